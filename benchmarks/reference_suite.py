"""Reference measurements for the chapters: one prepared run of every point they compare against.

On the GPU machine (one process, points in priority order, results written as each finishes):

    PYTHONPATH=. python3 benchmarks/reference_suite.py --out data/reference/h200.json \\
        --md data/reference/h200.md --deadline-s 540

CPU dry run with tiny sizes (never written into data/reference/):

    PYTHONPATH=. python3 benchmarks/reference_suite.py --tiny --out out/reference-dryrun.json

Design (the GPU time is short and cannot be repeated at will):

* A driver (this process, no torch import) hands points one by one to a worker process (this
  script with ``--worker``) that keeps torch and CUDA warm between points. Every point has a soft cap
  (the run is asked to stop at its next micro-step; the updates done so far are kept as a partial
  result) and a hard cap: if the worker does not answer in time -- a long ``torch.compile``, a hung
  loader, a broken CUDA context -- its whole process group is killed, the point is recorded as a
  timeout and a fresh worker takes the next point.
* A global deadline (``--deadline-s``) bounds the whole suite, with time held back for the GPU
  tests at the end; points that no longer fit are listed in ``provenance.not_run``, never faked.
* The JSON (``labkit.tools.reference`` schema 1) is rewritten atomically after every point, so an outer
  ``timeout`` loses at most the point in progress.
* Non-run points (timing, overhead, tests) keep their configuration under ``summary.config``, so
  ``labkit.tools.reference.match`` (which compares top-level summary keys) never returns them as runs.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import re
import select
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = ROOT / "data" / "reference"
SUITE_VERSION = 1
MIN_START_S = 10.0  # a point is not started with less than this (or its own cap) left


# ---- the plan ------------------------------------------------------------------------------------

@dataclass
class Point:
    id: str                      # stable: the chapters look points up by it ("precision/bf16")
    section: str
    label: str
    kind: str = "run"            # run | timing | memory_budget | overhead | pytest | sleep | tf32 | attention |
    #                              optimizer | profile | step2 | allocator (chapters 07-08) | parallel (10)
    config: dict = field(default_factory=dict)
    cap_s: float = 45.0          # soft cap; the hard cap adds the profile's grace
    args: dict = field(default_factory=dict)
    derive: str = ""             # "best": config chosen by the driver from earlier results
    min_start_s: float = 0.0     # not started with less time left than this (0: MIN_START_S or cap)


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    B: int                 # micro-batch of the main comparisons
    B_small: int           # the small micro-batch of the grid
    B_big: int             # the larger eager candidate for the best configuration
    steps: int
    warmup: int
    data_cost_ms: float    # per sample: B * cost is the loader's work per micro-batch
    matmul_n: int          # timing point: square matmul size
    compile_cap_s: float
    grace_s: float         # hard cap = soft cap + grace
    deadline_s: float
    tests_reserve_s: float
    device: str = "auto"


# GPU sizes. A bf16 base step at B=32, T=1024 is about 20 TFLOP: tens of milliseconds on an H200, so
# setup (model build, FLOP count, activation probe, process group) dominates each point. fp32 without
# TF32 runs near 67 TFLOP/s peak: a few hundred ms per micro-step. data_cost_ms=4 is a realistic
# decode+augment cost; at B=32 that is ~130 ms of CPU work per micro-batch against a much shorter GPU
# step, so workers=0 starves the GPU and the knee sits between 2 and 8 workers.
GPU = Profile("gpu", model="base", B=32, B_small=8, B_big=64, steps=10, warmup=2, data_cost_ms=4.0,
              matmul_n=8192, compile_cap_s=150.0, grace_s=20.0, deadline_s=540.0, tests_reserve_s=75.0)
# CPU dry run: the same points, tiny sizes; exercises every code path, measures nothing of interest.
TINY = Profile("tiny", model="tiny", B=8, B_small=2, B_big=16, steps=3, warmup=1, data_cost_ms=1.0,
               matmul_n=256, compile_cap_s=20.0, grace_s=10.0, deadline_s=300.0, tests_reserve_s=45.0)
PROFILES = {"gpu": GPU, "tiny": TINY}

BEST_CANDIDATES = ("precision/bf16", "accumulation/K4", "best/bf16-Bbig")


def plan(P: Profile) -> list:
    """Every point, in the order it runs: cheapest answers to the most chapters first, the slow
    ``torch.compile`` points and the capstone grid later, chapters 07-08's points after the grid (the caps add up
    to far more than the deadline: the newest points are the ones a slow machine loses), the GPU tests last
    (time is held for them)."""
    common = dict(model=P.model, micro_batch=P.B, steps=P.steps, warmup=P.warmup, device=P.device)
    bf16 = dict(common, precision="bf16")
    pts = []
    add = pts.append
    # 1. precision (TF32 off for fp32: the engine sets fp32_precision="ieee")
    for prec, label in (("fp32", "fp32, TF32 off"), ("tf32", "TF32 matmuls"), ("fp16", "fp16 + GradScaler"),
                        ("bf16", "bf16 autocast")):
        add(Point(f"precision/{prec}", "precision", label, config=dict(common, precision=prec)))
    # 2. checkpointing (the 'none' baseline is precision/bf16)
    add(Point("checkpointing/full", "checkpointing", "full, every block", config=dict(bf16, checkpointing="full")))
    add(Point("checkpointing/selective", "checkpointing", "selective (matmuls saved)",
              config=dict(bf16, checkpointing="selective")))
    add(Point("checkpointing/full-every2", "checkpointing", "full, every 2nd block",
              config=dict(bf16, checkpointing="full", checkpoint_every=2)))
    # 3. accumulation at a fixed micro-batch (K=1 is precision/bf16); AllReduce per update at world 1
    add(Point("accumulation/K4", "accumulation", "K=4, no_sync", config=dict(bf16, accum=4, steps=max(3, P.steps - 2))))
    add(Point("accumulation/K16", "accumulation", "K=16, no_sync",
              config=dict(bf16, accum=16, steps=max(2, P.steps // 2), warmup=1), cap_s=60.0))
    add(Point("ddp/every_micro-K4", "ddp", "K=4, AllReduce every micro-batch",
              config=dict(bf16, accum=4, ddp_sync="every_micro", steps=max(3, P.steps - 2))))
    add(Point("ddp/every_micro-K16", "ddp", "K=16, AllReduce every micro-batch",
              config=dict(bf16, accum=16, ddp_sync="every_micro", steps=max(2, P.steps // 2), warmup=1), cap_s=60.0))
    # 4. loader workers with a real per-sample CPU cost; pinned memory on/off at 4 workers
    loader = dict(bf16, data_cost_ms=P.data_cost_ms, steps=P.steps + 4, warmup=P.warmup + 1)
    for w in (0, 2, 4, 8):
        add(Point(f"loader/w{w}", "loader", f"{w} workers", config=dict(loader, workers=w)))
    add(Point("loader/w4-pin", "loader", "4 workers, pin_memory", config=dict(loader, workers=4, pin_memory=True)))
    # 5. timing with and without synchronisation (chapter 00's warning)
    add(Point("timing/sync", "timing", "perf_counter without / with synchronize, CUDA events", kind="timing",
              config=dict(model=P.model, micro_batch=max(1, P.B // 2), device=P.device),
              args=dict(n=P.matmul_n, reps=50 if P.name == "gpu" else 10, steps=5), cap_s=40.0))
    # 6. a 16 GB card (T4/V100-sized): OOM without checkpointing, fits with it, memory back to baseline
    add(Point("memory_budget", "memory_budget", "16 GiB budget, fp16", kind="memory_budget",
              config=dict(model=P.model, precision="fp16", steps=2, warmup=1, device=P.device),
              args=dict(budget_gb=16.0), cap_s=90.0))
    # 7. best combined configuration: eager candidates, then torch.compile
    # One compile run serves both "bf16 + compile" and, usually, "best + compile": it uses the larger
    # micro-batch (the likely best eager configuration) and best/bf16-Bbig is its eager twin. A compile
    # costs a minute or more, so best/compile runs after the grid and only if the best eager candidate differs.
    bf16_big = dict(bf16, micro_batch=P.B_big)
    add(Point("best/bf16-Bbig", "best", f"bf16, micro-batch {P.B_big}", config=bf16_big))
    add(Point("precision/bf16-compile", "precision", f"bf16 + torch.compile, micro-batch {P.B_big}",
              config=dict(bf16_big, compile=True, steps=P.steps + 2, warmup=P.warmup + 1),  # first updates compile
              cap_s=P.compile_cap_s, min_start_s=0.6 * P.compile_cap_s))
    # 8. instrumentation overhead: labkit's loop against a bare loop (benchmarks/overhead.py)
    add(Point("overhead/bf16", "overhead", "labkit / bare loop step time", kind="overhead",
              config=dict(model=P.model, precision="bf16", micro_batch=P.B, steps=P.steps, warmup=P.warmup,
                          device=P.device),
              args=dict(repeats=2 if P.name == "gpu" else 1), cap_s=90.0))
    # 9. capstone grid: micro-batch x K x checkpointing x precision (Pareto: memory against speed)
    for prec in ("bf16", "fp32"):
        for B in (P.B_small, P.B):
            for K in (1, 4):
                for ck in ("none", "full"):
                    add(Point(f"grid/{prec}-B{B}-K{K}-{ck}", "grid", f"{prec} B={B} K={K} {ck}",
                              config=dict(common, precision=prec, micro_batch=B, accum=K, checkpointing=ck,
                                          steps=max(2, P.steps // 2), warmup=1),
                              cap_s=40.0 if prec == "fp32" and B == P.B else 30.0))
    # 10. the best eager configuration compiled, unless it is the one precision/bf16-compile already ran
    add(Point("best/compile", "best", "best eager configuration + torch.compile", derive="best",
              cap_s=P.compile_cap_s, min_start_s=0.6 * P.compile_cap_s))
    # 11. chapters 07-08 (kernels, memory) after every point of the older chapters and the capstone: the soft
    # caps add up to far more than the deadline, so on a slow machine these are what is lost first, never the
    # capstone's grid or best/compile. First the short points of their own kinds (each a few seconds on a GPU),
    gpu = P.name == "gpu"
    add(Point("kernels/tf32", "kernels", "matmul in fp32 (TF32 off), TF32 and bf16: TFLOP/s, error against fp64",
              kind="tf32", config=dict(device=P.device), args=dict(n=P.matmul_n, reps=20 if gpu else 3), cap_s=30.0))
    add(Point("kernels/attention", "kernels", "SDPA backends against sequence length: time and memory",
              kind="attention", config=dict(device=P.device),
              args=dict(seq_lens=[1024, 2048, 4096, 8192] if gpu else [64, 128], batch=8 if gpu else 1,
                        n_head=12 if gpu else 2, head_dim=64 if gpu else 16, repeats=5 if gpu else 2), cap_s=60.0))
    add(Point("kernels/optimizer", "kernels", "AdamW step: for-loop, foreach, fused", kind="optimizer",
              config=dict(model=P.model, device=P.device), args=dict(repeats=10 if gpu else 3), cap_s=40.0))
    add(Point("kernels/profile", "kernels", "profiler table of one bf16 step", kind="profile",
              config=dict(bf16, micro_batch=P.B_small), cap_s=45.0))
    add(Point("memory/step2", "memory", "fp32: weights, gradients, AdamW state and activations over two updates",
              kind="step2", config=dict(model=P.model, micro_batch=P.B_small, precision="fp32", device=P.device),
              cap_s=45.0))
    add(Point("memory/allocator", "memory", "fragmentation with fixed and with expandable segments",
              kind="allocator", config=dict(device=P.device), cap_s=60.0))
    # then MFU at small micro-batches (B and B_big are precision/bf16 and best/bf16-Bbig), and
    # activation memory against sequence length: fused and math attention, and math with attention recompute
    for B in (1, 4):
        add(Point(f"kernels/mfu-B{B}", "kernels", f"bf16, micro-batch {B}", config=dict(bf16, micro_batch=B),
                  cap_s=30.0))
    seq = dict(bf16, micro_batch=P.B_small, steps=max(3, P.steps // 2), warmup=1)
    long_T = 2048 if gpu else 256
    for T, att, ck in ((long_T // 4, "auto", "none"), (long_T, "auto", "none"), (long_T, "math", "none"),
                       (long_T, "math", "attention")):
        pid = f"seqlen/T{T}" + ("-math" if att == "math" else "") + ("-recompute" if ck == "attention" else "")
        words = f"bf16, T={T}, {'math' if att == 'math' else 'fused'} attention" + (
            ", attention recompute" if ck == "attention" else "")
        add(Point(pid, "seqlen", words, config=dict(seq, seq_len=T, attention=att, checkpointing=ck), cap_s=40.0))
    # 12. chapter 10 (when the model does not fit): FSDP2, tensor and pipeline parallelism on 2 processes --
    # NCCL where the machine has 2 GPUs, else gloo on its CPU (the summary's "kind" says which)
    for what, words in (("fsdp", "FSDP2: bytes per rank, AllGathers with and without reshard, accumulation"),
                        ("tp", "tensor parallel: AllReduce calls and bytes per block, equivalence"),
                        ("pipeline", "GPipe and 1F1B: the bubble from timestamps, saved activations")):
        add(Point(f"parallel/{what}", "parallel", words, kind="parallel",
                  config=dict(model="small" if gpu else "tiny"), args=dict(what=what), cap_s=60.0))
    # 13. chapter 11 (a long run): the exact resume and its ablation on fresh processes, DCP on 2 FSDP2 ranks
    # (sync and async save, resharding), a SIGKILLed rank restarted from its checkpoint
    for what, words in (("exact", "resume in a new process, bit for bit; one checkpoint item left out at a time"),
                        ("dcp", "torch.distributed.checkpoint: save, load, reshard 2 -> 1 -> 2, async_save's share"),
                        ("failure", "a rank killed by SIGKILL, the job restarted from its last checkpoint")):
        add(Point(f"longrun/{what}", "longrun", words, kind="longrun",
                  config=dict(model="small" if gpu else "tiny"), args=dict(what=what), cap_s=90.0))
    # 14. the GPU tests
    add(Point("tests/gpu", "tests", "pytest -m gpu", kind="pytest", cap_s=P.tests_reserve_s + 30.0))
    return pts


def select_points(points: list, only: str = "", skip: str = "") -> list:
    """``--only`` / ``--skip``: comma-separated ids or prefixes. "grid" or "grid/" is a section, an exact
    id is that point alone ("precision/bf16" is not "precision/bf16-compile"), anything else a prefix
    ("grid/bf16" = the bf16 half of the grid)."""
    ids = {p.id for p in points}

    def hit(pid, pats):
        for s in pats:
            if s in ids:
                if pid == s:
                    return True
            elif "/" not in s.rstrip("/"):
                if pid.startswith(s.rstrip("/") + "/") or pid == s.rstrip("/"):
                    return True
            elif pid.startswith(s):
                return True
        return False

    only_l = [s.strip() for s in only.split(",") if s.strip()]
    skip_l = [s.strip() for s in skip.split(",") if s.strip()]
    return [p for p in points if (not only_l or hit(p.id, only_l)) and not hit(p.id, skip_l)]


# ---- small helpers shared by driver and worker ----------------------------------------------------

_FLAGS = {"model": "--model", "n_layer": "--n-layer", "d_model": "--d-model", "n_head": "--n-head",
          "micro_batch": "--micro-batch", "seq_len": "--seq-len", "accum": "--accum", "precision": "--precision",
          "loss_scaling": "--loss-scaling", "checkpointing": "--checkpointing",
          "checkpoint_every": "--checkpoint-every", "optimizer": "--optimizer", "grad_clip": "--grad-clip",
          "attention": "--attention", "workers": "--workers", "prefetch_factor": "--prefetch-factor",
          "data_cost_ms": "--data-cost-ms", "world_size": "--world-size", "ddp_sync": "--ddp-sync",
          "bucket_cap_mb": "--bucket-cap-mb", "comm_hook": "--comm-hook", "steps": "--steps",
          "warmup": "--warmup", "lr": "--lr", "seed": "--seed", "device": "--device",
          "memory_budget_gb": "--memory-budget-gb"}


def cli_args(config: dict) -> list:
    """The ``python -m labkit run`` flags that reproduce ``config``."""
    out = []
    for k, v in config.items():
        if k == "compile":
            out += ["--compile"] if v else []
        elif k == "pin_memory":
            out += ["--pin-memory" if v else "--no-pin-memory"]
        elif v is not None and k in _FLAGS:
            out += [_FLAGS[k], str(v)]
    return out


def run_command(config: dict) -> str:
    return "PYTHONPATH=. python3 -m labkit run " + " ".join(cli_args(config)) + " --json"


def sanitize(x):
    """JSON without NaN/Infinity (not valid JSON for browsers and most readers): such values become
    null; the records' ``skipped``/``nonfinite`` flags say why a grad norm is missing."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): sanitize(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [sanitize(v) for v in x]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(sanitize(data), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)  # atomic: a reader (or a kill) never sees half a file


