"""The training loop: loader -> autocast forward -> loss/K -> backward (no_sync on K-1) -> optimizer.

``run(config, on_step)`` is the one entry point the panel, the CLI, the notebooks and the benchmarks
share. Each optimizer update produces one flat record (units in the names).
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from . import ddp as ddp_mod
from . import runtime
from .config import Config
from .data import check_corpus, corpus_path, corpus_sha, make_loader
from . import precision as precision_mod
from .device import capabilities, cores, peak_flops, synchronize
from .errors import NonFiniteError, OutOfMemory, RunError, Stopped
from .measure import (activation_bytes, attention_backend, children_cpu_s, count_flops, median, mfu,
                      optimizer_bytes, state_bytes)
from .model import GPT, VOCAB, n_params
from .precision import autocast
from .rules import check as check_device


@dataclass
class Result:
    """What a run returns: the configuration, a flat summary dict and one record per update."""

    config: Config
    summary: dict
    records: list = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"config": self.config.to_dict(), "summary": self.summary,
                           "records": self.records}, default=str)

    def __repr__(self):
        s = self.summary
        return (f"Result({s.get('status')}: {s.get('model')} {s.get('precision')} accum={s.get('accum')}, "
                f"{s.get('tokens_per_s') or 0:.0f} tokens/s, final loss {s.get('final_loss')})")


def run(config: Config, on_step=None, stop=None) -> Result:
    """Train ``config`` and return a Result. ``on_step(record)`` is called after every update;
    ``stop`` (anything with ``is_set()``) ends the run cleanly at the next micro-step."""
    if not isinstance(config, Config):
        raise TypeError(f"run() needs a labkit.Config, got {type(config).__name__}")
    config.validate()  # again: a field may have been changed since the Config was made (c.micro_batch = 0)
    check_device(config)  # what this device refuses (bf16 on a T4, tf32 off CUDA, ...): before any work
    check_host_memory(config)  # a CPU run that cannot fit fails now, not after minutes of swapping
    records = []

    def on_record(rec):
        records.append(rec)
        if on_step is not None:
            on_step(rec)

    check_corpus(config)  # a missing, empty or too-short text fails here, before any work
    with runtime.ctrl_c_at_next_micro_step() as interrupted:
        def should_stop():
            return interrupted.is_set() or (stop is not None and stop.is_set())

        try:
            summary = _run(config, on_record, should_stop, records)
        except (RunError, KeyboardInterrupt):
            if not interrupted.is_set():
                raise
            # A RunError here is news of the interrupt itself: a terminal's or Jupyter's Ctrl-C also
            # reaches the loader workers, which quit. A KeyboardInterrupt came after the cleanup ran.
    if interrupted.is_set():  # the run has stopped and cleaned up: now tell the caller
        raise KeyboardInterrupt(f"interrupted after {len(records)} update(s); every worker and DDP process "
                                "of the run has ended")
    return Result(config, summary, records)


_BUSY = ("another run is already going in this Python process (one run at a time per kernel): wait for it, "
         "or stop it first")


def _run(config, on_record, should_stop, records) -> dict:
    oom = None
    try:
        with runtime.one_run(_BUSY):
            if config.world_size == 1 or runtime.under_torchrun():
                rank = int(os.environ.get("RANK", 0)) if runtime.under_torchrun() else 0
                ws = int(os.environ.get("WORLD_SIZE", config.world_size)) if runtime.under_torchrun() else 1
                summary = train_worker(config, rank=rank, world_size=ws,
                                       emit=on_record if rank == 0 else None, should_stop=should_stop)
            else:
                # Probe (or read) the peak once here, with the ranks' thread count: every rank then reads
                # the cache instead of probing while its peers wait at the rendezvous.
                caps = capabilities(config.device)
                peak_flops(caps, config.precision, threads_for(config, caps.kind, config.world_size))
                summary = ddp_mod.launch(config, on_record, should_stop)
    except Stopped:
        summary = {"status": "stopped", **_config_keys(config), "updates_done": len(records)}
    except torch.OutOfMemoryError as e:
        oom = str(e).split("\n")[0]  # leave the except block first: its traceback pins the tensors
    if oom is not None:
        raise OutOfMemory(oom_message(config, oom, len(records)))
    return summary


def param_count(spec) -> int:
    """Parameters of this course's GPT, from its shapes (no model is built): token and position
    embeddings, per block two LayerNorms (2d each), qkv (3d^2 + 3d), proj (d^2 + d), fc (4d^2 + 4d) and
    out (4d^2 + d), the final LayerNorm; the head shares the token embedding."""
    d = spec.d_model
    return VOCAB * d + spec.seq_len * d + spec.n_layer * (12 * d * d + 13 * d) + 2 * d


def host_memory_estimate(config: Config, procs: int = 1) -> dict:
    """Bytes a CPU run of ``procs`` processes needs at the least, counted before any work.

    Per process: fp32 weights, gradients and DDP's gradient buckets (4 B each per parameter), the
    optimizer's state (AdamW 8 B, SGD's momentum 4 B), autocast's 16-bit weight copies; and the
    activations kept for backward, from memtrace's hand count per block (16-bit values under
    autocast). With checkpointing only the block inputs plus one block are counted, and the math
    attention kernel adds its T x T scores and probabilities. Embeddings and logits are left out:
    this is a floor, so a run it refuses could not have fit."""
    from .memtrace import block_bytes_formula

    spec, B = config.spec, config.micro_batch
    n = param_count(spec)
    half = config.precision in ("fp16", "bf16")
    per_param = 12 + (8 if config.optimizer == "adamw" else 4) + (2 if half else 0)
    block = block_bytes_formula(spec.d_model, spec.n_head, spec.seq_len, B, 2 if half else 4)
    if config.attention == "math":
        block += 2 * B * spec.n_head * spec.seq_len ** 2 * (2 if half else 4)
    if config.checkpointing == "none":
        acts = spec.n_layer * block
    else:
        acts = spec.n_layer * B * spec.seq_len * spec.d_model * 4 + block
    states = n * per_param
    return {"n_params": n, "state_bytes": states, "activation_bytes": acts,
            "total_bytes": procs * (states + acts), "procs": procs}


def available_memory() -> int:
    """Bytes of host memory available now (psutil if installed; else free pages from sysconf)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_host_memory(config: Config) -> None:
    """Refuse a CPU run whose estimate exceeds the memory available, in one line with both numbers.
    GPUs keep their own out-of-memory path (memory_budget_gb, oom_message)."""
    if capabilities(config.device).kind != "cpu":
        return
    procs = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if runtime.under_torchrun() else config.world_size
    est = host_memory_estimate(config, procs)
    avail = available_memory()
    if est["total_bytes"] <= avail:
        return
    gib = 2**30
    raise OutOfMemory(
        f"not enough memory to start: {config.model} ({est['n_params'] / 1e6:.1f} M parameters) with "
        f"micro_batch={config.micro_batch}, seq_len={config.context}, checkpointing={config.checkpointing} on "
        f"{procs} process(es) needs at least {est['total_bytes'] / gib:.1f} GiB (per process: weights, "
        f"gradients and {config.optimizer} state {est['state_bytes'] / gib:.1f} GiB, activations "
        f"{est['activation_bytes'] / gib:.1f} GiB), but this machine has {avail / gib:.1f} GiB available. "
        "Try a smaller micro_batch with more accum, a shorter seq_len, checkpointing='full' or a smaller model.")


