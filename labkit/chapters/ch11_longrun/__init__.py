"""Chapter 11's room (a long run on a fixed number of GPUs): what a checkpoint must hold to resume exactly,
distributed checkpoints, how often to save, surviving a failure, loss spikes.

    from labkit.chapters import ch11_longrun as lr
    lr.exact.resume_demo("tiny")          # N updates straight against N/2 + save + a new process + N/2
    lr.spikes.young_daly(30.0, 86400.0)   # seconds of work between checkpoints

One module per topic, each reachable as ``lr.<module>`` (imported when first used: DCP and FSDP take seconds
to import, and only their section needs them):

* ``state``      -- the checkpoint a learner writes at work: the six items (``ITEMS``), every generator, an
  atomic save, a load that turns a damaged or foreign file into one line (``CheckpointError``); the loader's
  position (a sampler with its own generator, counted where the loop takes a batch); the exercise's logs
* ``exact``      -- the bit-exact resume on fresh processes, and the ablation (one item left out at a time)
* ``dcp``        -- torch.distributed.checkpoint as a learner writes it (save, load with resharding,
  async_save) and the demo on FSDP2 ranks (round trip, 2 -> 1 and 1 -> 2, bytes and seconds, the critical
  path); ``dcp_ranks`` what its ranks run
* ``restart``    -- a job that survives a SIGKILLed rank: the restart loop (what torchrun --max-restarts does),
  the redone work measured
* ``spikes``     -- a loss-spike guard (skip or roll back) and the demo of two injected causes; how often
  to checkpoint: Young/Daly, Daly's refinement, the expected overhead, a cluster's MTBF

Each module returns data -- rows, figures, a verdict's name -- and draws its charts; the sentences a learner
reads are written in the chapter, which chooses among them with ``lk.course.explain``.
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
