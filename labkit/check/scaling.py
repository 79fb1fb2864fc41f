"""Checkers for chapters 04-05: activation checkpointing and the data loader.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..base import phrases
from ..tools import memory, timing
from ..engine.config import ModelSpec
from ..engine.measure import count_flops, formula_flops_per_token
from ..engine.model import Block, GPT
from ._core import checker, describe, near, not_attempted_if_none, number, number_or_none

__all__ = ["checkpoint_blocks", "checkpoint_budget", "checkpoint_overhead",  # 04 activation checkpointing
           "ideal_step", "wait_fraction", "fewest_workers"]  # 05 data loader


# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 04
WORDS04 = phrases.load_section("lab_messages.md", "Checks: chapter 04", {
    "blocks-callable": (), "blocks-no-grad": ("count", "name"), "blocks-differ": ("worst",),
    "blocks-saved": ("kept", "plain"), "blocks-right": ("kept", "plain", "share"),
    "budget-names": ("names",), "budget-names-got": ("answer", "names"), "budget-none": (),
    "budget-over": ("answer", "kept", "budget"), "budget-right": ("answer", "kept", "budget"),
    "budget-more": ("answer", "extra"),
    "overhead-percent": ("answer",), "overhead-right": ("right", "naive"),
    "overhead-textbook": ("answer", "naive", "pct"),
    "overhead-high": (), "overhead-below-one": (), "overhead-none": (), "overhead-other": ()})

# ## Checks: chapter 05: this module's data-loader checkers and profiling.loader_reading's sentences (one section,
# one spec: a section is read against the whole list of its keys)
WORDS05 = phrases.load_section("lab_messages.md", "Checks: chapter 05", {
    "ideal-callable": (), "ideal-divides": (), "ideal-zero": ("got",), "ideal-sum": ("em",), "ideal-max": (),
    "ideal-wrong": ("data", "compute", "workers", "want", "got"), "ideal-right": (),
    "wait-callable": (), "wait-idle": (), "wait-right": (), "wait-mean": (), "wait-seconds": (), "wait-compute": (),
    "wait-percent": (), "wait-wrong": ("want", "got"),
    "fewest-callable": (), "fewest-thumb": (), "round-nearest": (), "round-down": (), "fewest-rounded": ("how",),
    "fewest-per-sample": ("em",), "fewest-no-cost": (),
    "fewest-zero": ("cost", "micro_batch", "data", "compute", "got"),
    "fewest-many": ("cost", "micro_batch", "compute", "got"), "fewest-few": ("cost", "micro_batch", "compute", "got"),
    "fewest-right": (),
    # profiling.loader_reading
    "reading-test-right": (), "reading-runs": (), "reading-test-wrong": ("loads", "hint"),
    "reading-no-runs": ("runs",),
    "reading-workers": (), "source-function": (), "source-answer": (), "reading-dict": ("source", "keys"),
    "reading-three": ("source", "value"), "workers-whole": (), "workers-floor": ("load", "compute", "workers", "every"),
    "workers-inverted": (), "workers-zero": (), "workers-more": ("workers", "most", "compute"), "workers-how": (),
    "test-seconds": (), "test-whole": (), "test-total": (), "test-warmup": (), "test-load": ("load", "got"),
    "test-compute-only": (), "test-with-wait": (), "test-compute": ("compute", "got"),
    "test-workers": ("workers", "load", "compute", "hint"),
    "runs-theirs": ("load", "compute", "updates", "low", "high"), "runs-seconds": (), "runs-per-sample": ("micro_batch",),
    "runs-load-hint": (), "runs-load": ("got", "tol", "theirs", "hint"), "runs-whole": (), "runs-compute-hint": (),
    "runs-compute": ("got", "tol", "theirs", "hint"), "runs-workers": ("load", "compute", "workers", "hint"),
    "runs-right": ("load", "compute", "workers", "theirs", "want", "knee"),
    # measurements: every measured check's file-borne messages (chapter 05's loader_reading is the first of mine)
    "no-entry": ("file",), "unreadable": ("no_entry", "file", "error"), "edited": (),
    "edited-entry": ("edited", "checker", "file"), "shape": (), "shape-what": ("shape", "what"),
    "where": ("file", "device", "time"), "unnamed-device": (), "unknown-time": (), "graded": ("message", "where"),
    "not-saved": ("message", "why"), "not-written": ("message", "file", "error")})


def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB"


# ---- 04 -- activation checkpointing --------------------------------------------------------------

def _tiny_spec():
    """The checks' model (chapter 06's too): small enough that two replicas' updates take well under a second."""
    return ModelSpec(n_layer=2, d_model=64, n_head=4, seq_len=64)


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
        return False, WORDS04.say("blocks-callable")
    not_attempted_if_none(wrap, *_one_block())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grads, kept = _grads_and_bytes(wrap)
    ref_grads, ref_bytes = _grads_and_bytes(None)  # only now: the learner's code finds no reference to read
    missing = [n for n, g in grads.items() if g is None and ref_grads[n] is not None]
    if missing:
        return False, WORDS04.say("blocks-no-grad", count=len(missing), name=missing[0])
    worst = max((float((grads[n] - g).abs().max() / (g.abs().max() + 1e-12)) for n, g in ref_grads.items()
                 if g is not None), default=0.0)
    if worst > 1e-4:
        return False, WORDS04.say("blocks-differ", worst=f"{worst:.2g}")
    if kept > 0.7 * ref_bytes:
        return False, WORDS04.say("blocks-saved", kept=_mib(kept), plain=_mib(ref_bytes))
    return True, WORDS04.say("blocks-right", kept=_mib(kept), plain=_mib(ref_bytes), share=f"{kept / ref_bytes:.0%}")


