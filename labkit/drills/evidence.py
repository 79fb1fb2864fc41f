"""What a drill shows: the telemetry a real engineer's tools give of a run -- never its configuration --, as
rows of text (``evidence_rows``), and the reveal, which measures the learner's fix against the right one.

``evidence(result)`` reads an ``lk.Result`` (or the same shape as a dict, which ``drills.mistakes``' loops
return) and keeps what a training log, a profiler and nvidia-smi show of it (the keys below), with each
update's telemetry (``records``, for the charts). ``run_case(case, "case" | "twin")`` runs one side of a case
and returns its evidence; ``reveal(case, fix)`` runs the fix against the right one.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Optional, Union

from ..base.runtime import ConfigError, OutOfMemory
from ..base.numfmt import is_number, number
from ..chapters.course import smoke
from ..engine.config import Config
from ..engine.rules import check as check_device
from ..engine.measure import mfu_impossible
from ..engine.train import Result, run
from ..tools.compare import compare_configs
from . import mistakes
from .bank import BASE, CASES, NO_FIX, PAGE, Case, all_fixes, fix_key

say = PAGE.say

# The summary's numbers a profiler, a logger or nvidia-smi shows, copied as they are.
SUMMARY_KEYS = ("step_time_s", "data_wait_s", "compute_s", "optimizer_s", "data_wait_frac", "tokens_per_s",
                "samples_per_s", "mfu", "hfu", "allreduce_calls_per_update", "allreduce_bytes_per_update",
                "peak_mem_bytes", "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes",
                "autocast_weight_copy_bytes", "first_loss", "final_loss", "skipped_steps", "nonfinite_steps",
                "grad_scale")
# What only the mistakes' loops measure (absent from an engine run's evidence).
EXTRA_KEYS = ("grad_zero_frac", "eval_losses", "eval_loss_spread", "timed_out", "collectives_per_rank",
              "hang_error", "param_norms_per_rank", "ranks_diverge_at_update", "oom_at_update", "error",
              "matmul_dtype", "expert_shares", "max_expert_share", "tp_collectives",
              "tp_allreduce_calls")
# Per update, what a logger or profiler records (the charts draw these); no configuration among them.
RECORD_KEYS = ("update", "loss", "grad_norm", "grad_scale", "skipped", "step_time_s", "data_wait_s", "compute_s",
               "optimizer_s", "tokens_per_s", "peak_mem_bytes", "allreduce_calls", "mfu", "hfu")
# The dtype a profiler shows the matmuls (GEMM kernels) take under each precision: an observation of the
# run, the same one the trace would give (tf32 keeps float32 tensors; its kernels' names say tf32).
MATMUL_DTYPE = {"fp32": "float32", "tf32": "float32 (tf32 kernels)", "fp16": "float16", "bf16": "bfloat16"}
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
# A value on one side and none on the other tells too: the instrument shows on one run only. The busiest
# expert's share: 1.5 (the MoE drill's twin 0.26-0.36 over 30 seeds, the case 0.83-1.0).
NOISE = {"allreduce_calls_per_update": "differs", "recompute_ratio": "differs", "timed_out": "differs",
         "grad_zero_frac": "differs", "eval_loss_spread": "differs", "oom_at_update": "differs",
         "grad_scale": "differs", "skipped_steps": "differs", "lr_vs_sqrt_rule": 1.5, "grad_norm": 2.0,
         "data_wait_frac": 2.0, "mfu": 2.0, "tokens_per_s": 2.0, "final_loss": 1.05, "loss_drop": 2.0,
         "max_expert_share": 1.5, "tp_allreduce_calls": "differs"}


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
    return _safe_evidence(config)


def _ms(v) -> str:
    return say("unit-ms", value=number(1000 * v)) if isinstance(v, (int, float)) else "–"


def _mib(v) -> str:
    return say("unit-mib", value=f"{v / 2**20:,.2f}") if isinstance(v, (int, float)) else "–"


def _pct(v) -> str:
    return f"{100 * v:.3g} %" if isinstance(v, (int, float)) else "–"


# What evidence_rows reads, by kind: a number (or None), a list, a string. NaN is allowed: a run's loss may be.
# Its numbers: the summary's, but two no row shows (checked only where read), and the loops' own.
_EV_NUMBERS = tuple(k for k in SUMMARY_KEYS if k not in ("autocast_weight_copy_bytes", "nonfinite_steps")) + (
    "oom_at_update", "loss_drop", "grad_norm", "clip_frac", "grad_zero_frac", "max_expert_share", "tp_allreduce_calls")
_EV_LISTS = ("losses", "peak_mem_by_update", "eval_losses", "collectives_per_rank", "expert_shares")
_EV_LOSS_KEYS = ("first_loss", "final_loss", "loss_drop", "grad_norm")  # shown with the loss curve
# Each case's signal (``Case.signal``) and the evidence row that shows it (its name, the page's "name-..."
# sentence): a case's tell must be on screen.
SIGNAL_ROWS = {k: say(v) for k, v in {
    "allreduce_calls_per_update": "name-allreduce", "data_wait_frac": "name-data-wait",
    "tokens_per_s": "name-throughput", "mfu": "name-mfu", "grad_zero_frac": "name-zero-grads",
    "grad_scale": "name-loss-scale", "recompute_ratio": "name-mfu", "oom_at_update": "name-oom",
    "lr_vs_sqrt_rule": "name-optimizer", "grad_norm": "name-grad-norm", "eval_loss_spread": "name-evaluation",
    "timed_out": "name-hang", "final_loss": "name-loss", "loss_drop": "name-loss",
    "max_expert_share": "name-experts", "tp_allreduce_calls": "name-tp"}.items()}


def _check_evidence(ev) -> None:
    """Every key evidence_rows reads, of the kind it reads; else a ConfigError naming it (before any row)."""
    if not isinstance(ev, dict):
        raise ConfigError("ev", type(ev).__name__, "a drill's evidence: a dict from lk.drills.evidence(result)")
    for k in _EV_NUMBERS:
        if ev.get(k) is not None and not is_number(ev[k]):
            raise ConfigError(f"ev[{k!r}]", ev[k], "a number or None (lk.drills.evidence makes it)")
    for k in _EV_LISTS:
        v = ev.get(k)
        if v is not None and (not isinstance(v, (list, tuple)) or not all(x is None or is_number(x) for x in v)):
            raise ConfigError(f"ev[{k!r}]", v, "a list of numbers or None (lk.drills.evidence makes it)")
    for k in ("matmul_dtype", "hang_error"):
        if ev.get(k) is not None and not isinstance(ev[k], str):
            raise ConfigError(f"ev[{k!r}]", ev[k], "a string or None")
    if ev.get("losses"):
        for k in _EV_LOSS_KEYS:
            if not is_number(ev.get(k)):
                raise ConfigError(f"ev[{k!r}]", ev.get(k), "a number: evidence with losses carries it too")


def evidence_rows(ev: dict) -> list:
    """[(what, value as text)] for every instrument the run's evidence holds, as the chapters show them (the
    values' words are the page's "row-..." sentences)."""
    _check_evidence(ev)
    rows = []
    if ev.get("status") not in (None, "completed"):
        status = say("status-oom") if ev["status"] == "out of memory" else str(ev["status"])
        rows.append((say("name-run"), status))
    if ev.get("step_time_s") is not None:
        rows.append((say("name-step-time"), say("row-step-time", step=_ms(ev["step_time_s"]),
                                                data=_ms(ev.get("data_wait_s")),
                                                compute=_ms(ev.get("compute_s")),
                                                optimizer=_ms(ev.get("optimizer_s")))))
        rows.append((say("name-data-wait"), say("row-data-wait", share=_pct(ev.get("data_wait_frac")))))
        rows.append((say("name-throughput"), say("row-throughput", tokens=number(ev.get("tokens_per_s") or 0),
                                                 samples=number(ev.get("samples_per_s") or 0))))
    if mfu_impossible(ev.get("mfu")):  # above 1 is not a measurement: never shown as one
        rows.append((say("name-mfu"), say("row-mfu-wrong", mfu=say("mfu-above-peak"))))
    elif ev.get("mfu") is not None:
        rows.append((say("name-mfu"), say("row-mfu", mfu=_pct(ev["mfu"]), hfu=_pct(ev.get("hfu")))))
    if ev.get("allreduce_calls_per_update") is not None:
        rows.append((say("name-allreduce"), say("row-allreduce", calls=number(ev["allreduce_calls_per_update"]),
                                                bytes=_mib(ev.get("allreduce_bytes_per_update")))))
    if ev.get("param_bytes") is not None:
        rows.append((say("name-memory"), say("row-memory", params=_mib(ev["param_bytes"]),
                                             grads=_mib(ev.get("grad_bytes")),
                                             optimizer=_mib(ev.get("optimizer_bytes")),
                                             activations=_mib(ev.get("activation_bytes")),
                                             peak=_mib(ev.get("peak_mem_bytes")))))
    if ev.get("oom_at_update"):
        peaks = ", ".join(_mib(p) for p in ev.get("peak_mem_by_update") or [])
        rows.append((say("name-oom"), say("row-oom" if peaks else "row-oom-first", update=ev["oom_at_update"],
                                          peaks=peaks)))
    if ev.get("matmul_dtype"):
        rows.append((say("name-profiler"), say("row-profiler", dtype=ev["matmul_dtype"])))
    if ev.get("logged_lr") is not None:
        rows.append((say("name-optimizer"), say("row-optimizer", lr=f"{ev['logged_lr']:g}",
                                                sequences=ev.get("samples_per_update"))))
    if ev.get("losses"):
        rows.append((say("name-loss"), say("row-loss", first=f"{ev['first_loss']:.4f}",
                                           final=f"{ev['final_loss']:.4f}", updates=len(ev["losses"]),
                                           drop=f"{ev['loss_drop']:.4f}")))
        rows.append((say("name-grad-norm"), say("row-grad-norm", norm=number(ev["grad_norm"]),
                                                clipped=_pct(ev.get("clip_frac")))))
    if ev.get("grad_scale") is not None:
        rows.append((say("name-loss-scale"), say("row-loss-scale", scale=number(ev["grad_scale"]))))
    if ev.get("skipped_steps") is not None:
        rows.append((say("name-skipped"), str(ev["skipped_steps"])))
    if ev.get("grad_zero_frac") is not None:
        rows.append((say("name-zero-grads"), say("row-zero-grads", share=_pct(ev["grad_zero_frac"]))))
    if ev.get("eval_losses"):
        losses = ", ".join(f"{v:.6f}" for v in ev["eval_losses"])
        rows.append((say("name-evaluation"), say("row-evaluation", losses=losses)))
    if ev.get("collectives_per_rank"):
        counts = ", ".join(f"{say('rank', rank=r)}: {n}" for r, n in enumerate(ev["collectives_per_rank"]))
        rows.append((say("name-collectives"), say("row-collectives", counts=counts)))
    if ev.get("param_norms_per_rank"):
        where = ev.get("ranks_diverge_at_update")
        norms = "; ".join(f"{say('rank', rank=r)}: " + ", ".join(f"{v:.6f}" for v in n)
                          for r, n in enumerate(ev["param_norms_per_rank"]))
        key = "row-parameters-differ" if where else "row-parameters-same"
        rows.append((say("name-parameters"), say(key, norms=norms, update=where)))
    if ev.get("timed_out"):
        rows.append((say("name-hang"), say("row-hang", error=ev.get("hang_error", ""))))
    if ev.get("expert_shares"):
        shares = ev["expert_shares"]
        rows.append((say("name-experts"), say("row-experts", shares=", ".join(_pct(s) for s in shares),
                                              largest=_pct(ev.get("max_expert_share")),
                                              even=_pct(1 / len(shares)))))
    if ev.get("tp_collectives"):
        kinds = ev["tp_collectives"]
        rows.append((say("name-tp"), say("row-tp-collectives", gathers=kinds.get("all_gather", 0),
                                         scatters=kinds.get("reduce_scatter", 0),
                                         reduces=kinds.get("all_reduce", 0))))
    return rows


# The reveal: run the learner's fix and the right fix side by side and say what the measurement shows.
#
# A knob fix (``"workers=1"``) is a Config change: both arms are ``lk.run``s, compared with
# ``compare_configs`` (interleaved repeats, a ratio of tokens/s with its 95 % interval, a verdict only when
# the data show one) and by the case's signal (a count, a norm, a share), read from the comparison's own runs.
# When the learner's fix is the right one the comparison is the case against it; when it leaves the run as
# it was ("nothing to fix" on a broken run, a code change the engine's loop does not have, a knob already at
# that value) the reveal says it changed nothing and runs nothing more.
#
# A code-level mistake (``case.mistake``) is fixed in code: its loop in ``drills.mistakes`` runs corrected
# (``buggy=False``) when the learner named its code fix, else buggy with the learner's knob change (if any).
# Its arms are compared by their signal alone -- counts and norms, the same every run of this machine --
# and not with ``compare_configs``: the loops are plain torch, not ``lk.run``, and their mistakes change
# what is learned, not the speed.


def budget() -> dict:
    """The comparison's size: short in CI mode (``lk.course.smoke()``), a steadier one otherwise."""
    if smoke():
        return {"budget_s": 8.0, "min_repeats": 3, "warmup_runs": 0}
    return {"budget_s": 20.0, "min_repeats": 5, "warmup_runs": 1}


