"""Chapter 07's pictures (taught in chapter 07): the MFU sweeps, the profiled step's shares, the attention
backends and the AdamW implementations -- matplotlib Figures from labkit's one figure maker
(``labkit.tools.plots.new_figure``), no pyplot."""
from __future__ import annotations

from ...base.numfmt import counted, number
from ...engine.measure import median
from .common import _pct

__all__ = ["plot_sweeps", "plot_shares", "plot_attention", "plot_optimizers", "KIND_COLORS", "KIND_WORDS"]

# Font sizes in points. Figures are drawn at 80 dpi and shown at their own width (720 px for 9 inches, inside
# JupyterLab's ~800-900 px output), so 9.5 pt is about 10.5 px on screen: the course's smallest readable text.
FS_SMALL, FS_LABEL, FS_TITLE = 9.5, 10, 11
DPI = 80


def _log_y(ax, values) -> None:
    """A log y axis that shows its values with readable plain-number ticks (not only 10⁰ and 10¹)."""
    vals = [v for v in values if v and v > 0]
    ax.set_yscale("log")
    if not vals:
        return
    lo, hi = min(vals) / 1.25, max(vals) * 1.25  # a margin, so the end points do not sit on the frame
    ax.set_ylim(lo, hi)
    from ...tools.plots import log_ticks  # deferred: matplotlib is optional; loaded only to draw

    ticks = log_ticks(lo, hi)
    if len(ticks) < 2:  # a range narrower than 1-2-3: label its two ends (two significant digits)
        ticks = [float(f"{v:.2g}") for v in (lo * 1.1, hi / 1.1)]
    ax.set_yticks(ticks, [number(t, 6) for t in ticks])
    ax.yaxis.set_minor_formatter(_null_formatter())


def plot_sweeps(sweeps: dict, width: float = 9.0, height: float = 4.6):
    """One column per sweep ({title: rows from mfu_sweep}). Top: MFU (median, whiskers from the lowest to the
    highest run; left axis) and model FLOPs per token (right axis, dashed) against the knob's value. Bottom:
    where each token's time went -- compute (forward + backward), optimizer, data wait (medians)."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=DPI)  # labkit's one figure maker, at this chapter's 80 dpi
    axes = fig.subplots(2, len(sweeps), squeeze=False)
    parts = (("compute", "compute", "#4c72b0"), ("optimizer", "optimizer", "#dd8452"),
             ("data_wait", "data wait", "#c44e52"))
    for col, (title, rows) in enumerate(sweeps.items()):
        ax, bx = axes[0][col], axes[1][col]
        xs = [r["value"] for r in rows]
        mfu = [_pct(r, "mfu") for r in rows]
        low = [m - _pct(r, "mfu_low") for m, r in zip(mfu, rows)]    # single runs: no whisker
        high = [_pct(r, "mfu_high") - m for m, r in zip(mfu, rows)]
        ax.errorbar(xs, mfu, yerr=[low, high], fmt="o-", color="#4c72b0", ecolor="#555555", capsize=3, label="MFU")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylabel("MFU (%)", fontsize=FS_LABEL, color="#4c72b0")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot(xs, [r["flops_per_token"] / 1e6 for r in rows], "s--", color="#999999", label="FLOPs per token")
        ax2.set_ylabel("model MFLOP per token", fontsize=FS_LABEL, color="#777777")
        ax2.set_ylim(bottom=0)
        runs = rows[0].get("runs", 1) if rows else 1
        ax.set_title(f"{title} (median of {counted(runs, 'run')})", fontsize=FS_TITLE)
        ax2.tick_params(labelsize=FS_SMALL)
        pos = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        for key, words, color in parts:
            vals = [r.get(f"{key}_us_per_token") or 0.0 for r in rows]
            bx.bar(pos, vals, bottom=bottom, color=color, label=words)
            bottom = [b + v for b, v in zip(bottom, vals)]
        bx.set_xticks(pos, [str(x) for x in xs])
        bx.set_xlabel(rows[0]["field"] if rows else "", fontsize=FS_LABEL)
        bx.set_ylabel("µs per token", fontsize=FS_LABEL)
        for a in (ax, bx):
            a.tick_params(labelsize=FS_SMALL)
    # one legend under the figure, not inside a panel: inside, it covers the tallest bar (micro-batch 1's)
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=FS_SMALL, loc="outside lower center", ncols=len(parts),
               title="each token's time (medians)", title_fontsize=FS_SMALL)
    return fig


KIND_COLORS = {"matmul": "#4c72b0", "attention": "#8172b3", "other": "#dd8452", "range": "#bbbbbb",
               "idle": "#e8e8e8"}
KIND_WORDS = {"matmul": "matmuls", "attention": "attention kernels", "other": "element-wise, norms, copies",
              "range": "outside ops (Python, autograd)", "idle": "GPU idle between kernels"}


def plot_shares(tables: dict, width: float = 7.5, height: float = 2.8):
    """One horizontal bar per profiled step ({label: ProfileTable}), split by kind of operation -- and, for a
    GPU step timed apart, the share of its wall time in which the GPU ran no kernel."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=DPI)  # labkit's one figure maker, at this chapter's 80 dpi
    ax = fig.add_subplot()
    labels = list(tables)
    kinds = [k for k in KIND_COLORS if any(k in t.kinds() for t in tables.values())]
    for i, name in enumerate(labels):
        left = 0.0
        for kind in kinds:
            share = 100 * tables[name].share(kind) if kind in tables[name].kinds() else 0.0
            ax.barh(i, share, left=left, color=KIND_COLORS[kind], label=KIND_WORDS[kind] if i == 0 else None,
                    edgecolor="#999999" if kind == "idle" else None, linewidth=0.5)
            if share >= 7:
                ax.text(left + share / 2, i, f"{share:.0f}%", ha="center", va="center", fontsize=FS_SMALL,
                        color="#333333" if kind in ("idle", "range") else "white")
            left += share
    ax.set_yticks(range(len(labels)), labels, fontsize=FS_LABEL)
    ax.set_xlim(0, 100)
    bases = {t.basis_words() for t in tables.values()}
    basis = bases.pop() if len(bases) == 1 else "of each step"  # mixed: the table's column says each
    ax.set_xlabel(f"% {basis}", fontsize=FS_LABEL)
    ax.tick_params(labelsize=FS_SMALL)
    fig.legend(fontsize=FS_SMALL, loc="outside lower center", ncols=3)
    ax.invert_yaxis()
    return fig


