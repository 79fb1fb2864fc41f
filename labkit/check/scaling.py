"""Checkers for chapters 04-06: activation checkpointing, the data loader, DDP and AllReduce.

Each returns ``(passed, message)``; the ``checker`` decorator turns a placeholder answer into 'not
attempted' and any exception into a failing result with a hint. Hints name the usual mistake.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import warnings

import torch
import torch.distributed as dist
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel as DDP

from ..chapters import loaderlab, memtrace
from ..base import runtime
from ._core import NotAttempted, checker, describe, number, shielded, unchanged
from .basics import _counting_forwards, _one_big_forward
from ..engine.config import ModelSpec
from ..engine.measure import count_flops, formula_flops_per_token
from ..engine.model import Block, GPT
from ..chapters.netmodel import allreduce_calls, ring_allreduce_s

__all__ = [
    # 04 activation checkpointing
    "checkpoint_blocks", "checkpoint_budget", "checkpoint_overhead",
    # 05 data loader
    "ideal_step", "wait_fraction", "fewest_workers",
    # 06 DDP and AllReduce
    "counting_hook", "predict_allreduce_calls", "fix_no_sync", "ring_allreduce_time",
]


def _close(a, b, rel=1e-6, abs_=1e-12) -> bool:
    """``a``: what the learner's function returned -- a str or a list there is the answer's fault, said so."""
    if a is None or b is None:
        return False
    a = number(a, "return a number", "your function returned")
    return math.isclose(a, float(b), rel_tol=rel, abs_tol=abs_)


def _got(value):
    """What the learner's function returned, as a plain number (None stays None: 'not attempted' is told apart)."""
    return None if value is None else number(value, "return a number", "your function returned")


