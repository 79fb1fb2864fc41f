"""Starting child processes: the first line every spawned child runs, and the warm start.

The warm start: ranks forked from this process's own multiprocessing forkserver, which imported
torch and labkit once (``PRELOAD``) and never runs a run's code -- so nothing a run changes (thread
counts, the tf32 switch, any torch global) reaches the next run. It dies with this process
(PDEATHSIG, and its pipe closing), is stopped after a failed run or Ctrl-C, and after ``IDLE_S``
seconds without a run. ``LABKIT_WARM_START=0`` takes the cold path (every rank a fresh Python).
"""
from __future__ import annotations

import atexit
import contextlib
import inspect
import multiprocessing as mp
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import forkserver, spawn
from multiprocessing import util as mp_util

from ..base.runtime import ConfigError

WARM = mp.get_context("forkserver") if "forkserver" in mp.get_all_start_methods() else None
# What the warm server imports once (a fork of it has them for free); never '__main__': a script's top
# level must not run in the server. torch._dynamo (with sympy) is what a rank's first FLOP count on the
# meta device imports: 2-3 s of every cold rank's start-up on 2 cores.
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "psutil", "labkit",
           "labkit.engine.train"]
IDLE_S = 300.0  # a warm server left unused this long is stopped


# Run by each spawned child before anything else -- before the seconds of `import torch` that unpickling
# its target costs. PR_SET_PDEATHSIG (1) set later would leave a window in which a killed parent leaves
# children behind; and if the parent is already gone (the child was re-parented), leave now.
_PDEATHSIG_LINE = ("import ctypes, os\n"
                   "try:\n    ctypes.CDLL(None).prctl(1, 9)\nexcept (OSError, AttributeError):\n    pass\n"
                   "if os.getppid() != {parent}:\n    os._exit(1)\n")
_SPAWN_PATCH = threading.Lock()


def _first_line(cmd: list, prefix: str) -> list:
    """``cmd`` ([python, flags..., -c, code, ...]) with ``prefix`` run before its code."""
    i = cmd.index("-c") + 1 if "-c" in cmd[:-1] else None
    return cmd if i is None else [*cmd[:i], prefix + cmd[i], *cmd[i + 1:]]


@contextlib.contextmanager
def _patched(owner, name: str, wrap):
    """``owner.name`` replaced by ``wrap(real)`` inside the block (one patch at a time)."""
    with _SPAWN_PATCH:
        real = getattr(owner, name)
        setattr(owner, name, wrap(real))
        try:
            yield
        finally:
            setattr(owner, name, real)


@contextlib.contextmanager
def children_die_with_parent():
    """Linux: processes spawned inside this block (ranks; a rank's DataLoader workers, which PyTorch's
    own watchdog misses when the rank dies while they start) ask the kernel to SIGKILL them when this
    process dies, as the very first line they run: spawn has no hook before it imports the target's
    module (and torch), so its command line gets that line in front. Forks are not affected."""
    if not sys.platform.startswith("linux"):
        yield
        return
    why = _command_line_unavailable()
    if why:  # the ranks still ask for it themselves, first thing in rank_main (launch._die_with_parent)
        _say_once(f"ranks ask Linux to end them with this process only once they run (not before their imports): {why}")
        yield
        return
    prefix = _PDEATHSIG_LINE.format(parent=os.getpid())
    with _patched(spawn, "get_command_line", lambda real: lambda **kw: _first_line(real(**kw), prefix)):
        yield


def _command_line_unavailable() -> str:
    """Why spawn's command line cannot get a first line in front ("" when it can)."""
    get = getattr(spawn, "get_command_line", None)
    try:
        cmd = get() if callable(get) else None
    except Exception:  # noqa: BLE001 -- any failure: leave it alone
        cmd = None
    if not isinstance(cmd, list) or "-c" not in cmd[:-1]:
        return "multiprocessing.spawn.get_command_line() is missing or no longer ends in '-c CODE'"
    return ""


