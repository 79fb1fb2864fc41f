"""Every chapter 04-06 checker (labkit.check.scaling for 04-05, .ddp for 06) accepts the reference solution
and rejects the mistakes learners make."""
import contextlib
import re
import types

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.checkpoint import checkpoint

import labkit as lk
from conftest import ENGLISH_RUN, assert_family_registered, attempted_and_passed, load_solutions
from labkit.check import ddp, scaling

FAMILIES = (scaling, ddp)  # chapters 04-05, 06
NAMES = [name for family in FAMILIES for name in family.__all__]
# both families' reference answers in one namespace (their names do not overlap)
sol = types.SimpleNamespace(**{n: v for family in ("scaling", "ddp") for n, v in vars(load_solutions(family)).items()
                               if not n.startswith("_")})


passes = attempted_and_passed


def test_every_checker_is_listed_and_found_by_name():
    for family in FAMILIES:
        assert_family_registered(family)


@pytest.mark.parametrize("name", NAMES)
def test_unattempted_answers_never_raise(name):
    fn = getattr(lk.check, name)
    extra = {"checkpoint_budget": ([], 1), "checkpoint_overhead": (lk.Config(model="tiny"),),
             "predict_allreduce_calls": (1, 1, "no_sync")}.get(name, ())
    for placeholder in (None, ...):
        res = fn(placeholder, *extra)
        assert not res.passed and not res.attempted


# ---- 04 -------------------------------------------------------------------------------------------

def test_checkpoint_blocks():
    assert passes(lk.check.checkpoint_blocks(sol.run_block))
    assert not passes(lk.check.checkpoint_blocks(lambda block, x: block(x)))  # forgot to checkpoint

    def no_grad(block, x):  # "saves memory" by dropping autograd altogether
        with torch.no_grad():
            return block(x)

    res = lk.check.checkpoint_blocks(no_grad)
    assert not res.passed and "no gradient" in res.message
    assert not passes(lk.check.checkpoint_blocks(lambda block, x: checkpoint(block, x.detach(), use_reentrant=False)))
    assert not passes(lk.check.checkpoint_blocks(lambda block, x: 2 * checkpoint(block, x, use_reentrant=False)))


OPTIONS = [dict(name="none", activation_bytes=100, hardware_flops=10),
           dict(name="selective", activation_bytes=70, hardware_flops=10),
           dict(name="every 2", activation_bytes=55, hardware_flops=11),
           dict(name="full", activation_bytes=10, hardware_flops=12)]


@pytest.mark.parametrize("budget", [5, 20, 60, 80, 120])
def test_checkpoint_budget(budget):
    best = sol.pick_option(OPTIONS, budget)
    if best is None:
        assert not passes(lk.check.checkpoint_budget("full", OPTIONS, budget))
        return
    assert passes(lk.check.checkpoint_budget(best, OPTIONS, budget))
    for o in OPTIONS:
        if o["name"] != best:
            assert not passes(lk.check.checkpoint_budget(o["name"], OPTIONS, budget))


def test_checkpoint_budget_typical_mistakes():
    res = lk.check.checkpoint_budget("full", OPTIONS, 60)  # fits, but recomputes more than "every 2"
    assert not res.passed and "recomputes more" in res.message
    res = lk.check.checkpoint_budget("selective", OPTIONS, 60)  # cheapest, but over the budget
    assert not res.passed and "over the budget" in res.message
    assert not passes(lk.check.checkpoint_budget("everything", OPTIONS, 60))


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_checkpoint_overhead(model):
    cfg = lk.Config(model=model)
    s = cfg.spec
    assert passes(lk.check.checkpoint_overhead(sol.predicted_overhead(s.n_layer, s.d_model, s.seq_len), cfg))
    from labkit.engine.measure import count_flops

    assert passes(lk.check.checkpoint_overhead(count_flops(s, "full") / count_flops(s), cfg))
    for wrong in (2.0, 1.5, 1.0, 30):  # "recompute doubles it", forward = half, no cost, a percentage
        assert not passes(lk.check.checkpoint_overhead(wrong, cfg))
    right = count_flops(s, "full") / count_flops(s)
    naive = scaling.naive_overhead(s)
    assert passes(lk.check.checkpoint_overhead(round(right, 2), cfg))  # rounded to 2 digits
    assert passes(lk.check.checkpoint_overhead(right * 1.02, cfg))  # a small term dropped
    for wrong in (right * 0.95, right * 1.05, 1.37):  # the old window took 0.97 x count .. 1.03 x textbook
        assert not passes(lk.check.checkpoint_overhead(wrong, cfg))
    res = lk.check.checkpoint_overhead(naive, cfg)  # every block's whole forward twice: 7-8% over the count
    assert not res.passed and res.attempted and "textbook" in res.message and "last matmul" in res.message


