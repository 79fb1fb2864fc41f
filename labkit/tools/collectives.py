"""What every multi-process demo of chapters 10 and 12 needs on its ranks: where they run (NCCL with
a GPU per rank, else gloo on the CPU), the machine's load beside their times, and the one counter of
collectives (``CollectiveCounter``: by kind and bytes) -- or torch's own CommDebugMode where it
works."""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..base.runtime import RunError
from ..engine.launch import spawn_ranks
from ..engine.model import Block


def load_average() -> float:
    """The machine's 1-minute load average (the demo's ranks included; 0 where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def device_kind(world_size: int) -> str:
    """"cuda" (NCCL, ``cuda:rank``) where this machine has a GPU per rank, else "cpu" (gloo)."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "cpu"


def backend(world_size: int) -> str:
    """"nccl" where this machine has a GPU per rank, else "gloo" (CPU processes) -- what the demos use."""
    return "nccl" if device_kind(world_size) == "cuda" else "gloo"


def rank_device(kind: str, rank: int) -> torch.device:
    """A spawned demo rank's set-up before its work: one thread (the ranks share this machine's cores) and its
    device -- ``cuda:rank``, made the current one (NCCL's collectives use it), where ``kind`` is "cuda", else
    the CPU."""
    torch.set_num_threads(1)
    if kind != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    return device


def rank_lab(lab: dict, target, args: tuple, what: str, timeout_s: float, prefix: str) -> dict:
    """``lab`` (its "world_size" and "kind") run: ``target(rank, *args)`` on every rank, their results in
    "ranks" (rank 0 first) and the spawn's "seconds"; or ok False with the launcher's ``error`` (``what``
    names the lab in it) where a rank failed or ``timeout_s`` passed."""
    t0, ws = time.monotonic(), lab["world_size"]
    try:
        with spawn_ranks(target, ws, args, kind=lab["kind"], prefix=prefix) as ranks:
            results = ranks.collect(timeout_s, what)
    except RunError as e:
        return {**lab, "ok": False, "error": str(e)}
    return {**lab, "seconds": time.monotonic() - t0, "ranks": [results[r] for r in range(ws)]}


def gpu_count() -> int:
    """The GPUs this machine has (0 where CUDA is not available): fewer than the ranks, and they run on the CPU."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def figure(width, height):
    """A new figure and its one axes."""
    from .plots.figure import _axes  # deferred: matplotlib is optional; loaded only to draw

    return _axes(None, width, height)


# ---- counting collectives ------------------------------------------------------------------------
# Two ways in, one record. FSDP2 issues every parameter AllGather and gradient ReduceScatter through
# one function on ``torch.distributed``, looked up at each call, one call per FSDP unit:
# ``all_gather_single`` / ``reduce_scatter_single`` from torch 2.13, ``all_gather_into_tensor`` /
# ``reduce_scatter_tensor`` in 2.9 (2.13 keeps those as aliases of the new ones). ``counting()``
# wraps every name this torch has and counts the outermost call only (an alias is counted once),
# with the full-size buffer. At world size 1 FSDP calls neither (it copies). Tensor parallelism's
# collectives are seen by entering the counter as a dispatch mode: what ``CommDebugMode`` counts,
# without its module tracker, which on torch 2.13 failed on labkit's Block
# (``commdebug_block_error``). Under HSDP FSDP2 also AllReduces each gradient shard on the replicate
# group: ``counting(all_reduce=True)``.
COLLECTIVES = ("allgather", "reducescatter")  # FSDP2's
COLLECTIVE_FUNCTIONS = {  # per collective: the torch.distributed names FSDP2 has used, and the full buffer
    "allgather": (("all_gather_single", "output_tensor"), ("all_gather_into_tensor", "output_tensor")),
    "reducescatter": (("reduce_scatter_single", "input"), ("reduce_scatter_tensor", "input")),
}
ALL_REDUCE = {"allreduce": (("all_reduce", "tensor"),)}
_OPS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "all_to_all",
        "alltoall", "send", "recv")  # the collective ops a dispatch mode notes (c10d's and functional names)


def tensor_bytes(args) -> int:
    """Bytes of a collective's tensor: its first argument (or the first of a list of them)."""
    t = args[0][0] if isinstance(args[0], (list, tuple)) else args[0]
    return t.numel() * t.element_size()


