"""Two risks of a long run (taught in chapter 11): loss spikes, and how often to checkpoint.

Loss spikes: notice a loss far above its recent median, then skip the update or roll back to the
last checkpoint and leave the batch out -- measured on labkit's GPT, one injected cause per run:

* ``"batch"``: update ``spike_at`` gets a batch of random bytes instead of text. Its OWN loss is
  the spike, seen before the update is applied: skipping it is enough.
* ``"lr"``: update ``spike_at`` is applied at ``lr_factor`` times the learning rate (a transient
  fault: a rollback's replay does not meet it again). The NEXT loss shows the damage: only a
  rollback undoes it.

    guard = lr.spikes.SpikeGuard(window=10, factor=1.5, action="skip")
    res = lr.spikes.spike_demo(model="tiny", updates=60, spike_at=30)

How often to checkpoint: saving's cost against the work a failure throws away -- Young's optimum
sqrt(2 * save time * MTBF) (CACM 17(9), 1974), Daly's refinement (FGCS 22(3), 2006), the expected
overhead, a job's MTBF from a published failure count (``LLAMA3``) or the learner's own.

    lr.spikes.young_daly(save_s=20.0, mtbf_s=lr.spikes.cluster_mtbf(1024))   # seconds between saves
"""
from __future__ import annotations

import collections
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ...base.runtime import ConfigError
from ...engine.config import PRESETS, _choice, real, whole
from ...engine.data import ByteWindows, corpus_path
from ...engine.device import intra_op_threads
from ...engine.model import GPT, VOCAB

ACTIONS = ("skip", "rollback")
CAUSES = ("batch", "lr")
RUNS = ("none", "skip", "rollback")  # no guard, then the guard with each action


class SpikeGuard:
    """Decides per update whether its loss is a spike: above ``factor`` x the median of the last ``window``
    accepted losses. No decision until the window is full (the warm-up; an early loss that falls fast would
    otherwise make every comparison moot), except that an inf/NaN loss is always a spike. A spike does not
    join the window: it must not raise the bar for the next one. ``action`` is what the loop then does.
    Shown in 11_long_runs_and_failures (code-11-spike)."""

    def __init__(self, window: int = 10, factor: float = 1.5, action: str = "skip"):
        if whole("window", window) < 3:
            raise ConfigError("window", window, "3 or more losses (a median of fewer is one loss)")
        if real("factor", factor, strict=True, allowed="a factor > 1") <= 1.0:
            raise ConfigError("factor", factor, "a factor > 1 (1 would call half of all losses spikes)")
        _choice("action", action, ACTIONS)
        self.window, self.factor, self.action = window, float(factor), action
        self.recent = collections.deque(maxlen=window)

    def threshold(self) -> float | None:
        """The loss above which the next one is a spike; None during the warm-up."""
        if len(self.recent) < self.window:
            return None
        return self.factor * statistics.median(self.recent)

    def is_spike(self, loss: float) -> bool:
        if isinstance(loss, bool) or not isinstance(loss, (int, float)):
            raise ConfigError("loss", loss, "a number (e.g. loss.item())")
        if not math.isfinite(loss):
            return True  # inf/NaN: a spike even in the warm-up
        limit = self.threshold()
        if limit is not None and loss > limit:
            return True
        self.recent.append(float(loss))
        return False


# ---- what the chapter shows: the loop a learner writes at work -------------------------------------------

