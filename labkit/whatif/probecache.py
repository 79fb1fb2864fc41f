"""What an entry of the what-if probe cache (``roofline_probe.json``) may hold: a planted or damaged entry (a
wrong type or shape, a non-finite or absurd figure) is named in words and measured again, never used."""
from __future__ import annotations

import math

from ..engine.peaks import FLOPS_RANGE, figure_problem

BANDWIDTH_MAX = 1e14  # bytes/s: 100 TB/s, beyond any memory a probe could stream from
_SECONDS = ("op_overhead_s", "update_overhead_s", "small_step_s", "sample_overhead_s")
# {key: (what each value is, its range, whether 0 is excluded)}: a view op may time at 0 s, no rate is 0; a
# tiny matmul shape may run far below the peak, so only a peak has a floor
_RATE_MAPS = {"shape_rates": ("a shape's FLOP/s", (0.0, FLOPS_RANGE[1]), True),
              "peaks_checked": ("a checked peak", FLOPS_RANGE, True),
              "op_times": ("an op's seconds", (0.0, 3600.0), False)}


def _curve_problem(entry: dict) -> "str | None":
    """The bandwidth curve ([[bytes, bytes/s], ...]) and the figures this_device reads beside it."""
    curve = entry["curve"]
    if not isinstance(curve, list) or not all(isinstance(pt, list) and len(pt) == 2 for pt in curve):
        return "curve is not a list of [bytes, bytes/s] pairs"
    checks = [c for x, y in curve for c in (("curve bytes", x, math.inf), ("curve bytes/s", y, BANDWIDTH_MAX))]
    checks.append(("bytes_per_s", entry.get("bytes_per_s"), BANDWIDTH_MAX))
    problem = next((p for name, v, hi in checks if (p := figure_problem(name, v, 0, hi, True))), None)
    return problem or figure_problem("sample_overhead_s", entry.get("sample_overhead_s"), 0, 3600)


def probe_entry_problem(entry) -> "str | None":
    """Why one entry of roofline_probe.json cannot be used (a wrong type or shape, a non-finite or absurd
    figure), in words; None when it can. A bandwidth curve comes with the figures read beside it."""
    if not isinstance(entry, dict):
        return f"an entry is {type(entry).__name__}, not an object"
    if "curve" in entry and (problem := _curve_problem(entry)):
        return problem
    for k in _SECONDS:
        if k in entry and (problem := figure_problem(k, entry[k], 0, 3600)):
            return problem
    for k, (words, (lo, hi), lo_open) in _RATE_MAPS.items():
        m = entry.get(k)
        if m is None:
            continue
        if not isinstance(m, dict):
            return f"{k} is {type(m).__name__}, not an object of {words}"
        problem = next((p for n, v in m.items() if (p := figure_problem(f"{k}[{n!r}]", v, lo, hi, lo_open))), None)
        if problem:
            return problem
    if "quiet" in entry and not isinstance(entry["quiet"], bool):
        return f"quiet={entry['quiet']!r} is not true or false"
    return None


__all__ = ["probe_entry_problem", "BANDWIDTH_MAX"]
