"""Chapter 02's instruments: what its demos and probes did, as data -- rows or figures plus, where the
chapter draws a conclusion, the outcome's name (for ``lk.course.explain``); the sentences are in its cells."""
from __future__ import annotations

import math

import torch

from ..base.runtime import ConfigError
from .course import UNDER_LOAD, remeasure_peak

# a 16-bit format counts as fast at this multiple of fp32's matmul peak (engine.device.fast_formats' rule)
FAST_RATIO = 1.2


def matmul_speeds(env: dict, remeasure=True) -> list:
    """One row per format of ``lk.env()``'s report: its matmul peak (FLOP/s), where that came from, and its
    ratio to fp32's. A peak probed while other programs used the cores measured them, not the hardware: it is
    probed once more (``remeasure``: True for the course's probe, False for not again, or a function
    ``(precision) -> (FLOP/s, still_loaded)``), and if the machine is still busy it is refused, not used.
    ``verdict`` per row: 'reference' (fp32), 'faster' (at least FAST_RATIO × fp32), 'not_faster', or 'refused'
    (this peak or fp32's was probed under load)."""
    if not isinstance(env, dict) or not isinstance(env.get("peak_flops"), dict):
        raise ConfigError("env", type(env).__name__, "the report lk.env() returns")
    if remeasure is True:
        remeasure = remeasure_peak
    elif remeasure is not False and not callable(remeasure):
        raise ConfigError("remeasure", remeasure, "True, False, or a function (precision) -> (FLOP/s, under_load)")
    rows = {}
    for p, peak in env["peak_flops"].items():
        flops, source = (peak or {}).get("flops"), str((peak or {}).get("source") or "")
        loaded = UNDER_LOAD in source
        remeasured = False
        if loaded and remeasure:
            flops, loaded = remeasure(p)
            remeasured = True
        rows[p] = {"format": p, "flops": flops, "tflops": flops / 1e12 if flops else None, "under_load": loaded,
                   "remeasured": remeasured, "source": "datasheet" if source and not source.startswith("measured")
                   else "this machine's matmul probe"}
    fp32 = rows.get("fp32")
    for p, row in rows.items():
        base_ok = fp32 is not None and fp32["flops"] and not fp32["under_load"]
        row["vs_fp32"] = row["flops"] / fp32["flops"] if base_ok and row["flops"] else None
        row["verdict"] = ("reference" if p == "fp32" and not row["under_load"] else
                          "refused" if row["vs_fp32"] is None or row["under_load"] else
                          "faster" if row["vs_fp32"] >= FAST_RATIO else "not_faster")
    return list(rows.values())


def speeds_verdict(rows: list) -> str:
    """What ``matmul_speeds``' rows allow the chapter to say, as an outcome name: 'faster' (some 16-bit format's
    peak reached FAST_RATIO × fp32's), 'refused' (none did, and some could not be judged: probed under load),
    or 'none' (every 16-bit peak was judged, none reached it)."""
    verdicts = [r["verdict"] for r in rows if r["format"] != "fp32"]
    return "faster" if "faster" in verdicts else "refused" if "refused" in verdicts or not verdicts else "none"


def flush_rows(g32: torch.Tensor, scale: float = 2.0**16) -> list:
    """What storing fp32 gradients ``g32`` in fp16 would do, as it is and multiplied by ``scale`` first: the
    shares of all values that were non-zero and become 0, and that land among fp16's subnormals."""
    if not torch.is_tensor(g32) or not g32.is_floating_point():
        raise ConfigError("g32", type(g32).__name__, "a floating-point tensor of gradients")
    tiny = torch.finfo(torch.float16).tiny
    rows = []
    for label, s in (("as computed", 1.0), (f"× {scale:,.0f} first", scale)):
        g = (g32 * s).abs()
        rows.append({"cast": label, "scale": s, "flushed": ((g != 0) & (g.half() == 0)).float().mean().item(),
                     "subnormal": ((g > 0) & (g < tiny)).float().mean().item()})
    return rows


def _trace(name, trace):
    if not isinstance(trace, list) or not trace or not all(isinstance(t, dict) and "scale" in t for t in trace):
        raise ConfigError(name, trace, "the demo's list of steps: dicts with loss, scale and skipped")