def plot_attention(rows, width: float = 9.0, height: float = 3.4):
    """Time and peak memory of forward + backward against sequence length, one line per backend (log-log,
    labelled with plain numbers)."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=DPI)  # labkit's one figure maker, at this chapter's 80 dpi
    a1, a2 = fig.subplots(1, 2)
    colors = {"math": "#c44e52", "flash": "#4c72b0", "efficient": "#55a868", "cudnn": "#8172b3"}
    ys = {a1: [], a2: []}
    for be in dict.fromkeys(r["backend"] for r in rows):
        pts = [r for r in rows if r["backend"] == be and "error" not in r]
        if not pts:
            continue
        xs = [r["seq_len"] for r in pts]
        ms, mib = [1e3 * r["time_s"] for r in pts], [r["peak_bytes"] / 2**20 for r in pts]
        a1.plot(xs, ms, "o-", color=colors.get(be), label=be)
        a2.plot(xs, mib, "o-", color=colors.get(be), label=be)
        ys[a1] += ms
        ys[a2] += mib
    lens = sorted({r["seq_len"] for r in rows})
    for ax, what in ((a1, "ms per forward + backward"), (a2, "peak MiB held")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens, [str(t) for t in lens])
        ax.xaxis.set_minor_formatter(_null_formatter())
        _log_y(ax, ys[ax])
        ax.grid(True, which="major", color="#eeeeee")
        ax.set_xlabel("sequence length T", fontsize=FS_LABEL)
        ax.set_ylabel(what, fontsize=FS_LABEL)
        ax.tick_params(labelsize=FS_SMALL)
        ax.legend(fontsize=FS_SMALL)
    a1.set_title("time", fontsize=FS_TITLE)
    a2.set_title("memory (math holds the T×T matrix)", fontsize=FS_TITLE)
    return fig


def _null_formatter():
    from matplotlib.ticker import NullFormatter  # deferred: matplotlib is optional; loaded only to draw

    return NullFormatter()


def plot_optimizers(times: dict, width: float = 5.0, height: float = 2.4):
    """Every repeat of each AdamW implementation's step (ms), with its median."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=DPI)  # labkit's one figure maker, at this chapter's 80 dpi
    ax = fig.add_subplot()
    for i, (impl, ts) in enumerate(times.items()):
        ax.plot([1e3 * t for t in ts], [i] * len(ts), "o", alpha=0.5, color="#4c72b0")
        ax.plot([1e3 * median(ts)], [i], "|", markersize=18, color="#222222")
    ax.set_yticks(range(len(times)), list(times), fontsize=FS_LABEL)
    ax.set_xlabel("ms per optimizer.step() (dots: repeats, bar: median)", fontsize=FS_LABEL)
    ax.set_xlim(left=0)
    ax.invert_yaxis()
    return fig
