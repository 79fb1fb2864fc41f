"""What a drill shows: the telemetry a real engineer's tools give of a run -- never its configuration.

``evidence(result)`` reads an ``lk.Result`` (or the same shape as a dict, which ``drills.mistakes``' loops
return) and keeps the learning rate and sequences per update a training log prints beside the curve, the
step-time split, utilisation, data wait, AllReduce calls per update, the memory
breakdown and peak, the loss and gradient-norm curves, skipped steps, how often clipping fired, the
dtype the profiler's matmuls take, and each update's telemetry (``records``, for the charts).
``run_case(case, "case" | "twin")`` runs one side of a case and returns its evidence.
"""
from __future__ import annotations

import math
import statistics
from typing import Optional

from ..base.errors import ConfigError, OutOfMemory
from ..chapters.course import smoke
from ..engine.config import Config
from ..engine.train import Result, run
from . import mistakes
from .cases import BASE, CASES, Case

# The summary's numbers a profiler, a logger or nvidia-smi shows, copied as they are.
SUMMARY_KEYS = ("step_time_s", "data_wait_s", "compute_s", "optimizer_s", "data_wait_frac", "tokens_per_s",
                "samples_per_s", "mfu", "hfu", "allreduce_calls_per_update", "allreduce_bytes_per_update",
                "peak_mem_bytes", "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes",
                "autocast_weight_copy_bytes", "first_loss", "final_loss", "skipped_steps", "nonfinite_steps",
                "grad_scale")
# What only the mistakes' loops measure (absent from an engine run's evidence).
EXTRA_KEYS = ("grad_zero_frac", "eval_losses", "eval_loss_spread", "timed_out", "collectives_per_rank",
              "hang_error", "param_norms_per_rank", "ranks_diverge_at_update", "oom_at_update", "error",
              "matmul_dtype")
# Per update, what a logger or profiler records (the charts draw these); no configuration among them.
RECORD_KEYS = ("update", "loss", "grad_norm", "grad_scale", "skipped", "step_time_s", "data_wait_s", "compute_s",
               "optimizer_s", "tokens_per_s", "peak_mem_bytes", "allreduce_calls", "mfu", "hfu")
# The dtype a profiler shows the matmuls (GEMM kernels) take under each precision: an observation of the
# run, the same one the trace would give (tf32 keeps float32 tensors; its kernels' names say tf32).
MATMUL_DTYPE = {"fp32": "float32", "tf32": "float32 (tf32 kernels)", "fp16": "float16", "bf16": "bfloat16"}
# Signals measured in counts, bytes and losses: the same on every run of one machine, so a test may
# compare them (speed is left to benchmarks).
DETERMINISTIC = ("allreduce_calls_per_update", "allreduce_bytes_per_update", "param_bytes", "grad_bytes",
                 "optimizer_bytes", "activation_bytes", "recompute_ratio", "skipped_steps", "nonfinite_steps",
                 "first_loss", "final_loss", "loss_drop", "grad_norm", "clip_frac", "lr_vs_sqrt_rule")
# The signals a mistake shows in (a healthy case must match its twin on every one of them). Memory bytes
# and speed are left out: a healthy look-alike may legitimately change the shape of each pass (four
# micro-batches of 2 hold fewer activations than one of 8) without anything being wrong.
SYMPTOMS = ("allreduce_calls_per_update", "recompute_ratio", "skipped_steps", "nonfinite_steps", "first_loss",
            "final_loss", "loss_drop", "grad_norm", "clip_frac", "grad_zero_frac", "eval_loss_spread", "timed_out",
            "ranks_diverge_at_update", "lr_vs_sqrt_rule")
WHICH = ("case", "twin")
# How far apart two runs' values of a signal must be before a reader can tell them apart -- what "within
# noise" means, per signal. "differs": a count, a flag or a logged value, the same on every run, so any
# difference tells; a number: a factor between the larger and the smaller value, for what varies from run
# to run (norms and shares of the step by a few per cent between seeds and repeats here; a learning rate
# read against the square-root rule needs more than the √2 of a batch one power of two off the course's).
# A value on one side and none on the other tells too: the instrument shows on one run only.
NOISE = {"allreduce_calls_per_update": "differs", "recompute_ratio": "differs", "timed_out": "differs",
         "grad_zero_frac": "differs", "eval_loss_spread": "differs", "oom_at_update": "differs",
         "grad_scale": "differs", "skipped_steps": "differs", "lr_vs_sqrt_rule": 1.5, "grad_norm": 2.0,
         "data_wait_frac": 2.0, "mfu": 2.0, "tokens_per_s": 2.0, "final_loss": 1.05, "loss_drop": 2.0}


