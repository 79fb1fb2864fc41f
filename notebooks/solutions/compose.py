"""Reference solutions for chapter 12 (composing the layout). For instructors: not imported by the notebook.

Each name matches the placeholder the learner fills in; tests/test_check_compose.py checks that the checkers
accept these and reject the usual wrong answers.
"""
import math


def my_sp_collectives(n_layer, sequence_parallel):
    """exercise-12-sp-collectives: two TP regions a block (attention, MLP), each one collective per pass."""
    if sequence_parallel:
        # forward: AllGather before each column-parallel layer, ReduceScatter after each row-parallel one;
        # backward mirrors them (an AllGather's backward is a ReduceScatter and vice versa)
        return {"all_reduce": 0, "all_gather": 4 * n_layer, "reduce_scatter": 4 * n_layer}
    # forward: AllReduce after each row-parallel layer; backward: of each column-parallel layer's input gradient
    return {"all_reduce": 4 * n_layer, "all_gather": 0, "reduce_scatter": 0}


def my_expert_capacity(tokens, n_experts, top_k, capacity_factor):
    """exercise-12-capacity: tokens · top_k assignments, an even share per expert, the head-room, rounded up."""
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


def my_interleaved_bubble(p, m, v):
    """exercise-12-interleaved-bubble: in chunk slots (1/v of a stage) a rank works v·m and idles p − 1."""
    return (p - 1) / (v * m + p - 1)
