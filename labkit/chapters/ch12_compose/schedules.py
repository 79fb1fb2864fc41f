"""Pipeline schedules beyond 1F1B (chapter 12): the bubble of interleaved 1F1B (v model chunks per rank)
and of a zero-bubble schedule (the backward split into B, the input's gradient, and W, the weights'),
the schedules as action lists replayed with unit costs, and the real ones from
``torch.distributed.pipelining`` run on 2 ranks x 2 chunks of labkit's GPT, timed and checked.

    bubble(2, 4), bubble(2, 4, v=2), zero_bubble(2, 4)     # 1/5, 1/9, 1/13 of the step idle
    replay(interleaved_schedule(2, 4, v=2))["bubble"]      # 1/9: the formula, from the action lists
    lab = schedules_lab(m=4)                               # the real schedules, measured

An action is (kind, chunk, micro-batch). Kinds: "F" forward; "BW" the whole backward (the input's
gradient leaves only when the weights' is done too); "B" the input's gradient alone and "W" the
weights' (a zero-bubble schedule sends B's result on at once and runs W whenever the rank would idle).
Chunk c of C = p * v is the c-th slice of the model; which rank holds it is which list it is in.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace as _replace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...base.errors import ConfigError, RunError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.launch import spawn_ranks
from ...engine.model import GPT, VOCAB
from ...tools.collectives import device_kind, figure, load_average

KINDS = ("F", "B", "W", "BW")
UNIT = {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0}  # equal costs: a backward is B + W = twice a forward
# the schedules of torch.distributed.pipelining this section runs: class name, chunks per rank, placement
REAL = {"1f1b": ("Schedule1F1B", 1, "loop"), "interleaved": ("ScheduleInterleaved1F1B", 2, "loop"),
        "zb": ("ScheduleInterleavedZeroBubble", 2, "loop"), "zbv": ("ScheduleZBVZeroBubble", 2, "v")}
TRUST = 1.05  # a measured step within 5 % of its replay with the measured costs is the schedule's
CHUNKS = 4  # 2 ranks x 2 chunks; v = 1 runs 2 stages of 2 chunks each


# ---- the formulas --------------------------------------------------------------------------------------

def bubble(p: int, m: int, v: int = 1) -> float:
    """The idle share of a step with ``p`` ranks of equal cost, ``m`` micro-batches and ``v`` model chunks
    per rank: (p - 1) / (v m + p - 1). The fill and drain still take p - 1 slots, but a slot is one
    chunk's work, 1/v of a rank's: interleaving divides the bubble's time by v (v = 1: GPipe, 1F1B)."""
    p, m, v = whole("p", p), whole("m", m), whole("v", v)
    return (p - 1) / (v * m + p - 1)


def zero_bubble(p: int, m: int, f: float = 1.0, b: float = 1.0, w: float = 1.0) -> float:
    """ZB-H1's idle share (Qi et al. 2023): 1F1B's memory, but W waits to fill the drain, so the idle time
    per rank drops from (p - 1)(f + b + w) to (p - 1)(f + b - w), over a step of m (f + b + w) plus it.
    Equal costs: (p - 1) / (3 m + p - 1)."""
    p, m = whole("p", p), whole("m", m)
    f, b = real("f", f, strict=True), real("b", b, strict=True)
    w = real("w", w, strict=True)
    if m < p:
        raise ConfigError("m", m, f"at least p = {p} micro-batches (ZB-H1's steady state)")
    if w > f + b:
        raise ConfigError("w", w, f"a weight-gradient cost at most f + b = {f + b} (ZB-H1's assumption)")
    idle = (p - 1) * (f + b - w)
    return idle / (m * (f + b + w) + idle)


# ---- the schedules as data -----------------------------------------------------------------------------

