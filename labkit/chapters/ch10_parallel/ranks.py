"""What chapter 10's demos read on their ranks: the bytes an FSDP2 rank holds (FSDP2's private state, read
only); a pipeline's clock, its message time and its saved activations; and, back in the calling process,
whether the collectives counter can be trusted with this torch's FSDP2 (``counter_problem``).
"""
from __future__ import annotations

import statistics
import time
import weakref

import torch
import torch.distributed as dist

from ...engine.ddp import local_bytes as _local_bytes
from ...tools.collectives import COLLECTIVE_FUNCTIONS, COLLECTIVES, CollectiveCounter
from .formulas import expected_calls


# ---- what an FSDP2 rank holds -------------------------------------------------------------------------

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
    held = [(fp.unsharded_accumulated_grad, fp._unsharded_param.grad if hasattr(fp, "_unsharded_param") else None)
            for g in _param_groups(model) for fp in g.fsdp_params]
    return sum(t.untyped_storage().nbytes() for pair in held for t in pair if t is not None)


def optimizer_bytes(opt) -> int:
    return sum(_local_bytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
               for st in opt.state.values())


def full_vector(model) -> torch.Tensor:
    """Every parameter, gathered and flattened (a collective: every rank calls it)."""
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1).cpu()
                      for p in model.parameters()])


def dtypes(tensors) -> list:
    return sorted({str(t.dtype).replace("torch.", "") for t in tensors if t is not None})


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


# ---- a pipeline's messages and saved activations --------------------------------------------------------

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
