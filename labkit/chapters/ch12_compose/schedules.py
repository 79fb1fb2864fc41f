"""Pipeline schedules beyond 1F1B (chapter 12): interleaved 1F1B and zero bubble as formulas, as
action lists replayed with unit costs, and as torch.distributed.pipelining's schedules, measured:
bubble(2, 4), bubble(2, 4, v=2), zero_bubble(2, 4) are 1/5, 1/9, 1/13 of the step idle.
An action is (kind, chunk, micro-batch): "F" forward, "BW" a whole backward (the input's gradient
leaves when the weights' is done too), "B" the input's gradient alone, "W" the weights'. Chunk c of
p * v is the c-th slice of the model; the list it is in says which rank holds it."""
import os
import statistics
import time
from dataclasses import replace as _replace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...base.runtime import ConfigError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.model import GPT, VOCAB, GPTStage
from ...tools.collectives import device_kind, load_average, rank_device, rank_lab

UNIT = {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0}  # the kinds; equal costs: a whole backward B + W
_TORCH_KIND = {"F": "F", "B": "BW", "I": "B", "W": "W"}  # torch's letters: I is our B, B our BW
# torch.distributed.pipelining's schedules run here: class, chunks per rank, chunks' placement
REAL = {"1f1b": ("Schedule1F1B", 1, "loop"), "interleaved": ("ScheduleInterleaved1F1B", 2, "loop"),
        "zb": ("ScheduleInterleavedZeroBubble", 2, "loop"),
        "zbv": ("ScheduleZBVZeroBubble", 2, "v")}
COLOURS = {"F": "#9ecae1", "B": "#3182bd", "W": "#31a354", "BW": "#756bb1"}  # the timelines
TRUST = 1.05  # a measured step within 5 % of its replay with the measured costs is the schedule's
CHUNKS = 4  # 2 ranks x 2 chunks; v = 1 runs 2 stages of 2 chunks each


def bubble(p: int, m: int, v: int = 1) -> float:
    """The idle share of a step: ``p`` ranks of equal cost, ``m`` micro-batches, ``v`` chunks per
    rank. Fill and drain take p - 1 slots of one chunk's work, 1/v of a rank's (v = 1: 1F1B).
    Shown in 12_composing_the_layout (code-12-schedules)."""
    p, m, v = whole("p", p), whole("m", m), whole("v", v)
    if v > 1 and m % p:  # with m < p one micro-batch's trip through v*p chunks outlasts the formula
        raise ConfigError("m", m, f"a multiple of p = {p} when v > 1: rounds of p micro-batches")
    return (p - 1) / (v * m + p - 1)


def zero_bubble(p: int, m: int, f: float = 1.0, b: float = 1.0, w: float = 1.0) -> float:
    """ZB-H1's idle share (Qi et al. 2023), costs f, b, w <= min(f, b): W fills the drain, so a rank
    idles (p - 1)(f + b - w), not 1F1B's (p - 1)(f + b + w), in a step of m (f + b + w) + that.
    Shown in 12_composing_the_layout (code-12-zb-h1)."""
    p, m = whole("p", p), whole("m", m)
    f, b, w = (real(k, x, strict=True) for k, x in (("f", f), ("b", b), ("w", w)))
    if m < p:
        raise ConfigError("m", m, f"at least p = {p} micro-batches (ZB-H1's steady state)")
    if w > min(f, b):  # a longer W no longer fits the slots the drain leaves
        raise ConfigError("w", w, f"a weight-gradient cost at most min(f, b) = {min(f, b)}")
    idle = (p - 1) * (f + b - w)
    return idle / (m * (f + b + w) + idle)


