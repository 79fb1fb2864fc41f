"""Tensor parallelism on labkit's GPT, Megatron-style (taught in chapter 10): every block's MLP split
column-then-row and its attention split by heads over ``world_size`` ranks, written twice -- in plain PyTorch
(two conjugate autograd Functions f and g around one counting ``all_reduce``, and ``TPBlock``) and with
``torch.distributed.tensor.parallel`` (``LocalAttention``, ``dtensor_block``) -- and run on real processes;
its figures as a table's rows, verdict keys and a chart; and, predicted, why TP stays inside a node.

    par.permute_qkv_per_head(w, b, n_head=4, world_size=2)   # the fused qkv, each rank's slice whole heads
    demo = par.tp_demo(model="tiny", world_size=2, micro_batch=4)
    demo["plain"]["calls_per_block"]   # {'forward': 2.0, 'backward': 2.0}: measured
    par.tp_link_rows()         # predicted: a TP layer's AllReduces against its compute, per interconnect

labkit's attention has ONE fused ``qkv`` projection whose output is [q | k | v]. Split by columns as it
stands, rank 0 of 2 would get all of q and half of k; ``permute_qkv_per_head`` reorders its rows so each
rank's contiguous slice holds whole heads' q, k and v -- the layout both versions use. The ranks start,
meet and end through ``engine.launch.spawn_ranks`` (warm forks, a FileStore in a private folder, gloo on
the loopback interface only; nothing outlives the call).
"""
from __future__ import annotations

import functools
import os
import statistics
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..netmodel import LINKS, Link
from ..playbook.args import real, whole
from ..playbook.fsdp import _demo_batches
from ...base.errors import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, ModelSpec, _choice
from ...engine.launch import spawn_ranks
from ...engine.model import GPT, Block
from ...whatif.devices import DEFAULTS, catalogue
from ...whatif.roofline import ring_allreduce_s, ring_bytes_sent
from .formulas import tp_allreduce_bytes, tp_collectives_per_block
from .ranks import CollectiveCounter, device_kind, figure, load_average, tensor_bytes

class QKVPerHead(NamedTuple):
    """The fused qkv weight and bias with rows reordered (``weight = original[order]``) so that rank r's
    contiguous 1/world_size slice holds whole heads' q, k and v; ``original = weight[inverse]`` (and the same
    for a gradient)."""

    weight: torch.Tensor
    bias: torch.Tensor
    order: torch.Tensor
    inverse: torch.Tensor


def _heads_split(n_head, world_size):
    whole("n_head", n_head)
    whole("world_size", world_size)
    if n_head % world_size:
        raise ConfigError("world_size", world_size, f"a divisor of the model's {n_head} heads: each rank "
                          "computes whole heads")


def _check_qkv(weight, bias, n_head, world_size):
    """A ConfigError for a fused qkv that cannot be split by heads over ``world_size`` ranks."""
    if not torch.is_tensor(weight) or weight.dim() != 2 or weight.shape[0] != 3 * weight.shape[1]:
        raise ConfigError("weight", getattr(weight, "shape", type(weight).__name__),
                          "a fused qkv weight of shape (3 d, d), e.g. block.attn.qkv.weight")
    d = weight.shape[1]
    if bias is not None and (not torch.is_tensor(bias) or tuple(bias.shape) != (3 * d,)):
        raise ConfigError("bias", getattr(bias, "shape", type(bias).__name__), f"None or a ({3 * d},) tensor")
    _heads_split(n_head, world_size)
    if d % n_head:
        raise ConfigError("n_head", n_head, f"a divisor of the width {d}")


def permute_qkv_per_head(weight, bias, n_head: int, world_size: int) -> QKVPerHead:
    """Reorder the rows of a fused (3d, d) qkv weight (and its (3d,) bias), [q | k | v], each of
    q, k, v split into ``n_head`` heads, so that rank r's slice ``r * 3d/world_size ...`` is
    [q | k | v] of heads r*h .. (r+1)*h - 1 (h = n_head/world_size).
    Returns ``QKVPerHead(weight, bias, order, inverse)``. Shown in 10_when_the_model_does_not_fit (code-10-tp-qkv)."""
    _check_qkv(weight, bias, n_head, world_size)  # ConfigError where heads cannot split evenly
    d = weight.shape[1]
    local = d // world_size  # one rank's share of q (and of k, and of v): whole heads
    rows = torch.arange(local)
    # rank 0: q rows 0..local-1, k rows d..d+local-1, v rows 2d..2d+local-1; then rank 1's, ...
    order = torch.cat([part * d + r * local + rows for r in range(world_size) for part in range(3)])
    inverse = torch.argsort(order)  # original = permuted[inverse]: how the gradients map back
    bias = None if bias is None else bias.detach()[order]
    return QKVPerHead(weight.detach()[order], bias, order, inverse)


