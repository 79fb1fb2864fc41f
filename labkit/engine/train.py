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
from pathlib import Path
from typing import Any, Optional

import torch

from . import ddp as ddp_mod
from . import precision as precision_mod
from ..base import runtime
from .config import Config
from .data import check_corpus, corpus_path, corpus_sha, make_loader
from .device import Capabilities, capabilities, cores, peak_flops, synchronize
from ..base.errors import NonFiniteError, OutOfMemory, RunError, Stopped
from .measure import activation_bytes, attention_backend, children_cpu_s, count_flops, median, mfu, optimizer_bytes, state_bytes
from .limits import block_bytes_formula
from .model import GPT, VOCAB, n_params
from .precision import Numerics, autocast
from .rules import check as check_device
from ..base.schema import CONFIG_KEYS, Record


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

    def keep(rec):
        records.append(rec)
        if on_step is not None:
            on_step(rec)

    check_corpus(config)  # a missing, empty or too-short text fails here, before any work
    with runtime.ctrl_c_at_next_micro_step() as interrupted:
        def should_stop():
            return interrupted.is_set() or (stop is not None and stop.is_set())

        try:
            summary = _run(config, keep, should_stop, records)
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


def _run(config, on_step, should_stop, records) -> dict:
    oom = None
    try:
        with runtime.one_run(_BUSY):
            if config.world_size == 1 or runtime.under_torchrun():
                rank = int(os.environ.get("RANK", 0)) if runtime.under_torchrun() else 0
                ws = int(os.environ.get("WORLD_SIZE", config.world_size)) if runtime.under_torchrun() else 1
                summary = train_worker(config, rank=rank, world_size=ws,
                                       on_step=on_step if rank == 0 else None, should_stop=should_stop)
            else:
                # Probe (or read) the peak once here, with the ranks' thread count: every rank then reads
                # the cache instead of probing while its peers wait at the rendezvous.
                caps = capabilities(config.device)
                peak_flops(caps, config.precision, threads_for(config, caps.kind, config.world_size))
                summary = ddp_mod.launch(config, train_worker, on_step, should_stop)
    except Stopped:
        summary = {"status": "stopped", **_config_keys(config, config.world_size), "updates_done": len(records)}
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
        import psutil  # deferred: optional (the course extras); sysconf below serves without it

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


# ---- one process's part of a run: set-up, one update, its record, teardown ------------------------

@dataclass(eq=False)
class _Run:
    """One process's part of a run, from set-up to teardown: everything the update loop reads."""

    config: Config
    rank: int
    world_size: int
    caps: Capabilities
    dev: torch.device
    numerics: Numerics
    threads: int
    corpus: Path
    model: Any = None
    net: Any = None             # what synchronises gradients: the DDP module (the model itself on MPS)
    fwd: Any = None             # what the forward pass calls: net, or its torch.compile
    optimizer: Any = None
    scaler: Any = None          # the GradScaler, or None
    counter: Any = None         # the counting hook's state; None without DDP
    batches: Any = None         # the loader's iterator
    probe: dict = field(default_factory=dict)  # rank 0: FLOPs, activation bytes, peak FLOP/s
    budget_set: bool = False
    param_bytes: int = 0
    grad_bytes: Optional[int] = None
    opt_bytes: Optional[int] = None
    t_start: float = 0.0

    def release(self):
        """Let go of the model, DDP, the optimizer and the loader, and give their memory back."""
        self.batches = self.net = self.fwd = self.model = self.optimizer = self.scaler = None
        gc.collect()
        if self.budget_set:
            torch.cuda.set_per_process_memory_fraction(1.0, self.dev)
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()


