"""MFU against one knob, all else equal (taught in chapter 07): ``mfu_sweep`` runs the sweep (chapter 01's
``profiling.sweep_rows``: the one implementation both chapters use), ``sweep_split`` tells compute from the
optimizer in the time saved per token, ``same_config`` sets a single baseline run against the sweep's point at
the same configuration. Each returns figures and a verdict name; chapter 07's cells say the words."""
from __future__ import annotations

from ...base.errors import ConfigError
from ...engine.config import Config, _choice, _int
from ...engine.device import LoadMeter, capabilities
from ..profiling import sweep_rows
from .common import _need_config, _need_threads, _pct, bench_threads

__all__ = ["mfu_sweep", "sweep_split", "busy", "same_config"]


def _sweep_configs(base, field_name: str, values, steps: int, repeats: int, n_threads) -> dict:
    """Every value's Config, built (and so validated) before the first run: {value: Config}."""
    _need_config("base", base)
    fields = tuple(f for f in base.to_dict() if f not in ("steps", "threads"))  # those two the sweep sets itself
    _choice("field_name", field_name, fields)
    _int("steps", steps, 1, 10**6)
    _int("repeats", repeats, 1, 1000)
    _need_threads(n_threads)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError("values", values, f"a list of {field_name} values")
    values = list(values)
    if not values or len(set(map(repr, values))) != len(values):
        raise ConfigError("values", values, f"one or more {field_name} values, each once")
    return {v: base.replace(**{field_name: v, "steps": steps, "threads": n_threads}) for v in values}


def mfu_sweep(base: Config, field_name: str, values, steps: int = 4, n_threads: int | None = None,
              run_fn=None, repeats: int = 1, progress: bool = False) -> list:
    """Short runs at each value of ``field_name`` (e.g. micro_batch or d_model), all else equal: ``repeats``
    rounds, the order reversed every other round (a drift in the machine's load then hits every value
    alike). On a CPU every run uses the same thread count (one on a busy machine), so the knob is the only
    thing that moves. One row per value: medians over the rounds (MFU, tokens/s, step time), MFU's lowest
    and highest run, the model FLOPs per token, the other programs' load during its runs, and each token's
    time split into data wait, compute (forward + backward) and optimizer -- the optimizer's cost is per
    update, so a knob that puts more tokens into an update also spreads it thinner. Every argument is
    checked, and every value's Config built, before the first run. The rounds and rows are chapter 01's
    (``profiling.sweep_rows``): one sweep for both chapters."""
    kind = capabilities(base.device).kind if isinstance(base, Config) else None
    if kind == "cpu" and n_threads is None:
        n_threads = base.threads or bench_threads(kind)
    configs = _sweep_configs(base, field_name, values, steps, repeats, n_threads if kind == "cpu" else None)
    return sweep_rows(configs, field_name, repeats=repeats, run_fn=run_fn, progress=progress, threads=n_threads,
                      steps=steps)


def _rows_at(rows: list, value):
    return next((r for r in rows if r["value"] == value), None)


def sweep_split(rows: list) -> dict:
    """What a micro-batch sweep's per-token split says, from its smallest to its largest value: the compute
    (forward + backward) and optimizer µs per token at both ends, the optimizer's share of an update at both
    ends (in %), and how much of the time saved per token came from each (in %). ``verdict``: 'both' (compute and the
    optimizer both saved time), 'optimizer_only' (compute per token did not fall), 'no_saving', or
    'no_split' (a figure is missing)."""
    if not isinstance(rows, list) or not rows:
        raise ConfigError("rows", rows, "the rows of kernels.mfu_sweep")
    first, last = rows[0], rows[-1]
    c0, c1 = first.get("compute_us_per_token"), last.get("compute_us_per_token")
    o0, o1 = first.get("optimizer_us_per_token"), last.get("optimizer_us_per_token")
    pct = (lambda f: None if f is None else 100 * f)
    out = {"field": first["field"].replace("_", "-"), "low": first["value"], "high": last["value"],
           "compute_low": c0, "compute_high": c1, "optimizer_low": o0, "optimizer_high": o1,
           "opt_share_low_pct": pct(first.get("optimizer_frac")), "opt_share_high_pct": pct(last.get("optimizer_frac")),
           "saved_us": None, "from_compute_pct": None, "from_optimizer_pct": None}
    if None in (c0, c1, o0, o1):
        return {**out, "verdict": "no_split"}
    saved_c, saved_o = c0 - c1, o0 - o1
    saved = saved_c + saved_o
    out["saved_us"] = saved
    if saved <= 0:
        return {**out, "verdict": "no_saving"}
    out.update(from_compute_pct=100 * saved_c / saved, from_optimizer_pct=100 * saved_o / saved)
    return {**out, "verdict": "both" if saved_c > 0 else "optimizer_only"}


def busy(other_cores) -> bool | None:
    """Whether other programs' load counts as busy: ``LoadMeter.BUSY_CORES`` or more cores on average -- the
    one threshold every verdict of the course that says "busy" uses. None where no load was read."""
    return None if other_cores is None else other_cores >= LoadMeter.BUSY_CORES


def same_config(summary: dict, load: dict | None, rows: list, value) -> dict | None:
    """The baseline run against the sweep's point at the same configuration (``value`` of the swept field):
    both MFUs, the sweep point's run-to-run range, thread counts, runs and timed updates, and the other
    programs' load in each, and ``rows``: the two measurements side by side for a table. ``verdict``: 'within' (the baseline lies in the sweep's range), else by the load,
    read with one threshold (``busy``): 'no_load' (none reported), 'load_changed' (one busy, the other not: the
    load moved the number), 'both_busy' (both measured under load: a single short run scatters beyond the
    range), 'quiet_below' (both quiet, the baseline below every run: first-call costs) or 'quiet_above'.
    None when the sweep lacks the value or an MFU is missing."""
    row = _rows_at(rows, value)
    if row is None or summary.get("mfu") is None or row.get("mfu") is None:
        return None
    b, lo, hi = 100 * summary["mfu"], _pct(row, "mfu_low"), _pct(row, "mfu_high")
    lb, ls = (load or {}).get("other_cores"), row.get("other_cores")
    f = row["field"].replace("_", "-")
    out = {"field": f, "value": value, "baseline_mfu": b, "sweep_mfu": 100 * row["mfu"], "sweep_low": lo,
           "sweep_high": hi, "baseline_cores": lb, "sweep_cores": ls, "busy_cores": LoadMeter.BUSY_CORES,
           "same_threads": summary.get("intra_op_threads") == row.get("threads"),
           "rows": [{"measurement": "baseline run", "mfu": summary["mfu"], "low": None, "high": None, "runs": 1,
                     "updates": summary.get("timed_updates"), "threads": summary.get("intra_op_threads"),
                     "other_cores": lb, "busy": busy(lb)},
                    {"measurement": f"sweep, {f} {value}", "mfu": row["mfu"], "low": lo / 100, "high": hi / 100,
                     "runs": row.get("runs", 1), "updates": row.get("steps"), "threads": row.get("threads"),
                     "other_cores": ls, "busy": busy(ls)}]}
    if lo <= b <= hi:
        verdict = "within"
    elif lb is None or ls is None:
        verdict = "no_load"
    elif busy(lb) != busy(ls):
        verdict = "load_changed"
    elif busy(lb):
        verdict = "both_busy"
    else:
        verdict = "quiet_below" if b < lo else "quiet_above"
    return {**out, "verdict": verdict}