def show(signal: str, value) -> str:
    """A signal's value as a reader wants it: a share in %, a count plainly, None as 'not measured'."""
    if value is None:
        return say("value-not-measured")
    if isinstance(value, bool):
        return say("value-yes") if value else say("value-no")
    if signal.endswith("_frac"):
        return f"{100 * value:.3g} %"
    return number(value) if isinstance(value, (int, float)) else str(value)


def _safe_evidence(config) -> dict:
    """One run's evidence; an out-of-memory run is evidence too (which update failed)."""
    records = []
    try:
        return evidence(run(config, on_step=records.append))
    except OutOfMemory as e:
        return evidence({"summary": {"status": "out of memory", "oom_at_update": len(records) + 1, "error": str(e)},
                         "records": records, "clip": config.grad_clip})


def reveal(case, fix: Optional[str], case_evidence: Optional[dict] = None,
           progress: Union[bool, Callable[[float, float, int], None]] = False, size: Optional[dict] = None) -> dict:
    """Run ``fix`` (a key of ``all_fixes()``; None: the learner gave none) against ``case``'s right
    fix. Returns {"case", "fix", "right_fix", "right", "changed_nothing", "signal", "values" {arm: value},
    "comparison" (a Comparison or None), "verdict" (the key of the page's sentence that opens the reveal:
    reveal-right, reveal-wrong, reveal-changed-nothing, reveal-cannot-run, reveal-oom, reveal-healthy-...),
    "sentence", "words"}. ``case_evidence``: the case's evidence, when
    the drill has it already (else it is run). ``progress``: True for the comparison's own progress line,
    or a function told ``(seconds so far, the budget's seconds, runs done)`` after each run (the widget's)."""
    if not isinstance(progress, bool) and not callable(progress):
        raise ConfigError("progress", progress, "True, False, or a function (seconds, budget seconds, runs)")
    case = case_by_id(case)
    fix = NO_FIX if fix is None else fix
    fixes = all_fixes()
    if fix not in fixes:
        raise ConfigError("fix", fix, "one of: " + "; ".join(fixes))
    if case.mistake:
        return _reveal_code(case, fix, fixes[fix], case_evidence)
    return _reveal_knobs(case, fix, fixes[fix], case_evidence, progress, size or budget())


