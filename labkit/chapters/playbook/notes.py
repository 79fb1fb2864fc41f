"""Chapter 09's sentences about what its cells measured (taught in chapter 09). Each function takes a cell's
results and returns the words as ``lk.course.Note`` -- markdown that renders as a cell's value or through
``display`` -- so the chapter's cells read like the technique while every number still comes from the runs.
A sentence that a comparison's verdict chooses stays in the chapter (``lk.course.explain`` and co.).

    display(pb.baseline_note(base_run.summary, baseline, budget))
"""
from __future__ import annotations

from ...base.numfmt import counted, number
from ..course import Note, mode_words
from .critical_batch import critical_batch_spread
from .grid import label, memory_of
from .pareto import measured
from .zero import remedies, state_bytes_per_gpu

MIB = 2**20


def chapter_note(env: dict, low: str, planned_s: float) -> Note:
    """The device, its 16-bit format, the mode, and how long the chapter's timed comparisons take."""
    # the set-up cell has said the device: this line adds the 16-bit format the chapter uses and the mode
    return Note(f"16-bit format: {low}; {mode_words().lower()}.\n\n"
                f"The timed A/B comparisons of this chapter repeat their runs, interleaved, for about "
                f"**{planned_s / 60:.1f} minutes** in all; the grid search and the other runs come on top.")


def problem_note(base: dict, n: int, target: int, budget: float, threads) -> Note:
    """The chapter's model, effective batch and budget (and, on a CPU, its fixed thread count)."""
    return Note(f"`{base['model']}`: {n:,} parameters; effective batch {target} sequences of {base['seq_len']} "
                f"tokens; budget {budget / MIB:,.0f} MiB"
                + (f"; {counted(threads, 'CPU thread')} in every run." if threads else "."))


def baseline_note(s: dict, baseline: dict, budget: float) -> Note:
    """The naive baseline's speed, memory and model state, and whether it fits."""
    mem, source = memory_of(s)
    states = s["param_bytes"] + s["grad_bytes"] + s["optimizer_bytes"]
    how = "measured peak" if source == "peak" else "parameters + gradients + optimizer + activations"
    return Note(f"Baseline ({label(baseline)}): **{s['tokens_per_s']:,.0f} tokens/s**, memory **{mem / MIB:,.1f} "
                f"MiB** ({how}). Model state: {states / MIB:,.1f} MiB for {s['n_params']:,} parameters = "
                f"{states / s['n_params']:.1f} bytes each; activations {s['activation_bytes'] / MIB:,.1f} MiB. "
                f"Budget {budget / MIB:,.1f} MiB: the baseline {'fits' if mem <= budget else 'does **not** fit'}.")


def emulated_note(low: str, kind: str, slow: float) -> Note:
    return Note(f"{low} is emulated on this {kind} (an update costs about {slow:.0f}× its fp32 time): the grid "
                "leaves it out; the cell after the Pareto chart compares the two formats on a smaller run.")


def grid_note(rows: list, fits: list, best_fit: dict, baseline: dict, base_tps: float, scatter, close: list) -> Note:
    """How many points fit, how fast the best one that fits runs (not which: that is the challenge), the
    baseline in the same grid, and how far the grid's scatter lets it rank the points."""
    if scatter is None:
        spread = "One run per point here: the grid's ranking is rough."
    else:
        spread = (f"Between the two passes a point's throughput differed by a median of {scatter:.0%}: "
                  + (f"{counted(len(close), 'other point')} that fit{'s is' if len(close) == 1 else ' are'} that "
                     "close to the top one, and these runs cannot rank them." if close else
                     "no other point that fits is that close to the top one."))
    return Note(f"**{len(fits)} of {len(rows)}** configurations fit the budget. The highest median that fits runs at "
                f"{best_fit['tokens_per_s']:,.0f} tokens/s — which configuration that is, is the challenge below; "
                f"the baseline ({label(baseline)}) ran at {base_tps:,.0f} tokens/s in the same grid. " + spread)


def front_note(front: list, rows: list) -> Note:
    return Note(f"The front holds {len(front)} of {len(measured(rows))} configurations: "
                f"{', '.join(r['label'] for r in front)}.")


