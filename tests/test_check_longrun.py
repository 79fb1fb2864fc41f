"""Every chapter 11 checker accepts the reference solution and its other right forms, and fails (never raises
on) the mistakes learners make, with a hint that names the mistake."""
import math

import pytest

import labkit as lk
from conftest import assert_family_registered, attempted_and_passed, load_solutions
from labkit.check import longrun

sol = load_solutions("longrun")
passes = attempted_and_passed


def fails_with(res, *words):
    assert res.attempted and not res.passed and not res.tampered, res
    for w in words:
        assert w in res.message, (w, res.message)


def test_every_checker_is_listed_and_found_by_name():
    assert_family_registered(longrun)
    assert longrun.__all__ == ["resume_needs", "young_daly", "lost_work", "inexact_resume"]


def test_the_items_are_the_chapters_own():
    from labkit.chapters.ch11_longrun import state
    assert longrun.ITEMS == tuple(state.ITEMS)


@pytest.mark.parametrize("name", longrun.__all__)
def test_placeholders_are_not_attempted(name):
    for placeholder in (None, ...):
        res = getattr(lk.check, name)(placeholder)
        assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("name", ["resume_needs", "young_daly", "lost_work"])
def test_a_function_whose_body_is_still_ellipsis_is_not_attempted(name):
    def todo(*args):
        ...

    res = getattr(lk.check, name)(todo)
    assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("name", longrun.__all__)
def test_garbage_and_crashing_answers_fail_with_a_message(name):
    def boom(*args):
        raise ValueError("oops")

    for bad in (42, "nonsense", boom, [1, 2], lambda *a: "12", lambda *a: [1, 2], lambda *a: float("nan")):
        res = getattr(lk.check, name)(bad)
        assert res.attempted and not res.passed and res.message, (bad, res)


# ---- exercise-11-resume-needs ------------------------------------------------------------------------

def test_resume_needs_accepts_the_solution_and_other_forms():
    assert passes(lk.check.resume_needs(sol.my_resume_needs))
    as_list = lambda s: sorted(sol.my_resume_needs(s))  # noqa: E731
    as_upper_tuple = lambda s: tuple(i.upper() for i in sol.my_resume_needs(s))  # noqa: E731
    as_frozen = lambda s: frozenset(sol.my_resume_needs(s))  # noqa: E731
    for fn in (as_list, as_upper_tuple, as_frozen):
        assert passes(lk.check.resume_needs(fn))


def test_resume_needs_cases_cover_every_item_both_ways():
    for item in longrun.ITEMS:
        ins = [item in longrun.needed(s) for s in longrun.RESUME_CASES]
        if item in ("model", "loader"):
            assert all(ins)
        else:
            assert any(ins) and not all(ins), item


def drop(item, when=lambda s: True):
    return lambda s: sol.my_resume_needs(s) - ({item} if when(s) else set())


def add(item, when=lambda s: True):
    return lambda s: sol.my_resume_needs(s) | ({item} if when(s) else set())


@pytest.mark.parametrize("wrong, words", [
    (drop("loader"), ["'loader'", "first batch again"]),
    (drop("loader", lambda s: not s["shuffle"]), ["'loader'", "fixed order too"]),
    (drop("rng"), ["'rng'", "dropout"]),
    (drop("scaler"), ["'scaler'", "65,536"]),
    (add("scaler"), ["'scaler'", "no loss scaling"]),
    (add("rng"), ["'rng'", "dropout 0"]),
    (drop("scheduler"), ["'scheduler'", "warm-up starts again"]),
    (add("scheduler"), ["'scheduler'", "constant learning rate"]),
    (drop("optimizer"), ["'optimizer'", "moments"]),
    (drop("optimizer", lambda s: s["optimizer"] == "sgd"), ["'optimizer'", "param_groups"]),
    (drop("optimizer", lambda s: s["optimizer"] == "sgd-momentum"), ["'optimizer'", "momentum buffers"]),
    (add("optimizer"), ["'optimizer'", "keeps no state"]),
    (lambda s: set(longrun.ITEMS), ["save everything", "smallest set"]),
    (lambda s: {"model", "optimizer"}, ["lacks"]),
    (lambda s: {"model", "optimizer", "scheduler", "scaler", "rng"} if s["shuffle"] else sol.my_resume_needs(s),
     ["'loader'"]),
])
def test_resume_needs_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.resume_needs(wrong), *words)


