"""Tensor parallelism on labkit's GPT, Megatron-style (taught in chapter 10): every block's MLP split
column-then-row and its attention split by heads over ``world_size`` ranks, written twice -- in plain
PyTorch (two conjugate autograd Functions and a ``TPBlock``) and with ``torch.distributed.tensor.parallel``
(``ColwiseParallel``/``RowwiseParallel`` on a ``DeviceMesh``) -- and run on real processes.

    par.permute_qkv_per_head(w, b, n_head=4, world_size=2)   # the fused qkv, each rank's slice whole heads
    demo = par.tp_demo(model="tiny", world_size=2, micro_batch=4)
    demo["plain"]["calls_per_block"]   # {'forward': 2.0, 'backward': 2.0}: measured
    par.tp_link_table()        # predicted: a TP layer's AllReduces against its compute, per interconnect

labkit's attention has ONE fused ``qkv`` projection whose output is [q | k | v]. Split by columns as it
stands, rank 0 of 2 would get all of q and half of k; ``permute_qkv_per_head`` reorders its rows so each
rank's contiguous slice holds whole heads' q, k and v -- the layout both versions below use.

The split itself is in ``megatron`` (re-exported here), what each rank runs in ``tp_ranks``, the demo's
sentences and chart in ``tp_notes``. The ranks start, meet and end as in chapter 09's FSDP demo
(``engine.launch.spawn_ranks``: warm forks, a FileStore in a private folder, gloo on the loopback
interface only; nothing outlives the call).
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from ..course import Note
from ..netmodel import LINKS, Link, ring_allreduce_s, ring_bytes_sent
from ..playbook.args import real, whole
from ...base.errors import ConfigError, RunError
from ...engine.config import PRESETS, ModelSpec, _choice
from ...engine.launch import spawn_ranks
from ...whatif.devices import DEFAULTS, catalogue
from .formulas import tp_allreduce_bytes, tp_collectives_per_block
from .megatron import (COMM, CopyToTP, LocalAttention, QKVPerHead, ReduceFromTP, TPBlock, TPBlockSeparateQKV,
                       all_reduce, dtensor_block, permute_qkv_per_head, tp_shard_names)
from .notes import load_average
from .tp_notes import PHASES, TP_STYLES, plot_tp_demo, step_time_verdict, tp_demo_note
from .tp_ranks import _tp_rank

__all__ = ["permute_qkv_per_head", "QKVPerHead", "all_reduce", "COMM", "CopyToTP", "ReduceFromTP", "TPBlock",
           "TPBlockSeparateQKV", "LocalAttention", "dtensor_block", "tp_demo", "tp_link_table", "tp_demo_note",
           "plot_tp_demo", "TP_STYLES", "GPT3_175B", "tp_shard_names", "block_train_flops",
           "step_time_verdict"]


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


def _verdict(ratio: float) -> str:
    if ratio < 0.15:
        return "a small cost"
    if ratio < 0.5:
        return "a sizeable share"
    return "a large share" if ratio < 1 else "longer than the compute itself"


def tp_link_table(spec: ModelSpec = GPT3_175B, micro_batch: int = 1, tp_sizes=(2, 4, 8), device: str = "h100-sxm",
                  dtype_bytes: int = 2) -> tuple:
    """Predicted: per GPU and per block, the seconds of a TP block's 4 AllReduces (2 forward, 2 backward; ring
    model) over each interconnect against the seconds of the same block's matmuls split ``tp`` ways
    (``block_train_flops``, attention included / the catalogue's bf16 peak x the what-if model's achievable
    matmul fraction). No overlap assumed: the ratio is what the AllReduces add to the step. Returns
    (Note, rows)."""
    if not hasattr(spec, "d_model"):
        raise ConfigError("spec", spec, "a model shape such as lk.PRESETS['base'] or tensor.GPT3_175B")
    whole("micro_batch", micro_batch)
    dev = catalogue()["devices"].get(device)
    if dev is None:
        _choice("device", device, list(catalogue()["devices"]))
    peak = dev["peak_tflops"]["bf16"]["value"]
    if peak is None:
        raise ConfigError("device", device, "a GPU with bf16 units")
    achievable = peak * 1e12 * DEFAULTS[dev["vendor"]]["matmul_fraction"]
    b, t, d = micro_batch, spec.seq_len, spec.d_model
    flops = block_train_flops(b, t, d)  # 72 b T d^2 + 12 b T^2 d: matmuls and attention
    nbytes = tp_allreduce_bytes(b, t, d, dtype_bytes)
    calls = sum(v for k, v in tp_collectives_per_block().items() if k != "collective")
    links = {"nvlink": LINKS["nvlink"], "pcie": _pcie_link(), "infiniband": LINKS["infiniband"]}
    rows = []
    for tp in tp_sizes:
        whole("tp", tp, 2)
        compute = flops / tp / achievable
        for key, link in links.items():
            comm = calls * ring_allreduce_s(nbytes, tp, link.bandwidth, link.latency)
            rows.append({"tp": tp, "link": link.name, "key": key, "compute_s": compute, "comm_s": comm,
                         "bytes_sent": calls * ring_bytes_sent(nbytes, tp), "ratio": comm / compute})
    lines = [f"**Predicted** (a model, not measured): one block of {spec.note.split(':')[0]}, micro-batch {b}, "
             f"bf16 on {dev['name']} at {DEFAULTS[dev['vendor']]['matmul_fraction']:.0%} of its "
             f"{peak:g} TFLOP/s peak. Each TP AllReduce sums {nbytes / 1e6:.0f} MB; a block makes {calls} of them "
             f"per micro-batch (forward and backward). Its training FLOPs, {flops / 1e12:.1f} TFLOP (6 x 12 d² per "
             "token for the weights, plus 12 T² d per sequence for attention's scores and values), split `tp` "
             "ways: the matmul time.", "",
             "| TP | link | GPU sends per block | AllReduce time | matmul time | AllReduce / matmul |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tp']} | {r['link']} | {r['bytes_sent'] / 1e6:.0f} MB | {1e3 * r['comm_s']:.2f} ms | "
                     f"{1e3 * r['compute_s']:.2f} ms | {r['ratio']:.2f} |")
    top = max(tp_sizes)
    by = {r["key"]: r for r in rows if r["tp"] == top}
    lines += ["", f"At TP={top} the block's AllReduces would add "
              + ", ".join(f"{by[k]['ratio']:.0%} over {by[k]['link']} ({_verdict(by[k]['ratio'])})" for k in links)
              + " to its matmul time -- this model assumes no overlap: every AllReduce is added to the "
              "step, as the demo above runs them (each waits for the matmul before it; the next layer "
              "waits for its sum). Practice hides part of it: Megatron-LM starts the backward AllReduce of a "
              "column-parallel layer's input gradient asynchronously and computes that layer's weight gradient "
              "meanwhile; with sequence parallelism, Transformer Engine's `tp_comm_overlap` splits the AllGather "
              "and ReduceScatter into chunks that overlap the GEMMs."]
    longer = [by[k] for k in links if by[k]["ratio"] > 1]
    if longer:
        lines[-1] += (" Overlap hides at most the compute beside it: over "
                      + " and ".join(f"{r['link']} at least {r['ratio'] - 1:.0%}" for r in longer)
                      + " of the matmul time would stay exposed even if every AllReduce overlapped.")
    near = by["nvlink"]["ratio"]
    if all(near < by[k]["ratio"] for k in links if k != "nvlink") and longer:
        lines[-1] += (" That is why TP stays inside one NVLink node and data or pipeline parallelism spans the "
                      "nodes.")
    return Note("\n".join(lines)), rows
