"""Real DDP with gloo and 2 processes: AllReduce counts from the comm hook, gradients, hygiene."""
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.engine import ddp as ddp_mod
from labkit.engine.model import GPT

# A small bucket cap so the tiny model's ~0.47 MB of gradients spread over several buckets.
BASE = dict(model="tiny", micro_batch=2, steps=3, bucket_cap_mb=0.1, optimizer="sgd", lr=0.05, grad_clip=None)


@pytest.fixture(scope="module")
def runs():
    """One spawned 2-process run per (K, sync) case; spawning costs seconds, so share them."""
    out = {}
    for K in (1, 2, 4):
        for sync in (("no_sync", "every_micro") if K > 1 else ("no_sync",)):
            out[(K, sync)] = lk.run(lk.Config(world_size=2, accum=K, ddp_sync=sync, **BASE))
    return out


def grad_bytes():
    with torch.device("meta"):
        return sum(p.numel() * 4 for p in GPT(lk.Config(model="tiny").spec).parameters())


@pytest.mark.parametrize("K", [1, 2, 4])
def test_allreduce_calls_per_update(runs, K):
    r = runs[(K, "no_sync")].summary
    assert r["status"] == "completed" and r["world_size"] == 2
    assert r["n_buckets"] > 1  # the 0.1 MB cap really split the gradients
    assert r["allreduce_calls_per_update"] == r["n_buckets"]  # once per update with no_sync
    if K > 1:
        e = runs[(K, "every_micro")].summary
        assert e["n_buckets"] == r["n_buckets"]
        assert e["allreduce_calls_per_update"] == K * e["n_buckets"]  # the naive loop syncs K times


def test_first_iteration_uses_one_bucket(runs):
    r = runs[(1, "no_sync")]
    assert r.summary["first_update_buckets"] == 1  # DDP's first iteration: every gradient in one bucket
    assert r.records[0]["allreduce_calls"] == 1
    assert r.records[1]["allreduce_calls"] == r.summary["n_buckets"]


def test_allreduce_bytes_equal_gradient_bytes(runs):
    gb = grad_bytes()
    assert runs[(4, "no_sync")].summary["allreduce_bytes_per_update"] == gb
    assert runs[(4, "every_micro")].summary["allreduce_bytes_per_update"] == 4 * gb
    assert runs[(4, "no_sync")].summary["grad_bytes"] == gb


def test_fp16_compression_halves_bytes():
    r = lk.run(lk.Config(world_size=2, accum=2, comm_hook="fp16_compress", **BASE)).summary
    assert r["allreduce_bytes_per_update"] == grad_bytes() // 2
    assert r["replicas_identical"]


def test_replicas_identical_and_equal_to_single_process(runs):
    ddp = runs[(2, "no_sync")].summary
    assert ddp["replicas_identical"]
    # the same global batch in one process: micro-batch 2 x 2 ranks = micro-batch 4
    single = lk.run(lk.Config(**{**BASE, "micro_batch": 4, "accum": 2})).summary
    assert ddp["param_fingerprint"] == pytest.approx(single["param_fingerprint"], rel=1e-6)
    assert ddp["final_loss"] == pytest.approx(single["final_loss"], rel=1e-5)
    naive = runs[(2, "every_micro")].summary  # syncing more often changes cost, not the result
    assert naive["param_fingerprint"] == pytest.approx(single["param_fingerprint"], rel=1e-6)


def test_world_size_one_counts_real_calls():
    r = lk.run(lk.Config(accum=3, ddp_sync="every_micro", **BASE)).summary
    assert r["world_size"] == 1
    assert r["allreduce_calls_per_update"] == 3 * r["n_buckets"]
    assert not dist.is_initialized()  # the process group of one is gone after the run


def test_records_stream_from_rank0(runs):
    r = runs[(2, "no_sync")]
    assert [rec["update"] for rec in r.records] == [1, 2, 3]
    assert all(rec["mfu"] is not None for rec in r.records)


