"""The allocator demo (taught in chapter 08): both fragmentation patterns, without and with a memory cap, run
in a fresh process per ``expandable_segments`` setting, and whether each arm measured what the allocator's rules
predict. The child process is ``python -m labkit.chapters.memlab --fragment`` (this folder's __main__).

    demos = memlab.fragmentation_demos()          # CUDA: one process per setting
    memlab.fragmentation_table(demos)             # each arm: measured, expected, confirmed?
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from ...engine.config import ConfigError, _num
from ._common import MIB
from .allocator import PAGE_MIB, allocator_stats, fragmentation_patterns


# What each arm of the demo is expected to show -- from the allocator's rules, not measured (chapter 08's
# markdown words each one): the test that the demo's own numbers confirm it. (pattern, expandable, capped) -> test.
EXPECTED = {
    ("holes", False, False): lambda m, p: m["ok"] and m["reserved_unallocated"] >= 0.98 * p["freed_mib"] * MIB,
    ("holes", True, False): lambda m, p: m["ok"] and m["reserved_unallocated"] >= 0.98 * p["freed_mib"] * MIB,
    ("holes", False, True): lambda m, p: not m["ok"] and m["ooms"] >= 1,
    ("holes", True, True): lambda m, p: m["ok"] and m["alloc_retries"] >= 1 and m["ooms"] == 0,
    ("growth", False, False): lambda m, p: (m["ok"] and m["reserved"] >= 0.98 * p["fixed_reserved_mib"] * MIB
                                            and m["segments"] >= p["steps"]),
    ("growth", True, False): lambda m, p: m["ok"] and m["reserved"] <= (p["expandable_reserved_mib"]
                                                                        + PAGE_MIB[True]) * MIB,
    ("growth", False, True): lambda m, p: m["ok"] and m["alloc_retries"] >= 1 and m["ooms"] == 0,
    ("growth", True, True): lambda m, p: m["ok"] and m["alloc_retries"] == 0,
}


def _cap(dev, mib: float) -> None:
    """Let this process's allocator reserve at most ``mib`` MiB (the fraction is global to the process)."""
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, mib * MIB / total), dev)


def _holes(dev, p: dict, capped: bool, keep: list) -> None:
    """The holes pattern (hole_pattern): one segment, every other block freed, then the request."""
    arena = torch.empty(p["arena_mib"] * MIB, dtype=torch.uint8, device=dev)
    del arena  # cached as one free segment: the blocks below are carved out of it
    keep += [torch.empty(p["block_mib"] * MIB, dtype=torch.uint8, device=dev) for _ in range(p["count"])]
    for i in range(0, p["count"], 2):
        keep[i] = None  # every other block freed: holes between live blocks, inside one segment
    if capped:  # room for half the request beyond what is reserved now: only the holes can make up the rest
        _cap(dev, torch.cuda.memory_reserved(dev) / MIB + p["request_mib"] / 2)
    keep.append(torch.empty(p["request_mib"] * MIB, dtype=torch.uint8, device=dev))


def _growth(dev, p: dict, capped: bool, keep: list) -> None:
    """The growth pattern (growth_pattern): a live tensor, then one larger temporary tensor per step."""
    if capped:
        _cap(dev, torch.cuda.memory_reserved(dev) / MIB + p["cap_mib"])
    keep.append(torch.empty(p["live_mib"] * MIB, dtype=torch.uint8, device=dev))
    for s in p["sizes_mib"]:
        step = torch.empty(s * MIB, dtype=torch.uint8, device=dev)
        del step  # freed at the step's end, as activations are


def _arm(build, dev, pattern: dict, capped: bool) -> dict:
    """One arm of the demo: allocator numbers after ``build`` ran (counters as differences over the arm).
    The cap and every tensor are gone afterwards, whatever happened."""
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    before, keep, error = allocator_stats(dev), [], None
    try:
        try:
            build(dev, pattern, capped, keep)
        except torch.cuda.OutOfMemoryError as e:
            error = " ".join(str(e).split())[:600]
        after = allocator_stats(dev)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)  # global to the process: never leave a cap behind
        keep.clear()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    counters = ("alloc_retries", "ooms", "device_allocs", "device_frees")
    return {**{k: after[k] for k in ("allocated", "reserved", "reserved_unallocated", "segments", "inactive_split")},
            **{k: after[k] - before[k] for k in counters}, "ok": error is None, "error": error}


