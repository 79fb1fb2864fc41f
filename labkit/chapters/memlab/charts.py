"""The memory chapter's charts (taught in chapter 08; plot_update_peaks in chapter 03): each draws a
memlab tool's result on the course's one figure maker (tools.plots.new_figure) at its text sizes."""
from __future__ import annotations

from ...engine.config import ConfigError
from ._common import MIB, _rows, _size
from .updates import _first_updates_result


def plot_seq_sweep(rows, width: float = 6.0, height: float = 3.0):
    """Measured activation bytes against T (dots) and the formula (lines), one colour per backend, on linear
    axes so that the math backend's T² term shows as a bend."""
    rows = _rows(rows, "measured_bytes")
    _size(width, height)
    from ...tools.plots import FONT as font, new_figure  # deferred: matplotlib is heavy; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    colors = {"auto": "#4c72b0", "math": "#c44e52", "flash": "#4c72b0"}
    for att in dict.fromkeys(r["attention"] for r in rows):
        pts = [r for r in rows if r["attention"] == att]
        xs = [r["seq_len"] for r in pts]
        ax.plot(xs, [r["measured_bytes"] / MIB for r in pts], "o", color=colors.get(att, "#555555"),
                label=f"{att}: measured")
        ax.plot(xs, [r["formula_total"] / MIB for r in pts], "-", color=colors.get(att, "#555555"), lw=1,
                label=f"{att}: formula")
    lens = sorted({r["seq_len"] for r in rows})
    ax.set_xticks(lens, [str(t) for t in lens])  # linear axes: a straight line is linear in T, a bend is T²
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("sequence length T", fontsize=font)
    ax.set_ylabel("activation MiB kept for backward", fontsize=font)
    ax.tick_params(labelsize=font)
    ax.legend(fontsize=font)
    return fig


ROLE_COLORS = {"weights": "#4c72b0", "master": "#64b5cd", "grads": "#dd8452", "accumulator": "#ccb974",
               "optimizer": "#55a868", "activations": "#c44e52"}
# the chapter's tables' words for the roles: a legend that says "grads" beside a table that says "gradients" reads
# as two different things
ROLE_WORDS = {"weights": "weights", "master": "master", "grads": "gradients", "accumulator": "accumulator",
              "optimizer": "AdamW state", "activations": "activations"}


def plot_first_updates(result: dict, width: float = 9.0, height: float = 3.4):
    """Stacked bytes by role after each phase of the first updates, with each update's peak as a line."""
    _first_updates_result(result, need=1)
    _size(width, height)
    from ...tools.plots import FONT as font, TITLE as title, new_figure  # deferred: matplotlib is heavy; loaded to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    ms = result["moments"]
    bottom = [0.0] * len(ms)
    for role in ("weights", "optimizer", "grads", "activations"):
        vals = [m[role] / MIB for m in ms]
        ax.bar(range(len(ms)), vals, bottom=bottom, color=ROLE_COLORS[role], label=ROLE_WORDS[role])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for name, peak in result["peaks"].items():
        idx = [j for j, m in enumerate(ms) if m["moment"].startswith(name + ":")]
        if idx:
            ax.hlines(peak / MIB, idx[0] - 0.4, idx[-1] + 0.4, colors="#222222", linestyles="--", lw=1)
            ax.text(idx[0] - 0.4, peak / MIB, f" peak of {name}", fontsize=font, va="bottom")
    # two lines a tick ("update 1" / "forward done"): the labels stay apart at the chart's width
    ax.set_xticks(range(len(ms)), [m["moment"].replace(": ", "\n").replace("optimizer step", "step")
                                   for m in ms], fontsize=font)
    ax.set_ylabel("MiB", fontsize=font)
    ax.tick_params(axis="y", labelsize=font)
    ax.set_ylim(0, max(result["peaks"].values()) / MIB * 1.25)
    ax.legend(fontsize=font, loc="upper left", ncols=4)
    ax.set_title(f"held bytes by role ({result['source']})", fontsize=title)
    return fig


def plot_update_peaks(by_k: dict, by_mb: dict, width: float = 6.5, height: float = 3.2):
    """Chapter 03: one update's peak (update_peak) against the effective batch, grown two ways -- more
    accumulation steps K, or a larger micro-batch -- with the gradients' bytes marked above K = 1."""
    for name, d in (("by_k", by_k), ("by_mb", by_mb)):
        if not isinstance(d, dict) or not d or not all(isinstance(v, dict) and "peak" in v for v in d.values()):
            raise ConfigError(name, type(d).__name__, "{factor: memlab.update_peak(...)}, one entry or more")
    _size(width, height)
    from ...tools.plots import FONT as font, TITLE as title, new_figure  # deferred: matplotlib is heavy; loaded to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    for d, words, marker in ((by_k, "raise K", "o-"), (by_mb, "raise the micro-batch (K = 1)", "s--")):
        eff = [v["accum"] * v["micro_batch"] for v in d.values()]
        ax.plot(eff, [v["peak"] / MIB for v in d.values()], marker, label=words)
    one = min(by_k.values(), key=lambda v: v["accum"])
    ax.axhline((one["peak"] + one["grads"]) / MIB, color="#555555", lw=1, ls=":",
               label=f"K = {one['accum']}'s peak + the gradients' bytes")
    ax.set_xticks(sorted({v["accum"] * v["micro_batch"] for d in (by_k, by_mb) for v in d.values()}))
    ax.set_xlabel("effective batch (sequences per update)", fontsize=font)
    ax.set_ylabel("peak of one update, MiB", fontsize=font)
    ax.set_ylim(bottom=0)
    ax.tick_params(labelsize=font)
    ax.legend(fontsize=font, loc="lower right")
    ax.set_title("peak of one update, " + ("from the CUDA allocator" if one["device"] == "cuda" else
                                           "counted by labkit's tracer"), fontsize=title)
    return fig


def plot_bytes_per_param(rows, width: float = 7.5, height: float = 2.8):
    """One horizontal stacked bar per recipe: bytes per parameter by role."""
    rows = _rows(rows, "n_params")
    _size(width, height)
    from ...tools.plots import FONT as font, new_figure  # deferred: matplotlib is heavy; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    roles = ("weights", "grads", "master", "accumulator", "optimizer")
    for i, r in enumerate(rows):
        left = 0.0
        for role in roles:
            v = r[role] / r["n_params"]
            if v:
                ax.barh(i, v, left=left, color=ROLE_COLORS[role])
                ax.text(left + v / 2, i, f"{v:.0f}", ha="center", va="center", fontsize=font, color="white")
            left += v
    # the long recipe names on two lines: at this width they would otherwise take half the chart
    ax.set_yticks(range(len(rows)), [r["recipe"].replace(" + fp32 grad", "\n+ fp32 grad") for r in rows],
                  fontsize=font)
    ax.set_xlabel("bytes per parameter kept between updates", fontsize=font)
    ax.tick_params(axis="x", labelsize=font)
    from matplotlib.patches import Patch  # deferred: matplotlib is optional; loaded only to draw

    # the legend in the bars' own left-to-right order (not in the order rows first use a role), roles shown only
    used = [role for role in roles if any(r[role] for r in rows)]
    fig.legend([Patch(color=ROLE_COLORS[role]) for role in used], [ROLE_WORDS[role] for role in used], fontsize=font,
               loc="outside lower center", ncols=len(used))
    ax.invert_yaxis()
    return fig
