"""Measurements: FLOPs (FlopCounterMode), activation bytes (labkit.tracer), memory, MFU/HFU.

Probes never touch the model being trained: they build their own copy of the architecture.

FLOP convention used by the whole course: count matmul FLOPs only (2 per multiply-add), attention
counted *non-causal* (the full T x T score matrix, as FlopCounterMode and PaLM's MFU do), N = every
matmul weight including the LM head. Then a training step costs 6·N + 12·L·d·T FLOPs per token.
"""
from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time

import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.utils.flop_counter import FlopCounterMode

from .device import LoadMeter, children_cpu_s, cores, machine_load  # noqa: F401  (re-exported: chapter tools import them from here)
from .model import GPT
from .precision import autocast
from .tracer import Tracer


def formula_flops_per_token(n_matmul_params: int, n_layer: int, d_model: int, seq_len: int) -> int:
    """Training FLOPs per token: 6·N (fwd 2N + bwd 4N) plus attention scores and mixing, non-causal."""
    return 6 * n_matmul_params + 12 * n_layer * d_model * seq_len


def _math_attention():
    """FlopCounterMode counts the fused CPU attention kernel as 0 FLOPs; the math backend is counted."""
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
    spec = config.spec
    torch.manual_seed(0)
    model = GPT(spec, checkpointing_mode=config.checkpointing, checkpoint_every=config.checkpoint_every).to(device)
    idx = torch.randint(0, 256, (batch, spec.seq_len), device=device)
    # labkit's one dispatch tracer (memtrace's): what is alive when the forward pass returns is what
    # autograd -- and a selective-checkpoint policy, which a saved-tensors hook cannot see -- holds for backward
    tracer = Tracer(model)
    with attention_backend(config.attention), tracer:
        with autocast(device.type, config.precision):
            loss = model(idx, idx)
        acts, copies = tracer.alive_bytes()
    del loss, model, tracer
    return acts, copies


def attention_backend(name: str):
    if name == "auto":
        return contextlib.nullcontext()

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


