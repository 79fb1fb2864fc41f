"""The live charts: one value per optimizer update (step time, throughput, MFU/HFU, AllReduce calls,
loss) and the memory breakdown, drawn while a run goes (the panel, ``Dashboard``, ``LiveChart``) or
after it. Each takes a Result, a {"records", "summary"} dict or a list of records.
"""
from __future__ import annotations

import itertools
import math

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ...base.numfmt import number
from ...base.schema import MEMORY_PARTS
from ...engine.measure import median
from .figure import (COLORS, DPI, FONT, _axes, _bytes_unit, _finish, _headroom, _key, _live_axes,
                     _note, _ok, _plain_ticks, _twin, _values, _wrap, new_figure, records_of,
                     run_label, say, summary_of, to_png, wipe)

# The live charts, in the panel's order.
CHARTS = ("step_time", "memory", "throughput", "utilization", "allreduce", "loss")


# ---- live charts: one value per optimizer update -----------------------------------------------

def _bars(ax, x, low, high, **kw):
    """Touching bars from ``low`` to ``high`` at each x, drawn as one filled outline: one shape per
    series instead of one per update, so drawing cost does not grow with the run."""
    xs = [v + dx for v in x for dx in (-0.5, 0.5)]
    twice = [(a, b) for a, b in zip(low, high) for _ in "lr"]  # each bar's left and right edge
    ax.fill_between(xs, [a for a, _ in twice], [b for _, b in twice], linewidth=0, **kw)


def step_time(data, ax=None) -> Figure:
    """Each update's time, stacked: waiting for data, forward+backward compute, optimizer step."""
    fig, ax, recs = _live_axes(data, ax)
    if recs:
        x = _values(recs, "update")
        bottom = [0.0] * len(recs)
        parts = (("data_wait_s", say("data-wait")), ("compute_s", say("compute")),
                 ("optimizer_s", say("optimizer")))
        for key, words in parts:
            top = [b + 1000 * (v or 0.0) for b, v in zip(bottom, _values(recs, key))]
            _bars(ax, x, bottom, top, color=COLORS[key], label=words)
            bottom = top
        ax.set_ylim(0, (max(bottom) or 1.0) * _headroom(len(parts)))  # head room for the key
        _key(ax, [(words, COLORS[key]) for key, words in reversed(parts)])
    _finish(ax, say("step-time"))
    return fig


def throughput(data, ax=None) -> Figure:
    """Tokens per second per update; the dashed line is the median after the first (warm-up) update."""
    fig, ax, recs = _live_axes(data, ax)
    if recs:
        x, y = _values(recs, "update"), _values(recs, "tokens_per_s")
        ax.plot(x, y, marker="o", ms=2, color=COLORS["compute_s"])
        med = median([v for v in y[1:] or y if _ok(v)])  # after the warm-up update, when there is one
        if med is not None:
            ax.axhline(med, ls="--", lw=1, color="#555555")
            ax.text(0.99, 0.03, say("median", value=number(med)), ha="right", fontsize=FONT,
                    transform=ax.transAxes)
        top = max([v for v in y if _ok(v)] or [0])
        ax.set_ylim(0, top * 1.15 or 1.0)  # a lone first point sits below the frame, not on it
    _finish(ax, say("tokens-per-s"))
    return fig


def utilization(data, ax=None) -> Figure:
    """MFU (useful model FLOPs) and HFU (FLOPs the hardware ran, recompute included) in % of peak."""
    fig, ax = _axes(ax)
    recs = records_of(data)
    if not recs or not any(_ok(r.get("mfu")) for r in recs):
        _note(ax, say("no-mfu") if not recs else say("no-peak"))
    else:
        x = _values(recs, "update")
        # without recompute HFU equals MFU: MFU a wide solid line, HFU a dashed one on top, so both show
        for key, style in (("mfu", dict(lw=3, ls="-", zorder=2)), ("hfu", dict(lw=1.2, ls="--", zorder=3))):
            ax.plot(x, [100 * v if _ok(v) else float("nan") for v in _values(recs, key)], marker="o", ms=2,
                    color=COLORS[key], label=key.upper(), **style)
        ax.set_ylim(bottom=0)
        _key(ax, [(say("hfu-dashed"), COLORS["hfu"]), ("MFU", COLORS["mfu"])], loc="lower right")
        if any(_ok(r.get("hfu")) and r["hfu"] > 1 for r in recs):  # never silently above the ceiling
            ax.axhline(100, color=COLORS["peak"], lw=0.8, ls="--")
            ax.text(0.02, 0.97, say("above-peak"), color="#c44e52",
                    fontsize=FONT, ha="left", va="top", transform=ax.transAxes)
    _finish(ax, say("utilization"))
    return fig


