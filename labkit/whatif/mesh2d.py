"""The arithmetic of a (dp, tp) layout of labkit's GPT -- FSDP2 over tensor parallelism -- from shapes
only: the mesh's groups, the model state each rank holds, the collectives one step makes (by pass, kind
and bytes) and what loss-parallel cross-entropy saves. Chapter 12's 2-D lab (``chapters/ch12_compose/
twod.py``) measures each figure beside these; the checkers may use them too.

    expected_memory(PRESETS["tiny"], dp=2, tp=2)["total"]   # bytes of model state on the largest rank
    block_collectives(2, sequence_parallel=True)          # {'all_reduce': 0, 'all_gather': 8, ...}
"""
from __future__ import annotations

import math
from collections import Counter

import torch

from ..base.runtime import ConfigError
from ..engine.config import whole
from ..engine.model import GPT, VOCAB

FP32 = 4  # bytes per value: the lab trains in fp32
STATE = {"params": 1, "grads": 1, "optimizer": 2}  # copies of each parameter: AdamW has 2 moments

TP_DIM = {"attn.qkv.weight": 0, "attn.qkv.bias": 0, "attn.proj.weight": 1,  # heads
          "fc.weight": 0, "fc.bias": 0, "out.weight": 1}  # hidden units; the rest whole on each
# activation collectives of ONE pass through one block (forward; the backward mirrors it)
PER_BLOCK = {False: {"all_reduce": 2},  # after proj and out (forward); before qkv and fc (backward)
             True: {"all_gather": 2, "reduce_scatter": 2}}  # each AllReduce cut in two


def check_layout(spec, dp: int, tp: int) -> None:
    """ConfigError unless ``dp`` x ``tp`` can lay out ``spec``: TP splits whole heads."""
    whole("dp", dp)
    if spec.n_head % whole("tp", tp) or VOCAB % tp:
        raise ConfigError("tp", tp, f"a divisor of the model's {spec.n_head} heads: each TP rank "
                          "computes whole heads")


def block_collectives(n_layer: int, sequence_parallel: bool) -> dict:
    """Activation collectives of one forward + backward of ``n_layer`` Megatron-TP blocks (one
    micro-batch, no recomputation): {4L, 0, 0} without SP, {0, 4L, 4L} with (the backward of an
    AllGather is a ReduceScatter and vice versa)."""
    per = PER_BLOCK[bool(sequence_parallel)]
    return {k: 2 * whole("n_layer", n_layer) * per.get(k, 0)
            for k in ("all_reduce", "all_gather", "reduce_scatter")}


