"""A verdict as soon as the statistics allow it (#46, chapter 05): the exact interval of tools/ranks.py below
``min_repeats`` runs per arm, ``compare_configs`` stopping at the first pair that settles the verdict, and
``ch05_loader.compare_loops`` holding its budget between loops. Synthetic samples and fake clocks only: no timing
is asserted."""
import random
from itertools import combinations
from math import comb

import pytest

import labkit as lk
from labkit.chapters import ch05_loader as loaderlab
from labkit.tools import compare, ranks, timing
from labkit.tools.compare import verdict


def _noisy(center, n, spread=0.02, seed=0):
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


# ---- the exact interval ----------------------------------------------------------------------------------

def _brute_counts(m, n):
    counts = [0] * (m * n + 1)
    for pos in combinations(range(m + n), n):  # where the b's sit in the sorted order
        below, u = 0, 0
        for i in range(m + n):
            if i in pos:
                below += 1
            else:
                u += below
        counts[u] += 1
    return tuple(counts)


@pytest.mark.parametrize("m,n", [(1, 1), (2, 3), (4, 4), (5, 3), (6, 6)])
def test_null_counts_are_the_mann_whitney_distribution(m, n):
    assert ranks.null_counts(m, n) == _brute_counts(m, n)
    assert sum(ranks.null_counts(m, n)) == comb(m + n, m)


def test_four_runs_per_arm_are_the_fewest_for_a_95_percent_interval():
    assert ranks.fewest_runs() == 4
    assert ranks.ratio_interval([1, 1.1, 0.9], [3, 3.1, 2.9]) is None  # 3 + 3: 90 % at best
    low, high, level = ranks.ratio_interval([1.0, 1.1, 0.9, 1.0], [3.0, 3.1, 2.9, 3.2])
    assert (low, high) == (2.9 / 1.1, 3.2 / 0.9)  # the smallest and largest of the 16 ratios
    assert level == pytest.approx(1 - 2 / 70)
    k, level5 = ranks.depth(5, 5)
    assert k == 3 and level5 >= 0.95  # 5 + 5: the 3rd smallest and 3rd largest of 25 ratios


def test_the_exact_interval_covers_the_true_ratio_at_least_95_percent_of_the_time():
    rng = random.Random(3)
    hits = 0
    for _ in range(1000):
        a = [rng.lognormvariate(0, 0.3) for _ in range(4)]
        b = [2 * rng.lognormvariate(0, 0.3) for _ in range(4)]
        low, high, _ = ranks.ratio_interval(a, b)
        hits += low <= 2 <= high
    assert hits >= 950  # 97.1 % expected; a narrower interval (a bootstrap of 4) falls short of 95 %


# ---- the verdict from fewer than min_repeats -------------------------------------------------------------

def test_four_pairs_far_from_one_give_a_verdict():
    # the learner's case: ratio about 2.97 from 4 pairs, every b/a ratio between 2.8 and 3.2
    a, b = [0.100, 0.102, 0.098, 0.101], [0.297, 0.300, 0.294, 0.299]
    c = verdict(a, b, "step_time_s", min_repeats=5)
    assert c.decided and c.early and c.verdict == "higher" and c.better == "a"
    assert c.method == compare.EXACT_METHOD and (c.low, c.high) == (0.294 / 0.102, 0.300 / 0.098)
    assert c.ratio == pytest.approx(2.97, abs=0.02)
    assert lk.course.outcome(c) == "slower"


def test_four_pairs_inside_the_threshold_band_decide_same():
    a, b = [1.00, 1.01, 0.99, 1.00], [1.01, 1.00, 1.02, 1.00]
    c = verdict(a, b, "step_time_s", min_repeats=5)
    assert c.decided and c.early and c.verdict == "same" and c.better is None
    assert lk.course.outcome(c) == "same"


def test_four_pairs_straddling_the_band_give_no_verdict():
    # every ratio above 1, but the interval reaches below 1.05: a direction, not yet its size
    a, b = [1.00, 1.01, 0.99, 1.00], [1.04, 1.10, 1.08, 1.12]
    c = verdict(a, b, "step_time_s", min_repeats=5)
    assert c.low > 1 and c.low < 1.05 and not c.decided and c.better is None
    assert lk.course.outcome(c) == "few" and "no verdict" in c.sentence


