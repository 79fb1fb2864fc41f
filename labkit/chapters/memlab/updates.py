"""The first two updates, by hand: where AdamW's state appears and why update 2's peak is higher (taught
in chapter 08). On CUDA the allocator's numbers; elsewhere labkit's dispatch tracer counts storage by storage.

    res = memlab.first_updates(config)       # weights, grads, AdamW state, activations after each phase
    memlab.step2_figures(res)                # the step-2 story's figures and its verdict key
"""
from __future__ import annotations

import torch

from ...engine.config import Config, ConfigError, _int
from ...engine.data import make_loader
from ...engine.device import capabilities, intra_op_threads, torch_device
from ...engine.measure import state_bytes
from ...engine.model import GPT
from ...engine.precision import autocast
from ...engine.tracer import Tracer
from ...engine.step import make_optimizer
from ._common import _config, _threads
from ..course import table  # rows that show themselves as a markdown table


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


def first_updates(config: Config, updates: int = 2, n_threads: int | None = 1) -> dict:
    """Train ``updates`` updates of ``config`` by hand and record, after each phase, the bytes of the
    weights, gradients, optimizer state and activations, and each update's peak.

    The optimizer's state is created inside the first ``step()``: the second update's forward and
    backward run with it already in memory, so its peak is higher by that much. CUDA: the allocator's
    numbers; CPU: counted storage by storage."""
    _config(config)
    _int("updates", updates, 1, 100)
    _threads(n_threads)
    moments, peaks, where = [], {}, {}
    with intra_op_threads(n_threads):
        kind, dev, model, opt, batches, c = _by_hand(config)

        def moment(label, activations=0):
            moments.append({"moment": label, "weights": c.weights(), "grads": c.grads(), "optimizer": c.optimizer(),
                            "activations": activations, "allocated": c.allocated()})

        moment("model built")
        for u in range(1, updates + 1):
            x, y = (t.to(dev) for t in next(batches))
            start = {"weights": c.weights(), "grads": c.grads(), "optimizer": c.optimizer()}  # forward starts with
            acts, fb_peak = _forward_backward(model, x, y, kind, config.precision, dev)
            moments.append({"moment": f"update {u}: forward done", **start, "activations": acts, "allocated": None})
            moment(f"update {u}: backward done")
            held = c.held()  # what the optimizer step starts with
            opt_peak = _step_peak(opt, model, dev)
            moment(f"update {u}: optimizer step done")
            opt.zero_grad(set_to_none=True)  # once per update, as the engine does
            moments[-1]["grads"] = c.grads()
            # the update's peak is in its forward/backward or in its optimizer step: say which
            fb, step = sum(start.values()) + fb_peak, held + opt_peak
            peaks[f"update {u}"] = max(fb, step)
            where[f"update {u}"] = {"forward and backward": fb, "optimizer step": step}
    n = sum(p.numel() for p in model.parameters())
    del model, opt
    return {"moments": moments, "peaks": peaks, "peak_phases": where, "n_params": n, "device": kind,
            "source": _source(kind)}


def _first_updates_result(result, need: int = 2) -> dict:
    peaks = result.get("peaks") if isinstance(result, dict) else None
    if not isinstance(peaks, dict) or any(f"update {u}" not in peaks for u in range(1, need + 1)):
        raise ConfigError("result", type(result).__name__, f"the dict memlab.first_updates returned, with at least "
                                                           f"{need} updates")
    return result


def update_peaks(result: dict) -> tuple:
    """(peak of update 1, peak of update 2, the difference) from ``first_updates``."""
    _first_updates_result(result)
    p1, p2 = result["peaks"]["update 1"], result["peaks"]["update 2"]
    return p1, p2, p2 - p1


def peak_phase(result: dict, update: int) -> str:
    """Where update ``update``'s peak was: 'forward and backward' or 'optimizer step'."""
    _first_updates_result(result, need=1)
    _int("update", update, 1, len(result["peaks"]))
    parts = result["peak_phases"][f"update {update}"]
    return max(parts, key=parts.get)


# ---- what the chapter's cells draw from first_updates (rows and figures; the words are the chapter's) ------

def _mib1(b) -> str:
    return f"{b / 2**20:.1f} MiB"


def peaks_table(result: dict) -> list:
    """Each update's peak and where it was (forward and backward, or the optimizer step), as a table --
    without the roles' bytes, so it can stand above an exercise that asks for AdamW's state."""
    _first_updates_result(result, need=1)
    rows = [{"update": u, "peak": p, "where": peak_phase(result, int(u.split()[-1]))}
            for u, p in result["peaks"].items()]
    return table(rows, [("update", "update", "{}"), ("peak", "peak", _mib1), ("where", "the peak was in its", "{}")])


def moments_table(result: dict) -> list:
    """The bytes of each role (weights, gradients, AdamW's state, activations) after each phase, as a table."""
    _first_updates_result(result, need=1)
    return table(result["moments"], [("moment", "moment", "{}"), ("weights", "weights", _mib1),
                                     ("grads", "gradients", _mib1), ("optimizer", "AdamW state", _mib1),
                                     ("activations", "activations", _mib1)])


def step2_figures(result: dict) -> dict:
    """The step-2 story's figures (MiB, and the difference as a share of AdamW's state) and its ``verdict``:
    "both_in_backward" (both peaks in forward and backward: the difference is the whole state),
    "step_then_backward" (update 1's peak in its optimizer step, update 2's in forward and backward) or
    "step_sets_peak" (the first optimizer step, already holding the new state, sets the peak). Also the state
    in bytes and per parameter (two moments, plus a step counter per parameter tensor)."""
    mib = 2**20
    p1, p2, extra = update_peaks(result)
    state = result["moments"][-1]["optimizer"]
    w1, w2 = peak_phase(result, 1), peak_phase(result, 2)
    verdict = ("both_in_backward" if w1 == w2 == "forward and backward" else
               "step_then_backward" if (w1, w2) == ("optimizer step", "forward and backward") else "step_sets_peak")
    below = p1 - result["peak_phases"]["update 1"]["forward and backward"]
    return {"verdict": verdict, "p1": p1 / mib, "p2": p2 / mib, "extra": extra / mib, "state": state / mib,
            "share_pct": 100 * extra / state if state else 0.0, "below": below / mib,
            "grads": max(m["grads"] for m in result["moments"]) / mib, "state_bytes": state,
            "n_params": result["n_params"], "per_param": state / result["n_params"], "device": result["device"]}


def step2_reference_rows(refs: dict) -> list:
    """The GPU reference runs of the step-2 section ({id: summary}) as table rows: each update's peak, from the
    allocator."""
    if not isinstance(refs, dict):
        raise ConfigError("refs", type(refs).__name__, "{id: summary} from kernels.reference_summaries")
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    rows = [{"gpu": r["device_name"], "model": r["config"]["model"], "params": r["n_params"] / 1e6,
             "p1": r["peaks"]["update 1"], "p2": r["peaks"]["update 2"],
             "extra": r["peaks"]["update 2"] - r["peaks"]["update 1"]} for r in refs.values()]
    return table(rows, [("gpu", "GPU reference", "{}"), ("model", "model (fp32)", "{}"),
                        ("params", "parameters", "{:.0f} M"), ("p1", "peak, update 1", gib),
                        ("p2", "peak, update 2", gib), ("extra", "difference", gib)])