class CollectiveCounter(TorchDispatchMode):
    """Notes collective calls and their bytes in ``calls`` [(name, bytes)]: as a dispatch mode
    (``with counter:``) every collective op that runs; inside ``counting()`` every call of FSDP2's
    functions (``COLLECTIVE_FUNCTIONS``), with dtypes and names (``snapshot()``); with
    ``counting(ranks=True)`` also in ``groups`` [(name, bytes, the global ranks of the call's
    group)]."""

    def __init__(self):
        super().__init__()
        self.calls, self.groups = [], []
        self.dtypes = {c: set() for c in (*COLLECTIVES, *ALL_REDUCE)}
        self.functions = {c: set() for c in (*COLLECTIVES, *ALL_REDUCE)}  # the names called (outermost)
        self._depth = 0  # > 0 inside a counted call: an alias calling the other name is not counted again

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        from torch.distributed.tensor import DTensor  # deferred: DTensor's import costs a second

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor turn the op into local ops and collectives first
        name = func._overloadpacket.__name__
        if func.namespace in ("c10d", "_c10d_functional") and any(w in name for w in _OPS):
            self.calls.append((name.rstrip("_"), tensor_bytes(args)))
        return func(*args, **(kwargs or {}))

    @staticmethod
    def wrapped_names() -> dict:
        """Per collective, the names of ``COLLECTIVE_FUNCTIONS`` this torch has (the ones ``counting`` wraps)."""
        return {c: [n for n, _ in pairs if hasattr(dist, n)] for c, pairs in COLLECTIVE_FUNCTIONS.items()}

    @contextlib.contextmanager
    def counting(self, all_reduce: bool = False, ranks: bool = False):
        """Inside the block, every outermost call of FSDP2's functions (and ``dist.all_reduce`` with
        ``all_reduce``) is noted with its full buffer; with ``ranks`` also in ``groups``."""
        functions = {**COLLECTIVE_FUNCTIONS, **(ALL_REDUCE if all_reduce else {})}
        saved = {n: getattr(dist, n) for pairs in functions.values() for n, _ in pairs if hasattr(dist, n)}

        def wrap(what, name, fn, arg):
            sig = inspect.signature(fn)

            def counted(*args, **kwargs):
                if self._depth == 0:
                    bound = sig.bind(*args, **kwargs).arguments
                    t, size = bound[arg], bound[arg].numel() * bound[arg].element_size()
                    self.calls.append((what, size))
                    self.dtypes[what].add(str(t.dtype).replace("torch.", ""))
                    self.functions[what].add(name)
                    if ranks:
                        g = bound.get("group")
                        g = dist.get_process_group_ranks(g) if g is not None else range(dist.get_world_size())
                        self.groups.append((what, size, tuple(g)))
                self._depth += 1
                try:
                    return fn(*args, **kwargs)
                finally:
                    self._depth -= 1
            return counted

        for what, pairs in functions.items():
            for name, arg in pairs:
                if name in saved:
                    setattr(dist, name, wrap(what, name, saved[name], arg))
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(dist, name, fn)

    def snapshot(self) -> dict:
        """FSDP2's calls, bytes, dtypes and function names per collective."""
        return {**{c: sum(n == c for n, _ in self.calls) for c in COLLECTIVES},
                **{f"{c}_bytes": sum(b for n, b in self.calls if n == c) for c in COLLECTIVES},
                **{f"{c}_dtypes": sorted(self.dtypes[c]) for c in COLLECTIVES},
                **{f"{c}_functions": sorted(self.functions[c]) for c in COLLECTIVES}}


@functools.lru_cache(maxsize=None)
def commdebug_block_error() -> str:
    """"" when torch's ``CommDebugMode`` traces a forward and a backward of labkit's ``Block`` in
    this torch; otherwise the exception it raised, or why it is missing. Found by trying it, never
    from the version number: on torch 2.13 its tracker registered a forward hook each time a module
    ran, and Block calls ``self.drop`` twice ("IndexError: list index out of range"); 2.14.1 traces
    it."""
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


def commdebug_counter():
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
                self.calls.append((func._overloadpacket.__name__.rstrip("_"), tensor_bytes(args)))
            return out

    return CommDebugCounter()


def counter_choice() -> dict:
    """Which mode counts the demo's collectives here: {"counter": "CommDebugMode" or "CollectiveCounter",
    "why": the error CommDebugMode raised on labkit's Block ("" when it traced it), "torch": the version}."""
    error = commdebug_block_error()
    return {"counter": "CollectiveCounter" if error else "CommDebugMode", "why": error, "torch": torch.__version__}


def commdebug_counts(block, d_model: int, x) -> dict:
    """CommDebugMode's own AllReduce count, forward and backward, of one DTensor block's attention
    and MLP called directly: the cross-check where its module tracker breaks on Block.forward
    itself."""
    from torch.distributed.tensor.debug import CommDebugMode  # deferred: DTensor only

    h = torch.randn(x.shape[0], x.shape[1], d_model, device=x.device, requires_grad=True)
    with CommDebugMode() as fwd:
        out = block.attn(h) + block.out(torch.nn.functional.gelu(block.fc(h)))
    with CommDebugMode() as bwd:
        out.sum().backward()
    block.zero_grad(set_to_none=True)
    return {p: sum(v for k, v in m.get_comm_counts().items() if "all_reduce" in str(k))
            for p, m in (("forward", fwd), ("backward", bwd))}
