"""A roofline model of one training step: what a configuration *would* do on a given device -- predicted,
never measured.

    p = lk.predict(lk.Config(model="base", precision="bf16", micro_batch=32), device="h100-sxm")
    p.step_time_s, p.tokens_per_s, p.mfu, p.memory_bytes, p.fits
    p.groups["matmul"].bound                  # "compute" or "memory"
    print(p.table())

How it works
------------
1. **Trace the step once, on fake tensors.** The course's GPT runs one forward and backward pass, the
   gradient clip and the optimizer step under ``FakeTensorMode`` (shapes only: no memory, no arithmetic,
   any model size), with CPU autocast (also for a GPU prediction: CUDA autocast's cast lists differ, so
   the casts it counts are those CPU autocast inserts) and the same attention choice a real run makes.
   A dispatch mode sees every ATen operation and records its FLOPs (``FlopCounterMode``'s own formulas, as
   ``measure.count_flops`` uses) and the bytes it moves (every input plus every output; a view moves
   none), and which tensors are still alive when the forward pass ends (the activations).
2. **Group the operations** for display: matmul, attention, element-wise/normalisation, optimizer;
   communication (DDP's gradient buckets and a ring AllReduce) and data (the loader) are modelled, not
   traced. A model deeper than two blocks is not traced block by block: its blocks are identical, so
   the trace of one and two blocks (and, for checkpointing every k-th block, of a two-block model with
   one block checkpointed) gives the cost of each kind of block exactly, and the step is the sum.
   A prediction costs about the same for 2 blocks as for 256.
3. **A roofline per operation**::

       op time = max(FLOPs / (peak x flops_fraction), bytes / (bandwidth x bandwidth_fraction))
       group time = sum of its ops' times + n_ops x per-op overhead

   Each operation is charged the slower of its own arithmetic and its own memory traffic, and the
   times are added. Taking the max once per group instead (its summed FLOPs against its summed bytes)
   would let a memory-bound small kernel hide behind a compute-bound large one, as if the two ran at
   the same time; on a GPU they run one after the other. A group's ``bound`` says which kind of op
   took most of its time.
   The step time is the **sum** of the groups: nothing overlaps (no compute during the AllReduce,
   no kernel hiding another's launch). The one exception: loader *workers* run beside the step, so
   only the part of their time the step cannot hide is added. Real GPUs overlap more than this, so
   the model leans slow where communication or launches matter.

The peaks, bandwidths and memory sizes come from ``devices.json`` (datasheets, each number with its
source). ``device="this"`` measures instead: the bounded, cached matmul probe of ``labkit.device``, a
memory-bandwidth probe and a per-operation overhead probe (this module; at most ~1 s, cached), and each
matmul and fused-attention shape of the step timed alone (bounded, cached): the achievable FLOP/s at the
model's own shapes. A probe is watched while it runs: when other programs used the cores it needed, or
its repeats disagree, its figures are kept for this process only (never cached), measured again on a
later prediction, and the prediction carries a ``caveat`` saying so. On a CPU the bandwidth is a curve
over the op's size: a small op's data stays in cache and streams several times faster than memory, so
an activation op's bytes are charged at the bandwidth of its size, while the weights, gradients and
optimizer state -- touched once per update -- stream at the bandwidth of their total size.
A GPU entry has one figure, its datasheet bandwidth.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import json
import math
import sys
import time
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..base.numfmt import counted
from ..engine import device as _device
from ..engine.config import Config, ConfigError, ModelSpec, _choice, _int, _num
from ..engine.measure import LoadMeter, attention_backend, count_flops, optimizer_bytes, state_bytes
from ..engine.model import GPT
from ..base.paths import cache_dir, read_json, write_json_atomic
from ..engine.precision import autocast
from ..base.progress import Progress

__all__ = ["predict", "Prediction", "GroupCost", "catalogue", "device_names", "trace_step", "StepTrace",
           "roofline_s", "ring_allreduce_s", "ddp_buckets", "data_time_s", "size_class", "bandwidth_at",
           "memory_s", "probe_bandwidth", "probe_op_overhead", "this_probes", "shape_keys", "probe_shapes",
           "this_shape_rates", "this_device", "DEFAULTS", "GROUPS", "error_rows", "error_sentence"]

GROUPS = ("matmul", "attention", "elementwise", "optimizer", "communication", "data")
CATALOGUE_FILE = Path(__file__).with_name("devices.json")

# --- Achievable fractions and overheads: the model's assumptions, never fitted to the validation runs --
#
# matmul: what large, well-shaped GEMMs reach of the dense datasheet peak. ml-engineering's "Maximum
#   Achievable Matmul FLOPS" table (stas00/ml-engineering, compute/accelerator/README.md, bf16 matmul,
#   best shape of a search): A100 SXM 267.9/312 = 85.9 %, A100 PCIe 82.2 %, GH200 83.0 %, H100 SXM
#   792.1/989 = 80.1 %, MI300X 781.9/1300 = 60.1 % (ROCm 6.2). We take 0.80 for NVIDIA and 0.60 for AMD.
#   No such measurement was found for the power-capped T4 and L4 (70-72 W): 0.80 is likely optimistic there.
#   On "this" every matmul shape is timed alone (probe_shapes) and runs at its measured rate; a shape too
#   large to time runs at the measured square-matmul peak (fraction 1.0).
# attention: FlashAttention-2 (Dao, 2023) reports 50-73 % of the A100's peak for the forward pass and
#   less for the backward pass; 0.5 for forward+backward of a fused kernel (on "this": shapes not timed).
# bandwidth: device-memory copy / STREAM-triad benchmarks reach about 85-92 % of the HBM datasheet
#   figure (e.g. ~3.0-3.1 of 3.35 TB/s on an H100 SXM); 0.85. On "this" the bandwidth is measured, per op
#   size (a curve): 1.0.
# op_overhead_s: the CPU cost of issuing one ATen operation from eager PyTorch (Python, dispatcher,
#   autograd, kernel launch) is a few microseconds; 4 us on a GPU. On "this" it is measured.
# link_latency_s: per ring step, an assumption of the order of one NVLink/PCIe hop plus NCCL's software
#   (labkit.netmodel uses 3 us for NVLink, 5 us for InfiniBand, 30 us for TCP over Ethernet).
# sample_overhead_s: the loader's own cost per sample (indexing a window, collating), beside
#   data_cost_ms; measured on "this", 20 us assumed elsewhere (the host CPU is unknown).
# usable_memory_fraction: CUDA's context, the caching allocator's fragmentation and workspaces take a
#   few GB of a card; 0.92 of the datasheet size counts as usable.
DEFAULTS = {
    "nvidia": {"matmul_fraction": 0.80, "attention_fraction": 0.5, "bandwidth_fraction": 0.85},
    "amd": {"matmul_fraction": 0.60, "attention_fraction": 0.5, "bandwidth_fraction": 0.85},
    "this": {"matmul_fraction": 1.0, "attention_fraction": 0.5, "bandwidth_fraction": 1.0},
    "op_overhead_s": 4e-6,
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

@functools.lru_cache(maxsize=1)
def catalogue() -> dict:
    """The parsed ``devices.json``: {"sources": {...}, "devices": {key: {...}}}."""
    return json.loads(CATALOGUE_FILE.read_text())


def device_names() -> list:
    """Every device key ``predict`` accepts: the catalogue's, then "this" (measured)."""
    return list(catalogue()["devices"]) + ["this"]


