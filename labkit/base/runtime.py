"""What one Python process allows at a time, and how a run is interrupted: the one-run slot, the
clean-up marker, Ctrl-C at the next micro-step, and whether torchrun started us.

**One run at a time.** A process has one default process group, one CUDA peak counter and one set of
thread settings, so labkit runs one thing that trains at a time per process (per notebook kernel).
Everything that trains or builds a process group takes the same slot: the engine (``lk.run``), the
panel (``Lab.run``, the Run button, ``Lab.ab``) and the chapter tools that build a group of their own
(``netmodel.bucket_timeline``, the twin-world checkers). Whoever finds it taken gets a ``RunError``
with their own words.

The panel takes the slot *around* the engine's run (it must refuse a second click before it starts a
thread), so it ``claim``s it and hands it to the thread that trains: inside ``claim.here()`` one run on
that thread may use the claimed slot instead of taking it again.
"""
from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading

from .errors import RunError

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
    if not _SLOT.acquire(blocking=False):
        raise RunError(busy_message)
    try:
        yield
    finally:
        _SLOT.release()


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


def is_cleaning_up() -> bool:
    return _cleaning > 0


# ---- Ctrl-C stops at the next micro-step -----------------------------------------------------------

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
            if state["active"] and not is_cleaning_up():
                _thread.interrupt_main()  # runs on_sigint again, on the main thread: it raises

    def on_sigint(signum, frame):
        if os.getpid() != owner:  # a forked loader worker inherits this handler: the loop shuts it down
            return
        if is_cleaning_up():
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
