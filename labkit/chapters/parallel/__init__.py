"""Chapter 10's instruments (when the model does not fit), taught in chapter 10: FSDP2 in practice, tensor
parallelism on labkit's GPT, pipeline schedules and their bubble, choosing a DP x TP x PP layout.

    from labkit.chapters import parallel as par

One module per topic:

* ``formulas``  -- the bubble, a TP block's collectives, a layout's model-state bytes (pure arithmetic)
* ``megatron``  -- the Megatron-style split of a block: the per-head qkv permutation, f and g, ``TPBlock``,
  and the same with torch.distributed.tensor.parallel (``dtensor_block``)
* ``tensor``    -- tensor parallelism on labkit's GPT: the per-head qkv permutation, the plain-PyTorch TPBlock
  (f and g as autograd Functions), the same with torch.distributed.tensor.parallel, the demo on real
  processes (collectives counted, equivalence measured) and the predicted link table
* ``tp_ranks``  -- what each rank of the TP demo runs (the split, the counted step, the gradient check)
* ``tp_notes``  -- the TP demo's sentences and chart, from its measured values
"""
from __future__ import annotations

from .formulas import (BUBBLE_DEFINITIONS, QKV_LAYOUTS, bubble_fraction, layout_state_bytes, tp_allreduce_bytes,
                       tp_collectives_per_block)
from .tensor import (GPT3_175B, TP_STYLES, CopyToTP, LocalAttention, ReduceFromTP, TPBlock, TPBlockSeparateQKV,
                     dtensor_block, permute_qkv_per_head, plot_tp_demo, tp_demo, tp_demo_note, tp_link_table)

__all__ = ["BUBBLE_DEFINITIONS", "QKV_LAYOUTS", "bubble_fraction", "tp_collectives_per_block", "tp_allreduce_bytes",
           "layout_state_bytes", "permute_qkv_per_head", "CopyToTP", "ReduceFromTP", "TPBlock",
           "TPBlockSeparateQKV", "LocalAttention", "dtensor_block", "tp_demo", "tp_demo_note", "plot_tp_demo",
           "tp_link_table", "TP_STYLES", "GPT3_175B"]