def units_note(env: dict, low: str, slow, note: str = "") -> Note:
    """What this device has for 16-bit matmuls (and, where the format is emulated, why the run is smaller)."""
    units = [f for f in env.get("cpu_flags") or [] if "bf16" in f or "fp16" in f]
    if env["kind"] == "cuda":
        why = "tensor cores"
    elif slow:
        why = f"no {low} units it can use: {low} is converted in software"
    else:
        why = f"16-bit matrix units ({', '.join(units)})" if units else "no 16-bit matrix units that labkit detects"
    return Note((note + " " if note else "") + f"This device has {why}.")


def pick_note(knobs: dict, pick_run, rows: list, budget: float) -> Note:
    """The learner's pick measured again, beside its own point in the grid (short runs scatter)."""
    pm, _ = memory_of(pick_run.summary)
    twin = [r for r in measured(rows) if r["label"] == label(knobs)]
    again = f" ({twin[0]['tokens_per_s']:,.0f} in the grid: short runs scatter by this much)" if twin else ""
    return Note(f"Your pick: {label(knobs)} — **{pick_run.summary['tokens_per_s']:,.0f} tokens/s** now{again}, "
                f"memory {pm / MIB:,.1f} MiB of {budget / MIB:,.1f} MiB.")


def best_note(best_fit: dict, close: list) -> Note:
    """The challenge's answer, after the challenge: the fastest point that fits, and those within the scatter."""
    near = f"; within the grid's scatter of it: {', '.join(r['label'] for r in close)}." if close else "."
    return Note(f"The fastest configuration that fits was **{best_fit['label']}** ({best_fit['tokens_per_s']:,.0f} "
                f"tokens/s, {best_fit['memory_bytes'] / MIB:,.1f} MiB){near}")


def cap_note(budget: float, capped=None, error=None) -> Note:
    """The pick under a hard memory cap: its peak and speed, or the out-of-memory error it met."""
    cap = f"Under a hard cap of {budget / 2**30:.0f} GiB the pick"
    if error is not None:
        return Note(f"{cap} ran out of memory: {error}")
    s = capped.summary
    return Note(f"{cap} ran: peak {s['peak_mem_bytes'] / 2**30:.2f} GiB, {s['tokens_per_s']:,.0f} tokens/s.")


def data_cost_note(cost: float, whose: str) -> Note:
    return Note(f"Data cost {cost} ms per sample ({whose}'s compute time per sample).")


