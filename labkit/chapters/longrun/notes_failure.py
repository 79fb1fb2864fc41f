"""Chapter 11's sentences, tables and charts about how often to save, surviving a failure and loss spikes (taught
in chapter 11), built from measured values (``restart.failure_demo``, ``spikes.spike_demo``, a measured save time)
and the published failure figure in ``interval.LLAMA3`` -- never typed numbers.

    display(lr.notes_failure.interval_note(save_s, mtbf_s)); lr.notes_failure.failure_timeline_chart(res)
"""
from __future__ import annotations

import torch

from ..course import Note
from . import interval as iv
from .restart import TORCHRUN_COMMAND, TORCHRUN_FLAGS, TORCHRUN_NOTE
from .spikes import RUNS


def _dur(seconds: float) -> str:
    return iv._duration(seconds)


def _s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


# ---- how often ---------------------------------------------------------------------------------------------

def mtbf_note(gpus: int, figure: iv.FailureFigure = iv.LLAMA3) -> Note:
    """Where the job's MTBF comes from: the published count, the per-GPU rate derived from it, the GPU count."""
    per_gpu = figure.per_gpu_mtbf_s()
    job = iv.cluster_mtbf(gpus, figure)
    hw = (f" ({figure.hardware_share:.0%} of them put down to hardware)" if figure.hardware_share is not None
          else "")
    return Note(
        f"The figure: {figure.interruptions:,} unexpected interruptions{hw} in {figure.days:g} days on "
        f"{figure.gpus:,} GPUs -- one interruption per {per_gpu / iv.DAY_S:,.0f} GPU-days, so ONE GPU (with its "
        f"share of hosts, network and software) fails about every {per_gpu / (365 * iv.DAY_S):.1f} years. A job "
        f"stops when any of its GPUs fails; with independent failures at that rate, a job on **{gpus:,} GPUs** "
        f"fails about every **{_dur(job)}** (MTBF = per-GPU MTBF / GPUs). Source: {figure.source}.")


def interval_note(save_s: float, mtbf_s: float, restart_s: float = 0.0, save_words: str = "measured") -> Note:
    """The Young/Daly interval for a save time and an MTBF, the overhead it predicts, and what saving ten times
    more or less often would cost."""
    best = iv.young_daly(save_s, mtbf_s)
    at = iv.expected_overhead(best, save_s, mtbf_s, restart_s)
    often = iv.expected_overhead(best / 10, save_s, mtbf_s, restart_s)
    rarely = iv.expected_overhead(best * 10, save_s, mtbf_s, restart_s)
    restart = f" and a restart of {_dur(restart_s)}" if restart_s else ""
    words = f" ({_dur(best)})" if best >= 120 else ""
    return Note(
        f"With a save of **{_s(save_s)}** ({save_words}) and an MTBF of **{_dur(mtbf_s)}**: "
        f"Young's interval sqrt(2 x {save_s:.3g} s x {mtbf_s:,.0f} s) = **{best:,.0f} s{words}** of work "
        f"between saves (Daly's higher-order estimate: {iv.daly(save_s, mtbf_s):,.0f} s). Predicted (first-order "
        f"model{restart}): **{at:.2%}** of the wall time lost there -- {save_s / best:.2%} saving, "
        f"{(best / 2 + restart_s) / mtbf_s:.2%} redoing work and restarting; saving 10x more often loses "
        f"{often:.2%}, 10x less often {rarely:.2%}. The curve is flat near its minimum: a factor of 2 either side "
        f"costs {iv.expected_overhead(best * 2, save_s, mtbf_s, restart_s) - at:.2%} more.")


def interval_table(save_s: float, gpu_counts=(8, 64, 512, 1024, 4096, 16_384), restart_s: float = 0.0,
                   figure: iv.FailureFigure = iv.LLAMA3) -> Note:
    """The job's MTBF, the Young/Daly interval and its predicted overhead for several GPU counts."""
    rows = []
    for n in gpu_counts:
        m = iv.cluster_mtbf(n, figure)
        t = iv.young_daly(save_s, m)
        rows.append(f"| {n:,} | {_dur(m)} | {_dur(t)} | {iv.expected_overhead(t, save_s, m, restart_s):.2%} |")
    return Note(f"Save {_s(save_s)}, the figure's per-GPU rate:\n\n| GPUs | MTBF of the job | Young/Daly interval | "
                "overhead there (predicted) |\n|---:|---:|---:|---:|\n" + "\n".join(rows))


# ---- surviving a failure -----------------------------------------------------------------------------------

