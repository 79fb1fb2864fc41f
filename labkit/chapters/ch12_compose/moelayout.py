"""Choosing a DP x TP x PP x EP (x ZeRO) layout for a mixture-of-experts model on a fixed number of
GPUs: chapter 10's chooser with a fifth dimension, expert parallelism. Every step time is **predicted**.

    rows = layouts("deepseek-v3", "h100-sxm", 256)   # every layout that obeys the rules
    choice(rows)                                     # the pick and why, as figures

The convention and the step model (Megatron-Core's "MoE parallel folding", the all-to-alls, the deepest
stage) are the chapter's markdown, in full. Also total against active parameters of any MoE decoder
(``moe_params``: Mixtral 8x7B, the tiny MoE).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ...base.runtime import ConfigError
from ...base.paths import read_json
from ...engine.config import _choice, whole
from ...whatif import roofline_s
from ...whatif.layouts import GB, bubble_fraction, gpu_spec, state_bytes_per_gpu
from ...whatif.roofline import LINKS, ring_allreduce_s

SHAPES_FILE = Path(__file__).resolve().parent / "moe_shapes.json"  # shipped as package data
CHECKPOINTING = ("none", "full")
MAX_ZERO_WITH_PP = 1   # chapter 10's rule: with pp > 1, ZeRO 0 or 1
PARTS = ("compute", "bubble", "tp_comm", "ep_alltoall", "pp_p2p", "dp_comm", "optimizer")
PART_NAMES = {"compute": "compute", "bubble": "the pipeline bubble", "tp_comm": "TP collectives",
              "ep_alltoall": "EP all-to-alls", "pp_p2p": "pipeline sends",
              "dp_comm": "DP gradient traffic", "optimizer": "the optimizer"}
MEMORY_PARTS = ("dense_state", "expert_state", "activations", "gather_bytes")
MEMORY_NAMES = {"dense_state": "dense layers' weights, grads, optimizer", "activations": "activations",
                "expert_state": "experts' weights, grads, optimizer", "gather_bytes": "layers ZeRO-3 gathers"}
TIE = 0.02   # two predicted steps closer than this are a tie: the model's assumptions move more
MAX_GPUS = 1 << 16


@dataclass(frozen=True)
class MoEShape:
    """A decoder-only MoE transformer: SwiGLU MLPs, RMSNorm, no biases. ``attention``: "gqa"
    (n_kv_head K/V heads of head_dim) or "mla" (DeepSeek's latent attention: q_lora_rank,
    kv_lora_rank, qk_rope_head_dim, v_head_dim; head_dim is then q's and k's no-rope part). The
    first ``dense_layers`` have a dense MLP of ``dense_ffn``; the others ``n_experts`` routed
    experts of ``expert_ffn`` (``top_k`` per token) and ``n_shared`` shared ones."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    vocab: int
    n_experts: int
    top_k: int
    expert_ffn: int
    n_shared: int = 0
    dense_layers: int = 0
    dense_ffn: int = 0
    tied: bool = False
    attention: str = "gqa"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0


def _load() -> tuple:
    raw = read_json(SHAPES_FILE, what="mixture-of-experts shapes")["models"]
    return {k: MoEShape(**v["shape"]) for k, v in raw.items()}, raw


MOE_MODELS, _RAW = _load()


def published(model: str) -> dict:
    """A model's published total and active parameters and where its figures come from."""
    _choice("model", model, tuple(MOE_MODELS))
    return {**_RAW[model]["published"], **_RAW[model]["sources"]}


def moe_shape(model) -> MoEShape:
    """A MoEShape from a key of MOE_MODELS (did-you-mean on a typo) or a MoEShape."""
    if isinstance(model, MoEShape):
        return model
    _choice("model", model, tuple(MOE_MODELS))
    return MOE_MODELS[model]


# ---- parameters and FLOPs: total against active --------------------------------------------------

