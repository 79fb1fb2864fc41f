"""Exercise checkers: ``lk.check.<name>(answer)`` says pass or fail with a hint, and never raises.

Checkers live in one module per part of the course; this package finds them by name. A placeholder answer
(None, ``...``, a function whose body is still ``...``) is "not attempted"; a function is called on all of its
cases before any right answer is worked out, and a wrong one gets the hint of the usual mistake it matches.
Results are kept per kernel (``export_csv``). Every part is imported here, at once, and then sealed (``_guard``),
before any learner code could reach a part that is not loaded yet.
"""
import importlib

from ._core import CheckResult, export_csv, history, reset_history, seal
# the measured exercises' saved file (graded from it while a grader runs the notebook): imported before the seal
from . import measurements
from .measurements import SAVED, grading_tool  # SAVED: "judge the entry saved in labkit-measurements.json"

# one module per part of the course, in chapter order: 00-01 and 03, 02, 04-05, 06, planning a run (09 and 11), the
# profiling exercises of 01 and 05, the kernels and memory chapters (07-08), when the model does not fit (10),
# composing the layout (12)
_PARTS = ("basics", "precision", "scaling", "ddp", "capstone", "profiling", "practice", "parallel", "compose")
_MODULES = tuple(importlib.import_module(f".{part}", __name__) for part in _PARTS)


def names() -> list:
    """Every checker's name, for instructors."""
    return [n for mod in _MODULES for n in getattr(mod, "__all__", [])]


def __getattr__(name):
    for mod in _MODULES:
        if name in getattr(mod, "__all__", ()):
            return getattr(mod, name)
    raise AttributeError(f"labkit.check has no checker {name!r}; available: {', '.join(names())}")


__all__ = ["CheckResult", "SAVED", "export_csv", "grading_tool", "history", "reset_history", "names"]
seal()