def train_with_guard(model, optimizer, batch_for, lr_at, updates, guard, save_every, ckpt_dir):
    """Train ``updates`` updates, saving every ``save_every``. A loss the guard calls a spike is not trained on
    ("skip"), or the run goes back to the last checkpoint from BEFORE that update and leaves its batch out
    ("rollback"). Returns ({update: loss trained on}, [(update, loss, action, rolled back to)]).
    Shown in 11_long_runs_and_failures (code-11-spike)."""
    losses, events, saved, left_out, judged = {}, [], [], set(), -1
    step = 0
    while step < updates:
        if step % save_every == 0 and step not in saved:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       os.path.join(ckpt_dir, f"{step}.pt"))
            saved.append(step)
        if step in left_out:  # the batch a rollback left out
            step += 1
            continue
        x, y = batch_for(step)
        loss = model(x, y)
        if guard is not None and step > judged:  # a replayed update was judged the first time
            judged = step
            if guard.is_spike(loss.item()):
                if guard.action == "skip":
                    events.append((step, loss.item(), "skip", None))
                    step += 1
                    continue  # no backward, no optimizer step: the weights stay as they were
                # the weights that made this loss may be the damage: go back to a checkpoint from before them
                back = max(s for s in saved if s < step)
                state = torch.load(os.path.join(ckpt_dir, f"{back}.pt"), weights_only=True)
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                events.append((step, loss.item(), "rollback", back))
                left_out.add(step)
                step = back
                continue
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses[step] = loss.item()
        step += 1
    return losses, events


# ---- plumbing: the demo's data, faults and runs -----------------------------------------------------------

def _batches(spec, micro_batch, updates, seed):
    """Every update's batch, fixed in advance (a function of the update alone), plus evaluation batches."""
    ds = ByteWindows(corpus_path(None), spec.seq_len)

    def batch(g):
        idx = torch.randint(0, len(ds), (micro_batch,), generator=g).tolist()
        xs, ys = zip(*(ds[i] for i in idx))
        return torch.stack(xs), torch.stack(ys)

    g = torch.Generator().manual_seed(seed)
    train = [batch(g) for _ in range(updates)]
    g_eval = torch.Generator().manual_seed(seed + 1_000_003)
    return train, [batch(g_eval) for _ in range(4)]


def _random_bytes(spec, micro_batch, seed):
    g = torch.Generator().manual_seed(seed + 7)
    t = torch.randint(0, VOCAB, (micro_batch, spec.seq_len + 1), generator=g)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


@torch.no_grad()
def _eval(model, batches) -> float:
    return sum(float(model(x, y)) for x, y in batches) / len(batches)


def _one_run(spec, seed, train, evals, cause, spike_at, lr, lr_factor, guard, save_every, ckpt_dir):
    """One training run: the fault (or none) and the guard (or none); its losses, events, final eval loss."""
    torch.manual_seed(seed)
    model = GPT(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    corrupt = _random_bytes(spec, train[0][0].shape[0], seed) if cause == "batch" else None
    fired = []  # the lr fault is transient: once per run, not again when a rollback replays its update

    def batch_for(step):
        return corrupt if cause == "batch" and step == spike_at else train[step]

    def lr_at(step):
        if cause == "lr" and step == spike_at and not fired:
            fired.append(step)
            return lr * lr_factor
        return lr

    t0 = time.perf_counter()
    losses, events = train_with_guard(model, opt, batch_for, lr_at, len(train), guard, save_every, ckpt_dir)
    seconds = time.perf_counter() - t0
    redone = sum(step - back for step, _, action, back in events if action == "rollback")
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"losses": losses, "events": events, "final": _eval(model, evals), "seconds": seconds, "params": params,
            "redone": redone, "trained": len(losses), "threshold": guard.threshold() if guard else None}


@dataclass
class SpikeResult:
    """What ``spike_demo`` measured: ``clean`` is the run with no fault (guarded: ``clean['events']`` are its
    false alarms); ``runs[cause][run]`` for run in ("none", "skip", "rollback") holds ``losses`` ({update:
    loss trained on}), ``events`` ([(update, loss, action, rolled back to)]), ``final`` (the mean loss of 4
    held-out batches after training), ``seconds``, ``redone`` (updates a rollback did again), ``trained`` and
    ``params`` (the final parameters, flattened)."""

    model: str
    micro_batch: int
    updates: int
    spike_at: int
    save_every: int
    window: int
    factor: float
    lr: float
    lr_factor: float
    causes: tuple
    clean: dict
    runs: dict = field(default_factory=dict)
    seconds: float = 0.0


