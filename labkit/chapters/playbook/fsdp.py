"""A small FSDP demonstration (taught in chapter 09): a GPT sharded with ``torch.distributed.fsdp.fully_shard``
over a few CPU processes (gloo), what each rank then holds against a full replica, and its losses beside one
process training on the whole batch.

    demo = pb.fsdp_demo(model="tiny", world_size=2, micro_batch=4, steps=3)
    demo["ranks"][0]["param_bytes"] / demo["replica"]["param_bytes"]        # about 1 / world_size

The ranks are started (warm: forked from the kernel's preloaded server), watched and reaped by the
engine's launcher (``engine.launch.spawn_ranks``): they meet through a FileStore in a private folder (no
listening port), talk on the loopback interface only, and none outlives the call.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ...base.compat import has, message, need
from ...base.errors import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice  # the Config's own check: one wording (and did-you-mean)
from ...engine.data import ByteWindows, corpus_path
from ...engine.launch import spawn_ranks
from ...engine.model import GPT
from .args import real, whole


def _local_bytes(tensors) -> int:
    """Bytes this process holds of ``tensors``: of a sharded (DTensor) one only the local shard."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _demo_batches(spec, batch: int, steps: int, seed: int):
    """The same global batches on every rank (each takes its slice), from the course corpus."""
    ds = ByteWindows(corpus_path(None), spec.seq_len)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(ds), (batch,), generator=g).tolist()
        xs, ys = zip(*(ds[i] for i in idx))
        yield torch.stack(xs), torch.stack(ys)


