"""The reveal: run the learner's fix and the right fix side by side and say what the measurement shows.

A knob fix (``"workers=1"``) is a Config change: both arms are ``lk.run``s, compared with
``compare_configs`` (interleaved repeats, a ratio of tokens/s with its 95 % interval, a verdict only when
the data show one) and by the case's signal (a count, a norm, a share), read from the comparison's own runs.
When the learner's fix is the right one the comparison is the case against it; when it leaves the run as
it was ("nothing to fix" on a broken run, a code change the engine's loop does not have, a knob already at
that value) the reveal says it changed nothing and runs nothing more.

A code-level mistake (``case.mistake``) is fixed in code: its loop in ``drills.mistakes`` runs corrected
(``buggy=False``) when the learner named its code fix, else buggy with the learner's knob change (if any).
Its arms are compared by their signal alone -- counts and norms, the same every run of this machine --
and not with ``compare_configs``: the loops are plain torch, not ``lk.run``, and their mistakes change
what is learned, not the speed.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Union

from ..base.errors import ConfigError, OutOfMemory
from ..base.numfmt import number
from ..chapters.course import smoke
from ..engine.rules import check as check_device
from ..engine.train import run
from ..tools.compare import compare_configs
from . import mistakes
from .cases import PAGE, Case
from .evidence import case_by_id, config_for, evidence
from .scoring import NO_FIX, all_fixes, fix_key

# signal -> its name in a sentence (the value follows): the page's "## Signals"
SIGNAL_WORDS = PAGE.signals
say = PAGE.say


def budget() -> dict:
    """The comparison's size: short in CI mode (``lk.course.smoke()``), a steadier one otherwise."""
    if smoke():
        return {"budget_s": 8.0, "min_repeats": 3, "warmup_runs": 0}
    return {"budget_s": 20.0, "min_repeats": 5, "warmup_runs": 1}


def show(signal: str, value) -> str:
    """A signal's value as a reader wants it: a share in %, a count plainly, None as 'not measured'."""
    if value is None:
        return "not measured"
    if isinstance(value, bool):
        return "yes" if value else "no"
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
    """Run ``fix`` (a key of ``scoring.all_fixes()``; None: the learner gave none) against ``case``'s right
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
    a, b, la, lb = ((case_cfg, right_cfg, "the case", "the right fix") if yours == right_cfg else
                    (yours, right_cfg, "your fix", "the right fix" if not case.healthy else "leaving it"))
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


__all__ = ["reveal", "budget", "show", "SIGNAL_WORDS"]
