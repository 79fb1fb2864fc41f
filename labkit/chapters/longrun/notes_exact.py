"""Chapter 11's sentences, tables and chart about resuming exactly (taught in chapter 11), built from
``exact.resume_demo``'s measured values -- never typed numbers.

    display(lr.notes_exact.resume_table(r), lr.notes_exact.resume_note(r))
    display(lr.notes_exact.ablation_table(r), lr.notes_exact.ablation_note(r)); lr.notes_exact.ablation_chart(r)
"""
from __future__ import annotations

import math

from ...base.errors import ConfigError
from ..course import Note
from .state import ITEMS

WINDOW = 12  # the loss table shows every update up to this many, else the ones around the resume


def _loss(v: float) -> str:
    return f"{v:.7f}"


def _updates(r) -> list:
    if r.updates <= WINDOW:
        return list(range(1, r.updates + 1))
    h = r.resume_at
    return sorted(set(range(max(1, h - 2), min(r.updates, h + 4) + 1)) | {r.updates})


def resume_table(r) -> Note:
    """Loss per update, straight against resumed, around the resume point: equal or not, as floats."""
    h = r.resume_at
    rows = []
    for u in _updates(r):
        a = r.straight.losses[u - 1]
        b = r.first_half.losses[u - 1] if u <= h else r.resumed.losses[u - h - 1]
        where = "first half" if u <= h else ("**first after the resume**" if u == h + 1 else "resumed")
        rows.append(f"| {u} | {_loss(a)} | {_loss(b)} | {where} | {'yes' if a == b else '**no**'} |")
    return Note("| update | straight run | saved, then resumed in a new process | leg | equal |\n"
                "|---:|---:|---:|:---|:---:|\n" + "\n".join(rows))


def _kib(n: float) -> str:
    return f"{n / 1024:,.0f} KiB"


def resume_note(r) -> Note:
    """Whether the resumed run is the straight run, bit for bit, and what the loader's position needed."""
    h = r.resume_at
    if r.params_equal and r.losses_equal:
        verdict = (f"All {r.updates} losses are equal as floats, and all {r.tensors} tensors of the final "
                   f"state_dict are `torch.equal`: the resumed run **is** the straight run, bit for bit.")
    else:
        verdict = (f"**Not exact**: {r.tensors_equal} of {r.tensors} final tensors are equal, the largest "
                   f"difference is {r.max_param_diff:.2e}; the losses are "
                   f"{'equal' if r.losses_equal else 'not equal'}.")
    pos = r.saved_position
    ahead = (pos.get("yielded") or 0) - pos["consumed"]
    loader = (f"At the save the loop had consumed {pos['consumed']} samples of epoch {pos['epoch']}, while the "
              f"sampler had already handed {pos['yielded']} indices to the loader: {ahead} samples "
              f"({ahead // r.micro_batch} batches) were being prefetched by the {r.workers} worker"
              f"{'s' if r.workers != 1 else ''}. The checkpoint stores what the loop consumed; storing the "
              f"sampler's own progress would have skipped those {ahead} samples on resume."
              if r.workers and pos.get("yielded") is not None else
              f"At the save the loop had consumed {pos['consumed']} samples of epoch {pos['epoch']} (no workers: "
              "nothing was prefetched).")
    epoch = (f" The epoch of {r.batches_per_epoch} batches ({r.samples} samples, the last one left out by "
             f"`drop_last`) ended at update {r.batches_per_epoch}, after the resume: the resumed sampler "
             "crossed into epoch 1 with its own seeded order, as the straight run did.")
    return Note(f"{r.model} GPT, micro-batch {r.micro_batch}, {r.updates} updates, dropout {r.dropout:g}, "
                f"AdamW with a warm-up + cosine lr, {r.precision_note}, a shuffled loader with "
                f"{r.workers} worker{'s' if r.workers != 1 else ''}, on {r.device}. Straight: {r.updates} "
                f"updates in one process ({r.straight.train_s:.2f} s of updates). Resumed: {h} updates and "
                f"a save in a second process (a {_kib(r.checkpoint_bytes)} file, written in "
                f"{r.save_s * 1000:.0f} ms), then a third process that never saw the first half loaded it and "
                f"ran updates {h + 1} to {r.updates} ({r.resumed.train_s:.2f} s of updates; the whole process, "
                f"start to report, {r.resumed.seconds:.1f} s). " + verdict + " " + loader + epoch)


def _pow2(x: float) -> str:
    return f"2^{int(math.log2(x))}" if x > 0 and math.log2(x).is_integer() else f"{x:g}"


def _at(u) -> str:
    return "never" if u is None else f"update {u}"


