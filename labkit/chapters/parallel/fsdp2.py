"""FSDP2 in practice (taught in chapter 10): ``torch.distributed.fsdp.fully_shard`` on labkit's GPT over a few
real processes, each thing counted or measured on every rank.

    lab = par.fsdp_lab(model="tiny", world_sizes=(1, 2), micro_batch=4, steps=2)
    lab["memory"][2]["ranks"][0]            # bytes of params / grads / AdamW state on rank 0 of 2
    lab["reshard"][True]["allgather"]       # AllGather calls per step: 2 x blocks + 1 (the root kept gathered)
    lab["reshard_root"]["allgather"]        # the root resharded too (reshard_after_forward=True on it): 2 x blocks + 2
    lab["accum"]["no_sync"]["reducescatter"]  # ReduceScatter calls per update: one per unit

What it measures, all in ONE spawn per world size (``engine.launch.spawn_ranks``: warm forks, a FileStore in
a private folder, gloo on loopback; NCCL with ``cuda:rank`` when there are enough GPUs):

1. memory against world size -- each rank's local bytes (fp32 AdamW: 4 + 4 + 8 bytes per parameter) against
   ZeRO-3's arithmetic, in both accountings (fp32 here; mixed precision 2 + 2 + 12 from ``formulas``);
2. ``reshard_after_forward`` True vs False on the blocks (the root left at torch's default, None: kept
   gathered), and True on the root too -- AllGather calls per step, and the unsharded parameter bytes still
   held when the forward ends (what the backward then finds gathered);
3. ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` -- the bytes one AllGather moves halve, the
   gradients still reduce in fp32;
4. ``clip_grad_norm_`` on the sharded model -- its norm equals one process's on the whole batch, and so do the
   clipped parameters;
5. gradient accumulation -- ReduceScatter calls per update when every micro-batch syncs (K per unit) and with
   ``set_requires_gradient_sync(False)`` until the last (1 per unit), the full-size gradients that costs, and
   the same parameters both ways.

FSDP2 runs only in the spawned ranks, never in the calling process: in a process that ran it, later
DataLoader-worker forks crashed (chapter 09 found it; its tests run FSDP in a fresh interpreter too).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ...base.compat import has, message
from ...base.errors import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice
from ...engine.launch import spawn_ranks
from ...engine.model import GPT
from ...engine.config import real, whole
from ...engine.ddp import demo_batches as _demo_batches, local_bytes as _local_bytes, shard
from .formulas import layout_state_bytes
from .fsdp_counting import COLLECTIVES, CollectiveCounter, counter_problem, expected_calls  # noqa: F401

FP32_BYTES = {"params": 4, "grads": 4, "optimizer": 8}  # fp32 weights, fp32 grads, AdamW's two fp32 moments
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


# ---- bytes a rank holds ---------------------------------------------------------------------------------

def _param_groups(model):
    """FSDP2's parameter groups (one per unit) of a ``fully_shard`` model (private state, read only)."""
    from torch.distributed.fsdp import FSDPModule  # deferred: 0.4 s to import, only in the ranks

    groups = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            group = m._get_fsdp_state()._fsdp_param_group
            if group is not None:
                groups.append(group)
    return groups


def unsharded_param_bytes(model) -> int:
    """Bytes of gathered (unsharded) parameters alive now: the storage of FSDP2's all-gather outputs, which it
    allocates to gather a unit and resizes to 0 when it reshards it."""
    return sum(t.untyped_storage().nbytes() for g in _param_groups(model) for fp in g.fsdp_params
               for t in fp.all_gather_outputs)


def unsharded_grad_bytes(model) -> int:
    """Bytes of full-size (not yet reduce-scattered) gradients alive now: what a rank accumulates while
    gradient sync is off."""
    total = 0
    for g in _param_groups(model):
        for fp in g.fsdp_params:
            acc = fp.unsharded_accumulated_grad
            grad = fp._unsharded_param.grad if hasattr(fp, "_unsharded_param") else None
            for t in (acc, grad):
                if t is not None:
                    total += t.untyped_storage().nbytes()
    return total


def _optimizer_bytes(opt) -> int:
    return sum(_local_bytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
               for st in opt.state.values())


def _full_vector(model) -> torch.Tensor:
    """Every parameter, gathered and flattened (a collective: every rank calls it)."""
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1).cpu()
                      for p in model.parameters()])


def _norm_value(norm) -> float:
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


# ---- the rank --------------------------------------------------------------------------------------------

