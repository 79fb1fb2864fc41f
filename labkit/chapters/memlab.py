"""Memory in practice: the tools of chapter 08 (sequence length, the step-2 out-of-memory, the allocator,
bytes per parameter), and chapter 03's peak against the accumulation steps.

    rows = labkit.memlab.seq_sweep(config, [64, 128, 256])     # activation bytes against T, measured
    labkit.memlab.activation_formula(L, d, n_head, T, B, "math")  # ... and by formula, part by part
    steps = labkit.memlab.first_updates(config)                 # weights, grads, AdamW state, activations
    peak = labkit.memlab.update_peak(config.replace(accum=4))   # one update's peak, K micro-batches
    rows = labkit.memlab.bytes_per_param(config)                # bytes per parameter of three recipes, counted
    pat = labkit.memlab.fragmentation_patterns()                # the allocator demo's arithmetic (any device)

On a CUDA GPU the allocator's own numbers are used (memory_allocated, memory_stats, its history); on a
CPU, which has no such allocator statistics, bytes are counted storage by storage (labkit.memtrace's
tracer) -- never estimated and shown as measured. Tools that build a model build their own copy.
Every public function checks its arguments before it does any work (ConfigError: field, value, what is
allowed).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ..engine.config import ATTENTION, Config, ConfigError, _choice, _int, _num
from ..engine.data import make_loader
from ..engine.device import capabilities, intra_op_threads, torch_device
from ..engine.measure import activation_bytes, count_flops, state_bytes
from .memtrace import Tracer
from ..engine.model import GPT, VOCAB
from ..base.paths import check_writable, write_atomic
from ..engine.precision import autocast
from ..engine.train import make_optimizer, run

__all__ = ["activation_formula", "seq_sweep", "attention_recompute_ready", "attention_recompute",
           "first_updates", "update_peaks", "peak_phase", "explain_update_peaks", "update_peak", "accumulation_peaks",
           "accumulation_verdict", "allocator_stats", "hole_pattern", "growth_pattern", "fragmentation_patterns", "EXPECTED",
           "fragmentation_demo", "fragmentation_demos", "fragmentation_table", "fragmentation_verdicts",
           "fragmentation_summary", "fragmentation_expectations", "record_cuda_history",
           "bytes_per_param", "RECIPES", "run_memory", "plot_seq_sweep", "plot_first_updates",
           "plot_update_peaks", "plot_bytes_per_param"]

MIB = 2**20


# ---- arguments: refused before any work --------------------------------------------------------------------


def _config(value, name: str = "config") -> Config:
    if not isinstance(value, Config):
        raise ConfigError(name, value, "a labkit.Config, e.g. lk.Config(model='tiny')")
    return value


def _threads(n) -> None:
    if n is not None:
        _int("n_threads", n, 1, 1024)


def _items(name: str, values, check) -> list:
    """``values`` as a non-empty list, each item passed through ``check(f"{name}[i]", item)``."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise ConfigError(name, values, "a non-empty list, e.g. [64, 128]")
    out = list(values)
    if not out:
        raise ConfigError(name, values, "a non-empty list, e.g. [64, 128]")
    for i, v in enumerate(out):
        check(f"{name}[{i}]", v)
    return out


def _seq_lens(seq_lens) -> list:
    return _items("seq_lens", seq_lens, lambda n, v: _int(n, v, 2, 65536))  # Config's own seq_len range


def _rows(rows, need: str) -> list:
    """A non-empty list of the dicts a memlab tool returned (``need``: a key every row has)."""
    out = list(rows) if isinstance(rows, (list, tuple)) else None
    if not out or not all(isinstance(r, dict) and need in r for r in out):
        raise ConfigError("rows", type(rows).__name__, f"the non-empty list of rows a memlab tool returned "
                                                        f"(dicts with {need!r})")
    return out


def _size(width, height) -> None:
    _num("width", width, 1.0, 30.0)
    _num("height", height, 1.0, 30.0)


# ---- sequence length --------------------------------------------------------------------------------


def activation_formula(n_layer: int, d_model: int, n_head: int, seq_len: int, batch: int, attention: str = "auto",
                       vocab: int = VOCAB, bytes_per_value: int = 4) -> dict:
    """Bytes the forward pass keeps for backward, part by part (fp32: 4 bytes a value).

    Per block and token, 16·d values (LayerNorm outputs, q/k/v, attention output, residuals, MLP
    up-projection and GELU output: labkit.memtrace's count) plus n_head (the fused kernel's log-sum-exp) plus
    4 (LayerNorm statistics). The math backend instead keeps the softmax probabilities, one T×T matrix per
    head, causal mask included: n_head·T values per token, less the log-sum-exp it does not need, so
    n_head·(T − 1) more than the fused kernel. Outside the blocks: the embedding sum and the final
    LayerNorm (2·d + 2) and the log-softmax of the logits (vocab)."""
    for name, v in (("n_layer", n_layer), ("d_model", d_model), ("n_head", n_head), ("seq_len", seq_len),
                    ("batch", batch), ("vocab", vocab)):
        _int(name, v, 1, 10**7)
    _int("bytes_per_value", bytes_per_value, 1, 8)
    _choice("attention", attention, ATTENTION)
    B, T, d, h, L = batch, seq_len, d_model, n_head, n_layer
    linear = L * B * T * (16 * d + h + 4) * bytes_per_value
    square = L * B * h * T * (T - 1) * bytes_per_value if attention == "math" else 0
    outside = B * T * (2 * d + 2 + vocab) * bytes_per_value
    return {"blocks_linear": linear, "attention_square": square, "outside": outside,
            "total": linear + square + outside}


