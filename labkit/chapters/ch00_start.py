"""Chapter 00's instruments, as data its cells draw and explain: each returns figures and a verdict key; the
cell draws a table (``lk.course.table``) and picks its sentence (``lk.course.explain``).

    reading = ch00.timer_reading(times, "cpu")     # the synchronize experiment
    lk.course.explain(reading["verdict"], values=reading, agree="...", scatter="...")
"""
from __future__ import annotations

import statistics

from ..base.runtime import ConfigError
from ..engine.measure import LoadMeter
from ..tools import reference
from .course import bench_threads, reference_points  # noqa: F401 -- ch00.bench_threads, as the chapter calls it

# chapter 00 calls two timings of the same finished work "in agreement" only within this share of each other
TIMER_TOLERANCE = 0.2
# two baseline runs of one configuration under load "agree" within this factor of tokens/s (two identical `small`
# runs differed by 47 % on a busy 2-core machine; a 17x slow run under load must not pass as one of them)
BASELINE_SPREAD = 1.5


def _positive(name, value, what="a measured time in seconds, > 0"):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or value == float("inf"):
        raise ConfigError(name, value, what)


# ---- chapter 00: timing with and without synchronize ---------------------------------------------------

def timer_reading(times: dict, kind: str, tolerance: float = TIMER_TOLERANCE) -> dict:
    """The two timers of chapter 00, from {"unsynced": [s, ...], "synced": [s, ...]} (one pair per round):
    each median (ms), ``ratio`` (median of the rounds' ratios), ``ratio_of_medians``, the lowest and highest
    ratio. ``verdict``: "queued" (a GPU: without synchronize it read less than the work took), "agree" (both
    ratios within ``tolerance`` of 1: a sentence never calls timers in agreement while its medians differ),
    else "scatter" on a CPU (noise) or "unclear" on a GPU."""
    if kind not in ("cuda", "mps", "cpu"):
        raise ConfigError("kind", kind, "'cuda', 'mps' or 'cpu' (the device's type)")
    if not isinstance(times, dict) or set(times) != {"unsynced", "synced"}:
        raise ConfigError("times", times, "{'unsynced': [seconds, ...], 'synced': [seconds, ...]} (timing.interleaved)")
    u, s = list(times["unsynced"]), list(times["synced"])
    if not u or len(u) != len(s):
        raise ConfigError("times", times, "the same number (at least one) of unsynced and synced timings")
    for v in u + s:
        _positive("times", v)
    ratios = [a / b for a, b in zip(u, s)]
    ratio, of_medians = statistics.median(ratios), statistics.median(u) / statistics.median(s)
    near = all(abs(r - 1) <= tolerance for r in (ratio, of_medians))
    if kind != "cpu" and ratio < 1 - tolerance and of_medians < 1 - tolerance:
        verdict = "queued"
    else:
        verdict = "agree" if near else ("scatter" if kind == "cpu" else "unclear")
    return dict(unsynced_ms=1e3 * statistics.median(u), synced_ms=1e3 * statistics.median(s), ratio=ratio,
                ratio_of_medians=of_medians, low=min(ratios), high=max(ratios), rounds=len(ratios),
                tolerance=tolerance, verdict=verdict)


def timing_reference_rows() -> list:
    """The same experiment on GPUs, one row per shipped reference point (none shipped: an empty list)."""
    rows = []
    for p in reference_points("timing"):
        mm = (p.get("summary") or {}).get("matmul") or {}
        if p.get("status") == "ok" and mm.get("no_sync_over_sync"):
            rows.append(dict(gpu=reference.label(p), matmuls=mm["count"], n=mm["n"], dtype=mm["dtype"],
                             ratio=mm["no_sync_over_sync"]))
    return rows


# ---- chapter 00: where memory goes, and a first baseline ----------------------------------------------

MEMORY_PARTS = {"param_bytes": "weights", "grad_bytes": "gradients", "optimizer_bytes": "optimizer state",
                "activation_bytes": "activations"}


def memory_rows(summaries: dict, formula) -> list:
    """{model: run summary} against ``formula(summary)`` (the chapter's own): one row per model and kind of
    tensor, MiB by the formula and measured."""
    if not isinstance(summaries, dict) or not summaries or not callable(formula):
        raise ConfigError("summaries", type(summaries).__name__, "a dict {model: run summary} and a formula function")
    rows = []
    for m, s in summaries.items():
        f = formula(s)
        rows += [dict(model=m, n_params=s["n_params"], part=words, formula_mib=f[k] / 2**20,
                      measured_mib=s[k] / 2**20) for k, words in MEMORY_PARTS.items()]
    return rows


def steady_baseline(run_fn, *, tries: int = 3, spread: float = BASELINE_SPREAD, meter=None) -> dict:
    """Run ``run_fn()`` until its tokens/s can stand as a baseline, the load read during each run (``meter``).
    A quiet run stands ("quiet", or "remeasured" after a busy one); under load the fastest stands when the
    next fastest is within ``spread`` of it ("busy"); after ``tries`` runs that never agreed, none does
    ("refused", ``result`` None) -- so a 17x slow run under load is never the baseline. Also the runs, their
    range, the load and ``agreement`` (the standing run over its closest repeat)."""
    if not callable(run_fn):
        raise ConfigError("run_fn", run_fn, "a function that runs the baseline and returns its Result (lab.run)")
    if not isinstance(tries, int) or isinstance(tries, bool) or not 1 <= tries <= 10:
        raise ConfigError("tries", tries, "a whole number of runs from 1 to 10")
    _positive("spread", spread, "a factor > 1 within which two runs agree")
    meter = meter or LoadMeter
    runs, results, chosen, verdict, agreement = [], [], None, "refused", None
    for i in range(tries):
        load = meter()
        result = run_fn()
        read = load.read()
        results.append(result)
        runs.append(dict(run=i + 1, tokens_per_s=result.summary["tokens_per_s"], other_cores=read.get("other_cores"),
                         busy=bool(read.get("busy")), used=False))
        if not runs[-1]["busy"]:
            chosen, verdict = i, "quiet" if i == 0 else "remeasured"
            break
        fast = sorted(range(len(runs)), key=lambda j: runs[j]["tokens_per_s"], reverse=True)
        if len(fast) > 1 and runs[fast[0]]["tokens_per_s"] <= spread * runs[fast[1]]["tokens_per_s"]:
            chosen, verdict = fast[0], "busy"  # load only slows a run: the fastest of two that agree
            agreement = runs[fast[0]]["tokens_per_s"] / runs[fast[1]]["tokens_per_s"]
            break
    if chosen is not None:
        runs[chosen]["used"] = True
    speeds = [r["tokens_per_s"] for r in runs]
    loads = [r["other_cores"] for r in runs if r["other_cores"] is not None]
    return dict(verdict=verdict, result=results[chosen] if chosen is not None else None, runs=runs,
                tokens_per_s=speeds[chosen] if chosen is not None else None, low=min(speeds), high=max(speeds),
                other_cores=max(loads) if loads else None, spread=spread, tries=len(runs), agreement=agreement)