def _plain(value):
    """A count the learner's code left, as a plain int or float (anything else as its repr, which no count equals)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return int(value) if float(value).is_integer() else float(value)
    return None if value is None else repr(value)


def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB"


# ================================================================================================
# 04 -- activation checkpointing
# ================================================================================================

def _tiny_spec():
    return ModelSpec(n_layer=2, d_model=64, n_head=4, seq_len=64)


def _unanswered_if_none(fn, *args):
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
    trace = memtrace.trace_model(model, idx, tgt)
    grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    return grads, trace.kept_bytes()


@checker
def checkpoint_blocks(wrap):
    """``wrap(block, x)`` must return the block's output, computed so that the block keeps only its input
    for backward: the same gradients as running the block plainly, and less activation memory."""
    if not callable(wrap):
        return False, "pass your function itself (e.g. `lk.check.checkpoint_blocks(run_block)`), not its result"
    _unanswered_if_none(wrap, *_one_block())
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
    return loaderlab.ideal_step_s(data_s, compute_s, workers)


@checker
def ideal_step(fn):
    """``fn(data_s, compute_s, workers)``: step time when ``workers`` processes prepare batches in parallel
    with the model (each worker makes a whole batch in ``data_s``) and nothing else competes for cores."""
    if not callable(fn):
        return False, "pass your function itself, e.g. `lk.check.ideal_step(ideal_step_s)`"
    _unanswered_if_none(fn, 0.3, 0.2, 1)
    try:
        got0 = _got(fn(0.3, 0.2, 0))
    except ZeroDivisionError:
        return False, ("workers=0 divides by zero: with no workers the main process loads each batch itself, "
                       "so data time and compute time add up")
    cases = [(0.3, 0.2, 1), (0.3, 0.2, 2), (0.9, 0.2, 3), (0.1, 0.2, 1), (0.5, 0.1, 4), (1.0, 0.2, 8)]
    answers = [_got(fn(d, c, w)) for d, c, w in cases]  # every answer before any right one is worked out
    if not _close(got0, _ideal(0.3, 0.2, 0)):
        return False, f"with 0 workers, data 0.3 s + compute 0.2 s should take 0.5 s per step; you return {got0}"
    for (d, c, w), got in zip(cases, answers):
        want = _ideal(d, c, w)
        if not _close(got, want):
            if _close(got, d / w + c):
                return False, ("with workers the loading happens *while* the model computes: the two overlap, so "
                               "the step takes the longer of the two, not their sum")
            if _close(got, max(d, c)):
                return False, "w workers each make a batch in data_s, together one every data_s / w seconds"
            return False, f"data {d} s, compute {c} s, {w} worker(s): expected {want:.3g} s, you return {got}"
    return True, "right: max(compute, data / workers) with workers, data + compute without."


@checker
def wait_fraction(fn):
    """``fn(records)``: the share of the run's time spent waiting for data, from per-update records
    with ``data_wait_s`` and ``step_time_s``."""
    if not callable(fn):
        return False, "pass your function itself, e.g. `lk.check.wait_fraction(my_wait_fraction)`"
    recs = [{"data_wait_s": 0.9, "step_time_s": 1.0, "compute_s": 0.1},
            {"data_wait_s": 0.0, "step_time_s": 3.0, "compute_s": 3.0},
            {"data_wait_s": 0.1, "step_time_s": 1.0, "compute_s": 0.9}]
    _unanswered_if_none(fn, [dict(r) for r in recs])
    got, got_idle = _got(fn([dict(r) for r in recs])), _got(fn([dict(recs[1])]))  # both before the answer exists
    want = sum(r["data_wait_s"] for r in recs) / sum(r["step_time_s"] for r in recs)
    if _close(got, want, rel=1e-3):
        if not _close(got_idle, 0.0, abs_=1e-9):
            return False, "a run that never waits should give 0"
        return True, "right: total wait over total time (long updates weigh more than short ones)."
    mean_ratio = sum(r["data_wait_s"] / r["step_time_s"] for r in recs) / len(recs)
    if _close(got, mean_ratio, rel=1e-3):
        return False, ("that is the mean of per-update fractions, which lets a short update count as much as a long "
                       "one. Divide the total wait by the total time.")
    if _close(got, 1.0 / 4.0, rel=1e-3):
        return False, "that is wait / compute; the fraction is of the whole step time (wait + compute + optimizer)"
    if _close(got, 100 * want, rel=1e-3):
        return False, "return a fraction (0.2), not a percentage (20)"
    return False, f"for these three records the answer is {want:g}; you return {got}"


def _fewest(cost_ms, micro_batch, compute_ms, limit=0.05):
    return loaderlab.fewest_workers(cost_ms, micro_batch, compute_ms, limit)


def _no_wait(cost_ms, micro_batch, compute_ms):
    """The interview question's rule: workers >= load time / compute time per batch (0 without loading)."""
    data = cost_ms * micro_batch
    return 0 if data <= 0 else math.ceil(data / compute_ms - 1e-9)


@checker
def fewest_workers(fn):
    """``fn(cost_ms_per_sample, micro_batch, compute_ms_per_batch)``: the fewest loader workers that keep data
    wait under 5% of the step, under the ideal model (workers never compete with the model for cores)."""
    if not callable(fn):
        return False, "pass your function itself, e.g. `lk.check.fewest_workers(fewest_workers)`"
    _unanswered_if_none(fn, 2.0, 8, 10.0)
    cases = [(2.0, 8, 10.0), (0.0, 8, 10.0), (0.02, 8, 10.0), (2.0, 8, 40.0), (1.0, 32, 10.0), (4.0, 16, 20.0),
             (2.0, 8, 15.9), (5.0, 8, 9.0)]
    answers = [_got(fn(cost, B, comp)) for cost, B, comp in cases]
    # Two rules are right. The exercise's: the fewest workers that keep the wait under 5% of the step. The
    # rule of thumb the interview question teaches: workers >= load time / compute time per batch, i.e.
    # ceil(load / compute) -- no wait at all, sometimes one worker more than the 5% knee needs.
    if all(got == _no_wait(cost, B, comp) for got, (cost, B, comp) in zip(answers, cases)) and \
            any(got != _fewest(cost, B, comp) for got, (cost, B, comp) in zip(answers, cases)):
        return True, ("right, by the rule of thumb workers = ⌈load time per batch / compute time per batch⌉ (no data "
                      "wait at all). The exercise's 5% knee sometimes needs one worker fewer: a wait of a few per "
                      "cent is allowed -- e.g. 2 ms × 8 samples against 15.9 ms of compute: 1 worker waits 0.6%.")
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