def seq_sweep(base: Config, seq_lens, attentions=("auto", "math"), batch: int = 2, n_threads: int | None = 1) -> list:
    """Activation bytes kept after one forward pass (the engine's own probe: live storages) at each sequence
    length and attention backend, beside the formula's parts. fp32 unless ``base`` says otherwise.

    ``batch`` >= 2 matches the formula exactly; with one sequence the math path's inputs have another
    layout, and it keeps scaled copies of q and k (2·d more values per token and block) as well."""
    _config(base, "base")
    lens = _seq_lens(seq_lens)
    atts = _items("attentions", attentions, lambda n, v: _choice(n, v, ATTENTION))
    _int("batch", batch, 1, 65536)
    _threads(n_threads)
    dev = torch_device(capabilities(base.device).kind)
    rows = []
    with intra_op_threads(n_threads):
        for T in lens:
            for att in atts:
                cfg = base.replace(seq_len=T, attention=att)
                measured, copies = activation_bytes(cfg, dev, batch=batch)
                s = cfg.spec
                f = activation_formula(s.n_layer, s.d_model, s.n_head, T, batch, att)
                rows.append({"seq_len": T, "attention": att, "batch": batch, "measured_bytes": measured,
                             "weight_copy_bytes": copies, **{f"formula_{k}": v for k, v in f.items()},
                             "ratio": measured / f["total"] if f["total"] else None})
    return rows


def attention_recompute_ready() -> tuple:
    """(ok, reason): whether the engine has Megatron-style attention recompute, checkpointing="attention"."""
    try:
        Config(model="tiny", checkpointing="attention")
    except ConfigError as e:
        return False, (f"this labkit does not have checkpointing='attention' yet ({e}); the cell below runs once "
                       "the engine gains it")
    return True, "checkpointing='attention' recomputes each block's attention core (the T×T part) in backward"


def attention_recompute(base: Config, seq_lens, batch: int = 2, n_threads: int | None = 1) -> list:
    """Under the math backend: activation bytes with and without checkpointing='attention', and the FLOPs
    the recompute adds (hardware over model FLOPs, counted), at each sequence length.

    ``core_flops_ratio`` is what rerunning the whole attention core would cost (4·T²·d per block and
    sequence: the scores and the product with V, counted like FlopCounterMode, non-causal). The count comes
    out lower: PyTorch's non-reentrant checkpoint stops recomputing once it has rebuilt the last tensor
    backward needs (softmax's output), so the product with V is never rerun."""
    _config(base, "base")
    lens = _seq_lens(seq_lens)
    _int("batch", batch, 1, 65536)
    _threads(n_threads)
    dev = torch_device(capabilities(base.device).kind)
    rows = []
    with intra_op_threads(n_threads):
        for T in lens:
            plain = base.replace(seq_len=T, attention="math", checkpointing="none")
            recomp = plain.replace(checkpointing="attention")
            a0, _ = activation_bytes(plain, dev, batch=batch)
            a1, _ = activation_bytes(recomp, dev, batch=batch)
            model_f = count_flops(plain.spec)
            hw_f = count_flops(recomp.spec, "attention", recomp.checkpoint_every)
            s = plain.spec
            core = s.n_layer * 4 * T * T * s.d_model  # the attention core's forward, one sequence
            rows.append({"seq_len": T, "bytes_none": a0, "bytes_attention": a1, "saved_frac": 1 - a1 / a0,
                         "flops_ratio": hw_f / model_f, "core_flops_ratio": 1 + core / model_f})
    return rows


# ---- the first two updates: where AdamW's state appears -----------------------------------------------


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


def _forward_backward(model, x, y, kind: str, precision: str, dev, scale: float = 1.0) -> tuple:
    """Forward then backward of one batch (its loss times ``scale``: 1/K under accumulation): (bytes the
    forward pass left for backward, peak bytes held during both on top of what existed before). CUDA: the
    allocator's numbers; elsewhere labkit's dispatch tracer (every storage an op made, from its birth to its
    death)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        with autocast(kind, precision):
            loss = model(x, y) * scale
        acts = torch.cuda.memory_allocated(dev) - base
        loss.backward()
        torch.cuda.synchronize(dev)
        return acts, torch.cuda.max_memory_allocated(dev) - base
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
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        opt.step()
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - base
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
    return ("the CUDA allocator (memory_allocated)" if kind == "cuda" else
            "tensors counted storage by storage (labkit's dispatch tracer)")


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


def explain_update_peaks(result: dict) -> str:
    """The step-2 story told from ``first_updates``' numbers: how much higher update 2's peak is, and why
    that is all of AdamW's state only when update 1's peak was in its forward and backward (bytes per
    parameter are left for the learner to work out)."""
    mib = 2**20
    p1, p2, extra = update_peaks(result)
    state = result["moments"][-1]["optimizer"]
    w1, w2 = peak_phase(result, 1), peak_phase(result, 2)
    head = (f"Peak of update 1: **{p1 / mib:.1f} MiB** (in its {w1}); of update 2: **{p2 / mib:.1f} MiB** (in its "
            f"{w2}) — **{extra / mib:.1f} MiB** more. AdamW's state: {state / mib:.1f} MiB.")
    if w1 == w2 == "forward and backward":
        return (head + " Both peaks came in forward and backward, and update 2's ran with the state already in "
                f"memory: the difference is the whole state ({extra / state:.0%} of it).")
    if w1 == "optimizer step" and w2 == "forward and backward":
        grads = max(m["grads"] for m in result["moments"])
        below = p1 - result["peak_phases"]["update 1"]["forward and backward"]
        return (head + f" Update 1's peak came in its optimizer step, where its gradients ({grads / mib:.1f} MiB) "
                "and the state it was creating were held together; update 2's forward and backward, with the state "
                f"in memory, went above that by {extra / mib:.1f} MiB — {extra / state:.0%} of the state. Update 1's "
                f"own forward and backward stayed {below / mib:.1f} MiB below its step: with that much more "
                "activation memory (a larger batch, longer sequences) its peak moves into forward and backward, "
                "and the difference becomes the whole state.")
    return (head + " For this model and batch the activations are smaller than the gradients plus the optimizer's "
            "temporaries, so the first optimizer step — which already holds the new state — sets the peak; update 2 "
            "adds little to it.")


# ---- chapter 03: one update's peak against the accumulation steps -------------------------------------------


def update_peak(config: Config, updates: int = 2, n_threads: int | None = 1) -> dict:
    """The peak bytes of one update of ``config`` -- ``config.accum`` micro-batches of ``config.micro_batch``
    sequences, loss / K, one optimizer step, ``zero_grad(set_to_none=True)`` -- trained by hand as the engine
    does. ``updates`` updates run and the last is reported: from the second on AdamW's state exists, as in
    any later update. CUDA: the allocator's peak; elsewhere counted storage by storage (labkit's tracer).

    Why K matters at all: the first micro-batch's forward runs with no ``.grad`` alive (they were set to
    None), micro-batches 2..K run theirs with every gradient alive. So from K = 1 to K = 2 the peak can rise
    by up to the gradients' bytes, and from K = 2 on nothing changes. ``micro_peaks``: each micro-batch's
    forward-and-backward peak; ``step_peak``: the optimizer step's."""
    _config(config)
    _int("updates", updates, 1, 100)
    _threads(n_threads)
    K = config.accum
    with intra_op_threads(n_threads):
        kind, dev, model, opt, batches, c = _by_hand(config)
        for _ in range(updates):
            micro = []
            for _k in range(K):
                x, y = (t.to(dev) for t in next(batches))
                held = c.held()  # the gradients of micro-batches 1..k-1 are alive from k = 2 on
                micro.append(held + _forward_backward(model, x, y, kind, config.precision, dev, scale=1 / K)[1])
            grads = c.grads()
            step = c.held() + _step_peak(opt, model, dev)
            opt.zero_grad(set_to_none=True)
    out = {"accum": K, "micro_batch": config.micro_batch, "peak": max(micro + [step]), "micro_peaks": micro,
           "step_peak": step, "phase": "optimizer step" if step > max(micro) else "forward and backward",
           "grads": grads, "weights": c.weights(), "optimizer": c.optimizer(), "device": kind, "source": _source(kind)}
    del model, opt, c
    return out


