"""Chapter 08's tables and sentences about what its cells measured (taught in chapter 08). Each function takes a
cell's results and returns ``lk.course.Note`` -- markdown that renders as a cell's value or through ``display``
-- so the cells read like the measurement while every number still comes from the runs.

    display(memlab.seq_table(rows), memlab.seq_note(base, rows))
"""
from __future__ import annotations

from ...base.numfmt import number
from ..course import Note, mode_words, reference_note
from ..measured import FILE, grading_tool
from ._common import MIB
from .fragmentation import fragmentation_table
from .recipes import run_memory
from .updates import explain_update_peaks

GIB = 2**30


def _table(head: list, rows: list) -> Note:
    return Note("\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                          + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]))


def device_note(device, ref_sections: list) -> Note:
    """The device and mode; that bytes are counted on every device; what is skipped where there is no CUDA."""
    out = [f"{mode_words()}. This chapter counts bytes; its runs are short. "
           "Bytes are **counted** (exact) on every device; on a CUDA GPU the allocator's own numbers are shown too."]
    if not ref_sections:  # GPU reference numbers shipped with the course: said once here, listed where they exist
        out.append(reference_note("memory")._repr_markdown_())
    if device.type != "cuda":
        out.append("GPU-only, skipped on this device: the caching allocator's allocated against reserved memory "
                   "(`measure-08-allocator`: its demo needs CUDA) and its recorded history (in `measure-08-timeline`).")
    return Note("\n\n".join(out))


def seq_table(rows: list) -> Note:
    """Activation bytes against T for both attention backends, measured beside the formula."""
    return _table(["T", "attention", "measured", "formula", "measured ÷ formula", "of it T×T (formula)"],
                  [(r["seq_len"], r["attention"], f"{r['measured_bytes'] / MIB:.2f} MiB",
                    f"{r['formula_total'] / MIB:.2f} MiB", f"{r['ratio']:.3f}",
                    f"{r['formula_attention_square'] / MIB:.2f} MiB") for r in rows])


def square_share(rows: list) -> float:
    """The share of the math backend's bytes at the longest T that the fused kernel does not keep: the T×T part."""
    t_max = max(r["seq_len"] for r in rows)
    m, f = (next(r for r in rows if r["seq_len"] == t_max and r["attention"] == a) for a in ("math", "auto"))
    return (m["measured_bytes"] - f["measured_bytes"]) / m["measured_bytes"]


def seq_note(base, rows: list) -> Note:
    """What the sweep shows at the longest T, how close the formula came, and where the T² part overtakes."""
    spec, t_max = base.spec, max(r["seq_len"] for r in rows)
    m, f = (next(r for r in rows if r["seq_len"] == t_max and r["attention"] == a) for a in ("math", "auto"))
    cross = (16 * spec.d_model + 4) / spec.n_head + 1  # n_head·(T − 1) = 16·d + 4: where the T² part overtakes
    worst = 100 * max(abs(r["ratio"] - 1) for r in rows)
    return Note(f"`{base.model}` (d = {spec.d_model}, {spec.n_head} heads): at T = {t_max} the math backend kept "
                f"**{m['measured_bytes'] / f['measured_bytes']:.2f}×** the fused kernel's bytes; the T×T part is "
                f"**{100 * square_share(rows):.0f}%** of them. The formula matches the measurement within "
                f"{number(worst, 1)}%. Per block, the T² part overtakes the linear "  # plain: 0.05%, not a rounded 0.0%
                f"part at T ≈ {cross:.0f} for this width and head count.")


def seq_reference_note(refs: dict) -> Note:
    """The GPU reference runs of the sequence-length section, one line each (empty when none are shipped)."""
    lines = []
    for pid, r in sorted(refs.items(), key=lambda kv: (kv[1]["seq_len"], kv[0])):
        peak = f", peak {r['peak_mem_bytes'] / GIB:.2f} GiB" if r.get("peak_mem_bytes") else ""
        lines.append(f"- {pid}: micro-batch {r['micro_batch']}, activations {r['activation_bytes'] / GIB:.2f} GiB"
                     f"{peak}, {r['tokens_per_s']:,.0f} tokens/s")
    return Note("\n".join(lines))


def recompute_table(rec: list) -> Note:
    return _table(["T", "activations, math", "with attention recompute", "saved", "hardware ÷ model FLOPs"],
                  [(r["seq_len"], f"{r['bytes_none'] / MIB:.2f} MiB", f"{r['bytes_attention'] / MIB:.2f} MiB",
                    f"{100 * r['saved_frac']:.0f}%", f"{r['flops_ratio']:.3f}") for r in rec])


def recompute_note(rec: list) -> Note:
    """The trade at the shortest and longest T, and how much of the core's FLOPs the early stop reruns."""
    lo, hi = rec[0], rec[-1]
    core, counted = hi["core_flops_ratio"] - 1, hi["flops_ratio"] - 1
    return Note(f"At T = {lo['seq_len']} attention recompute saved {100 * lo['saved_frac']:.0f}% of the activations "
                f"for {100 * (lo['flops_ratio'] - 1):.1f}% more FLOPs; at T = {hi['seq_len']}, "
                f"**{100 * hi['saved_frac']:.0f}%** for **{100 * counted:.1f}%**. The longer the sequence, the better "
                "the trade — and with a fused attention kernel, which never stores the T² part, there is little left "
                f"to save.\n\nRerunning the whole core (4·B·T²·d per block) would add {100 * core:.1f}% at T = "
                f"{hi['seq_len']}; the count is {100 * counted:.1f}%, {counted / core:.2f} of it: the early stop skips "
                "the product with V.")


def moments_table(fu: dict) -> Note:
    """The bytes of each role after each phase of the first two updates."""
    keys = ("weights", "grads", "optimizer", "activations")
    return _table(["moment", "weights", "gradients", "AdamW state", "activations"],
                  [(mo["moment"], *(f"{mo[k] / MIB:.1f} MiB" for k in keys)) for mo in fu["moments"]])


def step2_reference_note(refs: dict) -> Note:
    """The GPU reference runs of the step-2 section: each update's peak, from the allocator."""
    lines = []
    for r in refs.values():
        g1, g2 = r["peaks"]["update 1"], r["peaks"]["update 2"]
        lines.append(f"- {r['device_name']}, {r['config']['model']} fp32 ({r['n_params'] / 1e6:.0f} M parameters), "
                     f"from the allocator: peak of update 1 {g1 / GIB:.2f} GiB, of update 2 {g2 / GIB:.2f} GiB "
                     f"(+{(g2 - g1) / GIB:.2f} GiB)")
    return Note("\n".join(lines))


def allocator_note(st: dict, run) -> Note:
    return Note(f"After a `{run.config.model}` run: allocated {st['allocated'] / MIB:.0f} MiB, reserved "
                f"{st['reserved'] / MIB:.0f} MiB (the run's peak allocated: {run.summary['peak_mem_bytes'] / GIB:.2f} "
                "GiB); `torch.cuda.empty_cache()` hands the cached blocks back to the driver.")


def timeline_note(trace) -> Note:
    return Note(f"Kept when forward ended: **{trace.kept_bytes() / MIB:.1f} MiB**; peak during the step "
                f"**{trace.peak_bytes() / MIB:.1f} MiB** (on top of the weights); gradients at the end "
                f"{trace.grad_bytes() / MIB:.1f} MiB.")


def snapshot_note(snap) -> Note:
    return Note(f"Allocator history of two updates: `{snap}` — open https://pytorch.org/memory_viz and drag the file "
                "onto the page. Look for the step where AdamW's state appears.")


def bpp_table(rows: list) -> Note:
    """Bytes per parameter of each recipe, role by role."""
    keys = ("weights", "grads", "master", "accumulator", "optimizer")
    return _table(["recipe", "weights", "gradients", "master", "accumulator", "AdamW", "bytes per parameter"],
                  [(r["recipe"], *(f"{r[k] / r['n_params']:.2f}" for k in keys), f"**{r['bytes_per_param']:.2f}**")
                   for r in rows])


def bpp_note(bpp: list) -> Note:
    """What was counted, AdamW's step counters, and whether the tracer found bytes no role counts."""
    r0 = bpp[0]
    extra = {r["recipe"]: r["traced_bytes"] - r["total"] for r in bpp}  # bytes alive that no role counts
    found = ("labkit's tracer, which follows every tensor each update made, found no byte alive beyond these roles."
             if not any(extra.values()) else
             "labkit's tracer found bytes alive that the roles do not count: "
             + ", ".join(f"{n}: {b / r0['n_params']:+.2f} bytes per parameter" for n, b in extra.items() if b) + ".")
    return Note(f"Counted after one update of each recipe on `tiny` ({r0['n_params']:,} parameters, 16-bit format "
                f"{r0['half']}). AdamW's step counters, one small tensor for each of the {r0['param_tensors']} "
                f"parameter tensors, are {r0['step_counter_bytes']} bytes in all: "
                f"{r0['step_counter_bytes'] / r0['n_params']:.4f} bytes per parameter, too little to show in the "
                "table. " + found)


def bpp_7b_note(bpp: list) -> Note:
    """What the first and the last recipe differ by for a 7 B-parameter model."""
    a, b = bpp[0]["bytes_per_param"], bpp[-1]["bytes_per_param"]
    return Note(f"For a 7 B-parameter model the difference between {a:.0f} and {b:.0f} bytes per parameter is "
                f"{7e9 * (b - a) / 1e9:.0f} GB.")


def step2_note(fu: dict) -> Note:
    """The step-2 story told from ``first_updates``' numbers, and where they came from."""
    return Note(f"{explain_update_peaks(fu)} Source: {fu['source']}.")


def fragmentation_reference_note(refs: dict) -> Note:
    """The allocator demo's table from the GPU reference run (``refs``: its summaries by setting)."""
    gpu = next(iter(refs.values())).get("gpu", "a GPU")
    return Note(f"GPU reference ({gpu}):\n\n" + fragmentation_table(refs))


def state_note(fu: dict) -> Note:
    """AdamW's counted state after the first update, per parameter (shown once the exercise passes)."""
    state, n = fu["moments"][-1]["optimizer"], fu["n_params"]
    return Note(f"Counted: {state:,} bytes of AdamW state for {n:,} parameters, {state / n:.4f} bytes each (the two "
                "moments, plus a step counter per parameter tensor).")


def budget_note(predicted: float, mem: dict) -> Note:
    """The learner's calculator beside what one run held (shown once the exercise passes)."""
    return Note(f"Your calculator for this chapter's baseline: {predicted / MIB:.1f} MiB; the run: "
                f"{mem['total'] / MIB:.1f} MiB.")


def budget_run_note(calculator, cfg) -> Note:
    """The learner's calculator beside one run of the chapter's baseline (``cfg``, one thread). While a grader
    runs the notebook the run is left out: the exercise is graded from the learner's saved measurements, and the
    grader's CPU measures nothing for it."""
    if grading_tool() is not None:
        return Note(f"Graded from `{FILE}` (your saved runs): the baseline is not run again here.")
    return budget_note(calculator(cfg), run_memory(cfg.replace(threads=1)))

