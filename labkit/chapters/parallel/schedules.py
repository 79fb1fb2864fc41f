"""Pipeline schedules as data (taught in chapter 10): for each stage, its ordered actions ("F", i) / ("B", i)
-- the forward and the backward of micro-batch i -- under GPipe and 1F1B; how many micro-batches each stage
holds at its peak; a replay of a schedule with given stage costs; and a step's bubble from measured
timestamps. Pure (no processes); ``pipeline`` runs these lists on real ones.

    gpipe_schedule(2, 4)          # [[F0 F1 F2 F3 B0 B1 B2 B3], [the same]]: all forwards, then all backwards
    one_f_one_b_schedule(2, 4)    # stage 0: F0, then F1 B0 F2 B1 F3 B2, then B3
    in_flight(one_f_one_b_schedule(4, 8))   # [4, 3, 2, 1]: micro-batches held at the peak, per stage
    replay(gpipe_schedule(2, 4), [1, 1], [2, 2])["bubble"]   # 1/5 = (p-1)/(m+p-1)
"""
from __future__ import annotations

import statistics

from ...base.errors import ConfigError
from ...engine.config import _choice
from ...engine.config import whole

# gpipe: all forwards, then all backwards; 1f1b: min(p - stage - 1, m) warm-up forwards, then one forward one
# backward, then the last backwards
SCHEDULES = ("gpipe", "1f1b")


# ---- the schedules: what each stage does, in order (pure) --------------------------------------------

def gpipe_schedule(p: int, m: int) -> list:
    """GPipe: every stage runs the forward of all ``m`` micro-batches, then their backwards. Simple, but
    each stage keeps the activations of all ``m`` micro-batches until their backward comes.
    Shown in 10_when_the_model_does_not_fit (code-10-schedules)."""
    p, m = whole("p", p), whole("m", m)
    schedule = []
    for stage in range(p):
        forwards = [("F", i) for i in range(m)]   # fill the pipeline: micro-batch i flows down the stages
        backwards = [("B", i) for i in range(m)]  # then drain it: gradients flow back up, in the same order
        schedule.append(forwards + backwards)
    return schedule


def one_f_one_b_schedule(p: int, m: int) -> list:
    """1F1B (PipeDream-Flush, Megatron-LM's default): a stage starts backwards as soon as it can, so it
    holds at most ``min(p - stage, m)`` micro-batches' activations instead of ``m``. Same bubble as GPipe.
    Any m works: with m < p a stage's warm-up is cut to the m micro-batches there are, as Megatron-LM
    does (torch's Schedule1F1B refuses m < p instead; the demo follows torch there).
    Shown in 10_when_the_model_does_not_fit (code-10-schedules)."""
    p, m = whole("p", p), whole("m", m)
    schedule = []
    for stage in range(p):
        # Warm-up: the last stage can run micro-batch 0's backward right after its forward; every stage
        # before it must first forward the micro-batches that will fill the stages after it.
        warmup = min(p - stage - 1, m)
        actions = [("F", i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:  # steady state: one forward, then the backward of the oldest micro-batch in flight
            actions += [("F", f), ("B", b)]
            f, b = f + 1, b + 1
        actions += [("B", i) for i in range(b, m)]  # cool-down: the backwards still owed
        schedule.append(actions)
    return schedule


def schedule_for(name: str, p: int, m: int) -> list:
    """The action lists of schedule ``name`` ("gpipe" or "1f1b")."""
    _choice("schedule", name, SCHEDULES)
    return gpipe_schedule(p, m) if name == "gpipe" else one_f_one_b_schedule(p, m)


def in_flight(schedule: list) -> list:
    """Per stage, the most micro-batches forwarded and not yet backwarded at any moment: how many
    micro-batches' activations the stage holds at its peak (GPipe: m; 1F1B: at most min(p - stage, m))."""
    peaks = []
    for actions in schedule:
        now = peak = 0
        for kind, _ in actions:
            now += 1 if kind == "F" else -1
            peak = max(peak, now)
        peaks.append(peak)
    return peaks


def stage_blocks(n_layer: int, p: int) -> list:
    """Which blocks each stage holds: ``n_layer // p`` each, the rest to the first stages -- the last stage
    also computes the head and the loss, the first only the (cheap) embedding lookups."""
    n_layer, p = whole("n_layer", n_layer), whole("p", p)
    if p > n_layer:
        raise ConfigError("stages", p, f"at most one stage per block: {n_layer} for this model")
    base, extra = divmod(n_layer, p)
    sizes = [base + (1 if s < extra else 0) for s in range(p)]
    starts = [sum(sizes[:s]) for s in range(p)]
    return [range(a, a + n) for a, n in zip(starts, sizes)]


# ---- measured timestamps, and a replay with given costs ---------------------------------------------

def _stage_numbers(log, t_start, t_end) -> dict:
    step = t_end - t_start
    busy = sum(t2 - t1 for _, _, _, t1, t2 in log)
    wait = sum(t1 - t0 for _, _, t0, t1, _ in log)
    return dict(busy_s=busy, wait_s=wait, step_s=step, idle_s=step - busy, bubble=(step - busy) / step)


def bubble_from_logs(logs: list) -> dict:
    """One step's numbers from every stage's action log (same clock): the step from the first action's
    start to the last one's end, and per stage busy (compute), wait (in recv), idle = step - busy and
    bubble = idle / step; ``bubble`` is their mean over the stages."""
    t_start = min(a[2] for log in logs for a in log)
    t_end = max(a[4] for log in logs for a in log)
    stages = [_stage_numbers(log, t_start, t_end) for log in logs]
    actions = [[(k, i, t0 - t_start, t1 - t_start, t2 - t_start) for k, i, t0, t1, t2 in log] for log in logs]
    return dict(step_s=t_end - t_start, bubble=statistics.fmean(s["bubble"] for s in stages), stages=stages,
                actions=actions)


def replay(schedule: list, forward_s, backward_s) -> dict:
    """The timeline ``schedule`` gives when stage s's forward takes ``forward_s[s]`` and its backward
    ``backward_s[s]`` and nothing else runs or travels: each stage does its actions in order, a forward
    once the previous stage's forward of that micro-batch is done, a backward once the next stage's
    backward is. Returns the step time and each stage's idle share (equal costs: (p-1)/(m+p-1))."""
    p = len(schedule)
    end, free, pos = {}, [0.0] * p, [0] * p
    while any(pos[s] < len(schedule[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pos[s] == len(schedule[s]):
                continue
            kind, i = schedule[s][pos[s]]
            dep = (s - 1, "F", i) if kind == "F" and s > 0 else (s + 1, "B", i) if kind == "B" and s < p - 1 \
                else None
            if dep is not None and dep not in end:
                continue  # its input is not there yet: another stage must move first
            start = max(free[s], end[dep] if dep is not None else 0.0)
            end[s, kind, i] = free[s] = start + (forward_s[s] if kind == "F" else backward_s[s])
            pos[s], moved = pos[s] + 1, True
        if not moved:
            raise ConfigError("schedule", "a deadlock", "action lists in which every input can arrive")
    step = max(free)
    busy = [sum(forward_s[s] if k == "F" else backward_s[s] for k, _ in schedule[s]) for s in range(p)]
    return dict(step_s=step, stage_bubble=[(step - b) / step for b in busy],
                bubble=statistics.fmean((step - b) / step for b in busy))