def mesh_layout(dp: int, tp: int) -> list:
    """What each rank of a (dp, tp) mesh is: ranks fill it row by row, a tp group is consecutive."""
    whole("dp", dp)
    whole("tp", tp)
    return [{"rank": r, "dp": r // tp, "tp": r % tp,
             "dp_group": [i * tp + r % tp for i in range(dp)],
             "tp_group": [r // tp * tp + j for j in range(tp)]} for r in range(dp * tp)]


def _shapes(spec) -> list:
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        return [(n, tuple(p.shape)) for n, p in GPT(spec).named_parameters()]  # tied head once


def _tp_local(name, shape, tp) -> tuple:
    dim = TP_DIM.get(name.split(".", 2)[-1]) if name.startswith("blocks.") else None
    return shape if dim is None else tuple(s // tp if i == dim else s for i, s in enumerate(shape))


def _fsdp_numel(shape, dp) -> int:
    """Numel of the largest FSDP2 shard: rows cut in chunks of ceil(rows / dp)."""
    return math.ceil(shape[0] / dp) * math.prod(shape[1:])


def expected_memory(spec, dp: int, tp: int) -> dict:
    """Model state on the largest rank, bytes: TP-split weights (``TP_DIM``) cut again by FSDP2 over
    dp, the rest by FSDP2 only; fp32 weights and gradients, AdamW's two fp32 moments."""
    check_layout(spec, dp, tp)
    n = sum(_fsdp_numel(_tp_local(name, shape, tp), dp) for name, shape in _shapes(spec))
    out = {part: copies * n * FP32 for part, copies in STATE.items()}
    return {**out, "total": sum(out.values())}


def expected_tp_calls(spec, micro_batch: int, tp: int, sequence_parallel: bool) -> list:
    """TP's collectives of one step by pass, kind and bytes as a rank passes them in (an AllGather
    its shard; a ReduceScatter and an AllReduce the whole): ``blocks`` (``PER_BLOCK``, a (B, T, d)
    activation), ``edges`` (SP: the sequence gathered before the final norm, and the embeddings'
    gradient gathered in backward) and ``grads`` (SP: each LayerNorm's weight and bias gradient is
    a partial sum over the sequence shards; FSDP2's post-backward AllReduces it over tp)."""
    check_layout(spec, 1, tp)
    act = whole("micro_batch", micro_batch) * spec.seq_len * spec.d_model * FP32
    L, sp = spec.n_layer, bool(sequence_parallel)
    rows = [{"phase": p, "kind": k, "bytes": act // tp if k == "all_gather" else act,
             "blocks": n * L, "edges": int(k == "all_gather"), "grads": 0}
            for p in ("forward", "backward") for k, n in PER_BLOCK[sp].items()]
    if sp:  # ln1 and ln2, weight and bias, per block
        rows.append({"phase": "backward", "kind": "all_reduce", "bytes": spec.d_model * FP32,
                     "blocks": 0, "edges": 0, "grads": 4 * L})
    return [{**r, "calls": r["blocks"] + r["edges"] + r["grads"]} for r in rows]


def expected_fsdp_calls(spec, dp: int, tp: int) -> list:
    """FSDP2's collectives of one step over dp: an AllGather per unit before its forward and again
    before a block's backward (the root stays gathered), a ReduceScatter per unit after its
    backward; bytes: the unit's TP-local weights in padded dp shards (gathered; reduced)."""
    check_layout(spec, dp, tp)
    unit = {}
    for name, shape in _shapes(spec):
        key = ".".join(name.split(".")[:2]) if name.startswith("blocks.") else "root"
        unit[key] = unit.get(key, 0) + dp * _fsdp_numel(_tp_local(name, shape, tp), dp) * FP32
    blocks = sorted(set(unit) - {"root"})
    rows = Counter([("forward", "all_gather", unit[u]) for u in ["root"] + blocks]
                   + [("backward", "all_gather", unit[u]) for u in blocks]
                   + [("backward", "reduce_scatter", unit[u]) for u in blocks + ["root"]])
    return [{"phase": p, "kind": k, "bytes": b, "calls": c} for (p, k, b), c in rows.items()]


def expected_loss_parallel(micro_batch: int, seq_len: int, d_model: int, tp: int) -> dict:
    """Per rank: the logits held (every word's, or V/tp) and the collectives {(kind, bytes): calls}.
    Gathered: an AllGather of my V/tp logits. Loss-parallel: softmax's max, its sum and the
    target's logit, a number a token each. Both: the hidden state's gradient, summed over tp."""
    tokens = whole("micro_batch", micro_batch) * whole("seq_len", seq_len)
    if VOCAB % whole("tp", tp):
        raise ConfigError("tp", tp, f"a divisor of the vocabulary ({VOCAB})")
    hidden = ("all_reduce", tokens * whole("d_model", d_model) * FP32)
    return {"gathered_bytes": tokens * VOCAB * FP32, "sharded_bytes": tokens * VOCAB // tp * FP32,
            "calls": {False: {("all_gather", tokens * VOCAB // tp * FP32): 1, hidden: 1},
                      True: {("all_reduce", tokens * FP32): 3, hidden: 1}}}