def remedies_table(models: dict, n_gpus: int, gpu_bytes: float) -> Note:
    """GB per GPU of model state only (no activations) for each model (rows) under each remedy (columns)."""
    heads = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "+ offload optimizer", "+ offload params", "8-bit Adam + ZeRO-2")
    lines = ["| model | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for name, n in models.items():
        per_gpu = [r["total"] for r in remedies(n, n_gpus, gpu_bytes)]
        per_gpu.append(state_bytes_per_gpu(n, n_gpus, stage=2, optimizer="adam8bit")["total"])
        # full offload leaves no model state on the GPU: a bare 0.0 there would read as a broken cell
        lines.append(f"| {name} | " + " | ".join(f"{b / 1e9:,.1f}" if b else "≈0 (all in CPU memory)"
                                                 for b in per_gpu) + " |")
    return Note(f"GB per GPU of **model state only** (no activations), {n_gpus} GPUs of {gpu_bytes / 1e9:.0f} GB:\n\n"
                + "\n".join(lines))


def activations_note(acts: dict) -> Note:
    return Note(f"A 7 B-shaped model on one 4096-token sequence keeps **{acts['none'] / 1e9:.1f} GB** of activations "
                f"without checkpointing and **{acts['full'] / 1e9:.1f} GB** with full checkpointing (Korthikanti et "
                "al. 2022, with flash attention) — per GPU, on top of the state above.")


def fix_note(states_only: str, with_acts: str, acts_bytes: float) -> Note:
    return Note(f"Model state alone, the least intrusive option that fits is **{states_only}**; with "
                f"{acts_bytes / 1e9:.0f} GB of activations per GPU on top it is **{with_acts}**"
                + (" — activations count." if states_only != with_acts else "."))


def fsdp_table(demo: dict) -> Note:
    """What FSDP rank 0 holds against a full replica (DDP), in plain bytes, with the share."""
    r0, rep = demo["ranks"][0], demo["replica"]
    rows = [f"| {k.replace('_bytes', '')} | {rep[k]:,} | {r0[k]:,} | {r0[k] / rep[k]:.2f} |"
            for k in ("param_bytes", "grad_bytes", "optimizer_bytes")]
    return Note("| bytes | a full replica (DDP) | FSDP rank 0 | share |\n|---|---:|---:|---:|\n" + "\n".join(rows))


def fsdp_losses_note(demo: dict, single: list) -> Note:
    """The FSDP losses beside one process's on the whole batch: equal, or the largest difference."""
    worst = max(abs(a - b) for a, b in zip(demo["losses"], single))
    same = 'identical' if worst == 0 else 'largest difference ' + number(worst)
    return Note(f"Losses under FSDP {', '.join(f'{v:.4f}' for v in demo['losses'])}; one process on the whole batch "
                f"{', '.join(f'{v:.4f}' for v in single)} ({same}). {demo['seconds']:.0f} s, mostly starting two "
                "Python processes.")


def convergence_table(conv: dict, batches, lrs, final_loss) -> Note:
    """Final loss per effective batch (rows) and learning rate (columns), on the same number of sequences."""
    head = ("Final loss (mean of the last three updates) on the same number of sequences:\n\n| effective batch | "
            "updates | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |\n|---:|---:|" + "---:|" * len(lrs))
    rows = [f"| {B} | {conv[B, lrs[0]].config.steps} | " + " | ".join(f"{final_loss(conv[B, lr]):.3f}" for lr in lrs)
            + " |" for B in batches]
    return Note(head + "\n" + "\n".join(rows))


def gap_note(gap: float, big, small) -> Note:
    """The loss gap between two effective batches at one learning rate, on the same tokens."""
    return Note(f"Same tokens, same learning rate: effective batch {big.config.micro_batch * big.config.accum} ends "
                f"{gap:+.3f} in loss against batch {small.config.micro_batch * small.config.accum} "
                f"({big.config.steps} updates against {small.config.steps}).")


def lr_batch_note(conv: dict, best_lr: dict, final_loss) -> Note:
    """The best learning rate per batch, and each batch's loss at it (more loss for bigger batches, on equal
    tokens, is what the model of McCandlish et al. expects: it places no batch on either side of B_crit)."""
    batches = sorted(best_lr)
    best = {B: final_loss(conv[B, best_lr[B]]) for B in batches}
    in_order = all(best[a] < best[b] for a, b in zip(batches, batches[1:]))
    grows = ("It grows with the batch, as the scaling rules say. " if best_lr[batches[-1]] > best_lr[batches[0]] else
             "Here it did not grow with the batch: with this few tokens the runs are short and noisy. ")
    ends = ", ".join(f"{best[B]:.3f} (batch {B}, {conv[B, best_lr[B]].config.steps} updates)" for B in batches)
    order = ("The larger the batch, the higher the loss: the model above expects that at every batch size, so this "
             "comparison alone places no batch on either side of B_crit — the next cell estimates it."
             if in_order else
             "Not in order of batch size: on runs this short the noise between runs is as large as the effect. Either "
             "way, a comparison on equal tokens places no batch on either side of B_crit — the next cell estimates it.")
    return Note("Best learning rate per effective batch (of the three tried): "
                + ", ".join(f"{B} → {best_lr[B]:g}" for B in batches) + ". " + grows
                + "At it, on the same tokens, each batch ends at " + ends + ". " + order)


def critical_batch_caveat(crit: list) -> Note:
    """How rough the B_crit estimate is (its interval through ``critical_batch_spread``), and whether it grows
    as the loss falls with intervals that do not overlap -- the only case in which it is said to."""
    finite = [e for e in crit if e["ok"] and e.get("interval") and 0 < e["b_crit"] < float("inf")]
    iv = crit[0].get("interval") if crit[0]["ok"] else None
    rough = ("With one seed, three batch sizes and runs this short, the estimate is rough: "
             + critical_batch_spread(iv)  # a factor when both ends are finite, else which end is open
             + " The bootstrap only resamples each run's update-to-update noise; other seeds, learning rates "
             "between the three tried, or another data order would move it further.")
    grows = (len(finite) >= 2 and all(a["b_crit"] > b["b_crit"] for a, b in zip(finite, finite[1:]))
             and finite[0]["interval"][0] > finite[-1]["interval"][1])
    return Note(rough + " " + ("Across the targets B_crit is larger at the lower loss, with intervals that do not "
                               "overlap: it grows as the loss falls, as the theory expects." if grows else
                               "The theory expects B_crit to grow as the loss falls; these runs are too noisy to show "
                               "it (the estimates at the three targets are within each other's intervals, or not in "
                               "that order)."))
