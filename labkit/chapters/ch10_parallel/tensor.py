"""Tensor parallelism on labkit's GPT, Megatron-style (taught in chapter 10): every block's MLP split
column-then-row and its attention by heads, in plain PyTorch (f and g around one counting ``all_reduce``,
``TPBlock``) and with ``torch.distributed.tensor.parallel`` (``dtensor_block``), on real processes; the
fused qkv's rows permuted per head (``permute_qkv_per_head``) so a rank's slice holds whole heads.

    demo = par.tp_demo(model="tiny", world_size=2, micro_batch=4)
    demo["plain"]["calls_per_block"]   # {'forward': 2.0, 'backward': 2.0}: measured
"""
from __future__ import annotations

import os
import statistics
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...base.runtime import ConfigError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.ddp import demo_batches as _demo_batches
from ...engine.model import GPT
from ...tools.collectives import (CollectiveCounter, commdebug_block_error, commdebug_counter, commdebug_counts,
                                  counter_choice, device_kind, figure, gpu_count, load_average, rank_device,
                                  rank_lab)
from .formulas import tp_allreduce_bytes, tp_collectives_per_block


class QKVPerHead(NamedTuple):
    """The fused qkv weight and bias with rows reordered: ``weight = original[order]``, ``original =
    weight[inverse]`` (and the same for a gradient)."""

    weight: torch.Tensor
    bias: torch.Tensor
    order: torch.Tensor
    inverse: torch.Tensor


def _check_qkv(weight, bias, n_head, world_size):
    if not torch.is_tensor(weight) or weight.dim() != 2 or weight.shape[0] != 3 * weight.shape[1]:
        raise ConfigError("weight", getattr(weight, "shape", type(weight).__name__),
                          "a fused qkv weight of shape (3 d, d), e.g. block.attn.qkv.weight")
    d = weight.shape[1]
    if bias is not None and (not torch.is_tensor(bias) or tuple(bias.shape) != (3 * d,)):
        raise ConfigError("bias", getattr(bias, "shape", type(bias).__name__), f"None or a ({3 * d},) tensor")
    whole("n_head", n_head)
    if n_head % whole("world_size", world_size):
        raise ConfigError("world_size", world_size, f"a divisor of the model's {n_head} heads: each rank "
                          "computes whole heads")
    if d % n_head:
        raise ConfigError("n_head", n_head, f"a divisor of the width {d}")