# ---- what the warm start needs from CPython, checked where it cannot be run ------------------------------
# The warm start leans on multiprocessing internals; each is looked for here, at run time, never inferred from
# the version. Reviewed against CPython's own source; in 3.11.7, 3.12.1 and 3.13.0 also exercised without torch
# (this module's checks, a server started with the first line, a fork of it, the server stopped); 3.14 read
# from source only (Lib/multiprocessing/forkserver.py with the authkey, context.py's new default):
#
#   API                                         3.12       3.13       3.14                     labkit
#   forkserver._forkserver._forkserver_pid      yes        yes        yes                      required (find, kill)
#   forkserver._forkserver._stop()              yes        yes        yes (+ forgets authkey)  optional (reaps)
#   forkserver.ensure_running()                 yes        yes        yes (+ authkey pipe)     required
#   ForkServer.ensure_running -> util.spawnv_passfds(exe, args, fds)   all three              required (first line)
#   util.spawnv_passfds(path, args, passfds)    yes        yes        yes                      required, same names
#   context.set_forkserver_preload(names)       yes        yes        yes                      required
#   spawn.get_command_line(**kw) [..., -c, code] yes       yes        yes                      cold path's first line
#   default start method on Linux               fork       fork       forkserver (gh-84559)    ranks set spawn
#
# A missing piece turns the warm start off -- ranks start cold, with one line saying why (``warm_unavailable``).
_said: set = set()


def _say_once(line: str):
    """One line on stderr, once per process: why labkit took a slower or plainer path."""
    if line not in _said:
        _said.add(line)
        print(f"labkit: {line}", file=sys.stderr)


def warm_unavailable() -> str:
    """Why ranks cannot start warm on this Python ("" when they can): the first internal of the
    table above that is missing or changed shape."""
    if WARM is None:
        return "this platform has no forkserver start method"
    server = getattr(forkserver, "_forkserver", None)
    if server is None or not hasattr(server, "_forkserver_pid"):
        return "multiprocessing.forkserver has no _forkserver._forkserver_pid (labkit finds and stops its server by it)"
    if not callable(getattr(forkserver, "ensure_running", None)):
        return "multiprocessing.forkserver has no ensure_running()"
    if not callable(getattr(WARM, "set_forkserver_preload", None)):
        return "the forkserver context has no set_forkserver_preload()"
    try:
        params = list(inspect.signature(mp_util.spawnv_passfds).parameters)
    except (AttributeError, TypeError, ValueError):
        params = None
    if params != ["path", "args", "passfds"]:
        return "multiprocessing.util.spawnv_passfds(path, args, passfds) is missing or changed"
    code = getattr(getattr(type(server), "ensure_running", None), "__code__", None)
    if code is None or "spawnv_passfds" not in code.co_names:
        return "ForkServer.ensure_running no longer starts the server through util.spawnv_passfds"
    return ""


def warm_start() -> bool:
    """Whether ranks start warm: yes, unless ``LABKIT_WARM_START=0`` asks for the cold path or this
    Python lacks a piece the warm start needs (``warm_unavailable``: then one line says why)."""
    value = os.environ.get("LABKIT_WARM_START", "1").strip()
    if value not in ("0", "1"):
        raise ConfigError("LABKIT_WARM_START", value, "1 (ranks forked from a warm server, the default) "
                          "or 0 (every rank a fresh Python: the cold path)")
    if value == "0":
        return False
    why = warm_unavailable()
    if why:
        _say_once(f"ranks start cold (each a fresh Python): {why}")
    return not why


