"""Checkers for chapters 04-05: activation checkpointing and the data loader.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..tools import timing
from ..tools import memory
from ..engine.config import ModelSpec
from ..engine.measure import count_flops, formula_flops_per_token
from ..engine.model import Block, GPT
from ._core import NotAttempted, checker, describe, near, not_attempted_if_none, number, number_or_none

__all__ = [
    # 04 activation checkpointing
    "checkpoint_blocks", "checkpoint_budget", "checkpoint_overhead",
    # 05 data loader
    "ideal_step", "wait_fraction", "fewest_workers",
]


def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB"


# ================================================================================================
# 04 -- activation checkpointing
# ================================================================================================

def _tiny_spec():
    return ModelSpec(n_layer=2, d_model=64, n_head=4, seq_len=64)


def not_attempted_if_none(fn, *args):
    """A learner's function whose body is still ``...`` returns None: that is 'not attempted', not wrong."""
    if fn(*args) is None:
        raise NotAttempted()


def _one_block():
    s = _tiny_spec()
    with torch.random.fork_rng(devices=[]):  # never disturb the learner's random state
        torch.manual_seed(0)
        return Block(s.d_model, s.n_head, 0.0), torch.randn(1, 8, s.d_model, requires_grad=True)


def _grads_and_bytes(wrap, seed=0, batch=4):
    """Gradients and activation bytes kept after forward for a tiny GPT whose blocks run through ``wrap``."""
    spec = _tiny_spec()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(spec)
    if wrap is not None:
        model._wrappers = [wrap] * spec.n_layer  # every block goes through the learner's function
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 256, (batch, spec.seq_len), generator=g)
    tgt = torch.randint(0, 256, (batch, spec.seq_len), generator=g)
    trace = memory.trace_model(model, idx, tgt)
    grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    return grads, trace.kept_bytes()


@checker
def checkpoint_blocks(wrap):
    """``wrap(block, x)`` must return the block's output, computed so that the block keeps only its input
    for backward: the same gradients as running the block plainly, and less activation memory."""
    if not callable(wrap):
        return False, "pass your function itself (e.g. `lk.check.checkpoint_blocks(run_block)`), not its result"
    not_attempted_if_none(wrap, *_one_block())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grads, kept = _grads_and_bytes(wrap)
    ref_grads, ref_bytes = _grads_and_bytes(None)  # only now: the learner's code finds no reference to read
    missing = [n for n, g in grads.items() if g is None and ref_grads[n] is not None]
    if missing:
        return False, (f"{len(missing)} parameters got no gradient (e.g. `{missing[0]}`): the block ran without "
                       "autograd (torch.no_grad() or .detach()?). Checkpointing still needs gradients -- it "
                       "recomputes the block in backward. torch.utils.checkpoint is the tool (its non-reentrant "
                       "form): see what it needs to run the block.")
    worst = max((float((grads[n] - g).abs().max() / (g.abs().max() + 1e-12)) for n, g in ref_grads.items()
                 if g is not None), default=0.0)
    if worst > 1e-4:
        return False, (f"the gradients differ from the plain model's (largest relative difference {worst:.2g}). "
                       "Call the block exactly once per forward, on x, and return its output unchanged.")
    if kept > 0.7 * ref_bytes:
        return False, (f"same gradients, but the forward pass still keeps {_mib(kept)} for backward (the plain "
                       f"model keeps {_mib(ref_bytes)}): the block's inner activations are still saved. Which tool of "
                       "torch.utils runs a function and keeps only its inputs for backward?")
    return True, (f"same gradients, and the forward pass keeps {_mib(kept)} instead of {_mib(ref_bytes)} "
                  f"({kept / ref_bytes:.0%}) on the check's tiny model: only block inputs survive; the rest is "
                  "recomputed in backward.")


def _cheapest(options, budget):
    fits = [o for o in options if o["activation_bytes"] <= budget]
    if not fits:
        return None, fits
    # least recompute first (hardware FLOPs), then the option that keeps the most (recomputes the least)
    best = min(fits, key=lambda o: (o["hardware_flops"], -o["activation_bytes"]))
    return best, fits


