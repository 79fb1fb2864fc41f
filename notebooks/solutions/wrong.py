"""Typical wrong answers, for the graded builds' tests (for instructors; not for learners).

Each function is the mistake a checker's own hint names, written as a learner would write it, for the exercises
whose mistake an expression in ``labkit.instructor.grading.WRONG`` cannot say. Every function here stands alone
(it reads nothing from the other solution modules): the graded builds copy it into an exercise cell. The comment
says which exercise it answers and which of the checker's hints it earns.
"""
import contextlib
import math
import statistics


# exercise-02-loss-scaler -> lk.check.loss_scaler: "after an overflow ... the count of good steps starts again"
class ScalerKeepsCount:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale = init_scale
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.good_steps = 0

    def update(self, found_inf):
        if found_inf:
            self.scale *= self.backoff_factor  # the count of good steps is not reset: the mistake
            return False
        self.good_steps += 1
        if self.good_steps % self.growth_interval == 0:
            self.scale *= self.growth_factor
        return True


# exercise-02-find-the-bug -> lk.check.fixed_training_loop: "An update without any AllReduce ..."
def update_never_syncs(ddp_model, optimizer, micro_batches):
    K = len(micro_batches)
    for x, y in micro_batches:
        with ddp_model.no_sync():  # every micro-batch, the last one too: the mistake
            loss = ddp_model(x, y) / K
            loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# exercise-03-accumulation-loop -> lk.check.accumulation_loop: "zero_grad() inside the micro-batch loop"
def update_zeroes_inside(model, optimizer, micro_batches):
    K = len(micro_batches)
    for x, y in micro_batches:
        optimizer.zero_grad(set_to_none=True)  # wipes what the earlier micro-batches added: the mistake
        loss = model(x, y) / K
        loss.backward()
    optimizer.step()


# exercise-04-predict-overhead -> lk.check.checkpoint_overhead: "the textbook estimate"
def textbook_overhead(n_layer, d_model, seq_len, vocab=256):
    n_blocks = 12 * d_model**2 * n_layer
    n = n_blocks + vocab * d_model
    step = 6 * n + 12 * n_layer * d_model * seq_len
    return 1 + (2 * n_blocks + 4 * n_layer * d_model * seq_len) / step  # the whole forward again: the mistake


# exercise-04-budget-pick -> lk.check.checkpoint_budget: "it recomputes more than needed"
def least_memory_option(options, budget_bytes):
    return min(options, key=lambda o: o["activation_bytes"])["name"]  # the smallest, not the cheapest that fits


# exercise-05-loader-reading -> lk.check.loader_reading: "These are seconds; give milliseconds."
def read_loader_in_seconds(records):
    load_s = statistics.median(r["data_wait_s"] for r in records)
    compute_s = statistics.median(r["step_time_s"] - r["data_wait_s"] for r in records)
    return load_s, compute_s, math.ceil(load_s / compute_s) if load_s > 0 else 0


# exercise-05-fewest-workers -> lk.check.fewest_workers: "the cost is per *sample*"
def workers_for_one_sample(cost_ms_per_sample, micro_batch, compute_ms_per_batch, limit=0.05):
    data = cost_ms_per_sample  # one sample's loading time taken for the batch's: the mistake
    w = 0
    while True:
        step = data + compute_ms_per_batch if w == 0 else max(compute_ms_per_batch, data / w)
        wait = data if w == 0 else max(0.0, data / w - compute_ms_per_batch)
        if step == 0 or wait / step < limit:
            return w
        w += 1


# exercise-06-counting-hook -> lk.check.counting_hook: "that counts elements, not bytes"
def hook_counts_elements(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    buf = bucket.buffer()
    state["calls"] += 1
    state["bytes"] += buf.numel()  # elements, not bytes: the mistake
    return default_hooks.allreduce_hook(None, bucket)


# exercise-06-fix-no-sync -> lk.check.fix_no_sync: "DDP synchronised after every micro-batch"
def no_sync_around_backward(ddp_model, batches, K):
    for k in range(K):
        x, y = next(batches)
        loss = ddp_model(x, y) / K  # the forward outside no_sync: DDP has decided to synchronise already
        with ddp_model.no_sync() if k < K - 1 else contextlib.nullcontext():
            loss.backward()


# exercise-07-breakeven -> lk.check.compile_breakeven: "round up to whole updates"
def breakeven_unrounded(compile_s, eager_step_s, compiled_step_s):
    saved = eager_step_s - compiled_step_s
    if saved <= 0:
        return math.inf
    return compile_s / saved  # a fraction of an update: the mistake


# exercise-08-budget -> lk.check.memory_budget: "AdamW's two moments (8 bytes per parameter) are missing."
def budget_without_adam(config):
    s = config.spec
    d, L, V, T, B = s.d_model, s.n_layer, 256, s.seq_len, config.micro_batch
    n_params = V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d
    state = 8 * n_params  # weights and gradients only: the mistake
    per_token = 16 * d + s.n_head + 4
    if config.attention == "math":
        per_token += s.n_head * (T - 1)
    acts = L * B * T * per_token * 4 + B * T * (2 * d + 2 + V) * 4
    return state + acts


# exercise-09-pareto -> lk.check.pareto_front: "faster than EVERY cheaper point ..., not just its neighbour"
def front_by_neighbour(points):
    pts = sorted(points, key=lambda p: (p[0], -p[1]))
    return [p for i, p in enumerate(pts) if i == 0 or p[1] > pts[i - 1][1]]


# exercise-09-budget -> lk.check.budget_challenge: "That is the fastest configuration overall"
def fastest_overall(rows, budget_bytes):
    ran = [r for r in rows if r.get("status", "ok") == "ok"]
    best = max(ran, key=lambda r: r["tokens_per_s"])  # the budget never looked at: the mistake
    return {k: best[k] for k in ("precision", "micro_batch", "checkpointing")}
