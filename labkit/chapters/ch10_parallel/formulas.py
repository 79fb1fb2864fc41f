"""Chapter 10's arithmetic (pure: no torch, no device): the pipeline bubble, the collectives a tensor-parallel
block makes, a DP x TP x PP layout's model-state bytes, the pipeline schedules as action lists, and the shapes
of well-known models (read from shapes.json; parameter counts computed, never typed).

    bubble_fraction(4, 8)                    # 3/11: the idle share of a GPipe/1F1B step, p=4, m=8
    one_f_one_b_schedule(2, 4)               # stage 0: F0, then F1 B0 F2 B1 F3 B2, then B3
    replay(gpipe_schedule(2, 4), [1, 1], [2, 2])["bubble"]   # 1/5 = (p-1)/(m+p-1)
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from ..playbook.args import real, whole
from ..playbook.zero import state_bytes_per_gpu
from ...base.errors import ConfigError
from ...base.paths import read_json
from ...engine.config import PRESETS, _bool, _choice
from ...engine.model import VOCAB

# the bubble's two definitions (chapter 10's markdown words them): "step", idle time over the whole step,
# (p - 1) / (m + p - 1); "ideal", idle time over the bubble-free time, Megatron-LM's paper's, (p - 1) / m
BUBBLE_DEFINITIONS = ("step", "ideal")
# a TP block's q, k, v: "per_head", one fused qkv weight permuted so each rank holds whole heads' q, k and v;
# "separate", three column-parallel layers
QKV_LAYOUTS = ("per_head", "separate")
# gpipe: all forwards, then all backwards; 1f1b: min(p - stage - 1, m) warm-up forwards, then one forward one
# backward, then the last backwards
SCHEDULES = ("gpipe", "1f1b")


def bubble_fraction(p: int, m: int, relative_to: str = "step") -> float:
    """The pipeline bubble of GPipe or 1F1B with ``p`` stages and ``m`` micro-batches of equal cost:
    "step", (p - 1)/(m + p - 1), what a stage's timestamps measure; "ideal", (p - 1)/m (Megatron-LM)."""
    p, m = whole("p", p), whole("m", m)
    _choice("relative_to", relative_to, BUBBLE_DEFINITIONS)
    return (p - 1) / (m + p - 1) if relative_to == "step" else (p - 1) / m


def tp_collectives_per_block(qkv: str = "per_head", sequence_parallel: bool = False) -> dict:
    """Collective calls one transformer block makes per micro-batch under Megatron-style tensor parallelism
    (attention split by heads, MLP column-then-row). Forward: one AllReduce after each row-parallel layer
    (proj, out); backward: one for each column-parallel input's gradient (1 for a fused per-head qkv, 3 for
    separate q, k, v, each with its own f) plus the MLP's first layer.

    ``sequence_parallel=True`` returns the same numbers: each AllReduce that Megatron's SP (Korthikanti et al.
    2022) replaces becomes a ReduceScatter in one pass and an AllGather in the other (the same bytes on a
    ring) -- not a full count of SP's collectives: Megatron also AllGathers a column-parallel layer's sharded
    input AGAIN in backward for its weight gradient (2 more per block), and the LayerNorms' and row-parallel
    biases' gradients are partial sums over the TP group (one AllReduce per optimizer step)."""
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
    """Model-state bytes per GPU (16-bit weights and gradients, the optimizer's fp32 state) of a DP x TP x PP
    layout: TP and PP split the parameters (embeddings split evenly too -- an approximation), then ZeRO
    ``zero_stage`` shards that over ``dp``. Activations come on top."""
    n = real("n_params", n_params, strict=True)
    dp, tp, pp = whole("dp", dp), whole("tp", tp), whole("pp", pp)
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise ConfigError("zero_stage", zero_stage, "a ZeRO stage: 0 (none), 1, 2 or 3")
    return state_bytes_per_gpu(n / (tp * pp), dp, zero_stage, optimizer)


# ---- the schedules: what each stage does, in order ("F", i) / ("B", i) ----------------------------------

