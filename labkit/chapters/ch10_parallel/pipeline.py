"""Pipeline parallelism on real processes (taught in chapter 10): labkit's GPT cut into ``p`` stages, one
process each, micro-batches passed on with point-to-point sends under GPipe and 1F1B: the bubble measured
from every action's timestamps (busy: computing; idle: the rest of the step), the saved activations
counted, the tied embedding's two copies summed after the backward as Megatron-LM does; its figures.

    demo = pipeline_demo(model="tiny", stages=2, micro_batches=(1, 2, 4, 8), schedule="both")
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...base import compat
from ...base.runtime import ConfigError
from ...base.numfmt import number
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, _bool, _choice, real, whole
from ...engine.model import GPT, VOCAB, GPTStage  # noqa: F401  (GPTStage: chapter 12 cuts the GPT too)
from ...tools.collectives import device_kind, figure, load_average, rank_device, rank_lab
from .formulas import (SCHEDULES, bubble_fraction, bubble_from_logs, gpipe_schedule, in_flight, replay,
                       schedule_for, stage_blocks)
from .ranks import SavedActivations, ping_pong, sync_clock

CHOICES = SCHEDULES + ("both",)  # both: GPipe and 1F1B, one after the other in the same processes


# ---- one stage of the GPT, and the loop every stage runs ---------------------------------------------

def run_schedule(stage, actions, rank, p, inputs=None, targets=None, shape=None, device="cpu",
                 now=time.perf_counter):
    """One training step of pipeline stage ``rank`` of ``p``: its ``actions`` in order, ("F", i) /
    ("B", i); activations go to rank + 1, gradients to rank - 1. Returns (the loss on the last
    stage, else None; (kind, i, t0 start, t1 input arrived, t2 end) per action).
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


# ---- the ranks ----------------------------------------------------------------------------------------

def demo_batch(spec, m: int, micro_batch: int, seed: int, device=None):
    """The same (tokens, targets) of m micro-batches on every rank and in the reference."""
    g = torch.Generator().manual_seed(seed + 1000 * m)
    x = torch.randint(0, VOCAB, (m * micro_batch, spec.seq_len), generator=g)
    y = torch.randint(0, VOCAB, (m * micro_batch, spec.seq_len), generator=g)
    return x.to(device), y.to(device)


def _one_step(stage, actions, r, p, x, y, micro_batch, dev, tied_group, now):
    """One step, then the tied embedding's AllReduce (outside the timed actions): (loss or None, log)."""
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
    """A spawned stage: every (schedule, m) once counting saved activations (and gradients), then ``repeats`` timed
    steps; then torch.distributed.pipelining if asked."""
    r, t_start = rank.rank, time.perf_counter()
    dev = rank_device(kind, r)  # NCCL's barrier and sends use the current device
    with ddp_mod.process_group(kind, r, p, rank.file_store()):
        tied_group = dist.new_group([0, p - 1]) if p > 2 else None  # every rank takes part in new_group
        torch.manual_seed(seed)
        blocks = stage_blocks(spec.n_layer, p)[r]
        stage = GPTStage(GPT(spec), blocks, r == 0, r == p - 1).to(dev)
        now, names = sync_clock(dev), stage.global_names()
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
            logs = []
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
    """The same pipeline with PyTorch's ``torch.distributed.pipelining``: wrap this rank's stage,
    pick a schedule, ``step`` the whole batch (it cuts the ``m`` micro-batches itself). The
    micro-batch losses on the last stage.
    Shown in 10_when_the_model_does_not_fit."""
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
    """Each schedule once through torch.distributed.pipelining at the smallest m >= p the demo ran: its loss and one
    timed step. An error is reported, not raised: every rank reaches the same point, none is left waiting."""
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
    """(loss, {name: gradient}) of the whole tied GPT on the demo's batch, one process."""
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
    """One (schedule, m): the fastest repeat (the one other processes disturbed least; the median beside it), and
    its replay -- the same compute times with nothing else running and messages free; the gap is the waiting
    the schedule does not explain."""
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
    """The (schedule, m) pairs to run, and those skipped: 1F1B only for m >= p, as torch's Schedule1F1B."""
    names = ("gpipe", "1f1b") if schedule == "both" else (schedule,)
    runs = [(n, m) for n in names for m in micro_batches if not (n == "1f1b" and m < p)]
    skipped = [(n, m) for n in names for m in micro_batches if n == "1f1b" and m < p]
    return runs, skipped


