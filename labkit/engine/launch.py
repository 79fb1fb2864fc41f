"""Ranks as processes: spawning, watching and reaping them, for the engine and the chapter demos.

``spawn_ranks(target, world_size, args)`` starts ``world_size`` processes, each running
``target(rank: Rank, *args)``, and guarantees that none outlives the ``with`` block. The ranks meet
through a FileStore in a private temporary folder (mode 0700: no listening port, and two runs never
collide) and talk on the loopback interface only; each sends ``(tag, rank, payload)`` messages home
through one queue. The engine's ``run_ranks`` streams rank 0's records while it watches for stop
requests, failed or dead ranks and silence (``_Watch``); a chapter demo's ``Ranks.collect`` just
waits for every rank's result. A rank asks Linux to SIGKILL it if the launching process dies, as the
very first line it runs; Ctrl-C and SIGTERM reach the parent, which ends every rank. Ranks fork
from this process's warm forkserver (``warm.py``) unless ``LABKIT_WARM_START=0`` or ``warm=False``.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from .ddp import TIMEOUT, backend_for, children_use_loopback
# which rank a failed run blames (ddp.blame); importable from here too
from .ddp import RankEnd, _rank_error, blame, first_end, settle  # noqa: F401
from . import warm as _warm
from .warm import children_die_with_parent, stop_warm_server, warm_server_pid, warm_start  # noqa: F401 -- launch's API
from ..base.runtime import RunError, Stopped
from ..base.runtime import cleaning_up

_CTX = mp.get_context("spawn")  # fork after torch has started threads can deadlock; spawn is safe
_LOADED_IN = os.getpid()  # in a fork of the warm server (which imported this module): the server's pid


# ---- what a rank gets, and what every rank runs first -------------------------------------------

@dataclass
class Rank:
    """A spawned rank's place in the world: its number, the world's size, where the ranks meet, the way
    home (``out_q``) and the parent's stop request (``stop.is_set()``)."""

    rank: int
    world_size: int
    store_path: str
    out_q: object
    stop: object
    env: dict = None  # warm start: the launcher's environment (a fork has the server's otherwise)

    def file_store(self):
        """The FileStore the ranks meet through (no port), with the collectives' timeout."""
        store = dist.FileStore(self.store_path, self.world_size)
        store.set_timeout(TIMEOUT)
        return store

    def send(self, tag: str, payload=None):
        self.out_q.put((tag, self.rank, payload))


def rank_main(rank: Rank, body, *args):
    """Entry point of every spawned rank: run ``body(rank, *args)`` and report how it ended --
    ("done", rank, result), ("stopped", rank, None) or ("error", rank, text) -- then ("exit", rank, None)."""
    _die_with_parent()
    if rank.env is not None:  # forked from the warm server: be what a spawned rank is
        os.environ.clear()
        os.environ.update(rank.env)
    if rank.env is not None or mp.get_context().get_start_method() == "forkserver":
        # A warm fork's default context is the server's; and from Python 3.14 on, forkserver is Linux's
        # default (gh-84559). Either way this rank's own children (DataLoader workers) would come from a
        # forkserver of its own, whose forks no PDEATHSIG or reap() of this rank reaches.
        mp.set_start_method("spawn", force=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # A terminal's Ctrl-C reaches every process of the group; ranks leave stopping to the parent,
    # which asks them all to stop at the same micro-step (one rank leaving alone would strand the others).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked when started off the main thread
    try:
        rank.send("done", body(rank, *args))
    except Stopped:
        rank.send("stopped")
    except BaseException as e:  # noqa: BLE001 -- reported to the parent, which ends the run
        rank.send("error", f"{type(e).__name__}: {e}")
    finally:
        rank.send("exit")


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
    if _LOADED_IN != os.getpid():  # forked from the warm server: the server is the parent
        parent_pid = _LOADED_IN
    else:
        parent = mp.parent_process()
        parent_pid = parent.pid if parent is not None else os.getppid()
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request: nobody would ever kill this rank


@contextlib.contextmanager
def _sigint_ignored_in_children():
    """Start ranks with SIGINT ignored (an ignored signal stays ignored across exec): a terminal's
    Ctrl-C reaches the whole process group, even a rank still importing torch, and stopping is the
    parent's job."""
    with contextlib.ExitStack() as undo:
        if threading.current_thread() is not threading.main_thread():
            # Off the main thread (the panel's Run button) handlers cannot be changed: a *blocked*
            # signal is inherited instead; the rank ignores SIGINT, then unblocks it, in rank_main.
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            undo.callback(signal.pthread_sigmask, signal.SIG_SETMASK, old_mask)
        else:
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)
            undo.callback(signal.signal, signal.SIGINT, old)
        yield


