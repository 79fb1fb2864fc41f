"""Reference solutions for the exercises of chapters 04-05 -- for instructors, not for learners.

Each function is what a learner would write in the notebook cell tagged ``exercise-NN-name``; the
tests in tests/test_check_scaling.py pass these to the checkers in labkit/check/scaling.py.
"""
from __future__ import annotations

from torch.utils.checkpoint import checkpoint


# ---- 04 activation checkpointing ------------------------------------------------------------------

# exercise-04-wrap-blocks: lk.check.checkpoint_blocks(run_block)
def run_block(block, x):
    """Keep only the block's input for backward; recompute everything inside it during backward."""
    return checkpoint(block, x, use_reentrant=False)


# exercise-04-budget-pick: lk.check.checkpoint_budget(pick_option(options, budget), options, budget)
def pick_option(options, budget_bytes):
    """Of the options whose activations fit the budget, the one that recomputes least (fewest hardware
    FLOPs); between equals, the one that keeps more (it recomputes less of the cheap ops)."""
    fits = [o for o in options if o["activation_bytes"] <= budget_bytes]
    if not fits:
        return None
    return min(fits, key=lambda o: (o["hardware_flops"], -o["activation_bytes"]))["name"]


# exercise-04-predict-overhead: lk.check.checkpoint_overhead(my_overhead, cfg)
def predicted_overhead(n_layer, d_model, seq_len, vocab=256):
    """Hardware / model FLOPs with every block checkpointed: the blocks' forward runs again in backward --
    all of it but the last matmul (the MLP's output projection, 4·d² weights), whose output backward never
    needs, so PyTorch's checkpoint stops before it. Forward of a block: 2 × 12·d² matmul FLOPs per token
    + 4·d·T for attention (non-causal convention); a step: 6·N + 12·L·d·T."""
    n_blocks = 12 * d_model**2 * n_layer
    n = n_blocks + vocab * d_model
    step = 6 * n + 12 * n_layer * d_model * seq_len
    recompute = 2 * (n_blocks - 4 * d_model**2 * n_layer) + 4 * n_layer * d_model * seq_len
    return 1 + recompute / step


# ---- 05 data loader --------------------------------------------------------------------------------

# exercise-05-ideal-step: lk.check.ideal_step(ideal_step_s)
def ideal_step_s(data_s, compute_s, workers):
    if workers == 0:
        return data_s + compute_s  # the main process loads, then computes
    return max(compute_s, data_s / workers)  # w workers deliver a batch every data_s / w seconds


# exercise-05-wait-fraction: lk.check.wait_fraction(wait_fraction)
def wait_fraction(records):
    total = sum(r["step_time_s"] for r in records)
    return sum(r["data_wait_s"] for r in records) / total if total else 0.0


# exercise-05-fewest-workers: lk.check.fewest_workers(fewest_workers)
def fewest_workers(cost_ms_per_sample, micro_batch, compute_ms_per_batch, limit=0.05):
    data = cost_ms_per_sample * micro_batch  # one batch's loading time
    w = 0
    while True:
        step = ideal_step_s(data, compute_ms_per_batch, w)
        wait = data if w == 0 else max(0.0, data / w - compute_ms_per_batch)
        if step == 0 or wait / step < limit:
            return w
        w += 1


__all__ = ["run_block", "pick_option", "predicted_overhead", "ideal_step_s", "wait_fraction", "fewest_workers"]
