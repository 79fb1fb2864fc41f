"""Chapter 10's arithmetic (pure: no torch, no device): the pipeline bubble, the collectives a tensor-parallel
block makes, a DP x TP x PP layout's model-state bytes, the pipeline schedules as action lists, and the shapes
of well-known models (read from shapes.json; parameter counts computed, never typed).

    bubble_fraction(4, 8)                    # 3/11: the idle share of a GPipe/1F1B step, p=4, m=8
    one_f_one_b_schedule(2, 4)               # stage 0: F0, then F1 B0 F2 B1 F3 B2, then B3
    replay(gpipe_schedule(2, 4), [1, 1], [2, 2])["bubble"]   # 1/5 = (p-1)/(m+p-1)
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from ...base.runtime import ConfigError
from ...base.paths import read_json
from ...engine.config import PRESETS, ModelSpec, _bool, _choice, real, whole
from ...engine.model import VOCAB
from ...whatif.devices import DEFAULTS, catalogue
from ...whatif.layouts import activation_bytes_estimate, state_bytes_per_gpu
from ...whatif.roofline import LINKS, Link, ring_allreduce_s, ring_bytes_sent
# moved down to whatif.layouts (chapter 12 uses them too); chapter 10 keeps every name
from ...whatif.layouts import BUBBLE_DEFINITIONS, GB, bubble_fraction, gpu_spec  # noqa: F401

# a TP block's q, k, v: "per_head", one fused qkv weight permuted so each rank holds whole heads' q, k and v;
# "separate", three column-parallel layers
QKV_LAYOUTS = ("per_head", "separate")
# gpipe: all forwards, then all backwards; 1f1b: min(p - stage - 1, m) warm-up forwards, then one forward one
# backward, then the last backwards
SCHEDULES = ("gpipe", "1f1b")


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


# ---- FSDP2's unit structure: its collectives, their bytes, its padding -----------------------------------

def ring_bytes_per_rank(buffer_bytes: float, world_size: int) -> float:
    """Bytes one rank sends (and receives) for an AllGather or ReduceScatter of a ``buffer_bytes`` buffer on
    a ring of ``world_size`` ranks: every shard but its own passes through it once, (n - 1) / n of the buffer."""
    n = whole("world_size", world_size)
    real("buffer_bytes", buffer_bytes, allowed="bytes >= 0")
    return ring_bytes_sent(buffer_bytes, n) / 2  # half a ring AllReduce: its ReduceScatter or its AllGather


def expected_calls(n_blocks: int, reshard_after_forward: bool = True, micro_batches: int = 1,
                   sync_every_micro_batch: bool = True, world_size: int = 2,
                   root_reshard_after_forward: bool = False) -> dict:
    """FSDP2's collectives per optimizer update of a model sharded block by block plus the root (L + 1 units): each
    unit gathers once for its forward, every block again for its backward with ``reshard_after_forward``, the
    root again only if it too was resharded (``fully_shard``'s default, torch 2.9 to 2.14.1: True for a
    block, False for the root: 2L + 1 per step). Each unit reduce-scatters once per synced backward. World
    size 1: none."""
    L, k = whole("n_blocks", n_blocks), whole("micro_batches", micro_batches)
    whole("world_size", world_size)
    per_pass = (L + 1) + (L if reshard_after_forward else 0) + (1 if root_reshard_after_forward else 0)
    synced = k if sync_every_micro_batch else 1
    if world_size == 1:
        return {"allgather": 0, "reducescatter": 0}
    return {"allgather": k * per_pass, "reducescatter": synced * (L + 1)}


def padded_numel(shape, world_size) -> int:
    """FSDP2 pads dim 0 up to a multiple of the world size (its ``_get_dim0_padded_size``)."""
    if not len(shape):
        return world_size
    return -(-shape[0] // world_size) * world_size * math.prod(shape[1:])


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


# ---- why TP stays inside a node: predicted ------------------------------------------------------------

GPT3_175B = ModelSpec(96, 12288, 96, 2048, "GPT-3 175B's shape (Brown et al. 2020, Table 2.1): 96 layers, "
                      "d_model 12288, 96 heads, context 2048")


def _pcie_link():
    """PCIe Gen5 x16 per direction, from the catalogue's H100 PCIe note (128 GB/s both directions)."""
    note = catalogue()["devices"]["h100-pcie"]["interconnect_gbps"]["note"]
    both = float(note.split("PCIe Gen5: ")[1].split(" GB/s")[0])
    return Link("PCIe Gen5 x16", both / 2 * 1e9, LINKS["infiniband"].latency, "from devices.json (h100-pcie)")


