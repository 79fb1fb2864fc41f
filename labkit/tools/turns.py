"""Timing loops that are called one at a time, in turn, within a time budget that holds between calls.

    runs = in_turn({"a": f, "b": g, "c": h}, budget_s=25, max_repeats=30, settled=lambda runs: ...)

``timing.interleaved`` keeps whole rounds (A B C) and always keeps two of them: right for calls of
milliseconds. A call that is itself a whole training loop of seconds needs a finer grain -- three loops
of 7 s under load made two rounds plus a warm-up cost 65 s against a 25 s budget. Here the budget is
checked before every call, the turn rotates each round (A B C, B C A, C A B, ...) so that a stop mid-round
shortens no case more than another, and a ``settled`` test may end the loop early.
"""
from __future__ import annotations

import math
import time

from ..base.runtime import ConfigError
from ..base.frontend import Progress
from ..engine.config import _int, _num  # the Config's own checks: one wording for every refusal
from ..engine.measure import median


def in_turn(fns: dict, *, budget_s: float, max_repeats: int, settled=None, finished=None,
            progress: bool = False) -> dict:
    """Call the ``fns`` one at a time, in a turn that rotates every round (A B C, B C A, ...). Before each
    call: stop if it would overrun ``budget_s`` -- its own median call so far, or the slowest call so far
    before its first, predicts it (the very first call is the one the budget cannot foresee). After each
    round: stop once ``settled(runs)`` says so, and leave out of the turn from then on the names that
    ``finished(runs)`` returns (a case whose every verdict is settled: the budget goes to the cases still
    open). No call is thrown away as a warm-up: a call that needs one drops its own first steps
    (``ch05_loader.time_loop`` drops its first update). Returns {name: [what the calls returned]}; among
    the cases still in the turn the counts differ by one at most."""
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise ConfigError("fns", fns, "a non-empty dict {name: function taking no arguments}")
    _num("budget_s", budget_s, 0.0, 86_400.0, lo_open=True)
    _int("max_repeats", max_repeats, 1, 10_000)
    for name, f in (("settled", settled), ("finished", finished)):
        if f is not None and not callable(f):
            raise ConfigError(name, f, "None or a function of the runs so far")
    names, t0, slowest = list(fns), time.perf_counter(), 0.0
    runs, took, done = {k: [] for k in names}, {k: [] for k in names}, set()
    with Progress(max_repeats * len(names), f"{len(names)} cases in turn",
                  delay=1.0 if progress else math.inf) as bar:
        for r in range(max_repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name in done:
                    continue
                guess = median(took[name]) if took[name] else slowest
                if time.perf_counter() - t0 + guess > budget_s:
                    bar.update(bar.done, f"budget {budget_s:.0f} s spent")
                    return runs
                t = time.perf_counter()
                runs[name].append(fns[name]())
                took[name].append(time.perf_counter() - t)
                slowest = max(slowest, took[name][-1])
                bar.update(bar.done + 1, f"{min(len(v) for v in runs.values())} round(s); budget {budget_s:.0f} s")
            if settled is not None and settled(runs):
                bar.update(bar.done, "done: every verdict settled")
                break
            if finished is not None:
                done |= set(finished(runs)) & set(names)
                if len(done) == len(names):
                    break
    return runs
