"""Data parallelism: the process group, a comm hook that counts AllReduce calls, the DDP wrapper;
and which rank a failed run blames.

World size 1 runs in the caller's process with a process group of one (a HashStore: no port); larger
worlds are spawned by ``launch`` and join the group here, on the loopback interface. Under
``torchrun`` the same entry point joins the group torchrun set up. The backend: NCCL on CUDA GPUs,
gloo otherwise, or what ``LABKIT_DIST_BACKEND`` names. A group of GPUs on NCCL first runs a
one-number AllReduce with a short timeout (``preflight``): a pair whose NCCL transfers hang
(PCIe-only GPUs such as Kaggle's 2 x T4) ends there, in one line naming ``NCCL_P2P_DISABLE=1``.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import queue as queue_mod
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ..base.runtime import ConfigError, RunError, under_torchrun
from ..base.compat import need
from .data import ByteWindows, corpus_path

TIMEOUT = datetime.timedelta(seconds=60)  # a dead peer makes collectives fail instead of hanging forever


# ---- counting communication hook ------------------------------------------------------------

@dataclass
class CommCounter:
    """State of the counting hook. Every call here is one real collective DDP launched."""

    process_group: object = None
    kind: str = "allreduce"
    calls: int = 0
    bytes: int = 0
    round_calls: int = 0          # calls in the current synchronisation (ends at the last bucket)
    rounds: list = field(default_factory=list)  # calls per finished synchronisation


def counting_hook(state: CommCounter, bucket):
    """Count one AllReduce of ``bucket`` and its bytes on the wire, then average it as DDP would.
    Shown in 06_ddp_allreduce (code-06-comm-hook)."""
    buf = bucket.buffer()
    sent = 2 if state.kind in ("fp16_compress", "bf16_compress") else buf.element_size()
    state.calls += 1
    state.bytes += buf.numel() * sent
    state.round_calls += 1
    if bucket.is_last():
        state.rounds.append(state.round_calls)
        state.round_calls = 0
    if state.kind == "fp16_compress":
        return default_hooks.fp16_compress_hook(state.process_group, bucket)
    if state.kind == "bf16_compress":
        return default_hooks.bf16_compress_hook(state.process_group, bucket)
    return default_hooks.allreduce_hook(state.process_group, bucket)  # sum, then divide by world size


def data_parallel(model, dev, bucket_cap_mb: float, comm_hook: str) -> tuple:
    """(DDP module, CommCounter): ``model`` under DistributedDataParallel in the current process group,
    every collective counted by ``counting_hook``. Free the module before the group is destroyed: its
    reducer holds the group, and the other order can leave a process stuck in the reducer's destructor.
    Shown in 06_ddp_allreduce (code-06-ddp-setup)."""
    counter = CommCounter(kind=comm_hook)
    # init_sync broadcasts rank 0's weights and checks every rank's shapes: a group of one has nothing to
    # check, and the broadcast is a large share of a small model's fixed cost per run
    net = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb,
              init_sync=dist.get_world_size() > 1)
    net.register_comm_hook(counter, counting_hook)  # every bucket's AllReduce now goes through the counter
    return net, counter


# ---- process group ----------------------------------------------------------------------------

BACKENDS = ("gloo", "nccl")  # what LABKIT_DIST_BACKEND may name
# The pre-flight: one small AllReduce with a timeout of its own, before any work of a run on NCCL. Long enough
# for NCCL to build its communicator on a cold pair of GPUs (a few seconds), short next to TIMEOUT.
PREFLIGHT_S = 20.0
P2P_HINT = ("GPUs joined only by PCIe (2 x T4 on Kaggle, most cloud pairs without NVLink) can hang in NCCL's "
            "peer-to-peer path: set NCCL_P2P_DISABLE=1 (or LABKIT_DIST_BACKEND=gloo) before starting Python "
            "and run again")


def backend_for(kind: str) -> str:
    """The collectives' backend for ranks on ``kind``: ``LABKIT_DIST_BACKEND`` when set, else NCCL
    on CUDA where this torch has it, gloo otherwise; a bad value is a ConfigError."""
    value = os.environ.get("LABKIT_DIST_BACKEND", "").strip()
    if not value:
        return "nccl" if kind == "cuda" and dist.is_nccl_available() else "gloo"
    if value.lower() not in BACKENDS:
        raise ConfigError("LABKIT_DIST_BACKEND", value, "gloo or nccl (or unset: NCCL on CUDA GPUs, gloo otherwise)")
    value = value.lower()
    if value == "nccl" and kind != "cuda":
        raise ConfigError("LABKIT_DIST_BACKEND", value, f"gloo on {kind} (NCCL runs on CUDA GPUs only), or unset")
    if value == "nccl" and not dist.is_nccl_available():
        raise ConfigError("LABKIT_DIST_BACKEND", value, "gloo (this torch was built without NCCL), or unset")
    return value


def needs_preflight(backend: str, world_size: int) -> bool:
    """A group of GPUs on NCCL gets the pre-flight: a hung pair there is silent until TIMEOUT. Gloo fails fast
    on a broken peer (its TCP connection closes), and a group of one has no pair to hang."""
    return backend == "nccl" and world_size > 1


def preflight(device, timeout_s: float = PREFLIGHT_S):
    """One AllReduce of a single number across the group (its sum checked), waited for at most
    ``timeout_s`` seconds: a pair of GPUs whose NCCL transfers hang ends here in one line."""
    n = dist.get_world_size()
    t = torch.ones(1, device=device)
    work = dist.all_reduce(t, async_op=True)
    try:
        ok = work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:  # the backends raise on a timed-out wait (DistBackendError is a RuntimeError)
        raise RunError(f"the pre-flight AllReduce between the {n} ranks ({dist.get_backend()}) did not finish in "
                       f"{timeout_s:g} s: {P2P_HINT if dist.get_backend() == 'nccl' else 'a rank never joined it'}"
                       f" ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if ok is False or float(t.item()) != n:
        raise RunError(f"the pre-flight AllReduce between the {n} ranks ({dist.get_backend()}) summed to "
                       f"{float(t.item()):g}, not {n}: " + (P2P_HINT if dist.get_backend() == "nccl" else
                                                              "the collectives are broken on this machine"))


def init_group(kind: str, rank: int, world_size: int, store=None):
    """Join (or create) the default process group. Returns True if this call created it.
    Shown in 06_ddp_allreduce (code-06-ddp-setup)."""
    if dist.is_initialized():
        return False
    backend = backend_for(kind)
    global _saved_excepthook
    # init_process_group wraps sys.excepthook to prefix "[rankN]: " and never unwraps it: in a notebook
    # or script that runs many times, the prefixes would pile up ("[rank0]: [rank0]: ..."). Keep the
    # original and put it back when the group is destroyed.
    _saved_excepthook = sys.excepthook
    if under_torchrun():  # torchrun set RANK, WORLD_SIZE and MASTER_ADDR/PORT: init_process_group reads them
        dist.init_process_group(backend, timeout=TIMEOUT)
    else:
        _use_loopback(kind)
        try:
            dist.init_process_group(backend, store=store or dist.HashStore(), rank=rank,
                                    world_size=world_size, timeout=TIMEOUT)
        except BaseException:
            _restore_env()  # no group, so no destroy_group to put the environment back
            raise
    if needs_preflight(backend, dist.get_world_size()):
        try:
            preflight(_nccl_device(rank))
        except BaseException:
            destroy_group()  # the caller never sees the group: it must not outlive this call
            raise
    return True


def _nccl_device(rank: int):
    """The GPU this rank's NCCL collectives run on: the current one if the rank chose it, else ``cuda:rank``."""
    local = int(os.environ.get("LOCAL_RANK", rank)) if under_torchrun() else rank
    return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_initialized() else
                        local % max(1, torch.cuda.device_count()))


