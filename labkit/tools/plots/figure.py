"""The figure plumbing every labkit chart shares: THE figure maker (``new_figure``), PNG bytes, the
course's colours and text sizes, the inputs a chart accepts, and the small helpers that keep a chart
readable (plain tick numbers, keys as coloured words, titles); and the words about runs that the
charts and the panel share (a run's short label, ratios to a baseline and their sentences). Nothing
here draws a quantity.
"""
from __future__ import annotations

import io
import math
import textwrap

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import AutoLocator, FuncFormatter, MaxNLocator, ScalarFormatter

from ...base import phrases
from ...base.numfmt import number
from ...base.schema import summary_of  # noqa: F401 -- the charts read a run through it
from ...engine import checkpointing
from ...engine.config import defaults
from ...engine.measure import mfu_impossible
from ..timing import records_of  # the one reading of a run's records

# The charts' words: the "## Charts" section of notebooks/lab_messages.md (key: the placeholders filled),
# said when a chart is drawn, in the language chosen then.
WORDS = phrases.load_section("lab_messages.md", "Charts", {
    "per-update": ("title",), "no-updates": (), "data-wait": (), "compute": (), "optimizer": (), "step-time": (),
    "median": ("value",), "tokens-per-s": (), "no-mfu": (), "no-peak": (), "hfu-dashed": (), "above-peak": (),
    "utilization": (), "no-ddp": (), "per-update-left": (), "cumulative": ("total",), "allreduce": (), "loss": (),
    "loss-and-scale": (), "nan-loss": (), "skipped-update": (), "grad-scale": (), "peak-so-far": ("unit",),
    "breakdown-later": (), "no-run": (), "memory": (), "memory-by-kind": ("unit",), "param_bytes": (),
    "grad_bytes": (), "optimizer_bytes": (), "activation_bytes": (), "autocast_weight_copy_bytes": (),
    "measured-peak": (), "no-peak-counter": (), "no-finished-runs": (), "ratio-title": ("baseline",),
    "ratio-title-more": ("baseline", "shown", "others", "hidden"), "baseline-run": ("name",), "thread": ("n",),
    "threads": ("n",), "cpu-thread": ("n",), "cpu-threads": ("n",), "chart-mfu": (), "this-measured": (),
    "predicted-bar": ("device",), "reference-bar": ("device",),
    "no-run-pick-gpu": (), "predicted-ms": ("ms",), "whatif-title": (), "no-reference": (), "yours": ("device",),
    "step-time-s": (), "ratio-tokens_per_s": (), "ratio-activation_bytes": (), "ratio-peak_mem_bytes": (),
    "ratio-mfu": (), "ratio-allreduce_calls_per_update": (), "ratio": ("ratio", "what"),
    "mfu-own-peak": ("precision", "flops", "base_precision", "base_flops"), "mfu-not-compared": (),
    "nothing": (), "both-threads": ("threads",), "other-threads": ("threads", "baseline"), "run-baseline": (),
    "same-knobs": (), "unknown": (), "unit-tokens": (), "unit-step": (), "unit-cpu-s": (), "unit-bytes": (),
    "ab-same": ("b",), "ab-higher": ("b",), "ab-lower": ("b",), "ab-interval": ("ratio", "low", "high"),
    "ab-no-verdict": ("a", "b"), "ab-so-far": ("ratio",), "ab-title": ("what", "interval"),
    "ab-title-busy": ("what", "interval")})
say = WORDS.say


def threads(n, cpu: bool = False) -> str:
    """'1 thread', '2 threads' ('2 CPU threads' with ``cpu``), in the learner's language."""
    if cpu:
        return say("cpu-thread" if n == 1 else "cpu-threads", n=n)
    return say("thread" if n == 1 else "threads", n=n)


# One colour per quantity, the same in every chart.
COLORS = {
    "data_wait_s": "#e8a33d", "compute_s": "#4c72b0", "optimizer_s": "#55a868",
    "param_bytes": "#4c72b0", "grad_bytes": "#dd8452", "optimizer_bytes": "#55a868",
    "activation_bytes": "#c44e52", "autocast_weight_copy_bytes": "#8172b3",
    "peak": "#222222", "mfu": "#4c72b0", "hfu": "#c44e52", "loss": "#4c72b0", "scale": "#8172b3",
}
# Text sizes in points. Every figure here is drawn at DPI dots per inch and shown at its own size (the
# notebook's output area, about 800-900 px wide, holds it unscaled): 8 pt at 90 dpi is 10 px, the
# smallest a learner reads comfortably.
DPI = 90
FONT = 8
TITLE = 9


