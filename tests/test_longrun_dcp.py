"""Chapter 11's distributed checkpoints (labkit.chapters.ch11_longrun.dcp): the round trip bit for bit, resharding
on load both ways (2 -> 1, 1 -> 2) bit for bit, bytes on disk against the state, async_save's checkpoint
against a synchronous one, nothing left behind (processes, folders) -- and bad input refused before any
process starts.

FSDP2 runs in a FRESH Python process (subprocess), as in tests/test_parallel_fsdp.py: in a process that ran
it, later DataLoader-worker forks crashed. That process runs the demo once and the out-of-time case, checks
that nothing outlived either, and hands the results back as a pickle; the tests below read it.
"""
from __future__ import annotations

import textwrap

import pytest

import labkit as lk
from conftest import run_in_fresh_python
from labkit.chapters import ch11_longrun as lr

SCRIPT = textwrap.dedent("""
    import pickle, sys, tempfile
    from labkit.chapters import ch11_longrun as lr
    from labkit.engine.launch import live_children

    if __name__ == "__main__":
        tempfile.tempdir = sys.argv[2]  # the demo's folders go here: the test checks they are gone
        out = {"res": lr.dcp.dcp_demo(model="tiny", micro_batch=2, sizes=("tiny",), updates=2, repeats=2)}
        out["left_after_demo"] = len(live_children())
        out["late"] = lr.dcp.dcp_demo(model="tiny", micro_batch=2, sizes=("tiny",), repeats=2, timeout_s=0.01)
        out["left_after_late"] = len(live_children())
        with open(sys.argv[1], "wb") as f:
            pickle.dump(out, f)
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_in_fresh_python(SCRIPT, tmp_path_factory.mktemp("dcp"))


@pytest.fixture(scope="module")
def res(run):
    assert run["res"]["ok"], run["res"].get("error")
    return run["res"]


def test_round_trip_is_bit_for_bit(res):
    rt = res["round_trip"]
    assert rt["differed_before_load"]  # the fresh model started elsewhere: the load did the work
    assert rt["mismatches_after_load"] == []  # torch.equal on every full parameter and AdamW tensor
    assert rt["next_loss_saved_run"] == rt["next_loss_loaded_run"] and rt["loss_equal"]
    assert rt["mismatches_after_next_update"] == [] and rt["params_equal"]
    assert res["loop"]["equal"] and res["loop"]["folders"] == ["loop-1", "loop-2"]


def test_resharding_on_load_both_ways_is_bit_for_bit(res):
    down, up = res["reshard"]["2->1"], res["reshard"]["1->2"]
    assert down["differed_before"] and down["mismatches"] == [] and down["params_equal"]
    assert up["mismatches"] == [] and up["params_equal"]
    t = res["to_torch_save"]
    assert t["ok"] and t["model_equal"] and t["keys"] == ["model", "optim"] and t["bytes"] > 0


def test_size_on_disk_holds_the_weights_and_adamw(res):
    s = res["sizes"]["tiny"]
    n = sum(p.numel() for p in lk.engine.model.GPT(lk.PRESETS["tiny"]).parameters())
    assert s["n_params"] == n and s["param_bytes"] == 4 * n and s["moment_bytes"] == 8 * n
    assert s["disk_bytes"] >= s["state_bytes"] > s["param_bytes"]
    assert sorted(s["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one file per rank
    assert s["disk_bytes"] == sum(s["files"].values())
    # the tied head is written under its own name too; the optimizer's tensors once each
    assert s["extra_names"] == ["head.weight"] and s["extra_bytes"] == 256 * 64 * 4
    assert s["layout"]["model"] == s["param_bytes"] + s["extra_bytes"]
    assert s["layout"]["optim"] == s["moment_bytes"] + s["step_bytes"]
    assert s["step_bytes"] == 4 * len(list(lk.engine.model.GPT(lk.PRESETS["tiny"]).parameters()))


def test_async_save_writes_what_a_sync_save_writes(res):
    a = res["async"]
    assert a["equals_sync"] and a["mismatches"] == []
    assert a["staged_before_update"]  # the update in flight changed the weights, not the checkpoint


def test_times_are_measured_and_the_contract_fields_exist(res):
    import math

    for key in ("save_s", "load_s", "async_block_s", "async_total_s", "critical_path_share"):
        assert math.isfinite(res[key]) and res[key] > 0, key
    s = res["sizes"]["tiny"]
    assert res["save_s"] == s["save_s"]["median"] and res["async_block_s"] == s["async_block_s"]["median"]
    assert len(s["save_s"]["runs"]) == res["repeats"] == 2  # the warm-up left out
    assert res["critical_path_share"] == res["async_critical_s"] / res["save_s"]
    assert res["block_share"] == res["async_block_s"] / res["save_s"]
    a = res["async"]  # the whole cost: the call's block plus the overlapped updates' slowdown, never below the block
    assert all(c > d >= 0.0 for c, d in zip(a["critical_s"]["runs"], a["slowdown_s"]["runs"]))
    assert all(n >= 1 for n in a["updates_while_writing"])


def test_rows_verdicts_and_chart_come_from_the_measured_values(res):
    """What the chapter draws and which of its sentences the measurement chooses, from the same result."""
    import matplotlib

    matplotlib.use("Agg")
    D = lr.dcp
    assert D.round_trip_verdict(res) == "same"
    sizes = {row["model"]: row for row in D.size_rows(res)}
    s = res["sizes"]["tiny"]
    assert sizes["tiny"]["n_params"] == s["n_params"] and sizes["tiny"]["ratio"] == s["disk_bytes"] / s["state_bytes"]
    assert sizes["tiny"]["files"] == res["world_size"] + 1  # one file per rank + .metadata
    assert sizes["tiny"]["tensor_bytes"] + sizes["tiny"]["metadata_bytes"] < s["disk_bytes"]
    assert [row["saved_by"] for row in D.reshard_rows(res)] == [res["world_size"], 1]
    assert all(row["params_equal"] for row in D.reshard_rows(res))
    times = D.time_rows(res)
    assert [row["model"] for row in times] == ["tiny"] and times[0]["save"] is s["save_s"]
    grew = D.growth(res)
    assert grew["verdict"] == ("fixed" if grew["time_x"] < grew["bytes_x"] / 2 else "bytes")
    ov = D.overlap(res)
    assert ov["share"] == res["critical_path_share"] and ov["kept_pct"] == round(100 * (1 - ov["share"]))
    assert ov["verdict"] == ("nothing_left" if ov["share"] >= 1 else "little_left" if ov["share"] > 0.6 else "left")
    assert D.size_text(2**20) == "1.00 MiB" and D.spread_text({"median": 0.012, "min": 0.01, "max": 0.015}) \
        == "12 ms (10–15)"
    fig = D.async_chart(res)
    assert fig.get_size_inches()[0] <= 8 and fig.get_size_inches()[1] <= 3


def test_nothing_outlives_the_demo_even_out_of_time(run):
    assert run["left_after_demo"] == 0 and run["left_after_late"] == 0
    late = run["late"]
    assert late["ok"] is False and late["error"].startswith("DCP on 2 ranks: no result after"), late
    assert not list(run["store_dir"].glob("labkit-ch11-*"))  # the checkpoints' folder removed both times


@pytest.mark.parametrize("kwargs, field", [
    (dict(model="huge"), "model"), (dict(micro_batch=0), "micro_batch"), (dict(world_size=1), "world_size"),
    (dict(world_size=9), "world_size"), (dict(world_size=2.0), "world_size"), (dict(sizes=()), "sizes"),
    (dict(sizes="tiny"), "sizes"), (dict(sizes=("tiny", "tiny")), "sizes"), (dict(sizes=("tiny", "huge")), "sizes"),
    (dict(model="small", sizes=("tiny",)), "sizes"), (dict(updates=0), "updates"), (dict(repeats=1), "repeats"),
    (dict(seed=-1), "seed"), (dict(timeout_s=0), "timeout_s"), (dict(timeout_s=True), "timeout_s"),
])
def test_bad_input_is_refused_before_any_process(kwargs, field, monkeypatch):
    import labkit.chapters.ch11_longrun.dcp as dcp

    monkeypatch.setattr(dcp, "spawn_ranks", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(lk.ConfigError) as e:
        dcp.dcp_demo(**kwargs)
    assert field in str(e.value)
