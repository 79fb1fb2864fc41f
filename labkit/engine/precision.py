"""Number formats, decided once per run: ``resolve(config, caps) -> Numerics``.

A run's ``precision`` string means several things at once -- autocast's dtype, whether fp32 matmuls
may use TF32, whether a GradScaler scales the loss, whether this device can serve it at all, and
what a learner should be told about its speed here. Every one of those readings lives here; the
engine, the panel and the CLI ask a ``Numerics`` (``num.matmuls()``, ``num.autocast()``,
``num.grad_scaler()``, ``num.refusal``) instead of comparing strings.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

from .device import FORMATS, Capabilities, slowdown, tf32_matmuls
from .gpus import precision_refusal
from ..base.runtime import ConfigError


@dataclass(frozen=True)
class Numerics:
    """How one run computes: read from the Config and the device once, used everywhere after."""

    precision: str
    kind: str                         # the device kind autocast and GradScaler are made for
    dtype: Optional[torch.dtype]      # autocast's dtype; None = no autocast (fp32, tf32)
    tf32: bool                        # fp32 matmuls on TF32 tensor cores
    scaler: bool                      # a GradScaler scales the loss
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    refusal: Optional[ConfigError] = None  # why this device cannot run it (None: it can)
    caps: Optional[Capabilities] = None

    def autocast(self):
        """Run matmuls in fp16/bf16 while autocast keeps precision-sensitive ops (losses, ...) in fp32."""
        return autocast(self.kind, self.precision)

    def matmuls(self):
        """TF32 on or off for the run's fp32 matmuls (CUDA only), restored afterwards."""
        return tf32_matmuls(self.kind, self.tf32)

    def grad_scaler(self):
        """The run's GradScaler, or None when loss scaling is off."""
        return grad_scaler(self.kind, self.scaler, self.init_scale, self.growth_interval)

    @property
    def note(self) -> Optional[str]:
        """What this device means for the run's speed (a CPU's measured slowdown), or None."""
        if self.caps is None or self.caps.kind != "cpu" or self.dtype is None:
            return None
        return precision_note(self.caps, self.precision, slowdown(self.caps, self.precision))

    def nonfinite_hint(self) -> str:
        """What to change when inf/NaN gradients stop a run that has no GradScaler."""
        why = ("fp16 overflows above 65504 and flushes tiny values to zero: turn loss scaling on, or use bf16"
               if self.precision == "fp16" else "lower the learning rate or clip gradients")
        return (f"Precision {self.precision}, loss scaling {'on' if self.scaler else 'off'}: {why}. "
                "(on_nonfinite='skip' drops such updates instead of stopping.)")


def resolve(config, caps: Capabilities) -> Numerics:
    """The Numerics of ``config`` on the device ``caps`` describes (a T4's too, on a laptop)."""
    fmt = FORMATS[config.precision]
    return Numerics(precision=config.precision, kind=caps.kind, dtype=fmt.dtype if fmt.low else None,
                    tf32=fmt.tf32_matmuls, scaler=config.scaling_on, init_scale=config.init_scale,
                    growth_interval=config.growth_interval, refusal=refusal(config.precision, caps), caps=caps)


def refusal(precision: str, caps: Capabilities) -> Optional[ConfigError]:
    """Why ``caps`` cannot run ``precision``, as the ConfigError a run raises -- or None."""
    if precision == "tf32" and caps.kind != "cuda":
        return ConfigError("precision", "tf32", f"tf32 is a CUDA tensor-core mode; on {caps.kind} use fp32, fp16 "
                           "or bf16")
    if precision in ("tf32", "bf16") and caps.kind == "cuda" and not (caps.tf32 if precision == "tf32" else caps.bf16):
        # the words are the GPU plan's where the catalogue knows the board (a T4: fp16 tensor cores, no bf16 units)
        return ConfigError("precision", precision, precision_refusal(caps.name, caps.compute_capability, precision))
    if not caps.supports(precision):
        return ConfigError("precision", precision, f"this PyTorch build has no {precision} on {caps.name} "
                           f"({caps.kind})")
    return None


def precision_note(caps: Capabilities, precision: str, factor: Optional[float] = None) -> Optional[str]:
    """What this CPU's hardware means for a precision, in words -- or None when nothing needs
    saying. "bf16 is faster" is a tensor-core (GPU) claim; on a CPU it depends on the matrix units
    its flags name, and on whether they are in use: ``factor`` (how many times slower than fp32 this
    precision's matmuls *measured*, ``device.slowdown``) wins over the flags (AMX can be off)."""
    if caps.kind != "cpu" or not FORMATS[precision].low:
        return None
    if factor is not None and factor >= 2:
        return (f"{precision} matmuls measured about {factor:.0f}x slower than fp32 on this CPU: no {precision} "
                "units are in use, so it is converted in software")
    if factor is not None and factor <= 0.8:
        return f"{precision} matmuls measured about {1 / factor:.1f}x faster than fp32 on this CPU (matrix units)"
    flags = set(caps.cpu_flags)
    if not flags:  # not an x86 Linux /proc/cpuinfo (ARM, macOS, ...): we cannot tell, so say nothing
        return None
    if precision == "bf16":
        if "amx_bf16" in flags:
            return "this CPU has AMX-BF16 matrix units: bf16 matmuls can run several times faster than fp32"
        if "avx512_bf16" in flags:
            return "this CPU has AVX512-BF16 (no AMX): expect a modest bf16 speed-up at best"
        return "this CPU has no bf16 units: bf16 is converted in software and usually runs slower than fp32"
    if "amx_fp16" in flags:
        return "this CPU has AMX-FP16 matrix units: fp16 matmuls can run faster than fp32"
    return ("this CPU has no AMX-FP16 units: fp16 autocast usually runs slower than fp32 here "
            "(fp16 is a GPU technique; compare the measured step times)")


# ---- the same, by name: for code that holds a precision string and no Config ----------------------

def autocast(kind: str, precision: str):
    """Autocast for ``precision`` on a device ``kind`` (a no-op for fp32 and tf32)."""
    fmt = FORMATS[precision]
    return torch.autocast(device_type=kind, dtype=fmt.dtype) if fmt.low else contextlib.nullcontext()


def matmul_precision(kind: str, precision: str):
    """TF32 for fp32 matmuls on CUDA when precision == 'tf32'; plain fp32 otherwise; restored after."""
    return tf32_matmuls(kind, FORMATS[precision].tf32_matmuls)


def grad_scaler(kind: str, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 2000):
    """Loss scaling multiplies the loss so tiny fp16 gradients do not underflow to zero. The scale
    starts at ``init_scale``, halves whenever the gradients hold inf/NaN (that update is skipped) and
    doubles after ``growth_interval`` clean updates in a row."""
    if not enabled:
        return None
    return torch.amp.GradScaler(kind, init_scale=init_scale, growth_interval=growth_interval)
