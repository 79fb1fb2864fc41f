"""The measured grid search (taught in chapter 09): grid points of Config knobs, one ``labkit.run`` per point
through the one sweep (``tools.sweep``), and one row per point -- its knobs, throughput and memory, or why it
did not run.

    rows = pb.grid_search(dict(model="small", steps=3), pb.grid(precision=("fp32", "bf16"),
                          micro_batch=(2, 4, 8), checkpointing=("none", "full"), effective_batch=8))

Memory of a configuration: on a GPU the device's measured peak (``peak_mem_bytes``); on a CPU, which cannot
report a peak, the engine's measured breakdown -- parameter + gradient + optimizer-state + activation bytes.
``memory_of`` says which one it used.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from ...base.errors import ConfigError, OutOfMemory, RunError
from ...engine.config import Config, _bool, _choice  # the Config's own checks: one wording (and did-you-mean) for every refusal
from ...engine.measure import median
from ...engine.train import run
from ...tools import reference, sweep
from ..measured import saved
from .args import axis_values, row_list, whole


def grid(precision=("fp32", "bf16"), micro_batch=(1, 2, 4, 8), checkpointing=("none", "full"), workers=(0,),
         effective_batch: int | None = None, accum=(1,)) -> list:
    """Grid points (dicts of Config knobs). With ``effective_batch`` (sequences per update) K is
    derived: accum = effective_batch // micro_batch, and micro-batches that do not divide it are
    left out -- every point then trains on the same batch, so only speed and memory differ."""
    knob_choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(Config)}
    for name, values in (("precision", precision), ("checkpointing", checkpointing)):
        for v in axis_values(name, values):
            _choice(name, v, knob_choices[name])
    for name, values, least in (("micro_batch", micro_batch, 1), ("workers", workers, 0), ("accum", accum, 1)):
        for v in axis_values(name, values):
            whole(name, v, least)
    if effective_batch is not None:
        whole("effective_batch", effective_batch)
    points = []
    for prec, mb, ck, w in itertools.product(precision, micro_batch, checkpointing, workers):
        if effective_batch is not None:
            if mb > effective_batch or effective_batch % mb:
                continue
            ks = (effective_batch // mb,)
        else:
            ks = accum
        for k in ks:
            points.append(dict(precision=prec, micro_batch=mb, accum=k, checkpointing=ck, workers=w))
    return points


def memory_of(summary: dict) -> tuple:
    """(bytes, source): the measured device peak where there is one (CUDA), else the engine's
    breakdown param + grad + optimizer + activation bytes (a CPU cannot report its peak)."""
    peak = summary.get("peak_mem_bytes")
    if peak:
        return float(peak), "peak"
    parts = [summary.get(k) for k in ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes")]
    if any(p is None for p in parts):
        return None, None
    return float(sum(parts)), "breakdown"


def label(point: dict) -> str:
    """'bf16 mb=4 K=2 ckpt w=2': a grid point's knobs in a few characters (the tables' and charts' names)."""
    ck = point.get("checkpointing", "none")
    w = point.get("workers", 0)
    return (f"{point.get('precision')} mb={point.get('micro_batch')} K={point.get('accum', 1)}"
            + (" ckpt" if ck == "full" else f" {ck}" if ck != "none" else "") + (f" w={w}" if w else ""))


KNOB_KEYS = ("precision", "micro_batch", "accum", "checkpointing", "workers")


def row_from_summary(point: dict, summary: dict, status: str = "ok", error: str = "") -> dict:
    """One grid row: the point's knobs, its throughput and memory, where the memory came from."""
    mem, source = memory_of(summary) if summary else (None, None)
    row = {k: point.get(k) for k in KNOB_KEYS}
    row.update(label=label(point), status=status, error=error, tokens_per_s=None, step_time_s=None,
               memory_bytes=mem, memory_source=source, mfu=None, final_loss=None)
    if summary:
        for k in ("tokens_per_s", "step_time_s", "mfu", "final_loss", "param_bytes", "grad_bytes",
                  "optimizer_bytes", "activation_bytes", "peak_mem_bytes"):
            row[k] = summary.get(k)
    return row


# what a point's failure is called in its row, first match first (OutOfMemory is a RunError)
FAILURES = ((ConfigError, "refused"), (OutOfMemory, "oom"), (RunError, "error"))