# ---- the worker: runs points, keeps torch/CUDA warm ------------------------------------------------

_KEEP = ("update", "loss", "grad_norm", "grad_scale", "skipped", "step_time_s", "data_wait_s", "compute_s",
         "optimizer_s", "tokens_per_s", "peak_mem_bytes", "allreduce_calls", "mfu", "hfu", "elapsed_s")


class _Deadline:
    """Duck-types the ``stop`` event lk.run polls at every micro-step."""

    def __init__(self, seconds: float):
        self.t = time.monotonic() + seconds

    def is_set(self) -> bool:
        return time.monotonic() > self.t


def _partial(records: list, warmup: int) -> dict:
    """Numbers from the updates a capped run finished (marked partial: fewer updates than planned)."""
    timed = records[warmup:] or records
    med = lambda k: statistics.median([r[k] for r in timed if r.get(k) is not None]) if timed else None  # noqa: E731
    peaks = [r["peak_mem_bytes"] for r in records if r.get("peak_mem_bytes") is not None]
    return {"partial": True, "updates_done": len(records), "timed_updates": len(timed),
            "step_time_s": med("step_time_s"), "tokens_per_s": med("tokens_per_s"), "mfu": med("mfu"),
            "hfu": med("hfu"), "peak_mem_bytes": max(peaks) if peaks else None}


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:2000]