def attention_params(s: MoEShape) -> int:
    """One layer's attention weights and its two norms. GQA: q and the output n_head x head_dim by
    d, k and v n_kv_head x head_dim by d. MLA: q through a rank-q_lora bottleneck, k and v through a
    shared rank-kv_lora latent (plus a rope key), the output from n_head x v_head_dim."""
    d, h = s.d_model, s.n_head
    if s.attention == "gqa":
        return 2 * d * h * s.head_dim + 2 * d * s.n_kv_head * s.head_dim + 2 * d
    qk, r = s.head_dim + s.qk_rope_head_dim, s.q_lora_rank
    q = d * r + r + r * h * qk if r else d * h * qk
    kv = d * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank \
        + s.kv_lora_rank * h * (s.head_dim + s.v_head_dim)
    return q + kv + h * s.v_head_dim * d + 2 * d


def expert_params(s: MoEShape) -> int:
    """One expert: a SwiGLU MLP, gate, up and down, d x expert_ffn each."""
    return 3 * s.d_model * s.expert_ffn


def param_counts(s: MoEShape) -> dict:
    """Parameters from the shape: ``total``; ``active``, what one token multiplies by (attention,
    the dense layers, top_k routed and the shared experts, the router, the embeddings and the head);
    ``routed``, every routed expert (what EP shards); ``dense``, the rest."""
    moe_layers = s.n_layer - s.dense_layers
    embed = s.vocab * s.d_model * (1 if s.tied else 2)
    dense = s.n_layer * attention_params(s) + s.dense_layers * 3 * s.d_model * s.dense_ffn \
        + embed + s.d_model
    dense += moe_layers * (s.n_shared * expert_params(s) + s.n_experts * s.d_model)  # + router
    routed = moe_layers * s.n_experts * expert_params(s)
    active = dense + moe_layers * s.top_k * expert_params(s)
    return {"total": dense + routed, "active": active, "routed": routed, "dense": dense}


def flops_per_token(s: MoEShape, seq_len: int) -> dict:
    """Training FLOPs per token, forward + backward: 6 per active weight a token multiplies by (the
    input embedding is a lookup: none), and attention's scores and weighted values over the full T
    as chapter 10 counts them, 6 x layers x T x heads x (q-k width + v width)."""
    mm = 6 * (param_counts(s)["active"] - (0 if s.tied else s.vocab * s.d_model))
    v = s.v_head_dim or s.head_dim
    attn = 6 * s.n_layer * whole("seq_len", seq_len) * s.n_head * (
        s.head_dim + s.qk_rope_head_dim + v)
    return {"matmul": float(mm), "attention": float(attn), "total": float(mm + attn)}


# Mixtral 8x7B's shape, from Mistral AI's paper "Mixtral of Experts" (Jiang et al., 2024, arXiv:2401.04088,
# Table 1) and its released config: 32 layers, d 4096, 32 query heads and 8 key-value heads of 128, SwiGLU
# experts of 14336, 8 experts, top-2, vocabulary 32000, RMSNorm, rotary positions, untied head.
MIXTRAL_8X7B = dict(n_layer=32, d_model=4096, n_experts=8, top_k=2, d_expert=14336, vocab=32000, kv_dim=1024,
                    gated=True, bias=False, tied=False, positions=0, norm="rms")