@contextlib.contextmanager
def _sigint_deferred():
    """Hold a Ctrl-C back until the block (milliseconds) ends, then raise it. A warm rank's start
    sends its arguments (the run's queue among them) to the server, then reads the new pid:
    interrupted between the two, the rank is forked with no pid on our side, and its parent frees
    the queue it is still unpickling. Only the main thread receives Python's signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if caught and old is not signal.SIG_IGN:
        if callable(old):
            old(signal.SIGINT, caught[0])  # Python's default handler (and ipykernel's) raise KeyboardInterrupt
        else:
            raise KeyboardInterrupt


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


# ---- spawning and reaping -----------------------------------------------------------------------

@dataclass
class Ranks:
    """The running ranks of one ``spawn_ranks`` block. ``grace_s``: how long they get to leave by
    themselves when the block ends (then they are terminated, then killed); 0 until a caller knows
    the ranks finished well."""

    procs: list
    out_q: object
    stop: object
    grace_s: float = 0.0
    warm: bool = False    # forked from the warm server
    failed: bool = False  # a rank failed or died (the warm server is stopped too, to be safe)

    def collect(self, timeout_s: float, what: str) -> dict:
        """{rank: result} once every rank has exited -- or a RunError that starts with ``what`` and
        names the rank that failed or died first (``blame``; its ``RankEnd`` as ``first``, every
        ``exit_codes`` read before anyone ended the survivors), or the time limit."""
        self.failed = True  # until every rank has reported
        results, exited, t0 = {}, set(), time.monotonic()
        while len(exited) < len(self.procs):
            if time.monotonic() - t0 > timeout_s:
                raise RunError(f"{what}: no result after {timeout_s:.0f} s")
            try:
                tag, rank, payload = self.out_q.get(timeout=0.2)[:3]
            except queue_mod.Empty:
                if any(p.exitcode not in (None, 0) for p in self.procs):
                    raise self._failure(what, {}, exited) from None
                continue
            if tag == "error":
                raise self._failure(what, {rank: RankEnd(rank, time.monotonic(), error=payload)}, exited)
            if tag == "done":
                results[rank] = payload
            elif tag == "exit":
                exited.add(rank)
        if sorted(results) != list(range(len(self.procs))):
            raise RunError(f"{what}: results from ranks {sorted(results)} only")
        self.grace_s, self.failed = 5.0, False  # every rank reported: let them leave by themselves
        return results

    def _failure(self, what: str, ends: dict, exited: set) -> RunError:
        ends = settle(self.procs, self.out_q, ends, exited)
        err = RunError(f"{what}: {blame(ends)}")
        err.first = first_end(ends)
        err.exit_codes = {r: p.exitcode for r, p in enumerate(self.procs)}
        return err


@contextlib.contextmanager
def spawn_ranks(target, world_size: int, args: tuple = (), *, kind: str = "cpu", prefix: str = "labkit-ranks-",
                warm=None):
    """Start ``world_size`` processes running ``rank_main(Rank, target, *args)`` and yield their
    ``Ranks``; when the block ends -- normally, by an exception or by Ctrl-C -- every rank is gone
    and the store's folder removed. ``target`` must be importable by name (a function in a labkit
    module, never one defined in a notebook). ``warm``: fork the ranks from the warm server (None:
    ``warm_start()``), or spawn each afresh (False)."""
    backend_for(kind)  # a bad LABKIT_DIST_BACKEND is refused here, before any rank starts
    warm = warm_start() if warm is None else (warm and not _warm.warm_unavailable())
    ctx = _warm.WARM if warm else _CTX
    store_dir = tempfile.mkdtemp(prefix=prefix)
    out_q, stop = ctx.Queue(), ctx.Event()
    procs, ranks, failed, acquired = [], None, True, False
    restore_sigterm = _sigterm_ends_ranks(procs, store_dir)
    try:
        with children_use_loopback(kind):
            if warm:
                _warm.SERVER.acquire()
                acquired = True
            ranks = Ranks(procs, out_q, stop, warm=warm)
            env = dict(os.environ) if warm else None  # a fork has the server's environment, not ours
            store_path = os.path.join(store_dir, "store")
            # Not daemonic: a rank must be allowed to start DataLoader workers of its own. reap() below
            # makes sure none outlives the block, and each rank asks Linux to kill it if its parent dies.
            procs += [ctx.Process(target=rank_main, daemon=False,
                                  args=(Rank(r, world_size, store_path, out_q, stop, env), target, *args))
                      for r in range(world_size)]
            # A fork of the server has the server's SIGINT (ignored), not ours; and its first start waits
            # for the server's imports -- seconds in which Ctrl-C must still reach this process.
            with contextlib.nullcontext() if warm else _sigint_ignored_in_children(), children_die_with_parent():
                for p in procs:
                    with _sigint_deferred() if warm else contextlib.nullcontext():
                        p.start()
        yield ranks
        failed = ranks.failed
    except KeyboardInterrupt:
        stop.set()  # Ctrl-C: ask the ranks to stop; the finally below ends every one of them
        raise
    finally:
        with cleaning_up():
            reap(procs, ranks.grace_s if ranks else 0.0)
            if acquired:
                _warm.SERVER.release(keep=not failed)  # after an error or Ctrl-C the next run starts a new one
            elif warm:
                _warm.SERVER.stop()  # interrupted while the server started
            out_q.close()
            out_q.join_thread()
            shutil.rmtree(store_dir, ignore_errors=True)
            restore_sigterm()


def reap(procs, grace_s: float):
    """Wait up to ``grace_s`` for processes to leave, then terminate, then kill: none may outlive the run."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)