def train_worker(config: Config, rank: int = 0, world_size: int = 1, store=None, on_step=None,
                 should_stop=lambda: False) -> dict:
    """Train on this process as ``rank`` of ``world_size``; returns the summary (meaningful on rank 0).

    Each set-up step registers its undoing on one ExitStack as it goes, so teardown runs in reverse
    and nothing is forgotten: loader workers end, then the modules go -- DDP's reducer holds the
    process group, so it must be freed before the group -- then the group, then the thread count."""
    teardown = contextlib.ExitStack()
    try:
        run = _set_up(config, rank, world_size, store, teardown)
        records = []
        run.t_start = time.perf_counter()
        with run.numerics.matmuls(), attention_backend(config.attention):
            for u in range(1, config.steps + 1):
                rec = _record(run, _one_update(run, u, should_stop))
                records.append(rec)
                if on_step is not None:
                    on_step(rec)
        return _finish(run, records)
    except RuntimeError as e:
        if not _loader_died(e):  # anywhere in the update, not only in next(): see _loader_died
            raise
        raise _loader_died_error(e) from None
    finally:
        with runtime.cleaning_up():  # a Ctrl-C now waits: nothing below may be skipped
            teardown.close()


def _set_up(config: Config, rank: int, world_size: int, store, teardown: contextlib.ExitStack) -> _Run:
    """Threads, model, rank 0's probes, process group and DDP, optimizer, CUDA memory, loader."""
    caps = capabilities(config.device)
    dev = _device_for(caps.kind, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    teardown.callback(torch.set_num_threads, torch.get_num_threads())
    threads = threads_for(config, caps.kind, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    torch.set_num_threads(threads)
    run = _Run(config, rank, world_size, caps, dev, precision_mod.resolve(config, caps), threads,
               corpus=corpus_path(config.corpus))
    torch.manual_seed(config.seed)  # same initial weights on every rank
    run.model = GPT(config.spec, config.dropout, config.checkpointing, config.checkpoint_every).to(dev)
    if rank == 0:
        run.probe = _probe(config, caps, dev, world_size, threads)
    if caps.kind != "mps" and ddp_mod.init_group(caps.kind, rank, world_size, store):
        teardown.callback(ddp_mod.destroy_group)
    teardown.callback(run.release)  # after the group's callback, so it runs before it
    if caps.kind == "mps":  # PyTorch has no distributed backend for Apple GPUs
        run.net = run.model
    else:
        run.net, run.counter = ddp_mod.data_parallel(run.model, dev, config.bucket_cap_mb, config.comm_hook)
    run.fwd = torch.compile(run.net) if config.compile else run.net
    run.optimizer = make_optimizer(config, run.model.parameters())
    run.scaler = run.numerics.grad_scaler()
    if dev.type == "cuda":
        if config.memory_budget_gb is not None:
            # Emulate a smaller card: allocations beyond this fraction raise OutOfMemoryError.
            torch.cuda.set_per_process_memory_fraction(config.memory_budget_gb * 2**30 / caps.memory_bytes, dev)
            run.budget_set = True
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)  # the peak from here on is the training run's
    loader, _ = make_loader(config, rank, run.corpus)
    with ddp_mod.children_die_with_parent():  # spawned workers: killed with this process, even while starting
        run.batches = iter(loader)
    teardown.callback(_shutdown_workers, run.batches)  # loader workers never outlive the run
    run.param_bytes = state_bytes(run.model.parameters())
    return run


def _probe(config: Config, caps: Capabilities, dev, world_size: int, threads: int) -> dict:
    """Rank 0's measurements, on fresh copies of the architecture and before DDP exists (a probe through
    the DDP module would launch a collective and become DDP's "first iteration")."""
    spec, per_update = config.spec, config.micro_batch * config.accum * world_size
    probe = {"model_flops": count_flops(spec) * per_update,
             "hardware_flops": count_flops(spec, config.checkpointing, config.checkpoint_every) * per_update}
    acts, copies = activation_bytes(config, dev, batch=1)
    probe["activation_bytes"] = acts * config.micro_batch  # every activation scales with the batch
    probe["autocast_weight_copy_bytes"] = copies
    probe["peak_flops"], probe["peak_flops_source"] = peak_flops(caps, config.precision, threads)
    return probe


def _shutdown_workers(batches):
    if hasattr(batches, "_shutdown_workers"):
        batches._shutdown_workers()


def _one_update(run: _Run, u: int, should_stop) -> dict:
    """Update ``u``: forward and backward of K micro-batches, then the optimizer; its raw numbers."""
    config, counter = run.config, run.counter
    _injected_fault(run.rank, u)
    t0, cpu0 = time.perf_counter(), time.process_time()
    calls0, bytes0 = (counter.calls, counter.bytes) if counter else (0, 0)
    losses, data_s = micro_steps(run.net, run.fwd, run.batches, config.accum, run.scaler, run.dev.type,
                                 config.precision, run.dev, non_blocking=config.pin_memory, should_stop=should_stop,
                                 no_sync=counter is not None and config.ddp_sync == "no_sync")
    events = None
    if run.dev.type == "cuda":  # the optimizer's own time, measured on the device
        events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        events[0].record()
    t_opt = time.perf_counter()
    if run.grad_bytes is None:
        run.grad_bytes = state_bytes(p.grad for p in run.model.parameters())
    loss_t = torch.stack(losses).float().mean()
    if run.world_size > 1:
        torch.distributed.all_reduce(loss_t)  # mean over ranks, so every world size reports alike
        loss_t /= run.world_size
    grad_norm, skipped = optimizer_step(run.model, run.optimizer, run.scaler, config.grad_clip, config.on_nonfinite,
                                        loss_t, f"update {u}", run.numerics.nonfinite_hint())
    if run.opt_bytes is None:
        run.opt_bytes = optimizer_bytes(run.optimizer)
    if events:
        events[1].record()
    synchronize(run.dev)  # the update is over only when the device has finished it
    t1 = time.perf_counter()
    return {"update": u, "step_s": t1 - t0, "cpu_s": time.process_time() - cpu0, "data_s": data_s,
            "opt_s": events[0].elapsed_time(events[1]) / 1000 if events else t1 - t_opt,
            "loss": float(loss_t), "grad_norm": float(grad_norm), "skipped": bool(skipped), "end": t1,
            "calls": (counter.calls - calls0) if counter else None,
            "bytes": (counter.bytes - bytes0) if counter else None}


def _record(run: _Run, m: dict) -> Record:
    """The record of one update (schema.Record): what the panel, the charts and --json see."""
    config, step_s = run.config, m["step_s"]
    tokens = config.tokens_per_update
    rec = Record(
        update=m["update"], loss=m["loss"], grad_norm=m["grad_norm"],
        grad_scale=float(run.scaler.get_scale()) if run.scaler else None, skipped=m["skipped"],
        nonfinite=not (math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])),
        step_time_s=step_s, cpu_s=m["cpu_s"],  # this process, every thread: compute cost, less moved by others' load
        data_wait_s=m["data_s"], optimizer_s=m["opt_s"], compute_s=max(0.0, step_s - m["data_s"] - m["opt_s"]),
        tokens=tokens, tokens_per_s=tokens / step_s,
        samples_per_s=config.micro_batch * config.accum * run.world_size / step_s,
        peak_mem_bytes=torch.cuda.max_memory_allocated(run.dev) if run.dev.type == "cuda" else None,
        allreduce_calls=m["calls"], allreduce_bytes=m["bytes"], elapsed_s=m["end"] - run.t_start)
    if run.rank == 0:
        probe = run.probe
        rec["mfu"] = mfu(probe["model_flops"], step_s, probe["peak_flops"], run.world_size)
        rec["hfu"] = mfu(probe["hardware_flops"], step_s, probe["peak_flops"], run.world_size)
        # the memory breakdown, so live charts need not wait for the summary
        rec.update(param_bytes=run.param_bytes, grad_bytes=run.grad_bytes, optimizer_bytes=run.opt_bytes,
                   activation_bytes=probe["activation_bytes"],
                   autocast_weight_copy_bytes=probe["autocast_weight_copy_bytes"])
    return rec