def _value(entry) -> Optional[float]:
    return entry.get("value") if isinstance(entry, dict) else entry


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
        "sample_overhead_s": DEFAULTS["sample_overhead_s"],
        "fractions": dict(DEFAULTS[d["vendor"]]),
        "sources": {field: catalogue()["sources"][_source_of(d[field])]["title"]
                    for field in ("peak_tflops", "memory_gb", "memory_bandwidth_gbps", "interconnect_gbps")},
    }


# ---- pure arithmetic (each piece has a hand-computed test) ------------------------------------------

def roofline_s(flops: float, nbytes: float, peak_flops: float, bandwidth: float,
               flops_fraction: float = 1.0, bandwidth_fraction: float = 1.0) -> tuple:
    """(seconds, bound): the slower of doing the arithmetic and moving the bytes -- the roofline.

    bound is "compute" when the arithmetic takes longer, else "memory". A zero-FLOP op (a copy, an
    add that the FLOP counter does not count) is memory-bound by definition."""
    compute = flops / (peak_flops * flops_fraction) if flops else 0.0
    memory = nbytes / (bandwidth * bandwidth_fraction) if nbytes else 0.0
    return max(compute, memory), ("compute" if compute > memory else "memory")


def ring_allreduce_s(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """Ring AllReduce of ``nbytes`` over ``n`` devices: 2(n-1)/n x bytes / bandwidth + 2(n-1) x latency
    (a reduce-scatter then an all-gather, n-1 steps each; the same model as ``labkit.netmodel``).
    ``bandwidth`` in bytes/s per direction. One device: nothing to send."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def ddp_buckets(param_bytes: list, cap_bytes: float, first_bytes: float = DDP_FIRST_BUCKET_BYTES) -> list:
    """Bytes of each DDP gradient bucket: parameters in reverse order (the order gradients become ready),
    filled greedily up to 1 MiB for the first bucket and ``cap_bytes`` (bucket_cap_mb) for the rest --
    DDP's rule after its first iteration. A parameter larger than the cap gets a bucket of its own."""
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
    """Seconds the step waits for data. Without workers the main process prepares every sample in the
    step (``samples`` x (data_cost_ms + the loader's own cost)). With ``workers`` processes the batches
    are prepared beside the step: only what ``workers`` in parallel cannot finish within ``hidden_s``
    (the rest of the step) is added."""
    load = samples * (data_cost_ms / 1000.0 + sample_overhead_s)
    if workers <= 0:
        return load
    return max(0.0, load / workers - hidden_s)


def size_class(nbytes: float) -> int:
    """The power of two just below an op's bytes: ops are binned by how much data they touch."""
    return max(0, int(math.log2(nbytes))) if nbytes >= 1 else 0


def bandwidth_at(dev: dict, op_bytes: float) -> float:
    """Bytes/s for an op that touches ``op_bytes``. A GPU entry has one figure (its memory bandwidth). A
    measured CPU has a curve, (op bytes, bytes/s) points from the probe: an op whose data fits in a cache
    streams at that cache's speed, several times faster than one that must come from memory (how many
    times depends on the machine: ``this_probes`` measures it), so the curve is interpolated in
    log(size) and held flat beyond its ends."""
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


# ---- the traced step ---------------------------------------------------------------------------------

_MATMUL_OPS = {"mm", "addmm", "addmv", "mv", "matmul", "linear", "_addmm_activation", "dot"}
_ATTENTION_OPS = {"bmm", "baddbmm", "_softmax", "_safe_softmax", "_softmax_backward_data",
                  "scaled_dot_product_attention"}


def _is_attention_sdpa(name: str) -> bool:
    return name.startswith(("_scaled_dot_product", "_flash_attention", "_efficient_attention"))


def _tensors(x) -> list:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _nbytes(ts) -> int:
    seen, total = set(), 0
    for t in ts:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _fmt(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


class _Recorder(TorchDispatchMode):
    """Every ATen op of the traced step, by *kind*: (phase, group, op name, number format, FLOPs and bytes
    of one call, matmul/attention shape) -> [calls, bytes]; and which storages are alive when the
    forward pass ends (activations, autocast weight copies). Calls of one kind cost the same, so the
    roofline is charged per kind (see ``_group_cost``)."""

    def __init__(self, param_keys: set, seq_len: int):
        super().__init__()
        self.param_keys, self.T = param_keys, seq_len
        self.phase = "forward"
        self.kinds: dict = {}    # kind key (see _kind_key) -> [calls, bytes moved by all of them]
        self.live: dict = {}     # storage key -> (weak ref, bytes, is an autocast weight copy)
        self.kept = (0, 0)       # (activation bytes, weight-copy bytes) alive after the forward pass

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "prim":  # FakeTensorMode's own queries (prim.device): not work a real run does
            return out
        name = func.overloadpacket.__name__
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        group = self._group(name, ins + outs)
        flops, fmt = self._flops(func, name, args, kwargs, out, ins)
        moved = 0 if func.is_view else _nbytes(ins) + _nbytes(outs)
        shape = shape_key(name, args, kwargs) if flops else None  # a measured CPU times each one (probe_shapes)
        cell = self.kinds.setdefault(_kind_key(self.phase, group, name, fmt if flops else None, flops, moved,
                                               shape), [0, 0])
        cell[0] += 1
        cell[1] += moved
        if self.phase == "forward":
            self._remember(func, ins, outs)
        return out

    @property
    def ops(self) -> dict:
        """(phase, group, op name) -> [calls, FLOPs, bytes] summed over the op's kinds (for tables, tests)."""
        rows = {}
        for (phase, group, name, _, flops, _, _), (n, moved) in self.kinds.items():
            row = rows.setdefault((phase, group, name), [0, 0, 0])
            row[0] += n
            row[1] += n * flops
            row[2] += moved
        return rows

    def _group(self, name: str, tensors: list) -> str:
        if self.phase in ("optimizer", "setup"):
            return "optimizer"
        if name in _MATMUL_OPS:
            return "matmul"
        if name in _ATTENTION_OPS or _is_attention_sdpa(name):
            return "attention"
        # the math attention backend's mask and score tensors: (B, H, T, T) or a (T, T) mask
        for t in tensors:
            if (t.dim() == 4 and tuple(t.shape[-2:]) == (self.T, self.T)) or (
                    t.dim() == 2 and t.dtype == torch.bool and tuple(t.shape) == (self.T, self.T)):
                return "attention"
        return "elementwise"

    def _flops(self, func, name, args, kwargs, out, ins) -> tuple:
        """(FLOPs, number format): FlopCounterMode's formulas; the CPU fused attention kernels, which it
        counts as 0, from its own SDPA formulas -- halved for a causal kernel, which skips the masked half."""
        fmt = _fmt(ins[0].dtype) if ins else "fp32"
        if name == "_scaled_dot_product_flash_attention_for_cpu":
            q, k, v = args[:3]
            causal = bool(args[4]) if len(args) > 4 else bool(kwargs.get("is_causal", False))
            f = sdpa_flop_count(q.shape, k.shape, v.shape)
            return int(f * (CAUSAL_FRACTION if causal else 1.0)), fmt
        if name == "_scaled_dot_product_flash_attention_for_cpu_backward":
            grad_out, q, k, v = args[:4]
            causal = bool(args[7]) if len(args) > 7 else bool(kwargs.get("is_causal", False))
            f = sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)
            return int(f * (CAUSAL_FRACTION if causal else 1.0)), _fmt(q.dtype)
        counter = flop_registry.get(func.overloadpacket)
        if counter is None:
            return 0, fmt
        return int(counter(*args, **kwargs, out_val=out)), fmt

    def _remember(self, func, ins, outs):
        """Track the storages the forward pass creates (keyed like memtrace: one entry per storage)."""
        copy = func is torch.ops.aten._to_copy.default and any(
            StorageWeakRef(t.untyped_storage()).cdata in self.param_keys for t in ins)
        for t in outs:
            ref = StorageWeakRef(t.untyped_storage())
            if ref.cdata in self.param_keys:
                continue  # a view of a parameter, not an activation
            old = self.live.get(ref.cdata)
            if old is not None and not old[0].expired():
                continue  # a view or an in-place result: the same storage, already counted
            self.live[ref.cdata] = (ref, t.untyped_storage().nbytes(), copy)

    def end_forward(self):
        acts = copies = 0
        for ref, nbytes, copy in self.live.values():
            if not ref.expired():
                if copy:
                    copies += nbytes
                else:
                    acts += nbytes
        self.kept = (acts, copies)
        self.live.clear()


def _kind_key(phase, group, name, fmt, flops, moved, shape) -> tuple:
    """What decides one op call's cost. In the optimizer update the bytes are left out of the key and
    summed: a multi-tensor (``_foreach_*``) call, or the clip's stack of every parameter's norm, moves
    bytes that grow with the model (which keeps the block-by-block sum of ``_folded`` exact), and the
    update's bytes all stream at the bandwidth of the model's state, whatever one call's size."""
    return phase, group, name, fmt, flops, None if phase == "optimizer" or name.startswith("_foreach") else moved, shape


@dataclass(frozen=True)
class StepTrace:
    """One traced micro-batch (forward + backward) and one optimizer update.

    ``kinds``: every op kind, {"phase", "group", "op", "fmt", "flops" (one call), "count", "bytes" (all calls),
    "shape"} -- what the roofline is charged on, one op at a time;
    ``micro`` and ``update``: their totals per group, {group: {"flops": {format: FLOPs}, "bytes": int,
    "n_ops": int, "by_size": {size class: bytes}, "shapes": {shape key: [calls, FLOPs]}}} (see
    ``size_class`` and ``shape_key``), for display;
    ``ops``: per op name, the totals with phase and group (for tables)."""

    micro: dict
    update: dict
    ops: tuple
    activation_bytes: int
    weight_copy_bytes: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    param_sizes: tuple     # bytes of each parameter tensor, in model order (for DDP's buckets)
    kinds: tuple = ()


def _spec_for(config: Config) -> ModelSpec:
    s = config.spec
    return ModelSpec(s.n_layer, s.d_model, s.n_head, s.seq_len)


FOLD_ABOVE_LAYERS = 2  # deeper models are predicted from traces of 1- and 2-block models (see _folded)


def trace_step(config: Config, *, precision: Optional[str] = None, foreach: bool = False) -> StepTrace:
    """Trace one micro-batch and one optimizer update of ``config`` on fake tensors (see the module
    docstring). ``foreach``: the optimizer and the gradient clip use the multi-tensor kernels, as
    PyTorch does by default on CUDA (on a CPU it loops over the tensors). A model of more than
    FOLD_ABOVE_LAYERS blocks is summed from small traces (``_folded``): the same totals, at a cost
    that does not grow with depth."""
    spec = _spec_for(config)
    choices = (config.micro_batch, precision or config.precision, config.checkpointing, config.checkpoint_every,
               config.attention if config.attention != "efficient" else "auto", config.optimizer,
               bool(config.grad_clip), foreach)
    if spec.n_layer > FOLD_ABOVE_LAYERS:
        return _folded(spec, *choices)
    return _trace(spec, *choices)


@functools.lru_cache(maxsize=32)  # a pure function of shapes and choices: a sweep traces each once
def _trace(spec, batch, precision, checkpointing, every, attention, optimizer, clip, foreach) -> StepTrace:
    with torch.random.fork_rng(devices=[]), FakeTensorMode(allow_non_fake_inputs=True):
        model = GPT(spec, checkpointing_mode=checkpointing, checkpoint_every=every)
        idx = torch.zeros(batch, spec.seq_len, dtype=torch.long)
        params = list(model.parameters())
        keys = {StorageWeakRef(p.untyped_storage()).cdata for p in params}
        if optimizer == "sgd":
            opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
        else:
            opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=foreach)
        rec = _Recorder(keys, spec.seq_len)
        with rec, attention_backend(attention):  # backward too, as in train.run: a recomputed block's attention
            with autocast("cpu", precision):      # must take the same kernel its forward took
                loss = model(idx, idx)
            rec.end_forward()
            rec.phase = "backward"
            loss.backward()
            del loss
            rec.phase = "setup"  # the first optimizer step creates its state: once per run, not traced
            opt.step()
            rec.phase = "optimizer"  # a steady update: clip, then step
            if clip:
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=foreach)
            opt.step()  # labkit's zero_grad(set_to_none=True) runs no op: left out
        sizes = {"param_bytes": state_bytes(params), "grad_bytes": state_bytes(p.grad for p in params),
                 "optimizer_bytes": optimizer_bytes(opt),
                 "param_sizes": tuple(p.numel() * p.element_size() for p in params)}
    kinds = {k: v for k, v in rec.kinds.items() if k[0] != "setup"}
    return _step_trace(kinds, activation_bytes=rec.kept[0], weight_copy_bytes=rec.kept[1], **sizes)