# ================================================================================================
# 06 -- DDP and AllReduce
# ================================================================================================

def _twin_group_class():
    class _Done(dist._Work):
        def __init__(self, result):
            super().__init__()
            self.result_ = result

        def wait(self, timeout=None):
            return True

        def get_future(self):
            f = Future()
            f.set_result(self.result_)
            return f

    class TwinGroup(dist.ProcessGroup):
        """``world`` ranks that all computed exactly this rank's gradients: an AllReduce sum is world × the
        local tensor. A hook that averages therefore gives back the local gradient; one that only sums gives
        world × it. Every collective is counted, with its bytes."""

        current = None

        def __init__(self, rank, world):
            super().__init__(rank, world)
            self.calls, self.bytes, self.when = 0, 0, []
            self.clock = lambda: None
            TwinGroup.current = self

        def getBackendName(self):
            return "labkit_twins"

        def allreduce(self, tensors, opts=None):
            self.calls += 1
            self.when.append(self.clock())
            for t in tensors:
                self.bytes += t.numel() * t.element_size()
                t.mul_(self.size())
            return _Done(tensors)

        def broadcast(self, tensors, opts=None):
            return _Done(tensors)

        def allgather(self, outputs, inputs, opts=None):
            for outs, inp in zip(outputs, inputs):
                for o in outs:
                    o.copy_(inp)
            return _Done(outputs)

        def barrier(self, opts=None):
            return _Done([])

    return TwinGroup


_TWIN = None


@contextlib.contextmanager
def twin_world(world_size: int = 2):
    """The default process group becomes ``world_size`` identical replicas inside this process (see
    TwinGroup). Held under the engine's one-run-per-process lock; torn down afterwards."""
    global _TWIN


    if _TWIN is None:
        _TWIN = _twin_group_class()
        dist.Backend.register_backend("labkit_twins", lambda store, rank, world, timeout: _TWIN(rank, world),
                                      devices=["cpu"])
    with runtime.one_run("a training run is going in this kernel: wait for it, then check again"):
        if dist.is_initialized():
            raise RuntimeError("a process group already exists in this kernel; restart the kernel and try again")
        with shielded():
            dist.init_process_group("labkit_twins", store=dist.HashStore(), rank=0, world_size=world_size)
        try:
            yield _TWIN.current
        finally:
            with shielded():
                dist.destroy_process_group()


def _ddp_tiny(bucket_cap_mb=0.1, seed=0, dtype=None):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(_tiny_spec())
    if dtype is not None:
        model.to(dtype)  # DDP's buckets take the parameters' dtype
    return model, DDP(model, bucket_cap_mb=bucket_cap_mb)


def _batches(n, seed=1, batch=2):
    g = torch.Generator().manual_seed(seed)
    T = _tiny_spec().seq_len
    return [(torch.randint(0, 256, (batch, T), generator=g), torch.randint(0, 256, (batch, T), generator=g))
            for _ in range(n)]


