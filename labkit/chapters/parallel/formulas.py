"""The arithmetic of chapter 10 (when the model does not fit), in one place: the pipeline bubble, the
collectives a tensor-parallel block makes, and the model-state bytes of a DP x TP x PP layout. Pure
(no torch, no device); the chapter's measurements are set against these, and its checkers use them.

    bubble_fraction(4, 8)                    # 3/11: the idle share of a GPipe/1F1B step, p=4, m=8
    bubble_fraction(4, 8, relative_to="ideal")   # 3/8: Megatron-LM's (p - 1)/m
    tp_collectives_per_block()               # {'forward': 2, 'backward': 2}: AllReduce calls, per-head qkv
    layout_state_bytes(7e9, dp=8, tp=8, pp=2, zero_stage=1)
"""
from __future__ import annotations

from ...engine.config import real, whole
from ...whatif.memory import state_bytes_per_gpu
from ...base.errors import ConfigError
from ...engine.config import _bool, _choice

# the bubble's two definitions (chapter 10's markdown words them): "step", idle time over the whole step,
# (p - 1) / (m + p - 1); "ideal", idle time over the bubble-free time, Megatron-LM's paper's, (p - 1) / m
BUBBLE_DEFINITIONS = ("step", "ideal")
# a TP block's q, k, v: "per_head", one fused qkv weight permuted so each rank holds whole heads' q, k and v;
# "separate", three column-parallel layers
QKV_LAYOUTS = ("per_head", "separate")


def bubble_fraction(p: int, m: int, relative_to: str = "step") -> float:
    """The pipeline bubble of GPipe or 1F1B with ``p`` stages and ``m`` micro-batches of equal cost.
    ``relative_to="step"``: the idle share of each stage's step, (p - 1)/(m + p - 1) -- what a stage's
    timestamps measure. ``"ideal"``: idle time over the bubble-free time, (p - 1)/m (Megatron-LM)."""
    p, m = whole("p", p), whole("m", m)
    _choice("relative_to", relative_to, BUBBLE_DEFINITIONS)
    return (p - 1) / (m + p - 1) if relative_to == "step" else (p - 1) / m


def tp_collectives_per_block(qkv: str = "per_head", sequence_parallel: bool = False) -> dict:
    """Collective calls one transformer block makes per micro-batch under Megatron-style tensor parallelism
    (attention split by heads, MLP column-then-row). Without sequence parallelism: AllReduce calls --
    forward, one after each row-parallel layer (attention's output projection, the MLP's second layer);
    backward, one for each column-parallel input's gradient (1 for a fused per-head qkv, 3 for separate
    q, k, v, each with its own f) plus the MLP's first layer.

    ``sequence_parallel=True`` returns the same numbers: the AllReduces that sequence parallelism (Megatron's
    SP, Korthikanti et al. 2022) replaces, each by a ReduceScatter in one pass and an AllGather in the other
    (the same bytes on a ring) -- not a full count of SP's collectives. Per block and micro-batch, fused qkv:
    forward 2 AllGathers (the sequence-sharded input of qkv and of fc) and 2 ReduceScatters (after proj and
    out); backward 2 AllGathers (the output gradients of proj and out) and 2 ReduceScatters (the input
    gradients of qkv and fc). On top: Megatron saves only the sharded input of a column-parallel layer and
    AllGathers it AGAIN in backward for the weight gradient (2 more AllGathers per block), unless the gathered
    input is kept; and with SP each rank holds only its own tokens, so the gradients of the LayerNorms and of
    the row-parallel layers' biases (added after the ReduceScatter) are partial sums and need an AllReduce
    over the TP group (Megatron: once per optimizer step, over the accumulated gradients). Without SP those
    gradients are already the same on every rank."""
    _choice("qkv", qkv, QKV_LAYOUTS)
    _bool("sequence_parallel", sequence_parallel)
    backward = 2 if qkv == "per_head" else 4
    return {"forward": 2, "backward": backward, "collective": "allgather+reducescatter" if sequence_parallel
            else "allreduce"}


def tp_allreduce_bytes(micro_batch: int, seq_len: int, d_model: int, dtype_bytes: int = 2) -> int:
    """Bytes of the activation one tensor-parallel AllReduce sums: a (micro_batch, seq_len, d_model) tensor."""
    return whole("micro_batch", micro_batch) * whole("seq_len", seq_len) * whole("d_model", d_model) * \
        whole("dtype_bytes", dtype_bytes)


def layout_state_bytes(n_params: float, dp: int = 1, tp: int = 1, pp: int = 1, zero_stage: int = 0,
                       optimizer: str = "adam") -> dict:
    """Model-state bytes per GPU (mixed-precision training: 16-bit weights and gradients, the optimizer's
    fp32 state) of a DP x TP x PP layout: TP and PP split the parameters (each GPU holds 1/(tp*pp) of them,
    embeddings split evenly too -- an approximation), then ZeRO ``zero_stage`` shards that over ``dp``.
    Activations come on top."""
    n = real("n_params", n_params, strict=True)
    dp, tp, pp = whole("dp", dp), whole("tp", tp), whole("pp", pp)
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise ConfigError("zero_stage", zero_stage, "a ZeRO stage: 0 (none), 1, 2 or 3")
    return state_bytes_per_gpu(n / (tp * pp), dp, zero_stage, optimizer)
