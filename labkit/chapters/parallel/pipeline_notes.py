"""Chapter 10's pipeline charts and sentences (taught in chapter 10): the measured timeline of one step, the
measured bubble against (p-1)/(m+p-1), and the words about both and about GPipe's and 1F1B's activation
memory -- each from a ``pipeline.pipeline_demo`` result, never a typed number.

    display(plot_pipeline(demo, "gpipe", 4)); display(bubble_note(demo)); display(memory_note(demo))
"""
from __future__ import annotations

import statistics

import torch

from ...base.errors import ConfigError
from ..course import Note
from .pipeline import find_run

# ---- charts ---------------------------------------------------------------------------------------------

def plot_pipeline(result: dict, schedule: str = "gpipe", m: int = 4, width: float = 7.5, height: float = 2.4):
    """The measured timeline of one step: a row per stage, a box per forward (light) and backward (dark)
    from its timestamps; the white space is the stage's idle time (waiting, the bubble)."""
    run = find_run(result, schedule, m)
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(min(width, 8.0), min(height, 3.0))
    ax = fig.add_subplot(1, 1, 1)
    ms = 1e3
    for s, actions in enumerate(run["timeline"]["actions"]):
        for kind, i, _, t1, t2 in actions:
            color = "#9ecae1" if kind == "F" else "#3182bd"
            ax.barh(s, (t2 - t1) * ms, left=t1 * ms, height=0.7, color=color, edgecolor="white", linewidth=0.5)
            if (t2 - t1) / run["timeline"]["step_s"] > 0.03:
                ax.text((t1 + t2) / 2 * ms, s, f"{kind}{i}", ha="center", va="center", fontsize=6,
                        color="black" if kind == "F" else "white")
    ax.set_yticks(range(run["p"]))
    ax.set_yticklabels([f"stage {s}" for s in range(run["p"])], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step began (light: forward, dark: backward, white: idle)", fontsize=8)
    ax.set_title(f"{schedule}, p={run['p']}, m={m}: measured idle share {run['bubble']:.0%} of the step "
                 f"(formula (p-1)/(m+p-1) = {run['formula']:.0%})", fontsize=8)
    ax.tick_params(labelsize=7)
    return fig


def plot_bubble(result: dict, schedule: str = "gpipe", width: float = 6.5, height: float = 2.6):
    """The measured idle share of the step (mean over stages, and each stage) against (p-1)/(m+p-1)."""
    runs = sorted((r for r in result["runs"] if r["schedule"] == schedule), key=lambda r: r["m"])
    if not runs:
        raise ConfigError("schedule", schedule, "a schedule the demo ran")
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(min(width, 8.0), min(height, 3.0))
    ax = fig.add_subplot(1, 1, 1)
    ms = [r["m"] for r in runs]
    ax.plot(ms, [r["formula"] for r in runs], "s--", color="gray", label="(p-1)/(m+p-1)")
    ax.plot(ms, [r["bubble"] for r in runs], "o-", color="#c44e52", label="measured, mean of stages")
    ax.plot(ms, [r["replayed"]["bubble"] for r in runs], "^:", color="#4c72b0",
            label="replayed (same compute, nothing else)")
    for s in range(result["stages"]):
        ax.plot(ms, [r["stage_bubble"][s] for r in runs], ".", alpha=0.6, label=f"measured, stage {s}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms)
    ax.set_xticklabels([str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches m", fontsize=8)
    ax.set_ylabel("idle share of the step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return fig


# ---- sentences from the measured values ------------------------------------------------------------------

def _device_words(result) -> str:
    if result["device"] == "cuda":
        return f"{result['stages']} GPUs (NCCL)"
    return (f"{result['stages']} CPU processes (gloo)" + ("" if not torch.cuda.is_available() else
            f": fewer than {result['stages']} GPUs here, so the stages run on the CPU"))


TRUST = 1.05  # measured step within 5 % of the replayed one: the idle shares then differ by under 0.05


def step_ratio(run: dict) -> float:
    """Measured step over replayed step: 1 when nothing but the schedule and the compute took time."""
    return run["step_s"] / run["replayed"]["step_s"]


def bubble_to_grade(result: dict, schedule: str = "gpipe", m: int = 4) -> tuple:
    """(value, source, why) to grade a predicted idle share against: the measured one when the measured
    step is within ``TRUST`` of the replayed step, else the replay -- computed from the measured compute
    times -- because then the timing is this machine's contention, not the schedule's."""
    run = find_run(result, schedule, m)
    ratio = step_ratio(run)
    if ratio <= TRUST:
        return run["bubble"], "measured", (f"Graded against the measured idle share: the measured step was "
                                           f"{ratio:.2f}× the replayed one (within {TRUST - 1:.0%}).")
    return run["replayed"]["bubble"], "computed", (
        f"Graded against the replay: the measured step was {ratio:.2f}× the replayed one, so the measured "
        "share holds waiting the schedule does not need (this machine's contention, the messages); the replay "
        "puts the measured compute times into the schedule.")


def stage_costs(result: dict) -> dict:
    """A forward plus a backward of one micro-batch per stage, over every run of the demo (both schedules,
    every m): each run's median, the median of those, and the verdict "equal" (within 10 %), "unequal"
    (the same stage the slowest in at least 3 runs of 4) or "noise" (unequal medians, but the slowest
    stage changes from run to run) -- one verdict per demo, whichever schedule's note asks."""
    p = result["stages"]
    per_run = [[f + b for f, b in zip(r["forward_s"], r["backward_s"])] for r in result["runs"]]
    median = [statistics.median(c[s] for c in per_run) for s in range(p)]
    slow = max(range(p), key=lambda s: median[s])
    wins = sum(max(range(p), key=lambda s: c[s]) == slow for c in per_run)
    verdict = ("equal" if max(median) < 1.1 * min(median) else "unequal" if wins >= 0.75 * len(per_run) else "noise")
    return dict(median=median, slowest=slow, wins=wins, runs=len(per_run), verdict=verdict)


def _cost_words(result) -> str:
    """How unequal the stages' costs were, from every run of the demo together (the same words in both
    schedules' notes)."""
    c, p = stage_costs(result), result["stages"]
    ms = ", ".join(f"{x * 1e3:.1f}" for x in c["median"])
    where = f"median over the {c['runs']} runs of both schedules" if len(
        {r["schedule"] for r in result["runs"]}) > 1 else f"median over the {c['runs']} runs"
    if c["verdict"] == "equal":
        return (f"A forward and a backward of one micro-batch took about the same on every stage ({ms} ms, "
                f"{where}), as the formula assumes.")
    if c["verdict"] == "noise":
        return (f"A forward and a backward of one micro-batch took {ms} ms on stages 0 to {p - 1} ({where}), "
                f"but stage {c['slowest']} was the slowest in only {c['wins']} of {c['runs']} runs: a "
                "difference within this machine's run-to-run noise, not the stages' own.")
    return (f"A forward and a backward of one micro-batch took {ms} ms on stages 0 to {p - 1} ({where}; "
            f"stage {c['slowest']} the slowest in {c['wins']} of {c['runs']})"
            + (": the last stage also runs the head and the loss" if c["slowest"] == p - 1 else "")
            + ". The formula assumes stages of equal cost; with unequal ones the faster stages wait for the "
              "slowest every micro-batch, which the replay includes.")


def _ms_list(runs) -> str:
    ms = [str(r["m"]) for r in runs]
    return ms[0] if len(ms) == 1 else ", ".join(ms[:-1]) + " and " + ms[-1]


def _timing_words(result, runs) -> str:
    """Whether the measured steps are the schedule's (measured step within TRUST of the replayed one) or
    something else's -- this machine's contention, the messages -- per m; and what each message cost."""
    load, cores = result["load"], result["cores"]
    good = [r for r in runs if step_ratio(r) <= TRUST]
    bad = [r for r in runs if step_ratio(r) > TRUST]
    lat, worst = result.get("p2p_s"), max(runs, key=step_ratio)
    excess = worst["step_s"] - worst["replayed"]["step_s"]
    words = []
    if good:
        words.append(f"For m = {_ms_list(good)} the measured step is within {TRUST - 1:.0%} of the replayed one "
                     "(the same step's compute times put into the schedule, nothing else running, messages "
                     "free): there the measurement confirms the schedule's idle share"
                     + (", and the formula's where the stages cost the same." if good == runs else "."))
    if bad:
        seen = (f"For m = {_ms_list(bad)} the measured step is above the replayed one by more than {TRUST - 1:.0%} "
                f"({worst['step_s'] * 1e3:.0f} ms against {worst['replayed']['step_s'] * 1e3:.0f} ms at m = "
                f"{worst['m']}, {step_ratio(worst):.2f}×), so the measured idle share there is not the schedule's")
        if load >= cores:
            how = "dominated" if step_ratio(worst) >= 1.5 else "stretched"
            words.append(seen + f": the timing is {how} by contention on this machine (load average {load:.1f} on "
                         f"{cores} cores: more runnable processes than cores). A stage that waits in `recv` "
                         "sleeps, and waking it needs a free core. Read the replay column there: the schedule's "
                         "idle share with these stages' measured compute times.")
        else:
            words.append(seen + f": the rest is waiting the schedule does not need -- the messages (below) and "
                         f"whatever else ran (load average {load:.1f} on {cores} cores).")
    if lat is not None:
        n = 2 * worst["m"]
        words.append(
            f"A message between the stages (one micro-batch's activation or gradient) took {lat * 1e3:.2f} ms "
            f"one way here (a ping-pong between stages 0 and 1 after the runs); at m = {worst['m']}, "
            f"{n} of them cross each link per step (m activations down, m gradients up): at most "
            f"{n * lat * 1e3:.1f} ms of the {worst['step_s'] * 1e3:.0f} ms step"
            + ((f", {n * lat / excess:.0%} of its {excess * 1e3:.0f} ms excess over the replay" if n * lat < excess
                else f": enough for all of its {excess * 1e3:.0f} ms excess over the replay")
               if bad and excess > 0 else "")
            + ". Each micro-batch pays a send/recv latency, so more micro-batches are not free.")
    return " ".join(words)


def bubble_note(result: dict, schedule: str = "gpipe") -> Note:
    """A table of the measured bubble against the replay and the formula per m; whether the measured step
    is the schedule's (within ``TRUST`` of the replayed step) or this machine's contention; what each
    message cost; and what the stages' costs did to it."""
    if not result.get("ok"):
        return Note(f"The pipeline did not run here: {result.get('error')}.")
    runs = sorted((r for r in result["runs"] if r["schedule"] == schedule), key=lambda r: r["m"])
    if not runs:
        raise ConfigError("schedule", schedule, "a schedule the demo ran")
    p = result["stages"]
    head = ("| m | measured (mean of stages) | " + " | ".join(f"stage {s}" for s in range(p))
            + " | median of the steps | replayed | (p-1)/(m+p-1) | step (ms) | replayed step (ms) | measured / "
              "replayed step |")
    rows = [head, "|" + "---|" * (p + 8)]
    rows += [f"| {r['m']} | **{r['bubble']:.2f}** | " + " | ".join(f"{b:.2f}" for b in r["stage_bubble"])
             + f" | {r['bubble_median']:.2f} | {r['replayed']['bubble']:.2f} | {r['formula']:.2f} | "
               f"{r['step_s'] * 1e3:.1f} | {r['replayed']['step_s'] * 1e3:.1f} | {step_ratio(r):.2f}× |"
             for r in runs]
    last = runs[-1]
    lines = [f"{'GPipe' if schedule == 'gpipe' else '1F1B'} on {_device_words(result)}, {result['micro_batch']} "
             f"sequences per micro-batch; the fastest of {last['repeats']} timed steps after a warm-up (the one "
             "least disturbed by other processes), the median beside it. Idle share = (step - time computing) / "
             "step, per stage; waiting for and posting sends count as idle. That is the step definition, "
             "(p-1)/(m+p-1); Megatron-LM's (p-1)/m divides by the ideal time instead.", "", *rows, "",
             _timing_words(result, runs), "", _cost_words(result)]
    return Note("\n".join(lines))


def memory_note(result: dict, m: int | None = None) -> Note:
    """Peak saved-activation bytes per stage, GPipe against 1F1B at the same m, with the micro-batches
    in flight each schedule predicts."""
    if not result.get("ok"):
        return Note(f"The pipeline did not run here: {result.get('error')}.")
    common = sorted({r["m"] for r in result["runs"] if r["schedule"] == "gpipe"}
                    & {r["m"] for r in result["runs"] if r["schedule"] == "1f1b"})
    if not common:
        return Note("Run the demo with schedule=\"both\" and an m >= p to compare their memory.")
    m = common[-1] if m is None else m
    g, o = find_run(result, "gpipe", m), find_run(result, "1f1b", m)
    p = result["stages"]
    rows = ["| stage | GPipe peak (KiB) | 1F1B peak (KiB) | GPipe / 1F1B | in flight: GPipe, 1F1B |",
            "|---|---|---|---|---|"]
    rows += [f"| {s} | {g['saved_peak_bytes'][s] / 1024:,.0f} | {o['saved_peak_bytes'][s] / 1024:,.0f} | "
             f"{g['saved_peak_bytes'][s] / o['saved_peak_bytes'][s]:.2f} | {g['in_flight'][s]}, {o['in_flight'][s]} |"
             for s in range(p)]
    r0 = g["saved_peak_bytes"][0] / o["saved_peak_bytes"][0]
    return Note(f"Peak bytes of the activations autograd saved for backward (counted with "
                f"`saved_tensors_hooks`, each storage once, parameters left out), p = {p}, m = {m}:\n\n"
                + "\n".join(rows) + f"\n\nOn stage 0 GPipe holds {r0:.1f}× the bytes 1F1B holds: it keeps all "
                f"{m} micro-batches' activations until the backwards start, 1F1B at most {o['in_flight'][0]} "
                f"(m/p = {m / p:.1f}). Both schedules have the same bubble; 1F1B buys memory, not time.")


def torch_pipelining_note(result: dict) -> Note:
    """Whether torch.distributed.pipelining ran here, and its loss against the plain send/recv pipeline's."""
    api = result.get("torch_pipelining") if result.get("ok") else None
    if not api:
        why = result.get("torch_pipelining_why")
        return Note("torch.distributed.pipelining was not tried in this run" + (f": {why}" if why else "."))
    parts = []
    for name, res in api.items():
        label = "ScheduleGPipe" if name == "gpipe" else "Schedule1F1B"
        if not res["ok"]:
            parts.append(f"`{label}` failed here: {res['error']}.")
            continue
        plain = find_run(result, name, res["m"])["loss"]
        parts.append(f"`{label}` (m = {res['m']}): loss {res['loss']:.6f}, the plain pipeline's {plain:.6f} "
                     f"(difference {abs(res['loss'] - plain):.1e}).")
    return Note("torch.distributed.pipelining on " + _device_words(result) + ": " + " ".join(parts))
