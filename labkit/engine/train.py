"""The training loop: loader -> autocast forward -> loss/K -> backward (no_sync on K-1) -> optimizer.

``run(config, on_step)`` is the one entry point the panel, the CLI, the notebooks and the benchmarks
share. Each optimizer update produces one flat record (units in the names).
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import time
import traceback
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from . import ddp as ddp_mod
from . import launch
from . import precision as precision_mod
from ..base import runtime
from .config import Config, config_echo
from .rules import check as check_device
from .data import check_corpus, corpus_path, make_loader
from .device import Capabilities, capabilities, children_cpu_s, cores, peak_flops, synchronize
from ..base.runtime import OutOfMemory, RunError, Stopped
from .measure import (activation_bytes, attention_backend, check_host_memory, count_flops, mfu,
                      oom_message, optimizer_bytes, run_summary, state_bytes)
from .model import GPT
from .precision import Numerics
from ..base.schema import Record
# The update step the course teaches lives in step.py; the loop calls it by these names (chapters and tests
# know them as labkit.engine.train.micro_steps / optimizer_step / make_optimizer).
from .step import loader_died, loader_died_error, make_optimizer, micro_steps, optimizer_step


@dataclass
class Result:
    """What a run returns: the configuration, a flat summary dict and one record per update."""

    config: Config
    summary: dict
    records: list = field(default_factory=list)

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
    # the device's capabilities, asked once per run and passed down to every step that needs them
    caps = check_device(config)  # what this device refuses (bf16 on a T4, tf32 off CUDA, ...): before any work
    check_host_memory(config, caps)  # a CPU run that cannot fit fails now, not after minutes of swapping
    records = []

    def keep(rec):
        records.append(rec)
        if on_step is not None:
            on_step(rec)

    corpus = check_corpus(config)  # a missing, empty or too-short text fails here, before any work
    with runtime.ctrl_c_at_next_micro_step() as interrupted:
        def should_stop():
            return interrupted.is_set() or (stop is not None and stop.is_set())

        try:
            summary = _run(config, caps, keep, should_stop, records, corpus)
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


def _run(config, caps, on_step, should_stop, records, corpus=None) -> dict:
    oom = None
    try:
        with runtime.one_run(_BUSY):
            if config.world_size == 1 or runtime.under_torchrun():
                rank = int(os.environ.get("RANK", 0)) if runtime.under_torchrun() else 0
                ws = int(os.environ.get("WORLD_SIZE", config.world_size)) if runtime.under_torchrun() else 1
                summary = train_worker(config, rank=rank, world_size=ws,
                                       on_step=on_step if rank == 0 else None, should_stop=should_stop, caps=caps,
                                       corpus=corpus)
            else:
                # Probe (or read) the peak once here, with the ranks' thread count: every rank then reads
                # the cache instead of probing while its peers wait at the rendezvous.
                threads = threads_for(config, caps.kind, config.world_size)
                peak_flops(caps, config.precision, threads)
                # On the CPU rank 0's probes run here too: this process remembers them between runs, and a
                # fresh fork does not (the small model's activation probe was 0.4 s of each DDP run's start).
                probe = (_probe(config, caps, torch.device("cpu"), config.world_size, threads)
                         if caps.kind == "cpu" else None)
                summary = launch.run_ranks(config, train_worker, on_step, should_stop, caps=caps, probe=probe)
    except Stopped:
        summary = {"status": "stopped", **config_echo(config, config.world_size), "updates_done": len(records)}
    except torch.OutOfMemoryError as e:
        oom = str(e).split("\n")[0]  # leave the except block first: its traceback pins the tensors
    if oom is not None:
        raise OutOfMemory(oom_message(config, oom, len(records)))
    return summary


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


def param_fingerprint(model) -> float:
    """A position-weighted sum of every weight: equal fingerprints <=> (almost surely) equal models."""
    with torch.no_grad():
        return float(sum((i + 1) * p.double().sum() for i, p in enumerate(model.parameters())))


def _injected_fault(rank: int, update: int):
    """Tests set LABKIT_INJECT_FAULT="rank:update" to make one rank raise mid-run."""
    if os.environ.get("LABKIT_INJECT_FAULT") == f"{rank}:{update}":
        raise RuntimeError(f"injected fault on rank {rank} at update {update} (LABKIT_INJECT_FAULT)")


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
        model = weakref.ref(self.model) if self.model is not None else None
        held = self.param_bytes + (self.grad_bytes or 0) + (self.opt_bytes or 0)
        self.batches = self.net = self.fwd = self.model = self.optimizer = self.scaler = None
        if model is not None and model() is not None and must_collect(self.dev, held):
            gc.collect()  # the model outlived its last reference: a reference cycle holds it
        if self.budget_set:
            torch.cuda.set_per_process_memory_fraction(1.0, self.dev)
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()


# A full gc.collect costs 0.2-0.3 s in a process that has imported torch (about 300,000 objects to
# walk) and was most of a small run's fixed cost. Reference counting alone frees the model, DDP, the
# optimizer and the loader when nothing holds them in a cycle (tests/test_engine_measure.py checks
# it), so teardown collects only when the model is still alive after its last reference went -- and
# leaves a small model on the CPU to Python's own collector (128 MiB is little next to torch).
COLLECT_ABOVE_BYTES = 128 * 2**20


def must_collect(dev: torch.device, held_bytes: int) -> bool:
    """Whether a model that outlived its run is worth a full collection now. On a GPU, always: what it
    still holds would count in the next run's peak memory and against its memory budget."""
    return dev.type != "cpu" or held_bytes >= COLLECT_ABOVE_BYTES


