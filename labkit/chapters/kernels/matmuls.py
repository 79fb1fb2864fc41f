"""The matmul's shape and precision (taught in chapter 07): an LM head alone at two vocabulary sizes
(``compare_head_shapes``, a padded 50304 against 50257, and ``padding_verdict`` for what the verdict allows),
and an n x n matmul in fp32, TF32 and bf16 with its error against fp64 (``tf32_matmul``, CUDA only)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...engine.device import capabilities, intra_op_threads, torch_device
from ...base.errors import ConfigError
from ...engine import rules
from ...engine.config import Config, _int
from ...engine.measure import median
from ...engine.precision import matmul_precision
from ...tools.compare import verdict
from .common import _need_budget, _need_threads, bench_threads, interleaved

__all__ = ["head_step", "compare_head_shapes", "padding_verdict", "tf32_refusal", "tf32_matmul"]


# ---- shapes: a padded vocabulary ------------------------------------------------------------------------


def head_step(vocab: int, tokens: int, d_model: int, device=None, dtype=torch.float32, seed: int = 0):
    """A function that runs one training step of an LM head alone: logits = x·Wᵀ, cross-entropy, backward.
    The vocabulary size is the matmul's N dimension, and the softmax's width."""
    _int("vocab", vocab, 2, 10**7)
    _int("tokens", tokens, 1, 10**7)
    _int("d_model", d_model, 1, 65536)
    dev = device or torch_device()
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, d_model, generator=g) * 0.02).to(dev, dtype).requires_grad_()
    w = (torch.randn(vocab, d_model, generator=g) * 0.02).to(dev, dtype).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g).to(dev)

    def step():
        loss = F.cross_entropy((x @ w.t()).float(), y)
        loss.backward()
        x.grad = w.grad = None

    return step


def compare_head_shapes(vocab_a: int, vocab_b: int, tokens: int, d_model: int, repeats: int = 15,
                        budget_s: float = 10.0, dtype=torch.float32, n_threads: int | None = None):
    """Interleaved head steps at two vocabulary sizes; the course's bootstrap verdict on their times
    (metric step_time_s: one 'update' here is one step of the head alone)."""
    for name, v in (("vocab_a", vocab_a), ("vocab_b", vocab_b)):
        _int(name, v, 2, 10**7)
    _int("tokens", tokens, 1, 10**7)
    _int("d_model", d_model, 1, 65536)
    _int("repeats", repeats, 1, 10**6)
    _need_budget(budget_s)
    _need_threads(n_threads)
    dev = torch_device()
    with intra_op_threads(n_threads if n_threads is not None else bench_threads(dev.type)):
        fns = {"a": head_step(vocab_a, tokens, d_model, dev, dtype),
               "b": head_step(vocab_b, tokens, d_model, dev, dtype)}
        t = interleaved(fns, repeats=repeats, warmup=2, budget_s=budget_s, device=dev)
    return verdict(t["a"], t["b"], "step_time_s", label_a=f"vocabulary {vocab_a:,}", label_b=f"vocabulary {vocab_b:,}")


def padding_verdict(cmp, extra_flops_pct: float = 0.09) -> dict:
    """What the padded-vocabulary comparison ``cmp`` (a = unpadded, b = padded, step_time_s) shows, as a verdict
    name that agrees with its own sentence -- a difference is one when the interval excludes 1, even below the
    course's threshold -- and the figures its words quote. ``verdict``: 'few' (no verdict), 'padded_faster',
    'unpadded_faster' (beyond the threshold), 'small_gain' / 'small_cost' (resolved, below the threshold),
    'scattered' (the interval includes 1 and the repeats scatter beyond the threshold) or 'within' (the
    interval includes 1 and bounds the cost: ``bound_pct``)."""
    out = {"extra_flops_pct": extra_flops_pct, "pct": None, "threshold_pct": 100 * cmp.threshold,
           "spread_pct": 100 * (cmp.spread or 0.0), "low": cmp.low, "high": cmp.high, "bound_pct": None}
    if cmp.ratio is None or not cmp.decided:
        return {**out, "verdict": "few"}
    out["pct"] = 100 * abs(cmp.ratio - 1)
    if cmp.better in ("a", "b"):
        return {**out, "verdict": "padded_faster" if cmp.better == "b" else "unpadded_faster"}
    if cmp.low > 1 or cmp.high < 1:  # resolved, but below the threshold the course counts as an effect
        return {**out, "verdict": "small_gain" if cmp.ratio < 1 else "small_cost"}
    if (cmp.spread or 0.0) > cmp.threshold:
        return {**out, "verdict": "scattered"}
    return {**out, "bound_pct": 100 * max(1 - cmp.low, cmp.high - 1), "verdict": "within"}


def tf32_refusal() -> str | None:
    """The engine's own refusal of ``precision="tf32"`` on this device (what ``lk.run`` would say), or None
    where it accepts it."""
    try:
        rules.check(Config(precision="tf32"))
    except ConfigError as e:
        return str(e)
    return None


# ---- TF32 ------------------------------------------------------------------------------------------------


def tf32_matmul(n: int = 4096, reps: int = 10) -> dict:
    """On CUDA: an n×n matmul's FLOP/s in fp32 (TF32 off), TF32 and bf16, and each one's relative error
    against an fp64 product of the same inputs. Raises RuntimeError elsewhere (TF32 is a tensor-core mode)."""
    _int("n", n, 1, 1 << 16)
    _int("reps", reps, 1, 10**6)
    kind = capabilities("auto").kind
    if kind != "cuda":
        raise RuntimeError(f"TF32 needs NVIDIA tensor cores (Ampere or newer); this device is {kind}")
    dev = torch_device(kind)
    g = torch.Generator().manual_seed(0)
    a64, b64 = (torch.randn(n, n, generator=g, dtype=torch.float64) for _ in range(2))
    ref = (a64 @ b64).to(dev)
    a, b = a64.float().to(dev), b64.float().to(dev)
    out = {}
    for name, prec in (("fp32", "fp32"), ("tf32", "tf32"), ("bf16", "fp32")):
        x, y = (a.bfloat16(), b.bfloat16()) if name == "bf16" else (a, b)
        with matmul_precision(kind, prec):
            c = x @ y
            t = interleaved({name: lambda: x @ y}, repeats=reps, warmup=2, device=dev)[name]
        err = float((c.double() - ref).norm() / ref.norm())
        out[name] = {"tflops": 2 * n**3 / median(t) / 1e12, "rel_error": err, "seconds": median(t)}
    return {"n": n, **out}


