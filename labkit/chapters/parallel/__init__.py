"""Chapter 10's instruments (when the model does not fit), taught in chapter 10: FSDP2 in practice, tensor
parallelism on labkit's GPT, pipeline schedules and their bubble, choosing a DP x TP x PP layout.

    from labkit.chapters import parallel as par

One module per topic:

* ``formulas``  -- the bubble, a TP block's collectives, a layout's model-state bytes (pure arithmetic)
* ``fsdp2``     -- FSDP2 in practice on real processes: memory per rank against world size, reshard_after_forward,
  mixed precision, clipping with sharded norms, accumulation with set_requires_gradient_sync, counted
* ``notes_fsdp`` -- its sentences and charts, from the measured values
"""
from __future__ import annotations

from .formulas import (BUBBLE_DEFINITIONS, QKV_LAYOUTS, bubble_fraction, layout_state_bytes, tp_allreduce_bytes,
                       tp_collectives_per_block)
from .fsdp2 import CollectiveCounter, expected_calls, fsdp2_shard, fsdp2_train_step, fsdp_lab
from .notes_fsdp import (fsdp_accum_note, fsdp_calls_chart, fsdp_clip_note, fsdp_memory_chart, fsdp_memory_note,
                         fsdp_memory_table, fsdp_precision_note, fsdp_reshard_note)

__all__ = ["BUBBLE_DEFINITIONS", "QKV_LAYOUTS", "bubble_fraction", "tp_collectives_per_block", "tp_allreduce_bytes",
           "layout_state_bytes",
           # fsdp2, notes_fsdp
           "fsdp_lab", "fsdp2_shard", "fsdp2_train_step", "expected_calls", "CollectiveCounter", "fsdp_memory_table",
           "fsdp_memory_note", "fsdp_reshard_note", "fsdp_precision_note", "fsdp_clip_note", "fsdp_accum_note",
           "fsdp_memory_chart", "fsdp_calls_chart"]