# ---- the plain-PyTorch version (shown in the chapter: code-10-tp) ----------------------------------------

COMM = {"forward": [], "backward": []}  # bytes of every TP AllReduce, by pass: what the demo reads


def all_reduce(t, phase: str):
    """Sum ``t`` over the ranks in place -- every TP AllReduce goes through here, and is noted.
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""
    COMM[phase].append(t.numel() * t.element_size())
    dist.all_reduce(t)
    return t


class CopyToTP(torch.autograd.Function):
    """f, before a column-parallel layer: forward the identity (every rank has the whole input);
    backward sum the input's gradient (each rank's columns gave only their share of it).
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), "backward")


class ReduceFromTP(torch.autograd.Function):
    """g, after a row-parallel layer: forward sum the ranks' partial outputs; backward identity.
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    @staticmethod
    def forward(ctx, x):
        return all_reduce(x.clone(), "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad


def _part(t, dim, rank, world_size):
    return nn.Parameter(t.detach().chunk(world_size, dim=dim)[rank].clone())


class TPBlock(nn.Module):
    """One labkit ``Block`` as rank ``rank`` of ``world_size`` holds it (dropout 0): qkv and fc
    column-split, proj and out row-split, the LayerNorms and the row layers' biases replicated.
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    def __init__(self, block, rank: int, world_size: int):
        super().__init__()
        attn, n = block.attn, world_size
        self.ln1, self.ln2 = block.ln1, block.ln2  # replicated: each rank normalises all of x
        self.heads = attn.n_head // n  # this rank's heads
        qkv = permute_qkv_per_head(attn.qkv.weight, attn.qkv.bias, attn.n_head, n)
        self.qkv_w, self.qkv_b = _part(qkv.weight, 0, rank, n), _part(qkv.bias, 0, rank, n)
        self.proj_w, self.proj_b = _part(attn.proj.weight, 1, rank, n), attn.proj.bias
        self.fc_w, self.fc_b = _part(block.fc.weight, 0, rank, n), _part(block.fc.bias, 0, rank, n)
        self.out_w, self.out_b = _part(block.out.weight, 1, rank, n), block.out.bias

    def attention(self, x):
        B, T, _ = x.shape
        qkv = F.linear(CopyToTP.apply(x), self.qkv_w, self.qkv_b)  # column-parallel: my heads
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return ReduceFromTP.apply(F.linear(y, self.proj_w)) + self.proj_b  # bias once, after sum

    def mlp(self, x):
        h = F.gelu(F.linear(CopyToTP.apply(x), self.fc_w, self.fc_b))  # my 4d/n hidden units
        return ReduceFromTP.apply(F.linear(h, self.out_w)) + self.out_b  # partial sums, summed

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TPBlockSeparateQKV(TPBlock):
    """The same block as if q, k and v were three layers, each column-parallel with its own f:
    three AllReduces of the input's gradient in backward instead of one (4 per block, not 2).
    With one f before all three (as Megatron's fused linear_qkv) it would stay 2.
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    def attention(self, x):
        B, T, _ = x.shape
        w, b = self.qkv_w.chunk(3), self.qkv_b.chunk(3)  # this rank's q, k and v rows: three layers
        q, k, v = (F.linear(CopyToTP.apply(x), w[i], b[i])  # an f each: 3 AllReduces in backward
                   .view(B, T, self.heads, -1).transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return ReduceFromTP.apply(F.linear(y, self.proj_w)) + self.proj_b


def tp_shard_names():
    """How each TPBlock parameter maps to the full block's: (TP name, full name, split dim or None)."""
    return [("qkv_w", "attn.qkv.weight", 0), ("qkv_b", "attn.qkv.bias", 0), ("proj_w", "attn.proj.weight", 1),
            ("proj_b", "attn.proj.bias", None), ("fc_w", "fc.weight", 0), ("fc_b", "fc.bias", 0),
            ("out_w", "out.weight", 1), ("out_b", "out.bias", None), ("ln1.weight", "ln1.weight", None),
            ("ln1.bias", "ln1.bias", None), ("ln2.weight", "ln2.weight", None), ("ln2.bias", "ln2.bias", None)]


