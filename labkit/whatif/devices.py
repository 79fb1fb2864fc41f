"""What the what-if model knows about a device before it predicts: the catalogue and the model's
assumptions, and on "this" machine each element-wise call of a traced step timed at its own shapes.

``devices.json`` (beside this module) holds every device's dense peaks, memory, bandwidth and interconnect,
each number with its source; ``DEFAULTS`` holds the achievable fractions and overheads the roofline
applies to them, each with the measurement it comes from. Nothing here is fitted to a validation run.

On "this", each element-wise call of the micro-batch (``probe_ops``) is rebuilt from the trace's key
(``trace.op_key``), timed alone, and charged the slower of that time and its bytes
(``roofline.op_roofline_s``); bounded (OP_BUDGET_S per prediction) and cached like the matmul shapes
(``probes.this_op_times``). Why: charged at the speed of the bandwidth curve's ``c = a + b``, a GELU
or a LayerNorm was predicted 3.6x to 9x too fast per call (tiny preset, micro-batch 8, one thread,
2-core AVX-512 EPYC, December 2026).
"""
from __future__ import annotations

import json
import math
import time

import torch

from ..engine import gpus
from ..engine.config import ConfigError
from ..engine.gpus import value as _value

__all__ = ["GROUPS", "CATALOGUE_FILE", "DEFAULTS", "CAUSAL_FRACTION", "catalogue", "device_names",
           "op_keys", "probe_ops", "OP_BUDGET_S"]

GROUPS = ("matmul", "attention", "elementwise", "optimizer", "communication", "data", "overhead")
CATALOGUE_FILE = gpus.CATALOGUE_FILE  # labkit/whatif/devices.json

# --- Achievable fractions and overheads: the model's assumptions, never fitted to the validation runs --
#
# matmul: what large, well-shaped GEMMs reach of the dense datasheet peak. ml-engineering's "Maximum
#   Achievable Matmul FLOPS" table (stas00/ml-engineering, compute/accelerator/README.md, bf16 matmul,
#   best shape of a search): A100 SXM 267.9/312 = 85.9 %, A100 PCIe 82.2 %, GH200 83.0 %, H100 SXM
#   792.1/989 = 80.1 %, MI300X 781.9/1300 = 60.1 % (ROCm 6.2). We take 0.80 for NVIDIA and 0.60 for AMD.
#   No such measurement was found for the power-capped T4 and L4 (70-72 W): 0.80 is likely optimistic there.
#   On "this" every matmul shape is timed alone, caches swept first (probe_shapes), at its measured rate; a shape too
#   large to time runs at the measured square-matmul peak (fraction 1.0).
# attention: FlashAttention-2 (Dao, 2023) reports 50-73 % of the A100's peak for the forward pass and
#   less for the backward pass; 0.5 for forward+backward of a fused kernel (on "this": shapes not timed).
# bandwidth: device-memory copy / STREAM-triad benchmarks reach about 85-92 % of the HBM datasheet
#   figure (e.g. ~3.0-3.1 of 3.35 TB/s on an H100 SXM); 0.85. On "this" the bandwidth is measured, per op
#   size (a curve): 1.0.
# op_overhead_s: the CPU cost of issuing one ATen operation from eager PyTorch (Python, dispatcher,
#   autograd, kernel launch) is a few microseconds; 4 us on a GPU. On "this" it is measured: the slope of
#   labkit's update time over its op count (probes.probe_op_overhead).
# update_overhead_s: the per-update part of the overhead term -- the update's own Python outside the ops
#   (the training loop, autocast and no_sync contexts, optimizer.step's wrappers, reading the loss back).
#   On "this" it is measured (the same fit's intercept). On a GPU it is an ASSUMPTION, 0.5 ms: this Python
#   runs on the host CPU whatever the device; labkit's own probe measured 1.6-3.6 ms of it on a busy
#   2-core AVX2 EPYC at one thread (December 2026, the CPU validation machine), and a GPU host's core is
#   usually faster and not shared. One significant figure, no more is known: next to a GPU step of tens
#   of ms it is around 1 %, and it matters for the tiniest models only.
# link_latency_s: per ring step, an assumption of the order of one NVLink/PCIe hop plus NCCL's software
#   (roofline.LINKS uses 3 us for NVLink, 5 us for InfiniBand, 30 us for TCP over Ethernet).
# sample_overhead_s: the loader's own cost per sample (indexing a window, collating), beside
#   data_cost_ms; measured on "this", 20 us assumed elsewhere (the host CPU is unknown).
# usable_memory_fraction: CUDA's context, the caching allocator's fragmentation and workspaces take a
#   few GB of a card; 0.92 of the datasheet size counts as usable.
DEFAULTS = {
    "nvidia": {"matmul_fraction": 0.80, "attention_fraction": 0.5, "bandwidth_fraction": 0.85},
    "amd": {"matmul_fraction": 0.60, "attention_fraction": 0.5, "bandwidth_fraction": 0.85},
    "this": {"matmul_fraction": 1.0, "attention_fraction": 0.5, "bandwidth_fraction": 1.0},
    "op_overhead_s": 4e-6,
    "update_overhead_s": 5e-4,          # an ASSUMPTION on GPUs: see the comment above
    "link_latency_s": 5e-6,
    "sample_overhead_s": 20e-6,
    "usable_memory_fraction": 0.92,
    "this_link_latency_s": 30e-6,       # gloo over the loopback interface: TCP
    "this_link_bw_fraction": 0.25,      # loopback TCP copies each byte several times: 1/4 of memory bandwidth
}
CAUSAL_FRACTION = 0.5  # a fused causal kernel skips the masked upper triangle: about half the T x T work

