"""Chapter 10's pipeline charts and sentences (taught in chapter 10): the measured timeline of one step, the
measured bubble against (p-1)/(m+p-1), and the words about both and about GPipe's and 1F1B's activation
memory -- each from a ``pipeline.pipeline_demo`` result, never a typed number.

    display(plot_pipeline(demo, "gpipe", 4)); display(bubble_note(demo)); display(memory_note(demo))
"""
from __future__ import annotations

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
    ax.plot(ms, [r["replayed"]["bubble"] for r in runs], "^:", color="#4c72b0", label="replayed (free cores)")
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


def _load_words(result) -> str:
    """What else ran on this machine's cores while the stages did (the 1-minute load average)."""
    load, cores = result["load"], result["cores"]
    if result["device"] == "cuda" or load < cores:
        return ""
    return (f" The machine's load average was {load:.1f} on {cores} cores: other processes shared the cores. A "
            "stage descheduled in the middle of an action stretches it (counted busy) and makes its neighbour "
            "wait (counted idle), so the measured share can land on either side of the schedule's own. The replay "
            "column is what the measured median compute times give in this schedule with nothing else running.")


def _cost_words(cost, p) -> str:
    """How unequal the stages' costs (a forward plus a backward of one micro-batch, median) were."""
    heavier = max(range(p), key=lambda s: cost[s])
    ms = ", ".join(f"{c * 1e3:.1f}" for c in cost)
    if max(cost) < 1.1 * min(cost):
        return (f"A forward and a backward of one micro-batch took about the same on every stage ({ms} ms, "
                "median), as the formula assumes.")
    return (f"A forward and a backward of one micro-batch took {ms} ms on stages 0 to {p - 1} (median)"
            + (": the last stage also runs the head and the loss" if heavier == p - 1 else "")
            + ". The formula assumes stages of equal cost; with unequal ones the faster stages wait for the "
              "slowest every micro-batch, which the replay includes.")


def bubble_note(result: dict, schedule: str = "gpipe") -> Note:
    """A table of the measured bubble against the formula per m, and what the stages' costs did to it."""
    if not result.get("ok"):
        return Note(f"The pipeline did not run here: {result.get('error')}.")
    runs = sorted((r for r in result["runs"] if r["schedule"] == schedule), key=lambda r: r["m"])
    if not runs:
        raise ConfigError("schedule", schedule, "a schedule the demo ran")
    p = result["stages"]
    head = ("| m | measured (mean of stages) | " + " | ".join(f"stage {s}" for s in range(p))
            + " | median of the steps | replayed | (p-1)/(m+p-1) | step (ms) |")
    rows = [head, "|" + "---|" * (p + 6)]
    rows += [f"| {r['m']} | **{r['bubble']:.2f}** | " + " | ".join(f"{b:.2f}" for b in r["stage_bubble"])
             + f" | {r['bubble_median']:.2f} | {r['replayed']['bubble']:.2f} | {r['formula']:.2f} | "
               f"{r['step_s'] * 1e3:.1f} |" for r in runs]
    last = runs[-1]
    cost = [f + b for f, b in zip(last["forward_s"], last["backward_s"])]
    lines = [f"{'GPipe' if schedule == 'gpipe' else '1F1B'} on {_device_words(result)}, {result['micro_batch']} "
             f"sequences per micro-batch; the fastest of {last['repeats']} timed steps after a warm-up (the one "
             "least disturbed by other processes), the median beside it. Idle share = (step - time computing) / "
             "step, per stage; waiting for and posting sends count as idle. That is the step definition, "
             "(p-1)/(m+p-1); Megatron-LM's (p-1)/m divides by the ideal time instead.", "", *rows, "",
             _cost_words(cost, p) + _load_words(result)]
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
        return Note("torch.distributed.pipelining was not tried in this run.")
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
