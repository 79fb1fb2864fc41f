"""Checkers for chapter 02, mixed precision: what fp16 flushes to zero, a loss scaler against
torch.amp.GradScaler, and a bf16 update with accumulation under DDP (run in a process group of one).
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import math
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ..base import runtime
from ..base.compat import need
from ..base.errors import RunError
from ..engine import ddp as ddp_mod
from ..engine.config import ModelSpec
from ..engine.model import GPT
from ._core import AnswerError, NotAttempted, a_function, checker, given, number, returned, shielded
from .accumulation import _counting_forwards, _one_big_forward, accumulate_hint

__all__ = ["fp16_flush_fraction", "loss_scaler", "fixed_training_loop"]


def _log_uniform(n=20_000, lo=-12, hi=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    mag = 10 ** (lo + (hi - lo) * torch.rand(n, generator=g))
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x = sign * mag
    x[:200] = 0.0  # some exact zeros: they do not "flush", they already are zero
    return x


@checker
def fp16_flush_fraction(fn):
    """fn(g) -> fraction of g's elements that are non-zero in fp32 but become 0 in fp16."""
    a_function(fn)
    tensors = [_log_uniform(lo=lo, hi=hi, seed=seed) for seed, (lo, hi) in enumerate(((-12, 0), (-9, -3), (-6, 2)))]
    answers = [returned(fn(g.clone()), "return a fraction between 0 and 1") for g in tensors]  # before any count
    for g, got in zip(tensors, answers):
        want = float(((g != 0) & (g.half() == 0)).float().mean())
        if abs(got - want) > 2e-4:
            a = g.abs()
            tiny = float(((a > 0) & (a < torch.finfo(torch.float16).tiny)).float().mean())
            if abs(got - tiny) < 2e-3:
                hint = ("you counted everything below fp16's smallest *normal* number (6.1e-5). Below it fp16 "
                        "still has subnormals, down to 2^-24 ≈ 6e-8: only values below about half of that "
                        "become 0. Let fp16 itself decide: a cast shows which values it cannot hold.")
            elif abs(got - float((g.half() == 0).float().mean())) < 2e-4:
                hint = "values that were already exactly 0 do not flush: leave them out of the count."
            elif 1.0 < got <= 100.0:
                hint = "give a fraction (0.012), not a percentage."
            else:
                hint = ("which values does fp16 turn into 0 that were not 0 before? Count those, as a share of "
                        "all the elements.")
            return False, f"on a test tensor you return {got:.4g}, expected {want:.4g}. {hint}"
    return True, "right: non-zero values below about 3e-8 (half of fp16's smallest subnormal) round to 0."


def _scaler_run(cls, kw, flags) -> list:
    """(take the step?, scale) after each update of the learner's scaler, as plain values."""
    s = cls(**kw)
    given(getattr(s, "scale", None))
    seen = []
    for i, inf in enumerate(flags):
        take = s.update(inf)
        if take is None:
            raise NotAttempted() if i == 0 and s.scale == kw["init_scale"] else TypeError(
                "update() must return True (take the step) or False (skip it)")
        seen.append((bool(take), number(s.scale, "keep a number in .scale", "your scaler's .scale is")))
    return seen


