"""What chapter 05's measurements come to, as data: the rows its tables draw (``lk.course.table``) and the
outcome names its sentences are chosen by (``lk.course.explain``). No words: the sentences are in the chapter.

* ``sample_cost``      -- the per-sample data cost for a load/compute ratio, and whether a limit changed it
* ``arm_rows``         -- both arms of a comparison: time per update, waiting, computing, MFU (medians)
* ``mfu_basis``        -- what a run's MFU is a share of: a datasheet peak, this machine's probe, or nothing usable
* ``sweep_rows``, ``loop_rows``, ``startup_rows``, ``prefetch_rows``, ``memory_rows``, ``reference_rows``
* ``workers_outcome``, ``prefetch_outcome`` -- a loader comparison's verdict, or 'odd' when the update shrank
                        but less waiting does not account for it (``waiting_explains``)
"""
from __future__ import annotations

import math
import statistics

from ...base.runtime import ConfigError
from ...engine.config import _int, _num  # the Config's own checks: one wording for every refusal
from ..course import outcome, reference_points
from ...tools.timing import wait_figures
from .loops import _comparison

def sample_cost(compute_ms: float, micro_batch: int, load_ratio: float, lo: float, hi: float) -> dict:
    """The per-sample cost (ms) that makes loading one batch take ``load_ratio`` × its compute, to two significant
    digits, kept within [``lo``, ``hi``] so that a moment of heavy load cannot make the chapter crawl. Returns
    cost_ms, wanted_ms (before the limits), load_ms (one batch at cost_ms), ratio (load_ms ÷ compute_ms) and
    clamp: 'capped' (held down to ``hi``), 'raised' (up to ``lo``) or 'as_asked' -- so the chapter can say
    when the ratio it promised is not the one it runs."""
    _num("compute_ms", compute_ms, 0.0, 1e9, lo_open=True)
    _int("micro_batch", micro_batch, 1)
    _num("load_ratio", load_ratio, 0.0, 1e3, lo_open=True)
    _num("lo", lo, 0.0, 1e6, lo_open=True)
    _num("hi", hi, lo, 1e6)
    wanted = load_ratio * compute_ms / micro_batch
    clamp = "capped" if wanted > hi else "raised" if wanted < lo else "as_asked"
    cost = min(hi, max(lo, wanted))
    cost = round(cost, 1 - math.floor(math.log10(cost)))
    return {"cost_ms": cost, "wanted_ms": wanted, "load_ms": cost * micro_batch, "compute_ms": compute_ms,
            "ratio": cost * micro_batch / compute_ms, "load_ratio": load_ratio, "clamp": clamp, "lo": lo, "hi": hi}


def arm_rows(cmp) -> list:
    """Both arms of a comparison as rows (medians of each arm's runs): label, step_time_ms, data_wait_ms,
    compute_ms, data_wait_frac, mfu, runs -- the figures the starving and workers cells show."""
    _comparison(cmp)
    rows = []
    for label, rs in ((cmp.label_a, cmp.results_a), (cmp.label_b, cmp.results_b)):
        f = wait_figures(rs)
        mfu = [r.summary.get("mfu") for r in rs if r.summary.get("mfu") is not None]
        rows.append({"arm": label, "step_time_ms": _ms(f["step_time_s"]), "data_wait_ms": _ms(f["data_wait_s"]),
                     "compute_ms": _ms(f["compute_s"]), "data_wait_frac": f["data_wait_frac"],
                     "mfu": statistics.median(mfu) if mfu else None, "runs": f["runs"],
                     "threads": f["intra_op_threads"]})
    return rows


def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


UNDER_LOAD = "other programs were using the cores"  # how the engine's peak source marks a probe taken under load


def mfu_basis(summary: dict) -> str:
    """What a run's MFU is a share of, as a verdict name: 'datasheet' (a GPU's published peak), 'probe' (this
    machine's own short matmul probe: the best it reached, not a published figure), 'under_load' (a probe taken
    while other programs used the cores: it reads low, so MFU reads high -- not to be shown) or 'none' (no peak)."""
    if not isinstance(summary, dict):
        raise ConfigError("summary", type(summary).__name__, "a run's summary dict (result.summary)")
    source = str(summary.get("peak_flops_source") or "")
    if not summary.get("peak_flops") or summary.get("mfu") is None:
        return "none"
    if not source.startswith("measured"):
        return "datasheet"
    return "under_load" if UNDER_LOAD in source else "probe"


