"""Mixed precision the PyTorch way: autocast for the forward pass, GradScaler for fp16, TF32 switch."""
from __future__ import annotations

import contextlib

import torch

from .device import autocast_dtype


def autocast(kind: str, precision: str):
    """Run matmuls in fp16/bf16 while autocast keeps precision-sensitive ops (losses, ...) in fp32."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=kind, dtype=dtype)


def grad_scaler(kind: str, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 2000):
    """Loss scaling multiplies the loss so tiny fp16 gradients do not underflow to zero. The scale
    starts at ``init_scale``, halves whenever the gradients hold inf/NaN (that update is skipped) and
    doubles after ``growth_interval`` clean updates in a row."""
    if not enabled:
        return None
    return torch.amp.GradScaler(kind, init_scale=init_scale, growth_interval=growth_interval)


@contextlib.contextmanager
def matmul_precision(kind: str, precision: str):
    """TF32 for fp32 matmuls on CUDA when precision == 'tf32'; plain fp32 otherwise; restored after.

    torch >= 2.9 has the ``fp32_precision`` API; in 2.13 reading the old ``allow_tf32`` flag after
    setting ``fp32_precision`` raises, so only the new API is touched where it exists.
    """
    if kind != "cuda":
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    want_tf32 = precision == "tf32"
    if hasattr(matmul, "fp32_precision"):
        saved = (matmul.fp32_precision, cudnn.conv.fp32_precision)
        matmul.fp32_precision = "tf32" if want_tf32 else "ieee"
        cudnn.conv.fp32_precision = "tf32" if want_tf32 else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision, cudnn.conv.fp32_precision = saved
    else:  # older torch
        saved = (matmul.allow_tf32, cudnn.allow_tf32)
        matmul.allow_tf32 = cudnn.allow_tf32 = want_tf32
        try:
            yield
        finally:
            matmul.allow_tf32, cudnn.allow_tf32 = saved
