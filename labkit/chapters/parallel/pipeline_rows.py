"""The pipeline demo's figures as a table's rows and verdict keys (taught in chapter 10): the bubble per m
(measured, replayed, the formula's), whether the measured steps are the schedule's (``timing``), what the
stages cost (``stage_costs``), the saved activations per stage under GPipe and 1F1B, torch.distributed.pipelining
against the plain pipeline. The chapter draws the tables and chooses its sentences by the verdicts.

    display(lk.course.table(par.bubble_rows(demo, "gpipe"), columns)); par.timing(demo)["verdict"]
"""
from __future__ import annotations

import statistics

from ...base.errors import ConfigError
from ...base.numfmt import number
from .pipeline import find_run


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
    """Per m: the measured idle share (mean of stages, each stage, the median step's), the replay's (the measured
    compute times put into the schedule, messages free, nothing else running), the formula's (p-1)/(m+p-1), the
    measured and replayed step, and their ratio."""
    rows = []
    for r in _runs_of(result, schedule):
        rows.append({"m": r["m"], "measured": r["bubble"], "stages": list(r["stage_bubble"]),
                     "median": r["bubble_median"], "replayed": r["replayed"]["bubble"], "formula": r["formula"],
                     "step_ms": r["step_s"] * 1e3, "replayed_step_ms": r["replayed"]["step_s"] * 1e3,
                     "ratio": step_ratio(r), "repeats": r["repeats"]})
    return rows


def timing(result: dict, schedule: str = "gpipe") -> dict:
    """Whether the measured steps are the schedule's: verdict "schedule" (every m's measured step within
    ``TRUST`` of the replayed one), "contention" (some are not, and the load average was at least the core
    count: more runnable processes than cores) or "other" (some are not on an unloaded machine: the messages,
    other programs). With the figures a sentence quotes: the worst m, its measured and replayed step and their
    ratio, the load and cores, the m's above and within ``TRUST``; and what the messages cost: the one-way
    latency of a ping-pong after the runs, 2m messages per link per step at the worst m, their total, and the
    share of the step's excess over the replay they explain (``messages``: "none" where not measured,
    "explain" where they account for all the excess, "part" where for part of it, "no_excess" where none)."""
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
    """(value, source, ratio) to grade a predicted idle share against: the measured one ("measured") when the
    measured step is within ``TRUST`` of the replayed step, else the replay ("computed", from the measured compute
    times) -- because then the timing is this machine's contention, not the schedule's."""
    run = find_run(result, schedule, m)
    ratio = step_ratio(run)
    if ratio <= TRUST:
        return run["bubble"], "measured", ratio
    return run["replayed"]["bubble"], "computed", ratio


def stage_costs(result: dict) -> dict:
    """A forward plus a backward of one micro-batch per stage, over every run of the demo (both schedules,
    every m): each run's median, the median of those (``median_ms``), and the verdict "equal" (within 10 %),
    "unequal" (the same stage the slowest in at least 3 runs of 4; ``last_slowest`` when that is the last stage,
    which also runs the head and the loss) or "noise" (unequal medians, but the slowest stage changes from run
    to run) -- one verdict per demo, whichever schedule's table asks."""
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
    """Per stage: peak saved-activation bytes under GPipe and 1F1B at the same m (the largest m both ran where
    ``m`` is None), their ratio, and the micro-batches each schedule holds in flight."""
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
    """One row per torch.distributed.pipelining schedule the demo ran: its m, its loss against the plain
    send/recv pipeline's at the same m, or the error it raised. Empty where it was not tried (the demo's
    ``torch_pipelining_why`` says why)."""
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
