"""What chapters 00 and 01 show of their measurements: each result as markdown that displays itself, so a
chapter's cell reads like the technique it measures and its sentences still follow the numbers.

* ``Table``: rows (dicts) that render as a markdown table -- a sweep's or a comparison's rows;
* ``timer_words`` / ``timing_references``: what the synchronize experiment of chapter 00 showed;
* ``memory_table``, ``scale_words``, ``baseline_words``: chapter 00's memory breakdown and first baseline;
* ``breakdown_words``, ``peak_table``, ``suspect_words``: chapter 01's baseline, peaks and low-MFU suspect.

    display(measurelab.memory_table(summaries, formula))
"""
from __future__ import annotations

import statistics

from ..base.errors import ConfigError
from ..base.numfmt import counted, number
from ..tools import reference
from ..base.page import Table  # noqa: F401 -- measurelab.Table, as chapters 00/01 call it
from .course import Note, md_escape, reference_note, reference_points

# chapter 00 calls two timings of the same finished work "in agreement" only within this share of each other
TIMER_TOLERANCE = 0.2


def _positive(name, value, what="a measured time in seconds, > 0"):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or value == float("inf"):
        raise ConfigError(name, value, what)


# ---- chapter 00: timing with and without synchronize ---------------------------------------------------

def timer_words(unsynced: float, synced: float, kind: str, n: int, reps: int, ratios=None) -> Note:
    """What the two timers of ``n``×``n`` matmuls (``reps`` each) showed. On a GPU the timer without
    synchronize measured the queueing; on a CPU both time the same finished work, so they are called in
    agreement only within TIMER_TOLERANCE -- a larger gap is named scatter, not asynchrony. ``ratios``: the
    ratio of each interleaved round (unsynced, synced, unsynced, ...); the words then read their median
    (``unsynced`` and ``synced`` are the medians of each timer) and give their spread."""
    _positive("unsynced", unsynced)
    _positive("synced", synced)
    if kind not in ("cuda", "mps", "cpu"):
        raise ConfigError("kind", kind, "'cuda', 'mps' or 'cpu' (the device's type)")
    if ratios is not None:
        if not isinstance(ratios, (list, tuple)) or not ratios:
            raise ConfigError("ratios", ratios, "a non-empty list of per-round ratios (unsynced / synced)")
        for r in ratios:
            _positive("ratios", r, "a ratio of two measured times, > 0")
    ratio = statistics.median(ratios) if ratios else unsynced / synced
    # one round is two timings of a few matmuls: their median over interleaved rounds, with its spread,
    # is what a busy machine cannot push around the way it pushes one pair
    rounds = (f" (medians of {counted(len(ratios), 'interleaved round')}; the rounds' ratios ranged "
              f"{number(min(ratios))}–{number(max(ratios))})") if ratios else ""
    median = "median " if ratios else ""
    head = (f"{n}×{n} matmul: **{1e3 * unsynced:.3f} ms** without synchronize, **{1e3 * synced:.3f} ms** "
            f"with it{rounds}.")
    if kind != "cpu":
        return Note(f"{head} Without synchronising, the timer reported **{ratio:.3g}×** the real time "
                    f"({median}ratio): it measured how fast the kernels were queued.")
    if abs(ratio - 1) <= TIMER_TOLERANCE:
        verdict = f"so both timers agree within {TIMER_TOLERANCE:.0%} ({median}ratio {ratio:.2f})"
    else:
        verdict = (f"so the two timers measure the same finished work, yet here they differ by more than "
                   f"{TIMER_TOLERANCE:.0%} ({median}ratio {ratio:.2f}: the run without synchronize was "
                   f"{'faster' if ratio < 1 else 'slower'}). That gap is not asynchrony but scatter between "
                   f"timings of {reps} short matmuls each: time.perf_counter reads wall-clock "
                   "time, which also counts other programs, clock-speed changes and cold caches. Run the cell "
                   "again and the ratio moves around 1")
    return Note(f"{head} On the CPU each operation finishes before the next line runs and synchronize has "
                f"nothing to wait for, {verdict}. The asynchronous GPU case cannot be shown here: there is no "
                "GPU, so that part is skipped.")


def timing_references() -> Note:
    """The reference note of the timing section, then each GPU point's synchronize experiment -- or an empty
    note when none are shipped (the chapter's first cell says so once, ``reference_overview``)."""
    lines = [str.__str__(reference_note("timing"))]
    for p in reference_points("timing"):
        mm = (p.get("summary") or {}).get("matmul") or {}
        if p.get("status") == "ok" and mm.get("no_sync_over_sync"):
            lines.append(f"{md_escape(reference.label(p))}: {mm['count']} {mm['n']}×{mm['n']} {mm['dtype']} "
                         f"matmuls; the timer without synchronize read {mm['no_sync_over_sync']:.3g}× the real time")
    return Note("\n\n".join(lines) if len(lines) > 1 else "")


def reference_overview() -> str:
    """Chapter 00's one line at its start: which GPU reference measurements it can show beside yours, or
    that none are shipped -- said once there, not after each section's numbers (chapter 07's wording)."""
    from .kernels.common import reference_overview as overview  # deferred: the kernels package is large

    return overview(("timing", "best"), ("the timers", "the baseline run"), gpu_only=())


# ---- chapter 00: where memory goes, and a first baseline ----------------------------------------------

MEMORY_PARTS = {"param_bytes": "weights", "grad_bytes": "gradients", "optimizer_bytes": "optimizer state",
                "activation_bytes": "activations"}


