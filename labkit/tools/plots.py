"""Charts for labkit runs: records and results in, matplotlib Figures out. Nothing here trains.

Every function takes what a run produced -- a ``Result``, a dict with ``"records"``/``"summary"``,
or a plain list of records -- and returns a ``matplotlib.figure.Figure``. Pass ``ax=`` to draw
into an axes of your own instead. No pyplot: figures are not registered with any GUI or notebook
backend, so they work in scripts, in tests (Agg) and from the panel's background thread alike.

    fig = labkit.plots.step_time(result)
    open("step_time.png", "wb").write(labkit.plots.to_png(fig))
"""
from __future__ import annotations

import io
import math
import textwrap

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import AutoLocator, FuncFormatter, MaxNLocator, NullLocator, ScalarFormatter

from . import reference as ref
from ..base.numfmt import counted, number  # noqa: F401  (lk.plots.number: the chapters call it by this name)
from ..base.schema import MEMORY_PARTS

# One colour per quantity, the same in every chart.
COLORS = {
    "data_wait_s": "#e8a33d", "compute_s": "#4c72b0", "optimizer_s": "#55a868",
    "param_bytes": "#4c72b0", "grad_bytes": "#dd8452", "optimizer_bytes": "#55a868",
    "activation_bytes": "#c44e52", "autocast_weight_copy_bytes": "#8172b3",
    "peak": "#222222", "mfu": "#4c72b0", "hfu": "#c44e52", "loss": "#4c72b0", "scale": "#8172b3",
}
CHARTS = ("step_time", "memory", "throughput", "utilization", "allreduce", "loss")
# What the comparison chart shows: (summary key, words)
# No step time: runs with other accumulation, micro-batch or world size do different work per update, so
# their step times are not like for like; tokens/s is (its inverse is the time per token).
METRICS = (("tokens_per_s", "tokens/s"), ("activation_bytes", "activation memory"),
           ("peak_mem_bytes", "peak memory"), ("mfu", "MFU"), ("allreduce_calls_per_update", "AllReduce calls/update"))
# Text sizes in points. Every figure here is drawn at DPI dots per inch and shown at its own size (the
# notebook's output area, about 800-900 px wide, holds it unscaled): 8 pt at 90 dpi is 10 px, the
# smallest a learner reads comfortably.
DPI = 90
FONT = 8
TITLE = 9
# The comparison chart shows the baseline and at most this many later runs (the table lists them all):
# a chart of 300 runs is unreadable, and its legend squeezed the axes to nothing.
COMPARE_LAST = 6
# Knobs a run label may mention, in the order a learner thinks of them.
KNOBS = ("model", "precision", "loss_scaling", "accum", "micro_batch", "checkpointing", "checkpoint_every",
         "optimizer", "workers", "pin_memory", "data_cost_ms", "world_size", "ddp_sync", "memory_budget_gb")


# ---- inputs --------------------------------------------------------------------------------

def records_of(data) -> list:
    """The per-update records of a Result, a {"records": ...} dict or a list of records."""
    if data is None:
        return []
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        return list(data.get("records") or [])
    return list(getattr(data, "records", None) or [])


def summary_of(data):
    """The summary dict of a Result or a {"summary": ...} dict; None for a bare list of records."""
    if isinstance(data, dict):
        return data.get("summary") if "summary" in data or "records" in data else data
    return getattr(data, "summary", None)


def _plain_ticks(axis, suffix=""):
    """Tick labels through ``number``: matplotlib's own would switch to 1e6 offsets or 10^k."""
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: number(v, 6) + suffix))  # ticks are round already


def _values(records, key):
    return [r.get(key) for r in records]


def _bars(ax, x, low, high, **kw):
    """Touching bars from ``low`` to ``high`` at each x, drawn as one filled outline: one shape per
    series instead of one per update, so drawing cost does not grow with the run."""
    xs, lo, hi = [], [], []
    for v, a, b in zip(x, low, high):
        xs += [v - 0.5, v + 0.5]
        lo += [a, a]
        hi += [b, b]
    ax.fill_between(xs, lo, hi, linewidth=0, **kw)


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and not math.isfinite(v))


# ---- figure plumbing ---------------------------------------------------------------------

class LabFigure(Figure):
    """A matplotlib Figure that shows itself as a PNG in a notebook even where pyplot was never
    imported (without pyplot no notebook backend registers a display for figures)."""

    def _repr_png_(self):
        return to_png(self)


def new_figure(width=4.0, height=2.8, dpi=DPI, layout="constrained") -> Figure:
    fig = LabFigure(figsize=(width, height), dpi=dpi, layout=layout)
    FigureCanvasAgg(fig)  # a canvas of its own: no pyplot, no backend switching
    return fig


