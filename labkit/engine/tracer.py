"""The one dispatch tracer: every storage an ATen op creates, who made it, and when it dies.

``Tracer`` is a ``TorchDispatchMode``: it sees every op -- forward, checkpoint recompute and
backward alike -- and holds each storage an op creates from that op until it is freed. ``Trace`` is
what one traced step produced, with the views the chapters read. Its readers -- ``memtrace`` (a
whole traced step) and ``measure.activation_bytes`` (bytes alive after the forward) sit above it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

PHASES = ("forward", "recompute", "backward")
# Categories of held bytes in the timeline, in stacking order.
CATEGORIES = (("forward", "kept from the forward pass"), ("recompute", "recomputed in backward"),
              ("backward", "gradients and backward temporaries"), ("weight_copy", "autocast weight copies"))


@dataclass
class Held:
    """One storage: who made it, when it was born and when it died (op indices)."""

    key: int
    nbytes: int
    op: str
    module: str
    phase: str
    shape: tuple
    dtype: str
    born: int
    died: int | None = None  # None: still alive at the end
    weight_copy: bool = False
    is_grad: bool = False  # a parameter's .grad at the end of the step


@dataclass
class Trace:
    """What one traced training step produced. Op indices count every ATen op of the step."""

    held: list
    ops: list                 # (index, phase, op name, module) for every op
    forward_end: int          # index of the forward pass's last op: kept() leaves out what it made (the loss)
    n_ops: int
    block_starts: list = field(default_factory=list)  # op index where each block's forward began
    label: str = ""

    # -- after the forward pass -----------------------------------------------------------------
    def kept(self, include_weight_copies: bool = False) -> list:
        """Storages created in the forward pass and still alive when it ended: what backward needs.
        One dict per storage: module, op, shape, dtype, bytes (in the order they were made)."""
        end = self.forward_end
        return [{"module": h.module, "op": h.op, "shape": h.shape, "dtype": h.dtype,
                 "bytes": h.nbytes, "weight_copy": h.weight_copy, "born": h.born} for h in self.held
                if h.phase == "forward" and h.born < end and (h.died is None or h.died > end)
                and (include_weight_copies or not h.weight_copy)]

    def kept_bytes(self) -> int:
        return sum(r["bytes"] for r in self.kept())

    def weight_copy_bytes(self) -> int:
        return sum(r["bytes"] for r in self.kept(include_weight_copies=True) if r["weight_copy"])

    def block_bytes(self) -> dict:
        """{block index: bytes its forward created that are still held when the forward pass ends}."""
        out = {}
        for r in self.kept():
            i = block_of(r["module"])
            if i is not None:
                out[i] = out.get(i, 0) + r["bytes"]
        return dict(sorted(out.items()))

    def by_module(self) -> dict:
        """{part of the model ('embedding', 'block 0', ..., 'head and loss'): bytes kept}, in model order."""
        first_block = self.block_starts[0] if self.block_starts else self.forward_end
        out = {}
        for r in self.kept():
            i = block_of(r["module"])
            part = (f"block {i}" if i is not None else
                    "embedding" if r["born"] <= first_block else "head and loss")
            out[part] = out.get(part, 0) + r["bytes"]
        return out

    # -- the whole step ---------------------------------------------------------------------------
    def timeline(self) -> dict:
        """Held bytes after every op, per category: {"index": [...], "forward": [...], ...}."""
        n = self.n_ops
        series = {c: [0] * (n + 1) for c, _ in CATEGORIES}
        for h in self.held:
            cat = "weight_copy" if h.weight_copy else h.phase
            end = h.died if h.died is not None else n + 1
            s = series[cat]
            for i in range(h.born, min(end, n + 1)):
                s[i] += h.nbytes
        series["index"] = list(range(n + 1))
        return series

    def peak_bytes(self) -> int:
        t = self.timeline()
        return max(sum(t[c][i] for c, _ in CATEGORIES) for i in t["index"])

    def grad_bytes(self) -> int:
        return sum(h.nbytes for h in self.held if h.is_grad)

    def recompute_ops(self) -> int:
        return sum(phase == "recompute" for _, phase, _, _ in self.ops)


def block_of(module: str):
    """'blocks.2.attn.qkv' -> 2; anything outside the blocks -> None."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1])
    return None