def _out(case: Case, fix: str, changed_nothing: bool, values: dict, comparison, verdict: str, *parts) -> dict:
    """The reveal's result; ``verdict`` is the key of its first sentence (the page's), ``parts`` the
    sentences after it (the case's explanation last)."""
    return {"case": case.id, "fix": fix, "right_fix": fix_key(case), "right": fix == fix_key(case),
            "changed_nothing": changed_nothing, "signal": case.signal, "values": values, "comparison": comparison,
            "verdict": verdict, "sentence": " ".join(p for p in parts if p), "words": case.words}


def _reveal_knobs(case: Case, fix: str, knobs: dict, case_ev, progress: bool, size: dict) -> dict:
    case_cfg = config_for(case, "case")
    right_cfg = case_cfg if case.healthy else config_for(case, "twin")
    sig = case.signal
    case_ev = case_ev if case_ev is not None else _safe_evidence(case_cfg)
    values = {"case": case_ev.get(sig)}
    try:
        yours = case_cfg.replace(**knobs)
        check_device(yours)
    except ConfigError as e:
        return _out(case, fix, True, values, None, "reveal-cannot-run", say("reveal-cannot-run", fix=fix, error=e),
                    *_right_words(case))
    if yours == case_cfg:
        if case.healthy:
            return _out(case, fix, True, values, None, "reveal-healthy-right", say("reveal-healthy-right"),
                        case.words)
        return _out(case, fix, True, values, None, "reveal-changed-nothing", say(
            "reveal-changed-nothing", answer=fix, signal=PAGE.signal(sig), case=show(sig, values["case"])),
            *_right_words(case))
    if sig == "oom_at_update":  # an arm that runs out of memory has no speed to compare
        values.update(yours=_safe_evidence(yours).get(sig), right=_safe_evidence(right_cfg).get(sig))
        return _out(case, fix, False, values, None, "reveal-oom", _oom_words(case, fix, values), case.words)
    right_words = say("label-right-fix") if not case.healthy else say("label-leaving")
    a, b, la, lb = ((case_cfg, right_cfg, say("label-case"), say("label-right-fix")) if yours == right_cfg else
                    (yours, right_cfg, say("label-yours"), right_words))
    cmp = compare_configs(a, b, metric="tokens_per_s", label_a=la, label_b=lb, progress=progress is True,
                          run_fn=_told_run(progress, size["budget_s"]), **size)
    ev_a, ev_b = evidence(cmp.results_a[0]), evidence(cmp.results_b[0])
    values.update(yours=(ev_b if yours == right_cfg else ev_a).get(sig), right=ev_b.get(sig))
    return _out(case, fix, False, values, cmp, *_knob_words(case, fix, yours == right_cfg, values, cmp), case.words)


