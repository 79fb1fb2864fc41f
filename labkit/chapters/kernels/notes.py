"""What chapter 07 says beside its measurements (taught in chapter 07): the words live here, every figure in
them comes from the result the chapter hands in, and each function returns a ``course.Note`` (markdown that
renders as a cell's value or through ``display``), so the chapter's cells read like the technique they
measure, not like the f-strings that build a sentence. A verdict's direction is never chosen here: the
chapter says it in words through ``lk.course.explain``."""
from __future__ import annotations

from ...base.errors import ConfigError
from ...engine import rules
from ...engine.config import Config
from .. import course
from ..course import Note, md_escape
from .attention import gpu_sdpa
from .common import plain, reference_summaries
from .profiles import ProfileTable

__all__ = ["setup_note", "baseline_note", "sweeps_note", "reference_lines", "reference_profile", "fusion_note",
           "compile_skip_note", "matching_profile", "optimizer_note", "tf32_note", "tf32_skip_note", "fused_backend",
           "attention_note", "trace_note"]


def _keys(name: str, value, keys) -> dict:
    if not isinstance(value, dict) or not set(keys) <= set(value):
        raise ConfigError(name, type(value).__name__, f"a dict with {', '.join(sorted(keys))}")
    return value


def setup_note(env: dict, device, n_threads, compare_s: float, smoke: bool) -> Note:
    """The chapter's opening lines: the device, the benchmarks' thread count, how long the A/B takes."""
    _keys("env", env, ("name",))
    threads = f"; intra-op threads for this chapter's runs: {n_threads}" if n_threads else ""
    # the set-up cell has said the device and versions: the mode and the thread count are this chapter's own
    return Note(f"Short mode: {'on' if smoke else 'off'}{threads}.\n\n"
                f"The eager-against-compiled comparison takes about **{compare_s:.0f} s**, after a compile from an "
                "empty cache (outside CI mode: tens of seconds on a small CPU); the MFU sweeps run many short "
                "trainings and show their progress; everything else here is short interleaved timings.")


def baseline_note(cfg: Config, s: dict) -> Note:
    """The baseline run's MFU, throughput and per-update split (medians), and where its peak came from."""
    _keys("s", s, ("mfu", "tokens_per_s", "data_wait_s", "data_wait_frac", "compute_s", "optimizer_s",
                   "peak_flops", "peak_flops_source"))
    where = "measured on this device" if s["peak_flops_source"].startswith("measured") else "from the datasheet"
    return Note(f"Baseline `{cfg.model}` ({cfg.precision}, micro-batch {cfg.micro_batch}): "
                f"**MFU {100 * s['mfu']:.1f}%**, {s['tokens_per_s']:,.0f} tokens/s. Per update (medians): data wait "
                f"{1e3 * s['data_wait_s']:.2f} ms "
                f"({100 * s['data_wait_frac']:.1f}% of the step), compute {1e3 * s['compute_s']:.1f} ms, optimizer "
                f"{1e3 * s['optimizer_s']:.1f} ms. The peak it is measured against: "
                f"{plain(s['peak_flops'] / 1e12, 3)} TFLOP/s ({where}).")


def sweeps_note(rows_b: list, rows_w: list, rounds: int) -> Note:
    """The MFU range of each sweep (micro-batch at fixed FLOPs per token, then width), with the values at its ends."""
    if not rows_b or not rows_w:
        raise ConfigError("rows", "empty", "the rows of two kernels.mfu_sweep calls")
    best_b, worst_b = max(rows_b, key=lambda r: r["mfu"]), min(rows_b, key=lambda r: r["mfu"])
    best_w, worst_w = max(rows_w, key=lambda r: r["mfu"]), min(rows_w, key=lambda r: r["mfu"])
    return Note(f"Micro-batch, at {rows_b[0]['flops_per_token'] / 1e6:.2f} MFLOP per token in every run (medians of "
                f"{rounds} runs): MFU from **{100 * worst_b['mfu']:.1f}%** (micro-batch {worst_b['value']}) to "
                f"**{100 * best_b['mfu']:.1f}%** (micro-batch {best_b['value']}). Width: from "
                f"**{100 * worst_w['mfu']:.1f}%** (d_model {worst_w['value']}) to **{100 * best_w['mfu']:.1f}%** "
                f"(d_model {best_w['value']}).")


def _mfu_lines() -> list:
    ref = reference_summaries("kernels/mfu-B1", "kernels/mfu-B4", "precision/bf16", "best/bf16-Bbig")
    return [f"GPU reference, {r['model']} bf16, micro-batch {r['micro_batch']}: MFU {100 * r['mfu']:.1f}%, "
            f"{r['tokens_per_s']:,.0f} tokens/s" for r in sorted(ref.values(), key=lambda r: r["micro_batch"])]