def _reference_grads(batches, K, seed=0):
    """Gradients of the mean loss over K micro-batches on a plain model: what one synced update must give."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(_tiny_spec())
    for x, y in batches[:K]:
        (model(x, y) / K).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _grad_gap(model, ref):
    worst = 0.0
    for n, p in model.named_parameters():
        if p.grad is None:
            return float("inf"), n
        worst = max(worst, float((p.grad - ref[n]).abs().max() / (ref[n].abs().max() + 1e-12)))
    return worst, None


@checker
def counting_hook(hook):
    """``hook(state, bucket)`` for ``ddp.register_comm_hook(state, hook)``: counts ``state["calls"]`` and
    ``state["bytes"]`` for every AllReduce it launches and returns a future of the *averaged* gradients.
    Checked on two replicas (an in-process stand-in for a 2-process group)."""
    if not callable(hook):
        return False, "pass your hook function itself, e.g. `lk.check.counting_hook(my_hook)`"
    batches = _batches(1)
    returned_none = []

    def guarded(state, bucket):
        out = hook(state, bucket)
        if out is None:  # the skeleton's `...`: keep DDP going, report 'not attempted' afterwards

            returned_none.append(True)
            out = torch.futures.Future()
            out.set_result(bucket.buffer())
        return out

    def one_update(dtype=None):
        """One typical update (DDP's first iteration uses one bucket for everything; the second is
        typical) with the hook; the model's parameters in ``dtype`` when given, so its buckets are too.
        The group's own count is read once the hook is done: no frame the hook can walk up to holds it."""
        with twin_world(2):
            model, ddp = _ddp_tiny(dtype=dtype)
            state = {"calls": 0, "bytes": 0}
            ddp.register_comm_hook(state, guarded)
            for _ in range(2):
                model.zero_grad(set_to_none=True)
                state["calls"], state["bytes"] = 0, 0
                _TWIN.current.calls, _TWIN.current.bytes = 0, 0
                x, y = batches[0]
                ddp(x, y).backward()
            del ddp
        return ({k: _plain(state.get(k)) for k in ("calls", "bytes")}, _TWIN.current.calls, _TWIN.current.bytes,
                model)

    # both updates before anything is unpacked: while the fp16 one runs, no local holds the fp32 one's count
    (state, real_calls, real_bytes, model), (state16, calls16, bytes16, _) = [one_update(), one_update(torch.float16)]
    gap, missing = _grad_gap(model, _reference_grads(batches, 1))
    if returned_none:
        raise NotAttempted()
    if real_calls == 0:
        return False, ("your hook never launched a collective, so the replicas never exchange gradients. A comm hook "
                       "returns the future of an AllReduce of the bucket's buffer (torch.distributed's "
                       "default_hooks has one to build on).")
    if missing:
        return False, f"parameter {missing} has no gradient after backward: return the future of the bucket's buffer"
    if abs(gap - 1.0) < 1e-3:
        return False, ("the gradients come back summed over the 2 replicas, not averaged: every replica must end "
                       "with the mean of the gradients")
    if gap > 1e-4:
        return False, f"the gradients differ from the averaged ones (relative gap {gap:.2g})"
    if state.get("calls") != real_calls:
        return False, (f"DDP launched {real_calls} AllReduce calls in one update, but state['calls'] says "
                       f"{state.get('calls')}: add 1 every time the hook runs (it runs once per bucket)")
    if state.get("bytes") != real_bytes:
        if isinstance(state.get("bytes"), int) and state["bytes"] and real_bytes == 4 * state["bytes"]:
            return False, "that counts elements, not bytes: how many bytes does each element of the buffer take?"
        return False, (f"{real_bytes} bytes went through AllReduce, state['bytes'] says {state.get('bytes')}: count "
                       "the bytes of the bucket's buffer each time the hook runs")
    # The same with fp16 buckets -- what goes through AllReduce under the fp16-compression hook, or with a
    # half-precision model: 2 bytes per element, so `numel() * 4` counts twice the bytes sent.
    if state16.get("calls") != calls16:
        return False, (f"with fp16 gradients DDP launched {calls16} AllReduce calls, but state['calls'] says "
                       f"{state16.get('calls')}: add 1 every time the hook runs")
    if state16.get("bytes") != bytes16:
        if state16.get("bytes") == 2 * bytes16:
            return False, ("right for fp32 buckets, but with fp16 ones (the fp16-compression hook of this chapter, or a "
                           f"half-precision model) {bytes16} bytes went through AllReduce and state['bytes'] says "
                           f"{state16.get('bytes')}: `numel() * 4` assumes 4-byte elements; a tensor's "
                           "element_size() says how many bytes each of its elements takes.")
        return False, (f"with fp16 buckets {bytes16} bytes went through AllReduce, state['bytes'] says "
                       f"{state16.get('bytes')}: count the bytes of the bucket's buffer each time the hook runs")
    return True, (f"right: {real_calls} calls and {real_bytes} bytes in one update (the tiny check model in "
                  f"buckets of 0.1 MB), {bytes16} bytes with fp16 buckets (element_size() 2), and the gradients "
                  "come back averaged.")


