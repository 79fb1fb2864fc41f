"""This machine, measured: what ``device="this"`` predicts from instead of a datasheet.

The matmul peak is the engine's bounded, cached probe (``engine.device.measured_peak``); this module adds
a memory-bandwidth probe (a curve over the op's size: on a CPU a small op's data stays in cache and
streams several times faster than memory), a per-operation overhead probe, and each matmul and
fused-attention shape of the step timed alone (the achievable FLOP/s at the model's own shapes). All are
bounded (about a second) and cached in ``roofline_probe.json`` through the engine's one cache reader
and writer (``engine.peaks.read_cache`` / ``write_cache``).

A probe is watched while it runs: when other programs used the cores it needed, or its repeats
disagree, its figures are kept for this process only (never cached), measured again on a later
prediction, and the prediction carries a caveat saying so.
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..base.numfmt import counted
from ..engine import device as _device
from ..engine.config import Config, ModelSpec
from ..engine.measure import LoadMeter
from ..engine.model import GPT
from ..engine.peaks import read_cache, write_cache
from .devices import CAUSAL_FRACTION, DEFAULTS
from .trace import StepTrace

__all__ = ["probe_bandwidth", "probe_op_overhead", "this_probes", "shape_keys", "probe_shapes",
           "this_shape_rates", "this_device", "BANDWIDTH_SIZES"]


def _threads(config: Config) -> int:
    """The intra-op thread count a CPU run of ``config`` uses (the rule of train.threads_for)."""
    if config.threads is not None:
        return config.threads
    return max(1, _device.cores() // config.world_size - config.workers)


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


def probe_shapes(keys, peak_flops: float, budget_s: float = SHAPE_BUDGET_S) -> dict:
    """{shape key: FLOP/s} measured on this CPU: each call run once to warm up, then timed up to 3 times
    (the best kept), until ``budget_s`` runs out. ml-engineering's advice on achievable matmul FLOPS is to
    measure "with the actual shapes your model is using": the square-matmul peak is a ceiling that a
    (1024 x 256) @ (256 x 768) product does not reach. Shapes predicted to take over SHAPE_MAX_CALL_S
    per call are left out (large products run at about the peak)."""
    rates, deadline = {}, time.perf_counter() + budget_s
    for key in keys:
        if time.perf_counter() > deadline:
            break
        if not _key_flops(key) or _key_flops(key) / peak_flops > SHAPE_MAX_CALL_S:
            continue  # decided before any tensor exists: a large attention backward would run its forward first
        fn, flops = _shape_call(key)
        fn()
        best = math.inf
        for _ in range(3):
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
    """Measured FLOP/s for the given shapes at ``threads`` threads: known ones from this process or the
    cache (roofline_probe.json), the rest (all of them with ``remeasure``) probed now within ``budget_s``;
    the best rate seen is kept (a probe under load only measures too slow). Rates timed under load are
    kept in this process only, listed in the entry's "loaded_shapes", and timed again when due."""
    key = _probe_key(threads)
    entry = _entry(key)
    rates = entry.setdefault("shape_rates", {})
    loaded = set(entry.get("loaded_shapes") or ())
    todo = list(keys) if remeasure else [k for k in keys if k not in rates]
    again = [k for k in keys if k in loaded and k not in todo]
    if again and _due("shapes", key):
        todo += again
    if not todo:
        return {k: rates[k] for k in keys if k in rates}
    _TRIED["shapes", key] = time.monotonic()
    with _watched(threads) as seen, torch.random.fork_rng(devices=[]):
        new = probe_shapes(todo, peak_flops, budget_s)
    for k, v in new.items():
        rates[k] = max(v, rates.get(k, 0.0))
    if seen["contended"]:
        loaded |= set(new)
        entry["shapes_other_cores"] = seen["other_cores"]
    elif new:
        loaded -= set(new)
        cached = dict((_read_probes().get(key) or {}).get("shape_rates") or {})
        _save_quiet(key, shape_rates={**cached, **{k: max(v, cached.get(k, 0.0)) for k, v in new.items()}})
    entry["loaded_shapes"] = sorted(loaded)
    return {k: rates[k] for k in keys if k in rates}


# ---- bandwidth, per-op overhead, peaks ---------------------------------------------------------------

PROBE_BUDGET_S = 1.0    # bandwidth + overhead probes together, once per machine and thread count
PROBE_RETRY_S = 30.0    # a figure measured under load is measured again at most this often (per process)
PEAK_BUDGET_S = _device.RUN_PROBE_BUDGET_S  # the check of one format's matmul peak (labkit.device's probe)
SPREAD_LIMIT = 1.5      # overhead probe: its median step over its fastest above this = its repeats disagree
_PROBED: dict = {}      # probe key -> this process's figures (see _entry)
_TRIED: dict = {}       # what this process last probed again after a probe under load -> time.monotonic()