# multiprocessing's own helpers live as long as the Python that started them, by design: they are
# not workers of a run (the resource tracker cleans up shared-memory names; forkserver forks workers --
# and the warm server, stopped when idle, when a run fails and when this process ends, is one).
MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _is_mp_helper(p) -> bool:
    """One of multiprocessing's helpers -- not a fork of the forkserver (a warm rank, or a rank's loader
    worker), which carries the server's command line but belongs to a run."""
    if not any(h in " ".join(p.cmdline()) for h in MP_HELPERS):
        return False
    parent = p.parent()
    return parent is None or MP_HELPERS[1] not in " ".join(parent.cmdline())


def live_children(root=None) -> list:
    """Running descendants of ``root`` (a psutil.Process; default: this process) that belong to runs:
    zombies (already ended) and multiprocessing's own helpers are left out. After a run this is
    empty -- that is labkit's promise, and what its tests and ``benchmarks/faults.py`` check."""
    import psutil  # deferred: optional (the course extras); only tests and benchmarks list children

    kids = []
    for p in (root or psutil.Process()).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.status() != psutil.STATUS_ZOMBIE and not _is_mp_helper(p):
                kids.append(p)
    return kids


def rank_processes(root=None) -> list:
    """The live ranks among ``root``'s descendants (cold: spawned children of ``root``; warm: forks
    of its forkserver), without their loader workers. For tests and benchmarks."""
    import psutil  # deferred: optional (the course extras), as in live_children

    root = root or psutil.Process()
    ranks = []
    for p in live_children(root):
        with contextlib.suppress(psutil.NoSuchProcess, AttributeError):
            parent = p.parent()
            if (parent.pid == root.pid and "spawn_main" in " ".join(p.cmdline())) or _is_mp_helper(parent):
                ranks.append(p)
    return ranks