def oom_message(config: Config, error: str, updates_done: int) -> str:
    """Explain an out-of-memory error with the numbers that matter, after freeing what the run held."""
    import gc

    gc.collect()
    parts = [f"out of device memory after {updates_done} update(s) of {config.model} with micro_batch="
             f"{config.micro_batch}, seq_len={config.context}, precision={config.precision}, "
             f"checkpointing={config.checkpointing}."]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        limit = config.memory_budget_gb or total
        parts.append(f"Budget {limit:.1f} GiB (card {total:.1f} GiB); still allocated after clean-up "
                     f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB.")
    parts.append("Try activation checkpointing, a smaller micro_batch with more accum, or bf16/fp16. "
                 f"PyTorch said: {error}")
    return " ".join(parts)


def _config_keys(c: Config) -> dict:
    spec = c.spec
    return dict(model=c.model, precision=c.precision, loss_scaling=c.loss_scaling, init_scale=c.init_scale,
                growth_interval=c.growth_interval, accum=c.accum,
                micro_batch=c.micro_batch, seq_len=spec.seq_len, checkpointing=c.checkpointing,
                checkpoint_every=c.checkpoint_every, optimizer=c.optimizer, attention=c.attention,
                compile=c.compile, workers=c.workers, pin_memory=c.pin_memory, data_cost_ms=c.data_cost_ms,
                world_size=c.world_size, steps=c.steps, seed=c.seed, lr=c.lr, grad_clip=c.grad_clip,
                on_nonfinite=c.on_nonfinite, ddp_sync=c.ddp_sync, bucket_cap_mb=c.bucket_cap_mb, comm_hook=c.comm_hook,
                memory_budget_gb=c.memory_budget_gb, threads=c.threads, n_layer=spec.n_layer, d_model=spec.d_model,
                n_head=spec.n_head, tokens_per_step=c.tokens_per_update)


def _device_for(kind: str, rank: int) -> torch.device:
    if kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device(kind)


def threads_for(config: Config, kind: str, procs_on_host: int) -> int:
    """CPU: leave one core per loader worker, or workers and PyTorch's threads fight over the cores.
    ``config.threads`` fixes the count (comparisons hold it equal in both arms, or they measure threads)."""
    if kind != "cpu":
        return torch.get_num_threads()
    if config.threads is not None:
        return config.threads
    return max(1, cores() // procs_on_host - config.workers)


def mfu_note(hfu, peak_source):
    """Why a utilisation above 100 % is shown -- never silently. HFU >= MFU, so HFU decides."""
    if hfu is None or hfu <= 1:
        return None
    if peak_source and peak_source.startswith("measured"):
        return (f"above 100 % ({hfu:.0%} HFU): the run did more FLOP/s than the short matmul probe that set "
                "the peak; the probe ran smaller matrices or under load. Run `python -m labkit env --remeasure` "
                "on an idle machine to raise the ceiling")
    return f"above 100 % ({hfu:.0%} HFU) of the datasheet peak: the FLOP count or the timing is wrong -- please report it"


def make_optimizer(config: Config, params):
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01)


def _loader_died(e: BaseException) -> bool:
    """Whether ``e`` is PyTorch's news of a killed loader worker. It comes from next() -- or from the
    loader's SIGCHLD handler, which raises wherever the main thread happens to be: in backward, in a
    DDP comm hook, in the optimizer step."""
    return (isinstance(e, RuntimeError) and not isinstance(e, RunError)
            and "DataLoader worker" in str(e))


def _loader_died_error(e: BaseException) -> RunError:
    return RunError(f"a DataLoader worker process died, so the run stopped ({type(e).__name__}: {str(e).strip()}). "
                            "If the machine ran out of memory, try fewer workers or a smaller prefetch_factor.")


def _next_batch(batches):
    try:
        return next(batches)
    except (RuntimeError, ConnectionError, EOFError) as e:
        # A killed worker (out of memory, SIGKILL) shows up as a RuntimeError from the loader, or as a
        # broken pipe while a batch was being handed over.
        if isinstance(e, RuntimeError) and not _loader_died(e):
            raise
        raise _loader_died_error(e) from None


def micro_steps(net, fwd, batches, K, scaler, kind, precision, dev, *, no_sync=False, non_blocking=False,
                should_stop=lambda: False):
    """Forward and backward K micro-batches; their gradients add up in ``.grad``.
    Returns (per-micro-batch losses, seconds spent waiting for data)."""
    losses, data_s = [], 0.0
    for k in range(K):
        if should_stop():
            raise Stopped()
        td = time.perf_counter()
        x, y = _next_batch(batches)
        x, y = x.to(dev, non_blocking=non_blocking), y.to(dev, non_blocking=non_blocking)
        data_s += time.perf_counter() - td
        # no_sync: skip the AllReduce on the first K-1 micro-batches; local gradients just add up
        with net.no_sync() if no_sync and k < K - 1 else contextlib.nullcontext():
            with autocast(kind, precision):
                loss = fwd(x, y)
            scaled = loss / K  # average over micro-batches: K of them = one big batch
            (scaler.scale(scaled) if scaler else scaled).backward()
        losses.append(loss.detach())
    return losses, data_s


def param_fingerprint(model) -> float:
    """A position-weighted sum of every weight: equal fingerprints <=> (almost surely) equal models."""
    with torch.no_grad():
        return float(sum((i + 1) * p.double().sum() for i, p in enumerate(model.parameters())))


def _injected_fault(rank: int, update: int):
    """Tests set LABKIT_INJECT_FAULT="rank:update" to make one rank raise mid-run."""
    spec = os.environ.get("LABKIT_INJECT_FAULT")
    if spec and spec == f"{rank}:{update}":
        raise RuntimeError(f"injected fault on rank {rank} at update {update} (LABKIT_INJECT_FAULT)")


def optimizer_step(model, optimizer, scaler, grad_clip, on_nonfinite="continue", loss=None, where="", hint=""):
    """Unscale, clip, step, zero. Returns (grad norm before clipping, whether the step was skipped).

    Without a GradScaler, inf/NaN gradients are handled by ``on_nonfinite``: "stop" raises
    NonFiniteError naming what went bad, "skip" drops the update, "continue" applies it anyway.
    """
    if scaler:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    clip = grad_clip if grad_clip else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)  # norm before clipping
    skipped = False
    if scaler:
        before = scaler.get_scale()
        scaler.step(optimizer)  # skipped when the gradients hold inf/NaN
        scaler.update()  # halve the scale after an overflow, grow it after a calm stretch
        skipped = scaler.get_scale() < before
    elif on_nonfinite != "continue" and not torch.isfinite(grad_norm):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        bad = sum(not bool(torch.isfinite(g).all()) for g in grads)
        optimizer.zero_grad(set_to_none=True)
        if on_nonfinite == "stop":
            what = []
            if loss is not None and not torch.isfinite(loss).all():
                what.append(f"the loss is {float(loss)}")
            what.append(f"{bad} of {len(grads)} gradient tensors hold inf/NaN")
            raise NonFiniteError(f"{where}: {' and '.join(what)}. {hint}".strip())
        skipped = True  # "skip": leave the weights as they were, like GradScaler does
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # once per update, never inside the micro-batch loop
    return grad_norm, skipped


