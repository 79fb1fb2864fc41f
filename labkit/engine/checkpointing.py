"""Activation checkpointing as small policies: which blocks to wrap, and what to keep inside them.

Checkpointing a block keeps only its input for backward and recomputes the rest during backward:
less memory, more compute. The modes (``Config.checkpointing``):

- ``full``: whole blocks (every ``checkpoint_every``-th one) keep only their input;
- ``selective``: PyTorch's selective activation checkpointing (SAC) with a policy that keeps matmul
  outputs and recomputes the cheap element-wise ops, in every block;
- ``attention``: Megatron-style *selective recomputation* (Korthikanti et al., 2022): only the attention
  core -- q·kᵀ, mask, softmax, dropout, ×v, the T×T part -- is recomputed, in every
  ``checkpoint_every``-th block. Two different things share the word "selective": this module keeps
  the names apart.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ..base.compat import need

try:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
except ImportError:  # torch < 2.4: "selective" is refused (rules.py) and _selective_context says why
    CheckpointPolicy = create_selective_checkpoint_contexts = None

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
    """The SAC policy: for each op run inside a checkpointed block, keep its output or recompute it in backward.
    Shown in 04_activation_checkpointing (code-04-wrap-blocks)."""
    if op in _save_ops():
        return CheckpointPolicy.MUST_SAVE  # matmul outputs: costly to recompute, keep them
    return CheckpointPolicy.PREFER_RECOMPUTE  # elementwise ops: cheap, recompute in backward


def _selective_context():
    """The context pair ``checkpoint(..., context_fn=...)`` runs forward and recompute under, so the policy sees
    every op. Shown in 04_activation_checkpointing (code-04-wrap-blocks)."""
    need("selective checkpointing")  # torch >= 2.4: a clear message on an older one
    return create_selective_checkpoint_contexts(_selective_policy)


def wrap_fn(mode: str, every: int, index: int):
    """A function ``f(block, x)`` that runs block ``index`` under the chosen policy, or None to run it plainly
    (also in ``attention`` mode: the block runs plainly and only its attention core is wrapped, see core_wrap_fn).
    The model calls it once per block. Shown in 04_activation_checkpointing (code-04-wrap-blocks)."""
    if mode == "full" and index % every == 0:  # every k-th block: 0, k, 2k, ...; the others keep everything
        # use_reentrant=False: the recommended implementation (works with DDP, autocast, kwargs)
        return lambda block, x: checkpoint(block, x, use_reentrant=False)
    if mode == "selective":  # every block, but inside it the policy keeps the matmul outputs
        return lambda block, x: checkpoint(block, x, use_reentrant=False, context_fn=_selective_context)
    return None


def core_wrap_fn(mode: str, every: int, index: int):
    """A function ``f(core, q, k, v)`` that runs block ``index``'s attention core, or None to run it plainly.

    In ``attention`` mode every k-th block (0, k, 2k, ... as in ``full``) keeps only q, k, v for backward and
    recomputes the core there: under the math backend that drops the T×T scores and probabilities -- most of
    a block's activations at long sequences -- for a few per cent more FLOPs. A fused kernel never stores
    them, so there the mode saves only the kernel's small extras (its log-sum-exp)."""
    if mode == "attention" and index % every == 0:
        return lambda core, q, k, v: checkpoint(core, q, k, v, use_reentrant=False)
    return None
