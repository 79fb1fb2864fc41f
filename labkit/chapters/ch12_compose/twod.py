"""Chapter 12: the mesh and FSDP2 over tensor parallelism (2-D) on labkit's GPT, on real processes.

    lab = twod.twod_lab(model="tiny", micro_batch=4)   # one spawn of 4 ranks: a 2 x 2 ("dp", "tp") mesh
    lab["mesh"]                 # what each rank is: its coordinates, its dp group and its tp group
    lab["counts"][True]         # one 2-D step's collectives by kind and bytes, sequence parallelism on
    lab["memory"]               # bytes per rank: 2-D, 1-D FSDP over 4, 1-D TP over 4
    lab["loss_parallel"]        # the vocabulary-sharded loss against the whole one

Every figure the lab measures has a formula beside it here (``expected_*``), from shapes only.
labkit's attention has one fused ``qkv`` projection, [q | k | v]: ``ColwiseParallel`` cuts its rows into
contiguous chunks, so rank 0 of 2 would get all of q and half of k. ``head_major`` reorders the rows once,
[q k v of head 0 | q k v of head 1 | ...], so any chunk of whole heads is a rank's own attention.
"""
from __future__ import annotations

import logging
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...base.errors import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.ddp import demo_batches, local_bytes
from ...engine.launch import spawn_ranks
from ...engine.model import GPT, VOCAB
from ...tools.collectives import CollectiveCounter, backend, device_kind, figure, gpu_count  # noqa: F401

FP32 = 4  # bytes per value: the CPU demo trains in fp32
STATE = {"params": 1, "grads": 1, "optimizer": 2}  # copies of each parameter: AdamW keeps two moments
DP, TP = 2, 2  # the 2-D mesh of the lab: 4 ranks


# ---- the fused qkv, head by head -------------------------------------------------------------------------

def head_major(attn) -> torch.Tensor:
    """Reorder the fused qkv rows in place from [q | k | v] to [q k v of head 0 | q k v of head 1 | ...]:
    a contiguous chunk of rows is then whole heads, whatever the number of ranks. Returns the order
    (``new = old[order]``; ``old = new[argsort(order)]``)."""
    d = attn.qkv.in_features
    hd = d // attn.n_head
    order = torch.tensor([part * d + h * hd + i for h in range(attn.n_head) for part in range(3)
                          for i in range(hd)])
    with torch.no_grad():
        attn.qkv.weight.copy_(attn.qkv.weight[order])
        attn.qkv.bias.copy_(attn.qkv.bias[order])
    return order


class HeadAttention(nn.Module):
    """labkit's attention on head-major qkv rows: it takes as many heads as its qkv gives it (all of them in
    one process; its own under ``ColwiseParallel``). Shown in 12_composing_the_layout (code-12-plan)."""

    def __init__(self, attn):
        super().__init__()
        self.qkv, self.proj, self.hd = attn.qkv, attn.proj, attn.qkv.in_features // attn.n_head

    def forward(self, x):
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, -1, 3, self.hd)  # (B, T, my heads, q/k/v, head width)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


def head_major_gpt(spec, seed: int, device="cpu") -> GPT:
    """The course's GPT from ``seed`` with every block's attention head-major: the same function."""
    torch.manual_seed(seed)
    model = GPT(spec).to(device)
    for block in model.blocks:
        head_major(block.attn)
        block.attn = HeadAttention(block.attn)
    return model


# ---- the code a learner writes at work --------------------------------------------------------------------

def tp_plan(sequence_parallel: bool) -> dict:
    """Megatron's plan for one labkit Block, as ``parallelize_module`` takes it.
    Shown in 12_composing_the_layout (code-12-plan)."""
    from torch.distributed.tensor import Replicate, Shard  # deferred: DTensor's import costs a second
    from torch.distributed.tensor.parallel import (  # deferred: as above
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel)

    if not sequence_parallel:  # the activations between blocks are whole on every rank
        return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),  # my heads; AllReduce
                "fc": ColwiseParallel(), "out": RowwiseParallel()}  # my hidden units; AllReduce
    seq = Shard(1)  # (batch, sequence, width): between blocks a rank holds 1/tp of the sequence
    return {"ln1": SequenceParallel(),  # LayerNorm on my tokens only
            # gather the sequence before attention (AllGather; its backward a ReduceScatter)
            "attn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "attn.qkv": ColwiseParallel(),
            # sum the heads' partial outputs and keep 1/tp of the sequence: a ReduceScatter; a DTensor
            # out, so the residual add is DTensor + DTensor
            "attn.proj": RowwiseParallel(output_layouts=seq, use_local_output=False),
            "ln2": SequenceParallel(),
            "fc": ColwiseParallel(input_layouts=seq),  # Block has no MLP module: gather here
            "out": RowwiseParallel(output_layouts=seq, use_local_output=False)}


