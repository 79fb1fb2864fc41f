"""labkit.tools.compare: the verdict's words for a resolved difference below the threshold, speed_jump,
and compare_configs (jumps flagged, arguments checked before the first run, warm-up within the budget,
a short progress line in proper plurals)."""
from __future__ import annotations

import math
import random
import re

import pytest

import labkit as lk
from labkit.tools.compare import Comparison, sentence, speed_jump, verdict


# ---- a resolved difference below the threshold is not "no difference" ------------------------------


def _cmp(ratio, low, high, n=10, **kw):
    c = Comparison(metric="tokens_per_s", ratio=ratio, low=low, high=high, verdict="same", better=None,
                   samples_a=[1.0] * n, samples_b=[ratio] * n, busy=False, sentence="", **kw)
    c.sentence = sentence(c)
    return c


def test_verdict_interval_1_02_to_1_04_reads_a_small_difference():
    text = _cmp(1.03, 1.02, 1.04).sentence
    assert "a difference of about 3 %, below the 5 % threshold this course counts as an effect" in text
    assert "no difference" not in text.lower()
    assert _cmp(1.03, 1.02, 1.04).resolved


def test_verdict_from_samples_three_percent_apart():
    rng = random.Random(0)
    a = [100 * (1 + rng.uniform(-0.002, 0.002)) for _ in range(10)]
    b = [103 * (1 + rng.uniform(-0.002, 0.002)) for _ in range(10)]
    c = verdict(a, b)
    assert c.verdict == "same" and c.better is None and c.low > 1  # no direction claimed, but resolved
    assert "a difference of about 3 %, below the 5 % threshold this course counts as an effect" in c.sentence
    slower = verdict(b, a)
    assert "a difference of about 3 %" in slower.sentence and "gave fewer tokens" in slower.sentence


def test_verdict_straddling_one_keeps_no_difference_measurable():
    text = _cmp(1.01, 0.97, 1.05).sentence
    assert "no difference measurable" in text and "a difference of about" not in text
    assert "about 0.4 %" in _cmp(1.004, 1.001, 1.007).sentence  # a resolved sub-1 % difference is not "0 %"