# ---- the same with torch.distributed.tensor.parallel ------------------------------------------------------

class LocalAttention(nn.Module):
    """labkit's Attention as a tensor-parallel rank runs it: it splits the width its qkv gives it
    (its own heads' q, k, v) into three, where labkit's ``Attention.forward`` splits by the
    model's full width C.

    Why the unchanged Attention fails under ``ColwiseParallel`` on ``attn.qkv``: the local qkv
    output is 3C/world_size wide, and ``split(C, dim=2)`` cuts it into pieces of C -- at world
    size 2 into two (C and C/2), so ``q, k, v = ...`` raises "ValueError: not enough values to
    unpack (expected 3, got 2)" (torch 2.13 and 2.14.1; the demo reports what this torch does).
    Were it to unpack, rank 0 would hold all of q and half of k. The per-head permutation plus this
    forward fix both. Shown in 10_when_the_model_does_not_fit (code-10-tp-dtensor)."""

    def __init__(self, attn, world_size: int):
        super().__init__()
        self.qkv, self.proj, self.heads = attn.qkv, attn.proj, attn.n_head // world_size

    def forward(self, x):
        B, T, _ = x.shape
        qkv = self.qkv(x)  # a local tensor: this rank's heads' q, k and v
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


def dtensor_block(block, mesh):
    """Parallelise one labkit Block in place with ``torch.distributed.tensor.parallel`` over
    ``mesh`` (a 1-D DeviceMesh): the per-head qkv permutation, then Megatron's plan.
    Shown in 10_when_the_model_does_not_fit (code-10-tp-dtensor)."""
    from torch.distributed.tensor.parallel import (  # deferred: a second to import
        ColwiseParallel, RowwiseParallel, parallelize_module)

    ws, attn = mesh.size(), block.attn
    qkv = permute_qkv_per_head(attn.qkv.weight, attn.qkv.bias, attn.n_head, ws)
    with torch.no_grad():  # per-head order: ColwiseParallel's row chunks are whole heads
        attn.qkv.weight.copy_(qkv.weight)
        attn.qkv.bias.copy_(qkv.bias)
    block.attn = LocalAttention(attn, ws)
    plan = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),  # heads; 1 AllReduce
            "fc": ColwiseParallel(), "out": RowwiseParallel()}  # 4d hidden units; 1 AllReduce
    return parallelize_module(block, mesh, plan)


PHASES = ("forward", "backward")
MIN_STEPS = 3  # timed steps per version before a faster/slower is stated: quartiles need a few
# the demo's versions: "plain" (f and g as autograd Functions, the fused qkv permuted per head), "separate"
# (q, k, v as three column-parallel layers), "dtensor" (ColwiseParallel/RowwiseParallel on a DeviceMesh)
TP_STYLES = ("plain", "separate", "dtensor")


# ---- running it on real processes ------------------------------------------

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
    kind = device_kind(world_size)
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


def _time_step(model, x, y, repeats: int) -> list:
    """Seconds of each of ``repeats`` forward+backward steps (one warm-up step first, excluded)."""
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        model(x, y).backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        if dist.is_initialized():
            dist.barrier()  # the step ends when the slowest rank is done
        if i:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return times


def _gathered(t, dim, world_size):
    """The full tensor from every rank's part along ``dim`` (plain dist: not one of the counted calls)."""
    parts = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=dim)


def _plain_grad_error(tp_model, ref, spec, world_size) -> float:
    """Max |TP gradient - unsplit gradient| over every parameter, the TP ones gathered into the full layout
    (qkv rows mapped back with the permutation's inverse)."""
    outside = [p for n, p in tp_model.named_parameters() if not n.startswith("blocks.")]
    worst = max((p.grad - q.grad).abs().max().item() for p, q in
                zip(outside, [q for n, q in ref.named_parameters() if not n.startswith("blocks.")]))
    inverse = permute_qkv_per_head(ref.blocks[0].attn.qkv.weight, ref.blocks[0].attn.qkv.bias, spec.n_head,
                                   world_size).inverse
    for tb, fb in zip(tp_model.blocks, ref.blocks):
        full = dict(fb.named_parameters())
        for tp_name, full_name, dim in tp_shard_names():
            g = tb.get_parameter(tp_name).grad
            g = g if dim is None else _gathered(g, dim, world_size)
            g = g[inverse] if tp_name.startswith("qkv") else g
            worst = max(worst, (g - full[full_name].grad).abs().max().item())
    return worst


