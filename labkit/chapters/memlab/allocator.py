"""The CUDA caching allocator (taught in chapter 08): its own statistics, the arithmetic of the two
fragmentation patterns under its rounding rules (pure arithmetic: any device), and its recorded history.

    memlab.allocator_stats()                      # allocated, reserved, splits, segments, retries (CUDA)
    pat = memlab.fragmentation_patterns()         # the allocator demo's arithmetic
    memlab.record_cuda_history(config, "snap.pickle")
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import torch

from ...base.paths import check_writable, write_atomic
from ...engine.config import Config, ConfigError, _int
from ...engine.device import capabilities
from ...engine.train import run
from ._common import _config


def allocator_stats(device=None) -> dict:
    """The caching allocator's view (CUDA only): bytes handed to tensors (allocated), bytes held from the
    driver (reserved) and their difference, cached-but-unusable splits (inactive_split), segments (cudaMalloc'd
    ones: an expandable segment's mapped pages are not counted in ``segment.all.current``), retries, OOMs,
    and the driver calls so far (``num_device_alloc``/``free``: cudaMalloc/cudaFree, or page maps/unmaps).
    Shown in 08_memory_in_practice (code-08-memory-stats); measure-08-allocator reads it after a run."""
    if not torch.cuda.is_available():
        raise RuntimeError("allocator statistics come from the CUDA caching allocator; this machine has no CUDA GPU")
    s = torch.cuda.memory_stats(device)
    alloc = s.get("allocated_bytes.all.current", 0)
    reserved = s.get("reserved_bytes.all.current", 0)
    return {"allocated": alloc, "reserved": reserved, "reserved_unallocated": reserved - alloc,
            "peak_allocated": s.get("allocated_bytes.all.peak", 0), "peak_reserved": s.get("reserved_bytes.all.peak", 0),
            "inactive_split": s.get("inactive_split_bytes.all.current", 0),
            "segments": s.get("segment.all.current", 0), "alloc_retries": s.get("num_alloc_retries", 0),
            "ooms": s.get("num_ooms", 0), "device_allocs": s.get("num_device_alloc", 0),
            "device_frees": s.get("num_device_free", 0), "fragmentation": 1 - alloc / reserved if reserved else 0.0}


# The allocator's rounding (c10/cuda/CUDACachingAllocator.cpp): a cudaMalloc'd segment for a request of
# 10 MiB or more is rounded up to 2 MiB (kRoundLarge); an expandable segment maps pages of 20 MiB (kLargeBuffer).
PAGE_MIB = {False: 2, True: 20}


def _pages(mib: float, expandable: bool) -> int:
    p = PAGE_MIB[expandable]
    return int(math.ceil(mib / p) * p)


def hole_pattern(block_mib: int = 64, count: int = 16, request_mib: int = 192, expandable: bool = False) -> dict:
    """The arithmetic of the holes pattern. One ``count`` × ``block_mib`` tensor is allocated and freed, so
    the allocator caches it as one segment; ``count`` blocks are then carved out of that segment, every other
    one is freed, and one ``request_mib`` tensor is asked for. Each freed block sits between two live ones,
    so no two holes merge (with expandable segments the last page's unused tail is one more, small hole).

    Raises ConfigError unless the largest hole < the request < all holes together: the request must fit
    the holes' sum but no hole. ``unmappable_mib``: how much of the holes lies in whole 20 MiB pages, which
    an expandable segment can unmap and map again at its end; fixed segments can give back nothing here,
    because the one segment still holds live blocks."""
    _int("block_mib", block_mib, 2, 4096)
    _int("count", count, 4, 256)
    if count % 2:
        raise ConfigError("count", count, "an even number: every other block is freed, the last one stays live")
    _int("request_mib", request_mib, 2, 10**6)
    arena = block_mib * count
    mapped = _pages(arena, expandable)
    holes = [(i * block_mib, (i + 1) * block_mib) for i in range(0, count, 2)]
    holes += [(arena, mapped)] if mapped > arena else []  # the segment's tail past the last (live) block
    sizes = [b - a for a, b in holes]
    largest, total = max(sizes), sum(sizes)
    if not largest < request_mib < total:
        raise ConfigError("request_mib", request_mib, f"more than the largest hole ({largest} MiB) and less than all "
                                                      f"{len(sizes)} holes together ({total} MiB)")
    page = PAGE_MIB[True]
    unmappable = sum(max(0, b // page - -(-a // page)) * page for a, b in holes)  # whole pages inside each hole
    return {"block_mib": block_mib, "count": count, "request_mib": request_mib, "arena_mib": arena,
            "reserved_mib": mapped, "live_mib": arena // 2, "holes_mib": sizes, "largest_hole_mib": largest,
            "sum_holes_mib": total, "freed_mib": block_mib * (count // 2), "unmappable_mib": unmappable if expandable else 0,
            "cap_mib": mapped + request_mib // 2, "expandable": expandable}


def _grow(live: int, sizes: list, expandable: bool, cap: float = math.inf) -> dict:
    """The growth pattern under the allocator's rules, in MiB: what stays reserved, the retries, whether it
    fits. A request that would take reserved past ``cap`` first releases what can be released -- fixed
    segments: every cached (whole, free) segment; an expandable segment: its free whole pages -- and retries.
    The cap check counts the whole request, even where an expandable segment maps only the difference."""
    reserved, cached, retries, worst = _pages(live, expandable), 0, 0, 0
    for s in sizes:
        worst = max(worst, reserved + s)
        if reserved + s > cap:
            reserved, cached, retries = (_pages(live, True) if expandable else reserved - cached), 0, retries + 1
            if reserved + s > cap:
                return {"reserved_mib": reserved, "retries": retries, "ok": False, "worst_mib": worst}
        if expandable:
            reserved = max(reserved, _pages(live + s, True))  # the segment maps the difference at its end
        else:
            reserved, cached = reserved + s, cached + s  # a new segment; freed at the step's end, it stays cached
    return {"reserved_mib": reserved, "retries": retries, "ok": True, "worst_mib": worst}


def growth_pattern(live_mib: int = 64, first_mib: int = 256, step_mib: int = 32, steps: int = 8,
                   expandable: bool = False) -> dict:
    """The arithmetic of the growth pattern: one ``live_mib`` tensor stays (the weights), then each of
    ``steps`` steps allocates one tensor ``step_mib`` larger than the step before and frees it (activations
    of a growing sequence length). With fixed segments a cached segment never fits the next, larger request:
    each step reserves a new one and the old ones stay cached -- live + the sum of all sizes. An expandable
    segment maps the difference at its end instead: live + the largest size, in 20 MiB pages.

    The capped arm allows ``cap_mib``: what the expandable segment needs at its worst step, plus one page.
    ``fixed_retries``: how often fixed segments then reach the cap, release every cached segment and try
    again (each retry also synchronises the device); an expandable segment needs none."""
    _int("live_mib", live_mib, 2, 10**5)
    _int("first_mib", first_mib, 10, 10**5)  # >= 10 MiB: rounded to 2 MiB, so the arithmetic here is exact
    _int("step_mib", step_mib, 2, 10**5)     # >= 2 MiB: a step's request never fits the last step's segment
    _int("steps", steps, 2, 64)
    sizes = [_pages(first_mib + i * step_mib, False) for i in range(steps)]
    fixed, grown = _grow(live_mib, sizes, False), _grow(live_mib, sizes, True)
    cap = grown["worst_mib"] + PAGE_MIB[True]
    return {"live_mib": live_mib, "sizes_mib": sizes, "steps": steps, "largest_mib": sizes[-1],
            "sum_mib": sum(sizes), "reserved_mib": (grown if expandable else fixed)["reserved_mib"],
            "fixed_reserved_mib": fixed["reserved_mib"], "expandable_reserved_mib": grown["reserved_mib"],
            "cap_mib": cap, "fixed_retries": _grow(live_mib, sizes, False, cap)["retries"],
            "expandable_retries": _grow(live_mib, sizes, True, cap)["retries"], "expandable": expandable}


def fragmentation_patterns(expandable: bool = False) -> dict:
    """Both patterns of the allocator demo, with the sizes it uses (pure arithmetic: any device)."""
    if not isinstance(expandable, bool):
        raise ConfigError("expandable", expandable, "True or False")
    return {"holes": hole_pattern(expandable=expandable), "growth": growth_pattern(expandable=expandable)}


def record_cuda_history(config: Config, path, steps: int = 2, max_entries: int = 200_000) -> str:
    """Run ``steps`` updates of ``config`` with the CUDA allocator recording every allocation and free,
    and write the snapshot to ``path`` (PyTorch's own snapshot format, a pickle that labkit writes and never reads:
    drag it onto https://pytorch.org/memory_viz). Written atomically: a failed write leaves no half file."""
    _config(config)
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError("path", path, "a file path (str or pathlib.Path) for the snapshot")
    _int("steps", steps, 1, 1000)
    _int("max_entries", max_entries, 1, 10**8)
    if capabilities(config.device).kind != "cuda":
        raise RuntimeError("the allocator's history is a CUDA feature (torch.cuda.memory._record_memory_history)")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    check_writable(path)  # a folder, a device or a read-only place is refused now, not after the run
    rec = torch.cuda.memory._record_memory_history
    rec(max_entries=max_entries)
    try:
        run(config.replace(steps=steps, warmup=min(config.warmup, steps - 1)))
        with tempfile.TemporaryDirectory() as tmp:  # private (0o700): PyTorch writes its file here
            own = Path(tmp) / "snapshot.pickle"
            torch.cuda.memory._dump_snapshot(str(own))
            blob = own.read_bytes()  # bytes only: nothing here unpickles it
    finally:
        rec(enabled=None)  # stop recording: it costs time on every allocation
    return str(write_atomic(path, blob))
