"""Chapter 12: the mesh and FSDP2 over tensor parallelism (2-D) on labkit's GPT, on real processes.

    lab = twod.twod_lab(model="tiny", micro_batch=4)  # one spawn of 4 ranks: a 2 x 2 mesh
    twod.verdicts(lab)  # the mesh, collectives, memory per rank, loss-parallel: vs whatif.layouts's

``head_major`` reorders the fused qkv's rows, [q | k | v] -> whole heads, so ``ColwiseParallel``'s
contiguous chunks are whole heads' attention.
"""
from __future__ import annotations

import logging
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.ddp import demo_batches, local_bytes
from ...engine.model import GPT, VOCAB
from ...tools.collectives import (  # noqa: F401  (backend, gpu_count: the size cell uses them)
    CollectiveCounter, backend, device_kind, figure, gpu_count, rank_device, rank_lab)
from ...whatif.layouts import (  # noqa: F401  (the chapter's formulas: twod.expected_memory, ...)
    FP32, STATE, block_collectives, check_layout, expected_fsdp_calls, expected_loss_parallel,
    expected_memory, expected_tp_calls, mesh_layout)

DP, TP = 2, 2  # the lab's mesh: 4 ranks
LAYOUTS = {"2-D": (DP, TP), "FSDP": (DP * TP, 1), "TP": (1, DP * TP)}  # (dp, tp), memory compared


# ---- the fused qkv, head by head -----------------------------------------------------------------

def head_major(attn) -> torch.Tensor:
    """Reorder the fused qkv rows in place, [q | k | v] -> [q k v of head 0 | q k v of head 1 |
    ...]: a contiguous chunk of rows is then whole heads, whatever the number of ranks. Returns the
    order (``new = old[order]``). Shown in 12_composing_the_layout (code-12-plan)."""
    d = attn.qkv.in_features
    hd = d // attn.n_head
    order = torch.tensor([part * d + h * hd + i for h in range(attn.n_head) for part in range(3)
                          for i in range(hd)])
    with torch.no_grad():
        attn.qkv.weight.copy_(attn.qkv.weight[order])
        attn.qkv.bias.copy_(attn.qkv.bias[order])
    return order


class HeadAttention(nn.Module):
    """labkit's attention on head-major qkv rows: as many heads as its qkv gives it (all of them
    in one process; its own under ``ColwiseParallel``).
    Shown in 12_composing_the_layout (code-12-plan)."""

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
    """The course's GPT from ``seed``, every block's attention head-major: the same function."""
    torch.manual_seed(seed)
    model = GPT(spec).to(device)
    for block in model.blocks:
        head_major(block.attn)
        block.attn = HeadAttention(block.attn)
    return model


# ---- the code a learner writes at work -----------------------------------------------------------

def build_mesh(device_type: str, dp: int = DP, tp: int = TP):
    """A named dp x tp mesh over every rank, and what this rank is in it.
    Shown in 12_composing_the_layout (code-12-mesh)."""
    from torch.distributed.device_mesh import init_device_mesh  # deferred: DTensor takes a second

    # rank r sits at row r // tp, column r % tp: a tp group is consecutive ranks (one node's GPUs)
    mesh = init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_i, tp_i = mesh.get_coordinate()
    return mesh, {"rank": dist.get_rank(), "dp": dp_i, "tp": tp_i,
                  # mesh["dp"]: the ranks in my column -- same TP shard, other data
                  "dp_group": dist.get_process_group_ranks(mesh["dp"].get_group()),
                  # mesh["tp"]: the ranks in my row -- same data, other shards of each weight
                  "tp_group": dist.get_process_group_ranks(mesh["tp"].get_group())}