def accumulation_peaks(base: Config, factors=(1, 2, 4), n_threads: int | None = 1) -> tuple:
    """(by_k, by_mb): ``update_peak`` at K = each factor (``base``'s micro-batch, K = 1 in ``base``) and at
    each factor × the micro-batch (K = 1), keyed by factor -- the effective batch grown two ways -- with a
    progress line."""
    from ..base.progress import Progress  # deferred: a notebook-only display

    _config(base, "base")
    fs = _items("factors", factors, lambda n, v: _int(n, v, 1, 64))
    if 1 not in fs:
        raise ConfigError("factors", factors, "a list that holds 1 (the baseline), e.g. [1, 2, 4]")
    _threads(n_threads)
    one = base.replace(accum=1)
    by_k, by_mb = {}, {}
    with Progress(total=2 * len(fs) - 1, label="one update's peak, K and micro-batch") as bar:
        for f in fs:
            by_k[f] = update_peak(one.replace(accum=f), n_threads=n_threads)
            bar.update(len(by_k), note=f"K = {f}")
        for f in fs:
            by_mb[f] = by_k[1] if f == 1 else update_peak(one.replace(micro_batch=f * base.micro_batch),
                                                            n_threads=n_threads)
            bar.update(len(by_k) + len(by_mb) - 1, note=f"micro-batch {f * base.micro_batch}")
    return by_k, by_mb


def accumulation_verdict(by_k: dict) -> str:
    """Chapter 03's sentence about the peak against K, chosen by the measured peaks ({K: update_peak(...)},
    K = 1 and 2 at least): how much K = 2 added over K = 1 against the gradients' bytes, why -- from where
    each peak was (``phase``: in forward and backward, or in the optimizer step) -- and whether larger K
    changed anything."""
    if not isinstance(by_k, dict) or not {1, 2} <= set(by_k) or not all(
            isinstance(v, dict) and {"peak", "phase"} <= set(v) for v in by_k.values()):
        raise ConfigError("by_k", type(by_k).__name__, "{K: memlab.update_peak(...)} with K = 1 and 2 at least")
    p1, p2, grads = by_k[1]["peak"], by_k[2]["peak"], by_k[1]["grads"]
    rise, tol = p2 - p1, max(0.01 * p2, 64 * 2**10)  # below 1 % (or 64 KiB): no change worth a word
    head = (f"From K = 1 to K = 2 the peak of one update {'rose' if rise >= 0 else 'fell'} by "
            f"**{abs(rise) / MIB:.2f} MiB**: {abs(rise) / grads:.0%} of the gradients' {grads / MIB:.2f} MiB.")
    why = _accumulation_why(by_k[1]["phase"], by_k[2]["phase"], rise, grads, tol)
    later = {k: v["peak"] - p2 for k, v in sorted(by_k.items()) if k > 2}
    if not later:
        return head + why
    k, d = max(later.items(), key=lambda kv: abs(kv[1]))
    flat = abs(d) <= tol
    within = "it did not change at all" if d == 0 else f"it stayed flat, within {abs(d) / MIB:.2f} MiB"
    tail = (f" From K = 2 to K = {max(later)} {within}: micro-batches 3…K start from the same state as "
            "micro-batch 2." if flat else
            f" From K = 2 to K = {k} it moved by {d / MIB:+.2f} MiB.")
    return head + why + tail


STEP_HOLDS = "weights, gradients, AdamW's state and the step's temporaries at once"