# ---- the engine's ranks: stream rank 0's records, watch for trouble -------------------------------

def _train_rank(rank: Rank, config, worker, caps, probe=None):
    """A training rank: ``worker`` on the shared FileStore; rank 0 streams its records home."""
    on_step = (lambda rec: rank.send("record", rec)) if rank.rank == 0 else None
    return worker(config, rank=rank.rank, world_size=rank.world_size, store=rank.file_store(),
                  on_step=on_step, should_stop=rank.stop.is_set, caps=caps, probe=probe if rank.rank == 0 else None)


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


def run_ranks(config, worker, on_step, should_stop, *, caps, probe=None, grace_s: float = 5.0, warm=None):
    """Run ``worker`` (``train.train_worker``) on ``config.world_size`` ranks; returns rank 0's
    summary. ``caps``: the run's capabilities, asked once in the parent; ``probe``: rank 0's probes,
    made in the parent. Any rank's exception, a stop request or Ctrl-C ends every process within
    ``grace_s`` seconds (then they are killed); nothing outlives the call."""
    with spawn_ranks(_train_rank, config.world_size, (config, worker, caps, probe), kind=caps.kind,
                     prefix="labkit-ddp-", warm=warm) as ranks:
        now = time.monotonic()
        w = _Watch(ranks.procs, ranks.out_q, ranks.stop, started=now, last_news=now)
        ranks.grace_s = grace_s  # also for Ctrl-C: the ranks see the stop at their next micro-step
        _watch(w, on_step, should_stop, grace_s)
        ranks.failed = w.error is not None
        if w.error is not None or w.deadline is not None:
            ranks.grace_s = 1.0
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
            tag, rank, payload = w.out_q.get(timeout=0.1)
        except queue_mod.Empty:
            w.error = w.error or _silence(w)
            if w.error:
                return
            continue
        w.last_news = time.monotonic()
        if tag == "record":
            on_step(payload)
        elif tag == "done" and rank == 0:
            w.summary = payload
        elif tag == "error":
            if w.deadline is not None or should_stop():
                continue  # stopping: ranks stop at different micro-steps and see their peer leave
            w.stop.set()  # the survivors stop at their next micro-step while the others report or are reaped
            w.error = w.error or _rank_error(rank, payload, w.procs, w.out_q, w.exited)
            return
        elif tag == "exit":
            w.exited.add(rank)


def _silence(w: _Watch):
    """Why no news came, when that is an error: a rank that ended without saying goodbye, or no
    progress from any rank for longer than a collective's timeout. None while all is well."""
    now = time.monotonic()
    for r, p in enumerate(w.procs):
        if p.exitcode is not None and r not in w.exited:
            w.gone_since.setdefault(r, now)
    gone = [r for r, t in w.gone_since.items() if r not in w.exited and now - t > 1.0]
    if gone and w.deadline is None:  # the one seen gone first: every one of them died without a word
        error = first_end({r: RankEnd(r, w.gone_since[r], exit_code=w.procs[r].exitcode) for r in gone}).words()
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


def _script_hint(error_printed: bool = True) -> str:
    """Why a rank can die -- or stall -- at start-up: multiprocessing re-imports the launching
    script in every rank, so a script's unguarded top-level work runs again in each."""
    said = "; its error is printed above" if error_printed else ""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(main, "__file__", None) and not (spec and spec.name.startswith("labkit")):
        return (said + (". If" if said else ": if") + " you call lk.run from a script, put the call -- and the "
                "script's other top-level work -- under `if __name__ == \"__main__\":`. Every rank imports your "
                "script again (multiprocessing does, for spawned and warm ranks alike): without the guard its "
                "top-level code runs again in each rank, and a call to lk.run there would start a run of its own")
    return said
