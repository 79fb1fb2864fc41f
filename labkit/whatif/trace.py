"""The traced step: one micro-batch and one optimizer update of the course's GPT, on fake tensors
(the package docstring says how). ``_Recorder`` rides on the one dispatch tracer
(``engine.tracer``): the tracer keeps which storages are alive (the activations), the recorder adds
each op's FLOPs and bytes.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..engine.config import Config, ModelSpec
from ..engine.measure import attention_backend, optimizer_bytes, state_bytes
from ..engine.model import GPT
from ..engine.precision import autocast
from ..engine.tracer import Tracer
from .devices import CAUSAL_FRACTION

__all__ = ["StepTrace", "trace_step", "shape_key", "op_key", "size_class", "FOLD_ABOVE_LAYERS"]

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


class _Recorder(Tracer):
    """Every ATen op of the traced step, by *kind*: (phase, group, op name, number format, FLOPs
    and bytes of one call, matmul/attention shape) -> [calls, bytes]; calls of one kind cost the
    same. What is alive when the forward ends: the tracer's own ``alive_bytes``."""

    def __init__(self, model: torch.nn.Module, seq_len: int):
        super().__init__(model)
        self.T = seq_len
        self.phase = "forward"   # then backward, setup (the optimizer's first step, left out), optimizer
        self.kinds: dict = {}    # kind key (see _kind_key) -> [calls, bytes moved by all of them]
        self.kept = (0, 0)       # (activation bytes, weight-copy bytes) alive after the forward pass

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = super().__torch_dispatch__(func, types, args, kwargs)  # runs the op; the tracer notes its storages
        if func.namespace == "prim":  # FakeTensorMode's own queries (prim.device): not work a real run does
            return out
        name = func.overloadpacket.__name__
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        group = self._group(name, ins + outs)
        flops, fmt = self._flops(func, name, args, kwargs, out, ins)
        moved = 0 if func.is_view else _nbytes(ins) + _nbytes(outs)
        # a measured CPU times each matmul/attention shape (probe_shapes) and each element-wise call of the
        # micro-batch at its own shapes (probe_ops)
        if flops:
            shape = shape_key(name, args, kwargs)
        else:
            shape = op_key(func, args, kwargs) if moved and self.phase in ("forward", "backward") else None
        cell = self.kinds.setdefault(_kind_key(self.phase, group, name, fmt if flops else None, flops, moved,
                                               shape), [0, 0])
        cell[0] += 1
        cell[1] += moved
        return out

    @property
    def op_totals(self) -> dict:
        """(phase, group, op name) -> [calls, FLOPs, bytes] summed over the op's kinds (for tables, tests)."""
        rows = {}
        for (phase, group, name, _, flops, _, _), (n, moved) in self.kinds.items():
            row = rows.setdefault((phase, group, name), [0, 0, 0])
            row[0] += n
            row[1] += n * flops
            row[2] += moved
        return rows

    def end_forward(self):
        self.kept = self.alive_bytes()  # the loss holds the graph: what is alive now is what backward needs
        super().end_forward()
        self.phase = "backward"

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


def _kind_key(phase, group, name, fmt, flops, moved, shape) -> tuple:
    """What decides one op call's cost. In the optimizer update the bytes are summed, not keyed: a
    ``_foreach_*`` call moves bytes that grow with the model (keeping ``_folded``'s sum exact), and
    they all stream at the bandwidth of the model's state, whatever one call's size."""
    return phase, group, name, fmt, flops, None if phase == "optimizer" or name.startswith("_foreach") else moved, shape


@dataclass(frozen=True)
class StepTrace:
    """One traced micro-batch (forward + backward) and one optimizer update.

    ``kinds``: every op kind, {"phase", "group", "op", "fmt", "flops" (one call), "count", "bytes" (all calls),
    "shape" (a matmul/attention ``shape_key``, an element-wise call's ``op_key``, or None)} -- what the
    roofline is charged on, one op at a time;
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
    """Trace one micro-batch and one optimizer update of ``config`` on fake tensors. ``foreach``:
    the optimizer and the clip use the multi-tensor kernels, as PyTorch does on CUDA. Beyond
    FOLD_ABOVE_LAYERS blocks, summed from small traces (``_folded``): same totals, flat cost."""
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
        if optimizer == "sgd":
            opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
        else:
            opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=foreach)
        rec = _Recorder(model, spec.seq_len)
        with rec, attention_backend(attention):  # backward too, as in train.run: a recomputed block's attention
            with autocast("cpu", precision):      # must take the same kernel its forward took
                loss = model(idx, idx)
            rec.end_forward()
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
        if shape is not None and flops:  # matmul / attention shapes only (an element-wise "op|" key has none)
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


def _encode(x):
    """One argument of an op call as JSON: a tensor by shape, strides and dtype (its values do not decide
    an element-wise op's speed), numbers and flags as they are. Anything else: ValueError."""
    if isinstance(x, torch.Tensor):
        return {"t": list(x.shape), "s": list(x.stride()), "d": str(x.dtype).replace("torch.", "")}
    if x is None or isinstance(x, (bool, int, str)) or (isinstance(x, float) and math.isfinite(x)):
        return x
    if isinstance(x, float):  # inf / -inf (a mask's fill value): JSON has no such number
        return {"f": repr(x)}
    if isinstance(x, (list, tuple)):
        return [_encode(v) for v in x]
    if isinstance(x, torch.dtype):
        return {"dtype": str(x).replace("torch.", "")}
    if isinstance(x, torch.device):
        return {"device": x.type}
    if isinstance(x, (torch.memory_format, torch.layout)):
        return {"enum": str(x).replace("torch.", "")}
    raise ValueError(f"an argument of type {type(x).__name__} cannot be rebuilt")


def op_key(func, args, kwargs) -> Optional[str]:
    """A string naming one element-wise call (the ATen overload and every argument, tensors by
    shape, strides and dtype), which ``devices.probe_ops`` rebuilds and times; None when an argument
    cannot be written down (the call is then charged by its bytes). It rides in a kind's "shape"
    field."""
    try:
        spec = [[_encode(a) for a in args], {k: _encode(v) for k, v in (kwargs or {}).items()}]
    except ValueError:
        return None
    return "op|" + str(func) + "|" + json.dumps(spec, separators=(",", ":"))


def size_class(nbytes: float) -> int:
    """The power of two just below an op's bytes: ops are binned by how much data they touch."""
    return max(0, int(math.log2(nbytes))) if nbytes >= 1 else 0