def _compile_lines() -> list:
    out = []
    for p in course.reference_points("precision") + course.reference_points("best"):
        if p.get("id") in ("best/bf16-Bbig", "precision/bf16-compile") and p.get("status") == "ok":  # eager, compiled
            ps, recs = p["summary"], p.get("records") or []
            first = (f", first update (with its compile) {recs[0]['step_time_s']:.1f} s"
                     if ps.get("compile") and recs else "")
            out.append(f"GPU reference {p['id']}: compile={ps['compile']}, {ps['tokens_per_s']:,.0f} tokens/s, "
                       f"MFU {100 * ps['mfu']:.1f}%{first}")
    return out


def _optimizer_lines() -> list:
    return [f"GPU reference, {r['device_name']}, {r['n_params'] / 1e6:.0f} M parameters (default: {r['default']}): "
            + ", ".join(f"{k} {1e3 * v:.2f} ms" for k, v in r["median_s"].items())
            for r in reference_summaries("kernels/optimizer").values()]


def _tf32_lines() -> list:
    out = [f"GPU reference {pid}: {ps['tokens_per_s']:,.0f} tokens/s, MFU {100 * ps['mfu']:.1f}%, final loss "
           f"{ps['final_loss']:.3f}" for pid, ps in reference_summaries("precision/fp32", "precision/tf32").items()]
    for ps in reference_summaries("kernels/tf32").values():
        out += [f"GPU reference, matmul {name}: {ps[name]['tflops']:.0f} TFLOP/s, relative error "
                f"{plain(ps[name]['rel_error'])}" for name in ("fp32", "tf32", "bf16")]
    return out


def _attention_lines() -> list:
    return [f"GPU reference, {r['device_name']} T={row['seq_len']} {row['backend']}: {1e3 * row['time_s']:.2f} ms, "
            f"peak {row['peak_bytes'] / 2**20:.1f} MiB"
            for r in reference_summaries("kernels/attention").values() for row in r["rows"] if "error" not in row]


_TOPICS = {"mfu": _mfu_lines, "compile": _compile_lines, "optimizer": _optimizer_lines, "tf32": _tf32_lines,
           "attention": _attention_lines}


def reference_lines(topic: str) -> Note:
    """The GPU reference lines of one section of the chapter, one per line; empty when none are shipped (the
    chapter said so once, at its start)."""
    if topic not in _TOPICS:
        raise ConfigError("topic", topic, f"one of {', '.join(_TOPICS)}")
    return Note("\n".join(f"- {md_escape(line)}" for line in _TOPICS[topic]()))


def reference_profile() -> tuple:
    """(ProfileTable, Note) of the GPU reference's profiled step, or (None, empty Note) without one."""
    p = reference_summaries("kernels/profile").get("kernels/profile")
    if not p:
        return None, Note("")
    table = ProfileTable(rows=p["top"], phases=p["phases_s"], device="cuda", time_source=p["time_source"],
                         wall_s=p.get("wall_s"))
    shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in p["shares"].items())
    return table, Note(f"GPU reference ({md_escape(p['device_name'])}), shares {table.basis_words()}: {shares}; "
                       f"top operation `{p['top_op']}`")


def fusion_note(fusion: dict) -> Note:
    """What eager ran and what Inductor made of ``gelu(x + b) + r`` (``fusion_demo``), with the first call's time."""
    _keys("fusion", fusion, ("ok",))
    if not fusion["ok"]:
        return Note(f"Skipped: {fusion['reason']}")
    k, cache = fusion["kernels"], fusion["cache"]
    made = ("reused the kernel it compiled earlier in this session (nothing new was generated)"
            if k == 0 or cache == "reused" else
            f"**loaded its {k} kernel(s) from its disk cache** (compiled in an earlier session)" if cache == "cached"
            else f"generated **{k} kernel(s)** for it")
    ops = fusion["eager_ops"]
    return Note(f"`gelu(x + b) + r` on a {fusion['tensor_mib']:.0f} MiB tensor: eager ran **{len(ops)} operations** "
                f"({', '.join(ops)}), each reading and writing whole tensors; Inductor {made}. First call (kept "
                f"apart): {fusion['compile_s']:.1f} s. Same result: {fusion['same_result']}.\n\n"
                + fusion["comparison"].sentence
                + " (One 'update' here is one call of the function on the whole tensor.)")


def compile_skip_note(why: str | None = None) -> Note:
    """Why the whole-step compile is skipped: ``why`` (no compiler here), or CI mode on a CPU."""
    if why:
        return Note(f"Skipped: {md_escape(why)}")
    return Note("Skipped in CI mode: a cold `torch.compile` of even `tiny` takes tens of seconds on a 2-core CPU "
                "(Inductor writes and compiles C++ for every fused kernel) — more than this chapter's CI budget. Run "
                "the chapter normally to see it.")


