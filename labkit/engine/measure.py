"""Measurements: FLOPs (FlopCounterMode), activation bytes (labkit.tracer), memory, MFU/HFU, a run's summary.

Probes never touch the model being trained: they build their own copy of the architecture.

FLOP convention used by the whole course: count matmul FLOPs only (2 per multiply-add), attention
counted *non-causal* (the full T x T score matrix, as FlopCounterMode and PaLM's MFU do), N = every
matmul weight including the LM head. Then a training step costs 6·N + 12·L·d·T FLOPs per token.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..base.compat import need
from ..base.numfmt import number
from .config import config_echo
from .data import corpus_sha
from .device import LoadMeter, children_cpu_s, cores, machine_load  # noqa: F401  (re-exported: chapter tools import them from here)
from .model import GPT, n_params
from .precision import autocast
from .tracer import Tracer

try:
    from torch.nn.attention import sdpa_kernel, SDPBackend
except ImportError:  # torch < 2.3: need("sdpa_kernel") below says so where a backend is chosen
    sdpa_kernel = SDPBackend = None


def formula_flops_per_token(n_matmul_params: int, n_layer: int, d_model: int, seq_len: int) -> int:
    """Training FLOPs per token: 6·N (fwd 2N + bwd 4N) plus attention scores and mixing, non-causal."""
    return 6 * n_matmul_params + 12 * n_layer * d_model * seq_len


def _math_attention():
    """FlopCounterMode counts the fused CPU attention kernel as 0 FLOPs; the math backend is counted."""
    need("sdpa_kernel")  # torch >= 2.3: a clear message on an older one
    return sdpa_kernel([SDPBackend.MATH])


@functools.lru_cache(maxsize=64)  # a pure function of the shape: sweeps need not count again
def count_flops(spec, checkpointing_mode: str = "none", checkpoint_every: int = 1, batch: int = 1) -> int:
    """FLOPs of one forward+backward of ``batch`` sequences, counted on a meta-device copy (no memory,
    no time). With checkpointing the recomputed forward is counted too: hardware FLOPs, for HFU."""
    with torch.device("meta"):
        model = GPT(spec, checkpointing_mode=checkpointing_mode, checkpoint_every=checkpoint_every)
        idx = torch.zeros(batch, spec.seq_len, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with _math_attention(), counter:
        model(idx, idx).backward()
    return int(counter.get_total_flops())


def activation_bytes(config, device, batch: int = 1) -> tuple:
    """(activation bytes, autocast weight-copy bytes) held for backward after one forward pass of
    ``batch`` sequences, measured on a fresh copy of the architecture on the real device."""
    device = torch.device(device)
    return _activation_bytes(config.spec, config.checkpointing, config.checkpoint_every, config.attention,
                             config.precision, device, batch)


# Measured once per process for each shape: a byte count depends on nothing else, and this probe was a
# large part of a small run's fixed cost (one traced forward pass, 0.05 s for tiny, 0.4 s for small on 2 cores).
@functools.lru_cache(maxsize=64)
def _activation_bytes(spec, checkpointing: str, every: int, attention: str, precision: str, device, batch: int):
    # The weights' and tokens' values do not change a byte count; their random numbers are drawn on the CPU
    # and given back, so the training's stream does not depend on whether this ran or was remembered.
    with torch.random.fork_rng(devices=[]):
        model = GPT(spec, checkpointing_mode=checkpointing, checkpoint_every=every).to(device)
        idx = torch.randint(0, 256, (batch, spec.seq_len)).to(device)
        # labkit's one dispatch tracer (memtrace's): what is alive when the forward pass returns is what
        # autograd -- and a selective-checkpoint policy, which a saved-tensors hook cannot see -- holds for backward
        tracer = Tracer(model)
        with attention_backend(attention), tracer:
            with autocast(device.type, precision):
                loss = model(idx, idx)
            acts, copies = tracer.alive_bytes()
        del loss, model, tracer
    return acts, copies


def attention_backend(name: str):
    if name == "auto":
        return contextlib.nullcontext()

    need("sdpa_kernel")  # torch >= 2.3: a clear message on an older one
    backend = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    return sdpa_kernel([backend])


def state_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def optimizer_bytes(optimizer) -> int:
    return sum(state_bytes(s.values()) for s in optimizer.state.values())


def mfu(flops_per_step: float, step_time_s: float, peak_flops: float, n_devices: int = 1):
    """Model FLOPs utilisation: achieved useful FLOP/s over what the hardware could do at peak."""
    if not step_time_s or not peak_flops:
        return None
    return flops_per_step / step_time_s / (peak_flops * n_devices)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- the summary of a run (schema.Summary) --------------------------------------------------------

MFU_WRONG = "MFU > 1: the peak is wrong"  # what every table shows in place of an MFU above 1 (never as measured)


def mfu_impossible(v) -> bool:
    """Whether a utilisation is above 1: no run does more FLOP/s than its device's peak, so the peak (or
    the FLOP count, or the timing) is wrong and the number is not a measurement."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1


