"""Chapter 10's room (when the model does not fit): FSDP2 in practice, tensor parallelism on labkit's GPT,
pipeline schedules and their bubble, choosing a DP x TP x PP layout, FP8 and context parallelism predicted.

    from labkit.chapters import ch10_parallel as par
    par.bubble_fraction(4, 8)                      # 3/11: the idle share of a pipeline step
    par.layouts("llama2-70b", "h100-sxm", 64)      # every layout of 64 GPUs, predicted

* ``formulas`` -- the arithmetic: the bubble, a TP block's and FSDP2's collectives, a layout's model-state
  bytes, the GPipe and 1F1B action lists and their replay, well-known model shapes; predicted: TP over each
  link, a GPU's figures, context parallelism's ring attention
* ``ranks``    -- what the demos read on their ranks: an FSDP2 rank's bytes, a pipeline's clock, message
  time and saved activations
* ``fsdp``     -- FSDP2 on real processes: bytes per rank, resharding, bf16, clipping, accumulation; its rows
* ``tensor``   -- the Megatron-style split (qkv per head, f and g, ``TPBlock``, the DTensor plan), its demo
* ``pipeline`` -- the GPT in stages on real processes: send/recv and torch.distributed.pipelining; its rows
* ``layout``   -- every DP x TP x PP (x ZeRO) layout, its bytes, fit and predicted step; published layouts;
  FP8's step and MFU
"""
from __future__ import annotations

from .formulas import (BUBBLE_DEFINITIONS, GPT3_175B, MODELS, QKV_LAYOUTS, bubble_fraction, context_rows,
                       context_summary, gpipe_schedule, hide_threshold_tokens, in_flight, layout_state_bytes,
                       one_f_one_b_schedule, replay, ring_bytes_per_rank, schedule_for, stage_blocks,
                       tp_allreduce_bytes, tp_collectives_per_block, tp_link_rows)
from ...tools.collectives import CollectiveCounter, backend, gpu_count  # the chapter reads them as par.*
from .fsdp import (accum_rows, calls_verdict, clip_figures, counter_problem, expected_calls, fsdp2_shard,
                   fsdp2_train_step, fsdp_calls_chart, fsdp_lab, fsdp_memory_chart, memory_verdict, precision_rows,
                   reshard_rows)
from .tensor import (TP_STYLES, CopyToTP, LocalAttention, ReduceFromTP, TPBlock, TPBlockSeparateQKV, all_reduce,
                     counts_verdict, dtensor_block, permute_qkv_per_head, plot_tp_demo, timing_verdict, tp_demo,
                     tp_rows, unchanged_attention_outcome)
from .pipeline import (GPTStage, SavedActivations, bubble_rows, bubble_to_grade, find_run, pipeline_demo,
                       plot_bubble, plot_pipeline, run_schedule, single_process, stage_costs, step_ratio, timing,
                       torch_pipelining_rows, torch_pipelining_step)
from .layout import (EXAMPLE_SCENARIO, PART_NAMES, PARTS, best_layout, choice, fp8_compare, fp8_here,
                     fp8_published_check, fp8_rows, layout_widget, layouts, published_check, published_layouts,
                     published_rows)