def tp_plan(sequence_parallel: bool) -> dict:
    """Megatron's plan for one labkit Block, as ``parallelize_module`` takes it.
    Shown in 12_composing_the_layout (code-12-plan)."""
    from torch.distributed.tensor import Replicate, Shard  # deferred: DTensor takes a second
    from torch.distributed.tensor.parallel import (  # deferred: as above
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel)

    if not sequence_parallel:  # the activations between blocks are whole on every rank
        return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),  # heads; AllReduce
                "fc": ColwiseParallel(), "out": RowwiseParallel()}  # my hidden units; AllReduce
    seq = Shard(1)  # (batch, sequence, width): between blocks a rank holds 1/tp of the sequence
    return {"ln1": SequenceParallel(),  # LayerNorm on my tokens only
            # gather the sequence before attention (AllGather; its backward a ReduceScatter)
            "attn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "attn.qkv": ColwiseParallel(),
            # sum the heads' partial outputs, keep my 1/tp of the sequence: a ReduceScatter; a
            # DTensor out, so that the residual add is DTensor + DTensor
            "attn.proj": RowwiseParallel(output_layouts=seq, use_local_output=False),
            "ln2": SequenceParallel(),
            "fc": ColwiseParallel(input_layouts=seq),  # Block has no MLP module: gather here
            "out": RowwiseParallel(output_layouts=seq, use_local_output=False)}


def parallelize_2d(model, mesh, sequence_parallel: bool = True):
    """Tensor parallelism over ``mesh["tp"]``, then FSDP2 over ``mesh["dp"]``: a unit per block,
    then the root. Shown in 12_composing_the_layout (code-12-plan)."""
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s to import
    from torch.distributed.tensor import Replicate, Shard  # deferred: DTensor takes a second
    from torch.distributed.tensor.parallel import (  # deferred: as above
        PrepareModuleInput, parallelize_module)

    tp, dp = mesh["tp"], mesh["dp"]
    for block in model.blocks:
        parallelize_module(block, tp, tp_plan(sequence_parallel))
    if sequence_parallel:  # into the first block: keep my 1/tp of the sequence (no message); into
        # the final norm: gather it again (AllGather), a plain tensor for the replicated head
        parallelize_module(model, tp, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),),
                                           desired_input_layouts=(Shard(1),)),
            "ln_f": PrepareModuleInput(input_layouts=(Shard(1),),
                                       desired_input_layouts=(Replicate(),),
                                       use_local_output=True)})
    for block in model.blocks:
        fully_shard(block, mesh=dp)  # each TP-local weight sharded again, over the dp ranks
    fully_shard(model, mesh=dp)  # the root: embeddings (tied to the head), final norm
    return model


def vocab_parallel_loss(head, hidden, targets, tp_mesh, parallel: bool = True):
    """Cross-entropy over a head split by vocabulary over ``tp_mesh``: with ``parallel`` no rank
    holds every word's logit; without, each gathers them all first.
    Shown in 12_composing_the_layout (code-12-loss-parallel)."""
    from torch.distributed.tensor import Replicate, Shard  # deferred: DTensor takes a second
    from torch.distributed.tensor.parallel import (  # deferred: as above
        ColwiseParallel, loss_parallel, parallelize_module)

    if not parallel:  # gather the (batch, sequence, vocabulary) logits on every rank: an AllGather
        parallelize_module(head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))
        logits = head(hidden)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        return loss, logits
    # my V/tp words' logits, left sharded: a DTensor on the last dim
    parallelize_module(head, tp_mesh,
                       ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))
    logits = head(hidden)
    with loss_parallel():  # softmax's max and sum, the target's logit: AllReduces, a number a token
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()  # inside too: the backward of the sharded softmax
    return loss, logits


# ---- on the ranks --------------------------------------------------------------------------------

