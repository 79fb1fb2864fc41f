"""Chapter 10's instruments (when the model does not fit), taught in chapter 10: FSDP2 in practice, tensor
parallelism on labkit's GPT, pipeline schedules and their bubble, choosing a DP x TP x PP layout.

    from labkit.chapters import parallel as par

One module per topic:

* ``formulas``  -- the bubble, a TP block's collectives, a layout's model-state bytes (pure arithmetic)
* ``notes``     -- the chapter's opening sentences: where its processes run, the one baseline
"""
from __future__ import annotations

from .formulas import (BUBBLE_DEFINITIONS, QKV_LAYOUTS, bubble_fraction, layout_state_bytes, tp_allreduce_bytes,
                       tp_collectives_per_block)
from .notes import backend, baseline_note, chapter_note

__all__ = ["BUBBLE_DEFINITIONS", "QKV_LAYOUTS", "bubble_fraction", "tp_collectives_per_block", "tp_allreduce_bytes",
           "layout_state_bytes", "backend", "chapter_note", "baseline_note"]
