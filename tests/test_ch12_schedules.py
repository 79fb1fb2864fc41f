"""Chapter 12's pipeline schedules: the formulas, the action lists and their replay, and one real run
of torch.distributed.pipelining's schedules on 2 gloo ranks whose gradients must equal one
process's."""
import pytest

from labkit.base.runtime import ConfigError
from labkit.chapters.ch10_parallel import formulas as ch10
from labkit.chapters.ch12_compose import schedules as sch

CASES = [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (4, 16)]


# ---- the formulas -------------------------------------------------------------------------------

def test_bubble_pinned():
    assert sch.bubble(2, 4) == pytest.approx(1 / 5)
    assert sch.bubble(2, 4, v=2) == pytest.approx(1 / 9)
    assert sch.bubble(4, 8, v=4) == pytest.approx(3 / 35)
    assert sch.zero_bubble(2, 4) == pytest.approx(1 / 13)
    # unequal costs: idle (p-1)(f+b-w) over m(f+b+w) + that
    assert sch.zero_bubble(4, 8, f=1, b=2, w=1) == pytest.approx(6 / (32 + 6))


@pytest.mark.parametrize("p, m", CASES)
def test_bubble_with_one_chunk_is_chapter_10s(p, m):
    assert sch.bubble(p, m) == pytest.approx(ch10.bubble_fraction(p, m))
    assert sch.bubble(p, m, v=2) < sch.bubble(p, m)
    assert sch.zero_bubble(p, m) < sch.bubble(p, m)


def test_interleaved_formula_is_the_replay_on_every_case_the_checker_asks():
    # the exercise's cases with v > 1 are those where the formula is the schedule's (m a multiple of p)
    from labkit.check import compose
    for p, m, v in compose.BUBBLE_CASES:
        if v > 1 and p > 1:
            got = sch.replay(sch.interleaved_schedule(p, m, v))["bubble"]
            assert got == pytest.approx(compose.interleaved_bubble_share(p, m, v)), (p, m, v)


def test_interleaved_with_fewer_micro_batches_than_ranks_idles_more_than_the_formula():
    # p = 4, m = 1, v = 2 depth first: one micro-batch crosses all 8 chunks, each rank works 2 of 8
    # forward and 2 of 8 backward slots: 3/4 of the step idle, not the formula's 3/5
    lists = [[("F", k * 4 + r, 0) for k in range(2)] + [("BW", k * 4 + r, 0) for k in (1, 0)]
             for r in range(4)]
    assert sch.replay(lists)["bubble"] == pytest.approx(3 / 4)
    assert 3 / 4 > (4 - 1) / (2 * 1 + 4 - 1)


@pytest.mark.parametrize("call", [
    lambda: sch.bubble(0, 4), lambda: sch.bubble(2, 4, v=0), lambda: sch.bubble(2, 2.5),
    lambda: sch.bubble(2, True), lambda: sch.zero_bubble(4, 2), lambda: sch.zero_bubble(2, 4, w=1.5),
    lambda: sch.zero_bubble(2, 4, f=-1), lambda: sch.interleaved_schedule(2, 3, v=2),
    lambda: sch.bubble(4, 1, v=2), lambda: sch.bubble(2, 3, v=2),  # interleaving: whole rounds of p
    lambda: sch.zb_h1_schedule(0, 4), lambda: sch.replay([]), lambda: sch.replay([[]]),
    lambda: sch.check_schedule([[("F", 0, 0)]], 1)])
def test_bad_input_is_a_config_error(call):
    with pytest.raises(ConfigError):
        call()


# ---- the schedules as data ---------------------------------------------------------------------

def _valid(schedule, m, chunks):
    """Each micro-batch once per chunk and kind, F before its B (or BW) before its W, a chunk on one
    rank -- checked here without check_schedule, so a broken checker cannot pass a broken list."""
    where = {}
    for r, actions in enumerate(schedule):
        for n, (kind, c, i) in enumerate(actions):
            assert (kind, c, i) not in where, (kind, c, i)
            where[kind, c, i] = (r, n)
    for c in range(chunks):
        for i in range(m):
            f = where[("F", c, i)]
            back = where.get(("BW", c, i)) or where[("B", c, i)]
            assert f[0] == back[0] and f[1] < back[1]
            if ("W", c, i) in where:
                assert ("BW", c, i) not in where and where["W", c, i][1] > back[1]
                assert where["W", c, i][0] == back[0]
    assert len(where) == sum(len(a) for a in schedule)


@pytest.mark.parametrize("p, m", CASES)
def test_action_lists_are_valid(p, m):
    _valid(sch.interleaved_schedule(p, m, 1), m, p)
    _valid(sch.interleaved_schedule(p, m, 2), m, 2 * p)
    _valid(sch.zb_h1_schedule(p, m), m, p)
    for make in sch.REPLAYED.values():
        sch.check_schedule(make(p, m), m)


@pytest.mark.parametrize("p, m", [(2, 1), (4, 2), (2, 4), (4, 8)])
def test_one_chunk_per_rank_is_chapter_10s_1f1b(p, m):
    ours = sch.interleaved_schedule(p, m, 1)
    theirs = ch10.one_f_one_b_schedule(p, m)
    assert [[("B" if k == "BW" else k, i) for k, _, i in s] for s in ours] == theirs


