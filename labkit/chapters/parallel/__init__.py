"""Chapter 10's instruments (when the model does not fit), taught in chapter 10: FSDP2 in practice, tensor
parallelism on labkit's GPT, pipeline schedules and their bubble, choosing a DP x TP x PP layout.

    from labkit.chapters import parallel as par

One module per topic:

* ``formulas``  -- the bubble, a TP block's collectives, a layout's model-state bytes (pure arithmetic)
* ``schedules`` -- GPipe's and 1F1B's action lists per stage, micro-batches in flight, a replay (pure)
* ``pipeline``  -- the GPT split into stages on real processes: send/recv and torch.distributed.pipelining
* ``pipeline_notes`` -- the pipeline's timeline and bubble charts, and its sentences from measured values
"""
from __future__ import annotations

from .formulas import (BUBBLE_DEFINITIONS, QKV_LAYOUTS, bubble_fraction, layout_state_bytes, tp_allreduce_bytes,
                       tp_collectives_per_block)
from .pipeline import (GPTStage, SavedActivations, find_run, pipeline_demo, run_schedule, single_process,
                       torch_pipelining_step)
from .pipeline_notes import bubble_note, memory_note, plot_bubble, plot_pipeline, torch_pipelining_note
from .schedules import gpipe_schedule, in_flight, one_f_one_b_schedule, replay, schedule_for, stage_blocks

__all__ = ["BUBBLE_DEFINITIONS", "QKV_LAYOUTS", "bubble_fraction", "tp_collectives_per_block", "tp_allreduce_bytes",
           "layout_state_bytes",
           # pipeline parallelism
           "gpipe_schedule", "one_f_one_b_schedule", "schedule_for", "in_flight", "replay", "stage_blocks", "GPTStage",
           "run_schedule", "SavedActivations", "pipeline_demo", "find_run", "single_process", "torch_pipelining_step",
           "plot_pipeline", "plot_bubble", "bubble_note", "memory_note", "torch_pipelining_note"]
