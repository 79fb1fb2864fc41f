"""The Megatron-style split of labkit's GPT block (taught in chapter 10), as a learner writes it at work: the
fused qkv permuted per head (``permute_qkv_per_head``), the two conjugate operators f and g as autograd
Functions around one counting ``all_reduce``, ``TPBlock`` (MLP column-then-row, attention by heads), and
the same plan with ``torch.distributed.tensor.parallel`` (``LocalAttention``, ``dtensor_block``).
``tensor.tp_demo`` runs them on real processes."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...engine.config import whole
from ...base.errors import ConfigError

# ---- the fused qkv, per head ----------------------------------------------------------------------------

class QKVPerHead(NamedTuple):
    """The fused qkv weight and bias with rows reordered (``weight = original[order]``) so that rank r's
    contiguous 1/world_size slice holds whole heads' q, k and v; ``original = weight[inverse]`` (and the same
    for a gradient)."""

    weight: torch.Tensor
    bias: torch.Tensor
    order: torch.Tensor
    inverse: torch.Tensor


def _heads_split(n_head, world_size):
    whole("n_head", n_head)
    whole("world_size", world_size)
    if n_head % world_size:
        raise ConfigError("world_size", world_size, f"a divisor of the model's {n_head} heads: each rank "
                          "computes whole heads")


def _check_qkv(weight, bias, n_head, world_size):
    """A ConfigError for a fused qkv that cannot be split by heads over ``world_size`` ranks."""
    if not torch.is_tensor(weight) or weight.dim() != 2 or weight.shape[0] != 3 * weight.shape[1]:
        raise ConfigError("weight", getattr(weight, "shape", type(weight).__name__),
                          "a fused qkv weight of shape (3 d, d), e.g. block.attn.qkv.weight")
    d = weight.shape[1]
    if bias is not None and (not torch.is_tensor(bias) or tuple(bias.shape) != (3 * d,)):
        raise ConfigError("bias", getattr(bias, "shape", type(bias).__name__), f"None or a ({3 * d},) tensor")
    _heads_split(n_head, world_size)
    if d % n_head:
        raise ConfigError("n_head", n_head, f"a divisor of the width {d}")


def permute_qkv_per_head(weight, bias, n_head: int, world_size: int) -> QKVPerHead:
    """Reorder the rows of a fused (3d, d) qkv weight (and its (3d,) bias), [q | k | v], each of
    q, k, v split into ``n_head`` heads, so that rank r's slice ``r * 3d/world_size ...`` is
    [q | k | v] of heads r*h .. (r+1)*h - 1 (h = n_head/world_size).
    Returns ``QKVPerHead(weight, bias, order, inverse)``. Shown in 10_when_the_model_does_not_fit (code-10-tp-qkv)."""
    _check_qkv(weight, bias, n_head, world_size)  # ConfigError where heads cannot split evenly
    d = weight.shape[1]
    local = d // world_size  # one rank's share of q (and of k, and of v): whole heads
    rows = torch.arange(local)
    # rank 0: q rows 0..local-1, k rows d..d+local-1, v rows 2d..2d+local-1; then rank 1's, ...
    order = torch.cat([part * d + r * local + rows for r in range(world_size) for part in range(3)])
    inverse = torch.argsort(order)  # original = permuted[inverse]: how the gradients map back
    bias = None if bias is None else bias.detach()[order]
    return QKVPerHead(weight.detach()[order], bias, order, inverse)


# ---- the plain-PyTorch version (shown in the chapter: code-10-tp) ----------------------------------------

COMM = {"forward": [], "backward": []}  # bytes of every TP AllReduce, by pass: what the demo reads


def all_reduce(t, phase: str):
    """Sum ``t`` over the ranks in place -- every TP AllReduce goes through here, and is noted.
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""
    COMM[phase].append(t.numel() * t.element_size())
    dist.all_reduce(t)
    return t


