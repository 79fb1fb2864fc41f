"""FSDP2 in practice (taught in chapter 10): ``fully_shard`` on labkit's GPT over real processes, one spawn
per world size, everything counted or measured on every rank -- bytes per rank, ``reshard_after_forward``,
bf16, clipping over shards, accumulation without a sync -- and its figures as rows, verdict keys and charts.

FSDP2 runs only in the spawned ranks, never in the calling process: in a process that ran it, later
DataLoader-worker forks crashed (chapter 09 found it; its tests run FSDP in a fresh interpreter too).
"""
from __future__ import annotations

import time

import torch

from ...base.compat import has, message
from ...base.runtime import ConfigError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.ddp import demo_batches as _demo_batches, local_bytes as _local_bytes
from ...engine.model import GPT
from ...tools.collectives import CollectiveCounter, device_kind, figure, rank_device, rank_lab
from .formulas import expected_calls, layout_state_bytes, padded_numel, ring_bytes_per_rank
from .ranks import (counter_problem, dtypes, full_vector, optimizer_bytes, unsharded_grad_bytes,
                    unsharded_param_bytes)

FP32_BYTES = {"params": 4, "grads": 4, "optimizer": 8}  # fp32 weights, fp32 grads, AdamW's two fp32 moments
MEMORY_PARTS = tuple(FP32_BYTES)
MAX_WORLD = 8


# ---- what the chapter shows: the FSDP2 code a learner writes at work --------------------------------------

def fsdp2_shard(model, reshard_after_forward=True, param_dtype=None,
                root_reshard_after_forward=None):
    """Shard a GPT with FSDP2: a unit per block, then the root (embeddings, final norm, head).
    Shown in 10_when_the_model_does_not_fit (code-10-fsdp)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # deferred: 0.4 s

    # compute (and gather) in param_dtype; reduce-scatter gradients in fp32: a bf16 sum loses digits
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.blocks:
        # True: free the gathered weights after the block's forward, gather again for its backward
        # (less memory, one more AllGather per block); False: keep them until the backward is done;
        # an int n: keep an n-way shard (e.g. a node's GPUs): the backward gathers over n ranks
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    # the root: None (torch's default) keeps it gathered after forward: its backward comes first
    # (2L + 1 AllGathers per step); True reshards it too (2L + 2)
    fully_shard(model, mp_policy=mp, reshard_after_forward=root_reshard_after_forward)
    return model


def fsdp2_train_step(model, optimizer, micro_batches, max_norm=1.0, sync_every_micro_batch=False):
    """One optimizer update of a ``fully_shard`` model over K micro-batches (x, y).
    Shown in 10_when_the_model_does_not_fit (code-10-fsdp)."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        # no ReduceScatter until the last micro-batch: each rank accumulates full-size local gradients
        model.set_requires_gradient_sync(last or sync_every_micro_batch)
        loss = model(x, y) / k  # the update's loss is the mean over its micro-batches
        loss.backward()
    # the gradients are DTensor shards: the norm is summed over every rank's shard, so it is the full model's
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


# ---- the parts, as each rank runs them --------------------------------------------------------------------

def _batches(spec, batch, steps, seed, device, mine, k=1):
    """``steps`` updates of ``k`` micro-batches: this rank's slice ``mine`` of the same global batches."""
    out = [(x[mine].to(device), y[mine].to(device)) for x, y in _demo_batches(spec, batch, steps * k, seed)]
    return [out[i * k:(i + 1) * k] for i in range(steps)]


def _fresh(spec, seed, device):
    torch.manual_seed(seed)
    return GPT(spec).to(device)


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)


def _memory_part(spec, seed, device, updates, world_size):
    """Part 1: train sharded in fp32; the local bytes of params, grads, AdamW."""
    model = _fresh(spec, seed, device)
    n_params = sum(p.numel() for p in model.parameters())
    fsdp2_shard(model)
    opt = _adamw(model)
    grads = 0
    for micro in updates:
        for x, y in micro:
            model(x, y).backward()
        grads = _local_bytes(p.grad for p in model.parameters())  # after the ReduceScatter: this rank's shard
        opt.step()
        opt.zero_grad(set_to_none=True)
    padded = sum(padded_numel(p.shape, world_size) for p in model.parameters()) // world_size
    return {"params": _local_bytes(model.parameters()), "grads": grads, "optimizer": optimizer_bytes(opt),
            "n_params": n_params, "padded_shard_numel": padded}