@checker
def checkpoint_budget(answer, options, budget_bytes):
    """``answer``: the name of the option that fits ``budget_bytes`` of activation memory with the least
    recompute. ``options``: dicts with name, activation_bytes, hardware_flops (as the chapter measured)."""
    answer = str(answer) if isinstance(answer, str) else answer  # a plain str: no code of the answer's runs later
    names = [o["name"] for o in options]
    if answer not in names:
        got = "" if isinstance(answer, str) else f"your answer is {describe(answer)}; "
        return False, f"{got}answer with one of the option names: {', '.join(repr(n) for n in names)}"
    chosen = next(o for o in options if o["name"] == answer)
    best, fits = _cheapest(options, budget_bytes)
    if best is None:
        return False, "no option fits this budget -- a smaller micro-batch is the only way (then say so)"
    if chosen["activation_bytes"] > budget_bytes:
        return False, (f"{answer!r} keeps {_mib(chosen['activation_bytes'])} of activations, over the budget of "
                       f"{_mib(budget_bytes)}: it would run out of memory. Compare each option's bytes with the budget.")
    if chosen is best or chosen["name"] == best["name"]:
        return True, (f"{answer!r} fits ({_mib(chosen['activation_bytes'])} ≤ {_mib(budget_bytes)}) and recomputes "
                      "the least of the options that fit.")
    extra = chosen["hardware_flops"] / best["hardware_flops"] - 1
    return False, (f"{answer!r} fits, but it recomputes more than needed ({extra:+.0%} hardware FLOPs against "
                   f"another option that also fits). Among the options under the budget, pick the one with the "
                   "fewest hardware FLOPs.")


def naive_overhead(spec) -> float:
    """The textbook estimate: every block's whole forward (2·N_blocks + 4·L·d·T FLOPs per token) runs twice."""
    d, L, T = spec.d_model, spec.n_layer, spec.seq_len
    n_blocks = 12 * d * d * L
    n_matmul = n_blocks + 256 * d  # plus the (tied) LM head
    return 1 + (2 * n_blocks + 4 * L * d * T) / formula_flops_per_token(n_matmul, L, d, T)


# How far a right checkpoint_overhead answer may be from the counted ratio (relative).
CHECKPOINT_OVERHEAD_TOLERANCE = 0.03


@checker
def checkpoint_overhead(answer, config):
    """``answer``: hardware FLOPs / model FLOPs of one step with full checkpointing of every block (e.g. 1.5)."""
    spec = config.spec
    a = number(answer, "give a ratio such as 1.5")
    right = count_flops(spec, "full", 1) / count_flops(spec)
    naive = naive_overhead(spec)
    if 10 <= a <= 100:
        return False, f"write a ratio, not a percentage: +30% is 1.3 (you wrote {a:g})"
    # a deterministic FLOP count: only a learner's rounding or a dropped small term (attention's 4·L·d·T, the
    # LM head) moves a right prediction, by a few per cent at most
    if abs(a / right - 1) <= CHECKPOINT_OVERHEAD_TOLERANCE:
        return True, (f"right. Counted with FlopCounterMode: {right:.3f}×. The textbook estimate -- the blocks' whole "
                      f"forward (2·N of a step's 6·N FLOPs per token) runs twice -- gives {naive:.3f}×. The count is "
                      "lower because PyTorch's checkpoint stops recomputing as soon as it has every tensor backward "
                      "needs: the block's last matmul output is never needed, so it is not recomputed.")
    if abs(a / naive - 1) <= CHECKPOINT_OVERHEAD_TOLERANCE:
        return False, (f"{a:g} is the textbook estimate (every block's whole forward runs twice, {naive:.3f}×); the "
                       f"count is {100 * (naive / right - 1):.0f}% lower. PyTorch's checkpoint stops recomputing once "
                       "it has every tensor backward needs: the block's last matmul (the MLP's output projection) "
                       "is not run again. Count the recompute without it.")
    if a >= 1.9:
        return False, ("too high: recompute repeats only the forward pass of the blocks, not the backward. Forward is "
                       "about a third of a step's FLOPs (2·N of 6·N per token).")
    if a < 1.0:
        return False, "a ratio below 1 would mean fewer FLOPs than without checkpointing: recompute adds work"
    if a <= 1.05:
        return False, "that is (almost) no extra work: full checkpointing recomputes every block's forward pass"
    return False, ("not quite. Count it: forward = 2·N FLOPs per token, backward = 4·N, and checkpointing runs the "
                   "blocks' forward once more in backward.")