def why(r, item: str) -> str:
    """The mechanism of one item's divergence, from what that resume measured."""
    a, s, h = r.ablation[item], r.straight, r.resume_at
    if a.first_param_diff is None and a.first_loss_diff is None:
        return "no divergence measured: in this setup the item did not change the run"
    tail = lambda xs: xs[h:]  # noqa: E731 -- the straight run's values for the resumed updates
    if item == "optimizer":
        applied = next((h + 1 + i for i, v in enumerate(tail(s.skipped)) if not v), None)
        return (f"Adam's two moments restart at zero and its step count at 0: the bias correction makes the first "
                f"update applied after the resume ({_at(applied)}) a full-size step in the sign of each gradient, "
                f"so the weights differ after {_at(a.first_param_diff)}, the loss from {_at(a.first_loss_diff)}. (This "
                f"ablation drops the optimizer's per-parameter state and keeps its param_groups, so the lr was still "
                f"right; a checkpoint without the optimizer's state_dict at all would also run update {h + 1} at the "
                f"warm-up's first lr: the scheduler writes the lr into the optimizer, and loading the scheduler "
                f"alone does not.)")
    if item == "scheduler":
        k = next((i for i, (x, y) in enumerate(zip(tail(s.lrs), a.lrs)) if x != y), None)
        if k is None:
            return "the lr was the same at every update: the schedule did not move here"
        kept = (f"update {h + 1} still used the right lr ({a.lrs[0]:.2e}: the optimizer's param_groups carry the "
                f"current lr), but " if k > 0 else "")
        return (f"{kept}the fresh scheduler counts from 0, so its next step restarted the warm-up: update "
                f"{h + k + 1} used lr {a.lrs[k]:.2e} instead of {tail(s.lrs)[k]:.2e}; weights differ after "
                f"{_at(a.first_param_diff)}, the loss from {_at(a.first_loss_diff)}")
    if item == "scaler":
        init, saved = a.scales[0], tail(s.scales)[0]
        skips_s = [h + 1 + i for i, v in enumerate(tail(s.skipped)) if v]
        skips_a = [h + 1 + i for i, v in enumerate(a.skipped) if v]
        skip = (f"; the straight run's GradScaler skipped update{'s' if len(skips_s) > 1 else ''} "
                f"{', '.join(map(str, skips_s)) or 'none'} (inf gradients at its grown scale), this one "
                f"{', '.join(map(str, skips_a)) or 'none'}" if skips_s != skips_a else "")
        return (f"a fresh GradScaler starts at its initial scale {_pow2(init)} instead of the saved {_pow2(saved)} "
                f"(and its growth counter at 0). Scaling by a power of two is exact except where an fp16 gradient "
                f"falls into the subnormal range or to zero: at the smaller scale some did, so the weights "
                f"differ after {_at(a.first_param_diff)}{skip}; the loss differs from {_at(a.first_loss_diff)}")
    if item == "rng":
        return (f"the new process's generators start from the seed again, so update {h + 1} drew the dropout "
                f"masks update 1 had drawn: the loss differs at {_at(a.first_loss_diff)} already -- the data "
                f"and the weights going in were the same")
    if item == "loader":
        first = a.batches[0] if a.batches else None
        again = s.batches.index(first) + 1 if first in s.batches else None
        replay = (f"update {h + 1} trained on the batch of update {again} (the same samples, replayed)"
                  if again is not None and again <= h else f"update {h + 1} trained on other samples")
        return (f"the sampler starts epoch 0 again at its first sample: {replay}, and the samples the straight "
                f"run trained on next come later (epoch 0 is replayed first); the loss differs at {_at(a.first_loss_diff)}")
    return ""


def ablation_table(r) -> Note:
    """Items x where the resumed run left the straight one, and by how much at the end."""
    rows = [f"| {item} | {_at(a.first_param_diff)} | {_at(a.first_loss_diff)} | {a.max_param_diff:.2e} |"
            for item, a in r.ablation.items()]
    head = (f"Resumed after update {r.resume_at} with one item left out of the checkpoint:\n\n"
            "| missing item | weights first differ after | loss first differs at | max abs param difference at "
            f"update {r.updates} |\n|:---|---:|---:|---:|\n")
    full = (f"| (nothing: the whole checkpoint) | {'never' if r.params_equal else 'see above'} | "
            f"{'never' if r.losses_equal else 'see above'} | {r.max_param_diff:.2e} |")
    return Note(head + "\n".join(rows) + "\n" + full)


def ablation_note(r) -> Note:
    """One sentence per item: why leaving it out changed the run, from the values that resume measured."""
    parts = [f"- **{item}**: {why(r, item)}." for item in r.ablation]
    skipped = [r.resume_at + 1 + i for i, v in enumerate(r.straight.skipped[r.resume_at:]) if v]
    if skipped:
        parts.append(f"- Note: the straight run's GradScaler skipped update{'s' if len(skipped) > 1 else ''} "
                     f"{', '.join(map(str, skipped))} (inf gradients at its grown scale: no weight changed); a resume "
                     f"that had not parted from it yet skipped {'them' if len(skipped) > 1 else 'it'} too, so its "
                     "weights can first differ only after an update that was applied.")
    missing = "" if "scaler" in r.ablation else (
        f"\n\nNo GradScaler ran here ({r.precision}), so the scaler is not an item of this run's checkpoint.")
    return Note("Why each resume parted from the straight run:\n\n" + "\n".join(parts) + missing)


