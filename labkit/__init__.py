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
"""
import importlib
import importlib.abc
import importlib.util
import sys

import torch

from .tools.compare import Comparison, compare_configs
from .engine.config import PRESETS, Config
from .engine.device import capabilities, env_report
from .base import compat  # lk.compat: the torch installed and the guards for newer torch APIs
from .base import release
from .base.errors import ConfigError, NonFiniteError, OutOfMemory, RunError, Stopped
from .whatif import Prediction, predict  # the function: lk.predict(config, device=...); the rest is lk.whatif
from .engine.train import Result, run

__all__ = ["Config", "ConfigError", "PRESETS", "Result", "RunError", "OutOfMemory", "NonFiniteError", "Stopped", "run", "env", "Lab",
           "compare_configs", "Comparison", "predict", "Prediction", "hello"]
__version__ = release.VERSION


def hello() -> None:
    """One line for the top of a chapter: labkit's and torch's versions, and the device it will run on
    and why (a GPU this PyTorch cannot drive is said here, in one line, with what to do)."""
    caps = capabilities("auto")
    print(f"labkit {__version__} · torch {torch.__version__} · device: {caps.kind} ({caps.name}) · {caps.reason}")


def env(device: str = "auto", measure: bool = True, remeasure: bool = False) -> dict:
    """A report of this machine: device, capabilities, memory, peak FLOP/s per dtype and source, and
    the formats whose matmul peak measured at least 1.2x fp32's (``fast_formats``: a short matmul probe, not a
    training step). At most 3 s the first time, then cached."""
    return env_report(device, measure, remeasure)


# Where the flat modules of labkit <= 0.1 live now: ``import labkit.kernels`` and ``from labkit import
# memlab`` in a notebook saved before the folders keep working, and are the same module objects as the
# new names (so a monkeypatch through either name patches the one module).
MOVED = {
    "errors": "base.errors", "runtime": "base.runtime", "paths": "base.paths", "progress": "base.progress",
    "numfmt": "base.numfmt", "schema": "base.schema",
    "config": "engine.config", "device": "engine.device", "precision": "engine.precision", "rules": "engine.rules",
    "model": "engine.model", "checkpointing": "engine.checkpointing", "data": "engine.data",
    "tracer": "engine.tracer", "measure": "engine.measure", "ddp": "engine.ddp", "train": "engine.train",
    "compare": "tools.compare", "plots": "tools.plots", "reference": "tools.reference",
    "course": "chapters.course", "diagnose": "chapters.profiling", "memtrace": "chapters.memtrace",
    "loaderlab": "chapters.loaderlab", "ddplab": "chapters.ddplab", "netmodel": "chapters.netmodel",
    "kernels": "chapters.kernels", "memlab": "chapters.memlab", "playbook": "chapters.playbook",
    "widgets": "panel.lab", "questions": "content.questions", "quiz": "content.quiz",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``labkit.<old name>`` as the module it moved to (see MOVED)."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, old = fullname.partition(".")
        if head == __name__ and old in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{MOVED[spec.name.partition('.')[2]]}")
        spec.loader_state = module.__spec__  # the import system is about to give the module the old name's spec
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())


def __getattr__(name):
    if name == "Lab":
        from .panel.lab import Lab  # deferred: ipywidgets is optional; the CLI runs without it

        return Lab
    if name in ("plots", "check", "reference", "course", "quiz", "playbook", "drills"):  # the notebooks' short names
        return importlib.import_module(f".{MOVED.get(name, name)}", __name__)
    if name in MOVED or name in ("base", "engine", "tools", "whatif", "chapters", "panel", "drills", "content"):
        return importlib.import_module(f".{MOVED.get(name, name)}", __name__)
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