def _accumulation_why(phase1: str, phase2: str, rise: float, grads: float, tol: float) -> str:
    """Why the peak moved as it did from K = 1 to K = 2, from where each peak was. Only micro-batch 2's forward
    and backward see K: it runs with every gradient alive, which K = 1's never does before backward."""
    fb = "forward and backward"
    if phase1 == "optimizer step" and phase2 == "optimizer step":
        return (f" No rise: at both K the peak was the optimizer step ({STEP_HOLDS}), which holds the same "
                "tensors whatever K is; micro-batch 2's forward and backward, run with every gradient alive, "
                "stayed below it.")
    if phase1 == "optimizer step":  # K = 2's peak is micro-batch 2's forward and backward
        above = "level with it" if abs(rise) <= tol else f"{rise / MIB:.2f} MiB above it"
        return (f" At K = 1 the peak was the optimizer step ({STEP_HOLDS}), not its forward and backward; at "
                f"K = 2 micro-batch 2's forward and backward, run with every gradient alive, went {above}. So the "
                "rise is how far that pass exceeded the step, not a measure of the gradients' bytes.")
    if phase2 == "optimizer step":  # K = 1 peaked in forward and backward, K = 2 in its step
        return (f" No rise: at K = 2 the peak was the optimizer step ({STEP_HOLDS}), which K does not change, "
                "and micro-batch 2's forward and backward stayed below it.")
    if rise >= 0.5 * grads:  # both in forward and backward
        return (" Micro-batch 2 ran its forward and backward with every gradient alive; at K = 1 the forward ran "
                "with none (they were set to None), and backward built them while it freed the activations.")
    if rise > tol:
        return (f" Less than the gradients: both peaks came in {fb}, and at K = 1 that peak came late enough in "
                "backward that part of the gradients existed already.")
    return (f" No rise, though both peaks came in {fb}: at K = 1 that peak came so late in backward that "
            "(nearly) every gradient existed already, as at K = 2.")


# ---- the CUDA caching allocator ---------------------------------------------------------------------------


def allocator_stats(device=None) -> dict:
    """The caching allocator's view (CUDA only): bytes handed to tensors (allocated), bytes held from the
    driver (reserved) and their difference, cached-but-unusable splits (inactive_split), segments (cudaMalloc'd
    ones: an expandable segment's mapped pages are not counted in ``segment.all.current``), retries, OOMs,
    and the driver calls so far (``num_device_alloc``/``free``: cudaMalloc/cudaFree, or page maps/unmaps)."""
    if not torch.cuda.is_available():
        raise RuntimeError("allocator statistics come from the CUDA caching allocator; this machine has no CUDA GPU")
    s = torch.cuda.memory_stats(device)
    alloc = s.get("allocated_bytes.all.current", 0)
    reserved = s.get("reserved_bytes.all.current", 0)
    return {"allocated": alloc, "reserved": reserved, "reserved_unallocated": reserved - alloc,
            "peak_allocated": s.get("allocated_bytes.all.peak", 0), "peak_reserved": s.get("reserved_bytes.all.peak", 0),
            "inactive_split": s.get("inactive_split_bytes.all.current", 0),
            "segments": s.get("segment.all.current", 0), "alloc_retries": s.get("num_alloc_retries", 0),
            "ooms": s.get("num_ooms", 0), "device_allocs": s.get("num_device_alloc", 0),
            "device_frees": s.get("num_device_free", 0), "fragmentation": 1 - alloc / reserved if reserved else 0.0}


# The allocator's rounding (c10/cuda/CUDACachingAllocator.cpp): a cudaMalloc'd segment for a request of
# 10 MiB or more is rounded up to 2 MiB (kRoundLarge); an expandable segment maps pages of 20 MiB (kLargeBuffer).
PAGE_MIB = {False: 2, True: 20}


def _pages(mib: float, expandable: bool) -> int:
    p = PAGE_MIB[expandable]
    return int(math.ceil(mib / p) * p)


