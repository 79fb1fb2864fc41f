"""Checkers for chapters 00-01: memory arithmetic, FLOPs and MFU, the step's bottleneck.

Every checker takes the learner's answer (a number, a function or a class), returns
``(passed, message)`` and is wrapped by ``checker`` so that it never raises in a notebook. A
placeholder answer (None or ``...``) -- or a function whose body is still ``...`` and so returns
None -- counts as "not attempted". The hints name the mistake learners actually make.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..base import phrases
from ._core import a_function, checker, given, number, returned

__all__ = [
    # 00 start here
    "bytes_per_param_mixed_adam", "llm_memory_gb", "training_state_bytes",
    # 01 measure first
    "flops_linear", "mfu_from_numbers", "find_bottleneck",
]


# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapters 00 and 01
WORDS = phrases.load_section("lab_messages.md", "Checks: chapters 00 and 01", {
    "flops-one-grad": ("em",),
    "state-sgd": ("em",),
    "state-adamw": ("em",),
    **dict.fromkeys(("bpp-right", "bpp-2", "bpp-4", "bpp-8", "bpp-12", "bpp-20", "bpp-other"), ()),
    "bpp-wrong": ("answer", "hint"), "gb-right": ("want", "at20"), "gb-gib": ("want",), "gb-bytes": ("answer",),
    **dict.fromkeys(("gb-2", "gb-4", "gb-8", "gb-12", "gb-20"), ()), "gb-other": ("n_params",),
    "gb-wrong": ("answer", "per", "hint"),
    **dict.fromkeys(("state-no-grads", "state-weights", "state-right"), ()),
    "state-other": ("opt",), "state-wrong": ("n", "opt", "got", "ratio", "hint"),
    **dict.fromkeys(("flops-forward", "flops-madd", "flops-other", "flops-right"), ()),
    "flops-wrong": ("shape", "got", "want", "hint"),
    "mfu-right": ("want", "pct"), "mfu-percent": ("answer", "want"),
    **dict.fromkeys(("mfu-sparse", "mfu-2n", "mfu-one-gpu", "mfu-per-gpu"), ()), "mfu-hinted": ("answer", "hint"),
    "mfu-wrong": ("answer",), "phase-smallest": ("em",), "phase-compare": (), "phase-right": (),
    "phase-wrong": ("breakdown", "got", "want", "hint")})


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a)


# ---- 00 start here ---------------------------------------------------------------------------

@checker
def bytes_per_param_mixed_adam(answer):
    """Bytes per parameter of training state for mixed-precision Adam (before any activation).

    The regime checked: gradients kept once, so 16 bytes -- 16-bit weights and gradients next to fp32
    master weights and Adam moments (the ZeRO paper's count), or autocast's fp32 weights and gradients.
    The Ultra-Scale Playbook's 20 (gradients also accumulated in fp32) is a different regime and fails,
    with a hint that says so."""
    v = number(answer, "give a number of bytes")
    if abs(v - 16) < 0.01:
        return True, WORDS.say("bpp-right")
    hint = WORDS.say(f"bpp-{round(v)}" if round(v) in (2, 4, 8, 12, 20) else "bpp-other")
    return False, WORDS.say("bpp-wrong", answer=f"{v:g}", hint=hint)


@checker
def llm_memory_gb(answer, n_params: float = 13e9):
    """GB (10^9 bytes) of weights, gradients and Adam state for mixed-precision training, in the
    16-bytes-per-parameter regime (gradients kept once; see ``bytes_per_param_mixed_adam``)."""
    v = number(answer, "give a number in GB")
    want = 16 * n_params / 1e9
    if _rel(v, want) <= 0.02:
        return True, WORDS.say("gb-right", want=f"{want:,.0f}", at20=f"{20 * n_params / 1e9:,.0f}")
    if _rel(v, want / 1.073741824) <= 0.02:
        return True, WORDS.say("gb-gib", want=f"{want:,.0f}")
    if _rel(v, want * 1e9) <= 0.02:  # the right amount, in bytes
        return False, WORDS.say("gb-bytes", answer=f"{v:g}")
    per = v * 1e9 / n_params
    hint = (WORDS.say(f"gb-{round(per)}") if round(per) in (2, 4, 8, 12, 20)
            else WORDS.say("gb-other", n_params=f"{n_params:.3g}"))
    return False, WORDS.say("gb-wrong", answer=f"{v:g}", per=f"{per:.3g}", hint=hint)


@checker
def training_state_bytes(fn):
    """fn(n_params, optimizer) -> bytes of fp32 weights + gradients + optimizer state: plain fp32
    training, which is also what PyTorch's autocast keeps (labkit's engine measures the same)."""
    a_function(fn)
    cases = [(n, opt) for n in (1_000, 3_257_856, 7_000_000_000) for opt in ("adamw", "sgd")]
    # every answer before anything right exists: the learner's code finds no expected value to read
    answers = [returned(fn(n, opt), "return a number of bytes") for n, opt in cases]
    for (n, opt), got in zip(cases, answers):
        bpp = {"adamw": 16, "sgd": 12}[opt]
        if _rel(got, bpp * n) > 1e-6:
                ratio = got / n
                if opt == "adamw" and round(ratio) == 12:
                    hint = WORDS.say("state-adamw", em="*")
                elif opt == "sgd" and round(ratio) == 16:
                    hint = WORDS.say("state-sgd", em="*")
                elif round(ratio) == bpp - 4:
                    hint = WORDS.say("state-no-grads")
                elif round(ratio) == 4:
                    hint = WORDS.say("state-weights")
                else:
                    hint = WORDS.say("state-other", opt=opt)
                return False, WORDS.say("state-wrong", n=f"{n:,}", opt=opt, got=f"{got:,.0f}", ratio=f"{ratio:.3g}",
                                    hint=hint)
    return True, WORDS.say("state-right")


# ---- 01 measure first ------------------------------------------------------------------------

def _counted_linear_flops(tokens: int, d_in: int, d_out: int) -> int:
    """FlopCounterMode's count for forward + backward of one Linear inside a network (the input
    needs a gradient too, as every layer but the first does)."""
    with torch.device("meta"):
        layer = torch.nn.Linear(d_in, d_out)
        x = torch.empty(tokens, d_in, requires_grad=True)
    counter = FlopCounterMode(display=False)
    with counter:
        layer(x).sum().backward()
    return int(counter.get_total_flops())


@checker
def flops_linear(fn):
    """fn(tokens, d_in, d_out) -> FLOPs of forward + backward of a Linear layer (matmuls only)."""
    a_function(fn)
    shapes = ((8, 16, 32), (128, 64, 256), (3, 5, 7), (4096, 768, 3072))
    answers = [returned(fn(*shape), "return a number of FLOPs") for shape in shapes]  # before any count exists
    for shape, got in zip(shapes, answers):
        want = _counted_linear_flops(*shape)
        if _rel(got, want) > 1e-9:
            r = got / want
            if abs(r - 1 / 3) < 1e-6:
                hint = WORDS.say("flops-forward")
            elif abs(r - 2 / 3) < 1e-6:
                hint = WORDS.say("flops-one-grad", em="*")
            elif abs(r - 0.5) < 1e-6 or abs(r - 1 / 6) < 1e-6:
                hint = WORDS.say("flops-madd")
            else:
                hint = WORDS.say("flops-other")
            return False, WORDS.say("flops-wrong", shape=str(shape), got=f"{got:,.0f}", want=f"{want:,}", hint=hint)
    return True, WORDS.say("flops-right")


# The scenario of chapter 01's MFU exercise (also printed in the notebook).
MFU_SCENARIO = dict(n_params=1.3e9, tokens_per_s=240_000, n_gpus=8, peak_dense=989e12, peak_sparse=1979e12)


@checker
def mfu_from_numbers(answer, n_params=1.3e9, tokens_per_s=240_000, n_gpus=8, peak_dense=989e12,
                     peak_sparse=1979e12):
    """MFU of the chapter's scenario, as a fraction (0.25) or in percent (25)."""
    v = number(answer, "give a number: a fraction such as 0.4, or a percentage")
    want = 6 * n_params * tokens_per_s / (n_gpus * peak_dense)
    if _rel(v, want) <= 0.03:
        return True, WORDS.say("mfu-right", want=f"{want:.3f}", pct=f"{100 * want:.1f}")
    if _rel(v, 100 * want) <= 0.03:
        return True, WORDS.say("mfu-percent", answer=f"{v:.3g}", want=f"{want:.3f}")
    frac = v / 100 if v > 1.5 else v
    candidates = {
        "sparse": (6 * n_params * tokens_per_s / (n_gpus * peak_sparse),
                   WORDS.say("mfu-sparse")),
        "2N": (2 * n_params * tokens_per_s / (n_gpus * peak_dense),
               WORDS.say("mfu-2n")),
        "one gpu": (6 * n_params * tokens_per_s / peak_dense,
                    WORDS.say("mfu-one-gpu")),
        "per gpu tokens": (6 * n_params * tokens_per_s / (n_gpus * n_gpus * peak_dense),
                           WORDS.say("mfu-per-gpu")),
    }
    for value, hint in candidates.values():
        if _rel(frac, value) <= 0.03 or _rel(v, value) <= 0.03:
            return False, WORDS.say("mfu-hinted", answer=f"{v:g}", hint=hint)
    return False, WORDS.say("mfu-wrong", answer=f"{v:g}")


