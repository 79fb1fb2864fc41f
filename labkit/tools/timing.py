"""The timing loops -- interleaved rounds, and calls in a rotating turn -- and the medians read from
what runs kept.

    times = interleaved({"eager": f, "compiled": g}, max_rounds=15, warmup_rounds=2, budget_s=8.0,
                        min_rounds=3, timed_on=dev)             # {name: [seconds, ...]}
    runs = in_turn({"a": f, "b": g, "c": h}, budget_s=25, max_repeats=30, settled=lambda runs: ...)
    median_of(cmp.results_a, "mfu")                             # the median of one summary key over runs

``interleaved`` calls A B C, A B C, ... so that a drift in the machine's load hits every case alike
(chapters 05 and 07 time through it); ``in_turn`` calls whole loops one at a time, the budget
checked before each. Also here: the timed records of runs, chapter 05's loader reading (01 and 05
share them) and the quiet profiler.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import time

from ..base.runtime import ConfigError
from ..base.frontend import Progress
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


def _check_fns(fns) -> None:
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise ConfigError("fns", fns, "a non-empty dict {name: function taking no arguments}")


def _check(fns, max_rounds, warmup_rounds, budget_s, min_rounds) -> None:
    _check_fns(fns)
    _int("max_rounds", max_rounds, 1, 10**6)
    _int("warmup_rounds", warmup_rounds, 0, 10**6)
    _int("min_rounds", min_rounds, 1, 10**6)
    if budget_s is not None:
        _num("budget_s", budget_s, 0.0, 86_400.0)  # 0: stop as soon as min_rounds are kept; NaN, inf refused


def interleaved(fns: dict, *, max_rounds: int, warmup_rounds: int = 0, budget_s: float | None = None,
                min_rounds: int = 2, timed_on=None, progress: bool = False) -> dict:
    """Call every ``fns[name]()`` in turn, round after round (A B C A B C ...), and keep what each
    call returned -- or, with ``timed_on`` (a device), the seconds it took (``timed``) -- the first
    ``warmup_rounds`` rounds (first calls allocate memory, pick kernels) left out. Ends after
    ``max_rounds`` kept rounds, or -- with a ``budget_s`` -- once ``min_rounds`` are kept and one
    more round (the median so far) would overrun it. ``progress``: a line counting the rounds.
    Returns {name: [...]}."""
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


# ---- calls in a rotating turn --------------------------------------------------------------------
# ``interleaved`` keeps whole rounds (A B C) and always keeps two of them: right for calls of
# milliseconds. A call that is itself a whole training loop of seconds needs a finer grain -- three
# loops of 7 s under load made two rounds plus a warm-up cost 65 s against a 25 s budget. Here the
# budget is checked before every call, the turn rotates each round (A B C, B C A, C A B, ...) so
# that a stop mid-round shortens no case more than another, and a ``settled`` test may end the loop
# early.


def in_turn(fns: dict, *, budget_s: float, max_repeats: int, settled=None, finished=None,
            progress: bool = False) -> dict:
    """Call the ``fns`` one at a time, in a turn that rotates every round (A B C, B C A, ...).
    Before each call: stop if it would overrun ``budget_s`` (its median call so far predicts it, or
    before its first the slowest so far). After each round: stop once ``settled(runs)`` says so, and
    leave out of the turn the names ``finished(runs)`` returns (the budget goes to the cases still
    open). No call is thrown away as a warm-up (``ch05_loader.time_loop`` drops its own first
    update). Returns {name: [what the calls returned]}; among the cases still in the turn the counts
    differ by one at most."""
    _check_fns(fns)
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


def records_of(data) -> list:
    """The per-update records of a Result, a {"records": ...} dict or a list of records."""
    if data is None or isinstance(data, list):
        return [] if data is None else data
    if isinstance(data, dict):
        return list(data.get("records") or [])
    return list(getattr(data, "records", None) or [])


def timed_records(runs) -> list:
    """Every timed update of one or more runs, the warm-up updates left out -- as each run's summary does
    (``timed_updates`` of them, the last ones; with a Result, ``config.warmup`` says the same)."""
    out = []
    for r in as_runs(runs):
        recs = records_of(r)
        n = summary_of(r).get("timed_updates")
        if isinstance(n, int) and 0 < n <= len(recs):
            out += recs[len(recs) - n:]
        else:
            warm = getattr(getattr(r, "config", None), "warmup", 1)
            out += recs[warm:] or recs
    return out


# ---- chapter 05's loader, read from records (its exercise and checker share it) ------------------------

def ideal_step_s(data_s: float, compute_s: float, workers: int) -> float:
    """Step time if ``workers`` processes prepare batches in parallel with the model and nothing else
    competes for cores: no workers -> data and compute add up; w workers -> the slower of the two."""
    _num("data_s", data_s, 0.0, 1e9)
    _num("compute_s", compute_s, 0.0, 1e9)
    _int("workers", workers, 0)
    if workers == 0:
        return data_s + compute_s
    return max(compute_s, data_s / workers)


def fewest_workers(cost_ms_per_sample: float, micro_batch: int, compute_ms_per_batch: float, limit: float = 0.05,
                   max_workers: int = 1024):
    """The fewest workers that keep data wait under ``limit`` of the step under ``ideal_step_s``."""
    _num("cost_ms_per_sample", cost_ms_per_sample, 0.0, 1e9)
    _int("micro_batch", micro_batch, 1)
    _num("compute_ms_per_batch", compute_ms_per_batch, 0.0, 1e9)
    _num("limit", limit, 0.0, 1.0, lo_open=True)
    _int("max_workers", max_workers, 0, 1_000_000)
    data = cost_ms_per_sample * micro_batch
    for w in range(0, max_workers + 1):
        step = ideal_step_s(data, compute_ms_per_batch, w)
        wait = data if w == 0 else max(0.0, data / w - compute_ms_per_batch)
        if step == 0 or wait / step < limit:
            return w
    return None


def loader_reading(runs) -> dict:
    """labkit's own reading of runs with 0 loader workers: each update's ``data_wait_s`` is the
    time to load one batch, the rest (``step_time_s - data_wait_s``) the time workers have to
    prepare the next. Returns medians over every timed update (``load_ms``, ``compute_ms``),
    their lowest and highest (``load_range_ms``, ``compute_range_ms``), ``updates``, and
    ``workers`` = ⌈load / compute⌉ (no wait) and ``knee`` (the fewest that keep the wait under 5
    %, ``fewest_workers``)."""
    recs = [r for r in timed_records(runs) if r.get("data_wait_s") is not None and r.get("step_time_s")]
    if not recs:
        raise ValueError("no timed updates with data_wait_s and step_time_s in these runs")
    load = [1e3 * r["data_wait_s"] for r in recs]
    compute = [1e3 * (r["step_time_s"] - r["data_wait_s"]) for r in recs]
    lo, co = median(load), median(compute)
    return dict(load_ms=lo, compute_ms=co, load_range_ms=(min(load), max(load)),
                compute_range_ms=(min(compute), max(compute)), updates=len(recs),
                workers=workers_rule(lo, co), knee=fewest_workers(lo, 1, co))


def workers_rule(load_ms: float, compute_ms: float) -> int:
    """⌈load / compute⌉: workers that together deliver a batch at least as fast as the model uses one."""
    _num("load_ms", load_ms, 0.0, 1e9)
    _num("compute_ms", compute_ms, 0.0, 1e9, lo_open=True)
    return 0 if load_ms <= 0 else math.ceil(load_ms / compute_ms - 1e-9)


# ---- the profiler, quiet (chapters 01 and 07) ----------------------------------------------------------

# The profiler's C++ side (kineto) logs "USDT:<time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52]
# profiler_start" (and _stop) straight to file descriptor 2, past sys.stderr: a notebook shows it as an error box.
# A CUDA build of torch on a machine with no NVIDIA driver (what a newcomer's pip installs on Linux) adds
# "ERROR:... gpuGetDeviceCount failed with code 35" (cudaErrorInsufficientDriver) at every stop: no GPU, no error.
_PROFILER_NOTE = re.compile(r"^(USDT|STAGE):.*(profiler_(start|stop)|Stage|[Pp]rofiler)"
                            r"|^ERROR:.*gpuGetDeviceCount failed with code 35\b")


@contextlib.contextmanager
def _quiet_fd2(heard: list):
    """The body with file descriptor 2 sent to a temp file; then every line it caught goes to
    ``heard``, and the lines that are not the profiler's notes back to sys.stderr (a real error is
    never lost)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 to redirect (a closed stderr): nothing to quiet
        yield
        return
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            lines = f.read().decode("utf-8", "replace").splitlines()
            heard.extend(lines)
            rest = [ln for ln in lines if ln.strip() and not _PROFILER_NOTE.search(ln)]
            if rest:
                print("\n".join(rest), file=sys.stderr, flush=True)


@contextlib.contextmanager
def quiet_profiler():
    """``with quiet_profiler(), torch.profiler.profile(...) as prof:`` -- the profiler's own start/stop
    log lines (kineto's, written to file descriptor 2, which a notebook shows as an error box) are dropped;
    anything else written there, a real error included, still reaches stderr."""
    with _quiet_fd2([]):
        yield


def wait_figures(results) -> dict:
    """Medians over the runs of one comparison arm (``Comparison.results_a`` or ``results_b``): step_time_s,
    data_wait_s and compute_s per update, data_wait_frac, intra_op_threads and how many runs."""
    if not isinstance(results, (list, tuple)) or not all(hasattr(r, "summary") for r in results):
        raise ConfigError("results", type(results).__name__, "a list of runs (Comparison.results_a or results_b)")
    out = {k: median_of(results, k) for k in ("step_time_s", "data_wait_s", "compute_s", "data_wait_frac",
                                         "tokens_per_s")}
    out["intra_op_threads"] = results[0].summary.get("intra_op_threads") if results else None
    out["runs"] = len(results)
    return out