def test_at_min_repeats_the_bootstrap_rule_is_unchanged():
    a, b = _noisy(100, 6), _noisy(200, 6, seed=1)
    c = verdict(a, b, min_repeats=5)
    assert c.method == compare.METHOD and not c.early and c.decided and c.verdict == "higher"
    assert (c.ratio, c.low, c.high) == compare.ratio_interval(a, b)


# ---- compare_configs: stop at the first pair that settles it -----------------------------------------------

class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _quiet_clock(monkeypatch, timed, measured):
    """A fake clock in ``timed``'s ``time.perf_counter`` and a quiet machine for ``measured``'s load check."""
    c = _Clock()
    monkeypatch.setattr(timed.time, "perf_counter", c)
    monkeypatch.setattr(measured, "machine_load", lambda: {"busy": False, "other_cores": 0.0})
    return c


@pytest.fixture
def clock(monkeypatch):
    return _quiet_clock(monkeypatch, compare, compare)


def _runner(clock, values, calls):
    def run_fn(cfg):
        arm = "b" if cfg.accum == 2 else "a"
        calls.append(arm)
        clock.t += 1.0
        return lk.Result(cfg, {"tokens_per_s": values[arm](), "device": "cpu"})
    return run_fn


def test_a_budget_of_four_pairs_gives_a_verdict_when_they_settle_it(clock):
    rng = random.Random(0)
    calls = []
    a = lk.Config(model="tiny", steps=2)
    # 10 s: the warm-up pair and 4 kept pairs of 2 s each; the old rule wanted 5 and gave no verdict
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=10, min_repeats=5, progress=False,
                           run_fn=_runner(clock, {"a": lambda: 100 * rng.uniform(0.98, 1.02),
                                                  "b": lambda: 297 * rng.uniform(0.98, 1.02)}, calls))
    assert len(c.samples_a) == 4 and c.decided and c.verdict == "higher" and c.better == "b"
    assert "no verdict" not in c.sentence


def test_a_settled_comparison_stops_long_before_its_budget(clock):
    calls = []
    rng = random.Random(1)
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=1000, min_repeats=5, progress=False,
                           run_fn=_runner(clock, {"a": lambda: 100 * rng.uniform(0.97, 1.03),
                                                  "b": lambda: 300 * rng.uniform(0.97, 1.03)}, calls))
    assert len(calls) == 2 * (1 + 4) and c.early and c.better == "b"  # warm-up pair + 4 pairs


def test_an_unsettled_comparison_keeps_going(clock):
    calls = []
    rng = random.Random(2)
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=30, min_repeats=5, progress=False,
                           run_fn=_runner(clock, {"a": lambda: rng.uniform(80, 120),
                                                  "b": lambda: rng.uniform(85, 125)}, calls))
    assert len(c.samples_a) > 5 and not c.early


# ---- compare_loops: the budget holds between loops ---------------------------------------------------------

def _fake_loops(clock, seconds, steps, calls):
    def loop(config, threads, updates):
        calls.append((config.workers, threads))
        clock.t += seconds
        return {"threads": threads, "workers": config.workers, "step_time_s": steps[(config.workers, threads)](),
                "data_wait_s": 0.0, "data_wait_frac": 0.0}
    return loop


CASES = {"none": (0, 2), "crowded": (1, 2), "limited": (1, 1)}


@pytest.fixture
def loop_clock(monkeypatch):
    return _quiet_clock(monkeypatch, timing, loaderlab)


def test_compare_loops_never_starts_a_loop_past_its_budget(loop_clock):
    calls = []
    rng = random.Random(4)
    noisy = {k: (lambda: rng.uniform(0.8, 1.2)) for k in CASES.values()}
    loops = loaderlab.compare_loops(lk.Config(model="tiny"), CASES, updates=3, budget_s=25,
                                    loop_fn=_fake_loops(loop_clock, 7.0, noisy, calls), progress=False)
    # 7 s loops, 25 s: three fit (21 s); a fourth would end at 28 s
    assert len(calls) == 3 and loop_clock.t <= 25
    assert {k: len(v) for k, v in loops.samples.items()} == {"none": 1, "crowded": 1, "limited": 1}
    over = loops.compare("none", "crowded")
    assert not over.decided and lk.course.outcome(over) == "few"