# ---- inputs --------------------------------------------------------------------------------

def _values(records, key):
    return [r.get(key) for r in records]


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and not math.isfinite(v))


# ---- ticks ---------------------------------------------------------------------------------

def _plain_ticks(axis, suffix=""):
    """Tick labels through ``number``: matplotlib's own would switch to 1e6 offsets or 10^k."""
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: number(v, 6) + suffix))  # ticks are round already


def log_ticks(lo: float, hi: float, most: int = 7) -> list:
    """Ticks for a log axis from ``lo`` to ``hi``: the densest of 1…9, 1-2-5, 1-3 and 1 per decade that
    gives at most ``most`` ticks -- so a range inside one decade still gets several labels, a wide one no
    crowd."""
    if not (lo > 0 and hi > lo):
        return []
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks = []
    for mantissas in (tuple(range(1, 10)), (1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0**e for e in decades for m in mantissas if lo <= m * 10.0**e <= hi]
        if len(ticks) <= most:
            return ticks
    return ticks


# ---- figure plumbing ---------------------------------------------------------------------

class LabFigure(Figure):
    """A matplotlib Figure that shows itself as a PNG in a notebook even where pyplot was never
    imported (without pyplot no notebook backend registers a display for figures)."""

    def _repr_png_(self):
        return to_png(self)


def new_figure(width=4.0, height=2.8, dpi=DPI, layout="constrained") -> Figure:
    """THE figure maker of the course: a Figure ``width`` x ``height`` inches with a canvas of its own,
    shown as a PNG in a notebook (``fig.subplots(1, n)`` for axes)."""
    fig = LabFigure(figsize=(width, height), dpi=dpi, layout=layout)
    FigureCanvasAgg(fig)  # a canvas of its own: no pyplot, no backend switching
    return fig


def _axes(ax, width=4.0, height=2.8):
    """The figure and axes to draw on: ``ax``'s own, or a new figure of this size with one axes."""
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(width, height)
    return fig, fig.add_subplot()


def to_png(fig: Figure, dpi=None) -> bytes:
    """The figure as PNG bytes (what the panel puts into its Image widgets)."""
    buf = io.BytesIO()
    # Light compression: these PNGs travel to a local browser; encoding time matters more than size.
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


class NoChart(str):
    """One line of text standing in for a chart that would have nothing to compare: a notebook shows
    it as a line of text, not as a quoted string; anywhere else it is a plain str."""

    def __repr__(self):
        return str(self)

    def _repr_markdown_(self):
        return f"*{self}*"


def _note(ax, text):
    """Say in words why a chart is empty, rather than drawing empty axes."""
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=FONT, color="#555555",
            transform=ax.transAxes)


def _key(ax, entries, loc="upper right"):
    """A colour key as coloured words in a corner: a legend box costs several times more to draw, and
    the live charts are redrawn while the run goes."""
    right, top = loc.endswith("right"), loc.startswith("upper")
    for i, (text, color) in enumerate(entries):
        ax.text(0.98 if right else 0.02, (0.97 - 0.1 * i) if top else (0.03 + 0.1 * i), text,
                color=color, fontsize=FONT, fontweight="bold", ha="right" if right else "left",
                va="top" if top else "bottom", transform=ax.transAxes)


def _headroom(n_keys: int) -> float:
    """How far above the data the y axis must reach so that ``n_keys`` lines of a top key clear it."""
    return 1 / max(0.25, 1 - 0.1 * n_keys - 0.08)


def _wrap(text, width):
    return textwrap.fill(str(text), width, break_long_words=False)


def _bytes_unit(values):
    top = max([v for v in values if _ok(v)] or [0])
    return (2**30, "GiB") if top >= 2**30 else (2**20, "MiB") if top >= 2**20 else (2**10, "KiB")


