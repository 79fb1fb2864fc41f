"""Checkers for chapter 06: DDP and AllReduce -- a counting comm hook, the calls per update, the no_sync
fix and the ring formula. The DDP checks run two replicas inside this process (``twin_world``): a process
group whose AllReduce sums identical gradients, so a check needs no second process.
"""
from __future__ import annotations

import contextlib
import numbers

import torch
import torch.distributed as dist
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel as DDP

from ..base import phrases, runtime
from ..whatif.roofline import allreduce_calls, ring_allreduce_s
from ..engine.model import GPT
from ._core import NotAttempted, checker, near, not_attempted_if_none, number, number_or_none, shielded, unchanged
from .basics import _counting_forwards, _one_big_forward
from .scaling import _tiny_spec

__all__ = ["counting_hook", "predict_allreduce_calls", "fix_no_sync", "ring_allreduce_time"]

# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 06
WORDS = phrases.load_section("lab_messages.md", "Checks: chapter 06", {
    "hook-callable": (), "hook-no-collective": (), "hook-no-grad": ("name",), "hook-summed": (),
    "hook-differ": ("gap",),
    "hook-calls": ("calls", "said"), "hook-elements": (), "hook-bytes": ("bytes", "said"),
    "hook-calls16": ("calls", "said"), "hook-bytes16-double": ("bytes", "said", "code"),
    "hook-bytes16": ("bytes", "said"), "hook-right": ("calls", "bytes", "bytes16"),
    "calls-right": ("buckets", "syncs", "right", "world_size"), "calls-world": (), "calls-no-sync": (),
    "calls-every-micro": (), "calls-per-bucket": ("buckets",), "calls-other": ("answer",),
    "fix-callable": (), "fix-not-done": (), "fix-took": ("K", "took"), "fix-no-allreduce": ("em",),
    "fix-no-grad": ("name",), "fix-every": ("calls", "K"), "fix-when": ("which", "K"), "fix-too-large": (),
    "fix-differ": ("gap",), "fix-right": ("calls",),
    "ring-callable": (), "ring-one": (), "ring-factor": (), "ring-two-passes": (), "ring-latency": (), "ring-bits": (),
    "ring-wrong": ("nbytes", "n", "bandwidth", "latency", "want", "got"), "ring-right": (),
    "busy": (), "group-exists": ()})


