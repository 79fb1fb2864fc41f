"""Which torch this is (``TORCH``: (major, minor)), and the newer torch APIs the course uses: one guard
per feature (``has``, ``need``), so an older torch gives a one-line message (the feature, the torch it
needs, the torch installed, what to do) instead of an AttributeError or ImportError deep inside a run.
"""
from __future__ import annotations

import pkgutil
import re

import torch

from .runtime import TorchTooOld

# the oldest torch the whole suite has passed on (CPU; requirements.txt lists the runs); requirements.txt and
# pyproject.toml say torch>=TORCH_FLOOR (tests/test_compat.py keeps the three in step)
TORCH_FLOOR = "2.9"

# feature -> (what the learner reads, the oldest torch that has it, the dotted names that must resolve)
FEATURES = {
    "fp32_precision": ("the TF32 switch torch.backends.cuda.matmul.fp32_precision", (2, 9),
                       ("torch.backends.cuda.matmul.fp32_precision",)),
    "fully_shard": ("FSDP2's torch.distributed.fsdp.fully_shard", (2, 6),
                    ("torch.distributed.fsdp.fully_shard", "torch.distributed.fsdp.MixedPrecisionPolicy")),
    "selective checkpointing": ("selective activation checkpointing "
                                "(torch.utils.checkpoint.create_selective_checkpoint_contexts)", (2, 4),
                                ("torch.utils.checkpoint.create_selective_checkpoint_contexts",
                                 "torch.utils.checkpoint.CheckpointPolicy")),
    "sdpa_kernel": ("torch.nn.attention.sdpa_kernel (choosing an attention backend)", (2, 3),
                    ("torch.nn.attention.sdpa_kernel", "torch.nn.attention.SDPBackend")),
    "GradScaler": ("torch.amp.GradScaler(device) (loss scaling on any device, the CPU too)", (2, 3),
                   ("torch.amp.GradScaler",)),
    # torch 2.9.1's schedules aborted both gloo ranks on a message-size mismatch ("8 vs 4") in a two-stage
    # Linear; 2.10.0, 2.11.0, 2.13.0 and 2.14.1 ran it (2026-12-06, CPU)
    "pipelining on gloo": ("torch.distributed.pipelining's schedules over gloo (on 2.9 they abort the process)",
                           (2, 10), ("torch.distributed.pipelining.PipelineStage",
                                     "torch.distributed.pipelining.ScheduleGPipe")),
}


# Features newer than the floor: the part of a chapter that uses one is skipped below it, saying why (the rest of
# the course still runs on the floor).
ABOVE_FLOOR = ("pipelining on gloo",)


def parse(version: str) -> tuple:
    """(major, minor) of a version string: '2.13.0+cpu' -> (2, 13), '2.10.0a0+git1234' -> (2, 10)."""
    m = re.match(r"\s*(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(m.group(1)), int(m.group(2))


TORCH = parse(torch.__version__)
INSTALLED = torch.__version__  # what the messages name; tests set both to pretend an older torch


def _found(feature: str):
    """The feature's first API object, or None when this torch is too old or lacks one of its names."""
    _, since, names = FEATURES[feature]
    if TORCH < since:
        return None
    try:
        objs = [pkgutil.resolve_name(n) for n in names]  # 'torch.amp.GradScaler' -> the class
    except (AttributeError, ImportError):
        return None
    return objs[0]


def has(feature: str) -> bool:
    """Whether ``feature`` (a key of FEATURES) is usable with this torch."""
    return _found(feature) is not None


def message(feature: str) -> str:
    """One line: which feature, the torch it needs, the torch installed, and what to do."""
    what, since, _ = FEATURES[feature]
    want = max(since, parse(TORCH_FLOOR))
    return (f"{what} needs torch >= {since[0]}.{since[1]} and is not in this torch ({INSTALLED}). "
            f"Run pip install -U 'torch>={want[0]}.{want[1]}' and restart the kernel; in Colab or Kaggle keep the "
            "platform's torch (replacing it can break its CUDA libraries) and skip this part.")


def need(feature: str):
    """The feature's API object (e.g. the function fully_shard); TorchTooOld with message(feature) if missing."""
    obj = _found(feature)
    if obj is None:
        raise TorchTooOld(message(feature))
    return obj