def mfu_note(hfu, peak_source, mfu=None, peak_flops=None):
    """Why a utilisation above 100 % is shown -- never silently, never as measured. MFU > 1 is said first
    ("MFU > 1: the peak is wrong (...)"); else HFU (>= MFU) above 1. None when both are at most 1."""
    if not (mfu_impossible(mfu) or mfu_impossible(hfu)):
        return None
    what = (f"{MFU_WRONG} (MFU {mfu:.0%}" if mfu_impossible(mfu) else f"HFU > 1: the peak is wrong (HFU {hfu:.0%}") \
        + (f" of {number(peak_flops)} FLOP/s" if isinstance(peak_flops, (int, float)) else "")
    if peak_source and peak_source.startswith("measured"):
        return (f"{what}, {peak_source.split(';')[0]}): above 100 % cannot be real -- the probe that set the peak "
                "ran small matrices or under load, or its cache was damaged or planted. Run "
                "`python -m labkit env --remeasure` on an idle machine to measure it again")
    return (f"{what} of the datasheet peak): above 100 % cannot be real -- the FLOP count or the timing is wrong; "
            "please report it")


def run_summary(run, records: list) -> dict:
    """The summary of one run (schema.Summary), from rank 0's per-process state ``run`` (train's ``_Run``:
    config, caps, numerics, probe, model, dev, threads, grad/opt bytes, counter, corpus) and its records:
    medians over the timed updates (the warm-up left out), memory, FLOPs, utilisation, losses, AllReduce."""
    config, caps, probe = run.config, run.caps, run.probe
    timed = records[config.warmup:] or records
    step_time = median([r["step_time_s"] for r in timed])
    total_time = sum(r["step_time_s"] for r in timed)
    s = {
        "status": "completed",
        **config_echo(config, run.world_size),
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
        **utilisation(probe, step_time, run.world_size),
        **loss_summary(records),
        "corpus_sha": corpus_sha(run.corpus),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    s.update(allreduce_summary(run.counter, records, caps.kind))
    return s


def utilisation(probe: dict, step_time, world_size: int) -> dict:
    """Peak FLOP/s (and where it came from), MFU, HFU and the note on a utilisation above 100 %."""
    hfu = mfu(probe["hardware_flops"], step_time, probe["peak_flops"], world_size)
    s_mfu = mfu(probe["model_flops"], step_time, probe["peak_flops"], world_size)
    return {"peak_flops": probe["peak_flops"], "peak_flops_source": probe["peak_flops_source"],
            "mfu": s_mfu, "hfu": hfu,
            "mfu_note": mfu_note(hfu, probe["peak_flops_source"], s_mfu, probe["peak_flops"])}


def loss_summary(records: list) -> dict:
    """First and final loss, the last gradient norm and scale, and how many updates were skipped or non-finite."""
    last = records[-1] if records else {}
    return {"final_loss": last.get("loss"), "first_loss": records[0]["loss"] if records else None,
            "grad_norm": last.get("grad_norm"), "skipped_steps": sum(r["skipped"] for r in records),
            "nonfinite_steps": sum(r["nonfinite"] for r in records), "grad_scale": last.get("grad_scale")}


def allreduce_summary(counter, records: list, kind: str) -> dict:
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