def hole_pattern(block_mib: int = 64, count: int = 16, request_mib: int = 192, expandable: bool = False) -> dict:
    """The arithmetic of the holes pattern. One ``count`` × ``block_mib`` tensor is allocated and freed, so
    the allocator caches it as one segment; ``count`` blocks are then carved out of that segment, every other
    one is freed, and one ``request_mib`` tensor is asked for. Each freed block sits between two live ones,
    so no two holes merge (with expandable segments the last page's unused tail is one more, small hole).

    Raises ConfigError unless the largest hole < the request < all holes together: the request must fit
    the holes' sum but no hole. ``unmappable_mib``: how much of the holes lies in whole 20 MiB pages, which
    an expandable segment can unmap and map again at its end; fixed segments can give back nothing here,
    because the one segment still holds live blocks."""
    _int("block_mib", block_mib, 2, 4096)
    _int("count", count, 4, 256)
    if count % 2:
        raise ConfigError("count", count, "an even number: every other block is freed, the last one stays live")
    _int("request_mib", request_mib, 2, 10**6)
    arena = block_mib * count
    mapped = _pages(arena, expandable)
    holes = [(i * block_mib, (i + 1) * block_mib) for i in range(0, count, 2)]
    holes += [(arena, mapped)] if mapped > arena else []  # the segment's tail past the last (live) block
    sizes = [b - a for a, b in holes]
    largest, total = max(sizes), sum(sizes)
    if not largest < request_mib < total:
        raise ConfigError("request_mib", request_mib, f"more than the largest hole ({largest} MiB) and less than all "
                                                      f"{len(sizes)} holes together ({total} MiB)")
    page = PAGE_MIB[True]
    unmappable = sum(max(0, b // page - -(-a // page)) * page for a, b in holes)  # whole pages inside each hole
    return {"block_mib": block_mib, "count": count, "request_mib": request_mib, "arena_mib": arena,
            "reserved_mib": mapped, "live_mib": arena // 2, "holes_mib": sizes, "largest_hole_mib": largest,
            "sum_holes_mib": total, "freed_mib": block_mib * (count // 2), "unmappable_mib": unmappable if expandable else 0,
            "cap_mib": mapped + request_mib // 2, "expandable": expandable}


def _grow(live: int, sizes: list, expandable: bool, cap: float = math.inf) -> dict:
    """The growth pattern under the allocator's rules, in MiB: what stays reserved, the retries, whether it
    fits. A request that would take reserved past ``cap`` first releases what can be released -- fixed
    segments: every cached (whole, free) segment; an expandable segment: its free whole pages -- and retries.
    The cap check counts the whole request, even where an expandable segment maps only the difference."""
    reserved, cached, retries, worst = _pages(live, expandable), 0, 0, 0
    for s in sizes:
        worst = max(worst, reserved + s)
        if reserved + s > cap:
            reserved, cached, retries = (_pages(live, True) if expandable else reserved - cached), 0, retries + 1
            if reserved + s > cap:
                return {"reserved_mib": reserved, "retries": retries, "ok": False, "worst_mib": worst}
        if expandable:
            reserved = max(reserved, _pages(live + s, True))  # the segment maps the difference at its end
        else:
            reserved, cached = reserved + s, cached + s  # a new segment; freed at the step's end, it stays cached
    return {"reserved_mib": reserved, "retries": retries, "ok": True, "worst_mib": worst}


def growth_pattern(live_mib: int = 64, first_mib: int = 256, step_mib: int = 32, steps: int = 8,
                   expandable: bool = False) -> dict:
    """The arithmetic of the growth pattern: one ``live_mib`` tensor stays (the weights), then each of
    ``steps`` steps allocates one tensor ``step_mib`` larger than the step before and frees it (activations
    of a growing sequence length). With fixed segments a cached segment never fits the next, larger request:
    each step reserves a new one and the old ones stay cached -- live + the sum of all sizes. An expandable
    segment maps the difference at its end instead: live + the largest size, in 20 MiB pages.

    The capped arm allows ``cap_mib``: what the expandable segment needs at its worst step, plus one page.
    ``fixed_retries``: how often fixed segments then reach the cap, release every cached segment and try
    again (each retry also synchronises the device); an expandable segment needs none."""
    _int("live_mib", live_mib, 2, 10**5)
    _int("first_mib", first_mib, 10, 10**5)  # >= 10 MiB: rounded to 2 MiB, so the arithmetic here is exact
    _int("step_mib", step_mib, 2, 10**5)     # >= 2 MiB: a step's request never fits the last step's segment
    _int("steps", steps, 2, 64)
    sizes = [_pages(first_mib + i * step_mib, False) for i in range(steps)]
    fixed, grown = _grow(live_mib, sizes, False), _grow(live_mib, sizes, True)
    cap = grown["worst_mib"] + PAGE_MIB[True]
    return {"live_mib": live_mib, "sizes_mib": sizes, "steps": steps, "largest_mib": sizes[-1],
            "sum_mib": sum(sizes), "reserved_mib": (grown if expandable else fixed)["reserved_mib"],
            "fixed_reserved_mib": fixed["reserved_mib"], "expandable_reserved_mib": grown["reserved_mib"],
            "cap_mib": cap, "fixed_retries": _grow(live_mib, sizes, False, cap)["retries"],
            "expandable_retries": _grow(live_mib, sizes, True, cap)["retries"], "expandable": expandable}


def fragmentation_patterns(expandable: bool = False) -> dict:
    """Both patterns of the allocator demo, with the sizes it uses (pure arithmetic: any device)."""
    if not isinstance(expandable, bool):
        raise ConfigError("expandable", expandable, "True or False")
    return {"holes": hole_pattern(expandable=expandable), "growth": growth_pattern(expandable=expandable)}


# What each arm of the demo is expected to show, and why -- from the allocator's rules, not measured: the
# demo's own numbers confirm or refute each line. (pattern, expandable, capped) -> (expectation, test).
EXPECTED = {
    ("holes", False, False): ("the request gets a new segment; the holes stay reserved (nothing forces them out)",
                              lambda m, p: m["ok"] and m["reserved_unallocated"] >= 0.98 * p["freed_mib"] * MIB),
    ("holes", True, False): ("the same: pages are mapped at the segment's end; the holes stay mapped",
                             lambda m, p: m["ok"] and m["reserved_unallocated"] >= 0.98 * p["freed_mib"] * MIB),
    ("holes", False, True): ("out of memory: no hole is a whole segment (the segment still holds live blocks), "
                             "so the allocator can give nothing back",
                             lambda m, p: not m["ok"] and m["ooms"] >= 1),
    ("holes", True, True): ("succeeds after one retry: the holes' whole pages are unmapped and mapped again at "
                            "the segment's end; reserved falls",
                            lambda m, p: m["ok"] and m["alloc_retries"] >= 1 and m["ooms"] == 0),
    ("growth", False, False): ("a new segment every step, the old ones cached: reserved ≈ live + the sum of all "
                               "sizes, one segment per step",
                               lambda m, p: m["ok"] and m["reserved"] >= 0.98 * p["fixed_reserved_mib"] * MIB
                               and m["segments"] >= p["steps"]),
    ("growth", True, False): ("one segment grows: reserved ≈ live + the largest size",
                              lambda m, p: m["ok"] and m["reserved"] <= (p["expandable_reserved_mib"]
                                                                         + PAGE_MIB[True]) * MIB),
    ("growth", False, True): ("no out-of-memory: at the cap the cached segments (whole and free) are released and "
                              "the request retried",
                              lambda m, p: m["ok"] and m["alloc_retries"] >= 1 and m["ooms"] == 0),
    ("growth", True, True): ("no retry: the cap leaves room for the one segment's worst step",
                             lambda m, p: m["ok"] and m["alloc_retries"] == 0),
}


def _cap(dev, mib: float) -> None:
    """Let this process's allocator reserve at most ``mib`` MiB (the fraction is global to the process)."""
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, mib * MIB / total), dev)


def _holes(dev, p: dict, capped: bool, keep: list) -> None:
    """The holes pattern (hole_pattern): one segment, every other block freed, then the request."""
    arena = torch.empty(p["arena_mib"] * MIB, dtype=torch.uint8, device=dev)
    del arena  # cached as one free segment: the blocks below are carved out of it
    keep += [torch.empty(p["block_mib"] * MIB, dtype=torch.uint8, device=dev) for _ in range(p["count"])]
    for i in range(0, p["count"], 2):
        keep[i] = None  # every other block freed: holes between live blocks, inside one segment
    if capped:  # room for half the request beyond what is reserved now: only the holes can make up the rest
        _cap(dev, torch.cuda.memory_reserved(dev) / MIB + p["request_mib"] / 2)
    keep.append(torch.empty(p["request_mib"] * MIB, dtype=torch.uint8, device=dev))


def _growth(dev, p: dict, capped: bool, keep: list) -> None:
    """The growth pattern (growth_pattern): a live tensor, then one larger temporary tensor per step."""
    if capped:
        _cap(dev, torch.cuda.memory_reserved(dev) / MIB + p["cap_mib"])
    keep.append(torch.empty(p["live_mib"] * MIB, dtype=torch.uint8, device=dev))
    for s in p["sizes_mib"]:
        step = torch.empty(s * MIB, dtype=torch.uint8, device=dev)
        del step  # freed at the step's end, as activations are


def _arm(build, dev, pattern: dict, capped: bool) -> dict:
    """One arm of the demo: allocator numbers after ``build`` ran (counters as differences over the arm).
    The cap and every tensor are gone afterwards, whatever happened."""
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    before, keep, error = allocator_stats(dev), [], None
    try:
        try:
            build(dev, pattern, capped, keep)
        except torch.cuda.OutOfMemoryError as e:
            error = " ".join(str(e).split())[:600]
        after = allocator_stats(dev)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)  # global to the process: never leave a cap behind
        keep.clear()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    counters = ("alloc_retries", "ooms", "device_allocs", "device_frees")
    return {**{k: after[k] for k in ("allocated", "reserved", "reserved_unallocated", "segments", "inactive_split")},
            **{k: after[k] - before[k] for k in counters}, "ok": error is None, "error": error}


def _fragment() -> dict:
    """Both patterns, without and with a cap, in this process (CUDA; the allocator's settings as started)."""
    dev = torch.device("cuda", 0)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    expandable = "expandable_segments:true" in conf.replace(" ", "").lower()
    pats = fragmentation_patterns(expandable)
    arms = {f"{name} {'capped' if capped else 'uncapped'}": _arm(build, dev, pats[name], capped)
            for name, build in (("holes", _holes), ("growth", _growth)) for capped in (False, True)}
    return {"settings": conf, "patterns": pats, "arms": arms, "gpu": torch.cuda.get_device_name(dev),
            "torch": torch.__version__}


def fragmentation_demo(expandable: bool, timeout_s: float = 120.0) -> dict:
    """Run both fragmentation patterns (fragmentation_patterns), each without and with a memory cap, in a
    fresh Python process with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` or ``False``: the allocator
    reads it when CUDA starts, so a process of its own is the documented way to switch it, and the cap
    (``set_per_process_memory_fraction``) dies with that process. The process is killed if it outlives
    ``timeout_s``, or if this call is interrupted."""
    if not isinstance(expandable, bool):
        raise ConfigError("expandable", expandable, "True or False")
    _num("timeout_s", timeout_s, 1.0, 3600.0)
    if not torch.cuda.is_available():
        raise RuntimeError("the caching allocator's segments exist on CUDA only: this demo needs a CUDA GPU, and "
                           "this machine has none")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=f"expandable_segments:{'True' if expandable else 'False'}")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    try:  # run() kills the child on a timeout and on any exception here (Ctrl-C included) before re-raising
        out = subprocess.run([sys.executable, "-m", "labkit.chapters.memlab", "--fragment"], capture_output=True, text=True,
                             env=env, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the allocator demo did not finish within timeout_s={timeout_s:g} s; its process was "
                           "stopped") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the allocator demo failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
    return {"expandable_segments": expandable, **json.loads(lines[-1])}


