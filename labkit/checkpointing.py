"""Activation checkpointing as small policies: which blocks to wrap, and what to keep inside them.

Checkpointing a block keeps only its input for backward and recomputes the rest during backward:
less memory, more compute.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

# Ops whose outputs the selective policy keeps: the expensive matmuls and attention.
# Everything else (layer norm, GELU, adds, reshapes) is cheap to recompute in backward.
_SAVE_OPS = None


def _save_ops():
    global _SAVE_OPS
    if _SAVE_OPS is None:
        aten = torch.ops.aten
        ops = [aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default]
        for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"):
            if hasattr(aten, name):
                ops.append(getattr(aten, name).default)
        _SAVE_OPS = frozenset(ops)
    return _SAVE_OPS


def _selective_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    if op in _save_ops():
        return CheckpointPolicy.MUST_SAVE  # matmul outputs: costly to recompute, keep them
    return CheckpointPolicy.PREFER_RECOMPUTE  # elementwise ops: cheap, recompute in backward


def _selective_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_policy)


def wrap_fn(mode: str, every: int, index: int):
    """A function ``f(block, x)`` that runs block ``index`` under the chosen policy."""
    if mode == "full" and index % every == 0:
        # use_reentrant=False: the recommended implementation (works with DDP, autocast, kwargs)
        return lambda block, x: checkpoint(block, x, use_reentrant=False)
    if mode == "selective":
        return lambda block, x: checkpoint(block, x, use_reentrant=False, context_fn=_selective_context)
    return None


def describe(mode: str, every: int, n_layer: int) -> str:
    if mode == "none":
        return "no checkpointing: every block keeps its activations for backward"
    if mode == "full":
        k = sum(1 for i in range(n_layer) if i % every == 0)
        return f"full checkpointing of {k} of {n_layer} blocks (every {every}): only block inputs are kept"
    return "selective: matmul and attention outputs kept, element-wise ops recomputed in backward"
