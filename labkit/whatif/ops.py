"""Each element-wise call of a traced step, timed on this machine at its own shapes (``device="this"``).

The bandwidth curve (``probes.probe_bandwidth``) is measured on ``c = a + b``. A GELU (an erf per element),
a LayerNorm and its backward, a log-softmax or a bias gradient's column sum do several times more
arithmetic per byte, so charging their bytes at an add's speed predicts them too fast on a CPU: 3.6x
(GELU) to 9x (LayerNorm) per call for the tiny preset at micro-batch 8, one thread, on a 2-core AVX-512
EPYC (December 2026). So every such call of the micro-batch is rebuilt
from the trace's key (``trace.op_key``: the ATen overload, every tensor by shape, strides and dtype),
timed alone, and charged the slower of that time and its bytes (``roofline.op_roofline_s``). Bounded
(OP_BUDGET_S per prediction) and cached in ``roofline_probe.json`` ("op_times") like the matmul shapes,
through the same watched, quiet-only cache of ``probes``.
"""
from __future__ import annotations

import json
import math
import time

import torch

from . import probes
from .trace import StepTrace

__all__ = ["op_keys", "probe_ops", "this_op_times", "OP_BUDGET_S"]


OP_BUDGET_S = 1.0   # per prediction: new element-wise calls timed on "this" (then cached)
OP_MAX_BYTES = 2**28  # a call moving more than this (256 MiB) is not rebuilt: its bytes decide its time


def op_keys(trace: StepTrace) -> list:
    """Every element-wise call key ("op|...", see ``trace.op_key``) of a traced step's micro-batch, sorted."""
    return sorted({r["shape"] for r in trace.kinds if (r.get("shape") or "").startswith("op|")})


def _tensor(spec: dict):
    """A real tensor for one encoded argument: floats in [0.5, 1.5) -- positive, away from zero, so a
    sqrt, log or division is defined and an in-place multiply repeated a few times makes no denormals --
    integers and flags zero (a valid index, class or mask everywhere), with the traced strides."""
    dtype = getattr(torch, spec["d"])
    t = torch.empty_strided(spec["t"], spec["s"], dtype=dtype)
    if dtype.is_floating_point:
        return t.uniform_(0.5, 1.5)
    return t.zero_()


def _decode(x):
    """One encoded argument (``trace._encode``) back as a value: tensors made fresh, dtypes and devices by name."""
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if isinstance(x, dict):
        if "t" in x:
            return _tensor(x)
        if "f" in x:
            return float(x["f"])
        if "dtype" in x:
            return getattr(torch, x["dtype"])
        if "device" in x:
            return torch.device(x["device"])
        return getattr(torch, x["enum"])
    return x


def _key_bytes(key: str) -> int:
    """Bytes of the tensors a call key names (its inputs), for OP_MAX_BYTES."""
    def walk(x):
        if isinstance(x, list):
            return sum(walk(v) for v in x)
        if isinstance(x, dict):
            if "t" in x:
                return math.prod(x["t"]) * getattr(torch, x["d"]).itemsize
            return sum(walk(v) for v in x.values())
        return 0
    return walk(json.loads(key.split("|", 2)[2]))


def _op_call(key: str):
    """A function running the call a key names once, on real CPU tensors (made once, reused)."""
    _, name, spec = key.split("|", 2)
    namespace, op, overload = name.split(".")
    func = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    args, kwargs = json.loads(spec)
    args, kwargs = _decode(args), {k: _decode(v) for k, v in kwargs.items()}
    return lambda: func(*args, **kwargs)


CALL_REPEATS = (3, 10)  # each call timed at least 3 and at most 10 times, the fastest kept ...
CALL_SPAN_S = 0.02      # ... stopping after 3 once this long was spent: a burst of load must miss one of them


def _best_call_s(fn, repeats: tuple = CALL_REPEATS, span_s: float = CALL_SPAN_S) -> float:
    fn()  # warm-up: allocator, caches, one-time kernel setup
    best, spent, done = math.inf, 0.0, 0
    while done < repeats[1] and (done < repeats[0] or spent < span_s):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, done = min(best, dt), spent + dt, done + 1
    return best


def probe_ops(keys, budget_s: float = OP_BUDGET_S) -> dict:
    """{call key: seconds of its kernel} measured on this CPU: each element-wise call of the step (a GELU,
    a LayerNorm and its backward, a softmax, a reduction, ...) rebuilt on real tensors of its traced
    shapes and timed alone (the fastest of 3 to 10 calls, after a warm-up), until ``budget_s`` runs out.
    The cost of calling any op from Python (an add of one element, timed the same way) is taken off: the
    per-op overhead term already charges it. Why: the bandwidth curve is measured on ``c = a + b``, and a GELU (erf per
    element) or a LayerNorm backward does several times the arithmetic per byte, so charging its bytes
    at an add's speed predicts it several times too fast. A call that cannot be rebuilt is left out (it
    stays charged by its bytes); so is one moving more than OP_MAX_BYTES."""
    out, deadline = {}, time.perf_counter() + budget_s
    one = torch.ones(1)
    floor = _best_call_s(lambda: torch.ops.aten.add.Tensor(one, one), (10, 20))
    for key in keys:
        if time.perf_counter() > deadline:
            break
        if _key_bytes(key) > OP_MAX_BYTES:
            continue
        try:
            fn = _op_call(key)
            secs = _best_call_s(fn)
        except Exception:  # noqa: BLE001 -- an op the rebuilt values do not suit: its bytes decide its time
            continue
        out[key] = max(0.0, secs - floor)
    return out


def this_op_times(keys, threads: int, remeasure: bool = False, budget_s: float = OP_BUDGET_S) -> dict:
    """Measured kernel seconds of the given element-wise calls at ``threads`` threads: known ones from
    this process or the cache (roofline_probe.json, "op_times"), the rest probed now within ``budget_s``;
    the fastest time seen is kept. Like the shape rates, times measured under load stay in this process
    ("loaded_ops") and are timed again when due."""
    key = probes._probe_key(threads)
    entry = probes._entry(key)
    times = entry.setdefault("op_times", {})
    loaded = set(entry.get("loaded_ops") or ())
    todo = list(keys) if remeasure else [k for k in keys if k not in times]
    again = [k for k in keys if k in loaded and k not in todo]
    if again and probes._due("ops", key):
        todo += again
    if not todo:
        return {k: times[k] for k in keys if k in times}
    probes._TRIED["ops", key] = time.monotonic()
    with probes._watched(threads) as seen, torch.random.fork_rng(devices=[]):
        new = probe_ops(todo, budget_s)
    for k, v in new.items():
        times[k] = min(v, times.get(k, math.inf))
    if seen["contended"]:
        loaded |= set(new)
        entry["ops_other_cores"] = seen["other_cores"]
    elif new:
        loaded -= set(new)
        cached = dict((probes._read_probes().get(key) or {}).get("op_times") or {})
        probes._save_quiet(key, op_times={**cached, **{k: min(v, cached.get(k, math.inf))
                                                       for k, v in new.items()}})
    entry["loaded_ops"] = sorted(loaded)
    return {k: times[k] for k in keys if k in times}
