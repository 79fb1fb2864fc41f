"""The planted mistakes no Config knob can make, each a small plain-torch training loop: ``buggy=True``
runs it with the mistake, ``buggy=False`` its corrected twin. These loops are what a drill's reveal shows,
so each is written to be read; each returns {"summary", "records", "clip"}, the shape ``evidence`` reads.
"""
from __future__ import annotations

import datetime
import time
from collections import OrderedDict

import torch
import torch.distributed as dist

from ..engine.data import ByteWindows, corpus_path
from ..engine.device import intra_op_threads
from ..engine.launch import spawn_ranks
from ..engine.model import GPT
from ..tools.collectives import CollectiveCounter

HANG_TIMEOUT_S = 3.0  # the process group's timeout in the hang drill: short, so the hang ends by itself


def run_loop(name: str, config, buggy: bool) -> dict:
    """Run the loop called ``name`` with the config's thread count (the drills' one thread), restored after:
    torch's default of every core, on a shared machine, measured the other programs (one loop 0.2 s alone,
    over 10 s beside them)."""
    with intra_op_threads(config.threads):
        return globals()[name](config, buggy=buggy)


def _setup(config, dropout: float = 0.0):
    """A seeded GPT, its AdamW and an endless stream of (x, y) micro-batches of the config's shape."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec, dropout=dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    data = ByteWindows(corpus_path(config.corpus), config.context)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(config.seed)).tolist()

    def batches():
        for i in range(0, len(order) - config.micro_batch, config.micro_batch):
            xs, ys = zip(*(data[j] for j in order[i:i + config.micro_batch]))
            yield torch.stack(xs), torch.stack(ys)
    return model, opt, batches()


def _result(config, records: list, **extra) -> dict:
    extra.setdefault("matmul_dtype", "float32")  # these loops run in fp32 unless they say otherwise
    return {"summary": {"status": "completed", **extra}, "records": records, "clip": config.grad_clip}


def _matmul_dtype(model, x, y) -> str:
    """The dtype the first Linear's matmul produces under fp16 autocast: what a profiler's GEMM shows."""
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    seen = []
    hook = linear.register_forward_hook(lambda mod, inp, out: seen.append(str(out.dtype).replace("torch.", "")))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        model(x, y)
    hook.remove()
    return seen[0]


def _step(params, opt, config) -> float:
    """Clip (the config's threshold; none: only measure), step, zero the gradients; returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip or float("inf"))
    opt.step()
    opt.zero_grad(set_to_none=True)  # the right place: once per update
    return float(norm)


def _accumulate(config, divide: bool, zero_each_micro: bool) -> dict:
    """Gradient accumulation over K micro-batches: each loss divided by K or not, zero_grad once per update or
    before every micro-batch."""
    model, opt, batches = _setup(config)
    K, records = config.accum, []
    for u in range(1, config.steps + 1):
        losses = []
        for _ in range(K):
            if zero_each_micro:
                opt.zero_grad(set_to_none=True)  # a mistake: wipes the micro-batches accumulated so far
            x, y = next(batches)
            loss = model(x, y)
            (loss / K if divide else loss).backward()  # not divided, a mistake: K gradients summed, not averaged
            losses.append(loss.item())
        records.append({"update": u, "loss": sum(losses) / K, "grad_norm": _step(model.parameters(), opt, config)})
    return _result(config, records)


def loss_not_divided_by_k(config, buggy: bool = True) -> dict:
    """Gradient accumulation over K micro-batches, with (buggy) the loss not divided by K."""
    return _accumulate(config, divide=not buggy, zero_each_micro=False)


def zero_grad_inside_loop(config, buggy: bool = True) -> dict:
    """Gradient accumulation over K micro-batches, with (buggy) zero_grad before every micro-batch."""
    return _accumulate(config, divide=True, zero_each_micro=buggy)


def fp16_without_scaler(config, buggy: bool = True) -> dict:
    """fp16 autocast, with (buggy) no loss scaling. Each update also takes the fp32 gradient of the same
    batch, to count the values fp16 flushed to zero where fp32 had one (a gradient histogram's zero bin)."""
    model, opt, batches = _setup(config)
    scale = 1.0 if buggy else 2.0**16  # the mistake: scale 1, i.e. no GradScaler
    records, zero_fracs, skipped = [], [], 0
    for u in range(1, config.steps + 1):
        x, y = next(batches)
        model(x, y).backward()  # the fp32 reference gradient
        g32 = torch.cat([p.grad.flatten() for p in model.parameters()])
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, y)
        (loss * scale).backward()
        for p in model.parameters():
            p.grad /= scale  # unscale before clipping and stepping
        g16 = torch.cat([p.grad.flatten() for p in model.parameters()])
        zero_fracs.append(((g16 == 0) & (g32 != 0)).float().mean().item())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip or float("inf"))
        if torch.isfinite(norm):
            opt.step()
        else:
            skipped += 1  # what GradScaler does on inf/NaN: skip the update
        opt.zero_grad(set_to_none=True)
        records.append({"update": u, "loss": loss.item(), "grad_norm": float(norm)})
    return _result(config, records, grad_zero_frac=max(zero_fracs), skipped_steps=skipped,
                   matmul_dtype=_matmul_dtype(model, x, y))


