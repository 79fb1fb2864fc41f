"""Memory instruments two chapters share: one update's bytes trained by hand (03, 08) and one traced step
(04, 08). Arguments are refused before any work (ConfigError). On CUDA the allocator's numbers
(``AllocatorPeak``); elsewhere labkit's dispatch tracer counts storage by storage."""
from __future__ import annotations

import torch

from ..engine.config import Config, ConfigError, _int, _num
from ..engine.data import make_loader
from ..engine.device import capabilities, torch_device
from ..engine.measure import attention_backend, state_bytes
from ..engine.model import GPT
from ..engine.precision import autocast
from ..engine.step import make_optimizer
from ..engine.tracer import CATEGORIES, Trace, Tracer

MIB = 2**20


def _config(value, name: str = "config") -> Config:
    if not isinstance(value, Config):
        raise ConfigError(name, value, "a labkit.Config, e.g. lk.Config(model='tiny')")
    return value


def _threads(n) -> None:
    if n is not None:
        _int("n_threads", n, 1, 1024)


def _items(name: str, values, check) -> list:
    """``values`` as a non-empty list, each item passed through ``check(f"{name}[i]", item)``."""
    listed = not isinstance(values, (str, bytes, dict)) and hasattr(values, "__iter__")
    out = list(values) if listed else []
    if not out:
        raise ConfigError(name, values, "a non-empty list, e.g. [64, 128]")
    for i, v in enumerate(out):
        check(f"{name}[{i}]", v)
    return out


def _seq_lens(seq_lens) -> list:
    return _items("seq_lens", seq_lens, lambda n, v: _int(n, v, 2, 65536))  # Config's own seq_len range


def _rows(rows, need: str) -> list:
    """A non-empty list of the dicts a chapter's tool returned (``need``: a key every row has)."""
    out = list(rows) if isinstance(rows, (list, tuple)) else None
    if not out or not all(isinstance(r, dict) and need in r for r in out):
        raise ConfigError("rows", type(rows).__name__, f"the non-empty list of rows the chapter's tool returned "
                                                        f"(dicts with {need!r})")
    return out


def _size(width, height) -> None:
    _num("width", width, 1.0, 30.0)
    _num("height", height, 1.0, 30.0)


class _Counter:
    """Bytes of the tensors held at a moment, by role: counted storage by storage on a CPU; on CUDA also
    what the allocator says (memory_allocated)."""

    def __init__(self, model, opt, dev):
        self.model, self.opt, self.dev = model, opt, dev

    def weights(self) -> int:
        return state_bytes(self.model.parameters())

    def grads(self) -> int:
        return state_bytes(p.grad for p in self.model.parameters())

    def optimizer(self) -> int:
        return sum(state_bytes(s.values()) for s in self.opt.state.values())

    def held(self) -> int:
        return self.weights() + self.grads() + self.optimizer()

    def allocated(self):
        return torch.cuda.memory_allocated(self.dev) if self.dev.type == "cuda" else None


class AllocatorPeak:
    """CUDA: the allocator's bytes above what was allocated when the block began -- ``now()`` inside it, and
    ``peak`` (the most at any moment) once it is done. Synchronised at both ends: the allocator counts what
    the queued kernels will use, so an unsynchronised read could miss work still in flight.
    Shown in 08_memory_in_practice (code-08-peak-memory); measure-08-step2 reads each phase's peak with it."""

    def __init__(self, dev):
        self.dev, self.base, self.peak = dev, 0, None

    def __enter__(self):
        torch.cuda.synchronize(self.dev)
        self.base = torch.cuda.memory_allocated(self.dev)
        torch.cuda.reset_peak_memory_stats(self.dev)  # the peak from here on, not since the process began
        return self

    def now(self) -> int:
        return torch.cuda.memory_allocated(self.dev) - self.base

    def __exit__(self, *exc):
        torch.cuda.synchronize(self.dev)
        self.peak = torch.cuda.max_memory_allocated(self.dev) - self.base
        return False


def _forward_backward(model, x, y, kind: str, precision: str, dev, scale: float = 1.0) -> tuple:
    """Forward then backward of one batch (its loss times ``scale``: 1/K under accumulation): (bytes the
    forward pass left for backward, peak bytes held during both on top of what existed before). CUDA: the
    allocator's numbers; elsewhere labkit's dispatch tracer (every storage an op made, from its birth to its
    death)."""
    if dev.type == "cuda":
        with AllocatorPeak(dev) as held:
            with autocast(kind, precision):
                loss = model(x, y) * scale
            acts = held.now()
            loss.backward()
        return acts, held.peak
    tracer = Tracer(model)
    with tracer:
        with autocast(kind, precision):
            loss = model(x, y) * scale
        tracer.end_forward()
        acts = sum(r["bytes"] for r in tracer.finish(model).kept(include_weight_copies=True))
        loss.backward()
        del loss
        trace = tracer.finish(model)
    return acts, trace.peak_bytes()


def _step_peak(opt, model, dev) -> int:
    """``opt.step()``; the peak bytes it held on top of what existed (its new state and temporaries)."""
    if dev.type == "cuda":
        with AllocatorPeak(dev) as held:
            opt.step()
        return held.peak
    tracer = Tracer(model)
    with tracer:
        opt.step()
        trace = tracer.finish(model)
    return trace.peak_bytes()


def _by_hand(config: Config):
    """A fresh model, its optimizer, its batches and a byte counter, on ``config``'s device (the engine's seed)."""
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    torch.manual_seed(config.seed)
    model = GPT(config.spec, config.dropout, config.checkpointing, config.checkpoint_every).to(dev)
    opt = make_optimizer(config, model.parameters())
    return kind, dev, model, opt, iter(make_loader(config)[0]), _Counter(model, opt, dev)


def _source(kind: str) -> str:
    """Where the bytes come from, as a label: memory_allocated on CUDA, else the tensors' storages counted."""
    return "the CUDA allocator" if kind == "cuda" else "labkit's dispatch tracer"


# ---- one traced step (chapters 04 and 08) --------------------------------------------------------

# The timeline's colours, one per category (tracer.CATEGORIES), in stacking order.
COLORS = {"forward": "#4c72b0", "recompute": "#dd8452", "backward": "#55a868", "weight_copy": "#8172b3"}


def trace_model(model, idx, targets, *, precision: str = "fp32", attention: str = "auto", label: str = "") -> Trace:
    """Trace one forward + backward of ``model`` (anything called as ``model(idx, targets) -> loss``)."""
    kind = idx.device.type
    model.zero_grad(set_to_none=True)
    tracer = Tracer(model)
    with attention_backend(attention), tracer:
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
    dev = torch.device(device) if device is not None else torch_device(capabilities(config.device).kind)
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


def describe(config) -> str:
    """A trace's label: the checkpointing mode, with k where it is not 1."""
    if config.checkpointing == "full":
        return "full" if config.checkpoint_every == 1 else f"every {config.checkpoint_every}"
    if config.checkpointing == "attention" and config.checkpoint_every > 1:  # it honours k too
        return f"attention every {config.checkpoint_every}"
    return config.checkpointing


def plot_timelines(traces: dict, width: float = 9.0, height: float = 3.0):
    """One panel per trace: held bytes after every op, stacked by category, forward/backward marked.
    All panels share the y axis, so the heights compare directly."""
    from .plots import FONT, TITLE, new_figure  # deferred: matplotlib is optional; loaded only to draw

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