@pytest.mark.parametrize("p, m", CASES)
def test_replay_gives_the_formulas_with_equal_costs(p, m):
    assert sch.replay(sch.interleaved_schedule(p, m, 1))["bubble"] == pytest.approx(sch.bubble(p, m))
    assert sch.replay(sch.interleaved_schedule(p, m, 2))["bubble"] == pytest.approx(
        sch.bubble(p, m, 2))
    assert sch.replay(sch.zb_h1_schedule(p, m))["bubble"] == pytest.approx(sch.zero_bubble(p, m))
    # and chapter 10's replay of its own 1F1B: F 1, backward 2
    old = ch10.replay(ch10.one_f_one_b_schedule(p, m), [1] * p, [2] * p)
    assert sch.replay(sch.interleaved_schedule(p, m, 1))["step"] == pytest.approx(old["step_s"])


@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("f, b, w", [(1, 2, 1), (2, 1, 1), (1, 1, 0.5), (3, 2, 2)])
def test_replay_with_unequal_costs(p, m, f, b, w):
    # ZB-H1's formula holds for any costs with W no longer than F or B
    got = sch.replay(sch.zb_h1_schedule(p, m), {"F": f, "B": b, "W": w})["bubble"]
    assert got == pytest.approx(sch.zero_bubble(p, m, f, b, w))
    # 1F1B's share does not depend on how a stage's time splits between forward and backward
    one = sch.replay(sch.interleaved_schedule(p, m, 1), {"F": f, "BW": b + w})["bubble"]
    assert one == pytest.approx(sch.bubble(p, m))


def test_a_long_w_does_not_fit_the_drain():
    with pytest.raises(ConfigError):
        sch.zero_bubble(2, 4, f=1, b=2, w=2)
    got = sch.replay(sch.zb_h1_schedule(2, 4), {"F": 1, "B": 2, "W": 2})["bubble"]
    assert got > (1 * (1 + 2 - 2)) / (4 * 5 + 1)  # more idle than the formula would say


def test_check_schedule_refuses_broken_lists():
    good = sch.zb_h1_schedule(2, 2)
    sch.check_schedule(good, 2)
    missing_w = [[a for a in good[0] if a != ("W", 0, 1)], good[1]]
    b_before_f = [[("B", 0, 0), ("F", 0, 0)] + good[0][2:], good[1]]
    twice = [good[0] + [("F", 0, 0)], good[1]]
    split_chunk = [good[0], good[1] + [("F", 0, 9)]]
    for bad in (missing_w, b_before_f, twice, split_chunk):
        with pytest.raises(ConfigError):
            sch.check_schedule(bad, 2)
    with pytest.raises(ConfigError):  # a deadlock: each rank waits for the other
        sch.replay([[("BW", 0, 0), ("F", 0, 0)], [("F", 1, 0), ("BW", 1, 0)]])


def test_schedules_lab_refuses_bad_input_before_spawning():
    for kwargs in (dict(model="tinyy"), dict(m=0), dict(probe=3), dict(probe=(0,)),
                   dict(repeats=0), dict(timeout_s=-1)):
        with pytest.raises(ConfigError):
            sch.schedules_lab(**kwargs)


# ---- one real run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lab():
    return sch.schedules_lab(model="tiny", m=4, probe=(5,), repeats=2, timeout_s=180)


def test_every_schedule_ran_and_gave_one_process_gradients(lab):
    assert lab["ok"], lab.get("error")
    assert set(lab["runs"]) == set(sch.REAL)
    for run in lab["runs"].values():
        assert run["covered"], run["schedule"]
        assert run["grad_diff"] < 1e-5, (run["schedule"], run["grad_diff"])
        assert 0 <= run["low"] <= run["measured"] <= run["high"] < 1
        assert run["repeats"] == 2


def test_the_interleaved_schedules_refuse_five_micro_batches(lab):
    by = {(a["schedule"], a["m"]): a for a in lab["accepted"]}
    assert not by["ScheduleInterleaved1F1B", 5]["ok"]
    assert not by["ScheduleInterleavedZeroBubble", 5]["ok"]
    assert by["ScheduleZBVZeroBubble", 5]["ok"] and by["Schedule1F1B", 5]["ok"]


def test_torch_order_replays_to_the_formula(lab):
    runs = lab["runs"]
    assert runs["interleaved"]["order"] == sch.interleaved_schedule(2, 4, 2)
    assert runs["interleaved"]["unit"] == pytest.approx(sch.bubble(2, 4, 2))
    assert runs["1f1b"]["unit"] == pytest.approx(sch.bubble(2, 4))
    for name in ("zb", "zbv"):  # W split off: less idle than interleaving alone
        assert any(k == "W" for actions in runs[name]["order"] for k, _, _ in actions)
        assert runs[name]["unit"] < runs["interleaved"]["unit"]
    verdict = sch.against_1f1b(lab)
    assert verdict["verdict"] in ("agree", "disagree", "mixed", "overlap")
    assert verdict["timing"] in ("schedule", "contention", "other")
