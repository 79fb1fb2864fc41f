"""Chapter 11's room (a long run on a fixed number of GPUs): what a checkpoint must hold to resume exactly,
distributed checkpoints, how often to save, surviving a failure, loss spikes.

    from labkit.chapters import ch11_longrun as lr
    lr.exact.resume_demo("tiny")          # N updates straight against N/2 + save + a new process + N/2
    lr.spikes.young_daly(30.0, 86400.0)   # seconds of work between checkpoints

One module per topic, each reachable as ``lr.<module>`` (imported when first used: DCP and FSDP take seconds
to import, and only their section needs them): ``state`` (the checkpoint a learner writes, the loader's
position), ``exact`` (the bit-exact resume and its ablation), ``dcp`` and ``dcp_ranks`` (distributed
checkpoints on FSDP2 ranks), ``restart`` (a job that survives a SIGKILLed rank), ``spikes`` (a loss-spike
guard; how often to checkpoint). Each returns data and draws its charts; the sentences a learner reads are
the chapter's, chosen with ``lk.course.explain``.
"""
from __future__ import annotations

import importlib

_MODULES = ("state", "exact", "dcp", "dcp_ranks", "restart", "spikes")


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_MODULES))
