"""engine.launch under Ctrl-C while ranks start: a warm rank's start is held together (its arguments sent and its
pid read, or neither), so an interruption never leaves a rank forked with a queue its parent is freeing; and the warm
server's import wait happens before any rank is asked for, where Ctrl-C may stop it at once."""
from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing import forkserver

import pytest

from labkit.engine import launch, warm

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="Python delivers signals to the main thread only")


def test_a_ctrl_c_inside_the_held_block_comes_after_it():
    ran_on = []
    with pytest.raises(KeyboardInterrupt):
        with launch._sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # noqa: sleep-ok -- gives the signal time to arrive inside the block
            ran_on.append("after the signal")
    assert ran_on == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_no_ctrl_c_no_exception():
    with launch._sigint_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_while_a_warm_rank_reads_its_pid_stops_every_rank_quietly(monkeypatch, capfd):
    """The interruption is planted where the race was: after the rank's arguments reached the server, before its
    pid came back. Unheld, the pid is never read, the rank is never reaped, and it fails to unpickle the queue its
    parent freed (SemLock._rebuild, FileNotFoundError) on the server's stderr."""
    if warm.warm_unavailable():
        pytest.skip(f"no warm start here: {warm.warm_unavailable()}")
    warm.stop_warm_server()  # a fresh server, started now, writes to this test's captured stderr
    real = forkserver.read_signed
    planted = []

    def read_signed_after_ctrl_c(fd):
        if not planted and threading.current_thread() is threading.main_thread():
            planted.append(fd)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # noqa: sleep-ok -- the signal lands here, between the send and the pid
        return real(fd)

    procs = []
    real_reap = launch.reap
    monkeypatch.setattr(launch, "reap", lambda ps, grace_s: (procs.extend(ps), real_reap(ps, grace_s)))
    with pytest.raises(KeyboardInterrupt):
        warm.SERVER.acquire()  # the import wait first, so the plant hits a rank's start, not the readiness fork
        warm.SERVER.release(keep=True)
        monkeypatch.setattr(forkserver, "read_signed", read_signed_after_ctrl_c)
        with launch.spawn_ranks(getattr, 2, ("rank",), prefix="labkit-launchtest-", warm=True):
            pass
    monkeypatch.setattr(forkserver, "read_signed", real)
    assert planted, "the plant never ran"
    assert procs and procs[0].pid is not None  # the interrupted start finished: its rank was known and reaped
    assert not [p for p in procs if p.pid is not None and p.is_alive()]
    time.sleep(1.0)  # noqa: sleep-ok -- a half-started rank would print its traceback within this second
    err = capfd.readouterr().err
    assert "Traceback" not in err and "FileNotFoundError" not in err, err[-2000:]