def block_train_flops(micro_batch: int, seq_len: int, d_model: int, attention: bool = True) -> float:
    """FLOPs of one transformer block's training step (forward + backward) for one micro-batch, unsplit.
    The matmuls: 12 d^2 weights (qkv 3d^2, proj d^2, fc 4d^2, out 4d^2), 2 FLOPs (multiply and add) per
    weight per token forward, backward twice forward: 6 x 12 d^2 per token. ``attention``: plus the
    scores QK^T and their product with V, 2 x 2 T d FLOPs per token forward, over the full T x T (the
    causal mask's skipped half counted, as in Narayanan et al. 2021, sec. 5.1: 72 b T d^2 + 12 b T^2 d)."""
    b, t, d = whole("micro_batch", micro_batch), whole("seq_len", seq_len), whole("d_model", d_model)
    matmuls = 6 * 12 * d * d * b * t  # 6 FLOPs per weight per token: 2 forward, 4 backward
    return float(matmuls + (3 * 4 * t * d * b * t if attention else 0))


def link_verdict(ratio: float) -> str:
    """What a TP block's AllReduces add to its matmul time (their ratio, no overlap): "small" (under 15 %),
    "sizeable" (under half), "large" (under the matmuls themselves) or "longer" (longer than the compute: overlap
    cannot hide it all)."""
    return "small" if ratio < 0.15 else "sizeable" if ratio < 0.5 else "large" if ratio < 1 else "longer"


def tp_link_rows(spec: ModelSpec = GPT3_175B, micro_batch: int = 1, tp_sizes=(2, 4, 8), device: str = "h100-sxm",
                 dtype_bytes: int = 2) -> tuple:
    """Predicted: per GPU and per block, the seconds of a TP block's 4 AllReduces (2 forward, 2 backward; ring
    model) over each interconnect against the seconds of the same block's matmuls split ``tp`` ways
    (``block_train_flops``, attention included / the catalogue's bf16 peak x the what-if model's achievable
    matmul fraction). No overlap assumed: the ratio is what the AllReduces add to the step. Returns (rows,
    facts): a row per (tp, link) with its ``verdict`` (``link_verdict``); the facts the rows share (the shape, the
    device, its peak and the fraction reached, the bytes of one AllReduce, the calls per block, the block's
    FLOPs, and ``nvlink_only``: True when at the largest tp NVLink is the only link whose AllReduces take less
    than the matmuls)."""
    if not hasattr(spec, "d_model"):
        raise ConfigError("spec", spec, "a model shape such as lk.PRESETS['base'] or par.GPT3_175B")
    whole("micro_batch", micro_batch)
    dev = catalogue()["devices"].get(device)
    if dev is None:
        _choice("device", device, list(catalogue()["devices"]))
    peak = dev["peak_tflops"]["bf16"]["value"]
    if peak is None:
        raise ConfigError("device", device, "a GPU with bf16 units")
    fraction = DEFAULTS[dev["vendor"]]["matmul_fraction"]
    b, t, d = micro_batch, spec.seq_len, spec.d_model
    flops = block_train_flops(b, t, d)  # 72 b T d^2 + 12 b T^2 d: matmuls and attention
    nbytes = tp_allreduce_bytes(b, t, d, dtype_bytes)
    calls = sum(v for k, v in tp_collectives_per_block().items() if k != "collective")
    links = {"nvlink": LINKS["nvlink"], "pcie": _pcie_link(), "infiniband": LINKS["infiniband"]}
    rows = []
    for tp in tp_sizes:
        whole("tp", tp, 2)
        compute = flops / tp / (peak * 1e12 * fraction)
        for key, link in links.items():
            comm = calls * ring_allreduce_s(nbytes, tp, link.bandwidth, link.latency)
            rows.append({"tp": tp, "link": link.name, "key": key, "compute_s": compute, "comm_s": comm,
                         "bytes_sent": calls * ring_bytes_sent(nbytes, tp), "ratio": comm / compute,
                         "verdict": link_verdict(comm / compute), "label": "predicted"})
    top = {r["key"]: r for r in rows if r["tp"] == max(tp_sizes)}
    facts = {"shape": spec.note.split(":")[0], "micro_batch": b, "device": dev["name"], "peak_tflops": peak,
             "fraction": fraction, "allreduce_bytes": nbytes, "calls": calls, "block_tflop": flops / 1e12,
             "top_tp": max(tp_sizes),
             "nvlink_only": top["nvlink"]["ratio"] < 1 and all(top[k]["ratio"] > 1 for k in top if k != "nvlink")}
    return rows, facts