def parallelize_2d(model, mesh, sequence_parallel: bool = True):
    """Tensor parallelism over ``mesh["tp"]``, then FSDP2 over ``mesh["dp"]``: a unit per block, then the root.
    Shown in 12_composing_the_layout (code-12-plan)."""
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s to import
    from torch.distributed.tensor import Replicate, Shard  # deferred: DTensor's import costs a second
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module  # deferred

    tp, dp = mesh["tp"], mesh["dp"]
    for block in model.blocks:
        parallelize_module(block, tp, tp_plan(sequence_parallel))
    if sequence_parallel:  # into the first block: keep my 1/tp of the sequence (no message);
        # into the final norm: gather it again (AllGather), a plain tensor for the replicated head
        parallelize_module(model, tp, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),)),
            "ln_f": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True)})
    for block in model.blocks:
        fully_shard(block, mesh=dp)  # shards each (TP-local) weight again, over the dp ranks
    fully_shard(model, mesh=dp)  # the root: embeddings (tied to the head), final norm
    return model


def vocab_parallel_loss(head, hidden, targets, tp_mesh, parallel: bool = True):
    """Cross-entropy over a head split by vocabulary over ``tp_mesh``: with ``parallel`` no rank ever holds
    every word's logit; without, each gathers them all first.
    Shown in 12_composing_the_layout (code-12-loss-parallel)."""
    from torch.distributed.tensor import Replicate, Shard  # deferred: DTensor's import costs a second
    from torch.distributed.tensor.parallel import (  # deferred: as above
        ColwiseParallel, loss_parallel, parallelize_module)

    if not parallel:  # gather the (batch, sequence, vocabulary) logits on every rank: an AllGather
        parallelize_module(head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))
        logits = head(hidden)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        return loss, logits
    # my V/tp words' logits, left sharded (a DTensor on the last dim)
    parallelize_module(head, tp_mesh, ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))
    logits = head(hidden)
    with loss_parallel():  # softmax's max, its sum and the target's logit: AllReduces of one number a token
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()  # inside too: the backward of the sharded softmax
    return loss, logits


# ---- the formulas: what one step should make and hold, from shapes only ---------------------------------

TP_DIM = {"attn.qkv.weight": 0, "attn.qkv.bias": 0, "attn.proj.weight": 1,  # heads: qkv rows, proj columns
          "fc.weight": 0, "fc.bias": 0, "out.weight": 1}  # hidden units; the rest is whole on every TP rank
# activation collectives of ONE pass through one block (the exercise's formula, per pass)
PER_BLOCK = {False: {"all_reduce": 2},  # after proj and after out (forward); f's before qkv and fc (backward)
             True: {"all_gather": 2, "reduce_scatter": 2}}  # each AllReduce cut in two; the sequence sharded


def check_layout(spec, dp: int, tp: int) -> None:
    """ConfigError unless ``dp`` x ``tp`` can lay out ``spec``: TP splits whole heads."""
    whole("dp", dp)
    if spec.n_head % whole("tp", tp) or (4 * spec.d_model) % tp or VOCAB % tp:
        raise ConfigError("tp", tp, f"a divisor of the model's {spec.n_head} heads: each TP rank computes "
                          "whole heads")


def block_collectives(n_layer: int, sequence_parallel: bool) -> dict:
    """The activation collectives of one forward + backward of ``n_layer`` Megatron-TP blocks (one micro-batch,
    no recomputation): {4L, 0, 0} without SP, {0, 4L, 4L} with (a gather's backward is a scatter)."""
    whole("n_layer", n_layer)
    per = PER_BLOCK[bool(sequence_parallel)]
    return {k: 2 * n_layer * per.get(k, 0) for k in ("all_reduce", "all_gather", "reduce_scatter")}