def _live_axes(data, ax):
    """The figure, axes and records of a per-update chart; with no records yet the axes say so."""
    fig, ax = _axes(ax)
    recs = records_of(data)
    if not recs:
        _note(ax, say("no-updates"))
    return fig, ax, recs


def _finish(ax, title, per_update=True):
    """Title (with the unit: axis labels would cost a redraw more text) and few, small tick labels --
    text is most of what a redraw costs."""
    ax.set_title(say("per-update", title=title) if per_update else title, fontsize=TITLE)
    ax.tick_params(labelsize=FONT)
    ax.yaxis.set_major_locator(MaxNLocator(4))
    if isinstance(ax.yaxis.get_major_formatter(), ScalarFormatter):  # not labels a chart set itself
        _plain_ticks(ax.yaxis)
    if per_update:
        # Updates are whole numbers; min_n_ticks=1 keeps them whole when one update is drawn (the
        # locator's default falls back to 0.96, 0.98, ... when fewer than two integers are in view).
        ax.xaxis.set_major_locator(MaxNLocator(4, integer=True, min_n_ticks=1))


def wipe(ax) -> None:
    """Remove what a chart function drew on ``ax`` (and its twin), keeping the axes themselves."""
    for a in (ax, getattr(ax, "_labkit_twin", None)):
        if a is None:
            continue
        for container in list(a.containers):  # bar groups: the legend would still list them
            container.remove()
        for artist in list(a.lines) + list(a.patches) + list(a.collections) + list(a.texts):
            artist.remove()
        if a.get_legend() is not None:
            a.get_legend().remove()
        a.set_title("")
        a.set_ylabel("")
        for axis in (a.xaxis, a.yaxis):
            axis.set_major_locator(AutoLocator())
            axis.set_major_formatter(ScalarFormatter())
        a.relim()
        a.set_autoscale_on(True)
    if getattr(ax, "_labkit_twin", None) is not None:
        ax._labkit_twin.set_visible(False)


def _twin(ax):
    """A right-hand y axis sharing x, made once per axes and reused across redraws."""
    tw = getattr(ax, "_labkit_twin", None)
    if tw is None:
        tw = ax._labkit_twin = ax.twinx()
    tw.set_visible(True)
    return tw


# ---- run labels and ratios in words (the charts' and the panel's) --------------------------------

# Knobs a run label may mention, in the order a learner thinks of them.
LABEL_KNOBS = ("model", "precision", "loss_scaling", "accum", "micro_batch", "checkpointing", "checkpoint_every",
         "optimizer", "workers", "pin_memory", "data_cost_ms", "world_size", "ddp_sync", "memory_budget_gb")
# What the comparison chart and the ratio sentences show: (summary key, words)
# No step time: runs with other accumulation, micro-batch or world size do different work per update, so
# their step times are not like for like; tokens/s is (its inverse is the time per token).
RATIO_METRICS = (("tokens_per_s", "tokens/s"), ("activation_bytes", "activation memory"),
           ("peak_mem_bytes", "peak memory"), ("mfu", "MFU"), ("allreduce_calls_per_update", "AllReduce calls/update"))
# (the words here are English; a learner reads the "ratio-KEY" item of the Charts section: ``metric_words``)


def metric_words(key: str) -> str:
    """A ratio metric's words in the learner's language ("tokens/s", "activation memory", ...)."""
    return say(f"ratio-{key}")


# The comparison chart shows the baseline and at most this many later runs (the table lists them all):
# a chart of 300 runs is unreadable, and its legend squeezed the axes to nothing.
COMPARE_LAST = 6


def run_label(summary, baseline=None) -> str:
    """Short words for a run: the knobs that differ from ``baseline`` (or from Config's defaults). A
    ``"label"`` you put into a summary yourself wins."""
    if not summary:
        return "?"
    if summary.get("label"):
        return str(summary["label"])
    ref = baseline or _DEFAULTS
    parts = []
    for k in LABEL_KNOBS + (("steps",) if baseline else ()):  # against a baseline, a different length matters too
        v = summary.get(k)
        if k == "checkpoint_every" and not _every_k_matters(summary.get("checkpointing")):
            continue  # e.g. selective checkpointing wraps every block whatever k says
        if k in summary and v != ref.get(k):
            parts.append(str(v) if k in ("precision", "model") else f"{k}={v}")
    return " ".join(parts) or (say("run-baseline") if baseline is None else say("same-knobs"))