def _one_run(lk, config: dict, soft_s: float) -> dict:
    """Run one configuration; the point's status, summary, error and compact records."""
    records = []
    t0 = time.monotonic()
    out = {"status": "error", "error": None, "summary": None, "records": records}
    try:
        cfg = lk.Config(**config)
        res = lk.run(cfg, on_step=lambda r: records.append({k: r.get(k) for k in _KEEP}), stop=_Deadline(soft_s))
    except lk.OutOfMemory as e:
        out.update(status="oom", error=str(e), wall_s=time.monotonic() - t0)
        return out
    except Exception as e:  # noqa: BLE001 -- one failing point must not end the suite
        out.update(error=_err(e), traceback=traceback.format_exc()[-4000:], wall_s=time.monotonic() - t0)
        return out
    out["wall_s"] = time.monotonic() - t0
    s = res.summary
    if s.get("status") == "completed":
        out.update(status="ok", summary=s)
    else:  # stopped by the soft cap: keep what was measured, say it is partial
        out.update(status="timeout", error=f"soft cap of {soft_s:.0f} s reached after {len(records)} update(s)",
                   summary={**s, **_partial(records, config.get("warmup", 1))})
    return out


def _kind_run(lk, msg):
    return [_one_run(lk, msg["config"], msg["soft_s"])]


def _device(torch, requested: str):
    from labkit.engine.device import capabilities

    return torch.device("cuda", 0) if capabilities(requested).kind == "cuda" else torch.device(
        capabilities(requested).kind)