def test_checkpoint_overhead_window_is_tight():
    """The value is a deterministic FLOP count: the window is a few per cent, not count .. textbook."""
    cfg = lk.Config(model="small")
    from labkit.engine.measure import count_flops

    right = count_flops(cfg.spec, "full") / count_flops(cfg.spec)
    assert abs(right - 1.226) < 1e-3
    assert scaling.CHECKPOINT_OVERHEAD_TOLERANCE <= 0.03
    assert not passes(lk.check.checkpoint_overhead(1.30, cfg))
    assert not passes(lk.check.checkpoint_overhead(1.19 * 0.99, cfg))


# ---- 05 -------------------------------------------------------------------------------------------

def test_ideal_step():
    assert passes(lk.check.ideal_step(sol.ideal_step_s))
    res = lk.check.ideal_step(lambda d, c, w: d / w + c if w else d + c)  # no overlap
    assert not res.passed and "overlap" in res.message
    res = lk.check.ideal_step(lambda d, c, w: max(c, d / w))  # forgets workers=0
    assert not res.passed and "workers=0" in res.message


def test_wait_fraction():
    assert passes(lk.check.wait_fraction(sol.wait_fraction))
    mean_of_ratios = lambda recs: sum(r["data_wait_s"] / r["step_time_s"] for r in recs) / len(recs)  # noqa: E731
    res = lk.check.wait_fraction(mean_of_ratios)
    assert not res.passed and "mean of per-update" in res.message
    res = lk.check.wait_fraction(lambda recs: 100 * sol.wait_fraction(recs))
    assert not res.passed and "percentage" in res.message
    # a mean wait in seconds was told it was "the mean of per-update fractions" (equal on the old records)
    res = lk.check.wait_fraction(lambda recs: sum(r["data_wait_s"] for r in recs) / len(recs))
    assert not res.passed and "in seconds" in res.message
    res = lk.check.wait_fraction(lambda recs: sum(r["data_wait_s"] for r in recs))
    assert not res.passed and "in seconds" in res.message
    res = lk.check.wait_fraction(lambda recs: sum(r["data_wait_s"] for r in recs) / sum(r["compute_s"] for r in recs))
    assert not res.passed and "wait / compute" in res.message