def _axes(ax, width=4.0, height=2.8):
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


def _finish(ax, title, per_update=True):
    """Title (with the unit: axis labels would cost a redraw more text) and few, small tick labels --
    text is most of what a redraw costs."""
    ax.set_title(title + (", per update" if per_update else ""), fontsize=TITLE)
    ax.tick_params(labelsize=FONT)
    ax.yaxis.set_major_locator(MaxNLocator(4))
    if isinstance(ax.yaxis.get_major_formatter(), ScalarFormatter):  # not labels a chart set itself
        _plain_ticks(ax.yaxis)
    if per_update:
        # Updates are whole numbers; min_n_ticks=1 keeps them whole when one update is drawn (the
        # locator's default falls back to 0.96, 0.98, ... when fewer than two integers are in view).
        ax.xaxis.set_major_locator(MaxNLocator(4, integer=True, min_n_ticks=1))


# ---- live charts: one value per optimizer update -----------------------------------------------

def step_time(data, ax=None) -> Figure:
    """Each update's time, stacked: waiting for data, forward+backward compute, optimizer step."""
    fig, ax = _axes(ax)
    recs = records_of(data)
    if not recs:
        _note(ax, "no updates yet")
    else:
        x = _values(recs, "update")
        bottom = [0.0] * len(recs)
        parts = (("data_wait_s", "data wait"), ("compute_s", "compute"), ("optimizer_s", "optimizer"))
        for key, words in parts:
            top = [b + 1000 * (v or 0.0) for b, v in zip(bottom, _values(recs, key))]
            # One filled staircase per part instead of one bar per update: drawing cost stays flat
            # however long the run is.
            _bars(ax, x, bottom, top, color=COLORS[key], label=words)
            bottom = top
        ax.set_ylim(0, (max(bottom) or 1.0) * _headroom(len(parts)))  # head room for the key
        _key(ax, [(words, COLORS[key]) for key, words in reversed(parts)])
    _finish(ax, "Step time (ms)")
    return fig


