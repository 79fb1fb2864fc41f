"""This machine, measured: what ``device="this"`` predicts from instead of a datasheet (the package
docstring says what each probe measures). Besides the engine's matmul peak (``engine.device``): a
bandwidth curve, the overhead probe, each matmul and fused-attention shape and each element-wise
call of the step timed alone -- all bounded and cached in ``roofline_probe.json`` through the
engine's one cache reader and writer (``engine.gpus``). A probe is watched while it runs: one under
load is kept for this process only and measured again later.
"""
from __future__ import annotations

import contextlib
import glob
import itertools
import math
import time

import numpy as np
import torch

from ..base.numfmt import counted
from ..engine import device as _device
from ..engine.config import Config
from ..engine.measure import LoadMeter
from ..engine.model import GPT
from ..engine.gpus import probe_entry_problem, read_cache, write_cache
from ..engine.step import make_optimizer, micro_steps, optimizer_step
from ..engine.train import threads_for
from .devices import CAUSAL_FRACTION, DEFAULTS, OP_BUDGET_S, probe_ops
from .trace import StepTrace, trace_step

__all__ = ["probe_bandwidth", "probe_op_overhead", "this_probes", "shape_keys", "probe_shapes",
           "this_shape_rates", "this_op_times", "this_device", "overhead_fit", "BANDWIDTH_SIZES"]


def _threads(config: Config) -> int:
    """The intra-op thread count a CPU run of ``config`` uses."""
    return threads_for(config, "cpu", config.world_size)


# ---- each matmul / fused-attention shape of the step, timed alone --------------------------------------

def _key_flops(key: str) -> int:
    """FLOPs of one call of a ``shape_key`` -- the same count the trace made (attention: causal halved)."""
    kind, *rest = key.split("|")
    if kind in ("mm", "addmm"):
        M, K, N = map(int, rest[:3])
        return 2 * M * K * N
    if kind in ("bmm", "baddbmm"):
        Bt, M, K, N = map(int, rest[:4])
        return 2 * Bt * M * K * N
    B, H, T, D, causal = map(int, rest[:5])
    per_pass = 2 if kind == "sdpa" else 5  # bmm-sized products: forward QK^T and PV; backward five
    return int(per_pass * 2 * B * H * T * T * D * (CAUSAL_FRACTION if causal else 1.0))


def _shape_call(key: str):
    """(function running the call once, FLOPs of one call) for a ``shape_key``, on real CPU tensors."""
    kind, *rest = key.split("|")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(rest[-2], torch.float32)
    lay = rest[-1]

    def mat(*shape, t=False):  # a matrix (or batch of them), stored transposed when the trace's was
        if t:
            return torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype).transpose(-1, -2)
        return torch.randn(*shape, dtype=dtype)

    if kind in ("mm", "addmm"):
        M, K, N = map(int, rest[:3])
        a, b, bias = mat(M, K, t=lay[0] == "t"), mat(K, N, t=lay[1] == "t"), torch.randn(N, dtype=dtype)
        return ((lambda: torch.mm(a, b)) if kind == "mm" else (lambda: torch.addmm(bias, a, b))), _key_flops(key)
    if kind in ("bmm", "baddbmm"):
        Bt, M, K, N = map(int, rest[:4])
        a, b = mat(Bt, M, K, t=lay[0] == "t"), mat(Bt, K, N, t=lay[1] == "t")
        return (lambda: torch.bmm(a, b)), _key_flops(key)
    B, H, T, D, causal = map(int, rest[:5])

    def qkv():
        x = torch.randn(B, T, H, D, dtype=dtype) if lay == "bthd" else torch.randn(B, H, T, D, dtype=dtype)
        return x.transpose(1, 2) if lay == "bthd" else x

    q, k, v = qkv(), qkv(), qkv()
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    if kind == "sdpa":
        return (lambda: fwd(q, k, v, 0.0, bool(causal))), _key_flops(key)
    out, lse = fwd(q, k, v, 0.0, bool(causal))
    grad = torch.randn_like(out)
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    return (lambda: bwd(grad, q, k, v, out, lse, 0.0, bool(causal))), _key_flops(key)


