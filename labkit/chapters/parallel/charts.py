"""Chapter 10's charts (taught in chapter 10), each drawn from a demo's measured result: FSDP2's bytes per rank
and its collectives against the unit structure, the TP demo's AllReduce calls per block, a pipeline step's
timeline and its bubble against m. Each returns a Figure (``display(...)`` it); the words around them are the
chapter's.

    display(par.fsdp_calls_chart(lab)); display(par.plot_bubble(demo, "gpipe"))
"""
from __future__ import annotations

from ...base.errors import ConfigError
from .fsdp_rows import MEMORY_PARTS, calls_rows
from .pipeline import find_run
from .tensor import TP_STYLES


def _figure(width, height):
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    return fig, fig.add_subplot(1, 1, 1)


# ---- FSDP2 ------------------------------------------------------------------------------------------------

def fsdp_memory_chart(lab: dict):
    """Bytes per rank against world size: params / grads / AdamW state stacked, measured (the largest rank)
    beside the fp32 formula."""
    fig, ax = _figure(7.0, 2.8)
    sizes = sorted(lab["memory"])
    colors = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
    for i, ws in enumerate(sizes):
        m = lab["memory"][ws]
        big = max(m["ranks"], key=lambda r: r["total"])
        for x, source, hatch in ((i - 0.18, big, None), (i + 0.18, m["formula_fp32"], "//")):
            bottom = 0.0
            for part in MEMORY_PARTS:
                kib = source[part] / 1024
                ax.bar(x, kib, 0.34, bottom=bottom, color=colors[part], hatch=hatch, edgecolor="white",
                       label=part if i == 0 and hatch is None else None)
                bottom += kib
    ax.set_xticks(range(len(sizes)), [f"{ws} rank{'s' if ws > 1 else ''}\nmeasured | formula" for ws in sizes])
    ax.set_ylabel("KiB per rank")
    ax.set_title("Model state per rank under FSDP2 (fp32 + AdamW)")
    ax.legend(frameon=False, fontsize=8)
    return fig


def fsdp_calls_chart(lab: dict):
    """Collective calls counted against the unit structure, one horizontal bar per setting (AllGather per step
    with reshard_after_forward True / False on the blocks and True on the root too; ReduceScatter per update
    syncing every micro-batch / only the last). Horizontal: the settings' names sit one under the other on
    the y axis, where long labels cannot run into each other."""
    rows = calls_rows(lab)
    fig, ax = _figure(7.0, 0.45 * len(rows) + 1.0)
    ys = range(len(rows))
    colors = ["#4c72b0" if r["collective"] == "AllGather" else "#dd8452" for r in rows]
    ax.barh(ys, [r["counted"] for r in rows], 0.6, color=colors, label="counted")
    ax.scatter([r["expected"] for r in rows], ys, marker="|", s=300, color="black", label="unit structure",
               zorder=3)
    for y, r in zip(ys, rows):
        ax.text(r["counted"] / 2, y, str(r["counted"]), ha="center", va="center", fontsize=8, color="white")
    ax.set_yticks(list(ys), [f"{r['collective']} per {r['per']}: {r['setting']}" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("calls on rank 0", fontsize=8)
    ax.set_title(f"FSDP2's collectives, {lab['n_blocks']} blocks + root, rank 0 of {lab['detail_world_size']}",
                 fontsize=9)
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    return fig


# ---- tensor parallelism -----------------------------------------------------------------------------------

def plot_tp_demo(demo: dict, width: float = 7.0, height: float = 2.6):
    """Measured AllReduce calls per block, forward and backward, per version, against the formula."""
    if not isinstance(demo, dict) or not demo.get("ok"):
        raise ConfigError("demo", type(demo).__name__, "the dict tp_demo returns, with ok True")
    fig, ax = _figure(width, height)
    styles = [s for s in TP_STYLES if s in demo]
    for i, phase in enumerate(("forward", "backward")):
        xs = [j + (i - 0.5) * 0.38 for j in range(len(styles))]
        ax.bar(xs, [demo[s]["calls_per_block"][phase] for s in styles], 0.36, label=f"{phase} (measured)",
               color=("#4c72b0", "#dd8452")[i])
        ax.scatter(xs, [demo[s]["expected_calls"][phase] for s in styles], marker="_", s=300, color="black",
                   zorder=3, label="formula" if i else None)
    ax.set_xticks(range(len(styles)), styles)
    ax.set_ylabel("AllReduce calls per block", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Measured on real processes: TP collectives per transformer block", fontsize=9)
    return fig


# ---- pipeline ---------------------------------------------------------------------------------------------

def plot_pipeline(result: dict, schedule: str = "gpipe", m: int = 4, width: float = 7.5, height: float = 2.4):
    """The measured timeline of one step: a row per stage, a box per forward (light) and backward (dark)
    from its timestamps; the white space is the stage's idle time (waiting, the bubble)."""
    run = find_run(result, schedule, m)
    fig, ax = _figure(min(width, 8.0), min(height, 3.0))
    ms = 1e3
    for s, actions in enumerate(run["timeline"]["actions"]):
        for kind, i, _, t1, t2 in actions:
            color = "#9ecae1" if kind == "F" else "#3182bd"
            ax.barh(s, (t2 - t1) * ms, left=t1 * ms, height=0.7, color=color, edgecolor="white", linewidth=0.5)
            if (t2 - t1) / run["timeline"]["step_s"] > 0.03:
                ax.text((t1 + t2) / 2 * ms, s, f"{kind}{i}", ha="center", va="center", fontsize=6,
                        color="black" if kind == "F" else "white")
    ax.set_yticks(range(run["p"]))
    ax.set_yticklabels([f"stage {s}" for s in range(run["p"])], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step began (light: forward, dark: backward, white: idle)", fontsize=8)
    ax.set_title(f"{schedule}, p={run['p']}, m={m}: measured idle share {run['bubble']:.0%} of the step "
                 f"(formula (p-1)/(m+p-1) = {run['formula']:.0%})", fontsize=8)
    ax.tick_params(labelsize=7)
    return fig


def plot_bubble(result: dict, schedule: str = "gpipe", width: float = 6.5, height: float = 2.6):
    """The measured idle share of the step (mean over stages, and each stage) against (p-1)/(m+p-1) and the
    replay (the measured compute times put into the schedule)."""
    runs = sorted((r for r in result["runs"] if r["schedule"] == schedule), key=lambda r: r["m"])
    if not runs:
        raise ConfigError("schedule", schedule, "a schedule the demo ran")
    fig, ax = _figure(min(width, 8.0), min(height, 3.0))
    ms = [r["m"] for r in runs]
    ax.plot(ms, [r["formula"] for r in runs], "s--", color="gray", label="(p-1)/(m+p-1)")
    ax.plot(ms, [r["bubble"] for r in runs], "o-", color="#c44e52", label="measured, mean of stages")
    ax.plot(ms, [r["replayed"]["bubble"] for r in runs], "^:", color="#4c72b0",
            label="replayed (same compute, nothing else)")
    for s in range(result["stages"]):
        ax.plot(ms, [r["stage_bubble"][s] for r in runs], ".", alpha=0.6, label=f"measured, stage {s}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms)
    ax.set_xticklabels([str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches m", fontsize=8)
    ax.set_ylabel("idle share of the step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return fig