class Tracer(TorchDispatchMode):
    """Records the storage of every tensor an op creates, and when it dies.

    Use ``with Tracer(model) as t:`` around forward and backward; call ``t.end_forward()`` between
    them. Module names come from forward hooks, which also fire when a checkpoint recomputes a block
    in backward: that tells recomputed tensors from the forward pass's own. Storages made before the
    trace (an in-place update of AdamW's state) are not counted; nor are ``exclude``'s, tensors an
    op may hand back as a view (the inputs: ``targets.view(-1)``), nor the parameters.
    """

    def __init__(self, model: torch.nn.Module, exclude=()):
        super().__init__()
        self.model = model
        # storages are keyed like ``live`` (StorageWeakRef.cdata): a fake tensor's data_ptr() is 0 for all
        self.params = {_key(p) for p in model.parameters()}
        self.skip = self.params | {_key(t) for t in exclude}  # never counted
        self.held: list = []
        self.live: dict = {}     # storage key -> (weak ref, Held)
        self.ops: list = []
        self.index = 0
        self.in_backward = False
        self.forward_end = None
        self.stack: list = []    # module names, innermost last
        self.block_starts: list = []
        self._handles = []

    # -- module names --------------------------------------------------------------------------
    def _install(self):
        for name, mod in self.model.named_modules():
            def pre(_m, _args, name=name):
                self.stack.append(name)
                if block_of(name) is not None and name.count(".") == 1 and not self.in_backward:
                    self.block_starts.append(self.index)

            def post(_m, _args, _out, name=name):
                # a checkpoint may stop a recompute early (an exception inside forward): unwind to here
                while self.stack:
                    if self.stack.pop() == name:
                        break

            self._handles.append(mod.register_forward_pre_hook(pre))
            self._handles.append(mod.register_forward_hook(post, always_call=True))

    def __enter__(self):
        self._install()
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._sweep()
        return super().__exit__(*exc)

    def end_forward(self):
        """Mark the boundary: ops from here on belong to backward (or its recompute)."""
        self._sweep()
        self.forward_end = self.index
        self.in_backward = True
        self.stack.clear()

    def finish(self, model=None) -> Trace:
        """After backward: mark the parameters' gradients and return the Trace."""
        self._sweep()
        model = model or self.model
        grads = {StorageWeakRef(p.grad.untyped_storage()).cdata for p in model.parameters() if p.grad is not None}
        for key, (ref, h) in self.live.items():
            if key in grads and not ref.expired():
                h.is_grad = True
        fe = self.forward_end if self.forward_end is not None else self.index
        return Trace(held=self.held, ops=self.ops, forward_end=fe, n_ops=self.index,
                     block_starts=list(self.block_starts))

    def alive_bytes(self) -> tuple:
        """(activation bytes, autocast weight-copy bytes) of the storages alive now -- the engine's probe
        asks this right after a forward pass, while the loss still holds the graph. Unlike ``Trace.kept``
        it counts every live storage the trace made, the returned loss included."""
        self._sweep()
        alive = [h for ref, h in self.live.values() if not ref.expired()]
        copies = sum(h.nbytes for h in alive if h.weight_copy)
        return sum(h.nbytes for h in alive) - copies, copies

    # -- the dispatch hook ----------------------------------------------------------------------
    def _phase(self) -> str:
        if not self.in_backward:
            return "forward"
        return "recompute" if self.stack else "backward"

    def _sweep(self):
        for k in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.live.pop(k)[1].died = self.index

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.index += 1
        phase = self._phase()
        module = self.stack[-1] if self.stack else ""
        name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        self.ops.append((self.index, phase, name, module))
        flat_args = tree_flatten(args)[0] + tree_flatten(kwargs or {})[0]
        from_param = func is torch.ops.aten._to_copy.default and any(
            isinstance(a, torch.Tensor) and _key(a) in self.params for a in flat_args)
        written = _written_storages(func, flat_args)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            ref = StorageWeakRef(st)
            if ref.cdata in self.skip:
                continue  # a view of a parameter (or of an excluded input): not an activation
            old = self.live.get(ref.cdata)
            if old is not None and not old[0].expired():
                if from_param:
                    old[1].weight_copy = True
                continue  # a view or an in-place result: the same storage, already counted
            if ref.cdata in written:
                continue  # an in-place (or out=) update of a storage made before the trace: nothing allocated
            if old is not None:
                old[1].died = self.index
            h = Held(key=ref.cdata, nbytes=st.nbytes(), op=name, module=module, phase=phase,
                     shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""), born=self.index,
                     weight_copy=from_param)
            self.held.append(h)
            self.live[ref.cdata] = (ref, h)
        self._sweep()
        return out


def _key(t) -> int:
    """The key of a tensor's storage, the same for every view of it (real or fake tensors alike)."""
    return StorageWeakRef(t.untyped_storage()).cdata


def _written_storages(func, flat_args) -> set:
    """Keys of the input storages an in-place or ``out=`` op writes into. Such an op returns a tensor on a
    storage that already existed -- made before the trace when the tracer does not know it (AdamW's state
    at its second step, an existing .grad, any tensor the caller owns) -- and allocates nothing."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return set()
    return {StorageWeakRef(a.untyped_storage()).cdata for a in flat_args
            if isinstance(a, torch.Tensor) and a.device.type != "meta"}