# ================================================================================================
# 05 -- the data loader
# ================================================================================================

def _ideal(data_s, compute_s, workers):
    return timing.ideal_step_s(data_s, compute_s, workers)


@checker
def ideal_step(fn):
    """``fn(data_s, compute_s, workers)``: step time when ``workers`` processes prepare batches in parallel
    with the model (each worker makes a whole batch in ``data_s``) and nothing else competes for cores."""
    if not callable(fn):
        return False, "pass your function itself, e.g. `lk.check.ideal_step(ideal_step_s)`"
    not_attempted_if_none(fn, 0.3, 0.2, 1)
    try:
        got0 = number_or_none(fn(0.3, 0.2, 0))
    except ZeroDivisionError:
        return False, ("workers=0 divides by zero: with no workers the main process loads each batch itself, "
                       "so data time and compute time add up")
    cases = [(0.3, 0.2, 1), (0.3, 0.2, 2), (0.9, 0.2, 3), (0.1, 0.2, 1), (0.5, 0.1, 4), (1.0, 0.2, 8)]
    answers = [number_or_none(fn(d, c, w)) for d, c, w in cases]  # every answer before any right one is worked out
    if not near(got0, _ideal(0.3, 0.2, 0)):
        return False, f"with 0 workers, data 0.3 s + compute 0.2 s should take 0.5 s per step; you return {got0}"
    for (d, c, w), got in zip(cases, answers):
        want = _ideal(d, c, w)
        if not near(got, want):
            if near(got, d / w + c):
                return False, ("with workers the loading happens *while* the model computes: the two overlap, so "
                               "the step takes the longer of the two, not their sum")
            if near(got, max(d, c)):
                return False, "w workers each make a batch in data_s, together one every data_s / w seconds"
            return False, f"data {d} s, compute {c} s, {w} worker(s): expected {want:.3g} s, you return {got}"
    return True, "right: max(compute, data / workers) with workers, data + compute without."


@checker
def wait_fraction(fn):
    """``fn(records)``: the share of the run's time spent waiting for data, from per-update records
    with ``data_wait_s`` and ``step_time_s``."""
    if not callable(fn):
        return False, "pass your function itself, e.g. `lk.check.wait_fraction(my_wait_fraction)`"
    # Steps of unequal length, so that each plausible mistake gives a number of its own: the total over the
    # total (right), the mean of per-update fractions, the mean or total wait in seconds, wait / compute.
    recs = [{"data_wait_s": 0.9, "step_time_s": 1.0, "compute_s": 0.1},
            {"data_wait_s": 0.0, "step_time_s": 3.0, "compute_s": 3.0},
            {"data_wait_s": 0.2, "step_time_s": 0.5, "compute_s": 0.3}]
    not_attempted_if_none(fn, [dict(r) for r in recs])
    got, got_idle = number_or_none(fn([dict(r) for r in recs])), number_or_none(fn([dict(recs[1])]))  # both before the answer exists
    want = sum(r["data_wait_s"] for r in recs) / sum(r["step_time_s"] for r in recs)
    if near(got, want, rel=1e-3):
        if not near(got_idle, 0.0, abs_=1e-9):
            return False, "a run that never waits should give 0"
        return True, "right: total wait over total time (long updates weigh more than short ones)."
    mean_ratio = sum(r["data_wait_s"] / r["step_time_s"] for r in recs) / len(recs)
    if near(got, mean_ratio, rel=1e-3):
        return False, ("that is the mean of per-update fractions, which lets a short update count as much as a long "
                       "one. Divide the total wait by the total time.")
    total_wait = sum(r["data_wait_s"] for r in recs)
    if near(got, total_wait / len(recs), rel=1e-3) or near(got, total_wait, rel=1e-3):
        return False, ("that is a wait in seconds (the mean or the total per update); the exercise asks for a "
                       "fraction: the total wait divided by the total step time.")
    if near(got, total_wait / sum(r["compute_s"] for r in recs), rel=1e-3):
        return False, "that is wait / compute; the fraction is of the whole step time (wait + compute + optimizer)"
    if near(got, 100 * want, rel=1e-3):
        return False, "return a fraction (0.2), not a percentage (20)"
    return False, f"for these three records the answer is {want:g}; you return {got}"


