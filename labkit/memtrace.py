"""What autograd keeps for backward, op by op, and how held memory moves through one training step.

    trace = labkit.memtrace.trace_step(config)            # one forward + backward on a fresh copy
    trace.kept()                                           # tensors alive after forward: op, shape, bytes
    trace.block_bytes()                                    # {block index: bytes kept}
    trace.timeline()                                       # held bytes after every op, forward to backward
    labkit.memtrace.plot_timelines({"none": t1, "full": t2})

How it works: a ``TorchDispatchMode`` sees every ATen op of the step -- forward, checkpoint recompute and
backward alike -- and remembers the storage of every tensor each op creates. A storage is *held* from the
op that created it until it is freed; the mode checks after every op which storages have died. What is
still alive when the forward pass ends is exactly what backward will need: the tensors autograd saved,
plus whatever a checkpoint policy decided to keep (a saved-tensors hook alone cannot see the latter).
Parameters are never counted; autocast's low-precision weight copies are counted separately.

Nothing here touches a model being trained: ``trace_step`` builds its own copy of the architecture.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .device import capabilities
from .measure import attention_backend
from .model import GPT
from .precision import autocast

__all__ = ["Trace", "Tracer", "trace_step", "trace_model", "block_bytes_formula", "plot_timelines",
           "kept_table", "options_table"]

PHASES = ("forward", "recompute", "backward")
# Categories of held bytes in the timeline, in stacking order.
CATEGORIES = (("forward", "kept from the forward pass"), ("recompute", "recomputed in backward"),
              ("backward", "gradients and backward temporaries"), ("weight_copy", "autocast weight copies"))
COLORS = {"forward": "#4c72b0", "recompute": "#dd8452", "backward": "#55a868", "weight_copy": "#8172b3"}


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
    forward_end: int          # index of the first op after the forward pass
    n_ops: int
    block_starts: list = field(default_factory=list)  # op index where each block's forward began
    label: str = ""

    # -- after the forward pass -----------------------------------------------------------------
    def kept(self, include_weight_copies: bool = False) -> list:
        """Storages created in the forward pass and still alive when it ended: what backward needs.
        One dict per storage: module, op, shape, dtype, bytes (in the order they were made)."""
        out = []
        for h in self.held:
            if h.phase != "forward" or h.born >= self.forward_end:
                continue
            if h.died is not None and h.died <= self.forward_end:
                continue
            if h.weight_copy and not include_weight_copies:
                continue
            out.append({"module": h.module, "op": h.op, "shape": h.shape, "dtype": h.dtype, "bytes": h.nbytes,
                        "weight_copy": h.weight_copy, "born": h.born})
        return out

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
            if i is not None:
                part = f"block {i}"
            else:
                part = "embedding" if r["born"] <= first_block else "head and loss"
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
        return sum(1 for _, phase, _, _ in self.ops if phase == "recompute")


def block_of(module: str):
    """'blocks.2.attn.qkv' -> 2; anything outside the blocks -> None."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1])
    return None


class Tracer(TorchDispatchMode):
    """Records the storage of every tensor an op creates, and when it dies.

    Use ``with Tracer(model) as t:`` around forward and backward; call ``t.end_forward()`` between them.
    Module names come from forward hooks, which also fire when a checkpoint recomputes a block in backward:
    that is how recomputed tensors are told apart from the forward pass's own. Storages made before the trace
    are not counted: an in-place update of one (AdamW's state in a second ``step()``) allocates nothing.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
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

    # -- the dispatch hook ----------------------------------------------------------------------
    def _phase(self) -> str:
        if not self.in_backward:
            return "forward"
        return "recompute" if self.stack else "backward"

    def _sweep(self):
        dead = [k for k, (ref, _) in self.live.items() if ref.expired()]
        for k in dead:
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
            isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in self.params for a in flat_args)
        written = _written_storages(func, flat_args)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            if st.data_ptr() in self.params:
                continue  # a view of a parameter: not an activation
            ref = StorageWeakRef(st)
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


def _written_storages(func, flat_args) -> set:
    """Keys of the input storages an in-place or ``out=`` op writes into. Such an op returns a tensor on a
    storage that already existed -- made before the trace when the tracer does not know it (AdamW's state
    at its second step, an existing .grad, any tensor the caller owns) -- and allocates nothing."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return set()
    return {StorageWeakRef(a.untyped_storage()).cdata for a in flat_args
            if isinstance(a, torch.Tensor) and a.device.type != "meta"}


def _attention(name: str):
    return attention_backend(name)


def trace_model(model, idx, targets, *, precision: str = "fp32", attention: str = "auto", label: str = "") -> Trace:
    """Trace one forward + backward of ``model`` (anything called as ``model(idx, targets) -> loss``)."""
    kind = idx.device.type
    model.zero_grad(set_to_none=True)
    tracer = Tracer(model)
    with _attention(attention), tracer:
        with autocast(kind, precision):
            loss = model(idx, targets)
        tracer.end_forward()
        loss.backward()
        del loss
        trace = tracer.finish(model)
    trace.label = label
    return trace