def interleaved_schedule(p: int, m: int, v: int = 2) -> list:
    """Megatron-LM's interleaved 1F1B: rank r holds chunks r, r + p, ... (v of them). Forwards go in
    rounds of p micro-batches, chunk by chunk; backwards in the same rounds, last chunk first. A warm-up
    of forwards, then one forward one backward, then the backwards owed. v = 1 is plain 1F1B."""
    p, m, v = whole("p", p), whole("m", m), whole("v", v)
    if v > 1 and m % p:
        raise ConfigError("m", m, f"a multiple of p = {p}: interleaving runs rounds of p micro-batches")
    out = []
    for r in range(p):
        if v == 1:  # 1F1B: the warm-up forwards fill the stages after this one
            fwd = bwd = [(r, i) for i in range(m)]
            warmup = min(p - r - 1, m)
        else:
            rounds = range(m // p)
            fwd = [(k * p + r, g * p + j) for g in rounds for k in range(v) for j in range(p)]
            bwd = [(k * p + r, g * p + j) for g in rounds for k in reversed(range(v)) for j in range(p)]
            # enough forwards that a backward is ready when the steady state starts (Megatron-LM's count)
            warmup = min(2 * (p - r - 1) + (v - 1) * p, m * v)
        actions = [("F", *a) for a in fwd[:warmup]]
        for f, b in zip(fwd[warmup:], bwd):  # steady state: one forward, then the oldest backward
            actions += [("F", *f), ("BW", *b)]
        actions += [("BW", *b) for b in bwd[len(fwd) - warmup:]]  # cool-down: the backwards owed
        out.append(actions)
    return out


def zb_h1_schedule(p: int, m: int) -> list:
    """ZB-H1 with one chunk per rank: 1F1B's forwards and input backwards, each followed by a weight
    backward -- but rank r holds r of its W back and runs them at the end, where 1F1B drains idle."""
    p, m = whole("p", p), whole("m", m)
    out = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        actions = [("F", r, i) for i in range(warmup)]
        for i in range(m):
            if warmup + i < m:
                actions.append(("F", r, warmup + i))
            actions.append(("B", r, i))  # the input's gradient first: the rank before waits for it
            if i >= r:
                actions.append(("W", r, i - r))  # the weights' gradient, r micro-batches late
        actions += [("W", r, i) for i in range(max(0, m - r), m)]  # the held-back W fill the drain
        out.append(actions)
    return out


REPLAYED = {"1f1b": lambda p, m: interleaved_schedule(p, m, 1),
            "interleaved": lambda p, m: interleaved_schedule(p, m, 2), "zb-h1": zb_h1_schedule}


def check_schedule(schedule: list, m: int) -> int:
    """Refuse an action list that is not a schedule: every (chunk, micro-batch) forwarded once and
    backwarded once (as BW, or as B then W), each chunk on one rank, F before B before W. The chunks."""
    m = whole("m", m)
    if not isinstance(schedule, list) or not schedule:
        raise ConfigError("schedule", schedule, "a list per rank of (kind, chunk, micro-batch) actions")
    seen, home = {}, {}
    for r, actions in enumerate(schedule):
        for n, a in enumerate(actions):
            if not (isinstance(a, tuple) and len(a) == 3 and a[0] in KINDS):
                raise ConfigError("action", a, f"(kind, chunk, micro-batch), kind one of {KINDS}")
            kind, c, i = a
            if home.setdefault(c, r) != r:
                raise ConfigError("action", a, f"chunk {c} on one rank (it is also on rank {home[c]})")
            if (kind, c, i) in seen or not 0 <= i < m:
                raise ConfigError("action", a, f"each micro-batch 0..{m - 1} once per chunk and kind")
            need = {"F": None, "B": "F", "BW": "F", "W": "B"}[kind]
            if need and (need, c, i) not in seen:
                raise ConfigError("action", a, f"after ({need!r}, {c}, {i}) on the same rank")
            seen[kind, c, i] = (r, n)
    chunks = sorted(home)
    for c in chunks:
        for i in range(m):
            if ("F", c, i) not in seen or (("BW", c, i) in seen) == (("W", c, i) in seen):
                raise ConfigError("schedule", f"chunk {c}, micro-batch {i}", "one F and one BW or B + W")
    if chunks != list(range(len(chunks))):
        raise ConfigError("schedule", chunks, "chunks numbered 0, 1, ... C - 1")
    return len(chunks)


def replay(schedule: list, costs: dict | None = None) -> dict:
    """The timeline of ``schedule`` when an action of kind k costs ``costs[k]`` and messages are free:
    a forward starts when the chunk before has forwarded that micro-batch, a backward (B or BW) when the
    chunk after has sent its input's gradient, W when its own B is done, each rank in its list's order.
    Returns the step, each rank's idle share (idle over the step) and their mean, and the timeline."""
    costs = {**UNIT, **(costs or {})}
    n_chunks = check_schedule(schedule, 1 + max(i for s in schedule for _, _, i in s))
    p = len(schedule)
    done, free, pos = {}, [0.0] * p, [0] * p
    timeline = [[] for _ in range(p)]
    while any(pos[r] < len(schedule[r]) for r in range(p)):
        moved = False
        for r in range(p):
            if pos[r] == len(schedule[r]):
                continue
            kind, c, i = schedule[r][pos[r]]
            if kind == "F":
                dep = ("F", c - 1, i) if c > 0 else None
            elif kind == "W":
                dep = ("grad", c, i)
            else:  # the input's gradient needs the next chunk's (the loss, on the last chunk)
                dep = ("grad", c + 1, i) if c < n_chunks - 1 else ("F", c, i)
            if dep is not None and dep not in done:
                continue  # its input is not there yet: another rank moves first
            start = max(free[r], done[dep] if dep else 0.0)
            free[r] = done[kind, c, i] = start + costs[kind]
            if kind in ("B", "BW"):
                done["grad", c, i] = free[r]
            timeline[r].append((kind, c, i, start, free[r]))
            pos[r], moved = pos[r] + 1, True
        if not moved:
            raise ConfigError("schedule", "a deadlock", "action lists in which every input can arrive")
    step = max(free)
    idle = [(step - sum(costs[k] for k, _, _ in s)) / step for s in schedule]
    return dict(step=step, rank_bubble=idle, bubble=statistics.fmean(idle), timeline=timeline)


def replay_rows(p: int = 2, m: int = 4) -> list:
    """Per replayed schedule: its chunks per rank, the formula's idle share and the replay's (unit costs)."""
    formula = {"1f1b": bubble(p, m), "interleaved": bubble(p, m, 2), "zb-h1": zero_bubble(p, m)}
    return [dict(schedule=name, v=2 if name == "interleaved" else 1, formula=formula[name],
                 replayed=replay(make(p, m))["bubble"]) for name, make in REPLAYED.items()]


# ---- the real thing: torch.distributed.pipelining on 2 ranks -----------------------------------------

class Chunk(nn.Module):
    """Blocks ``blocks`` of ``gpt``; the first chunk also embeds the tokens, the last applies ln_f and the
    head (a copy of the tied embedding: its gradient is added to wte's when compared)."""

    def __init__(self, gpt: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last, self.ids = first, last, list(blocks)
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in blocks)
        if first:
            self.wte, self.wpe = gpt.wte, gpt.wpe
        if last:
            self.ln_f, self.head = gpt.ln_f, nn.Linear(gpt.spec.d_model, VOCAB, bias=False)
            self.head.weight = nn.Parameter(gpt.wte.weight.detach().clone())

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x

    def global_name(self, name: str) -> str:
        if name.startswith("blocks."):
            j, rest = name.split(".", 2)[1:]
            return f"blocks.{self.ids[int(j)]}.{rest}"
        return "wte.weight" if name == "head.weight" else name


def placement(name: str, p: int = 2) -> list:
    """Which chunks each rank holds: "loop" r, r + p, ...; "v" r and 2p - 1 - r (ZB-V: the last chunk
    sits beside the first, so the loss's gradient turns round on rank 0 without a message)."""
    _, v, style = REAL[name]
    if v == 1:
        return [[r] for r in range(p)]
    return [[r, 2 * p - 1 - r] if style == "v" else [r + k * p for k in range(v)] for r in range(p)]


def _timed(stage, log: list):
    """Note every forward, backward and weight backward this stage runs: (kind, chunk, mb, start, end)."""
    def wrap(method, kind):
        def run(mb, *args, **kwargs):
            t0 = time.perf_counter()  # CLOCK_MONOTONIC on Linux: one clock for every process
            out = method(mb, *args, **kwargs)
            k = kind or ("BW" if kwargs.get("full_backward", True) else "B")
            log.append((k, stage.stage_index, mb, t0, time.perf_counter()))
            return out
        return run
    stage.forward_one_chunk = wrap(stage.forward_one_chunk, "F")
    stage.backward_one_chunk = wrap(stage.backward_one_chunk, None)
    stage.backward_weight_one_chunk = wrap(stage.backward_weight_one_chunk, "W")


def pipelined_step(chunks: list, name: str, rank: int, p: int, m: int, x, y, device="cpu"):
    """One training step of this rank's ``chunks`` under torch's schedule ``name``: a PipelineStage per
    chunk (stage index = chunk number), the schedule object, ``step``. Returns (losses, log, order)."""
    from torch.distributed import pipelining as pp  # deferred: a third of a second, one cell uses it

    cls, v, _ = REAL[name]
    n = len(chunks) * p
    stages = [pp.PipelineStage(mod, idx, n, torch.device(device)) for idx, mod in chunks]
    log = []
    for s in stages:
        _timed(s, log)
    loss_fn = lambda logits, t: F.cross_entropy(logits.flatten(0, 1), t.flatten())  # noqa: E731
    Schedule = getattr(pp, cls)
    pipe = Schedule(stages[0] if v == 1 else stages, n_microbatches=m, loss_fn=loss_fn)
    first, last = any(i == 0 for i, _ in chunks), any(i == n - 1 for i, _ in chunks)
    losses = []
    pipe.step(*([x] if first else []), target=y if last else None, losses=losses if last else None)
    order = getattr(pipe, "pipeline_order", None)
    return losses, log, order


_TORCH_KIND = {"F": "F", "B": "BW", "I": "B", "W": "W"}


def torch_order(order: dict) -> list:
    """torch's own ``pipeline_order`` (rank -> actions, None for a planned idle slot) as action lists."""
    kinds = [[(_TORCH_KIND.get(getattr(a.computation_type, "value", None)), a.stage_index,
               a.microbatch_index) for a in order[r] if a is not None] for r in sorted(order)]
    return [[a for a in actions if a[0] is not None] for actions in kinds]


def _rank(rank, spec, names, ms, timed, micro_batch, seed, repeats, kind):
    torch.set_num_threads(1)  # two ranks share the cores
    r, p = rank.rank, rank.world_size
    dev = torch.device("cuda", r) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(dev)
    with ddp_mod.process_group(kind, r, p, rank.file_store()):
        torch.manual_seed(seed)
        gpt = GPT(spec).to(dev)  # every rank builds the same model, then keeps its chunks
        per = spec.n_layer // CHUNKS
        chunk = [Chunk(gpt, range(c * per, (c + 1) * per), c == 0, c == CHUNKS - 1).to(dev)
                 for c in range(CHUNKS)]
        out = {}
        for name in names:
            v = REAL[name][1]  # v = 1: this rank's stage is two chunks in a row
            mine = ([(r, nn.Sequential(chunk[2 * r], chunk[2 * r + 1]))] if v == 1
                    else [(c, chunk[c]) for c in placement(name, p)[r]])
            held = [c for idx, _ in mine for c in ([2 * idx, 2 * idx + 1] if v == 1 else [idx])]
            for m in dict.fromkeys((*ms, timed)):
                x, y = demo_batch(spec, m, micro_batch, seed, dev)
                res = out.setdefault(name, {})[m] = dict(ok=False)
                try:
                    for mod in chunk:
                        mod.zero_grad(set_to_none=True)
                    losses, _, order = pipelined_step(mine, name, r, p, m, x, y, dev)
                    grads = {}
                    for c in held:
                        for n, q in chunk[c].named_parameters():
                            g = grads.setdefault(chunk[c].global_name(n), 0)
                            grads[chunk[c].global_name(n)] = g + q.grad.detach().cpu().numpy()
                    res.update(ok=True, grads=grads, order=torch_order(order) if order and v > 1 else None,
                               loss=float(sum(float(t.detach()) for t in losses) / m) if losses else None)
                    if m == timed:  # the timed steps, after that first (warm-up) one
                        res["logs"] = []
                        for _ in range(repeats):
                            dist.barrier()  # every rank starts the step together
                            res["logs"].append(pipelined_step(mine, name, r, p, m, x, y, dev)[1])
                except Exception as e:  # noqa: BLE001 -- the chapter says what did not run
                    res.update(error=f"{type(e).__name__}: {e}"[:300])
                dist.barrier()
        return out


def demo_batch(spec, m: int, micro_batch: int, seed: int, device=None):
    """The same (tokens, targets) of m micro-batches on every rank and in the reference."""
    g = torch.Generator().manual_seed(seed + 1000 * m)
    x = torch.randint(0, VOCAB, (m * micro_batch, spec.seq_len), generator=g)
    y = torch.randint(0, VOCAB, (m * micro_batch, spec.seq_len), generator=g)
    return x.to(device), y.to(device)


def reference(spec, m: int, micro_batch: int, seed: int) -> dict:
    """{name: gradient} of the whole GPT on the same batch, one process: what every schedule must give."""
    torch.manual_seed(seed)
    model = GPT(spec)
    x, y = demo_batch(spec, m, micro_batch, seed)
    model(x, y).backward()
    return {n: q.grad for n, q in model.named_parameters()}


def _measured(logs: list) -> dict:
    """One step from both ranks' logs: the step (first start to last end), each rank's idle share."""
    t0 = min(a[3] for log in logs for a in log)
    step = max(a[4] for log in logs for a in log) - t0
    idle = [(step - sum(a[4] - a[3] for a in log)) / step for log in logs]
    timeline = [[(k, c, i, a - t0, b - t0) for k, c, i, a, b in log] for log in logs]
    return dict(step=step, rank_bubble=idle, bubble=statistics.fmean(idle), timeline=timeline)


def _summary(name, per_rank, m, ref) -> dict:
    """A schedule's run: the gradients' largest difference from the reference, the timed steps' idle
    shares (median and spread), torch's order replayed with unit costs and with the measured ones."""
    grads = {}
    for res in per_rank:
        for n, g in res["grads"].items():
            grads[n] = grads.get(n, 0) + g
    diff = max(float((torch.from_numpy(grads[n]) - ref[n]).abs().max()) for n in ref)
    out = dict(schedule=name, cls=REAL[name][0], v=REAL[name][1], m=m, ok=True, max_grad_diff=diff,
               covered=set(grads) == set(ref))
    if "logs" not in per_rank[0]:
        return out
    steps = [_measured([res["logs"][k] for res in per_rank]) for k in range(len(per_rank[0]["logs"]))]
    shares = [st["bubble"] for st in steps]
    order = per_rank[0]["order"] or interleaved_schedule(len(per_rank), m, 1)  # v = 1: our 1F1B
    acts = [a for st in steps for tl in st["timeline"] for a in tl]
    costs = {k: statistics.median(b - a for kk, _, _, a, b in acts if kk == k)
             for k in KINDS if any(a[0] == k for a in acts)}
    median = sorted(steps, key=lambda st: st["bubble"])[len(steps) // 2]
    out.update(measured=statistics.median(shares), low=min(shares), high=max(shares), repeats=len(steps),
               step_ms=median["step"] * 1e3, timeline=median["timeline"],
               unit=replay(order)["bubble"], with_costs=replay(order, costs)["bubble"],
               ratio=median["step"] / replay(order, costs)["step"],  # 1: only compute took time
               costs_ms={k: c * 1e3 for k, c in costs.items()},
               formula=bubble(len(per_rank), m, REAL[name][1]) if name in ("1f1b", "interleaved") else None)
    return out


def schedules_lab(model: str = "tiny", m: int = 4, probe=(1, 2, 3, 5, 6), micro_batch: int = 4,
                  repeats: int = 3, seed: int = 0, timeout_s: float = 120.0) -> dict:
    """torch.distributed.pipelining's 1F1B, interleaved 1F1B, interleaved zero-bubble and ZB-V on 2 ranks
    of labkit's GPT cut into 4 chunks (``model``'s layers rounded up to a multiple of 4), in ONE spawn: each
    schedule at every micro-batch count of ``probe`` and ``m`` (accepted or refused; gradients against one
    process's), then ``repeats`` timed steps at ``m``: busy is a rank's compute, idle the rest of the step."""
    _choice("model", model, PRESETS)
    m, repeats = whole("m", m), whole("repeats", repeats)
    whole("micro_batch", micro_batch)
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    if not isinstance(probe, (tuple, list)):
        raise ConfigError("probe", probe, "a tuple of micro-batch counts to try, e.g. (1, 2, 3)")
    probe = tuple(whole("probe", k) for k in probe)
    base = PRESETS[model]
    spec = _replace(base, n_layer=CHUNKS * -(-base.n_layer // CHUNKS))  # tiny's 2 blocks become 4
    kind, p, load = device_kind(2), 2, load_average()
    t0 = time.monotonic()
    try:
        with spawn_ranks(_rank, p, (spec, list(REAL), probe, m, micro_batch, seed, repeats, kind),
                         kind=kind, prefix="labkit-schedules-") as ranks:
            res = ranks.collect(timeout_s, "pipeline schedules")
    except RunError as e:
        return {"ok": False, "error": str(e)}
    seconds, refs = time.monotonic() - t0, {}
    accepted, runs = [], {}
    for name in REAL:
        for k in res[0][name]:
            per = [res[r][name][k] for r in range(p)]
            if not all(q["ok"] for q in per):
                accepted.append(dict(schedule=REAL[name][0], m=k, ok=False, max_grad_diff=None,
                                     error=next(q["error"] for q in per if not q["ok"])))
                continue
            if k not in refs:
                refs[k] = reference(spec, k, micro_batch, seed)
            row = _summary(name, per, k, refs[k])
            accepted.append(dict(schedule=REAL[name][0], m=k, ok=True, max_grad_diff=row["max_grad_diff"],
                                 error=""))
            if k == m:
                runs[name] = row
    return {"ok": True, "p": p, "m": m, "model": model, "n_layer": spec.n_layer, "device": kind,
            "accepted": sorted(accepted, key=lambda a: (a["schedule"], a["m"])), "runs": runs,
            "seconds": seconds, "load": max(load, load_average()), "repeats": repeats}


def measured_rows(lab: dict) -> list:
    """Per schedule run at ``m``: the formula's idle share (where one is taught), torch's order replayed with
    unit costs and with the measured ones, the measured share (median, spread) and the gradients' error."""
    return [dict(schedule=r["cls"], v=r["v"], formula=r["formula"], unit=r["unit"], with_costs=r["with_costs"],
                 measured=r["measured"], spread=(r["low"], r["high"]), step_ms=r["step_ms"],
                 grad_diff=r["max_grad_diff"]) for r in lab["runs"].values() if "measured" in r]


def against_1f1b(lab: dict) -> dict:
    """Each schedule's measured idle share against 1F1B's, over the repeats: "lower" or "higher" when the
    two spreads (lowest to highest repeat) do not overlap, "overlap" when they do (no verdict). The overall
    verdict: "agree" (every one lower, as the unit-cost replay has it), "disagree" (one higher), "mixed"."""
    runs = {k: r for k, r in lab["runs"].items() if "measured" in r}
    if "1f1b" not in runs or len(runs) < 2:
        raise ConfigError("lab", sorted(runs), "a schedules_lab result with 1F1B and another schedule timed")
    base, each = runs["1f1b"], {}
    for name, r in runs.items():
        if name != "1f1b":
            each[name] = ("lower" if r["high"] < base["low"] else "higher" if r["low"] > base["high"]
                          else "overlap")
    said, worst = set(each.values()), max(runs.values(), key=lambda r: r["ratio"])
    verdict = ("agree" if said == {"lower"} else "disagree" if "higher" in said else
               "mixed" if "lower" in said else "overlap")
    return dict(verdict=verdict, each=each, base_low=base["low"], base_high=base["high"],
                lower=", ".join(REAL[k][0] for k, v in each.items() if v == "lower") or "none",
                overlap=", ".join(REAL[k][0] for k, v in each.items() if v == "overlap") or "none",
                higher=", ".join(REAL[k][0] for k, v in each.items() if v == "higher") or "none",
                repeats=base["repeats"], load=lab["load"], cores=os.cpu_count(), worst=worst["cls"],
                ratio=worst["ratio"], timing="schedule" if worst["ratio"] <= TRUST else
                "contention" if lab["load"] >= os.cpu_count() else "other")


COLOURS = {"F": "#9ecae1", "B": "#3182bd", "W": "#31a354", "BW": "#756bb1"}


def plot_timelines(timelines: dict, unit: str = "ms", width: float = 8.0):
    """One panel per schedule, one row per rank: F light blue, B dark blue, W green, a whole backward
    (B and W together) purple; the white is idle."""
    import matplotlib.pyplot as plt  # deferred: only to draw

    fig, axes = plt.subplots(len(timelines), 1, figsize=(width, 0.9 * len(timelines) + 0.6), squeeze=False)
    scale = 1e3 if unit == "ms" else 1.0
    for ax, (label, timeline) in zip(axes[:, 0], timelines.items()):
        end = max(b for tl in timeline for *_, b in tl)
        for r, actions in enumerate(timeline):
            for kind, c, i, a, b in actions:
                ax.barh(r, (b - a) * scale, left=a * scale, color=COLOURS[kind], edgecolor="white", lw=0.4)
                if (b - a) / end > 0.035:
                    ax.text((a + b) / 2 * scale, r, f"{c}.{i}", ha="center", va="center", fontsize=5)
        ax.set_yticks(range(len(timeline)), [f"rank {r}" for r in range(len(timeline))], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(label, fontsize=8, loc="left")
        ax.tick_params(labelsize=6)
    axes[-1, 0].set_xlabel(f"{unit} since the step began (label: chunk.micro-batch; F light, B dark, "
                           "W green, B+W purple, white idle)", fontsize=7)
    fig.tight_layout()
    return fig