PROBE_CACHE = "roofline_probe.json"  # in cache_dir(), beside the engine's peak_flops.json


def _read_probes() -> dict:
    return read_cache(PROBE_CACHE, "roofline probe cache")  # missing or damaged: {} (measure again)


def _write_probe(key: str, entry: dict) -> None:
    data = _read_probes()
    data[key] = entry
    write_cache(PROBE_CACHE, data)  # atomic; an unwritable cache leaves the value in this process only


def _entry(key: str) -> dict:
    """This process's figures for one probe key: the cache's, plus any measured here under load -- those
    stay in this process (they are never written: the cache holds only figures from a quiet machine)."""
    if key not in _PROBED:
        _PROBED[key] = dict(_read_probes().get(key) or {})
    return _PROBED[key]


def _save_quiet(key: str, **figures) -> None:
    """Add figures measured on a quiet machine to the cache entry of ``key``."""
    entry = dict(_read_probes().get(key) or {})
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
    """Run a probe at ``threads`` intra-op threads and watch the machine meanwhile: yields a dict that
    afterwards holds "contended" (see labkit.device.contended) and "other_cores" (what other programs used, or None)."""
    seen: dict = {}
    meter = LoadMeter()
    with _device.intra_op_threads(threads):
        yield seen
    reading = meter.read()
    seen.update(contended=_device.contended(reading, threads), other_cores=reading.get("other_cores"))


BANDWIDTH_SIZES = (2**14, 2**16, 2**18, 2**20, 2**22, 2**24)  # fp32 elements per vector: 64 KiB .. 64 MiB