def fragmentation_demos(timeout_s: float = 120.0) -> dict:
    """``fragmentation_demo`` with fixed, then with expandable segments: {False: ..., True: ...}, with a
    progress line (each is a process of its own that starts CUDA)."""
    from ..base.progress import Progress  # deferred: a notebook-only display

    _num("timeout_s", timeout_s, 1.0, 3600.0)
    out = {}
    with Progress(total=2, label="allocator demo, one process per setting") as bar:
        for i, flag in enumerate((False, True)):
            out[flag] = fragmentation_demo(flag, timeout_s)
            bar.update(i + 1, note=f"expandable_segments={flag} done")
    return out


def _demos(demos) -> dict:
    """{expandable: fragmentation_demo result} -- what fragmentation_table and _verdicts read."""
    if not isinstance(demos, dict) or not demos or not all(
            isinstance(k, bool) and isinstance(v, dict) and "arms" in v for k, v in demos.items()):
        raise ConfigError("demos", type(demos).__name__, "{False: fragmentation_demo(False), True: "
                                                         "fragmentation_demo(True)}")
    return demos


def fragmentation_verdicts(demos: dict) -> list:
    """One row per arm: the pattern, the setting, the cap, what was expected (EXPECTED) and whether the
    measurement shows it."""
    rows = []
    for flag, d in sorted(_demos(demos).items()):
        for arm, m in d["arms"].items():
            name, capped = arm.split()[0], arm.endswith(" capped")
            words, test = EXPECTED[(name, flag, capped)]
            rows.append({"pattern": name, "expandable": flag, "capped": capped, "expected": words,
                         "confirmed": bool(test(m, d["patterns"][name])), **m})
    return rows


def fragmentation_table(demos: dict) -> str:
    """A markdown table of the demo: each arm's measured allocator numbers, and whether they show what
    was expected (fragmentation_expectations says what and why)."""
    head = ["| pattern | segments | cap | the request | reserved | reserved, not allocated | cudaMalloc segments | "
            "retries | as expected? |", "|---|---|---|---|---|---|---|---|---|"]
    lines = [f"| {r['pattern']} | {'expandable' if r['expandable'] else 'fixed'} | {'yes' if r['capped'] else 'no'} | "
             f"{'served' if r['ok'] else '**out of memory**'} | {r['reserved'] / MIB:,.0f} MiB | "
             f"{r['reserved_unallocated'] / MIB:,.0f} MiB | {r['segments']} | {r['alloc_retries']} | "
             f"{'yes' if r['confirmed'] else '**no**'} |" for r in fragmentation_verdicts(demos)]
    return "\n".join(head + lines)


