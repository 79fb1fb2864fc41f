"""What one Python process allows and how a run ends early: labkit's errors, the one-run slot, the
clean-up marker, Ctrl-C at the next micro-step, whether torchrun started us, the cores it may use.
It imports nothing of labkit's, so every folder names the same error classes:

    ConfigError     a setting that cannot run (names the field, the value and what is allowed)
    RunError        a run that failed while it ran (a dead worker or rank, a second run at once)
    OutOfMemory     ... because it needed more memory than it had (memory is freed before it is raised)
    NonFiniteError  ... because inf/NaN appeared and on_nonfinite="stop"
    Stopped         a stop was asked for (Stop button, Ctrl-C); the engine turns it into status "stopped"
    TorchTooOld     a torch API the course uses is not in the installed torch (base/compat.py says which)

**One run at a time.** A process has one default process group, one CUDA peak counter and one set of
thread settings, so everything that trains or builds a process group takes the same slot: the engine
(``lk.run``), the panel (``Lab.run``, the Run button, ``Lab.ab``) and the chapter tools that build a
group of their own (``netmodel.bucket_timeline``, the twin-world checkers); whoever finds it taken
gets a ``RunError`` in their own words. The panel must refuse a second click before it starts a
thread, so it ``claim``s the slot and hands it to the thread that trains: inside ``claim.here()`` one
run on that thread uses the claimed slot instead of taking it again.

**Cores.** A container limited by a CFS quota (Kubernetes' ``cpu`` limit, Docker's ``--cpus``) still
sees every core of the node in its affinity: limited to 2 CPUs on a 64-core node, 64 threads get 2
cores' worth of time, sliced 32 ways. ``usable`` reads the quota from cgroup v2 (``cpu.max``: "max
100000" or "200000 100000") or v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, -1 for none), in this
process's cgroup and every one above it (the smallest limit wins).
"""
from __future__ import annotations

import _thread
import contextlib
import math
import os
import signal
import sys
import threading
from pathlib import Path

# The words around a ConfigError's field, value and allowed text in the learner's language: labkit.base.phrases
# installs its formatter here when it is imported (this module imports nothing of labkit's). A formatter returns the
# message, or None for the English below; a ConfigError raised while one runs is said in English.
_formatter: list = []
_busy: list = []


def install_formatter(formatter) -> None:
    """Frame every ConfigError message from now on with ``formatter(field, value, allowed)`` (None: English)."""
    _formatter[:] = [formatter]


def _message(field_name: str, value, allowed: str) -> str:
    if _formatter and not _busy:
        _busy.append(True)
        try:
            said = _formatter[0](field_name, value, allowed)
        finally:
            _busy.pop()
        if said is not None:
            return said
    return f"{field_name}={value!r} is not allowed: {allowed}"


class ConfigError(ValueError):
    """A configuration that cannot run. The message names the field, the value and what is allowed (in the
    learner's language where labkit.base.phrases has it)."""

    def __init__(self, field_name: str, value, allowed: str):
        self.field, self.value, self.allowed = field_name, value, allowed
        super().__init__(_message(field_name, value, allowed))


class RunError(RuntimeError):
    """A run failed; the message says where and why."""


class OutOfMemory(RunError):
    """The run needed more device memory than it had. Memory has been freed; the next run can go."""


class NonFiniteError(RunError):
    """inf/NaN appeared in the loss or gradients and the run was configured to stop."""


class Stopped(Exception):
    """A stop was requested (Stop button, Ctrl-C)."""


class TorchTooOld(RuntimeError):
    """The installed torch lacks an API the course uses; the message names it, the torch it needs, the one
    installed, and what to do (labkit.base.compat builds it)."""


# ---- the one-run slot ----------------------------------------------------------------------------

_SLOT = threading.Lock()
_claimed_for = None     # the thread whose next run may use the claimed slot (see Claim.here)
_inner_running = False  # that run is going now: a run inside it (from its on_step) is refused