def forgotten_note(r=None) -> Note:
    """What ``model.state_dict()`` does not hold, and people forget to save."""
    per_rank = ("each rank saves its own generators" if r is None else
                f"each rank saves its own generators (here one process; the demo's rng resume differed at "
                f"{_at(r.ablation['rng'].first_loss_diff) if 'rng' in r.ablation else 'an update not measured'})")
    return Note(
        "What a `model.state_dict()` does not hold, and a checkpoint must:\n\n"
        f"- **every RNG, per rank**: Python's `random`, NumPy's, torch's CPU generator and each GPU's -- {per_rank}; "
        "a rank that restores rank 0's generators draws rank 0's dropout masks. With DCP, key them by rank "
        "(`{f\"rng/rank{r}\": ...}`) or `torch.save` them to one file per rank: one key saved by every rank is "
        "deduplicated, and every rank loads one rank's value back. And randomness inside loader *workers* (random "
        "augmentation) is in other processes, out of `rng_state()`'s reach: derive it from (seed, epoch, index) "
        "in `__getitem__`, or use a stateful loader (torchdata's `StatefulDataLoader`).\n"
        "- **the loader's position**: the epoch and the samples the *training loop* consumed -- with workers the "
        "loader has prefetched more than that; and the shuffle must come from a generator of its own (seeded "
        "by epoch), not from the global one.\n"
        "- **the GradScaler**: its scale and growth counter (fp16 only; bf16 and fp32 runs have none).\n"
        "- **the scheduler's step count**: a fresh scheduler restarts the warm-up.\n"
        "- **the optimizer's state**: Adam's moments and step counts (SGD without momentum has none).\n"
        "- **where you are inside an update**: with gradient accumulation, a save between micro-batches loses "
        "the gradients summed so far and the accumulation counter -- save (and resume) only at update "
        "boundaries, as `save_checkpoint`'s `step` counts them.\n"
        "- on GPUs, deterministic kernels for a bit-exact comparison (`torch.use_deterministic_algorithms(True)`, "
        "`CUBLAS_WORKSPACE_CONFIG=:4096:8`): not state, but without them two straight runs may already differ.")


def ablation_chart(r, ax=None):
    """|loss(resumed without the item) - loss(straight)| per update after the resume, one line per item."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 2.8))
    h = r.resume_at
    xs = list(range(h + 1, r.updates + 1))
    tail = r.straight.losses[h:]
    floor = 1e-8
    for item, a in r.ablation.items():
        d = [max(abs(x - y), 0.0) for x, y in zip(a.losses, tail)]
        ax.plot(xs, [v if v > 0 else floor for v in d], marker="o", label=f"without {item}")
    full = [abs(x - y) for x, y in zip(r.resumed.losses, tail)]
    ax.plot(xs, [v if v > 0 else floor for v in full], "k--", marker="x", label="whole checkpoint")
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, None)
    ax.axhline(floor, color="0.7", lw=0.8)
    ax.text(xs[0], floor * 1.3, "equal (0)", fontsize=7, color="0.4")
    ax.set_xticks(xs)
    ax.set_xlabel(f"update (resumed after update {h})")
    ax.set_ylabel("|loss difference|")
    ax.set_title("Resumed with one item missing: where the run leaves the straight one")
    ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def needed_items(r) -> set:
    """The items this run's checkpoint needed: the model, and every item whose absence changed the run."""
    return {"model"} | {item for item, a in r.ablation.items() if a.first_param_diff is not None}


def guess_note(guess, r) -> Note:
    """The learner's predicted set of items against the measured one."""
    needed = needed_items(r)
    words = ", ".join(i for i in ITEMS if i in needed)
    if guess is None or guess is Ellipsis:
        return Note(f"**Items this run needed** (measured): {words}. (Write a prediction in the cell above next time "
                    "-- guessing first is how intuition gets built.)")
    if not isinstance(guess, (set, frozenset, list, tuple)) or any(g not in ITEMS for g in guess):
        raise ConfigError("my_guess_items", guess, "a set of items from " + ", ".join(ITEMS)
                          + ', e.g. {"model", "optimizer"}')
    guess = set(guess)
    if guess == needed:
        return Note(f"**Items needed:** you predicted exactly the measured set -- {words}.")
    missing = ", ".join(i for i in ITEMS if i in needed - guess) or "none"
    extra = ", ".join(i for i in ITEMS if i in guess - needed) or "none"
    return Note(f"**Items needed** (measured): {words}. You left out: {missing}; you named but this run did not "
                f"need: {extra}. The ablation below shows what each one left out does.")
