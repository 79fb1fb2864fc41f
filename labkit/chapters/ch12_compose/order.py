"""The order of the transforms (taught in chapter 12): torchtitan's -- tensor parallelism, activation
checkpointing, ``torch.compile`` per block, ``fully_shard`` -- as a learner writes it (``apply_all``), and
``order_lab``: it and the orders that break or cost, on one spawn of ranks on a 2 x 2 ("dp", "tp") mesh
(FSDP before TP; checkpointing a stack around FSDP's units; compiling the whole FSDP model).

    lab = order.order_lab(model="tiny", world_size=4)
    order.order_rows(lab)          # one row per order: its outcome and the measured evidence
"""
from __future__ import annotations

import dataclasses
import time

import torch

from ...base.compat import has, message
from ...base.runtime import ConfigError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _bool, _choice, real, whole
from ...engine.model import GPT
from ...tools.collectives import CollectiveCounter, device_kind, rank_device, rank_lab

AC_LAYERS = 4  # the checkpointing case runs 4 blocks: with 2, FSDP's backward prefetch holds both anyway
MAX_WORLD = 8


# ---- what the chapter shows: the order a learner writes at work ----------------------------------------------

def tp_plan() -> dict:
    """A small tensor-parallel plan of one labkit Block: its MLP, Megatron-style.
    Shown in 12_composing_the_layout (code-12-order)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # deferred: DTensor

    # fc split by output columns, out by input rows: each rank computes its slice of the hidden layer and
    # one AllReduce sums the slices after `out` (the attention stays replicated in this small plan)
    return {"fc": ColwiseParallel(), "out": RowwiseParallel()}


def apply_all(model, mesh, compile_backend=None):
    """torchtitan's order on labkit's GPT and a ("dp", "tp") mesh: TP, then activation checkpointing, then
    torch.compile per block, then fully_shard per block and the root.
    Shown in 12_composing_the_layout (code-12-order)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # deferred: the ranks' only
        checkpoint_wrapper)
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s, and only the ranks need it
    from torch.distributed.tensor.parallel import parallelize_module  # deferred: DTensor, the ranks' only

    for i, block in enumerate(model.blocks):
        # 1. TP first: it turns the block's weights into DTensors on the "tp" mesh, which FSDP then shards
        parallelize_module(block, mesh["tp"], tp_plan())
        # 2. checkpoint the whole block: FSDP's unit below is this wrapper, so the recomputation of a
        #    block runs while that block's weights are gathered for its backward anyway
        block = checkpoint_wrapper(block)
        # 3. compile each block alone: one small graph, the same code for every block, FSDP's hooks outside
        if compile_backend is not None:
            block.compile(backend=compile_backend)
        # 4. FSDP last, on the "dp" mesh: one unit per block, gathered just before it runs
        fully_shard(block, mesh=mesh["dp"])
        model.blocks[i] = block
    fully_shard(model, mesh=mesh["dp"])  # the root: embeddings, final norm, head
    return model


# ---- the cases, as each rank runs them -----------------------------------------------------------------------

def _gathered_blocks(blocks) -> int:
    """How many of ``blocks`` (FSDP units) hold their gathered weights now (FSDP2's private state, read only:
    a unit's AllGather outputs are resized to 0 bytes when it reshards)."""
    n = 0
    for block in blocks:
        group = block._get_fsdp_state()._fsdp_param_group
        n += any(t.untyped_storage().nbytes() for fp in group.fsdp_params for t in fp.all_gather_outputs)
    return n


def _torchtitan_case(spec, device, mesh, x, y):
    """apply_all runs a step; the weights' placements; its loss beside an unsharded model's on the same batch."""
    torch.manual_seed(0)
    with torch.no_grad():
        ref_loss = GPT(spec).to(device)(x, y).item()
    torch.manual_seed(0)
    model = apply_all(GPT(spec).to(device), mesh)
    with CollectiveCounter().counting() as counter:
        loss = model(x, y)
        loss.backward()
    w = model.blocks[0].fc.weight
    return {"ok": True, "loss_diff": abs(loss.item() - ref_loss), "mesh_dims": list(w.device_mesh.mesh_dim_names),
            "placements": [str(p) for p in w.placements], "split": [not p.is_replicate() for p in w.placements],
            "all_gather": counter.snapshot()["allgather"]}


def _fsdp_first_case(spec, device, mesh):
    """fully_shard on "dp" first, then parallelize_module on "tp": what torch says."""
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s, and only the ranks need it
    from torch.distributed.tensor.parallel import parallelize_module  # deferred: DTensor, the ranks' only

    torch.manual_seed(0)
    model = GPT(spec).to(device)
    try:
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], tp_plan())
    except Exception as e:  # noqa: BLE001 -- the outcome shown: the error torch raises
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    return {"ok": True, "error": ""}