def test_a_rank_that_raises_ends_the_run_cleanly(monkeypatch, no_leftover_processes):
    monkeypatch.setenv("LABKIT_INJECT_FAULT", "1:2")  # rank 1 raises at update 2
    with pytest.raises(lk.RunError, match="rank 1 failed.*injected fault"):
        lk.run(lk.Config(world_size=2, **{**BASE, "steps": 5}))
    monkeypatch.delenv("LABKIT_INJECT_FAULT")
    assert lk.run(lk.Config(**BASE)).summary["status"] == "completed"  # the next run works


def test_stop_mid_run_leaves_no_process(no_leftover_processes):
    stop = threading.Event()
    r = lk.run(lk.Config(world_size=2, **{**BASE, "steps": 200, "accum": 2}),
               on_step=lambda rec: stop.set(), stop=stop)
    assert r.summary["status"] == "stopped" and len(r.records) >= 1


def test_exception_in_on_step_ends_workers(no_leftover_processes):
    def boom(rec):
        raise ValueError("callback failed")

    with pytest.raises(ValueError, match="callback failed"):
        lk.run(lk.Config(world_size=2, **{**BASE, "steps": 50}), on_step=boom)


def test_one_run_at_a_time_per_process():
    started, release = threading.Event(), threading.Event()

    def slow(rec):
        started.set()
        release.wait(30)

    t = threading.Thread(target=lambda: lk.run(lk.Config(**BASE), on_step=slow))
    t.start()
    try:
        assert started.wait(60)
        with pytest.raises(lk.RunError, match="one run at a\\s+time"):
            lk.run(lk.Config(**BASE))
    finally:
        release.set()
        t.join(60)


def test_counting_hook_averages_like_ddp():
    """The hook must still average: check it directly in a process group of one."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        ref = torch.nn.Linear(4, 2)
        ref.load_state_dict(model.state_dict())
        net = torch.nn.parallel.DistributedDataParallel(model)
        state = ddp_mod.CommCounter()
        net.register_comm_hook(state, ddp_mod.counting_hook)
        x = torch.randn(8, 4)
        net(x).sum().backward()
        ref(x).sum().backward()
        assert state.calls == 1 and state.bytes == sum(p.numel() * 4 for p in model.parameters())
        for a, b in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(a.grad, b.grad)
    finally:
        # DDP's reducer holds the process group: free it first, or gloo's destructor can hang
        net = None
        import gc

        gc.collect()
        dist.destroy_process_group()


def test_a_broken_connection_is_blamed_on_its_cause():
    """A survivor only sees 'Connection closed by peer'; the message must lead with the real cause."""
    import queue
    import types

    from labkit.engine.launch import _rank_error

    lost = "RuntimeError: [gloo/transport/tcp/pair.cc] Connection closed by peer [127.0.0.1]:1408"
    alive, clean_exit, killed = (types.SimpleNamespace(exitcode=c) for c in (None, 0, -9))
    # a peer killed by a signal
    msg = _rank_error(0, lost, [alive, killed], queue.Queue())
    assert msg.startswith("rank 1 died (killed by SIGKILL)") and "Connection closed" in msg
    # a peer whose own exception is still in the queue (it exited cleanly after reporting): its error first
    q = queue.Queue()
    q.put(("error", 1, "OutOfMemoryError: CUDA out of memory", "traceback"))
    msg = _rank_error(0, lost, [alive, clean_exit], q)
    assert msg.startswith("rank 1 failed: OutOfMemoryError") and "exit code 0" not in msg
    # an ordinary exception is reported as it is, at once
    # (rank 0 never ends here: it is waited for settle_s only)
    assert _rank_error(1, "ValueError: bad", [alive, alive], queue.Queue(), settle_s=0.2) == "rank 1 failed: ValueError: bad"


def test_runs_do_not_pile_up_rank_prefixes_on_the_excepthook():
    """torch's init_process_group wraps sys.excepthook for good; labkit puts the original back."""
    import sys

    import labkit as lk

    before = sys.excepthook
    for _ in range(2):
        lk.run(lk.Config(model="tiny", steps=1))
    assert sys.excepthook is before