def _check(model, micro_batch, updates, spike_at, causes, window, factor, save_every, lr, lr_factor, seed):
    _choice("model", model, tuple(PRESETS))
    whole("micro_batch", micro_batch)
    whole("updates", updates)
    SpikeGuard(window, factor)  # the guard's own checks
    if whole("spike_at", spike_at, 0) < window or spike_at >= updates - 1:
        raise ConfigError("spike_at", spike_at, f"an update from window={window} (the guard's warm-up) to "
                          f"updates - 2 = {updates - 2} (the lr fault shows one update later)")
    if not isinstance(causes, (tuple, list)) or not causes:
        raise ConfigError("causes", causes, "a non-empty tuple of " + ", ".join(CAUSES))
    for c in causes:
        _choice("causes", c, CAUSES)
    whole("save_every", save_every)
    real("lr", lr, strict=True, allowed="a learning rate > 0")
    real("lr_factor", lr_factor, strict=True, allowed="a factor > 0")
    whole("seed", seed, 0)


def spike_demo(model: str = "tiny", micro_batch: int = 4, updates: int = 60, spike_at: int = 30,
               causes=CAUSES, window: int = 10, factor: float = 1.5, save_every: int = 10, lr: float = 1e-3,
               lr_factor: float = 100.0, seed: int = 0) -> SpikeResult:
    """One process, the same batches for every run: a clean run (guarded, to count false alarms), then per
    cause the run with no guard, with "skip" and with "rollback". Checkpoints in a temporary folder."""
    _check(model, micro_batch, updates, spike_at, causes, window, factor, save_every, lr, lr_factor, seed)
    spec = PRESETS[model]
    t0 = time.perf_counter()
    train, evals = _batches(spec, micro_batch, updates, seed)
    args = (spike_at, lr, lr_factor)
    out = SpikeResult(model, micro_batch, updates, spike_at, save_every, window, float(factor), lr, lr_factor,
                      tuple(causes), clean={})
    with intra_op_threads(1):  # a tiny model: more threads only fight over a shared machine's cores
        _all_runs(out, spec, seed, train, evals, args, window, factor, save_every, causes)
    out.seconds = time.perf_counter() - t0
    return out


def _all_runs(out, spec, seed, train, evals, args, window, factor, save_every, causes):
    with tempfile.TemporaryDirectory(prefix="labkit-ch11-") as tmp:
        def run(cause, action, name):
            d = os.path.join(tmp, name)
            os.mkdir(d)
            guard = SpikeGuard(window, factor, action) if action else None
            return _one_run(spec, seed, train, evals, cause, *args, guard, save_every, d)

        out.clean = run(None, "skip", "clean")
        for cause in causes:
            out.runs[cause] = {name: run(cause, None if name == "none" else name, f"{cause}-{name}")
                               for name in RUNS}


# ---- what the chapter draws from a result: rows, figures, a chart (the words are the chapter's) -------------

def spike_rows(res: SpikeResult) -> list:
    """The clean run first (``cause`` None, ``run`` "clean": guarded, so what it flagged are false alarms),
    then per cause and run ("none", "skip", "rollback"): the updates the guard flagged, the updates redone,
    the final held-out loss and its difference from the clean run's."""
    def row(cause, name, r):
        return dict(cause=cause, run=name, flagged=", ".join(str(e[0]) for e in r["events"]) or None,
                    redone=r.get("redone", 0), final=r["final"], vs_clean=r["final"] - res.clean["final"])

    return [row(None, "clean", res.clean)] + [row(cause, name, runs[name]) for cause, runs in res.runs.items()
                                             for name in RUNS]