def gpipe_schedule(p: int, m: int) -> list:
    """GPipe: every stage runs the forward of all ``m`` micro-batches, then their backwards; each stage keeps
    the activations of all ``m`` until their backward comes.
    Shown in 10_when_the_model_does_not_fit (code-10-schedules)."""
    p, m = whole("p", p), whole("m", m)
    schedule = []
    for stage in range(p):
        forwards = [("F", i) for i in range(m)]   # fill the pipeline: micro-batch i flows down the stages
        backwards = [("B", i) for i in range(m)]  # then drain it: gradients flow back up, in the same order
        schedule.append(forwards + backwards)
    return schedule


def one_f_one_b_schedule(p: int, m: int) -> list:
    """1F1B (PipeDream-Flush, Megatron-LM's default): a stage starts backwards as soon as it can, so it holds
    at most ``min(p - stage, m)`` micro-batches' activations instead of ``m``; the same bubble as GPipe. With
    m < p the warm-up is cut to the m there are, as Megatron-LM does (torch's Schedule1F1B refuses m < p).
    Shown in 10_when_the_model_does_not_fit (code-10-schedules)."""
    p, m = whole("p", p), whole("m", m)
    schedule = []
    for stage in range(p):
        # Warm-up: the last stage can run micro-batch 0's backward right after its forward; every stage
        # before it must first forward the micro-batches that will fill the stages after it.
        warmup = min(p - stage - 1, m)
        actions = [("F", i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:  # steady state: one forward, then the backward of the oldest micro-batch in flight
            actions += [("F", f), ("B", b)]
            f, b = f + 1, b + 1
        actions += [("B", i) for i in range(b, m)]  # cool-down: the backwards still owed
        schedule.append(actions)
    return schedule


def schedule_for(name: str, p: int, m: int) -> list:
    _choice("schedule", name, SCHEDULES)
    return gpipe_schedule(p, m) if name == "gpipe" else one_f_one_b_schedule(p, m)


def in_flight(schedule: list) -> list:
    """Per stage, the most micro-batches forwarded and not yet backwarded at any moment: the activations it
    holds at its peak (GPipe: m; 1F1B: at most min(p - stage, m))."""
    peaks = []
    for actions in schedule:
        now = peak = 0
        for kind, _ in actions:
            now += 1 if kind == "F" else -1
            peak = max(peak, now)
        peaks.append(peak)
    return peaks


def stage_blocks(n_layer: int, p: int) -> list:
    """Which blocks each stage holds: ``n_layer // p`` each, the rest to the first stages -- the last stage
    also computes the head and the loss, the first only the (cheap) embedding lookups."""
    n_layer, p = whole("n_layer", n_layer), whole("p", p)
    if p > n_layer:
        raise ConfigError("stages", p, f"at most one stage per block: {n_layer} for this model")
    base, extra = divmod(n_layer, p)
    sizes = [base + (1 if s < extra else 0) for s in range(p)]
    starts = [sum(sizes[:s]) for s in range(p)]
    return [range(a, a + n) for a, n in zip(starts, sizes)]


def bubble_from_logs(logs: list) -> dict:
    """One step's numbers from every stage's action log (kind, i, t0, t1, t2), one clock: the step from the
    first start to the last end; per stage busy (compute, t2 - t1), wait (in recv, t1 - t0), idle = step - busy
    and bubble = idle / step; ``bubble`` is their mean over the stages."""
    t_start = min(a[2] for log in logs for a in log)
    t_end = max(a[4] for log in logs for a in log)
    step = t_end - t_start
    stages = []
    for log in logs:
        busy = sum(t2 - t1 for _, _, _, t1, t2 in log)
        stages.append(dict(busy_s=busy, wait_s=sum(t1 - t0 for _, _, t0, t1, _ in log), step_s=step,
                           idle_s=step - busy, bubble=(step - busy) / step))
    actions = [[(k, i, t0 - t_start, t1 - t_start, t2 - t_start) for k, i, t0, t1, t2 in log] for log in logs]
    return dict(step_s=step, bubble=statistics.fmean(s["bubble"] for s in stages), stages=stages, actions=actions)


def replay(schedule: list, forward_s, backward_s) -> dict:
    """The timeline ``schedule`` gives when stage s's forward takes ``forward_s[s]`` and its backward
    ``backward_s[s]`` and nothing else runs or travels: a forward once the previous stage's forward of that
    micro-batch is done, a backward once the next stage's backward is. Equal costs: (p-1)/(m+p-1)."""
    p = len(schedule)
    end, free, pos = {}, [0.0] * p, [0] * p
    while any(pos[s] < len(schedule[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pos[s] == len(schedule[s]):
                continue
            kind, i = schedule[s][pos[s]]
            dep = (s - 1, "F", i) if kind == "F" and s > 0 else (s + 1, "B", i) if kind == "B" and s < p - 1 \
                else None
            if dep is not None and dep not in end:
                continue  # its input is not there yet: another stage must move first
            start = max(free[s], end[dep] if dep is not None else 0.0)
            end[s, kind, i] = free[s] = start + (forward_s[s] if kind == "F" else backward_s[s])
            pos[s], moved = pos[s] + 1, True
        if not moved:
            raise ConfigError("schedule", "a deadlock", "action lists in which every input can arrive")
    step = max(free)
    busy = [sum(forward_s[s] if k == "F" else backward_s[s] for k, _ in schedule[s]) for s in range(p)]
    return dict(step_s=step, stage_bubble=[(step - b) / step for b in busy],
                bubble=statistics.fmean((step - b) / step for b in busy))


# ---- the shapes of well-known decoder-only transformers ---------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape. ``ffn``: the MLP's hidden width (default 4 x d); ``gated``: a SwiGLU
    MLP (3 weight matrices instead of 2); ``n_kv_head``: grouped-query attention's K/V heads (default: all)."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    seq_len: int
    vocab: int = VOCAB
    ffn: int = 0
    n_kv_head: int = 0
    gated: bool = False
    tied: bool = True
    learned_pos: bool = True
    bias: bool = True
    source: str = ""

    @property
    def d_ff(self) -> int:
        return self.ffn or 4 * self.d_model

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def d_kv(self) -> int:
        """Width of K (or V): kv heads x head dim."""
        return self.kv_heads * (self.d_model // self.n_head)

    @property
    def n_params(self) -> int:
        return n_params_of(self)


def _preset(key: str) -> Shape:
    s = PRESETS[key]
    # labkit's own GPT: fused qkv, a GELU MLP of 4 d, the byte embedding tied to the output
    return Shape(f"labkit {key}", s.n_layer, s.d_model, s.n_head, s.seq_len, source="labkit.engine.config.PRESETS")


SHAPES_FILE = Path(__file__).resolve().parent / "shapes.json"  # shipped as package data
MODELS = {**{key: Shape(**fields) for key, fields in read_json(SHAPES_FILE, what="model shapes")["shapes"].items()},
          **{key: _preset(key) for key in PRESETS}}


def n_params_of(shape: Shape) -> int:
    """Parameters from the shape: per block, attention (q and the output d x d each, k and v d x d_kv each) plus
    the MLP (2 or, gated, 3 matrices of d x d_ff), with biases and the two norms' weights; then the token
    embedding (a second copy for an untied output head), learned positions and the final norm."""
    d, f, kv = shape.d_model, shape.d_ff, shape.d_kv
    attn = 2 * d * d + 2 * d * kv + ((d + 2 * kv) + d if shape.bias else 0)
    mlp = (3 if shape.gated else 2) * d * f + ((f + d) if shape.bias and not shape.gated else 0)
    norms = 2 * (2 * d if shape.bias else d)
    per_block = attn + mlp + norms
    embed = shape.vocab * d * (1 if shape.tied else 2) + (shape.seq_len * d if shape.learned_pos else 0)
    return shape.n_layer * per_block + embed + (2 * d if shape.bias else d)


def flops_per_token(shape: Shape, seq_len: int | None = None) -> dict:
    """Training FLOPs per token (forward + backward = 3 x forward): matmuls 6 x the weights a token multiplies
    by (every block's matrices and the head; lookups cost none), attention (Q K^T and the weighted V,
    non-causal as the course's MFU counts it) 12 x layers x T x d."""
    T = seq_len or shape.seq_len
    d, f, kv = shape.d_model, shape.d_ff, shape.d_kv
    matmul_params = shape.n_layer * (2 * d * d + 2 * d * kv + (3 if shape.gated else 2) * d * f) + shape.vocab * d
    mm, attn = 6 * matmul_params, 12 * shape.n_layer * T * d
    return {"matmul": float(mm), "attention": float(attn), "total": float(mm + attn)}


def model_shape(model) -> Shape:
    """A Shape from a key of MODELS (did-you-mean on a typo) or a Shape."""
    if isinstance(model, Shape):
        return model
    _choice("model", model, tuple(MODELS))
    return MODELS[model]
