"""Chapter 10's opening sentences (taught in chapter 10): the device and the process backend the chapter's
demos use, and the one baseline every split version is set against. Each returns ``lk.course.Note`` built
from measured values; each part's own sentences live beside its part (``fsdp2``, ``tensor``, ``pipeline``,
``layout``).

    display(par.chapter_note(env, size))
    display(par.baseline_note(base_run.summary, size))
"""
from __future__ import annotations

import os

import torch

from ...base.numfmt import counted
from ..course import Note, mode_words

MIB = 2**20


def load_average() -> float:
    """The machine's 1-minute load average (every runnable process, the demo's ranks included; 0 where the OS
    has none): what the demos report beside their times."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def backend(world_size: int) -> str:
    """"nccl" where this machine has a GPU per rank, else "gloo" (CPU processes) -- what the demos use."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"


def why_gloo(world_size: int) -> str:
    """Why the demos' ranks run on the CPU: 'there is no GPU here', or too few GPUs for one per rank."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"this machine has {counted(gpus, 'GPU')}, fewer than {world_size}" if gpus else "there is no GPU here"


def chapter_note(env: dict, size: dict) -> Note:
    """Where the chapter's processes run, and the mode."""
    ws = size["world_size"]
    if backend(ws) == "nccl":
        where = f"{ws} processes, one per GPU, talking over NCCL"
    else:
        why = why_gloo(ws)
        where = (f"{ws} CPU processes talking over gloo on the loopback interface "
                 f"({why}: the counts and the equivalence are the same as on GPUs; the times are a CPU's)")
    return Note(f"Model `{size['model']}`, micro-batch {size['micro_batch']}; every demo starts "
                f"{where}. {mode_words()}.")


def baseline_note(s: dict, size: dict) -> Note:
    """The unsplit model on one process: what it holds and how fast it steps."""
    states = s["param_bytes"] + s["grad_bytes"] + s["optimizer_bytes"]
    return Note(f"Baseline, one process: `{s['model']}` has {s['n_params']:,} parameters; its model state is "
                f"**{states / MIB:,.2f} MiB** (weights {s['param_bytes'] / MIB:,.2f} + gradients "
                f"{s['grad_bytes'] / MIB:,.2f} + AdamW's moments {s['optimizer_bytes'] / MIB:,.2f}, all fp32: "
                f"{states / s['n_params']:.0f} bytes per parameter); **{s['tokens_per_s']:,.0f} tokens/s** on "
                f"{s['device']}, final loss {s['final_loss']:.3f}. Everything below splits this one model.")