# DDP (labkit wraps every CUDA and CPU run in it, also at world size 1): each synchronisation copies the
# gradients into flat buckets, divides them by the world size, reduces them and copies them back: about
# 6 x the gradient bytes of local traffic, 2 ops per parameter tensor and a few per bucket (comm hook,
# future, callbacks).
DDP_TRAFFIC_PER_GRAD_BYTE = 6
DDP_OPS_PER_PARAM = 2
DDP_OPS_PER_BUCKET = 8
DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES



# ---- the catalogue ---------------------------------------------------------------------------------

def catalogue() -> dict:
    """The parsed ``devices.json``: {"sources": {...}, "boards": [...], "devices": {key: {...}}} -- read once,
    by the engine's peak source (``labkit.engine.gpus``), which reads the same file for MFU."""
    return gpus.catalogue()


def device_names() -> list:
    """Every device key ``predict`` accepts: the catalogue's, then "this" (measured)."""
    return list(catalogue()["devices"]) + ["this"]


def _source_of(entry) -> str:
    """The source id of a catalogue field: its own, or its first number's (peak_tflops holds four)."""
    if "source" in entry:
        return entry["source"]
    return next(iter(entry.values()))["source"]


def _catalogue_device(name: str) -> dict:
    devs = catalogue()["devices"]
    if name not in devs:
        raise ConfigError("device", name, "one of " + ", ".join(device_names()))
    d = devs[name]
    peaks = {p: (_value(e) * 1e12 if _value(e) is not None else None) for p, e in d["peak_tflops"].items()}
    return {
        "key": name, "name": d["name"], "vendor": d["vendor"], "measured": False,
        "peak_flops": peaks,
        "hardware_units": dict(d["hardware_units"]),
        "memory_bytes": _value(d["memory_gb"]) * 1e9,
        "bandwidth": _value(d["memory_bandwidth_gbps"]) * 1e9,
        "link_bandwidth": _value(d["interconnect_gbps"]) * 1e9,
        **{k: DEFAULTS[k] for k in ("link_latency_s", "op_overhead_s", "update_overhead_s",
                                    "sample_overhead_s")},
        "fractions": dict(DEFAULTS[d["vendor"]]),
        "sources": {field: catalogue()["sources"][_source_of(d[field])]["title"]
                    for field in ("peak_tflops", "memory_gb", "memory_bandwidth_gbps", "interconnect_gbps")},
    }


# ---- this machine's element-wise calls, timed (device="this") ------------------------------------

OP_BUDGET_S = 1.0   # per prediction: new element-wise calls timed on "this" (then cached)
OP_MAX_BYTES = 2**28  # a call moving more than this (256 MiB) is not rebuilt: its bytes decide its time


def op_keys(trace) -> list:
    """Every element-wise call key ("op|...", ``trace.op_key``) of a traced micro-batch, sorted."""
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
    """{call key: seconds of its kernel} measured on this CPU: each element-wise call rebuilt on
    real tensors of its traced shapes and timed alone (the fastest of 3 to 10 calls, after a
    warm-up), until ``budget_s`` runs out, less the cost of calling any op from Python (the per-op
    overhead term charges it). A call that cannot be rebuilt, or moves more than OP_MAX_BYTES, is
    left out (charged by its bytes)."""
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
