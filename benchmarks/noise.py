"""How often does ``lk.compare_configs`` claim a difference that is not there, and how often does it find
one that is? A/A comparisons (the same configuration as both arms) must say "same"; A/B comparisons
with a real effect must say which way.

    python benchmarks/noise.py                        # 40 A/A + 20 A/B with the chapters' budgets
    python benchmarks/noise.py --aa 10 --ab 4 --budget 6      # a quick look
    python benchmarks/noise.py --load                 # the same with another process loading one core

The A/B effects: `data_cost_ms` large against 0 with no workers (wall time: tokens/s), and full
activation checkpointing against none (compute cost: CPU-seconds per update). The last line is
``false_claims=<A/A share not "same"> detected=<A/B share with the right verdict>``; the line before it
gives both shares' 95 % Wilson intervals.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import labkit as lk  # noqa: E402
from labkit.engine.device import capabilities  # noqa: E402

BASE = dict(model="tiny", steps=4, warmup=1, micro_batch=8)


def cases(n_aa: int, n_ab: int) -> list:
    """(kind, a, b, metric, expected verdict of b against a)."""
    a = lk.Config(**BASE)
    out = [("A/A tokens/s", a, a, "tokens_per_s", "same") for _ in range(n_aa // 2)]
    out += [("A/A CPU-s", a, a, "cpu_s_per_update", "same") for _ in range(n_aa - n_aa // 2)]
    slow_data = a.replace(data_cost_ms=2.0)
    ckpt_base = a  # full checkpointing recomputes each block: about +30-40 % CPU-seconds on tiny
    ab = [("A/B data cost", a, slow_data, "tokens_per_s", "lower"),
          ("A/B checkpointing", ckpt_base, ckpt_base.replace(checkpointing="full"), "cpu_s_per_update", "higher")]
    out += [ab[i % 2] for i in range(n_ab)]
    return _interleave(out)  # a drift in machine load then hits A/A and A/B alike


def _interleave(items):
    aa = [c for c in items if c[0].startswith("A/A")]
    ab = [c for c in items if c[0].startswith("A/B")]
    mixed = []
    while aa or ab:
        mixed += aa[:2] + ab[:1]
        aa, ab = aa[2:], ab[1:]
    return mixed


def wilson(k: int, n: int, z: float = 1.96) -> tuple:
    """95 % Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


BURN = "x = 0\nwhile True:\n    x = (x + 1) % 1000003"


def start_burner() -> int:
    """Another program keeping one core busy, started *outside* this process tree (the shell that starts
    it exits at once): a child of ours would count as our own CPU time, and the load meter would not
    see it as someone else's load. Returns its pid."""
    out = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 & echo $!', BURN],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aa", type=int, default=40, help="A/A comparisons")
    ap.add_argument("--ab", type=int, default=20, help="A/B comparisons with a real effect")
    ap.add_argument("--budget", type=float, default=15.0, help="budget_s of each comparison (the chapters' size)")
    ap.add_argument("--load", action="store_true", help="keep one core busy with another process throughout")
    ns = ap.parse_args(argv)
    caps = capabilities("auto")
    print(f"machine: {caps.name} ({caps.cores} cores; flags {' '.join(caps.cpu_flags) or 'n/a'}); "
          f"torch {lk.engine.train.torch.__version__}; python {platform.python_version()}; "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '')}", flush=True)
    burner = None
    if ns.load:
        burner = start_burner()
        print(f"condition: another program (pid {burner}, not ours) keeps one core busy", flush=True)
    else:
        print(f"condition: no extra load (1-minute load average {os.getloadavg()[0]:.2f})", flush=True)
    t0 = time.perf_counter()
    tally = {"aa": [0, 0], "ab": [0, 0]}
    try:
        todo = cases(ns.aa, ns.ab)
        for i, (kind, a, b, metric, expected) in enumerate(todo, 1):
            c = lk.compare_configs(a, b, metric=metric, budget_s=ns.budget, progress=False,
                                   label_a="a", label_b="b")
            key = "aa" if kind.startswith("A/A") else "ab"
            right = c.verdict == expected
            tally[key][0] += (not right) if key == "aa" else right
            tally[key][1] += 1
            print(f"{i:3d}/{len(todo)} {kind:<18} {metric:<17} verdict={c.verdict:<6} expected={expected:<6} "
                  f"ratio={c.ratio:.3f} [{c.low:.3f}, {c.high:.3f}] n={len(c.samples_a)} busy={c.busy} "
                  f"{c.elapsed_s:.0f}s", flush=True)
    finally:
        if burner is not None:
            os.kill(burner, signal.SIGKILL)
    (fa, na), (da, nb) = tally["aa"], tally["ab"]
    false_rate, det_rate = fa / max(1, na), da / max(1, nb)
    lo1, hi1 = wilson(fa, na)
    lo2, hi2 = wilson(da, nb)
    print(f"total {time.perf_counter() - t0:.0f} s; {na} A/A, {nb} A/B")
    print(f"95% intervals: false_claims [{lo1:.3f}, {hi1:.3f}] detected [{lo2:.3f}, {hi2:.3f}] (Wilson)")
    print(f"false_claims={false_rate:.3f} detected={det_rate:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