def probe_bandwidth(budget_s: float = 0.5, sizes=BANDWIDTH_SIZES) -> dict:
    """Best bytes/s of ``c = a + b`` on fp32 vectors of each size in ``sizes`` (an op touching 12 x n
    bytes: from 768 KiB, inside a core's L2, to 192 MiB, beyond most last-level caches), within
    ``budget_s``. Returns the curve [(op bytes, bytes/s), ...] and the largest size's figure."""
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


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def probe_op_overhead(budget_s: float = 0.4) -> dict:
    """Seconds per ATen op of eager training at negligible size: labkit's GPT with 1 block of width 16
    on 8 tokens -- forward, backward, gradient clip, AdamW step -- timed whole and divided by the ops a
    dispatch mode counted in it. So it carries what each op costs around it in a real step (Python,
    nn.Module calls, autograd, the optimizer's loop), not only the dispatcher. Also the loader's own
    cost per sample (slice a byte window, convert, collate), for the data group."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT(ModelSpec(1, 16, 2, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    idx = torch.randint(0, 256, (1, 8))

    def step():
        model(idx, idx).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # first call: the optimizer's state is created
    counter = _OpCounter()
    with counter:
        step()
    t_start = time.perf_counter()
    deadline = t_start + budget_s * 0.8
    times = []
    while time.perf_counter() < deadline or len(times) < 3:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    median = sorted(times)[len(times) // 2]
    per_op = median / counter.n  # the median step: typical, not the luckiest
    data = np.zeros(1 << 16, dtype=np.uint8)
    windows = []
    t0, deadline = time.perf_counter(), time.perf_counter() + budget_s * 0.2
    while time.perf_counter() < deadline or len(windows) < 8:
        start = (len(windows) * 129) % (len(data) - 130)
        chunk = torch.from_numpy(data[start:start + 129].astype(np.int64))
        windows.append((chunk[:-1], chunk[1:]))
        if len(windows) % 8 == 0:
            torch.utils.data.default_collate(windows[-8:])
    per_sample = (time.perf_counter() - t0) / len(windows)
    return {"op_overhead_s": per_op, "ops_per_step": counter.n, "steps": len(times),
            "spread": median / min(times),  # far above 1: steps were interrupted (see SPREAD_LIMIT)
            "sample_overhead_s": per_sample, "seconds": round(time.perf_counter() - t_start, 3)}


def _probe_key(threads: int) -> str:
    return _device.peak_cache_key(_device.capabilities("cpu"), threads)


def _best_of(new: dict, old: dict) -> dict:
    """Two probes of bandwidth and overhead merged: the highest bandwidth (per size), the lowest overheads
    -- a busy machine only ever measures worse."""
    out = dict(new, probes=int(old.get("probes", 0)) + 1)
    if old.get("curve") and len(old["curve"]) == len(new["curve"]):
        out["bytes_per_s"] = max(new["bytes_per_s"], old["bytes_per_s"])
        out["curve"] = [[x, max(y, oy)] for (x, y), (_, oy) in zip(new["curve"], old["curve"])]
    for k in ("op_overhead_s", "sample_overhead_s"):
        out[k] = min(new[k], old.get(k) or math.inf)
    return out


def this_probes(threads: int, remeasure: bool = False) -> dict:
    """Memory bandwidth, per-op overhead and per-sample loader cost of this CPU at ``threads`` intra-op
    threads: known ones, else measured (at most ~PROBE_BUDGET_S), kept in ``roofline_probe.json`` beside
    ``peak_flops.json``, keyed like the peak cache; a later probe keeps the best values seen.

    A probe is watched (``_watched``): one that ran while other programs held the cores it needed, or
    whose repeats disagree, is marked ``"quiet": False`` with what the others used (``"load_other_cores"``),
    kept in this process only and measured again on a later call (at most every PROBE_RETRY_S). An entry
    cached before this check existed (no "quiet" mark) is measured again once, too."""
    key = _probe_key(threads)
    entry = _entry(key)
    have = bool(entry.get("curve") and entry.get("op_overhead_s"))
    if have and not remeasure and (entry.get("quiet") or not _due("memory", key)):
        return entry
    _TRIED["memory", key] = time.monotonic()  # a first probe counts too: under load, the next waits its turn
    with _watched(threads) as seen:
        bw = probe_bandwidth(PROBE_BUDGET_S * 0.5)
        oh = probe_op_overhead(PROBE_BUDGET_S * 0.4)
    quiet = not seen["contended"] and oh["spread"] <= SPREAD_LIMIT
    new = {**oh, "bytes_per_s": bw["bytes_per_s"], "curve": bw["curve"], "bandwidth_calls": bw["calls"],
           "measured": time.strftime("%Y-%m-%d")}
    figures = _best_of(new, entry if have else {})
    figures["quiet"] = quiet or bool(entry.get("quiet"))  # the best of a quiet probe and any other is still good
    figures["load_other_cores"] = None if figures["quiet"] else seen["other_cores"]
    entry.update(figures)
    if figures["quiet"]:
        _save_quiet(key, **figures)
    return entry


def _op_overhead(probes: dict, threads: int) -> tuple:
    """(seconds per op, whether that figure came from a quiet probe). Issuing one op costs the dispatcher's
    time, which does not grow with the thread count; a probe at several threads on a busy machine waits
    for a core at every op and measures many times the one-thread cost: take the lower of the two."""
    if threads <= 1:
        return probes["op_overhead_s"], bool(probes.get("quiet"))
    one = this_probes(1)
    if one["op_overhead_s"] < probes["op_overhead_s"]:
        return one["op_overhead_s"], bool(one.get("quiet"))
    return probes["op_overhead_s"], bool(probes.get("quiet"))


def _this_peak(caps, precision: str, threads: int) -> tuple:
    """(matmul FLOP/s of ``precision`` at ``threads`` threads, whether it was measured under load). The
    peak is labkit.device's cached probe, which keeps the highest value it ever measured -- but its first
    probe may have run under load. So each peak is probed again once, watched, and marked checked in
    roofline_probe.json when that probe ran on a quiet machine."""
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
    """The "this" entry, measured: the matmul peak of ``precision`` (and fp32) from labkit.device's probe,
    bandwidth and overheads from ``this_probes``, memory size from the OS; the link between processes
    is loopback TCP (an assumption, see DEFAULTS). ``under_load``: {input: cores other programs used (or
    None)} for every figure measured under load (empty when all are trustworthy)."""
    caps = _device.capabilities("cpu")
    probes = this_probes(threads)
    under_load = {} if probes.get("quiet") else {"memory bandwidth": probes.get("load_other_cores")}
    peaks = {}
    for p in dict.fromkeys(("fp32", precision if precision in ("bf16", "fp16") else "fp32")):
        peaks[p], loaded = _this_peak(caps, p, threads)
        if loaded:
            under_load[f"{p} matmul peak"] = _entry(_probe_key(threads)).get("loaded_peaks", {}).get(p)
    overhead, quiet = _op_overhead(probes, threads)
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
        "op_overhead_s": overhead, "sample_overhead_s": probes["sample_overhead_s"],
        "fractions": dict(DEFAULTS["this"]),
        "sources": {"peaks": "measured: labkit.device's bounded matmul probe (peak_flops.json)",
                    "bandwidth": "measured: best c = a + b per op size, 768 KiB to 192 MiB (roofline_probe.json)",
                    "op_overhead_s": "measured: a 1-block width-16 training step / its ATen ops",
                    "shapes": "measured: each matmul / fused-attention shape of the step, timed alone "
                              "(roofline_probe.json); the fractions apply only to shapes not timed"},
    }
