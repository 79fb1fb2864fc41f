"""What each rank of the tensor-parallel demo runs (taught in chapter 10; ``tensor.tp_demo`` starts them):
the unsplit GPT and each version of its TP split from the same seed, one forward+backward on the same
batch with every collective counted, the gradients gathered back into the full layout and compared, then
timed steps. The collectives are counted by torch's own ``CommDebugMode`` where the installed torch can trace
labkit's Block (``commdebug_block_error()`` tries it), by the course's ``CollectiveCounter`` only where it
cannot; each rank reports which (``counter``) and why."""
from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from ...engine import ddp as ddp_mod
from ...engine.data import ByteWindows, corpus_path
from ...engine.model import GPT, Block
from .megatron import COMM, TPBlock, TPBlockSeparateQKV, dtensor_block, permute_qkv_per_head, tp_shard_names

def _batch(spec, batch: int, seed: int):
    ds = ByteWindows(corpus_path(None), spec.seq_len)
    g = torch.Generator().manual_seed(seed)
    xs, ys = zip(*(ds[i] for i in torch.randint(0, len(ds), (batch,), generator=g).tolist()))
    return torch.stack(xs), torch.stack(ys)


def _time_step(model, x, y, repeats: int) -> list:
    """Seconds of each of ``repeats`` forward+backward steps (one warm-up step first, excluded)."""
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        model(x, y).backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        if dist.is_initialized():
            dist.barrier()  # the step ends when the slowest rank is done
        if i:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return times


def _gathered(t, dim, world_size):
    """The full tensor from every rank's part along ``dim`` (plain dist: not one of the counted calls)."""
    parts = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=dim)


def _plain_grad_error(tp_model, ref, spec, world_size) -> float:
    """Max |TP gradient - unsplit gradient| over every parameter, the TP ones gathered into the full layout
    (qkv rows mapped back with the permutation's inverse)."""
    outside = [p for n, p in tp_model.named_parameters() if not n.startswith("blocks.")]
    worst = max((p.grad - q.grad).abs().max().item() for p, q in
                zip(outside, [q for n, q in ref.named_parameters() if not n.startswith("blocks.")]))
    inverse = permute_qkv_per_head(ref.blocks[0].attn.qkv.weight, ref.blocks[0].attn.qkv.bias, spec.n_head,
                                   world_size).inverse
    for tb, fb in zip(tp_model.blocks, ref.blocks):
        full = dict(fb.named_parameters())
        for tp_name, full_name, dim in tp_shard_names():
            g = tb.get_parameter(tp_name).grad
            g = g if dim is None else _gathered(g, dim, world_size)
            g = g[inverse] if tp_name.startswith("qkv") else g
            worst = max(worst, (g - full[full_name].grad).abs().max().item())
    return worst


def _dtensor_grad_error(tp_model, ref, spec, world_size) -> float:
    """Max |TP gradient - unsplit gradient|: each DTensor gradient gathered whole (``full_tensor``), the
    qkv rows mapped back with the permutation's inverse."""
    worst = 0.0
    inverse = None
    for (n, p), q in zip(tp_model.named_parameters(), ref.parameters()):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        if n.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            if inverse is None:
                inverse = permute_qkv_per_head(q.new_zeros(3 * spec.d_model, spec.d_model), None, spec.n_head,
                                               world_size).inverse
            g = g[inverse]
        worst = max(worst, (g - q.grad).abs().max().item())
    return worst


_COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "all_to_all",
                "alltoall", "send", "recv")


