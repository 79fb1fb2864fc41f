"""Real DDP with gloo and 2 processes: AllReduce counts from the comm hook, gradients, hygiene."""
import subprocess
import sys
import threading

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
    assert _rank_error(1, "ValueError: bad", [alive, alive], queue.Queue()) == "rank 1 failed: ValueError: bad"


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