def _dtensor_grad_error(tp_model, ref, spec, world_size) -> float:
    """Max |TP gradient - unsplit gradient|: each DTensor gradient gathered whole (``full_tensor``), the
    qkv rows mapped back with the permutation's inverse."""
    worst = 0.0
    inverse = None
    for (n, p), q in zip(tp_model.named_parameters(), ref.parameters()):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        if n.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            if inverse is None:
                inverse = permute_qkv_per_head(q.new_zeros(3 * spec.d_model, spec.d_model), None, spec.n_head,
                                               world_size).inverse
            g = g[inverse]
        worst = max(worst, (g - q.grad).abs().max().item())
    return worst


@functools.lru_cache(maxsize=None)
def commdebug_block_error() -> str:
    """"" when torch's ``CommDebugMode`` traces a forward and a backward of labkit's ``Block`` in this process's
    torch; otherwise the exception it raised (torch 2.13: "IndexError: list index out of range"; 2.14.1 traces
    it; see ``CollectiveCounter``), or why it is missing. Found by trying it, never from the version number: a fix (or a
    regression) in any torch shows up here. No process group is needed: a Block without collectives."""
    try:
        from torch.distributed.tensor.debug import CommDebugMode  # deferred: DTensor's import costs a second
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    torch.manual_seed(0)
    x = torch.randn(2, 8, 64, requires_grad=True)
    try:
        with CommDebugMode():
            out = Block(64, 4, 0.0)(x)  # its dropout module runs twice: what broke the tracker
        with CommDebugMode():
            out.sum().backward()
    except Exception as e:  # noqa: BLE001 -- any failure means: count with the course's own mode
        return f"{type(e).__name__}: {e}"
    return ""