def test_fewest_workers():
    assert passes(lk.check.fewest_workers(sol.fewest_workers))
    import math

    # the interview question's rule of thumb, workers >= load / compute: passes, and the message says which rule
    res = lk.check.fewest_workers(lambda c, B, t: math.ceil(c * B / t))
    assert passes(res) and "rule of thumb" in res.message and "5%" in res.message
    res = lk.check.fewest_workers(lambda c, B, t: -(-c * B // t) if c else 0)  # the same rule, another form
    assert passes(res) and "rule of thumb" in res.message
    res = lk.check.fewest_workers(sol.fewest_workers)
    assert "5% rule" in res.message and "rule of thumb" in res.message
    res = lk.check.fewest_workers(lambda c, B, t: math.ceil(c * B / t) + 1)  # a spare worker: neither rule
    assert not res.passed and res.attempted and "no wait at all" in res.message
    res = lk.check.fewest_workers(lambda c, B, t: math.floor(c * B / t))  # rounds down: waits
    assert not res.passed and res.attempted and "round up" in res.message
    res = lk.check.fewest_workers(lambda c, B, t: round(c * B / t))  # was told "multiply by micro_batch"
    assert not res.passed and "round up" in res.message and "per *sample*" not in res.message
    res = lk.check.fewest_workers(lambda c, B, t: sol.fewest_workers(c, 1, t))  # cost per sample, not per batch
    assert not res.passed and "per *sample*" in res.message


# ---- 06 -------------------------------------------------------------------------------------------

def test_counting_hook():
    assert passes(lk.check.counting_hook(sol.count_and_average))

    def sums_only(state, bucket):
        state["calls"] += 1
        state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    res = lk.check.counting_hook(sums_only)
    assert not res.passed and "averaged" in res.message

    def counts_elements(state, bucket):
        state["calls"] += 1
        state["bytes"] += bucket.buffer().numel()
        return default_hooks.allreduce_hook(None, bucket)

    res = lk.check.counting_hook(counts_elements)
    assert not res.passed and "elements" in res.message

    def four_bytes_each(state, bucket):  # right for fp32 only: wrong under the fp16-compression hook
        state["calls"] += 1
        state["bytes"] += bucket.buffer().numel() * 4
        return default_hooks.allreduce_hook(None, bucket)

    res = lk.check.counting_hook(four_bytes_each)
    assert not res.passed and res.attempted and "element_size()" in res.message and "fp16" in res.message

    def nbytes_form(state, bucket):  # right, another form
        state["calls"] += 1
        buf = bucket.buffer()
        state["bytes"] += buf.untyped_storage().nbytes() if buf.storage_offset() == 0 and buf.is_contiguous() \
            else buf.numel() * buf.element_size()
        return default_hooks.allreduce_hook(None, bucket)

    res = lk.check.counting_hook(nbytes_form)
    assert passes(res) and "fp16" in res.message

    def never_communicates(state, bucket):
        state["calls"] += 1
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    res = lk.check.counting_hook(never_communicates)
    assert not res.passed and "never launched" in res.message
    assert not dist.is_initialized()  # the checker leaves no process group behind


@pytest.mark.parametrize("n_buckets,accum,sync,world", [(3, 4, "every_micro", 2), (3, 4, "no_sync", 8),
                                                       (1, 16, "every_micro", 1), (5, 1, "no_sync", 4)])
def test_predict_allreduce_calls(n_buckets, accum, sync, world):
    right = sol.calls(n_buckets, accum, sync)
    assert passes(lk.check.predict_allreduce_calls(right, n_buckets, accum, sync, world))
    wrong = right * world if world > 1 else right + 1  # multiplying by the world size
    assert not passes(lk.check.predict_allreduce_calls(wrong, n_buckets, accum, sync, world))


def test_predict_allreduce_calls_hints():
    res = lk.check.predict_allreduce_calls(12, 3, 4, "no_sync", 2)
    assert not res.passed and "no_sync" in res.message


def test_fix_no_sync():
    assert passes(lk.check.fix_no_sync(sol.accumulate))

    def forgets_no_sync(ddp_model, batches, K):  # the loop the chapter starts from
        for _ in range(K):
            x, y = next(batches)
            (ddp_model(x, y) / K).backward()

    res = lk.check.fix_no_sync(forgets_no_sync)
    assert not res.passed and "every micro-batch" in res.message

    def never_syncs(ddp_model, batches, K):
        with ddp_model.no_sync():
            for _ in range(K):
                x, y = next(batches)
                (ddp_model(x, y) / K).backward()

    res = lk.check.fix_no_sync(never_syncs)
    assert not res.passed and "no AllReduce" in res.message

    def syncs_first(ddp_model, batches, K):
        for k in range(K):
            x, y = next(batches)
            with ddp_model.no_sync() if k > 0 else contextlib.nullcontext():
                (ddp_model(x, y) / K).backward()

    assert not passes(lk.check.fix_no_sync(syncs_first))

    def sums_losses(ddp_model, batches, K):
        for k in range(K):
            x, y = next(batches)
            with ddp_model.no_sync() if k < K - 1 else contextlib.nullcontext():
                ddp_model(x, y).backward()

    res = lk.check.fix_no_sync(sums_losses)
    assert not res.passed and "K×" in res.message

    def one_big_forward(ddp_model, batches, K):  # no accumulation: same gradients, one AllReduce
        xs, ys = zip(*(next(batches) for _ in range(K)))
        (ddp_model(torch.cat(xs), torch.cat(ys))).backward()

    res = lk.check.fix_no_sync(one_big_forward)
    assert not res.passed and res.attempted and "K=4 forward passes" in res.message and "micro_batch=2" in res.message

    def first_k_minus_1_in_one_block(ddp_model, batches, K):  # right, another form
        with ddp_model.no_sync():
            for _ in range(K - 1):
                x, y = next(batches)
                (ddp_model(x, y) / K).backward()
        x, y = next(batches)
        (ddp_model(x, y) / K).backward()

    assert passes(lk.check.fix_no_sync(first_k_minus_1_in_one_block))
    assert not dist.is_initialized()


def test_ring_allreduce_time():
    assert passes(lk.check.ring_allreduce_time(sol.ring_time))
    res = lk.check.ring_allreduce_time(lambda b, n, bw, lat: 2 * b / bw + 2 * (n - 1) * lat if n > 1 else 0.0)
    assert not res.passed and "(N-1)/N" in res.message
    res = lk.check.ring_allreduce_time(lambda b, n, bw, lat: 2 * (n - 1) / n * b / bw if n > 1 else 0.0)
    assert not res.passed and "latency" in res.message


@pytest.mark.parametrize("name", ["checkpoint_blocks", "ideal_step", "wait_fraction", "fewest_workers",
                                  "counting_hook", "fix_no_sync", "ring_allreduce_time"])
def test_a_skeleton_whose_body_is_still_dots_counts_as_not_attempted(name):
    def skeleton(*args):
        ...  # your code here

    res = getattr(lk.check, name)(skeleton)
    assert not res.passed and not res.attempted, res
    assert not dist.is_initialized()


# ---- the hints in Russian (issue #51) ------------------------------------------------------------------------

wrong = load_solutions("wrong")  # the typical wrong answers (labkit.instructor.grading.WRONG)
_TINY = lk.Config(model="tiny")
# each checker's typical wrong answer (templates/wrong-answers.md), as a call
TYPICAL_WRONG = {
    "checkpoint_overhead": lambda: lk.check.checkpoint_overhead(
        wrong.textbook_overhead(_TINY.spec.n_layer, _TINY.spec.d_model, _TINY.spec.seq_len), _TINY),
    "checkpoint_blocks": lambda: lk.check.checkpoint_blocks(lambda block, x: block(x)),
    "checkpoint_budget": lambda: lk.check.checkpoint_budget(wrong.least_memory_option(OPTIONS, 60), OPTIONS, 60),
    "wait_fraction": lambda: lk.check.wait_fraction(
        lambda records: sum(r["data_wait_s"] / r["step_time_s"] for r in records) / len(records)),
    "loader_reading": lambda: lk.check.loader_reading(wrong.read_loader_in_seconds),
    "ideal_step": lambda: lk.check.ideal_step(
        lambda data_s, compute_s, workers: data_s + compute_s if workers == 0 else data_s / workers + compute_s),
    "fewest_workers": lambda: lk.check.fewest_workers(wrong.workers_for_one_sample),
    "counting_hook": lambda: lk.check.counting_hook(wrong.hook_counts_elements),
    "predict_allreduce_calls": lambda: lk.check.predict_allreduce_calls(3, 3, 8, "every_micro"),
    "fix_no_sync": lambda: lk.check.fix_no_sync(wrong.no_sync_around_backward),
    "ring_allreduce_time": lambda: lk.check.ring_allreduce_time(
        lambda nbytes, n, bandwidth, latency: 0.0 if n <= 1 else 2 * nbytes / bandwidth + 2 * (n - 1) * latency),
    # not a wrong answer: the exercise's starting code, not attempted yet, with its own message
    "fix_no_sync untouched": lambda: lk.check.fix_no_sync(ddp._fix_no_sync_start),
}


@pytest.mark.parametrize("name", list(TYPICAL_WRONG))
def test_a_typical_wrong_answer_gets_its_hint_in_russian(name, speaks_russian):
    res = TYPICAL_WRONG[name]()
    assert res.attempted != name.endswith("untouched") and not res.passed, res
    assert re.search("[а-яё]", res.message) and "Warning" not in res.message, res.message
    assert not ENGLISH_RUN.search(res.message), res.message
