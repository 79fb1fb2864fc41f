"""Counting FSDP2's collectives (taught in chapter 10, used by ``fsdp2.fsdp_lab``): a counter that wraps the
``torch.distributed`` functions FSDP2 calls, the calls the unit structure predicts, and what one rank sends.

    counter = CollectiveCounter()
    with counter.counting():
        model(x, y).backward()
    counter.snapshot()["allgather"] == expected_calls(n_blocks, True)["allgather"]   # 2L + 1
"""
from __future__ import annotations

import contextlib
import inspect

import torch
import torch.distributed as dist

from ...whatif.roofline import ring_bytes_sent
from ...engine.config import real, whole

COLLECTIVES = ("allgather", "reducescatter")


# ---- counting FSDP2's collectives ----------------------------------------------------------------------
# How: FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) issues every parameter AllGather and
# every gradient ReduceScatter through one function on ``torch.distributed`` (its DefaultAllGather /
# DefaultReduceScatter look it up there at each call), one call per FSDP unit (the unit's parameters are
# flattened into one buffer). Which function depends on the version: ``all_gather_single`` /
# ``reduce_scatter_single`` from torch 2.13 (2.14.1, the course's torch, too), ``all_gather_into_tensor`` /
# ``reduce_scatter_tensor`` in 2.9 (2.13 and later keep those names as deprecated aliases of the new ones).
# The counter wraps every name of the pair that this torch has and counts only the outermost call, so an
# alias that calls the other name is counted once.
# It records the full-size buffer of each call (the gathered output; the reduced input) and its dtype. At world
# size 1 FSDP calls neither (nothing to gather or scatter: it copies). The counts of a step are the same in the
# first step (FSDP's lazy initialisation adds no collective) and later ones. ``counter_problem`` turns "counted
# nothing where the unit structure expects calls" (this torch calls a function not wrapped) into an error.

COLLECTIVE_FUNCTIONS = {  # per collective: the torch.distributed names FSDP2 has used, and the full buffer
    "allgather": (("all_gather_single", "output_tensor"), ("all_gather_into_tensor", "output_tensor")),
    "reducescatter": (("reduce_scatter_single", "input"), ("reduce_scatter_tensor", "input")),
}


def ring_bytes_per_rank(buffer_bytes: float, world_size: int) -> float:
    """Bytes one rank sends (and receives) for an AllGather or ReduceScatter of a ``buffer_bytes`` buffer on
    a ring of ``world_size`` ranks: every shard but its own passes through it once, (n - 1) / n of the buffer."""
    n = whole("world_size", world_size)
    real("buffer_bytes", buffer_bytes, allowed="bytes >= 0")
    return ring_bytes_sent(buffer_bytes, n) / 2  # half a ring AllReduce: its ReduceScatter or its AllGather


class CollectiveCounter:
    """Counts FSDP2's AllGather / ReduceScatter calls (and their bytes) while on, through whichever of
    ``COLLECTIVE_FUNCTIONS`` this torch has."""

    def __init__(self):
        self.calls = {c: 0 for c in COLLECTIVES}
        self.bytes = {c: 0 for c in COLLECTIVES}
        self.dtypes = {c: set() for c in COLLECTIVES}
        self.functions = {c: set() for c in COLLECTIVES}  # the names that were called (outermost)
        self._depth = 0  # > 0 inside a counted call: an alias calling the other name is not counted again

    @staticmethod
    def wrapped_names() -> dict:
        """Per collective, the names of ``COLLECTIVE_FUNCTIONS`` this torch has (the ones the counter wraps)."""
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
                    self.calls[what] += 1
                    self.bytes[what] += t.numel() * t.element_size()
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
        return {**{c: self.calls[c] for c in COLLECTIVES},
                **{f"{c}_bytes": self.bytes[c] for c in COLLECTIVES},
                **{f"{c}_dtypes": sorted(self.dtypes[c]) for c in COLLECTIVES},
                **{f"{c}_functions": sorted(self.functions[c]) for c in COLLECTIVES}}


def expected_calls(n_blocks: int, reshard_after_forward: bool = True, micro_batches: int = 1,
                   sync_every_micro_batch: bool = True, world_size: int = 2,
                   root_reshard_after_forward: bool = False) -> dict:
    """FSDP2's collectives per optimizer update of a model sharded block by block plus the root (n_blocks + 1
    units): each unit gathers once for its forward; with ``reshard_after_forward`` every block gathers again
    for its backward; the root gathers again only if it too was resharded after forward. ``fully_shard``'s
    ``reshard_after_forward`` defaults to None (in torch 2.9 to 2.14.1): True for a non-root unit, False
    for the root (kept gathered: its backward comes first), so the default is 2L + 1 AllGathers per step;
    ``fully_shard(model, reshard_after_forward=True)`` on the root gives 2L + 2
    (``root_reshard_after_forward=True`` here). Each unit reduce-scatters once per synced backward. At world
    size 1 there is nothing to gather or scatter: 0."""
    L, k = whole("n_blocks", n_blocks), whole("micro_batches", micro_batches)
    whole("world_size", world_size)
    per_pass = (L + 1) + (L if reshard_after_forward else 0) + (1 if root_reshard_after_forward else 0)
    synced = k if sync_every_micro_batch else 1
    if world_size == 1:
        return {"allgather": 0, "reducescatter": 0}
    return {"allgather": k * per_pass, "reducescatter": synced * (L + 1)}


def counter_problem(lab: dict) -> str | None:
    """Why the counted collectives cannot be trusted, or None: a part that counted 0 calls of a collective
    the unit structure expects (this torch's FSDP2 calls a function the counter does not wrap)."""
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