def matching_profile(cfg: Config, *tables):
    """The first profiled table whose model, micro-batch and precision are ``cfg``'s (None if none is)."""
    return next((t for t in tables if all(t.config.get(k) == getattr(cfg, k)
                                          for k in ("model", "micro_batch", "precision"))), None)


def optimizer_note(s: dict, opt: dict, fused_why: str) -> Note:
    """The optimizer's share of the baseline update, whether fused AdamW runs here, and PyTorch's default."""
    _keys("s", s, ("optimizer_s", "step_time_s"))
    _keys("opt", opt, ("default", "n_params"))
    return Note(f"In the baseline run the optimizer took **{100 * s['optimizer_s'] / s['step_time_s']:.0f}%** of "
                f"each update ({1e3 * s['optimizer_s']:.1f} ms: unscale, clip, step, zero). {fused_why}. Left to "
                f"itself, `torch.optim.AdamW` picks **{opt['default']}** here "
                f"({opt['n_params'] / 1e6:.1f} M parameters).")


def tf32_note(r: dict) -> Note:
    """fp32, TF32 and bf16 matmul rates and errors against fp64 (``tf32_matmul``)."""
    _keys("r", r, ("n", "fp32", "tf32", "bf16"))
    rows = ["| format | TFLOP/s | relative error against fp64 |", "|---|---|---|"]
    rows += [f"| {name} | {r[name]['tflops']:.1f} | {plain(r[name]['rel_error'])} |"
             for name in ("fp32", "tf32", "bf16")]
    gain = r["tf32"]["tflops"] / r["fp32"]["tflops"]
    return Note("\n".join(rows) + f"\n\nTF32 ran the {r['n']}² matmul at **{gain:.1f}×** fp32's rate with a "
                f"relative error of {plain(r['tf32']['rel_error'], 1)} "
                f"(fp32: {plain(r['fp32']['rel_error'], 1)}).")


def tf32_skip_note(env: dict) -> Note:
    """Why the TF32 measurement is skipped on this device: the engine's own refusal, or no TF32 tensor cores."""
    _keys("env", env, ("name",))
    try:
        rules.check(Config(precision="tf32"))  # what this device refuses, as lk.run would
        reason = f"{env['name']} has no TF32 tensor cores (compute capability below 8.0)"
    except ConfigError as e:
        reason = f"the engine refuses it here — {e}"
    return Note(f"Skipped on this device: TF32 is a mode of NVIDIA tensor cores; {md_escape(reason)}.")


def fused_backend(att: list) -> str:
    """The first fused SDPA backend that ran in ``attention_sweep``'s rows (flash, then efficient, then cuDNN)."""
    ran = {r["backend"] for r in att if "error" not in r}
    found = next((b for b in ("flash", "efficient", "cudnn") if b in ran), None)
    if found is None:
        raise ConfigError("att", sorted(ran), "rows of attention_sweep in which a fused backend ran")
    return found


def attention_note(att: list, fused: str) -> Note:
    """Backends that were not available (on a GPU without flash attention, first why: the GPU plan's sentence),
    then the bytes kept and the peak of math and ``fused`` at the longest T."""
    lines = [f"- T={r['seq_len']} {r['backend']}: not available here ({md_escape(r['error'][:90])})"
             for r in att if "error" in r]
    if course.device_kind() == "cuda" and "flash" not in gpu_sdpa()[0]:
        lines.insert(0, md_escape(gpu_sdpa()[1]))
    longest = max(r["seq_len"] for r in att if r["backend"] == fused and "error" not in r)
    m = {r["backend"]: r for r in att if r["seq_len"] == longest and "error" not in r}
    mib = {b: {k: m[b][k] / 2**20 for k in ("kept_bytes", "peak_bytes", "scores_bytes") if k in m[b]} for b in m}
    lines.append(f"At T = {longest}: the math backend kept **{mib['math']['kept_bytes']:.1f} MiB** for backward (the "
                 f"T × T probabilities alone are {mib['math']['scores_bytes']:.1f} MiB) and peaked at "
                 f"{mib['math']['peak_bytes']:.1f} MiB; {fused} kept **{mib[fused]['kept_bytes']:.2f} MiB** and peaked "
                 f"at {mib[fused]['peak_bytes']:.1f} MiB.")
    return Note("\n\n".join(lines))


def trace_note(table: ProfileTable) -> Note:
    """Where the profiled step's trace went and how to open it."""
    if not isinstance(table, ProfileTable):
        raise ConfigError("table", type(table).__name__, "the table kernels.profile_step returns")
    return Note(f"Trace of the baseline step: `{table.trace_path}` — open https://ui.perfetto.dev and drag the file "
                "onto the page (on a GPU the device's kernels appear in their own rows).")