_saved_excepthook = None
_saved_env: dict = {}  # interface variables init_group changed, with their old values (None: unset)


def loopback_interface() -> str:
    """The loopback interface's name: "lo" on Linux, "lo0" on macOS and the BSDs."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except (OSError, AttributeError):
        names = set()
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return "lo0" if sys.platform == "darwin" else "lo"


def _interface_variables(kind: str) -> list:
    return ["GLOO_SOCKET_IFNAME"] + (["NCCL_SOCKET_IFNAME"] if kind == "cuda" else [])


def _use_loopback(kind: str):
    """A local run talks to itself only: without these variables gloo (and NCCL's bootstrap) listen
    on the address the host name resolves to, often the LAN. Read when the group (or NCCL's first
    communicator) is created, they stay set until destroy_group puts the old values back."""
    lo = loopback_interface()
    for name in _interface_variables(kind):
        _saved_env.setdefault(name, os.environ.get(name))
        os.environ[name] = lo


def _put_back(saved: dict) -> None:
    for name, old in saved.items():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _restore_env():
    _put_back(_saved_env)
    _saved_env.clear()


@contextlib.contextmanager
def children_use_loopback(kind: str):
    """Ranks started inside this block have the interface variables in the environment they start
    with (so also any process they start); this process gets its own values back afterwards."""
    saved = {name: os.environ.get(name) for name in _interface_variables(kind)}
    lo = loopback_interface()
    try:
        for name in saved:
            os.environ[name] = lo
        yield
    finally:
        _put_back(saved)


def destroy_group():
    global _saved_excepthook
    if dist.is_initialized():
        dist.destroy_process_group()
    _restore_env()
    if _saved_excepthook is not None:
        sys.excepthook, _saved_excepthook = _saved_excepthook, None


@contextlib.contextmanager
def process_group(kind: str, rank: int, world_size: int, store=None):
    """Inside the block this process is ``rank`` of a default process group (joined, or already there);
    a group this block created is destroyed when it ends -- also after an exception."""
    created = init_group(kind, rank, world_size, store)
    try:
        yield created
    finally:
        if created and dist.is_initialized():
            destroy_group()


# ---- FSDP: what chapters 09, 10 and 11 shard and train with ---------------------------------------

def local_bytes(tensors) -> int:
    """Bytes this process holds of ``tensors``: of a sharded (DTensor) one only the local shard."""
    shards = (t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None)
    return sum(t.numel() * t.element_size() for t in shards)


def demo_batches(spec, batch: int, steps: int, seed: int):
    """The same global batches on every rank (each takes its slice), from the course corpus."""
    ds = ByteWindows(corpus_path(None), spec.seq_len)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(ds), (batch,), generator=g).tolist()
        xs, ys = zip(*(ds[i] for i in idx))
        yield torch.stack(xs), torch.stack(ys)


def shard(model, param_dtype=None):
    """Shard a GPT the FSDP2 way, block by block (ZeRO-3: weights, gradients and optimizer state), computing in
    ``param_dtype`` (bf16 on a GPU; None keeps fp32, as the CPU demo does). Needs a process group.
    Shown in 09_fixed_gpus_playbook (code-09-fully-shard); the FSDP demo (measure-09-fsdp) runs it."""
    need("fully_shard")  # torch >= 2.6: a clear message on an older one
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # deferred: 0.4 s to import

    # gather and compute in param_dtype, reduce-scatter gradients in fp32: a bf16 sum over many ranks loses digits
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)  # one unit per block: its full weights exist only while it runs
    fully_shard(model, mp_policy=mp)  # the rest (embeddings, final norm, head) as the root unit
    return model


# ---- which rank a failed run blames (``launch``'s ``Ranks.collect`` and watch; chapter 11) -------
# The rank that failed or died first, and how -- never a survivor's consequent error. A SIGKILLed
# rank's exit code is known only once it is reaped (by the launcher, or by the warm server, which
# writes it down a pipe), while its survivor's "Connection closed by peer" travels the queue in
# milliseconds. So ``settle`` waits until every rank has reported, said goodbye or ended (at most
# ``SETTLE_S``), and ``blame`` orders what it learned by cause, not by arrival.

def _exit_words(code) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# What a rank's exception says when all it saw was a peer going away (gloo's TCP pair, NCCL's abort): a
# consequence of another rank's end, never a cause while another cause is known.
_LOST_PEER = ("Connection closed", "Connection reset", "Broken pipe", "by peer", "remote worker crashing",
              "remote process exited", "NCCL communicator was aborted")
# After the first sign of trouble, how long the other ranks get to report their own error or be reaped.
SETTLE_S = 3.0


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended badly, as the parent learned it at ``seen`` (``time.monotonic()``): by its own
    exception (``error``, the text it sent home), or without a word -- a signal or an exit code
    (``exit_code``, negative for a signal, as multiprocessing reports it)."""

    rank: int
    seen: float
    error: str | None = None
    exit_code: int | None = None

    @property
    def lost_peer(self) -> bool:
        """Its exception only says that a connection to another rank broke."""
        return self.error is not None and any(s in self.error for s in _LOST_PEER)

    def words(self) -> str:
        """'rank 1 died (killed by SIGKILL)', 'rank 1 died (exit code 3)' or 'rank 0 failed: ValueError: ...'."""
        if self.error is None:
            return f"rank {self.rank} died ({_exit_words(self.exit_code)})"
        return f"rank {self.rank} failed: {self.error}"


def _cause_order(end: RankEnd):
    """Which end came first: a death without a word (a signal, an exit code) cannot have been caused
    by a peer's exception, so deaths first, then a rank's own exception, then a mere broken
    connection; among equals, the one seen first (time alone would blame the survivor)."""
    return (0 if end.error is None else 2 if end.lost_peer else 1, end.seen)


def settle(procs, out_q, ends: dict, exited=(), settle_s: float = SETTLE_S) -> dict:
    """{rank: RankEnd} for every rank that failed or died, gathered until each rank has reported an error,
    said goodbye (``exited``, or an "exit" message) or ended -- or for ``settle_s`` seconds at most (a rank
    stuck in a collective never does). ``ends``: what is known already. Records arriving meanwhile are dropped:
    the run is over."""
    ends, said_bye = dict(ends), set(exited)
    deadline = time.monotonic() + settle_s
    while True:
        try:  # what is in the queue first: a rank that reported and then exited is known by its words
            msg = out_q.get(timeout=0.05)
        except queue_mod.Empty:
            msg = None
        if msg is not None and msg[0] == "error" and msg[1] not in ends:
            ends[msg[1]] = RankEnd(msg[1], time.monotonic(), error=msg[2])
        elif msg is not None and msg[0] == "exit":
            said_bye.add(msg[1])
        now = time.monotonic()
        codes = [p.exitcode for p in procs]
        for r, code in enumerate(codes):
            if code not in (None, 0) and r not in ends:
                ends[r] = RankEnd(r, now, exit_code=code)
        if now > deadline or (msg is None and all(r in ends or r in said_bye or code is not None
                                                  for r, code in enumerate(codes))):
            return ends


def first_end(ends: dict) -> RankEnd | None:
    """The rank whose end came first (``_cause_order``), or None."""
    return min(ends.values(), key=_cause_order) if ends else None


def blame(ends: dict) -> str:
    """One sentence naming the rank that failed or died first and how, then what a survivor saw."""
    first = first_end(ends)
    if first.lost_peer:  # the cause never showed: a peer stuck, or ended after settle_s
        return f"rank {first.rank} lost its connection to another rank, which probably failed or died: {first.error}"
    lost = sorted((e for e in ends.values() if e.lost_peer), key=lambda e: e.seen)
    if not lost:
        return first.words()
    if first.error is None:
        return (f"{first.words()}, so rank {lost[0].rank} lost its connection to it and the run stopped. "
                f"Rank {lost[0].rank} saw: {lost[0].error}")
    return f"{first.words()} (rank {lost[0].rank} then lost its connection to it)"


def _rank_error(rank, text, procs, out_q, exited=(), settle_s: float = SETTLE_S) -> str:
    """The message for a run in which rank ``rank`` raised ``text``: the rank that failed or died first
    leads (``blame``), once the others have reported or been reaped."""
    return blame(settle(procs, out_q, {rank: RankEnd(rank, time.monotonic(), error=text)}, exited, settle_s))