def outcome(res: SpikeResult, cause: str) -> dict:
    """What the guard and each action did to one cause: the first flagged update and its loss (None: nothing
    flagged), updates skipped and redone, the final losses, ``skip_worse`` (skipping ended further from the
    clean run than no guard, having refused more than one update: the damaged weights kept tripping the guard)
    and ``same_params`` (skip and rollback ended bit for bit the same)."""
    runs = res.runs[cause]
    none, skip, back = runs["none"], runs["skip"], runs["rollback"]
    first = skip["events"][0] if skip["events"] else (None, None)
    return dict(flagged=first[0], flagged_loss=first[1], skipped=len(skip["events"]), redone=back["redone"],
                none=none["final"], skip=skip["final"], rollback=back["final"], clean=res.clean["final"],
                factor=res.factor, window=res.window, spike_at=res.spike_at, lr_factor=res.lr_factor,
                skip_worse=skip["final"] > none["final"] and len(skip["events"]) > 1,
                same_params=bool(torch.equal(skip["params"], back["params"])),
                best=min(("skip", "rollback"), key=lambda a: abs(runs[a]["final"] - res.clean["final"])))


def spike_chart(res: SpikeResult, axes=None):
    """The loss per update for each cause: no guard, skip, rollback (and the clean run), the spikes flagged."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import

    causes = list(res.runs)
    if axes is None:
        _, axes = plt.subplots(1, len(causes), figsize=(7.8, 2.8), sharey=True, squeeze=False)
        axes = axes[0]
    styles = {"none": ("#dd8452", "-", "no guard"), "skip": ("#4c72b0", "-", "guard, skip"),
              "rollback": ("#55a868", "--", "guard, roll back")}
    titles = {"batch": f"random bytes at update {res.spike_at}",
              "lr": f"{res.lr_factor:g}x lr at update {res.spike_at}"}
    lo = max(0, res.spike_at - 2 * res.window)
    for ax, cause in zip(axes, causes):
        clean = sorted(res.clean["losses"].items())
        ax.plot([s for s, _ in clean if s >= lo], [v for s, v in clean if s >= lo], color="grey", lw=1,
                label="clean run")
        for name in RUNS:
            r = res.runs[cause][name]
            pts = sorted(r["losses"].items())
            color, ls, label = styles[name]
            ax.plot([s for s, _ in pts if s >= lo], [v for s, v in pts if s >= lo], color=color, ls=ls, lw=1.4,
                    label=label)
            ev = r["events"]
            if ev:
                ax.plot([e[0] for e in ev], [e[1] for e in ev], "x", color=color, ms=7)
        ax.axvline(res.spike_at, color="crimson", lw=0.8, ls=":")
        ax.set_title(titles.get(cause, cause), fontsize=8)
        ax.set_xlabel("update (x: flagged, not trained on)")
    axes[0].set_ylabel("training loss")
    axes[0].legend(frameon=False, fontsize=7)
    return axes


# ---- how often to checkpoint: pure arithmetic, instant ----------------------------------------------------

DAY_S = 86_400.0


@dataclass(frozen=True)
class FailureFigure:
    """A failure count observed on a cluster: ``interruptions`` unexpected job interruptions in ``days`` days
    on ``gpus`` GPUs, with where the figure comes from."""

    interruptions: int
    days: float
    gpus: int
    source: str
    hardware_share: float | None = None  # the fraction of the interruptions put down to hardware, if stated

    def __post_init__(self):
        whole("interruptions", self.interruptions)
        real("days", self.days, strict=True, allowed="days > 0")
        whole("gpus", self.gpus)
        if not isinstance(self.source, str) or not self.source.strip():
            raise ConfigError("source", self.source, "where the figure comes from (a non-empty string)")
        if self.hardware_share is not None:
            real("hardware_share", self.hardware_share, allowed="a fraction from 0 to 1")
            if self.hardware_share > 1:
                raise ConfigError("hardware_share", self.hardware_share, "a fraction from 0 to 1")

    def per_gpu_rate(self) -> float:
        """Failures per GPU per second: the count spread evenly over every GPU and every second."""
        return self.interruptions / (self.gpus * self.days * DAY_S)

    def per_gpu_mtbf_s(self) -> float:
        """Mean time between failures of ONE GPU, in seconds (the GPU-seconds per interruption)."""
        return 1.0 / self.per_gpu_rate()


# Meta's Llama 3 report: the numbers as published, the rate derived from them (per_gpu_rate), never typed.
# The full citation is chapter 11's markdown: section 3.3.4 and Table 5, 419 unexpected interruptions in a
# 54-day snapshot of pre-training on 16,384 H100 GPUs, about 78 % put down to confirmed or suspected hardware.
LLAMA3 = FailureFigure(interruptions=419, days=54, gpus=16_384, hardware_share=0.78,
                       source="arXiv:2407.21783 (Llama 3) §3.3.4")


def _positive(name, value) -> float:
    return real(name, value, strict=True, allowed="a finite number of seconds > 0")


def cluster_mtbf(gpus: int, figure: FailureFigure = LLAMA3) -> float:
    """Seconds between failures of a job on ``gpus`` GPUs: a job stops when ANY of its GPUs fails, so with
    independent failures at the figure's per-GPU rate the rates add up: MTBF = per-GPU MTBF / gpus."""
    whole("gpus", gpus)
    if not isinstance(figure, FailureFigure):
        raise ConfigError("figure", figure, "a FailureFigure(interruptions=, days=, gpus=, source=), e.g. LLAMA3")
    return figure.per_gpu_mtbf_s() / gpus


