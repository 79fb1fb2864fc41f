"""Context parallelism's arithmetic (taught in chapter 10): ring attention over ``cp`` ranks, each holding T/cp of
the sequence; K and V blocks travel round the ring while each rank computes attention on the block it holds.
Pure arithmetic, every time predicted; nothing here runs. Every figure is per GPU: with TP inside the node each GPU
holds 1/tp of the heads, so its K/V bytes, its attention FLOPs and its activations are all 1/tp of the layer's.
Not every CP is a ring: Llama 3's context parallelism all-gathers the K and V of the whole sequence before
attention (Meta, The Llama 3 Herd of Models, 2024) -- simpler, exposed rather than overlapped, and cheap when K/V
is small under GQA.

    ring_step_bytes(131072, 16, d_kv=1024)         # bytes one rank sends per ring step and layer (forward)
    context_rows("llama3-405b", "h100-sxm", 131072, cps=(1, 2, 4, 8, 16, 32))
"""
from __future__ import annotations

from ...base.errors import ConfigError
from ...whatif.roofline import LINKS
from ...engine.config import whole
from ...whatif.memory import activation_bytes_estimate
from .layout import GB, gpu_spec, model_shape

__all__ = ["ring_step_bytes", "ring_attention_layer", "hide_threshold_tokens", "context_rows", "context_summary"]


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
