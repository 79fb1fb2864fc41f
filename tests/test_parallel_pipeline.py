"""labkit.chapters.ch10_parallel's pipeline: the schedules as data (pure), the replay, argument checks before any
process, and ONE real two-stage run (both schedules): loss and every gradient equal to one process's tied
GPT, a bubble computed from the timestamps, 1F1B's saved activations below GPipe's, torch's own pipelining
giving the same loss, and no process left afterwards. No timing comparisons."""
from __future__ import annotations

import math

import pytest

from labkit.base import compat
from labkit.base.runtime import ConfigError
from labkit.chapters import ch10_parallel as par
from labkit.chapters.ch10_parallel import pipeline as pl
from labkit.engine.launch import live_children

SHAPES = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 16)]


# ---- the schedules (pure) ---------------------------------------------------------------------------------

def _check_actions(actions, m):
    assert sorted(actions) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])  # each once
    for i in range(m):
        assert actions.index(("F", i)) < actions.index(("B", i))  # a micro-batch's forward before its backward


@pytest.mark.parametrize("p, m", SHAPES)
def test_gpipe_runs_every_forward_then_every_backward(p, m):
    sched = par.gpipe_schedule(p, m)
    assert len(sched) == p
    for actions in sched:
        _check_actions(actions, m)
        assert [k for k, _ in actions] == ["F"] * m + ["B"] * m
    assert par.in_flight(sched) == [m] * p


@pytest.mark.parametrize("p, m", SHAPES)
def test_one_f_one_b_warms_up_then_alternates(p, m):
    sched = par.one_f_one_b_schedule(p, m)
    for stage, actions in enumerate(sched):
        _check_actions(actions, m)
        kinds = "".join(k for k, _ in actions)
        warmup = min(p - stage - 1, m)  # Megatron-LM's: with m < p the warm-up is cut to the m there are
        assert kinds == "F" * warmup + "FB" * (m - warmup) + "B" * warmup
        assert [i for k, i in actions if k == "B"] == list(range(m))  # backwards in micro-batch order
    assert par.in_flight(sched) == [min(p - s, m) for s in range(p)]  # stage s holds at most p - s


def test_one_f_one_b_with_fewer_micro_batches_than_stages():
    # p = 4, m = 2: stages 0 and 1 forward both first (GPipe's order), stage 3 alternates at once
    assert par.one_f_one_b_schedule(4, 2)[0] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert par.one_f_one_b_schedule(4, 2)[3] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    for bad in (0, 2.5, True, "4"):
        with pytest.raises(ConfigError):
            par.gpipe_schedule(2, bad)
    with pytest.raises(ConfigError):
        par.schedule_for("interleaved", 2, 4)


def test_in_flight_counts_a_hand_written_schedule():
    assert par.in_flight([[("F", 0), ("B", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 2)]]) == [2]


@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 8), (3, 5), (8, 16), (4, 2), (8, 3)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("f, b", [(1.0, 1.0), (1.0, 2.0), (0.3, 1.1)])
def test_replay_with_equal_stages_gives_the_formula(p, m, name, f, b):
    rep = par.replay(par.schedule_for(name, p, m), [f] * p, [b] * p)
    assert math.isclose(rep["step_s"], (m + p - 1) * (f + b))
    assert math.isclose(rep["bubble"], par.bubble_fraction(p, m))
    assert all(math.isclose(x, par.bubble_fraction(p, m)) for x in rep["stage_bubble"])


def test_replay_with_a_slower_last_stage_idles_the_others_more():
    rep = par.replay(par.gpipe_schedule(2, 4), [1.0, 2.0], [2.0, 4.0])
    assert rep["stage_bubble"][0] > rep["stage_bubble"][1] > 0
    assert rep["bubble"] > par.bubble_fraction(2, 4)