class CollectiveCounter(TorchDispatchMode):
    """Notes every collective op (c10d's and the functional ones DTensor issues) that runs inside it: its
    name and the bytes of its tensor. What ``torch.distributed.tensor.debug.CommDebugMode`` counts, without
    its module tracker -- the fallback where that tracker fails on labkit's Block (``commdebug_block_error``):
    on torch 2.13 it registered a new forward hook each time a module runs, and Block calls ``self.drop``
    twice, so the second one popped its parent stack twice ("IndexError: list index out of range"); torch
    2.14.1 traces Block, so there the demo uses CommDebugMode itself."""

    def __init__(self):
        super().__init__()
        from torch.distributed.tensor import DTensor  # deferred: DTensor's import costs a second

        self.dtensor = DTensor
        self.calls = []  # (op name, bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        if any(issubclass(t, self.dtensor) for t in types):
            return NotImplemented  # let DTensor turn the op into local ops and collectives first
        name = func._overloadpacket.__name__
        if func.namespace in ("c10d", "_c10d_functional") and any(w in name for w in _COLLECTIVES):
            self.calls.append((name.rstrip("_"), _bytes(args)))
        return func(*args, **(kwargs or {}))


def _bytes(args) -> int:
    t = args[0][0] if isinstance(args[0], (list, tuple)) else args[0]
    return t.numel() * t.element_size()


@functools.lru_cache(maxsize=None)
def commdebug_block_error() -> str:
    """"" when torch's ``CommDebugMode`` traces a forward and a backward of labkit's ``Block`` in this process's
    torch; otherwise the exception it raised (torch 2.13: "IndexError: list index out of range"; 2.14.1 traces
    it; see ``CollectiveCounter``), or why it is missing. Found by trying it, never from the version number: a fix (or a
    regression) in any torch shows up here. No process group is needed: a Block without collectives."""
    try:
        from torch.distributed.tensor.debug import CommDebugMode  # deferred: DTensor's import costs a second
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    torch.manual_seed(0)
    x = torch.randn(2, 8, 64, requires_grad=True)
    try:
        with CommDebugMode():
            out = Block(64, 4, 0.0)(x)  # its dropout module runs twice: what broke the tracker
        with CommDebugMode():
            out.sum().backward()
    except Exception as e:  # noqa: BLE001 -- any failure means: count with the course's own mode
        return f"{type(e).__name__}: {e}"
    return ""