def fragmentation_summary(demos: dict) -> str:
    """What the demo showed, in sentences chosen by its numbers: how many arms went as expected (and which
    did not), the allocator's own out-of-memory message, and the growth pattern's reserved bytes."""
    rows = fragmentation_verdicts(demos)
    bad = [r for r in rows if not r["confirmed"]]
    out = [f"**{len(rows) - len(bad)} of {len(rows)}** arms showed what was expected."]
    out += [f"Not as expected: {r['pattern']}, {'expandable' if r['expandable'] else 'fixed'} segments, "
            f"{'capped' if r['capped'] else 'no cap'} — expected {r['expected']}." for r in bad]
    oom = next((r["error"] for r in rows if r["error"]), None)
    if oom:
        out.append(f"The allocator's own words at the out-of-memory: *{oom}*")
    grow = {r["expandable"]: r for r in rows if r["pattern"] == "growth" and not r["capped"]}
    if len(grow) == 2:
        out.append(f"Growth without a cap: fixed segments reserved **{grow[False]['reserved'] / MIB:,.0f} MiB** in "
                   f"{grow[False]['segments']} segments; the expandable segment **{grow[True]['reserved'] / MIB:,.0f} "
                   "MiB**.")
    return " ".join(out)


def fragmentation_expectations() -> str:
    """Markdown: the two patterns' arithmetic and what each arm is expected to show, and why (from the
    allocator's rules -- expected, not measured)."""
    h, g = hole_pattern(), growth_pattern()
    holes = (f"**Holes**: {h['count']} blocks of {h['block_mib']} MiB carved out of one cached segment, every other "
             f"one freed: {h['count'] // 2} holes, the largest {h['largest_hole_mib']} MiB, together "
             f"{h['freed_mib']} MiB. The request, {h['request_mib']} MiB, is larger than any hole and smaller than "
             f"their sum. The cap leaves room for half of it beyond what is reserved.")
    growth = (f"**Growth**: a live {g['live_mib']} MiB tensor, then {g['steps']} steps that each allocate and free "
              f"one tensor, {g['sizes_mib'][0]} MiB growing to {g['largest_mib']} MiB (predicted: fixed segments "
              f"reserve {g['fixed_reserved_mib']:,} MiB, an expandable one {g['expandable_reserved_mib']:,} MiB). The "
              f"cap, {g['cap_mib']:,} MiB, holds the expandable segment's worst step; fixed segments are predicted to "
              f"reach it {g['fixed_retries']} times.")
    arms = [f"- {name}, {'expandable' if flag else 'fixed'} segments, {'capped' if capped else 'no cap'}: "
            f"expected — {words}." for (name, flag, capped), (words, _) in EXPECTED.items()]
    return "\n\n".join([holes, growth, "\n".join(arms)])


def record_cuda_history(config: Config, path, steps: int = 2, max_entries: int = 200_000) -> str:
    """Run ``steps`` updates of ``config`` with the CUDA allocator recording every allocation and free,
    and write the snapshot to ``path`` (PyTorch's own snapshot format, a pickle that labkit writes and never reads:
    drag it onto https://pytorch.org/memory_viz). Written atomically: a failed write leaves no half file."""
    _config(config)
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError("path", path, "a file path (str or pathlib.Path) for the snapshot")
    _int("steps", steps, 1, 1000)
    _int("max_entries", max_entries, 1, 10**8)
    if capabilities(config.device).kind != "cuda":
        raise RuntimeError("the allocator's history is a CUDA feature (torch.cuda.memory._record_memory_history)")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    check_writable(path)  # a folder, a device or a read-only place is refused now, not after the run
    rec = torch.cuda.memory._record_memory_history
    rec(max_entries=max_entries)
    try:
        run(config.replace(steps=steps, warmup=min(config.warmup, steps - 1)))
        with tempfile.TemporaryDirectory() as tmp:  # private (0o700): PyTorch writes its file here
            own = Path(tmp) / "snapshot.pickle"
            torch.cuda.memory._dump_snapshot(str(own))
            blob = own.read_bytes()  # bytes only: nothing here unpickles it
    finally:
        rec(enabled=None)  # stop recording: it costs time on every allocation
    return str(write_atomic(path, blob))


# ---- bytes per parameter of three mixed-precision recipes ---------------------------------------------------

# recipe -> what it keeps per parameter, in words (the measurement counts the real tensors)
RECIPES = {
    "autocast": "fp32 weights (4) + fp32 gradients (4) + AdamW m, v in fp32 (8); autocast's 16-bit weight copies "
                "live only during forward/backward",
    "16-bit weights + fp32 master": "16-bit weights (2) + 16-bit gradients (2) + fp32 master weights (4) + "
                                    "AdamW m, v (8); the fp32 copy of the gradients lives only for the step",
    "16-bit weights + fp32 master + fp32 grad accumulation": "as above + an fp32 gradient accumulator (4) that "
                "each micro-batch's 16-bit .grad is added into; the 16-bit .grad stays allocated beside it",
}


def _half_dtype(kind: str):
    """bf16 where the hardware runs it (compute capability 8.0+ on CUDA; any CPU), else fp16."""
    if kind == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16
    return torch.bfloat16


