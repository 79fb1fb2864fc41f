"""Layout formulas from shapes and datasheets alone (no device, no trace), for chapters 09, 10 and
12: the model state per GPU under ZeRO and offload, a transformer's activations, the pipeline
bubble, a GPU's catalogue figures in SI units, and a (dp, tp) mesh of labkit's GPT -- FSDP2 over
tensor parallelism: its groups, the state each rank holds, the collectives of one step and what
loss-parallel saves (chapter 12's 2-D lab, ``ch12_compose/twod.py``, measures each beside these).

    gpu_spec("h100-sxm")["usable"]                          # bytes a layout may fill on one GPU
    bubble_fraction(4, 8)                                   # 3/11: a 1F1B step's idle share
    expected_memory(PRESETS["tiny"], dp=2, tp=2)["total"]   # bytes of model state, largest rank
"""
from __future__ import annotations

import difflib
import math
from collections import Counter

import torch

from ..base.runtime import ConfigError
from ..engine.config import _bool, _choice, real, whole
from ..engine.model import GPT, VOCAB
from ..engine.gpus import value as _value
from .devices import DEFAULTS, _catalogue_device, catalogue
from .roofline import Link

GB = 1e9

# the bubble's two definitions (chapter 10's markdown words them): "step", idle time over the whole step,
# (p - 1) / (m + p - 1); "ideal", idle time over the bubble-free time, Megatron-LM's paper's, (p - 1) / m
BUBBLE_DEFINITIONS = ("step", "ideal")


def bubble_fraction(p: int, m: int, relative_to: str = "step") -> float:
    """The pipeline bubble of GPipe or 1F1B with ``p`` stages and ``m`` micro-batches of equal cost:
    "step", (p - 1)/(m + p - 1), what a stage's timestamps measure; "ideal", (p - 1)/m (Megatron-LM)."""
    p, m = whole("p", p), whole("m", m)
    _choice("relative_to", relative_to, BUBBLE_DEFINITIONS)
    return (p - 1) / (m + p - 1) if relative_to == "step" else (p - 1) / m


def gpu_spec(gpu: str) -> dict:
    """The catalogue's figures of one GPU in SI units, with the what-if model's achievable fractions."""
    devs = catalogue()["devices"]
    if not isinstance(gpu, str) or gpu not in devs:
        close = difflib.get_close_matches(gpu, list(devs), n=1) if isinstance(gpu, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError("gpu", gpu, hint + "a GPU of the what-if catalogue: " + ", ".join(devs))
    d, fp8 = _catalogue_device(gpu), _value(devs[gpu].get("fp8_peak_tflops") or {})
    memory = d["memory_bytes"]
    peak = {p: v or 0.0 for p, v in d["peak_flops"].items()}
    return {"key": gpu, "name": d["name"], "peak": peak,
            "fp8_peak": fp8 * 1e12 if fp8 else None, "memory": memory,
            "usable": memory * DEFAULTS["usable_memory_fraction"], "bandwidth": d["bandwidth"],
            "link": Link(f"{d['name']} in-node link", d["link_bandwidth"], d["link_latency_s"]),
            "fractions": d["fractions"]}


# ---- bytes per parameter -----------------------------------------------------------------------
# Mixed-precision training (the ZeRO paper's accounting): 16-bit weights and gradients on the
# device, plus what the optimizer keeps in fp32 -- a master copy of the weights and its moments.
WEIGHT_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = {
    "adam": 12,       # fp32 master weights 4 + first moment 4 + second moment 4
    "adam8bit": 6,    # fp32 master weights 4 + 8-bit moments 1 + 1 (block scales are negligible)
    "sgd": 8,         # fp32 master weights 4 + momentum 4
}


def state_bytes_per_gpu(n_params: float, n_gpus: int = 1, stage: int = 0, optimizer: str = "adam",
                        offload_optimizer: bool = False, offload_params: bool = False) -> dict:
    """Bytes of model state (weights, gradients, optimizer) on each GPU under ZeRO ``stage`` 0-3: 0
    is plain DDP, 1 shards the optimizer states over the ``n_gpus`` ranks, 2 the gradients too, 3
    (FSDP's FULL_SHARD) the weights too. Offloading moves the optimizer states (with
    ``offload_params`` also the weights and gradients) to CPU memory (``cpu``). Activations and
    FSDP's gathered layer come on top."""
    N = real("n_params", n_params, strict=True)
    G = whole("n_gpus", n_gpus)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError("stage", stage, "a ZeRO stage: 0 (none), 1, 2 or 3")
    _choice("optimizer", optimizer, OPTIMIZER_BYTES)
    _bool("offload_optimizer", offload_optimizer)
    _bool("offload_params", offload_params)
    params = WEIGHT_BYTES * N / (G if stage >= 3 else 1)
    grads = GRAD_BYTES * N / (G if stage >= 2 else 1)
    optim = OPTIMIZER_BYTES[optimizer] * N / (G if stage >= 1 else 1)
    cpu = 0.0
    if offload_optimizer or offload_params:
        cpu += optim
        optim = 0.0
    if offload_params:
        cpu += params + grads
        params = grads = 0.0
    return {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim, "cpu": cpu}


def activation_bytes_estimate(n_layer: int, d_model: int, n_head: int, seq_len: int, micro_batch: int,
                              checkpointing: str = "none", flash: bool = True) -> float:
    """Activation bytes of a 16-bit transformer, from Korthikanti et al. 2022 (Reducing Activation
    Recomputation in Large Transformer Models): per layer s·b·h·(34 + 5·a·s/h) bytes without
    recomputation; the 5·a·s/h term (the s×s attention scores) is gone with a fused (flash) kernel;
    with full checkpointing only each layer's input (2·s·b·h bytes) is kept."""
    s, b, h, a = (whole(k, v) for k, v in (("seq_len", seq_len), ("micro_batch", micro_batch),
                                               ("d_model", d_model), ("n_head", n_head)))
    whole("n_layer", n_layer)
    _choice("checkpointing", checkpointing, ("none", "full"))
    _bool("flash", flash)
    if checkpointing == "full":
        return float(n_layer * 2 * s * b * h)
    per_layer = s * b * h * (34 + (0 if flash else 5 * a * s / h))
    return float(n_layer * per_layer)


# ---- a (dp, tp) mesh of labkit's GPT ------------------------------------------------------------

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