def _told_run(progress, budget_s: float):
    """``lk.run``, telling ``progress`` after each run when it is a function (a comparison takes 20-45 s)."""
    if not callable(progress):
        return run
    t0, runs = time.perf_counter(), [0]

    def told(config):
        result = run(config)
        runs[0] += 1
        progress(time.perf_counter() - t0, budget_s, runs[0])
        return result
    return told


def _right_words(case: Case) -> tuple:
    return say("reveal-right-fix-is", right_fix=fix_key(case)), case.words


def _lower_loss_words(case: Case, fix: str, values: dict) -> str:
    """Why a healthy run's loss fell with a learner's higher learning rate, and why that proves nothing: the
    reveal would otherwise call "not needed" a change that its own figures show as better."""
    yours, was = values.get("yours"), values.get("case")
    lower = case.signal == "final_loss" and isinstance(yours, float) and isinstance(was, float) and yours < was
    if not ("lr" in all_fixes().get(fix, {}) and lower):
        return ""
    return say("reveal-lower-loss")


def _knob_words(case: Case, fix: str, right: bool, values: dict, cmp) -> tuple:
    """(verdict key, its sentence, the speed's sentence[, the lower loss's])."""
    sig = case.signal
    shown = {k: show(sig, v) for k, v in values.items()}
    speed = cmp.sentence.replace("**", "")
    if case.healthy:
        key = "reveal-healthy-unneeded-same" if values["case"] == values["yours"] else "reveal-healthy-unneeded"
        return (key, say(key, fix=fix, signal=PAGE.signal(sig), **shown), _lower_loss_words(case, fix, values),
                say("reveal-speed-healthy", speed=speed))
    if right:
        return ("reveal-right", say("reveal-right", fix=fix, signal=PAGE.signal(sig), **shown),
                say("reveal-speed-right", speed=speed))
    return ("reveal-wrong", say("reveal-wrong", fix=fix, signal=PAGE.signal(sig), right_fix=fix_key(case), **shown),
            say("reveal-speed-wrong", speed=speed))


