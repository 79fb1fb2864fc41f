"""The instruments chapter 10's demos run on their ranks: where the ranks run (NCCL with a GPU per rank, else
gloo on the CPU) and the machine's load beside their times; the one counter of collectives (and whether torch's
CommDebugMode can count instead), what FSDP2's unit structure predicts; the bytes an FSDP2 rank holds; a
pipeline's message time and saved activations; the figure every chart starts from.

    par.backend(2)        # "nccl" with two GPUs here, else "gloo"
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import statistics
import time
import weakref

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ...engine.config import real, whole
from ...engine.ddp import local_bytes as _local_bytes
from ...engine.model import Block
from ...whatif.roofline import ring_bytes_sent


def load_average() -> float:
    """The machine's 1-minute load average (the demo's ranks included; 0 where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def device_kind(world_size: int) -> str:
    """"cuda" (NCCL, ``cuda:rank``) where this machine has a GPU per rank, else "cpu" (gloo)."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "cpu"


def backend(world_size: int) -> str:
    """"nccl" where this machine has a GPU per rank, else "gloo" (CPU processes) -- what the demos use."""
    return "nccl" if device_kind(world_size) == "cuda" else "gloo"


def gpu_count() -> int:
    """The GPUs this machine has (0 where CUDA is not available): fewer than the ranks, and they run on the CPU."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ring_bytes_per_rank(buffer_bytes: float, world_size: int) -> float:
    """Bytes one rank sends (and receives) for an AllGather or ReduceScatter of a ``buffer_bytes`` buffer on
    a ring of ``world_size`` ranks: every shard but its own passes through it once, (n - 1) / n of the buffer."""
    n = whole("world_size", world_size)
    real("buffer_bytes", buffer_bytes, allowed="bytes >= 0")
    return ring_bytes_sent(buffer_bytes, n) / 2  # half a ring AllReduce: its ReduceScatter or its AllGather


def figure(width, height):
    """A new figure and its one axes."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    return fig, fig.add_subplot(1, 1, 1)


# ---- counting collectives --------------------------------------------------------------------------------
# Two ways in, one record. FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) issues every
# parameter AllGather and gradient ReduceScatter through one function on ``torch.distributed``, looked up at
# each call, one call per FSDP unit: ``all_gather_single`` / ``reduce_scatter_single`` from torch 2.13 (2.14.1,
# the course's, too), ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` in 2.9 (2.13 keeps those as
# deprecated aliases of the new ones). ``counting()`` wraps every name of the pair this torch has and counts
# only the outermost call, so an alias that calls the other name is counted once; it records the full-size
# buffer (the gathered output; the reduced input). At world size 1 FSDP calls neither (it copies).
# Tensor parallelism's collectives (c10d's, and the functional ones DTensor issues) are seen by entering the
# counter as a dispatch mode: what ``torch.distributed.tensor.debug.CommDebugMode`` counts, without its module
# tracker -- the fallback where that tracker fails on labkit's Block (``tensor.commdebug_block_error``): on
# torch 2.13 it registered a new forward hook each time a module ran, and Block calls ``self.drop`` twice, so
# the second popped its parent stack twice ("IndexError: list index out of range"); 2.14.1 traces Block.

COLLECTIVES = ("allgather", "reducescatter")  # FSDP2's
COLLECTIVE_FUNCTIONS = {  # per collective: the torch.distributed names FSDP2 has used, and the full buffer
    "allgather": (("all_gather_single", "output_tensor"), ("all_gather_into_tensor", "output_tensor")),
    "reducescatter": (("reduce_scatter_single", "input"), ("reduce_scatter_tensor", "input")),
}
_OPS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "all_to_all",
        "alltoall", "send", "recv")  # the collective ops a dispatch mode notes (c10d's and functional names)


def tensor_bytes(args) -> int:
    """Bytes of a collective's tensor: its first argument (or the first of a list of them)."""
    t = args[0][0] if isinstance(args[0], (list, tuple)) else args[0]
    return t.numel() * t.element_size()