def test_stage_blocks_cover_every_block_once():
    for n, p in [(2, 2), (4, 2), (4, 4), (12, 5), (24, 8)]:
        blocks = par.stage_blocks(n, p)
        assert [i for r in blocks for i in r] == list(range(n))
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    with pytest.raises(ConfigError, match="stages"):
        par.stage_blocks(2, 4)


def test_bubble_from_logs_is_idle_over_the_step():
    logs = [[("F", 0, 0.0, 0.0, 1.0), ("B", 0, 1.0, 4.0, 6.0)], [("F", 0, 0.0, 1.0, 2.0), ("B", 0, 2.0, 2.0, 4.0)]]
    out = par.formulas.bubble_from_logs(logs)
    assert out["step_s"] == 6.0
    assert [s["busy_s"] for s in out["stages"]] == [3.0, 3.0]
    assert [s["wait_s"] for s in out["stages"]] == [3.0, 1.0]
    assert out["bubble"] == 0.5


# ---- argument checks: before any process ----------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(model="huge"), "model"), (dict(stages=1), "stages"), (dict(stages=4), "stages"),  # tiny: 2 blocks
    (dict(micro_batches=()), "micro_batches"), (dict(micro_batches=4), "micro_batches"),
    (dict(micro_batches=(2, 0)), "micro_batches"), (dict(schedule="zb"), "schedule"),
    (dict(schedule="1f1b", micro_batches=(1,)), "micro_batches"), (dict(micro_batch=0), "micro_batch"),
    (dict(repeats=0), "repeats"), (dict(timeout_s=-1), "timeout_s"), (dict(check="yes"), "check"),
])
def test_bad_input_is_refused_before_any_process(kwargs, field):
    before = {p.pid for p in live_children()}
    with pytest.raises(ConfigError, match=field):
        par.pipeline_demo(**kwargs)
    assert {p.pid for p in live_children()} <= before


# ---- one real run -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo():
    before = {p.pid for p in live_children()}
    out = par.pipeline_demo(model="tiny", stages=2, micro_batches=(1, 4), schedule="both", micro_batch=2,
                            repeats=2, check=True, torch_api=True, timeout_s=120)
    from conftest import wait_no_children
    left = [p for p in wait_no_children() if p.pid not in before]
    assert not left, f"processes outlived the run: {[(p.pid, p.name()) for p in left]}"
    return out


def test_the_run_has_every_requested_schedule(demo):
    assert demo["ok"], demo.get("error")
    assert [(r["schedule"], r["m"]) for r in demo["runs"]] == [("gpipe", 1), ("gpipe", 4), ("1f1b", 4)]
    assert demo["skipped"] == [dict(schedule="1f1b", m=1, why="torch's Schedule1F1B needs m >= p = 2")]


def test_loss_and_gradients_equal_one_process(demo):
    for run in demo["runs"]:
        assert abs(run["loss"] - run["loss_single"]) < 1e-5, run["schedule"]
        assert run["grads_covered"], "every parameter of the tied GPT, the embedding included, was compared"
        assert run["max_grad_diff"] < 1e-5, (run["schedule"], run["m"], run["max_grad_diff"])


def test_bubble_comes_from_the_timestamps(demo):
    for run in demo["runs"]:
        tl = run["timeline"]
        acts = [a for stage in tl["actions"] for a in stage]
        step = max(a[4] for a in acts) - min(a[2] for a in acts)
        assert math.isclose(step, tl["step_s"]) and step > 0
        for s, stage in enumerate(tl["actions"]):
            assert len(stage) == 2 * run["m"]  # every action of the schedule has its timestamps
            assert all(t0 <= t1 <= t2 for _, _, t0, t1, t2 in stage)
            busy = sum(t2 - t1 for _, _, _, t1, t2 in stage)
            assert math.isclose(run["stage_bubble"][s], (step - busy) / step)
        assert 0 < run["bubble"] < 1 and math.isfinite(run["bubble"])
        assert run["formula"] == par.bubble_fraction(2, run["m"])
        assert 0 < run["replayed"]["bubble"] < 1