def _ac_case(spec, device, mesh, x, y, stack: bool):
    """Checkpointing one block per FSDP unit (AC, then fully_shard) or one stack of all blocks around the
    units: one step's AllGathers, the blocks that ran again in the backward, most blocks gathered at once."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # deferred: the ranks' only
        checkpoint_wrapper)
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s, and only the ranks need it

    torch.manual_seed(0)
    model = GPT(spec).to(device)
    blocks, seen = list(model.blocks), {"runs": 0, "most": 0}

    def look(*_):  # as each block's forward starts: count it, and how many blocks are gathered now
        seen["runs"] += 1  # (a pre-hook: a recomputation stops early, once it has what backward needs)
        seen["most"] = max(seen["most"], _gathered_blocks(units))

    for block in blocks:
        block.register_forward_pre_hook(look)
    if stack:  # FSDP per block; one checkpoint around them all: the recomputed region spans every unit
        units = [fully_shard(b, mesh=mesh) for b in blocks]
        model.blocks = torch.nn.ModuleList([checkpoint_wrapper(torch.nn.Sequential(*blocks))])
    else:      # torchtitan's: checkpoint each block, then make that wrapper the FSDP unit
        units = [fully_shard(checkpoint_wrapper(b), mesh=mesh) for b in blocks]
        model.blocks = torch.nn.ModuleList(units)
    fully_shard(model, mesh=mesh)
    with CollectiveCounter().counting() as counter:
        loss = model(x, y)
        forward_runs, seen["most"] = seen["runs"], 0
        loss.backward()
    return {"all_gather": counter.snapshot()["allgather"], "n_layer": len(blocks),
            "recomputed": seen["runs"] - forward_runs, "most_gathered_backward": seen["most"]}


def _compile_case(spec, device, mesh, x, y, whole_model: bool):
    """torch.compile with a backend that only records each captured graph's op count (no code generated):
    every block before fully_shard, or the whole model after it. Two steps (the second reuses the graphs)."""
    from torch import _dynamo  # deferred: dynamo's import costs a second
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s, and only the ranks need it

    graphs = []

    def record(gm, example_inputs):  # a dynamo backend: note the graph, run it as captured
        graphs.append(sum(n.op == "call_function" for n in gm.graph.nodes))
        return gm.forward

    _dynamo.reset()  # forget the graphs of the case before
    torch.manual_seed(0)
    model = GPT(spec).to(device)
    t0 = time.perf_counter()
    for block in model.blocks:
        if not whole_model:
            block.compile(backend=record)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if whole_model:
        model.compile(backend=record)
    try:
        for _ in range(2):
            model(x, y).backward()
    except Exception as e:  # noqa: BLE001 -- the outcome shown: the error torch raises
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}", "graphs": graphs}
    return {"ok": True, "graphs": graphs, "seconds": time.perf_counter() - t0}


def _lab_rank(rank, kind, spec, micro_batch, seed, compile_check) -> dict:
    """A spawned rank: every case, in one process group, on a (world / 2, 2) ("dp", "tp") mesh."""
    from torch.distributed.device_mesh import init_device_mesh  # deferred: DTensor's import costs a second

    ws, r = rank.world_size, rank.rank
    device = rank_device(kind, r)
    with ddp_mod.process_group(kind, r, ws, rank.file_store()):
        t0 = time.perf_counter()
        mesh = init_device_mesh(kind, (ws // 2, 2), mesh_dim_names=("dp", "tp"))
        d = mesh.get_coordinate()[0]  # ranks of one "tp" group share their batch; "dp" groups differ
        x, y = (t[d * micro_batch:(d + 1) * micro_batch].to(device)
                for t in next(ddp_mod.demo_batches(spec, micro_batch * ws // 2, 1, seed)))
        out = {"torchtitan": _torchtitan_case(spec, device, mesh, x, y),
               "fsdp_first": _fsdp_first_case(spec, device, mesh)}
        flat = init_device_mesh(kind, (ws,))  # the other cases: FSDP over every rank, no TP
        deep = dataclasses.replace(spec, n_layer=max(spec.n_layer, AC_LAYERS))
        out["ac_per_block"] = _ac_case(deep, device, flat, x, y, stack=False)
        out["ac_stack"] = _ac_case(deep, device, flat, x, y, stack=True)
        if compile_check:
            out["compile_per_block"] = _compile_case(spec, device, flat, x, y, whole_model=False)
            out["compile_whole"] = _compile_case(spec, device, flat, x, y, whole_model=True)
        out["seconds"] = time.perf_counter() - t0
    return out


# ---- the lab ---------------------------------------------------------------------------------------------------

def order_lab(model: str = "tiny", micro_batch: int = 4, world_size: int = 4, compile_check: bool = True,
              seed: int = 0, timeout_s: float = 120.0) -> dict:
    """Every case above in one spawn of ``world_size`` ranks (even, 2 to 8: the mesh is world / 2 x 2).
    ``compile_check`` False skips the two torch.compile cases. ``ok`` False with ``error`` where the ranks
    could not run."""
    _choice("model", model, PRESETS)
    whole("micro_batch", micro_batch)
    if whole("world_size", world_size) > MAX_WORLD or world_size % 2:
        raise ConfigError("world_size", world_size, f"an even number of processes, 2 to {MAX_WORLD} (tp = 2)")
    _bool("compile_check", compile_check)
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    if not has("fully_shard"):
        return {"ok": False, "error": message("fully_shard")}
    spec, kind = PRESETS[model], device_kind(world_size)
    lab = {"ok": True, "torch": torch.__version__, "model": model, "world_size": world_size, "kind": kind,
           "n_layer": spec.n_layer, "ac_layers": max(spec.n_layer, AC_LAYERS), "compile_check": compile_check}
    return rank_lab(lab, _lab_rank, (kind, spec, micro_batch, seed, compile_check), "order lab", timeout_s,
                    "labkit-order-")


# ---- the lab's figures as rows and verdict keys -----------------------------------------------------------------

ORDERS = {"torchtitan": "TP → AC → FSDP (torchtitan's; compile: below)",
          "fsdp_first": "FSDP, then TP",
          "ac_per_block": "AC per block, then FSDP per block",
          "ac_stack": "FSDP per block, then AC around the stack",
          "compile_per_block": "compile per block, then FSDP",
          "compile_whole": "FSDP, then compile the whole model"}


def verdicts(lab: dict) -> dict:
    """Per case, its outcome's name, from rank 0 (the counts are checked equal on every rank in the tests):
    torchtitan 'ran' (a 2-D placement, loss equal to one process's) or 'wrong'; fsdp_first 'raised' or 'ran';
    ac 'more_gathered' (the stack held more blocks gathered at once in its backward), 'more_gathers' (it
    gathered more often) or 'same'; compile 'same_graphs', 'different_graphs', 'failed' or 'skipped'."""
    r = lab["ranks"][0]
    t = r["torchtitan"]
    out = {"torchtitan": "ran" if t["ok"] and all(t["split"]) and t["loss_diff"] < 1e-5 else "wrong",
           "fsdp_first": "raised" if not r["fsdp_first"]["ok"] else "ran"}
    per, stack = r["ac_per_block"], r["ac_stack"]
    out["ac"] = ("more_gathers" if stack["all_gather"] > per["all_gather"] else
                 "more_gathered" if stack["most_gathered_backward"] > per["most_gathered_backward"] else "same")
    if not lab["compile_check"]:
        out["compile"] = "skipped"
    elif not (r["compile_per_block"]["ok"] and r["compile_whole"]["ok"]):
        out["compile"] = "failed"
    else:
        same = r["compile_per_block"]["graphs"] == r["compile_whole"]["graphs"]
        out["compile"] = "same_graphs" if same else "different_graphs"
    return out


def order_rows(lab: dict) -> list:
    """One row per case (rank 0): the order, its outcome's name, its error's first line (cut to 60
    characters), the blocks the case's model had, and the measured evidence as numbers (None where a
    figure does not apply to that case)."""
    r, v = lab["ranks"][0], verdicts(lab)
    outcome = {"torchtitan": v["torchtitan"], "fsdp_first": v["fsdp_first"], "ac_per_block": "ran",
               "ac_stack": v["ac"], "compile_per_block": v["compile"], "compile_whole": v["compile"]}
    rows = []
    for key, label in ORDERS.items():
        case = r.get(key)
        if case is None:
            continue
        error = (case.get("error") or "").split("\n")[0]  # its first line: the full text is in lab["ranks"]
        rows.append({"case": key, "order": label, "outcome": outcome[key],
                     "error": error if len(error) <= 60 else error[:59] + "…",
                     "blocks": case.get("n_layer", lab["n_layer"]) if case.get("ok", True) else None,
                     "all_gather": case.get("all_gather"), "recomputed": case.get("recomputed"),
                     "most_gathered": case.get("most_gathered_backward"),
                     "graphs": len(case["graphs"]) if "graphs" in case else None,
                     "graph_ops": sum(case["graphs"]) if "graphs" in case else None,
                     "loss_diff": case.get("loss_diff")})
    return rows