def moe_params(n_layer, d_model, n_experts, top_k, d_expert, vocab, kv_dim=None, gated=False, bias=True,
               tied=True, positions=0, norm="layer", attention=True, dtype_bytes=2) -> dict:
    """Total and active (per token) parameters of a decoder whose every MLP is an MoE layer, the weights'
    bytes with every expert held (``dtype_bytes`` each), and training FLOPs per token, 6 x the active matmul
    weights (the course's 6 N rule, N what a token actually multiplies by). ``kv_dim``: the width of k and v
    (grouped-query attention; default d_model); ``gated``: SwiGLU experts (3 matrices, else 2); a norm
    before each sublayer and one at the end; ``attention`` False: MoE blocks only (``TinyMoELM``)."""
    for name, v in (("n_layer", n_layer), ("d_model", d_model), ("d_expert", d_expert), ("vocab", vocab)):
        whole(name, v)
    if whole("top_k", top_k) > whole("n_experts", n_experts):
        raise ConfigError("top_k", top_k, f"at most n_experts = {n_experts}: each token picks distinct experts")
    whole("positions", positions, 0)
    whole("dtype_bytes", dtype_bytes)
    if norm not in ("layer", "rms"):
        raise ConfigError("norm", norm, "'layer' (weight and bias) or 'rms' (weight)")
    d, kv = d_model, whole("kv_dim", kv_dim) if kv_dim is not None else d_model
    attn = (d * (d + 2 * kv) + d * d + (2 * d + 2 * kv if bias else 0)) if attention else 0
    expert = (3 if gated else 2) * d * d_expert + (d_expert + d if bias else 0)
    router, norms = d * n_experts, (2 if norm == "layer" else 1) * d
    embed = vocab * d + positions * d
    head = 0 if tied else vocab * d
    per_layer = attn + n_experts * expert + router + (2 if attention else 1) * norms
    total = n_layer * per_layer + norms + embed + head
    active = total - n_layer * (n_experts - top_k) * expert
    matmul = n_layer * (attn + top_k * expert + router) + vocab * d  # the head (tied or not) is a matmul
    return {"total": total, "active": active, "active_share": active / total, "weights_bytes": total * dtype_bytes,
            "active_bytes": active * dtype_bytes, "flops_per_token": 6 * matmul,
            "dense_flops_per_token": 6 * (matmul + n_layer * (n_experts - top_k) * expert)}


def tiny_shape(model) -> dict:
    """``moe_params``' arguments for a ``moe.TinyMoELM`` (fp32: 4 bytes a weight)."""
    m = model.moes()[0]
    return dict(n_layer=len(model.blocks), d_model=model.wte.embedding_dim, n_experts=m.n_experts, top_k=m.top_k,
                d_expert=m.experts[0].fc.out_features, vocab=model.wte.num_embeddings,
                positions=model.wpe.num_embeddings, attention=False, dtype_bytes=4)


# ---- expert parallelism: the all-to-alls ---------------------------------------------------------

def alltoall_bytes(tokens: int, top_k: int, d_model: int, ep: int, dtype_bytes: int = 2) -> dict:
    """One all-to-all of one rank (dispatch or combine, forward or backward): ``payload``, its
    tokens x top_k copies x d x bytes; ``leaving``, the (ep - 1)/ep of it that goes to other ranks
    when the routing is balanced (the rest stays: this rank holds 1/ep of the experts).
    Shown in 12_composing_the_layout (code-12-moe-layout)."""
    payload = whole("tokens", tokens) * whole("top_k", top_k) * whole("d_model", d_model) \
        * whole("dtype_bytes", dtype_bytes)
    ep = whole("ep", ep)
    return {"payload": payload, "leaving": payload * (ep - 1) / ep}


def alltoall_s(payload: float, ep: int, node_size: int, near, far) -> float:
    """Seconds of one all-to-all: a group of ep consecutive ranks, each sending payload/ep to every
    peer: to the min(ep, node) - 1 in its node over ``near``, to the rest over ``far``, at once.
    Shown in 12_composing_the_layout (code-12-moe-layout)."""
    if ep == 1:
        return 0.0
    in_node = min(ep, node_size) - 1
    out = ep - 1 - in_node
    t_near = payload * in_node / ep / near.bandwidth + near.latency
    t_far = payload * out / ep / far.bandwidth + far.latency if out else 0.0
    return max(t_near, t_far)


# ---- one layout ----------------------------------------------------------------------------------

def stage_layers(s: MoEShape, pp: int) -> dict:
    """The deepest stage's layers, ceil(L/pp), and how many are dense: all the dense layers with
    pp = 1; with pp > 1 none (the few dense layers come first: some stage holds MoE layers only)."""
    n0 = math.ceil(s.n_layer / pp)
    dense = s.dense_layers if pp == 1 else 0
    return {"layers": n0, "dense": dense, "moe": n0 - dense}