def _step_trace(kinds: dict, **fields) -> StepTrace:
    """A StepTrace from op kinds ({kind key: [calls, bytes]}): the kinds as rows, their group totals."""
    rows, micro, update, ops = [], {}, {}, {}
    for (phase, group, name, fmt, flops, _, shape), (n, moved) in sorted(kinds.items(), key=repr):
        if n <= 0:
            continue
        rows.append({"phase": phase, "group": group, "op": name, "fmt": fmt, "flops": flops, "count": n,
                     "bytes": moved, "shape": shape})
        g = (update if phase == "optimizer" else micro).setdefault(
            group, {"flops": {}, "bytes": 0, "n_ops": 0, "by_size": {}, "shapes": {}})
        g["bytes"] += moved
        g["n_ops"] += n
        if flops:
            g["flops"][fmt] = g["flops"].get(fmt, 0) + n * flops
        if moved:  # bytes by the op's size class: on a CPU a small op's data stays in cache
            b = size_class(moved / n)
            g["by_size"][b] = g["by_size"].get(b, 0) + moved
        if shape is not None:
            cell = g["shapes"].setdefault(shape, [0, 0])
            cell[0] += n
            cell[1] += n * flops
        row = ops.setdefault((phase, group, name), {"phase": phase, "group": group, "op": name, "count": 0,
                                                    "flops": 0, "bytes": 0})
        row["count"] += n
        row["flops"] += n * flops
        row["bytes"] += moved
    return StepTrace(micro=micro, update=update, ops=tuple(ops.values()), kinds=tuple(rows), **fields)