def pipeline_demo(model: str = "tiny", stages: int = 2, micro_batches=(1, 2, 4, 8), schedule: str = "gpipe",
                  micro_batch: int = 4, seed: int = 0, repeats: int = 5, check: bool = True,
                  torch_api: bool = True, timeout_s: float = 120.0) -> dict:
    """Run labkit's GPT as a ``stages``-stage pipeline on as many processes, in ONE spawn: a warm-up step, then per
    (schedule, m) one step counting saved activations and ``repeats`` timed ones. Per run: the measured
    bubble per stage against ``bubble_fraction(p, m)``, the fastest step's timeline, the saved-activation
    peaks, the loss (``check``: and every gradient) against one process's; torch.distributed.pipelining's
    loss (``torch_api``); one activation's one-way time (``p2p_s``). ``ok`` False and ``error`` where a rank
    failed or was late."""
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
    _bool("check", check)
    _bool("torch_api", torch_api)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    runs, skipped = _runs(schedule, p, ms)
    if not runs:
        raise ConfigError("micro_batches", micro_batches,
                          f"at least one m >= stages = {p} for 1F1B (as torch's Schedule1F1B)")
    kind = device_kind(p)
    api_why = None  # why torch.distributed.pipelining is not tried (a torch whose schedules abort on gloo)
    if torch_api and kind == "cpu" and not compat.has("pipelining on gloo"):
        torch_api, api_why = False, compat.message("pipelining on gloo")
    load = load_average()
    run = rank_lab({"ok": True, "world_size": p, "kind": kind}, _pipeline_rank,
                   (spec, p, runs, micro_batch, seed, repeats, check, torch_api, kind), "pipeline demo",
                   timeout_s, "labkit-pipeline-")
    if not run["ok"]:
        return {"ok": False, "error": run["error"], "runs": [], "stages": p}
    results, seconds = run["ranks"], run["seconds"]
    refs = {m: single_process(spec, m, micro_batch, seed) for m in dict.fromkeys(m for _, m in runs)}
    out = [_summarise(n, m, [results[s]["runs"][k] for s in range(p)], p, refs.get(m))
           for k, (n, m) in enumerate(runs)]
    return {"ok": True, "stages": p, "model": model, "micro_batch": micro_batch, "device": kind, "runs": out,
            "skipped": [dict(schedule=n, m=m, why=f"torch's Schedule1F1B needs m >= p = {p}") for n, m in skipped],
            "torch_pipelining": results[p - 1]["torch_pipelining"], "torch_pipelining_why": api_why,
            "definition": "step",  # formulas.BUBBLE_DEFINITIONS' key: idle time over the whole step
            "seconds": seconds, "rank_seconds": results[0]["seconds"], "cores": os.cpu_count(),
            "p2p_s": results[0]["p2p_s"], "load": max(load, load_average())}  # what else shared the cores


def find_run(result: dict, schedule: str, m: int) -> dict:
    for run in result.get("runs", []):
        if run["schedule"] == schedule and run["m"] == m:
            return run
    raise ConfigError("m", m, f"one of the measured m for {schedule}: "
                      f"{[r['m'] for r in result.get('runs', []) if r['schedule'] == schedule]}")


TRUST = 1.05  # measured step within 5 % of the replayed one: the idle shares then differ by under 0.05


def _runs_of(result: dict, schedule: str) -> list:
    runs = sorted((r for r in result["runs"] if r["schedule"] == schedule), key=lambda r: r["m"])
    if not runs:
        raise ConfigError("schedule", schedule, "a schedule the demo ran")
    return runs


def step_ratio(run: dict) -> float:
    """Measured step over replayed step: 1 when nothing but the schedule and the compute took time."""
    return run["step_s"] / run["replayed"]["step_s"]