def train_worker(config: Config, rank: int = 0, world_size: int = 1, store=None, emit=None,
                 should_stop=lambda: False) -> dict:
    """Train on this process as ``rank`` of ``world_size``; returns the summary (meaningful on rank 0)."""
    caps = capabilities(config.device)
    kind = caps.kind
    dev = _device_for(kind, rank)
    if kind == "cuda":
        torch.cuda.set_device(dev)
    local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    old_threads = torch.get_num_threads()
    threads = threads_for(config, kind, local_procs)
    torch.set_num_threads(threads)
    spec = config.spec
    K = config.accum
    numerics = precision_mod.resolve(config, caps)
    group_created = False
    it = net = fwd = model = optimizer = None
    budget_set = False
    try:
        path = corpus_path(config.corpus)
        torch.manual_seed(config.seed)  # same initial weights on every rank
        model = GPT(spec, config.dropout, config.checkpointing, config.checkpoint_every).to(dev)

        # Probes on fresh copies of the architecture, before DDP exists (a probe through the DDP
        # module would launch a collective and become DDP's "first iteration").
        probe = {}
        if rank == 0:
            probe["model_flops"] = count_flops(spec) * config.micro_batch * K * world_size
            probe["hardware_flops"] = (count_flops(spec, config.checkpointing, config.checkpoint_every)
                                       * config.micro_batch * K * world_size)
            acts, copies = activation_bytes(config, dev, batch=1)
            probe["activation_bytes"] = acts * config.micro_batch  # every activation scales with batch
            probe["autocast_weight_copy_bytes"] = copies
            probe["peak_flops"], probe["peak_flops_source"] = peak_flops(caps, config.precision, threads)

        counter = None
        net = model
        if kind != "mps":
            group_created = ddp_mod.init_group(kind, rank, world_size, store)
            counter = ddp_mod.CommCounter(kind=config.comm_hook)
            net = DDP(model, device_ids=[dev.index] if kind == "cuda" else None,
                      bucket_cap_mb=config.bucket_cap_mb)
            net.register_comm_hook(counter, ddp_mod.counting_hook)
        fwd = torch.compile(net) if config.compile else net
        optimizer = make_optimizer(config, model.parameters())
        scaler = numerics.grad_scaler()

        if kind == "cuda":
            if config.memory_budget_gb is not None:
                # Emulate a smaller card: allocations beyond this fraction raise OutOfMemoryError.
                torch.cuda.set_per_process_memory_fraction(config.memory_budget_gb * 2**30 / caps.memory_bytes, dev)
                budget_set = True
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)  # the peak from here on is the training run's

        loader, _ = make_loader(config, rank, path)
        with ddp_mod.children_die_with_parent():  # spawned workers: killed with this process, even while starting
            it = iter(loader)
        grad_bytes = opt_bytes = None
        param_bytes = state_bytes(model.parameters())
        records = []
        t_start = time.perf_counter()
        use_events = kind == "cuda"
        with numerics.matmuls(), attention_backend(config.attention):
            for u in range(config.steps):
                _injected_fault(rank, u + 1)
                t0, cpu0 = time.perf_counter(), time.process_time()
                calls0, bytes0 = (counter.calls, counter.bytes) if counter else (0, 0)
                losses, data_s = micro_steps(net, fwd, it, K, scaler, kind, config.precision, dev,
                                             no_sync=counter is not None and config.ddp_sync == "no_sync",
                                             non_blocking=config.pin_memory, should_stop=should_stop)
                if use_events:
                    ev_bwd, ev_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    ev_bwd.record()
                t_opt = time.perf_counter()
                if grad_bytes is None:
                    grad_bytes = state_bytes(p.grad for p in model.parameters())
                loss_t = torch.stack(losses).float().mean()
                if world_size > 1:
                    torch.distributed.all_reduce(loss_t)  # mean over ranks, so every world size reports alike
                    loss_t /= world_size
                grad_norm, skipped = optimizer_step(model, optimizer, scaler, config.grad_clip, config.on_nonfinite,
                                                    loss_t, f"update {u + 1}", numerics.nonfinite_hint())
                if opt_bytes is None:
                    opt_bytes = optimizer_bytes(optimizer)
                if use_events:
                    ev_end.record()
                synchronize(dev)  # the update is over only when the device has finished it
                t1 = time.perf_counter()
                step_s = t1 - t0
                cpu_s = time.process_time() - cpu0  # this process, every thread: compute cost, less moved by others' load
                opt_s = ev_bwd.elapsed_time(ev_end) / 1000 if use_events else t1 - t_opt
                loss_v, norm_v = float(loss_t), float(grad_norm)
                tokens = config.tokens_per_update
                rec = {
                    "update": u + 1,
                    "loss": loss_v,
                    "grad_norm": norm_v,
                    "grad_scale": float(scaler.get_scale()) if scaler else None,
                    "skipped": bool(skipped),
                    "nonfinite": not (math.isfinite(loss_v) and math.isfinite(norm_v)),
                    "step_time_s": step_s,
                    "cpu_s": cpu_s,
                    "data_wait_s": data_s,
                    "optimizer_s": opt_s,
                    "compute_s": max(0.0, step_s - data_s - opt_s),
                    "tokens": tokens,
                    "tokens_per_s": tokens / step_s,
                    "samples_per_s": config.micro_batch * K * world_size / step_s,
                    "peak_mem_bytes": torch.cuda.max_memory_allocated(dev) if kind == "cuda" else None,
                    "allreduce_calls": (counter.calls - calls0) if counter else None,
                    "allreduce_bytes": (counter.bytes - bytes0) if counter else None,
                    "elapsed_s": t1 - t_start,
                }
                if rank == 0:
                    rec["mfu"] = mfu(probe["model_flops"], step_s, probe["peak_flops"], world_size)
                    rec["hfu"] = mfu(probe["hardware_flops"], step_s, probe["peak_flops"], world_size)
                    # the memory breakdown, so live charts need not wait for the summary
                    rec.update(param_bytes=param_bytes, grad_bytes=grad_bytes, optimizer_bytes=opt_bytes,
                               activation_bytes=probe["activation_bytes"],
                               autocast_weight_copy_bytes=probe["autocast_weight_copy_bytes"])
                records.append(rec)
                if emit is not None:
                    emit(rec)
        fingerprint = param_fingerprint(model)
        identical = True
        if world_size > 1:  # DDP's promise: every replica holds the same weights after each update
            prints = [None] * world_size
            torch.distributed.all_gather_object(prints, fingerprint)
            identical = all(p == fingerprint for p in prints)
        if rank != 0:
            return {}
        summary = _summary(config, caps, dev, model, records, probe, counter, world_size, threads,
                           grad_bytes, opt_bytes, corpus_sha(path))
        # loader workers' CPU time, kept apart from cpu_s: the price of hiding data time, not compute
        summary["worker_cpu_s"] = children_cpu_s() if config.workers else None
        summary.update(param_fingerprint=fingerprint, replicas_identical=identical)
        return summary
    except RuntimeError as e:
        if not _loader_died(e):  # anywhere in the update, not only in next(): see _loader_died
            raise
        raise _loader_died_error(e) from None
    finally:
        with runtime.cleaning_up():  # a Ctrl-C now waits: nothing below may be skipped
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()  # loader workers never outlive the run
            # Free DDP (its reducer holds the process group) before the group itself goes: the other
            # order can leave a process stuck in the reducer's destructor.
            it = net = fwd = model = optimizer = None
            gc.collect()
            if budget_set:
                torch.cuda.set_per_process_memory_fraction(1.0, dev)
            if kind == "cuda":
                torch.cuda.empty_cache()
            if group_created:
                ddp_mod.destroy_group()
            torch.set_num_threads(old_threads)