# Config's own defaults: what a run label leaves unsaid (a copy typed here had drifted before).
_DEFAULTS = defaults()


def _every_k_matters(mode) -> bool:
    """Whether ``checkpoint_every`` changes what checkpointing ``mode`` does, asked of the engine's own
    policies (full and attention wrap every k-th block): block 1 is wrapped with k = 1 but not with k = 2."""
    return any((wrap(mode, 1, 1) is None) != (wrap(mode, 2, 1) is None)
               for wrap in (checkpointing.wrap_fn, checkpointing.core_wrap_fn))


def ratios(results, baseline=0, only=None) -> list:
    """For every run (or the indices in ``only``): {"index", "label", metric: value / baseline's value,
    ...}; None where either is missing."""
    summaries = [summary_of(r) for r in results]
    base = summaries[baseline]
    out = []
    for i in (range(len(summaries)) if only is None else only):
        s = summaries[i]
        row = {"index": i, "label": run_label(s, base) if i != baseline else run_label(s)}
        for key, _ in RATIO_METRICS:
            a, b = s.get(key), base.get(key)
            row[key] = a / b if _ok(a) and _ok(b) and b else None
        if mfu_impossible(s.get("mfu")) or mfu_impossible(base.get("mfu")):
            row["mfu"] = None  # an MFU above 1 is not a measurement: no ratio of it either
            row["mfu_wrong"] = True
        out.append(row)
    return out


def cpu_threads(summary):
    """The intra-op threads a CPU run used; None on a GPU (there the CPU threads barely matter)."""
    s = summary_of(summary) or {}
    return s.get("intra_op_threads") if s.get("device") == "cpu" else None


def threads_words(summary, base) -> str:
    """' (both at 2 CPU threads)', or a warning when the thread count differs: a bf16 speed-up was 9.5x
    at one thread and 4.9x at two on the same CPU, so a speed-up means little without it."""
    a, b = cpu_threads(summary), cpu_threads(base)
    if a is None or b is None:
        return ""
    if a == b:
        return " " + say("both-threads", threads=threads(a, cpu=True))
    return " " + say("other-threads", threads=threads(a, cpu=True), baseline=b)


def flops_words(v) -> str:
    """A FLOP/s rate in words a learner reads: '0.43 GFLOP/s', '989 TFLOP/s'."""
    if not _ok(v) or not v:
        return say("unknown")
    return f"{number(v / 1e12)} TFLOP/s" if v >= 1e12 else f"{number(v / 1e9)} GFLOP/s"


def _mfu_words(s, base) -> str:
    """Why an MFU ratio can fall while tokens/s rises: each run's MFU is against its own format's peak."""
    if s.get("precision") == base.get("precision"):
        return ""
    return " " + say("mfu-own-peak", precision=s.get("precision"), flops=flops_words(s.get("peak_flops")),
                     base_precision=base.get("precision"), base_flops=flops_words(base.get("peak_flops")))


def ratio_lines(results, baseline=0, only=None) -> list:
    """One sentence per run (or per index in ``only``), e.g. 'bf16: 2.1× tokens/s, 0.52× activation
    memory, 0.28× MFU (MFU is measured against each format's own peak: ...) (both at 2 CPU threads)'."""
    summaries = [summary_of(r) for r in results]
    base = summaries[baseline]
    lines = []
    for row in ratios(results, baseline, only):
        if row["index"] == baseline:
            continue
        s = summaries[row["index"]]
        parts = [say("ratio", ratio=number(row[k], 2), what=metric_words(k))
                 + (_mfu_words(s, base) if k == "mfu" else "") for k, _ in RATIO_METRICS if row[k] is not None]
        if row.get("mfu_wrong"):
            parts.append(say("mfu-not-compared"))  # MFU_WRONG, in words
        lines.append(f"{row['label']}: " + (", ".join(parts) or say("nothing")) + threads_words(s, base))
    return lines


def shown_runs(n_runs: int, baseline=0, last=COMPARE_LAST) -> list:
    """Which runs a comparison chart shows: the baseline and the ``last`` latest others, in order."""
    later = [i for i in range(n_runs) if i != baseline][-last:] if last else []
    return sorted(set(later) | {baseline})
