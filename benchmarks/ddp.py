"""What data parallelism costs here: start-up of a 2-process run, and DDP's per-step cost at world size 1.

1. Start-up: from calling ``labkit.run`` with world_size=2 (gloo on CPU) to the first update's record
   in the caller, cold and warm interleaved in one process, medians:
   * ``ddp_startup_s_cold``: ``LABKIT_WARM_START=0``, every rank a fresh Python (spawn, torch import,
     process group, probes, first step);
   * ``ddp_startup_s_warm``: ranks forked from this process's preloaded forkserver, already running;
   * ``ddp_startup_s_server_start``: the first warm run, which starts that server (once per kernel).
   ``ddp_startup_s`` is what ``lk.run`` does by default (warm). The machine's load is printed with them.
2. ``ddp_ws1_ratio``: the bare loop wrapped in DDP (process group of one, as every labkit run is)
   over the same bare loop without DDP, alternating, median of repeats.

    python benchmarks/ddp.py --model small --repeats 5 --startup-repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import labkit as lk  # noqa: E402
from labkit.engine import launch  # noqa: E402
from labkit.engine.device import cores, machine_load  # noqa: E402
from overhead import bare_loop  # noqa: E402


def startup_s(cfg: lk.Config, warm: bool) -> float:
    os.environ["LABKIT_WARM_START"] = "1" if warm else "0"  # read by lk.run at each call
    t0 = time.perf_counter()
    first = []
    lk.run(cfg, on_step=lambda rec: first.append(time.perf_counter() - t0) if not first else None)
    return first[0]


def startups(repeats: int) -> dict:
    """{"server_start": s, "cold": [s...], "warm": [s...]}: the first warm run starts the server; then
    cold and warm alternate (which goes first swaps each round), so both see the same load."""
    cfg = lk.Config(model="tiny", world_size=2, steps=2)
    launch.stop_warm_server()
    out = {"server_start": startup_s(cfg, warm=True), "cold": [], "warm": []}
    print(f"first warm run (starts the server): {out['server_start']:.2f} s")
    for i in range(repeats):
        for warm in ((False, True) if i % 2 == 0 else (True, False)):
            out["warm" if warm else "cold"].append(startup_s(cfg, warm))
        print(f"round {i + 1}: cold {out['cold'][-1]:.2f} s, warm {out['warm'][-1]:.2f} s")
    os.environ.pop("LABKIT_WARM_START")
    return out


def _cores(reading: dict) -> str:
    return "n/a" if reading["other_cores"] is None else f"{reading['other_cores']:.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--startup-repeats", type=int, default=3)
    ns = ap.parse_args(argv)

    # Others' load just before and just after (a LoadMeter across the runs would count the warm ranks,
    # children of the server rather than of this process, as somebody else's).
    loads = [machine_load(1.0)]
    starts = startups(ns.startup_repeats)
    loads.append(machine_load(1.0))
    cold, warm = statistics.median(starts["cold"]), statistics.median(starts["warm"])
    print(f"ddp_startup_s_cold={cold:.2f} ddp_startup_s_warm={warm:.2f} "
          f"ddp_startup_s_server_start={starts['server_start']:.2f} warm_over_cold={warm / cold:.3f}")
    print("machine load before/after: other_cores=" + "/".join(_cores(r) for r in loads) + f" of {cores()}, "
          f"load_avg_1min={os.getloadavg()[0]:.2f}, busy={any(r['busy'] for r in loads)}")

    cfg = lk.Config(model=ns.model, steps=ns.steps, warmup=2)
    plain, wrapped = [], []
    bare_loop(cfg)  # warm caches outside the timing
    for i in range(ns.repeats):
        pair = ((False, plain), (True, wrapped))
        for ddp, acc in (pair if i % 2 == 0 else pair[::-1]):
            acc.append(statistics.median(bare_loop(cfg, ddp=ddp)))
        print(f"repeat {i + 1}: bare {plain[-1] * 1000:.2f} ms, bare+DDP(ws=1) {wrapped[-1] * 1000:.2f} ms")
    print(f"ddp_startup_s={warm:.2f} "
          f"ddp_ws1_ratio={statistics.median(wrapped) / statistics.median(plain):.4f}")


if __name__ == "__main__":
    main()