def test_resume_needs_names_an_unknown_item_with_a_did_you_mean():
    fails_with(lk.check.resume_needs(lambda s: sol.my_resume_needs(s) | {"schedular"}), "did you mean 'scheduler'")
    fails_with(lk.check.resume_needs(lambda s: "model"), "return a set of item names")


def test_resume_needs_names_a_set_up_that_returns_nothing():
    fails_with(lk.check.resume_needs(lambda s: None if s["precision"] == "fp16" else sol.my_resume_needs(s)),
               "returned None", "fp16")


# ---- exercise-11-young-daly --------------------------------------------------------------------------

def test_young_daly_accepts_the_solution_and_other_forms():
    from labkit.chapters.ch11_longrun import spikes as interval
    assert passes(lk.check.young_daly(sol.my_interval))
    res = lk.check.young_daly(interval.daly)  # Daly's higher-order estimate: also right, said so
    assert passes(res) and "Daly's higher-order" in res.message
    assert passes(lk.check.young_daly(lambda c, m: (2 * c * m) ** 0.5))
    assert passes(lk.check.young_daly(lambda c, m: math.hypot(0, math.sqrt(2) * math.sqrt(c) * math.sqrt(m))))


@pytest.mark.parametrize("wrong, words", [
    (lambda c, m: math.sqrt(c * m), ["left out the 2"]),
    (lambda c, m: 2 * c * m, ["square root"]),
    (lambda c, m: math.sqrt(2 * c / m), ["multiplies, it does not divide"]),
    (lambda c, m: math.sqrt(2 * c * m) / 60, ["minutes"]),
    (lambda c, m: math.sqrt(2 * c * m) / 3600, ["hours"]),
    (lambda c, m: math.sqrt(2 * c * m) - c, ["subtracted the save time"]),
    (lambda c, m: m / 2, ["half the MTBF"]),
    (lambda c, m: 600.0, ["not it"]),
])
def test_young_daly_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.young_daly(wrong), *words)


# ---- exercise-11-lost-work ---------------------------------------------------------------------------