def _kind_timing(lk, msg):
    """Time the same GPU work three ways. Without a synchronize, perf_counter stops when the work is
    *queued*; with it (or with CUDA events) it measures the work. On a CPU the three agree."""
    import torch

    from labkit.engine.device import synchronize, table_peak
    from labkit.engine.model import GPT
    from labkit.engine.precision import autocast

    args, cfg = msg["args"], lk.Config(**msg["config"])
    dev = _device(torch, cfg.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    n, reps = args["n"], args["reps"]

    def three_ways(work, count):
        work()  # warm up kernels and allocator
        synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(count):
            work()
        queued = time.perf_counter() - t0
        synchronize(dev)
        finished = time.perf_counter() - t0  # the same loop once the device has really finished
        synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(count):
            work()
        synchronize(dev)
        synced = time.perf_counter() - t0
        events = None
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(count):
                work()
            e1.record()
            e1.synchronize()
            events = e0.elapsed_time(e1) / 1000
        return {"count": count, "no_sync_s": queued, "no_sync_then_sync_s": finished, "sync_s": synced,
                "cuda_events_s": events, "no_sync_over_sync": queued / synced if synced else None}

    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    mm = three_ways(lambda: a @ b, reps)
    flops = 2 * n**3 * reps
    mm.update(n=n, dtype=str(dtype).replace("torch.", ""), flops=flops,
              no_sync_tflops=flops / mm["no_sync_s"] / 1e12 if mm["no_sync_s"] else None,
              sync_tflops=flops / mm["sync_s"] / 1e12,
              cuda_events_tflops=flops / mm["cuda_events_s"] / 1e12 if mm["cuda_events_s"] else None)
    del a, b

    spec = cfg.spec
    torch.manual_seed(0)
    model = GPT(spec).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (cfg.micro_batch, spec.seq_len), device=dev)
    prec = "bf16" if cuda else "fp32"

    def step():
        with autocast(dev.type, prec):
            loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # no loss.item(): that would synchronize by itself

    st = three_ways(step, args["steps"])
    st.update(model=cfg.model, micro_batch=cfg.micro_batch, seq_len=spec.seq_len, precision=prec)
    del model, opt, x
    if cuda:
        torch.cuda.empty_cache()
    peak, source = table_peak(torch.cuda.get_device_name(0), "bf16") if cuda else (None, None)
    summary = {"matmul": mm, "train_step": st, "peak_flops_bf16": peak, "peak_flops_source": source,
               "device": dev.type, "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
               "torch_version": torch.__version__, "config": msg["config"]}
    return [{"status": "ok", "summary": summary}]


def _kind_memory_budget(lk, msg):
    """A card of ``budget_gb`` GiB: find a micro-batch that runs out of memory without checkpointing,
    catch the OOM in this process, check memory is back to baseline, then run it with full
    checkpointing. The micro-batch comes from the engine's own activation probe, then is verified."""
    import torch

    from labkit.engine.measure import activation_bytes
    from labkit.engine.model import GPT

    base, budget = dict(msg["config"]), msg["args"]["budget_gb"]
    t_end = time.monotonic() + msg["soft_s"]
    try:
        cfg1 = lk.Config(**dict(base, micro_batch=1, memory_budget_gb=budget))
    except lk.ConfigError as e:
        return [{"id": "memory_budget/none", "status": "error", "error": _err(e)}]
    dev = torch.device("cuda", 0)
    with torch.device("meta"):
        n = sum(p.numel() for p in GPT(cfg1.spec).parameters())
    acts_none, copies = activation_bytes(cfg1, dev, batch=1)
    acts_full, _ = activation_bytes(cfg1.replace(checkpointing="full"), dev, batch=1)
    torch.cuda.empty_cache()
    static = n * 16 + copies  # fp32 weights, grads, two AdamW moments; plus autocast's weight copies
    limit = budget * 2**30
    # aim 1.25x over the budget without checkpointing (the probe ignores backward's temporaries)
    B = max(8, int(math.ceil((1.25 * limit - static) / acts_none / 8)) * 8)
    plan_info = {"budget_gb": budget, "probe_activation_bytes_per_sample": acts_none,
                 "probe_activation_bytes_per_sample_full": acts_full, "static_bytes_estimate": static}
    out = []
    for _ in range(3):  # the probe is an estimate: go up if it still fits
        left = t_end - time.monotonic()
        if left < 5:
            break
        before = torch.cuda.memory_allocated(dev)
        cfg = dict(base, micro_batch=B, memory_budget_gb=budget)
        r = _one_run(lk, cfg, left)
        after = torch.cuda.memory_allocated(dev)
        mem = {"mem_before_bytes": before, "mem_after_bytes": after,
               "back_to_baseline": after <= before + 2**20, **plan_info}
        if r["status"] == "oom":
            r.update(id="memory_budget/none", label=f"no checkpointing, micro-batch {B}: out of memory",
                     summary={"config": cfg, **mem}, config=cfg)
            out.append(r)
            break
        r.update(id=f"memory_budget/none-fits-B{B}", label=f"no checkpointing, micro-batch {B}: fits", config=cfg)
        if isinstance(r.get("summary"), dict):
            r["summary"].update(mem)
        out.append(r)
        if r["status"] != "ok":
            return out
        B = int(math.ceil(B * 1.5 / 8)) * 8
    else:
        return out
    if not out or out[-1]["status"] != "oom":
        return out
    left = t_end - time.monotonic()
    cfg = dict(base, micro_batch=B, memory_budget_gb=budget, checkpointing="full")
    r = _one_run(lk, cfg, max(5.0, left))
    r.update(id="memory_budget/full", label=f"full checkpointing, micro-batch {B}", config=cfg)
    if isinstance(r.get("summary"), dict):
        r["summary"].update(plan_info)
    out.append(r)
    return out


def _about(msg) -> dict:
    """What every non-run point's summary carries: the device, torch, and its configuration (kept under
    summary.config so that labkit.tools.reference.match never takes it for a training run)."""
    import torch

    cuda = torch.cuda.is_available()
    return {"device": "cuda" if cuda else "cpu", "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
            "torch_version": torch.__version__, "config": msg["config"]}


def _kind_tf32(lk, msg):
    """Chapter 07: an n×n matmul in fp32 with TF32 off, in TF32 and in bf16; TFLOP/s and error against fp64."""
    from labkit.chapters import ch07_kernels as kernels

    r = kernels.tf32_matmul(msg["args"]["n"], msg["args"]["reps"])  # raises off CUDA: an error point, never faked
    return [{"status": "ok", "summary": {**r, **_about(msg)}}]


def _kind_attention(lk, msg):
    """Chapter 07: forward + backward of causal attention with every SDPA backend, against sequence length."""
    from labkit.chapters import ch07_kernels as kernels

    rows = kernels.attention_sweep(**msg["args"])
    fused = next((b for b in ("flash", "efficient", "cudnn") if any(r["backend"] == b and "error" not in r
                                                                    for r in rows)), None)
    cmp = kernels.attention_verdict(rows, "math", fused) if fused else None
    return [{"status": "ok", "summary": {"rows": rows, "verdict": cmp.to_dict() if cmp else None, **_about(msg)}}]


