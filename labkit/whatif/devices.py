"""The device catalogue and the model's assumptions: what the what-if model knows about a GPU before it
predicts anything.

``devices.json`` (beside this module) holds every device's dense peaks, memory, bandwidth and interconnect,
each number with its source; ``DEFAULTS`` holds the achievable fractions and overheads the roofline
applies to them, each with the measurement it comes from. Nothing here is fitted to a validation run.
"""
from __future__ import annotations

from ..engine import gpus
from ..engine.config import ConfigError
from ..engine.gpus import value as _value

__all__ = ["GROUPS", "CATALOGUE_FILE", "DEFAULTS", "CAUSAL_FRACTION", "catalogue", "device_names"]

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
        "link_latency_s": DEFAULTS["link_latency_s"],
        "op_overhead_s": DEFAULTS["op_overhead_s"],
        "update_overhead_s": DEFAULTS["update_overhead_s"],
        "sample_overhead_s": DEFAULTS["sample_overhead_s"],
        "fractions": dict(DEFAULTS[d["vendor"]]),
        "sources": {field: catalogue()["sources"][_source_of(d[field])]["title"]
                    for field in ("peak_tflops", "memory_gb", "memory_bandwidth_gbps", "interconnect_gbps")},
    }