def _summary(config, caps, dev, model, records, probe, counter, world_size, threads, grad_bytes,
             opt_bytes, sha) -> dict:
    timed = records[config.warmup:] or records
    step_time = median([r["step_time_s"] for r in timed])
    total_time = sum(r["step_time_s"] for r in timed)
    tokens = config.tokens_per_update
    later = records[1:] or records  # DDP's first iteration uses a single bucket: leave it out
    s = {
        "status": "completed",
        **_config_keys(config),
        "world_size": world_size,
        "device": caps.kind,
        "device_name": caps.name,
        "device_reason": caps.reason,
        "precision_note": precision_mod.resolve(config, caps).note,
        "compute_capability": caps.compute_capability,
        "n_params": n_params(model),
        "n_matmul_params": model.matmul_params(),
        "timed_updates": len(timed),
        "step_time_s": step_time,
        "tokens_per_s": tokens / step_time if step_time else None,
        "samples_per_s": config.micro_batch * config.accum * world_size / step_time if step_time else None,
        "data_wait_s": median([r["data_wait_s"] for r in timed]),
        "compute_s": median([r["compute_s"] for r in timed]),
        "optimizer_s": median([r["optimizer_s"] for r in timed]),
        "data_wait_frac": sum(r["data_wait_s"] for r in timed) / total_time if total_time else None,
        "intra_op_threads": threads,
        "cpu_s_per_update": median([r["cpu_s"] for r in timed]),
        "peak_mem_bytes": torch.cuda.max_memory_allocated(dev) if caps.kind == "cuda" else None,
        "param_bytes": state_bytes(model.parameters()),
        "grad_bytes": grad_bytes,
        "optimizer_bytes": opt_bytes,
        "activation_bytes": probe["activation_bytes"],
        "autocast_weight_copy_bytes": probe["autocast_weight_copy_bytes"],
        "model_flops_per_step": probe["model_flops"],
        "hardware_flops_per_step": probe["hardware_flops"],
        "peak_flops": probe["peak_flops"],
        "peak_flops_source": probe["peak_flops_source"],
        "mfu": mfu(probe["model_flops"], step_time, probe["peak_flops"], world_size),
        "hfu": mfu(probe["hardware_flops"], step_time, probe["peak_flops"], world_size),
        "mfu_note": mfu_note(mfu(probe["hardware_flops"], step_time, probe["peak_flops"], world_size),
                             probe["peak_flops_source"]),
        "final_loss": records[-1]["loss"] if records else None,
        "first_loss": records[0]["loss"] if records else None,
        "grad_norm": records[-1]["grad_norm"] if records else None,
        "skipped_steps": sum(r["skipped"] for r in records),
        "nonfinite_steps": sum(r["nonfinite"] for r in records),
        "grad_scale": records[-1]["grad_scale"] if records else None,
        "corpus_sha": sha,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    if counter is not None:
        s.update({
            "n_buckets": counter.rounds[-1] if counter.rounds else None,
            "first_update_buckets": counter.rounds[0] if counter.rounds else None,
            "allreduce_calls": counter.calls,
            "allreduce_bytes": counter.bytes,
            "allreduce_calls_per_update": sum(r["allreduce_calls"] for r in later) / len(later),
            "allreduce_bytes_per_update": sum(r["allreduce_bytes"] for r in later) / len(later),
            "comm_time_s": None,
            "ddp_note": "per-update AllReduce figures leave out update 1 (DDP's first iteration uses one "
                        "bucket for every gradient)" if len(records) > 1 else "only one update: it is DDP's "
                        "first iteration, whose single bucket differs from later ones",
        })
    else:
        s.update({k: None for k in ("n_buckets", "first_update_buckets", "allreduce_calls", "allreduce_bytes",
                                    "allreduce_calls_per_update", "allreduce_bytes_per_update", "comm_time_s")})
        s["ddp_note"] = f"no DDP on {caps.kind}: PyTorch has no distributed backend for it"
    return s