def _kind_optimizer(lk, msg):
    """Chapter 07: seconds per AdamW step, for-loop / foreach / fused, interleaved, over the model's weights."""
    from labkit.chapters import ch07_kernels as kernels

    out = kernels.optimizer_steps(lk.Config(**msg["config"]), repeats=msg["args"]["repeats"])
    med = {k: statistics.median(v) for k, v in out["times"].items()}
    return [{"status": "ok", "summary": {"median_s": med, "samples_s": out["times"], "default": out["default"],
                                         "n_params": out["n_params"], **_about(msg)}}]


def _kind_profile(lk, msg):
    """Chapter 07: one profiled step: top operations by self time, shares by kind, the phases."""
    from labkit.chapters import ch07_kernels as kernels

    t = kernels.profile_step(lk.Config(**msg["config"]))
    kinds = t.kinds()  # on a GPU this includes "idle": the gaps between kernels in the step's wall time
    return [{"status": "ok", "summary": {"top": t.top(12), "top_op": t.top_op(), "phases_s": t.phases,
                                         "wall_s": t.wall_s,
                                         "optimizer_share": t.phase_share("optimizer"),
                                         "shares": {k: t.share(k) for k in kinds},
                                         "calls": {k: t.calls(k) for k in kinds}, "time_source": t.time_source,
                                         **_about(msg)}}]


def _kind_step2(lk, msg):
    """Chapter 08: bytes by role after each phase of the first two updates, and each update's peak."""
    from labkit.chapters import ch08_memory as memlab

    r = memlab.first_updates(lk.Config(**msg["config"]))
    return [{"status": "ok", "summary": {**r, **_about(msg)}}]


def _kind_allocator(lk, msg):
    """Chapter 08: the fragmentation pattern with fixed and with expandable segments (one process each)."""
    from labkit.chapters import ch08_memory as memlab

    out = []
    for flag, name in ((False, "fixed"), (True, "expandable")):
        t0 = time.monotonic()
        try:
            d = memlab.fragmentation_demo(flag, timeout_s=max(10.0, msg["soft_s"] / 2))
            r = {"status": "ok", "summary": {**d, **_about(msg)}}
        except Exception as e:  # noqa: BLE001 -- one failing half must not hide the other
            r = {"status": "error", "error": _err(e)}
        r.update(id=f"memory/allocator-{name}", label=f"fragmentation, {name} segments", wall_s=time.monotonic() - t0)
        out.append(r)
    return out


def _kind_parallel(lk, msg):
    """Chapter 10: one of its demos on 2 processes, as the chapter runs it (counts, bytes, bubble, memory)."""
    from labkit.chapters import ch10_parallel as par

    model, what = msg["config"]["model"], msg["args"]["what"]
    timeout = max(20.0, msg["soft_s"])
    if what == "fsdp":
        r = par.fsdp_lab(model=model, world_sizes=(1, 2), micro_batch=4, steps=2, timeout_s=timeout)
    elif what == "tp":
        r = par.tp_demo(model=model, world_size=2, micro_batch=4, timeout_s=timeout)
    else:
        r = par.pipeline_demo(model=model, stages=2, micro_batches=(1, 2, 4, 8), schedule="both", micro_batch=4,
                              timeout_s=timeout)
    if not r.get("ok"):
        return [{"status": "error", "error": str(r.get("error"))}]
    return [{"status": "ok", "summary": {**r, **_about(msg)}}]


def _kind_longrun(lk, msg):
    """Chapter 11: one of its demos, as the chapter runs it (equality bit for bit, divergence, seconds)."""
    import dataclasses

    from labkit.chapters import ch11_longrun as lr

    model, what = msg["config"]["model"], msg["args"]["what"]
    timeout = max(30.0, msg["soft_s"])
    if what == "exact":
        r = lr.exact.resume_demo(model, micro_batch=4, updates=8, timeout_s=timeout)
        summary = {k: v for k, v in dataclasses.asdict(r).items()
                   if k not in ("straight", "first_half", "resumed", "straight_params", "resumed_params")}
    elif what == "dcp":
        r = lr.dcp.dcp_demo(model=model, micro_batch=4, world_size=2, sizes=(model,), repeats=3, timeout_s=timeout)
        if not r.get("ok"):
            return [{"status": "error", "error": str(r.get("error"))}]
        summary = r
    else:
        r = lr.restart.failure_demo(model=model, micro_batch=4, updates=12, save_every=4, kill_at=10,
                                    timeout_s=timeout)
        summary = {k: v for k, v in dataclasses.asdict(r).items() if k not in ("attempts", "timeline")}
    return [{"status": "ok", "summary": {**summary, **_about(msg)}}]


def _kind_sleep(lk, msg):
    """Self-test of the hard cap: ignores its soft cap on purpose."""
    time.sleep(msg["args"].get("seconds", 3600))
    return [{"status": "ok", "summary": {"slept_s": msg["args"].get("seconds")}}]


_KINDS = {"run": _kind_run, "timing": _kind_timing, "memory_budget": _kind_memory_budget, "sleep": _kind_sleep,
          "tf32": _kind_tf32, "attention": _kind_attention, "optimizer": _kind_optimizer, "profile": _kind_profile,
          "step2": _kind_step2, "allocator": _kind_allocator, "parallel": _kind_parallel,
          "longrun": _kind_longrun}


def _hello(lk) -> dict:
    import torch

    from labkit.engine.data import corpus_path, corpus_sha
    from labkit.engine.device import capabilities, cores

    caps = capabilities("auto")
    path = corpus_path(None)
    info = {"torch_version": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "device_kind": caps.kind, "gpu": caps.name, "compute_capability": caps.compute_capability,
            "n_gpus": caps.n_devices if caps.kind == "cuda" else 0, "device_memory_bytes": caps.memory_bytes,
            "cpu": _cpu_name(), "cpu_cores": cores(), "platform": platform.platform(),
            "corpus_sha": corpus_sha(path), "corpus_bytes": path.stat().st_size}
    if caps.kind == "cuda":
        info["cudnn"] = torch.backends.cudnn.version()
        try:
            info["cuda_driver_api"] = torch._C._cuda_getDriverVersion()  # e.g. 12040; guarded: private API
        except Exception:  # noqa: BLE001
            pass
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def worker_main(result_fd: int) -> int:
    out = os.fdopen(result_fd, "w", buffering=1)

    def send(obj):
        out.write(json.dumps(sanitize(obj), allow_nan=False) + "\n")
        out.flush()

    sys.path.insert(0, str(ROOT))
    import labkit as lk

    send({"hello": _hello(lk)})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("quit"):
            break
        t0 = time.monotonic()
        try:
            pts = _KINDS[msg["kind"]](lk, msg)
        except Exception as e:  # noqa: BLE001 -- report, keep serving
            pts = [{"status": "error", "error": _err(e), "traceback": traceback.format_exc()[-4000:]}]
        send({"id": msg["id"], "points": pts, "wall_s": time.monotonic() - t0})
    return 0


# ---- the driver ------------------------------------------------------------------------------------

