"""What data parallelism costs here: start-up of a 2-process run, and DDP's per-step cost at world size 1.

1. ``ddp_startup_s``: from calling ``labkit.run`` with world_size=2 (gloo on CPU) to the first
   update's record in the caller -- process spawn, torch import, process group, probes, first step.
2. ``ddp_ws1_ratio``: the bare loop wrapped in DDP (process group of one, as every labkit run is)
   over the same bare loop without DDP, alternating, median of repeats.

    python benchmarks/ddp.py --model small --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import labkit as lk  # noqa: E402
from overhead import bare_loop  # noqa: E402


def startup_s(cfg: lk.Config) -> float:
    t0 = time.perf_counter()
    first = []
    lk.run(cfg, on_step=lambda rec: first.append(time.perf_counter() - t0) if not first else None)
    return first[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--startup-repeats", type=int, default=3)
    ns = ap.parse_args(argv)

    starts = [startup_s(lk.Config(model="tiny", world_size=2, steps=2)) for _ in range(ns.startup_repeats)]
    for s in starts:
        print(f"world size 2 start-up to first record: {s:.2f} s")

    cfg = lk.Config(model=ns.model, steps=ns.steps, warmup=2)
    plain, wrapped = [], []
    bare_loop(cfg)  # warm caches outside the timing
    for i in range(ns.repeats):
        pair = ((False, plain), (True, wrapped))
        for ddp, acc in (pair if i % 2 == 0 else pair[::-1]):
            acc.append(statistics.median(bare_loop(cfg, ddp=ddp)))
        print(f"repeat {i + 1}: bare {plain[-1] * 1000:.2f} ms, bare+DDP(ws=1) {wrapped[-1] * 1000:.2f} ms")
    print(f"ddp_startup_s={statistics.median(starts):.2f} "
          f"ddp_ws1_ratio={statistics.median(wrapped) / statistics.median(plain):.4f}")


if __name__ == "__main__":
    main()