class CopyToTP(torch.autograd.Function):
    """f, before a column-parallel layer: forward the identity (every rank has the whole input);
    backward sum the input's gradient (each rank's columns gave only their share of it).
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), "backward")


class ReduceFromTP(torch.autograd.Function):
    """g, after a row-parallel layer: forward sum the ranks' partial outputs; backward identity.
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    @staticmethod
    def forward(ctx, x):
        return all_reduce(x.clone(), "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad


def _part(t, dim, rank, world_size):
    return nn.Parameter(t.detach().chunk(world_size, dim=dim)[rank].clone())


class TPBlock(nn.Module):
    """One labkit ``Block`` as rank ``rank`` of ``world_size`` holds it (dropout 0): qkv and fc
    column-split, proj and out row-split, the LayerNorms and the row layers' biases replicated.
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    def __init__(self, block, rank: int, world_size: int):
        super().__init__()
        attn, n = block.attn, world_size
        self.ln1, self.ln2 = block.ln1, block.ln2  # replicated: each rank normalises all of x
        self.heads = attn.n_head // n  # this rank's heads
        qkv = permute_qkv_per_head(attn.qkv.weight, attn.qkv.bias, attn.n_head, n)
        self.qkv_w, self.qkv_b = _part(qkv.weight, 0, rank, n), _part(qkv.bias, 0, rank, n)
        self.proj_w, self.proj_b = _part(attn.proj.weight, 1, rank, n), attn.proj.bias
        self.fc_w, self.fc_b = _part(block.fc.weight, 0, rank, n), _part(block.fc.bias, 0, rank, n)
        self.out_w, self.out_b = _part(block.out.weight, 1, rank, n), block.out.bias

    def attention(self, x):
        B, T, _ = x.shape
        qkv = F.linear(CopyToTP.apply(x), self.qkv_w, self.qkv_b)  # column-parallel: my heads
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return ReduceFromTP.apply(F.linear(y, self.proj_w)) + self.proj_b  # bias once, after sum

    def mlp(self, x):
        h = F.gelu(F.linear(CopyToTP.apply(x), self.fc_w, self.fc_b))  # my 4d/n hidden units
        return ReduceFromTP.apply(F.linear(h, self.out_w)) + self.out_b  # partial sums, summed

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TPBlockSeparateQKV(TPBlock):
    """The same block as if q, k and v were three layers, each column-parallel with its own f:
    three AllReduces of the input's gradient in backward instead of one (4 per block, not 2).
    With one f before all three (as Megatron's fused linear_qkv) it would stay 2.
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    def attention(self, x):
        B, T, _ = x.shape
        w, b = self.qkv_w.chunk(3), self.qkv_b.chunk(3)  # this rank's q, k and v rows: three layers
        q, k, v = (F.linear(CopyToTP.apply(x), w[i], b[i])  # an f each: 3 AllReduces in backward
                   .view(B, T, self.heads, -1).transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return ReduceFromTP.apply(F.linear(y, self.proj_w)) + self.proj_b


def tp_shard_names():
    """How each TPBlock parameter maps to the full block's: (TP name, full name, split dim or None)."""
    return [("qkv_w", "attn.qkv.weight", 0), ("qkv_b", "attn.qkv.bias", 0), ("proj_w", "attn.proj.weight", 1),
            ("proj_b", "attn.proj.bias", None), ("fc_w", "fc.weight", 0), ("fc_b", "fc.bias", 0),
            ("out_w", "out.weight", 1), ("out_b", "out.bias", None), ("ln1.weight", "ln1.weight", None),
            ("ln1.bias", "ln1.bias", None), ("ln2.weight", "ln2.weight", None), ("ln2.bias", "ln2.bias", None)]


# ---- the same with torch.distributed.tensor.parallel ------------------------------------------------------

class LocalAttention(nn.Module):
    """labkit's Attention as a tensor-parallel rank runs it: it splits the width its qkv gives it
    (its own heads' q, k, v) into three, where labkit's ``Attention.forward`` splits by the
    model's full width C.

    Why the unchanged Attention fails under ``ColwiseParallel`` on ``attn.qkv``: the local qkv
    output is 3C/world_size wide, and ``split(C, dim=2)`` cuts it into pieces of C -- at world
    size 2 into two (C and C/2), so ``q, k, v = ...`` raises "ValueError: not enough values to
    unpack (expected 3, got 2)" (torch 2.13 and 2.14.1; the demo reports what this torch does).
    Were it to unpack, rank 0 would hold all of q and half of k. The per-head permutation plus this
    forward fix both. Shown in 10_when_the_model_does_not_fit (code-10-tp-dtensor)."""

    def __init__(self, attn, world_size: int):
        super().__init__()
        self.qkv, self.proj, self.heads = attn.qkv, attn.proj, attn.n_head // world_size

    def forward(self, x):
        B, T, _ = x.shape
        qkv = self.qkv(x)  # a local tensor: this rank's heads' q, k and v
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


def dtensor_block(block, mesh):
    """Parallelise one labkit Block in place with ``torch.distributed.tensor.parallel`` over
    ``mesh`` (a 1-D DeviceMesh): the per-head qkv permutation, then Megatron's plan.
    Shown in 10_when_the_model_does_not_fit (code-10-tp-dtensor)."""
    from torch.distributed.tensor.parallel import (  # deferred: a second to import
        ColwiseParallel, RowwiseParallel, parallelize_module)

    ws, attn = mesh.size(), block.attn
    qkv = permute_qkv_per_head(attn.qkv.weight, attn.qkv.bias, attn.n_head, ws)
    with torch.no_grad():  # per-head order: ColwiseParallel's row chunks are whole heads
        attn.qkv.weight.copy_(qkv.weight)
        attn.qkv.bias.copy_(qkv.bias)
    block.attn = LocalAttention(attn, ws)
    plan = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),  # heads; 1 AllReduce
            "fc": ColwiseParallel(), "out": RowwiseParallel()}  # 4d hidden units; 1 AllReduce
    return parallelize_module(block, mesh, plan)
