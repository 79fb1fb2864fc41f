"""Reading a measured grid (taught in chapter 09): the Pareto front of memory against throughput, the fastest
point within a memory budget, how far repeats of one point scatter, and the
grid as a table and a chart.

    front = pb.pareto_front(rows)
    best = pb.best_within(rows, budget_bytes=80 * 2**20)
"""
from __future__ import annotations

import math

from ...base.errors import ConfigError
from ...base.numfmt import number
from ...engine.config import _bool  # the Config's own check: one wording for every refusal
from ...engine.measure import median
from .args import real, row_list


def measured(rows: list) -> list:
    """The rows that ran and have both a memory figure and a throughput (refused or failed ones left out)."""
    return [r for r in row_list("rows", rows) if r.get("status", "ok") == "ok" and r.get("memory_bytes") is not None
            and r.get("tokens_per_s")]


def pareto_front(rows: list, memory: str = "memory_bytes", speed: str = "tokens_per_s") -> list:
    """The rows no other row beats on both axes (less or equal memory AND more or equal speed, one of
    them strictly), sorted by memory. Every other configuration is a bad deal: something on the front
    is at least as fast and needs no more memory."""
    pts = [r for r in row_list("rows", rows) if r.get(memory) is not None and r.get(speed) is not None]
    pts.sort(key=lambda r: (r[memory], -r[speed]))
    front, best = [], -math.inf
    for r in pts:
        if r[speed] > best:
            front.append(r)
            best = r[speed]
    return front


def best_within(rows: list, budget_bytes: float, memory: str = "memory_bytes", speed: str = "tokens_per_s"):
    """The fastest measured row whose memory fits the budget (None when nothing fits)."""
    real("budget_bytes", budget_bytes, strict=True, allowed="a number of bytes > 0")
    fits = [r for r in measured(rows) if r[memory] <= budget_bytes]
    return max(fits, key=lambda r: r[speed]) if fits else None


def run_scatter(rows: list):
    """How much a point's tokens/s differed between the grid's repeats: the median over points of
    (max - min) / median of its runs. None with one run per point (nothing to tell the scatter from)."""
    rows = row_list("rows", rows)
    spreads = [(max(r["tokens_per_s_runs"]) - min(r["tokens_per_s_runs"])) / median(r["tokens_per_s_runs"])
               for r in measured(rows) if len(r.get("tokens_per_s_runs") or []) > 1]
    return median(spreads)  # None when no point ran twice


def within_scatter(rows: list, top: dict, scatter) -> list:
    """The measured rows whose tokens/s is within ``scatter`` (relative) of ``top``'s: points these runs
    cannot rank against it ([top] alone when there is no scatter estimate)."""
    rows = row_list("rows", rows)
    if not isinstance(top, dict):
        raise ConfigError("top", top, "one grid row (a dict), e.g. best_within(rows, budget)")
    if scatter is not None:
        real("scatter", scatter, allowed="a relative spread >= 0 (run_scatter's), or None")
    if not scatter:
        return [top]
    return [r for r in measured(rows) if r["tokens_per_s"] >= top["tokens_per_s"] * (1 - scatter)]


# ---- verdicts: what the chapter may conclude from a repeated, interleaved comparison -------------------

# ---- the grid as a table ---------------------------------------------------------------------------

def table_rows(rows: list, budget_bytes: float | None = None) -> tuple:
    """(rows, unit): the grid fastest first, each row's ``label``, ``tokens_per_s``, ``memory`` in ``unit``
    ('MiB' or 'GiB', the larger the grid needs), ``fits`` the budget (None without one) -- or, for a point that
    did not run, its ``status`` (the figures None)."""
    rows = row_list("rows", rows)
    if budget_bytes is not None:
        real("budget_bytes", budget_bytes, strict=True, allowed="a number of bytes > 0, or None")
    unit, u = _unit(rows)
    out = []
    for r in sorted(rows, key=lambda r: -(r.get("tokens_per_s") or -1)):
        if r.get("status", "ok") != "ok":
            out.append({"label": r["label"], "status": r["status"], "tokens_per_s": None, "memory": None,
                        "fits": None})
            continue
        out.append({"label": r["label"], "status": None, "tokens_per_s": r["tokens_per_s"],
                    "memory": r["memory_bytes"] / unit,
                    "fits": None if budget_bytes is None else r["memory_bytes"] <= budget_bytes})
    return out, u


def fixed_digits(v, digits: int = 3) -> str:
    """``number(v, digits)`` with its trailing zeros kept ('1.70', not '1.7'): a column reads alike."""
    return number(v, digits, trailing_zeros=True)


def _unit(rows):
    top = max([r.get("memory_bytes") or 0 for r in rows] or [0])
    return (2**30, "GiB") if top >= 2**30 else (2**20, "MiB")


# ---- the chart ---------------------------------------------------------------------------------------