def _reshard_part(spec, seed, device, updates, flag, root=None):
    """Part 2: one step's collectives (the first: lazy initialisation adds none) and the gathered bytes after
    forward; ``root``: the root's reshard_after_forward."""
    model = _fresh(spec, seed, device)
    full = _local_bytes(model.parameters())
    fsdp2_shard(model, reshard_after_forward=flag, root_reshard_after_forward=root)
    opt = _adamw(model)
    peak = {"forward_peak": 0}

    def record(module, args):  # runs after FSDP's own pre-forward hook: this unit is gathered now
        peak["forward_peak"] = max(peak["forward_peak"], unsharded_param_bytes(model))

    for block in model.blocks:
        block.register_forward_pre_hook(record)
    x, y = updates[0][0]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with CollectiveCounter().counting() as counter:
        loss = model(x, y)
        held = unsharded_param_bytes(model)  # between forward and backward
        loss.backward()
        after = unsharded_param_bytes(model)
    opt.step()
    opt.zero_grad(set_to_none=True)
    out = {**counter.snapshot(), "held_after_forward": held, "held_after_backward": after, **peak,
           "full_param_bytes": full}
    if device.type == "cuda":
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    return out


def _precision_part(spec, seed, device, updates):
    """Part 3: the same step in bf16 with fp32 reduction; the shards stay fp32 (the master copy)."""
    model = fsdp2_shard(_fresh(spec, seed, device), param_dtype=torch.bfloat16)
    opt = _adamw(model)
    x, y = updates[0][0]
    with CollectiveCounter().counting() as counter:
        model(x, y).backward()
    out = {**counter.snapshot(), "grad_dtypes": dtypes(p.grad for p in model.parameters()),
           "param_dtypes": dtypes(model.parameters()), "params": _local_bytes(model.parameters()),
           "grads": _local_bytes(p.grad for p in model.parameters())}
    opt.step()
    return {**out, "optimizer": optimizer_bytes(opt)}


def _clip_part(spec, seed, device, updates, max_norm):
    """Part 4: clip_grad_norm_ on the sharded model."""
    model = fsdp2_shard(_fresh(spec, seed, device))
    opt = _adamw(model)
    norms = []
    for micro in updates:
        norm = fsdp2_train_step(model, opt, micro, max_norm)
        norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
    return {"norms": norms, "params": full_vector(model)}


def _accum_part(spec, seed, device, updates, max_norm):
    """Part 5: K micro-batches per update, syncing each or only the last."""
    out = {}
    for name, every in (("sync_every", True), ("no_sync", False)):
        model = fsdp2_shard(_fresh(spec, seed, device))
        opt = _adamw(model)
        between, calls = 0, []
        for micro in updates:
            with CollectiveCounter().counting() as counter:
                k = len(micro)
                for i, (x, y) in enumerate(micro):  # fsdp2_train_step's loop, with a look between micro-batches
                    model.set_requires_gradient_sync(every or i == k - 1)
                    (model(x, y) / k).backward()
                    if i < k - 1:
                        sharded = _local_bytes(p.grad for p in model.parameters())
                        between = max(between, unsharded_grad_bytes(model) + sharded)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
            calls.append(counter.snapshot())
        out[name] = {**calls[-1], "calls_each_update": [c["reducescatter"] for c in calls],
                     "grad_bytes_between": between, "params": full_vector(model)}
    return out