def _gradscaler_trace(flags, init_scale, growth_factor, backoff_factor, growth_interval):
    """What torch.amp.GradScaler really does for a sequence of overflow flags: (scale after each
    update, whether the optimizer step was taken)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    need("GradScaler")  # torch >= 2.3: a clear message on an older one
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth_factor,
                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
    scales, taken = [], []
    for inf in flags:
        scaler.scale(torch.ones(()))  # creates the scale tensor on first use
        before = p.detach().clone()
        p.grad = torch.full((1,), float("inf") if inf else 1.0)
        scaler.step(opt)
        scaler.update()
        scales.append(float(scaler.get_scale()))
        taken.append(not torch.equal(before, p.detach()))
        opt.zero_grad(set_to_none=True)
    return scales, taken


@checker
def loss_scaler(cls):
    """cls(init_scale, growth_factor, backoff_factor, growth_interval) with .scale and
    .update(found_inf) -> whether to take the optimizer step; compared with torch.amp.GradScaler."""
    a_function(cls, "a class")
    kw = dict(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    flags = [False, False, True, False, False, True, True, False, False, False, False, False, False, False, True,
             False, False, False]
    seen = _scaler_run(cls, kw, flags)  # the learner's scaler runs to the end before GradScaler's trace exists
    want_scales, want_taken = _gradscaler_trace(flags, **kw)
    for i, (inf, (take, scale)) in enumerate(zip(flags, seen)):
        history = ", ".join("inf" if f else "ok" for f in flags[:i + 1])
        if take != want_taken[i]:
            what = "skip" if not want_taken[i] else "take"
            return False, (f"update {i + 1} ({'overflow' if inf else 'finite gradients'}): GradScaler would "
                           f"{what} the optimizer step. Skip it exactly when the gradients hold inf/NaN.")
        if abs(scale - want_scales[i]) > 1e-9 * want_scales[i]:
            hint = ("after an overflow the scale is multiplied by backoff_factor *and* the count of good steps "
                    "starts again from 0" if scale > want_scales[i] else
                    "the scale grows by growth_factor only after growth_interval finite updates in a row")
            return False, (f"after updates [{history}] your scale is {scale:g}, GradScaler's is "
                           f"{want_scales[i]:g}. Hint: {hint}.")
    return True, "your scaler backs off, skips and grows exactly like torch.amp.GradScaler."


def _tiny_gpt():
    torch.manual_seed(0)
    return GPT(ModelSpec(n_layer=1, d_model=32, n_head=2, seq_len=16))


def _batches(updates, K, B=2, T=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randint(0, 256, (B, T), generator=g), torch.randint(0, 256, (B, T), generator=g))
             for _ in range(K)] for _ in range(updates)]


def _delta_error(model, ref, start):
    """Relative error of the learner's weight change against the reference's, and their norm ratio."""
    num = den = mine = 0.0
    for p, q, s in zip(model.parameters(), ref.parameters(), start):
        d_me, d_ref = (p.detach() - s).double(), (q.detach() - s).double()
        num += float((d_me - d_ref).pow(2).sum())
        den += float(d_ref.pow(2).sum())
        mine += float(d_me.pow(2).sum())
    return math.sqrt(num / den), math.sqrt(mine / den)


def inspect_update_loop(fn, K: int = 4, updates: int = 2, lr: float = 0.1) -> dict:
    """Run ``fn(ddp_model, optimizer, micro_batches)`` -- one optimizer update with bf16 autocast on the
    CPU -- under real DDP in a process group of one, with labkit's counting comm hook.

    Returns {"allreduce_per_update": [...], "grad_scalers": n created, "delta_error": relative error of
    the weight change against one big-batch update, "delta_ratio": its size relative to that,
    "forward_rows": per update, the rows each forward call of the model saw}.
    A GradScaler created with ``enabled=False`` (the AMP recipe's on/off switch) does nothing and is
    not counted. It takes labkit's one-run slot (a process has one default process group): while a run is
    going in this kernel the check says so and builds nothing.
    """
    with contextlib.ExitStack() as slot:
        try:
            slot.enter_context(runtime.one_run(_BUSY))
        except RunError as e:  # not the learner's fault: said as it is, not as a crash in their code
            raise AnswerError(str(e)) from None
        if dist.is_initialized():
            raise AnswerError("a process group already exists in this kernel (made outside labkit?): restart the "
                              "kernel, then run the check again")
        return _update_loop(fn, K, updates, lr)


_BUSY = "a training run is going in this kernel: wait for it to finish, then run the check again"


def _update_loop(fn, K: int, updates: int, lr: float) -> dict:
    """inspect_update_loop's work, run while it holds the one-run slot."""
    model = _tiny_gpt()
    start = [p.detach().clone() for p in model.parameters()]
    data = _batches(updates, K)
    created = []
    real_init = torch.amp.GradScaler.__init__

    def spy(self, *a, **kw):  # every GradScaler (torch.amp, torch.cpu.amp, torch.cuda.amp) passes here
        # the `enabled` argument as written, not is_enabled(): a CUDA scaler switches itself off on a
        # machine without CUDA, and that must not turn a wrong answer into a right one here
        try:
            enabled = inspect.signature(real_init).bind(self, *a, **kw).arguments.get("enabled", True)
        except TypeError:
            enabled = True
        if enabled is not False:
            created.append(type(self).__name__)
        real_init(self, *a, **kw)

    rounds, forwards = [], []
    net = None
    with shielded():  # the time limit must not cut the group's set-up half-way
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        net = DDP(model)
        state = ddp_mod.CommCounter()
        net.register_comm_hook(state, ddp_mod.counting_hook)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        torch.amp.GradScaler.__init__ = spy
        for u in range(updates):
            before = len(state.rounds)
            with _counting_forwards(model) as rows:
                fn(net, opt, data[u])
            rounds.append(len(state.rounds) - before)
            forwards.append(rows)
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)  # the learner's frames hold ``net`` too: freed below, not later
        raise
    finally:
        torch.amp.GradScaler.__init__ = real_init
        net = None  # free DDP's reducer before its process group
        with shielded():  # nor its teardown: a group left behind would break every later check
            gc.collect()
            dist.destroy_process_group()
    ref = _tiny_gpt()  # only now, from the same start: nothing to compare with existed while the learner's code ran
    with torch.no_grad():
        for q, s in zip(ref.parameters(), start):
            q.copy_(s)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for u in range(updates):  # the same updates as one big batch each, no DDP
        x = torch.cat([b[0] for b in data[u]])
        y = torch.cat([b[1] for b in data[u]])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ref(x, y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    err, ratio = _delta_error(model, ref, start)
    return {"allreduce_per_update": rounds, "grad_scalers": len(created), "delta_error": err,
            "delta_ratio": ratio, "K": K, "forward_rows": forwards, "micro_batch": int(data[0][0][0].shape[0])}


@checker
def fixed_training_loop(fn):
    """fn(ddp_model, optimizer, micro_batches): one bf16 update with accumulation under DDP --
    one AllReduce per update, no (enabled) GradScaler, K forward passes of one micro-batch each, and the
    same weights as one big-batch update."""
    if not callable(fn):
        a_function(fn)
    r = inspect_update_loop(fn)
    K = r["K"]
    if not r["grad_scalers"] and not any(r["allreduce_per_update"]) and r["delta_ratio"] < 1e-12:
        raise NotAttempted()  # the body is still `...`: nothing ran
    if r["grad_scalers"]:
        # Not "it skips steps on overflow": with bf16 there is no overflow for it to catch. Its real
        # costs are a sync every step and silently skipped steps when something truly diverges.
        return False, ("a GradScaler was created. bf16 has fp32's 8 exponent bits (range up to about 3e38, "
                       "normal numbers down to about 1e-38), so its gradients neither overflow nor flush to zero "
                       "the way fp16's do: the scaler has nothing to rescue. It still costs you: its inf/NaN "
                       "check makes the host wait for the device every step (a host-device synchronisation), and "
                       "a step that hits a genuine inf/NaN is skipped silently while the scale shrinks, which "
                       "hides a diverging run. Drop it (or create it with enabled=False) and call "
                       "loss.backward() and optimizer.step().")
    for rows in r["forward_rows"]:
        big = _one_big_forward(rows, K, r["micro_batch"])
        if big:
            return False, big
    calls = r["allreduce_per_update"]
    # each figure once: "4 in each of the 2 updates", not the list [4, 4] (read as 8 calls)
    said = (f"{calls[0]} in each of the {len(calls)} updates" if len(set(calls)) == 1
            else ", ".join(map(str, calls)) + " in its updates")
    if any(c == 0 for c in calls):
        return False, (f"AllReduce calls per update: {said}. An update without any AllReduce leaves every "
                       "rank with its own gradients: the *last* micro-batch's backward must run outside no_sync().")
    if any(c != 1 for c in calls):
        return False, (f"AllReduce calls per update: {said}, with K={K} micro-batches. Every micro-batch whose "
                       "forward pass runs outside no_sync() all-reduces its gradients in backward (DDP decides in "
                       "the forward whether the backward will synchronise): the micro-batches that must not "
                       "communicate need their forward *and* backward inside DDP's context for that.")
    if r["delta_ratio"] < 1e-6:
        return False, "the weights did not change: call optimizer.step() once per update, after the K micro-batches."
    if r["delta_error"] > 0.05:
        if abs(r["delta_ratio"] - K) < 0.1 * K:
            hint = f"the update is {K}× too large: divide each micro-batch's loss by K before backward()."
        else:
            hint = accumulate_hint()
        return False, (f"one AllReduce per update and no scaler -- good -- but the weights differ from one "
                       f"big-batch update by {100 * r['delta_error']:.0f}%. {hint}")
    return True, (f"one AllReduce per update (instead of {K}), no GradScaler with bf16, and the weights match "
                  f"one big-batch update (difference {100 * r['delta_error']:.2f}%, bf16 rounding).")
