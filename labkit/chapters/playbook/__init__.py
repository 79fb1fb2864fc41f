"""Chapter 09's instruments (the playbook), taught in chapter 09: a measured grid search and its Pareto front,
convergence on a token budget and the critical batch size, the memory arithmetic of what to do when a model
still does not fit (ZeRO stages, offload, 8-bit Adam), and a small FSDP demo.

    from labkit.chapters import playbook as pb          # or lk.playbook
    rows = pb.grid_search(dict(model="small", steps=3), pb.grid(precision=("fp32", "bf16"),
                          micro_batch=(2, 4, 8), checkpointing=("none", "full"), effective_batch=8))
    front = pb.pareto_front(rows)
    best = pb.best_within(rows, budget_bytes=80 * 2**20)

One module per topic; every name the chapter, its checker and the tests use is here:

* ``zero``           -- bytes per GPU under ZeRO 0-3 and offload, the remedies in order, their chart
* ``grid``           -- grid points, the grid search (through ``tools.sweep``), one row per point
* ``pareto``         -- the front, the best point within a budget, scatter, the search's verdict, table, chart
* ``convergence``    -- tokens seen, final loss, loss and learning-rate charts
* ``critical_batch`` -- McCandlish et al.'s B_crit from a batch x learning-rate sweep, its interval and verdict
* ``fsdp``           -- FSDP on a few CPU processes against one process on the whole batch
* ``predicted``      -- the what-if section: toggles predicted on catalogue GPUs: table rows, launch-bound figures
* ``args``           -- the argument checks every public function starts with

The arithmetic functions are pure (no torch, no device) and unit-tested. Every measurement goes through
``labkit.run`` like everything else in the course.
"""
from __future__ import annotations

from .convergence import convergence_rows, final_loss, loss_chart, lr_chart, tokens_seen
from .critical_batch import (batch_rows, critical_batch_chart, critical_batch_estimate, critical_batch_fit,
                             critical_batch_rows, fit_verdict, grows_as_loss_falls, interval_shape, loss_targets,
                             monotone_fit, run_noise, steps_to_target)
from .fsdp import fsdp_demo, fsdp_rows, loss_rows, shard, single_process_losses
from .grid import (KNOB_KEYS, config_of, grid, grid_search, label, memory_of, reference_rows, row_from_summary,
                   saved_pick)
from .predicted import faster, launch_bound, predicted_ms, predicted_table
from .pareto import (best_within, fixed_digits, measured, pareto_chart, pareto_front, run_scatter,
                     table_rows, within_scatter)
from .zero import (GB, GRAD_BYTES, OPTIMIZER_BYTES, REMEDIES, WEIGHT_BYTES, activation_bytes_estimate,
                   remedies, remedies_rows, remedy_chart, smallest_fix, state_bytes_per_gpu, zero_bytes_per_gpu)

__all__ = [
    "GB", "WEIGHT_BYTES", "GRAD_BYTES", "OPTIMIZER_BYTES", "REMEDIES", "state_bytes_per_gpu",
    "zero_bytes_per_gpu", "activation_bytes_estimate", "remedies", "remedies_rows", "smallest_fix", "remedy_chart",
    "KNOB_KEYS", "grid", "grid_search", "memory_of", "label", "row_from_summary", "config_of", "reference_rows",
    "saved_pick",
    "measured", "pareto_front", "best_within", "run_scatter", "within_scatter", "table_rows",
    "fixed_digits", "pareto_chart",
    "tokens_seen", "final_loss", "convergence_rows", "loss_chart", "lr_chart",
    "monotone_fit", "steps_to_target", "critical_batch_fit", "loss_targets", "run_noise", "critical_batch_estimate",
    "fit_verdict", "interval_shape", "grows_as_loss_falls", "batch_rows", "critical_batch_rows",
    "critical_batch_chart",
    "single_process_losses", "fsdp_demo", "fsdp_rows", "loss_rows", "shard",
    "predicted_ms", "predicted_table", "faster", "launch_bound",
]