def _pareto_axes(ax, rows, budget_bytes, title, mark_best=True):
    """One grid's dots (colour: precision, marker: checkpointing, text: micro-batch), its front, the budget."""
    from ...tools.plots import FONT, TITLE  # deferred: matplotlib is optional; loaded only to draw

    pts = measured(rows)
    unit, u = _unit(pts)
    front = pareto_front(pts)
    colors = {"fp32": "#4c72b0", "tf32": "#8172b3", "fp16": "#dd8452", "bf16": "#c44e52"}
    for prec in sorted({r["precision"] for r in pts}):
        for ck, marker in (("none", "o"), ("full", "^"), ("selective", "s"), ("attention", "D")):
            sel = [r for r in pts if r["precision"] == prec and r["checkpointing"] == ck]
            if sel:
                ax.scatter([r["memory_bytes"] / unit for r in sel], [r["tokens_per_s"] for r in sel], s=30,
                           marker=marker, color=colors.get(prec, "#555555"), alpha=0.85,
                           label=f"{prec}{'' if ck == 'none' else ', checkpointing ' + ck}")
    labels = []
    for r in pts:  # the micro-batch beside each dot: with it the chart alone says which configuration a dot is
        below = r["checkpointing"] != "none"  # the front runs up through these dots: a label above sits on it
        labels.append(ax.annotate(f"mb={r['micro_batch']}", (r["memory_bytes"] / unit, r["tokens_per_s"]),
                                  fontsize=FONT, xytext=(5, -6) if below else (4, 3), textcoords="offset points",
                                  color="#333333", va="top" if below else "baseline"))
    ax.plot([r["memory_bytes"] / unit for r in front], [r["tokens_per_s"] for r in front], "-", lw=1,
            color="#222222", zorder=0, label="Pareto front")
    if budget_bytes:
        ax.axvline(budget_bytes / unit, ls="--", color="#c44e52", lw=1)
        ax.text(budget_bytes / unit, 0.98, " budget", color="#c44e52", fontsize=FONT, va="top",
                transform=ax.get_xaxis_transform())
        best = best_within(pts, budget_bytes) if mark_best else None
        if best is not None:
            ax.scatter([best["memory_bytes"] / unit], [best["tokens_per_s"]], s=130, facecolors="none",
                       edgecolors="#222222", lw=1.2, label="best within budget")
    ax.set_xlabel(f"memory ({u}; {pts[0].get('memory_source') or 'measured'})", fontsize=FONT)
    ax.set_ylabel("tokens/s", fontsize=FONT)
    ax.set_ylim(bottom=0, top=max(r["tokens_per_s"] for r in pts) * 1.15)  # room above the top dot's label
    ax.set_title(title, fontsize=TITLE)
    ax.tick_params(labelsize=FONT)
    ax.margins(x=0.12)  # room for the micro-batch label of the right-most dot
    _untangle(ax, labels)


def _untangle(ax, labels):
    """Two dots close together had their labels printed over each other ('mb=4mb=8'). Placed right to left, a
    label that runs into one already placed moves to the left of its dot, else to its other side vertically."""
    renderer = ax.figure.canvas.get_renderer()
    placed = []
    for t in sorted(labels, key=lambda t: -t.xy[0]):
        (dx, dy), va = t.xyann, t.get_va()
        flip = {"top": "baseline", "baseline": "top"}[va]
        for x, y, ha, v in ((dx, dy, "left", va), (-dx, dy, "right", va), (dx, -dy, "left", flip),
                            (-dx, -dy, "right", flip)):
            t.set_position((x, y))
            t.set_ha(ha)
            t.set_va(v)
            if not any(t.get_window_extent(renderer).overlaps(b) for b in placed):
                break
        else:  # nowhere free: where it was
            t.set_position((dx, dy))
            t.set_ha("left")
            t.set_va(va)
        placed.append(t.get_window_extent(renderer))


def pareto_chart(rows: list, budget_bytes: float | None, reference_rows: list | None = None,
                 reference_budget_bytes: float | None = None, device_name: str = "this device",
                 mark_best: bool = True):
    """Memory against throughput, the budget as a dashed line, the Pareto front joined -- for the
    learner's runs and, beside them, the GPU reference grid when one is shipped (one panel when not).
    ``mark_best=False`` leaves the best point within the budget unmarked (a chapter asks for it first)."""
    rows = row_list("rows", rows)
    if not measured(rows):
        raise ConfigError("rows", f"{len(rows)} rows, none measured", "at least one grid row that ran")
    for name, b in (("budget_bytes", budget_bytes), ("reference_budget_bytes", reference_budget_bytes)):
        if b is not None:
            real(name, b, strict=True, allowed="a number of bytes > 0, or None")
    _bool("mark_best", mark_best)
    from ...tools.plots import FONT, new_figure  # deferred: matplotlib is optional; loaded only to draw

    ref = measured(row_list("reference_rows", reference_rows or []))
    fig = new_figure(7.6, 3.8) if not ref else new_figure(9.4, 4.2)
    axes = [fig.add_subplot()] if not ref else list(fig.subplots(1, 2))
    _pareto_axes(axes[0], rows, budget_bytes, f"Your grid: {device_name}", mark_best)
    if ref:
        _pareto_axes(axes[1], ref, reference_budget_bytes, f"GPU reference: {ref[0].get('device', '')}", mark_best)
    entries = {}  # one legend for the figure, outside the axes: it hides no dot
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(text, handle)
    fig.legend(list(entries.values()), list(entries), fontsize=FONT,
               loc="outside right upper" if not ref else "outside lower center", ncols=1 if not ref else 3)
    return fig