def _cheapest(options, budget):
    fits = [o for o in options if o["activation_bytes"] <= budget]
    # least recompute first (hardware FLOPs), then the option that keeps the most (recomputes the least)
    return min(fits, key=lambda o: (o["hardware_flops"], -o["activation_bytes"]), default=None)


@checker
def checkpoint_budget(answer, options, budget_bytes):
    """``answer``: the name of the option that fits ``budget_bytes`` of activation memory with the least
    recompute. ``options``: dicts with name, activation_bytes, hardware_flops (as the chapter measured)."""
    answer = str(answer) if isinstance(answer, str) else answer  # a plain str: no code of the answer's runs later
    names = [o["name"] for o in options]
    if answer not in names:
        listed = ", ".join(repr(n) for n in names)
        if isinstance(answer, str):
            return False, WORDS04.say("budget-names", names=listed)
        return False, WORDS04.say("budget-names-got", answer=describe(answer), names=listed)
    chosen = next(o for o in options if o["name"] == answer)
    best = _cheapest(options, budget_bytes)
    if best is None:
        return False, WORDS04.say("budget-none")
    if chosen["activation_bytes"] > budget_bytes:
        return False, WORDS04.say("budget-over", answer=repr(answer), kept=_mib(chosen["activation_bytes"]),
                                  budget=_mib(budget_bytes))
    if chosen is best or chosen["name"] == best["name"]:
        return True, WORDS04.say("budget-right", answer=repr(answer), kept=_mib(chosen["activation_bytes"]),
                                 budget=_mib(budget_bytes))
    extra = chosen["hardware_flops"] / best["hardware_flops"] - 1
    return False, WORDS04.say("budget-more", answer=repr(answer), extra=f"{extra:+.0%}")


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
        return False, WORDS04.say("overhead-percent", answer=f"{a:g}")
    # a deterministic FLOP count: only a learner's rounding or a dropped small term (attention's 4·L·d·T, the
    # LM head) moves a right prediction, by a few per cent at most
    if abs(a / right - 1) <= CHECKPOINT_OVERHEAD_TOLERANCE:
        return True, WORDS04.say("overhead-right", right=f"{right:.3f}", naive=f"{naive:.3f}")
    if abs(a / naive - 1) <= CHECKPOINT_OVERHEAD_TOLERANCE:
        return False, WORDS04.say("overhead-textbook", answer=f"{a:g}", naive=f"{naive:.3f}",
                                  pct=f"{100 * (naive / right - 1):.0f}")
    return False, WORDS04.say("overhead-high" if a >= 1.9 else "overhead-below-one" if a < 1.0
                              else "overhead-none" if a <= 1.05 else "overhead-other")


# ---- 05 -- the data loader -----------------------------------------------------------------------

@checker
def ideal_step(fn):
    """``fn(data_s, compute_s, workers)``: step time when ``workers`` processes prepare batches in parallel
    with the model (each worker makes a whole batch in ``data_s``) and nothing else competes for cores."""
    if not callable(fn):
        return False, WORDS05.say("ideal-callable")
    not_attempted_if_none(fn, 0.3, 0.2, 1)
    try:
        got0 = number_or_none(fn(0.3, 0.2, 0))
    except ZeroDivisionError:
        return False, WORDS05.say("ideal-divides")
    cases = [(0.3, 0.2, 1), (0.3, 0.2, 2), (0.9, 0.2, 3), (0.1, 0.2, 1), (0.5, 0.1, 4), (1.0, 0.2, 8)]
    answers = [number_or_none(fn(d, c, w)) for d, c, w in cases]  # every answer before any right one is worked out
    if not near(got0, timing.ideal_step_s(0.3, 0.2, 0)):
        return False, WORDS05.say("ideal-zero", got=f"{got0}")
    for (d, c, w), got in zip(cases, answers):
        want = timing.ideal_step_s(d, c, w)
        if not near(got, want):
            if near(got, d / w + c):
                return False, WORDS05.say("ideal-sum", em="*")
            if near(got, max(d, c)):
                return False, WORDS05.say("ideal-max")
            return False, WORDS05.say("ideal-wrong", data=f"{d}", compute=f"{c}", workers=f"{w}", want=f"{want:.3g}",
                                      got=f"{got}")
    return True, WORDS05.say("ideal-right")