def dropout_in_eval(config, buggy: bool = True) -> dict:
    """Train with dropout, then evaluate one held-out batch three times -- (buggy) without model.eval()."""
    model, opt, batches = _setup(config, dropout=config.dropout)
    records = []
    for u in range(1, config.steps + 1):
        x, y = next(batches)
        loss = model(x, y)
        loss.backward()
        records.append({"update": u, "loss": loss.item(), "grad_norm": _step(model.parameters(), opt, config)})
    x, y = next(batches)  # held out: never trained on
    if not buggy:
        model.eval()  # the fix: dropout off while evaluating
    with torch.no_grad():
        evals = [model(x, y).item() for _ in range(3)]
    model.train()
    return _result(config, records, eval_losses=evals, eval_loss_spread=max(evals) - min(evals))


def _skipping_rank(rank, config, buggy: bool, timeout_s: float) -> dict:
    """One DDP-style rank: the same initial parameters on every rank, its own data, gradients averaged by hand
    with one all_reduce per update. Buggy: rank 1 skips update 2's ("my batch was empty") and moves on.
    Collectives pair by call order, not by intent: rank 0's update-2 all_reduce completes with rank 1's
    update-3 gradient, every later one is paired one update apart, and only rank 0's last call finds no partner.
    Each rank logs its parameters' norm after every update -- the instrument that shows the corruption."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=rank.file_store(), rank=rank.rank, world_size=rank.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    model, opt, _ = _setup(config)  # every rank starts from the same parameters, as DDP's broadcast makes them
    _, _, batches = _setup(config.replace(seed=config.seed + 1 + rank.rank))  # each rank its own data
    calls, error, norms, records = 0, "", [], []
    try:
        for u in range(1, config.steps + 1):
            x, y = next(batches)
            loss = model(x, y)
            loss.backward()
            if not (buggy and rank.rank == 1 and u == 2):  # the mistake: a collective one rank leaves out
                flat = torch.cat([p.grad.flatten() for p in model.parameters()])
                calls += 1  # counted as it starts, as a flight recorder would: the last one may never end
                dist.all_reduce(flat)
                _unflatten_into_grads(model, flat / rank.world_size)
            norm = _step(model.parameters(), opt, config)
            norms.append(torch.cat([p.detach().flatten() for p in model.parameters()]).norm().item())
            records.append({"update": u, "loss": loss.item(), "grad_norm": norm})
        if buggy and rank.rank == 1:
            # rank 1 is done but alive (say it evaluates): rank 0 waits out gloo's timeout (no work is faked)
            time.sleep(timeout_s + 1.0)  # noqa: sleep-ok
    except RuntimeError as e:  # gloo's timeout: what ends the hang
        error = str(e).strip().splitlines()[0][:300]
    if not error:
        dist.destroy_process_group()  # after a timeout the group is broken: the process's exit ends it
    return {"calls": calls, "error": error, "param_norms": norms, "records": records}


def _unflatten_into_grads(model, flat) -> None:
    """Copy the averaged flat gradient back into each parameter's .grad (what DDP's buckets do)."""
    i = 0
    for p in model.parameters():
        n = p.grad.numel()
        p.grad.copy_(flat[i:i + n].view_as(p.grad))
        i += n


def first_divergence(per_rank: list):
    """The first update (1-based) after which the ranks' logged parameter norms differ, or None: DDP's ranks
    hold bit-identical parameters, so any difference is corruption. Compared over the updates all ranks logged."""
    for u, values in enumerate(zip(*per_rank), start=1):
        if len(set(values)) > 1:
            return u
    return None


def rank_skips_collective(config, buggy: bool = True) -> dict:
    """Two ranks (spawned by the engine's launcher; none outlives the call); buggy: one skips a collective,
    the ranks' parameters silently diverge from that update on, and the other rank's last collective hangs
    until the process group's timeout (``HANG_TIMEOUT_S``)."""
    with spawn_ranks(_skipping_rank, config.world_size, (config, buggy, HANG_TIMEOUT_S),
                     prefix="labkit-drill-") as ranks:
        out = ranks.collect(60.0 + 2 * HANG_TIMEOUT_S, "hang drill")
    per_rank = [out[r] for r in range(config.world_size)]
    errors = [p["error"] for p in per_rank if p["error"]]
    norms = [p["param_norms"] for p in per_rank]
    return _result(config, per_rank[0]["records"], timed_out=bool(errors),
                   collectives_per_rank=[p["calls"] for p in per_rank], hang_error=errors[0] if errors else "",
                   param_norms_per_rank=norms, ranks_diverge_at_update=first_divergence(norms))


# The balancing loss's weight: Switch Transformer's 0.01 left one expert with 0.73-1.0 of the tokens after
# this loop's 40 updates (8 seeds); 0.1 brings the largest share to 0.26-0.34 (1/4 is even).
BALANCE_ALPHA = 0.1
N_EXPERTS, WIDTH = 4, 32


def router_without_balance_loss(config, buggy: bool = True) -> dict:
    """A top-1 mixture-of-experts layer learning a toy regression, with (buggy) its router trained on the task
    loss alone. The tokens share a common direction, as a transformer's hidden states do, so the router's
    first preference is the same for most of them; the expert that gets them learns fastest and is preferred
    more (rich get richer). The twin adds the balancing loss. Logged: each expert's share of the tokens."""
    torch.manual_seed(config.seed)
    E, d, tokens = N_EXPERTS, WIDTH, config.micro_batch * config.context
    router = torch.nn.Linear(d, E, bias=False)
    experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(),
                                                      torch.nn.Linear(2 * d, d)) for _ in range(E))
    params = [*router.parameters(), *experts.parameters()]
    opt = torch.optim.AdamW(params, lr=config.lr)
    common = torch.randn(d)  # a direction every token shares (as large as the tokens' own spread)
    target = torch.randn(d, d) / d ** 0.5  # what the layer must learn
    records, counts_log = [], []
    for u in range(1, config.steps + 1):
        x = torch.randn(tokens, d) + common
        probs = torch.softmax(router(x), dim=-1)
        gate, choice = probs.max(dim=-1)  # top-1: each token goes to one expert, scaled by its probability
        out = torch.zeros_like(x)
        for e in range(E):
            mine = choice == e
            if mine.any():
                out[mine] = gate[mine, None] * experts[e](x[mine])
        loss = torch.nn.functional.mse_loss(out, torch.tanh(x @ target))
        counts = torch.bincount(choice, minlength=E)
        total = loss
        if not buggy:  # the fix: alpha * E * sum_i f_i * P_i, smallest when both are uniform
            f = counts.float() / tokens  # share of tokens sent to expert i (counted: no gradient)
            P = probs.mean(dim=0)  # mean router probability of expert i (its gradient balances)
            total = loss + BALANCE_ALPHA * E * (f * P).sum()
        total.backward()
        counts_log.append(counts)
        records.append({"update": u, "loss": loss.item(), "grad_norm": _step(params, opt, config)})
    late = torch.stack(counts_log[-max(1, config.steps // 4):]).sum(dim=0).float()  # the last quarter
    shares = (late / late.sum()).tolist()
    return _result(config, records, expert_shares=shares, max_expert_share=max(shares))


class _SPBlock(torch.nn.Module):
    """A pre-norm MLP block: the part of a transformer block that sequence parallelism changes."""

    def __init__(self, d: int):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(OrderedDict(fc=torch.nn.Linear(d, 4 * d), act=torch.nn.GELU(),
                                                   proj=torch.nn.Linear(4 * d, d)))

    def forward(self, x):
        return x + self.mlp(self.ln(x))  # the residual, on this rank's slice of the sequence


def _sp_rank(rank, config, buggy: bool) -> dict:
    """One tensor-parallel rank of two blocks under a sequence-parallel plan. Buggy: the row-parallel layer
    keeps RowwiseParallel's default output (Replicate), so its partial sums are all-reduced where a
    reduce-scatter to sequence shards belongs; the residual then takes its own shard of the full result
    (a local slice, no message), so every number comes out the same. Counted: the collectives of each
    update's forward and backward, by kind."""
    from torch.distributed.device_mesh import init_device_mesh  # deferred: DTensor's imports cost a second
    from torch.distributed.tensor import DTensor, Replicate, Shard  # deferred: as above, in the rank only
    from torch.distributed.tensor.parallel import (  # deferred: as above, in the rank only
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=rank.file_store(), rank=rank.rank, world_size=rank.world_size)
    mesh = init_device_mesh("cpu", (rank.world_size,))
    torch.manual_seed(config.seed)  # the same weights on every rank before they are sharded
    d, T = WIDTH, config.context
    model = torch.nn.Sequential(_SPBlock(d), _SPBlock(d))
    row = (RowwiseParallel(use_local_output=False) if buggy  # the mistake: output_layouts left at Replicate
           else RowwiseParallel(output_layouts=Shard(1), use_local_output=False))  # reduce-scatter to shards
    for block in model:
        parallelize_module(block, mesh, {
            "ln": SequenceParallel(),  # the norm runs on this rank's slice of the sequence
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.fc": ColwiseParallel(), "mlp.proj": row})
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
    data = torch.Generator().manual_seed(config.seed + 1)
    records, per_update = [], []
    for u in range(1, config.steps + 1):
        x = torch.randn(config.micro_batch, T, d, generator=data)
        y = x + 0.1 * torch.randn(config.micro_batch, T, d, generator=data)  # near what the residual passes on
        mine = x.chunk(rank.world_size, dim=1)[rank.rank]  # this rank's slice of the sequence
        with CollectiveCounter() as counter:
            out = model(DTensor.from_local(mine, mesh, [Shard(1)]))
            loss = ((out.to_local() - y.chunk(rank.world_size, dim=1)[rank.rank]) ** 2).mean()
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip or float("inf"))
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # the logged loss: every rank's slice, averaged (outside the count)
        per_update.append({k: sum(n == k for n, _ in counter.calls) for k, _ in counter.calls})
        records.append({"update": u, "loss": mean_loss.item() / rank.world_size, "grad_norm": float(norm)})
    dist.destroy_process_group()
    return {"records": records, "collectives": per_update}


def sp_rowwise_replicated(config, buggy: bool = True) -> dict:
    """Two tensor-parallel ranks (spawned by the engine's launcher; none outlives the call) training two
    blocks under sequence parallelism; buggy: the row-parallel layers all-reduce instead of reduce-scatter.
    The losses are the same either way: only the collectives, by kind, tell."""
    with spawn_ranks(_sp_rank, config.world_size, (config, buggy), prefix="labkit-drill-") as ranks:
        out = ranks.collect(120.0, "sequence-parallel drill")
    last = out[0]["collectives"][-1]  # one update's, as a profiler's trace of a steady step shows them
    kinds = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
    for name, n in last.items():
        kinds[next((k for k in kinds if name.startswith(k)), name)] = n
    return _result(config, out[0]["records"], tp_collectives=kinds, tp_allreduce_calls=kinds["all_reduce"])


# the loops run_loop finds by the names drills/bank.py SPECS give them
__all__ = ["run_loop", "loss_not_divided_by_k", "zero_grad_inside_loop", "fp16_without_scaler", "dropout_in_eval",
           "rank_skips_collective", "router_without_balance_loss", "sp_rowwise_replicated"]