def failure_note(res) -> Note:
    """What the killed-rank demo measured: equality, the redone span, the restart's cost, what was left."""
    same = ("**equal bit for bit** (`torch.equal` on every tensor)" if res.equal else
            f"**NOT equal** (largest difference {res.max_abs_diff:.3g})")
    left = ("no process was left running" if res.left_processes == 0 else
            "psutil is not installed, so the processes left were not counted" if res.left_processes is None else
            f"**{res.left_processes} process(es) were left running**")
    where = "gloo on this machine's CPU" if res.kind == "cpu" else "NCCL, one GPU per rank"
    return Note(
        f"{res.world_size} DDP ranks ({where}) trained the {res.model} GPT ({res.n_params:,} parameters) for "
        f"{res.updates} updates, rank 0 saving every {res.save_every}. In the first attempt {res.killed} at "
        f"update {res.kill_at}{_exit_status(res)}; the other rank's collective failed and every process of that "
        f"attempt was ended "
        f"{_s(res.detect_s)} after the kill. The job was launched again ({res.n_attempts} attempts in all) and "
        f"resumed from the checkpoint of step **{res.resumed_from}**: **{res.redone_updates} "
        f"update{' was' if res.redone_updates == 1 else 's were'} done twice** ({res.kill_at} - "
        f"{res.resumed_from}), {_s(res.lost_s)} of work thrown away in the first attempt "
        f"and {_s(res.redone_s)} spent redoing it. The restart itself took **{_s(res.restart_s)}**: new processes "
        f"{_s(res.spawn_s)} (forked from labkit's warm server, which had imported torch already -- a relaunch "
        f"on a cluster starts fresh Pythons and pays for `import torch` and its own imports too), process group, "
        f"model and DDP {_s(res.setup_s)}, reading and loading the {res.checkpoint_bytes / 2**20:.1f} MiB "
        f"checkpoint {_s(res.load_s)}. One update takes {_s(res.update_s)} here (median, uninterrupted run). "
        f"The final parameters are {same} to the uninterrupted run's, and {left}.")


def _exit_status(res) -> str:
    """How the rank that ended first ended, by its exit status: the restart loop read it once that rank was
    reaped (a survivor's broken connection arrives sooner; it is a consequence, never the one blamed)."""
    first = res.attempts[0] if res.attempts else None
    code = first.exit_codes.get(first.first_rank) if first is not None and first.first_rank is not None else None
    if code in (None, 0):
        return ""
    how = f"signal {-code}, exit code {code} as multiprocessing reports it" if code < 0 else f"exit code {code}"
    return f" -- the rank that ended first, by its exit status ({how})"


def failure_timeline_chart(res, ax=None):
    """The attempts on a time axis: each update rank 0 started, the checkpoints, the kill, the restart gap and
    the span of updates done twice."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 2.8))
    tl = res.timeline
    colors = ("#dd8452", "#4c72b0", "#55a868", "#8172b3")
    for i, a in enumerate(tl["attempts"]):
        ts = [t for _, t in a["updates"]]
        steps = [s for s, _ in a["updates"]]
        ax.step(ts, steps, where="post", color=colors[i % len(colors)], lw=2,
                label=f"attempt {a['number']} ({'finished' if a['ok'] else 'failed'})")
        ax.axvspan(a["began"], ts[0] if ts else a["ended"], color=colors[i % len(colors)], alpha=0.12, lw=0)
    k_step, k_t = tl["kill"]
    ax.plot([k_t], [k_step], "X", color="crimson", ms=10, label=f"rank SIGKILLed at update {k_step}")
    ax.axhspan(res.resumed_from, res.kill_at, color="crimson", alpha=0.10, lw=0,
               label=f"updates done twice ({res.redone_updates})")
    for c in tl["checkpoints"]:
        ax.axhline(c, color="grey", lw=0.6, ls=":")
    ax.set_yticks(tl["checkpoints"], [f"ckpt {c}" for c in tl["checkpoints"]], fontsize=7)
    ax.set_xlabel("seconds since the first launch (shaded: start-up, restart included)")
    ax.set_ylabel("update")
    ax.set_title("A killed rank, the relaunch and the redone work (measured)", fontsize=10)
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    return ax


def torchrun_note() -> Note:
    """The command a real cluster would use, what each flag does, what the script must do itself, and why the
    chapter does not run it."""
    flags = "\n".join(f"- `{flag}`: {words}." for flag, words in TORCHRUN_FLAGS)
    return Note(f"```\n{TORCHRUN_COMMAND}\n```\n\n{flags}\n\nWhat the script must do itself: load the latest "
                "checkpoint when it starts (every restart is a fresh process), write checkpoints atomically, and "
                "make its data a function of the step, so the resumed run sees what the dead one would have. "
                "A failure costs every worker the work since the last checkpoint, not just the one that died.\n\n"
                + TORCHRUN_NOTE)


# ---- loss spikes ------------------------------------------------------------------------------------------

CAUSE_WORDS = {"batch": "a batch of random bytes at update {k}",
               "lr": "update {k} applied at {f:g}x the learning rate (once)"}
RUN_WORDS = {"none": "no guard", "skip": "guard, skip", "rollback": "guard, roll back"}


def spike_table(res) -> Note:
    """Per cause and action: what the guard flagged, updates redone, the final held-out loss against the clean
    run's."""
    rows = []
    for cause, runs in res.runs.items():
        for name in RUNS:
            r = runs[name]
            flagged = ", ".join(str(e[0]) for e in r["events"]) or "--"
            rows.append(f"| {CAUSE_WORDS[cause].format(k=res.spike_at, f=res.lr_factor)} | {RUN_WORDS[name]} | "
                        f"{flagged} | {r['redone']} | {r['final']:.4f} | {r['final'] - res.clean['final']:+.4f} |")
    return Note(f"Clean run (no fault): final held-out loss {res.clean['final']:.4f}, "
                f"{len(res.clean['events'])} false alarm(s).\n\n| injected cause | run | updates flagged | "
                "updates redone | final loss | vs clean |\n|---|---|---|---:|---:|---:|\n" + "\n".join(rows))