def permute_qkv_per_head(weight, bias, n_head: int, world_size: int) -> QKVPerHead:
    """Reorder the rows of a fused (3d, d) qkv weight (and its (3d,) bias), [q | k | v], so that
    rank r's contiguous 1/world_size slice is [q | k | v] of its own heads r*h .. (r+1)*h - 1 (h
    = n_head/world_size).
    Shown in 10_when_the_model_does_not_fit (code-10-tp-qkv)."""
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
    """The same block as if q, k and v were three column-parallel layers, each with its own f: three
    AllReduces of the input's gradient in backward instead of one (4 per block, not 2; with one f
    before all three, as Megatron's fused linear_qkv, it stays 2).
    Shown in 10_when_the_model_does_not_fit (code-10-tp)."""

    def attention(self, x):
        B, T, _ = x.shape
        w, b = self.qkv_w.chunk(3), self.qkv_b.chunk(3)  # this rank's q, k and v rows: three layers
        q, k, v = (F.linear(CopyToTP.apply(x), w[i], b[i])  # an f each: 3 AllReduces in backward
                   .view(B, T, self.heads, -1).transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return ReduceFromTP.apply(F.linear(y, self.proj_w)) + self.proj_b


# each TPBlock parameter: (its name, the full block's name, the dim it is split on or None)
TP_SHARDS = [("qkv_w", "attn.qkv.weight", 0), ("qkv_b", "attn.qkv.bias", 0), ("proj_w", "attn.proj.weight", 1),
             ("proj_b", "attn.proj.bias", None), ("fc_w", "fc.weight", 0), ("fc_b", "fc.bias", 0),
             ("out_w", "out.weight", 1), ("out_b", "out.bias", None), ("ln1.weight", "ln1.weight", None),
             ("ln1.bias", "ln1.bias", None), ("ln2.weight", "ln2.weight", None), ("ln2.bias", "ln2.bias", None)]


# ---- the same with torch.distributed.tensor.parallel ------------------------------------------------------

class LocalAttention(nn.Module):
    """labkit's Attention as a tensor-parallel rank runs it: it splits the width its qkv gives it
    (its own heads' q, k, v) into three, where ``Attention.forward`` splits by the model's full
    width C -- under ``ColwiseParallel`` the local qkv output is 3C/world_size wide, and
    ``split(C, dim=2)`` cuts it into two pieces at world size 2: "ValueError: not enough values
    to unpack" (torch 2.13, 2.14.1; the demo reports what this torch does). Were it to unpack,
    rank 0 would hold all of q and half of k.
    Shown in 10_when_the_model_does_not_fit (code-10-tp-dtensor)."""

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
    """Parallelise one labkit Block in place with ``torch.distributed.tensor.parallel`` over a 1-D
    ``mesh``: the per-head qkv permutation, then Megatron's plan.
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
# the demo's versions: "plain" (f and g, qkv permuted per head), "separate" (q, k, v three column-parallel
# layers), "dtensor" (ColwiseParallel/RowwiseParallel on a DeviceMesh)
TP_STYLES = ("plain", "separate", "dtensor")


# ---- running it on real processes ------------------------------------------

def tp_demo(model: str = "tiny", world_size: int = 2, micro_batch: int = 4, seed: int = 0,
            timeout_s: float = 120.0, styles=("plain", "separate", "dtensor"), repeats: int = 5) -> dict:
    """Run labkit's GPT tensor-parallel on ``world_size`` processes: each rank builds the full GPT from ``seed``,
    converts every block (``styles``) and runs forward+backward on the same batch. Per style: AllReduce calls
    per block and pass and the bytes of each (measured, against ``formulas``), each rank's loss and the max
    gradient difference against the unsplit model, rank 0's timed steps (warm-up excluded) beside the unsplit
    model's, with the machine's ``load`` and ``cores``. ``ok`` False and ``error`` where a rank failed or was
    late."""
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
    load = load_average()
    run = rank_lab({"ok": True, "model": model, "world_size": world_size, "kind": kind}, _tp_rank,
                   (spec, micro_batch, seed, tuple(styles), repeats, kind), "TP demo", timeout_s, "labkit-tp-")
    if not run["ok"]:
        return {k: run[k] for k in ("ok", "error", "model", "world_size")}
    out = _summary(run["ranks"], spec, model, world_size, micro_batch, styles, kind, run["seconds"])
    out.update(load=max(load, load_average()), cores=os.cpu_count())  # what else shared the cores while it ran
    return out


def _summary(results, spec, model, world_size, micro_batch, styles, kind, seconds) -> dict:
    r0 = results[0]
    unsplit = r0["unsplit_step_times"]
    expected_bytes = tp_allreduce_bytes(micro_batch, spec.seq_len, spec.d_model, dtype_bytes=4)  # fp32 here
    out = {"ok": True, "model": model, "world_size": world_size, "micro_batch": micro_batch, "kind": kind,
           "n_layer": spec.n_layer, "ref_loss": r0["ref_loss"], "unsplit_step_s": statistics.median(unsplit),
           "unsplit_step_times": unsplit, "expected_bytes": expected_bytes, "seconds": seconds, "gpus": gpu_count(),
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
            "step_times": s0["step_times"], "commdebug_per_block": s0.get("commdebug")}
    return out


def time_steps(model, x, y, repeats: int) -> list:
    """Seconds of each of ``repeats`` forward+backward steps after one warm-up."""
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


# ---- the demo's figures as rows and verdicts (the chapter draws the table and says the words) --------------

def quartiles(times) -> tuple:
    xs = sorted(times)
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def step_time_verdict(times, unsplit_times) -> str:
    """'faster', 'slower', 'within noise' (the interquartile ranges overlap) or 'too few steps' (under ``MIN_STEPS``
    on a side) against the unsplit model's steps."""
    if len(times) < MIN_STEPS or len(unsplit_times) < MIN_STEPS:
        return "too few steps"
    (a1, _, a3), (b1, _, b3) = quartiles(times), quartiles(unsplit_times)
    if a1 <= b3 and b1 <= a3:
        return "within noise"
    return "faster" if a3 < b1 else "slower"


def tp_rows(demo: dict) -> list:
    """One row per version the demo ran, then the unsplit model: AllReduce calls per block and pass (measured) and
    the formula's, the bytes of each call, the loss and gradient errors, the median step and its
    interquartile range in ms, and ``speed`` (``step_time_verdict``)."""
    rows = []
    for style in (k for k in TP_STYLES if k in demo):
        s = demo[style]
        q1, q2, q3 = (1e3 * q for q in quartiles(s["step_times"]))
        calls = s["calls_per_block"]
        rows.append({"version": style, "forward": calls["forward"], "backward": calls["backward"],
                     "formula": (s["expected_calls"]["forward"], s["expected_calls"]["backward"]),
                     "bytes": ", ".join(f"{b:,}" for b in s["bytes_per_call"]) or "not counted per call",
                     "loss_error": s["loss_error"], "grad_error": s["grad_error"], "step_ms": q2, "iqr_ms": (q1, q3),
                     "speed": step_time_verdict(s["step_times"], demo["unsplit_step_times"])})
    q1, q2, q3 = (1e3 * q for q in quartiles(demo["unsplit_step_times"]))
    rows.append({"version": "unsplit (one process)", "forward": 0, "backward": 0, "formula": None, "bytes": "",
                 "loss_error": None, "grad_error": None, "step_ms": q2, "iqr_ms": (q1, q3), "speed": ""})
    return rows


def counts_verdict(demo: dict) -> str:
    """'agree' when every version's calls per block and pass and the bytes of each call are the formula's."""
    ok = all(all(demo[k]["calls_per_block"][p] == demo[k]["expected_calls"][p] for p in PHASES)
             and demo[k]["bytes_per_call"] == [demo["expected_bytes"]] for k in TP_STYLES if k in demo)
    return "agree" if ok else "differ"


def timing_verdict(demo: dict) -> str:
    """'few' (under ``MIN_STEPS`` timed steps on a side), 'loaded' (the 1-minute load at least the core count while
    the demo ran: the times measure the contention as much as TP) or 'quiet'."""
    n = min([len(demo["unsplit_step_times"])] + [len(demo[k]["step_times"]) for k in TP_STYLES if k in demo])
    if n < MIN_STEPS:
        return "few"
    load, cores = demo.get("load"), demo.get("cores")
    return "loaded" if load is not None and cores and load >= cores else "quiet"


def unchanged_attention_outcome(demo: dict) -> str:
    """What ColwiseParallel on the fused ``attn.qkv`` did with labkit's Attention as written: 'raised'
    (``unchanged_attention_error`` keeps the line), 'ran' (computing the wrong heads) or 'not_tried'."""
    err = demo.get("unchanged_attention_error")
    return "not_tried" if err is None else "raised" if err else "ran"


def _plain_grad_error(tp_model, ref, spec, world_size) -> float:
    """Max |TP gradient - unsplit gradient|, the TP ones gathered into the full layout, qkv rows mapped back."""
    outside = [p for n, p in tp_model.named_parameters() if not n.startswith("blocks.")]
    worst = max((p.grad - q.grad).abs().max().item() for p, q in
                zip(outside, [q for n, q in ref.named_parameters() if not n.startswith("blocks.")]))
    inverse = permute_qkv_per_head(ref.blocks[0].attn.qkv.weight, ref.blocks[0].attn.qkv.bias, spec.n_head,
                                   world_size).inverse
    for tb, fb in zip(tp_model.blocks, ref.blocks):
        full = dict(fb.named_parameters())
        for tp_name, full_name, dim in TP_SHARDS:
            g = tb.get_parameter(tp_name).grad
            if dim is not None:  # gather every rank's part (plain dist: not one of the counted calls)
                parts = [torch.empty_like(g) for _ in range(world_size)]
                dist.all_gather(parts, g.contiguous())
                g = torch.cat(parts, dim=dim)
            g = g[inverse] if tp_name.startswith("qkv") else g
            worst = max(worst, (g - full[full_name].grad).abs().max().item())
    return worst


def _dtensor_grad_error(tp_model, ref, spec, world_size) -> float:
    """The same for DTensor gradients, each gathered whole (``full_tensor``)."""
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


def _counted_step(model, x, y, style):
    """One forward and one backward, each's collectives counted: by ``all_reduce``'s own notes (plain versions) and
    by a dispatch mode that sees every collective op -- torch's CommDebugMode where it traces labkit's Block,
    the course's own otherwise."""
    for phase in COMM:
        COMM[phase].clear()
    new_counter = CollectiveCounter if commdebug_block_error() else commdebug_counter
    with new_counter() as fwd:
        loss = model(x, y)
    with new_counter() as bwd:
        loss.backward()
    seen = {"forward": fwd.calls, "backward": bwd.calls}
    own = None if style == "dtensor" else {p: [("all_reduce", b) for b in COMM[p]] for p in COMM}
    return own, seen, loss


def _unchanged_attention_error(spec, seed, mesh, x) -> str:
    """What ColwiseParallel on the fused ``attn.qkv`` does to labkit's Attention as written: the exception's text,
    or ""."""
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
    """A spawned TP rank: the unsplit GPT and each style's version from the same seed, one counted step each."""
    device = rank_device(kind, rank.rank)
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
                                    "step_times": time_steps(model, x, y, repeats)}
            if style == "dtensor" and commdebug_block_error():
                out["styles"][style]["commdebug"] = commdebug_counts(model.blocks[0], spec.d_model, x)
        ref.zero_grad(set_to_none=True)
        out["unsplit_step_times"] = time_steps(ref, x, y, repeats)  # every rank at once: each on its own core
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
