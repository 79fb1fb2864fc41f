"""Reference solutions for the measure and diagnose exercises of chapters 01 and 05 (for instructors; the tests
import them).

Each name matches what the learner fills in, in the notebook cell tagged ``exercise-NN-<name>``; the comment says
which ``lk.check`` checker grades it. These exercises are answered by measuring, so the solution says what to
run; the checker then judges the runs.
"""
import math
import statistics

# ---- 01 measure first --------------------------------------------------------------------------------------

# exercise-01-low-mfu -> lk.check.low_mfu_fix(my_run, suspect)
# The suspect has no data wait to speak of; its update is 8 micro-batches of one sequence, so every matmul has
# one sequence's rows and fixed per-operation costs dominate. Same model, same tokens per update, in one big
# micro-batch: my_run = lk.run(fixed_config(suspect_cfg))  (or accum 4 x micro-batch 2, 2 x 4: all pass).


def fixed_config(suspect_cfg):
    return suspect_cfg.replace(micro_batch=suspect_cfg.micro_batch * suspect_cfg.accum, accum=1)


# ---- 05 data loader ----------------------------------------------------------------------------------------

# exercise-05-loader-reading -> lk.check.loader_reading(read_loader, cmp_starving.results_b)
def read_loader(records):
    # with 0 workers the loop loads each batch itself: the update's data wait is the time to load one batch,
    # and everything else in the update (forward, backward, optimizer step) is what workers must keep up with
    load_ms = 1e3 * statistics.median(r["data_wait_s"] for r in records)
    compute_ms = 1e3 * statistics.median(r["step_time_s"] - r["data_wait_s"] for r in records)
    workers = math.ceil(load_ms / compute_ms) if load_ms > 0 else 0  # w workers deliver a batch every load / w
    return load_ms, compute_ms, workers


__all__ = ["fixed_config", "read_loader"]