SHAPE_BUDGET_S = 1.0        # per prediction: new matmul/attention shapes timed on "this" (then cached)
SHAPE_MAX_CALL_S = 0.05     # a shape whose one call would take longer (at the peak) is not timed


SHAPE_TIMING = "caches swept"  # how the cached shape rates were timed; rates timed another way are timed again


def _last_level_cache_bytes() -> int:
    """The largest CPU cache of this machine (Linux: sysfs), else 32 MiB."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            text = f.read().strip().upper()
            sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]] if text[-1] in "KMG"
                         else int(text))
    return max(sizes, default=32 * 2**20)


def probe_shapes(keys, peak_flops: float, budget_s: float = SHAPE_BUDGET_S) -> dict:
    """{shape key: FLOP/s} measured on this CPU at the model's own shapes (a (1024 x 256) @ (256 x
    768) product does not reach the square-matmul peak): each call warmed up, then timed up to 3
    times (the best kept) until ``budget_s`` runs out; shapes over SHAPE_MAX_CALL_S a call are left
    out (they run at about the peak). Each timed call follows a read of twice the last-level cache,
    as in a step whose other work pushed the weights out: the small preset's 51 matmuls (micro-batch
    8, one thread, 2-core EPYC, December 2026) took 166 ms without the sweep, 179 ms with it, 180 ms
    in the step."""
    rates, deadline = {}, time.perf_counter() + budget_s
    sweep = torch.zeros(min(2 * _last_level_cache_bytes(), 2**28) // 4)
    for key in keys:
        if time.perf_counter() > deadline:
            break
        if not _key_flops(key) or _key_flops(key) / peak_flops > SHAPE_MAX_CALL_S:
            continue  # decided before any tensor exists: a large attention backward would run its forward first
        fn, flops = _shape_call(key)
        fn()
        best = math.inf
        for _ in range(3):
            sweep.sum()  # out of the caches, as in the step (see above)
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
            if time.perf_counter() > deadline:
                break
        rates[key] = flops / best
    return rates


def shape_keys(trace: StepTrace) -> list:
    """Every matmul / fused-attention shape key of a traced step, sorted."""
    return sorted({k for part in (trace.micro, trace.update) for g in part.values() for k in g.get("shapes", {})})


def this_shape_rates(keys, threads: int, peak_flops: float, remeasure: bool = False,
                     budget_s: float = SHAPE_BUDGET_S) -> dict:
    """Measured FLOP/s of the given shapes at ``threads`` threads: known ones from this process or
    the cache, the rest (all with ``remeasure``) probed now within ``budget_s``; the best rate seen
    is kept. Rates timed under load stay in this process ("loaded_shapes"), timed again when due."""
    return _this_timed("shapes", "shape_rates", max, keys, threads, remeasure,
                       lambda todo: probe_shapes(todo, peak_flops, budget_s),
                       shape_timing=SHAPE_TIMING)


def _this_timed(what: str, field: str, best, keys, threads: int, remeasure: bool, probe,
                **saved) -> dict:
    """The cache of timings of one ``what`` ("shapes", "ops"), kept in the probe entry's ``field``:
    the ``best`` (max, min) value seen per key; ``probe(todo)`` times the keys still to do."""
    key = _probe_key(threads)
    entry = _entry(key)
    values = entry.setdefault(field, {})
    loaded = set(entry.get(f"loaded_{what}") or ())
    todo = list(keys) if remeasure else [k for k in keys if k not in values]
    again = [k for k in keys if k in loaded and k not in todo]
    if again and _due(what, key):
        todo += again
    if not todo:
        return {k: values[k] for k in keys if k in values}
    _TRIED[what, key] = time.monotonic()
    with _watched(threads) as seen, torch.random.fork_rng(devices=[]):
        new = probe(todo)
    for k, v in new.items():
        values[k] = best(v, values[k]) if k in values else v
    if seen["contended"]:
        loaded |= set(new)
        entry[f"{what}_other_cores"] = seen["other_cores"]
    elif new:
        loaded -= set(new)
        cached = dict(_current(_read_probes().get(key) or {}).get(field) or {})
        _save_quiet(key, **{field: {**cached, **{k: best(v, cached[k]) if k in cached else v
                                                 for k, v in new.items()}}}, **saved)
    entry[f"loaded_{what}"] = sorted(loaded)
    return {k: values[k] for k in keys if k in values}


def this_op_times(keys, threads: int, remeasure: bool = False, budget_s: float = OP_BUDGET_S) -> dict:
    """Measured kernel seconds of the given element-wise calls, as ``this_shape_rates`` (cache key
    "op_times", the fastest kept; under load: "loaded_ops")."""
    return _this_timed("ops", "op_times", min, keys, threads, remeasure,
                       lambda todo: probe_ops(todo, budget_s))


# ---- bandwidth, per-op overhead, peaks ---------------------------------------------------------------

PROBE_BUDGET_S = 1.0    # bandwidth + overhead probes together, once per machine and thread count
PROBE_RETRY_S = 30.0    # a figure measured under load is measured again at most this often (per process)
PEAK_BUDGET_S = _device.RUN_PROBE_BUDGET_S  # the check of one format's matmul peak (labkit.engine.device's probe)
SPREAD_LIMIT = 1.5      # overhead probe: its median step over its fastest above this = its repeats disagree
_PROBED: dict = {}      # probe key -> this process's figures (see _entry)
_TRIED: dict = {}       # what this process last probed again after a probe under load -> time.monotonic()


PROBE_CACHE = "roofline_probe.json"  # in cache_dir(), beside the engine's peak_flops.json


def _read_probes() -> dict:
    # missing or damaged: {}; a damaged entry is dropped (measured again) and said once
    return read_cache(PROBE_CACHE, "roofline probe cache", entry_problem=probe_entry_problem)


def _write_probe(key: str, entry: dict) -> None:
    data = _read_probes()
    data[key] = entry
    write_cache(PROBE_CACHE, data)  # atomic; an unwritable cache leaves the value in this process only


def _entry(key: str) -> dict:
    """This process's figures for one probe key: the cache's, plus any measured here under load
    (never written: the cache holds only figures from a quiet machine)."""
    if key not in _PROBED:
        _PROBED[key] = _current(_read_probes().get(key) or {})
    return _PROBED[key]


def _current(entry: dict) -> dict:
    """A cache entry without shape rates timed otherwise than SHAPE_TIMING says (those are timed again)."""
    entry = dict(entry)
    if entry.get("shape_timing") != SHAPE_TIMING:
        entry.pop("shape_rates", None)
    return entry


def _save_quiet(key: str, **figures) -> None:
    """Add figures measured on a quiet machine to the cache entry of ``key``."""
    entry = _current(_read_probes().get(key) or {})
    entry.pop("shapes", None)  # the old, unchecked shape timings: "shape_rates" replaces them
    entry.update(figures)
    _write_probe(key, entry)


def _due(*what) -> bool:
    """Whether a figure measured under load may be probed again now (and if so, note the time)."""
    now = time.monotonic()
    if now - _TRIED.get(what, -math.inf) < PROBE_RETRY_S:
        return False
    _TRIED[what] = now
    return True


@contextlib.contextmanager
def _watched(threads: int):
    """Run a probe at ``threads`` threads, watched: the dict it yields then holds "contended"
    (``engine.device.contended``) and "other_cores" (what other programs used, or None)."""
    seen: dict = {}
    meter = LoadMeter()
    with _device.intra_op_threads(threads):
        yield seen
    reading = meter.read()
    seen.update(contended=_device.contended(reading, threads), other_cores=reading.get("other_cores"))


BANDWIDTH_SIZES = (2**14, 2**16, 2**18, 2**20, 2**22, 2**24)  # fp32 elements per vector: 64 KiB .. 64 MiB


def probe_bandwidth(budget_s: float = 0.5, sizes=BANDWIDTH_SIZES) -> dict:
    """Best bytes/s of ``c = a + b`` on fp32 vectors of each size (12 x n bytes an op: 768 KiB,
    in a core's L2, to 192 MiB) within ``budget_s``: the curve [(op bytes, bytes/s), ...], the
    largest's."""
    t_start = time.perf_counter()
    per_size = budget_s / len(sizes)
    curve, calls = [], 0
    for n in sizes:
        a, b, c = torch.ones(n), torch.ones(n), torch.zeros(n)  # written once: the pages exist before timing
        torch.add(a, b, out=c)  # and are in whatever cache holds them
        best, deadline = 0.0, time.perf_counter() + per_size
        while True:
            t0 = time.perf_counter()
            torch.add(a, b, out=c)
            dt = time.perf_counter() - t0
            best, calls = max(best, 12 * n / dt), calls + 1
            if time.perf_counter() + dt > deadline:
                break
        curve.append([12 * n, best])
        del a, b, c
    return {"bytes_per_s": curve[-1][1], "curve": curve, "calls": calls,
            "seconds": round(time.perf_counter() - t_start, 3)}


OVERHEAD_LAYERS = (1, 3)  # the overhead probe's two model depths: same fixed cost, different op counts


def _probe_config(n_layer: int) -> Config:
    """labkit's GPT at negligible size: an update that is almost all overhead."""
    return Config(model="tiny", n_layer=n_layer, d_model=16, n_head=2, seq_len=8, micro_batch=1, precision="fp32")


def _traced_ops(config: Config) -> int:
    """Ops of one update as the prediction counts them (the per-op figure is fitted on this
    count)."""
    return sum(r["count"] for r in trace_step(config, foreach=False).kinds)


def _update_fn(config: Config):
    """One update of labkit's own loop (engine.step), the loss read back; the optimizer's state
    made."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT(config.spec)
        idx = torch.randint(0, 256, (1, config.spec.seq_len))
    opt = make_optimizer(config, model.parameters())
    batches, cpu = itertools.repeat((idx, idx)), torch.device("cpu")

    def update():
        losses, _ = micro_steps(model, model, batches, 1, None, "cpu", "fp32", cpu)
        loss = torch.stack(losses).float().mean()
        optimizer_step(model, opt, None, config.grad_clip, "continue", loss)
        return float(loss)

    update()  # first call: the optimizer's state is created
    return update


def overhead_fit(n_small: int, t_small: float, n_large: int, t_large: float) -> tuple:
    """(seconds per update, seconds per op): a line through two updates' (ops, seconds). Where noise
    tilts it past the axes, the fixed part is 0 and every second is charged per op."""
    per_op = (t_large - t_small) / (n_large - n_small)
    fixed = t_small - n_small * per_op
    if per_op <= 0 or fixed < 0:
        return 0.0, t_small / n_small
    return fixed, per_op


def _loader_cost(budget_s: float) -> float:
    """The loader's own cost per sample (slice a byte window, convert, collate), for the data group."""
    data = np.zeros(1 << 16, dtype=np.uint8)
    windows = []
    t0, deadline = time.perf_counter(), time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(windows) < 8:
        start = (len(windows) * 129) % (len(data) - 130)
        chunk = torch.from_numpy(data[start:start + 129].astype(np.int64))
        windows.append((chunk[:-1], chunk[1:]))
        if len(windows) % 8 == 0:
            torch.utils.data.default_collate(windows[-8:])
    return (time.perf_counter() - t0) / len(windows)


def probe_op_overhead(budget_s: float = 0.4) -> dict:
    """The overhead term of this CPU: a line through the median update times of labkit's loop on
    GPTs of 1 and 3 blocks over their op counts: cost per op (slope) and per update (intercept); and
    the loader's own cost per sample."""
    t_start = time.perf_counter()
    configs = [_probe_config(n) for n in OVERHEAD_LAYERS]
    ops = [_traced_ops(c) for c in configs]
    fns = [_update_fn(c) for c in configs]
    times: list = [[], []]
    deadline = time.perf_counter() + budget_s * 0.8
    while time.perf_counter() < deadline or len(times[0]) < 3:
        for fn, ts in zip(fns, times):  # interleaved: a burst of load hits both sizes
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    medians = [sorted(ts)[len(ts) // 2] for ts in times]  # the median update: typical, not the luckiest
    fixed, per_op = overhead_fit(ops[0], medians[0], ops[1], medians[1])
    return {"op_overhead_s": per_op, "update_overhead_s": fixed, "ops_per_step": ops, "steps": len(times[0]),
            "small_step_s": medians[0],
            "spread": max(m / min(ts) for m, ts in zip(medians, times)),  # far above 1: updates were interrupted
            "sample_overhead_s": _loader_cost(budget_s * 0.2), "seconds": round(time.perf_counter() - t_start, 3)}


def _probe_key(threads: int) -> str:
    return _device.peak_cache_key(_device.capabilities("cpu"), threads)


def _best_of(new: dict, old: dict) -> dict:
    """Two probes merged: the highest bandwidth (per size), the lowest loader cost, and the overhead
    pair of the probe whose small update ran faster (a busy machine only measures worse; a fit's
    halves stay together)."""
    out = dict(new, probes=int(old.get("probes", 0)) + 1)
    if old.get("curve") and len(old["curve"]) == len(new["curve"]):
        out["bytes_per_s"] = max(new["bytes_per_s"], old["bytes_per_s"])
        out["curve"] = [[x, max(y, oy)] for (x, y), (_, oy) in zip(new["curve"], old["curve"])]
    out["sample_overhead_s"] = min(new["sample_overhead_s"], old.get("sample_overhead_s") or math.inf)
    if _has_overhead(old) and old.get("small_step_s", math.inf) < new["small_step_s"]:
        out.update({k: old[k] for k in ("op_overhead_s", "update_overhead_s", "small_step_s")})
    return out


def _has_overhead(entry: dict) -> bool:
    """Whether a cache entry holds a usable overhead pair (else: measure again)."""
    figures = [entry.get(k) for k in ("op_overhead_s", "update_overhead_s", "small_step_s")]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf for v in figures)


def this_probes(threads: int, remeasure: bool = False) -> dict:
    """Memory bandwidth, per-op overhead and per-sample loader cost of this CPU at ``threads``
    threads: known ones, else measured (~PROBE_BUDGET_S), cached keyed like the peak cache; the best
    values seen are kept. A probe under load or with disagreeing repeats is marked ``"quiet":
    False`` (with ``"load_other_cores"``), kept in this process only and measured again at most
    every PROBE_RETRY_S."""
    key = _probe_key(threads)
    entry = _entry(key)
    have = bool(entry.get("curve")) and _has_overhead(entry)
    if have and not remeasure and (entry.get("quiet") or not _due("memory", key)):
        return entry
    _TRIED["memory", key] = time.monotonic()  # a first probe counts too: under load, the next waits its turn
    with _watched(threads) as seen:
        bw = probe_bandwidth(PROBE_BUDGET_S * 0.5)
        oh = probe_op_overhead(PROBE_BUDGET_S * 0.4)
    quiet = not seen["contended"] and oh["spread"] <= SPREAD_LIMIT
    new = {**oh, "bytes_per_s": bw["bytes_per_s"], "curve": bw["curve"], "bandwidth_calls": bw["calls"],
           "measured": time.strftime("%Y-%m-%d")}
    figures = _best_of(new, entry if entry.get("curve") else {})  # without an overhead pair, its curve counts
    figures["quiet"] = quiet or bool(entry.get("quiet"))  # the best of a quiet probe and any other is still good
    figures["load_other_cores"] = None if figures["quiet"] else seen["other_cores"]
    entry.update(figures)
    if figures["quiet"]:
        _save_quiet(key, **figures)
    return entry


def _overheads(probes: dict, threads: int) -> tuple:
    """(seconds per op, seconds per update, whether from a quiet probe). Issuing ops does not get
    cheaper with threads, but a busy machine makes a many-thread probe wait for a core at every op:
    take the probe (this count's or one thread's) whose small update ran faster."""
    best = probes
    if threads > 1:
        one = this_probes(1)
        best = one if one["small_step_s"] < probes["small_step_s"] else probes
    return best["op_overhead_s"], best["update_overhead_s"], bool(best.get("quiet"))


def _this_peak(caps, precision: str, threads: int) -> tuple:
    """(matmul FLOP/s of ``precision`` at ``threads`` threads, whether measured under load): the
    engine's cached peak, probed again once, watched (its first probe may have run under load), and
    marked checked when that probe ran on a quiet machine."""
    key = _probe_key(threads)
    entry = _entry(key)
    checked = entry.setdefault("peaks_checked", {})
    if precision in checked or not _due("peak", key, precision):
        return _device.peak_flops(caps, precision, threads)[0], precision not in checked
    with _watched(threads) as seen:
        flops, _ = _device.measured_peak(caps, precision, budget_s=PEAK_BUDGET_S, remeasure=True)  # keeps the higher
    if seen["contended"]:
        entry.setdefault("loaded_peaks", {})[precision] = seen["other_cores"]
        return flops, True
    checked[precision] = flops
    entry.get("loaded_peaks", {}).pop(precision, None)
    _save_quiet(key, peaks_checked={**(_read_probes().get(key) or {}).get("peaks_checked", {}), precision: flops})
    return flops, False


def this_device(threads: int, precision: str) -> dict:
    """The "this" entry, measured: matmul peaks of ``precision`` and fp32, bandwidth and overheads
    (``this_probes``), memory from the OS; the link is loopback TCP (assumed, DEFAULTS).
    ``under_load``: {input: cores other programs used, or None} per figure measured under load."""
    caps = _device.capabilities("cpu")
    probes = this_probes(threads)
    under_load = {} if probes.get("quiet") else {"memory bandwidth": probes.get("load_other_cores")}
    peaks = {}
    for p in dict.fromkeys(("fp32", precision if precision in ("bf16", "fp16") else "fp32")):
        peaks[p], loaded = _this_peak(caps, p, threads)
        if loaded:
            under_load[f"{p} matmul peak"] = _entry(_probe_key(threads)).get("loaded_peaks", {}).get(p)
    overhead, per_update, quiet = _overheads(probes, threads)
    if not quiet:
        under_load["per-op overhead"] = probes.get("load_other_cores")
    units = {"fp32": True, "tf32": False, "fp16": False, "bf16": False}
    for p in ("fp16", "bf16"):  # a format counts as having units when measured >= 1.2x fp32 (device.fast_formats)
        if peaks.get(p):
            units[p] = peaks[p] >= 1.2 * peaks["fp32"]
    bw = probes["bytes_per_s"]
    return {
        "key": "this", "name": f"this CPU ({caps.name}, {counted(threads, 'thread')})", "vendor": "this", "measured": True,
        "peak_flops": peaks, "hardware_units": units, "threads": threads, "under_load": under_load,
        "memory_bytes": float(caps.memory_bytes or 0), "bandwidth": bw,
        "bandwidth_curve": [tuple(pt) for pt in probes["curve"]],
        "link_bandwidth": bw * DEFAULTS["this_link_bw_fraction"],
        "link_latency_s": DEFAULTS["this_link_latency_s"],
        "op_overhead_s": overhead, "update_overhead_s": per_update, "sample_overhead_s": probes["sample_overhead_s"],
        "fractions": dict(DEFAULTS["this"]),
        "sources": {"peaks": "measured: labkit.engine.device's bounded matmul probe (peak_flops.json)",
                    "bandwidth": "measured: best c = a + b per op size, 768 KiB to 192 MiB (roofline_probe.json)",
                    "op_overhead_s": "measured: the slope of labkit's update time over its ATen ops (GPTs of "
                                     "1 and 3 blocks, width 16)",
                    "update_overhead_s": "measured: the same line's intercept (the update's own Python)",
                    "shapes": "measured: each matmul / fused-attention shape of the step, timed alone "
                              "(roofline_probe.json); the fractions apply only to shapes not timed",
                    "ops": "measured: each element-wise call of the micro-batch rebuilt at its traced shapes and "
                           "timed alone (roofline_probe.json, op_times); charged the slower of that and its bytes"},
    }