@checker
def wait_fraction(fn):
    """``fn(records)``: the share of the run's time spent waiting for data, from per-update records
    with ``data_wait_s`` and ``step_time_s``."""
    if not callable(fn):
        return False, WORDS05.say("wait-callable")
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
            return False, WORDS05.say("wait-idle")
        return True, WORDS05.say("wait-right")
    mean_ratio = sum(r["data_wait_s"] / r["step_time_s"] for r in recs) / len(recs)
    total_wait = sum(r["data_wait_s"] for r in recs)
    mistakes = (("wait-mean", mean_ratio), ("wait-seconds", total_wait / len(recs)), ("wait-seconds", total_wait),
                ("wait-compute", total_wait / sum(r["compute_s"] for r in recs)), ("wait-percent", 100 * want))
    key = next((key for key, value in mistakes if near(got, value, rel=1e-3)), "wait-wrong")
    return False, WORDS05.say(key, want=f"{want:g}", got=f"{got}")


def _rounded(rounding, cost_ms, micro_batch, compute_ms):
    """Load time per batch / compute time, rounded by ``rounding`` (0 without loading): rounded up, the interview
    question's rule (workers >= load / compute); rounded down or to the nearest, its usual mistakes."""
    data = cost_ms * micro_batch
    return 0 if data <= 0 else int(rounding(data / compute_ms))


@checker
def fewest_workers(fn):
    """``fn(cost_ms_per_sample, micro_batch, compute_ms_per_batch)``: the fewest loader workers that keep data
    wait under 5% of the step, under the ideal model (workers never compete with the model for cores)."""
    if not callable(fn):
        return False, WORDS05.say("fewest-callable")
    not_attempted_if_none(fn, 2.0, 8, 10.0)
    cases = [(2.0, 8, 10.0), (0.0, 8, 10.0), (0.02, 8, 10.0), (2.0, 8, 40.0), (1.0, 32, 10.0), (4.0, 16, 20.0),
             (2.0, 8, 15.9), (5.0, 8, 9.0)]
    answers = [number_or_none(fn(cost, B, comp)) for cost, B, comp in cases]
    # Two rules are right. The exercise's: the fewest workers that keep the wait under 5% of the step. The
    # rule of thumb the interview question teaches: workers >= load time / compute time per batch, i.e.
    # ceil(load / compute) -- no wait at all, sometimes one worker more than the 5% knee needs.
    up = lambda x: math.ceil(x - 1e-9)  # noqa: E731
    if all(got == _rounded(up, cost, B, comp) for got, (cost, B, comp) in zip(answers, cases)) and \
            any(got != timing.fewest_workers(cost, B, comp) for got, (cost, B, comp) in zip(answers, cases)):
        return True, WORDS05.say("fewest-thumb")
    for rounding, words in ((round, "round-nearest"), (math.floor, "round-down")):
        if all(got == _rounded(rounding, cost, B, comp) for got, (cost, B, comp) in zip(answers, cases)):
            return False, WORDS05.say("fewest-rounded", how=WORDS05.say(words))
    for got, (cost, B, comp) in zip(answers, cases):
        want = timing.fewest_workers(cost, B, comp)
        if got == want:
            continue
        data = cost * B
        if cost > 0 and got == timing.fewest_workers(cost, 1, comp):
            return False, WORDS05.say("fewest-per-sample", em="*")
        if cost == 0 and got != 0:
            return False, WORDS05.say("fewest-no-cost")
        if want == 0:
            return False, WORDS05.say("fewest-zero", cost=f"{cost}", micro_batch=f"{B}", data=f"{data:g}",
                                      compute=f"{comp}", got=f"{got}")
        where = dict(cost=f"{cost}", micro_batch=f"{B}", compute=f"{comp}", got=f"{got:g}")
        return False, WORDS05.say("fewest-many" if got > want else "fewest-few", **where)
    return True, WORDS05.say("fewest-right")
