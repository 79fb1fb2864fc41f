"""The tensor-parallel demo's sentences and chart, from its measured values (taught in chapter 10):
``tp_demo_note`` (a Note: the counts, bytes, equivalence errors and step times per version),
``step_time_verdict`` (faster / slower than the unsplit model only where the interquartile ranges of the
timed steps are apart; else "within noise") and ``plot_tp_demo`` (AllReduce calls per block, measured,
beside the formula)."""
from __future__ import annotations

import statistics

from ..course import Note
from ...base.errors import ConfigError

PHASES = ("forward", "backward")
MIN_STEPS = 3  # timed steps per version before a faster/slower is stated: quartiles need a few
TP_STYLES = {"plain": "the plain-PyTorch TPBlock (f and g as autograd Functions), fused qkv per head",
             "separate": "the plain TPBlock with q, k, v as three column-parallel layers",
             "dtensor": "torch.distributed.tensor.parallel (ColwiseParallel/RowwiseParallel) on a DeviceMesh"}


def quartiles(times) -> tuple:
    """(first quartile, median, third quartile) of a list of step times (all three the one value if one)."""
    xs = sorted(times)
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def step_time_verdict(times, unsplit_times) -> str:
    """'faster', 'slower', 'within noise' (the interquartile ranges overlap) or 'too few steps' (fewer than
    ``MIN_STEPS`` on either side): what one version's timed steps allow saying against the unsplit model's."""
    if len(times) < MIN_STEPS or len(unsplit_times) < MIN_STEPS:
        return "too few steps"
    (a1, _, a3), (b1, _, b3) = quartiles(times), quartiles(unsplit_times)
    if a1 <= b3 and b1 <= a3:
        return "within noise"
    return "faster" if a3 < b1 else "slower"


def _ms(times) -> str:
    """'26.3 ms (25.1-27.9)': the median and, for several steps, the interquartile range."""
    q1, q2, q3 = quartiles(times)
    return f"{1e3 * q2:.1f} ms" + (f" ({1e3 * q1:.1f}–{1e3 * q3:.1f})" if len(times) > 1 else "")


def _timing_sentence(demo: dict) -> str:
    styles = [k for k in TP_STYLES if k in demo]
    unsplit = demo["unsplit_step_times"]
    by = {k: step_time_verdict(demo[k]["step_times"], unsplit) for k in styles}
    n = min([len(unsplit)] + [len(demo[k]["step_times"]) for k in styles])
    said = f"Timed steps: {n} per version (warm-up excluded), median and interquartile range in the table"
    load, cores = demo.get("load"), demo.get("cores")
    if load is not None and cores:
        said += f"; the machine's 1-minute load was {load:.1f} on {cores} cores"
        if load >= cores:
            said += " -- the cores were shared, so these times measure the contention as much as TP"
    said += ". "
    if n < MIN_STEPS:
        return said + (f"Too few steps to say faster or slower (at least {MIN_STEPS} each are needed to set "
                       "the spreads side by side).")
    groups = {v: [k for k in styles if by[k] == v] for v in ("faster", "slower", "within noise")}
    parts = [f"{label}: {', '.join(groups[v])}" for v, label in
             (("faster", "faster than the unsplit model"), ("slower", "slower"),
              ("within noise", "within noise of it (the interquartile ranges overlap)")) if groups[v]]
    verdicts = "; ".join(parts)
    if load is not None and cores and load >= cores:  # a verdict of this moment's machine, said so
        return said + "Under this load, " + verdicts + "."
    return said + verdicts[0].upper() + verdicts[1:] + "."


def _counter_sentence(demo: dict) -> str:
    """Which mode counted the collectives, and why -- as tried on the running torch, in the ranks."""
    if demo.get("counter") == "CommDebugMode":
        return (f"Counted with torch's own `CommDebugMode` (`torch.distributed.tensor.debug`): on this torch "
                f"({demo.get('torch', '?')}) it traced labkit's Block, forward and backward, so the course's own counter "
                "was not needed.")
    why = demo.get("counter_why", "")
    return (f"Counted with the course's own dispatch mode (`CollectiveCounter`, the collectives `CommDebugMode` "
            f"counts, without its module tracker): on this torch ({demo.get('torch', '?')}) `CommDebugMode` failed "
            f"on labkit's Block (`{why}`)" + (" -- its module tracker pops its parent stack twice when a module "
                                              "runs twice in one forward, and Block calls its dropout module twice"
                                              if why.startswith("IndexError") else "") + ".")