def _reference(spec, seed, device, batch, steps, k, max_norm):
    """One process, the whole batch, no FSDP: the norms and parameters the sharded runs must reproduce."""
    model = _fresh(spec, seed, device)
    opt = _adamw(model)
    norms = []
    for micro in _batches(spec, batch, steps, seed, device, slice(None), k):
        for x, y in micro:
            (model(x, y) / len(micro)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return norms, full_vector(model)


def _compare(out: dict, ref) -> None:
    """Replace the gathered parameter vectors by their largest differences from the reference (rank 0)."""
    clip, acc = out["clip"], out["accum"]
    vectors = {"clip": clip.pop("params"), **{n: acc[n].pop("params") for n in acc}}
    if ref is None:
        return
    clip["reference_norms"] = ref["clip"][0]
    clip["max_param_diff"] = float((vectors["clip"] - ref["clip"][1]).abs().max())
    for n in acc:
        acc[n]["max_param_diff_vs_reference"] = float((vectors[n] - ref["accum"][1]).abs().max())
    acc["max_param_diff_between"] = float((vectors["sync_every"] - vectors["no_sync"]).abs().max())
    acc["reference_norms"] = ref["accum"][0]


def _lab_rank(rank, kind, spec, micro_batch, steps, seed, accumulation, max_norm, detail) -> dict:
    """A spawned rank: every part of the lab, in one process group."""
    ws, r = rank.world_size, rank.rank
    device = rank_device(kind, r)
    mine = slice(r * micro_batch, (r + 1) * micro_batch)
    batch = micro_batch * ws
    out = {"device": str(device)}
    with ddp_mod.process_group(kind, r, ws, rank.file_store()):
        t0 = time.perf_counter()
        out["memory"] = _memory_part(spec, seed, device, _batches(spec, batch, steps, seed, device, mine), ws)
        out["memory_s"] = time.perf_counter() - t0
        if not detail:
            return out
        t0 = time.perf_counter()
        one = _batches(spec, batch, 1, seed, device, mine)
        out["reshard"] = {flag: _reshard_part(spec, seed, device, one, flag) for flag in (True, False)}
        out["reshard_root"] = _reshard_part(spec, seed, device, one, True, root=True)
        out["precision"] = _precision_part(spec, seed, device, one)
        out["detail_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        out["clip"] = _clip_part(spec, seed, device, _batches(spec, batch, steps, seed, device, mine), max_norm)
        out["accum"] = _accum_part(spec, seed, device,
                                   _batches(spec, batch, steps, seed, device, mine, accumulation), max_norm)
        # rank 0 compares with one process on the whole batch (tensors stay here: results travel as numbers)
        ref = {"clip": _reference(spec, seed, device, batch, steps, 1, max_norm),
               "accum": _reference(spec, seed, device, batch, steps, accumulation, max_norm)} if r == 0 else None
        _compare(out, ref)
        out["train_s"] = time.perf_counter() - t0
    return out


# ---- the lab ---------------------------------------------------------------------------------------------

def _check(model, world_sizes, micro_batch, steps, seed, timeout_s, accumulation, max_norm, detail_world_size):
    _choice("model", model, PRESETS)
    if not isinstance(world_sizes, (list, tuple)) or not world_sizes:
        raise ConfigError("world_sizes", world_sizes, f"a list of world sizes, e.g. (1, 2), each 1 to {MAX_WORLD}")
    for ws in world_sizes:
        if whole("world_sizes", ws) > MAX_WORLD:
            raise ConfigError("world_sizes", ws, f"1 to {MAX_WORLD} processes (each rank is a process)")
    if len(set(world_sizes)) != len(world_sizes):
        raise ConfigError("world_sizes", world_sizes, "each world size once")
    whole("micro_batch", micro_batch)
    whole("steps", steps)
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    if whole("accumulation", accumulation) < 2:
        raise ConfigError("accumulation", accumulation, "2 or more micro-batches per update (1 accumulates nothing)")
    real("max_norm", max_norm, strict=True, allowed="a norm > 0")
    if detail_world_size not in world_sizes or detail_world_size < 2:
        raise ConfigError("detail_world_size", detail_world_size,
                          f"one of world_sizes {tuple(world_sizes)} that is 2 or more (one rank shards nothing)")


def fsdp_lab(model: str = "tiny", world_sizes=(1, 2), micro_batch: int = 4, steps: int = 2, seed: int = 0,
             timeout_s: float = 120.0, accumulation: int = 4, max_norm: float = 0.5,
             detail_world_size: int = 2) -> dict:
    """FSDP2 measured on real processes: memory per rank at each of ``world_sizes``; at ``detail_world_size`` also
    resharding, bf16, clipping and accumulation. ``ok`` False with ``error`` where FSDP could not run or its
    collectives could not be counted (``counter_problem``)."""
    _check(model, world_sizes, micro_batch, steps, seed, timeout_s, accumulation, max_norm, detail_world_size)
    if not has("fully_shard"):
        return {"ok": False, "error": message("fully_shard")}
    spec, t_all = PRESETS[model], time.monotonic()
    lab = {"ok": True, "torch": torch.__version__, "model": model, "n_blocks": spec.n_layer,
           "micro_batch": micro_batch, "steps": steps, "accumulation": accumulation, "max_norm": max_norm,
           "world_sizes": list(world_sizes),
           "detail_world_size": detail_world_size, "memory": {}, "seconds": {}, "kinds": {}}
    for ws in world_sizes:
        kind, detail = device_kind(ws), ws == detail_world_size
        run = rank_lab({"ok": True, "world_size": ws, "kind": kind}, _lab_rank,
                       (kind, spec, micro_batch, steps, seed, accumulation, max_norm, detail),
                       f"FSDP2 lab (world size {ws})", timeout_s, "labkit-fsdp2-")
        if not run["ok"]:
            return {**lab, "ok": False, "error": run["error"]}
        lab["seconds"][ws], lab["kinds"][ws] = run["seconds"], kind
        lab["memory"][ws] = _memory_summary([r["memory"] for r in run["ranks"]], ws)
        if detail:
            _detail(lab, run["ranks"])
            problem = counter_problem(lab)
            if problem:  # fail with the reason rather than report counts of 0
                return {**lab, "ok": False, "error": problem}
    lab["seconds"]["total"] = time.monotonic() - t_all
    return lab


def _memory_summary(ranks: list, ws: int) -> dict:
    n = ranks[0]["n_params"]
    fp32 = {k: b * n / ws for k, b in FP32_BYTES.items()}
    fp32["total"] = sum(fp32.values())
    mixed = {k: v for k, v in layout_state_bytes(n, dp=ws, zero_stage=3).items() if k != "cpu"}
    rows = [{**{k: r[k] for k in MEMORY_PARTS}, "total": sum(r[k] for k in MEMORY_PARTS)} for r in ranks]
    return {"n_params": n, "ranks": rows, "formula_fp32": fp32, "formula_mixed": mixed,
            "uneven": len({r["params"] for r in rows}) > 1,
            "padded_shard_bytes": {k: b * ranks[0]["padded_shard_numel"] for k, b in FP32_BYTES.items()}}


def _detail(lab: dict, results: list) -> None:
    r0 = results[0]
    lab.update({k: r0[k] for k in ("reshard", "reshard_root", "precision", "accum")})
    lab["reshard_counts_all_ranks"] = {**{flag: [r["reshard"][flag]["allgather"] for r in results]
                                          for flag in (True, False)},
                                       "root": [r["reshard_root"]["allgather"] for r in results]}
    lab["clip"] = {**r0["clip"], "clipped": all(n > lab["max_norm"] for n in r0["clip"]["reference_norms"])}
    lab["rank_seconds"] = {k: r0.get(k) for k in ("memory_s", "detail_s", "train_s")}


# ---- the lab's figures as rows and verdict keys -----------------------------------------------------------

def memory_rows(lab: dict) -> list:
    """Per world size: the largest rank's bytes per part and total, rank 0's total, the fp32 formula's 16 N / world
    size, and the mixed-precision split (2 + 2 + 12 bytes per parameter)."""
    rows = []
    for ws, m in sorted(lab["memory"].items()):
        big = max(m["ranks"], key=lambda r: r["total"])
        rows.append({"world_size": ws, **{k: big[k] for k in MEMORY_PARTS}, "total": big["total"],
                     "rank0_total": m["ranks"][0]["total"], "formula": m["formula_fp32"]["total"],
                     "mixed_params": m["formula_mixed"]["params"], "mixed_grads": m["formula_mixed"]["grads"],
                     "mixed_optimizer": m["formula_mixed"]["optimizer"], "uneven": m["uneven"]})
    return rows


def memory_verdict(lab: dict) -> str:
    """'formula' (every rank held exactly 16 N / world size), 'uneven' (a world size cut some parameter's rows
    unevenly: FSDP2's chunks of ceil(rows / world size) leave the trailing ranks fewer, and only the mean is
    the formula) or 'differ'."""
    if any(m["uneven"] for m in lab["memory"].values()):
        return "uneven"
    exact = all(abs(r[k] - m["formula_fp32"][k]) < 0.5 for m in lab["memory"].values() for r in m["ranks"]
                for k in MEMORY_PARTS)
    return "formula" if exact else "differ"


def calls_rows(lab: dict) -> list:
    """Each counted collective setting against the unit structure (``expected_calls``)."""
    L, k, acc = lab["n_blocks"], lab["accumulation"], lab["accum"]
    settings = (
        ("AllGather", "step", "reshard=True", lab["reshard"][True], expected_calls(L, True)),
        ("AllGather", "step", "reshard=False", lab["reshard"][False], expected_calls(L, False)),
        ("AllGather", "step", "root resharded too", lab["reshard_root"],
         expected_calls(L, True, root_reshard_after_forward=True)),
        ("ReduceScatter", "update", f"sync all {k}", acc["sync_every"], expected_calls(L, micro_batches=k)),
        ("ReduceScatter", "update", "sync last only", acc["no_sync"],
         expected_calls(L, micro_batches=k, sync_every_micro_batch=False)))
    return [{"collective": c, "per": per, "setting": name, "counted": got[c.lower()], "expected": want[c.lower()]}
            for c, per, name, got, want in settings]


def calls_verdict(lab: dict) -> str:
    return "agree" if all(r["counted"] == r["expected"] for r in calls_rows(lab)) else "differ"


def reshard_rows(lab: dict) -> list:
    """Per reshard setting: AllGathers per step (counted, expected), the gathered bytes held after and during the
    forward, the bytes gathered per step and what one rank sends of them."""
    L, ws = lab["n_blocks"], lab["detail_world_size"]
    out = []
    for setting, r, expected in (
            ("blocks True, root default", lab["reshard"][True], expected_calls(L, True)),
            ("blocks False", lab["reshard"][False], expected_calls(L, False)),
            ("blocks and root True", lab["reshard_root"], expected_calls(L, True, root_reshard_after_forward=True))):
        out.append({"setting": setting, "allgather": r["allgather"], "expected": expected["allgather"],
                    "held_after_forward": r["held_after_forward"], "forward_peak": r["forward_peak"],
                    "gathered": r["allgather_bytes"], "sent": ring_bytes_per_rank(r["allgather_bytes"], ws),
                    "full_param_bytes": r["full_param_bytes"],
                    "through": ", ".join("dist." + n for n in r.get("allgather_functions", [])) or "none"})
    return out


def precision_rows(lab: dict) -> list:
    """fp32 against MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): each collective's bytes and dtype,
    and the model-state bytes rank 0 keeps."""
    t, p = lab["reshard"][True], lab["precision"]
    m = lab["memory"][lab["detail_world_size"]]["ranks"][0]
    return [{"policy": "fp32 (no policy)", "allgather_bytes": t["allgather_bytes"], "allgather_dtype": "float32",
             "reducescatter_bytes": t["reducescatter_bytes"], "reducescatter_dtype": "float32", "kept": m["total"],
             "shard_dtypes": "float32 / float32"},
            {"policy": "param bf16, reduce fp32", "allgather_bytes": p["allgather_bytes"],
             "allgather_dtype": ", ".join(p["allgather_dtypes"]), "reducescatter_bytes": p["reducescatter_bytes"],
             "reducescatter_dtype": ", ".join(p["reducescatter_dtypes"]),
             "kept": p["params"] + p["grads"] + p["optimizer"],
             "shard_dtypes": f"{', '.join(p['param_dtypes'])} / {', '.join(p['grad_dtypes'])}"}]


def accum_rows(lab: dict) -> list:
    """Syncing every micro-batch against only the last: ReduceScatters and bytes per update, what one rank sends,
    the gradient bytes held between micro-batches, the AllGathers, the parameters against one process."""
    a, ws = lab["accum"], lab["detail_world_size"]
    return [{"sync": name, "reducescatter": r["reducescatter"], "reduced": r["reducescatter_bytes"],
             "sent": ring_bytes_per_rank(r["reducescatter_bytes"], ws), "held_between": r["grad_bytes_between"],
             "allgather": r["allgather"], "vs_reference": r["max_param_diff_vs_reference"]}
            for name, r in (("every micro-batch", a["sync_every"]), ("last only", a["no_sync"]))]


def clip_figures(lab: dict) -> dict:
    """clip_grad_norm_ sharded against one process: per update the two norms and their relative difference; the
    worst, the parameters' largest difference, the max norm."""
    c = lab["clip"]
    rows = [{"update": i + 1, "sharded": a, "reference": b, "relative": abs(a - b) / b}
            for i, (a, b) in enumerate(zip(c["norms"], c["reference_norms"]))]
    return {"rows": rows, "worst_relative": max(r["relative"] for r in rows), "max_param_diff": c["max_param_diff"],
            "max_norm": lab["max_norm"], "updates": len(rows)}


def fsdp_memory_chart(lab: dict):
    """Bytes per rank against world size, params / grads / AdamW state stacked: measured (the largest rank) beside
    the fp32 formula."""
    fig, ax = figure(7.0, 2.8)
    sizes = sorted(lab["memory"])
    colors = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
    for i, ws in enumerate(sizes):
        m = lab["memory"][ws]
        big = max(m["ranks"], key=lambda r: r["total"])
        for x, source, hatch in ((i - 0.18, big, None), (i + 0.18, m["formula_fp32"], "//")):
            bottom = 0.0
            for part in MEMORY_PARTS:
                kib = source[part] / 1024
                ax.bar(x, kib, 0.34, bottom=bottom, color=colors[part], hatch=hatch, edgecolor="white",
                       label=part if i == 0 and hatch is None else None)
                bottom += kib
    ax.set_xticks(range(len(sizes)), [f"{ws} rank{'s' if ws > 1 else ''}\nmeasured | formula" for ws in sizes])
    ax.set_ylabel("KiB per rank")
    ax.set_title("Model state per rank under FSDP2 (fp32 + AdamW)")
    ax.legend(frameon=False, fontsize=8)
    return fig


def fsdp_calls_chart(lab: dict):
    """Collectives counted against the unit structure, a horizontal bar per setting (the long names sit one under
    the other)."""
    rows = calls_rows(lab)
    fig, ax = figure(7.0, 0.45 * len(rows) + 1.0)
    ys = range(len(rows))
    colors = ["#4c72b0" if r["collective"] == "AllGather" else "#dd8452" for r in rows]
    ax.barh(ys, [r["counted"] for r in rows], 0.6, color=colors, label="counted")
    ax.scatter([r["expected"] for r in rows], ys, marker="|", s=300, color="black", label="unit structure",
               zorder=3)
    for y, r in zip(ys, rows):
        ax.text(r["counted"] / 2, y, str(r["counted"]), ha="center", va="center", fontsize=8, color="white")
    ax.set_yticks(list(ys), [f"{r['collective']} per {r['per']}: {r['setting']}" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("calls on rank 0", fontsize=8)
    ax.set_title(f"FSDP2's collectives, {lab['n_blocks']} blocks + root, rank 0 of {lab['detail_world_size']}",
                 fontsize=9)
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    return fig