def _raw_kinds(trace: StepTrace) -> dict:
    """The inverse of _step_trace's rows: {kind key: [calls, bytes]}."""
    return {_kind_key(r["phase"], r["group"], r["op"], r["fmt"], r["flops"], r["bytes"] // r["count"], r["shape"]):
            [r["count"], r["bytes"]] for r in trace.kinds}


@functools.lru_cache(maxsize=32)
def _folded(spec, batch, precision, checkpointing, every, *rest) -> StepTrace:
    """The trace of a deep model as a sum over its blocks. Every block of one kind (checkpointed or not)
    does the same ops, so a trace is C + n_c x X_c + n_p x X_p: the embedding, head, loss and their
    optimizer work (C), and each checkpointed (X_c) and plain (X_p) block. Three small traces fix the
    three terms: A = 1 block checkpointed (C + X_c), B = 2 checkpointed (C + 2 X_c), E = 2 blocks, only
    the first checkpointed (C + X_c + X_p); without a periodic pattern every block is of one kind and A
    and B suffice. Blocks 0, k, 2k, ... are the checkpointed ones (checkpointing.wrap_fn)."""
    L = spec.n_layer

    def at(n, k):
        return _trace(dataclasses.replace(spec, n_layer=n), batch, precision, checkpointing, k, *rest)

    if checkpointing in ("full", "attention") and every > 1:
        n_c = -(-L // every)  # ceil(L / every): blocks 0, every, 2 x every, ... below L
        parts = ((at(1, 1), 1 - (n_c - 1) - (L - n_c)), (at(2, 1), n_c - 1), (at(2, 2), L - n_c))
    else:
        parts = ((at(1, 1), 2 - L), (at(2, 1), L - 1))
    kinds: dict = {}
    for trace, coef in parts:
        for key, (n, moved) in _raw_kinds(trace).items():
            cell = kinds.setdefault(key, [0, 0])
            cell[0] += coef * n
            cell[1] += coef * moved
    if any(n < 0 or (n == 0 and moved) for n, moved in kinds.values()):  # blocks that differ: never guess
        return _trace(spec, batch, precision, checkpointing, every, *rest)
    sums = {f: sum(coef * getattr(t, f) for t, coef in parts)
            for f in ("activation_bytes", "weight_copy_bytes", "param_bytes", "grad_bytes", "optimizer_bytes")}
    return _step_trace(kinds, param_sizes=_param_sizes(spec), **sums)


def _param_sizes(spec) -> tuple:
    """Bytes of each parameter of the model, in model order (for DDP's buckets), from a 1-block copy on
    the meta device (no memory): what comes before the blocks, block 0's parameters n_layer times, the rest."""
    with torch.device("meta"):
        named = [(n, p.numel() * p.element_size())
                 for n, p in GPT(dataclasses.replace(spec, n_layer=1)).named_parameters()]
    first = next(i for i, (n, _) in enumerate(named) if n.startswith("blocks.0."))
    block = [b for n, b in named if n.startswith("blocks.0.")]
    before, after = named[:first], named[first + len(block):]
    return tuple(b for _, b in before) + tuple(block) * spec.n_layer + tuple(b for _, b in after)


def _transposed(t) -> bool:
    """Whether the last two dims are stored transposed (a weight.t() in a backward matmul, say)."""
    return t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) == t.shape[-2] and t.shape[-1] > 1


def shape_key(name: str, args, kwargs) -> Optional[str]:
    """A string naming a matmul or fused-attention call by kind, shape, number format and layout -- what
    decides its speed -- or None for any other op. ``probe_shapes`` rebuilds the call from it."""
    if name in ("mm", "addmm"):
        a, b = (args[0], args[1]) if name == "mm" else (args[1], args[2])
        dims = (a.shape[0], a.shape[1], b.shape[1])
    elif name in ("bmm", "baddbmm"):
        a, b = (args[0], args[1]) if name == "bmm" else (args[1], args[2])
        dims = (a.shape[0], a.shape[1], a.shape[2], b.shape[2])
    elif name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"):
        bwd = name.endswith("backward")
        q = args[1] if bwd else args[0]
        causal = bool(args[7] if bwd else (args[4] if len(args) > 4 else kwargs.get("is_causal", False)))
        layout = "bthd" if q.stride(1) < q.stride(2) else "bhtd"  # q, k, v as views of a (B, T, H, d) tensor
        return "|".join(map(str, ("sdpa_bwd" if bwd else "sdpa", *q.shape, int(causal), _fmt(q.dtype), layout)))
    else:
        return None
    lay = ("t" if _transposed(a) else "n") + ("t" if _transposed(b) else "n")
    return "|".join(map(str, (name, *dims, _fmt(a.dtype), lay)))


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


def shape_keys(trace: "StepTrace") -> list:
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


# ---- "this" machine: measured ----------------------------------------------------------------------

PROBE_BUDGET_S = 1.0    # bandwidth + overhead probes together, once per machine and thread count
PROBE_RETRY_S = 30.0    # a figure measured under load is measured again at most this often (per process)
PEAK_BUDGET_S = _device.RUN_PROBE_BUDGET_S  # the check of one format's matmul peak (labkit.device's probe)
SPREAD_LIMIT = 1.5      # overhead probe: its median step over its fastest above this = its repeats disagree
_PROBED: dict = {}      # probe key -> this process's figures (see _entry)
_TRIED: dict = {}       # what this process last probed again after a probe under load -> time.monotonic()


def _probe_file() -> Path:
    return cache_dir() / "roofline_probe.json"


def _read_probes() -> dict:
    try:
        data = read_json(_probe_file(), what="roofline probe cache")
    except (OSError, ValueError):
        return {}  # missing or damaged: measure again (the next write replaces it whole)
    return data if isinstance(data, dict) else {}


def _write_probe(key: str, entry: dict) -> None:
    data = _read_probes()
    data[key] = entry
    try:
        write_json_atomic(_probe_file(), data, sort_keys=True)  # atomic, like device.py's peak cache
    except (OSError, ValueError):
        pass  # no writable cache: the value still lives in this process


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


# ---- the prediction ------------------------------------------------------------------------------

@dataclass
class GroupCost:
    """One group's share of a step: FLOPs and bytes per update, and its predicted time -- the sum of its
    ops' own rooflines: ``time_s = compute_s + memory_s + overhead_s``, where ``compute_s`` is the time
    of the ops whose arithmetic is their slower part, ``memory_s`` that of the ops whose bytes are (for
    communication: the local copies and the link), ``overhead_s`` the per-op cost of issuing them all.
    ``bound`` names the larger of the two."""

    flops: float
    bytes: float
    n_ops: int
    time_s: float
    bound: str            # "compute" or "memory" (for communication: the link or the local copies)
    compute_s: float = 0.0
    memory_s: float = 0.0
    overhead_s: float = 0.0


@dataclass
class Prediction:
    """A *predicted* training step of one configuration on one device. Nothing here was measured on
    that device; ``assumptions`` lists every fraction and overhead used. ``caveat``: None when the
    inputs can be trusted; otherwise one line saying why not (on "this": a figure measured while other
    programs held the cores its probe needed) -- show it beside the prediction."""

    device: str
    device_name: str
    precision: str
    step_time_s: float
    tokens_per_s: float
    mfu: Optional[float]
    memory_bytes: float
    fits: bool
    groups: dict
    assumptions: dict
    memory: dict = field(default_factory=dict)
    model_flops_per_step: float = 0.0
    tokens_per_step: int = 0
    label: str = "predicted"
    caveat: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """A markdown table, every time labelled predicted (numbers in plain digits, never e-notation)."""
        lines = [f"**Predicted** step on {self.device_name} ({self.precision}): "
                 f"{self.step_time_s * 1000:,.1f} ms, {self.tokens_per_s:,.0f} tokens/s"
                 + (f", MFU {self.mfu:.0%}" if self.mfu is not None else "")
                 + f"; memory {self.memory_bytes / 2**30:,.2f} GiB ({'fits' if self.fits else 'does NOT fit'})"]
        if self.caveat:
            lines.append(f"*Caveat: {self.caveat}*")
        lines += ["", "| group | GFLOP | MB moved | ops | predicted ms | bound |", "|---|---:|---:|---:|---:|---|"]
        for name, g in self.groups.items():
            lines.append(f"| {name} | {g.flops / 1e9:,.2f} | {g.bytes / 1e6:,.1f} | {g.n_ops:,} | "
                         f"{g.time_s * 1000:,.2f} | {g.bound} |")
        return "\n".join(lines)

    def __repr__(self):
        return (f"Prediction(predicted on {self.device}: {self.step_time_s * 1000:,.1f} ms/step, "
                f"{self.tokens_per_s:,.0f} tokens/s, fits={self.fits}" + (", with a caveat" if self.caveat else "")
                + ")")


def _threads(config: Config) -> int:
    """The intra-op thread count a CPU run of ``config`` uses (the rule of train.threads_for)."""
    if config.threads is not None:
        return config.threads
    return max(1, _device.cores() // config.world_size - config.workers)


def _resolve_device(device: str, config: Config, precision: str) -> dict:
    if device == "this":
        return this_device(_threads(config), precision)
    spec = _catalogue_device(device)
    if spec["peak_flops"].get(precision) is None:
        have = [p for p, v in spec["peak_flops"].items() if v is not None]
        raise ConfigError("precision", precision, f"one of {', '.join(have)} on {device}: {spec['name']} has no "
                          f"{precision} hardware unit (labkit refuses it there)")
    return spec


def _matmul_peak(dev: dict, fmt: str, precision: str) -> float:
    """The peak a matmul of number format ``fmt`` runs at: fp32 matmuls use TF32 units when precision is tf32."""
    if fmt == "fp32" and precision == "tf32":
        return dev["peak_flops"]["tf32"]
    return dev["peak_flops"].get(fmt) or dev["peak_flops"]["fp32"]


def _group_cost(kinds, dev: dict, precision: str, flops_fraction: float, bw_fraction: float,
                overhead_s: float) -> GroupCost:
    """A group's cost, one op kind at a time: each kind's calls x ``roofline_s`` of one call, summed, plus
    the cost of issuing every op. ``kinds``: rows with "count", "flops" (of one call), "fmt", "bytes" (of
    all its calls), optionally "shape" (a measured CPU's timed shapes run at their own rate) and "stream"
    (on a CPU, the size whose bandwidth its bytes get: the model's state for weights, gradients and
    optimizer state; default the op's own size)."""
    rates = dev.get("shape_rates") or {}
    compute = memory = flops = nbytes = 0.0
    n_ops = 0
    for r in kinds:
        n = r["count"]
        if n <= 0:
            continue
        per_call = r["bytes"] / n
        peak = rates.get(r.get("shape")) or (
            _matmul_peak(dev, r["fmt"], precision) * flops_fraction if r["flops"] else 1.0)
        secs, bound = roofline_s(r["flops"], per_call, peak, bandwidth_at(dev, r.get("stream") or per_call),
                                 1.0, bw_fraction)
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
PREDICT_OPTIONS = ("precision", "world_size", "matmul_fraction", "attention_fraction", "bandwidth_fraction",
                   "op_overhead_s", "link_latency_s")
MAX_OVERHEAD_S = 1.0  # per op or per ring step: a second is already far beyond any real machine


def _check_arguments(config, device, precision, world_size, fractions: dict, seconds: dict) -> None:
    """Every argument of ``predict``, before any work (ConfigError: the field, the value, what is allowed)."""
    if not isinstance(config, Config):
        raise TypeError(f"predict() needs a labkit.Config, got {type(config).__name__}: build one with "
                        "lk.Config(model=..., ...)")
    _choice("device", device, tuple(device_names()))
    if precision is not None:
        _choice("precision", precision, ("fp32", "tf32", "fp16", "bf16"))
    if precision == "tf32" and device == "this":
        raise ConfigError("precision", "tf32", "fp32, fp16 or bf16 on this CPU (tf32 is a CUDA tensor-core mode)")
    if world_size is not None:
        _int("world_size", world_size, 1, 4096)  # Config's own range
    for name, v in fractions.items():
        if v is not None:
            _num(name, v, 0, 1, lo_open=True)
    for name, v in seconds.items():
        if v is not None:
            _num(name, v, 0, MAX_OVERHEAD_S)


def _caveat(dev: dict) -> Optional[str]:
    """One line when an input of the prediction was measured under load (see this_device), else None."""
    loaded = dev.get("under_load") or {}
    if not loaded:
        return None
    names = list(loaded)
    what = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    others = [v for v in loaded.values() if isinstance(v, (int, float))]
    n = dev.get("threads", 1)
    load = (f"other programs used {max(others):.1f} of its {_device.cores()} cores while a probe at "
            f"{counted(n, 'thread')} ran" if others else "its probe's repeats disagreed")
    return (f"this machine's {what} {'were' if len(names) > 1 else 'was'} measured under load ({load}): they read "
            "slower than the hardware is, so this prediction leans slow; a later prediction measures again")


def predict(config: Config, device: str = "h100-sxm", *, precision: Optional[str] = None,
            world_size: Optional[int] = None, matmul_fraction: Optional[float] = None,
            attention_fraction: Optional[float] = None, bandwidth_fraction: Optional[float] = None,
            op_overhead_s: Optional[float] = None, link_latency_s: Optional[float] = None,
            progress: bool = True) -> Prediction:
    """Predict one optimizer update of ``config`` on ``device`` (a key of ``devices.json`` or "this").

    ``precision`` and ``world_size`` override the config's (a Config describes any machine: one with
    tf32 or 8 processes builds on a 2-core CPU and can be predicted on a GPU, only ``lk.run`` refuses
    it). ``world_size`` devices of this kind train data-parallel over the catalogue's interconnect
    (ring AllReduce). The fractions (> 0, <= 1) and the overheads (seconds, 0 to MAX_OVERHEAD_S)
    override the defaults documented in ``DEFAULTS``. Every argument is checked before any work; the
    cost does not grow with the model's depth (see ``trace_step``), and on "this" the first prediction
    measures the machine (a few seconds at most, with a progress line; ``progress=False`` for a caller
    that says it is predicting in its own words, as the panel does)."""
    fractions = {"matmul_fraction": matmul_fraction, "attention_fraction": attention_fraction,
                 "bandwidth_fraction": bandwidth_fraction}
    _check_arguments(config, device, precision, world_size,
                     fractions, {"op_overhead_s": op_overhead_s, "link_latency_s": link_latency_s})
    precision = precision or config.precision
    if world_size is not None:
        config = config.replace(world_size=world_size)  # a Config is pure: 8 processes build on a laptop too
    if not isinstance(progress, bool):
        raise ConfigError("progress", progress, "True or False")
    with Progress(3, f"predicting on {device}", delay=1.0 if progress else math.inf) as bar:
        dev = _resolve_device(device, config, precision)
        bar.update(1, "tracing the step")
        trace = trace_step(config, precision=precision, foreach=device != "this")
        if device == "this":
            bar.update(2, "timing the step's matmul shapes")
            keys = shape_keys(trace)
            dev["shape_rates"] = this_shape_rates(keys, _threads(config), dev["peak_flops"].get(precision)
                                                  or dev["peak_flops"]["fp32"])
            if set(_entry(_probe_key(_threads(config))).get("loaded_shapes") or ()) & set(keys):
                dev["under_load"]["matmul shape timings"] = _entry(_probe_key(_threads(config))).get(
                    "shapes_other_cores")
        bar.update(3)
    fr = {**dev["fractions"], **{k: float(v) for k, v in fractions.items() if v is not None}}
    overhead = dev["op_overhead_s"] if op_overhead_s is None else float(op_overhead_s)
    latency = dev["link_latency_s"] if link_latency_s is None else float(link_latency_s)
    groups = _step_groups(config, trace, dev, precision, fr, overhead, latency)
    return _prediction(config, device, dev, precision, trace, groups, fr, overhead, latency)


def _step_groups(config, trace, dev, precision, fr, overhead, latency) -> dict:
    """Every group's GroupCost for one optimizer update (K micro-batches, one optimizer step)."""
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
    return groups


def _model_flops(spec: ModelSpec) -> int:
    """measure.count_flops of a forward+backward, at a cost that does not grow with depth: FLOPs are
    affine in the number of (identical) blocks, so a deep model's count is 1 block's + (L-1) x one more."""
    if spec.n_layer <= FOLD_ABOVE_LAYERS:
        return count_flops(spec)
    one, two = (count_flops(dataclasses.replace(spec, n_layer=n)) for n in (1, 2))
    return one + (spec.n_layer - 1) * (two - one)


def _prediction(config, device, dev, precision, trace, groups, fr, overhead, latency) -> Prediction:
    K, W = config.accum, config.world_size
    step = sum(g.time_s for g in groups.values())
    model_flops = _model_flops(_spec_for(config)) * config.micro_batch * K * W
    peak = dev["peak_flops"].get(precision) or dev["peak_flops"]["fp32"]
    tokens = config.tokens_per_update
    memory = _memory(config, trace, dev)
    total_mem = sum(memory.values())
    usable = dev["memory_bytes"] * (1.0 if dev["measured"] else DEFAULTS["usable_memory_fraction"])
    emulated = precision in ("bf16", "fp16") and not dev["hardware_units"].get(precision, False)
    assumptions = _assumptions(dev, device, precision, fr, overhead, latency, W, emulated)
    return Prediction(device=device, device_name=dev["name"], precision=precision, step_time_s=step,
                      tokens_per_s=tokens / step if step else math.inf,
                      mfu=model_flops / step / (peak * W) if step and peak else None,
                      memory_bytes=total_mem, fits=total_mem <= usable, groups=groups,
                      assumptions=assumptions, memory=memory, model_flops_per_step=model_flops,
                      tokens_per_step=tokens, caveat=_caveat(dev))


def _assumptions(dev: dict, device: str, precision: str, fr: dict, overhead: float, latency: float, W: int,
                 emulated: bool) -> dict:
    """Everything a prediction assumed, for the learner to read beside it."""
    assumptions = {
        **fr, "op_overhead_s": overhead, "link_latency_s": latency,
        "sample_overhead_s": dev["sample_overhead_s"],
        "peak_flops": {p: v for p, v in dev["peak_flops"].items() if v}, "bandwidth_bytes_per_s": dev["bandwidth"],
        "link_bandwidth_bytes_per_s": dev["link_bandwidth"],
        "usable_memory_fraction": 1.0 if dev["measured"] else DEFAULTS["usable_memory_fraction"],
        "measured_device": dev["measured"], "sources": dev["sources"],
        "measured_shapes": len(dev.get("shape_rates") or {}),
        "emulated_format": emulated,
        "roofline": "per op: each op is charged the larger of its FLOPs / achievable FLOP/s and its bytes / "
                    "achievable bandwidth; a group's time is the sum over its ops (plus the per-op overhead)",
        "overlap": "none: every op's time is summed (no compute hides communication, launches or data); "
                   "loader workers are the exception (only the part of their time the step cannot hide counts)",
        "measured_under_load": sorted(dev.get("under_load") or {}),
        "attention_flops": "executed FLOPs: a fused causal kernel does about half the non-causal count; "
                           "MFU uses the course's non-causal model FLOPs (measure.count_flops)",
        "op_trace": "one micro-batch traced on fake tensors with CPU autocast rules (for a GPU too: CUDA "
                    "autocast's cast lists differ, so the casts counted are those CPU autocast inserts) and "
                    "PyTorch's optimizer "
                    + ("loop (CPU)" if device == "this" else "multi-tensor (foreach) kernels, as on CUDA"),
        "ddp": f"DDP at world size {W}: gradients copied into buckets and back each sync "
               f"({DDP_TRAFFIC_PER_GRAD_BYTE} x gradient bytes of local traffic); ring AllReduce over the link",
    }
    if emulated:
        assumptions["note"] = (f"{precision} has no fast hardware unit on {dev['name']}: its measured (slow) "
                               "matmul peak is used -- the prediction is for emulated arithmetic")
    return assumptions


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
    sent = syncs * sum(2 * (config.world_size - 1) / config.world_size * b * wire for b in buckets)
    return GroupCost(flops=0.0, bytes=float(local + sent), n_ops=int(n), time_s=memory + ring + over,
                     bound="memory", compute_s=0.0, memory_s=memory + ring, overhead_s=over)


def _memory(config, trace, dev) -> dict:
    """Bytes held at the start of backward (the peak of a step, less transient workspaces): weights,
    gradients, optimizer state, DDP's gradient buckets, the activations of one micro-batch and autocast's
    16-bit weight copies (the last two counted in the trace, as memtrace counts them)."""
    return {"weights": trace.param_bytes, "gradients": trace.grad_bytes, "optimizer_state": trace.optimizer_bytes,
            "ddp_buckets": trace.grad_bytes, "activations": trace.activation_bytes,
            "autocast_weight_copies": trace.weight_copy_bytes}



# ---- predicted against measured (chapter 09's what-if cell) -------------------------------------------

def error_rows(labels, measured_s, predicted_s) -> list:
    """One row per configuration: its label, measured and predicted step time (s) and the error
    ``predicted / measured - 1`` (positive: the model predicts slower than measured)."""
    rows = []
    for label, m, p in zip(labels, measured_s, predicted_s):
        ok = isinstance(m, (int, float)) and m > 0 and isinstance(p, (int, float))
        rows.append({"label": str(label), "measured_s": m, "predicted_s": p, "error": p / m - 1 if ok else None})
    return rows


def error_sentence(rows, device_words: str = "this machine") -> str:
    """The chapter's sentence about the rows, from their numbers: median and worst |error|, and which
    way the model leans."""
    errs = [r for r in rows if r["error"] is not None]
    if not errs:
        return f"No configuration was both measured and predicted on {device_words}."
    sizes = sorted(abs(r["error"]) for r in errs)
    mid = len(sizes) // 2
    median = sizes[mid] if len(sizes) % 2 else (sizes[mid - 1] + sizes[mid]) / 2
    worst = max(errs, key=lambda r: abs(r["error"]))
    slow = sum(r["error"] > 0 for r in errs)
    lean = ("predicts slower than measured for every configuration" if slow == len(errs) else
            "predicts faster than measured for every configuration" if slow == 0 else
            f"predicts slower for {slow} of {len(errs)} configurations and faster for the rest")
    return (f"On {device_words} the model's median error is {median:.0%} over {len(errs)} configurations; the "
            f"worst is {worst['label']} ({worst['error']:+.0%}). It {lean}.")


# ---- lk.predict(...) ------------------------------------------------------------------------------

class _CallableModule(types.ModuleType):
    """This module, callable: ``lk.predict(config, device="t4")`` is ``predict(config, device="t4")``.

    Why not export the function as ``labkit.predict``: it would shadow this module of the same name, and
    ``from labkit import predict as pr; pr.catalogue()`` (the tests, benchmarks/predict.py) would get the
    function. A callable module serves both."""

    def __call__(self, config, device: str = "h100-sxm", **options) -> Prediction:
        for name in options:
            if name not in PREDICT_OPTIONS:  # a typo such as matmul_fracton: say so, with the options
                close = difflib.get_close_matches(name, PREDICT_OPTIONS, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(name, options[name], f"{hint}not an option of lk.predict; options are: "
                                  + ", ".join(PREDICT_OPTIONS))
        return predict(config, device, **options)

    __call__.__doc__ = predict.__doc__


sys.modules[__name__].__class__ = _CallableModule
