"""Tensor parallelism on labkit's GPT, Megatron-style (taught in chapter 10): every block's MLP split
column-then-row and its attention split by heads over ``world_size`` ranks, written twice -- in plain
PyTorch (two conjugate autograd Functions and a ``TPBlock``) and with ``torch.distributed.tensor.parallel``
(``ColwiseParallel``/``RowwiseParallel`` on a ``DeviceMesh``) -- and run on real processes.

    par.permute_qkv_per_head(w, b, n_head=4, world_size=2)   # the fused qkv, each rank's slice whole heads
    demo = par.tp_demo(model="tiny", world_size=2, micro_batch=4)
    demo["plain"]["calls_per_block"]   # {'forward': 2.0, 'backward': 2.0}: measured
    par.tp_link_rows()         # predicted: a TP layer's AllReduces against its compute, per interconnect

labkit's attention has ONE fused ``qkv`` projection whose output is [q | k | v]. Split by columns as it
stands, rank 0 of 2 would get all of q and half of k; ``permute_qkv_per_head`` reorders its rows so each
rank's contiguous slice holds whole heads' q, k and v -- the layout both versions below use.

The split itself is in ``megatron`` (re-exported here), what each rank runs in ``tp_ranks``, the demo's
chart in ``charts``; its figures as a table's rows (``tp_rows``) and verdict keys at the end of this module.
The ranks start, meet and end as in chapter 09's FSDP demo
(``engine.launch.spawn_ranks``: warm forks, a FileStore in a private folder, gloo on the loopback
interface only; nothing outlives the call).
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from ...whatif.roofline import LINKS, Link, ring_allreduce_s, ring_bytes_sent
from ...engine.config import real, whole
from ...base.errors import ConfigError, RunError
from ...engine.config import PRESETS, ModelSpec, _choice
from ...engine.launch import spawn_ranks
from ...whatif.devices import DEFAULTS, catalogue
from .formulas import tp_allreduce_bytes, tp_collectives_per_block
from .megatron import (COMM, CopyToTP, LocalAttention, QKVPerHead, ReduceFromTP, TPBlock, TPBlockSeparateQKV,
                       all_reduce, dtensor_block, permute_qkv_per_head, tp_shard_names)
from .processes import load_average
from .tp_ranks import _tp_rank

__all__ = ["permute_qkv_per_head", "QKVPerHead", "all_reduce", "COMM", "CopyToTP", "ReduceFromTP", "TPBlock",
           "TPBlockSeparateQKV", "LocalAttention", "dtensor_block", "tp_demo", "tp_link_rows", "tp_rows",
           "counts_verdict", "timing_verdict", "unchanged_attention_outcome", "TP_STYLES", "GPT3_175B",
           "tp_shard_names", "block_train_flops", "step_time_verdict"]

PHASES = ("forward", "backward")
MIN_STEPS = 3  # timed steps per version before a faster/slower is stated: quartiles need a few
# the demo's versions: "plain" (f and g as autograd Functions, the fused qkv permuted per head), "separate"
# (q, k, v as three column-parallel layers), "dtensor" (ColwiseParallel/RowwiseParallel on a DeviceMesh)
TP_STYLES = ("plain", "separate", "dtensor")


# ---- running it on real processes (a rank's side: tp_ranks) ------------------------------------------

def _device_kind(world_size):
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "cpu"


def tp_demo(model: str = "tiny", world_size: int = 2, micro_batch: int = 4, seed: int = 0,
            timeout_s: float = 120.0, styles=("plain", "separate", "dtensor"), repeats: int = 5) -> dict:
    """Run labkit's GPT tensor-parallel on ``world_size`` processes (gloo on the CPU; NCCL on ``cuda:rank``
    where there are that many GPUs): each rank builds the full GPT from ``seed``, converts every block
    (``styles``: see ``TP_STYLES``) and runs forward+backward on the same batch. Reports, per style, the
    AllReduce calls per block in each pass and the bytes of each (measured, against ``formulas``), the
    loss on each rank and the max gradient difference against the unsplit model, and rank 0's timed steps
    (``repeats`` of them, warm-up excluded; ``step_s`` their median) beside the unsplit model's, with the
    machine's 1-minute ``load`` and its ``cores``. A failed or late rank gives ``ok`` False and
    the reason in ``error``; nothing outlives the call."""
    _choice("model", model, PRESETS)
    spec = PRESETS[model]
    whole("world_size", world_size)
    if world_size < 2 or world_size > spec.n_head or spec.n_head % world_size:
        raise ConfigError("world_size", world_size, f"2 or more ranks dividing the {spec.n_head} heads of "
                          f"{model!r}: each rank computes whole heads")
    whole("micro_batch", micro_batch)
    whole("seed", seed, 0)
    whole("repeats", repeats)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    if isinstance(styles, str) or not isinstance(styles, (tuple, list)) or not styles:
        raise ConfigError("styles", styles, "a tuple of: " + ", ".join(TP_STYLES))
    for s in styles:
        _choice("styles", s, TP_STYLES)
    kind = _device_kind(world_size)
    t0, load = time.monotonic(), load_average()
    try:
        with spawn_ranks(_tp_rank, world_size, (spec, micro_batch, seed, tuple(styles), repeats, kind),
                         kind=kind, prefix="labkit-tp-") as ranks:
            results = ranks.collect(timeout_s, "TP demo")
    except RunError as e:
        return {"ok": False, "error": str(e), "model": model, "world_size": world_size}
    out = _summary(results, spec, model, world_size, micro_batch, styles, kind, time.monotonic() - t0)
    out.update(load=max(load, load_average()), cores=os.cpu_count())  # what else shared the cores while it ran
    return out


def _summary(results, spec, model, world_size, micro_batch, styles, kind, seconds) -> dict:
    r0 = results[0]
    unsplit = r0["unsplit_step_times"]
    expected_bytes = tp_allreduce_bytes(micro_batch, spec.seq_len, spec.d_model, dtype_bytes=4)  # fp32 here
    out = {"ok": True, "model": model, "world_size": world_size, "micro_batch": micro_batch, "kind": kind,
           "n_layer": spec.n_layer, "ref_loss": r0["ref_loss"], "unsplit_step_s": statistics.median(unsplit),
           "unsplit_step_times": unsplit,
           "expected_bytes": expected_bytes, "seconds": seconds,
           "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
           "unchanged_attention_error": r0.get("unchanged_attention_error"),
           # which mode counted the collectives, and why: CommDebugMode where it traces labkit's Block
           "counter": r0["counter"], "counter_why": r0["why"], "torch": r0["torch"]}
    for style in styles:
        s0 = r0["styles"][style]
        qkv = "separate" if style == "separate" else "per_head"
        noted = s0["own"] or s0["seen"]  # the plain versions' own notes; DTensor's collectives as dispatched
        calls = {p: sum(n == "all_reduce" for n, _ in noted[p]) for p in PHASES}
        seen = {p: sum(n in ("all_reduce", "allreduce") for n, _ in s0["seen"][p]) for p in PHASES}
        others = sorted({n for p in PHASES for n, _ in s0["seen"][p] if n not in ("all_reduce", "allreduce")})
        sizes = sorted({b for p in PHASES for n, b in noted[p] if n == "all_reduce"})
        out[style] = {
            "calls_per_block": {p: calls[p] / spec.n_layer for p in PHASES},
            "dispatched_per_block": {p: seen[p] / spec.n_layer for p in PHASES},
            "expected_calls": {p: tp_collectives_per_block(qkv)[p] for p in ("forward", "backward")},
            "other_collectives": others, "bytes_per_call": sizes,
            "losses": [results[r]["styles"][style]["loss"] for r in range(world_size)],
            "loss_error": max(abs(results[r]["styles"][style]["loss"] - r0["ref_loss"]) for r in range(world_size)),
            "grad_error": r0["styles"][style]["grad_error"], "step_s": statistics.median(s0["step_times"]),
            "step_times": s0["step_times"],
            "commdebug_per_block": s0.get("commdebug")}
    return out


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
        raise ConfigError("spec", spec, "a model shape such as lk.PRESETS['base'] or tensor.GPT3_175B")
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


# ---- the demo's figures as rows and verdicts (the chapter draws the table and says the words) --------------

def quartiles(times) -> tuple:
    """(first quartile, median, third quartile) of a list of step times (all three the one value if one)."""
    xs = sorted(times)
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def step_time_verdict(times, unsplit_times) -> str:
    """'faster', 'slower', 'within noise' (the interquartile ranges overlap) or 'too few steps' (fewer than
    ``MIN_STEPS`` on either side): what one version's timed steps allow saying against the unsplit model's."""
    if len(times) < MIN_STEPS or len(unsplit_times) < MIN_STEPS:
        return "too few steps"
    (a1, _, a3), (b1, _, b3) = quartiles(times), quartiles(unsplit_times)
    if a1 <= b3 and b1 <= a3:
        return "within noise"
    return "faster" if a3 < b1 else "slower"


def tp_rows(demo: dict) -> list:
    """One row per version the demo ran, then the unsplit model: AllReduce calls per block forward and backward
    (measured) and the formula's, the bytes of each call, the loss and gradient errors against the unsplit
    model, the median step with its interquartile range in ms, and ``speed`` (``step_time_verdict`` against
    the unsplit model's timed steps)."""
    rows = []
    for style in (k for k in TP_STYLES if k in demo):
        s = demo[style]
        q1, q2, q3 = (1e3 * q for q in quartiles(s["step_times"]))
        rows.append({"version": style, "forward": s["calls_per_block"]["forward"],
                     "backward": s["calls_per_block"]["backward"],
                     "formula": (s["expected_calls"]["forward"], s["expected_calls"]["backward"]),
                     "bytes": ", ".join(f"{b:,}" for b in s["bytes_per_call"]) or "not counted per call",
                     "loss_error": s["loss_error"], "grad_error": s["grad_error"], "step_ms": q2, "iqr_ms": (q1, q3),
                     "speed": step_time_verdict(s["step_times"], demo["unsplit_step_times"])})
    q1, q2, q3 = (1e3 * q for q in quartiles(demo["unsplit_step_times"]))
    rows.append({"version": "unsplit (one process)", "forward": 0, "backward": 0, "formula": None, "bytes": "",
                 "loss_error": None, "grad_error": None, "step_ms": q2, "iqr_ms": (q1, q3), "speed": ""})
    return rows


def counts_verdict(demo: dict) -> str:
    """'agree' when every version's AllReduce calls per block, forward and backward, and the bytes of each call
    are the formula's; else 'differ'."""
    ok = all(all(demo[k]["calls_per_block"][p] == demo[k]["expected_calls"][p] for p in PHASES)
             and demo[k]["bytes_per_call"] == [demo["expected_bytes"]] for k in TP_STYLES if k in demo)
    return "agree" if ok else "differ"


def timing_verdict(demo: dict) -> str:
    """'few' (fewer than ``MIN_STEPS`` timed steps on a side: no faster or slower said), 'loaded' (the
    machine's 1-minute load at least its core count while the demo ran: the times measure the contention as
    much as TP) or 'quiet'."""
    n = min([len(demo["unsplit_step_times"])] + [len(demo[k]["step_times"]) for k in TP_STYLES if k in demo])
    if n < MIN_STEPS:
        return "few"
    load, cores = demo.get("load"), demo.get("cores")
    return "loaded" if load is not None and cores and load >= cores else "quiet"


def unchanged_attention_outcome(demo: dict) -> str:
    """What ColwiseParallel on labkit's fused ``attn.qkv`` did with its Attention as written: 'raised' (the
    demo keeps the error's one line in ``unchanged_attention_error``), 'ran' (and computed the wrong heads)
    or 'not_tried'."""
    err = demo.get("unchanged_attention_error")
    return "not_tried" if err is None else "raised" if err else "ran"