def evidence(result) -> dict:
    """The evidence of one run: ``result`` is an ``lk.Result`` or a dict with "summary" and "records"
    (and optionally "clip", the clipping threshold, so the clipping rate can be told)."""
    logged = {}
    if isinstance(result, Result):
        summary, records = result.summary, result.records
        clip = result.config.grad_clip
        # what a training log prints beside every loss curve: the optimizer's learning rate (constant in these
        # runs) and the sequences one update averages over
        c = result.config
        logged = {"logged_lr": c.lr, "samples_per_update": c.micro_batch * c.accum * c.world_size}
        logged["lr_vs_sqrt_rule"] = lr_vs_sqrt_rule(logged["logged_lr"], logged["samples_per_update"])
    elif isinstance(result, dict) and isinstance(result.get("summary"), dict):
        summary, records, clip = result["summary"], result.get("records") or [], result.get("clip")
    else:
        raise ConfigError("result", type(result).__name__, "an lk.Result, or a dict with 'summary' and 'records'")
    ev = {k: summary.get(k) for k in SUMMARY_KEYS if k in summary}
    ev.update({k: summary[k] for k in EXTRA_KEYS if k in summary})
    ev.update(logged)
    ev["status"] = summary.get("status", "completed")
    if "matmul_dtype" not in ev and summary.get("precision") in MATMUL_DTYPE:
        ev["matmul_dtype"] = MATMUL_DTYPE[summary["precision"]]
    if summary.get("model_flops_per_step"):  # what HFU / MFU says: recompute in the backward pass
        ev["recompute_ratio"] = summary["hardware_flops_per_step"] / summary["model_flops_per_step"]
    losses = [r["loss"] for r in records]
    norms = [r["grad_norm"] for r in records]
    ev["losses"], ev["grad_norms"] = losses, norms
    if losses:
        ev.setdefault("first_loss", losses[0])
        ev.setdefault("final_loss", losses[-1])
        ev["loss_drop"] = ev["first_loss"] - ev["final_loss"]
    if norms:
        ev["grad_norm"] = statistics.median(norms)  # before clipping, as clip_grad_norm_ returns it
        ev["clip_frac"] = sum(n > clip for n in norms) / len(norms) if clip else 0.0
    ev["step_times_s"] = [r["step_time_s"] for r in records if "step_time_s" in r]
    ev["peak_mem_by_update"] = [r.get("peak_mem_bytes") for r in records]
    ev["records"] = [{k: r[k] for k in RECORD_KEYS if k in r} for r in records]
    return ev


def lr_vs_sqrt_rule(lr: float, samples_per_update: int) -> float:
    """The logged learning rate against AdamW's square-root rule from the course's tuned point (``lk.Config``'s
    lr for its micro-batch): 1 when scaled by √(batch ratio), 0.5 for 4x the batch at the unscaled lr. The
    drills' evidence keeps it for the tests and the reveal; a learner reads lr and batch off the log."""
    base = Config()
    return lr / (base.lr * math.sqrt(samples_per_update / base.micro_batch))


def separated(signal: str, a, b) -> bool:
    """Whether values ``a`` and ``b`` of ``signal`` are told apart (``NOISE``); None: not measured."""
    if signal not in NOISE:
        raise ConfigError("signal", signal, "one of " + ", ".join(NOISE))
    if a is None or b is None:
        return (a is None) != (b is None)
    rule = NOISE[signal]
    if rule == "differs":
        return a != b
    lo, hi = sorted((abs(float(a)), abs(float(b))))
    return hi > rule * lo


def case_by_id(case) -> Case:
    """``case`` itself, or the catalogue's case of that id."""
    if isinstance(case, Case):
        return case
    for c in CASES:
        if c.id == case:
            return c
    raise ConfigError("case", case, "a drills Case or one of the ids " + ", ".join(c.id for c in CASES))


def config_for(case, which: str = "case", steps: Optional[int] = None) -> Config:
    """The Config of one side of ``case``: BASE, then its knobs (or its twin's), then ``steps``."""
    case = case_by_id(case)
    if which not in WHICH:
        raise ConfigError("which", which, "'case' (the run to diagnose) or 'twin' (its healthy twin)")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 2):
        raise ConfigError("steps", steps, "None (the case's size) or an integer >= 2")
    knobs = {**BASE, "steps": 4 if smoke() else 8, **(case.knobs if which == "case" else case.twin)}
    if steps is not None:
        knobs["steps"] = steps
    return Config.from_dict(knobs)


def run_case(case, which: str = "case", steps: Optional[int] = None) -> dict:
    """Run one side of ``case`` (an id or a Case): "case" is the run with the mistake, "twin" its healthy
    twin. Returns its evidence. CI-sized (4 updates) when ``lk.course.smoke()``. A code-level mistake runs
    its loop in ``drills.mistakes``, buggy for "case" and corrected for "twin"; an out-of-memory run is
    evidence too (``oom_at_update``)."""
    case = case_by_id(case)
    config = config_for(case, which, steps)
    if case.mistake:
        return evidence(mistakes.run_loop(case.mistake, config, buggy=which == "case"))
    records = []
    try:
        result = run(config, on_step=records.append)
    except OutOfMemory as e:
        return evidence({"summary": {"status": "out of memory", "oom_at_update": len(records) + 1,
                                     "error": str(e)}, "records": records, "clip": config.grad_clip})
    return evidence(result)