# Errors after which the worker's CUDA context (or its process group) cannot be trusted
_STICKY = re.compile(r"CUDA error|CUBLAS_STATUS|cuDNN error|device-side assert|illegal memory access|NCCL", re.I)


class WorkerGone(Exception):
    pass


class Worker:
    """One worker process in its own session, so a kill takes its DataLoader workers with it."""

    def __init__(self, env):
        rfd, wfd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", "--result-fd", str(wfd)],
            stdin=subprocess.PIPE, stdout=2, pass_fds=(wfd,), start_new_session=True, env=env, cwd=str(ROOT))
        os.close(wfd)  # only the worker may hold the write end, or EOF never comes
        self.rfd, self.buf = rfd, b""

    def send(self, obj):
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerGone(f"worker gone ({e})") from None

    def read(self, timeout: float):
        """The next message, None on timeout; WorkerGone if it died."""
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.rfd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(self.rfd, 1 << 20)
                if not chunk:
                    raise WorkerGone(f"worker exited (code {self.proc.poll()})")
                self.buf += chunk
            elif self.proc.poll() is not None:
                raise WorkerGone(f"worker exited (code {self.proc.returncode})")
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the worker and its loader workers
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._close()

    def quit(self, timeout=15.0):
        try:
            self.send({"quit": True})
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout)
            self._close()
        except (WorkerGone, subprocess.TimeoutExpired, OSError):
            self.kill()

    def _close(self):
        try:
            os.close(self.rfd)
        except OSError:
            pass


def _sh(cmd, timeout=10.0) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT)).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def source_sha() -> str:
    """Identifies the code that ran even where the checkout has no .git (the GPU machine's copy)."""
    h = hashlib.sha256()
    files = sorted(ROOT.glob("labkit/*.py")) + sorted(ROOT.glob("benchmarks/*.py"))
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def slug(name: str) -> str:
    s = re.sub(r"^nvidia\s+", "", name.strip().lower())
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-") or "gpu"


