"""The one peak source: the dense datasheet FLOP/s of every GPU labkit knows (behind MFU and the what-if
model), and the cache files that keep what this machine measured instead.

The figures live in one file, ``labkit/whatif/devices.json`` (each with its document). Its "boards" list
names each GPU exactly as ``torch.cuda.get_device_name()`` reports it, with the figures its document
prints ("quote"); a board shares the ``peak_tflops`` of its catalogue "device", or carries its own where
the what-if catalogue has no entry for it (no memory or bandwidth figures collected). The engine reads
the file by path: it never imports ``labkit.whatif``, which sits above it.

Peaks are DENSE (never 2:4-sparse): "fp16"/"bf16"/"tf32" are tensor-core figures with fp32 accumulate,
"fp32" the plain (non-tensor-core) figure. The SXM and NVL/PCIe boards of one chip differ in clocks and
power, so each has its own figures.
"""
from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from typing import Callable, Optional

from ..base.numfmt import is_number
from ..base.paths import cache_dir, read_json, write_json_atomic

__all__ = ["CATALOGUE_FILE", "PEAK_CACHE", "PEAK_TABLE", "TB", "catalogue", "value", "board_peaks",
           "board_source", "table_peak", "read_cache", "write_cache", "FLOPS_RANGE", "figure_problem",
           "peak_entry_problem", "BANDWIDTH_MAX", "probe_entry_problem"]

TB = 1e12
CATALOGUE_FILE = Path(__file__).resolve().parent.parent / "whatif" / "devices.json"
PEAK_CACHE = "peak_flops.json"  # this machine's measured matmul peaks, in cache_dir() (see device.measured_peak)
_HALVED = "; tensor-core figures are its with-sparsity numbers halved"


@functools.lru_cache(maxsize=1)
def catalogue() -> dict:
    """The parsed ``devices.json``: {"sources": {...}, "boards": [...], "devices": {key: {...}}}."""
    return read_json(CATALOGUE_FILE, what="device catalogue")


def value(entry) -> Optional[float]:
    """The number of a catalogue field: ``{"value": 989.5, "source": ...}`` or a bare number."""
    return entry.get("value") if isinstance(entry, dict) else entry


def board_peaks(board: dict) -> dict:
    """{format: dense TFLOP/s} of one board, only the formats it has a unit for (in the file's order)."""
    entries = board.get("peak_tflops") or catalogue()["devices"][board["device"]]["peak_tflops"]
    return {p: value(e) for p, e in entries.items() if value(e) is not None}


def board_source(board: dict) -> str:
    """The document of one board's peaks and the figures it prints, in words a reader can check."""
    title, quote = catalogue()["sources"][board["source"]]["title"], board["quote"]
    words = f"{title}{' ' if quote.startswith('(') else ', '}{quote}"
    # a quote with only with-sparsity figures ("1,979*"): the peaks are those halved, and the row says so
    return words + (_HALVED if "*" in quote and "|" not in quote else "")


def _table() -> list:
    return [(tuple(b["names"]), board_peaks(b), board_source(b)) for b in catalogue()["boards"]]


# [(names torch reports, {format: dense TFLOP/s}, source)], in the file's order (notebook 01 prints rows of it)
PEAK_TABLE = _table()


def table_peak(name: str, precision: str):
    """(FLOP/s, source) from the datasheet table for an exact device name, or (None, None)."""
    for names, peaks, source in PEAK_TABLE:
        if name in names and precision in peaks:
            return peaks[precision] * TB, source
    return None, None


# ---- measured instead: the cache files (measured peaks here, the roofline's probes in labkit.whatif) -------

# No device multiplies slower than a MFLOP/s or faster than 10 PFLOP/s dense (the fastest datasheet figure in
# devices.json is a few PFLOP/s): a cached peak outside this range was planted or damaged, not measured.
FLOPS_RANGE = (1e6, 1e16)
_SAID: set = set()  # (cache file, problem) already said by this process


def figure_problem(name: str, v, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False) -> Optional[str]:
    """Why ``v`` is not a cached figure within [lo, hi] (``lo_open``: above lo), in words; None when it is."""
    if not is_number(v) or not math.isfinite(v):
        return f"{name}={v!r} is not a finite number"
    if v < lo or (lo_open and v == lo) or v > hi:
        return f"{name}={v:g} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    return None


def peak_entry_problem(entry) -> Optional[str]:
    """Why one measured peak ({"flops", "n", "probes", ...}) cannot be used, in words; None when it can."""
    if not isinstance(entry, dict):
        return f"a peak is {type(entry).__name__}, not an object"
    problem = figure_problem("flops", entry.get("flops"), *FLOPS_RANGE)
    for k in ("n", "probes"):
        v = entry.get(k)
        if problem is None and v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            problem = f"{k}={v!r} is not a count"
    return problem


def _peak_key_problem(value) -> Optional[str]:
    """Why one key of peak_flops.json ({precision: peak entry}) cannot be used; None when it can."""
    if not isinstance(value, dict):
        return f"an entry is {type(value).__name__}, not an object of formats"
    return next((f"{p}: {problem}" for p, e in value.items() if (problem := peak_entry_problem(e))), None)



# ---- what an entry of the what-if probe cache (``roofline_probe.json``, whatif/probes.py) may
# hold: a planted or damaged entry (a wrong type or shape, a non-finite or absurd figure) is named
# in words and measured again, never used

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


_CHECKS = {PEAK_CACHE: _peak_key_problem}  # the peak cache checks itself; the probe cache passes its own


def read_cache(name: str, what: str, entry_problem: Optional[Callable] = None) -> dict:
    """The JSON object in ``cache_dir() / name`` ({} when missing, damaged or not an object: measure again;
    the next write replaces it whole). The one reader of labkit's measurement caches. Each entry is
    checked (``entry_problem(value)`` -> why it cannot be used, or None; the peak cache's own check by
    default): a wrong type or shape, a non-finite or absurd figure is dropped -- measured again -- and
    said once, in one line."""
    path = cache_dir() / name
    try:
        data = read_json(path, what=what)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        _say(path, what, f"not an object ({type(data).__name__})")
        return {}
    check = entry_problem or _CHECKS.get(name)
    if check is None:
        return data
    kept = {}
    for key, value in data.items():
        problem = check(value)
        if problem:
            _say(path, what, problem)
        else:
            kept[key] = value
    return kept


def _say(path, what: str, problem: str) -> None:
    if (str(path), problem) not in _SAID:
        _SAID.add((str(path), problem))
        print(f"[labkit] {what} {path}: {problem}; not used, measuring again", file=sys.stderr, flush=True)


def write_cache(name: str, data: dict) -> None:
    """Replace ``cache_dir() / name`` with ``data``, atomically: a DDP rank reading at the same moment sees
    old or new, and a full disk leaves no temp file. A cache that cannot be written (full, read-only, a
    folder in its place) is skipped: the value still lives in the process that measured it."""
    try:
        write_json_atomic(cache_dir() / name, data, sort_keys=True)
    except (OSError, ValueError):
        pass