def train_worker(config: Config, rank: int = 0, world_size: int = 1, store=None, on_step=None,
                 should_stop=lambda: False, caps: Capabilities = None, corpus: Optional[Path] = None,
                 probe: Optional[dict] = None) -> dict:
    """Train on this process as ``rank`` of ``world_size``; returns the summary (meaningful on rank 0).

    Each set-up step registers its undoing on one ExitStack as it goes, so teardown runs in reverse
    and nothing is forgotten: loader workers end, then the modules go -- DDP's reducer holds the
    process group, so it must be freed before the group -- then the group, then the thread count.
    ``corpus``: the corpus file when the caller has just found and checked it (its hash is not read twice);
    ``probe``: rank 0's probes when the caller has made them (``_probe``)."""
    teardown = contextlib.ExitStack()
    try:
        run = _set_up(config, rank, world_size, store, teardown, caps, corpus, probe)
        records = []
        run.t_start = time.perf_counter()
        with run.numerics.matmuls(), attention_backend(config.attention):
            for u in range(1, config.steps + 1):
                rec = _record(run, _one_update(run, u, should_stop))
                records.append(rec)
                if on_step is not None:
                    on_step(rec)
        return _finish(run, records)
    except BaseException as e:
        # The traceback keeps the frames the error came through with their locals -- micro_steps' ``net`` is
        # the DDP module -- and a notebook keeps the traceback. DDP freed after the group is destroyed can
        # leave the process stuck in the reducer's destructor: the frames let go of their locals first.
        traceback.clear_frames(e.__traceback__)
        if isinstance(e, RuntimeError) and loader_died(e):  # anywhere in the update: see step.loader_died
            raise loader_died_error(e) from None
        raise
    finally:
        with runtime.cleaning_up():  # a Ctrl-C now waits: nothing below may be skipped
            teardown.close()


def _set_up(config: Config, rank: int, world_size: int, store, teardown: contextlib.ExitStack,
            caps: Capabilities = None, corpus: Optional[Path] = None, probe: Optional[dict] = None) -> _Run:
    """Threads, model, rank 0's probes, process group and DDP, optimizer, CUDA memory, loader."""
    caps = caps if caps is not None else capabilities(config.device)  # the run's, when it passed them down
    dev = _device_for(caps.kind, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    teardown.callback(torch.set_num_threads, torch.get_num_threads())
    threads = threads_for(config, caps.kind, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    torch.set_num_threads(threads)
    run = _Run(config, rank, world_size, caps, dev, precision_mod.resolve(config, caps), threads,
               corpus=corpus or corpus_path(config.corpus))
    torch.manual_seed(config.seed)  # same initial weights on every rank
    run.model = GPT(config.spec, config.dropout, config.checkpointing, config.checkpoint_every).to(dev)
    run.param_bytes = state_bytes(run.model.parameters())  # known from here on: release() weighs it
    if rank == 0:
        run.probe = probe if probe is not None else _probe(config, caps, dev, world_size, threads)
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
    with launch.children_die_with_parent():  # spawned workers: killed with this process, even while starting
        run.batches = iter(loader)
    teardown.callback(_shutdown_workers, run.batches)  # loader workers never outlive the run
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
    summary = run_summary(run, records)
    # loader workers' CPU time, kept apart from cpu_s: the price of hiding data time, not compute
    summary["worker_cpu_s"] = children_cpu_s() if run.config.workers else None
    summary.update(param_fingerprint=fingerprint, replicas_identical=identical)
    return summary