def throughput(data, ax=None) -> Figure:
    """Tokens per second per update; the dashed line is the median after the first (warm-up) update."""
    fig, ax = _axes(ax)
    recs = records_of(data)
    if not recs:
        _note(ax, "no updates yet")
    else:
        x, y = _values(recs, "update"), _values(recs, "tokens_per_s")
        ax.plot(x, y, marker="o", ms=2, color=COLORS["compute_s"])
        later = sorted(v for v in y[1:] or y if _ok(v))
        if later:
            med = later[len(later) // 2]
            ax.axhline(med, ls="--", lw=1, color="#555555")
            ax.text(0.99, 0.03, f"median {number(med)}", ha="right", fontsize=FONT, transform=ax.transAxes)
        top = max([v for v in y if _ok(v)] or [0])
        ax.set_ylim(0, top * 1.15 or 1.0)  # a lone first point sits below the frame, not on it
    _finish(ax, "Tokens/s")
    return fig


def utilization(data, ax=None) -> Figure:
    """MFU (useful model FLOPs) and HFU (FLOPs the hardware ran, recompute included) in % of peak."""
    fig, ax = _axes(ax)
    recs = records_of(data)
    if not recs or not any(_ok(r.get("mfu")) for r in recs):
        _note(ax, "no MFU yet" if not recs else "no peak FLOP/s known for this device")
    else:
        x = _values(recs, "update")
        for key in ("hfu", "mfu"):
            ax.plot(x, [100 * v if _ok(v) else float("nan") for v in _values(recs, key)], marker="o", ms=2,
                    color=COLORS[key], label=key.upper())
        ax.set_ylim(bottom=0)
        _key(ax, [("HFU", COLORS["hfu"]), ("MFU", COLORS["mfu"])], loc="lower right")
        if any(_ok(r.get("hfu")) and r["hfu"] > 1 for r in recs):  # never silently above the ceiling
            ax.axhline(100, color=COLORS["peak"], lw=0.8, ls="--")
            ax.text(0.02, 0.97, "⚠ above 100 %: faster than the probe that set the peak", color="#c44e52",
                    fontsize=FONT, ha="left", va="top", transform=ax.transAxes)
    _finish(ax, "MFU, HFU (% of peak)")
    return fig


def allreduce(data, ax=None) -> Figure:
    """AllReduce calls DDP launched in each update (bars) and in total so far (line, right axis)."""
    fig, ax = _axes(ax)
    recs = records_of(data)
    calls = _values(recs, "allreduce_calls")
    if not recs or not any(c is not None for c in calls):
        _note(ax, "no updates yet" if not recs else "no DDP here: nothing is all-reduced")
    else:
        x = _values(recs, "update")
        per = [c or 0 for c in calls]
        _bars(ax, x, [0] * len(per), per, color=COLORS["compute_s"], label="per update")
        ax.set_ylim(0, max(per) * 1.6 + 0.5)  # head room for the key
        total, cum = 0, []
        for c in per:
            total += c
            cum.append(total)
        ax2 = _twin(ax)
        ax2.plot(x, cum, color=COLORS["peak"], marker="o", ms=2, label="cumulative")
        ax2.set_ylim(bottom=0)
        ax2.tick_params(labelsize=FONT)
        ax2.yaxis.set_major_locator(MaxNLocator(3, integer=True))
        _plain_ticks(ax2.yaxis)
        _key(ax, [("per update (left)", COLORS["compute_s"]), (f"cumulative: {total} (right)", COLORS["peak"])],
             loc="upper left")
    _finish(ax, "AllReduce calls")
    ax.yaxis.set_major_locator(MaxNLocator(4, integer=True))  # calls are counted: no 0.6 of a call
    return fig


def loss(data, ax=None) -> Figure:
    """Training loss; with an fp16 GradScaler also its scale (right axis, log) and skipped updates (x)."""
    fig, ax = _axes(ax)
    recs = records_of(data)
    if not recs:
        _note(ax, "no updates yet")
        _finish(ax, "Loss")
        return fig
    x = _values(recs, "update")
    y = [v if _ok(v) else float("nan") for v in _values(recs, "loss")]
    ax.plot(x, y, color=COLORS["loss"], marker="o", ms=2, label="loss")
    key = []
    bad = [r["update"] for r in recs if r.get("nonfinite")]
    if bad:  # NaN/inf cannot be drawn as a value: mark where it happened along the bottom
        ax.plot(bad, [0.02] * len(bad), "v", color="#c44e52", transform=ax.get_xaxis_transform(),
                label="NaN/inf loss")
        key.append(("▼ = NaN/inf loss", "#c44e52"))
    dropped = [(r["update"], r["loss"]) for r in recs if r.get("skipped") and r.get("grad_scale") is None
               and _ok(r.get("loss"))]
    if dropped:  # updates skipped without a GradScaler (on_nonfinite="skip"): mark them on the loss
        ax.plot(*zip(*dropped), "x", color="#c44e52", ms=6, label="skipped update")
        key.append(("x = skipped update", "#c44e52"))
    scales = _values(recs, "grad_scale")
    if any(s is not None for s in scales):
        ax2 = _twin(ax)
        ax2.step(x, [s if s else float("nan") for s in scales], where="post", color=COLORS["scale"],
                 lw=1, label="grad scale")
        ax2.set_yscale("log", base=2)
        ax2.tick_params(labelsize=FONT)
        _plain_ticks(ax2.yaxis)
        key.insert(0, ("grad scale (right)", COLORS["scale"]))
        skipped = [(r["update"], r["grad_scale"]) for r in recs if r.get("skipped") and r.get("grad_scale")]
        if skipped:
            ax2.plot(*zip(*skipped), "x", color="#c44e52", ms=6, label="skipped update")
            key.append(("x = skipped update", "#c44e52"))
    _key(ax, key)
    _finish(ax, "Loss" + (" and grad scale" if any(s is not None for s in scales) else ""))
    return fig


def memory(data, ax=None, labels=None) -> Figure:
    """Where the bytes go: parameters, gradients, optimizer state and activations (stacked), with the
    measured device peak as a line. One bar per run; pass a list of results to compare runs."""
    fig, ax = _axes(ax)
    runs = data if isinstance(data, (list, tuple)) and data and not _is_record(data[0]) else [data]
    summaries = [summary_of(r) for r in runs]
    peaks_live = [_last(records_of(r), "peak_mem_bytes") for r in runs]
    have = [s for s in summaries if s and _ok(s.get("param_bytes"))]
    if not have:
        peak = next((p for p in peaks_live if _ok(p)), None)
        if peak:
            unit, name = _bytes_unit([peak])
            ax.axhline(peak / unit, color=COLORS["peak"], lw=1.5, label="device peak so far")
            ax.set_ylim(0, peak / unit * 1.3)
            _key(ax, [(f"device peak so far ({name})", COLORS["peak"])])
        _note(ax, "the breakdown appears when the run ends" if records_of(runs[0]) or peak else "no run yet")
        ax.set_xticks([])
        if not peak:
            ax.set_yticks([])
        _finish(ax, "Memory", per_update=False)
        return fig
    values = [s.get(k) for s in have for k, _ in MEMORY_PARTS] + [s.get("peak_mem_bytes") for s in have]
    unit, name = _bytes_unit(values)
    x = list(range(len(have)))
    bottom = [0.0] * len(have)
    for key, words in MEMORY_PARTS:
        vals = [(s.get(key) or 0) / unit for s in have]
        if key == "autocast_weight_copy_bytes" and not any(vals):
            continue  # only bf16/fp16 runs have them
        ax.bar(x, vals, bottom=bottom, width=0.6, color=COLORS[key], label=words, linewidth=0)
        bottom = [b + v for b, v in zip(bottom, vals)]
    peaks = [s.get("peak_mem_bytes") for s in have]
    for i, p in enumerate(peaks):
        if _ok(p):
            ax.hlines(p / unit, i - 0.4, i + 0.4, color=COLORS["peak"], lw=2,
                      label="measured device peak" if i == next(j for j, q in enumerate(peaks) if _ok(q)) else None)
    # One run's bar needs no name (the panel says which run it is), and a wrapped name under a live
    # chart's fixed margins was cut off; several runs are told apart by theirs.
    named = labels is not None or len(have) > 1
    labels = labels or [run_label(s) for s in have]
    ax.set_xticks(x, [_wrap(lab, 14) for lab in labels] if named else [""] * len(have), fontsize=FONT)
    key = [(words, COLORS[k]) for k, words in MEMORY_PARTS if any(s.get(k) for s in have)][::-1]  # as stacked
    key += ([("— measured device peak", COLORS["peak"])] if any(_ok(p) for p in peaks)
            else [("(no device-peak counter here)", "#555555")])
    top = max(bottom + [(p or 0) / unit for p in peaks])
    if len(have) == 1:  # one bar on the left, its key to the right of it
        ax.set_ylim(0, top * 1.1)
        ax.set_xlim(-0.6, 2.4)
    else:  # the key above the bars
        ax.set_ylim(0, top * _headroom(len(key)))
        ax.set_xlim(-0.6, len(have) - 0.4)
    _key(ax, key)
    _finish(ax, f"Memory by kind ({name})", per_update=False)
    return fig


def _is_record(x) -> bool:
    return isinstance(x, dict) and "update" in x


def _last(records, key):
    for r in reversed(records):
        if _ok(r.get(key)):
            return r[key]
    return None


DRAW = {"step_time": step_time, "memory": memory, "throughput": throughput, "utilization": utilization,
        "allreduce": allreduce, "loss": loss}


class Dashboard:
    """Several live charts of one run in a grid, on one figure that is kept and redrawn.

    Building axes (their ticks, spines, labels) costs far more than drawing a few lines, so a redraw
    wipes the data artists of the existing axes and draws new ones. The panel redraws while the run
    goes; that time is taken from training, so it must stay small.
    """

    def __init__(self, charts=CHARTS, columns=2, dpi=DPI):
        self.charts = [c for c in charts if c in DRAW] or list(CHARTS)
        cols = min(columns, len(self.charts))
        rows = math.ceil(len(self.charts) / cols)
        # A fixed layout: constrained layout would re-solve the whole grid at every redraw. Two columns
        # of 4.1 in at 90 dpi are 740 px: the notebook shows them unscaled, so 8 pt stays 10 px.
        self.fig = new_figure(4.1 * cols, 2.6 * rows, dpi=dpi, layout=None)
        self.fig.subplots_adjust(left=0.08, right=0.92, bottom=0.12 / rows, top=1 - 0.12 / rows,
                                 wspace=0.45, hspace=0.25 + 0.2 * (rows > 1))
        self.axes = {name: self.fig.add_subplot(rows, cols, i + 1) for i, name in enumerate(self.charts)}

    def draw(self, data) -> Figure:
        for name, ax in self.axes.items():
            wipe(ax)
            DRAW[name](data, ax=ax)
        return self.fig

    def png(self, data) -> bytes:
        return to_png(self.draw(data))


class LiveChart:
    """One chart on a figure kept between redraws (see ``Dashboard`` for why); the panel shows each
    chart as its own image, so hidden charts cost nothing."""

    def __init__(self, name, width=4.1, height=2.6, dpi=DPI):
        self.name = name
        self.fig = new_figure(width, height, dpi=dpi, layout=None)  # 369 x 234 px: two fit side by side
        self.fig.subplots_adjust(left=0.14, right=0.86, bottom=0.12, top=0.88)
        self.size_px = (round(width * dpi), round(height * dpi))
        self.ax = self.fig.add_subplot()

    def draw(self, data) -> Figure:
        wipe(self.ax)
        DRAW[self.name](data, ax=self.ax)
        return self.fig

    def png(self, data) -> bytes:
        return to_png(self.draw(data))


def dashboard(data, charts=CHARTS, columns=2) -> Figure:
    """Several live charts of one run in a grid (the panel's live view, as one figure)."""
    return Dashboard(charts, columns).draw(data)


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


# ---- comparing runs ------------------------------------------------------------------------------

def run_label(summary, baseline=None) -> str:
    """Short words for a run: the knobs that differ from ``baseline`` (or from the defaults). A
    ``"label"`` you put into a summary yourself wins."""
    if not summary:
        return "?"
    if summary.get("label"):
        return str(summary["label"])
    ref = baseline or _DEFAULTS
    parts = []
    for k in KNOBS + (("steps",) if baseline else ()):  # against a baseline, a different length matters too
        v = summary.get(k)
        if k == "checkpoint_every" and summary.get("checkpointing") != "full":
            continue  # k means something only with full checkpointing
        if k in summary and v != ref.get(k):
            parts.append(str(v) if k in ("precision", "model") else f"{k}={v}")
    return " ".join(parts) or ("baseline" if baseline is None else "same knobs")


_DEFAULTS = dict(model="small", precision="fp32", loss_scaling="auto", accum=1, micro_batch=8, checkpointing="none",
                 checkpoint_every=1, optimizer="adamw", workers=0, pin_memory=False, data_cost_ms=0.0, world_size=1,
                 ddp_sync="no_sync", memory_budget_gb=None)


def ratios(results, baseline=0, only=None) -> list:
    """For every run (or the indices in ``only``): {"index", "label", metric: value / baseline's value,
    ...}; None where either is missing."""
    summaries = [summary_of(r) for r in results]
    base = summaries[baseline]
    out = []
    for i in (range(len(summaries)) if only is None else only):
        s = summaries[i]
        row = {"index": i, "label": run_label(s, base) if i != baseline else run_label(s)}
        for key, _ in METRICS:
            a, b = s.get(key), base.get(key)
            row[key] = a / b if _ok(a) and _ok(b) and b else None
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
        return f" (both at {counted(a, 'CPU thread')})"
    return (f" (⚠ {counted(a, 'CPU thread')} against the baseline's {b}: the thread count "
            "differs too, so part of the ratio is the threads)")


def flops_words(v) -> str:
    """A FLOP/s rate in words a learner reads: '0.43 GFLOP/s', '989 TFLOP/s'."""
    if not _ok(v) or not v:
        return "unknown"
    return f"{number(v / 1e12)} TFLOP/s" if v >= 1e12 else f"{number(v / 1e9)} GFLOP/s"


def _mfu_words(s, base) -> str:
    """Why an MFU ratio can fall while tokens/s rises: each run's MFU is against its own format's peak."""
    if s.get("precision") == base.get("precision"):
        return ""
    return (f" (MFU is measured against each format's own peak: {s.get('precision')} "
            f"{flops_words(s.get('peak_flops'))}, {base.get('precision')} {flops_words(base.get('peak_flops'))})")


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
        parts = [f"{number(row[k], 2)}× {words}" + (_mfu_words(s, base) if k == "mfu" else "")
                 for k, words in METRICS if row[k] is not None]
        lines.append(f"{row['label']}: " + (", ".join(parts) or "nothing to compare") + threads_words(s, base))
    return lines


def shown_runs(n_runs: int, baseline=0, last=COMPARE_LAST) -> list:
    """Which runs a comparison chart shows: the baseline and the ``last`` latest others, in order."""
    later = [i for i in range(n_runs) if i != baseline][-last:] if last else []
    return sorted(set(later) | {baseline})


# Ratio ticks for a log axis: 1-2-5 steps read at a glance.
_RATIO_TICKS = [m * 10.0 ** e for e in range(-4, 5) for m in (1, 2, 5)]
_CHART_WORDS = {"mfu": "MFU (each\nformat's own\npeak)"}


def compare(results, baseline=0, ax=None, last=COMPARE_LAST) -> Figure:
    """The baseline and the ``last`` latest other runs side by side, each metric as a ratio to the
    baseline (1×) on a log axis: a bar rises above 1× or falls below it, so 0.03× and 140× both read."""
    fig, ax = _axes(ax, 7.0, 3.2)
    results = list(results)
    if len(results) < 1:
        _note(ax, "no finished runs yet")
        return fig
    shown = shown_runs(len(results), baseline, last)
    rows = ratios(results, baseline, shown)
    metrics = [(k, w) for k, w in METRICS if any(r[k] is not None for r in rows)]
    n, width = len(rows), 0.8 / len(rows)
    ends = [1.0]
    for j, row in enumerate(rows):
        ends += _ratio_bars(ax, results, baseline, row, metrics, (j - (n - 1) / 2) * width, width, labels=n <= 4)
    ax.axhline(1.0, color="#555555", lw=1, ls="--")
    _ratio_axis(ax, min(ends), max(ends), labelled=n <= 4)
    ax.set_xticks(range(len(metrics)), [_CHART_WORDS.get(k, _wrap(w, 12)) for k, w in metrics], fontsize=FONT)
    ax.set_xlim(-0.5, len(metrics) - 0.5)
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    hidden = len(results) - len(shown)
    ax.set_title(_wrap(f"Ratio to run #{baseline} (1× = the same; log scale); whiskers: middle half of a run's "
                       "updates" + (f"; the last {len(shown) - 1} of {len(results) - 1} other runs "
                                    f"({hidden} more in the table)" if hidden else ""), 75), fontsize=TITLE)
    ax.tick_params(labelsize=FONT)
    return fig


def _ratio_bars(ax, results, baseline, row, metrics, dx, width, labels) -> list:
    """One run's bars, from 1× to its ratio, with the spread of its updates as whiskers. Returns the
    ends drawn (bars and whiskers), for the axis limits."""
    i = row["index"]
    s = summary_of(results[i])
    keys = [k for k, _ in metrics]
    lo, hi = _update_spread(results[i], results[baseline], keys)
    xs = [m + dx for m in range(len(metrics))]
    vals = [row[k] if row[k] is not None and row[k] > 0 else None for k in keys]  # a log axis has no 0
    name = f"#{i} {_wrap(row['label'], 26)}" + (" (baseline)" if i == baseline else "")
    threads = cpu_threads(s)
    name += f", {counted(threads, 'thread')}" if threads else ""
    pts = [(x, v, a, b) for x, v, a, b in zip(xs, vals, lo, hi) if v is not None]
    if not pts:
        return []
    ax.bar([p[0] for p in pts], [p[1] - 1 for p in pts], bottom=1, width=width * 0.92, label=name, linewidth=0)
    ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                yerr=[[max(0.0, v - a) if a > 0 else 0.0 for _, v, a, _b in pts],
                      [max(0.0, b - v) for _, v, _a, b in pts]], fmt="none", ecolor="#333333", elinewidth=0.8,
                capsize=2)
    ends = [e for _, v, a, b in pts for e in (v, a, b) if e > 0]
    if labels and i != baseline:  # the baseline is 1× by definition: the dashed line says so
        for x, v, a, b in pts:
            up = v >= 1
            # beyond the bar *and* its whisker, turned upright: neighbouring labels never overlap
            y = max(v, b) if up else min(v, a if a > 0 else v)
            # a gap in points, not a share of y: on a log axis 4 % of 20 is a pixel, and "20×" sat on its bar
            ax.annotate(f"{number(v, 2)}×", (x, y), xytext=(0, 3 if up else -3), textcoords="offset points",
                        ha="center", va="bottom" if up else "top", rotation=90, fontsize=FONT)
    return ends