def scaler_story(scaled: list, unscaled: list) -> dict:
    """The GradScaler demo (``scaled``: one dict per step with the scale S it used, whether it was skipped and
    the loss; ``unscaled``: the same loop without scaling) as figures: steps, skipped, S's start and lowest
    value, the steps (from 1) at which S grew, both final losses; ``verdict`` 'grew' or 'never_grew'."""
    _trace("scaled", scaled)
    _trace("unscaled", unscaled)
    grew = [i + 2 for i, (a, b) in enumerate(zip(scaled, scaled[1:])) if b["scale"] > a["scale"]]
    return {"steps": len(scaled), "skipped": sum(bool(t["skipped"]) for t in scaled),
            # a scale is a power of two: every digit of it (1048576), not three significant ones
            "start": int(scaled[0]["scale"]), "low": int(min(t["scale"] for t in scaled)),
            "grew_at": grew, "loss_scaled": scaled[-1]["loss"], "loss_unscaled": unscaled[-1]["loss"],
            "verdict": "grew" if grew else "never_grew"}


def update_loop_counts(report: dict) -> dict:
    """``check.precision.inspect_update_loop``'s report, each figure once per update: the AllReduce calls of an
    update (None where the updates differ: ``allreduce_each`` lists them) and the GradScalers made per update
    (the report counts every one made over all its updates)."""
    if not isinstance(report, dict) or not {"K", "allreduce_per_update", "grad_scalers"} <= set(report):
        raise ConfigError("report", type(report).__name__, "what inspect_update_loop returns")
    each = list(report["allreduce_per_update"])
    updates = len(each)
    return {"K": report["K"], "updates": updates, "allreduce_each": each,
            "allreduce_per_update": each[0] if each and len(set(each)) == 1 else None,
            "grad_scalers_per_update": report["grad_scalers"] / updates if updates else None,
            "verdict": "same_each_update" if each and len(set(each)) == 1 else "differs"}


def memory_rows(runs: dict, state: tuple) -> list:
    """{format: run} as rows of MiB: activations, autocast weight copies, the training state (the ``state``
    keys of a summary: weights, gradients, optimizer) and the run's skipped steps."""
    mib = 2**20
    return [{"format": p, "model": r.summary["model"], "activations": r.summary["activation_bytes"] / mib,
             "copies": r.summary["autocast_weight_copy_bytes"] / mib,
             "state": sum(r.summary[k] for k in state) / mib, "skipped": r.summary["skipped_steps"]}
            for p, r in runs.items()]


def bf16_scaler_rows(with_scaler: list, without: list) -> list:
    """The bf16 loops step by step, with a GradScaler and without: loss, scale, skipped, weights finite."""
    return [{"step": i, "loss": a["loss"], "scale": a["scale"], "skipped": a["skipped"], "finite": a["finite"],
             "loss_without": b["loss"], "finite_without": b["finite"]}
            for i, (a, b) in enumerate(zip(with_scaler, without), 1)]


def bf16_scaler_summary(with_scaler: list, without: list, bad_step: int) -> dict:
    """What the bf16 loops showed: the steps the scaler skipped (and how many of the normal ones, i.e. not
    ``bad_step``), whether each loop's weights ended finite, how many later losses read nan. ``verdict``:
    'hidden' (the scaler's weights finite, the plain loop's not: the scaler hid the bad step), 'both_finite',
    or 'scaler_broke' (non-finite weights even with the scaler)."""
    skipped = [i for i, t in enumerate(with_scaler, 1) if t["skipped"]]
    fine_with, fine_without = bool(with_scaler[-1]["finite"]), bool(without[-1]["finite"])
    return {"skipped": ", ".join(map(str, skipped)) or "none",
            "over": sum(1 for i in skipped if i != bad_step), "normal": len(with_scaler) - 1,
            "later_nan": sum(not math.isfinite(t["loss"]) for t in without[bad_step:]),
            "later": len(without) - bad_step, "finite_with": fine_with, "finite_without": fine_without,
            "verdict": "scaler_broke" if not fine_with else "hidden" if not fine_without else "both_finite"}
