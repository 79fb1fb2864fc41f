"""Charts that set runs side by side: the ratio chart of a run history (``compare``), an interleaved
A/B with its repeats (``comparison``), a run beside GPU reference measurements (``reference``), and
predictions (``labkit.predict``) beside measurements (``whatif``, ``predicted_vs_measured``): always
labelled "predicted" and hatched, never mixed with what was measured.
"""
from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from .. import ranks, reference as ref
from ...base.numfmt import ms, number
from ...engine.measure import median
from .figure import (COLORS, COMPARE_LAST, FONT, RATIO_METRICS, TITLE, NoChart, _axes, _finish,
                     _key, _note, _ok, _plain_ticks, _wrap, cpu_threads, metric_words, new_figure,
                     ratios, records_of, run_label, say, shown_runs, summary_of, threads)

# Ratio ticks for a log axis: 1-2-5 steps read at a glance.
_RATIO_TICKS = [m * 10.0 ** e for e in range(-4, 5) for m in (1, 2, 5)]


def compare(results, baseline=0, ax=None, last=COMPARE_LAST) -> Figure:
    """The baseline and the ``last`` latest other runs side by side, each metric as a ratio to the
    baseline (1×) on a log axis: a bar rises above 1× or falls below it, so 0.03× and 140× both read."""
    fig, ax = _axes(ax, 7.0, 3.2)
    results = list(results)
    if len(results) < 1:
        _note(ax, say("no-finished-runs"))
        return fig
    shown = shown_runs(len(results), baseline, last)
    rows = ratios(results, baseline, shown)
    metrics = [(k, w) for k, w in RATIO_METRICS if any(r[k] is not None for r in rows)]
    n, width = len(rows), 0.8 / len(rows)
    ends = [1.0]
    for j, row in enumerate(rows):
        ends += _ratio_bars(ax, results, baseline, row, metrics, (j - (n - 1) / 2) * width, width, labels=n <= 4)
    ax.axhline(1.0, color="#555555", lw=1, ls="--")
    _ratio_axis(ax, min(ends), max(ends), labelled=n <= 4)
    ax.set_xticks(range(len(metrics)), [_wrap(say("chart-mfu") if k == "mfu" else metric_words(k), 12)
                                        for k, _ in metrics], fontsize=FONT)
    ax.set_xlim(-0.5, len(metrics) - 0.5)
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    hidden = len(results) - len(shown)
    title = (say("ratio-title-more", baseline=baseline, shown=len(shown) - 1, others=len(results) - 1,
                 hidden=hidden) if hidden else say("ratio-title", baseline=baseline))
    ax.set_title(_wrap(title, 75), fontsize=TITLE)
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
    name = f"#{i} {_wrap(row['label'], 26)}"
    name = say("baseline-run", name=name) if i == baseline else name
    n_threads = cpu_threads(s)
    name += f", {threads(n_threads)}" if n_threads else ""
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