def _ratio_axis(ax, low, high, labelled):
    """A log ratio axis from ``low`` to ``high`` with room for the upright value labels, ticks 1-2-5."""
    low, high = min(low, 1.0), max(high, 1.0)
    span = max(math.log10(high / low), 0.3)
    pad = span * (0.45 if labelled else 0.12)  # an upright "0.029×" needs about a third of the height
    ax.set_yscale("log")
    ax.set_ylim(low / 10 ** pad, high * 10 ** pad)
    lo, hi = ax.get_ylim()
    ticks = [t for t in _RATIO_TICKS if lo <= t <= hi]
    while len(ticks) > 7:
        ticks = ticks[::2] if 1.0 in ticks[::2] else ticks[1::2]
    ax.set_yticks(ticks, [number(t, 2) + "×" for t in ticks])
    ax.yaxis.set_minor_locator(NullLocator())


def _update_spread(result, base, keys) -> tuple:
    """(low, high) per metric: the quartiles of a run's timed updates over the baseline's value, for the
    time-based metrics (one run's updates scatter; a single bar would hide it). Others: no whisker."""
    recs, s, b = records_of(result)[1:], summary_of(result), summary_of(base)
    lows, highs = [], []
    for key in keys:
        xs = sorted(r[key] for r in recs if _ok(r.get(key))) if key in ("tokens_per_s", "step_time_s") else []
        ref = b.get(key)
        if len(xs) >= 2 and _ok(ref) and ref:
            lows.append(xs[len(xs) // 4] / ref)
            highs.append(xs[(3 * len(xs)) // 4] / ref)
        else:
            v = s.get(key) / ref if _ok(s.get(key)) and _ok(ref) and ref else 0
            lows.append(v)
            highs.append(v)
    return lows, highs


class NoChart(str):
    """One line of text standing in for a chart that would have nothing to compare: a notebook shows
    it as a line of text, not as a quoted string; anywhere else it is a plain str."""

    def __repr__(self):
        return str(self)

    def _repr_markdown_(self):
        return f"*{self}*"


def reference(summary, points, ax=None) -> Figure | NoChart:
    """Your run beside reference measurements of the same configuration from real GPUs (absolute
    numbers on a log scale: a CPU and an H200 differ by orders of magnitude). With no reference
    point there is nothing to set beside your run -- a lone bar on a log axis says nothing -- so
    nothing is drawn and one line (a NoChart) says so instead."""
    if not points:
        return NoChart("no GPU reference yet for this configuration (data/reference/ has none): "
                       "your own numbers are above.")
    summary = summary_of(summary) or {}
    fig = new_figure(8.0, 0.9 + 0.45 * (1 + len(points))) if ax is None else ax.figure
    shown = [("tokens_per_s", "tokens/s"), ("step_time_s", "step time (s)"), ("mfu", "MFU")]
    names = [_wrap(f"yours: {summary.get('device_name') or summary.get('device', '?')}", 24)]
    names += [_wrap(ref.label(p), 24) for p in points]
    sources = [summary] + [p.get("summary", {}) for p in points]
    axes = [ax] if ax is not None else [fig.add_subplot(1, len(shown), i + 1) for i in range(len(shown))]
    for a, (key, words) in zip(axes, shown if ax is None else shown[:1]):
        vals = [s.get(key) if _ok(s.get(key)) else 0 for s in sources]
        colors = [COLORS["compute_s"]] + ["#999999"] * len(points)
        a.barh(range(len(vals)), vals, color=colors)
        for i, v in enumerate(vals):
            if v:
                a.text(v, i, f" {number(v)}", va="center", fontsize=FONT)
        a.set_yticks(range(len(vals)), names if a is axes[0] else [""] * len(vals), fontsize=FONT)
        if any(v > 0 for v in vals):
            a.set_xscale("log")
            _plain_ticks(a.xaxis)
            a.margins(x=0.3)  # room for the value labels right of the bars
        a.invert_yaxis()
        _finish(a, words, per_update=False)
    return fig


def comparison(cmp, ax=None) -> Figure:
    """Every repeat of an interleaved A/B (``lk.compare_configs``) as a dot, each arm's median as a bar:
    the spread is on the chart, not in a footnote. The title is the verdict."""
    fig, ax = _axes(ax, 5.6, 3.0)
    unit = {"tokens_per_s": "tokens/s", "step_time_s": "s per update", "cpu_s_per_update": "CPU-s per update",
            "peak_mem_bytes": "bytes"}.get(cmp.metric, cmp.metric)
    for i, (label, xs) in enumerate(((cmp.label_a, cmp.samples_a), (cmp.label_b, cmp.samples_b))):
        if not xs:
            continue
        jitter = [i + 0.12 * ((k % 5) - 2) / 2 for k in range(len(xs))]
        ax.plot(jitter, xs, "o", ms=3, alpha=0.6, color=COLORS["mfu"] if i == 0 else COLORS["hfu"])
        med = sorted(xs)[len(xs) // 2] if len(xs) % 2 else sum(sorted(xs)[len(xs) // 2 - 1:len(xs) // 2 + 1]) / 2
        ax.hlines(med, i - 0.3, i + 0.3, color="#222222", lw=1.5)
    ax.set_xticks([0, 1])
    ax.set_xticklabels([_wrap(cmp.label_a, 28), _wrap(cmp.label_b, 28)], fontsize=FONT)
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel(unit, fontsize=FONT)
    _plain_ticks(ax.yaxis)
    if cmp.ratio is not None:
        what = {"same": "no measurable difference", "higher": f"{cmp.label_b} higher",
                "lower": f"{cmp.label_b} lower"}[cmp.verdict]
        if not cmp.decided:
            what = f"no verdict ({len(cmp.samples_a)} of {cmp.min_repeats} repeats fit the budget)"
        ax.set_title(_wrap(f"{what}: ratio {cmp.ratio:.2f} [{cmp.low:.2f}, {cmp.high:.2f}] 95 %"
                           + (" (busy machine)" if cmp.busy else ""), 60), fontsize=TITLE)
    ax.tick_params(labelsize=FONT)
    return fig


# ---- measured here, predicted there -------------------------------------------------------------

PREDICTED_COLOR = "#dd8452"


def whatif(measured, predicted, references=(), ax=None) -> Figure:
    """Step time per update, one group of bars per run: this machine **measured**, another GPU
    **predicted** (``labkit.predict``; hatched, and the word "predicted" on the bar and its label), and
    GPU reference measurements of the same knobs when there are some (grey). ``measured`` is a list of
    Results or summaries, ``predicted`` a list of Predictions (or dicts with ``step_time_s`` and
    ``device_name``; None where none could be made), one per run, and ``references`` a list of lists of
    reference points (``labkit.reference.match``). Log scale: a CPU and a GPU differ by orders of magnitude."""
    measured, predicted = list(measured), list(predicted)
    references = list(references) or [[] for _ in measured]
    bars = []  # (label, seconds, kind)
    for run, pred, refs in zip(measured, predicted, references):
        s = summary_of(run) or {}
        knobs = run_label(s)
        bars.append((f"{knobs}\nthis machine, measured", s.get("step_time_s"), "measured"))
        if pred is not None:
            name = pred.get("device_name") if isinstance(pred, dict) else pred.device_name
            sec = pred.get("step_time_s") if isinstance(pred, dict) else pred.step_time_s
            bars.append((f"{knobs}\n{name}, PREDICTED", sec, "predicted"))
        for p in refs:
            bars.append((f"{knobs}\n{ref.label(p)}, measured", p.get("summary", {}).get("step_time_s"), "reference"))
    fig, ax = _axes(ax, 8.0, 0.7 + 0.45 * max(1, len(bars)))
    if not any(_ok(v) and v > 0 for _, v, _ in bars):
        _note(ax, "no run yet: press Run, then pick a GPU")
        return fig
    color = {"measured": COLORS["compute_s"], "predicted": PREDICTED_COLOR, "reference": "#999999"}
    for i, (label, v, kind) in enumerate(bars):
        if not (_ok(v) and v > 0):
            continue
        ax.barh(i, v * 1000, color=color[kind], hatch="//" if kind == "predicted" else None,
                edgecolor="white" if kind == "predicted" else None)
        ax.text(v * 1000, i, f" {number(v * 1000)} ms" + (" (predicted)" if kind == "predicted" else ""),
                va="center", fontsize=FONT)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=FONT)
    ax.set_xscale("log")
    _plain_ticks(ax.xaxis)
    ax.invert_yaxis()
    ax.margins(x=0.35)  # room right of the longest bar for its label
    ax.set_title("ms per update: measured here, PREDICTED (hatched) on the GPU", fontsize=TITLE)
    ax.tick_params(axis="x", labelsize=FONT)  # not _finish: its tick locator would drop the bars' labels
    return fig


def predicted_vs_measured(rows, ax=None) -> Figure:
    """Each configuration's step time, measured (solid) beside predicted (hatched, labelled predicted),
    with the error above the pair. ``rows`` as ``labkit.predict.error_rows`` makes them."""
    fig, ax = _axes(ax, 8.0, 3.2)
    if not rows:
        _note(ax, "no configuration measured")
        return fig
    for i, row in enumerate(rows):  # error rows, not run records
        for dx, key, kind in ((-0.2, "measured_s", "measured"), (0.2, "predicted_s", "predicted")):
            v = row.get(key)
            if _ok(v):
                ax.bar(i + dx, v * 1000, width=0.4, color=PREDICTED_COLOR if kind == "predicted" else COLORS["compute_s"],
                       hatch="//" if kind == "predicted" else None, edgecolor="white")
        if row.get("error") is not None:
            top = max(v for v in (row.get("measured_s"), row.get("predicted_s")) if _ok(v)) * 1000
            ax.text(i, top, f"{row['error']:+.0%}", ha="center", va="bottom", fontsize=FONT)
    ax.set_xticks(range(len(rows)), [_wrap(row["label"], 14) for row in rows], fontsize=FONT)
    ax.margins(y=0.15)
    _key(ax, [("measured", COLORS["compute_s"]), ("PREDICTED (hatched)", PREDICTED_COLOR)], loc="upper left")
    ax.set_title("ms per update on this machine: measured vs predicted (error above)", fontsize=TITLE)
    ax.tick_params(axis="y", labelsize=FONT)
    _plain_ticks(ax.yaxis)
    return fig