def test_the_verdict_speaks_the_learners_language_with_the_same_figures(monkeypatch):
    import warnings
    from labkit.base import phrases
    english = [verdict([1.0] * 5, [b] * 5, "step_time_s", busy=True, load={"other_cores": 1.25})
               for b in (1.3, 1.03, 1.0)] + [verdict([1.0] * 3, [1.4] * 2), verdict([], [1.0])]
    monkeypatch.setenv("LABKIT_LANG", "ru")
    monkeypatch.setattr(phrases, "_chosen", [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an English fallback would warn
        russian = [sentence(c) for c in english]
    assert "на 30% больше** времени по часам на обновление" in russian[0] and "лучше «**a**»" in russian[0]
    assert "разница около 3 %, ниже порога в 5 %" in russian[1] and "измеримой разницы" in russian[2]
    assert all("вердикта нет" in r for r in russian[3:]) and "(чередующихся запусков: 0 + 1)" in russian[4]
    for en, ru in zip(english, russian):  # the same figures, whatever the words
        assert re.findall(r"\d+(?:\.\d+)?", en.sentence) == re.findall(r"\d+(?:\.\d+)?", ru)
        assert not re.search(r"[A-Za-z]{4,} [a-z]{3,} [a-z]{3,}", ru.replace("budget_s", ""))


# ---- speed_jump ------------------------------------------------------------------------------------------

def _steps(levels, noise=0.05, seed=0):
    """Synthetic per-update step times: [(seconds, how many updates), ...] with multiplicative noise."""
    rng = random.Random(seed)
    return [s * (1 + rng.uniform(-noise, noise)) for s, k in levels for _ in range(k)]


def test_speed_jump_finds_a_tenfold_fall_at_update_15():
    j = speed_jump(_steps([(1.0, 15), (0.1, 15)]))
    assert j["at"] == 15 and j["ratio"] == pytest.approx(0.1, rel=0.1)
    assert j["before_s"] == pytest.approx(1.0, rel=0.06) and j["after_s"] == pytest.approx(0.1, rel=0.06)


def test_speed_jump_finds_a_rise_and_ignores_noise_spikes_and_drift():
    assert speed_jump(_steps([(0.2, 8), (0.5, 12)]))["at"] == 8
    assert speed_jump(_steps([(1.0, 30)], noise=0.3)) is None       # noisy but level
    spike = _steps([(1.0, 20)])
    spike[7] = 10.0
    assert speed_jump(spike) is None                               # one slow update is not a new level
    assert speed_jump([1.0 + 0.01 * i for i in range(30)]) is None  # a slow 30 % drift is not a jump
    assert speed_jump([1.0, 1.0, 0.1, 0.1]) is None                 # too short to tell
    with pytest.raises(lk.ConfigError):
        speed_jump([1.0, float("nan"), 1.0, 1.0, 1.0, 1.0])


def _jumping_runner(clock, order, jump_in):
    """Fake runs of ``tokens_per_s`` 100/100 whose per-update records jump in the runs listed in jump_in."""
    def run_fn(cfg):
        arm = "b" if cfg.accum == 2 else "a"
        order.append(arm)
        clock.t += 1.0
        levels = [(0.5, 10), (0.05, 10)] if len(order) in jump_in else [(0.5, 20)]
        recs = [{"step_time_s": s} for s in _steps(levels, seed=len(order))]
        return lk.Result(cfg.replace(warmup=1), {"tokens_per_s": 100.0 + len(order) % 2, "device": "cpu"}, recs)
    return run_fn


from test_honest_numbers import clock  # noqa: E402,F401 -- the faked clock (a fixture) compare_configs runs on


def test_compare_configs_flags_a_run_whose_speed_jumped(clock):
    order = []
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=12, progress=False,
                           run_fn=_jumping_runner(clock, order, jump_in={6}))  # run 6 = b's 2nd kept run
    assert [(j["arm"], j["sample"], j["at"]) for j in c.jumps] == [("b", 1, 10)] and c.jumps[0]["ratio"] < 0.2
    assert "changed speed mid-run" in c.sentence and "run 2" in c.sentence and "fell" in c.sentence
    assert "at update 11" in c.sentence  # records[10] is the run's 11th update
    calm = lk.compare_configs(a, a.replace(accum=2), budget_s=12, progress=False,
                              run_fn=_jumping_runner(clock, [], jump_in=set()))
    assert calm.jumps == [] and "mid-run" not in calm.sentence


# ---- compare_configs validates every argument before the first run ------------------------------------

def _never(cfg):
    raise AssertionError("a run started before the arguments were checked")


@pytest.mark.parametrize("kw, field", [
    (dict(budget_s=float("nan")), "budget_s"), (dict(budget_s=0), "budget_s"), (dict(budget_s=-5), "budget_s"),
    (dict(budget_s="abc"), "budget_s"), (dict(budget_s=None), "budget_s"), (dict(budget_s=float("inf")), "budget_s"),
    (dict(budget_s=True), "budget_s"),
    (dict(min_repeats=0), "min_repeats"), (dict(min_repeats=1), "min_repeats"), (dict(min_repeats=2.5), "min_repeats"),
    (dict(max_repeats=0), "max_repeats"), (dict(min_repeats=8, max_repeats=5), "max_repeats"),
    (dict(warmup_runs=50), "warmup_runs"), (dict(warmup_runs=-1), "warmup_runs"),
    (dict(threshold=-1), "threshold"), (dict(threshold=float("nan")), "threshold"), (dict(threshold="5%"), "threshold"),
    (dict(threshold=1.5), "threshold"), (dict(metric="speed"), "metric"), (dict(label_a=3), "label_a"),
    (dict(progress="yes"), "progress"), (dict(run_fn="run"), "run_fn"),
])
def test_compare_configs_refuses_bad_arguments_before_any_run(kw, field):
    a = lk.Config(model="tiny", steps=2)
    kw.setdefault("run_fn", _never)
    with pytest.raises(lk.ConfigError) as e:
        lk.compare_configs(a, a.replace(accum=2), **kw)
    assert e.value.field == field and "\n" not in str(e.value) and "is not allowed" in str(e.value)


def test_compare_configs_warm_up_is_bounded_by_the_budget(clock):
    order = []
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=1, warmup_runs=10, progress=False,
                           run_fn=_jumping_runner(clock, order, jump_in=set()))
    # no warm-up fits, so none is run: one kept run per arm (tests/test_compare_early.py: the budget holds)
    assert len(order) == 2 and len(c.samples_a) == 1


# ---- compare_configs' progress line stays on one line, in proper plurals (chapter 09 in Chromium) ---------

def test_compare_progress_line_is_short_and_says_pairs_in_plurals(clock, monkeypatch):
    from labkit.tools import compare as compare_mod
    from labkit.base.frontend import Progress

    bars = []

    class Recording(Progress):
        def __init__(self, total, label, **kw):
            super().__init__(total, label, delay=math.inf)  # silent: the test reads the lines it would draw
            self.lines = []
            bars.append(self)

        def update(self, done, note=""):
            super().update(done, note)
            self.lines.append(self.text())

    monkeypatch.setattr(compare_mod, "Progress", Recording)
    a = lk.Config(model="tiny", steps=2)
    lk.compare_configs(a, a.replace(accum=2), budget_s=30, min_repeats=4, label_a="baseline (fp32 mb=8 K=1)",
                       label_b="the grid's best that fits", run_fn=_jumping_runner(clock, [], jump_in=set()))
    lines = bars[0].lines
    assert any("· 1 pair kept," in s for s in lines) and any("· 2 pairs kept," in s for s in lines)
    assert all("(s)" not in s and len(s) <= 80 for s in lines), max(lines, key=len)
