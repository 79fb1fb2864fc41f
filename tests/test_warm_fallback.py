"""The warm start on a Python whose multiprocessing internals differ (engine.warm.warm_unavailable): each piece
it needs is looked for at run time; a missing one is simulated here by taking it away, and the ranks must then
start cold, with one line saying why. The table of what CPython 3.12-3.14 have is in engine/warm.py."""
from __future__ import annotations

import multiprocessing as mp
from multiprocessing import forkserver, spawn
from multiprocessing import util as mp_util

import pytest

from labkit.engine import launch, warm


def test_this_python_has_every_piece_the_warm_start_needs():
    assert warm.warm_unavailable() == "" and warm._command_line_unavailable() == ""


class _NoPid:
    """A ForkServer as a Python might have it that renamed ``_forkserver_pid``."""

    def ensure_running(self):
        raise AssertionError("must not be started")


def _without_server_pid(monkeypatch):
    monkeypatch.setattr(forkserver, "_forkserver", _NoPid())


def _spawnv_passfds_changed(monkeypatch):
    monkeypatch.setattr(mp_util, "spawnv_passfds", lambda path, args, passfds, *, extra=None: 0)


def _ensure_running_starts_otherwise(monkeypatch):
    class Server(type(forkserver._forkserver)):
        def ensure_running(self):  # starts its server some other way than util.spawnv_passfds
            return None

    monkeypatch.setattr(forkserver, "_forkserver", Server())


def _no_preload(monkeypatch):
    import types

    monkeypatch.setattr(warm, "WARM", types.SimpleNamespace(Process=None))  # a context without the method


def _no_forkserver(monkeypatch):
    monkeypatch.setattr(warm, "WARM", None)


@pytest.mark.parametrize("take_away,why", [
    (_without_server_pid, "_forkserver_pid"), (_spawnv_passfds_changed, "spawnv_passfds(path, args, passfds)"),
    (_ensure_running_starts_otherwise, "no longer starts the server"), (_no_preload, "set_forkserver_preload"),
    (_no_forkserver, "no forkserver start method")])
def test_a_missing_piece_turns_the_warm_start_off_with_one_line(monkeypatch, capsys, take_away, why):
    monkeypatch.setattr(warm, "_said", set())
    monkeypatch.delenv("LABKIT_WARM_START", raising=False)
    take_away(monkeypatch)
    assert why in warm.warm_unavailable()
    assert warm.warm_start() is False and warm.warm_start() is False
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("labkit: ranks start cold (each a fresh Python): ") and why in err[0]


def test_ranks_start_cold_and_work_when_a_piece_is_missing(monkeypatch, capsys):
    """The fallback really runs: two cold ranks, spawned, not forked from a server (warm=True is overruled too)."""
    monkeypatch.setattr(warm, "_said", set())
    _without_server_pid(monkeypatch)
    for asked in (None, True):
        with launch.spawn_ranks(getattr, 2, ("rank",), prefix="labkit-warmtest-", warm=asked) as ranks:
            assert ranks.warm is False
            assert ranks.collect(180, "cold") == {0: 0, 1: 1}
    assert launch.live_children() == []


def test_a_changed_spawn_command_line_keeps_the_cold_path_unpatched(monkeypatch, capsys):
    monkeypatch.setattr(warm, "_said", set())
    real = spawn.get_command_line
    monkeypatch.setattr(spawn, "get_command_line", lambda **kw: ["python", "-m", "somewhere"])
    with warm.children_die_with_parent():
        assert spawn.get_command_line() == ["python", "-m", "somewhere"]  # left alone: no '-c' to put a line before
    assert "get_command_line() is missing" in capsys.readouterr().err
    monkeypatch.setattr(spawn, "get_command_line", real)
    with warm.children_die_with_parent():
        assert "prctl(1, 9)" in spawn.get_command_line()[-2]  # the first line, in front of spawn's own code


def test_a_rank_never_inherits_a_forkserver_default(monkeypatch):
    """Python 3.14 makes forkserver Linux's default: a rank's DataLoader workers must still be its own children."""
    import queue
    import types

    default = types.SimpleNamespace(get_start_method=lambda: "forkserver")  # 3.14's default context on Linux
    monkeypatch.setattr(launch, "_die_with_parent", lambda: None)
    # rank_main ignores SIGINT and unblocks it: not in this test's own process
    monkeypatch.setattr(launch.signal, "signal", lambda *a: None)
    monkeypatch.setattr(launch.signal, "pthread_sigmask", lambda *a: set())
    monkeypatch.setenv("OMP_NUM_THREADS", launch.os.environ.get("OMP_NUM_THREADS", "1"))  # rank_main's default
    monkeypatch.setattr(mp, "get_context", lambda method=None: default)
    seen = []
    monkeypatch.setattr(mp, "set_start_method", lambda method, force=False: seen.append((method, force)))
    q = queue.Queue()
    launch.rank_main(launch.Rank(0, 1, "", q, None), lambda r: "ok")
    assert seen == [("spawn", True)] and q.get_nowait() == ("done", 0, "ok")
    default.get_start_method = lambda: "fork"  # 3.11-3.13: a cold rank keeps fork for its workers
    seen.clear()
    launch.rank_main(launch.Rank(0, 1, "", q, None), lambda r: "ok")
    assert seen == []
