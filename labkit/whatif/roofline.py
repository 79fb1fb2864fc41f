"""The roofline arithmetic: what each group of a traced step costs on a device, one op kind at a
time (the formulas: the package docstring). Communication (DDP's buckets and a ring AllReduce -- the
course's one ring model: chapters 06 and 10 and their checkers use it too) and data (the loader) are
modelled here, not traced. Each pure piece has a hand-computed test (tests/test_predict.py).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..base.runtime import ConfigError
from ..engine.config import ModelSpec, _choice, _int, _num
from ..engine.measure import count_flops
from .devices import (DDP_FIRST_BUCKET_BYTES, DDP_OPS_PER_BUCKET, DDP_OPS_PER_PARAM, DDP_TRAFFIC_PER_GRAD_BYTE,
                      GROUPS)
from .trace import FOLD_ABOVE_LAYERS, StepTrace

__all__ = ["GroupCost", "roofline_s", "op_roofline_s", "Link", "LINKS", "ring_bytes_sent", "ring_allreduce_s",
           "allreduce_calls", "update_time", "sweep", "crossover", "flops_compute_s", "ddp_buckets", "data_time_s",
           "bandwidth_at", "memory_s"]


def roofline_s(flops: float, nbytes: float, peak_flops: float, bandwidth: float,
               flops_fraction: float = 1.0, bandwidth_fraction: float = 1.0) -> tuple:
    """(seconds, bound): the slower of doing the arithmetic and moving the bytes -- the roofline;
    bound "compute" when the arithmetic takes longer, else "memory" (so is a zero-FLOP op)."""
    compute = flops / (peak_flops * flops_fraction) if flops else 0.0
    memory = nbytes / (bandwidth * bandwidth_fraction) if nbytes else 0.0
    return max(compute, memory), ("compute" if compute > memory else "memory")


def op_roofline_s(kernel_s: float, nbytes: float, bandwidth: float) -> tuple:
    """(seconds, bound) of an element-wise call timed alone (``devices.probe_ops``): the slower of
    that kernel time (a GELU's erf, which the ``c = a + b`` curve does not see) and its bytes at the
    bandwidth they get in the step; "compute" when the kernel's time is the larger."""
    memory = nbytes / bandwidth if nbytes else 0.0
    return max(kernel_s, memory), ("compute" if kernel_s > memory else "memory")


@dataclass(frozen=True)
class Link:
    """One kind of interconnect: per-direction bandwidth per GPU (bytes/s) and per-step latency (s)."""

    name: str
    bandwidth: float   # bytes per second, one direction, per GPU
    latency: float     # seconds per ring step -- an ASSUMPTION, see LINKS
    note: str = ""


# Bandwidths (per direction, per GPU):
#  - NVLink 4 on H100/H200 SXM: 18 links x 25 GB/s = 450 GB/s each way (900 GB/s total), NVIDIA H100
#    datasheet / Hopper architecture whitepaper. Inside one 8-GPU node (NVSwitch) only.
#  - InfiniBand NDR: 400 Gb/s per port = 50 GB/s per direction (NVIDIA ConnectX-7 / Quantum-2 datasheets),
#    one port per GPU as in DGX H100.
#  - 25 Gb/s Ethernet: 25e9 / 8 = 3.125 GB/s per direction, before protocol overhead.
# Latencies are ASSUMPTIONS for illustration (order of magnitude of one hop incl. software): a few
# microseconds for NVLink, about 5 us for InfiniBand with RDMA, tens of microseconds for TCP over Ethernet.
LINKS = {
    "nvlink": Link("NVLink 4 (H100/H200 SXM)", 450e9, 3e-6, "inside one node of 8 GPUs only"),
    "infiniband": Link("InfiniBand NDR 400 Gb/s", 50e9, 5e-6, "one 400 Gb/s port per GPU"),
    "ethernet": Link("Ethernet 25 Gb/s", 25e9 / 8, 30e-6, "TCP, no RDMA"),
}
MAX_GPUS = 1 << 30  # far beyond any cluster: a bound that catches a typo, not a claim


def count(name, n, lo=1):
    _int(name, n, lo, MAX_GPUS)


def amount(name, v, *, positive=False):
    _num(name, v, 0.0, 1e30, lo_open=positive)  # finite and not negative (a NaN or -4 GPUs is a typo)


def ring_bytes_sent(nbytes: float, n: int) -> float:
    """Bytes each GPU sends (and receives) in a ring AllReduce of ``nbytes`` over ``n`` GPUs: a
    reduce-scatter then an all-gather, n-1 steps each of nbytes/n."""
    amount("nbytes", nbytes)
    count("n", n)
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes


def ring_allreduce_s(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds for one ring AllReduce of ``nbytes`` over ``n`` devices: 2(n-1)/n x bytes / bandwidth
    + 2(n-1) x latency (bytes/s per direction). NCCL also uses trees and hierarchical rings, so at
    large n it does better than this flat ring: an order-of-magnitude guide."""
    amount("bandwidth", bandwidth, positive=True)
    amount("latency", latency)
    sent = ring_bytes_sent(nbytes, n)
    return sent / bandwidth + 2 * (n - 1) * latency


def allreduce_calls(n_buckets: int, accum: int, ddp_sync: str = "no_sync") -> int:
    """AllReduce calls per optimizer update on each GPU: one per bucket per synchronisation (once
    per update with ``no_sync``, after each of the K micro-batches with ``every_micro``)."""
    count("n_buckets", n_buckets)
    count("accum", accum)
    _choice("ddp_sync", ddp_sync, ("no_sync", "every_micro"))
    return n_buckets * (accum if ddp_sync == "every_micro" else 1)


# ---- one optimizer update on n GPUs: compute, the ring AllReduces, what overlap hides (chapter 06) ----

def update_time(compute_micro_s: float, grad_bytes: float, n: int, link: Link, *, accum: int = 1,
                n_buckets: int = 1, ddp_sync: str = "no_sync", overlap: float = 0.0) -> dict:
    """One optimizer update on each of ``n`` GPUs: compute = K × one micro-batch; communication =
    the update's AllReduce calls of ``grad_bytes / n_buckets`` each. ``overlap`` (0..1): the share
    of the synchronising micro-batch's backward (2/3 of its compute) they hide behind (0:
    pessimistic)."""
    amount("compute_micro_s", compute_micro_s)
    if not isinstance(link, Link):
        raise ConfigError("link", link, "a roofline.Link, e.g. LINKS['infiniband']")
    _num("overlap", overlap, 0.0, 1.0)
    calls = allreduce_calls(n_buckets, accum, ddp_sync)
    per_call = ring_allreduce_s(grad_bytes / n_buckets, n, link.bandwidth, link.latency)
    comm = calls * per_call
    compute = accum * compute_micro_s
    syncs = accum if ddp_sync == "every_micro" else 1
    hideable = overlap * (2 / 3) * compute_micro_s * syncs
    exposed = max(0.0, comm - hideable)
    total = compute + exposed
    return {"n": n, "link": link.name, "accum": accum, "calls": calls, "compute_s": compute, "comm_s": comm,
            "exposed_comm_s": exposed, "total_s": total, "comm_frac": exposed / total if total else 0.0}


def sweep(compute_micro_s: float, grad_bytes: float, ns=(8, 64, 512), links=None, accums=(1,), **kw) -> list:
    """``update_time`` for every GPU count x link x accumulation: rows for a table or a chart."""
    links = LINKS if links is None else links
    if not isinstance(links, dict) or not links:
        raise ConfigError("links", links, "a dict of name -> Link, like LINKS")
    for name, values in (("ns", ns), ("accums", accums)):
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or not list(values):
            raise ConfigError(name, values, "a list of whole numbers, e.g. (8, 64, 512)")
    return [update_time(compute_micro_s, grad_bytes, n, link, accum=k, **kw)
            for key, link in links.items() for k in accums for n in ns]


def crossover(compute_micro_s: float, grad_bytes: float, link: Link, *, accum: int = 1, max_n: int = 1 << 20,
              **kw):
    """Smallest GPU count at which exposed communication takes at least as long as compute (None if it never
    does up to ``max_n``). Searches powers of two, then bisects."""
    _int("max_n", max_n, 2, MAX_GPUS)
    update_time(compute_micro_s, grad_bytes, 2, link, accum=accum, **kw)  # every argument checked once, up front

    def dominated(n):
        r = update_time(compute_micro_s, grad_bytes, n, link, accum=accum, **kw)
        return r["exposed_comm_s"] >= r["compute_s"]

    n = 2
    while n <= max_n and not dominated(n):
        n *= 2
    if n > max_n:
        return None
    lo, hi = n // 2, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if dominated(mid):
            hi = mid
        else:
            lo = mid
    return hi


def flops_compute_s(flops_per_micro: float, peak_flops: float, mfu: float) -> float:
    """Seconds of one micro-batch at a given MFU: an ASSUMED utilisation turns FLOPs into time."""
    amount("flops_per_micro", flops_per_micro)
    amount("peak_flops", peak_flops, positive=True)
    _num("mfu", mfu, 0.0, 1.0, lo_open=True)
    return flops_per_micro / (peak_flops * mfu)


def ddp_buckets(param_bytes: list, cap_bytes: float, first_bytes: float = DDP_FIRST_BUCKET_BYTES) -> list:
    """Bytes of each DDP gradient bucket: parameters in reverse order (as gradients become ready),
    filled greedily up to 1 MiB for the first and ``cap_bytes`` for the rest (DDP's rule after its
    first step)."""
    buckets, current, limit = [], 0, first_bytes
    for nbytes in reversed(param_bytes):
        if current and current + nbytes > limit:
            buckets.append(current)
            current, limit = 0, cap_bytes
        current += nbytes
    if current:
        buckets.append(current)
    return buckets


def data_time_s(samples: int, data_cost_ms: float, workers: int, sample_overhead_s: float,
                hidden_s: float = 0.0) -> float:
    """Seconds the step waits for data: every sample's cost without workers; with ``workers``
    processes preparing beside the step, only what they cannot finish within ``hidden_s`` (the rest
    of the step)."""
    load = samples * (data_cost_ms / 1000.0 + sample_overhead_s)
    if workers <= 0:
        return load
    return max(0.0, load / workers - hidden_s)


def bandwidth_at(dev: dict, op_bytes: float) -> float:
    """Bytes/s for an op that touches ``op_bytes``: a GPU entry's one figure, or a measured CPU's
    curve (data that fits a cache streams faster) interpolated in log(size), flat beyond its
    ends."""
    curve = dev.get("bandwidth_curve")
    if not curve:
        return dev["bandwidth"]
    if op_bytes <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if op_bytes <= x1:
            t = (math.log(op_bytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    return curve[-1][1]


def memory_s(by_size: dict, dev: dict, bandwidth_fraction: float = 1.0) -> float:
    """Seconds to move ``by_size`` ({size class: bytes}) at the bandwidth each size class gets."""
    return sum(v / (bandwidth_at(dev, 2 ** (b + 0.5)) * bandwidth_fraction) for b, v in by_size.items() if v)


@dataclass
class GroupCost:
    """One group's share of a step: FLOPs and bytes per update, and its predicted time ``time_s =
    compute_s + memory_s + overhead_s`` (the ops whose arithmetic, resp. bytes, is their slower
    part; issuing them). ``bound``: the larger of the two ("overhead" for the fixed group)."""

    flops: float
    bytes: float
    n_ops: int
    time_s: float
    bound: str            # "compute" or "memory" (for communication: the link or the local copies)
    compute_s: float = 0.0
    memory_s: float = 0.0
    overhead_s: float = 0.0


def _matmul_peak(dev: dict, fmt: str, precision: str) -> float:
    """The peak a matmul of number format ``fmt`` runs at: fp32 matmuls use TF32 units when precision is tf32."""
    if fmt == "fp32" and precision == "tf32":
        return dev["peak_flops"]["tf32"]
    return dev["peak_flops"].get(fmt) or dev["peak_flops"]["fp32"]


def _group_cost(kinds, dev: dict, precision: str, flops_fraction: float, bw_fraction: float,
                overhead_s: float) -> GroupCost:
    """A group's cost: each op kind's calls x ``roofline_s`` of one call, summed, plus issuing every
    op. ``kinds``: rows with "count", "flops" (one call), "fmt", "bytes" (all calls), optionally
    "shape" (a timed matmul shape runs at its rate, a timed element-wise call by ``op_roofline_s``)
    and "stream" (on a CPU, the size whose bandwidth its bytes get; default the op's own)."""
    rates, op_times = dev.get("shape_rates") or {}, dev.get("op_times") or {}
    compute = memory = flops = nbytes = 0.0
    n_ops = 0
    for r in kinds:
        n = r["count"]
        if n <= 0:
            continue
        per_call = r["bytes"] / n
        bandwidth = bandwidth_at(dev, r.get("stream") or per_call)
        kernel_s = op_times.get(r.get("shape")) if not r["flops"] else None
        if kernel_s is not None:  # an element-wise call timed at its own shapes: its arithmetic may be slower
            secs, bound = op_roofline_s(kernel_s, per_call, bandwidth * bw_fraction)
        else:
            peak = rates.get(r.get("shape")) or (
                _matmul_peak(dev, r["fmt"], precision) * flops_fraction if r["flops"] else 1.0)
            secs, bound = roofline_s(r["flops"], per_call, peak, bandwidth, 1.0, bw_fraction)
        if bound == "compute":
            compute += n * secs
        else:
            memory += n * secs
        flops, nbytes, n_ops = flops + n * r["flops"], nbytes + r["bytes"], n_ops + n
    over = n_ops * overhead_s
    return GroupCost(flops=float(flops), bytes=float(nbytes), n_ops=int(n_ops), time_s=compute + memory + over,
                     bound="compute" if compute > memory else "memory", compute_s=compute, memory_s=memory,
                     overhead_s=over)


def _kinds_of(trace: StepTrace, group: str, phases: tuple, times: int = 1, stream=None) -> list:
    """The trace's op kinds of one group in ``phases``, each run ``times`` times (K micro-batches)."""
    return [{**r, "count": r["count"] * times, "bytes": r["bytes"] * times, "stream": stream}
            for r in trace.kinds if r["group"] == group and r["phase"] in phases]


_MICRO = ("forward", "backward")


def _step_groups(config, trace, dev, precision, fr, overhead, latency, per_update=0.0) -> dict:
    """Every group's GroupCost for one optimizer update (K micro-batches, one optimizer step);
    the "overhead" group is the overhead term's fixed part, the per-op part stays with each
    group's ops."""
    K = config.accum
    # Weights, gradients and optimizer state are touched about once per update, so by the time an update
    # comes back to one of them the rest of the step has passed through the caches: on a measured CPU their
    # traffic (optimizer, gradient accumulation, DDP's bucket copies) streams at the bandwidth of the whole
    # state's size, not of one op's (its "reuse distance"). Activations are read right after they are made.
    state = trace.param_bytes + trace.grad_bytes + trace.optimizer_bytes
    # from the second micro-batch on, autograd adds each new gradient into .grad: one in-place add per
    # parameter tensor (read both, write one)
    accumulate = [{"count": K - 1, "flops": 0, "fmt": None, "bytes": 3 * b * (K - 1), "stream": state}
                  for b in trace.param_sizes]
    fraction_for = {"matmul": fr["matmul_fraction"], "attention": fr["attention_fraction"]}
    groups = {}
    for g in ("matmul", "attention", "elementwise"):
        kinds = _kinds_of(trace, g, _MICRO, K) + (accumulate if g == "elementwise" else [])
        groups[g] = _group_cost(kinds, dev, precision, fraction_for.get(g, 1.0), fr["bandwidth_fraction"], overhead)
    opt = [k for g in GROUPS for k in _kinds_of(trace, g, ("optimizer",), stream=state)]
    groups["optimizer"] = _group_cost(opt, dev, precision, 1.0, fr["bandwidth_fraction"], overhead)
    groups["communication"] = _communication(config, trace, dev, fr["bandwidth_fraction"], overhead, latency)
    busy = sum(g.time_s for g in groups.values())
    data_s = data_time_s(config.micro_batch * K, config.data_cost_ms, config.workers, dev["sample_overhead_s"],
                         hidden_s=busy)
    groups["data"] = GroupCost(flops=0.0, bytes=0.0, n_ops=0, time_s=data_s, bound="compute", compute_s=data_s)
    groups["overhead"] = GroupCost(flops=0.0, bytes=0.0, n_ops=0, time_s=per_update, bound="overhead",
                                   overhead_s=per_update)
    return groups


def _model_flops(spec: ModelSpec) -> int:
    """measure.count_flops of a forward+backward, at a cost that does not grow with depth: FLOPs are
    affine in the number of (identical) blocks, so a deep model's count is 1 block's + (L-1) x one more."""
    if spec.n_layer <= FOLD_ABOVE_LAYERS:
        return count_flops(spec)
    one, two = (count_flops(dataclasses.replace(spec, n_layer=n)) for n in (1, 2))
    return one + (spec.n_layer - 1) * (two - one)


def _communication(config, trace, dev, bw_fraction, overhead, latency) -> GroupCost:
    """DDP's share: local bucket copies each synchronisation, plus ring AllReduces over the link."""
    syncs = config.accum if config.ddp_sync == "every_micro" else 1
    buckets = ddp_buckets(list(trace.param_sizes), config.bucket_cap_mb * 2**20)
    wire = 0.5 if config.comm_hook in ("fp16_compress", "bf16_compress") else 1.0  # 16-bit on the wire
    ring = syncs * sum(ring_allreduce_s(b * wire, config.world_size, dev["link_bandwidth"], latency) for b in buckets)
    local = syncs * DDP_TRAFFIC_PER_GRAD_BYTE * trace.grad_bytes
    # each parameter's gradient is copied in and out (2 x 2 x its bytes), each bucket divided (2 x its bytes)
    memory = local / (bandwidth_at(dev, trace.param_bytes + trace.grad_bytes + trace.optimizer_bytes) * bw_fraction)
    n = syncs * (DDP_OPS_PER_PARAM * len(trace.param_sizes) + DDP_OPS_PER_BUCKET * len(buckets))
    over = n * overhead
    sent = syncs * sum(ring_bytes_sent(b * wire, config.world_size) for b in buckets)
    return GroupCost(flops=0.0, bytes=float(local + sent), n_ops=int(n), time_s=memory + ring + over,
                     bound="memory", compute_s=0.0, memory_s=memory + ring, overhead_s=over)


def _memory(config, trace, dev) -> dict:
    """Bytes held at the start of backward (a step's peak, less transient workspaces), by part; the
    activations and autocast's weight copies as the trace counted them."""
    return {"weights": trace.param_bytes, "gradients": trace.grad_bytes, "optimizer_state": trace.optimizer_bytes,
            "ddp_buckets": trace.grad_bytes, "activations": trace.activation_bytes,
            "autocast_weight_copies": trace.weight_copy_bytes}
