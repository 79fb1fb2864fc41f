"""One sweep: run a grid of configurations, one after another, with one progress line, and collect what each
run reported. The CLI's ``python -m labkit sweep`` and chapter 09's grid search (``playbook.grid_search``) both
run through here, and so does the MFU sweep of chapters 01 and 07 (``sweep_rows``).

    n = count_runs({"accum": [1, 2], "seed": [0, 1]}, max_runs=100)   # 4, counted before anything is built
    runs, failed = run_configs(configs, run, label="sweep", notes=["accum=1 seed=0", ...])
    rows = [runs[i][0] for i in range(len(configs))]

The time left is estimated from the runs done so far on this machine, under its load.
"""
from __future__ import annotations

import math
import time

from ..base.runtime import ConfigError
from ..base.frontend import Progress
from ..engine.measure import LoadMeter, median
from ..engine.train import run

MAX_RUNS = 100  # a bigger grid must be asked for (--max-runs): 10**6 points once meant hours and 1.4 GB


def dims(grid: dict) -> str:
    """'2 precision x 3 micro_batch': the grid's shape in words (its values are not read)."""
    return " x ".join(f"{len(v):,} {k}" for k, v in grid.items()) or "the base configuration"


def count_runs(grid: dict, max_runs, flag: str = "--max-runs") -> int:
    """How many runs ``grid`` ({field: [values]}) means, counted before one configuration is built; a
    ConfigError above ``max_runs``, saying how to ask for them all (``flag``: the CLI's option)."""
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ConfigError("max_runs", max_runs, "a whole number of runs, 1 or more")
    n = math.prod(len(v) for v in grid.values())
    if n > max_runs:
        raise ConfigError("grid", f"{n:,} runs", f"at most {max_runs:,} runs in one sweep ({dims(grid)}); "
                                                 f"pass {flag} {n} to start them all")
    return n


def fmt_s(s: float) -> str:
    """Seconds in words fit for a progress line: '4.2 s', '12 min', '3.5 h'."""
    return f"{s:.1f} s" if s < 120 else f"{s / 60:,.0f} min" if s < 7200 else f"{s / 3600:,.1f} h"


def _order(n: int, rep: int) -> range:
    """Pass ``rep`` over ``n`` points: forwards, then backwards, and so on -- a drift in the machine's load
    then hits every point alike instead of always the last ones."""
    return range(n - 1, -1, -1) if rep % 2 else range(n)


def _note(text: str, rep: int, repeats: int, status: str, done: int, total: int, elapsed: float) -> str:
    """The progress line's note: what runs now, which pass, a failure's status, and the time left."""
    note = text + (f" [pass {rep + 1}/{repeats}]" if repeats > 1 else "") + (f" ({status})" if status else "")
    if done:  # measured on this machine, under its load: the runs so far, not a typed-in rate
        note += f" · about {fmt_s(elapsed / done * (total - done))} left"
    return note


def run_configs(configs: list, run_fn, *, label: str = "sweep", notes=None, repeats: int = 1,
                delay: float = 1.0, failures=()) -> tuple:
    """Run every configuration ``repeats`` times (forwards, then backwards, ...) under one progress
    line named ``label`` (``notes[i]`` says which point runs; ``delay=math.inf`` keeps it off); each
    ``run_fn(config).summary`` is kept. ``failures``: (exception type, status word) pairs -- a run
    raising one marks its point failed, not run again; any other exception ends the sweep. Returns
    ``({i: [summary of each run]}, {i: (status, exception)})``."""
    notes = list(notes) if notes is not None else [f"point {i + 1}" for i in range(len(configs))]
    total = len(configs) * repeats
    runs = {i: [] for i in range(len(configs))}
    failed = {}
    t0, done = time.perf_counter(), 0
    with Progress(total, label, delay=delay) as bar:
        for rep in range(repeats):
            for i in _order(len(configs), rep):
                status = failed[i][0] if i in failed else ""
                bar.update(done, _note(notes[i], rep, repeats, status, done, total, time.perf_counter() - t0))
                if not status:
                    _run_one(i, configs[i], run_fn, runs, failed, failures)
                done += 1
        bar.update(total)
    return runs, failed


def _run_one(i: int, config, run_fn, runs: dict, failed: dict, failures) -> None:
    """One run: its summary into ``runs[i]``, or its failure into ``failed[i]`` when ``failures`` names it."""
    try:
        runs[i].append(run_fn(config).summary)
    except tuple(kind for kind, _ in failures) as e:
        failed[i] = (next(word for kind, word in failures if isinstance(e, kind)), e)


# ---- the MFU sweep of chapters 01 and 07 --------------------------------------------------------------

def sweep_rows(configs: dict, field_name: str, *, repeats: int, run_fn=None, progress: bool = False,
               threads=None, steps=None) -> list:
    """The MFU sweep of chapters 01 and 07: every Config of ``configs`` ({value: Config}) run
    ``repeats`` passes, the other programs' load read during each (the likeliest reason two runs
    differ). One row per value: medians (MFU, tokens/s, step time), MFU's lowest and highest, FLOPs
    per token, the load, each token's time by part (data wait, compute, optimizer)."""
    run_fn = run_fn or run
    loads = {id(c): [] for c in configs.values()}

    def measured(cfg):
        meter = LoadMeter()
        result = run_fn(cfg)
        loads[id(cfg)].append(meter.read().get("other_cores"))
        return result

    values = list(configs)
    label = field_name.replace("_", "-")
    runs, _ = run_configs([configs[v] for v in values], measured, label=f"{label} sweep", repeats=repeats,
                          notes=[f"{field_name} {v}" for v in values], delay=1.0 if progress else math.inf)
    return [_sweep_row(field_name, v, configs[v].tokens_per_update, runs[i], loads[id(configs[v])], threads, steps)
            for i, v in enumerate(values)]


def _sweep_row(field_name: str, value, tokens: int, summaries: list, loads: list, threads, steps) -> dict:
    """One value's run summaries as medians, with the per-token split of the time."""
    def med(key):
        return median([s.get(key) for s in summaries])

    mfus = [s["mfu"] for s in summaries if s.get("mfu") is not None]
    split = {f"{k[:-2]}_us_per_token": (None if med(k) is None else 1e6 * med(k) / tokens)
             for k in ("data_wait_s", "compute_s", "optimizer_s")}
    opt_frac = median([s["optimizer_s"] / s["step_time_s"] for s in summaries
                       if s.get("optimizer_s") is not None and s.get("step_time_s")])
    return {field_name: value, "field": field_name, "value": value, "runs": len(summaries), "mfu": med("mfu"),
            "mfu_low": min(mfus) if mfus else None, "mfu_high": max(mfus) if mfus else None,
            "tokens_per_s": med("tokens_per_s"), "step_time_s": med("step_time_s"), "tokens_per_update": tokens,
            "data_wait_frac": med("data_wait_frac"), "flops_per_token": summaries[0]["model_flops_per_step"] / tokens,
            "n_params": summaries[0].get("n_params"), "optimizer_frac": opt_frac, "threads": threads, "steps": steps,
            "other_cores": median(loads), **split}