def sweep_rows(by_workers: dict) -> list:
    """Medians per worker count ({workers: [run summaries]}): workers, step_time_s, data_wait_s, data_wait_frac,
    threads and runs -- what the sweep's table and ``plot_sweep`` show."""
    if not isinstance(by_workers, dict) or not by_workers or not all(by_workers.values()):
        raise ConfigError("by_workers", by_workers, "a dict {workers: [run summaries]}, each list non-empty")

    def med(ss, k):
        return statistics.median(s[k] for s in ss)
    return [dict(workers=w, step_time_s=med(ss, "step_time_s"), data_wait_s=med(ss, "data_wait_s"),
                 data_wait_frac=med(ss, "data_wait_frac"), threads=ss[0]["intra_op_threads"], runs=len(ss))
            for w, ss in by_workers.items()]


def loop_rows(loops, cases: dict) -> list:
    """Medians of ``compare_loops``'s interleaved runs, one row per case {name: (workers, threads)}."""
    return [{"case": name, "workers": w, "threads": t, "step_time_ms": _ms(loops.median(name, "step_time_s")),
             "data_wait_frac": loops.median(name, "data_wait_frac"), "runs": len(loops.samples[name])}
            for name, (w, t) in cases.items()]


def startup_rows(cmp) -> list:
    """``startup_comparison``'s medians: time to the first batch of the first and of a later epoch, without and
    with persistent workers."""
    later = {False: cmp.samples_a, True: cmp.samples_b}
    return [{"persistent_workers": p, "first_epoch_ms": _ms(statistics.median(cmp.first_epochs[p])),
             "later_epoch_ms": _ms(statistics.median(later[p])), "tries": len(cmp.first_epochs[p])}
            for p in (False, True)]


def prefetch_rows(cmp, workers: int, depths: tuple, batch_bytes: int) -> list:
    """Both arms of a comparison of two prefetch factors (``depths``, arm a's first): time per update, waiting,
    and the batches in flight (workers × prefetch_factor) with their KiB."""
    rows = arm_rows(cmp)
    for row, depth in zip(rows, depths):
        row.update(in_flight=workers * depth, in_flight_kib=workers * depth * batch_bytes / 2**10)
    return rows


def memory_rows(mem: dict) -> list:
    """``worker_memory`` per start method ({context: result}) as rows of MiB: the training process, then each
    worker with its start method (USS: its own pages, what one more worker costs)."""
    mib = 2**20
    main = next(iter(mem.values()))["main"]
    rows = [{"process": "training process", "rss": main["rss"] / mib, "uss": None, "pss": None}]
    for m in mem.values():
        rows += [{"process": f"worker ({m['start_method']})", "start_method": m["start_method"], "rss": w["rss"] / mib,
                  "uss": w["uss"] / mib, "pss": None if w["pss"] is None else w["pss"] / mib} for w in m["workers"]]
    return rows


def reference_rows(ids: tuple = ()) -> list:
    """The shipped GPU reference runs of the loader (only ``ids`` when given): label, ms per update, waiting,
    MFU -- an empty list where none are shipped (the chapter's opening cell has said so once)."""
    pts = [p for p in reference_points("loader") if p.get("status") == "ok" and (not ids or p["id"] in ids)]
    return [{"run": p.get("label"), "step_time_ms": _ms(p["summary"]["step_time_s"]),
             "data_wait_frac": p["summary"]["data_wait_frac"], "mfu": p["summary"].get("mfu")} for p in pts]


def workers_outcome(cmp) -> str:
    """The verdict name of a 0-workers (a) against workers (b) comparison, for ``lk.course.explain``: 'faster' /
    'slower' / 'same' / 'few' as ``lk.course.outcome`` reads it, and 'odd' where the workers arm won but less
    waiting does not account for it (``waiting_explains``) -- something other than the loader changed."""
    key = outcome(cmp)
    return "odd" if key == "faster" and not waiting_explains(cmp) else key


def prefetch_outcome(cmp) -> str:
    """The same for a shallow (a) against a deep (b) prefetch queue: 'odd' where the deeper queue won but its
    arm did not wait less by at least half the time it saved -- a queue can only save waiting."""
    key = outcome(cmp)
    return "odd" if key == "faster" and not waiting_explains(cmp) else key


def waiting_explains(cmp, share: float = 0.5) -> bool:
    """Whether arm b's shorter update is mostly waiting it no longer does: the drop in median wait is at least
    ``share`` of the drop in median update time (what a loader change can save; more workers or a deeper queue
    do not make the model compute faster). False where either median is missing."""
    a, b = wait_figures(cmp.results_a), wait_figures(cmp.results_b)
    if None in (a["data_wait_s"], b["data_wait_s"], a["step_time_s"], b["step_time_s"]):
        return False
    saved = a["step_time_s"] - b["step_time_s"]
    return saved <= 0 or a["data_wait_s"] - b["data_wait_s"] >= share * saved