def young_daly(save_s: float, mtbf_s: float) -> float:
    """The checkpoint interval (seconds of work between saves) that loses the least time, to first order.
    Shown in 11_long_runs_and_failures (code-11-young-daly)."""
    save_s, mtbf_s = _positive("save_s", save_s), _positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s)  # minimises save_s / T + T / (2 * mtbf_s)


def daly(save_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order estimate of the same interval; the MTBF itself once saving takes 2 MTBFs."""
    save_s, mtbf_s = _positive("save_s", save_s), _positive("mtbf_s", mtbf_s)
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    r = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - save_s


def expected_overhead(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """The fraction of wall time lost, to first order, when saving every ``interval_s`` seconds of work:
    ``save_s / interval_s`` spent saving, plus per failure (one every ``mtbf_s`` on average) half an interval
    of work redone and ``restart_s`` to relaunch and load: ``(interval_s / 2 + restart_s) / mtbf_s``.

    The model's assumptions: failures are independent and arrive at a constant rate (exponential times between
    them), a failure is as likely at any moment of an interval (so half of one is lost on average), the save
    blocks training and takes far less than the interval, and a failure during a save or a restart is
    neglected. It is a prediction: where these fail (a save comparable to the interval, an MTBF of a few
    intervals) Daly's higher-order estimate is closer. Shown in 11_long_runs_and_failures (code-11-young-daly)."""
    interval_s = _positive("interval_s", interval_s)
    save_s, mtbf_s = _positive("save_s", save_s), _positive("mtbf_s", mtbf_s)
    restart_s = real("restart_s", restart_s, allowed="a finite number of seconds >= 0")
    return save_s / interval_s + (interval_s / 2.0 + restart_s) / mtbf_s


