"""labkit.engine.launch and ddp, multi-process runs: no network listener beyond loopback, and nothing
outlives a killed parent, whatever phase the run is in."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import labkit as lk
from labkit.engine import ddp as ddp_mod
from labkit.engine import launch

psutil = pytest.importorskip("psutil")
from conftest import _file_faults  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "labkit", "run", "--model", "tiny", "--steps", "300", "--world-size", "2"]
LOOPBACK = ("127.0.0.1", "::1")


def _family(root_pid):
    """root and its descendants, alive."""
    try:
        root = psutil.Process(root_pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _listening(procs):
    """(address, port, command) of every listening inet socket these processes hold."""
    seen = set()
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    seen.add((c.laddr.ip, c.laddr.port, " ".join(p.cmdline())[-60:]))
        except psutil.Error:
            pass
    return seen


def _listeners_while_running(cmd, tmp_path, on_poll=lambda pid, family: None):
    """Run ``cmd`` (temp files under tmp_path) and collect every listening socket its process tree held
    while it ran; ``on_poll`` sees the tree at each look. Returns (return code, stderr, sockets)."""
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           env={**os.environ, "TMPDIR": str(tmp_path)})
    seen = set()
    try:
        while run.poll() is None:
            family = _family(run.pid)
            seen |= _listening(family)
            on_poll(run.pid, family)
            time.sleep(0.1)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    return run.returncode, err, seen


def test_a_two_process_run_listens_on_loopback_only(tmp_path):
    """Before: the parent's TCPStore listened on *:PORT (IPv4 and IPv6), open to any host."""
    rank_env = {}

    def ranks_interface(pid, family):
        try:
            for p in launch.rank_processes(psutil.Process(pid)):  # forks of the CLI's warm server
                rank_env[p.pid] = p.environ().get("GLOO_SOCKET_IFNAME")
        except psutil.Error:
            pass

    rc, err, seen = _listeners_while_running(CLI + ["--json"], tmp_path, ranks_interface)
    assert rc == 0, err
    print("listening during a world-size-2 run:", sorted(seen))
    assert seen, "saw no listening socket at all: the poll missed the run"
    assert all(ip in LOOPBACK for ip, _, _ in seen), sorted(seen)
    # gloo picks the address the host name resolves to unless told otherwise
    assert rank_env and set(rank_env.values()) == {ddp_mod.loopback_interface()}, rank_env
    assert not list(tmp_path.glob("labkit-ddp-*")), "the store's folder outlived the run"


def test_an_in_process_group_uses_loopback_and_puts_the_environment_back(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "was-here")
    during = []

    def look(rec):
        during.append(os.environ.get("GLOO_SOCKET_IFNAME"))
        during.append(_listening([psutil.Process()]))

    assert lk.run(lk.Config(model="tiny", steps=1), on_step=look).summary["status"] == "completed"
    assert during[0] == ddp_mod.loopback_interface()
    assert all(ip in LOOPBACK for ip, _, _ in during[1]), during[1]
    assert os.environ["GLOO_SOCKET_IFNAME"] == "was-here"


# ---- a killed parent ------------------------------------------------------------------------------

def _session(sid):
    """Live processes of session ``sid`` other than its leader (zombies have already ended): benchmarks/faults.py's."""
    return _file_faults()._session(sid)


def _server(p) -> bool:
    return "multiprocessing.forkserver" in " ".join(p.cmdline())


def _run_processes(sid):
    """Session ``sid``'s ranks and their loader workers: spawned Pythons (cold), forks of the warm server."""
    out = []
    for p in _session(sid):
        try:
            if "spawn_main" in " ".join(p.cmdline()) or (_server(p) and _server(p.parent())):
                out.append(p)
        except (psutil.Error, AttributeError):
            pass
    return out


def _servers(sid):
    out = []
    for p in _session(sid):
        try:
            if _server(p) and p.ppid() == sid:
                out.append(p)
        except psutil.Error:
            pass
    return out


