"""Pipeline parallelism on real processes (taught in chapter 10): labkit's GPT cut into ``p`` stages by
blocks, one process per stage, micro-batches passed on with point-to-point sends, run under the GPipe and
the 1F1B schedule -- and the bubble measured from every action's timestamps, the saved activations
counted. The schedules themselves (pure action lists) are in ``schedules``; the charts in ``charts``; the
figures the chapter shows as tables (``bubble_rows``, ``timing``, ``stage_costs``, ``memory_rows``,
``torch_pipelining_rows``) in ``pipeline_rows``.

    demo = pipeline_demo(model="tiny", stages=2, micro_batches=(1, 2, 4, 8), schedule="both")
    demo["runs"][0]["bubble"], demo["runs"][0]["formula"]    # measured idle share against (p-1)/(m+p-1)

Definitions used wherever a number is shown:

* **busy**: the time a stage spends computing a forward or a backward (``t_end - t_start`` of an action);
* **idle**: the rest of the step -- waiting in ``recv`` for the neighbour's activation or gradient,
  posting sends, and the gaps between actions. Communication is counted as idle: on one machine with gloo
  the bytes move in microseconds and the wait is the schedule's, which is what the bubble is;
* **step**: from the first action's start on any stage to the last action's end on any stage (one
  clock: ``time.perf_counter`` is the machine's monotonic clock, the same in every process);
* **bubble** ("step" definition, ``formulas.bubble_fraction``): idle / step per stage, (p-1)/(m+p-1) for
  stages of equal cost; Megatron-LM's paper divides by the ideal time instead, (p-1)/m (``relative_to="ideal"``).

The tied embedding: the first stage looks tokens up in ``wte``, the last stage's head multiplies by the same
matrix. The stages are different processes, so each holds its own copy (equal at the start) and, as
Megatron-LM does, the two copies' gradients are summed (an AllReduce between the first and last stage)
after the backward pass: each copy then has the tied model's gradient and stays equal after any update.
The equivalence test compares against the ordinary tied ``engine.model.GPT``.

The ranks are started warm and reaped by ``engine.launch.spawn_ranks`` (FileStore in a private folder,
gloo on loopback; NCCL and ``cuda:rank`` where ``torch.cuda.device_count() >= stages``).
"""
from __future__ import annotations

import os
import statistics
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...base import compat
from ...base.errors import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice
from ...engine.launch import spawn_ranks
from ...engine.model import GPT, VOCAB
from ...engine.config import real, whole
from .formulas import bubble_fraction
from .processes import load_average
from .schedules import (SCHEDULES, bubble_from_logs, gpipe_schedule, in_flight, one_f_one_b_schedule,  # noqa: F401
                        replay, schedule_for, stage_blocks)

CHOICES = SCHEDULES + ("both",)  # both: GPipe and 1F1B, one after the other in the same processes


# ---- one stage of the GPT, and the loop every stage runs ---------------------------------------------

class GPTStage(nn.Module):
    """Blocks ``blocks`` of ``gpt``; the first stage also embeds tokens, the last also applies ln_f and
    the head (its own copy of the tied embedding: see the module's docstring). Returns logits on the
    last stage, the residual stream (B, T, d) elsewhere."""

    def __init__(self, gpt: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last, self.block_ids = first, last, list(blocks)
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in blocks)
        if first:
            self.wte, self.wpe = gpt.wte, gpt.wpe
        if last:
            self.ln_f = gpt.ln_f
            self.head = nn.Linear(gpt.spec.d_model, VOCAB, bias=False)
            self.head.weight = nn.Parameter(gpt.wte.weight.detach().clone())  # the tied matrix, a copy

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x

    def global_names(self) -> dict:
        """This stage's parameter names -> the full GPT's (the head's copy maps to the tied wte.weight)."""
        out = {}
        for name, _ in self.named_parameters():
            if name.startswith("blocks."):
                j, rest = name.split(".", 2)[1:]
                out[name] = f"blocks.{self.block_ids[int(j)]}.{rest}"
            else:
                out[name] = "wte.weight" if name == "head.weight" else name
        return out