def _commdebug_counter():
    """A ``CommDebugMode`` that also notes each collective's bytes: the collectives are the ops CommDebugMode
    itself counted (its total grew), in its own names (native functional ops under their legacy names)."""
    from torch.distributed.tensor.debug import CommDebugMode  # deferred: DTensor only

    class CommDebugCounter(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.calls = []  # (op name, bytes), as CollectiveCounter's

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = self.get_total_counts()
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if self.get_total_counts() > before:
                self.calls.append((func._overloadpacket.__name__.rstrip("_"), _bytes(args)))
            return out

    return CommDebugCounter()


def counter_choice() -> dict:
    """Which mode counts the demo's collectives here: {"counter": "CommDebugMode" or "CollectiveCounter",
    "why": the error CommDebugMode raised on labkit's Block ("" when it traced it), "torch": the version}."""
    error = commdebug_block_error()
    return {"counter": "CollectiveCounter" if error else "CommDebugMode", "why": error, "torch": torch.__version__}


def _counted_step(model, x, y, style):
    """One forward and one backward, the TP collectives of each counted: by ``all_reduce``'s own notes for
    the plain versions, by a dispatch mode that sees every collective op for DTensor (and, as a cross-check,
    for the plain ones too) -- torch's CommDebugMode where it traces labkit's Block, the course's own otherwise."""
    for phase in COMM:
        COMM[phase].clear()
    new_counter = CollectiveCounter if commdebug_block_error() else _commdebug_counter
    with new_counter() as fwd:
        loss = model(x, y)
    with new_counter() as bwd:
        loss.backward()
    seen = {"forward": fwd.calls, "backward": bwd.calls}
    own = None if style == "dtensor" else {p: [("all_reduce", b) for b in COMM[p]] for p in COMM}
    return own, seen, loss


def _commdebug_counts(block, d_model: int, x) -> dict:
    """CommDebugMode's own AllReduce count, forward and backward, for one DTensor block's attention and MLP
    called directly -- the cross-check where its module tracker breaks on Block.forward itself (see
    CollectiveCounter): there the demo counts with the course's own mode."""
    from torch.distributed.tensor.debug import CommDebugMode  # deferred: DTensor only

    h = torch.randn(x.shape[0], x.shape[1], d_model, device=x.device, requires_grad=True)
    with CommDebugMode() as fwd:
        out = block.attn(h) + block.out(torch.nn.functional.gelu(block.fc(h)))
    with CommDebugMode() as bwd:
        out.sum().backward()
    block.zero_grad(set_to_none=True)
    return {p: sum(v for k, v in m.get_comm_counts().items() if "all_reduce" in str(k))
            for p, m in (("forward", fwd), ("backward", bwd))}


def _unchanged_attention_error(spec, seed, mesh, x) -> str:
    """What ColwiseParallel on labkit's fused ``attn.qkv`` does to its Attention as written (no permutation,
    no LocalAttention): the exception's text, or "" if it ran."""
    from torch.distributed.tensor.parallel import (  # deferred: a second to import; DTensor only
        ColwiseParallel, RowwiseParallel, parallelize_module)

    torch.manual_seed(seed)
    block = GPT(spec).blocks[0].to(x.device)
    parallelize_module(block, mesh, {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel()})
    try:
        block(torch.randn(x.shape[0], x.shape[1], spec.d_model, device=x.device))
    except Exception as e:  # noqa: BLE001 -- reported: the chapter says what happens
        return f"{type(e).__name__}: {e}"
    return ""


def _tp_model(style, spec, seed, rank, world_size, mesh, device):
    torch.manual_seed(seed)
    model = GPT(spec).to(device)  # the full model from the same seed on every rank: the same weights to split
    if style == "dtensor":
        for block in model.blocks:
            dtensor_block(block, mesh)
    else:
        cls = TPBlockSeparateQKV if style == "separate" else TPBlock
        model.blocks = nn.ModuleList(cls(b, rank, world_size) for b in model.blocks)
    return model


def _tp_rank(rank, spec, micro_batch: int, seed: int, styles: tuple, repeats: int, kind: str) -> dict:
    """A spawned TP rank: the unsplit GPT and each style's TP version of it from the same seed, one counted
    forward+backward on the same batch, the gradients compared, then timed steps."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    device = torch.device(f"cuda:{rank.rank}" if kind == "cuda" else "cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    ws = rank.world_size
    with ddp_mod.process_group(kind, rank.rank, ws, rank.file_store()):
        x, y = (t.to(device) for t in _batch(spec, micro_batch, seed))
        torch.manual_seed(seed)
        ref = GPT(spec).to(device)
        ref_loss = ref(x, y)
        ref_loss.backward()
        out = {"ref_loss": ref_loss.item(), "styles": {}, **counter_choice()}
        mesh = None
        for style in styles:
            if style == "dtensor" and mesh is None:
                from torch.distributed.device_mesh import init_device_mesh  # deferred: only for DTensor

                mesh = init_device_mesh(device.type, (ws,))
                out["unchanged_attention_error"] = _unchanged_attention_error(spec, seed, mesh, x)
            model = _tp_model(style, spec, seed, rank.rank, ws, mesh, device)
            own, seen, loss = _counted_step(model, x, y, style)
            err = (_dtensor_grad_error if style == "dtensor" else _plain_grad_error)(model, ref, spec, ws)
            model.zero_grad(set_to_none=True)
            out["styles"][style] = {"own": own, "seen": seen, "loss": loss.item(), "grad_error": err,
                                    "step_times": _time_step(model, x, y, repeats)}
            if style == "dtensor" and commdebug_block_error():
                out["styles"][style]["commdebug"] = _commdebug_counts(model.blocks[0], spec.d_model, x)
        ref.zero_grad(set_to_none=True)
        out["unsplit_step_times"] = _time_step(ref, x, y, repeats)  # every rank at once: each on its own core
        return out