class CollectiveCounter(TorchDispatchMode):
    """Notes collective calls and their bytes in ``calls`` [(name, bytes)]: as a dispatch mode (``with
    counter:``) every collective op that runs; inside ``counting()`` every call of FSDP2's torch.distributed
    functions (``COLLECTIVE_FUNCTIONS``), with their dtypes and the names called (``snapshot()``)."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.dtypes = {c: set() for c in COLLECTIVES}
        self.functions = {c: set() for c in COLLECTIVES}  # the names that were called (outermost)
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
    def counting(self):
        saved = {n: getattr(dist, n) for pairs in COLLECTIVE_FUNCTIONS.values() for n, _ in pairs
                 if hasattr(dist, n)}

        def wrap(what, name, fn, arg):
            sig = inspect.signature(fn)

            def counted(*args, **kwargs):
                if self._depth == 0:
                    t = sig.bind(*args, **kwargs).arguments[arg]
                    self.calls.append((what, t.numel() * t.element_size()))
                    self.dtypes[what].add(str(t.dtype).replace("torch.", ""))
                    self.functions[what].add(name)
                self._depth += 1
                try:
                    return fn(*args, **kwargs)
                finally:
                    self._depth -= 1
            return counted

        for what, pairs in COLLECTIVE_FUNCTIONS.items():
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


def expected_calls(n_blocks: int, reshard_after_forward: bool = True, micro_batches: int = 1,
                   sync_every_micro_batch: bool = True, world_size: int = 2,
                   root_reshard_after_forward: bool = False) -> dict:
    """FSDP2's collectives per optimizer update of a model sharded block by block plus the root (L + 1 units): each
    unit gathers once for its forward, every block again for its backward with ``reshard_after_forward``, the
    root again only if it too was resharded (``fully_shard``'s default, torch 2.9 to 2.14.1: True for a
    block, False for the root: 2L + 1 per step). Each unit reduce-scatters once per synced backward. World
    size 1: none."""
    L, k = whole("n_blocks", n_blocks), whole("micro_batches", micro_batches)
    whole("world_size", world_size)
    per_pass = (L + 1) + (L if reshard_after_forward else 0) + (1 if root_reshard_after_forward else 0)
    synced = k if sync_every_micro_batch else 1
    if world_size == 1:
        return {"allgather": 0, "reducescatter": 0}
    return {"allgather": k * per_pass, "reducescatter": synced * (L + 1)}


def counter_problem(lab: dict) -> str | None:
    """Why the counted collectives cannot be trusted, or None: a part that counted 0 calls where the unit structure
    expects some (this torch's FSDP2 calls a function the counter does not wrap)."""
    L, k = lab["n_blocks"], lab["accumulation"]
    parts = {"reshard_after_forward=True": (lab["reshard"][True], expected_calls(L, True)),
             "reshard_after_forward=False": (lab["reshard"][False], expected_calls(L, False)),
             "root resharded": (lab["reshard_root"], expected_calls(L, True, root_reshard_after_forward=True)),
             "bf16 mixed precision": (lab["precision"], expected_calls(L, True)),
             "accumulation, sync every micro-batch": (lab["accum"]["sync_every"],
                                                      expected_calls(L, True, micro_batches=k))}
    names = CollectiveCounter.wrapped_names()
    for part, (got, want) in parts.items():
        for c in COLLECTIVES:
            if got[c] == 0 and want[c] > 0:
                wrapped = ", ".join(f"dist.{n}" for n in names[c]) or "none of " + ", ".join(
                    f"dist.{n}" for n, _ in COLLECTIVE_FUNCTIONS[c])
                return (f"the collectives counter counted 0 {c} calls in the {part} step where the unit structure "
                        f"expects {want[c]}: torch {torch.__version__}'s FSDP2 issues them through a function it "
                        f"does not wrap (it wraps {wrapped}); the counts would be wrong, so none are reported")
    return None


# ---- timing a rank's steps ----------------------------------------------------------------------------------

def time_steps(model, x, y, repeats: int) -> list:
    """Seconds of each of ``repeats`` forward+backward steps after one warm-up."""
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


# ---- what an FSDP2 rank holds -----------------------------------------------------------------------------

def _param_groups(model):
    """FSDP2's parameter groups, one per unit (private state, read only)."""
    from torch.distributed.fsdp import FSDPModule  # deferred: 0.4 s to import, only in the ranks

    groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule)]
    return [g for g in groups if g is not None]