def _one_update_autocast(config, dev, x, y, half):
    """labkit's engine: fp32 weights, autocast makes 16-bit copies for the matmuls, AdamW steps the fp32 weights.
    Returns (bytes by role, every tensor the recipe keeps until its next update)."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec).to(dev)
    opt = make_optimizer(config, model.parameters())
    with autocast(dev.type, "bf16" if half == torch.bfloat16 else "fp16"):
        loss = model(x, y)
    loss.backward()
    opt.step()
    return {"weights": state_bytes(model.parameters()), "grads": state_bytes(p.grad for p in model.parameters()),
            "master": 0, "accumulator": 0, "optimizer": sum(state_bytes(s.values()) for s in opt.state.values())}, \
        {"model": model, "opt": opt}


def _one_update_master(config, dev, x, y, half, accumulate_fp32: bool, micro: int = 2):
    """16-bit model weights; the optimizer steps fp32 master copies. With ``accumulate_fp32`` each
    micro-batch's 16-bit .grad is added into an fp32 buffer, which the master weights use as their gradient,
    and the 16-bit .grad stays allocated beside it (the accounting of the Ultra-Scale Playbook's memory table).
    Megatron Core's distributed optimizer instead has backward add straight into an fp32 main_grad and keeps
    no 16-bit .grad: its documentation counts 18 bytes per parameter for that (16-bit params, fp32 grads).
    Returns (bytes by role, every tensor the recipe keeps until its next update)."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec).to(dev).to(half)
    params = list(model.parameters())
    master = [p.detach().float().clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(master, lr=config.lr, weight_decay=0.01)
    acc = [torch.zeros_like(m) for m in master] if accumulate_fp32 else None
    for _ in range(micro):
        (model(x, y) / micro).backward()
        if acc is not None:
            for a, p in zip(acc, params):
                a.add_(p.grad.float())  # fp32 sums: small 16-bit gradients are not lost in the addition
                p.grad.zero_()          # the 16-bit buffer stays allocated for the next micro-batch
    for m, p, a in zip(master, params, acc or [None] * len(params)):
        m.grad = a if a is not None else p.grad.float()
    opt.step()
    with torch.no_grad():
        for m, p in zip(master, params):
            p.copy_(m)  # the updated master weights, rounded to 16 bits for the next forward
            m.grad = None  # the fp32 gradient copy is transient (ZeRO's accounting); the accumulator lives on in acc
    held = {"weights": state_bytes(params), "grads": state_bytes(p.grad for p in params),
            "master": state_bytes(master), "accumulator": state_bytes(acc or []),
            "optimizer": sum(state_bytes(s.values()) for s in opt.state.values())}
    return held, {"model": model, "master": master, "opt": opt, "acc": acc}


def _step_counter_bytes(opt) -> int:
    """Bytes of AdamW's step counters (one small tensor per parameter tensor), part of its state."""
    return state_bytes(s["step"] for s in opt.state.values() if "step" in s)


def _traced(recipe, config, dev, x, y, *args) -> tuple:
    """Run one recipe's update under labkit's tracer: (bytes by role, the kept tensors, the bytes of every
    storage the update made that is still alive while they are kept -- what the process really holds, so a
    tensor the roles forget, such as a gradient copy never freed, shows up as a difference)."""
    tracer = Tracer(torch.nn.Module(), exclude=(x, y))  # the recipe makes every other tensor itself
    with tracer:
        held, kept = recipe(config, dev, x, y, *args)
        alive = sum(tracer.alive_bytes())
    return held, kept, alive


def bytes_per_param(config: Config, n_threads: int | None = 1) -> list:
    """Each recipe of RECIPES trained for one update on ``config``'s model: the bytes of the tensors it
    keeps between updates, by role, counted; and per parameter. ``traced_bytes``: every byte the update's
    own tensors still hold afterwards (labkit's tracer) -- equal to ``total`` when nothing is left uncounted.
    ``step_counter_bytes``: the part of the optimizer's bytes that is AdamW's step counters."""
    _config(config)
    _threads(n_threads)
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    half = _half_dtype(kind)
    rows = []
    with intra_op_threads(n_threads):
        x, y = (t.to(dev) for t in next(iter(make_loader(config)[0])))
        for name in RECIPES:
            if name == "autocast":
                held, kept, alive = _traced(_one_update_autocast, config, dev, x, y, half)
            else:
                held, kept, alive = _traced(_one_update_master, config, dev, x, y, half, "accumulation" in name)
            model = kept["model"]
            n = sum(p.numel() for p in model.parameters())
            total = sum(held.values())
            rows.append({"recipe": name, **held, "total": total, "traced_bytes": alive, "n_params": n,
                         "bytes_per_param": total / n, "half": str(half).replace("torch.", ""),
                         "step_counter_bytes": _step_counter_bytes(kept["opt"]),
                         "param_tensors": len(list(model.parameters()))})
            del model, kept
    return rows


def run_memory(config: Config) -> dict:
    """What one engine run of ``config`` held: weights, gradients and optimizer state (bytes, from the run's
    summary) and the activations kept for backward, counted at the run's micro-batch.

    The engine's summary counts one sequence's activations and multiplies by the micro-batch; under
    attention="math" one sequence keeps scaled copies of q and k as well (see seq_sweep), so the count here
    runs the whole micro-batch. ``engine_activation_bytes`` keeps the summary's own figure."""
    _config(config)
    s = run(config.replace(steps=1, warmup=0)).summary
    parts = {k: s[k] or 0 for k in ("param_bytes", "grad_bytes", "optimizer_bytes")}
    with intra_op_threads(config.threads):
        acts, _ = activation_bytes(config, torch_device(capabilities(config.device).kind), batch=config.micro_batch)
    parts["activation_bytes"] = acts
    return {**parts, "total": sum(parts.values()), "n_params": s["n_params"],
            "engine_activation_bytes": s["activation_bytes"]}


# ---- pictures -----------------------------------------------------------------------------------------------


def _figure(width: float, height: float):
    """A figure at the course's resolution and its text sizes in points (plots.FONT, plots.TITLE: at least
    10 px where the notebook shows the figure at its own size, as it does up to ~800 px wide)."""
    from ..tools import plots  # deferred: matplotlib is heavy; loaded only to draw

    _size(width, height)
    return plots.new_figure(width, height), plots.FONT, plots.TITLE


def plot_seq_sweep(rows, width: float = 6.0, height: float = 3.0):
    """Measured activation bytes against T (dots) and the formula (lines), one colour per backend, on linear
    axes so that the math backend's T² term shows as a bend."""
    rows = _rows(rows, "measured_bytes")
    fig, font, _ = _figure(width, height)
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
    fig, font, title = _figure(width, height)
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
    fig, font, title = _figure(width, height)
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
    fig, font, _ = _figure(width, height)
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


if __name__ == "__main__":  # the allocator demo's own process (fragmentation_demo)
    if "--fragment" in sys.argv:
        print(json.dumps(_fragment()))
