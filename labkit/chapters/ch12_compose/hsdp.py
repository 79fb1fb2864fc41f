"""HSDP (taught in chapter 12): ``fully_shard`` on a 2-D ("replicate", "shard") mesh -- FSDP inside each group of
``shard`` ranks (a "node"), plain data parallelism across the groups -- against plain FSDP over every rank. One
spawn runs both on the same ranks; every collective is counted with its bytes and the ranks of its process
group, and set beside the formula. Then the course's ring model predicts when HSDP beats plain FSDP on 2
nodes x 8 GPUs (NVLink inside a node, InfiniBand between nodes).

    lab = hsdp.hsdp_lab(model="tiny", world_size=4, replicate=2)
    hsdp.count_rows(lab)        # per layout and collective: the group, calls and bytes, counted and formula
    hsdp.predicted_rows()       # per model size: FSDP over 16 against HSDP 8 x 2, predicted
"""
from __future__ import annotations

import math
import time

import torch

from ...base.compat import has, message
from ...base.runtime import ConfigError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.model import GPT, VOCAB
from ...tools.collectives import CollectiveCounter, device_kind, figure, rank_device, rank_lab
from ...whatif.devices import catalogue
from ...whatif.layouts import gpu_spec, state_bytes_per_gpu
from ...whatif.roofline import LINKS, Link, ring_allreduce_s, ring_bytes_sent

MESH_DIMS = ("replicate", "shard")   # the names torch's HSDP expects, outer dimension first
KINDS = ("all_gather", "reduce_scatter", "all_reduce")
KIND_OF = dict(zip(("allgather", "reducescatter", "allreduce"), KINDS))  # CollectiveCounter's names -> these
MAX_WORLD = 8


# ---- what the chapter shows: the HSDP code a learner writes at work -----------------------------------------

def hsdp_shard(model, mesh):
    """Shard a GPT with FSDP2 on ``mesh``: a unit per block, then the root (embeddings, final norm, head).
    Shown in 12_composing_the_layout (code-12-hsdp)."""
    from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s

    # A 1-D mesh is plain FSDP: every unit is sharded over all its ranks. A 2-D ("replicate", "shard") mesh
    # is HSDP: each unit is sharded over the "shard" dimension (ranks of one node: fast links) and replicated
    # over "replicate" (the same shard on every node), so the weights' AllGathers and the gradients'
    # ReduceScatters stay inside the node; only the gradient shards are AllReduced across the nodes.
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# ---- the formulas --------------------------------------------------------------------------------------------

def unit_shapes(spec) -> dict:
    """The parameter shapes of each FSDP unit of labkit's GPT: "root" (token and position embeddings, final
    norm; the head is tied to the token embedding) and "block" (one of ``spec.n_layer``)."""
    d = spec.d_model
    block = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    return {"root": [(VOCAB, d), (spec.seq_len, d), (d,), (d,)], "block": block}