def bubble_rows(result: dict, schedule: str = "gpipe") -> list:
    """Per m: the measured idle share (mean, each stage, the median step's), the replay's, the formula's
    (p-1)/(m+p-1), the measured and replayed step, and their ratio."""
    return [{"m": r["m"], "measured": r["bubble"], "stages": list(r["stage_bubble"]),
             "median": r["bubble_median"], "replayed": r["replayed"]["bubble"], "formula": r["formula"],
             "step_ms": r["step_s"] * 1e3, "replayed_step_ms": r["replayed"]["step_s"] * 1e3,
             "ratio": step_ratio(r), "repeats": r["repeats"]} for r in _runs_of(result, schedule)]


def timing(result: dict, schedule: str = "gpipe") -> dict:
    """Whether the measured steps are the schedule's: "schedule" (every m's step within ``TRUST`` of the replay),
    "contention" (not, and the load average at least the core count) or "other"; with the worst m's figures,
    and what the messages cost (``messages``: "none" unmeasured, "explain" all of the excess over the replay,
    "part", "no_excess")."""
    runs = _runs_of(result, schedule)
    worst = max(runs, key=step_ratio)
    bad = [r["m"] for r in runs if step_ratio(r) > TRUST]
    load, cores = result["load"], result["cores"]
    verdict = "schedule" if not bad else "contention" if load >= cores else "other"
    out = {"verdict": verdict, "worst_m": worst["m"], "step_ms": worst["step_s"] * 1e3,
           "replayed_ms": worst["replayed"]["step_s"] * 1e3, "ratio": step_ratio(worst), "load": load,
           "cores": cores, "above": bad, "within": [r["m"] for r in runs if step_ratio(r) <= TRUST],
           "trust_percent": round((TRUST - 1) * 100), "messages": "none"}
    lat = result.get("p2p_s")
    if lat is not None:
        n, excess = 2 * worst["m"], worst["step_s"] - worst["replayed"]["step_s"]
        out.update(latency_ms=lat * 1e3, n_messages=n, messages_ms=n * lat * 1e3, excess_ms=excess * 1e3)
        if not bad or excess <= 0:
            out["messages"] = "no_excess"
        else:
            out["messages"] = "explain" if n * lat >= excess else "part"
            out["messages_share"] = min(1.0, n * lat / excess)
    return out


def bubble_to_grade(result: dict, schedule: str = "gpipe", m: int = 4) -> tuple:
    """(value, source, ratio) to grade a predicted idle share against: the measured one when the step is within
    ``TRUST`` of the replay, else the replay ("computed") -- then the timing is this machine's contention."""
    run = find_run(result, schedule, m)
    ratio = step_ratio(run)
    if ratio <= TRUST:
        return run["bubble"], "measured", ratio
    return run["replayed"]["bubble"], "computed", ratio


def stage_costs(result: dict) -> dict:
    """A forward plus a backward per stage over every run: each run's median, their median, and "equal" (within 10
    %), "unequal" (one stage the slowest in 3 runs of 4; ``last_slowest`` when the last, which runs the head
    and the loss) or "noise"."""
    p = result["stages"]
    per_run = [[f + b for f, b in zip(r["forward_s"], r["backward_s"])] for r in result["runs"]]
    median = [statistics.median(c[s] for c in per_run) for s in range(p)]
    slow = max(range(p), key=lambda s: median[s])
    wins = sum(max(range(p), key=lambda s: c[s]) == slow for c in per_run)
    verdict = ("equal" if max(median) < 1.1 * min(median) else "unequal" if wins >= 0.75 * len(per_run) else "noise")
    if verdict == "unequal" and slow == p - 1:
        verdict = "last_slowest"
    return dict(median=median, ms=", ".join(number(x * 1e3) for x in median), slowest=slow, last=p - 1, wins=wins,
                runs=len(per_run), verdict=verdict)