def _finish(run: _Run, records: list) -> dict:
    """After the last update: check the replicas agree, and (rank 0) write the summary."""
    fingerprint = param_fingerprint(run.model)
    identical = True
    if run.world_size > 1:  # DDP's promise: every replica holds the same weights after each update
        prints = [None] * run.world_size
        torch.distributed.all_gather_object(prints, fingerprint)
        identical = all(p == fingerprint for p in prints)
    if run.rank != 0:
        return {}
    summary = _summary(run, records)
    # loader workers' CPU time, kept apart from cpu_s: the price of hiding data time, not compute
    summary["worker_cpu_s"] = children_cpu_s() if run.config.workers else None
    summary.update(param_fingerprint=fingerprint, replicas_identical=identical)
    return summary


# ---- the summary (schema.Summary) ------------------------------------------------------------------

def _config_keys(c: Config, world_size: Optional[int] = None) -> dict:
    """The configuration as the run used it (schema.ConfigEcho): the shape resolved from the preset,
    ``world_size`` the processes that ran (torchrun decides under torchrun; default: the Config's)."""
    spec = c.spec
    resolved = {**c.to_dict(), "seq_len": spec.seq_len, "n_layer": spec.n_layer, "d_model": spec.d_model,
                "n_head": spec.n_head, "world_size": world_size or c.world_size,
                "tokens_per_update": c.tokens_per_update, "tokens_per_step": c.tokens_per_update}
    return {k: resolved[k] for k in CONFIG_KEYS}