def test_a_script_without_a_main_guard_gets_told_why_its_ranks_died(tmp_path):
    """spawn re-imports the launching script in every rank; without the guard each rank fails at once."""
    script = tmp_path / "train_without_guard.py"
    script.write_text("import labkit as lk\nlk.run(lk.Config(model='tiny', steps=1, world_size=2))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "before it started training" in last and 'if __name__ == "__main__":' in last, last


def test_a_process_group_block_destroys_its_group_even_after_an_error():
    with pytest.raises(ValueError):
        with ddp_mod.process_group("cpu", 0, 1) as created:
            assert created and dist.is_initialized()
            raise ValueError("inside the block")
    assert not dist.is_initialized()


def test_spawned_ranks_report_fail_by_name_and_leave_nothing(no_leftover_processes):
    """launch.spawn_ranks, as the chapter demos use it: results per rank, a rank's error as a RunError
    naming it, and no process or store folder left either way. The targets are importable built-ins."""
    import glob
    import operator
    import tempfile

    from labkit.engine import launch

    def folders():
        return set(glob.glob(f"{tempfile.gettempdir()}/labkit-launchtest-*"))

    before = folders()
    with launch.spawn_ranks(getattr, 2, ("rank",), prefix="labkit-launchtest-") as ranks:
        assert ranks.collect(120, "demo") == {0: 0, 1: 1}  # getattr(Rank, "rank") in each rank
    with pytest.raises(lk.RunError, match=r"^demo: rank \d failed: TypeError"):
        with launch.spawn_ranks(operator.truediv, 2, (0,), prefix="labkit-launchtest-") as ranks:
            ranks.collect(120, "demo")  # Rank / 0 raises in every rank
    assert folders() == before


# ---- the warm start: ranks forked from this process's own preloaded forkserver ---------------------

def _settings():
    """What a run may change in its process -- a fork of the warm server must start from none of it."""
    return {"threads": torch.get_num_threads(),
            "tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_precision": torch.get_float32_matmul_precision(), "dtype": str(torch.get_default_dtype()),
            "grad": torch.is_grad_enabled(), "seed": torch.initial_seed()}


def _change_settings_rank(rank):
    """A rank that changes every global setting _settings() reads (a run could do any of it)."""
    torch.set_num_threads(torch.get_num_threads() + 1)
    torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("medium")
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.manual_seed(12345)
    return _settings()


def _report_rank(rank, name):
    import os

    return {**_settings(), "env": os.environ.get(name), "pid": os.getpid(), "ppid": os.getppid()}


def _ranks(target, args=(), warm=None):
    from labkit.engine import launch

    with launch.spawn_ranks(target, 2, args, prefix="labkit-launchtest-", warm=warm) as ranks:
        return ranks.collect(120, "warm test")


def test_nothing_a_warm_rank_changes_reaches_the_next_run(no_leftover_processes, monkeypatch):
    """Before a warm start, a pool of ranks reused between runs would have kept a run's thread count,
    tf32 switch and the rest. The server never runs a run's code: every rank is a fresh fork."""
    from labkit.engine import launch

    first = _ranks(_report_rank, ("LABKIT_TEST_NAME",), warm=True)
    server = launch.warm_server_pid()
    assert server is not None and {r["ppid"] for r in first.values()} == {server}  # forks of the server
    changed = _ranks(_change_settings_rank, warm=True)[0]
    monkeypatch.setenv("LABKIT_TEST_NAME", "set after the server started")
    after = _ranks(_report_rank, ("LABKIT_TEST_NAME",), warm=True)
    assert launch.warm_server_pid() == server  # the same server, no restart, ...
    for key in _settings():
        assert changed[key] != first[0][key], key  # (each setting really was changed)
        assert after[0][key] == first[0][key], key  # ... and nothing of the last run in it
    assert after[0]["env"] == "set after the server started"  # a rank sees the caller's environment
    monkeypatch.setenv("XYZ_READ_AT_IMPORT", "1")  # a variable torch might read at import: a new server
    again = _ranks(_report_rank, ("XYZ_READ_AT_IMPORT",), warm=True)
    assert launch.warm_server_pid() not in (None, server) and again[1]["env"] == "1"
    assert not psutil_alive(server)


def test_a_prestarted_server_is_the_one_the_next_run_uses(no_leftover_processes):
    """The panel starts the server when the learner moves the world-size control; the run after must
    find that server (a restart -- e.g. the run's loopback variables read as a changed environment --
    would cost the seconds the prestart saved)."""
    from labkit.engine import launch, warm

    warm.stop_warm_server()
    warm.prestart()
    deadline = time.monotonic() + 120
    while launch.warm_server_pid() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    server = launch.warm_server_pid()
    assert server is not None, "prestart did not start the server"
    res = _ranks(_report_rank, ("LABKIT_TEST_NAME",), warm=True)
    assert {r["ppid"] for r in res.values()} == {server} and launch.warm_server_pid() == server


def test_the_panel_prestarts_the_server_on_a_ddp_toggle(monkeypatch):
    from labkit.panel import lab as lab_mod

    calls = []
    monkeypatch.setattr(lab_mod, "prestart", lambda: calls.append(1))
    lab = lk.Lab(preset="all", model="tiny", steps=1)
    assert calls == []
    lab.set(world_size=2)
    assert len(calls) == 1
    lab.set(world_size=1, seed=3)
    assert len(calls) == 1
    lab._knobs.controls["world_size"].value = 2  # the learner's slider
    assert len(calls) == 2


def test_the_warm_server_goes_after_an_error_ctrl_c_and_when_idle(no_leftover_processes, monkeypatch):
    import operator

    from labkit.engine import launch, warm

    _ranks(getattr, ("rank",), warm=True)
    assert launch.warm_server_pid() is not None
    with pytest.raises(lk.RunError, match="rank \\d failed"):
        _ranks(operator.truediv, (0,), warm=True)
    assert launch.warm_server_pid() is None, "a failed run left its server"
    with pytest.raises(KeyboardInterrupt):
        with launch.spawn_ranks(getattr, 2, ("rank",), prefix="labkit-launchtest-", warm=True):
            raise KeyboardInterrupt
    assert launch.warm_server_pid() is None, "Ctrl-C left the server"
    monkeypatch.setattr(warm, "IDLE_S", 0.5)
    _ranks(getattr, ("rank",), warm=True)
    server = launch.warm_server_pid()
    deadline = time.monotonic() + 10
    while launch.warm_server_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert launch.warm_server_pid() is None, "an idle server was kept"
    assert not psutil_alive(server)
    monkeypatch.setenv("LABKIT_WARM_START", "sometimes")
    with pytest.raises(lk.ConfigError, match="LABKIT_WARM_START"):
        _ranks(getattr, ("rank",))


def test_the_cold_path_spawns_and_leaves_the_server_alone(no_leftover_processes, monkeypatch):
    from labkit.engine import launch

    launch.stop_warm_server()
    monkeypatch.setenv("LABKIT_WARM_START", "0")
    res = _ranks(_report_rank, ("LABKIT_TEST_NAME",))
    import os

    assert {r["ppid"] for r in res.values()} == {os.getpid()} and launch.warm_server_pid() is None


def psutil_alive(pid):
    psutil = pytest.importorskip("psutil")
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


KERNEL = """
import sys, labkit as lk
from labkit.engine import launch
if __name__ == "__main__":
    with launch.spawn_ranks(getattr, 2, ("rank",), prefix="labkit-launchtest-") as ranks:
        ranks.collect(120, "kernel")
    print(launch.warm_server_pid(), flush=True)
    sys.stdin.read()
"""


def test_each_kernel_has_its_own_server_and_it_ends_with_the_kernel(tmp_path):
    """Two Pythons never share a server; a kernel that exits, or is killed, takes its server along."""
    psutil = pytest.importorskip("psutil")
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    kernels = [subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        servers = [int(k.stdout.readline()) for k in kernels]
        assert servers[0] != servers[1]
        assert [psutil.Process(s).ppid() for s in servers] == [k.pid for k in kernels]
        kernels[0].kill()        # killed: PDEATHSIG
        kernels[1].stdin.close()  # exits normally
        for k in kernels:
            k.wait(60)
        _, alive = psutil.wait_procs([psutil.Process(s) for s in servers if psutil_alive(s)], timeout=15)
        assert not [p for p in alive if psutil_alive(p.pid)], "a server outlived its kernel"
    finally:
        for k in kernels:
            if k.poll() is None:
                k.kill()
                k.wait(10)
