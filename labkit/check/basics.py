"""Checkers for chapters 00-01: memory arithmetic, FLOPs and MFU, the step's bottleneck.

Every checker takes the learner's answer (a number, a function or a class), returns
``(passed, message)`` and is wrapped by ``checker`` so that it never raises in a notebook. A
placeholder answer (None or ``...``) -- or a function whose body is still ``...`` and so returns
None -- counts as "not attempted". The hints name the mistake learners actually make.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ._core import a_function, checker, given, number, returned

__all__ = [
    # 00 start here
    "bytes_per_param_mixed_adam", "llm_memory_gb", "training_state_bytes",
    # 01 measure first
    "flops_linear", "mfu_from_numbers", "find_bottleneck",
]


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
        return True, ("16 bytes, with the gradients kept once: 16-bit weights (2) + 16-bit gradients (2) + fp32 "
                      "master weights (4) + Adam's two fp32 moments (4 + 4). PyTorch's autocast (labkit's engine) "
                      "keeps fp32 weights and gradients instead (4 + 4 + 8): the same 16. Frameworks that also "
                      "accumulate the gradients in fp32 need about 20 (the Ultra-Scale Playbook's table).")
    hints = {
        2: "2 bytes is only the 16-bit copy of the weights.",
        4: "4 bytes is only one fp32 number per parameter (the master weights).",
        8: "you have two or three of the pieces; Adam alone keeps two fp32 numbers per parameter (8 bytes).",
        12: "close: 12 is fp32 master weights plus Adam's two moments; the 16-bit weights and gradients "
            "(2 + 2) are missing.",
        20: "20 is the count when gradients are also accumulated in fp32 (the Ultra-Scale Playbook's "
            "table: 2 + 2 + 4 + 4 + 8). This exercise checks the regime that keeps the gradients once, "
            "in 16 bits, next to fp32 master weights and Adam's moments.",
    }
    hint = hints.get(round(v), "list every tensor mixed-precision Adam keeps per parameter -- the weights and "
                               "their master copy, the gradients, Adam's state -- each with its width, and add up "
                               "their bytes.")
    return False, f"{v:g} bytes is not it — {hint}"


@checker
def llm_memory_gb(answer, n_params: float = 13e9):
    """GB (10^9 bytes) of weights, gradients and Adam state for mixed-precision training, in the
    16-bytes-per-parameter regime (gradients kept once; see ``bytes_per_param_mixed_adam``)."""
    v = number(answer, "give a number in GB")
    want = 16 * n_params / 1e9
    if _rel(v, want) <= 0.02:
        return True, (f"{want:,.0f} GB at 16 bytes per parameter (gradients kept once; about "
                      f"{20 * n_params / 1e9:,.0f} GB at 20 if they are also accumulated in fp32) -- before a "
                      "single activation. No single 80 GB or 141 GB GPU holds that: sharding (ZeRO/FSDP) or "
                      "offloading is needed.")
    if _rel(v, want / 1.073741824) <= 0.02:
        return True, f"right, in GiB (2^30 bytes); in GB (10^9 bytes) it is {want:,.0f}."
    if _rel(v, want * 1e9) <= 0.02:  # the right amount, in bytes
        return False, f"{v:g} is the right amount in bytes: the answer is in GB (10^9 bytes)."
    per = v * 1e9 / n_params
    hints = {2: "that is only the 16-bit weights (2 bytes per parameter).",
             4: "that is only one fp32 copy of the weights (4 bytes per parameter).",
             8: "that is half of it: count each piece of the training state again (the exercise before).",
             12: "the 16-bit weights and gradients (2 + 2 bytes per parameter) are missing.",
             20: "20 is the count when gradients are also accumulated in fp32; this exercise checks the "
                 "16-byte regime (gradients kept once)."}
    hint = hints.get(round(per), f"how many bytes does mixed-precision Adam keep per parameter, with the gradients "
                                 f"kept once (the exercise before)? Scale that to {n_params:.3g} parameters, in "
                                 "GB (10^9 bytes).")
    return False, f"{v:g} GB is {per:.3g} bytes per parameter: {hint}"


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
                    hint = "AdamW keeps *two* fp32 moments per parameter (exp_avg and exp_avg_sq)."
                elif opt == "sgd" and round(ratio) == 16:
                    hint = "SGD with momentum keeps only *one* buffer per parameter."
                elif round(ratio) == bpp - 4:
                    hint = "the gradients are missing: one fp32 number per parameter, as big as the weights."
                elif round(ratio) == 4:
                    hint = "that is the weights alone; add gradients and the optimizer's state."
                else:
                    hint = ("which fp32 tensors does training keep for every parameter: the weights, and what "
                            f"else? Count what {opt} itself keeps.")
                return False, (f"for {n:,} parameters with {opt} you return {got:,.0f} bytes ({ratio:.3g} per "
                               f"parameter): that is not it. Hint: {hint}")
    return True, ("16 bytes per parameter with AdamW, 12 with SGD + momentum (fp32 weights, gradients, state). "
                  "Autocast keeps the same, plus 16-bit weight copies that live only during a step.")


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
                hint = "that is the forward pass only; the backward pass costs twice the forward."
            elif abs(r - 2 / 3) < 1e-6:
                hint = ("the backward pass has *two* matmuls: the gradient for the input (to pass on) and the "
                        "gradient for the weight.")
            elif abs(r - 0.5) < 1e-6 or abs(r - 1 / 6) < 1e-6:
                hint = "a multiply-add is 2 FLOPs (one multiply, one add)."
            else:
                hint = ("count the matmuls: the forward's one, then backward's (a gradient for the input and one "
                        "for the weight), at 2 FLOPs per multiply-add.")
            return False, f"for tokens, d_in, d_out = {shape} you return {got:,.0f}; FlopCounterMode counts {want:,}: {hint}"
    return True, "6·tokens·d_in·d_out, as FlopCounterMode counts: forward 2, backward 4 (input and weight gradients)."


# The scenario of chapter 01's MFU exercise (also printed in the notebook).
MFU_SCENARIO = dict(n_params=1.3e9, tokens_per_s=240_000, n_gpus=8, peak_dense=989e12, peak_sparse=1979e12)


@checker
def mfu_from_numbers(answer, n_params=1.3e9, tokens_per_s=240_000, n_gpus=8, peak_dense=989e12,
                     peak_sparse=1979e12):
    """MFU of the chapter's scenario, as a fraction (0.25) or in percent (25)."""
    v = number(answer, "give a number: a fraction such as 0.4, or a percentage")
    want = 6 * n_params * tokens_per_s / (n_gpus * peak_dense)
    if _rel(v, want) <= 0.03:
        return True, f"MFU = 6·N·tokens/s ÷ (GPUs × dense peak) = {want:.3f} ({100 * want:.1f}%)."
    if _rel(v, 100 * want) <= 0.03:
        return True, f"right, in percent ({v:.3g}%); as a fraction it is {want:.3f}."
    frac = v / 100 if v > 1.5 else v
    candidates = {
        "sparse": (6 * n_params * tokens_per_s / (n_gpus * peak_sparse),
                   "you divided by the 2:4-sparse peak; MFU uses the dense figure."),
        "2N": (2 * n_params * tokens_per_s / (n_gpus * peak_dense),
               "a training step costs 6·N FLOPs per token (forward 2N + backward 4N), not 2·N."),
        "one gpu": (6 * n_params * tokens_per_s / peak_dense,
                    "the tokens/s are for all GPUs together: divide by the peak of all of them."),
        "per gpu tokens": (6 * n_params * tokens_per_s / (n_gpus * n_gpus * peak_dense),
                           "the tokens/s are already the total: divide by the GPUs once."),
    }
    for value, hint in candidates.values():
        if _rel(frac, value) <= 0.03 or _rel(v, value) <= 0.03:
            return False, f"{v:g} is not it: {hint}"
    return False, (f"{v:g} is not it. MFU compares the FLOP/s the model's training does (per token: its forward and "
                   "backward) with the peak FLOP/s of every GPU the run uses.")


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
            hint = ("you picked the *smallest* part; the bottleneck is where most of the time goes."
                    if got == _phase(smallest) else "compare all three parts: which one is the largest?")
            return False, f"for {breakdown} you say {got!r}, but the step mostly waits on {want!r}. {hint}"
    return True, "the largest part of the step is the one to fix first."
