"""How often to checkpoint (taught in chapter 11): the cost of saving against the work a failure throws away.

    lr.interval.young_daly(save_s=20.0, mtbf_s=lr.interval.cluster_mtbf(1024))   # seconds between saves
    lr.interval.expected_overhead(interval_s, save_s, mtbf_s, restart_s)       # fraction of wall time lost
    lr.interval.overhead_chart(save_s, mtbf_s)                                 # that fraction against the interval

Pure arithmetic, instant. The optimum is J. W. Young's first-order one, "A first order approximation to the
optimum checkpoint interval", Communications of the ACM 17(9), 1974: sqrt(2 * save time * MTBF). J. T. Daly,
"A higher order estimate of the optimum checkpoint interval for restart dumps", Future Generation Computer
Systems 22(3), 2006, refined it (``daly``); for a save time far below the MTBF the two agree.

The MTBF comes from a published failure count (``LLAMA3``) scaled to the learner's GPU count, or from the
learner's own figure (``FailureFigure``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...base.runtime import ConfigError
from ...engine.config import real, whole

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
