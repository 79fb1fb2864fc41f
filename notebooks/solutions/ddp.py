"""Reference solutions for the exercises of chapter 06 -- for instructors, not for learners.

Each function is what a learner would write in the notebook cell tagged ``exercise-NN-name``; the
tests in tests/test_check_scaling.py pass these to the checkers in labkit/check/ddp.py.
"""
from __future__ import annotations

import contextlib


# ---- 06 DDP and AllReduce ---------------------------------------------------------------------------

# exercise-06-counting-hook: ddp.register_comm_hook(state, count_and_average); lk.check.counting_hook(...)
def count_and_average(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buf = bucket.buffer()
    state["calls"] += 1
    state["bytes"] += buf.numel() * buf.element_size()
    return default_hooks.allreduce_hook(None, bucket)  # sum over ranks, divided by the world size


# exercise-06-predict-calls: lk.check.predict_allreduce_calls(calls(...), n_buckets, accum, ddp_sync, world_size)
def calls(n_buckets, accum, ddp_sync):
    return n_buckets * (accum if ddp_sync == "every_micro" else 1)


# exercise-06-fix-no-sync: lk.check.fix_no_sync(accumulate)
def accumulate(ddp_model, batches, K):
    for k in range(K):
        x, y = next(batches)
        # the first K-1 micro-batches only add up local gradients; the last one synchronises
        with ddp_model.no_sync() if k < K - 1 else contextlib.nullcontext():
            loss = ddp_model(x, y) / K
            loss.backward()


# exercise-06-ring-formula: lk.check.ring_allreduce_time(ring_time)
def ring_time(nbytes, n, bandwidth, latency):
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


__all__ = ["count_and_average", "calls", "accumulate", "ring_time"]