def tp_demo_note(demo: dict) -> Note:
    """The demo's sentences, from its measured values."""
    if not demo.get("ok"):
        return Note(f"The tensor-parallel demo did not run here: {demo.get('error')}.")
    n, gpus = demo["world_size"], demo.get("gpus", 0)
    where = f"NCCL on {n} GPUs" if demo["kind"] == "cuda" else f"gloo on this machine's CPU ({n} processes)"
    if demo["kind"] != "cuda" and gpus:
        where += f"; this machine has {gpus} GPU{'s' if gpus > 1 else ''}, fewer than {n} ranks, so they ran on the CPU"
    lines = [f"Measured with {where}, model {demo['model']!r} ({demo['n_layer']} blocks), micro-batch "
             f"{demo['micro_batch']}:", "",
             "| version | AllReduce / block fwd | bwd | expected | bytes per call | loss diff | max grad diff | step |",
             "|---|---|---|---|---|---|---|---|"]
    for style in TP_STYLES:
        if style not in demo:
            continue
        s = demo[style]
        c, e = s["calls_per_block"], s["expected_calls"]
        by = ", ".join(f"{b:,}" for b in s["bytes_per_call"]) or "(not counted per call)"
        lines.append(f"| {style} | {c['forward']:g} | {c['backward']:g} | {e['forward']} + {e['backward']} | {by} | "
                     f"{s['loss_error']:.1e} | {s['grad_error']:.1e} | {_ms(s['step_times'])} |")
    lines.append(f"| unsplit (one process) | 0 | 0 | | | | | {_ms(demo['unsplit_step_times'])} |")
    for style, s in ((k, demo[k]) for k in TP_STYLES if k in demo):
        c, e = s["calls_per_block"], s["expected_calls"]
        match = all(c[p] == e[p] for p in PHASES) and s["bytes_per_call"] == [demo["expected_bytes"]]
        lines.append("")
        lines.append(f"**{style}**: {c['forward']:g} AllReduce calls per block forward and {c['backward']:g} "
                     f"backward, each of {', '.join(f'{b:,}' for b in s['bytes_per_call'])} bytes -- "
                     + ("as the formula says" if match else "NOT what the formula says") +
                     f" ({e['forward']} and {e['backward']}, {demo['expected_bytes']:,} bytes: one (micro-batch, "
                     f"seq_len, d_model) fp32 activation). Loss within {s['loss_error']:.1e} of the unsplit "
                     f"model's on every rank, gradients within {s['grad_error']:.1e} once mapped back to the full "
                     f"layout; its median step took {s['step_s'] / demo['unsplit_step_s']:.2f}x the unsplit model's "
                     f"({step_time_verdict(s['step_times'], demo['unsplit_step_times'])}).")
    lines += ["", _counter_sentence(demo)]
    cd = demo.get("dtensor", {}).get("commdebug_per_block")
    if cd:
        lines += ["", f"Cross-check: torch's own `CommDebugMode`, around one DTensor block's attention and MLP "
                  f"called directly (not the whole Block, where it fails here), counts {cd['forward']} AllReduce "
                  f"calls forward and {cd['backward']} backward."]
    lines += ["", _timing_sentence(demo) + " At this size a rank's halved matmuls save little next to an "
              "AllReduce's fixed cost (and, for DTensor, its Python per op); TP pays off when one GPU's matmuls "
              "are large -- and its AllReduces fast (the link table below)."]
    if demo.get("unchanged_attention_error") is not None:
        err = demo["unchanged_attention_error"]
        lines += ["", "ColwiseParallel on labkit's fused `attn.qkv` with its Attention as written: "
                  + (f"`{err}`" if err else "it ran (and computed the wrong heads)") + "."]
    return Note("\n".join(lines))


def plot_tp_demo(demo: dict, width: float = 7.0, height: float = 2.6):
    """Measured AllReduce calls per block, forward and backward, per version, against the formula."""
    if not isinstance(demo, dict) or not demo.get("ok"):
        raise ConfigError("demo", type(demo).__name__, "the dict tp_demo returns, with ok True")
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot(1, 1, 1)
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