def reference(summary, points, ax=None) -> Figure | NoChart:
    """Your run beside reference measurements of the same configuration from real GPUs (log
    scale: a CPU and an H200 differ by orders of magnitude); with no reference point, one line (a
    NoChart)."""
    if not points:
        return NoChart(say("no-reference"))
    summary = summary_of(summary) or {}
    fig = new_figure(8.0, 0.9 + 0.45 * (1 + len(points))) if ax is None else ax.figure
    shown = [("tokens_per_s", metric_words("tokens_per_s")), ("step_time_s", say("step-time-s")), ("mfu", "MFU")]
    names = [_wrap(say("yours", device=summary.get('device_name') or summary.get('device', '?')), 24)]
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
    unit = {"tokens_per_s": "unit-tokens", "step_time_s": "unit-step", "cpu_s_per_update": "unit-cpu-s",
            "peak_mem_bytes": "unit-bytes"}.get(cmp.metric)
    unit = say(unit) if unit else cmp.metric
    for i, (label, xs) in enumerate(((cmp.label_a, cmp.samples_a), (cmp.label_b, cmp.samples_b))):
        if not xs:
            continue
        jitter = [i + 0.12 * ((k % 5) - 2) / 2 for k in range(len(xs))]
        ax.plot(jitter, xs, "o", ms=3, alpha=0.6, color=COLORS["mfu"] if i == 0 else COLORS["hfu"])
        ax.hlines(median(xs), i - 0.3, i + 0.3, color="#222222", lw=1.5)
    ax.set_xticks([0, 1])
    ax.set_xticklabels([_wrap(cmp.label_a, 28), _wrap(cmp.label_b, 28)], fontsize=FONT)
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel(unit, fontsize=FONT)
    _plain_ticks(ax.yaxis)
    if cmp.ratio is not None:
        what = say({"same": "ab-same", "higher": "ab-higher", "lower": "ab-lower"}[cmp.verdict], b=cmp.label_b)
        interval = say("ab-interval", ratio=f"{cmp.ratio:.2f}", low=f"{cmp.low:.2f}", high=f"{cmp.high:.2f}")
        if not cmp.decided:  # as the sentence says it: no 95 % interval below 4 runs an arm (tools/ranks.py)
            what = say("ab-no-verdict", a=len(cmp.samples_a), b=len(cmp.samples_b))
            if min(len(cmp.samples_a), len(cmp.samples_b)) < ranks.fewest_runs():
                interval = say("ab-so-far", ratio=f"{cmp.ratio:.2f}")
        title = say("ab-title-busy" if cmp.busy else "ab-title", what=what, interval=interval)
        ax.set_title(_wrap(title, 60), fontsize=TITLE)
    ax.tick_params(labelsize=FONT)
    return fig


# ---- measured here, predicted there -------------------------------------------------------------

PREDICTED_COLOR = "#dd8452"


def whatif(measured, predicted, references=(), ax=None) -> Figure:
    """Step time per update on a log scale, per run: this machine **measured**, another GPU
    **predicted** (hatched, labelled predicted) and GPU reference points of the same knobs (grey).
    Per run: a Result or summary, a Prediction (or a dict with ``step_time_s`` and ``device_name``;
    or None) and a list of reference points (``labkit.reference.match``)."""
    measured, predicted = list(measured), list(predicted)
    references = list(references) or [[] for _ in measured]
    bars = []  # (label, seconds, kind)
    for run, pred, refs in zip(measured, predicted, references):
        s = summary_of(run) or {}
        knobs = run_label(s)
        bars.append((f"{knobs}\n" + say("this-measured"), s.get("step_time_s"), "measured"))
        if pred is not None:
            name = pred.get("device_name") if isinstance(pred, dict) else pred.device_name
            sec = pred.get("step_time_s") if isinstance(pred, dict) else pred.step_time_s
            bars.append((f"{knobs}\n" + say("predicted-bar", device=name), sec, "predicted"))
        for p in refs:
            bars.append((f"{knobs}\n" + say("reference-bar", device=ref.label(p)),
                         p.get("summary", {}).get("step_time_s"), "reference"))
    fig, ax = _axes(ax, 8.0, 0.7 + 0.45 * max(1, len(bars)))
    if not any(_ok(v) and v > 0 for _, v, _ in bars):
        _note(ax, say("no-run-pick-gpu"))
        return fig
    color = {"measured": COLORS["compute_s"], "predicted": PREDICTED_COLOR, "reference": "#999999"}
    for i, (label, v, kind) in enumerate(bars):
        if not (_ok(v) and v > 0):
            continue
        ax.barh(i, v * 1000, color=color[kind], hatch="//" if kind == "predicted" else None,
                edgecolor="white" if kind == "predicted" else None)
        ax.text(v * 1000, i, " " + (say("predicted-ms", ms=ms(v)) if kind == "predicted" else f"{ms(v)} ms"),
                va="center", fontsize=FONT)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=FONT)
    ax.set_xscale("log")
    _plain_ticks(ax.xaxis)
    ax.invert_yaxis()
    ax.margins(x=0.35)  # room right of the longest bar for its label
    ax.set_title(say("whatif-title"), fontsize=TITLE)
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
