"""Fused, foreach and for-loop AdamW (taught in chapter 07): which one torch picks by itself, where fused
runs, and each one's ``optimizer.step()`` timed interleaved over the same model's weights."""
from __future__ import annotations

import torch

from ...engine.config import Config, _choice, _int
from ...engine.device import capabilities, intra_op_threads, torch_device
from ...engine.model import GPT
from .common import _need_budget, _need_config, _need_threads, bench_threads, interleaved

__all__ = ["ADAMW_IMPLS", "fused_supported", "default_adamw", "adamw_impls", "optimizer_steps"]

ADAMW_IMPLS = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}


def fused_supported(kind: str | None = None) -> tuple:
    """(ok, error): whether ``AdamW(fused=True)`` steps on this device type (it needs a fused kernel for
    the device: CUDA since torch 2.0, CPU since 2.4, MPS later); ``error``: torch's refusal (cut to 160
    characters), None where it steps."""
    kind = kind or capabilities("auto").kind
    dev = torch_device(kind)
    p = torch.nn.Parameter(torch.zeros(4, device=dev))
    p.grad = torch.ones(4, device=dev)
    try:
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
    except (RuntimeError, ValueError, NotImplementedError) as e:
        return False, str(e)[:160]
    return True, None


def default_adamw(params) -> str:
    """Which implementation ``torch.optim.AdamW(params)`` picks by itself: foreach for CUDA tensors, the
    for-loop elsewhere (torch's own rule, asked rather than assumed)."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach  # deferred: a private torch API, read only where it exists

        fused, foreach = _default_to_fused_or_foreach(list(params), False, False)
    except Exception:  # noqa: BLE001 -- a private helper: fall back to the documented rule
        foreach, fused = all(p.is_cuda for p in params), False
    return "fused" if fused else "foreach" if foreach else "for-loop"


def adamw_impls(kind: str | None = None) -> list:
    """The AdamW implementations to compare on this device: fused only where it is supported."""
    impls = ["for-loop", "foreach"]
    if fused_supported(kind)[0]:
        impls.append("fused")
    return impls


def optimizer_steps(config: Config, impls=None, repeats: int = 10, budget_s: float = 10.0,
                    n_threads: int | None = None) -> dict:
    """Seconds per ``optimizer.step()`` of AdamW over ``config``'s model parameters, for each
    implementation, interleaved. Each implementation gets its own copy of the weights (its own state)
    and the same random gradients. Returns {"times": {impl: [s, ...]}, "default": impl, "n_params": N}."""
    _need_config("config", config)
    for impl in impls or ():
        _choice("impls", impl, tuple(ADAMW_IMPLS))
    _int("repeats", repeats, 1, 10**6)
    _need_budget(budget_s)
    _need_threads(n_threads)
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    impls = list(impls or adamw_impls(kind))
    opts = {}
    with intra_op_threads(n_threads if n_threads is not None else (config.threads or bench_threads(kind))):
        for impl in impls:
            torch.manual_seed(config.seed)
            model = GPT(config.spec).to(dev)
            g = torch.Generator().manual_seed(1)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g).to(dev)
            opts[impl] = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01, **ADAMW_IMPLS[impl])
        default = default_adamw(list(next(iter(opts.values())).param_groups[0]["params"]))
        times = interleaved({k: o.step for k, o in opts.items()}, repeats=repeats, warmup=1, budget_s=budget_s,
                            device=dev)
    n = sum(p.numel() for p in next(iter(opts.values())).param_groups[0]["params"])
    return {"times": times, "default": default, "n_params": n}


