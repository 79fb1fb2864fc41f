"""The ranks of chapter 11's DCP demo (``dcp.dcp_demo`` runs them): FSDP2 models trained, saved and loaded
with the checkpoint code a learner writes at work (first below, shown as ``lr.dcp.<name>``: a sharded or plain
model and its optimizer saved and loaded with ``torch.distributed.checkpoint``, synchronously or with
``async_save``), each check and timing on every rank. Only spawned processes run this module's rank functions
(FSDP2 never runs in the calling process).
"""
from __future__ import annotations

import os
import shutil
import statistics
import time
import warnings

import torch
import torch.distributed as dist

from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS
from ...engine.ddp import demo_batches, local_bytes
from ...engine.model import GPT
from .state import device_for


# ---- the checkpoint code a learner writes at work ---------------------------------------------------------

def save_checkpoint(model, optimizer, folder, process_group=None):
    """Save a model (sharded or not) and its optimizer to ``folder`` with DCP: each rank writes its shards.
    Shown in 11_long_runs_and_failures (code-11-dcp)."""
    import torch.distributed.checkpoint as dcp  # deferred: 2-3 s to import on a CPU
    from torch.distributed.checkpoint.state_dict import get_state_dict  # deferred: as above

    # keyed by parameter name (FQN); under FSDP2 every tensor is a DTensor: this rank's shard + its place
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # every rank writes one file of its own shards (__<rank>_0.distcp), in parallel; rank 0 adds .metadata
    # (which slice of which tensor is where). No process group (one process): no_dist, no collectives
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder, process_group=process_group,
             no_dist=not dist.is_initialized())


def load_checkpoint(model, optimizer, folder):
    """Load ``folder`` into ``model`` and ``optimizer``, whatever world size (and sharding) wrote it.
    Shown in 11_long_runs_and_failures (code-11-dcp)."""
    import torch.distributed.checkpoint as dcp  # deferred: 2-3 s to import on a CPU
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # deferred: as above

    # the state dicts of THIS model's layout say what this rank must fill: its shards, or whole tensors
    model_sd, optim_sd = get_state_dict(model, optimizer)  # (a fresh optimizer's state is created here)
    state = {"model": model_sd, "optim": optim_sd}
    # in place: each rank reads every stored chunk that overlaps its shard and keeps the overlap (resharding)
    dcp.load(state, checkpoint_id=folder, no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def async_checkpoint(model, optimizer, folder, pending, process_group):
    """Start saving ``folder`` in the background; returns the future to wait on before the next save.
    Shown in 11_long_runs_and_failures (code-11-async-save)."""
    import torch.distributed.checkpoint as dcp  # deferred: 2-3 s to import on a CPU
    from torch.distributed.checkpoint.state_dict import get_state_dict  # deferred: as above

    if pending is not None:
        pending.result()  # one save in flight at a time: two would double the CPU copies and their collectives
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # with no async_stager, DCP's default stager blocks while it copies the state to CPU memory (staging:
    # training may change the weights after that; on GPUs a DefaultStager(StagingOptions()) stages in the
    # background with pinned memory instead, and the loop waits only before its next optimizer step);
    # a thread then plans and writes, its collectives on process_group -- a gloo group of its own, so they
    # never interleave with the training loop's on the default group
    return dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder,
                          process_group=process_group)


def train_with_async_saves(model, optimizer, batches, every, folder_for):
    """A training loop that checkpoints every ``every`` updates without waiting for the files.
    Shown in 11_long_runs_and_failures (code-11-async-save)."""
    group = dist.new_group(backend="gloo")  # async_save needs a CPU group; one of its own (see above)
    pending = None
    for step, (x, y) in enumerate(batches, start=1):
        model(x, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % every == 0:
            pending = async_checkpoint(model, optimizer, folder_for(step), pending, group)
    if pending is not None:
        pending.result()  # before exiting: a save still writing is a checkpoint that is not there yet
    dist.destroy_process_group(group)


# ---- the ranks' plumbing ---------------------------------------------------------------------------------

def _fresh(spec, seed, device):
    torch.manual_seed(seed)
    return GPT(spec).to(device)


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)