def interleaved_schedule(p: int, m: int, v: int = 2) -> list:
    """Megatron-LM's interleaved 1F1B, rank r holding chunks r, r + p, ...: forwards in rounds of p
    micro-batches chunk by chunk, backwards last chunk first; warm-up, 1F1B, cool-down; v=1: 1F1B"""
    p, m, v = whole("p", p), whole("m", m), whole("v", v)
    if v > 1 and m % p:
        raise ConfigError("m", m, f"a multiple of p = {p}: interleaving runs rounds of p")
    out = []
    for r in range(p):
        if v == 1:  # 1F1B: the warm-up forwards fill the stages after this one
            fwd = bwd = [(r, i) for i in range(m)]
            warmup = min(p - r - 1, m)
        else:
            rounds = range(m // p)
            fwd = [(k * p + r, g * p + j) for g in rounds for k in range(v) for j in range(p)]
            bwd = [(k * p + r, g * p + j) for g in rounds for k in range(v)[::-1] for j in range(p)]
            # enough forwards that a backward is ready when the steady state starts (Megatron's)
            warmup = min(2 * (p - r - 1) + (v - 1) * p, m * v)
        actions = [("F", *a) for a in fwd[:warmup]]
        for f, b in zip(fwd[warmup:], bwd):  # steady state: one forward, the oldest backward
            actions += [("F", *f), ("BW", *b)]
        actions += [("BW", *b) for b in bwd[len(fwd) - warmup:]]  # cool-down: the rest owed
        out.append(actions)
    return out


def zb_h1_schedule(p: int, m: int) -> list:
    """ZB-H1, one chunk per rank: 1F1B's forwards and input backwards, each followed by a weight
    backward -- but rank r holds r of its W back and runs them at the end, where 1F1B idles.
    Shown in 12_composing_the_layout (code-12-zb-h1)."""
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
        actions += [("W", r, i) for i in range(max(0, m - r), m)]  # the held-back W: the drain
        out.append(actions)
    return out


REPLAYED = {"1f1b": lambda p, m: interleaved_schedule(p, m, 1),
            "interleaved": lambda p, m: interleaved_schedule(p, m, 2), "zb-h1": zb_h1_schedule}


def check_schedule(schedule: list, m: int) -> int:
    """Refuse an action list that is not a schedule: every (chunk, micro-batch) forwarded once and
    backwarded once (BW, or B then W), each chunk on one rank, F before B before W. The chunks."""
    m = whole("m", m)
    if not isinstance(schedule, list) or not any(schedule):
        raise ConfigError("schedule", schedule, "a list per rank of (kind, chunk, mb) actions")
    seen, home = set(), {}
    for r, actions in enumerate(schedule):
        for a in actions:
            if not (isinstance(a, tuple) and len(a) == 3 and a[0] in UNIT):
                raise ConfigError("action", a, f"(kind, chunk, mb), kind one of {tuple(UNIT)}")
            kind, c, i = a
            if home.setdefault(c, r) != r:
                raise ConfigError("action", a, f"chunk {c} on one rank (also on rank {home[c]})")
            if a in seen or not 0 <= i < m:
                raise ConfigError("action", a, f"each micro-batch 0..{m - 1} once per chunk, kind")
            need = {"F": None, "B": "F", "BW": "F", "W": "B"}[kind]
            if need and (need, c, i) not in seen:
                raise ConfigError("action", a, f"after ({need!r}, {c}, {i}) on the same rank")
            seen.add(a)
    for c, i in ((c, i) for c in range(len(home)) for i in range(m)):
        whole_bw, split = ("BW", c, i) in seen, ("W", c, i) in seen
        if c not in home or ("F", c, i) not in seen or whole_bw == split:
            raise ConfigError("schedule", f"chunk {c}, micro-batch {i}", "one F, a BW or B and W")
    return len(home)


def replay(schedule: list, costs: dict | None = None) -> dict:
    """The timeline of ``schedule`` when kind k costs ``costs[k]`` and messages are free, each rank
    in its list's order. The step, each rank's idle share, their mean, the timeline."""
    costs = {**UNIT, **(costs or {})}
    n_chunks = check_schedule(schedule, 1 + max((a[-1] for s in schedule for a in s), default=0))
    p = len(schedule)
    done, free, pos, timeline = {}, [0.0] * p, [0] * p, [[] for _ in range(p)]
    while any(pos[r] < len(schedule[r]) for r in range(p)):
        moved = False
        for r in range(p):
            if pos[r] == len(schedule[r]):
                continue
            kind, c, i = schedule[r][pos[r]]
            # F waits for the chunk before's F; W for its own B; B or BW for the input gradient of
            # the chunk after (the last chunk: for its own F, the loss)
            dep = {"F": ("F", c - 1, i) if c else None, "W": ("grad", c, i)}.get(
                kind, ("grad", c + 1, i) if c < n_chunks - 1 else ("F", c, i))
            if dep is not None and dep not in done:
                continue  # its input is not there yet: another rank moves first
            start = max(free[r], done[dep] if dep else 0.0)
            free[r] = done[kind, c, i] = start + costs[kind]
            if kind in ("B", "BW"):
                done["grad", c, i] = free[r]
            timeline[r].append((kind, c, i, start, free[r]))
            pos[r], moved = pos[r] + 1, True
        if not moved:
            raise ConfigError("schedule", "a deadlock", "lists in which every input can arrive")
    step = max(free)
    idle = [(step - sum(costs[k] for k, _, _ in s)) / step for s in schedule]
    return dict(step=step, rank_bubble=idle, bubble=statistics.fmean(idle), timeline=timeline)


# ---- the real thing: torch.distributed.pipelining on 2 ranks -----------------------------------

def _timed(stage, log: list):
    """Note each forward, backward and weight backward the stage runs: (kind, chunk, mb, t0, t1)."""
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


def pipeline(chunks: list, name: str, p: int, m: int, device="cpu"):
    """This rank's ``chunks`` [(index, module)] under torch's schedule ``name``: a PipelineStage per
    chunk, the schedule. Returns (step(x, y): one training step, the log of its actions, order)."""
    from torch.distributed import pipelining as pp  # deferred: a third of a second, one cell

    (cls, v, _), n = REAL[name], len(chunks) * p
    stages, log = [pp.PipelineStage(mod, i, n, torch.device(device)) for i, mod in chunks], []
    for s in stages:
        _timed(s, log)
    loss_fn = lambda logits, t: F.cross_entropy(logits.flatten(0, 1), t.flatten())  # noqa: E731
    pipe = getattr(pp, cls)(stages[0] if v == 1 else stages, n_microbatches=m, loss_fn=loss_fn)
    first, last = any(i == 0 for i, _ in chunks), any(i == n - 1 for i, _ in chunks)

    def step(x, y):  # the rank with the first chunk feeds the tokens, the last one's the targets
        pipe.step(*([x] if first else []), target=y if last else None)
    return step, log, getattr(pipe, "pipeline_order", None)


def torch_order(order: dict) -> list:
    """torch's own ``pipeline_order`` (rank -> actions, None an idle slot) as action lists."""
    return [[(_TORCH_KIND[a.computation_type.value], a.stage_index, a.microbatch_index)
             for a in order[r] if a is not None and a.computation_type.value in _TORCH_KIND]
            for r in sorted(order)]


def _rank(rank, spec, names, ms, timed, micro_batch, seed, repeats, kind):
    r, p = rank.rank, rank.world_size
    dev = rank_device(kind, r)
    with ddp_mod.process_group(kind, r, p, rank.file_store()):
        torch.manual_seed(seed)
        gpt = GPT(spec).to(dev)  # every rank builds the same model, then keeps its chunks
        per = spec.n_layer // CHUNKS
        chunk = nn.ModuleList(GPTStage(gpt, range(c * per, (c + 1) * per), c == 0, c == CHUNKS - 1)
                              for c in range(CHUNKS)).to(dev)
        out = {}
        for name in names:
            # v = 1: one stage of two chunks; ZB-V's "v": the last chunk beside the first, so
            # the loss's gradient turns round without a message; "loop": r and r + p
            _, v, style = REAL[name]
            held = ([2 * r, 2 * r + 1] if v == 1 else [r, 2 * p - 1 - r] if style == "v"
                    else [r, r + p])
            mine = ([(r, nn.Sequential(*(chunk[c] for c in held)))] if v == 1
                    else [(c, chunk[c]) for c in held])
            for m in dict.fromkeys((*ms, timed)):
                x, y = demo_batch(spec, m, micro_batch, seed, dev)
                res = out.setdefault(name, {})[m] = dict(ok=False)
                try:
                    chunk.zero_grad(set_to_none=True)
                    step, log, order = pipeline(mine, name, p, m, dev)
                    step(x, y)  # the first step also finds the shapes each stage sends
                    grads = {}  # numpy: travels home by value; the head's copy adds to wte's
                    for c, (n, q) in ((c, nq) for c in held for nq in chunk[c].named_parameters()):
                        key = chunk[c].global_names()[n]
                        grads[key] = grads.get(key, 0) + q.grad.detach().cpu().numpy()
                    res.update(ok=True, grads=grads, order=torch_order(order) if v > 1 else None)
                    if m == timed:  # the timed steps, after that first (warm-up) one
                        res["logs"] = []
                        for _ in range(repeats):
                            log.clear()
                            dist.barrier()  # every rank starts the step together
                            step(x, y)
                            res["logs"].append(list(log))
                except Exception as e:  # noqa: BLE001 -- the chapter says what did not run
                    res.update(error=f"{type(e).__name__}: {e}"[:300])
                dist.barrier()
        return out


def demo_batch(spec, m: int, micro_batch: int, seed: int, device=None):
    """The same (tokens, targets) of m micro-batches on every rank and in the reference."""
    g = torch.Generator().manual_seed(seed + 1000 * m)
    x, y = torch.randint(0, VOCAB, (2, m * micro_batch, spec.seq_len), generator=g)
    return x.to(device), y.to(device)


def reference(spec, m: int, micro_batch: int, seed: int) -> dict:
    """{name: gradient} of the whole GPT on the same batch in one process: what each must give."""
    torch.manual_seed(seed)
    model, (x, y) = GPT(spec), demo_batch(spec, m, micro_batch, seed)
    model(x, y).backward()
    return {n: q.grad for n, q in model.named_parameters()}


def _measured(logs: list) -> dict:
    """One step from the ranks' logs: the step, first start to last end; each rank's idle share."""
    t0 = min(a[3] for log in logs for a in log)
    step = max(a[4] for log in logs for a in log) - t0
    idle = [(step - sum(a[4] - a[3] for a in log)) / step for log in logs]
    timeline = [[(k, c, i, a - t0, b - t0) for k, c, i, a, b in log] for log in logs]
    return dict(step=step, rank_bubble=idle, bubble=statistics.fmean(idle), timeline=timeline)


def _summary(name, per_rank, m, ref) -> dict:
    """A schedule's run: the gradients' largest difference from the reference; the timed steps' idle
    shares (median, lowest, highest); torch's order replayed with unit and with measured costs."""
    grads = {n: sum(res["grads"][n] for res in per_rank if n in res["grads"]) for n in ref}
    out = dict(name=name, schedule=REAL[name][0], v=REAL[name][1], m=m, ok=True, error="",
               grad_diff=max(float((torch.from_numpy(grads[n]) - ref[n]).abs().max()) for n in ref),
               covered=set().union(*(res["grads"] for res in per_rank)) == set(ref))
    if "logs" not in per_rank[0]:
        return out
    steps = [_measured(list(logs)) for logs in zip(*(res["logs"] for res in per_rank))]
    shares = [st["bubble"] for st in steps]
    order = per_rank[0]["order"] or interleaved_schedule(len(per_rank), m, 1)  # v = 1: our 1F1B
    acts = [a for st in steps for tl in st["timeline"] for a in tl]
    costs = {k: statistics.median(b - a for kk, _, _, a, b in acts if kk == k)
             for k in UNIT if any(a[0] == k for a in acts)}
    median = sorted(steps, key=lambda st: st["bubble"])[len(steps) // 2]
    p, v = len(per_rank), REAL[name][1]
    has_formula = name in REPLAYED and (v == 1 or m % p == 0)  # interleaved: whole rounds of p
    out.update(measured=statistics.median(shares), low=min(shares), high=max(shares),
               repeats=len(steps), step_ms=median["step"] * 1e3, timeline=median["timeline"],
               order=order,  # the action lists torch ran (v = 1: ours)
               unit=replay(order)["bubble"], with_costs=replay(order, costs)["bubble"],
               ratio=median["step"] / replay(order, costs)["step"],  # 1: only compute took time
               formula=bubble(p, m, v) if has_formula else None)
    return out


def schedules_lab(model: str = "tiny", m: int = 4, probe=(1, 2, 3, 5, 6), micro_batch: int = 4,
                  repeats: int = 3, seed: int = 0, timeout_s: float = 120.0) -> dict:
    """The schedules of ``REAL`` on 2 ranks, labkit's GPT in 4 chunks (layers rounded up to 4), one
    spawn: each at every m of ``probe`` and ``m`` (refused, or gradients against one process's),
    then ``repeats`` timed steps at ``m``: busy is a rank's compute, idle the rest of the step."""
    _choice("model", model, PRESETS)
    m, repeats = whole("m", m), whole("repeats", repeats)
    whole("micro_batch", micro_batch), whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    if not isinstance(probe, (tuple, list)):
        raise ConfigError("probe", probe, "a tuple of micro-batch counts to try, e.g. (1, 2, 3)")
    probe = tuple(whole("probe", k) for k in probe)
    spec = _replace(PRESETS[model], n_layer=CHUNKS * -(-PRESETS[model].n_layer // CHUNKS))  # ≥ 4
    kind, p, load = device_kind(2), 2, load_average()
    run = rank_lab({"ok": True, "world_size": p, "kind": kind}, _rank,
                   (spec, list(REAL), probe, m, micro_batch, seed, repeats, kind),
                   "pipeline schedules", timeout_s, "labkit-schedules-")
    if not run["ok"]:
        return {"ok": False, "error": run["error"]}
    res, seconds, refs, tried = run["ranks"], run["seconds"], {}, []
    for name, k in ((name, k) for name in REAL for k in sorted(res[0][name])):
        per = [res[r][name][k] for r in range(p)]
        errors = [q["error"] for q in per if not q["ok"]]
        if not errors and k not in refs:
            refs[k] = reference(spec, k, micro_batch, seed)
        tried.append(_summary(name, per, k, refs[k]) if not errors else dict(
            name=name, schedule=REAL[name][0], m=k, ok=False, grad_diff=None, error=errors[0]))
    return {"ok": True, "p": p, "m": m, "model": model, "n_layer": spec.n_layer, "device": kind,
            "accepted": tried, "runs": {a["name"]: a for a in tried if a["ok"] and a["m"] == m},
            "seconds": seconds, "load": max(load, load_average()), "repeats": repeats}


def against_1f1b(lab: dict) -> dict:
    """Each schedule's measured idle share against 1F1B's: "lower" or "higher" when the spreads
    (lowest to highest repeat) do not overlap, else "overlap" (no verdict). Overall: "agree" (all
    lower, as the replay has it), "disagree" (one higher), "mixed", "overlap"; and the timing."""
    runs = {k: r for k, r in lab["runs"].items() if "measured" in r}
    if "1f1b" not in runs or len(runs) < 2:
        raise ConfigError("lab", sorted(runs), "a schedules_lab result with 1F1B and another")
    base = runs["1f1b"]
    each = {k: "lower" if r["high"] < base["low"] else "higher" if r["low"] > base["high"]
            else "overlap" for k, r in runs.items() if k != "1f1b"}
    said, worst = set(each.values()), max(runs.values(), key=lambda r: r["ratio"])
    verdict = ("agree" if said == {"lower"} else "disagree" if "higher" in said else
               "mixed" if "lower" in said else "overlap")
    named = {w: ", ".join(REAL[k][0] for k, v in each.items() if v == w) or "none" for w in
             ("lower", "overlap", "higher")}
    return dict(verdict=verdict, each=each, base_low=base["low"], base_high=base["high"], **named,
                repeats=base["repeats"], load=lab["load"], cores=os.cpu_count(),
                worst=worst["schedule"], ratio=worst["ratio"], timing="schedule" if worst["ratio"]
                <= TRUST else "contention" if lab["load"] >= os.cpu_count() else "other")


def plot_timelines(timelines: dict, unit: str = "ms", width: float = 8.0):
    """A panel per schedule, a row per rank: F light blue, B dark blue, W green, B+W purple."""
    from ...tools.plots.figure import new_figure  # deferred: matplotlib loads only to draw

    fig, scale = new_figure(width, 0.9 * len(timelines) + 0.6), 1e3 if unit == "ms" else 1.0
    axes = fig.subplots(len(timelines), 1, squeeze=False)
    for ax, (label, timeline) in zip(axes[:, 0], timelines.items()):
        end = max(b for tl in timeline for *_, b in tl)
        for r, actions in enumerate(timeline):
            for kind in COLOURS:  # one call per rank and kind: quick to draw
                spans = [(a * scale, (b - a) * scale) for k, _, _, a, b in actions if k == kind]
                ax.broken_barh(spans, (r - 0.35, 0.7), color=COLOURS[kind], ec="white", lw=0.4)
            for kind, c, i, a, b in actions:
                if (b - a) / end > 0.035:
                    ax.text((a + b) / 2 * scale, r, f"{c}.{i}", ha="center", va="center", size=5)
        ax.set_yticks(range(len(timeline)), [f"rank {r}" for r in range(len(timeline))], fontsize=7)
        ax.invert_yaxis(), ax.tick_params(labelsize=6), ax.set_title(label, fontsize=8, loc="left")
    axes[-1, 0].set_xlabel(f"{unit} since the step began (label: chunk.micro-batch; F light, "
                           "B dark, W green, B+W purple, white idle)", fontsize=7)
    return fig
