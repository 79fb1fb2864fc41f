"""labkit: measure how mixed precision, gradient accumulation, activation checkpointing, data
loading and DDP change memory, speed and MFU -- live, on your own hardware.

    import labkit as lk
    result = lk.run(lk.Config(model="tiny", precision="bf16", accum=4))
    lk.predict(result.config, device="h100-sxm")   # the same step on an H100: predicted, never measured

Nothing heavy happens at import time; the widget panel (``lk.Lab``) loads only when asked for.

The folders are the layers, leaves first; a module imports only from its own folder or those above it
in this list (``tests/test_layers.py`` checks it):

    base/      errors, the one-run slot, files written atomically, progress, number format, records
    engine/    one training run: config, device, numerics, model, data, tracer, measurements, DDP, train
    tools/     what runs the engine many times: honest comparisons, timing loops, sweeps, charts
    whatif/    the roofline model: the same step on another device, predicted
    chapters/  each chapter's instruments, named by topic (``lk.course`` is the notebooks' glue)
    panel/     the ``lk.Lab`` widget panel
    check/     the exercise checkers, ``lk.check.<name>(answer)``
    drills/    interview drills: planted mistakes, healthy twins, and the evidence that tells them apart
    content/   the interview question bank and its self-quiz
    instructor/ the grading builds, the grade command and the generators (a learner never loads it)
"""
import importlib

import torch

from .tools.compare import Comparison, compare_configs
from .engine.config import PRESETS, Config
from .engine.device import capabilities, env_report
from .base import compat, phrases, release  # lk.compat: the torch installed, the guards for newer APIs
from .base.runtime import ConfigError, NonFiniteError, OutOfMemory, RunError, Stopped
from .whatif import Prediction, predict  # the function: lk.predict(config, device=...); the rest is lk.whatif
from .engine.train import Result, run

__all__ = ["Config", "ConfigError", "PRESETS", "Result", "RunError", "OutOfMemory", "NonFiniteError", "Stopped", "run", "env", "Lab",
           "compare_configs", "Comparison", "predict", "Prediction", "hello"]
__version__ = release.VERSION


WORDS = phrases.load_section("lab_messages.md", "Hello", {"line": ("version", "torch", "kind", "name", "reason")})


def hello() -> None:
    """One line for the top of a chapter: labkit's and torch's versions, and the device it will run on
    and why (a GPU this PyTorch cannot drive is said here, in one line, with what to do)."""
    caps = capabilities("auto")
    print(WORDS.say("line", version=__version__, torch=torch.__version__, kind=caps.kind, name=caps.name,
                    reason=caps.reason))


def env(device: str = "auto", measure: bool = True, remeasure: bool = False) -> dict:
    """A report of this machine: device, capabilities, memory, peak FLOP/s per dtype and source, and
    the formats whose matmul peak measured at least 1.2x fp32's (``fast_formats``: a short matmul probe, not a
    training step). At most 3 s the first time, then cached."""
    return env_report(device, measure, remeasure)


# The notebooks' short names: ``lk.course`` for ``labkit.chapters.course``, ... (one entry a name; a chapter's
# room is imported by its notebook, never through a short name).
SHORT = {"course": "chapters.course", "check": "check", "plots": "tools.plots", "reference": "tools.reference",
         "quiz": "content.quiz", "drills": "drills", "engine": "engine", "whatif": "whatif", "compat": "base.compat"}


def __getattr__(name):
    if name == "Lab":
        from .panel.lab import Lab  # deferred: ipywidgets is optional; the CLI runs without it

        return Lab
    if name in SHORT or name in ("base", "tools", "chapters", "panel", "content"):
        return importlib.import_module(f".{SHORT.get(name, name)}", __name__)
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
