"""Where chapter 10's demos run their ranks (taught in chapter 10): NCCL with a GPU per rank, else gloo on the
CPU, and the machine's load beside the times they report.

    par.backend(2)        # "nccl" with two GPUs here, else "gloo"
    par.gpu_count()       # the GPUs this machine has (0 without CUDA): why the ranks may run on the CPU
"""
from __future__ import annotations

import os

import torch


def load_average() -> float:
    """The machine's 1-minute load average (every runnable process, the demo's ranks included; 0 where the OS
    has none): what the demos report beside their times."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def backend(world_size: int) -> str:
    """"nccl" where this machine has a GPU per rank, else "gloo" (CPU processes) -- what the demos use."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"


def gpu_count() -> int:
    """The GPUs this machine has (0 where CUDA is not available): fewer than the ranks, and they run on the CPU."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
