"""labkit's instrumented loop against a bare hand-written loop doing the same work.

Same model, config, data and sample order. Both are timed the same way: wall clock per optimizer
update, ending with a device synchronisation, warm-up updates left out. The two alternate
(labkit, bare, labkit, bare, ...) so drifts in machine load hit both, and the ratio of medians is
reported. labkit's side includes everything it does on every update: DDP (a process group of one
at world size 1), the counting comm hook, per-update records, loss/grad-norm bookkeeping.

    python benchmarks/overhead.py --model small --steps 12 --repeats 5
    -> last line: overhead_ratio=<labkit/bare>
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.__main__ import _add_config_args, config_from_args  # noqa: E402
from labkit.engine.data import make_loader  # noqa: E402
from labkit.engine.device import capabilities, synchronize  # noqa: E402
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


def labkit_loop(cfg: lk.Config) -> list:
    res = lk.run(cfg)
    return [r["step_time_s"] for r in res.records[cfg.warmup:]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_config_args(ap)
    ap.add_argument("--repeats", type=int, default=5, help="alternating pairs of runs")
    ap.set_defaults(model="small", steps=12, warmup=2)
    ns = ap.parse_args(argv)
    cfg = config_from_args(ns)
    if cfg.world_size != 1:
        sys.exit("overhead.py compares single-process loops: use --world-size 1")
    print(f"# {cfg.model} {cfg.precision} micro_batch={cfg.micro_batch} accum={cfg.accum} "
          f"steps={cfg.steps} (warm-up {cfg.warmup}) on {capabilities(cfg.device).name}, torch {torch.__version__}")
    lab, bare = [], []
    labkit_loop(cfg.replace(steps=cfg.warmup + 1))  # warm caches (corpus, peak FLOP/s) outside the timing
    for i in range(ns.repeats):
        order = (("labkit", labkit_loop, lab), ("bare", bare_loop, bare))
        for name, fn, acc in (order if i % 2 == 0 else order[::-1]):  # alternate who goes first
            t = statistics.median(fn(cfg))
            acc.append(t)
            print(f"repeat {i + 1} {name:<6} median step {t * 1000:.2f} ms", flush=True)
    lab_s, bare_s = statistics.median(lab), statistics.median(bare)
    print(f"labkit_step_s={lab_s:.6f} bare_step_s={bare_s:.6f}")
    print(f"overhead_ratio={lab_s / bare_s:.4f}")


if __name__ == "__main__":
    main()