def grid_search(base: dict, points: list, progress: bool = True, on_point=None, repeats: int = 1,
                run_fn=None) -> list:
    """Run ``labkit.run`` once per point (base knobs + the point's), with a progress bar. Returns one
    row per point; a point the device refuses (ConfigError) or that runs out of memory is kept with
    its status ('refused', 'oom', 'error') so the table shows why it is missing from the chart.

    ``repeats`` > 1 runs the whole grid that many times, forwards then backwards and so on (a drift in
    the machine's load hits every point alike); each row then holds the **median** tokens/s, step time
    and MFU, and every run's tokens/s in ``tokens_per_s_runs``. A point refused once is not retried.
    ``run_fn`` replaces ``labkit.run`` (tests feed a fake)."""
    if not isinstance(base, dict):
        raise ConfigError("base", base, "a dict of Config knobs shared by every point, e.g. dict(model='tiny')")
    points = row_list("points", points)
    repeats = whole("repeats", repeats)
    _bool("progress", progress)
    for name, fn in (("on_point", on_point), ("run_fn", run_fn)):
        if fn is not None and not callable(fn):
            raise ConfigError(name, fn, "a function, or None")
    configs = [Config(**{**base, **point}) for point in points]  # a bad knob is refused now, before any run
    runs, failed = sweep.run_configs(configs, run_fn or run, label="grid", notes=[label(p) for p in points],
                                     repeats=repeats, delay=1.0 if progress else math.inf, failures=FAILURES)
    return _grid_rows(points, runs, failed, on_point)


def _failed_row(point: dict, status: str, error: Exception) -> dict:
    """A failed point's row: its status, and the first sentence of an OOM's advice (the table has no room)."""
    return row_from_summary(point, None, status, str(error).split(". ")[0] if status == "oom" else str(error))


def _grid_rows(points, summaries, failed, on_point):
    """One row per point: a failed point's own row, else the medians of its runs (``on_point`` sees each)."""
    rows = []
    for i, point in enumerate(points):
        if i in failed:
            row = _failed_row(point, *failed[i])
        else:
            ss = summaries[i]
            row = row_from_summary(point, ss[0])
            for k in ("tokens_per_s", "step_time_s", "mfu"):
                row[k] = median(x.get(k) for x in ss)  # None when no run reported it
            mems = [memory_of(x)[0] for x in ss if memory_of(x)[0] is not None]
            row["memory_bytes"] = max(mems) if mems else None  # a GPU's peak can differ a little: the larger
            row["tokens_per_s_runs"] = [x.get("tokens_per_s") for x in ss]
        rows.append(row)
        if on_point is not None:
            on_point(row)
    return rows


def config_of(base: dict, point: dict):
    """The Config of a grid point (a row or a dict of knobs) on top of ``base``."""
    for name, value in (("base", base), ("point", point)):
        if not isinstance(value, dict):
            raise ConfigError(name, value, "a dict of Config knobs")
    return Config(**{**base, **{k: point[k] for k in KNOB_KEYS if point.get(k) is not None}})


# ---- the GPU reference suite's grid, as rows of the same kind ----------------------------------------

def reference_rows(section: str = "grid", directory=None) -> list:
    """The GPU reference suite's grid points as grid rows ([] when none are shipped)."""
    rows = []
    for p in reference.points(directory, section=section):
        s = p.get("summary") or {}
        if p.get("status") != "ok" or not s:
            continue
        row = row_from_summary(s, s)
        row["device"] = reference.label(p)
        rows.append(row)
    return rows


@dataclasses.dataclass
class SavedRun:
    """A run as the learner's measurement file keeps it: its summary (no records, no model)."""
    summary: dict
    records: list = dataclasses.field(default_factory=list)


def saved_pick():
    """While a grader runs the notebook, the challenge pick's run that the learner's ``budget_challenge`` check
    saved (``labkit-measurements.json``), as a SavedRun: the pick is graded on the learner's own measurement,
    so the grader's CPU does not run it again. None otherwise (the chapter runs the pick)."""
    data = saved("budget_challenge")
    return SavedRun(dict(data["summary"])) if data and isinstance(data.get("summary"), dict) else None