def _shard(model):
    from torch.distributed.fsdp import fully_shard  # deferred: 1.5 s to import, only in the ranks

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _update(model, opt, x, y) -> float:
    """One AdamW update; the loss averaged over the ranks (each has its slice of the batch)."""
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss = loss.detach().clone()
    if dist.is_initialized():
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return float(loss)


def _batches(spec, micro_batch, world_size, n, seed, rank, device):
    """``n`` global batches of micro_batch x world_size sequences; this rank's slice of each."""
    mine = slice(rank * micro_batch, (rank + 1) * micro_batch) if rank is not None else slice(None)
    return [(x[mine].to(device), y[mine].to(device))
            for x, y in demo_batches(spec, micro_batch * world_size, n, seed)]


def _full_state(model, opt) -> dict:
    """The whole model and optimizer state, unsharded, on the CPU (a collective under FSDP2; every rank
    gets it: the models here are small)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict  # deferred: 2-3 s

    m, o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    cpu = lambda t: t.detach().cpu().clone() if torch.is_tensor(t) else t  # noqa: E731
    return {"model": {k: cpu(v) for k, v in m.items()},
            "optim": {p: {k: cpu(v) for k, v in st.items()} for p, st in o["state"].items()}}


def _differences(a: dict, b: dict) -> list:
    """Names of the tensors that are not bit for bit equal (torch.equal) between two ``_full_state``s."""
    bad = [k for k in a["model"] if k not in b["model"] or not torch.equal(a["model"][k], b["model"][k])]
    for p, st in a["optim"].items():
        other = b["optim"].get(p, {})
        bad += [f"optim {p} {k}" for k, v in st.items()
                if k not in other or not torch.equal(torch.as_tensor(v), torch.as_tensor(other[k]))]
    return bad


def _folder_bytes(folder) -> dict:
    files = {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(os.listdir(folder))}
    return {"files": files, "total": sum(files.values())}


def _state_bytes(model, opt) -> dict:
    """Bytes of the whole model (tied weights once) and of AdamW's state, counted from the tensors."""
    ws = dist.get_world_size() if dist.is_initialized() else 1
    n = sum(p.numel() for p in model.parameters())  # global element counts (DTensor.numel is the full one)
    params = n * 4
    moments = sum(ws * local_bytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
                  for st in opt.state.values())
    steps = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                if torch.is_tensor(v) and v.dim() == 0)
    # names the state dict lists beyond the parameters: a tied weight under its second name (head.weight)
    named = dict(model.named_parameters())  # tied weights once
    extra = {k: v.numel() * v.element_size() for k, v in model.state_dict().items() if k not in named}
    return {"n_params": n, "param_bytes": params, "moment_bytes": moments, "step_bytes": steps,
            "extra_names": sorted(extra), "extra_bytes": sum(extra.values())}


def _barrier_time(fn, group) -> float:
    """Seconds ``fn`` takes, started together on every rank; the slowest rank's time (synchronised on a GPU).
    ``group``: a gloo group, so the CPU tensor works beside NCCL too."""
    dist.barrier(group=group)
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
    return float(dt)


def _spread(xs) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": list(xs)}


# ---- world size 1: the plain model's save (1 -> 2) and load (2 -> 1) -----------------------------------

def _save_at_one(spec, micro_batch, world_size, updates, seed, device, folder) -> None:
    """World size 1: a plain GPT trained on the whole global batch, saved by a process with no process group;
    its full state kept as the reference for the load at world size 2."""
    model = _fresh(spec, seed, device)
    opt = _adamw(model)
    for x, y in _batches(spec, micro_batch, world_size, updates, seed, None, device):
        _update(model, opt, x, y)
    save_checkpoint(model, opt, os.path.join(folder, "ws1"))
    torch.save(_full_state(model, opt), os.path.join(folder, "ref_ws1.pt"))