def memory_table(summaries: dict, formula) -> Note:
    """{model: run summary} against ``formula(summary)`` (the chapter's own), MiB per kind of tensor."""
    if not isinstance(summaries, dict) or not summaries or not callable(formula):
        raise ConfigError("summaries", type(summaries).__name__, "a dict {model: run summary} and a formula function")
    rows = []
    for m, s in summaries.items():
        f = formula(s)
        head = f"{m} ({s['n_params'] / 1e6:.2f} M params, micro-batch {s['micro_batch']}, seq {s['seq_len']})"
        rows += [dict(run=head if i == 0 else "", part=words, formula=f[k] / 2**20, measured=s[k] / 2**20)
                 for i, (k, words) in enumerate(MEMORY_PARTS.items())]
    return Note(Table(rows, [("run", "model", "{}"), ("part", "tensors", "{}"), ("formula", "formula MiB", "{:.2f}"),
                             ("measured", "measured MiB", "{:.2f}")])._repr_markdown_())


def scale_words(bytes_per_param: float, need_gb: dict) -> Note:
    """The measured bytes per parameter scaled to LLM sizes ({name: GB}): a table, then the 7 B and 70 B rows."""
    _positive("bytes_per_param", bytes_per_param, "the measured bytes per parameter, > 0")
    table = Table([dict(model=k, gb=v) for k, v in need_gb.items()],
                  [("model", "model", "{}"), ("gb", "GB of weights + gradients + Adam state", number)])
    # the table and the sentence in one format (course.number): "1,120" in both, never "1,120.0" beside "1120"
    said = [f"a {k} model needs {number(need_gb[k])} GB" for k in ("7 B", "70 B") if k in need_gb]
    return Note(table._repr_markdown_() + f"\n\nMeasured on `small`: **{bytes_per_param:.2f} bytes per parameter**. "
                f"At that rate {' and '.join(said)} before any activation.")


def _peak_kind(s: dict) -> str:
    return "measured" if str(s.get("peak_flops_source", "")).startswith("measured") else "datasheet"


def baseline_words(result) -> Note:
    """Chapter 00's first baseline: throughput, the median update, MFU of which peak, and the loss."""
    s = _summary(result)
    return Note(f"Baseline on **{md_escape(s['device_name'])}**: **{number(s['tokens_per_s'])} tokens/s**, "
                f"{1e3 * s['step_time_s']:.0f} ms per update (median of {s['timed_updates']}), MFU "
                f"{100 * s['mfu']:.1f}% of the {_peak_kind(s)} {s['precision']} peak; loss {s['first_loss']:.2f} → "
                f"{s['final_loss']:.2f} in {len(result.records)} updates.")


# ---- chapter 01: the baseline's breakdown, the peaks, the low-MFU suspect -----------------------------

def breakdown_words(result) -> Note:
    """Chapter 01's baseline: the update split into data wait, compute and optimizer, its FLOPs, MFU and HFU."""
    s = _summary(result)
    where = "measured on this device" if _peak_kind(s) == "measured" else "from the datasheet"
    n = s.get("intra_op_threads")
    threads = f", {counted(n, 'intra-op thread')}" if isinstance(n, int) else ""
    return Note(
        f"Baseline: **{number(s['tokens_per_s'])} tokens/s**, {1e3 * s['step_time_s']:.0f} ms per update: data "
        f"wait {1e3 * s['data_wait_s']:.1f} ms, compute {1e3 * s['compute_s']:.0f} ms, optimizer "
        f"{1e3 * s['optimizer_s']:.1f} ms (medians{threads}). It needs "
        f"{s['model_flops_per_step'] / 1e9:.1f} GFLOP per update: MFU **{100 * s['mfu']:.1f}%**, HFU "
        f"{100 * s['hfu']:.1f}% (the same: nothing is recomputed) of a peak that is {where}.")


def peak_table(table_rows, env: dict) -> Note:
    """Rows of labkit's dense peak table (names, {format: TFLOP/s}, source), then this device's peaks."""
    _env(env)
    formats = [p for p in ("fp32", "tf32", "fp16", "bf16") if any(p in peaks for _, peaks, _ in table_rows)]
    rows = [dict(device=names[0], **peaks) for names, peaks, _ in table_rows]
    rows.append(dict(device=f"your device: {env['name']}",
                     **{p: v["flops"] / 1e12 for p, v in env["peak_flops"].items() if v.get("flops")}))
    table = Table(rows, [("device", "device", "{}")] + [(p, f"{p} TFLOP/s", number) for p in formats])
    sources = [f"- {p}: {md_escape(v['source'])}" for p, v in env["peak_flops"].items()]
    return Note(table._repr_markdown_() + "\n\nWhere your device's peaks come from:\n\n" + "\n".join(sources))


def suspect_words(result) -> Note:
    """The low-MFU suspect of chapter 01's exercise: MFU, the waiting share, and its update split."""
    s = _summary(result)
    return Note(f"The suspect: MFU **{s['mfu']:.2%}**, waiting for data **{s['data_wait_frac']:.1%}** of the time; "
                f"per update (medians) {1e3 * s['compute_s']:.1f} ms compute, {1e3 * s['optimizer_s']:.1f} ms "
                f"optimizer step, {1e3 * s['data_wait_s']:.2f} ms data wait, for {s['tokens_per_step']:,} tokens.")


def _env(env):
    if not isinstance(env, dict) or not isinstance(env.get("peak_flops"), dict) or "name" not in env:
        raise ConfigError("env", type(env).__name__, "the report lk.env() returns")


def _summary(result) -> dict:
    s = getattr(result, "summary", None)
    if not isinstance(s, dict) or not hasattr(result, "records"):
        raise ConfigError("result", type(result).__name__, "a finished run (what lk.run or lab.run returns)")
    return s
