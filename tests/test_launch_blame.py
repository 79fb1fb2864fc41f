"""Which rank a failed run blames (engine.launch.settle / blame, used by Ranks.collect, the engine's watch and
chapter 11's restart loop): the rank that died or failed first and how, never a survivor's consequent error.

The race these pin, made deterministic: a SIGKILLed rank's exit code is known only once it is reaped (by the
launcher, or by the warm server, which writes it down a pipe), while its survivor's "Connection closed by
peer" travels the queue in milliseconds. Here the killed rank is reaped ``REAPED_AFTER_S`` after the survivor's
report is already waiting; the old code read the exit codes at once and blamed the survivor."""
from __future__ import annotations

import contextlib
import queue
import threading
import time

import pytest

from labkit.base.runtime import RunError
from labkit.chapters.ch11_longrun import restart
from labkit.engine import launch

LOST = ("RuntimeError: [third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
        "[127.0.0.1]:58530. This is typically caused by a remote worker crashing.")
REAPED_AFTER_S = 1.5  # longer than the old engine's 1 s wait for a cause


class Proc:
    """A rank as the parent sees it: ``exitcode`` None until ``after_s`` seconds from now, then ``code``."""

    def __init__(self, code, after_s=0.0):
        self.code, self.at = code, time.monotonic() + after_s

    @property
    def exitcode(self):
        return self.code if time.monotonic() >= self.at else None


def _killed_rank_1_survivor_reports_first():
    """Rank 1 SIGKILLed, reaped late; rank 0 reported its broken connection, said goodbye and exited."""
    q = queue.Queue()
    q.put(("error", 0, LOST))
    q.put(("exit", 0, None))
    return [Proc(0, 0.05), Proc(-9, REAPED_AFTER_S)], q


def test_collect_blames_the_killed_rank_not_the_survivor_whose_error_came_first():
    procs, q = _killed_rank_1_survivor_reports_first()
    with pytest.raises(RunError) as e:
        launch.Ranks(procs, q, stop=None).collect(60, "demo")
    assert str(e.value).startswith("demo: rank 1 died (killed by SIGKILL), so rank 0 lost its connection")
    assert e.value.first.rank == 1 and e.value.first.exit_code == -9
    assert e.value.exit_codes == {0: 0, 1: -9}


def test_the_engines_watch_blames_the_killed_rank_reaped_late():
    procs, q = _killed_rank_1_survivor_reports_first()
    now = time.monotonic()
    w = launch._Watch(procs, q, threading.Event(), started=now, last_news=now)
    launch._watch(w, on_step=lambda rec: None, should_stop=lambda: False, grace_s=1.0)
    assert w.error.startswith("rank 1 died (killed by SIGKILL), so rank 0 lost its connection"), w.error
    assert w.stop.is_set()


def test_a_ranks_own_exception_outranks_a_broken_connection_that_arrived_first():
    q = queue.Queue()
    for msg in (("error", 1, LOST), ("exit", 1, None), ("error", 0, "ValueError: bad batch"), ("exit", 0, None)):
        q.put(msg)
    with pytest.raises(RunError) as e:
        launch.Ranks([Proc(0), Proc(0)], q, stop=None).collect(60, "demo")
    assert str(e.value) == "demo: rank 0 failed: ValueError: bad batch (rank 1 then lost its connection to it)"


def test_an_exit_code_is_named_and_two_deaths_go_by_the_first_seen():
    ends = launch.settle([Proc(3, 0.3), Proc(-11)], queue.Queue(), {})
    assert launch.first_end(ends).rank == 1 and launch.blame(ends) == "rank 1 died (killed by SIGSEGV)"
    assert launch.RankEnd(0, 0.0, exit_code=3).words() == "rank 0 died (exit code 3)"


def test_a_peer_that_never_ends_is_waited_for_settle_s_only():
    q = queue.Queue()
    t0 = time.monotonic()
    text = launch._rank_error(0, LOST, [Proc(0), Proc(None)], q, settle_s=0.3)
    assert time.monotonic() - t0 < 5
    assert text.startswith("rank 0 lost its connection to another rank, which probably failed or died")


def test_the_restart_loop_records_the_killed_rank_and_its_exit_code(monkeypatch):
    """Chapter 11's note reads Attempt.error: it must name the killed rank, reaped after its survivor reported."""
    launches = []

    @contextlib.contextmanager
    def fake_spawn_ranks(target, world_size, args=(), **kw):
        launches.append(args[0])  # the restart count
        if len(launches) == 1:
            procs, q = _killed_rank_1_survivor_reports_first()
        else:
            procs, q = [Proc(0), Proc(0)], queue.Queue()
            for r in range(2):
                q.put(("done", r, {"rank": r}))
                q.put(("exit", r, None))
        yield launch.Ranks(procs, q, stop=None)

    monkeypatch.setattr(restart, "spawn_ranks", fake_spawn_ranks)
    results, attempts = restart.run_with_restarts(object, 2, (), max_restarts=1, timeout_s=60)
    assert launches == [0, 1] and results == {0: {"rank": 0}, 1: {"rank": 1}}
    assert attempts[0].error == "rank 1 died (killed by SIGKILL)" and attempts[0].exit_codes == {0: 0, 1: -9}
    assert attempts[0].first_rank == 1 and attempts[1].ok
    # chapter 11 names the first rank's exit status, read from the attempt (not the survivor's 0)
    from types import SimpleNamespace

    ended = restart.first_exit(SimpleNamespace(attempts=attempts))
    assert ended == dict(how="signal", rank=1, code=-9, signal=9)