def test_one_f_one_b_saves_fewer_activation_bytes_than_gpipe(demo):
    g, o = pl.find_run(demo, "gpipe", 4), pl.find_run(demo, "1f1b", 4)
    assert o["saved_peak_bytes"][0] < g["saved_peak_bytes"][0]  # bytes, counted: deterministic
    assert o["saved_peak_bytes"][1] < g["saved_peak_bytes"][1]
    assert g["in_flight"] == [4, 4] and o["in_flight"] == [2, 1]
    # GPipe holds 4 micro-batches at its peak, 1F1B 2 on stage 0: about twice the bytes
    assert 1.6 < g["saved_peak_bytes"][0] / o["saved_peak_bytes"][0] < 2.4


def test_torch_pipelining_gives_the_same_loss(demo):
    if not compat.has("pipelining on gloo"):  # torch 2.9: not tried, and the note says why
        assert demo["torch_pipelining"] is None and "2.10" in demo["torch_pipelining_why"]
        assert pl.torch_pipelining_rows(demo) == []
        return
    api = demo["torch_pipelining"]
    assert [r["diff"] < 1e-5 for r in pl.torch_pipelining_rows(demo)] == [True, True]
    for name in ("gpipe", "1f1b"):
        assert api[name]["ok"], api[name].get("error")
        assert api[name]["m"] == 4  # the smallest m >= p the demo ran
        assert abs(api[name]["loss"] - pl.find_run(demo, name, 4)["loss"]) < 1e-5


def test_rows_and_charts_come_from_the_run(demo):
    import matplotlib

    matplotlib.use("Agg")
    rows = pl.bubble_rows(demo, "gpipe")
    assert [r["m"] for r in rows] == [r["m"] for r in sorted(
        (r for r in demo["runs"] if r["schedule"] == "gpipe"), key=lambda r: r["m"])]
    assert rows[-1]["measured"] == pl.find_run(demo, "gpipe", 4)["bubble"] and rows[-1]["m"] == 4
    assert demo["p2p_s"] > 0 and math.isfinite(demo["p2p_s"])  # the ping-pong ran between the stages
    t = pl.timing(demo, "gpipe")
    assert t["verdict"] in ("schedule", "contention", "other") and t["latency_ms"] == demo["p2p_s"] * 1e3
    value, source, _ = pl.bubble_to_grade(demo, "gpipe", 4)
    assert source in ("measured", "computed") and 0 < value < 1
    mem = pl.memory_rows(demo)
    assert mem[0]["gpipe_bytes"] == pl.find_run(demo, "gpipe", mem[0]["m"])["saved_peak_bytes"][0]
    fig = pl.plot_pipeline(demo, "1f1b", 4)
    w, h = fig.get_size_inches()
    assert w <= 8 and h <= 3
    assert len(fig.axes[0].patches) == 2 * 2 * 4  # a box per action per stage
    fig = pl.plot_bubble(demo)
    assert fig.get_size_inches()[0] <= 8
    with pytest.raises(ConfigError):
        pl.plot_pipeline(demo, "gpipe", 3)


# ---- the notes' logic, on synthetic results (no timing) ---------------------------------------------------

def _run(schedule, m, step_s, replay_step_s, cost=(1.0, 1.0), bubble=0.5, replay_bubble=0.2):
    return dict(schedule=schedule, m=m, p=2, bubble=bubble, stage_bubble=[bubble, bubble], bubble_median=bubble,
                replayed=dict(bubble=replay_bubble, step_s=replay_step_s, stage_bubble=[replay_bubble] * 2),
                formula=par.bubble_fraction(2, m), step_s=step_s, forward_s=[c / 3 for c in cost],
                backward_s=[2 * c / 3 for c in cost], repeats=3)