def load_at_one(rank, kind, spec, seed, folder) -> dict:
    """A fresh process, world size 1: the ranks' checkpoint loaded into a plain GPT (DCP reshards 2 -> 1)."""
    # DCP warns that it loads "in a single process" when there is no process group: that is the point here
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    t0 = time.perf_counter()
    device = device_for(kind, 0)
    model = _fresh(spec, seed + 5, device)
    opt = _adamw(model)
    ref = _load_ref(folder, "ref_ws2.pt")
    differed = bool(_differences(_full_state(model, opt), ref))
    load_checkpoint(model, opt, os.path.join(folder, "ws2"))
    mismatches = _differences(_full_state(model, opt), ref)
    return {"device": str(device), "differed_before": differed, "mismatches": mismatches,
            "to_torch_save": _to_torch_save(folder, ref), "seconds": time.perf_counter() - t0}


def _load_ref(folder, name):
    return torch.load(os.path.join(folder, name), weights_only=True)  # never unpickle code


def _to_torch_save(folder, ref) -> dict:
    """``dcp_to_torch_save``: the sharded folder as ONE torch.save file (in one process, no group)."""
    try:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # deferred: ranks only
    except ImportError as e:
        return {"ok": False, "error": str(e)}
    path = os.path.join(folder, "ws2.pt")
    t0 = time.perf_counter()
    dcp_to_torch_save(os.path.join(folder, "ws2"), path)
    seconds = time.perf_counter() - t0
    sd = torch.load(path, weights_only=True)
    model = sd["model"]
    return {"ok": True, "seconds": seconds, "bytes": os.path.getsize(path), "keys": sorted(sd),
            "model_equal": all(torch.equal(model[k], v) for k, v in ref["model"].items())}


# ---- the ranks: round trip, 1 -> 2, size and time, async ------------------------------------------------

def _round_trip(spec, micro_batch, updates, seed, device, r, ws, folder) -> dict:
    """Train, save, load into a fresh (differently initialised) model and optimizer, one more update each."""
    batches = _batches(spec, micro_batch, ws, updates + 1, seed, r, device)
    a = _shard(_fresh(spec, seed, device))
    opt_a = _adamw(a)
    losses = [_update(a, opt_a, x, y) for x, y in batches[:updates]]
    save_checkpoint(a, opt_a, os.path.join(folder, "ws2"))
    saved = _full_state(a, opt_a)
    if r == 0:
        torch.save(saved, os.path.join(folder, "ref_ws2.pt"))  # for the load at world size 1
    b = _shard(_fresh(spec, seed + 1, device))
    opt_b = _adamw(b)
    differed = bool(_differences(_full_state(b, opt_b), saved))
    load_checkpoint(b, opt_b, os.path.join(folder, "ws2"))
    loaded = _differences(_full_state(b, opt_b), saved)
    x, y = batches[updates]
    loss_a, loss_b = _update(a, opt_a, x, y), _update(b, opt_b, x, y)
    return {"losses": losses, "next_loss_saved_run": loss_a, "next_loss_loaded_run": loss_b,
            "loss_equal": loss_a == loss_b, "differed_before_load": differed, "mismatches_after_load": loaded,
            "mismatches_after_next_update": _differences(_full_state(a, opt_a), _full_state(b, opt_b))}


def _from_one(spec, seed, device, folder) -> dict:
    """The world-size-1 checkpoint loaded into the sharded model: DCP reshards 1 -> 2."""
    model = _shard(_fresh(spec, seed + 2, device))
    opt = _adamw(model)
    load_checkpoint(model, opt, os.path.join(folder, "ws1"))
    return {"mismatches": _differences(_full_state(model, opt), _load_ref(folder, "ref_ws1.pt"))}


def _layout(path) -> dict:
    """What the checkpoint's ``.metadata`` lists: tensor bytes under "model" and "optim", and the stored
    items (one per tensor chunk: a sharded tensor has one chunk per rank). A file this demo wrote itself:
    DCP reads ``.metadata`` with plain ``pickle.load``."""
    from torch.distributed.checkpoint import FileSystemReader  # deferred: 2-3 s; only ranks read folders
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # deferred: as above

    md = FileSystemReader(path).read_metadata()
    out = {"model": 0, "optim": 0, "items": len(md.storage_data)}
    for key, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            out[key.split(".")[0]] += m.size.numel() * m.properties.dtype.itemsize
    out["tensor_bytes"] = out["model"] + out["optim"]
    return out


