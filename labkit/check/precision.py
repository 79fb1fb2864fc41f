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

from ..base import phrases, runtime
from ..base.compat import need
from ..base.runtime import RunError
from ..engine import ddp as ddp_mod
from ..engine.config import ModelSpec
from ..engine.model import GPT
from ._core import AnswerError, NotAttempted, a_function, checker, given, number, returned, shielded
from .basics import _counting_forwards, _one_big_forward, accumulate_hint

__all__ = ["fp16_flush_fraction", "loss_scaler", "fixed_training_loop"]


# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 02
WORDS = phrases.load_section("lab_messages.md", "Checks: chapter 02", {
    "flush-normal": ("em",), "flush-zeros": (), "flush-percent": (), "flush-other": (),
    "flush-wrong": ("got", "want", "hint"), "flush-right": (), "overflow": (), "finite": (), "skip": (), "take": (),
    "scaler-step": ("update", "what", "action"), "scaler-backoff": ("em",), "scaler-growth": (),
    "scaler-scale": ("history", "scale", "want", "hint"), "scaler-right": (), "bf16-scaler": (),
    "each-update": ("calls", "updates"), "its-updates": ("calls",), "no-allreduce": ("said", "em"),
    "many-allreduce": ("said", "K", "em"), "no-change": (), "too-large": ("K",), "weights-differ": ("pct", "hint"),
    "loop-right": ("K", "pct")})


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
            a, zeros = g.abs(), float((g.half() == 0).float().mean())
            tiny = float(((a > 0) & (a < torch.finfo(torch.float16).tiny)).float().mean())
            mistakes = (("flush-normal", abs(got - tiny) < 2e-3), ("flush-zeros", abs(got - zeros) < 2e-4),
                        ("flush-percent", 1.0 < got <= 100.0))
            hint = WORDS.say(next((key for key, when in mistakes if when), "flush-other"), em="*")
            return False, WORDS.say("flush-wrong", got=f"{got:.4g}", want=f"{want:.4g}", hint=hint)
    return True, WORDS.say("flush-right")


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
            action = WORDS.say("skip" if not want_taken[i] else "take")
            return False, WORDS.say("scaler-step", update=i + 1, what=WORDS.say("overflow" if inf else "finite"),
                                    action=action)
        if abs(scale - want_scales[i]) > 1e-9 * want_scales[i]:
            hint = WORDS.say("scaler-backoff" if scale > want_scales[i] else "scaler-growth", em="*")
            return False, WORDS.say("scaler-scale", history=history, scale=f"{scale:g}", want=f"{want_scales[i]:g}",
                                    hint=hint)
    return True, WORDS.say("scaler-right")


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
    """Run ``fn(ddp_model, optimizer, micro_batches)`` -- one bf16-autocast update on the CPU -- under real DDP
    in a process group of one, with labkit's counting comm hook. Returns {"allreduce_per_update": [...],
    "grad_scalers": n created (not one made with ``enabled=False``), "delta_error" and "delta_ratio": the weight
    change against one big-batch update's, "forward_rows": per update, the rows of each forward call}. It takes
    labkit's one-run slot (a process has one default process group)."""
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
        return False, WORDS.say("bf16-scaler")
    for rows in r["forward_rows"]:
        big = _one_big_forward(rows, K, r["micro_batch"])
        if big:
            return False, big
    calls = r["allreduce_per_update"]
    # each figure once: "4 in each of the 2 updates", not the list [4, 4] (read as 8 calls)
    said = (WORDS.say("each-update", calls=calls[0], updates=len(calls)) if len(set(calls)) == 1
            else WORDS.say("its-updates", calls=", ".join(map(str, calls))))
    if any(c == 0 for c in calls):
        return False, WORDS.say("no-allreduce", said=said, em="*")
    if any(c != 1 for c in calls):
        return False, WORDS.say("many-allreduce", said=said, K=K, em="*")
    if r["delta_ratio"] < 1e-6:
        return False, WORDS.say("no-change")
    if r["delta_error"] > 0.05:
        if abs(r["delta_ratio"] - K) < 0.1 * K:
            hint = WORDS.say("too-large", K=K)
        else:
            hint = accumulate_hint()
        return False, WORDS.say("weights-differ", pct=f"{100 * r['delta_error']:.0f}", hint=hint)
    return True, WORDS.say("loop-right", K=K, pct=f"{100 * r['delta_error']:.2f}")