def _plain(value):
    """A count the learner's code left, as a plain int or float (anything else as its repr, which no count equals)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return int(value) if float(value).is_integer() else float(value)
    return None if value is None else repr(value)


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
    with runtime.one_run(WORDS.say("busy")):
        if dist.is_initialized():
            raise RuntimeError(WORDS.say("group-exists"))
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
        return False, WORDS.say("hook-callable")
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
        return False, WORDS.say("hook-no-collective")
    if missing:
        return False, WORDS.say("hook-no-grad", name=missing)
    if abs(gap - 1.0) < 1e-3:
        return False, WORDS.say("hook-summed")
    if gap > 1e-4:
        return False, WORDS.say("hook-differ", gap=f"{gap:.2g}")
    if state.get("calls") != real_calls:
        return False, WORDS.say("hook-calls", calls=real_calls, said=f"{state.get('calls')}")
    if state.get("bytes") != real_bytes:
        if isinstance(state.get("bytes"), int) and state["bytes"] and real_bytes == 4 * state["bytes"]:
            return False, WORDS.say("hook-elements")
        return False, WORDS.say("hook-bytes", bytes=real_bytes, said=f"{state.get('bytes')}")
    # The same with fp16 buckets -- what goes through AllReduce under the fp16-compression hook, or with a
    # half-precision model: 2 bytes per element, so `numel() * 4` counts twice the bytes sent.
    if state16.get("calls") != calls16:
        return False, WORDS.say("hook-calls16", calls=calls16, said=f"{state16.get('calls')}")
    if state16.get("bytes") != bytes16:
        if state16.get("bytes") == 2 * bytes16:
            return False, WORDS.say("hook-bytes16-double", bytes=bytes16, said=f"{state16.get('bytes')}",
                                    code="numel() * 4")
        return False, WORDS.say("hook-bytes16", bytes=bytes16, said=f"{state16.get('bytes')}")
    return True, WORDS.say("hook-right", calls=real_calls, bytes=real_bytes, bytes16=bytes16)


@checker
def predict_allreduce_calls(answer, n_buckets, accum, ddp_sync, world_size=1):
    """``answer``: AllReduce calls each GPU launches per optimizer update."""
    a = number(answer, "give a whole number of calls")
    a = int(a) if a == int(a) else a
    right = allreduce_calls(n_buckets, accum, ddp_sync)
    if a == right:
        return True, WORDS.say("calls-right", buckets=n_buckets, syncs=accum if ddp_sync == "every_micro" else 1,
                               right=right, world_size=world_size)
    mistakes = (("calls-world", world_size > 1 and a == right * world_size),
                ("calls-no-sync", ddp_sync == "no_sync" and a == n_buckets * accum),
                ("calls-every-micro", ddp_sync == "every_micro" and a == n_buckets),
                ("calls-per-bucket", a in (accum, 1) and n_buckets > 1))
    return False, WORDS.say(next((key for key, when in mistakes if when), "calls-other"), buckets=n_buckets,
                            answer=f"{a:g}")


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
        return False, WORDS.say("fix-callable")
    if unchanged(fn, _fix_no_sync_start):
        raise NotAttempted(WORDS.say("fix-not-done"))
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
        return False, WORDS.say("fix-took", K=K, took=pos["k"] + 1)
    big = _one_big_forward(rows, K, int(batches[0][0].shape[0]))
    if big:
        return False, big
    if calls == 0:
        return False, WORDS.say("fix-no-allreduce", em="*")
    if missing:
        return False, WORDS.say("fix-no-grad", name=missing)
    if set(when) != {K - 1}:
        per = sorted(set(when))
        if len(per) == K:
            return False, WORDS.say("fix-every", calls=calls, K=K)
        return False, WORDS.say("fix-when", which=f"{[k + 1 for k in per]}", K=K)
    if abs(gap - (K - 1)) < 1e-2 * K:
        return False, WORDS.say("fix-too-large")
    if gap > 1e-4:
        return False, WORDS.say("fix-differ", gap=f"{gap:.2g}")
    return True, WORDS.say("fix-right", calls=calls)


@checker
def ring_allreduce_time(fn):
    """``fn(nbytes, n, bandwidth, latency)``: seconds for a ring AllReduce of ``nbytes`` over ``n`` GPUs with
    ``bandwidth`` bytes/s per direction and ``latency`` seconds per ring step."""
    if not callable(fn):
        return False, WORDS.say("ring-callable")
    not_attempted_if_none(fn, 1e9, 8, 50e9, 0.0)
    cases = [(1e9, 8, 50e9, 0.0), (1e9, 2, 50e9, 0.0), (4e8, 64, 450e9, 5e-6), (1e6, 512, 3.125e9, 30e-6),
             (1e9, 1, 50e9, 5e-6)]
    answers = [number_or_none(fn(*case)) for case in cases]  # every answer before any right one is worked out
    for (nb, n, bw, lat), got in zip(cases, answers):
        want = ring_allreduce_s(nb, n, bw, lat)
        if near(got, want, rel=1e-6, abs_=1e-15):
            continue
        half = (n - 1) / n * nb / bw
        mistakes = (("ring-one", n == 1), ("ring-factor", near(got, 2 * nb / bw + 2 * (n - 1) * lat)),
                    ("ring-two-passes", near(got, half + (n - 1) * lat) or near(got, half + 2 * (n - 1) * lat)),
                    ("ring-latency", near(got, ring_allreduce_s(nb, n, bw, 0.0)) and lat),
                    ("ring-bits", any(near(got, ring_allreduce_s(nb, n, b, lat)) for b in (bw / 8, bw * 8))))
        return False, WORDS.say(next((key for key, when in mistakes if when), "ring-wrong"), nbytes=f"{nb:g}", n=n,
                                bandwidth=f"{bw:g}", latency=f"{lat:g}", want=f"{want:.4g}", got=f"{got}")
    return True, WORDS.say("ring-right")