def unsharded_param_bytes(model) -> int:
    """Bytes of gathered parameters alive now: FSDP2's all-gather outputs, resized to 0 when it reshards."""
    return sum(t.untyped_storage().nbytes() for g in _param_groups(model) for fp in g.fsdp_params
               for t in fp.all_gather_outputs)


def unsharded_grad_bytes(model) -> int:
    """Bytes of full-size gradients not yet reduce-scattered: what a rank holds while sync is off."""
    total = 0
    for g in _param_groups(model):
        for fp in g.fsdp_params:
            grad = fp._unsharded_param.grad if hasattr(fp, "_unsharded_param") else None
            for t in (fp.unsharded_accumulated_grad, grad):
                if t is not None:
                    total += t.untyped_storage().nbytes()
    return total


def optimizer_bytes(opt) -> int:
    return sum(_local_bytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
               for st in opt.state.values())


def full_vector(model) -> torch.Tensor:
    """Every parameter, gathered and flattened (a collective: every rank calls it)."""
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1).cpu()
                      for p in model.parameters()])


def dtypes(tensors) -> list:
    return sorted({str(t.dtype).replace("torch.", "") for t in tensors if t is not None})


def padded_numel(shape, world_size) -> int:
    """FSDP2 pads dim 0 up to a multiple of the world size (its ``_get_dim0_padded_size``)."""
    if not len(shape):
        return world_size
    return -(-shape[0] // world_size) * world_size * torch.Size(shape[1:]).numel()


# ---- a pipeline's messages and saved activations -----------------------------------------------------------

def sync_clock(dev):
    if dev.type != "cuda":
        return time.perf_counter

    def now():  # a GPU's work is asynchronous: a timestamp means something once the device has finished
        torch.cuda.synchronize(dev)
        return time.perf_counter()
    return now


def ping_pong(r, shape, rounds=20, device="cpu", now=time.perf_counter):
    """The one-way time of a message of ``shape`` float32s between ranks 0 and 1 (every other rank returns
    None): rank 0 sends, rank 1 sends it back, ``rounds`` times after 3 untimed ones; half the median
    round trip. It is what each micro-batch's send/recv pays on top of the compute."""
    if r > 1:
        return None
    buf, trips = torch.zeros(shape, device=device), []
    for k in range(rounds + 3):
        t0 = now()
        if r == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if k >= 3:
            trips.append(now() - t0)
    return statistics.median(trips) / 2


class _Held:
    """What autograd keeps instead of a saved tensor while the counter runs: dies when autograd lets go."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class SavedActivations:
    """Bytes of the tensors autograd saved for backward that are alive now, and their peak: a
    ``saved_tensors_hooks`` pair wraps each saved tensor in a holder, and a finalizer subtracts the bytes
    when autograd frees it (after the backward that used it). Each storage counts once; parameters
    (always alive, not activations) are not counted."""

    def __init__(self, params):
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.live, self.now, self.peak = {}, 0, 0

    def _pack(self, t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.skip:
            return t
        count, nbytes = self.live.get(key, (0, storage.nbytes()))
        if count == 0:
            self.now += nbytes
            self.peak = max(self.peak, self.now)
        self.live[key] = (count + 1, nbytes)
        held = _Held(t)
        weakref.finalize(held, self._drop, key)
        return held

    def _drop(self, key):
        count, nbytes = self.live[key]
        if count == 1:
            del self.live[key]
            self.now -= nbytes
        else:
            self.live[key] = (count - 1, nbytes)

    @staticmethod
    def _unpack(held):
        return held.t if isinstance(held, _Held) else held

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
