"""MFU against one knob, all else equal (taught in chapter 07): ``mfu_sweep`` runs the sweep (chapter 01's
``profiling.sweep_rows``: the one implementation both chapters use), ``sweep_sentence`` tells compute from the
optimizer in the time saved per token, ``same_config_sentence`` sets a single baseline run against the sweep's
point at the same configuration."""
from __future__ import annotations

from ...base.errors import ConfigError
from ...engine.config import Config, _choice, _int
from ...engine.device import capabilities
from ..profiling import sweep_rows
from .common import _n, _need_config, _need_threads, _pct, bench_threads

__all__ = ["mfu_sweep", "sweep_sentence", "same_config_sentence"]


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


def sweep_sentence(rows: list) -> str:
    """What a micro-batch sweep's per-token split says, from its smallest to its largest value: how much of
    the time saved per token came from compute (bigger matmuls, fewer operations per token) and how much
    from the optimizer (the same per-update step spread over more tokens). Chosen by the numbers."""
    first, last = rows[0], rows[-1]
    c0, c1 = first.get("compute_us_per_token"), last.get("compute_us_per_token")
    o0, o1 = first.get("optimizer_us_per_token"), last.get("optimizer_us_per_token")
    if None in (c0, c1, o0, o1):
        return ""
    f, a, b = first["field"].replace("_", "-"), first["value"], last["value"]
    head = (f"Per token, compute (forward + backward) went from {c0:,.0f} µs at {f} {a} to {c1:,.0f} µs at {b}, "
            f"and the optimizer from {o0:,.0f} to {o1:,.0f} µs")
    opt_words = (f"The optimizer steps once per update whatever the {f}, so with `accum` = 1 a larger {f} spreads "
                 f"the same step over more tokens: at {f} {a} it took {100 * (first['optimizer_frac'] or 0):.0f}% of "
                 f"each update, at {b}, {100 * (last['optimizer_frac'] or 0):.0f}%.")
    saved_c, saved_o = c0 - c1, o0 - o1
    saved = saved_c + saved_o
    if saved <= 0:
        return f"{head}: the larger {f} saved no time per token here. {opt_words}"
    if saved_c <= 0:
        return (f"{head}: all of the time saved per token came from the optimizer; compute per token did not fall. "
                f"{opt_words}")
    return (f"{head}: of the {saved:,.0f} µs saved per token, **{100 * saved_c / saved:.0f}%** came from compute "
            f"(bigger matmuls, fewer operations per token) and **{100 * saved_o / saved:.0f}%** from the optimizer. "
            f"{opt_words} Hold the tokens per update fixed with `accum` to see the matmuls alone.")


def same_config_sentence(summary: dict, load: dict | None, rows: list, value) -> str:
    """The baseline run against the sweep's point at the same configuration (``value`` of the swept field):
    two measurements of one configuration, each with its thread count, runs, timed updates and the other
    programs' load, and whether the baseline falls within the sweep's own run-to-run range. Chosen by the
    numbers; empty when the sweep lacks the value or a number is missing."""
    row = _rows_at(rows, value)
    if row is None or summary.get("mfu") is None or row.get("mfu") is None:
        return ""
    f = row["field"].replace("_", "-")
    b, m = 100 * summary["mfu"], 100 * row["mfu"]
    lo, hi = _pct(row, "mfu_low"), _pct(row, "mfu_high")
    t_base, t_sweep = summary.get("intra_op_threads"), row.get("threads")
    threads = (f"both with {_n(t_base, 'intra-op thread')}" if t_base == t_sweep else
               f"with {_n(t_base, 'intra-op thread')} against the sweep's {t_sweep}: the thread counts differ")
    runs, timed = row.get("runs", 1), summary.get("timed_updates")
    text = (f"The sweep's {f} {value} point is the baseline's configuration: MFU **{m:.1f}%** there (median of "
            f"{_n(runs, 'run')} of {_n(row.get('steps'), 'update')}, runs from {lo:.1f} to {hi:.1f}%), against "
            f"**{b:.1f}%** in the single baseline run above ({_n(timed, 'timed update')}), {threads}.")
    if lo <= b <= hi:
        return text + (" The baseline lies within the sweep's own run-to-run range: one measurement, scattered — "
                       "a single short run on this machine is no more precise than that.")
    side = "below" if b < lo else "above"
    text += f" The baseline lies {side} every run of the sweep's."
    lb, ls = (load or {}).get("other_cores"), row.get("other_cores")
    if lb is None or ls is None:
        return text + " This device reports no load to say why."
    text += f" Other programs used {lb:.1f} cores on average during the baseline and {ls:.1f} during this point's runs"
    if abs(lb - ls) >= 0.3:
        return text + ": the load changed between the two cells, and with it the number — not the configuration."
    if side == "below":
        return text + (", alike: the load does not explain it. A baseline below every later run fits a first "
                       "training in the kernel still paying first-call costs after the engine's one left-out update; "
                       "rerun the baseline cell to see whether the gap stays.")
    return text + (f", alike: the load does not explain it either. {_n(runs, 'run')} of "
                   f"{_n(row.get('steps'), 'update')} and a baseline of {_n(timed, 'timed update')} scatter more than "
                   "this range shows: rerun both cells (outside CI mode: more runs) for a steadier pair.")