def test_lost_work_accepts_the_solution_and_other_forms():
    assert passes(lk.check.lost_work(sol.my_lost_work))
    assert passes(lk.check.lost_work(lambda f, i, r: f - i * math.floor(f / i) + r))
    assert passes(lk.check.lost_work(lambda f, i, r: r + (f - (f // i) * i)))


def test_lost_work_cases_include_a_failure_before_the_first_checkpoint_and_none_at_a_save():
    assert any(f < i for f, i, r in longrun.LOST_CASES)
    assert not any(f % i == 0 for f, i, r in longrun.LOST_CASES)  # "before or after that save?" has no answer


@pytest.mark.parametrize("wrong, words", [
    (lambda f, i, r: f % i, ["left out the restart"]),
    (lambda f, i, r: i / 2 + r, ["EXPECTED"]),
    (lambda f, i, r: f + r, ["from the run's start"]),
    (lambda f, i, r: i - f % i + r, ["NEXT checkpoint"]),
    (lambda f, i, r: i + r, ["whole interval"]),
    (lambda f, i, r: (f % i + r) / 60, ["minutes"]),
    (lambda f, i, r: f % i + r + 1, ["not it"]),
])
def test_lost_work_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.lost_work(wrong), *words)


# ---- exercise-11-inexact-resume ----------------------------------------------------------------------

def test_inexact_resume_accepts_the_solution_in_any_spelling():
    assert passes(lk.check.inexact_resume(sol.my_missing))
    assert passes(lk.check.inexact_resume({k.lower(): v.upper() + " " for k, v in sol.my_missing.items()}))


def test_inexact_resume_half_filled_is_told_what_is_open_and_wrong_is_told_which_log():
    fails_with(lk.check.inexact_resume({"A": "loader", "B": None}), "C, D, E are still open")
    swapped = dict(sol.my_missing, C="optimizer", D="scheduler")
    fails_with(lk.check.inexact_resume(swapped), "log C is not 'optimizer'", "2 of 5")
    fails_with(lk.check.inexact_resume(dict(sol.my_missing, A="model")), "log A is not 'model'")
    fails_with(lk.check.inexact_resume(dict(sol.my_missing, F="rng")), "the key")
    fails_with(lk.check.inexact_resume(dict(sol.my_missing, A="sampler")), "the items are")
    assert not lk.check.inexact_resume({"A": None}).attempted


# ---- the hints in Russian (issue #51): chapters 09-12's typical wrong answers -----------------------------------
# {checker: the typical wrong answer of its exercise (labkit/content/templates/wrong-answers.md)}
TYPICAL_WRONG = {
    "resume_needs": lambda setup: set(longrun.ITEMS),
    "inexact_resume": {"A": "rng", "B": "loader", "C": "scheduler", "D": "optimizer", "E": "scaler"},
    "young_daly": lambda save_s, mtbf_s: (save_s * mtbf_s) ** 0.5,
    "lost_work": lambda fail_at_s, interval_s, restart_s: fail_at_s % interval_s,
    "tp_allreduces": lambda n_layer, micro_batches, qkv: 2 * n_layer * micro_batches,
    "bubble": lambda p, m: (p - 1) / m,
    "layout_bytes": lambda n_params, dp, tp, pp, zero_stage: 16 * n_params / (dp * tp * pp),
    "layout_fits": dict(dp=64, tp=1, pp=1, zero_stage=3),
    "sp_collectives": lambda n_layer, sequence_parallel: {"all_reduce": 4 * n_layer, "all_gather": 0,
                                                          "reduce_scatter": 0},
    "expert_capacity": lambda tokens, n_experts, top_k, capacity_factor: int(capacity_factor * tokens * top_k
                                                                             / n_experts),
    "interleaved_bubble": lambda p, m, v: (p - 1) / (m + p - 1),
    "moe_layout_fits": dict(dp=8, tp=2, pp=4, ep=16, zero_stage=1),
    "pareto_front": lambda points: [p for i, p in enumerate(sorted(points, key=lambda q: (q[0], -q[1])))
                                    if i == 0 or p[1] > sorted(points, key=lambda q: (q[0], -q[1]))[i - 1][1]],
    "zero_bytes_per_gpu": lambda n_params, n_gpus, stage: 16 * n_params / n_gpus if stage else 16 * n_params,
    "smallest_fix": "zero3",
}


@pytest.mark.parametrize("name", sorted(TYPICAL_WRONG))
def test_a_typical_wrong_answer_gets_its_hint_in_russian(name, monkeypatch):
    import re
    import warnings
    from labkit.base import phrases
    monkeypatch.setenv("LABKIT_LANG", "en")  # restored after the test, as _chosen: English again
    monkeypatch.setattr(phrases, "_chosen", [])
    monkeypatch.setattr(phrases, "_said", set())
    english = getattr(lk.check, name)(TYPICAL_WRONG[name])
    phrases.choose_language("ru")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an English fallback would warn
        res = getattr(lk.check, name)(TYPICAL_WRONG[name])
    assert res.attempted and not res.passed and not res.tampered, res
    assert not english.passed and english.message != res.message
    assert re.search("[а-яё]", res.message) and not re.search(r"[A-Za-z]+ [a-z]+ [a-z]+ [a-z]+ [a-z]+", res.message), \
        res.message