def _fewest(cost_ms, micro_batch, compute_ms, limit=0.05):
    return timing.fewest_workers(cost_ms, micro_batch, compute_ms, limit)


def _no_wait(cost_ms, micro_batch, compute_ms):
    """The interview question's rule: workers >= load time / compute time per batch (0 without loading)."""
    data = cost_ms * micro_batch
    return 0 if data <= 0 else math.ceil(data / compute_ms - 1e-9)


def _rounded(rounding, cost_ms, micro_batch, compute_ms):
    """The rule of thumb with the wrong rounding: load time per batch / compute time, rounded down or to the nearest."""
    data = cost_ms * micro_batch
    return 0 if data <= 0 else int(rounding(data / compute_ms))


@checker
def fewest_workers(fn):
    """``fn(cost_ms_per_sample, micro_batch, compute_ms_per_batch)``: the fewest loader workers that keep data
    wait under 5% of the step, under the ideal model (workers never compete with the model for cores)."""
    if not callable(fn):
        return False, "pass your function itself, e.g. `lk.check.fewest_workers(fewest_workers)`"
    not_attempted_if_none(fn, 2.0, 8, 10.0)
    cases = [(2.0, 8, 10.0), (0.0, 8, 10.0), (0.02, 8, 10.0), (2.0, 8, 40.0), (1.0, 32, 10.0), (4.0, 16, 20.0),
             (2.0, 8, 15.9), (5.0, 8, 9.0)]
    answers = [number_or_none(fn(cost, B, comp)) for cost, B, comp in cases]
    # Two rules are right. The exercise's: the fewest workers that keep the wait under 5% of the step. The
    # rule of thumb the interview question teaches: workers >= load time / compute time per batch, i.e.
    # ceil(load / compute) -- no wait at all, sometimes one worker more than the 5% knee needs.
    if all(got == _no_wait(cost, B, comp) for got, (cost, B, comp) in zip(answers, cases)) and \
            any(got != _fewest(cost, B, comp) for got, (cost, B, comp) in zip(answers, cases)):
        return True, ("right, by the rule of thumb workers = ⌈load time per batch / compute time per batch⌉ (no data "
                      "wait at all). The exercise's 5% knee sometimes needs one worker fewer: a wait of a few per "
                      "cent is allowed -- e.g. 2 ms × 8 samples against 15.9 ms of compute: 1 worker waits 0.6%.")
    for rounding, words in ((round, "round to the nearest"), (math.floor, "round down")):
        if all(got == _rounded(rounding, cost, B, comp) for got, (cost, B, comp) in zip(answers, cases)):
            return False, (f"you {words}: 3.2 batches' worth of loading per compute time needs 4 workers, not 3 -- "
                           "a fraction of a worker's load still needs a whole worker, so round up (ceil).")
    for got, (cost, B, comp) in zip(answers, cases):
        want = _fewest(cost, B, comp)
        if got == want:
            continue
        data = cost * B
        if cost > 0 and got == _fewest(cost, 1, comp):
            return False, "the cost is per *sample*: one batch costs cost × micro_batch ms"
        if cost == 0 and got != 0:
            return False, "with no data cost at all, no workers are needed"
        if want == 0:
            return False, (f"cost {cost} ms × {B} samples = {data:g} ms of loading against {comp} ms of compute: "
                           f"that is under 5% of the step already, so 0 workers suffice (you return {got})")
        where = f"cost {cost} ms/sample, micro-batch {B}, compute {comp} ms: you return {got:g}"
        if got > want:
            return False, (f"{where}, more workers than needed: fewer already keep the wait under 5 % of the step "
                           "(or at no wait at all), and each extra one costs a core and memory.")
        return False, (f"{where}, too few. w workers deliver a batch every (load time per batch) / w ms, and the "
                       "model needs one every compute time: find the fewest that keep the wait under 5 % of the step.")
    return True, ("right, by the 5% rule: the smallest w whose data time per batch / w stays under compute / 0.95 "
                  "(0 if loading is tiny). The rule of thumb ⌈load / compute⌉ passes too; it never lets the model wait.")
