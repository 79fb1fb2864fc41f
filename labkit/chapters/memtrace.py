"""What autograd keeps for backward, op by op, and how held memory moves through one training step.

    trace = labkit.memtrace.trace_step(config)            # one forward + backward on a fresh copy
    trace.kept()                                           # tensors alive after forward: op, shape, bytes
    trace.block_bytes()                                    # {block index: bytes kept}
    trace.timeline()                                       # held bytes after every op, forward to backward
    labkit.memtrace.plot_timelines({"none": t1, "full": t2})

How it works (``labkit.tracer``, the one dispatch tracer): a ``TorchDispatchMode`` sees every ATen op
of the step -- forward, checkpoint recompute and backward alike -- and remembers the storage of every
tensor each op creates. A storage is *held* from the op that created it until it is freed; the mode
checks after every op which storages have died. What is
still alive when the forward pass ends is exactly what backward will need: the tensors autograd saved,
plus whatever a checkpoint policy decided to keep (a saved-tensors hook alone cannot see the latter).
Parameters are never counted; autocast's low-precision weight copies are counted separately.

Nothing here touches a model being trained: ``trace_step`` builds its own copy of the architecture.
"""
from __future__ import annotations

import torch

from ..engine.device import capabilities, torch_device
from ..engine.measure import attention_backend
from ..engine.model import GPT
from ..engine.precision import autocast
# the tracer lives in a module of its own, which measure's probe imports too; its names stay importable here
from ..engine.tracer import CATEGORIES, PHASES, Held, Trace, Tracer, block_of  # noqa: F401
from ..engine.limits import block_bytes_formula  # the engine's formula; chapter 04 compares it with the trace

__all__ = ["Trace", "Tracer", "trace_step", "trace_model", "block_bytes_formula", "plot_timelines",
           "kept_table", "options_table"]

# The timeline's colours, one per category (tracer.CATEGORIES), in stacking order.
COLORS = {"forward": "#4c72b0", "recompute": "#dd8452", "backward": "#55a868", "weight_copy": "#8172b3"}


def _attention(name: str):
    return attention_backend(name)


def trace_model(model, idx, targets, *, precision: str = "fp32", attention: str = "auto", label: str = "") -> Trace:
    """Trace one forward + backward of ``model`` (anything called as ``model(idx, targets) -> loss``)."""
    kind = idx.device.type
    model.zero_grad(set_to_none=True)
    tracer = Tracer(model)
    with _attention(attention), tracer:
        with autocast(kind, precision):
            loss = model(idx, targets)
        tracer.end_forward()
        loss.backward()
        del loss
        trace = tracer.finish(model)
    trace.label = label
    return trace


def trace_step(config, batch: int | None = None, device=None, label: str = "", seed: int = 0) -> Trace:
    """Trace one training step (forward + backward, no optimizer) of ``config``'s model on a fresh copy.
    ``batch`` defaults to the config's micro-batch."""
    spec = config.spec
    dev = torch.device(device) if device is not None else _device_of(config)
    with torch.random.fork_rng(devices=[]):  # a fresh copy with the engine's weights; the caller's RNG untouched
        torch.manual_seed(seed)
        model = GPT(spec, checkpointing_mode=config.checkpointing, checkpoint_every=config.checkpoint_every)
    model = model.to(dev)
    g = torch.Generator().manual_seed(seed)
    B = batch or config.micro_batch
    idx = torch.randint(0, 256, (B, spec.seq_len), generator=g).to(dev)
    tgt = torch.randint(0, 256, (B, spec.seq_len), generator=g).to(dev)
    trace = trace_model(model, idx, tgt, precision=config.precision, attention=config.attention,
                        label=label or describe(config))
    del model
    return trace


def _device_of(config):
    return torch_device(capabilities(config.device).kind)


