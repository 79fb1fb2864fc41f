"""What a run will need before it starts, and the words when it does not fit: the memory pre-flight.

``check_host_memory`` refuses a CPU run whose floor estimate (``host_memory_estimate``: weights, gradients,
optimizer state and the activations ``block_bytes_formula`` counts by hand) exceeds the memory available;
``oom_message`` explains a device's out-of-memory error with the numbers that matter. Chapter 04's tracer
views (``chapters.memtrace``) compare the same formula with a trace.
"""
from __future__ import annotations

import gc
import os

import torch

from ..base import runtime
from ..base.runtime import OutOfMemory
from .device import Capabilities, capabilities
from .model import VOCAB


def block_bytes_formula(d_model: int, n_head: int, seq_len: int, batch: int, bytes_per_value: int = 4) -> int:
    """Bytes one transformer block of this course's GPT keeps for backward, counted by hand.

    Per token, in values: LayerNorm 1 output (d) + q,k,v (3d) + attention output (d; a fused kernel returns
    it in the layout the projection reads, so no copy) + residual sum (d) + LayerNorm 2 output (d) + MLP
    up-projection (4d) + GELU output (4d) + block output (d) = 16·d; plus the attention kernel's log-sum-exp
    (one per head) and each LayerNorm's mean and 1/std (2 × 2). A fused kernel keeps no T×T score matrix.
    """
    per_token = 16 * d_model + n_head + 4
    return batch * seq_len * per_token * bytes_per_value


def param_count(spec) -> int:
    """Parameters of this course's GPT, from its shapes (no model is built): token and position
    embeddings, per block two LayerNorms (2d each), qkv (3d^2 + 3d), proj (d^2 + d), fc (4d^2 + 4d) and
    out (4d^2 + d), the final LayerNorm; the head shares the token embedding."""
    d = spec.d_model
    return VOCAB * d + spec.seq_len * d + spec.n_layer * (12 * d * d + 13 * d) + 2 * d


def host_memory_estimate(config, procs: int = 1) -> dict:
    """Bytes a CPU run of ``procs`` processes needs at the least, counted before any work.

    Per process: fp32 weights, gradients and DDP's gradient buckets (4 B each per parameter), the
    optimizer's state (AdamW 8 B, SGD's momentum 4 B), autocast's 16-bit weight copies; and the
    activations kept for backward, from the hand count per block (``block_bytes_formula``) (16-bit values under
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


def check_host_memory(config, caps: Capabilities = None) -> None:
    """Refuse a CPU run whose estimate exceeds the memory available, in one line with both numbers.
    GPUs keep their own out-of-memory path (memory_budget_gb, oom_message). ``caps``: the run's
    capabilities (default: those of the device ``config`` asks for)."""
    if (caps if caps is not None else capabilities(config.device)).kind != "cpu":
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


def oom_message(config, error: str, updates_done: int) -> str:
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