@checker
def predict_allreduce_calls(answer, n_buckets, accum, ddp_sync, world_size=1):
    """``answer``: AllReduce calls each GPU launches per optimizer update."""
    a = number(answer, "give a whole number of calls")
    a = int(a) if a == int(a) else a
    right = allreduce_calls(n_buckets, accum, ddp_sync)
    if a == right:
        return True, (f"right: {n_buckets} bucket(s) × {accum if ddp_sync == 'every_micro' else 1} synchronisation(s) "
                      f"per update = {right}, on every one of the {world_size} GPU(s).")
    if world_size > 1 and a == right * world_size:
        return False, "calls are counted per GPU: every GPU launches the same calls together; world size does not multiply them"
    if ddp_sync == "no_sync" and a == n_buckets * accum:
        return False, "with no_sync the first K-1 micro-batches skip the AllReduce: only the last one synchronises"
    if ddp_sync == "every_micro" and a == n_buckets:
        return False, "every_micro synchronises after each of the K micro-batches, not once per update"
    if a in (accum, 1) and n_buckets > 1:
        return False, f"each synchronisation launches one AllReduce per bucket ({n_buckets} buckets here)"
    return False, (f"not quite (you wrote {a:g}): how many buckets does each synchronisation send, and how many "
                   "synchronisations does one update make?")


# The code exercise-06 hands out to be fixed, exactly as in the notebook (a test keeps the two the
# same): it runs, so only comparing with it tells an untouched exercise from a wrong fix. No docstring:
# that would be one more constant than the notebook's function has.
def _fix_no_sync_start(ddp_model, batches, K):
    for k in range(K):
        x, y = next(batches)
        loss = ddp_model(x, y) / K
        loss.backward()  # DDP all-reduces the gradients here -- after every micro-batch