def allreduce(data, ax=None) -> Figure:
    """AllReduce calls DDP launched in each update (bars) and in total so far (line, right axis)."""
    fig, ax = _axes(ax)
    recs = records_of(data)
    calls = _values(recs, "allreduce_calls")
    if not recs or not any(c is not None for c in calls):
        _note(ax, say("no-updates") if not recs else say("no-ddp"))
    else:
        x = _values(recs, "update")
        per = [c or 0 for c in calls]
        _bars(ax, x, [0] * len(per), per, color=COLORS["compute_s"], label="per update")
        ax.set_ylim(0, max(per) * 1.6 + 0.5)  # head room for the key
        cum = list(itertools.accumulate(per))
        total = cum[-1]
        ax2 = _twin(ax)
        ax2.plot(x, cum, color=COLORS["peak"], marker="o", ms=2, label="cumulative")
        ax2.set_ylim(bottom=0)
        ax2.tick_params(labelsize=FONT)
        ax2.yaxis.set_major_locator(MaxNLocator(3, integer=True))
        _plain_ticks(ax2.yaxis)
        _key(ax, [(say("per-update-left"), COLORS["compute_s"]), (say("cumulative", total=total), COLORS["peak"])],
             loc="upper left")
    _finish(ax, say("allreduce"))
    ax.yaxis.set_major_locator(MaxNLocator(4, integer=True))  # calls are counted: no 0.6 of a call
    return fig


def loss(data, ax=None) -> Figure:
    """Training loss; with an fp16 GradScaler also its scale (right axis, log) and skipped updates (x)."""
    fig, ax, recs = _live_axes(data, ax)
    if not recs:
        _finish(ax, say("loss"))
        return fig
    x = _values(recs, "update")
    y = [v if _ok(v) else float("nan") for v in _values(recs, "loss")]
    ax.plot(x, y, color=COLORS["loss"], marker="o", ms=2, label="loss")
    key = []
    bad = [r["update"] for r in recs if r.get("nonfinite")]
    if bad:  # NaN/inf cannot be drawn as a value: mark where it happened along the bottom
        ax.plot(bad, [0.02] * len(bad), "v", color="#c44e52", transform=ax.get_xaxis_transform(),
                label="NaN/inf loss")
        key.append((say("nan-loss"), "#c44e52"))
    dropped = [(r["update"], r["loss"]) for r in recs if r.get("skipped") and r.get("grad_scale") is None
               and _ok(r.get("loss"))]
    if dropped:  # updates skipped without a GradScaler (on_nonfinite="skip"): mark them on the loss
        ax.plot(*zip(*dropped), "x", color="#c44e52", ms=6, label="skipped update")
        key.append((say("skipped-update"), "#c44e52"))
    scales = _values(recs, "grad_scale")
    if any(s is not None for s in scales):
        ax2 = _twin(ax)
        ax2.step(x, [s if s else float("nan") for s in scales], where="post", color=COLORS["scale"],
                 lw=1, label="grad scale")
        ax2.set_yscale("log", base=2)
        ax2.tick_params(labelsize=FONT)
        _plain_ticks(ax2.yaxis)
        key.insert(0, (say("grad-scale"), COLORS["scale"]))
        skipped = [(r["update"], r["grad_scale"]) for r in recs if r.get("skipped") and r.get("grad_scale")]
        if skipped:
            ax2.plot(*zip(*skipped), "x", color="#c44e52", ms=6, label="skipped update")
            key.append((say("skipped-update"), "#c44e52"))
    _key(ax, key)
    _finish(ax, say("loss-and-scale") if any(s is not None for s in scales) else say("loss"))
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
            _key(ax, [(say("peak-so-far", unit=name), COLORS["peak"])])
        _note(ax, say("breakdown-later") if records_of(runs[0]) or peak else say("no-run"))
        ax.set_xticks([])
        if not peak:
            ax.set_yticks([])
        _finish(ax, say("memory"), per_update=False)
        return fig
    values = [s.get(k) for s in have for k, _ in MEMORY_PARTS] + [s.get("peak_mem_bytes") for s in have]
    unit, name = _bytes_unit(values)
    x = list(range(len(have)))
    bottom = [0.0] * len(have)
    for key, _ in MEMORY_PARTS:
        vals = [(s.get(key) or 0) / unit for s in have]
        if key == "autocast_weight_copy_bytes" and not any(vals):
            continue  # only bf16/fp16 runs have them
        ax.bar(x, vals, bottom=bottom, width=0.6, color=COLORS[key], label=say(key), linewidth=0)
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
    key = [(say(k), COLORS[k]) for k, _ in MEMORY_PARTS if any(s.get(k) for s in have)][::-1]  # as stacked
    key += ([(say("measured-peak"), COLORS["peak"])] if any(_ok(p) for p in peaks)
            else [(say("no-peak-counter"), "#555555")])
    top = max(bottom + [(p or 0) / unit for p in peaks])
    if len(have) == 1:  # one bar on the left, its key to the right of it
        ax.set_ylim(0, top * 1.1)
        ax.set_xlim(-0.6, 2.4)
    else:  # the key above the bars
        ax.set_ylim(0, top * _headroom(len(key)))
        ax.set_xlim(-0.6, len(have) - 0.4)
    _key(ax, key)
    _finish(ax, say("memory-by-kind", unit=name), per_update=False)
    return fig


def _is_record(x) -> bool:
    return isinstance(x, dict) and "update" in x


def _last(records, key):
    return next((r[key] for r in reversed(records) if _ok(r.get(key))), None)


DRAW = {"step_time": step_time, "memory": memory, "throughput": throughput, "utilization": utilization,
        "allreduce": allreduce, "loss": loss}


class Dashboard:
    """Several live charts of one run in a grid, on one figure kept and redrawn: building axes
    costs far more than drawing a few lines, so a redraw wipes the data of the existing axes and
    draws anew (the panel redraws while the run goes; that time is taken from training)."""

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
