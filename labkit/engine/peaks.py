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
from pathlib import Path
from typing import Optional

from ..base.paths import cache_dir, read_json, write_json_atomic

__all__ = ["CATALOGUE_FILE", "PEAK_CACHE", "PEAK_TABLE", "TB", "catalogue", "value", "board_peaks",
           "board_source", "table_peak", "read_cache", "write_cache"]

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

def read_cache(name: str, what: str) -> dict:
    """The JSON object in ``cache_dir() / name`` ({} when missing, damaged or not an object: measure again;
    the next write replaces it whole). The one reader of labkit's measurement caches."""
    try:
        data = read_json(cache_dir() / name, what=what)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(name: str, data: dict) -> None:
    """Replace ``cache_dir() / name`` with ``data``, atomically: a DDP rank reading at the same moment sees
    old or new, and a full disk leaves no temp file. A cache that cannot be written (full, read-only, a
    folder in its place) is skipped: the value still lives in the process that measured it."""
    try:
        write_json_atomic(cache_dir() / name, data, sort_keys=True)
    except (OSError, ValueError):
        pass
