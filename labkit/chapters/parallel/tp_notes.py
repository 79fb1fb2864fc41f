"""The tensor-parallel demo's sentences and chart, from its measured values (taught in chapter 10):
``tp_demo_note`` (a Note: the counts, bytes, equivalence errors and step times per version) and
``plot_tp_demo`` (AllReduce calls per block, measured, beside the formula)."""
from __future__ import annotations

from ..course import Note
from ...base.errors import ConfigError

PHASES = ("forward", "backward")
TP_STYLES = {"plain": "the plain-PyTorch TPBlock (f and g as autograd Functions), fused qkv per head",
             "separate": "the plain TPBlock with q, k, v as three column-parallel layers",
             "dtensor": "torch.distributed.tensor.parallel (ColwiseParallel/RowwiseParallel) on a DeviceMesh"}


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
                     f"{s['loss_error']:.1e} | {s['grad_error']:.1e} | {1e3 * s['step_s']:.1f} ms |")
    lines.append(f"| unsplit (one process) | 0 | 0 | | | | | {1e3 * demo['unsplit_step_s']:.1f} ms |")
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
                     f"layout; a step took {s['step_s'] / demo['unsplit_step_s']:.2f}x the unsplit model's.")
    cd = demo.get("dtensor", {}).get("commdebug_per_block")
    if cd:
        lines += ["", f"Cross-check: torch's own `CommDebugMode`, around one DTensor block's attention and MLP "
                  f"called directly, counts {cd['forward']} AllReduce calls forward and {cd['backward']} backward "
                  "(around the whole Block its module tracker fails on torch 2.13: Block calls its dropout "
                  "module twice)."]
    faster = [k for k in TP_STYLES if k in demo and demo[k]["step_s"] < demo["unsplit_step_s"]]
    slow = [k for k in TP_STYLES if k in demo and k not in faster]
    lines += ["", (f"Faster than the unsplit model here: {', '.join(faster)}" if faster else
                   "No TP version beat the unsplit model here")
              + (f"; slower: {', '.join(slow)}" if faster and slow else "") + ". At this size a rank's halved "
              "matmuls save little next to an AllReduce's fixed cost (and, for DTensor, its Python per op); TP "
              "pays off when one GPU's matmuls are large -- and its AllReduces fast (the link table below)."]
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
