"""Expert parallelism on real ranks (chapter 12): each rank holds one group of experts; tokens travel to their
experts in one ``all_to_all_single`` (dispatch) and back in a second (combine), after a small all-to-all of
the token counts so every rank knows its uneven splits. Run on ``world_size`` processes (gloo on a CPU, NCCL
with a GPU per rank: both implement all_to_all), counted with the course's ``CollectiveCounter`` and set
beside the formula and a one-process run of the same layer.

    demo = moe.ep_demo(world_size=4, n_experts=8, top_k=2, tokens=256, d_model=64)   # moe.MoE on 4 ranks
    moe.ep_rows(demo)        # per rank and capacity factor: counted bytes, the formula's, max |EP - one process|
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from ...base.runtime import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import real, whole
from ...engine.launch import spawn_ranks
from ...tools.collectives import CollectiveCounter, device_kind, load_average, rank_device

TOLERANCE = 1e-5  # max |EP output - one-process output| still called equal: fp32 sums in another order


def ep_forward(layer, x, group=None):
    """The MoE layer with its experts spread over the ranks: rank r runs only experts r*E/ws .. (r+1)*E/ws - 1.
    Every rank routes its own tokens (same router weights everywhere), sends each kept assignment's row to the
    rank holding its expert, runs its experts on what arrives, and sends the results back.
    Shown in 12_composing_the_layout (code-12-moe-ep)."""
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    n_local = layer.n_experts // ws                              # experts per rank
    gates, chosen, kept = layer.route(x)                         # capacity counted over this rank's tokens
    token, j = torch.nonzero(kept, as_tuple=True)
    expert = chosen[token, j]
    order = torch.argsort(expert, stable=True)                   # rows grouped by expert, hence by rank
    token, j, expert = token[order], j[order], expert[order]
    per_expert = torch.bincount(expert, minlength=layer.n_experts)
    # 0. counts first: rank r learns how many rows each rank will send to each of its experts
    incoming = torch.empty_like(per_expert)
    dist.all_to_all_single(incoming, per_expert, group=group)    # even splits: n_local counts per rank
    send = per_expert.view(ws, n_local).sum(dim=1).tolist()      # rows to each rank
    recv = incoming.view(ws, n_local).sum(dim=1).tolist()        # rows from each rank
    # 1. dispatch: uneven splits, rows grouped by destination
    inbox = x.new_empty(sum(recv), x.shape[-1])
    dist.all_to_all_single(inbox, x[token], recv, send, group=group)
    # 2. my experts; from each source rank the rows arrive grouped by expert
    mine = torch.arange(n_local).repeat(ws).repeat_interleave(incoming.cpu()).to(x.device)
    outbox = torch.empty_like(inbox)
    for e in range(n_local):
        rows = mine == e
        outbox[rows] = layer.experts[rank * n_local + e](inbox[rows])
    # 3. combine: the reverse exchange, then each token sums its gated expert outputs
    back = x.new_empty(len(token), x.shape[-1])
    dist.all_to_all_single(back, outbox, send, recv, group=group)
    out = torch.zeros_like(x)
    out.index_add_(0, token, gates[token, j, None] * back)
    return out


def alltoall_bytes(tokens: int, top_k: int, d_model: int, world_size: int, dtype_bytes: int = 4) -> dict:
    """One all-to-all of the MoE forward (dispatch, or combine) on one rank when nothing is dropped: the buffer
    holds tokens * top_k rows of d_model values; what stays local never crosses a link, and with routing
    spread evenly that is 1 / world_size of it."""
    for name, v in (("tokens", tokens), ("top_k", top_k), ("d_model", d_model), ("world_size", world_size),
                    ("dtype_bytes", dtype_bytes)):
        whole(name, v)
    buffer = tokens * top_k * d_model * dtype_bytes
    return {"buffer": buffer, "off_rank": buffer * (world_size - 1) / world_size}


def counted_bytes(send, d_model: int, n_experts: int, dtype_bytes: int = 4) -> list:
    """Per rank, the bytes ``CollectiveCounter`` notes for one ``ep_forward`` with routing ``send`` (send[i][j]:
    the rows rank i dispatches to rank j): the counter notes each call's receive buffer -- the counts
    (n_experts int64), the dispatch (rows the others send me) and the combine (my own rows, back) -- and the
    bytes this rank sends off-rank in the dispatch (its rows minus those for its own experts)."""
    ws, row = len(send), d_model * dtype_bytes
    return [{"counts": n_experts * 8, "dispatch": sum(send[i][r] for i in range(ws)) * row,
             "combine": sum(send[r]) * row, "off_rank": (sum(send[r]) - send[r][r]) * row} for r in range(ws)]


def ep_run(layer_cls, world_size: int = 4, n_experts: int = 8, top_k: int = 2, tokens: int = 256,
           d_model: int = 64, d_expert: int = 128, factors=(None, 1.0), seed: int = 0,
           timeout_s: float = 120.0) -> dict:
    """Run ``ep_forward`` on ``world_size`` processes for a ``layer_cls(d_model, n_experts, top_k, d_expert)``
    layer (``moe.MoE``; ``moe.ep_demo`` passes it) built from ``seed`` on every rank, each rank with its own
    ``tokens`` (random, seeded by rank),
    once per capacity factor (None: n_experts / top_k, room for every assignment: nothing dropped). Per rank:
    the collectives counted by name and bytes, the routing, max |EP - the one-process layer on the same tokens|.
    ``ok`` False and ``error`` where a rank failed or was late."""
    for name, v in (("world_size", world_size), ("n_experts", n_experts), ("top_k", top_k), ("tokens", tokens),
                    ("d_model", d_model), ("d_expert", d_expert)):
        whole(name, v)
    if world_size < 2 or n_experts % world_size:
        raise ConfigError("world_size", world_size, f"2 or more ranks dividing the {n_experts} experts: one "
                          "expert group per rank")
    if top_k > n_experts:
        raise ConfigError("top_k", top_k, f"at most n_experts = {n_experts}")
    if isinstance(factors, (str, bytes)) or not isinstance(factors, (tuple, list)) or not factors:
        raise ConfigError("factors", factors, "a tuple of capacity factors (None: nothing dropped)")
    factors = tuple(n_experts / top_k if f is None else real("factors", f, strict=True) for f in factors)
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    kind, t0, load = device_kind(world_size), time.monotonic(), load_average()
    args = (layer_cls, n_experts, top_k, tokens, d_model, d_expert, factors, seed, kind)
    try:
        with spawn_ranks(_ep_rank, world_size, args, kind=kind, prefix="labkit-ep-") as ranks:
            results = ranks.collect(timeout_s, "expert-parallel demo")
    except RunError as e:
        return {"ok": False, "error": str(e), "world_size": world_size}
    settings = []
    for i, f in enumerate(factors):
        send = [results[r][i]["send"] for r in range(world_size)]
        settings.append({"factor": f, "send": send, "formula": counted_bytes(send, d_model, n_experts),
                         "ranks": [results[r][i] for r in range(world_size)]})
    return {"ok": True, "world_size": world_size, "n_experts": n_experts, "top_k": top_k, "tokens": tokens,
            "d_model": d_model, "kind": kind, "backend": "nccl" if kind == "cuda" else "gloo",
            "no_drop": alltoall_bytes(tokens, top_k, d_model, world_size), "settings": settings,
            "seconds": time.monotonic() - t0, "load": max(load, load_average()), "cores": os.cpu_count()}


def _ep_rank(rank, layer_cls, n_experts, top_k, tokens, d_model, d_expert, factors, seed, kind) -> list:
    """A spawned rank: the same MoE layer from ``seed`` on every rank, its own tokens, one counted
    ``ep_forward`` per capacity factor beside the one-process layer's output on the same tokens."""
    device = rank_device(kind, rank.rank)
    ws, out = rank.world_size, []
    with ddp_mod.process_group(kind, rank.rank, ws, rank.file_store()):
        torch.manual_seed(seed)
        # every expert on every rank only for the one-process reference; ep_forward runs its own group alone
        layer = layer_cls(d_model, n_experts, top_k, d_expert).to(device)
        x = torch.randn(tokens, d_model, generator=torch.Generator().manual_seed(seed + 1 + rank.rank)).to(device)
        for f in factors:
            layer.capacity_factor = f
            with torch.no_grad():
                ref = layer(x)  # the one-process layer: every expert, this rank's tokens
                _, chosen, kept = layer.route(x)
                send = torch.bincount(chosen[kept] // (n_experts // ws), minlength=ws).tolist()
                with CollectiveCounter() as counter:
                    ep = ep_forward(layer, x)
            out.append({"error": (ep - ref).abs().max().item(), "calls": counter.calls, "send": send,
                        "dropped": layer.dropped, "assignments": tokens * top_k})
    return out


def ep_rows(demo: dict) -> list:
    """One row per capacity factor and rank: assignments dropped, the all-to-all calls counted, the bytes of
    the counts, dispatch and combine calls as counted beside the formula's, bytes sent off-rank, max error."""
    if not isinstance(demo, dict) or not demo.get("ok"):
        raise ConfigError("demo", type(demo).__name__, "the dict ep_demo returns, with ok True")
    rows = []
    for s in demo["settings"]:
        for r, (got, want) in enumerate(zip(s["ranks"], s["formula"])):
            sizes = [b for name, b in got["calls"] if name.startswith(("alltoall", "all_to_all"))]
            rows.append({"factor": s["factor"], "rank": r, "dropped": got["dropped"], "calls": len(sizes),
                         "counted": tuple(sizes), "formula": (want["counts"], want["dispatch"], want["combine"]),
                         "off_rank": want["off_rank"], "error": got["error"]})
    return rows


def ep_verdict(demo: dict) -> str:
    """'agree': on every rank and factor the EP output equals the one-process layer's (within ``TOLERANCE``)
    and the three all-to-alls' counted bytes equal the formula's; 'bytes_differ' or 'outputs_differ' else."""
    rows = ep_rows(demo)
    if any(r["error"] > TOLERANCE for r in rows):
        return "outputs_differ"
    return "agree" if all(r["counted"] == r["formula"] for r in rows) else "bytes_differ"


def ep_figures(demo: dict) -> dict:
    """The figures the chapter's sentences quote: ranks, backend, all-to-all calls per forward, the largest
    |EP - one process|, assignments dropped at the smallest factor, rank 0's rows as bytes (nothing dropped)."""
    rows = ep_rows(demo)
    tight, loose = min(s["factor"] for s in demo["settings"]), max(s["factor"] for s in demo["settings"])
    return {"world_size": demo["world_size"], "backend": demo["backend"], "n_experts": demo["n_experts"],
            "calls": max(r["calls"] for r in rows), "max_error": max(r["error"] for r in rows),
            "tight": tight, "dropped": sum(r["dropped"] for r in rows if r["factor"] == tight),
            "assignments": demo["world_size"] * demo["tokens"] * demo["top_k"],
            "rank0_rows_bytes": next(r["counted"][2] for r in rows if r["factor"] == loose),
            "buffer": demo["no_drop"]["buffer"]}


def drop_verdict(demo: dict) -> str:
    """At the smallest capacity factor: 'none_dropped'; 'shrank' when every rank's combine buffer (its own kept
    rows, back) is exactly (tokens * k - its dropped assignments) rows: a dropped assignment sends no bytes;
    'differ' else."""
    rows = ep_rows(demo)
    tight = [r for r in rows if r["factor"] == min(s["factor"] for s in demo["settings"])]
    if not any(r["dropped"] for r in tight):
        return "none_dropped"
    row = demo["d_model"] * 4
    full = demo["tokens"] * demo["top_k"]
    return "shrank" if all(r["counted"][2] == (full - r["dropped"]) * row for r in tight) else "differ"