def _train(model, spec, batch: int, steps: int, seed: int, mine: slice = slice(None), world_size: int = 1):
    """AdamW on the demo's batches, each step on the ``mine`` slice of the batch -- the one loop of the FSDP
    ranks and the single process alike. Returns (losses, the optimizer, gradient bytes after the last
    backward); with ``world_size`` > 1 each loss is the mean over the ranks."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    losses, grads = [], 0
    for x, y in _demo_batches(spec, batch, steps, seed):
        loss = model(x[mine], y[mine])
        loss.backward()  # under FSDP a reduce-scatter: each rank keeps the averaged gradient of its shard
        grads = _local_bytes(p.grad for p in model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().clone()
        if world_size > 1:
            dist.all_reduce(loss)  # every rank's loss on its slice, summed: the whole batch's mean below
        losses.append(float(loss) / world_size)
    return losses, opt, grads


def shard(model, param_dtype=None):
    """Shard a GPT the FSDP2 way, block by block (ZeRO-3: weights, gradients and optimizer state), computing in
    ``param_dtype`` (bf16 on a GPU; None keeps fp32, as the CPU demo does). Needs a process group.
    Shown in 09_fixed_gpus_playbook (code-09-fully-shard); the FSDP demo (measure-09-fsdp) runs it."""
    need("fully_shard")  # torch >= 2.6: a clear message on an older one
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # deferred: 0.4 s to import

    # gather and compute in param_dtype, reduce-scatter gradients in fp32: a bf16 sum over many ranks loses digits
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)  # one unit per block: its full weights exist only while it runs
    fully_shard(model, mp_policy=mp)  # the rest (embeddings, final norm, head) as the root unit
    return model


def _fsdp_rank(rank, spec, micro_batch: int, steps: int, seed: int) -> dict:
    """A spawned FSDP rank (``rank``: the launcher's Rank): shard a GPT with ``shard``, train on its
    slice of each batch, and report the bytes it holds."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    # the engine's way: the launcher's FileStore (no listening port) and gloo on the loopback interface only
    with ddp_mod.process_group("cpu", rank.rank, rank.world_size, rank.file_store()):
        torch.manual_seed(seed)
        model = GPT(spec)
        full_params = _local_bytes(model.parameters())
        shard(model)  # fp32 throughout: the losses must match one process's exactly
        mine = slice(rank.rank * micro_batch, (rank.rank + 1) * micro_batch)
        losses, opt, grads = _train(model, spec, micro_batch * rank.world_size, steps, seed, mine, rank.world_size)
        opt_bytes = sum(_local_bytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
                        for st in opt.state.values())
        return dict(param_bytes=_local_bytes(model.parameters()), grad_bytes=grads, optimizer_bytes=opt_bytes,
                    full_param_bytes=full_params, losses=losses)


def single_process_losses(spec, batch: int, steps: int, seed: int = 0) -> list:
    """The same training as the FSDP demo, in one process on the whole batch: the losses to match."""
    if spec not in PRESETS.values() and not hasattr(spec, "n_layer"):
        raise ConfigError("spec", spec, "a model shape such as lk.PRESETS['tiny']")
    whole("batch", batch)
    whole("steps", steps)
    whole("seed", seed, 0)
    torch.manual_seed(seed)
    return _train(GPT(spec), spec, batch, steps, seed)[0]


def fsdp_demo(model: str = "tiny", world_size: int = 2, micro_batch: int = 4, steps: int = 3, seed: int = 0,
              timeout_s: float = 120.0) -> dict:
    """Train a GPT under FSDP (``torch.distributed.fsdp.fully_shard``) on ``world_size`` CPU processes
    (gloo) and report what each rank holds against a full replica, and the losses beside one
    process training on the whole batch. Nothing outlives the call; a failed or late rank gives
    ``ok`` False and the reason in ``error``."""
    _choice("model", model, PRESETS)
    if whole("world_size", world_size, 2) > 8:  # one rank shards nothing; each rank is a spawned process
        raise ConfigError("world_size", world_size, "2 to 8 processes for this demo")
    whole("micro_batch", micro_batch)
    whole("steps", steps)
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    if not has("fully_shard"):  # no processes to spawn: the chapter says FSDP did not run here, and why
        return {"ok": False, "error": message("fully_shard"), "ranks": {}}
    t0 = time.monotonic()
    try:
        with spawn_ranks(_fsdp_rank, world_size, (PRESETS[model], micro_batch, steps, seed),
                         prefix="labkit-fsdp-") as ranks:
            results = ranks.collect(timeout_s, "FSDP demo")
    except RunError as e:  # the chapter says FSDP did not run here, and why; the arithmetic still holds
        return {"ok": False, "error": str(e), "ranks": {}}
    full = results[0]["full_param_bytes"]
    return {"ok": True, "world_size": world_size, "model": model, "ranks": [results[r] for r in range(world_size)],
            "replica": {"param_bytes": full, "grad_bytes": full, "optimizer_bytes": 2 * full},
            "losses": results[0]["losses"], "seconds": time.monotonic() - t0}


def fsdp_rows(demo: dict) -> list:
    """What FSDP rank 0 holds against a full replica (DDP), in plain bytes, with the share: one row per kind of
    state (parameters, gradients, optimizer)."""
    if not isinstance(demo, dict) or not demo.get("ok") or "replica" not in demo:
        raise ConfigError("demo", type(demo).__name__, "what fsdp_demo returned, with ok True")
    r0, rep = demo["ranks"][0], demo["replica"]
    rows = [{"state": k.replace("_bytes", ""), "replica": rep[k], "rank0": r0[k], "share": r0[k] / rep[k]}
            for k in ("param_bytes", "grad_bytes", "optimizer_bytes")]
    return rows


def loss_rows(demo: dict, single: list) -> list:
    """The FSDP run's loss after each update beside one process's on the whole batch, and their difference
    (plain digits: a difference of 4e-7 must read as a number, not as e-notation)."""
    if not isinstance(demo, dict) or "losses" not in demo:
        raise ConfigError("demo", type(demo).__name__, "what fsdp_demo returned")
    if not isinstance(single, (list, tuple)) or len(single) != len(demo["losses"]):
        raise ConfigError("single", single, f"{len(demo['losses'])} losses, one per update of the FSDP run")
    rows = [{"update": i + 1, "fsdp": a, "single": b, "diff": abs(a - b)}
            for i, (a, b) in enumerate(zip(demo["losses"], single))]
    return rows