# ---- context parallelism: ring attention over cp ranks, each holding T/cp of the sequence (predicted) -------
# K and V blocks travel round the ring while each rank computes attention on the block it holds. Every figure
# is per GPU: with TP inside the node each GPU holds 1/tp of the heads, so its K/V bytes, attention FLOPs and
# activations are 1/tp of the layer's. Not every CP is a ring: Llama 3's all-gathers the K and V of the whole
# sequence before attention (Meta, The Llama 3 Herd of Models, 2024) -- exposed, and cheap when K/V is small.

def ring_step_bytes(seq_len: int, cp: int, d_kv: int, dtype_bytes: int = 2, micro_batch: int = 1) -> int:
    """Bytes one rank sends per ring step per layer in the forward pass: its current K and V blocks,
    2 · (T/cp) · d_kv · bytes (· micro-batch). ``d_kv`` = K/V heads × head dim (smaller than d under GQA)."""
    T, cp = whole("seq_len", seq_len), whole("cp", cp)
    if T % cp:
        raise ConfigError("cp", cp, f"a number of ranks that divides seq_len={T}")
    return 2 * (T // cp) * whole("d_kv", d_kv) * whole("dtype_bytes", dtype_bytes) * whole("micro_batch", micro_batch)


def ring_attention_layer(shape, dev: dict, seq_len: int, cp: int, link, micro_batch: int = 1,
                         causal: bool = True, tp: int = 1, grad_dtype_bytes: int = 2) -> dict:
    """One layer's ring attention on one GPU: cp - 1 steps forward and cp - 1 backward. Per step the GPU sends a
    K/V block (backward: K and V plus their gradients dK, dV -- twice the forward bytes with bf16 gradients, the
    assumption here; 3× where dK/dV travel in fp32, ``grad_dtype_bytes=4``) and computes attention between its
    queries and the block it holds: forward 4 · (T/cp)² · d FLOPs (Q Kᵀ and the weighted V), backward twice that;
    causal masking skips about half of it on average (a load-balanced split, e.g. zigzag, evens it across
    ranks). With ``tp`` the GPU holds 1/tp of the heads: bytes and FLOPs both divide by tp. The send hides when it
    takes no longer than the step's compute."""
    s = seq_len // cp
    tp = whole("tp", tp)
    if shape.kv_heads % tp:
        raise ConfigError("tp", tp, f"a TP degree that divides the {shape.kv_heads} K/V heads")
    fwd_bytes = ring_step_bytes(seq_len, cp, shape.d_kv, 2, micro_batch) // tp
    bwd_bytes = fwd_bytes * (4 + 2 * whole("grad_dtype_bytes", grad_dtype_bytes)) // 4   # K, V bf16 + dK, dV
    flops_fwd = 4 * s * s * shape.d_model * micro_batch * (0.5 if causal else 1.0) / tp
    rate = dev["peak"]["bf16"] * dev["fractions"]["attention_fraction"]
    steps = cp - 1
    comm_fwd, comp_fwd = fwd_bytes / link.bandwidth + link.latency, flops_fwd / rate
    comm_bwd, comp_bwd = bwd_bytes / link.bandwidth + link.latency, 2 * flops_fwd / rate
    exposed = steps * (max(0.0, comm_fwd - comp_fwd) + max(0.0, comm_bwd - comp_bwd))
    return {"cp": cp, "tp": tp, "tokens_per_rank": s, "step_bytes_fwd": fwd_bytes, "step_bytes_bwd": bwd_bytes,
            "steps": steps, "comm_step_s": comm_fwd, "compute_step_s": comp_fwd, "hidden": comm_fwd <= comp_fwd and
            comm_bwd <= comp_bwd, "exposed_s": exposed, "label": "predicted"}


def hide_threshold_tokens(model, gpu: str, interconnect: str = "infiniband") -> float:
    """Tokens per rank above which a forward ring step's send hides behind its (causal) compute:
    4 · s · d_kv / bandwidth = 2 · s² · d / rate  ->  s = 2 · d_kv · rate / (d · bandwidth). The same with tp (both
    sides divide by it). It scales with ``rate``, the attention efficiency the what-if model assumes
    (``attention_fraction`` of the bf16 peak) at every block size: a faster kernel raises the threshold, and the
    real efficiency at blocks of a thousand or so tokens is not known here."""
    shape, dev = model_shape(model), gpu_spec(gpu)
    if interconnect not in LINKS:
        raise ConfigError("interconnect", interconnect, "one of " + ", ".join(LINKS))
    rate = dev["peak"]["bf16"] * dev["fractions"]["attention_fraction"]
    return 2 * shape.d_kv * rate / (shape.d_model * LINKS[interconnect].bandwidth)


def context_rows(model, gpu: str, seq_len: int, cps=(1, 2, 4, 8, 16, 32), interconnect: str = "infiniband",
                 micro_batch: int = 1, tp: int = 1, grad_dtype_bytes: int = 2) -> list:
    """One row per cp, every column per GPU: ring bytes and times per layer (1/tp of the heads), whether the send
    hides, and the activation bytes (per layer, /cp: each rank holds T/cp tokens; /tp with sequence parallelism).
    The ring runs over the inter-node link (a CP group of 8 TP-sharded nodes: the conservative case)."""
    shape, dev = model_shape(model), gpu_spec(gpu)
    if interconnect not in LINKS:
        raise ConfigError("interconnect", interconnect, "one of " + ", ".join(LINKS))
    link = LINKS[interconnect]
    act_full = activation_bytes_estimate(1, shape.d_model, shape.n_head, whole("seq_len", seq_len), micro_batch)
    rows = []
    for cp in cps:
        r = ring_attention_layer(shape, dev, seq_len, cp, link, micro_batch, tp=tp,
                                 grad_dtype_bytes=grad_dtype_bytes)
        r["activation_bytes_per_layer"] = act_full / cp / whole("tp", tp)
        rows.append(r)
    return rows


def context_summary(rows: list, model) -> dict:
    """What the rows say (predicted): the largest cp whose send hides (``hidden_up_to``) and the smallest whose
    send is exposed (``exposed_from``), the verdict "hides" (every ring hides), "exposed" (none does) or "both",
    the model's K/V width and heads, the backward's bytes over the forward's, and the activation bytes per layer
    at the first and the last cp."""
    shape = model_shape(model)
    ring = [r for r in rows if r["steps"]]
    hidden = [r["cp"] for r in ring if r["hidden"]]
    exposed = [r["cp"] for r in ring if not r["hidden"]]
    return {"hidden_up_to": max(hidden) if hidden else None, "exposed_from": min(exposed) if exposed else None,
            "verdict": "both" if hidden and exposed else "hides" if hidden else "exposed",
            "model": shape.name, "d_kv": shape.d_kv, "kv_heads": shape.kv_heads, "tp": rows[0].get("tp", 1),
            "bwd_over_fwd": ring[0]["step_bytes_bwd"] / ring[0]["step_bytes_fwd"] if ring else 2.0,
            "first_cp": rows[0]["cp"], "last_cp": rows[-1]["cp"],
            "first_act_gb": rows[0]["activation_bytes_per_layer"] / GB,
            "last_act_gb": rows[-1]["activation_bytes_per_layer"] / GB, "label": "predicted"}