def run_schedule(stage, actions, rank, p, inputs=None, targets=None, shape=None, device="cpu",
                 now=time.perf_counter):
    """One training step of pipeline stage ``rank`` of ``p``: its ``actions`` in order, ("F", i) the
    forward and ("B", i) the backward of micro-batch i. Activations go down to rank + 1, gradients up to
    rank - 1. Returns (the loss on the last stage, else None; one (kind, i, t0, t1, t2) per action:
    t0 its start, t1 when its input had arrived, t2 its end).
    Shown in 10_when_the_model_does_not_fit (code-10-pipeline-stage)."""
    first, last, m = rank == 0, rank == p - 1, len(actions) // 2
    ins, outs, sent, log, loss = {}, {}, [], [], 0.0
    for kind, i in actions:
        t0 = now()
        sent = [(work, t) for work, t in sent if not work.is_completed()]  # let sent buffers go
        if kind == "F":
            if first:
                x = inputs[i]
            else:
                x = torch.empty(shape, device=device)
                dist.recv(x, rank - 1)  # wait for micro-batch i's activation from the stage before
                x.requires_grad_()      # its gradient is what we send back in B
            t1 = now()
            y = stage(x)
            if last:  # mean over the whole batch = sum of the micro-batch means / m
                y = F.cross_entropy(y.flatten(0, 1), targets[i].flatten()) / m
                loss += y.detach()
            ins[i], outs[i] = x, y  # keep micro-batch i's graph alive until its backward
            t2 = now()
            if not last:  # isend: a blocking send could wait for a neighbour that is itself sending
                out = y.detach()
                sent.append((dist.isend(out, rank + 1), out))
        else:
            x, y = ins.pop(i), outs.pop(i)
            grad = None
            if not last:
                grad = torch.empty_like(y)
                dist.recv(grad, rank + 1)  # d loss / d our output, from the stage after
            t1 = now()
            y.backward(grad)  # adds to every parameter's .grad, frees micro-batch i's graph
            t2 = now()
            if not first:
                sent.append((dist.isend(x.grad, rank - 1), x.grad))
        log.append((kind, i, t0, t1, t2))
    for work, _ in sent:  # the tensors stayed referenced until their sends completed
        work.wait()
    return (loss if last else None), log


def ping_pong(r, shape, rounds=20, device="cpu", now=time.perf_counter):
    """The one-way time of a message of ``shape`` float32s between ranks 0 and 1 (every other rank returns
    None): rank 0 sends, rank 1 sends it back, ``rounds`` times after 3 untimed ones; half the median
    round trip. It is what each micro-batch's send/recv pays on top of the compute."""
    if r > 1:
        return None
    buf, trips = torch.zeros(shape, device=device), []
    for k in range(rounds + 3):
        t0 = now()
        if r == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if k >= 3:
            trips.append(now() - t0)
    return statistics.median(trips) / 2