def duration(seconds: float) -> str:
    """Seconds as the chapter's tables show them: s, min, h or days, whichever reads best."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / DAY_S:.1f} days"


def overhead_chart(save_s: float, mtbf_s: float, restart_s: float = 0.0, ax=None):
    """Predicted overhead (first-order model) against the checkpoint interval, on a log axis: the cost of
    saving falls, the work lost to failures grows, and their sum is lowest at the Young/Daly interval."""
    import matplotlib.pyplot as plt  # deferred: a chart only, and matplotlib is slow to import
    best = young_daly(save_s, mtbf_s)
    expected_overhead(best, save_s, mtbf_s, restart_s)  # checks restart_s before drawing anything
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.8))
    lo = max(best / 50.0, save_s)
    t = np.geomspace(lo, best * 50.0, 200)
    saving = 100 * save_s / t
    lost = 100 * (t / 2 + restart_s) / mtbf_s
    ax.plot(t, saving + lost, color="#4c72b0", lw=2, label="total overhead, predicted (first-order model)")
    ax.plot(t, saving, color="#55a868", ls="--", lw=1, label="time spent saving")
    ax.plot(t, lost, color="#dd8452", ls="--", lw=1, label="work lost to failures + restarts")
    at_best = 100 * expected_overhead(best, save_s, mtbf_s, restart_s)
    ax.axvline(best, color="grey", lw=0.8)
    ax.plot([best], [at_best], "o", color="#4c72b0")
    ax.annotate(f"Young/Daly: every {duration(best)}\n({at_best:.2f} % lost)", (best, at_best),
                textcoords="offset points", xytext=(8, 14), fontsize=8)
    ax.set_xscale("log")
    ax.set_ylim(0, min(100.0, 4 * at_best))
    ax.set_xlabel("checkpoint interval (seconds of work between saves, log scale)")
    ax.set_ylabel("% of wall time lost")
    ax.set_title(f"Save {duration(save_s)}, MTBF {duration(mtbf_s)}: predicted overhead", fontsize=10)
    ax.legend(frameon=False, fontsize=7, loc="upper center")  # the curve is lowest there
    return ax


# ---- what the chapter draws: rows of figures (the words are the chapter's) ---------------------------------

def mtbf_row(gpus: int, figure: FailureFigure = LLAMA3) -> dict:
    """The published count, the per-GPU MTBF derived from it (GPU-days and years), and the MTBF of a job on
    ``gpus`` GPUs (seconds): a job stops when any of its GPUs fails."""
    per_gpu = figure.per_gpu_mtbf_s()
    return dict(interruptions=figure.interruptions, days=figure.days, figure_gpus=figure.gpus,
                hardware_share=figure.hardware_share, per_gpu_days=per_gpu / DAY_S,
                per_gpu_years=per_gpu / (365 * DAY_S), gpus=gpus, job_mtbf_s=cluster_mtbf(gpus, figure))


INTERVAL_FACTORS = (0.1, 0.5, 1.0, 2.0, 10.0)  # multiples of Young's interval the overhead table shows


def overhead_rows(save_s: float, mtbf_s: float, restart_s: float = 0.0, factors=INTERVAL_FACTORS) -> list:
    """The predicted overhead (first-order model) when saving every ``factor`` x Young's interval: the interval,
    the share spent saving, the share redoing work and restarting, and their sum; then Daly's interval
    (``factor`` None)."""
    best = young_daly(save_s, mtbf_s)
    rows = []
    for factor, t in [(f, f * best) for f in factors] + [(None, daly(save_s, mtbf_s))]:
        saving, lost = save_s / t, (t / 2 + restart_s) / mtbf_s
        rows.append(dict(factor=factor, interval_s=t, saving=saving, lost=lost,
                         overhead=expected_overhead(t, save_s, mtbf_s, restart_s)))
    return rows


def cluster_rows(save_s: float, gpu_counts=(8, 64, 512, 1024, 4096, 16_384), restart_s: float = 0.0,
                 figure: FailureFigure = LLAMA3) -> list:
    """Per GPU count: the job's MTBF, Young's interval and the predicted overhead there (seconds, fractions)."""
    rows = []
    for n in gpu_counts:
        m = cluster_mtbf(n, figure)
        t = young_daly(save_s, m)
        rows.append(dict(gpus=n, mtbf_s=m, interval_s=t, overhead=expected_overhead(t, save_s, m, restart_s)))
    return rows