_PHASES = ("data", "compute", "optimizer")


def _phase(name) -> str:
    s = str(name).lower().strip()
    for p in _PHASES:
        if s.startswith(p):
            return p
    raise ValueError(f"return one of 'data', 'compute', 'optimizer'; got {name!r}")


@checker
def find_bottleneck(fn):
    """fn(breakdown) -> 'data', 'compute' or 'optimizer': the phase that takes most of the step."""
    a_function(fn)
    cases = [{"data_wait_s": 0.120, "compute_s": 0.060, "optimizer_s": 0.010},
             {"data_wait_s": 0.002, "compute_s": 0.180, "optimizer_s": 0.015},
             {"data_wait_s": 0.001, "compute_s": 0.020, "optimizer_s": 0.045},
             {"data_wait_s": 0.050, "compute_s": 0.049, "optimizer_s": 0.001}]
    answers = [_phase(given(fn(dict(breakdown)))) for breakdown in cases]  # before the right phase is known
    for breakdown, got in zip(cases, answers):
        want = _phase(max(breakdown, key=breakdown.get))
        if got != want:
            smallest = min(breakdown, key=breakdown.get)
            hint = WORDS.say("phase-smallest" if got == _phase(smallest) else "phase-compare", em="*")
            return False, WORDS.say("phase-wrong", breakdown=str(breakdown), got=repr(got), want=repr(want), hint=hint)
    return True, WORDS.say("phase-right")
