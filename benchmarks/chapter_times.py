"""Measure how long each chapter notebook takes to run top to bottom on this machine.

    python benchmarks/chapter_times.py                      # every notebooks/NN_*.ipynb, normal mode
    python benchmarks/chapter_times.py --ci                 # with CI=true (short runs, as in CI)
    python benchmarks/chapter_times.py 07 --cells           # one chapter, slowest cells listed too
    python benchmarks/chapter_times.py --markdown           # a table for notebooks/README.md

Each notebook runs in a fresh kernel (nbclient), from the notebooks/ folder like JupyterLab and nbval
do; nothing is written back to the notebooks. Times include kernel start-up. They depend on the machine
and on whatever else it is doing: say which machine and how loaded it was when you quote them
(the load average before and after each notebook is printed).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def chapters(selection) -> list:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if selection:
        paths = [p for p in paths if any(p.name.startswith(s) or p.stem == s for s in selection)]
    return paths


def _parse(ts):
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")) if ts else None


def run_notebook(path: Path, timeout: int) -> dict:
    """Execute one notebook in a fresh kernel; return wall time, status and per-cell times."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=True,
                            resources={"metadata": {"path": str(path.parent)}})
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        client.execute()
    except CellExecutionError as e:
        status, error = "error", str(e).strip().splitlines()[-1][:200]
    except Exception as e:  # noqa: BLE001 -- a timeout or a dead kernel: report, go on
        status, error = type(e).__name__, str(e)[:200]
    wall = time.perf_counter() - t0
    cells = []
    for i, c in enumerate(nb.cells):
        ex = c.get("metadata", {}).get("execution", {})
        a, b = _parse(ex.get("iopub.execute_input")), _parse(ex.get("shell.execute_reply"))
        if a and b:
            tags = c.get("metadata", {}).get("tags", [])
            cells.append((i, (b - a).total_seconds(), ",".join(tags) or c.source.splitlines()[0][:50]))
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"name": path.name, "wall_s": wall, "status": status, "error": error, "cells": cells,
            "load_before": load0, "load_after": load1}


def lk_env_fast(caps) -> list:
    """The formats measured faster than fp32 on this machine (the cached peak probe)."""
    from labkit.engine.device import env_report

    return env_report(caps.kind)["fast_formats"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("chapters", nargs="*", help="chapter numbers or notebook names (default: all)")
    ap.add_argument("--ci", action="store_true", help="set CI=true: the short mode CI runs")
    ap.add_argument("--cells", type=int, nargs="?", const=5, default=0, help="list the N slowest cells")
    ap.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table at the end")
    args = ap.parse_args(argv)
    os.environ["LABKIT_MODE"] = "short" if args.ci else "full"  # lk.course.smoke reads it before CI
    if args.ci:
        os.environ["CI"] = "true"
    else:
        os.environ.pop("CI", None)
    paths = chapters(args.chapters)
    if not paths:
        print("no chapter notebooks found", file=sys.stderr)
        return 1
    import torch

    from labkit.engine.device import capabilities

    from labkit.engine.device import _isa_flags

    caps = capabilities("auto")
    isa = " ".join(_isa_flags()) or "no AVX-512, no AMX"
    limits = " ".join(f"{v}={os.environ[v]}" for v in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if v in os.environ)
    print(f"machine: {caps.name} ({caps.kind}), {os.cpu_count()} CPUs, torch {torch.__version__}; "
          f"mode: {'CI' if args.ci else 'normal'}")
    print(f"cpu flags: {isa}" + (f"; limited by {limits}" if limits else ""))
    print(f"fast formats here: {', '.join(lk_env_fast(caps)) or 'none (bf16/fp16 emulated)'}", flush=True)
    results = []
    for p in paths:
        r = run_notebook(p, args.timeout)
        results.append(r)
        load = (f"load {r['load_before']:.1f} -> {r['load_after']:.1f}" if r["load_before"] is not None else "")
        print(f"{r['name']:<36} {r['wall_s']:7.1f} s  {r['status']}  {load}  {r['error']}", flush=True)
        for i, sec, what in sorted(r["cells"], key=lambda c: -c[1])[:args.cells]:
            print(f"    cell {i:>3} {sec:7.1f} s  {what}")
    if args.markdown:
        print(f"\n| chapter | {'CI mode' if args.ci else 'normal'} (s) |\n|---|---:|")
        for r in results:
            print(f"| {r['name']} | {r['wall_s']:.0f}{'' if r['status'] == 'ok' else ' (' + r['status'] + ')'} |")
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