def test_compare_loops_turn_rotates_and_stops_once_every_pair_is_settled(loop_clock):
    calls = []
    steps = {(0, 2): lambda: 1.0, (1, 2): lambda: 2.0, (1, 1): lambda: 0.9}
    loops = loaderlab.compare_loops(lk.Config(model="tiny"), CASES, updates=3, budget_s=1000,
                                    loop_fn=_fake_loops(loop_clock, 1.0, steps, calls), progress=False)
    assert calls[:6] == [(0, 2), (1, 2), (1, 1), (1, 2), (1, 1), (0, 2)]  # A B C, then B C A
    assert {len(v) for v in loops.samples.values()} == {4} and len(calls) == 12  # 4 rounds settle it, not 30
    assert loops.compare("none", "crowded").better == "a" and loops.compare("crowded", "limited").better == "b"


def test_in_turn_refuses_what_it_cannot_run():
    with pytest.raises(lk.ConfigError, match="^fns="):
        timing.in_turn({}, budget_s=5, max_repeats=2)
    with pytest.raises(lk.ConfigError, match="^budget_s="):
        timing.in_turn({"a": lambda: 1}, budget_s=float("nan"), max_repeats=2)
    with pytest.raises(lk.ConfigError, match="^pairs="):
        loaderlab.compare_loops(lk.Config(model="tiny"), CASES, updates=3, budget_s=5, pairs=[("none", "nope")],
                                loop_fn=lambda *a, **k: None)


def test_a_case_that_never_ran_is_no_verdict_not_an_unmeasured_metric():
    c = verdict([1.0, 1.1], [], "step_time_s", label_a="ran", label_b="never ran")
    assert not c.decided and c.better is None and lk.course.outcome(c) == "few"
    assert "no verdict" in c.sentence and "not measured" not in c.sentence


def test_startup_comparison_holds_its_budget_and_stops_once_settled(loop_clock):
    calls = []

    def fake_startup(config, workers, persistent, epochs):
        calls.append(persistent)
        loop_clock.t += 1.0
        return [0.5, 0.02 if persistent else 0.4]

    cmp = loaderlab.startup_comparison(lk.Config(model="tiny"), 2, budget_s=1000, startup_fn=fake_startup,
                                       progress=False)
    assert len(calls) == 8 and cmp.decided and cmp.better == "b"  # 4 + 4 settle it, long before 1000 s
    calls.clear()
    short = loaderlab.startup_comparison(lk.Config(model="tiny"), 2, budget_s=5.5, startup_fn=fake_startup,
                                         progress=False)
    assert len(calls) == 5 and not short.decided  # 5 calls of 1 s fit 5.5 s: 3 + 2, too few


# ---- compare_configs: a run starts only if its predicted time fits the budget ---------------------------------

def _timed_runner(clock, seconds, calls, values=None):
    """Runs that take ``seconds[arm]`` on the fake clock and give ``values[arm]`` (a number or a function; 100
    and 300 by default)."""
    values = values or {"a": 100.0, "b": 300.0}

    def run_fn(cfg):
        arm = "b" if cfg.accum == 2 else "a"
        calls.append(arm)
        clock.t += seconds[arm]
        value = values[arm]() if callable(values[arm]) else values[arm]
        return lk.Result(cfg, {"tokens_per_s": value, "device": "cpu"})
    return run_fn


@pytest.mark.parametrize("budget", [3, 4, 5, 7, 8.5, 11, 14])
def test_compare_configs_never_starts_a_run_past_its_budget(clock, budget):
    calls = []
    a = lk.Config(model="tiny", steps=2)
    noisy = iter(_noisy(100, 99, spread=0.5))  # never settles early: the budget is what ends it
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=budget, min_repeats=5, max_repeats=50, progress=False,
                           run_fn=_timed_runner(clock, {"a": 1.0, "b": 2.0}, calls,
                                                {"a": 100.0, "b": lambda: next(noisy)}))
    assert clock.t <= budget  # the old rule ran a warm-up pair and two kept pairs whatever the budget: 9 s
    assert c.samples_a and c.samples_b  # one kept run per arm at least
    assert calls[::2] == ["a"] * len(calls[::2]) and calls[1::2] == ["b"] * len(calls[1::2])  # interleaved