def _ping_pong_rank(rank, shape, rounds):
    """A spawned rank of ``p2p_latency``."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    with ddp_mod.process_group("cpu", rank.rank, rank.world_size, rank.file_store()):
        return ping_pong(rank.rank, shape, rounds)


def p2p_latency(shape=(4, 64, 64), rounds: int = 50, timeout_s: float = 60.0) -> float:
    """One-way seconds of one gloo send/recv of ``shape`` float32s between two CPU processes on loopback
    (a ping-pong; the machine's load is whatever it is now)."""
    whole("rounds", rounds)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    with spawn_ranks(_ping_pong_rank, 2, (tuple(shape), rounds), kind="cpu", prefix="labkit-pingpong-") as ranks:
        return ranks.collect(timeout_s, "ping-pong")[0]


# ---- counting saved activations ------------------------------------------------------------------------

class _Held:
    """What autograd keeps instead of a saved tensor while the counter runs: dies when autograd lets go."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class SavedActivations:
    """Bytes of the tensors autograd saved for backward that are alive now, and their peak: a
    ``saved_tensors_hooks`` pair wraps each saved tensor in a holder, and a finalizer subtracts the bytes
    when autograd frees it (after the backward that used it). Each storage counts once; parameters
    (always alive, not activations) are not counted."""

    def __init__(self, params):
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.live, self.now, self.peak = {}, 0, 0

    def _pack(self, t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.skip:
            return t
        count, nbytes = self.live.get(key, (0, storage.nbytes()))
        if count == 0:
            self.now += nbytes
            self.peak = max(self.peak, self.now)
        self.live[key] = (count + 1, nbytes)
        held = _Held(t)
        weakref.finalize(held, self._drop, key)
        return held

    def _drop(self, key):
        count, nbytes = self.live[key]
        if count == 1:
            del self.live[key]
            self.now -= nbytes
        else:
            self.live[key] = (count - 1, nbytes)

    @staticmethod
    def _unpack(held):
        return held.t if isinstance(held, _Held) else held

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)


# ---- the ranks ----------------------------------------------------------------------------------------

def demo_batch(spec, m: int, micro_batch: int, seed: int, device=None):
    """The same (tokens, targets) of m micro-batches on every rank and in the single-process reference."""
    g = torch.Generator().manual_seed(seed + 1000 * m)
    x = torch.randint(0, VOCAB, (m * micro_batch, spec.seq_len), generator=g)
    y = torch.randint(0, VOCAB, (m * micro_batch, spec.seq_len), generator=g)
    return x.to(device), y.to(device)


def _sync_clock(dev):
    if dev.type != "cuda":
        return time.perf_counter

    def now():  # a GPU's work is asynchronous: a timestamp means something once the device has finished
        torch.cuda.synchronize(dev)
        return time.perf_counter()
    return now


def _one_step(stage, actions, r, p, x, y, micro_batch, dev, tied_group, now):
    """One pipeline step on micro-batches of x (first stage) and y (last), then the tied embedding's
    AllReduce (outside the timed actions). Returns (loss or None, log)."""
    xs, ys = (x.split(micro_batch) if r == 0 else None), (y.split(micro_batch) if r == p - 1 else None)
    shape = (micro_batch, x.shape[1], stage_width(stage))
    loss, log = run_schedule(stage, actions, r, p, xs, ys, shape, dev, now)
    if r in (0, p - 1):  # Megatron-LM's way: the two copies of the tied matrix get the sum of both gradients
        w = stage.wte.weight if r == 0 else stage.head.weight
        dist.all_reduce(w.grad, group=tied_group)
    return loss, log


def stage_width(stage) -> int:
    return (stage.blocks[0].ln1 if len(stage.blocks) else stage.ln_f).normalized_shape[0]


def _pipeline_rank(rank, spec, p, runs, micro_batch, seed, repeats, want_grads, torch_api, kind):
    """A spawned pipeline stage: build the GPT (same seed everywhere), keep this stage's part, run every
    requested (schedule, m): one step counting saved activations (and gradients for the check), then
    ``repeats`` timed steps; then, if asked, the same through ``torch.distributed.pipelining``."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    r, t_start = rank.rank, time.perf_counter()
    dev = torch.device("cuda", r) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(dev)  # NCCL's barrier and sends use the current device
    with ddp_mod.process_group(kind, r, p, rank.file_store()):
        tied_group = dist.new_group([0, p - 1]) if p > 2 else None  # every rank takes part in new_group
        torch.manual_seed(seed)
        blocks = stage_blocks(spec.n_layer, p)[r]
        stage = GPTStage(GPT(spec), blocks, r == 0, r == p - 1).to(dev)
        now, names = _sync_clock(dev), stage.global_names()
        warm = max(m for _, m in runs)
        x, y = demo_batch(spec, warm, micro_batch, seed, dev)
        _one_step(stage, gpipe_schedule(p, warm)[r], r, p, x, y, micro_batch, dev, tied_group, now)  # warm-up
        out, t_runs = [], time.perf_counter()
        for name, m in runs:
            actions = schedule_for(name, p, m)[r]
            x, y = demo_batch(spec, m, micro_batch, seed, dev)
            stage.zero_grad(set_to_none=True)
            counter = SavedActivations(stage.parameters())
            with counter.hooks():  # not timed: the hooks cost time
                loss, _ = _one_step(stage, actions, r, p, x, y, micro_batch, dev, tied_group, now)
            # numpy arrays travel home by value (a tensor would go as shared memory the exiting rank takes away)
            grads = ({names[n]: q.grad.detach().cpu().numpy() for n, q in stage.named_parameters()}
                     if want_grads else None)
            logs, steps = [], []
            for _ in range(repeats):
                stage.zero_grad(set_to_none=True)
                dist.barrier()  # every stage starts the step together
                logs.append(_one_step(stage, actions, r, p, x, y, micro_batch, dev, tied_group, now)[1])
            out.append(dict(schedule=name, m=m, loss=None if loss is None else float(loss), grads=grads,
                            saved_peak_bytes=counter.peak, logs=logs, blocks=list(blocks)))
        dist.barrier()  # a message's own cost, same size as an activation, under this run's load
        p2p = ping_pong(r, (micro_batch, spec.seq_len, stage_width(stage)), 20, dev, now)
        t_api = time.perf_counter()
        api = _torch_pipelining(stage, spec, r, p, runs, micro_batch, seed, dev) if torch_api else None
        seconds = dict(setup=t_runs - t_start, runs=t_api - t_runs, torch_pipelining=time.perf_counter() - t_api)
        return dict(runs=out, torch_pipelining=api, seconds=seconds, p2p_s=p2p)


def torch_pipelining_step(stage_module, rank, p, m, x, y, schedule="gpipe", device="cpu"):
    """The same pipeline with PyTorch's own ``torch.distributed.pipelining``: wrap this rank's stage, pick
    a schedule, and ``step`` the whole batch -- it cuts it into ``m`` micro-batches itself. Returns the
    micro-batch losses on the last stage (their mean is the batch's loss). Shown in 10_when_the_model_does_not_fit."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # deferred: 0.3 s, one cell

    stage = PipelineStage(stage_module, rank, p, torch.device(device))  # shapes found on the first step
    loss_fn = lambda logits, t: F.cross_entropy(logits.flatten(0, 1), t.flatten())  # noqa: E731
    Schedule = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    pipe = Schedule(stage, n_microbatches=m, loss_fn=loss_fn)  # gradients scaled by 1/m, as ours
    losses = []
    if rank == 0:
        pipe.step(x)                            # the first stage feeds the tokens
    elif rank == p - 1:
        pipe.step(target=y, losses=losses)      # the last computes the loss
    else:
        pipe.step()                             # the middle ones pass activations and gradients on
    return losses


def _torch_pipelining(stage, spec, r, p, runs, micro_batch, seed, dev) -> dict:
    """Each schedule once through torch.distributed.pipelining, at the smallest m >= p the demo ran (the
    comparison needs one m, and a small one is quick): its loss, and the wall time of one step after the
    shape-finding first one. Any error is reported, not raised: every rank reaches the same point of the
    same schedule, so none is left waiting."""
    res = {}
    for name in dict.fromkeys(n for n, _ in runs):
        ms = [mm for n, mm in runs if n == name]
        m = min([mm for mm in ms if mm >= p] or ms)
        x, y = demo_batch(spec, m, micro_batch, seed, dev)
        try:
            torch_pipelining_step(stage, r, p, m, x, y, name, dev)  # first step: shape inference
            dist.barrier()
            t0 = time.perf_counter()
            stage.zero_grad(set_to_none=True)
            losses = torch_pipelining_step(stage, r, p, m, x, y, name, dev)
            res[name] = dict(m=m, ok=True, seconds=time.perf_counter() - t0,
                             loss=float(sum(float(v.detach()) for v in losses) / m) if losses else None)
        except Exception as e:  # noqa: BLE001 -- the chapter says why it did not run
            res[name] = dict(m=m, ok=False, error=f"{type(e).__name__}: {e}")
    return res


# ---- the single-process reference, and the demo --------------------------------------------------------

def single_process(spec, m: int, micro_batch: int, seed: int = 0) -> tuple:
    """(loss, {name: gradient}) of the whole tied GPT on the demo's batch of m micro-batches, one process."""
    torch.manual_seed(seed)
    model = GPT(spec)
    x, y = demo_batch(spec, m, micro_batch, seed)
    loss = model(x, y)
    loss.backward()
    return float(loss.detach()), {n: q.grad for n, q in model.named_parameters()}


def _costs(steps, p) -> tuple:
    """Median compute time of a forward and of a backward, per stage, over every measured step."""
    def med(s, kind):
        return statistics.median(t2 - t1 for st in steps for k, _, _, t1, t2 in st["actions"][s] if k == kind)
    return [med(s, "F") for s in range(p)], [med(s, "B") for s in range(p)]


def _summarise(name, m, per_rank, p, ref) -> dict:
    """One (schedule, m). The shown step is the fastest of the repeats -- the one other processes on this
    machine disturbed least; the median over the repeats is kept beside it. The replay puts that same step's
    compute times (each stage's median forward and backward) into the schedule with nothing else running
    and no message taking time: the bubble these stages' costs give; the measured step minus the replayed
    one is the waiting the schedule does not explain (messages, other processes)."""
    steps = [bubble_from_logs([per_rank[s]["logs"][k] for s in range(p)]) for k in range(len(per_rank[0]["logs"]))]
    best = min(steps, key=lambda st: st["step_s"])
    schedule = schedule_for(name, p, m)
    fwd, bwd = _costs(steps, p)
    best_fwd, best_bwd = _costs([best], p)
    loss = per_rank[p - 1]["loss"]
    out = dict(schedule=name, m=m, p=p, bubble=best["bubble"], stage_bubble=[st["bubble"] for st in best["stages"]],
               bubble_median=statistics.median(st["bubble"] for st in steps),
               formula=bubble_fraction(p, m), formula_ideal=bubble_fraction(p, m, "ideal"),
               replayed=replay(schedule, best_fwd, best_bwd), forward_s=fwd, backward_s=bwd,
               step_s=best["step_s"], step_median_s=statistics.median(st["step_s"] for st in steps),
               timeline=best, repeats=len(steps),
               busy_s=[st["busy_s"] for st in best["stages"]], wait_s=[st["wait_s"] for st in best["stages"]],
               saved_peak_bytes=[per_rank[s]["saved_peak_bytes"] for s in range(p)],
               in_flight=in_flight(schedule), loss=loss, blocks=[per_rank[s]["blocks"] for s in range(p)])
    if ref is not None:
        ref_loss, ref_grads = ref
        out["loss_single"] = ref_loss
        if per_rank[0]["grads"] is not None:
            diffs = [float((torch.from_numpy(g) - ref_grads[n]).abs().max())
                     for s in range(p) for n, g in per_rank[s]["grads"].items()]
            covered = {n for s in range(p) for n in per_rank[s]["grads"]}
            out["max_grad_diff"] = max(diffs)
            out["grads_covered"] = covered == set(ref_grads)
    return out


def _runs(schedule: str, p: int, micro_batches) -> tuple:
    """The (schedule, m) pairs to run; 1F1B only for m >= p, as torch's Schedule1F1B (the schedule itself
    handles m < p: ``one_f_one_b_schedule``)."""
    names = ("gpipe", "1f1b") if schedule == "both" else (schedule,)
    runs = [(n, m) for n in names for m in micro_batches if not (n == "1f1b" and m < p)]
    skipped = [(n, m) for n in names for m in micro_batches if n == "1f1b" and m < p]
    return runs, skipped


def pipeline_demo(model: str = "tiny", stages: int = 2, micro_batches=(1, 2, 4, 8), schedule: str = "gpipe",
                  micro_batch: int = 4, seed: int = 0, repeats: int = 5, check: bool = True,
                  torch_api: bool = True, timeout_s: float = 120.0) -> dict:
    """Run labkit's GPT as a ``stages``-stage pipeline on as many processes, once per requested m (and per
    schedule: "gpipe", "1f1b" or "both"), in ONE spawn: a warm-up step first (not counted), then per
    (schedule, m) one step counting saved activations and ``repeats`` timed steps. Returns per run the
    measured bubble per stage and its mean against ``formulas.bubble_fraction(p, m)`` ("step"
    definition), the timeline of the fastest step, the peak saved-activation bytes per stage, the loss
    against one process's (``check``: and every gradient), and torch.distributed.pipelining's loss
    (``torch_api``), and the one-way time of one activation-sized message between stages 0 and 1
    (``p2p_s``, a ping-pong after the runs). 1F1B runs only for m >= p, as torch's Schedule1F1B (the rest
    are listed under ``skipped``). Nothing outlives
    the call; a failed or late rank gives ``ok`` False and the reason in ``error``."""
    _choice("model", model, PRESETS)
    spec = PRESETS[model]
    p = whole("stages", stages, 2)
    if p > 8:
        raise ConfigError("stages", stages, "2 to 8 stages (each is a process)")
    stage_blocks(spec.n_layer, p)  # at most one stage per block
    if not isinstance(micro_batches, (tuple, list)) or not micro_batches:
        raise ConfigError("micro_batches", micro_batches, "a non-empty tuple of micro-batch counts, e.g. (1, 2, 4)")
    ms = tuple(dict.fromkeys(whole("micro_batches", m) for m in micro_batches))
    _choice("schedule", schedule, CHOICES)
    whole("micro_batch", micro_batch)
    whole("seed", seed, 0)
    whole("repeats", repeats)
    if not isinstance(check, bool) or not isinstance(torch_api, bool):
        raise ConfigError("check" if not isinstance(check, bool) else "torch_api",
                          check if not isinstance(check, bool) else torch_api, "True or False")
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    runs, skipped = _runs(schedule, p, ms)
    if not runs:
        raise ConfigError("micro_batches", micro_batches,
                          f"at least one m >= stages = {p} for 1F1B (as torch's Schedule1F1B)")
    kind = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= p else "cpu"
    api_why = None  # why torch.distributed.pipelining is not tried (a torch whose schedules abort on gloo)
    if torch_api and kind == "cpu" and not compat.has("pipelining on gloo"):
        torch_api, api_why = False, compat.message("pipelining on gloo")
    t0, load = time.monotonic(), load_average()
    try:
        with spawn_ranks(_pipeline_rank, p, (spec, p, runs, micro_batch, seed, repeats, check, torch_api, kind),
                         kind=kind, prefix="labkit-pipeline-") as ranks:
            results = ranks.collect(timeout_s, "pipeline demo")
    except RunError as e:
        return {"ok": False, "error": str(e), "runs": [], "stages": p}
    seconds = time.monotonic() - t0
    refs = {m: single_process(spec, m, micro_batch, seed) for m in dict.fromkeys(m for _, m in runs)}
    out = [_summarise(n, m, [results[s]["runs"][k] for s in range(p)], p, refs.get(m))
           for k, (n, m) in enumerate(runs)]
    return {"ok": True, "stages": p, "model": model, "micro_batch": micro_batch, "device": kind, "runs": out,
            "skipped": [dict(schedule=n, m=m, why=f"torch's Schedule1F1B needs m >= p = {p}") for n, m in skipped],
            "torch_pipelining": results[p - 1]["torch_pipelining"], "torch_pipelining_why": api_why,
            "definition": "step",  # formulas.BUBBLE_DEFINITIONS' key: idle time over the whole step
            "seconds": seconds, "rank_seconds": results[0]["seconds"], "cores": os.cpu_count(),
            "p2p_s": results[0]["p2p_s"],
            "load": max(load, load_average())}  # the 1-minute load average: what else shared the cores


def find_run(result: dict, schedule: str, m: int) -> dict:
    """The run of ``schedule`` with ``m`` micro-batches in a pipeline_demo result."""
    for run in result.get("runs", []):
        if run["schedule"] == schedule and run["m"] == m:
            return run
    raise ConfigError("m", m, f"one of the measured m for {schedule}: "
                      f"{[r['m'] for r in result.get('runs', []) if r['schedule'] == schedule]}")
