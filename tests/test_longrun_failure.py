"""Chapter 11, part C (labkit.chapters.ch11_longrun: restart, spikes): the Young/Daly arithmetic against
hand-worked values, the MTBF scaled from the published count, a SIGKILLed rank whose job restarts and ends
bit for bit where an uninterrupted run ends, the restart loop giving up, the spike guard's decisions -- and
bad input refused before any work."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from labkit.base.runtime import ConfigError, RunError
from labkit.chapters.ch11_longrun import spikes as iv
from labkit.chapters.ch11_longrun import restart, spikes, state
from labkit.engine.launch import live_children


# ---- how often ---------------------------------------------------------------------------------------------

def test_young_daly_and_overhead_against_hand_worked_values():
    assert iv.young_daly(50.0, 3600.0) == pytest.approx(600.0)  # sqrt(2 * 50 * 3600) = sqrt(360000)
    assert iv.young_daly(18.0, 10_000.0) == pytest.approx(600.0)
    # 50 / 600 saving + 300 / 3600 lost = 1/12 + 1/12
    assert iv.expected_overhead(600.0, 50.0, 3600.0) == pytest.approx(1 / 6)
    assert iv.expected_overhead(600.0, 50.0, 3600.0, restart_s=36.0) == pytest.approx(1 / 6 + 0.01)
    # Daly's estimate: close to Young's when saving is short, the MTBF itself when saving takes >= 2 MTBFs
    assert iv.daly(50.0, 3600.0) == pytest.approx(600 * (1 + math.sqrt(50 / 7200) / 3 + 50 / 7200 / 9) - 50)
    assert iv.daly(1.0, 1e6) == pytest.approx(iv.young_daly(1.0, 1e6), rel=0.01)
    assert iv.daly(100.0, 40.0) == 40.0


@pytest.mark.parametrize("save_s,mtbf_s,restart_s", [(20.0, 3600.0 * 49, 0.0), (5.0, 7200.0, 60.0), (300.0, 1e6, 0.0)])
def test_the_overhead_is_lowest_at_young_daly(save_s, mtbf_s, restart_s):
    best = iv.young_daly(save_s, mtbf_s)
    grid = np.geomspace(best / 20, best * 20, 4001)
    numeric = grid[np.argmin([iv.expected_overhead(t, save_s, mtbf_s, restart_s) for t in grid])]
    assert numeric == pytest.approx(best, rel=0.03)


def test_cluster_mtbf_scales_with_gpus_from_the_published_count():
    f = iv.LLAMA3
    assert (f.interruptions, f.days, f.gpus) == (419, 54, 16_384)
    assert "Llama 3" in f.source and "3.3.4" in f.source
    assert iv.cluster_mtbf(f.gpus) == pytest.approx(54 * 86_400 / 419)  # the whole snapshot's cluster
    assert iv.cluster_mtbf(1) == pytest.approx(f.per_gpu_mtbf_s())
    assert iv.cluster_mtbf(1024) == pytest.approx(iv.cluster_mtbf(1) / 1024)
    assert iv.cluster_mtbf(2048) == pytest.approx(iv.cluster_mtbf(1024) / 2)
    mine = iv.FailureFigure(interruptions=3, days=30, gpus=64, source="my cluster's log")
    assert iv.cluster_mtbf(64, mine) == pytest.approx(10 * 86_400)
    row = iv.mtbf_row(1024)
    assert row["job_mtbf_s"] == iv.cluster_mtbf(1024) and row["per_gpu_days"] == pytest.approx(
        16_384 * 54 / 419)


def test_the_chapter_tables_carry_the_model_s_figures():
    """The rows the chapter draws: Young's interval is the lowest overhead of the multiples shown, the shares
    add up to the overhead, Daly's row is Daly's interval; per GPU count the MTBF falls and the interval with it."""
    rows = iv.overhead_rows(20.0, iv.cluster_mtbf(1024), restart_s=60.0)
    young = next(r for r in rows if r["factor"] == 1.0)
    assert young["interval_s"] == pytest.approx(iv.young_daly(20.0, iv.cluster_mtbf(1024)))
    assert min(rows, key=lambda r: r["overhead"]) in (young, rows[-1])  # Young's or Daly's, never a multiple
    assert all(r["overhead"] == pytest.approx(r["saving"] + r["lost"]) for r in rows)
    assert rows[-1]["factor"] is None and rows[-1]["interval_s"] == pytest.approx(iv.daly(20.0, iv.cluster_mtbf(1024)))
    cl = iv.cluster_rows(20.0, gpu_counts=(8, 1024, 16_384))
    assert [r["gpus"] for r in cl] == [8, 1024, 16_384]
    assert cl[0]["mtbf_s"] > cl[1]["mtbf_s"] > cl[2]["mtbf_s"] and cl[0]["interval_s"] > cl[2]["interval_s"]
    assert iv.duration(90) == "90 s" and iv.duration(3 * 86_400) == "3.0 days"


@pytest.mark.parametrize("call,field", [
    (lambda: iv.young_daly(0, 10), "save_s"), (lambda: iv.young_daly(-1.0, 10), "save_s"),
    (lambda: iv.young_daly(1.0, float("nan")), "mtbf_s"), (lambda: iv.young_daly(1.0, float("inf")), "mtbf_s"),
    (lambda: iv.young_daly(True, 10), "save_s"), (lambda: iv.young_daly("20", 10), "save_s"),
    (lambda: iv.expected_overhead(0, 1, 1), "interval_s"), (lambda: iv.expected_overhead(1, 1, 1, -1), "restart_s"),
    (lambda: iv.cluster_mtbf(0), "gpus"), (lambda: iv.cluster_mtbf(8.5), "gpus"),
    (lambda: iv.cluster_mtbf(8, figure=3.0), "figure"),
    (lambda: iv.FailureFigure(interruptions=0, days=1, gpus=1, source="x"), "interruptions"),
    (lambda: iv.overhead_chart(-1, 10), "save_s"),
])
def test_bad_interval_input_is_refused_by_name(call, field):
    with pytest.raises(ConfigError) as e:
        call()
    assert e.value.field == field


# ---- surviving a failure -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def failure():
    return restart.failure_demo(model="tiny", micro_batch=2, updates=10, save_every=3, kill_at=8)


def test_a_killed_rank_resumes_bit_for_bit(failure):
    assert failure.equal and failure.max_abs_diff == 0.0
    assert failure.n_attempts == 2 and not failure.attempts[0].ok and failure.attempts[1].ok
    assert "SIGKILL" in failure.killed and failure.attempts[0].exit_codes[1] == -9
    assert failure.resumed_from == 6 and failure.redone_updates == 8 - 6  # kill_at - the last checkpoint
    assert failure.left_processes == 0 and live_children() == []
    for name in ("lost_s", "redone_s", "detect_s", "restart_s", "spawn_s", "setup_s", "load_s", "update_s"):
        v = getattr(failure, name)
        assert math.isfinite(v) and v >= 0, name
    assert failure.redone_s > 0 and failure.restart_s > 0
    # what the chapter draws: the verdicts its sentences are chosen by, the costs, the chart
    assert restart.first_exit(failure) == dict(how="signal", rank=1, code=-9, signal=9)
    assert restart.leftover(failure) == "none"
    cost = restart.costs(failure)
    assert (cost["kill_at"], cost["resumed_from"], cost["redone"]) == (8, 6, 2)
    assert cost["restart_s"] == failure.restart_s and cost["checkpoint_mib"] > 0
    restart.timeline_chart(failure)


def test_no_restarts_left_is_a_clear_error_and_leaves_no_process():
    with pytest.raises(RunError, match=r"max_restarts=0 allows no more restarts.*rank 1 died \(killed by SIGKILL\)"):
        restart.failure_demo(model="tiny", micro_batch=2, updates=4, save_every=2, kill_at=3, max_restarts=0)
    assert live_children() == []


def test_a_rank_frees_its_ddp_module_before_the_group_is_destroyed(tmp_path, monkeypatch):
    """DDP's reducer holds the process group. Freed after the group was destroyed, the reducer's destructor
    joins gloo's worker thread while holding the GIL that thread may be waiting for: a rank stuck for good
    (the ninth session's CI, and here about one demo in ten under load). A rank of one, in this process."""
    from conftest import ddp_alive_at
    from labkit.engine import ddp as ddp_mod
    from labkit.engine.data import corpus_path
    from labkit.engine.launch import Rank

    alive_at_destroy = ddp_alive_at(monkeypatch, ddp_mod, "destroy_group")
    threads = torch.get_num_threads()
    try:
        out = restart._job_rank(Rank(0, 1, str(tmp_path / "store"), None, None), 0, "cpu", "tiny", 1, 2, 1, None,
                                str(tmp_path), str(corpus_path(None)), 0)
    finally:
        torch.set_num_threads(threads)  # the rank set one thread: this process's own count back
    assert out["start"] == 0 and alive_at_destroy == [0]


@pytest.mark.parametrize("kw,field", [
    (dict(kill_at=12, updates=12), "kill_at"), (dict(kill_at=-1), "kill_at"), (dict(save_every=0), "save_every"),
    (dict(save_every=20, updates=12), "save_every"), (dict(model="huge"), "model"), (dict(world_size=0), "world_size"),
    (dict(micro_batch=True), "micro_batch"), (dict(updates=1, kill_at=0, save_every=1), "updates"),
    (dict(max_restarts=-1), "max_restarts"),
])
def test_bad_failure_demo_input_is_refused_before_work(kw, field):
    with pytest.raises(ConfigError) as e:
        restart.failure_demo(**kw)
    assert e.value.field == field


# ---- loss spikes -------------------------------------------------------------------------------------------

def test_spike_guard_decisions_on_hand_made_losses():
    g = spikes.SpikeGuard(window=3, factor=2.0)
    assert [g.is_spike(v) for v in (5.0, 9.0, 4.0)] == [False, False, False]  # warm-up: no decision yet
    assert g.threshold() == pytest.approx(10.0)  # 2 x median(5, 9, 4)
    assert g.is_spike(10.5) is True  # a spike ...
    assert g.threshold() == pytest.approx(10.0)  # ... does not join the window
    assert g.is_spike(9.9) is False  # no spike: it joins, the window slides to (9, 4, 9.9)
    assert g.threshold() == pytest.approx(18.0)
    fresh = spikes.SpikeGuard(window=5)
    assert fresh.is_spike(1e9) is False and fresh.threshold() is None  # still warming up
    assert fresh.is_spike(float("nan")) is True and fresh.is_spike(float("inf")) is True  # always


@pytest.mark.parametrize("call,field", [
    (lambda: spikes.SpikeGuard(window=2), "window"), (lambda: spikes.SpikeGuard(factor=1.0), "factor"),
    (lambda: spikes.SpikeGuard(action="stop"), "action"), (lambda: spikes.SpikeGuard().is_spike("3"), "loss"),
    (lambda: spikes.spike_demo(spike_at=5), "spike_at"),
    (lambda: spikes.spike_demo(updates=31, spike_at=30), "spike_at"),
    (lambda: spikes.spike_demo(causes=("heat",)), "causes"), (lambda: spikes.spike_demo(causes="lr"), "causes"),
    (lambda: spikes.spike_demo(lr=0), "lr"),
])
def test_bad_spike_input_is_refused(call, field):
    with pytest.raises(ConfigError) as e:
        call()
    assert e.value.field == field


def test_spike_demo_flags_the_injected_spikes():
    res = spikes.spike_demo(model="tiny", micro_batch=4, updates=36, spike_at=30)
    assert res.clean["events"] == []  # no false alarm on the clean run
    batch, lr = res.runs["batch"], res.runs["lr"]
    assert batch["none"]["events"] == [] and len(batch["none"]["losses"]) == 36
    assert [e[0] for e in batch["skip"]["events"]] == [30]  # the corrupted batch's own loss
    assert batch["rollback"]["events"][0][3] == 20 and batch["rollback"]["redone"] == 10
    # the replay after a rollback is deterministic: same parameters as skipping, bit for bit
    assert torch.equal(batch["skip"]["params"], batch["rollback"]["params"])
    assert lr["skip"]["events"][0][0] == 31  # the 100x-lr update's damage shows one update later
    assert lr["rollback"]["events"][0][3] == 30  # back to the checkpoint from before the bad update
    # what the chapter draws: the clean run's row, then cause x run; the verdicts its sentences follow
    rows = spikes.spike_rows(res)
    assert [(r["cause"], r["run"]) for r in rows] == [(None, "clean")] + [
        (c, n) for c in ("batch", "lr") for n in ("none", "skip", "rollback")]
    assert rows[0]["flagged"] is None and rows[2]["flagged"] == "30" and rows[5]["flagged"].startswith("31")
    ob, ol = spikes.outcome(res, "batch"), spikes.outcome(res, "lr")
    assert ob["same_params"] and ob["flagged"] == 30 and ol["flagged"] == 31
    assert ol["best"] == min(("skip", "rollback"), key=lambda a: abs(lr[a]["final"] - res.clean["final"]))
    assert ol["skip_worse"] == (lr["skip"]["final"] > lr["none"]["final"] and len(lr["skip"]["events"]) > 1)
    spikes.spike_chart(res)


# The two "at work" checkpoint writers agree: a process crash cannot leave half a file after os.replace; a
# host crash can lose the rename unless the file and its folder are fsynced.
def test_save_latest_syncs_the_file_and_its_folder_like_save_checkpoint(tmp_path, monkeypatch):
    """A process crash cannot leave half a file after os.replace; a host crash can lose the rename (or the
    bytes) unless the file and its folder are fsynced -- which state.save_checkpoint does, and now save_latest."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.path.realpath(f"/proc/self/fd/{fd}")), real(fd)))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    path = str(tmp_path / "latest.pt")
    restart.save_latest(model, opt, 3, path)
    latest = list(synced)
    synced.clear()
    state.save_checkpoint(str(tmp_path / "full.pt"), model, opt, None, None, None, 3)
    assert latest[0].endswith("latest.pt.tmp") and latest[1] == str(tmp_path)  # the file, then its folder
    assert [os.path.dirname(p) if p.endswith(".tmp") else p for p in latest] == \
           [os.path.dirname(p) if p.endswith(".tmp") else p for p in synced]  # the same two syncs as state's
    assert restart.load_latest(model, opt, path) == 3


def test_the_timeline_never_prints_two_checkpoint_labels_over_each_other():
    """The last save (the run's end, update 16) sat one update above the save at 15: "ckpt 15" and "ckpt 16"
    were drawn over each other (the learner's pass through chapter 11, issue 46's second pass)."""
    assert restart.checkpoint_labels([5, 10, 15, 16]) == ["ckpt 5", "ckpt 10", "", "ckpt 15, 16"]
    assert restart.checkpoint_labels([3, 6, 9]) == ["ckpt 3", "ckpt 6", "ckpt 9"]
