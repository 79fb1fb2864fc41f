"""Chapter 10's FSDP2 lab (labkit.chapters.ch10_parallel.fsdp): bytes per rank against ZeRO-3's arithmetic,
AllGather counts against the unit structure, clipping with sharded norms against one process, accumulation's
ReduceScatter counts and parameters -- and bad input refused before any process starts.

FSDP2 runs in a FRESH Python process (subprocess): in a process that ran it, later DataLoader-worker forks
crashed. That process runs the lab once (its ranks spawned by the launcher) and the out-of-time case, checks
that nothing outlived either, and hands the results back as a pickle; the tests below read it.
"""
from __future__ import annotations

import textwrap

import pytest

import labkit as lk
from conftest import run_in_fresh_python
from labkit.chapters import ch10_parallel as par

SCRIPT = textwrap.dedent("""
    import pickle, sys, tempfile
    from labkit.chapters import ch10_parallel as par
    from labkit.engine.launch import live_children

    if __name__ == "__main__":
        out = {"lab": par.fsdp_lab(model="tiny", world_sizes=(2, 3), micro_batch=2, steps=2, accumulation=3)}
        out["left_after_lab"] = len(live_children())
        tempfile.tempdir = sys.argv[2]
        out["late"] = par.fsdp_lab(model="tiny", world_sizes=(2,), micro_batch=2, steps=1, timeout_s=0.01)
        out["left_after_late"] = len(live_children())
        with open(sys.argv[1], "wb") as f:
            pickle.dump(out, f)
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_in_fresh_python(SCRIPT, tmp_path_factory.mktemp("fsdp2"))


@pytest.fixture(scope="module")
def lab(run):
    assert run["lab"]["ok"], run["lab"].get("error")
    return run["lab"]


def test_bytes_per_rank_are_zero3s_fp32_arithmetic(lab):
    two, three = lab["memory"][2], lab["memory"][3]
    n = two["n_params"]
    assert n == sum(p.numel() for p in lk.engine.model.GPT(lk.PRESETS["tiny"]).parameters())
    for r in two["ranks"]:  # the tiny GPT's first dimensions are all even: no padding, exactly N / 2 each
        assert r == {"params": 2 * n, "grads": 2 * n, "optimizer": 4 * n, "total": 8 * n}
        assert r["total"] == two["formula_fp32"]["total"] == two["formula_mixed"]["total"]
    assert two["formula_mixed"]["params"] == n  # the other accounting: bf16 weights, 2 bytes each over 2 ranks
    assert not two["uneven"]


def test_uneven_shards_hold_whole_rows_and_average_to_the_formula(lab):
    three = lab["memory"][3]  # 64 or 256 rows do not divide by 3: ceil(rows / 3) on the first ranks
    assert three["uneven"]
    assert three["ranks"][0] == {**three["padded_shard_bytes"], "total": sum(three["padded_shard_bytes"].values())}
    assert three["ranks"][-1]["total"] < three["formula_fp32"]["total"] < three["ranks"][0]["total"]
    for k in ("params", "grads", "optimizer", "total"):
        assert sum(r[k] for r in three["ranks"]) == 3 * three["formula_fp32"][k]
    assert par.fsdp.memory_verdict(lab) == "uneven"
    assert [r["total"] for r in par.fsdp.memory_rows(lab) if r["world_size"] == 3] == [three["ranks"][0]["total"]]


def test_allgather_counts_follow_the_unit_structure(lab):
    L = lab["n_blocks"]
    t, f = lab["reshard"][True], lab["reshard"][False]
    assert (t["allgather"], f["allgather"]) == (2 * L + 1, L + 1)
    assert (t["allgather"], f["allgather"]) == (par.expected_calls(L, True)["allgather"],
                                                par.expected_calls(L, False)["allgather"])
    assert lab["reshard_counts_all_ranks"] == {True: [2 * L + 1] * 2, False: [L + 1] * 2, "root": [2 * L + 2] * 2}
    assert t["reducescatter"] == f["reducescatter"] == L + 1
    # False keeps every unit gathered until its backward: the whole model at the end of the forward
    assert f["held_after_forward"] == f["full_param_bytes"] > t["held_after_forward"] > 0
    assert t["held_after_backward"] == f["held_after_backward"] == 0
    # the forward's peak with True: the root (kept gathered) + one block
    block = sum(p.numel() for p in lk.engine.model.GPT(lk.PRESETS["tiny"]).blocks[0].parameters()) * 4
    assert t["forward_peak"] == t["held_after_forward"] + block


def test_the_root_resharded_too_gathers_once_more(lab):
    L, root, t = lab["n_blocks"], lab["reshard_root"], lab["reshard"][True]
    assert root["allgather"] == 2 * L + 2 == par.expected_calls(L, True, root_reshard_after_forward=True)["allgather"]
    assert root["held_after_forward"] == 0 < t["held_after_forward"]  # nothing gathered between forward and backward
    assert root["reducescatter"] == L + 1
    rows = par.fsdp.reshard_rows(lab)
    assert [(r["allgather"], r["expected"]) for r in rows] == [(2 * L + 1,) * 2, (L + 1,) * 2, (2 * L + 2,) * 2]


def test_the_counter_wraps_what_this_torch_calls(lab):
    import torch.distributed as dist

    names = par.CollectiveCounter.wrapped_names()
    assert names["allgather"] and names["reducescatter"]
    for c in ("allgather", "reducescatter"):  # counted through a name this torch has, once per call
        assert lab["reshard"][True][f"{c}_functions"] and set(lab["reshard"][True][f"{c}_functions"]) <= set(names[c])
    assert hasattr(dist, lab["reshard"][True]["allgather_functions"][0])
    assert lab["torch"] == __import__("torch").__version__


def test_an_alias_calling_the_other_name_is_counted_once(monkeypatch):
    import torch
    import torch.distributed as dist

    seen = []

    def new(output_tensor, input_tensor, group=None, async_op=False):
        seen.append("new")

    def old(output_tensor, input_tensor, group=None, async_op=False):  # a deprecated alias, as in torch 2.13
        return dist.all_gather_single(output_tensor, input_tensor, group, async_op)

    monkeypatch.setattr(dist, "all_gather_single", new, raising=False)
    monkeypatch.setattr(dist, "all_gather_into_tensor", old, raising=False)
    counter = par.CollectiveCounter()
    with counter.counting():
        dist.all_gather_into_tensor(torch.zeros(8), torch.zeros(4))
        dist.all_gather_single(torch.zeros(6), torch.zeros(3))
    assert seen == ["new", "new"]
    snap = counter.snapshot()
    assert snap["allgather"] == 2 and snap["allgather_bytes"] == (8 + 6) * 4
    assert snap["allgather_functions"] == ["all_gather_into_tensor", "all_gather_single"]
    assert dist.all_gather_single is new and dist.all_gather_into_tensor is old  # unwrapped afterwards


def test_counting_nothing_where_calls_are_expected_fails_the_lab(lab):
    import copy

    assert par.counter_problem(lab) is None
    broken = copy.deepcopy(lab)
    broken["reshard"][True]["allgather"] = 0
    reason = par.counter_problem(broken)
    assert reason.startswith("the collectives counter counted 0 allgather calls in the reshard_after_forward=True")
    assert f"expects {2 * lab['n_blocks'] + 1}" in reason


def test_wire_bytes_are_the_ring_share_of_the_buffer(lab):
    assert par.ring_bytes_per_rank(1000, 2) == 500 and par.ring_bytes_per_rank(1000, 4) == 750
    assert par.ring_bytes_per_rank(1000, 1) == 0
    t = lab["reshard"][True]
    first = par.fsdp.reshard_rows(lab)[0]
    assert (first["gathered"], first["sent"]) == (t["allgather_bytes"], t["allgather_bytes"] / 2)
    accum = par.fsdp.accum_rows(lab)
    assert [r["sent"] for r in accum] == [r["reduced"] / 2 for r in accum]
    with pytest.raises(lk.ConfigError):
        par.ring_bytes_per_rank(1000, 0)


def test_bf16_gathers_half_the_bytes_and_reduces_in_fp32(lab):
    p, t = lab["precision"], lab["reshard"][True]
    assert p["allgather"] == t["allgather"] and p["allgather_dtypes"] == ["bfloat16"]
    assert p["allgather_bytes"] * 2 == t["allgather_bytes"]
    assert p["reducescatter_dtypes"] == ["float32"] and p["reducescatter_bytes"] == t["reducescatter_bytes"]
    # FSDP2 keeps fp32 shards (the master copy): the rank's model state is the fp32 run's
    assert p["param_dtypes"] == p["grad_dtypes"] == ["float32"]
    assert p["params"] + p["grads"] + p["optimizer"] == lab["memory"][2]["ranks"][0]["total"]


def test_clipping_with_sharded_norms_is_the_unsharded_models(lab):
    c = lab["clip"]
    assert c["clipped"], "max_norm must be below the norms, or nothing was clipped"
    assert c["norms"] == pytest.approx(c["reference_norms"], rel=1e-5)
    assert c["max_param_diff"] < 1e-4


def test_accumulation_reduce_scatters_once_per_unit_without_sync(lab):
    L, k, a = lab["n_blocks"], lab["accumulation"], lab["accum"]
    assert a["sync_every"]["calls_each_update"] == [k * (L + 1)] * lab["steps"]
    assert a["no_sync"]["calls_each_update"] == [L + 1] * lab["steps"]
    assert a["sync_every"]["allgather"] == a["no_sync"]["allgather"] == k * (2 * L + 1)
    full = lab["reshard"][True]["full_param_bytes"]  # fp32 gradients are as big as the fp32 weights
    assert a["no_sync"]["grad_bytes_between"] == full
    assert a["sync_every"]["grad_bytes_between"] == full // 2
    assert a["max_param_diff_between"] < 1e-4
    assert a["no_sync"]["max_param_diff_vs_reference"] < 1e-4


def test_rows_verdicts_and_charts_come_from_the_measured_values(lab):
    L = lab["n_blocks"]
    assert par.fsdp.calls_verdict(lab) == "agree"
    calls = par.fsdp.calls_rows(lab)
    assert [r["counted"] for r in calls] == [2 * L + 1, L + 1, 2 * L + 2, lab["accumulation"] * (L + 1), L + 1]
    mem = {r["world_size"]: r for r in par.fsdp.memory_rows(lab)}
    assert mem[2]["total"] == lab["memory"][2]["ranks"][0]["total"]
    fp32, bf16 = par.fsdp.precision_rows(lab)
    assert bf16["allgather_bytes"] * 2 == fp32["allgather_bytes"] and bf16["kept"] == fp32["kept"]
    every, last = par.fsdp.accum_rows(lab)
    assert last["reducescatter"] < every["reducescatter"] and last["held_between"] > every["held_between"]
    clip = par.fsdp.clip_figures(lab)
    assert clip["worst_relative"] < 1e-5 and len(clip["rows"]) == lab["steps"]
    for chart in (par.fsdp_memory_chart, par.fsdp_calls_chart):
        fig = chart(lab)
        assert fig.get_size_inches()[0] <= 8 and fig.get_size_inches()[1] <= 3.5


# the counts chapter 10 shows for the tiny GPT on 2 ranks, accumulation 4: enough to draw the calls chart
CALLS = {"n_blocks": 2, "accumulation": 4, "detail_world_size": 2,
         "reshard": {True: {"allgather": 5}, False: {"allgather": 3}}, "reshard_root": {"allgather": 6},
         "accum": {"sync_every": {"reducescatter": 12}, "no_sync": {"reducescatter": 3}}}


def test_the_calls_charts_labels_do_not_overlap():
    """Issue 46: the five settings' names ran into each other under vertical bars. Drawn, no two tick labels'
    boxes overlap, every setting is named, and the names stay inside the figure."""
    fig = par.fsdp_calls_chart(CALLS)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    ticks = [t for t in ax.get_yticklabels() + ax.get_xticklabels() if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in ticks]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    names = [(t.get_text(), b) for t, b in zip(ticks, boxes) if " per " in t.get_text()]
    assert len(names) == 5
    width, height = fig.get_size_inches() * fig.dpi
    assert all(b.x0 >= 0 and b.y0 >= 0 and b.x1 <= width and b.y1 <= height for _, b in names)
    assert par.fsdp.calls_verdict(CALLS) == "agree"
    assert par.fsdp.calls_verdict({**CALLS, "reshard_root": {"allgather": 5}}) == "differ"


def test_nothing_outlives_the_lab_even_out_of_time(run):
    assert run["left_after_lab"] == 0 and run["left_after_late"] == 0
    late = run["late"]
    assert late["ok"] is False and late["error"].startswith("FSDP2 lab (world size 2): no result after"), late
    assert not list(run["store_dir"].glob("labkit-fsdp2-*"))


def test_expected_calls_arithmetic():
    assert par.expected_calls(4, True) == {"allgather": 9, "reducescatter": 5}
    assert par.expected_calls(4, False, micro_batches=3) == {"allgather": 15, "reducescatter": 15}
    assert par.expected_calls(4, True, micro_batches=3, sync_every_micro_batch=False)["reducescatter"] == 5
    assert par.expected_calls(4, world_size=1) == {"allgather": 0, "reducescatter": 0}
    assert par.expected_calls(4, True, root_reshard_after_forward=True)["allgather"] == 10  # 2L + 2
    assert par.expected_calls(4, False, root_reshard_after_forward=True)["allgather"] == 6  # L + 2


@pytest.mark.parametrize("kwargs, field", [
    (dict(model="huge"), "model"), (dict(world_sizes=()), "world_sizes"), (dict(world_sizes=(2, 2)), "world_sizes"),
    (dict(world_sizes=(2, 9)), "world_sizes"), (dict(world_sizes=(1, 2.5)), "world_sizes"),
    (dict(micro_batch=0), "micro_batch"), (dict(steps=True), "steps"), (dict(timeout_s=0), "timeout_s"),
    (dict(accumulation=1), "accumulation"), (dict(max_norm=float("nan")), "max_norm"),
    (dict(world_sizes=(1,), detail_world_size=1), "detail_world_size"),
    (dict(world_sizes=(1, 4)), "detail_world_size"),
])
def test_bad_input_is_refused_before_any_process(kwargs, field, monkeypatch):
    from labkit.tools import collectives

    monkeypatch.setattr(collectives, "spawn_ranks", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(lk.ConfigError) as e:
        par.fsdp_lab(**kwargs)
    assert field in str(e.value)