def _async_round(model, opt, path, group, during=None) -> dict:
    """One ``async_save`` (nothing in flight before it): the seconds the caller was blocked, until the files
    were written (the future's done-callback), and ``during()``'s result while the thread writes."""
    dist.barrier(group=group)
    ended = []
    t0 = time.perf_counter()
    fut = async_checkpoint(model, opt, path, None, group)
    blocked = time.perf_counter() - t0
    fut.add_done_callback(lambda f: ended.append(time.perf_counter()))  # in the writer thread (or now)
    extra = during(fut) if during is not None else None
    still_writing = not fut.done()
    fut.result()
    times = torch.tensor([blocked, (ended[0] if ended else time.perf_counter()) - t0], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)  # the slowest rank's
    return {"blocked": float(times[0]), "total": float(times[1]), "during": extra,
            "still_writing": still_writing}


def _remove(group, *paths):
    dist.barrier(group=group)  # every rank is done with them
    if dist.get_rank() == 0:
        for p in paths:
            shutil.rmtree(p, ignore_errors=True)


def _size_and_time(name, micro_batch, seed, device, r, ws, folder, repeats, group) -> dict:
    """Bytes on disk, and save / load / async-save seconds for one model size (round 0 a warm-up)."""
    spec = PRESETS[name]
    model = _shard(_fresh(spec, seed, device))
    opt = _adamw(model)
    (x, y), = _batches(spec, micro_batch, ws, 1, seed, r, device)
    _update(model, opt, x, y)  # AdamW's state exists after one update
    out = {"state": _state_bytes(model, opt)}
    save, load, block, total = [], [], [], []
    for i in range(repeats + 1):
        path, apath = os.path.join(folder, f"{name}-sync-{i}"), os.path.join(folder, f"{name}-async-{i}")
        save.append(_barrier_time(lambda: save_checkpoint(model, opt, path), group))
        load.append(_barrier_time(lambda: load_checkpoint(model, opt, path), group))
        a = _async_round(model, opt, apath, group)
        block.append(a["blocked"])
        total.append(a["total"])
        if i == 0:
            out.update(disk=_folder_bytes(path), async_disk=_folder_bytes(apath), layout=_layout(path))
        _remove(group, path, apath)
    out.update(save_s=_spread(save[1:]), load_s=_spread(load[1:]), async_block_s=_spread(block[1:]),
               async_total_s=_spread(total[1:]))
    return out