def unit_bytes(shapes, shard: int, dtype_bytes: int = 4) -> int:
    """Bytes of one unit's AllGather output (= its ReduceScatter input): FSDP2 pads each parameter's first
    dimension up to a multiple of ``shard``, so every rank's shard has the same size."""
    whole("shard", shard)
    total = sum(-(-shape[0] // shard) * shard * math.prod(shape[1:]) for shape in shapes)
    return total * whole("dtype_bytes", dtype_bytes)


def expected_calls(n_layer: int, replicate: int, shard: int) -> dict:
    """Collectives of one forward + backward, per kind: {"calls", "dim" (the mesh dimension its group spans)}.
    reshard_after_forward=True (the blocks) and torch's default for the root (kept gathered: its backward
    comes first): AllGather 2 L + 1 and ReduceScatter L + 1 over "shard"; under HSDP also an AllReduce of
    each unit's reduced gradient shard over "replicate", L + 1."""
    L = whole("n_layer", n_layer)
    if whole("shard", shard) < 2:
        raise ConfigError("shard", shard, "2 or more ranks per shard group (1 shards nothing)")
    hsdp = whole("replicate", replicate) > 1
    return {"all_gather": {"calls": 2 * L + 1, "dim": "shard"},
            "reduce_scatter": {"calls": L + 1, "dim": "shard"},
            "all_reduce": {"calls": L + 1 if hsdp else 0, "dim": "replicate"}}


def expected_bytes(spec, shard: int, dtype_bytes: int = 4) -> dict:
    """Bytes of one call per kind and unit: AllGather and ReduceScatter move the whole (padded) unit; HSDP's
    AllReduce moves the rank's reduced shard, the unit / ``shard``."""
    shapes = unit_shapes(spec)
    full = {u: unit_bytes(s, shard, dtype_bytes) for u, s in shapes.items()}
    return {"all_gather": full, "reduce_scatter": full, "all_reduce": {u: b // shard for u, b in full.items()}}


def crosses_nodes(ranks, per_node: int) -> bool:
    """Whether a group spans more than one node of ``per_node`` consecutive ranks."""
    return len({r // per_node for r in ranks}) > 1


def sent_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring collective of ``nbytes`` over ``n`` ranks: an AllReduce 2 (n-1)/n x
    bytes, an AllGather or ReduceScatter half of that."""
    _choice("kind", kind, KINDS)
    sent = ring_bytes_sent(nbytes, n)
    return sent if kind == "all_reduce" else sent / 2


# ---- the lab: one spawn, both layouts on the same ranks -------------------------------------------------------

def _layout_part(spec, device, mesh, x, y):
    """One counted forward + backward of a freshly sharded GPT; the bytes of the local shards; the full
    gradients (gathered after the count) to compare the two layouts."""
    torch.manual_seed(0)
    model = hsdp_shard(GPT(spec).to(device), mesh)
    with CollectiveCounter().counting(all_reduce=True, ranks=True) as counter:  # and each call's group
        model(x, y).backward()
    calls = [{"kind": KIND_OF[n], "bytes": b, "ranks": g} for n, b, g in counter.groups]
    grads = torch.cat([p.grad.full_tensor().reshape(-1).cpu() for p in model.parameters()])
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    return {"calls": calls, "param_bytes": local}, grads


def _lab_rank(rank, kind, spec, micro_batch, replicate, seed) -> dict:
    """A spawned rank: HSDP on ``replicate`` x (world / replicate), then plain FSDP on all ranks."""
    from torch.distributed.device_mesh import init_device_mesh  # deferred: DTensor's import costs a second

    ws, r = rank.world_size, rank.rank
    device = rank_device(kind, r)
    x, y = (t[r * micro_batch:(r + 1) * micro_batch].to(device)
            for t in next(ddp_mod.demo_batches(spec, micro_batch * ws, 1, seed)))
    with ddp_mod.process_group(kind, r, ws, rank.file_store()):
        t0 = time.perf_counter()
        mesh2 = init_device_mesh(kind, (replicate, ws // replicate), mesh_dim_names=MESH_DIMS)
        out = {"mesh": mesh2.mesh.tolist()}
        out["hsdp"], g_hsdp = _layout_part(spec, device, mesh2, x, y)
        out["fsdp"], g_fsdp = _layout_part(spec, device, init_device_mesh(kind, (ws,)), x, y)
        out["grad_diff"] = float((g_hsdp - g_fsdp).abs().max())
        out["seconds"] = time.perf_counter() - t0
    return out


def _check(model, micro_batch, world_size, replicate, seed, timeout_s):
    _choice("model", model, PRESETS)
    whole("micro_batch", micro_batch)
    if whole("world_size", world_size) > MAX_WORLD or world_size < 4:
        raise ConfigError("world_size", world_size, f"4 to {MAX_WORLD} processes (2 groups of 2 or more)")
    if whole("replicate", replicate) < 2 or world_size % replicate or world_size // replicate < 2:
        raise ConfigError("replicate", replicate,
                          f"2 or more groups that split world_size {world_size} evenly, 2 or more ranks each")
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")


def hsdp_lab(model: str = "tiny", micro_batch: int = 4, world_size: int = 4, replicate: int = 2, seed: int = 0,
             timeout_s: float = 120.0) -> dict:
    """HSDP on a (replicate, world_size / replicate) mesh and plain FSDP on all ``world_size`` ranks, one step
    of each counted on every rank. ``ok`` False with ``error`` where FSDP2 could not run."""
    _check(model, micro_batch, world_size, replicate, seed, timeout_s)
    if not has("fully_shard"):
        return {"ok": False, "error": message("fully_shard")}
    spec, kind = PRESETS[model], device_kind(world_size)
    lab = {"ok": True, "torch": torch.__version__, "model": model, "n_layer": spec.n_layer, "spec": spec,
           "world_size": world_size, "replicate": replicate, "shard": world_size // replicate, "kind": kind}
    lab = rank_lab(lab, _lab_rank, (kind, spec, micro_batch, replicate, seed), "HSDP lab", timeout_s, "labkit-hsdp-")
    return {**lab, "mesh": lab["ranks"][0]["mesh"]} if lab["ok"] else lab


# ---- the lab's figures as rows and verdict keys ----------------------------------------------------------------

def _layouts(lab):
    """(name, replicate, shard) of the two layouts; a "node" is one HSDP shard group."""
    return (("hsdp", lab["replicate"], lab["shard"]), ("fsdp", 1, lab["world_size"]))


def count_rows(lab: dict, rank: int = 0) -> list:
    """Per layout and collective kind, on ``rank``: the group it ran on, whether that group crosses a "node"
    (a shard group of HSDP), calls and the bytes of one block's call, counted and by the formula."""
    rows, per_node = [], lab["shard"]
    for name, replicate, shard in _layouts(lab):
        calls = lab["ranks"][rank][name]["calls"]
        want, size = expected_calls(lab["n_layer"], replicate, shard), expected_bytes(lab["spec"], shard)
        for kind in KINDS:
            mine = [c for c in calls if c["kind"] == kind]
            groups = sorted({c["ranks"] for c in mine})
            rows.append({"layout": name, "collective": kind, "calls": len(mine), "expected": want[kind]["calls"],
                         "dim": (want[kind]["dim"] if name == "hsdp" else "1-D: all") if mine else "-",
                         "groups": "; ".join(",".join(map(str, g)) for g in groups) or "-",
                         "crosses_nodes": any(crosses_nodes(g, per_node) for g in groups),
                         "block_bytes": max((c["bytes"] for c in mine), default=0),
                         "expected_block_bytes": size[kind]["block"] if want[kind]["calls"] else 0,
                         "bytes": sum(c["bytes"] for c in mine),
                         "expected_bytes": _formula_total(lab, kind, replicate, shard)})
    return rows


def _formula_total(lab, kind, replicate, shard) -> int:
    n = expected_calls(lab["n_layer"], replicate, shard)[kind]["calls"]
    if not n:
        return 0
    b = expected_bytes(lab["spec"], shard)[kind]
    return b["root"] + (n - 1) * b["block"]  # the root once, the blocks the rest (AllGather: 2 per block)


def counts_verdict(lab: dict) -> str:
    """'agree' when every rank's calls, bytes and groups per kind are the formula's (AllGather and
    ReduceScatter over the shard dimension, AllReduce over the replicate one), else 'differ'."""
    mesh = lab["mesh"]
    dims = {"shard": {tuple(row) for row in mesh}, "replicate": {tuple(col) for col in zip(*mesh)},
            "all": {tuple(range(lab["world_size"]))}}
    for r in range(lab["world_size"]):
        for row in count_rows(lab, r):
            if (row["calls"], row["block_bytes"], row["bytes"]) != (
                    row["expected"], row["expected_block_bytes"], row["expected_bytes"]):
                return "differ"
            mine = {c["ranks"] for c in lab["ranks"][r][row["layout"]]["calls"] if c["kind"] == row["collective"]}
            allowed = dims["all" if row["layout"] == "fsdp" else row["dim"]] if mine else set()
            if not mine <= allowed:
                return "differ"
    return "agree"


def crossing_rows(lab: dict, rank: int = 0) -> list:
    """Per layout: the calls whose group crosses a node, the bytes one rank sends in them (ring), all its calls,
    its local parameter bytes, and the largest gradient difference between the layouts."""
    rows = []
    for name, replicate, shard in _layouts(lab):
        calls = lab["ranks"][rank][name]["calls"]
        cross = [c for c in calls if crosses_nodes(c["ranks"], lab["shard"])]
        rows.append({"layout": name, "calls": len(calls), "crossing_calls": len(cross),
                     "crossing_sent": sum(sent_bytes(c["kind"], c["bytes"], len(c["ranks"])) for c in cross),
                     "param_bytes": lab["ranks"][rank][name]["param_bytes"],
                     "grad_diff": max(r["grad_diff"] for r in lab["ranks"])})
    return rows


# ---- predicted: 2 nodes x 8 GPUs, NVLink inside a node, InfiniBand between ------------------------------------

MODEL_SIZES = {"1B": (1e9, 16), "7B": (7e9, 32), "70B": (70e9, 80)}  # parameters, blocks (Llama-like depths)


def _half_ring_s(nbytes, n, link: Link) -> float:
    """An AllGather or a ReduceScatter: half a ring AllReduce (n - 1 steps of nbytes / n)."""
    return ring_allreduce_s(nbytes, n, link.bandwidth, link.latency) / 2 if n > 1 else 0.0


def step_comm_s(n_params: float, n_layer: int, replicate: int, shard: int, per_node: int = 8,
                intra: Link = LINKS["nvlink"], inter: Link = LINKS["infiniband"], dtype_bytes: int = 2) -> dict:
    """Predicted seconds of one step's collectives (one micro-batch, one unit per block, the root ignored):
    2 L AllGathers and L ReduceScatters of a block (bf16) over ``shard`` ranks -- at NVLink's speed when the
    group fits in a node, else at the slower link's (a ring is as fast as its slowest hop) -- and, under HSDP,
    L AllReduces of a block's gradient shard (block / shard) over ``replicate`` ranks across the nodes."""
    n = real("n_params", n_params, strict=True)
    L, replicate, shard, per_node = (whole(k, v) for k, v in (("n_layer", n_layer), ("replicate", replicate),
                                                              ("shard", shard), ("per_node", per_node)))
    block = whole("dtype_bytes", dtype_bytes) * n / L
    shard_link = intra if shard <= per_node else inter
    parts = {"all_gather": 2 * L * _half_ring_s(block, shard, shard_link),
             "reduce_scatter": L * _half_ring_s(block, shard, shard_link),
             "all_reduce": L * ring_allreduce_s(block / shard, replicate, inter.bandwidth, inter.latency)
             if replicate > 1 else 0.0}
    return {**parts, "total": sum(parts.values()), "shard_link": shard_link.name}


def predicted_rows(sizes=None, nodes: int = 2, per_node: int = 8, gpu: str = "h100-sxm") -> list:
    """Per model size (predicted): FSDP over nodes x per_node GPUs against HSDP (shard per_node inside a node,
    replicate over the nodes): each step's communication and the bytes per GPU -- model state (bf16 weights
    and gradients, AdamW's fp32 state: ZeRO-3 over the shard group) plus two gathered blocks -- and whether
    they fit the GPU (activations come on top: ``headroom_bytes`` is what is left for them)."""
    sizes = MODEL_SIZES if sizes is None else sizes
    if not isinstance(sizes, dict) or not sizes:
        raise ConfigError("sizes", sizes, "a dict of name -> (parameters, blocks), like MODEL_SIZES")
    n_gpus = whole("nodes", nodes) * whole("per_node", per_node)
    _choice("gpu", gpu, list(catalogue()["devices"]))  # refused as every choice is: "choose one of ..."
    usable = gpu_spec(gpu)["usable"]
    rows = []
    for name, (n, L) in sizes.items():
        for layout, replicate, shard in (("fsdp", 1, n_gpus), ("hsdp", nodes, per_node)):
            comm = step_comm_s(n, L, replicate, shard, per_node)
            state = state_bytes_per_gpu(n, shard, stage=3)["total"]
            gathered = 2 * 2 * n / L  # two bf16 blocks gathered at a time: the one running, the one prefetched
            total = state + gathered
            rows.append({"model": name, "n_params": n, "n_layer": L, "layout": layout, "replicate": replicate,
                         "shard": shard, "comm_s": comm["total"], "parts": comm, "state_bytes": state,
                         "gathered_bytes": gathered, "bytes_per_gpu": total, "fits": total <= usable,
                         "headroom_bytes": usable - total, "usable_bytes": usable, "label": "predicted"})
    return rows


def predicted_verdicts(rows: list) -> dict:
    """Per model: 'hsdp' (HSDP's state fits and its communication is shorter), 'fsdp_only_fits' (only plain
    FSDP's state fits), 'neither_fits', or 'fsdp' (both fit, plain FSDP communicates less)."""
    out = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        f, h = (next(r for r in rows if r["model"] == name and r["layout"] == k) for k in ("fsdp", "hsdp"))
        if not f["fits"] and not h["fits"]:
            out[name] = "neither_fits"
        elif not h["fits"]:
            out[name] = "fsdp_only_fits"
        else:
            out[name] = "hsdp" if h["comm_s"] < f["comm_s"] else "fsdp"
    return out


def predicted_chart(rows: list):
    """Per model size: each step's communication (ms, log scale) of FSDP over all GPUs and of HSDP, labelled
    with the bytes per GPU before activations; hatched where they do not fit the GPU. All predicted."""
    fig, ax = figure(7.0, 3.0)
    names = list(dict.fromkeys(r["model"] for r in rows))
    for j, (layout, color) in enumerate((("fsdp", "#4c72b0"), ("hsdp", "#dd8452"))):
        for i, name in enumerate(names):
            r = next(r for r in rows if r["model"] == name and r["layout"] == layout)
            x, ms = i + (j - 0.5) * 0.36, r["comm_s"] * 1e3
            ax.bar(x, ms, 0.34, color=color, hatch=None if r["fits"] else "//", edgecolor="white",
                   label=f"{layout.upper()} {r['replicate']} x {r['shard']}" if i == 0 else None)
            ax.text(x, ms * 1.1, f"{r['bytes_per_gpu'] / 1e9:.0f} GB", ha="center", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("communication per step (ms)")
    ax.set_title("Predicted: FSDP over 16 GPUs vs HSDP (8 per node x 2 nodes); GB = per GPU before activations, "
                 "// = does not fit", fontsize=8)
    ax.legend(frameon=False, fontsize=8)
    return fig