def _commdebug_counter():
    """A ``CommDebugMode`` that also notes each collective's bytes: the collectives are the ops CommDebugMode
    itself counted (its total grew), in its own names (native functional ops under their legacy names)."""
    from torch.distributed.tensor.debug import CommDebugMode  # deferred: DTensor only

    class CommDebugCounter(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.calls = []  # (op name, bytes), as CollectiveCounter's

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = self.get_total_counts()
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if self.get_total_counts() > before:
                self.calls.append((func._overloadpacket.__name__.rstrip("_"), tensor_bytes(args)))
            return out

    return CommDebugCounter()


def counter_choice() -> dict:
    """Which mode counts the demo's collectives here: {"counter": "CommDebugMode" or "CollectiveCounter",
    "why": the error CommDebugMode raised on labkit's Block ("" when it traced it), "torch": the version}."""
    error = commdebug_block_error()
    return {"counter": "CollectiveCounter" if error else "CommDebugMode", "why": error, "torch": torch.__version__}


def _counted_step(model, x, y, style):
    """One forward and one backward, the TP collectives of each counted: by ``all_reduce``'s own notes for
    the plain versions, by a dispatch mode that sees every collective op for DTensor (and, as a cross-check,
    for the plain ones too) -- torch's CommDebugMode where it traces labkit's Block, the course's own otherwise."""
    for phase in COMM:
        COMM[phase].clear()
    new_counter = CollectiveCounter if commdebug_block_error() else _commdebug_counter
    with new_counter() as fwd:
        loss = model(x, y)
    with new_counter() as bwd:
        loss.backward()
    seen = {"forward": fwd.calls, "backward": bwd.calls}
    own = None if style == "dtensor" else {p: [("all_reduce", b) for b in COMM[p]] for p in COMM}
    return own, seen, loss


def _commdebug_counts(block, d_model: int, x) -> dict:
    """CommDebugMode's own AllReduce count, forward and backward, for one DTensor block's attention and MLP
    called directly -- the cross-check where its module tracker breaks on Block.forward itself (see
    CollectiveCounter): there the demo counts with the course's own mode."""
    from torch.distributed.tensor.debug import CommDebugMode  # deferred: DTensor only

    h = torch.randn(x.shape[0], x.shape[1], d_model, device=x.device, requires_grad=True)
    with CommDebugMode() as fwd:
        out = block.attn(h) + block.out(torch.nn.functional.gelu(block.fc(h)))
    with CommDebugMode() as bwd:
        out.sum().backward()
    block.zero_grad(set_to_none=True)
    return {p: sum(v for k, v in m.get_comm_counts().items() if "all_reduce" in str(k))
            for p, m in (("forward", fwd), ("backward", bwd))}


def _unchanged_attention_error(spec, seed, mesh, x) -> str:
    """What ColwiseParallel on labkit's fused ``attn.qkv`` does to its Attention as written (no permutation,
    no LocalAttention): the exception's text, or "" if it ran."""
    from torch.distributed.tensor.parallel import (  # deferred: a second to import; DTensor only
        ColwiseParallel, RowwiseParallel, parallelize_module)

    torch.manual_seed(seed)
    block = GPT(spec).blocks[0].to(x.device)
    parallelize_module(block, mesh, {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel()})
    try:
        block(torch.randn(x.shape[0], x.shape[1], spec.d_model, device=x.device))
    except Exception as e:  # noqa: BLE001 -- reported: the chapter says what happens
        return f"{type(e).__name__}: {e}"
    return ""


def _tp_model(style, spec, seed, rank, world_size, mesh, device):
    torch.manual_seed(seed)
    model = GPT(spec).to(device)  # the full model from the same seed on every rank: the same weights to split
    if style == "dtensor":
        for block in model.blocks:
            dtensor_block(block, mesh)
    else:
        cls = TPBlockSeparateQKV if style == "separate" else TPBlock
        model.blocks = nn.ModuleList(cls(b, rank, world_size) for b in model.blocks)
    return model


def _tp_rank(rank, spec, micro_batch: int, seed: int, styles: tuple, repeats: int, kind: str) -> dict:
    """A spawned TP rank: the unsplit GPT and each style's TP version of it from the same seed, one counted
    forward+backward on the same batch, the gradients compared, then timed steps."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    device = torch.device(f"cuda:{rank.rank}" if kind == "cuda" else "cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    ws = rank.world_size
    with ddp_mod.process_group(kind, rank.rank, ws, rank.file_store()):
        x, y = (t.to(device) for t in next(_demo_batches(spec, micro_batch, 1, seed)))
        torch.manual_seed(seed)
        ref = GPT(spec).to(device)
        ref_loss = ref(x, y)
        ref_loss.backward()
        out = {"ref_loss": ref_loss.item(), "styles": {}, **counter_choice()}
        mesh = None
        for style in styles:
            if style == "dtensor" and mesh is None:
                from torch.distributed.device_mesh import init_device_mesh  # deferred: only for DTensor

                mesh = init_device_mesh(device.type, (ws,))
                out["unchanged_attention_error"] = _unchanged_attention_error(spec, seed, mesh, x)
            model = _tp_model(style, spec, seed, rank.rank, ws, mesh, device)
            own, seen, loss = _counted_step(model, x, y, style)
            err = (_dtensor_grad_error if style == "dtensor" else _plain_grad_error)(model, ref, spec, ws)
            model.zero_grad(set_to_none=True)
            out["styles"][style] = {"own": own, "seen": seen, "loss": loss.item(), "grad_error": err,
                                    "step_times": _time_step(model, x, y, repeats)}
            if style == "dtensor" and commdebug_block_error():
                out["styles"][style]["commdebug"] = _commdebug_counts(model.blocks[0], spec.d_model, x)
        ref.zero_grad(set_to_none=True)
        out["unsplit_step_times"] = _time_step(ref, x, y, repeats)  # every rank at once: each on its own core
        return out


def plot_tp_demo(demo: dict, width: float = 7.0, height: float = 2.6):
    """Measured AllReduce calls per block, forward and backward, per version, against the formula."""
    if not isinstance(demo, dict) or not demo.get("ok"):
        raise ConfigError("demo", type(demo).__name__, "the dict tp_demo returns, with ok True")
    fig, ax = figure(width, height)
    styles = [s for s in TP_STYLES if s in demo]
    for i, phase in enumerate(PHASES):
        xs = [j + (i - 0.5) * 0.38 for j in range(len(styles))]
        ax.bar(xs, [demo[s]["calls_per_block"][phase] for s in styles], 0.36, label=f"{phase} (measured)",
               color=("#4c72b0", "#dd8452")[i])
        ax.scatter(xs, [demo[s]["expected_calls"][phase] for s in styles], marker="_", s=300, color="black",
                   zorder=3, label="formula" if i else None)
    ax.set_xticks(range(len(styles)), styles)
    ax.set_ylabel("AllReduce calls per block", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Measured on real processes: TP collectives per transformer block", fontsize=9)
    return fig
