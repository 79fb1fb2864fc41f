"""labkit's instrumented loop against a bare hand-written loop doing the same work, and the fixed cost
of one ``lk.run``.

Same model, config, data and sample order. Both are timed the same way: wall clock per optimizer
update, ending with a device synchronisation, warm-up updates left out. The two alternate
(labkit, bare, labkit, bare, ...) so drifts in machine load hit both; the ratio is taken within each
repeat and the median of those ratios is reported, with their quartiles. labkit's side includes everything it does on every update: DDP (a process group of one
at world size 1), the counting comm hook, per-update records, loss/grad-norm bookkeeping.

The fixed cost per run is what a run costs beyond N updates at the steady pace. For each of labkit's
runs above: the wall time of the whole ``lk.run`` call (checks, set-up, probes, every update, summary,
teardown) minus the sum of its N timed updates -- the time outside them, ``outside_updates_s`` -- plus
the first update's excess over the median update (its warm-up: a learner pays it on every run).
``fixed_cost_s`` is the median over the repeats. (Wall time minus N x the median update would say the
same on a quiet machine, but on a shared one the other updates' scatter swamps it, even below zero.)

With ``--old-teardown`` a third arm, interleaved with the others, runs ``lk.run`` as it was before issue
34: a full ``gc.collect()`` at every teardown and nothing remembered between runs (the activation probe
runs and the corpus is hashed again each time), so before and after are measured side by side.
Each repeat prints the machine's load (other processes' cores) beside its figures.

    python benchmarks/overhead.py --model small --steps 12 --repeats 5 [--old-teardown]
    -> lines: fixed_cost_s=<s> [fixed_cost_s_old=<s>], overhead_ratio_q1=, overhead_ratio_q3=,
       last line: overhead_ratio=<labkit/bare>
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.__main__ import _add_config_args, config_from_args  # noqa: E402
from labkit.engine import data, measure, train  # noqa: E402
from labkit.engine.data import make_loader  # noqa: E402
from labkit.engine.device import LoadMeter, capabilities, cores, synchronize  # noqa: E402
from labkit.engine.model import GPT  # noqa: E402
from labkit.engine.precision import autocast, matmul_precision  # noqa: E402
from labkit.engine.step import make_optimizer  # noqa: E402
from labkit.engine.train import _device_for, threads_for  # noqa: E402


def bare_loop(cfg: lk.Config, ddp: bool = False) -> list:
    """The textbook loop, no instrumentation. Returns per-update seconds (after warm-up).
    With ``ddp=True`` the model is wrapped in DDP in a process group of one, as labkit does."""
    kind = capabilities(cfg.device).kind
    dev = _device_for(kind, 0)
    old = torch.get_num_threads()
    torch.set_num_threads(threads_for(cfg, kind, 1))  # same thread count as labkit uses
    try:
        torch.manual_seed(cfg.seed)
        model = GPT(cfg.spec, cfg.dropout, cfg.checkpointing, cfg.checkpoint_every).to(dev)
        net = model
        if ddp:
            torch.distributed.init_process_group("gloo" if kind == "cpu" else "nccl",
                                                 store=torch.distributed.HashStore(), rank=0, world_size=1)
            net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_cap_mb)
        fwd = torch.compile(net) if cfg.compile else net
        opt = make_optimizer(cfg, model.parameters())
        scaler = (torch.amp.GradScaler(kind, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval)
                  if cfg.scaling_on else None)
        loader, _ = make_loader(cfg)
        it = iter(loader)
        times = []
        with matmul_precision(kind, cfg.precision):
            for _ in range(cfg.steps):
                t0 = time.perf_counter()
                for _ in range(cfg.accum):
                    x, y = next(it)
                    x, y = x.to(dev, non_blocking=cfg.pin_memory), y.to(dev, non_blocking=cfg.pin_memory)
                    with autocast(kind, cfg.precision):
                        loss = fwd(x, y)
                    loss = loss / cfg.accum
                    (scaler.scale(loss) if scaler else loss).backward()
                if scaler:
                    scaler.unscale_(opt)
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                if scaler:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                opt.zero_grad(set_to_none=True)
                synchronize(dev)
                times.append(time.perf_counter() - t0)
        del it
        return times[cfg.warmup:]
    finally:
        net = fwd = None
        if ddp and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        torch.set_num_threads(old)


def labkit_loop(cfg: lk.Config, fixed: list = None, old: bool = False) -> list:
    """labkit's per-update seconds (after warm-up); appends (fixed cost, time outside updates) to ``fixed``."""
    with (_old_teardown() if old else contextlib.nullcontext()):
        t0 = time.perf_counter()
        res = lk.run(cfg)
        wall = time.perf_counter() - t0
    steps = [r["step_time_s"] for r in res.records]
    if fixed is not None:
        outside = wall - sum(steps)
        fixed.append((outside + steps[0] - statistics.median(steps), outside))
    return steps[cfg.warmup:]