def _run_subprocess(cmd, timeout, env):
    """(returncode or None on timeout, combined output). Kills the whole session on timeout."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=env, cwd=str(ROOT))
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = p.communicate()
        return None, out or ""


class Suite:
    def __init__(self, points, profile: Profile, out: Path, md: Path = None, deadline_s: float = None,
                 argv=None, git_commit: str = "", log=sys.stderr):
        self.points, self.P, self.out, self.md = points, profile, out, md
        self.deadline_s = deadline_s if deadline_s is not None else profile.deadline_s
        self.argv = argv or sys.argv
        self.git_commit_arg = git_commit
        self.log = log
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        self.worker = None
        self.hello = None
        self._static = None  # git / nvidia-smi answers, asked once
        self.results = {}   # id -> point dict, in completion order
        self.not_run = []
        self.t0 = time.monotonic()
        self.started = datetime.datetime.now(datetime.timezone.utc)

    # -- bookkeeping --
    def say(self, msg):
        print(f"[{time.monotonic() - self.t0:6.1f} s] {msg}", file=self.log, flush=True)

    def elapsed(self):
        return time.monotonic() - self.t0

    def provenance(self, finished: bool) -> dict:
        h = self.hello or {}
        if self._static is None:
            git = _sh(["git", "rev-parse", "HEAD"])
            dirty = bool(_sh(["git", "status", "--porcelain", "--", "labkit", "benchmarks"])) if git else None
            commit = git or self.git_commit_arg or os.environ.get("LABKIT_GIT_COMMIT", "")  # .git wins if present
            drv = _sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()
            self._static = dict(commit=commit, dirty=dirty, driver=drv[0] if drv else None, source_sha=source_sha())
        st = self._static
        return {
            "gpu": h.get("gpu") or "unknown",
            "device_kind": h.get("device_kind"),
            "compute_capability": h.get("compute_capability"),
            "n_gpus": h.get("n_gpus"),
            "device_memory_bytes": h.get("device_memory_bytes"),
            "driver": st["driver"],
            "cuda": h.get("cuda"),
            "cuda_driver_api": h.get("cuda_driver_api"),
            "cudnn": h.get("cudnn"),
            "torch_version": h.get("torch_version") or "unknown",
            "python": h.get("python"),
            "cpu": h.get("cpu"),
            "cpu_cores": h.get("cpu_cores"),
            "platform": h.get("platform"),
            "date": self.started.isoformat(timespec="seconds"),
            "command": "PYTHONPATH=. python3 " + " ".join(shlex.quote(a) for a in self.argv),
            "git_commit": st["commit"] or "unknown (no .git here; source_sha identifies the code)",
            "git_dirty": st["dirty"],  # uncommitted changes under labkit/ or benchmarks/ (None: no git)
            "source_sha": st["source_sha"],
            "corpus_sha": h.get("corpus_sha") or "unknown",
            "corpus_bytes": h.get("corpus_bytes"),
            "profile": self.P.name,
            "dry_run": self.P.name != "gpu",
            "suite_version": SUITE_VERSION,
            "deadline_s": self.deadline_s,
            "wall_s": round(self.elapsed(), 1),
            "finished": finished,
            "not_run": self.not_run,
        }

    def document(self, finished: bool) -> dict:
        doc = {"schema": 1, "provenance": self.provenance(finished), "points": list(self.results.values())}
        ok_runs = [p for p in doc["points"] if p["status"] == "ok" and isinstance(p.get("summary"), dict)
                   and p["summary"].get("mfu") is not None]
        if ok_runs:
            best = max(ok_runs, key=lambda p: p["summary"]["mfu"])
            doc["highlights"] = {"best_mfu_point": best["id"]}
        return doc

    def save(self, finished=False):
        doc = self.document(finished)
        if not doc["points"]:
            return doc  # the schema wants a non-empty list: nothing to write yet
        write_json(self.out, doc)
        if self.md:
            try:
                here = str(Path(__file__).resolve().parent)
                if here not in sys.path:
                    sys.path.insert(0, here)
                import reference_table

                self.md.parent.mkdir(parents=True, exist_ok=True)
                self.md.write_text(reference_table.render(doc, source=self.out.name))
            except Exception as e:  # noqa: BLE001 -- the table is derived; never lose the JSON for it
                self.say(f"markdown table failed: {_err(e)}")
        return doc

    # -- worker management --
    def ensure_worker(self, timeout=120.0):
        if self.worker is not None and self.worker.proc.poll() is None:
            return
        self.worker = Worker(self.env)
        try:
            msg = self.worker.read(timeout)
        except WorkerGone:
            msg = None
        if not msg or "hello" not in msg:
            self.worker.kill()
            self.worker = None
            raise WorkerGone("worker did not start")
        if self.hello is None:
            self.hello = msg["hello"]
            self.say(f"worker up: {self.hello.get('gpu')} ({self.hello.get('device_kind')}), "
                     f"torch {self.hello.get('torch_version')}")

    def stop_worker(self, kill=False):
        if self.worker is not None:
            self.worker.kill() if kill else self.worker.quit()
            self.worker = None

    # -- points --
    def derive(self, p: Point):
        if p.derive != "best":
            return p.config
        cands = [self.results[c] for c in BEST_CANDIDATES if c in self.results
                 and self.results[c]["status"] == "ok" and self.results[c]["summary"].get("mfu") is not None]
        if not cands:
            return None
        best = max(cands, key=lambda r: r["summary"]["mfu"])
        cfg = dict(best["config"], compile=True, steps=best["config"]["steps"] + 2,
                   warmup=best["config"].get("warmup", 1) + 1)
        cfg["_from"] = best["id"]
        return cfg

    def record(self, p: Point, r: dict, wall: float, cap: float, config=None):
        pid = r.pop("id", None) or p.id
        config = r.pop("config", None) or config
        point = {"id": pid, "section": p.section, "label": r.pop("label", None) or p.label,
                 "command": r.pop("command", None) or self.command_for(p, config),
                 "status": r.get("status", "error"), "error": r.get("error"), "summary": r.get("summary"),
                 "config": config, "kind": p.kind, "cap_s": round(cap, 1), "wall_s": round(wall, 2),
                 "started_at_s": round(self.elapsed() - wall, 1)}
        for k in ("records", "traceback", "output_tail", "derived_from"):
            if r.get(k):
                point[k] = r[k]
        self.results[pid] = point
        s = point["summary"] or {}
        extra = ""
        if s.get("tokens_per_s"):
            extra = f"  {s['tokens_per_s']:,.0f} tok/s"
            if s.get("mfu") is not None:
                extra += f"  MFU {100 * s['mfu']:.1f}%"
            if s.get("peak_mem_bytes"):
                extra += f"  peak {s['peak_mem_bytes'] / 2**30:.2f} GiB"
        self.say(f"{pid:<28} {point['status']:<7} {wall:6.1f} s{extra}"
                 + (f"  ({point['error'][:160]})" if point["error"] and point["status"] != "ok" else ""))

    def command_for(self, p: Point, config) -> str:
        if p.kind == "run" and config:
            return run_command({k: v for k, v in config.items() if not k.startswith("_")})
        tiny = " --tiny" if self.P.name != "gpu" else ""
        return f"PYTHONPATH=. python3 benchmarks/reference_suite.py{tiny} --only {p.id} --out OUT.json"

    def run_point(self, p: Point, soft: float):
        t0 = time.monotonic()
        if p.kind == "overhead":
            return self.run_overhead(p, soft)
        if p.kind == "pytest":
            return self.run_pytest(p, soft)
        config = self.derive(p)
        if config is None:
            self.record(p, {"status": "error", "error": "no completed candidate to derive it from: "
                            + ", ".join(BEST_CANDIDATES)}, 0.0, soft)
            return
        derived_from = config.pop("_from", None) if p.derive else None
        if derived_from:
            for q in self.results.values():  # the same configuration already measured: do not pay twice
                if q.get("config") == config and q["status"] == "ok":
                    self.say(f"{p.id}: same configuration as {q['id']}, not run again")
                    self.not_run.append({"id": p.id, "reason": f"same configuration as {q['id']}"})
                    return
        hard = soft + self.P.grace_s
        try:
            self.ensure_worker(timeout=max(1.0, hard))
            self.worker.send({"id": p.id, "kind": p.kind, "config": config, "args": p.args, "soft_s": soft})
            msg = self.worker.read(hard - (time.monotonic() - t0))
        except WorkerGone as e:
            self.worker = None
            self.record(p, {"status": "error", "error": str(e)}, time.monotonic() - t0, soft, config)
            return
        if msg is None:
            self.say(f"{p.id}: no answer within the hard cap of {hard:.0f} s: killing the worker")
            self.worker.kill()
            self.worker = None
            self.record(p, {"status": "timeout", "error": f"hard cap of {hard:.0f} s reached (worker killed)"},
                        time.monotonic() - t0, soft, config)
            return
        broken = False
        for r in msg["points"]:
            if derived_from:
                r["derived_from"] = derived_from
            broken = broken or bool(_STICKY.search(r.get("error") or ""))
            wall = r.pop("wall_s", None)
            self.record(p, r, wall if wall is not None else msg.get("wall_s", time.monotonic() - t0), soft, config)
        if broken:  # a CUDA error poisons the context for every later point: start a fresh worker
            self.say("CUDA error: replacing the worker")
            self.stop_worker(kill=True)

    def run_overhead(self, p: Point, soft: float):
        script = ROOT / "benchmarks" / "overhead.py"
        cfg = dict(p.config)
        if not script.exists():
            self.record(p, {"status": "error", "error": "benchmarks/overhead.py not found"}, 0.0, soft, cfg)
            return
        argv = [sys.executable, str(script)] + cli_args(cfg) + ["--repeats", str(p.args.get("repeats", 3))]
        t0 = time.monotonic()
        rc, out = _run_subprocess(argv, soft + self.P.grace_s, self.env)
        wall = time.monotonic() - t0
        cmd = "PYTHONPATH=. python3 benchmarks/overhead.py " + " ".join(argv[2:])
        lines = [ln for ln in out.strip().splitlines() if ln.strip()]
        vals = dict(re.findall(r"^(\w+)=([0-9.eE+-]+)$", "\n".join(lines), re.M))  # key=value lines: number only
        r = {"command": cmd, "output_tail": out[-3000:]}
        if rc is None:
            r.update(status="timeout", error=f"cap of {soft + self.P.grace_s:.0f} s reached")
        elif rc != 0 or not lines or not lines[-1].startswith("overhead_ratio="):
            r.update(status="error", error=f"exit code {rc}; last line: {lines[-1][:300] if lines else '(none)'}")
        else:
            summary = {"overhead_ratio": float(vals["overhead_ratio"]), "config": cfg,
                       "repeats": p.args.get("repeats", 3),
                       "device_name": (self.hello or {}).get("gpu")}
            for k in ("labkit_step_s", "bare_step_s", "overhead_ratio_q1", "overhead_ratio_q3"):
                if k in vals:
                    summary[k] = float(vals[k])
            r.update(status="ok", summary=summary)
        self.record(p, r, wall, soft, cfg)

    def run_pytest(self, p: Point, soft: float):
        # The GPU machine's Python has no psutil, and tests/conftest.py imports it at the top: without it
        # every test would fail to collect. test_gpu.py needs no conftest fixture, so run just that file.
        import importlib.util

        self.stop_worker()  # free the worker's CUDA context and cached memory before the tests
        if importlib.util.find_spec("psutil") is not None:
            argv = ["-m", "pytest", "-m", "gpu", "tests", "--continue-on-collection-errors"]
            note = None
        else:
            argv = ["-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "--noconftest"]
            note = "psutil missing: ran tests/test_gpu.py without tests/conftest.py"
        argv += ["-q", "-p", "no:cacheprovider", "-rfEs"]
        t0 = time.monotonic()
        rc, out = _run_subprocess([sys.executable] + argv, soft + self.P.grace_s, self.env)
        wall = time.monotonic() - t0
        counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed)", out)}
        if "error" in counts:
            counts["errors"] = counts.pop("error")
        summary = {"returncode": rc, **counts, "note": note, "device_name": (self.hello or {}).get("gpu")}
        log = self.out.with_suffix(".pytest.log")
        try:
            log.write_text(out)
            summary["log"] = log.name
        except OSError:
            pass
        r = {"command": "PYTHONPATH=. python3 " + " ".join(argv), "output_tail": out[-3000:], "summary": summary}
        if rc is None:
            r.update(status="timeout", error=f"cap of {soft + self.P.grace_s:.0f} s reached")
        elif rc == 0:
            r.update(status="ok")
        else:
            r.update(status="error", error=f"pytest exit code {rc}: " + (out.strip().splitlines() or [""])[-1][:300])
        self.record(p, r, wall, soft)

    def run(self) -> dict:
        has_tests = any(p.kind == "pytest" for p in self.points)
        try:
            for i, p in enumerate(self.points):
                reserve = self.P.tests_reserve_s if has_tests and p.kind != "pytest" else 0.0
                left = self.deadline_s - self.elapsed() - reserve
                soft = min(p.cap_s, left - self.P.grace_s)
                if soft < (p.min_start_s or min(p.cap_s, MIN_START_S)):  # too little left to be worth starting
                    self.say(f"{p.id}: skipped, {max(0.0, left):.0f} s left before the deadline")
                    self.not_run.append({"id": p.id, "reason": "global deadline"})
                    continue
                self.say(f"({i + 1}/{len(self.points)}) {p.id} [cap {soft:.0f} s]")
                self.run_point(p, soft)
                self.save()
        except BaseException:
            self.stop_worker(kill=True)  # interrupted mid-point: no time to let it finish
            raise
        self.stop_worker()
        return self.save(finished=True)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # labkit from this source tree, as on the GPU machine
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="JSON file (default: data/reference/<gpu>.json; "
                    "out/reference-dryrun.json with --tiny)")
    ap.add_argument("--md", default=None, help="also write the claims-vs-measurements markdown table here")
    ap.add_argument("--tiny", "--dry-run", dest="tiny", action="store_true",
                    help="CPU dry run: tiny sizes, never written into data/reference/")
    ap.add_argument("--deadline-s", type=float, default=None, help="global budget for the whole suite in seconds "
                    f"(default {GPU.deadline_s:.0f}; {TINY.deadline_s:.0f} with --tiny)")
    ap.add_argument("--only", default="", help="comma-separated point ids or section prefixes")
    ap.add_argument("--skip", default="", help="comma-separated point ids or section prefixes to leave out")
    ap.add_argument("--device", default=None, help="override the device of every point (auto, cpu, cuda)")
    ap.add_argument("--git-commit", default="", help="commit to record where the checkout has no .git")
    ap.add_argument("--allow-cpu", action="store_true", help="run full sizes without a GPU (never for data/reference)")
    ap.add_argument("--list", action="store_true", help="print the plan with caps and exit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result-fd", type=int, default=None, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.worker:
        return worker_main(ns.result_fd)

    P = TINY if ns.tiny else GPU
    if ns.device:
        P = Profile(**{**P.__dict__, "device": ns.device})
    points = select_points(plan(P), ns.only, ns.skip)
    if ns.list:
        total = 0.0
        for p in points:
            total += p.cap_s
            print(f"{p.id:<28} {p.kind:<14} cap {p.cap_s:5.0f} s  hard {p.cap_s + P.grace_s:5.0f} s")
        print(f"{len(points)} points; caps add up to {total:.0f} s; the deadline ({ns.deadline_s or P.deadline_s:.0f} s, "
              f"{P.tests_reserve_s:.0f} s held for the tests) stops the suite first")
        return 0
    if not points:
        print("error: --only/--skip left no points", file=sys.stderr)
        return 2

    out = Path(ns.out).resolve() if ns.out else None
    if ns.tiny:
        out = out or ROOT / "out" / "reference-dryrun.json"
        if REFERENCE_DIR.resolve() in out.parents or (ns.md and REFERENCE_DIR.resolve() in Path(ns.md).resolve().parents):
            print("error: a dry run never writes into data/reference/ (those files are real GPU measurements)",
                  file=sys.stderr)
            return 2
    suite = Suite(points, P, out or Path("/nonexistent"), Path(ns.md).resolve() if ns.md else None,
                  ns.deadline_s, argv=["benchmarks/reference_suite.py"] + argv, git_commit=ns.git_commit)

    def on_term(signum, frame):  # an outer `timeout`: end cleanly, keep what was written
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_term)
    try:
        return _drive(suite, ns, out, points, P)
    finally:
        signal.signal(signal.SIGTERM, old_term)  # main() may run inside another program (the tests)


def _drive(suite, ns, out, points, P) -> int:
    try:
        suite.ensure_worker()
    except WorkerGone as e:
        print(f"error: {e}", file=sys.stderr)
        suite.stop_worker()
        return 1
    kind = suite.hello.get("device_kind")
    if not ns.tiny:
        if kind != "cuda" and not ns.allow_cpu:
            suite.stop_worker()
            print(f"error: the full suite needs a CUDA GPU (this is {kind}: {suite.hello.get('gpu')}); "
                  "use --tiny for a dry run", file=sys.stderr)
            return 2
        if kind != "cuda" and (out is None or REFERENCE_DIR.resolve() in out.parents):
            suite.stop_worker()
            print("error: without a GPU the results cannot go into data/reference/; pass --out elsewhere",
                  file=sys.stderr)
            return 2
        suite.out = out or REFERENCE_DIR / f"{slug(suite.hello.get('gpu', 'gpu'))}.json"
    else:
        suite.out = out
    suite.say(f"{len(points)} points, profile {P.name}, deadline {suite.deadline_s:.0f} s -> {suite.out}")
    try:
        doc = suite.run()
    except KeyboardInterrupt as e:
        suite.say(f"interrupted ({e}): keeping the {len(suite.results)} point(s) written so far")
        suite.stop_worker(kill=True)
        suite.save(finished=False)
        return 130
    counts = {}
    for p in doc["points"]:
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    try:
        from labkit.tools.reference import validate

        problems = validate(doc) if doc["points"] else ["no point finished"]
    except Exception as e:  # noqa: BLE001
        problems = [f"could not validate: {_err(e)}"]
    print(f"wrote {suite.out}: {len(doc['points'])} point(s) {counts}, {len(suite.not_run)} not run, "
          f"{suite.elapsed():.0f} s" + (f"; schema problems: {problems}" if problems else ""))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
