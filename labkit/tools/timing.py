"""The one interleaved timing loop, and the medians read from what runs kept.

    times = interleaved({"eager": f, "compiled": g}, max_rounds=15, warmup_rounds=2, budget_s=8.0,
                        min_rounds=3, timed_on=dev)             # {name: [seconds, ...]}
    median_of(cmp.results_a, "mfu")                             # the median of one summary key over runs

``interleaved`` calls A B C, A B C, ... so that a drift in the machine's load hits every case alike; the first
rounds are warm-up (first calls allocate memory and pick kernels) and are dropped; a time budget ends the loop
before a round that would overrun it. Chapter 05's loader loops (``loaderlab.interleaved``) and chapter 07's
kernel timings (``kernels.interleaved``) both run through it. With ``timed_on`` (a device) it keeps each
call's own seconds, the device synchronised before and after (the work is finished when the clock stops);
without, what each call returned (a loop that times itself, such as a whole training run).
"""
from __future__ import annotations

import math
import time

from ..base.errors import ConfigError
from ..base.progress import Progress
from ..base.schema import summary_of
from ..engine.config import _int, _num  # Config's own checks: one wording for every refusal
from ..engine.device import synchronize, torch_device
from ..engine.measure import median


def timed(fn, device=None):
    """``fn`` made into a function that returns the seconds one call took, the device synchronised before
    (no earlier work is counted) and after (the call is over when the device has finished it)."""
    dev = device or torch_device()

    def call() -> float:
        synchronize(dev)
        t0 = time.perf_counter()
        fn()
        synchronize(dev)
        return time.perf_counter() - t0

    return call


def _check(fns, max_rounds, warmup_rounds, budget_s, min_rounds) -> None:
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise ConfigError("fns", fns, "a non-empty dict {name: function taking no arguments}")
    _int("max_rounds", max_rounds, 1, 10**6)
    _int("warmup_rounds", warmup_rounds, 0, 10**6)
    _int("min_rounds", min_rounds, 1, 10**6)
    if budget_s is not None:
        _num("budget_s", budget_s, 0.0, 86_400.0)  # 0: stop as soon as min_rounds are kept; NaN, inf refused


def interleaved(fns: dict, *, max_rounds: int, warmup_rounds: int = 0, budget_s: float | None = None,
                min_rounds: int = 2, timed_on=None, progress: bool = False) -> dict:
    """Call every ``fns[name]()`` in turn, round after round (A B C A B C ...), and keep what each call
    returned -- or, with ``timed_on`` (a device), the seconds it took (``timed``) -- the first
    ``warmup_rounds`` rounds left out. Ends after ``max_rounds`` kept rounds, or -- with a ``budget_s`` --
    once ``min_rounds`` are kept and one more round (the median round so far) would overrun the budget.
    ``progress``: a line counting the rounds (it shows after a second). Returns {name: [...]}."""
    _check(fns, max_rounds, warmup_rounds, budget_s, min_rounds)
    if timed_on is not None:
        fns = {name: timed(fn, timed_on) for name, fn in fns.items()}
    out = {name: [] for name in fns}
    t0, round_s, rounds = time.perf_counter(), [], 0
    # the bar counts rounds up to max_rounds; a budget usually ends it earlier, and the note says so
    with Progress(max_rounds + warmup_rounds, f"{len(fns)} cases interleaved",
                  delay=1.0 if progress else math.inf) as bar:
        while True:
            t_round = time.perf_counter()
            for name, fn in fns.items():
                value = fn()
                if rounds >= warmup_rounds:
                    out[name].append(value)
            rounds += 1
            round_s.append(time.perf_counter() - t_round)
            kept = rounds - warmup_rounds
            budget = f"; budget {budget_s:.0f} s" if budget_s is not None else ""
            bar.update(rounds, note=f"{max(0, kept)} round(s) kept{budget}")
            if kept >= max_rounds:
                break
            # never start a round the budget has no room for: a budget is a promise to the learner's wait
            if budget_s is not None and kept >= min_rounds and \
                    time.perf_counter() - t0 + median(round_s) > budget_s:
                break
    return out


# ---- runs in, medians out ----------------------------------------------------------------------------------
# Chapters and checkers accept a Result, a {"summary": ..., "records": ...} dict, a bare summary dict, or a list
# of those (repeats of one configuration): one reading for all of them.


def as_runs(x) -> list:
    """A list of runs from one run or a list/tuple of them; [] when ``x`` holds no run."""
    if isinstance(x, (list, tuple)):
        return [r for r in x if summary_of(r) is not None]
    return [x] if summary_of(x) is not None else []


def median_of(results, key):
    """The median of ``key`` over the runs' summaries (one run or a list of them); only finite numbers count,
    and None where no run has one."""
    vals = [summary_of(r).get(key) for r in as_runs(results)]
    return median([float(v) for v in vals
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)])