@checker
def fix_no_sync(fn):
    """``fn(ddp_model, batches, K)``: forward+backward K micro-batches (``x, y = next(batches)``,
    ``loss = ddp_model(x, y)``) so that gradients add up locally and DDP synchronises once, at the last one --
    K forward passes of one micro-batch each, not one over the concatenated micro-batches."""
    if not callable(fn):
        return False, "pass your function itself, e.g. `lk.check.fix_no_sync(accumulate)`"
    if unchanged(fn, _fix_no_sync_start):
        raise NotAttempted("fix the function in the cell above (it still synchronises after every "
                           "micro-batch), then run this cell again")
    K = 4
    batches = _batches(2 * K)
    with twin_world(2) as group:
        model, ddp = _ddp_tiny()
        pos = {"k": -1}
        group.clock = lambda: pos["k"]

        def feed(bs):
            for b in bs:
                pos["k"] += 1
                yield b

        fn(ddp, feed(batches[:K]), K)  # update 1 (DDP's single-bucket first iteration)
        if pos["k"] == -1:
            del ddp
            raise NotAttempted()  # the skeleton's `...` takes no batch at all
        model.zero_grad(set_to_none=True)
        group.calls, group.when, pos["k"] = 0, [], -1

        with _counting_forwards(model) as rows:
            fn(ddp, feed(batches[K:]), K)
        calls, when = group.calls, list(group.when)
        del ddp
    gap, missing = _grad_gap(model, _reference_grads(batches[K:], K))  # only once the learner's code is done
    if pos["k"] + 1 != K:
        return False, f"the loop should take exactly K={K} micro-batches from `batches`; it took {pos['k'] + 1}"
    big = _one_big_forward(rows, K, int(batches[0][0].shape[0]))
    if big:
        return False, big
    if calls == 0:
        return False, ("no AllReduce at all: the last micro-batch must run *outside* no_sync, or the replicas never "
                       "exchange gradients and drift apart")
    if missing:
        return False, f"parameter {missing} has no gradient: call backward() on every micro-batch's loss"
    if set(when) != {K - 1}:
        per = sorted(set(when))
        if len(per) == K:
            return False, (f"DDP synchronised after every micro-batch ({calls} calls for K={K}). DDP decides in each "
                           "forward whether that micro-batch's backward will synchronise: which of its context "
                           "managers skips it, and around which micro-batches' forward and backward?")
        return False, (f"AllReduce ran during micro-batch(es) {[k + 1 for k in per]} of {K}: it must run only in the "
                       "last one, after every local gradient has been added (no_sync on the first K-1)")
    if abs(gap - (K - 1)) < 1e-2 * K:
        return False, "the gradients are K× too large: divide each micro-batch's loss by K (an average, not a sum)"
    if gap > 1e-4:
        return False, f"the gradients differ from one big batch's (relative gap {gap:.2g}); use loss / K each time"
    return True, (f"right: {calls} AllReduce call(s) in the update, all in the last micro-batch (one per bucket), "
                  "and the gradients equal one big batch's.")


@checker
def ring_allreduce_time(fn):
    """``fn(nbytes, n, bandwidth, latency)``: seconds for a ring AllReduce of ``nbytes`` over ``n`` GPUs with
    ``bandwidth`` bytes/s per direction and ``latency`` seconds per ring step."""
    if not callable(fn):
        return False, "pass your function itself, e.g. `lk.check.ring_allreduce_time(ring_time)`"
    _unanswered_if_none(fn, 1e9, 8, 50e9, 0.0)
    cases = [(1e9, 8, 50e9, 0.0), (1e9, 2, 50e9, 0.0), (4e8, 64, 450e9, 5e-6), (1e6, 512, 3.125e9, 30e-6),
             (1e9, 1, 50e9, 5e-6)]
    answers = [_got(fn(*case)) for case in cases]  # every answer before any right one is worked out
    for (nb, n, bw, lat), got in zip(cases, answers):
        want = ring_allreduce_s(nb, n, bw, lat)
        if _close(got, want, rel=1e-6, abs_=1e-15):
            continue
        if n == 1:
            return False, "one GPU has nobody to talk to: the AllReduce takes 0 s"
        if _close(got, 2 * nb / bw + 2 * (n - 1) * lat):
            return False, "each GPU sends 2·(N-1)/N of the bytes, not 2×: the (N-1)/N factor is missing"
        if _close(got, (n - 1) / n * nb / bw + (n - 1) * lat) or _close(got, (n - 1) / n * nb / bw + 2 * (n - 1) * lat):
            return False, "a ring AllReduce is two passes (reduce-scatter, then all-gather): factor 2"
        if _close(got, ring_allreduce_s(nb, n, bw, 0.0)) and lat:
            return False, "the latency term is missing: 2·(N-1) ring steps each pay the latency"
        if _close(got, ring_allreduce_s(nb, n, bw / 8, lat)) or _close(got, ring_allreduce_s(nb, n, bw * 8, lat)):
            return False, "bits and bytes: the bandwidth is already in bytes per second"
        return False, f"{nb:g} bytes, {n} GPUs, {bw:g} B/s, {lat:g} s: expected {want:.4g} s, you return {got}"
    return True, "right: 2·(N-1)/N · bytes / bandwidth + 2·(N-1) · latency."
