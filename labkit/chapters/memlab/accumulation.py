"""One update's peak against the accumulation steps K, trained by hand (taught in chapter 03; its tools
live with chapter 08's, whose first-updates machinery they share).

    peak = memlab.update_peak(config.replace(accum=4))   # one update's peak, K micro-batches
    by_k, by_mb = memlab.accumulation_peaks(config)      # the effective batch grown two ways
"""
from __future__ import annotations

from ...engine.config import Config, ConfigError, _int
from ...engine.device import intra_op_threads
from ._common import MIB, _config, _items, _threads
from .updates import _by_hand, _forward_backward, _source, _step_peak


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
    from ...base.progress import Progress  # deferred: a notebook-only display

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


def unequal_note(counts: list, true_mean: float, mean_of_means: float, weighted: float) -> str:
    """Chapter 03's sentence about micro-batches with unequal numbers of valid tokens: the mean over all
    tokens against the plain mean of the micro-batch means, and the token-weighted mean."""
    return (f"Valid tokens per micro-batch: {counts}. Mean over all tokens **{true_mean:.4f}**; mean of the "
            f"micro-batch means {mean_of_means:.4f} (off by {abs(mean_of_means - true_mean):.2g}); "
            f"token-weighted {weighted:.4f}.")


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