def _fragment() -> dict:
    """Both patterns, without and with a cap, in this process (CUDA; the allocator's settings as started)."""
    dev = torch.device("cuda", 0)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    expandable = "expandable_segments:true" in conf.replace(" ", "").lower()
    pats = fragmentation_patterns(expandable)
    arms = {f"{name} {'capped' if capped else 'uncapped'}": _arm(build, dev, pats[name], capped)
            for name, build in (("holes", _holes), ("growth", _growth)) for capped in (False, True)}
    return {"settings": conf, "patterns": pats, "arms": arms, "gpu": torch.cuda.get_device_name(dev),
            "torch": torch.__version__}


def fragmentation_demo(expandable: bool, timeout_s: float = 120.0) -> dict:
    """Run both fragmentation patterns (fragmentation_patterns), each without and with a memory cap, in a
    fresh Python process with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` or ``False``: the allocator
    reads it when CUDA starts, so a process of its own is the documented way to switch it, and the cap
    (``set_per_process_memory_fraction``) dies with that process. The process is killed if it outlives
    ``timeout_s``, or if this call is interrupted."""
    if not isinstance(expandable, bool):
        raise ConfigError("expandable", expandable, "True or False")
    _num("timeout_s", timeout_s, 1.0, 3600.0)
    if not torch.cuda.is_available():
        raise RuntimeError("the caching allocator's segments exist on CUDA only: this demo needs a CUDA GPU, and "
                           "this machine has none")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=f"expandable_segments:{'True' if expandable else 'False'}")
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    try:  # run() kills the child on a timeout and on any exception here (Ctrl-C included) before re-raising
        out = subprocess.run([sys.executable, "-m", "labkit.chapters.memlab", "--fragment"], capture_output=True, text=True,
                             env=env, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the allocator demo did not finish within timeout_s={timeout_s:g} s; its process was "
                           "stopped") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the allocator demo failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
    return {"expandable_segments": expandable, **json.loads(lines[-1])}


def fragmentation_demos(timeout_s: float = 120.0) -> dict:
    """``fragmentation_demo`` with fixed, then with expandable segments: {False: ..., True: ...}, with a
    progress line (each is a process of its own that starts CUDA)."""
    from ...base.progress import Progress  # deferred: a notebook-only display

    _num("timeout_s", timeout_s, 1.0, 3600.0)
    out = {}
    with Progress(total=2, label="allocator demo, one process per setting") as bar:
        for i, flag in enumerate((False, True)):
            out[flag] = fragmentation_demo(flag, timeout_s)
            bar.update(i + 1, note=f"expandable_segments={flag} done")
    return out


def _demos(demos) -> dict:
    """{expandable: fragmentation_demo result} -- what fragmentation_table and _verdicts read."""
    if not isinstance(demos, dict) or not demos or not all(
            isinstance(k, bool) and isinstance(v, dict) and "arms" in v for k, v in demos.items()):
        raise ConfigError("demos", type(demos).__name__, "{False: fragmentation_demo(False), True: "
                                                         "fragmentation_demo(True)}")
    return demos


def fragmentation_verdicts(demos: dict) -> list:
    """One row per arm: the pattern, the setting, the cap and whether the measurement shows what the
    allocator's rules predict for it (``EXPECTED``; the chapter words each prediction)."""
    rows = []
    for flag, d in sorted(_demos(demos).items()):
        for arm, m in d["arms"].items():
            name, capped = arm.split()[0], arm.endswith(" capped")
            test = EXPECTED[(name, flag, capped)]
            rows.append({"pattern": name, "expandable": flag, "capped": capped,
                         "confirmed": bool(test(m, d["patterns"][name])), **m})
    return rows


def fragmentation_table(demos: dict) -> list:
    """The demo as a table, one row per arm: its measured allocator numbers and whether they show what the
    allocator's rules predict (``EXPECTED``; the chapter's markdown says what each arm should show)."""
    from ..course import table  # deferred: the course module draws; this one measures
    mib = lambda b: f"{b / MIB:,.0f} MiB"  # noqa: E731
    return table(fragmentation_verdicts(demos), [
        ("pattern", "pattern", "{}"), ("expandable", "segments", lambda e: "expandable" if e else "fixed"),
        ("capped", "cap", lambda c: "yes" if c else "no"),
        ("ok", "the request", lambda ok: "served" if ok else "out of memory"), ("reserved", "reserved", mib),
        ("reserved_unallocated", "reserved, not allocated", mib), ("segments", "cudaMalloc segments", "{}"),
        ("alloc_retries", "retries", "{}"), ("confirmed", "as predicted?", lambda c: "yes" if c else "NO")])