def under_torchrun() -> bool:
    """Whether torchrun (or another launcher that sets RANK/WORLD_SIZE/MASTER_ADDR) started us."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ
                                                     and "MASTER_ADDR" in os.environ)


def busy() -> bool:
    """Whether something holds the one-run slot now."""
    return _SLOT.locked()


@contextlib.contextmanager
def one_run(busy_message: str):
    """Hold the one-run slot for the block; raise RunError(busy_message) at once when it is taken.
    On a thread inside ``Claim.here()`` the claimed slot is used (once: not by a run inside that run)."""
    global _inner_running
    if _claimed_for == threading.get_ident() and not _inner_running:
        _inner_running = True
        try:
            yield
        finally:
            _inner_running = False
        return
    with claim(busy_message):
        yield


class Claim:
    """The slot, taken on one thread for a run that a caller starts itself (the panel's Run button
    takes it on the kernel's thread, then trains on a thread of its own). Release it with ``release()``
    or by leaving ``with claim:``."""

    def __init__(self):
        self._held = True

    @contextlib.contextmanager
    def here(self):
        """Inside this block, one run on the calling thread uses this claim instead of the slot."""
        global _claimed_for
        _claimed_for = threading.get_ident()
        try:
            yield self
        finally:
            _claimed_for = None

    def release(self):
        if self._held:
            self._held = False
            _SLOT.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def claim(busy_message: str) -> Claim:
    """Take the slot now for a run to come, or raise RunError(busy_message)."""
    if not _SLOT.acquire(blocking=False):
        raise RunError(busy_message)
    return Claim()


# ---- clean-up that a Ctrl-C must not cut short ---------------------------------------------------

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


# ---- Ctrl-C stops at the next micro-step ---------------------------------------------------------

CTRL_C_GRACE_S = 1.0  # how long a first Ctrl-C waits for a micro-step boundary before it interrupts at once


@contextlib.contextmanager
def ctrl_c_at_next_micro_step():
    """Ctrl-C (Jupyter's *Interrupt kernel* too) during a run, on the main thread, when nobody has
    replaced Python's own handler. Yields an Event that is set once Ctrl-C was pressed.

    Python raises KeyboardInterrupt wherever the main thread happens to be -- even inside a finalizer,
    where it is printed and lost. So a first press asks the loop to stop at the next micro-step, which
    then cleans up and raises. If no micro-step boundary comes within CTRL_C_GRACE_S (a compile, a
    long step, slow data, start-up), or on a second press, it interrupts at once. While the run is
    cleaning up (``cleaning_up``) presses wait, so no worker, process group or setting is left."""
    flag = threading.Event()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield flag
        return

    owner, lock, state = os.getpid(), threading.Lock(), {"active": True, "timer": None}

    def interrupt_now():
        with lock:
            if state["active"] and not _cleaning:
                _thread.interrupt_main()  # runs on_sigint again, on the main thread: it raises

    def on_sigint(signum, frame):
        if os.getpid() != owner:  # a forked loader worker inherits this handler: the loop shuts it down
            return
        if _cleaning:
            flag.set()
            print("\nCtrl-C: cleaning up, one moment ...", file=sys.stderr, flush=True)
            return
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()
        print("\nCtrl-C: stopping at the next micro-step ...", file=sys.stderr, flush=True)
        state["timer"] = threading.Timer(CTRL_C_GRACE_S, interrupt_now)
        state["timer"].daemon = True
        state["timer"].start()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield flag
    finally:
        with lock:
            state["active"] = False
            if state["timer"] is not None:
                state["timer"].cancel()
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ---- the cores this process may use: its CPU affinity and its cgroup's CPU quota -----------------

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_paths(proc_cgroup: str) -> dict:
    """{'v2': '/a/b', 'v1': '/a/b'}: this process's cgroup per hierarchy, from /proc/self/cgroup's lines."""
    out = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        num, controllers, path = parts
        if num == "0" and controllers == "":
            out["v2"] = path
        elif "cpu" in controllers.split(","):
            out["v1"] = path
    return out


def _upwards(mount: Path, path: str):
    """The cgroup's folder and each one above it, up to the mount (inside a container's cgroup namespace the
    own path is '/', and the mount is the container's own cgroup)."""
    parts = [p for p in path.strip("/").split("/") if p]
    for i in range(len(parts), -1, -1):
        yield mount.joinpath(*parts[:i])


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _limit(quota, period, where):
    """(cores, where(quota, period)) of a quota and period as read, as whole numbers; None for no
    quota ('max', -1) or an unreadable one."""
    try:
        quota, period = int(quota), int(period)
    except (TypeError, ValueError):
        return None
    return (quota / period, where(quota, period)) if quota > 0 and period > 0 else None


def _v2_limit(folder: Path):
    text = _read(folder / "cpu.max") or ""
    fields = text.split()
    return _limit(*fields, lambda q, p: f"{folder / 'cpu.max'}: {text}") if len(fields) == 2 else None


def _v1_limit(folder: Path):
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    return _limit(quota, period, lambda q, p: f"{folder / 'cpu.cfs_quota_us'}: {q} per {p} µs")


def quota(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None):
    """(cores the quota allows, where it was read), or None when no quota limits this process."""
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup")) or ""
    own = _own_paths(proc_cgroup)
    limits = []
    if "v2" in own or (root / "cpu.max").exists():
        limits += [lim for f in _upwards(root, own.get("v2", "/")) if (lim := _v2_limit(f))]
    for mount in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
        if mount.is_dir():
            limits += [lim for f in _upwards(mount, own.get("v1", "/")) if (lim := _v1_limit(f))]
            break
    return min(limits) if limits else None


def affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def usable(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> tuple:
    """(cores, where the figure came from): the affinity's count, or the quota's (rounded up: 1.5 cores of time
    keep 2 threads busy part of the time) when that is smaller."""
    n = affinity()
    limit = quota(root, proc_cgroup)
    if limit is not None and math.ceil(limit[0]) < n:
        return max(1, math.ceil(limit[0])), f"the cgroup's CPU quota ({limit[1]}); {n} in the affinity"
    return n, "CPU affinity" + (f" (the cgroup's quota, {limit[1]}, allows more)" if limit else "")