def _oom_words(case: Case, fix: str, values: dict) -> str:
    def fate(v):
        return say("fate-oom", update=v) if v else say("fate-completed")
    return say("reveal-oom", fix=fix, right_fix=fix_key(case), **{k: fate(v) for k, v in values.items()})


def _reveal_code(case: Case, fix: str, knobs: dict, case_ev) -> dict:
    def loop(config, buggy):
        return mistakes.run_loop(case.mistake, config, buggy)
    cfg = config_for(case, "case")
    sig, words = case.signal, PAGE.signal(case.signal)
    case_ev = case_ev if case_ev is not None else evidence(loop(cfg, buggy=True))
    right_ev = evidence(loop(cfg, buggy=False))
    values = {"case": case_ev.get(sig), "right": right_ev.get(sig)}
    how = say("reveal-code-how")  # this plain-torch loop gives the same counts every run: no repeats
    if fix == fix_key(case):
        values["yours"] = values["right"]
        shown = {k: show(sig, v) for k, v in values.items()}
        return _out(case, fix, False, values, None, "reveal-right", say("reveal-right", fix=fix, signal=words, **shown),
                    how, case.words)
    try:
        yours_cfg = cfg.replace(**knobs)
    except ConfigError:
        yours_cfg = cfg
    if yours_cfg == cfg:
        values["yours"] = values["case"]
        shown = {k: show(sig, v) for k, v in values.items()}
        return _out(case, fix, True, values, None, "reveal-changed-nothing", say(
            "reveal-code-changed-nothing", answer=fix, signal=words, **shown), *_right_words(case))
    values["yours"] = evidence(loop(yours_cfg, buggy=True)).get(sig)
    shown = {k: show(sig, v) for k, v in values.items()}
    return _out(case, fix, False, values, None, "reveal-wrong", say(
        "reveal-code-wrong", fix=fix, signal=words, right_fix=fix_key(case), **shown), how, case.words)