def trace_step(config, batch: int | None = None, device=None, label: str = "", seed: int = 0) -> Trace:
    """Trace one training step (forward + backward, no optimizer) of ``config``'s model on a fresh copy.
    ``batch`` defaults to the config's micro-batch."""
    spec = config.spec
    dev = torch.device(device) if device is not None else _device_of(config)
    with torch.random.fork_rng(devices=[]):  # a fresh copy with the engine's weights; the caller's RNG untouched
        torch.manual_seed(seed)
        model = GPT(spec, checkpointing_mode=config.checkpointing, checkpoint_every=config.checkpoint_every)
    model = model.to(dev)
    g = torch.Generator().manual_seed(seed)
    B = batch or config.micro_batch
    idx = torch.randint(0, 256, (B, spec.seq_len), generator=g).to(dev)
    tgt = torch.randint(0, 256, (B, spec.seq_len), generator=g).to(dev)
    trace = trace_model(model, idx, tgt, precision=config.precision, attention=config.attention,
                        label=label or describe(config))
    del model
    return trace


def _device_of(config):
    kind = capabilities(config.device).kind
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def describe(config) -> str:
    if config.checkpointing == "full":
        return "full" if config.checkpoint_every == 1 else f"every {config.checkpoint_every}"
    if config.checkpointing == "attention" and config.checkpoint_every > 1:  # it honours k too
        return f"attention every {config.checkpoint_every}"
    return config.checkpointing


# ---- the formula -------------------------------------------------------------------------------

def block_bytes_formula(d_model: int, n_head: int, seq_len: int, batch: int, bytes_per_value: int = 4) -> int:
    """Bytes one transformer block of this course's GPT keeps for backward, counted by hand.

    Per token, in values: LayerNorm 1 output (d) + q,k,v (3d) + attention output (d; a fused kernel returns
    it in the layout the projection reads, so no copy) + residual sum (d) + LayerNorm 2 output (d) + MLP
    up-projection (4d) + GELU output (4d) + block output (d) = 16·d; plus the attention kernel's log-sum-exp
    (one per head) and each LayerNorm's mean and 1/std (2 × 2). A fused kernel keeps no T×T score matrix.
    """
    per_token = 16 * d_model + n_head + 4
    return batch * seq_len * per_token * bytes_per_value


# ---- tables and pictures -------------------------------------------------------------------------

def _fmt_bytes(b: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= size:
            return f"{b / size:.2f} {unit}"
    return f"{int(b)} B"


def kept_table(trace: Trace, module_prefix: str | None = None, limit: int | None = None) -> str:
    """A markdown table of what the forward pass keeps (optionally one module's rows only)."""
    rows = [r for r in trace.kept(include_weight_copies=True)
            if module_prefix is None or r["module"] == module_prefix or r["module"].startswith(module_prefix + ".")]
    lines = ["| # | module | op that made it | shape | dtype | bytes |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(rows[:limit] if limit else rows):
        what = r["op"] + (" (weight copy)" if r["weight_copy"] else "")
        lines.append(f"| {i + 1} | `{r['module'] or '(top)'}` | `{what}` | {list(r['shape'])} | {r['dtype']} | "
                     f"{_fmt_bytes(r['bytes'])} |")
    total = sum(r["bytes"] for r in rows)
    lines.append(f"| | **total** | | | | **{_fmt_bytes(total)}** |")
    return "\n".join(lines)


def options_table(rows: list) -> str:
    """Markdown table of checkpointing options: dicts with name, activation_bytes, step_time_s, hfu_over_mfu."""
    lines = ["| option | activation memory | step time | hardware / model FLOPs |", "|---|---|---|---|"]
    for r in rows:
        st = r.get("step_time_s")
        lines.append(f"| {r['name']} | {_fmt_bytes(r['activation_bytes'])} | "
                     f"{'n/a' if st is None else f'{1000 * st:.0f} ms'} | {r.get('flops_ratio', float('nan')):.2f} |")
    return "\n".join(lines)


def plot_timelines(traces: dict, width: float = 9.0, height: float = 2.6):
    """One panel per trace: held bytes after every op, stacked by category, forward/backward marked.
    All panels share the y axis, so the heights compare directly."""
    from .plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    n = len(traces)
    fig = new_figure(width, height)
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    scale, unit = 2**20, "MiB"
    for ax, (name, tr) in zip(axes, traces.items()):
        t = tr.timeline()
        x = t["index"]
        ys = [[v / scale for v in t[c]] for c, _ in CATEGORIES]
        labels = [words for _, words in CATEGORIES]
        colors = [COLORS[c] for c, _ in CATEGORIES]
        keep = [i for i, y in enumerate(ys) if any(y)]
        ax.stackplot(x, *[ys[i] for i in keep], labels=[labels[i] for i in keep], colors=[colors[i] for i in keep],
                     linewidth=0)
        ax.axvline(tr.forward_end, color="#222222", lw=1, ls="--")
        ax.text(tr.forward_end, 0.97, " backward →", fontsize=7, va="top", transform=ax.get_xaxis_transform())
        ax.text(tr.forward_end, 0.97, "← forward ", fontsize=7, va="top", ha="right",
                transform=ax.get_xaxis_transform())
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("op number in the step", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel(f"held bytes ({unit})", fontsize=8)
    axes[0].set_ylim(0, axes[0].get_ylim()[1] * 1.15)  # room for the labels
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncols=len(labels))
    return fig