class _Server:
    """This process's warm forkserver. Never shared: multiprocessing keeps one per process, reached
    through a socket in this process's private folder and a pipe only this process holds."""

    def __init__(self):
        self.lock = threading.Lock()
        self.env = None      # the environment it started with; None: not running
        self.busy = 0        # blocks using it now
        self.timer = None    # stops it after IDLE_S idle seconds
        self.ready = None    # the pid of a server known to have finished its imports
        # PDEATHSIG fires when the *thread* that started a process ends: start the server from one
        # that lives as long as this process, not from the panel's short-lived Run thread.
        self.starter = ThreadPoolExecutor(1, thread_name_prefix="labkit-warm-start")

    def acquire(self):
        """Make sure the server runs, started in this process's environment as it is now: torch and its
        libraries read many variables once, at import (OMP_*, MKL_*, ONEDNN_*, ATEN_CPU_CAPABILITY, ...),
        so another value needs another server. labkit reads its own (LABKIT_*) when a run starts, and a
        rank gets this process's whole environment anyway (Rank.env)."""
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
            # The interface variables (GLOO_SOCKET_IFNAME, ...) are read when a rank builds its process group,
            # from the environment it is given (Rank.env): a server prestarted without them serves as well.
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("LABKIT_") and not k.endswith("_SOCKET_IFNAME")}
            if self.env is not None and env != self.env:
                self._stop()
            self.starter.submit(_start_server).result()  # starts it (again, if it died); at once if it runs
            self.env = env
            if self.pid() != self.ready:
                self._wait_ready()
            self.busy += 1

    def _wait_ready(self):
        """Fork one process that does nothing and wait for it: a new server forks nothing until its
        imports are done (seconds). Waiting here, with no rank asked for yet, lets Ctrl-C stop the
        wait at once and leaves no half-started rank behind; rank starts then take milliseconds."""
        p = WARM.Process(target=_ready, daemon=True)
        p.start()
        p.join()
        self.ready = self.pid()

    def release(self, keep: bool):
        """After a block: keep the server for the next run (stopped after IDLE_S idle seconds), or stop it."""
        with self.lock:
            self.busy -= 1
            if not keep:
                self._stop()
            elif self.busy == 0 and self.env is not None:
                self.timer = threading.Timer(IDLE_S, self.stop)
                self.timer.daemon = True
                self.timer.start()

    def stop(self):
        with self.lock:
            if self.busy == 0:
                self._stop()

    def _stop(self):
        self.env = None
        pid = self.pid()
        if pid is not None:  # it holds nothing to clean up; killed, it goes at once, even mid-import
            os.kill(pid, signal.SIGKILL)
        if hasattr(forkserver._forkserver, "_stop"):  # closes its "alive" pipe, reaps it, forgets it
            forkserver._forkserver._stop()

    def pid(self):
        """The running server's pid, or None (a zombie is not running; it is left for multiprocessing to reap)."""
        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if pid is None:
            return None
        try:
            with open(f"/proc/{pid}/stat") as f:
                return None if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X") else pid
        except OSError:
            try:
                os.kill(pid, 0)
                return pid
            except OSError:
                return None


def _ready():
    """The warm server's first fork: it only shows that the server's imports are done."""


def _start_server():
    """Start the forkserver (on the starter thread); its first line asks Linux to kill it with this process."""
    WARM.set_forkserver_preload(PRELOAD)
    if not sys.platform.startswith("linux"):
        forkserver.ensure_running()
        return
    # Ctrl-C is for this process, which then stops the server: ignored there from its first line on.
    prefix = _PDEATHSIG_LINE.format(parent=os.getpid()) + "import signal\nsignal.signal(2, signal.SIG_IGN)\n"
    with _patched(mp_util, "spawnv_passfds", lambda real: lambda path, args, fds: real(path, _first_line(
            list(args), prefix), fds)):
        forkserver.ensure_running()


SERVER = _Server()
atexit.register(SERVER.stop)


def prestart():
    """Start the warm server in the background now, for a run at world size > 1 not yet asked for
    (the panel calls it when the world-size control moves): the first DDP run then finds it up. A
    server that cannot start is left for the run itself to report."""
    if not warm_start():
        return

    def start():
        try:
            SERVER.acquire()
        except Exception:  # the run that needs it will start it again and say why it failed
            return
        SERVER.release(keep=True)

    threading.Thread(target=start, name="labkit-warm-prestart", daemon=True).start()


def stop_warm_server():
    """Stop this process's warm server now (the next warm start starts it again); a no-op when none runs."""
    SERVER.stop()


def warm_server_pid():
    """The pid of this process's warm server, or None when none runs."""
    return SERVER.pid()
