"""One layout's bytes per GPU and **predicted** step time, the model behind ``layout`` (taught in chapter 10).

The step-time model (every figure predicted, none measured):

* compute: the model's FLOPs (matmuls 6 x matmul-parameters per token, attention 12 x layers x T x d per token,
  non-causal as the course counts MFU) shared over the GPUs, at the GPU's datasheet peak times the what-if model's
  achievable fraction (``whatif.DEFAULTS``: matmul and attention fractions) through ``whatif.roofline_s``;
  element-wise ops, norms and kernel launches are not charged (large shapes: the matmuls dominate); full
  activation recomputation (``checkpointing="full"``) costs one more forward: 4/3 of the compute;
* memory: model state (``formulas.layout_state_bytes``) plus activations of 34·s·b·h/tp bytes a layer: sequence
  parallelism is assumed (Megatron pairs it with TP: every activation term splits over tp), and 34·s·b·h is
  GPT-3's breakdown (Korthikanti et al. 2022, flash attention) applied to every shape -- an approximation for
  SwiGLU/GQA models. Under 1F1B stage 0 holds min(p, m) micro-batches of its L/p layers: L layers' worth of one
  micro-batch whatever p is. Not modelled: the first and last stages' extra load (embedding and output-head
  parameters, the fp32 logits of a large vocabulary -- about 4 GB per 8K-token micro-batch at 128K words);
* tensor parallelism: 2 AllReduces forward + 2 backward per block and micro-batch (``formulas``; 2 more with full
  recomputation, which re-runs the forward), a ring over the node's own link (the catalogue's NVLink/PCIe figure);
* pipeline parallelism: the 1F1B bubble, (p - 1) idle slots of one micro-batch (``bubble_fraction``), and the
  activation sends between stages (2 per micro-batch per stage), each of 1/tp of the b·s·h activation: with
  sequence parallelism every TP rank holds and sends its own slice of the sequence, in parallel on its own link
  (Megatron's scatter/gather does the same for plain TP; the receiving side's AllGather inside the node is not
  charged); 1F1B needs m >= p micro-batches per DP rank;
* data parallelism: one gradient AllReduce per step (ZeRO 0/1: gradients accumulate full-size over the m
  micro-batches); ZeRO-2/3 keep gradients sharded, which takes one ReduceScatter per micro-batch (FSDP's default,
  what the chapter's measure-10-fsdp-accum counts), then one AllGather of the updated shard (ZeRO-2) or, for
  ZeRO-3, two parameter AllGathers per micro-batch (re-gathered for backward); over the inter-node link when the
  DP group spans nodes. With pp > 1 the tool offers ZeRO 0 and 1 only. That is DeepSpeed's and Megatron's rule
  (DeepSpeed's pipeline engine refuses ZeRO-2/3; Megatron's distributed optimizer is ZeRO-1 with a full-size
  gradient buffer), not a law: PyTorch-native stacks combine FSDP with PP -- ``torch.distributed.pipelining``
  turns gradient sync and reshard-after-backward off on an FSDP stage until its last micro-batch, torchtitan
  sets ``reshard_after_forward = not pp_enabled`` -- and reduce-scatter once per step. Within the step such a
  stage holds its full 16-bit weights and gradients beside sharded optimizer state, and moves one
  ReduceScatter and one AllGather a step: ZeRO-1's bytes at the peak and ZeRO-1's traffic, so the ZeRO-1 row
  stands for it. (Between steps FSDP frees the unsharded copies, which a peak does not see.) What the tool
  leaves out -- sharding per micro-batch under PP -- pays a ReduceScatter (and for ZeRO-3 two AllGathers) per
  micro-batch per stage, which no stack above makes its default;
* nothing overlaps: a real run hides much of the DP and TP communication behind compute, so this model
  leans slow where communication matters, and it favours layouts with less of it.

Ranks are placed TP innermost (a TP group inside one node), then DP, then PP.
"""
from __future__ import annotations

import difflib
import math

from ...base.errors import ConfigError
from ...engine.config import _choice
from ...engine.peaks import value as _value
from ...whatif import DEFAULTS, catalogue, roofline_s
from ...whatif.roofline import LINKS, Link, ring_allreduce_s
from ...engine.config import whole
from ...whatif.memory import activation_bytes_estimate
from .formulas import bubble_fraction, layout_state_bytes, tp_allreduce_bytes, tp_collectives_per_block
from .shapes import flops_per_token, model_shape