def _summary(run: _Run, records: list) -> dict:
    config, caps, probe = run.config, run.caps, run.probe
    timed = records[config.warmup:] or records
    step_time = median([r["step_time_s"] for r in timed])
    total_time = sum(r["step_time_s"] for r in timed)
    s = {
        "status": "completed",
        **_config_keys(config, run.world_size),
        "device": caps.kind,
        "device_name": caps.name,
        "device_reason": caps.reason,
        "precision_note": run.numerics.note,
        "compute_capability": caps.compute_capability,
        "n_params": n_params(run.model),
        "n_matmul_params": run.model.matmul_params(),
        "timed_updates": len(timed),
        "step_time_s": step_time,
        "tokens_per_s": config.tokens_per_update / step_time if step_time else None,
        "samples_per_s": config.micro_batch * config.accum * run.world_size / step_time if step_time else None,
        "data_wait_s": median([r["data_wait_s"] for r in timed]),
        "compute_s": median([r["compute_s"] for r in timed]),
        "optimizer_s": median([r["optimizer_s"] for r in timed]),
        "data_wait_frac": sum(r["data_wait_s"] for r in timed) / total_time if total_time else None,
        "intra_op_threads": run.threads,
        "cpu_s_per_update": median([r["cpu_s"] for r in timed]),
        "peak_mem_bytes": torch.cuda.max_memory_allocated(run.dev) if caps.kind == "cuda" else None,
        "param_bytes": state_bytes(run.model.parameters()),
        "grad_bytes": run.grad_bytes,
        "optimizer_bytes": run.opt_bytes,
        "activation_bytes": probe["activation_bytes"],
        "autocast_weight_copy_bytes": probe["autocast_weight_copy_bytes"],
        "model_flops_per_step": probe["model_flops"],
        "hardware_flops_per_step": probe["hardware_flops"],
        **_utilisation(probe, step_time, run.world_size),
        **_losses(records),
        "corpus_sha": corpus_sha(run.corpus),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    s.update(_allreduce(run.counter, records, caps.kind))
    return s


def _utilisation(probe: dict, step_time, world_size: int) -> dict:
    hfu = mfu(probe["hardware_flops"], step_time, probe["peak_flops"], world_size)
    return {"peak_flops": probe["peak_flops"], "peak_flops_source": probe["peak_flops_source"],
            "mfu": mfu(probe["model_flops"], step_time, probe["peak_flops"], world_size), "hfu": hfu,
            "mfu_note": mfu_note(hfu, probe["peak_flops_source"])}


def _losses(records: list) -> dict:
    last = records[-1] if records else {}
    return {"final_loss": last.get("loss"), "first_loss": records[0]["loss"] if records else None,
            "grad_norm": last.get("grad_norm"), "skipped_steps": sum(r["skipped"] for r in records),
            "nonfinite_steps": sum(r["nonfinite"] for r in records), "grad_scale": last.get("grad_scale")}


def _allreduce(counter, records: list, kind: str) -> dict:
    """AllReduce totals and per-update figures; ``comm_time_s`` is not measured (always None) but stays,
    as the CLI's --json promises the key."""
    if counter is None:
        return {**{k: None for k in ("n_buckets", "first_update_buckets", "allreduce_calls", "allreduce_bytes",
                                     "allreduce_calls_per_update", "allreduce_bytes_per_update", "comm_time_s")},
                "ddp_note": f"no DDP on {kind}: PyTorch has no distributed backend for it"}
    later = records[1:] or records  # DDP's first iteration uses a single bucket: leave it out
    return {
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
    }
