"""What chapter 02 shows of its measurements, as markdown that displays itself: each sentence follows from
what the run did (a GradScaler demo that never grew its scale must not say that it grew).

    display(precisionnotes.scaler_note(scaled, unscaled, growth_interval))
"""
from __future__ import annotations

import math

from ..base.errors import ConfigError
from ..base.numfmt import counted
from .course import Note
from .measurelab import Table  # chapter 00's markdown table: a table wraps between words at any width


def _trace(name, trace):
    if not isinstance(trace, list) or not trace or not all(isinstance(t, dict) and "scale" in t for t in trace):
        raise ConfigError(name, trace, "the demo's list of steps: dicts with loss, scale and skipped")


def scaler_note(scaled: list, unscaled: list, growth_interval: int) -> Note:
    """The GradScaler demo (``scaled``: one dict per step with the scale S it used, whether it was skipped
    and the loss; ``unscaled``: the same loop without scaling): how often S fell and grew, what was skipped."""
    _trace("scaled", scaled)
    _trace("unscaled", unscaled)
    n, skipped = len(scaled), sum(bool(t["skipped"]) for t in scaled)
    pairs = list(zip(scaled, scaled[1:]))
    grew = [i + 2 for i, (a, b) in enumerate(pairs) if b["scale"] > a["scale"]]  # step numbers, from 1
    low = min(t["scale"] for t in scaled)
    # a scale is a power of two: every digit of it, not three significant ones (1,048,576, not 1,050,000)
    fell = f"{skipped} of {n} steps were skipped while S came down from {scaled[0]['scale']:,.0f} to {low:,.0f}"
    if grew:
        steps = ("step " if len(grew) == 1 else "steps ") + ", ".join(map(str, grew))
        again = f"; after {counted(growth_interval, 'good step')} in a row S doubled again, at {steps}"
    else:
        again = (f"; S never grew again: no run of {counted(growth_interval, 'good step')} in a row came "
                 f"in these {n} steps")
    return Note(f"{fell}{again}. Final loss: {scaled[-1]['loss']:.3f} with scaling, "
                f"{unscaled[-1]['loss']:.3f} without.")


def tf32_note(per_product, err: dict) -> Note:
    """The emulated tf32 rounding: its error per product (a tensor of relative errors) and a whole
    matmul's relative error ``err`` {format: error against float64} for fp32, tf32 and bf16 inputs."""
    return Note(f"Emulated tf32 inputs: relative error per product up to **{per_product.max():.1e}** "
                f"(median {per_product.median():.1e}); a 512×512 matmul (fp32 sums) was off by "
                f"**{err['tf32']:.1e}** against float64 — fp32 {err['fp32']:.1e}, bf16 inputs {err['bf16']:.1e}.")


def flush_note(flushed: float, subnormal: float, flushed_scaled: float) -> Note:
    """What casting the fp32 gradients to fp16 would do: shares flushed to 0, subnormal, and flushed
    after a scale of 2^16."""
    return Note(f"In fp16, **{100 * flushed:.3f}%** of these gradient values would become 0 and "
                f"{100 * subnormal:.1f}% would be subnormal (fewer digits); multiplied by 2^16 = 65536 "
                f"first, {100 * flushed_scaled:.4f}% would become 0.")


def memory_table(runs: dict, state: tuple) -> Table:
    """{format: run} as a table: MiB of activations, of autocast weight copies and of the training
    state (the ``state`` keys: weights, gradients, optimizer), and the run's skipped steps."""
    def mib(key):
        return lambda r: r["s"][key] / 2**20

    rows = [dict(format=p, s=r.summary) for p, r in runs.items()]
    return Table(rows, [("format", "format", "{}"), (lambda r: r["s"]["model"], "model", "{}"),
                        (mib("activation_bytes"), "activations MiB", "{:.1f}"),
                        (mib("autocast_weight_copy_bytes"), "autocast weight copies MiB", "{:.1f}"),
                        (lambda r: sum(r["s"][k] for k in state) / 2**20, "weights + grads + Adam MiB",
                         "{:.1f}"),
                        (lambda r: r["s"]["skipped_steps"], "skipped steps", "{}")])


# what the speed comparison's verdict means (lk.course.explain picks one from the data)
GPU_FASTER = ("Tensor cores run 16-bit matmuls at several times the fp32 rate, and 16-bit tensors halve "
              "memory traffic.")
SLOWER = ("Layer norms, element-wise operations and the conversions to and from 16 bits do not get faster, "
          "and in this step they outweighed the matmuls. A larger model or micro-batch gives the matmuls a "
          "larger share.")
SAME = ("No direction showed above the scatter of the repeats: a training step is more than its matmuls "
        "(layer norms, element-wise operations, conversions), and a larger model or a quieter machine "
        "narrows the interval.")


def bf16_scaler_table(with_scaler: list, without: list) -> Table:
    """The bf16 loop step by step, with a GradScaler and without: loss, scale, skipped, weights finite."""
    rows = [dict(step=i, a=a, b=b) for i, (a, b) in enumerate(zip(with_scaler, without), 1)]
    return Table(rows, [("step", "step", "{}"), (lambda r: r["a"]["loss"], "with the scaler: loss", "{:.4f}"),
                        (lambda r: r["a"]["scale"], "scale", "{:.0f}"),
                        (lambda r: r["a"]["skipped"], "skipped", "{}"),
                        (lambda r: r["a"]["finite"], "weights finite", "{}"),
                        (lambda r: r["b"]["loss"], "without: loss", "{:.4f}"),
                        (lambda r: r["b"]["finite"], "weights finite", "{}")])


def bf16_scaler_note(with_scaler: list, without: list, bad_step: int) -> Note:
    """What the bf16 loops showed: which steps the scaler skipped (for overflow: any but the bad one), no
    error raised; and whether the loop without it turned NaN after the bad step."""
    skipped = [i for i, t in enumerate(with_scaler, 1) if t["skipped"]]
    over = sum(1 for i in skipped if i != bad_step)  # skipped for overflow: the normal steps
    later_nan = sum(not math.isfinite(t["loss"]) for t in without[bad_step:])
    return Note(f"**With the scaler:** steps skipped {skipped or 'none'} ({over} of the {len(with_scaler) - 1} "
                f"normal ones), no error raised, the weights "
                f"{'finite' if with_scaler[-1]['finite'] else 'non-finite'}. **Without it:** the weights are "
                f"{'finite' if without[-1]['finite'] else 'NaN'} after the bad step; {later_nan} of the "
                f"{len(without) - bad_step} later losses read nan.")
