"""The update step the course teaches: K micro-batches whose gradients add up, then one optimizer step.

``micro_steps`` is gradient accumulation (chapter 03): forward and backward each micro-batch, the loss
divided by K so K of them make one big batch -- and under DDP ``no_sync`` on the first K-1, so gradients
are all-reduced once per update, not once per micro-batch (chapter 06). ``optimizer_step`` is the
update itself (chapter 02): unscale a GradScaler's gradients, clip, step, zero. The training loop
(``labkit.engine.train``) calls both once per update; ``train`` re-exports them under their old names.
"""
from __future__ import annotations

import contextlib
import time

import torch

from ..base.runtime import NonFiniteError, RunError, Stopped
from .precision import autocast


def make_optimizer(config, params):
    """The run's optimizer: AdamW (weight decay 0.01), or SGD with momentum 0.9."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01)


def loader_died(e: BaseException) -> bool:
    """Whether ``e`` is PyTorch's news of a killed loader worker. It comes from next() -- or from the
    loader's SIGCHLD handler, which raises wherever the main thread happens to be: in backward, in a
    DDP comm hook, in the optimizer step."""
    return (isinstance(e, RuntimeError) and not isinstance(e, RunError)
            and "DataLoader worker" in str(e))


def loader_died_error(e: BaseException) -> RunError:
    return RunError(f"a DataLoader worker process died, so the run stopped ({type(e).__name__}: {str(e).strip()}). "
                    "If the machine ran out of memory, try fewer workers or a smaller prefetch_factor.")


def _next_batch(batches):
    try:
        return next(batches)
    except (RuntimeError, ConnectionError, EOFError) as e:
        # A killed worker (out of memory, SIGKILL) shows up as a RuntimeError from the loader, or as a
        # broken pipe while a batch was being handed over.
        if isinstance(e, RuntimeError) and not loader_died(e):
            raise
        raise loader_died_error(e) from None


def micro_steps(net, fwd, batches, K, scaler, kind, precision, dev, *, no_sync=False, non_blocking=False,
                should_stop=lambda: False):
    """Gradient accumulation: forward and backward K micro-batches, whose gradients add up in ``.grad``;
    ``optimizer_step`` then makes one update of them. Returns (per-micro-batch losses, seconds spent
    waiting for data). Shown in 03_gradient_accumulation (code-03-accumulation-loop)."""
    losses, data_s = [], 0.0
    for k in range(K):
        if should_stop():
            raise Stopped()
        td = time.perf_counter()
        x, y = _next_batch(batches)
        x, y = x.to(dev, non_blocking=non_blocking), y.to(dev, non_blocking=non_blocking)
        data_s += time.perf_counter() - td
        # no_sync: skip the AllReduce on the first K-1 micro-batches; local gradients just add up
        with net.no_sync() if no_sync and k < K - 1 else contextlib.nullcontext():
            with autocast(kind, precision):  # fp16/bf16 matmuls (chapter 02); a no-op in fp32/tf32
                loss = fwd(x, y)
            scaled = loss / K  # average over micro-batches: K of them = one big batch
            (scaler.scale(scaled) if scaler else scaled).backward()  # adds into .grad: that sum is the accumulation
        losses.append(loss.detach())  # detached: the log keeps the value, not the autograd graph
    return losses, data_s


def optimizer_step(model, optimizer, scaler, grad_clip, on_nonfinite="continue", loss=None, where="", hint=""):
    """Unscale, clip, step, zero. Returns (grad norm before clipping, whether the step was skipped).

    Without a GradScaler, inf/NaN gradients are handled by ``on_nonfinite``: "stop" raises
    NonFiniteError naming what went bad, "skip" drops the update, "continue" applies it anyway.
    Shown in 03_gradient_accumulation (code-03-accumulation-loop).
    """
    if scaler:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    clip = grad_clip if grad_clip else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)  # norm before clipping
    skipped = False
    if scaler:
        before = scaler.get_scale()
        scaler.step(optimizer)  # skipped when the gradients hold inf/NaN
        scaler.update()  # halve the scale after an overflow, grow it after a calm stretch
        skipped = scaler.get_scale() < before
    elif on_nonfinite != "continue" and not torch.isfinite(grad_norm):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        bad = sum(not bool(torch.isfinite(g).all()) for g in grads)
        optimizer.zero_grad(set_to_none=True)
        if on_nonfinite == "stop":
            what = []
            if loss is not None and not torch.isfinite(loss).all():
                what.append(f"the loss is {float(loss)}")
            what.append(f"{bad} of {len(grads)} gradient tensors hold inf/NaN")
            raise NonFiniteError(f"{where}: {' and '.join(what)}. {hint}".strip())
        skipped = True  # "skip": leave the weights as they were, like GradScaler does
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # once per update, never inside the micro-batch loop
    return grad_norm, skipped