# (what the CLI is doing when it is killed, LABKIT_WARM_START, how to tell that it is doing it)
PHASES = {
    "cold ranks importing torch": ("0", lambda sid: len(_run_processes(sid)) >= 2),
    "warm server importing torch": ("1", lambda sid: len(_servers(sid)) >= 1),
    "warm ranks starting": ("1", lambda sid: len(_run_processes(sid)) >= 2),
    "loader workers starting": ("1", lambda sid: len(_run_processes(sid)) >= 4),
}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_killing_the_parent_at_start_up_leaves_nothing(sig, phase, tmp_path):
    """Before: ranks set PR_SET_PDEATHSIG only after importing torch, and a rank's loader workers not at
    all; a parent killed in that window left ranks, workers and the resource tracker for ~150 s. The warm
    server must go too, also while it is still importing torch."""
    warm, reached = PHASES[phase]
    cli = subprocess.Popen(CLI + ["--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           cwd=ROOT, start_new_session=True,
                           env={**os.environ, "TMPDIR": str(tmp_path), "LABKIT_WARM_START": warm})
    try:
        deadline = time.monotonic() + 120
        while not reached(cli.pid):
            assert cli.poll() is None, cli.stderr.read()
            assert time.monotonic() < deadline, f"never saw '{phase}'"
            time.sleep(0.02)
        if phase.endswith("importing torch"):
            time.sleep(0.5)  # importing torch takes seconds: it is still at it
        before = len(_session(cli.pid))
        cli.send_signal(sig)
        cli.wait(10)
        t0 = time.monotonic()
        while _session(cli.pid) and time.monotonic() - t0 < 15:
            time.sleep(0.05)
        left = _session(cli.pid)
        print(f"{signal.Signals(sig).name} during '{phase}': {before} processes gone in "
              f"{time.monotonic() - t0:.2f} s")
        assert not left, [" ".join(p.cmdline())[-100:] for p in left]
        if sig == signal.SIGTERM:  # SIGKILL leaves the store's small folder: nothing can run after it
            assert not list(tmp_path.glob("labkit-ddp-*"))
    finally:
        for p in _session(cli.pid):
            try:
                p.kill()
            except psutil.Error:
                pass
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)


def test_a_group_that_fails_to_start_puts_the_environment_back(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "was-here")

    def fails(*args, **kwargs):
        raise RuntimeError("no group today")

    monkeypatch.setattr(ddp_mod.dist, "init_process_group", fails)
    with pytest.raises(RuntimeError, match="no group today"):
        ddp_mod.init_group("cpu", 0, 1)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "was-here"


FSDP_DEMO = ("import labkit.chapters.ch09_playbook as pb; d = pb.fsdp_demo(model='tiny', world_size=2, micro_batch=2, steps=40); "
             "assert d['ok'], d")


def test_the_fsdp_demo_listens_on_loopback_only(tmp_path):
    """The FSDP demo of chapter 09 (the playbook) had a TCPStore of its own, listening on every interface."""
    rc, err, seen = _listeners_while_running([sys.executable, "-c", FSDP_DEMO], tmp_path)
    assert rc == 0, err
    assert seen, "saw no listening socket at all: the poll missed the demo"
    assert all(ip in LOOPBACK for ip, _, _ in seen), sorted(seen)
    assert not list(tmp_path.glob("labkit-fsdp-*")), "the store's folder outlived the demo"


# ---- a run whose ranks never report: the hint at a missing __main__ guard ---------------------------

def test_no_progress_from_any_rank_gets_the_main_guard_hint(monkeypatch):
    import types

    from labkit.engine import launch as launch_mod

    script = types.ModuleType("__main__")
    script.__file__ = "/home/me/train.py"
    monkeypatch.setitem(sys.modules, "__main__", script)
    t = time.monotonic() - launch_mod.TIMEOUT.total_seconds() - 20
    w = launch_mod._Watch(procs=[], out_q=None, stop=None, started=t, last_news=t)
    msg = launch_mod._silence(w)
    assert msg.startswith("no progress from any rank for 70 s (none had started training)")
    assert 'if __name__ == "__main__":' in msg and "top-level" in msg and "printed above" not in msg
    w.last_news = t + 1  # training had begun: a hang, not a script re-running its top level
    assert 'if __name__' not in launch_mod._silence(w)
