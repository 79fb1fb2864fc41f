"""Chapter 09's room (the playbook): a measured grid search and its Pareto front, convergence on a token
budget and the critical batch size, the memory arithmetic of what to do when a model still does not fit
(ZeRO stages, offload, 8-bit Adam), and a small FSDP demo.

    from labkit.chapters import ch09_playbook as pb
    rows = pb.grid_search(dict(model="small", steps=3), pb.grid(precision=("fp32", "bf16"),
                          micro_batch=(2, 4, 8), checkpointing=("none", "full"), effective_batch=8))
    front = pb.pareto_front(rows)
    best = pb.best_within(rows, budget_bytes=80 * 2**20)

* ``search``  -- grid points, the grid search (through ``tools.sweep``), the front, the best point within a
  budget, scatter, table and chart; the toggles predicted on catalogue GPUs
* ``batch``   -- tokens seen, final loss, loss and learning-rate charts; B_crit from a batch x learning-rate
  sweep, its interval and verdict
* ``memory``  -- bytes per GPU under ZeRO 0-3 and offload (``whatif.layouts``), the remedies in order, their
  chart; FSDP on a few CPU processes against one process on the whole batch

The arithmetic functions are pure (no torch, no device) and unit-tested. Every measurement goes through
``labkit.run`` like everything else in the course.
"""
from __future__ import annotations

from ...engine.ddp import shard
from ...whatif.layouts import (GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, activation_bytes_estimate,
                               state_bytes_per_gpu)
from .batch import (batch_rows, convergence_rows, critical_batch_chart, critical_batch_estimate,
                    critical_batch_fit, critical_batch_rows, final_loss, fit_verdict, grows_as_loss_falls,
                    interval_shape, loss_chart, loss_targets, lr_chart, monotone_fit, run_noise, steps_to_target,
                    tokens_seen)
from .memory import (GB, REMEDIES, fsdp_demo, fsdp_rows, loss_rows, remedies, remedies_rows, remedy_chart,
                     single_process_losses, smallest_fix, zero_bytes_per_gpu)
from .search import (KNOB_KEYS, best_within, config_of, faster, fixed_digits, grid, grid_search, label,
                     launch_bound, measured, memory_of, pareto_chart, pareto_front, predicted_ms, predicted_table,
                     reference_rows, row_from_summary, run_scatter, saved_pick, table_rows, within_scatter)