def _result(runs, load=0.5, cores=2, p2p_s=1e-4):
    return dict(ok=True, stages=2, micro_batch=4, device="cpu", runs=runs, load=load, cores=cores, p2p_s=p2p_s)


def test_a_measured_step_twice_the_replay_is_called_contention_and_graded_against_the_replay():
    res = _result([_run("gpipe", 1, 0.0098, 0.0095, bubble=0.52, replay_bubble=0.5),
                   _run("gpipe", 4, 0.100, 0.050, bubble=0.67, replay_bubble=0.26)], load=2.6, p2p_s=2e-3)
    t = pl.timing(res, "gpipe")
    assert t["verdict"] == "contention" and t["above"] == [4] and t["within"] == [1]
    assert (t["worst_m"], t["step_ms"], t["replayed_ms"], t["ratio"]) == (4, 100, 50, 2)
    assert t["n_messages"] == 8 and t["messages_ms"] == pytest.approx(16) and t["excess_ms"] == pytest.approx(50)
    assert t["messages"] == "part" and t["messages_share"] == pytest.approx(0.32)
    value, source, ratio = pl.bubble_to_grade(res, "gpipe", 4)
    assert (value, source, ratio) == (0.26, "computed", 2)
    assert pl.bubble_to_grade(res, "gpipe", 1)[:2] == (0.52, "measured")


def test_a_measured_step_close_to_the_replay_confirms_the_schedule():
    res = _result([_run("gpipe", m, 0.0104 * m, 0.010 * m, bubble=0.21, replay_bubble=0.2) for m in (2, 4)])
    t = pl.timing(res, "gpipe")
    assert t["verdict"] == "schedule" and t["messages"] == "no_excess"
    assert pl.bubble_to_grade(res, "gpipe", 4)[:2] == (0.21, "measured")


def test_the_stage_balance_has_one_verdict_for_both_schedules():
    def both(costs_g, costs_o):
        return _result([_run("gpipe", 2, 0.01, 0.01, cost=c) for c in costs_g]
                       + [_run("1f1b", 2, 0.01, 0.01, cost=c) for c in costs_o])
    flip = both([(5.3e-3, 7.4e-3)], [(6.5e-3, 5.9e-3)])  # the slower stage changes between the runs
    assert pl.stage_costs(flip)["verdict"] == "noise"
    steady = both([(5.3e-3, 7.4e-3)] * 2, [(5.9e-3, 7.0e-3)])
    c = pl.stage_costs(steady)
    assert c["verdict"] == "last_slowest" and (c["slowest"], c["wins"], c["runs"]) == (1, 3, 3)
    mostly = both([(5.3e-3, 7.4e-3)] * 3, [(5.9e-3, 6.5e-3)] * 2 + [(6.6e-3, 6.5e-3)])  # one flip in 6
    assert pl.stage_costs(mostly)["verdict"] == "last_slowest"
    first = both([(7.4e-3, 5.3e-3)] * 3, [(7.0e-3, 5.9e-3)])  # the first stage the slow one
    assert pl.stage_costs(first)["verdict"] == "unequal" and pl.stage_costs(first)["slowest"] == 0
    even = both([(6.0e-3, 6.3e-3)], [(6.3e-3, 6.0e-3)])
    assert pl.stage_costs(even)["verdict"] == "equal"


def test_an_excess_on_an_idle_machine_is_not_called_contention():
    res = _result([_run("gpipe", 8, 0.080, 0.060)], load=0.3, p2p_s=1e-3)
    t = pl.timing(res, "gpipe")
    assert t["verdict"] == "other" and t["messages"] == "part" and t["messages_share"] == pytest.approx(0.8)
    assert pl.bubble_to_grade(res, "gpipe", 8)[1] == "computed"
    res = _result([_run("gpipe", 8, 0.070, 0.060)], load=0.3, p2p_s=1e-3)  # 16 messages > the 10 ms excess
    assert pl.timing(res, "gpipe")["messages"] == "explain"
