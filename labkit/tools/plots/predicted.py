"""Charts that put a prediction (``labkit.predict``) beside a measurement: always labelled "predicted"
and hatched, never mixed with what was measured.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .. import reference as ref
from ...base.numfmt import number
from .figure import COLORS, FONT, TITLE, _axes, _key, _note, _ok, _plain_ticks, _wrap, summary_of
from .labels import run_label

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