@contextlib.contextmanager
def _old_teardown():
    """lk.run as before issue 34: collect at every teardown, remember no probe or corpus hash."""
    release = train._Run.release

    def collect_always(self):
        release(self)
        gc.collect()

    measure._activation_bytes.cache_clear()
    data._checked.clear()
    train._Run.release = collect_always
    try:
        yield
    finally:
        train._Run.release = release


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_config_args(ap)
    ap.add_argument("--repeats", type=int, default=5, help="alternating pairs of runs")
    ap.add_argument("--old-teardown", action="store_true", help="also time lk.run as before issue 34, interleaved")
    ap.set_defaults(model="small", steps=12, warmup=2)
    ns = ap.parse_args(argv)
    cfg = config_from_args(ns)
    if cfg.world_size != 1:
        sys.exit("overhead.py compares single-process loops: use --world-size 1")
    print(f"# {cfg.model} {cfg.precision} micro_batch={cfg.micro_batch} accum={cfg.accum} "
          f"steps={cfg.steps} (warm-up {cfg.warmup}) on {capabilities(cfg.device).name}, torch {torch.__version__}, "
          f"{cores()} cores")
    lab, bare, fixed, fixed_old, loads = [], [], [], [], []
    labkit_loop(cfg.replace(steps=cfg.warmup + 1))  # warm caches (corpus, peak FLOP/s) outside the timing
    arms = [("labkit", lambda: labkit_loop(cfg, fixed), lab), ("bare", lambda: bare_loop(cfg), bare)]
    if ns.old_teardown:
        arms.append(("old", lambda: labkit_loop(cfg, fixed_old, old=True), None))
    for i in range(ns.repeats):
        meter = LoadMeter()
        for name, fn, acc in (arms if i % 2 == 0 else arms[::-1]):  # alternate who goes first
            t = statistics.median(fn())
            if acc is not None:
                acc.append(t)
            extra = f", fixed cost {fixed[-1][0]:.3f} s" if name == "labkit" else ""
            extra = f", fixed cost {fixed_old[-1][0]:.3f} s (old teardown)" if name == "old" else extra
            print(f"repeat {i + 1} {name:<6} median step {t * 1000:.2f} ms{extra}", flush=True)
        loads.append(meter.read().get("other_cores"))
        print(f"repeat {i + 1} machine load: {_load(loads[-1])}", flush=True)
    lab_s, bare_s = statistics.median(lab), statistics.median(bare)
    print(f"labkit_step_s={lab_s:.6f}")
    print(f"bare_step_s={bare_s:.6f}")
    # The ratio is taken within each repeat (its two runs a few seconds apart) and the median of those is
    # reported: this machine's speed drifts by 20 % and more between repeats, which a ratio of the two
    # overall medians would carry into the answer. Their spread says how far to trust it.
    ratios = sorted(a / b for a, b in zip(lab, bare))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    load = _load(statistics.median([x for x in loads if x is not None]) if any(x is not None for x in loads) else None)
    # key=value lines carry only the number (benchmarks/reference_suite.py parses them); words go above
    print(f"machine load: {load} (median over the repeats)")
    if fixed_old:
        print("fixed_cost_s_old: lk.run with the teardown and probes before issue 34, same repeats, interleaved")
    print(f"outside_updates_s={statistics.median(f[1] for f in fixed):.4f}")
    if fixed_old:
        print(f"fixed_cost_s_old={statistics.median(f[0] for f in fixed_old):.4f}")
    print(f"fixed_cost_s={statistics.median(f[0] for f in fixed):.4f}")
    print(f"overhead ratio per repeat (labkit/bare, paired): {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"overhead_ratio_q1={q[0]:.4f}")
    print(f"overhead_ratio_q3={q[2]:.4f}")
    print(f"overhead_ratio={statistics.median(ratios):.4f}")


def _load(other_cores) -> str:
    return "unknown" if other_cores is None else f"{other_cores:.2f} other cores busy of {cores()}"


if __name__ == "__main__":
    main()