GB = 1e9
INTERCONNECTS = tuple(LINKS)          # the link between nodes: netmodel's InfiniBand, Ethernet, NVLink
PRECISIONS = ("bf16", "fp8")          # fp8: the linear layers' GEMMs at the FP8 peak (see fp8.py)
CHECKPOINTING = ("none", "full")     # activation recomputation: none, or every layer re-run in backward
MAX_ZERO_WITH_PP = 1                 # pp > 1: ZeRO 0 or 1 (DeepSpeed's, Megatron's rule; FSDP + PP peaks at ZeRO-1)
PARTS = ("compute", "bubble", "tp_comm", "pp_p2p", "dp_comm", "optimizer")
MAX_GPUS = 1 << 20


def gpu_spec(gpu: str) -> dict:
    """The catalogue's figures of one GPU in SI units, with the what-if model's achievable fractions."""
    devs = catalogue()["devices"]
    if not isinstance(gpu, str) or gpu not in devs:
        close = difflib.get_close_matches(gpu, list(devs), n=1) if isinstance(gpu, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError("gpu", gpu, hint + "a GPU of the what-if catalogue: " + ", ".join(devs))
    d = devs[gpu]
    peaks = {p: (_value(e) or 0.0) * 1e12 for p, e in d["peak_tflops"].items()}
    fp8 = _value(d.get("fp8_peak_tflops") or {})
    return {"key": gpu, "name": d["name"], "peak": peaks, "fp8_peak": fp8 * 1e12 if fp8 else None,
            "memory": _value(d["memory_gb"]) * GB, "usable": _value(d["memory_gb"]) * GB * DEFAULTS[
                "usable_memory_fraction"], "bandwidth": _value(d["memory_bandwidth_gbps"]) * 1e9,
            "link": Link(f"{d['name']} in-node link", _value(d["interconnect_gbps"]) * 1e9,
                         DEFAULTS["link_latency_s"]), "fractions": dict(DEFAULTS[d["vendor"]])}


def _divisors(n: int) -> list:
    return [k for k in range(1, n + 1) if n % k == 0]


def _check_scenario(model, gpu, n_gpus, node_size, interconnect, global_batch, seq_len, micro_batch, zero_stages,
                    precision, checkpointing):
    shape = model_shape(model)
    dev = gpu_spec(gpu)
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or not 1 <= n_gpus <= MAX_GPUS:
        raise ConfigError("n_gpus", n_gpus, f"a whole number of GPUs from 1 to {MAX_GPUS}")
    whole("node_size", node_size)
    if n_gpus > node_size and n_gpus % node_size:
        raise ConfigError("node_size", node_size, f"a node size that divides n_gpus={n_gpus} (whole nodes), "
                          f"e.g. {', '.join(str(k) for k in _divisors(n_gpus) if 2 <= k <= 16)}")
    _choice("interconnect", interconnect, INTERCONNECTS)
    _choice("precision", precision, PRECISIONS)
    cks = tuple(checkpointing) if isinstance(checkpointing, (tuple, list)) else (checkpointing,)
    if not cks:
        raise ConfigError("checkpointing", checkpointing, "'none', 'full', or a tuple of them")
    for ck in cks:
        _choice("checkpointing", ck, CHECKPOINTING)
    if precision == "fp8" and not dev["fp8_peak"]:
        have = [k for k, v in catalogue()["devices"].items() if v.get("fp8_peak_tflops")]
        raise ConfigError("precision", "fp8", f"bf16 on {gpu}: the catalogue has no FP8 peak for it (FP8 peaks: "
                          + ", ".join(have) + ")")
    whole("micro_batch", micro_batch)
    if seq_len is not None:
        whole("seq_len", seq_len)
    gb = 2 * n_gpus * micro_batch if global_batch is None else whole("global_batch", global_batch)
    stages = tuple(zero_stages) if isinstance(zero_stages, (tuple, list)) else None
    if not stages or any(isinstance(z, bool) or z not in (0, 1, 2, 3) for z in stages):
        raise ConfigError("zero_stages", zero_stages, "a non-empty tuple of ZeRO stages from 0, 1, 2, 3")
    return shape, dev, gb, stages, tuple(dict.fromkeys(cks))


def _ring_half(nbytes, n, link: Link) -> float:
    """A ReduceScatter or an AllGather: half a ring AllReduce."""
    return ring_allreduce_s(nbytes, n, link.bandwidth, link.latency) / 2 if n > 1 else 0.0


def _row(shape, dev, n_gpus, node_size, inter: Link, gb, T, b, dp, tp, pp, zero, precision, checkpointing) -> dict:
    """One layout's bytes per GPU and predicted step time (every time labelled predicted)."""
    m = gb // (dp * b)                                 # micro-batches per DP rank per step
    layers = math.ceil(shape.n_layer / pp)             # the deepest stage sets the pace
    full = checkpointing == "full"
    state = layout_state_bytes(shape.n_params, dp=dp, tp=tp, pp=pp, zero_stage=zero)
    per_mb = activation_bytes_estimate(layers, shape.d_model, shape.n_head, T, b, checkpointing, True)
    in_flight = min(pp, m)                             # 1F1B: stage 0 holds p micro-batches' activations
    act = per_mb / tp * in_flight                      # /tp: sequence parallelism assumed, every term splits
    if full:  # backward re-runs one layer at a time: that layer's full activations live on top of the inputs
        act += activation_bytes_estimate(1, shape.d_model, shape.n_head, T, b, "none", True) / tp
    layer_params = shape.n_params / shape.n_layer
    gather = 2 * 2 * layer_params / tp if zero == 3 else 0.0   # ZeRO-3: one layer gathered + one prefetched
    total = state["total"] + act + gather
    # -- compute: the FLOPs of one micro-batch on one stage's GPU, at the achievable peak --
    f = flops_per_token(shape, T)
    share = layers / shape.n_layer / tp                # this GPU's share of the model's layers
    tokens = b * T
    # 16-bit matmuls at the bf16 peak -- or, on a GPU without bf16 units (T4, V100, P100), fp16's (with a scaler)
    peak = dev["peak"]["bf16"] or dev["peak"].get("fp16") or dev["peak"].get("fp32")
    mm_peak = dev["fp8_peak"] if precision == "fp8" else peak
    fr = dev["fractions"]
    t_mb = roofline_s(f["matmul"] * tokens * share, 0, mm_peak, dev["bandwidth"], fr["matmul_fraction"])[0] + \
        roofline_s(f["attention"] * tokens * share, 0, peak, dev["bandwidth"], fr["attention_fraction"])[0]
    t_mb *= 4 / 3 if full else 1.0                     # recomputation: forward (1/3 of the FLOPs) runs twice
    compute = m * t_mb
    bubble = compute * bubble_fraction(pp, m, relative_to="ideal") if pp > 1 else 0.0  # (p - 1) x t_mb
    # -- tensor parallelism: 4 AllReduces per block and micro-batch inside the node (6 when the forward re-runs) --
    calls = tp_collectives_per_block()
    tp_bytes = tp_allreduce_bytes(b, T, shape.d_model)
    n_calls = calls["forward"] * (2 if full else 1) + calls["backward"]
    tp_comm = m * layers * n_calls * ring_allreduce_s(
        tp_bytes, tp, dev["link"].bandwidth, dev["link"].latency) if tp > 1 else 0.0
    # -- pipeline: each stage sends one activation forward and one gradient back per micro-batch; under sequence
    #    parallelism each TP rank sends only its 1/tp slice, all tp of them at once on their own links --
    pp_link = dev["link"] if n_gpus <= node_size else inter    # stages sit tp x dp ranks apart: other nodes
    p2p = 2 * m * (tp_bytes / tp / pp_link.bandwidth + pp_link.latency) if pp > 1 else 0.0
    # -- data parallelism: gradients of this GPU's share, over the inter-node link when DP spans nodes --
    dp_link = dev["link"] if tp * dp <= node_size else inter
    grads = 2 * shape.n_params / (tp * pp)
    if dp == 1:
        dp_comm = 0.0
    elif zero <= 1:   # gradients accumulate full-size over the m micro-batches: one AllReduce per step
        dp_comm = ring_allreduce_s(grads, dp, dp_link.bandwidth, dp_link.latency)
    elif zero == 2:   # sharded gradients: a ReduceScatter per micro-batch, one AllGather of the updated shard
        dp_comm = (m + 1) * _ring_half(grads, dp, dp_link)
    else:             # ZeRO-3: a ReduceScatter and two weight AllGathers (forward, backward) per micro-batch
        dp_comm = 3 * m * _ring_half(grads, dp, dp_link)
    optimizer = roofline_s(0, 2 * (state["optimizer"] + state["params"] + state["grads"]), peak, dev["bandwidth"],
                           1.0, fr["bandwidth_fraction"])[0]
    parts = {"compute": compute, "bubble": bubble, "tp_comm": tp_comm, "pp_p2p": p2p, "dp_comm": dp_comm,
             "optimizer": optimizer}
    step = sum(parts.values())
    model_flops = f["total"] * gb * T
    return {"dp": dp, "tp": tp, "pp": pp, "zero_stage": zero, "checkpointing": checkpointing,
            "micro_batches": m, "layers_per_stage": layers,
            "state_bytes": state["total"], "states": state, "activation_bytes": act, "zero3_gather_bytes": gather,
            "bytes_per_gpu": total, "usable_bytes": dev["usable"], "fits": total <= dev["usable"],
            "step_s": step, "parts": parts, "bottleneck": max(parts, key=parts.get),
            "tokens_per_s": gb * T / step, "model_flops": model_flops, "mfu": model_flops / step / (n_gpus * peak),
            "dp_link": dp_link.name, "precision": precision, "label": "predicted"}