def memory_rows(result: dict, m: int | None = None) -> list:
    """Per stage: peak saved-activation bytes under GPipe and 1F1B at one m (default the largest both ran), their
    ratio, and the micro-batches each holds in flight."""
    common = sorted({r["m"] for r in result["runs"] if r["schedule"] == "gpipe"}
                    & {r["m"] for r in result["runs"] if r["schedule"] == "1f1b"})
    if not common:
        raise ConfigError("result", "one schedule", 'a demo run with schedule="both" and an m >= p')
    m = common[-1] if m is None else m
    g, o = find_run(result, "gpipe", m), find_run(result, "1f1b", m)
    return [{"stage": s, "m": m, "gpipe_bytes": g["saved_peak_bytes"][s], "one_f_one_b_bytes": o["saved_peak_bytes"][s],
             "ratio": g["saved_peak_bytes"][s] / o["saved_peak_bytes"][s], "gpipe_in_flight": g["in_flight"][s],
             "one_f_one_b_in_flight": o["in_flight"][s]} for s in range(result["stages"])]


def torch_pipelining_rows(result: dict) -> list:
    """Per torch.distributed.pipelining schedule the demo ran: its loss against the plain pipeline's at the same m,
    or its error (none where not tried: ``torch_pipelining_why``)."""
    api = result.get("torch_pipelining") if result.get("ok") else None
    rows = []
    for name, res in (api or {}).items():
        label = "ScheduleGPipe" if name == "gpipe" else "Schedule1F1B"
        if not res["ok"]:
            rows.append({"schedule": label, "m": res.get("m"), "loss": None, "plain_loss": None, "diff": None,
                         "error": res["error"]})
            continue
        plain = find_run(result, name, res["m"])["loss"]
        rows.append({"schedule": label, "m": res["m"], "loss": res["loss"], "plain_loss": plain,
                     "diff": abs(res["loss"] - plain), "error": ""})
    return rows


# ---- the charts ---------------------------------------------------------------------------------------------

def plot_pipeline(result: dict, schedule: str = "gpipe", m: int = 4, width: float = 7.5, height: float = 2.4):
    """The measured timeline of one step: a row per stage, a box per forward (light) and backward (dark); the white
    space is the stage's idle time."""
    run = find_run(result, schedule, m)
    fig, ax = figure(min(width, 8.0), min(height, 3.0))
    ms = 1e3
    for s, actions in enumerate(run["timeline"]["actions"]):
        for kind, i, _, t1, t2 in actions:
            color = "#9ecae1" if kind == "F" else "#3182bd"
            ax.barh(s, (t2 - t1) * ms, left=t1 * ms, height=0.7, color=color, edgecolor="white", linewidth=0.5)
            if (t2 - t1) / run["timeline"]["step_s"] > 0.03:
                ax.text((t1 + t2) / 2 * ms, s, f"{kind}{i}", ha="center", va="center", fontsize=6,
                        color="black" if kind == "F" else "white")
    ax.set_yticks(range(run["p"]), [f"stage {s}" for s in range(run["p"])], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step began (light: forward, dark: backward, white: idle)", fontsize=8)
    ax.set_title(f"{schedule}, p={run['p']}, m={m}: measured idle share {run['bubble']:.0%} of the step "
                 f"(formula (p-1)/(m+p-1) = {run['formula']:.0%})", fontsize=8)
    ax.tick_params(labelsize=7)
    return fig


def plot_bubble(result: dict, schedule: str = "gpipe", width: float = 6.5, height: float = 2.6):
    """The measured idle share (mean and each stage) against (p-1)/(m+p-1) and the replay."""
    runs = _runs_of(result, schedule)
    fig, ax = figure(min(width, 8.0), min(height, 3.0))
    ms = [r["m"] for r in runs]
    ax.plot(ms, [r["formula"] for r in runs], "s--", color="gray", label="(p-1)/(m+p-1)")
    ax.plot(ms, [r["bubble"] for r in runs], "o-", color="#c44e52", label="measured, mean of stages")
    ax.plot(ms, [r["replayed"]["bubble"] for r in runs], "^:", color="#4c72b0",
            label="replayed (same compute, nothing else)")
    for s in range(result["stages"]):
        ax.plot(ms, [r["stage_bubble"][s] for r in runs], ".", alpha=0.6, label=f"measured, stage {s}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches m", fontsize=8)
    ax.set_ylabel("idle share of the step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return fig