def spike_note(res) -> Note:
    """What each action did to each cause, from the measured runs."""
    parts = []
    g = f"{res.factor:g} x the median of the last {res.window} losses"
    for cause, runs in res.runs.items():
        none, skip, back = runs["none"], runs["skip"], runs["rollback"]
        k = res.spike_at
        first = skip["events"][0] if skip["events"] else None
        seen = (f"the guard ({g}) flagged update {first[0]} (loss {first[1]:.2f})" if first else
                f"the guard ({g}) flagged nothing: the spike stayed under its threshold")
        text = f"**{CAUSE_WORDS[cause].format(k=k, f=res.lr_factor)}**: {seen}. "
        if cause == "batch":
            text += ("The spike is that batch's own loss, seen before the update is applied, so skipping it never "
                     "trains on the garbage. ")
        else:
            text += (f"Update {k}'s own loss was normal; the damage showed one update later, once the bad weights "
                     "existed. ")
        text += (f"Final held-out loss: no guard {none['final']:.4f}, skip {skip['final']:.4f} "
                 f"({len(skip['events'])} update(s) skipped), rollback {back['final']:.4f} "
                 f"({back['redone']} update(s) redone); clean run {res.clean['final']:.4f}. ")
        if skip["final"] > none["final"] and len(skip["events"]) > 1:
            text += (f"Skipping ended further from the clean run than no guard at all: the damaged weights' losses "
                     f"stayed above the threshold, so the guard refused {len(skip['events'])} updates -- the very "
                     "updates that would have repaired them. ")
        if torch.equal(skip["params"], back["params"]):
            text += ("Skip and rollback ended with the same parameters, bit for bit: the rollback's replay changed "
                     "nothing but the time it took. ")
        parts.append(text)
    parts.append(
        "labkit's `on_nonfinite` (engine/step.py) acts only on inf/NaN gradients: \"stop\" raises, \"skip\" drops "
        "the update, \"continue\" applies it. A GradScaler does the same for fp16 by itself: a step whose "
        "gradients hold inf/NaN is skipped and the scale halved. Neither ever sees a finite spike like these -- "
        "that needs a guard on the loss.")
    return Note("\n\n".join(parts))


def spike_chart(res, axes=None):
    """The loss per update for each cause: no guard, skip, rollback (and the clean run), the spikes flagged."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import

    causes = list(res.runs)
    if axes is None:
        _, axes = plt.subplots(1, len(causes), figsize=(7.8, 2.8), sharey=True, squeeze=False)
        axes = axes[0]
    styles = {"none": ("#dd8452", "-"), "skip": ("#4c72b0", "-"), "rollback": ("#55a868", "--")}
    lo = max(0, res.spike_at - 2 * res.window)
    for ax, cause in zip(axes, causes):
        clean = sorted(res.clean["losses"].items())
        ax.plot([s for s, _ in clean if s >= lo], [v for s, v in clean if s >= lo], color="grey", lw=1,
                label="clean run")
        for name in RUNS:
            r = res.runs[cause][name]
            pts = sorted(r["losses"].items())
            color, ls = styles[name]
            ax.plot([s for s, _ in pts if s >= lo], [v for s, v in pts if s >= lo], color=color, ls=ls, lw=1.4,
                    label=RUN_WORDS[name])
            ev = r["events"]
            if ev:
                ax.plot([e[0] for e in ev], [e[1] for e in ev], "x", color=color, ms=7)
        ax.axvline(res.spike_at, color="crimson", lw=0.8, ls=":")
        ax.set_title(CAUSE_WORDS[cause].format(k=res.spike_at, f=res.lr_factor), fontsize=8)
        ax.set_xlabel("update (x: flagged, not trained on)")
    axes[0].set_ylabel("training loss")
    axes[0].legend(frameon=False, fontsize=7)
    return axes
