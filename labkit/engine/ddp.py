"""Data parallelism: the process group, a comm hook that counts AllReduce calls, and the launcher.

World size 1 runs in the caller's process with a process group of one (a HashStore: no port).
Larger worlds start worker processes from this importable module (so it works from Jupyter under
spawn), meet through a FileStore in a private temporary folder (no listening port: nobody on the
network can join the run) and stream rank 0's records back through a queue. Gloo (and NCCL) are
told to use the loopback interface. Under ``torchrun`` the same entry point joins the group torchrun
set up, with torchrun's own rendezvous (multi-node needs the network).
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing import spawn

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from .device import capabilities
from ..base.errors import NonFiniteError, OutOfMemory, RunError, Stopped  # noqa: F401 -- importable from here too, as before
from ..base.runtime import cleaning_up, under_torchrun

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
    """Count one AllReduce of ``bucket`` and its bytes on the wire, then average it as DDP would."""
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
    reducer holds the group, and the other order can leave a process stuck in the reducer's destructor."""
    counter = CommCounter(kind=comm_hook)
    net = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb)
    net.register_comm_hook(counter, counting_hook)
    return net, counter


# ---- process group ----------------------------------------------------------------------------

def backend_for(kind: str) -> str:
    return "nccl" if kind == "cuda" and dist.is_nccl_available() else "gloo"


def init_group(kind: str, rank: int, world_size: int, store=None):
    """Join (or create) the default process group. Returns True if this call created it."""
    if dist.is_initialized():
        return False
    backend = backend_for(kind)
    global _saved_excepthook
    # init_process_group wraps sys.excepthook to prefix "[rankN]: " and never unwraps it: in a notebook
    # or script that runs many times, the prefixes would pile up ("[rank0]: [rank0]: ..."). Keep the
    # original and put it back when the group is destroyed.
    _saved_excepthook = sys.excepthook
    if under_torchrun():
        dist.init_process_group(backend, timeout=TIMEOUT)
    else:
        _use_loopback(kind)
        try:
            dist.init_process_group(backend, store=store or dist.HashStore(), rank=rank,
                                    world_size=world_size, timeout=TIMEOUT)
        except BaseException:
            _restore_env()  # no group, so no destroy_group to put the environment back
            raise
    return True


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
    """A local run talks to itself only. Without these variables gloo (and NCCL's bootstrap) listen on
    the address the host name resolves to, often the LAN, where anyone could connect. They are read
    when the group (or, for NCCL, its first communicator) is created, so they stay set until
    destroy_group puts the old values back."""
    lo = loopback_interface()
    for name in _interface_variables(kind):
        _saved_env.setdefault(name, os.environ.get(name))
        os.environ[name] = lo


def _restore_env():
    for name, old in _saved_env.items():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
    _saved_env.clear()


@contextlib.contextmanager
def _children_use_loopback(kind: str):
    """Ranks started inside this block have the interface variables in the environment they start
    with (so also any process they start); this process gets its own values back afterwards."""
    saved = {name: os.environ.get(name) for name in _interface_variables(kind)}
    lo = loopback_interface()
    try:
        for name in saved:
            os.environ[name] = lo
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def destroy_group():
    global _saved_excepthook
    if dist.is_initialized():
        dist.destroy_process_group()
    _restore_env()
    if _saved_excepthook is not None:
        sys.excepthook, _saved_excepthook = _saved_excepthook, None


# ---- launcher for world size > 1 ---------------------------------------------------------------