def _device(kind: str, rank: int) -> torch.device:
    if kind == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _batches(spec, batch, steps, seed, device, mine, k=1):
    """``steps`` updates of ``k`` micro-batches each: this rank's slice ``mine`` of the same global batches."""
    out = [(x[mine].to(device), y[mine].to(device)) for x, y in _demo_batches(spec, batch, steps * k, seed)]
    return [out[i * k:(i + 1) * k] for i in range(steps)]


def _fresh(spec, seed, device):
    torch.manual_seed(seed)
    return GPT(spec).to(device)


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)


def _memory_part(spec, seed, device, updates, world_size):
    """Part 1: train with chapter 09's ``shard`` (fp32) and read the local bytes of params, grads, AdamW."""
    model = _fresh(spec, seed, device)
    n_params = sum(p.numel() for p in model.parameters())
    shard(model)
    opt = _adamw(model)
    grads = 0
    for micro in updates:
        for x, y in micro:
            model(x, y).backward()
        grads = _local_bytes(p.grad for p in model.parameters())  # after the ReduceScatter: this rank's shard
        opt.step()
        opt.zero_grad(set_to_none=True)
    padded = sum(_padded_numel(p.shape, world_size) for _, p in model.named_parameters()) // world_size
    return {"params": _local_bytes(model.parameters()), "grads": grads, "optimizer": _optimizer_bytes(opt),
            "n_params": n_params, "padded_shard_numel": padded}