def _local_update(model, opt, x, y):
    """An update without the loss all-reduce: only FSDP's own collectives, on the default group."""
    model(x, y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _timed_update(model, opt, x, y):
    t0 = time.perf_counter()
    _local_update(model, opt, x, y)
    if x.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _updates_while_writing(model, opt, x, y, fut, most: int = 50) -> list:
    """Updates timed one after another until the async save's files are written (the same count on every rank:
    they agree on "still writing" over the default group, between updates -- never on the saver's group)."""
    times = []
    while len(times) < most:
        times.append(_timed_update(model, opt, x, y))
        writing = torch.tensor([0.0 if fut.done() else 1.0])
        dist.all_reduce(writing, op=dist.ReduceOp.MAX)  # any rank still writing: every rank goes on
        if writing.item() == 0.0:
            break
    return times


def _overlap(spec, micro_batch, seed, device, r, ws, folder, repeats, group) -> dict:
    """Training while an async save writes: an update timed alone and during a save; and the async checkpoint
    (started at state k, the weights changed by the update while it wrote) against a sync one of state k."""
    model = _shard(_fresh(spec, seed, device))
    opt = _adamw(model)
    batches = _batches(spec, micro_batch, ws, 2 * repeats + 3, seed, r, device)
    _update(model, opt, *batches[0])
    alone = [_barrier_time(lambda: _local_update(model, opt, x, y), group) for x, y in batches[1:repeats + 2]]
    during, blocked = [], []
    for i, (x, y) in enumerate(batches[repeats + 2:]):
        apath = os.path.join(folder, f"overlap-async-{i}")
        if i == 0:
            spath = os.path.join(folder, "overlap-sync")
            save_checkpoint(model, opt, spath)
        a = _async_round(model, opt, apath, group, lambda fut: _updates_while_writing(model, opt, x, y, fut))
        during.append(a["during"])
        blocked.append(a["blocked"])
        if i == 0:
            same = _async_equals_sync(spec, seed, device, spath, apath, model, opt)
            _remove(group, spath)
        _remove(group, apath)
    base = statistics.median(alone[1:])
    # what the loop lost to each async save: the call's own block, plus how much slower the updates that
    # overlapped the write ran than an update alone (the writer shares the cores, the memory and the GIL)
    slowdown = [max(0.0, sum(ts) - len(ts) * base) for ts in during[1:]]
    critical = [b + d for b, d in zip(blocked[1:], slowdown)]
    return {"update_s": _spread(alone[1:]), "update_during_save_s": _spread([t for ts in during[1:] for t in ts]),
            "updates_while_writing": [len(ts) for ts in during[1:]], "slowdown_s": _spread(slowdown),
            "critical_s": _spread(critical), "async_equals_sync": same}


def _async_equals_sync(spec, seed, device, path, apath, model, opt) -> dict:
    """The sync checkpoint of state k and the async one started at state k (an update then changed the
    weights while it wrote), each loaded into a fresh model: bit for bit the same, and not the new state?"""
    states = []
    for p in (path, apath):
        m = _shard(_fresh(spec, seed + 3, device))
        o = _adamw(m)
        load_checkpoint(m, o, p)
        states.append(_full_state(m, o))
    return {"mismatches": _differences(states[0], states[1]),
            "differs_from_after_update": bool(_differences(states[1], _full_state(model, opt)))}


def _loop_check(spec, micro_batch, updates, seed, device, r, ws, folder) -> dict:
    """``train_with_async_saves`` as shown: one checkpoint per update; the last one against the final state."""
    model = _shard(_fresh(spec, seed, device))
    opt = _adamw(model)
    batches = _batches(spec, micro_batch, ws, updates, seed, r, device)
    folder_for = lambda step: os.path.join(folder, f"loop-{step}")  # noqa: E731
    train_with_async_saves(model, opt, batches, 1, folder_for)
    saved = sorted(f for f in os.listdir(folder) if f.startswith("loop-"))
    fresh = _shard(_fresh(spec, seed + 4, device))
    fresh_opt = _adamw(fresh)
    load_checkpoint(fresh, fresh_opt, folder_for(updates))
    return {"folders": saved, "mismatches": _differences(_full_state(fresh, fresh_opt), _full_state(model, opt))}


def rank_main(rank, kind, spec, micro_batch, updates, seed, folder, sizes, repeats) -> dict:
    device = device_for(kind, rank.rank)  # one thread: the ranks share this machine's cores
    r, ws = rank.rank, rank.world_size
    out = {"device": str(device), "seconds": {}}
    if r == 0:  # before any process group exists: a world-size-1 save, for the load at world size 2
        t0 = time.perf_counter()
        with warnings.catch_warnings():  # DCP's "assuming the intent is to save in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            _save_at_one(spec, micro_batch, ws, updates, seed, device, folder)
        out["seconds"]["save_at_one"] = time.perf_counter() - t0
    with ddp_mod.process_group(kind, r, ws, rank.file_store()):
        t0 = time.perf_counter()
        out["round_trip"] = _round_trip(spec, micro_batch, updates, seed, device, r, ws, folder)
        out["from_one"] = _from_one(spec, seed, device, folder)
        out["loop"] = _loop_check(spec, micro_batch, updates, seed, device, r, ws, folder)
        out["seconds"]["correctness"] = time.perf_counter() - t0
        group = dist.new_group(backend="gloo")  # async_save's own CPU group (and the timings' barriers)
        out["sizes"] = {}
        for name in sizes:
            t0 = time.perf_counter()
            out["sizes"][name] = _size_and_time(name, micro_batch, seed, device, r, ws, folder, repeats, group)
            out["seconds"][name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        out["overlap"] = _overlap(spec, micro_batch, seed, device, r, ws, folder, repeats, group)
        out["seconds"]["overlap"] = time.perf_counter() - t0
        dist.destroy_process_group(group)
    return out