def layout_bytes(s: MoEShape, dp, tp, pp, ep, zero_stage, seq_len, micro_batch, m,
                 checkpointing="none") -> dict:
    """Bytes per GPU of the deepest stage: ``dense_state`` (its dense parameters / tp, ZeRO over
    dp), ``expert_state`` (its routed experts / ep, ZeRO over edp = dp x tp / ep), ``activations``
    (min(pp, m) micro-batches in flight, each layer's bytes / tp under sequence parallelism),
    ``gather_bytes`` (ZeRO-3: one layer gathered, one prefetched), their ``total``, and the parameters per
    GPU behind them (``dense_params``, ``expert_params``)."""
    st, d, tokens = stage_layers(s, pp), s.d_model, micro_batch * seq_len
    embed = s.vocab * d * ((1 if s.tied else 2) if pp == 1 else 1)   # with pp: one of the two
    moe_dense = s.n_shared * expert_params(s) + s.n_experts * d       # shared experts, router
    dense = (st["layers"] * attention_params(s) + st["dense"] * 3 * d * s.dense_ffn
             + st["moe"] * moe_dense + embed) / tp
    experts = st["moe"] * s.n_experts * expert_params(s) / ep
    dense_state = state_bytes_per_gpu(dense, dp, zero_stage)["total"]
    expert_state = state_bytes_per_gpu(experts, dp * tp // ep, zero_stage)["total"] \
        if experts else 0.0
    # activations a layer keeps for backward, bytes per token: attention and norms 15 d (GPT-3's
    # share of Korthikanti et al.'s 34 d, flash attention); a SwiGLU MLP of width f its input (2 d)
    # and three f-wide tensors (6 f); an MoE layer its router's input and, per routed copy, the
    # dispatched input and the expert's three tensors, and the shared experts' three
    dense_mlp = 2 * d + 6 * s.dense_ffn
    moe_mlp = 2 * d + s.top_k * (2 * d + 6 * s.expert_ffn) + s.n_shared * 6 * s.expert_ffn
    per_mb = tokens * (st["layers"] * 15 * d + st["dense"] * dense_mlp + st["moe"] * moe_mlp) / tp
    if checkpointing == "full":   # each layer's input, and one layer re-run at a time in backward
        per_mb = tokens * (st["layers"] * 2 * d + 15 * d + max(moe_mlp, dense_mlp)) / tp
    act = per_mb * min(pp, m)
    gather = 4 * (dense / st["layers"] + experts / max(st["moe"], 1)) if zero_stage == 3 else 0.0
    return {"dense_state": dense_state, "expert_state": expert_state, "activations": act,
            "gather_bytes": gather, "total": dense_state + expert_state + act + gather,
            "dense_params": dense, "expert_params": experts}


def _grads_s(params, group, zero, m, link) -> float:
    """Chapter 10's ZeRO traffic for ``params`` 16-bit gradients over ``group`` ranks: ZeRO 0/1 one
    AllReduce a step; 2 a ReduceScatter per micro-batch and one AllGather; 3 a ReduceScatter and
    two AllGathers per micro-batch (each half a ring AllReduce)."""
    if group == 1:
        return 0.0
    ring = ring_allreduce_s(2 * params, group, link.bandwidth, link.latency)
    return ring if zero <= 1 else (m + 1) * ring / 2 if zero == 2 else 3 * m * ring / 2


def _row(s, dev, n_gpus, node_size, inter, gb, T, b, dp, tp, pp, ep, zero, ck) -> dict:
    m = gb // (dp * b)                                      # micro-batches per DP rank per step
    st, full, link = stage_layers(s, pp), ck == "full", dev["link"]
    mem = layout_bytes(s, dp, tp, pp, ep, zero, T, b, m, ck)
    # compute: this GPU's share of the stage's active FLOPs (b.T/tp tokens, sequence parallelism)
    f, share = flops_per_token(s, T), st["layers"] / s.n_layer / tp
    peak, fr = dev["peak"]["bf16"], dev["fractions"]
    t_mb = roofline_s(f["matmul"] * b * T * share, 0, peak, dev["bandwidth"],
                      fr["matmul_fraction"])[0] \
        + roofline_s(f["attention"] * b * T * share, 0, peak, dev["bandwidth"],
                     fr["attention_fraction"])[0]
    compute = m * t_mb * (4 / 3 if full else 1.0)          # recomputation: the forward runs twice
    bubble = compute * bubble_fraction(pp, m, relative_to="ideal") if pp > 1 else 0.0
    # TP: attention's AllReduce fwd (after proj) and bwd (before qkv), a dense MLP's too, +1 recomputing
    act_bytes = b * T * s.d_model * 2
    calls = (2 + full) * (st["layers"] + st["dense"])
    tp_comm = m * calls * ring_allreduce_s(act_bytes, tp, link.bandwidth, link.latency) if tp > 1 else 0.0
    # EP: 4 all-to-alls per MoE layer and micro-batch (dispatch + combine, fwd + bwd), 6 recomputing
    payload = alltoall_bytes(b * T // tp, s.top_k, s.d_model, ep)["payload"]
    ep_comm = m * st["moe"] * (4 + 2 * full) * alltoall_s(payload, ep, node_size, link, inter)
    pp_link = link if n_gpus <= node_size else inter
    p2p = 2 * m * (act_bytes / tp / pp_link.bandwidth + pp_link.latency) if pp > 1 else 0.0
    dp_link = link if dp * tp <= node_size else inter
    dp_comm = _grads_s(mem["dense_params"], dp, zero, m, dp_link) \
        + _grads_s(mem["expert_params"], dp * tp // ep, zero, m, dp_link)
    state = mem["dense_state"] + mem["expert_state"]
    optimizer = roofline_s(0, 2 * state, peak, dev["bandwidth"], 1.0, fr["bandwidth_fraction"])[0]
    parts = {"compute": compute, "bubble": bubble, "tp_comm": tp_comm, "ep_alltoall": ep_comm,
             "pp_p2p": p2p, "dp_comm": dp_comm, "optimizer": optimizer}
    step = sum(parts.values())
    return {"dp": dp, "tp": tp, "pp": pp, "ep": ep, "edp": dp * tp // ep, "zero_stage": zero,
            "checkpointing": ck, "micro_batches": m, "layers_per_stage": st["layers"],
            **{k: mem[k] for k in MEMORY_PARTS}, "bytes_per_gpu": mem["total"], "usable_bytes": dev["usable"],
            "fits": mem["total"] <= dev["usable"], "step_s": step, "parts": parts,
            "bottleneck": max(parts, key=parts.get), "tokens_per_s": gb * T / step,
            "mfu": f["total"] * gb * T / step / (n_gpus * peak), "alltoall_payload": payload,
            "ep_crosses_nodes": ep > node_size, "label": "predicted"}


def _divisors(n: int) -> list:
    return [k for k in range(1, n + 1) if n % k == 0]


def _check(model, gpu, n_gpus, node_size, interconnect, global_batch, seq_len, micro_batch,
           zero_stages, checkpointing):
    s, dev = moe_shape(model), gpu_spec(gpu)
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or not 1 <= n_gpus <= MAX_GPUS:
        raise ConfigError("n_gpus", n_gpus, f"a whole number of GPUs from 1 to {MAX_GPUS}")
    whole("node_size", node_size)
    if n_gpus > node_size and n_gpus % node_size:
        raise ConfigError("node_size", node_size, f"a node size that divides n_gpus={n_gpus}")
    _choice("interconnect", interconnect, tuple(LINKS))
    whole("seq_len", seq_len)
    whole("micro_batch", micro_batch)
    gb = 2 * n_gpus * micro_batch if global_batch is None else whole("global_batch", global_batch)
    zs = tuple(zero_stages) if isinstance(zero_stages, (tuple, list)) else None
    if not zs or any(isinstance(z, bool) or z not in (0, 1, 2, 3) for z in zs):
        raise ConfigError("zero_stages", zero_stages, "a non-empty tuple of ZeRO stages 0 to 3")
    cks = tuple(checkpointing) if isinstance(checkpointing, (tuple, list)) else (checkpointing,)
    if not cks:
        raise ConfigError("checkpointing", checkpointing, "'none', 'full', or a tuple of them")
    for ck in cks:
        _choice("checkpointing", ck, CHECKPOINTING)
    return s, dev, gb, zs, tuple(dict.fromkeys(cks))


def layouts(model, gpu: str, n_gpus: int, node_size: int = 8, interconnect: str = "infiniband",
            global_batch: int | None = None, seq_len: int = 4096, micro_batch: int = 1,
            zero_stages=(0, 1, 2, 3), checkpointing=CHECKPOINTING) -> list:
    """Every DP x TP x PP x EP (x ZeRO stage, x recomputation) of ``n_gpus`` that obeys the rules,
    fastest predicted fit first: tp divides the heads, the K/V heads and the node (a TP group stays
    in a node); pp at most the layers (uneven stages allowed); dp x micro_batch divides the global
    batch (sequences; default 2 x n_gpus x micro_batch) into m >= pp micro-batches; ep divides
    dp x tp and the routed experts; ZeRO only where something is replicated, 0 or 1 with pp > 1."""
    s, dev, gb, zs, cks = _check(model, gpu, n_gpus, node_size, interconnect, global_batch,
                                 seq_len, micro_batch, zero_stages, checkpointing)
    rows = []
    for tp in _divisors(n_gpus):
        if s.n_head % tp or s.n_kv_head % tp or tp > node_size or node_size % tp:
            continue
        for pp in _divisors(n_gpus // tp):
            dp = n_gpus // (tp * pp)
            if pp > s.n_layer or gb % (dp * micro_batch) or gb // (dp * micro_batch) < pp:
                continue
            for ep in (e for e in _divisors(dp * tp) if s.n_experts % e == 0):
                for zero in (z for z in zs if pp == 1 or z <= MAX_ZERO_WITH_PP):
                    if zero and dp == 1 and ep == tp:
                        continue   # nothing is replicated: ZeRO has nothing to shard
                    rows += [_row(s, dev, n_gpus, node_size, LINKS[interconnect], gb, seq_len,
                                  micro_batch, dp, tp, pp, ep, zero, ck) for ck in cks]
    rows.sort(key=lambda r: (not r["fits"], r["step_s"]))
    return rows


def best_layout(rows: list):
    """The fastest predicted layout that fits (None when none does)."""
    return min((r for r in rows if r["fits"]), key=lambda r: r["step_s"], default=None)


def find(rows: list, dp, tp, pp, ep, zero_stage=None, checkpointing=None):
    """That layout's row (the faster of its ZeRO stages or recomputation choices if not given)."""
    mine = [r for r in rows if (r["dp"], r["tp"], r["pp"], r["ep"]) == (dp, tp, pp, ep)
            and zero_stage in (None, r["zero_stage"]) and checkpointing in (None, r["checkpointing"])]
    return min(mine, key=lambda r: (not r["fits"], r["step_s"])) if mine else None


def name(r) -> str:
    rc = ", recomputing" if r["checkpointing"] == "full" else ""
    return f"DP {r['dp']} × TP {r['tp']} × PP {r['pp']}, EP {r['ep']}, ZeRO-{r['zero_stage']}{rc}"


def figures(r) -> dict:
    """One row's figures as a sentence quotes them: its name, step (s), MFU (%), bytes in GB."""
    return {"name": name(r), "step_s": r["step_s"], "mfu_pct": round(100 * r["mfu"]),
            "ep": r["ep"], "edp": r["edp"], "dense_gb": r["dense_state"] / GB,
            "expert_gb": r["expert_state"] / GB, "act_gb": r["activations"] / GB,
            "total_gb": r["bytes_per_gpu"] / GB, "usable_gb": r["usable_bytes"] / GB,
            "a2a_s": r["parts"]["ep_alltoall"],
            "a2a_pct": round(100 * r["parts"]["ep_alltoall"] / r["step_s"]),
            "ep_crosses_nodes": r["ep_crosses_nodes"], "recomputed": r["checkpointing"] == "full"}


def choice(rows: list) -> dict:
    """The pick and why, as figures: ``verdict`` 'no_layout', 'none_fits' (the smallest layout's
    figures follow), or 'in_node' / 'across_nodes' (the fastest fit, whose EP group stays in a node
    or crosses nodes) with its figures; ``runner_up`` 'tie' / 'faster' / None against the fastest
    fit with another ep, and the part of the step that differs most between them (``part``,
    ``part_name``, ``part_s`` the pick's seconds in it, ``ru_part_s`` the runner-up's)."""
    best = best_layout(rows)
    if best is None:
        if not rows:
            return {"verdict": "no_layout", "runner_up": None}
        return {"verdict": "none_fits", "runner_up": None,
                **figures(min(rows, key=lambda r: r["bytes_per_gpu"]))}
    out = {"verdict": "across_nodes" if best["ep_crosses_nodes"] else "in_node",
           "runner_up": None, **figures(best)}
    other = [r for r in rows if r["fits"] and r["ep"] != best["ep"]]
    if other:
        ru = min(other, key=lambda r: r["step_s"])
        k = max(PARTS, key=lambda p: abs(ru["parts"][p] - best["parts"][p]))
        ratio = ru["step_s"] / best["step_s"]
        out.update(runner_up="tie" if ratio - 1 < TIE else "faster", ru_name=name(ru),
                   ru_step_s=ru["step_s"], ratio=ratio, gap_pct=100 * (ratio - 1), part=k,
                   part_name=PART_NAMES[k], part_s=best["parts"][k], ru_part_s=ru["parts"][k])
    return out



def layout_chart(shown: dict):
    """Where a GPU's bytes and its predicted step go, one bar per layout of ``shown`` ({label: row}),
    hatched where the layout does not fit; the dashed line is the memory a GPU may fill."""
    from ...tools.plots.figure import new_figure  # deferred: matplotlib is loaded only to draw
    fig = new_figure(11, 3.8)
    axes, rows = fig.subplots(1, 2, sharey=True), list(shown.values())
    axes[0].axvline(rows[0]["usable_bytes"] / GB, ls="--", c="k", label="what a GPU may fill")
    for ax, parts, names, get, label in (
            (axes[0], MEMORY_PARTS, MEMORY_NAMES, lambda r, p: r[p] / GB, "GB per GPU"),
            (axes[1], PARTS, PART_NAMES, lambda r, p: r["parts"][p], "seconds per step")):
        left = [0.0] * len(rows)
        for part in parts:
            vals = [get(r, part) for r in rows]
            for bar, r in zip(ax.barh(range(len(rows)), vals, left=left, label=names[part]), rows):
                bar.set(hatch=None if r["fits"] else "//", edgecolor="white")
            left = [a + b for a, b in zip(left, vals)]
        ax.set_xlabel(label + " (predicted)")
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    axes[0].set_yticks(range(len(rows)), [f"{k}\n{name(r)}" + ("" if r["fits"] else "\n(does not fit)")
                                          for k, r in shown.items()], fontsize=7)
    axes[0].invert_yaxis()
    fig.suptitle("Predicted: a GPU's memory and step, by layout (hatched: does not fit)", fontsize=9)
    return fig

# The section's scenario: DeepSeek-V3's shape on 256 H100s in 32 nodes of 8, InfiniBand between
# nodes, 1,024 sequences of 4,096 tokens per step (4 M tokens), micro-batch 1.
EXAMPLE_SCENARIO = dict(model="deepseek-v3", gpu="h100-sxm", n_gpus=256, node_size=8,
                        interconnect="infiniband", global_batch=1024, seq_len=4096, micro_batch=1)
# exercise-12-moe-layout's: Qwen3-235B-A22B on 64 H100s in 8 nodes of 8, 256 sequences of 4,096
# tokens, full activation recomputation; the learner picks dp, tp, pp, ep and the ZeRO stage
EXERCISE_SCENARIO = dict(model="qwen3-235b-a22b", gpu="h100-sxm", n_gpus=64, node_size=8,
                         interconnect="infiniband", global_batch=256, seq_len=4096, micro_batch=1,
                         checkpointing="full")
SLOW_FACTOR = 1.25   # the exercise passes a layout that fits within this factor of the best step