def mesh_layout(dp: int, tp: int) -> list:
    """What each rank of a (dp, tp) mesh is: ranks fill it row by row, so a tp group is consecutive ranks."""
    whole("dp", dp)
    whole("tp", tp)
    return [{"rank": r, "dp": r // tp, "tp": r % tp, "dp_group": [i * tp + r % tp for i in range(dp)],
             "tp_group": [r // tp * tp + j for j in range(tp)]} for r in range(dp * tp)]


def _shapes(spec) -> list:
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        return [(n, tuple(p.shape)) for n, p in GPT(spec).named_parameters()]  # the tied head once


def _tp_local(name, shape, tp) -> tuple:
    dim = TP_DIM.get(name.split(".", 2)[-1]) if name.startswith("blocks.") else None
    return shape if dim is None else tuple(s // tp if i == dim else s for i, s in enumerate(shape))


def _fsdp_numel(shape, dp) -> int:
    """Numel of the largest FSDP2 shard: rows cut in chunks of ceil(rows / dp)."""
    return math.ceil(shape[0] / dp) * math.prod(shape[1:])


def expected_memory(spec, dp: int, tp: int) -> dict:
    """Bytes of model state on the largest rank: TP-split weights (``TP_DIM``) cut again by FSDP2 over dp,
    everything else cut by FSDP2 only; fp32 weights and gradients, AdamW's two fp32 moments."""
    check_layout(spec, dp, tp)
    n = sum(_fsdp_numel(_tp_local(name, shape, tp), dp) for name, shape in _shapes(spec))
    out = {part: copies * n * FP32 for part, copies in STATE.items()}
    return {**out, "total": sum(out.values())}


def _tally(rows) -> dict:
    out = {}
    for phase, kind, nbytes, calls in rows:
        out[(phase, kind, nbytes)] = out.get((phase, kind, nbytes), 0) + calls
    return out


def expected_tp_calls(spec, micro_batch: int, tp: int, sequence_parallel: bool) -> list:
    """TP's collectives of one step, by pass, kind and bytes as a rank passes them in (an AllGather its shard,
    a ReduceScatter and an AllReduce the whole): ``blocks`` (``PER_BLOCK``, activation-sized), ``edges``
    (SP: gather before the final norm; forward, and again in backward for the embeddings' gradient) and
    ``grads`` (SP: each LayerNorm's weight and bias gradient is a partial sum over the sequence shards;
    FSDP2's post-backward AllReduces it over tp)."""
    check_layout(spec, 1, tp)
    act = whole("micro_batch", micro_batch) * spec.seq_len * spec.d_model * FP32  # one (B, T, d) activation
    L, sp = spec.n_layer, bool(sequence_parallel)
    rows = []
    for phase in ("forward", "backward"):
        for kind, n in PER_BLOCK[sp].items():
            edge = int(sp and kind == "all_gather")
            rows.append({"phase": phase, "kind": kind, "bytes": act // tp if kind == "all_gather" else act,
                         "blocks": n * L, "edges": edge, "grads": 0})
    if sp:
        rows.append({"phase": "backward", "kind": "all_reduce", "bytes": spec.d_model * FP32, "blocks": 0,
                     "edges": 0, "grads": 4 * L})  # ln1 and ln2, weight and bias
    return [{**r, "calls": r["blocks"] + r["edges"] + r["grads"]} for r in rows]


def expected_fsdp_calls(spec, dp: int, tp: int) -> list:
    """FSDP2's collectives of one step over dp: an AllGather per unit before its forward and again before a
    block's backward (the root stays gathered), a ReduceScatter per unit after its backward; bytes = the
    unit's TP-local weights, padded to dp shards (the gathered buffer; the buffer reduced)."""
    check_layout(spec, dp, tp)
    unit = {}
    for name, shape in _shapes(spec):
        key = ".".join(name.split(".")[:2]) if name.startswith("blocks.") else "root"
        unit[key] = unit.get(key, 0) + dp * _fsdp_numel(_tp_local(name, shape, tp), dp) * FP32
    blocks = sorted(set(unit) - {"root"})
    rows = [("forward", "all_gather", unit[u], 1) for u in ["root"] + blocks]
    rows += [("backward", "all_gather", unit[u], 1) for u in blocks]
    rows += [("backward", "reduce_scatter", unit[u], 1) for u in blocks + ["root"]]
    return [{"phase": p, "kind": k, "bytes": b, "calls": c} for (p, k, b), c in _tally(rows).items()]


def expected_loss_parallel(micro_batch: int, seq_len: int, d_model: int, tp: int) -> dict:
    """Per rank: the logits held (all words, or V/tp of them) and the collectives, {(kind, bytes): calls}.
    Gathered: an AllGather of my V/tp logits. Loss-parallel: softmax's max, its sum and the target's logit,
    one number a token each. Both: the hidden state's gradient, summed over the vocabulary shards."""
    tokens = whole("micro_batch", micro_batch) * whole("seq_len", seq_len)
    if VOCAB % whole("tp", tp):
        raise ConfigError("tp", tp, f"a divisor of the vocabulary ({VOCAB})")
    hidden = ("all_reduce", tokens * whole("d_model", d_model) * FP32)
    return {"gathered_bytes": tokens * VOCAB * FP32, "sharded_bytes": tokens * VOCAB // tp * FP32,
            "calls": {False: {("all_gather", tokens * VOCAB // tp * FP32): 1, hidden: 1},
                      True: {("all_reduce", tokens * FP32): 3, hidden: 1}}}


# ---- on the ranks -------------------------------------------------------------------------------------------

KINDS = {"allreduce": "all_reduce", "all_gather_into_tensor": "all_gather", "allgather": "all_gather",
         "allgather_into_tensor_coalesced": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
         "reducescatter": "reduce_scatter"}
LAYOUTS = {"2-D": (DP, TP), "FSDP": (DP * TP, 1), "TP": (1, DP * TP)}  # (dp, tp) of the memory comparison


class _Counter(CollectiveCounter):
    """The course's counter, as a dispatch mode (TP's collectives) and around FSDP2's calls (``counting``):
    the c10d op an FSDP2 call issues is that call, noted once, as FSDP's."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._depth:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def _counted(fn):
    c = _Counter()
    with c, c.counting():
        out = fn()
    return out, [(KINDS.get(n, n), b, n in ("allgather", "reducescatter")) for n, b in c.calls]


def _grad_error(model, ref) -> float:
    worst = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # a collective: all ranks
        worst = max(worst, (g - q.grad).abs().max().item())
    return worst


def _trained_state(model) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()  # the moments exist after the first step
    return {"params": local_bytes(model.parameters()), "grads": local_bytes(p.grad for p in model.parameters()),
            "optimizer": sum(local_bytes(v for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
                             for s in opt.state.values())}


def _step_times(model, x, y, repeats) -> list:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(x, y).backward()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def _step_2d(spec, seed, mesh, x, y, ref, sp, repeats):
    model = parallelize_2d(head_major_gpt(spec, seed, x.device), mesh, sp)
    loss, fwd = _counted(lambda: model(x, y))
    _, bwd = _counted(loss.backward)
    mean = loss.detach().clone()
    dist.all_reduce(mean)  # outside the count: the four ranks' losses, averaged
    out = {"forward": fwd, "backward": bwd, "loss": mean.item() / dist.get_world_size(),
           "grad_error": _grad_error(model, ref)}
    if repeats:  # NCCL only: a gloo CPU step times the loopback and Python
        out["step_times"] = _step_times(model, x, y, repeats)
    return model, out


def _fsdp_1d(spec, seed, mesh, x, y):
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s to import

    model = head_major_gpt(spec, seed, x.device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(x, y).backward()
    return model


def _tp_1d(spec, seed, mesh, x, y):
    from torch.distributed.tensor.parallel import parallelize_module  # deferred: DTensor's import

    model = head_major_gpt(spec, seed, x.device)
    for block in model.blocks:
        parallelize_module(block, mesh, tp_plan(False))
    model(x, y).backward()  # every TP rank sees the whole batch
    return model


def _loss_parallel(ref, hidden, y, tp_mesh) -> dict:
    ref_h = hidden.detach().clone().requires_grad_()
    ref_loss = F.cross_entropy(ref.head(ref_h).flatten(0, 1), y.flatten())
    ref_loss.backward()
    out = {"ref_loss": ref_loss.item()}
    for parallel in (False, True):
        head = nn.Linear(hidden.shape[-1], VOCAB, bias=False).to(hidden.device)
        with torch.no_grad():
            head.weight.copy_(ref.head.weight)
        h = hidden.detach().clone().requires_grad_()
        (loss, logits), calls = _counted(lambda: vocab_parallel_loss(head, h, y, tp_mesh, parallel))
        loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        out[parallel] = {"loss": loss.item(), "loss_error": abs(loss.item() - ref_loss.item()),
                         "grad_error": (h.grad - ref_h.grad).abs().max().item(),
                         "logits_bytes": local_bytes([logits]), "calls": calls}
    return out


def _lab_rank(rank, kind, spec, micro_batch, seed, repeats) -> dict:
    """A spawned rank: the mesh, a 2-D step with SP off and on, the 1-D layouts, loss-parallel."""
    from torch.distributed.device_mesh import init_device_mesh  # deferred: DTensor's import costs a second

    torch.set_num_threads(1)  # the ranks share this machine's cores
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)  # full_tensor's note
    device = torch.device(f"cuda:{rank.rank}" if kind == "cuda" else "cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    with ddp_mod.process_group(kind, rank.rank, rank.world_size, rank.file_store()):
        mesh = init_device_mesh(device.type, (DP, TP), mesh_dim_names=("dp", "tp"))
        dp_i, tp_i = mesh.get_coordinate()
        out = {"rank": dist.get_rank(), "dp": dp_i, "tp": tp_i,
               "dp_group": dist.get_process_group_ranks(mesh["dp"].get_group()),
               "tp_group": dist.get_process_group_ranks(mesh["tp"].get_group()), "steps": {}}
        x, y = (t.to(device) for t in next(demo_batches(spec, micro_batch * DP, 1, seed)))
        ref = head_major_gpt(spec, seed, device)  # one process, the whole batch
        seen = []  # the final hidden states as the head gets them: the loss-parallel part's input
        ref.head.register_forward_hook(lambda m, args, o: seen.append(args[0]))
        ref_loss = ref(x, y)
        ref_loss.backward()
        out["ref_loss"] = ref_loss.item()
        mine = slice(dp_i * micro_batch, (dp_i + 1) * micro_batch)  # my dp group's share of the batch
        for sp in (False, True):
            model, out["steps"][sp] = _step_2d(spec, seed, mesh, x[mine], y[mine], ref, sp, repeats)
        out["memory"] = {"2-D": _trained_state(model)}
        flat = init_device_mesh(device.type, (DP * TP,), mesh_dim_names=("all",))
        out["memory"]["FSDP"] = _trained_state(_fsdp_1d(spec, seed, flat, x[mine], y[mine]))
        out["memory"]["TP"] = _trained_state(_tp_1d(spec, seed, flat, x, y))
        out["loss_parallel"] = _loss_parallel(ref, seen[0][mine], y[mine], mesh["tp"])
        return out


def twod_lab(model: str = "tiny", micro_batch: int = 4, seed: int = 0, repeats: int = 5,
             timeout_s: float = 120.0) -> dict:
    """The chapter's 2-D lab, one spawn of DP x TP = 4 ranks (see the module's docstring); ``repeats`` timed
    steps per SP setting where each rank has a GPU (none on gloo). ``ok`` False and ``error`` where a rank
    failed or was late."""
    _choice("model", model, PRESETS)
    spec = PRESETS[model]
    check_layout(spec, DP, TP)
    whole("micro_batch", micro_batch)
    whole("seed", seed, 0)
    whole("repeats", repeats, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    ws, kind = DP * TP, device_kind(DP * TP)
    t0 = time.monotonic()
    try:
        with spawn_ranks(_lab_rank, ws, (kind, spec, micro_batch, seed, repeats if kind == "cuda" else 0),
                         kind=kind, prefix="labkit-2d-") as ranks:
            results = [r for _, r in sorted(ranks.collect(timeout_s, "The 2-D lab").items())]
    except RunError as e:
        return {"ok": False, "error": str(e), "model": model}
    r0 = results[0]
    return {"ok": True, "model": model, "spec": spec, "micro_batch": micro_batch, "kind": kind,
            "backend": backend(ws), "seconds": time.monotonic() - t0, "ranks": results,
            "mesh": [{k: r[k] for k in ("rank", "dp", "tp", "dp_group", "tp_group")} for r in results],
            "steps": r0["steps"], "ref_loss": r0["ref_loss"],
            "grad_error": max(r["steps"][sp]["grad_error"] for r in results for sp in (False, True)),
            "memory": {k: max((r["memory"][k] for r in results), key=lambda m: sum(m.values()))
                       for k in LAYOUTS},
            "loss_parallel": r0["loss_parallel"]}


# ---- the lab's figures as rows and verdicts (the chapter says the words) -----------------------------------

def mesh_verdict(lab: dict) -> str:
    """'agree' when every rank's coordinates and groups are ``mesh_layout``'s."""
    return "agree" if lab["mesh"] == mesh_layout(DP, TP) else "differ"


def measured_calls(lab: dict, sp: bool, fsdp: bool) -> dict:
    """Rank 0's collectives of one 2-D step, {(pass, kind, bytes): calls}: FSDP2's, or TP's."""
    step = lab["steps"][sp]
    return _tally((p, k, b, 1) for p in ("forward", "backward") for k, b, f in step[p] if f == fsdp)


def count_rows(lab: dict, sp: bool) -> list:
    """TP's rows, then FSDP2's: measured calls beside the formula (and its parts, for TP)."""
    spec = lab["spec"]
    rows = []
    for who, formula in (("TP", expected_tp_calls(spec, lab["micro_batch"], TP, sp)),
                         ("FSDP2", expected_fsdp_calls(spec, DP, TP))):
        seen = measured_calls(lab, sp, who == "FSDP2")
        keys = {(r["phase"], r["kind"], r["bytes"]): r for r in formula}
        for key in sorted(set(seen) | set(keys), key=lambda k: (k[0] != "forward", k[1], k[2])):
            f = keys.get(key, {})
            rows.append({"who": who, "phase": key[0], "kind": key[1], "bytes": key[2], "measured": seen.get(key, 0),
                         "formula": f.get("calls", 0), "blocks": f.get("blocks"), "edges": f.get("edges"),
                         "grads": f.get("grads")})
    return rows


def counts_verdict(lab: dict) -> str:
    """'agree' when, SP off and on, every count (TP's and FSDP2's, by pass, kind and bytes) is the formula's."""
    ok = all(r["measured"] == r["formula"] for sp in (False, True) for r in count_rows(lab, sp))
    return "agree" if ok else "differ"


def memory_rows(lab: dict) -> list:
    """Per layout: the largest rank's bytes, measured, beside ``expected_memory``."""
    rows = []
    for name, (dp, tp) in LAYOUTS.items():
        m, f = lab["memory"][name], expected_memory(lab["spec"], dp, tp)
        rows.append({"layout": name, "dp": dp, "tp": tp, **m, "total": sum(m.values()), "formula": f["total"]})
    return rows


def memory_verdict(lab: dict) -> str:
    """'agree' when every layout held the formula's bytes; else 'differ'."""
    return "agree" if all(r["total"] == r["formula"] for r in memory_rows(lab)) else "differ"


def memory_chart(lab: dict):
    """Bytes per rank for each layout, params / grads / AdamW stacked: measured beside the formula."""
    fig, ax = figure(6.5, 2.8)
    colors = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
    for i, row in enumerate(memory_rows(lab)):
        f = expected_memory(lab["spec"], row["dp"], row["tp"])
        for x, source, hatch in ((i - 0.18, row, None), (i + 0.18, f, "//")):
            bottom = 0.0
            for part in STATE:
                ax.bar(x, source[part] / 1024, 0.34, bottom=bottom, color=colors[part], hatch=hatch,
                       edgecolor="white", label=part if i == 0 and hatch is None else None)
                bottom += source[part] / 1024
    ax.set_xticks(range(len(LAYOUTS)), [f"{k} (dp {dp} × tp {tp})\nmeasured | formula"
                                        for k, (dp, tp) in LAYOUTS.items()], fontsize=8)
    ax.set_ylabel("KiB per rank", fontsize=8)
    ax.set_title("Model state per rank, 4 ranks, three layouts (fp32 + AdamW)", fontsize=9)
    ax.legend(frameon=False, fontsize=7)
    return fig


def loss_parallel_rows(lab: dict) -> list:
    """Gathered logits vs loss-parallel: loss and gradient errors, logits held, collectives vs formula."""
    spec, lp = lab["spec"], lab["loss_parallel"]
    f = expected_loss_parallel(lab["micro_batch"], spec.seq_len, spec.d_model, TP)
    rows = []
    for parallel in (False, True):
        r = lp[parallel]
        rows.append({"way": "loss_parallel" if parallel else "gathered logits", "loss_error": r["loss_error"],
                     "grad_error": r["grad_error"], "logits_bytes": r["logits_bytes"],
                     "formula_bytes": f["sharded_bytes" if parallel else "gathered_bytes"],
                     "calls": _tally(("", k, b, 1) for k, b, _ in r["calls"]),
                     "formula_calls": {("", k, b): n for (k, b), n in f["calls"][parallel].items()}})
    return rows