def test_the_warm_up_pair_is_kept_when_no_kept_pair_fits_after_it(clock):
    calls = []
    a = lk.Config(model="tiny", steps=2)
    # a 1 s, b 2 s, budget 5: after the warm-up pair (3 s) a kept pair (3 s) would end at 6 s
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=5, progress=False,
                           run_fn=_timed_runner(clock, {"a": 1.0, "b": 2.0}, calls))
    assert calls == ["a", "b"] and (len(c.samples_a), len(c.samples_b)) == (1, 1) and clock.t == 3
    calls.clear()
    clock.t = 0.0
    # budget 9: the warm-up pair (3 s) and two kept pairs (6 s) fit
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=9, progress=False,
                           run_fn=_timed_runner(clock, {"a": 1.0, "b": 2.0}, calls))
    assert len(calls) == 6 and len(c.samples_a) == 2


def test_a_budget_shorter_than_one_pair_overruns_by_the_floor_only(clock):
    calls = []
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=0.5, warmup_runs=3, progress=False,
                           run_fn=_timed_runner(clock, {"a": 1.0, "b": 1.0}, calls))
    assert calls == ["a", "b"] and (len(c.samples_a), len(c.samples_b)) == (1, 1)  # no warm-up, one run per arm
    assert not c.decided and "no verdict" in c.sentence and "budget" in c.sentence


def test_a_run_slower_than_predicted_stops_the_pair_before_b(clock):
    calls = []
    a = lk.Config(model="tiny", steps=2)
    times = iter([1, 1, 1, 1, 1, 1, 4])  # warm-up pair, two kept pairs, then an a that takes 4 s

    def run_fn(cfg):
        arm = "b" if cfg.accum == 2 else "a"
        calls.append(arm)
        clock.t += next(times)
        return lk.Result(cfg, {"tokens_per_s": 100.0 + len(calls), "device": "cpu"})

    c = lk.compare_configs(a, a.replace(accum=2), budget_s=10, progress=False, run_fn=run_fn)
    assert calls == ["a", "b"] * 3 + ["a"] and clock.t == 10  # b (1 s) would have ended at 11 s
    assert (len(c.samples_a), len(c.samples_b)) == (3, 2) and "3 + 2" in c.sentence


def test_compare_loops_stops_the_cases_whose_verdicts_are_settled(loop_clock):
    calls = []
    rng = random.Random(5)
    # limited is 3x faster than crowded (settles at 4 loops); none and crowded are noise (never settle)
    steps = {(0, 2): lambda: rng.uniform(0.8, 1.2), (1, 2): lambda: rng.uniform(0.8, 1.2),
             (1, 1): lambda: 0.3 * rng.uniform(0.98, 1.02)}
    loops = loaderlab.compare_loops(lk.Config(model="tiny"), CASES, updates=3, budget_s=30,
                                    loop_fn=_fake_loops(loop_clock, 1.0, steps, calls), progress=False)
    counts = {k: len(v) for k, v in loops.samples.items()}
    assert counts["limited"] == 4 and counts["none"] > 4 and counts["crowded"] > 4
    assert len(calls) == 30 and loops.compare("crowded", "limited").better == "b"
    assert not loops.compare("none", "crowded").resolved or not loops.compare("none", "crowded").decided


def test_the_comparison_chart_claims_no_95_percent_interval_that_the_sentence_denies():
    few = verdict([1.0, 1.1], [0.8, 0.85], "step_time_s")  # 2 + 2: no 95 % interval exists (ranks.fewest_runs)
    title = lk.plots.comparison(few).axes[0].get_title()
    assert "no verdict" in title and "95 %" not in title and "2 + 2" in title
    four = verdict([1.0, 1.1, 1.0, 1.0], [0.8, 0.85, 0.8, 0.8], "step_time_s")
    assert four.decided and "95 %" in lk.plots.comparison(four).axes[0].get_title()


def test_in_turn_leaves_finished_cases_out_and_stops_when_none_is_left(loop_clock):
    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    timing.in_turn(fns, budget_s=1000, max_repeats=4, finished=lambda runs: ["a"] if len(runs["a"]) >= 2 else [])
    assert calls.count("a") == 2 and calls.count("b") == calls.count("c") == 4
    calls.clear()
    timing.in_turn(fns, budget_s=1000, max_repeats=50, finished=lambda runs: list(runs))
    assert len(calls) == 3  # one round, then every case is finished
    with pytest.raises(lk.ConfigError, match="^finished="):
        timing.in_turn(fns, budget_s=5, max_repeats=2, finished="a")