class _Counter(CollectiveCounter):
    """The course's counter as a dispatch mode (TP's collectives) and around FSDP2's calls
    (``counting``): the c10d op an FSDP2 call issues is that call, noted once, as FSDP2's."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._depth:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def _counted(fn):
    c = _Counter()
    with c, c.counting():
        out = fn()
    kind = {"gather": "all_gather", "scatter": "reduce_scatter", "reduce": "all_reduce"}
    fsdp = ("allgather", "reducescatter")  # the names counting() notes FSDP2's calls under
    return out, [(next(v for k, v in kind.items() if k in n), b, n in fsdp) for n, b in c.calls]


def _grad_error(model, ref) -> float:
    return max(((p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) - q.grad)
               .abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


def _trained_state(model) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()  # the moments exist after the first step
    return {"params": local_bytes(model.parameters()),
            "grads": local_bytes(p.grad for p in model.parameters()),
            "optimizer": sum(local_bytes(v for v in s.values() if v.dim() > 0)  # not the step
                             for s in opt.state.values())}


def _step_2d(spec, seed, mesh, x, y, ref, sp):
    model = parallelize_2d(head_major_gpt(spec, seed, x.device), mesh, sp)
    loss, fwd = _counted(lambda: model(x, y))
    _, bwd = _counted(loss.backward)
    dist.all_reduce(mean := loss.detach().clone())  # not counted: the four ranks' losses, averaged
    return model, {"forward": fwd, "backward": bwd, "loss": mean.item() / dist.get_world_size(),
                   "grad_error": _grad_error(model, ref)}


def _one_d(spec, seed, mesh, x, y, layout):
    """1-D FSDP2 (the 2-D lab's units) or 1-D TP (the plan without SP) over every rank, one step."""
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s to import
    from torch.distributed.tensor.parallel import parallelize_module  # deferred: DTensor's import

    model = head_major_gpt(spec, seed, x.device)
    for unit in ([*model.blocks, model] if layout == "FSDP" else model.blocks):
        if layout == "FSDP":
            fully_shard(unit, mesh=mesh)
        else:
            parallelize_module(unit, mesh, tp_plan(False))
    model(x, y).backward()  # (the bytes held do not depend on which tokens)
    return model


def _loss_parallel(ref, hidden, y, tp_mesh) -> dict:
    ref_h = hidden.detach().clone().requires_grad_()
    ref_loss = F.cross_entropy(ref.head(ref_h).flatten(0, 1), y.flatten())
    ref_loss.backward()
    out = {"ref_loss": ref_loss.item()}
    for parallel in (False, True):
        head = nn.Linear(hidden.shape[-1], VOCAB, bias=False).to(hidden.device)
        head.weight = nn.Parameter(ref.head.weight.detach().clone())
        h = hidden.detach().clone().requires_grad_()
        (loss, logits), calls = _counted(lambda: vocab_parallel_loss(head, h, y, tp_mesh, parallel))
        loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        out[parallel] = {"loss": loss.item(), "loss_error": abs(loss.item() - ref_loss.item()),
                         "grad_error": (h.grad - ref_h.grad).abs().max().item(),
                         "logits_bytes": local_bytes([logits]), "calls": calls}
    return out


def _lab_rank(rank, kind, spec, micro_batch, seed) -> dict:
    """A spawned rank: the mesh, a 2-D step with SP off and on, the 1-D layouts, loss-parallel."""
    from torch.distributed.device_mesh import init_device_mesh  # deferred: DTensor takes a second

    # full_tensor of a 2-D gradient warns that it gathers twice: the check's cost, not the lesson's
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    device = rank_device(kind, rank.rank)
    with ddp_mod.process_group(kind, rank.rank, rank.world_size, rank.file_store()):
        mesh, me = build_mesh(device.type)
        out, dp_i = {**me, "steps": {}}, me["dp"]
        x, y = (t.to(device) for t in next(demo_batches(spec, micro_batch * DP, 1, seed)))
        ref, seen = head_major_gpt(spec, seed, device), []  # one process, the whole batch
        ref.head.register_forward_hook(lambda m, args, o: seen.append(args[0]))  # loss-parallel's
        ref_loss = ref(x, y)
        ref_loss.backward()
        out["ref_loss"] = ref_loss.item()
        mine = slice(dp_i * micro_batch, (dp_i + 1) * micro_batch)  # my dp group's share
        for sp in (False, True):
            model, out["steps"][sp] = _step_2d(spec, seed, mesh, x[mine], y[mine], ref, sp)
        out["memory"] = {"2-D": _trained_state(model)}
        flat = init_device_mesh(device.type, (DP * TP,), mesh_dim_names=("all",))
        for layout in ("FSDP", "TP"):
            xs, ys = (x[mine], y[mine]) if layout == "FSDP" else (x, y)
            out["memory"][layout] = _trained_state(_one_d(spec, seed, flat, xs, ys, layout))
        out["loss_parallel"] = _loss_parallel(ref, seen[0][mine], y[mine], mesh["tp"])
        return out


_RUNS = {}  # the last good lab per arguments: the mesh section and the 2-D section share one spawn


def twod_lab(model: str = "tiny", micro_batch: int = 4, seed: int = 0, timeout_s: float = 120.0,
             reuse: bool = True) -> dict:
    """The chapter's 2-D lab in one spawn of DP x TP = 4 ranks (see the module's docstring), or with
    ``reuse`` the same call's result from earlier in this process. ``ok`` False and ``error`` where
    a rank failed or was late."""
    _choice("model", model, PRESETS)
    spec = PRESETS[model]
    check_layout(spec, DP, TP)
    whole("micro_batch", micro_batch)
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    if reuse and (model, micro_batch, seed) in _RUNS:
        return _RUNS[model, micro_batch, seed]
    ws, kind = DP * TP, device_kind(DP * TP)
    run = rank_lab({"ok": True, "model": model, "world_size": ws, "kind": kind}, _lab_rank,
                   (kind, spec, micro_batch, seed), "The 2-D lab", timeout_s, "labkit-2d-")
    if not run["ok"]:
        return run
    results = run.pop("ranks")
    r0 = results[0]
    lab = _RUNS[model, micro_batch, seed] = {
            **run, "spec": spec, "micro_batch": micro_batch, "backend": backend(ws), "ref_loss": r0["ref_loss"],
            "mesh": [{k: r[k] for k in ("rank", "dp", "tp", "dp_group", "tp_group")}
                     for r in results],
            "steps": r0["steps"], "loss_parallel": r0["loss_parallel"],
            "loss_error": max(abs(s["loss"] - r0["ref_loss"]) for s in r0["steps"].values()),
            "grad_error": max(s["grad_error"] for r in results for s in r["steps"].values()),
            "memory": {k: max((r["memory"][k] for r in results), key=lambda m: sum(m.values()))
                       for k in LAYOUTS}}
    return lab


# ---- the lab's figures as rows and verdicts (the chapter says the words) -------------------------

def _beside(seen: dict, want: dict, **extra) -> list:
    """Rows of measured calls beside the formula's, one per (pass, kind, bytes) either has."""
    keys = sorted(set(seen) | set(want), key=lambda k: (k[0] != "forward", k[1], k[2]))
    return [{**extra, "phase": k[0], "kind": k[1], "bytes": k[2], "measured": seen.get(k, 0),
             "formula": want.get(k, 0)} for k in keys]


def count_rows(lab: dict, sp: bool) -> list:
    """Rank 0's collectives in one 2-D step, TP's then FSDP2's, beside ``expected_tp_calls`` (with
    its parts: per block, edges, norm gradients) and ``expected_fsdp_calls``."""
    tp = {(r["phase"], r["kind"], r["bytes"]): r for r in
          expected_tp_calls(lab["spec"], lab["micro_batch"], TP, sp)}
    rows = []
    for who, want in (("TP", {k: r["calls"] for k, r in tp.items()}),
                      ("FSDP2", {(r["phase"], r["kind"], r["bytes"]): r["calls"]
                                 for r in expected_fsdp_calls(lab["spec"], DP, TP)})):
        step = lab["steps"][sp]
        seen = Counter((p, k, b) for p in ("forward", "backward") for k, b, f in step[p]
                      if f == (who == "FSDP2"))
        rows += _beside(seen, want, who=who)
    for r in rows:
        t = tp.get((r["phase"], r["kind"], r["bytes"])) if r["who"] == "TP" else None
        r["parts"] = (t["blocks"], t["edges"], t["grads"]) if t else None
    return rows


def call_totals(lab: dict, sp: bool, who: str) -> dict:
    """Rank 0's calls in one 2-D step by kind, forward and backward together: "TP" or "FSDP2"."""
    out = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0}
    for r in count_rows(lab, sp):
        out[r["kind"]] += r["measured"] if r["who"] == who else 0
    return out


