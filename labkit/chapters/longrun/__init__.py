"""Chapter 11's instruments (a long run on a fixed number of GPUs), taught in chapter 11: what a checkpoint
must hold to resume exactly, distributed checkpoints, how often to save, surviving a failure, loss spikes.

    from labkit.chapters import longrun as lr

One module per topic, each reachable as ``lr.<module>`` (imported when first used).
"""
from __future__ import annotations

import importlib

_MODULES = ("state", "resumable", "exact", "notes_exact", "dcp", "notes_dcp", "interval", "restart", "spikes",
            "notes_failure", "notes")


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
