"""Reference solutions for chapter 09 (the playbook). For instructors: not imported by the notebook.

Each name matches the placeholder the learner fills in; tests/test_check_capstone.py checks that
the checkers accept these and reject the usual wrong answers.
"""


def my_pareto_front(points):
    """exercise-09-pareto: (memory, tokens/s) pairs that nothing cheaper-or-equal beats on speed."""
    front, best = [], float("-inf")
    for mem, speed in sorted(points, key=lambda p: (p[0], -p[1])):  # cheapest first, fastest first on ties
        if speed > best:  # faster than EVERY cheaper point: a running maximum, not the neighbour
            front.append((mem, speed))
            best = speed
    return front


def my_pick(rows, budget_bytes):
    """exercise-09-budget: the fastest measured grid row that fits the budget, as knobs for lab.run."""
    fits = [r for r in rows if r.get("status", "ok") == "ok" and r["memory_bytes"] <= budget_bytes]
    best = max(fits, key=lambda r: r["tokens_per_s"])
    return {k: best[k] for k in ("precision", "micro_batch", "checkpointing")}


def my_zero_bytes(n_params, n_gpus, stage):
    """exercise-09-zero: model-state bytes per GPU, mixed-precision Adam (2 + 2 + 12 bytes/param)."""
    weights, grads, optimizer = 2 * n_params, 2 * n_params, 12 * n_params
    if stage >= 1:
        optimizer /= n_gpus  # ZeRO-1: optimizer states (fp32 master, m, v) sharded
    if stage >= 2:
        grads /= n_gpus      # ZeRO-2: gradients too (reduce-scatter instead of all-reduce)
    if stage >= 3:
        weights /= n_gpus    # ZeRO-3 / FSDP: weights too (all-gathered layer by layer)
    return weights + grads + optimizer


# exercise-09-which-fix: 13 B parameters, 8 GPUs of 80 GB, 20 GB of activations per GPU.
# DDP 208 + 20 GB; ZeRO-1 52 + 19.5 + 20 = 91.5 GB (too much); ZeRO-2 26 + 22.75 + 20 = 68.75 GB: fits.
my_fix = "zero2"
