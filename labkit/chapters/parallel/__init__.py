"""Chapter 10's instruments (when the model does not fit), taught in chapter 10: FSDP2 in practice, tensor
parallelism on labkit's GPT, pipeline schedules and their bubble, choosing a DP x TP x PP layout.

    from labkit.chapters import parallel as par
    par.bubble_fraction(4, 8)                      # 3/11: the idle share of a pipeline step
    par.layout.layouts("llama2-70b", "h100-sxm", 64)   # every layout of 64 GPUs, predicted

One module per topic (each reachable as ``par.<module>``):

* ``formulas``  -- the bubble, a TP block's collectives, a layout's model-state bytes (pure arithmetic)
* ``processes`` -- where the demos' ranks run (NCCL with a GPU per rank, else gloo) and the machine's load
* ``megatron``  -- the Megatron-style split of a block: the per-head qkv permutation, f and g, ``TPBlock``,
  and the same with torch.distributed.tensor.parallel (``dtensor_block``)
* ``fsdp2``     -- FSDP2 in practice on real processes: bytes per rank against world size, reshard_after_forward,
  the bf16 policy, clipping over shards, accumulation without a sync per micro-batch, collectives counted;
  ``fsdp_rows`` its figures as rows and verdict keys (``memory_rows``, ``calls_verdict``, ...);
  ``fsdp_counting`` the counter of FSDP2's collectives (whichever torch.distributed functions this torch's
  FSDP2 calls), the calls the unit structure predicts, ring bytes
* ``tensor``    -- the TP demo on real processes (collectives counted, equivalence measured), the predicted
  link rows, the demo's rows and verdict keys; ``tp_ranks`` what each of its ranks runs
* ``shapes``    -- well-known model shapes, parameters from the shape, FLOPs per token
* ``schedules`` -- GPipe's and 1F1B's action lists per stage, micro-batches in flight, a replay (pure)
* ``pipeline``  -- the GPT split into stages on real processes: send/recv and torch.distributed.pipelining;
  ``pipeline_rows`` the bubble's rows, the timing verdict, the stages' costs, the saved activations per stage
* ``charts``    -- the chapter's charts, each from a demo's result (FSDP2 bytes and calls, TP calls, pipeline
  timeline and bubble)
* ``layout``    -- every DP x TP x PP (x ZeRO) layout of n GPUs, its bytes, fit and predicted step; the choice,
  the widget, published layouts against the tool (``published_rows``)
* ``layout_model`` -- one layout's bytes per GPU and predicted step (what is charged, what is assumed)
* ``fp8``       -- FP8 training, predicted: what changes, the step at the FP8 peak, MFU against both peaks
* ``context``   -- context parallelism's ring-attention arithmetic (bytes per step against compute, memory)
"""
from __future__ import annotations

from . import context, fp8, fsdp2, fsdp_rows, layout, pipeline, pipeline_rows, shapes, tensor  # noqa: F401
from .formulas import (BUBBLE_DEFINITIONS, QKV_LAYOUTS, bubble_fraction, layout_state_bytes, tp_allreduce_bytes,
                       tp_collectives_per_block)
from .fsdp2 import fsdp2_shard, fsdp2_train_step, fsdp_lab
from .fsdp_counting import CollectiveCounter, counter_problem, expected_calls, ring_bytes_per_rank
from .pipeline import (GPTStage, SavedActivations, find_run, p2p_latency, ping_pong, pipeline_demo, run_schedule,
                       single_process, torch_pipelining_step)
from .pipeline_rows import (bubble_rows, bubble_to_grade, stage_costs, step_ratio, timing,  # (par.pipeline_rows)
                            torch_pipelining_rows)
from .charts import fsdp_calls_chart, fsdp_memory_chart, plot_bubble, plot_pipeline, plot_tp_demo
from .schedules import gpipe_schedule, in_flight, one_f_one_b_schedule, replay, schedule_for, stage_blocks
from .layout import (MODELS, best_layout, choice, choose, layout_widget, layouts,
                     published_check, published_layouts, published_rows)
from .processes import backend, gpu_count
from .tensor import (GPT3_175B, TP_STYLES, CopyToTP, LocalAttention, ReduceFromTP, TPBlock, TPBlockSeparateQKV,
                     dtensor_block, permute_qkv_per_head, tp_demo, tp_link_rows, tp_rows)

__all__ = [
    "BUBBLE_DEFINITIONS", "QKV_LAYOUTS", "bubble_fraction", "tp_collectives_per_block", "tp_allreduce_bytes",
    "layout_state_bytes",
    "backend", "gpu_count",
    "gpipe_schedule", "one_f_one_b_schedule", "schedule_for", "in_flight", "replay", "stage_blocks", "GPTStage",
    "run_schedule", "SavedActivations", "pipeline_demo", "find_run", "single_process", "torch_pipelining_step",
    "plot_pipeline", "plot_bubble", "bubble_rows", "timing", "torch_pipelining_rows",
    "ping_pong", "p2p_latency", "bubble_to_grade", "stage_costs", "step_ratio",
    "MODELS", "layouts", "best_layout", "choose", "choice", "layout_widget",
    "published_layouts", "published_check", "published_rows",
    "permute_qkv_per_head", "CopyToTP", "ReduceFromTP", "TPBlock", "TPBlockSeparateQKV", "LocalAttention",
    "fsdp_lab", "fsdp2_shard", "fsdp2_train_step", "expected_calls", "CollectiveCounter", "counter_problem",
    "ring_bytes_per_rank", "fsdp_memory_chart", "fsdp_calls_chart",
    "dtensor_block", "tp_demo", "tp_rows", "plot_tp_demo", "tp_link_rows", "TP_STYLES", "GPT3_175B",
]