def memory_rows(lab: dict) -> list:
    """Per layout: the largest rank's bytes, measured, beside ``expected_memory``."""
    return [{"layout": name, "dp": dp, "tp": tp, **lab["memory"][name],
             "total": sum(lab["memory"][name].values()),
             "formula": expected_memory(lab["spec"], dp, tp)} for name, (dp, tp) in LAYOUTS.items()]


def loss_parallel_rows(lab: dict) -> list:
    """Gathered logits, then loss-parallel: errors against one process, the logits a rank held
    beside ``expected_loss_parallel``, and its collectives ({(kind, bytes): calls}, measured)."""
    spec, lp = lab["spec"], lab["loss_parallel"]
    f = expected_loss_parallel(lab["micro_batch"], spec.seq_len, spec.d_model, TP)
    return [{"way": "loss_parallel" if par else "gathered logits",
             **{k: lp[par][k] for k in ("loss_error", "grad_error", "logits_bytes")},
             "formula_bytes": f["sharded_bytes" if par else "gathered_bytes"],
             "calls": _beside(Counter(("", k, b) for k, b, _ in lp[par]["calls"]),
                              {("", k, b): n for (k, b), n in f["calls"][par].items()})}
            for par in (False, True)]


def verdicts(lab: dict) -> dict:
    """'agree' or 'differ' for each measurement against its formula: "mesh" (``mesh_layout``),
    "counts" (SP off and on, TP's and FSDP2's), "memory" (each layout), "loss_parallel" (logits
    held, collectives)."""
    counts = [r for sp in (False, True) for r in count_rows(lab, sp)]
    lp = loss_parallel_rows(lab)
    ok = {"mesh": lab["mesh"] == mesh_layout(DP, TP),
          "counts": all(r["measured"] == r["formula"] for r in counts),
          "memory": all(r["total"] == r["formula"]["total"] for r in memory_rows(lab)),
          "loss_parallel": all(r["logits_bytes"] == r["formula_bytes"] and
                               all(c["measured"] == c["formula"] for c in r["calls"]) for r in lp)}
    return {k: "agree" if v else "differ" for k, v in ok.items()}


def memory_chart(lab: dict):
    """Bytes per rank, each layout: params / grads / AdamW (measured) and the formula's total."""
    fig, ax = figure(6.5, 2.8)
    colors = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
    for i, row in enumerate(memory_rows(lab)):
        bottom = 0.0
        for part in STATE:
            ax.bar(i, row[part] / 1024, 0.5, bottom=bottom, color=colors[part],
                   label=part * (i == 0))
            bottom += row[part] / 1024
        ax.scatter(i, row["formula"]["total"] / 1024, marker="_", s=900, color="black", zorder=3,
                   label="formula" * (i == 0))
    ax.set_xticks(range(len(LAYOUTS)), [f"{k}: dp {dp} × tp {tp}" for k, (dp, tp) in
                                        LAYOUTS.items()], fontsize=8)
    ax.set_ylabel("KiB per rank", fontsize=8)
    ax.set_title("Model state on the largest rank, 4 ranks (fp32 + AdamW)", fontsize=9)
    ax.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5),
              markerscale=0.3)  # the formula's wide dash, shrunk to fit beside its label
    return fig
