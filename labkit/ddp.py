"""Data parallelism: the process group, a comm hook that counts AllReduce calls, and the launcher.

World size 1 runs in the caller's process with a process group of one (a HashStore: no port).
Larger worlds start worker processes from this importable module (so it works from Jupyter under
spawn), talk through a TCPStore on a free port, and stream rank 0's records back through a queue.
Under ``torchrun`` the same entry point joins the group torchrun set up.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import queue as queue_mod
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=60)  # a dead peer makes collectives fail instead of hanging forever
_LOCK = threading.Lock()  # the default process group is global to a process: one run at a time


class RunError(RuntimeError):
    """A run failed; the message says where and why."""


class OutOfMemory(RunError):
    """The run needed more device memory than it had. Memory has been freed; the next run can go."""


class NonFiniteError(RunError):
    """inf/NaN appeared in the loss or gradients and the run was configured to stop."""


class Stopped(Exception):
    """A stop was requested (Stop button, Ctrl-C)."""


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
    wait_s: float = 0.0           # host time spent waiting on finished collectives (when measured)


def counting_hook(state: CommCounter, bucket):
    """Count one AllReduce of ``bucket`` and its bytes on the wire, then average it as DDP would."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

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


# ---- process group ----------------------------------------------------------------------------

def backend_for(kind: str) -> str:
    return "nccl" if kind == "cuda" and dist.is_nccl_available() else "gloo"


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ
                                                     and "MASTER_ADDR" in os.environ)


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
        dist.init_process_group(backend, store=store or dist.HashStore(), rank=rank,
                                world_size=world_size, timeout=TIMEOUT)
    return True


_saved_excepthook = None


_cleaning = 0  # > 0 while a run frees its processes and memory: a Ctrl-C then waits instead of raising


@contextlib.contextmanager
def cleaning_up():
    """Mark clean-up code: labkit's Ctrl-C handler lets it finish (a KeyboardInterrupt in the middle of
    it would leave workers, a process group or a thread setting behind)."""
    global _cleaning
    _cleaning += 1
    try:
        yield
    finally:
        _cleaning -= 1


def is_cleaning_up() -> bool:
    return _cleaning > 0


def destroy_group():
    global _saved_excepthook
    if dist.is_initialized():
        dist.destroy_process_group()
    if _saved_excepthook is not None:
        sys.excepthook, _saved_excepthook = _saved_excepthook, None


# ---- launcher for world size > 1 ---------------------------------------------------------------

def _die_with_parent():
    """Linux: have the kernel SIGKILL this rank if the launching process dies (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


def _child(rank, world_size, port, config, out_q, stop):
    """Entry point of a spawned worker: join the group, train, send rank 0's records home."""
    from .train import train_worker

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _die_with_parent()
    # A terminal's Ctrl-C reaches every process of the group; ranks leave stopping to the parent,
    # which asks them all to stop at the same micro-step (one rank leaving alone would strand the others).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked when started off the main thread
    try:
        store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False, timeout=TIMEOUT)
        emit = (lambda rec: out_q.put(("record", rec))) if rank == 0 else None
        summary = train_worker(config, rank=rank, world_size=world_size, store=store,
                               emit=emit, should_stop=stop.is_set)
        if rank == 0:
            out_q.put(("done", summary))
    except Stopped:
        out_q.put(("stopped", rank))
    except BaseException as e:  # noqa: BLE001 -- reported to the parent, which ends the run
        out_q.put(("error", rank, f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        out_q.put(("exit", rank))


def launch(config, on_record, should_stop, *, grace_s: float = 5.0):
    """Run ``config`` on ``config.world_size`` spawned processes; returns rank 0's summary.

    Any rank's exception, a stop request or Ctrl-C ends every process within ``grace_s`` seconds
    (then they are killed); nothing outlives the call.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock; spawn is safe
    ws = config.world_size
    # The parent owns the store on port 0: the OS picks a free port, so two runs never collide.
    store = dist.TCPStore("127.0.0.1", 0, ws + 1, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    out_q, stop = ctx.Queue(), ctx.Event()
    # Not daemonic: a rank must be allowed to start DataLoader workers of its own. _reap() below
    # makes sure none outlives the run, and each rank asks Linux to kill it if this process dies.
    procs = [ctx.Process(target=_child, args=(r, ws, store.port, config, out_q, stop), daemon=False)
             for r in range(ws)]
    summary, error, exited, deadline = None, None, set(), None
    last_news, gone_since = time.monotonic(), {}
    started = last_news
    try:
        with _sigint_ignored_in_children():
            for p in procs:
                p.start()
        while len(exited) < ws:
            if should_stop() and not stop.is_set():
                stop.set()
                # Ranks still starting (importing torch, building the model) cannot see the request
                # until their first micro-step, and have nothing to keep: end them at once.
                deadline = time.monotonic() + (grace_s if last_news > started else 0.0)
            if deadline is not None and time.monotonic() > deadline:
                break
            try:
                msg = out_q.get(timeout=0.1)
            except queue_mod.Empty:
                now = time.monotonic()
                for r, p in enumerate(procs):  # a process that ended without saying goodbye
                    if p.exitcode is not None and r not in exited:
                        gone_since.setdefault(r, now)
                gone = [r for r, t in gone_since.items() if r not in exited and now - t > 1.0]
                if gone and error is None and deadline is None:
                    error = f"rank {gone[0]} died ({_exit_words(procs[gone[0]].exitcode)})"
                    if last_news == started:
                        error += " before it started training" + _script_hint()
                if error is None and time.monotonic() - last_news > TIMEOUT.total_seconds() + 10:
                    error = f"no progress from any rank for {TIMEOUT.total_seconds() + 10:.0f} s"
                if error:
                    break
                continue
            last_news = time.monotonic()
            tag = msg[0]
            if tag == "record":
                on_record(msg[1])
            elif tag == "done":
                summary = msg[1]
            elif tag == "error":
                if deadline is not None or should_stop():
                    continue  # stopping: ranks stop at different micro-steps and see their peer leave
                error = error or _rank_error(msg[1], msg[2], procs, out_q)
                stop.set()
                break
            elif tag == "exit":
                exited.add(msg[1])
    except KeyboardInterrupt:
        stop.set()  # Ctrl-C: the finally below ends every worker, then the interrupt goes on up
        raise
    finally:
        with cleaning_up():
            _reap(procs, grace_s if error is None and deadline is None else 1.0)
            out_q.close()
            out_q.join_thread()
            del store
    if error:
        raise RunError(error)
    if summary is None:
        raise Stopped("stopped before the run finished")
    return summary


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


def _script_hint() -> str:
    """Why a rank can die at start-up: spawn re-imports the launching script in every rank."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(main, "__file__", None) and not (spec and spec.name.startswith("labkit")):
        return ("; its error is printed above. If you call lk.run from a script, put the call under "
                "`if __name__ == \"__main__\":` -- every rank imports your script again (multiprocessing's "
                "spawn), and without the guard it would start a run of its own")
    return "; its error is printed above"


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
    import psutil

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