def describe(config) -> str:
    if config.checkpointing == "full":
        return "full" if config.checkpoint_every == 1 else f"every {config.checkpoint_every}"
    if config.checkpointing == "attention" and config.checkpoint_every > 1:  # it honours k too
        return f"attention every {config.checkpoint_every}"
    return config.checkpointing


# ---- the formula -------------------------------------------------------------------------------

# ---- tables and pictures -------------------------------------------------------------------------

def _fmt_bytes(b: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= size:
            return f"{b / size:.2f} {unit}"
    return f"{int(b)} B"


def kept_table(trace: Trace, module_prefix: str | None = None, limit: int | None = None) -> str:
    """A markdown table of what the forward pass keeps (optionally one module's rows only)."""
    rows = [r for r in trace.kept(include_weight_copies=True)
            if module_prefix is None or r["module"] == module_prefix or r["module"].startswith(module_prefix + ".")]
    lines = ["| # | module | op that made it | shape | dtype | bytes |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(rows[:limit] if limit else rows):
        what = r["op"] + (" (weight copy)" if r["weight_copy"] else "")
        lines.append(f"| {i + 1} | `{r['module'] or '(top)'}` | `{what}` | {list(r['shape'])} | {r['dtype']} | "
                     f"{_fmt_bytes(r['bytes'])} |")
    total = sum(r["bytes"] for r in rows)
    lines.append(f"| | **total** | | | | **{_fmt_bytes(total)}** |")
    return "\n".join(lines)


def options_table(rows: list) -> str:
    """Markdown table of checkpointing options: dicts with name, activation_bytes, step_time_s, hfu_over_mfu."""
    lines = ["| option | activation memory | step time | hardware / model FLOPs |", "|---|---|---|---|"]
    for r in rows:
        st = r.get("step_time_s")
        lines.append(f"| {r['name']} | {_fmt_bytes(r['activation_bytes'])} | "
                     f"{'n/a' if st is None else f'{1000 * st:.0f} ms'} | {r.get('flops_ratio', float('nan')):.2f} |")
    return "\n".join(lines)


def plot_timelines(traces: dict, width: float = 9.0, height: float = 3.0):
    """One panel per trace: held bytes after every op, stacked by category, forward/backward marked.
    All panels share the y axis, so the heights compare directly."""
    from ..tools.plots import FONT, TITLE, new_figure  # deferred: matplotlib is optional; loaded only to draw

    n = len(traces)
    fig = new_figure(width, height)
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    scale, unit = 2**20, "MiB"
    for ax, (name, tr) in zip(axes, traces.items()):
        t = tr.timeline()
        x = t["index"]
        ys = [[v / scale for v in t[c]] for c, _ in CATEGORIES]
        labels = [words for _, words in CATEGORIES]
        colors = [COLORS[c] for c, _ in CATEGORIES]
        keep = [i for i, y in enumerate(ys) if any(y)]
        ax.stackplot(x, *[ys[i] for i in keep], labels=[labels[i] for i in keep], colors=[colors[i] for i in keep],
                     linewidth=0)
        ax.axvline(tr.forward_end, color="#222222", lw=1, ls="--")
        ax.text(tr.forward_end, 0.97, " backward →", fontsize=FONT, va="top", transform=ax.get_xaxis_transform())
        ax.text(tr.forward_end, 0.97, "← forward ", fontsize=FONT, va="top", ha="right",
                transform=ax.get_xaxis_transform())
        ax.set_title(name, fontsize=TITLE)
        ax.set_xlabel("op number in the step", fontsize=FONT)
        ax.tick_params(labelsize=FONT)
    axes[0].set_ylabel(f"held bytes ({unit})", fontsize=FONT)
    axes[0].set_ylim(0, axes[0].get_ylim()[1] * 1.15)  # room for the labels
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    # two columns at most: four categories in one row would run past a narrow figure's edges
    fig.legend(handles, labels, fontsize=FONT, loc="outside lower center", ncols=min(len(labels), 2 if width < 7 else 4))
    return fig