def _die_with_parent():
    """Linux: have the kernel SIGKILL this rank if the launching process dies (even by SIGKILL).
    A fallback: children_die_with_parent() normally did this already, in the rank's first line."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        return
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)  # the parent died before the request: nobody would ever kill this rank


# Run by each spawned child before anything else -- before the seconds of `import torch` that unpickling
# its target costs. PR_SET_PDEATHSIG (1) set later would leave a window in which a killed parent leaves
# children behind; and if the parent is already gone (the child was re-parented), leave now.
_PDEATHSIG_LINE = ("import ctypes, os\n"
                   "try:\n    ctypes.CDLL(None).prctl(1, 9)\nexcept (OSError, AttributeError):\n    pass\n"
                   "if os.getppid() != {parent}:\n    os._exit(1)\n")
_SPAWN_PATCH = threading.Lock()


@contextlib.contextmanager
def children_die_with_parent():
    """Linux: processes spawned inside this block (DDP ranks; a rank's DataLoader workers, which
    PyTorch's own watchdog misses when the rank dies while they start) ask the kernel to SIGKILL them
    when this process dies, as the very first line they run. multiprocessing's spawn offers no hook
    before it imports the target's module (and with it torch), so its command line gets that line in
    front. Forked children are not affected."""
    if not sys.platform.startswith("linux"):
        yield
        return
    with _SPAWN_PATCH:
        real = spawn.get_command_line
        prefix = _PDEATHSIG_LINE.format(parent=os.getpid())

        def command_line(**kwds):
            cmd = real(**kwds)
            if len(cmd) >= 3 and cmd[-3] == "-c":  # [python, flags..., -c, code, --multiprocessing-fork]
                cmd[-2] = prefix + cmd[-2]
            return cmd

        spawn.get_command_line = command_line
        try:
            yield
        finally:
            spawn.get_command_line = real


def _sigterm_ends_ranks(procs, store_dir):
    """SIGTERM's default action ends this process at once and skips every `finally`: ranks (outside
    Linux), their loader workers and the store's folder would be left behind. Until the returned
    function is called, SIGTERM kills the ranks and removes the folder first, then ends this process
    as before. Only on the main thread, and only when nobody else handles SIGTERM."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return lambda: None

    def on_sigterm(signum, frame):
        for p in procs:
            if p.pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGKILL)
        shutil.rmtree(store_dir, ignore_errors=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _child(rank, world_size, store_path, config, worker, out_q, stop):
    """Entry point of a spawned rank: join the group, run ``worker``, send rank 0's records home."""
    _die_with_parent()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # A terminal's Ctrl-C reaches every process of the group; ranks leave stopping to the parent,
    # which asks them all to stop at the same micro-step (one rank leaving alone would strand the others).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked when started off the main thread
    try:
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(TIMEOUT)
        on_step = (lambda rec: out_q.put(("record", rec))) if rank == 0 else None
        summary = worker(config, rank=rank, world_size=world_size, store=store, on_step=on_step,
                         should_stop=stop.is_set)
        if rank == 0:
            out_q.put(("done", summary))
    except Stopped:
        out_q.put(("stopped", rank))
    except BaseException as e:  # noqa: BLE001 -- reported to the parent, which ends the run
        out_q.put(("error", rank, f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        out_q.put(("exit", rank))


@dataclass
class _Watch:
    """What the parent knows about its ranks while they run."""

    procs: list
    out_q: object
    stop: object
    started: float
    last_news: float
    summary: object = None
    error: object = None
    deadline: object = None       # set once a stop was asked for: the ranks get until then
    exited: set = field(default_factory=set)
    gone_since: dict = field(default_factory=dict)


def launch(config, worker, on_step, should_stop, *, grace_s: float = 5.0):
    """Run ``worker(config, rank=, world_size=, store=, on_step=, should_stop=)`` on ``config.world_size``
    spawned processes; returns rank 0's summary. ``worker`` must be importable by name (spawn pickles it
    by reference): the engine passes ``train.train_worker``.

    Any rank's exception, a stop request or Ctrl-C ends every process within ``grace_s`` seconds
    (then they are killed); nothing outlives the call.
    """
    ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock; spawn is safe
    ws = config.world_size
    # The ranks meet through a file in a folder of this run's own (mode 0700): no port is opened, so
    # nothing on the network can connect, and two runs never collide.
    store_dir = tempfile.mkdtemp(prefix="labkit-ddp-")
    out_q, stop = ctx.Queue(), ctx.Event()
    # Not daemonic: a rank must be allowed to start DataLoader workers of its own. _reap() below
    # makes sure none outlives the run, and each rank asks Linux to kill it if this process dies.
    procs = [ctx.Process(target=_child, daemon=False,
                         args=(r, ws, os.path.join(store_dir, "store"), config, worker, out_q, stop))
             for r in range(ws)]
    now = time.monotonic()
    w = _Watch(procs, out_q, stop, started=now, last_news=now)
    restore_sigterm = _sigterm_ends_ranks(procs, store_dir)
    try:
        with (_sigint_ignored_in_children(), children_die_with_parent(),
              _children_use_loopback(capabilities(config.device).kind)):
            for p in procs:
                p.start()
        _watch(w, on_step, should_stop, grace_s)
    except KeyboardInterrupt:
        stop.set()  # Ctrl-C: the finally below ends every worker, then the interrupt goes on up
        raise
    finally:
        with cleaning_up():
            _reap(procs, grace_s if w.error is None and w.deadline is None else 1.0)
            out_q.close()
            out_q.join_thread()
            shutil.rmtree(store_dir, ignore_errors=True)
            restore_sigterm()
    if w.error:
        raise RunError(w.error)
    if w.summary is None:
        raise Stopped("stopped before the run finished")
    return w.summary


def _watch(w: _Watch, on_step, should_stop, grace_s: float):
    """Pass rank 0's records on until every rank has exited, a rank failed or died, or a stop's grace
    time ran out; what went wrong ends up in ``w.error``."""
    while len(w.exited) < len(w.procs):
        if should_stop() and not w.stop.is_set():
            w.stop.set()
            # Ranks still starting (importing torch, building the model) cannot see the request
            # until their first micro-step, and have nothing to keep: end them at once.
            w.deadline = time.monotonic() + (grace_s if w.last_news > w.started else 0.0)
        if w.deadline is not None and time.monotonic() > w.deadline:
            return
        try:
            msg = w.out_q.get(timeout=0.1)
        except queue_mod.Empty:
            w.error = w.error or _silence(w)
            if w.error:
                return
            continue
        w.last_news = time.monotonic()
        tag = msg[0]
        if tag == "record":
            on_step(msg[1])
        elif tag == "done":
            w.summary = msg[1]
        elif tag == "error":
            if w.deadline is not None or should_stop():
                continue  # stopping: ranks stop at different micro-steps and see their peer leave
            w.error = w.error or _rank_error(msg[1], msg[2], w.procs, w.out_q)
            w.stop.set()
            return
        elif tag == "exit":
            w.exited.add(msg[1])


def _silence(w: _Watch):
    """Why no news came, when that is an error: a rank that ended without saying goodbye, or no
    progress from any rank for longer than a collective's timeout. None while all is well."""
    now = time.monotonic()
    for r, p in enumerate(w.procs):
        if p.exitcode is not None and r not in w.exited:
            w.gone_since.setdefault(r, now)
    gone = [r for r, t in w.gone_since.items() if r not in w.exited and now - t > 1.0]
    if gone and w.deadline is None:
        error = f"rank {gone[0]} died ({_exit_words(w.procs[gone[0]].exitcode)})"
        if w.last_news == w.started:
            error += " before it started training" + _script_hint()
        return error
    limit = TIMEOUT.total_seconds() + 10
    if now - w.last_news > limit:
        error = f"no progress from any rank for {limit:.0f} s"
        if w.last_news == w.started:  # not one record: stuck before training, e.g. re-running a script's top level
            error += " (none had started training)" + _script_hint(error_printed=False)
        return error
    return None


@contextlib.contextmanager
def _sigint_ignored_in_children():
    """Start ranks with SIGINT ignored (an ignored signal stays ignored across exec): a terminal's
    Ctrl-C reaches the whole process group, even a rank still importing torch, and stopping is the
    parent's job. Signal handlers can only be changed on the main thread; elsewhere SIGINT is blocked
    instead while the ranks start (a blocked signal is inherited too)."""
    if threading.current_thread() is not threading.main_thread():
        # Off the main thread (the panel's Run button) a *blocked* signal is inherited instead; the rank
        # ignores SIGINT, then unblocks it, in _child.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _script_hint(error_printed: bool = True) -> str:
    """Why a rank can die -- or stall -- at start-up: spawn re-imports the launching script in every rank,
    so a script's unguarded top-level work runs again in each (fails fast, or takes its minutes)."""
    said = "; its error is printed above" if error_printed else ""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(main, "__file__", None) and not (spec and spec.name.startswith("labkit")):
        return (said + (". If" if said else ": if") + " you call lk.run from a script, put the call -- and the "
                "script's other top-level work -- under `if __name__ == \"__main__\":`. Every rank imports your "
                "script again (multiprocessing's spawn): without the guard its top-level code runs again in each "
                "rank, and a call to lk.run there would start a run of its own")
    return said


def _exit_words(code) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_LOST_PEER = ("Connection closed", "Connection reset", "Broken pipe", "by peer")


def _rank_error(rank, text, procs, out_q) -> str:
    """The message for a rank's exception. When it only says a connection broke, the real cause is
    elsewhere: another rank's own exception (its report may still be in the queue) or a peer that
    died without one (killed, crashed, out of host memory). Lead with that cause."""
    if not any(s in text for s in _LOST_PEER):
        return f"rank {rank} failed: {text}"
    deadline = time.monotonic() + 1.0  # the cause may take a moment to arrive
    while time.monotonic() < deadline:
        try:
            msg = out_q.get(timeout=0.05)
        except queue_mod.Empty:
            msg = None
        if msg and msg[0] == "error" and msg[1] != rank and not any(s in msg[2] for s in _LOST_PEER):
            return f"rank {msg[1]} failed: {msg[2]} (rank {rank} then lost its connection to it)"
        dead = [(r, p.exitcode) for r, p in enumerate(procs) if r != rank and p.exitcode not in (None, 0)]
        if dead:
            r, code = dead[0]
            return (f"rank {r} died ({_exit_words(code)}), so rank {rank} lost its connection to it and the "
                    f"run stopped. Rank {rank} saw: {text}")
    return f"rank {rank} lost its connection to another rank, which probably failed or died: {text}"


# multiprocessing's own helpers live as long as the Python that started them, by design: they are
# not workers of a run (the resource tracker cleans up shared-memory names; forkserver forks workers).
MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def live_children(root=None) -> list:
    """Running descendants of ``root`` (a psutil.Process; default: this process) that belong to runs:
    zombies (already ended) and multiprocessing's own helpers are left out. After a run this is
    empty -- that is labkit's promise, and what its tests and ``benchmarks/faults.py`` check."""
    import psutil  # deferred: optional (the course extras); only tests and benchmarks list children

    kids = []
    for p in (root or psutil.Process()).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not any(h in " ".join(p.cmdline()) for h in MP_HELPERS):
                kids.append(p)
        except psutil.NoSuchProcess:
            pass
    return kids


def _reap(procs, grace_s: float):
    """Wait briefly for workers to leave, then terminate, then kill: none may outlive the run."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