def _padded_numel(shape, world_size) -> int:
    """FSDP2 pads dim 0 up to a multiple of the world size (its ``_get_dim0_padded_size``)."""
    if not len(shape):
        return world_size
    rows = -(-shape[0] // world_size) * world_size
    return rows * (torch.Size(shape[1:]).numel())


def _reshard_part(spec, seed, device, updates, flag, root=None):
    """Part 2: count one step's collectives (the first: lazy initialisation adds none) and the gathered bytes
    after forward; ``root`` is the root's reshard_after_forward (None: torch's default, kept gathered)."""
    model = _fresh(spec, seed, device)
    full = _local_bytes(model.parameters())
    fsdp2_shard(model, reshard_after_forward=flag, root_reshard_after_forward=root)
    opt = _adamw(model)
    peak = {"forward_peak": 0}

    def record(module, args):  # runs after FSDP's own pre-forward hook: this unit is gathered now
        peak["forward_peak"] = max(peak["forward_peak"], unsharded_param_bytes(model))

    for block in model.blocks:
        block.register_forward_pre_hook(record)
    counter = CollectiveCounter()
    x, y = updates[0][0]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with counter.counting():
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


def _dtypes(tensors) -> list:
    return sorted({str(t.dtype).replace("torch.", "") for t in tensors if t is not None})


def _precision_part(spec, seed, device, updates):
    """Part 3: the same counted step with bf16 compute and fp32 gradient reduction, and what each rank then
    keeps (FSDP2's sharded parameters stay fp32: they are the master copy)."""
    model = fsdp2_shard(_fresh(spec, seed, device), param_dtype=torch.bfloat16)
    opt = _adamw(model)
    counter = CollectiveCounter()
    x, y = updates[0][0]
    with counter.counting():
        model(x, y).backward()
    out = {**counter.snapshot(), "grad_dtypes": _dtypes(p.grad for p in model.parameters()),
           "param_dtypes": _dtypes(model.parameters()), "params": _local_bytes(model.parameters()),
           "grads": _local_bytes(p.grad for p in model.parameters())}
    opt.step()
    return {**out, "optimizer": _optimizer_bytes(opt)}


def _clip_part(spec, seed, device, updates, max_norm):
    """Part 4: clip_grad_norm_ on the sharded model against one process on the whole batch (rank 0)."""
    model = fsdp2_shard(_fresh(spec, seed, device))
    opt = _adamw(model)
    norms = [_norm_value(fsdp2_train_step(model, opt, micro, max_norm)) for micro in updates]
    params = _full_vector(model)
    return {"norms": norms, "params": params}


def _accum_part(spec, seed, device, updates, max_norm):
    """Part 5: K micro-batches per update, syncing each or only the last; counted and measured."""
    out = {}
    for name, every in (("sync_every", True), ("no_sync", False)):
        model = fsdp2_shard(_fresh(spec, seed, device))
        opt = _adamw(model)
        held = {"grad_bytes_between": 0}

        calls = []
        for micro in updates:
            counter = CollectiveCounter()
            with counter.counting():
                k = len(micro)
                for i, (x, y) in enumerate(micro):  # fsdp2_train_step's loop, with a look between micro-batches
                    model.set_requires_gradient_sync(every or i == k - 1)
                    (model(x, y) / k).backward()
                    if i < k - 1:
                        sharded = _local_bytes(p.grad for p in model.parameters())
                        held["grad_bytes_between"] = max(held["grad_bytes_between"],
                                                         unsharded_grad_bytes(model) + sharded)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
            calls.append(counter.snapshot())
        out[name] = {**calls[-1], "calls_each_update": [c["reducescatter"] for c in calls], **held,
                     "params": _full_vector(model)}
    return out


def _reference(spec, seed, device, batch, steps, k, max_norm):
    """One process, the whole batch, no FSDP: the norms and parameters the sharded runs must reproduce."""
    model = _fresh(spec, seed, device)
    opt = _adamw(model)
    whole_batches = _batches(spec, batch, steps, seed, device, slice(None), k)
    norms = []
    for micro in whole_batches:
        for x, y in micro:
            (model(x, y) / len(micro)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return norms, torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def _compare(out: dict, ref) -> None:
    """Replace the gathered parameter vectors by their largest differences (on rank 0: from the reference)."""
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
    """A spawned rank: every part of the lab on this rank, in this one process group."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    device = _device(kind, rank.rank)
    ws, r = rank.world_size, rank.rank
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


def _kind(world_size: int) -> str:
    """NCCL on ``cuda:rank`` when this machine has a GPU per rank; gloo on the CPU otherwise."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "cpu"


def fsdp_lab(model: str = "tiny", world_sizes=(1, 2), micro_batch: int = 4, steps: int = 2, seed: int = 0,
             timeout_s: float = 120.0, accumulation: int = 4, max_norm: float = 0.5,
             detail_world_size: int = 2) -> dict:
    """FSDP2 measured on real processes, one spawn per world size: memory per rank at each of
    ``world_sizes``; at ``detail_world_size`` also reshard_after_forward True/False (and True on the root
    too: ``reshard_root``), bf16 mixed precision, clipping and gradient accumulation (``accumulation``
    micro-batches per update). ``ok`` False with the
    reason in ``error`` when FSDP could not run here, or when its collectives could not be counted
    (``counter_problem``); nothing outlives the call."""
    _check(model, world_sizes, micro_batch, steps, seed, timeout_s, accumulation, max_norm, detail_world_size)
    if not has("fully_shard"):
        return {"ok": False, "error": message("fully_shard")}
    spec = PRESETS[model]
    t_all = time.monotonic()
    lab = {"ok": True, "torch": torch.__version__, "model": model, "n_blocks": spec.n_layer,
           "micro_batch": micro_batch, "steps": steps,
           "accumulation": accumulation, "max_norm": max_norm, "world_sizes": list(world_sizes),
           "detail_world_size": detail_world_size, "memory": {}, "seconds": {}, "kinds": {}}
    for ws in world_sizes:
        kind, detail = _kind(ws), ws == detail_world_size
        t0 = time.monotonic()
        try:
            with spawn_ranks(_lab_rank, ws, (kind, spec, micro_batch, steps, seed, accumulation, max_norm, detail),
                             kind=kind, prefix="labkit-fsdp2-") as ranks:
                results = ranks.collect(timeout_s, f"FSDP2 lab (world size {ws})")
        except RunError as e:
            return {**lab, "ok": False, "error": str(e)}
        lab["seconds"][ws] = time.monotonic() - t0
        lab["kinds"][ws] = kind
        lab["memory"][ws] = _memory_summary([results[r]["memory"] for r in range(ws)], ws)
        if detail:
            _detail(lab, [results[r] for r in range(ws)])
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
    rows = [{k: r[k] for k in ("params", "grads", "optimizer")} for r in ranks]
    for row in rows:
        row["total"] = row["params"] + row["grads"] + row["optimizer"]
    return {"n_params": n, "ranks": rows, "formula_fp32": fp32, "formula_mixed": mixed,
            "uneven": len({r["params"] for r in rows}) > 1,
            "padded_shard_bytes": {k: b * ranks[0]["padded_shard_numel"] for k, b in FP32_BYTES.items()}}


def _detail(lab: dict, results: list) -> None:
    r0 = results[0]
    lab["reshard"] = r0["reshard"]
    lab["reshard_root"] = r0["reshard_root"]
    lab["reshard_counts_all_ranks"] = {**{flag: [r["reshard"][flag]["allgather"] for r in results]
                                          for flag in (True, False)},
                                       "root": [r["reshard_root"]["allgather"] for r in results]}
    lab["precision"] = r0["precision"]
    lab["clip"] = {**r0["clip"], "clipped": all(n > lab["max_norm"] for n in r0["clip"]["reference_norms"])}
    lab["accum"] = r0["accum"]
    lab["rank_seconds"] = {k: r0.get(k) for k in ("memory_s", "detail_s", "train_s")}
