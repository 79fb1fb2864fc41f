"""Chapter 12's layout checker with experts (exercise-12-moe-layout) accepts the reference and
every layout the chapter's model passes, and fails (never raises on) the mistakes learners make,
with a hint that names the mistake."""
import pytest

import labkit as lk
from conftest import assert_family_registered, attempted_and_passed, load_solutions
from labkit.base.runtime import ConfigError
from labkit.chapters.ch12_compose import moelayout as ml
from labkit.check import experts

sol = load_solutions("experts")
check = lk.check.moe_layout_fits


def fails_with(res, *words):
    assert res.attempted and not res.passed and not res.tampered, res
    for w in words:
        assert w in res.message, (w, res.message)


def test_the_checker_is_listed_and_found_by_name():
    assert_family_registered(experts)
    assert experts.__all__ == ["moe_layout_fits"]
    assert experts.MOE_SCENARIO == ml.EXERCISE_SCENARIO


def test_the_reference_and_its_other_forms_pass():
    assert attempted_and_passed(check(sol.my_moe_layout))
    lay = sol.my_moe_layout
    assert attempted_and_passed(check(tuple(lay[k] for k in experts.KEYS)))
    assert attempted_and_passed(check([lay[k] for k in experts.KEYS]))
    assert attempted_and_passed(check({"DP": 4, "tp": 2, "pp": 8, "ep": 8, "zero": 1}))


def test_exactly_the_fitting_layouts_within_the_factor_pass():
    rows = ml.layouts(**{k: v for k, v in ml.EXERCISE_SCENARIO.items() if k != "checkpointing"},
                      checkpointing=("full",))
    best = ml.best_layout(rows)["step_s"]
    good = [r for r in rows if r["fits"] and r["step_s"] <= ml.SLOW_FACTOR * best]
    assert 2 <= len(good) < len(rows) / 10   # a choice to make, not a lottery
    for r in rows[:40]:
        res = check(tuple(r[k] for k in experts.KEYS))
        assert res.passed == (r in good), (ml.name(r), res)


@pytest.mark.parametrize("answer, words", [
    ((2, 2, 8, 4, 1), ["dp × tp × pp = 32", "64 GPUs"]),
    ((4, 16, 1, 8, 1), ["tp = 16", "node"]),
    ((8, 8, 1, 8, 0), ["K/V heads"]),
    ((2, 2, 16, 8, 1), ["does not divide dp × tp = 4", "carved out"]),
    ((4, 2, 8, 3, 1), ["ep = 3 does not divide dp × tp"]),
    ((2, 2, 16, 4, 2), ["ZeRO-2 with pipeline", "ZeRO-1"]),
    ((1, 4, 16, 4, 1), ["nothing to shard"]),
    ((1, 1, 64, 1, 0), ["does not fit", "experts' state overflows", "edp = 1"]),
    ((4, 4, 4, 8, 1), ["does not fit", "experts' state overflows", "edp = 2"]),
    ((64, 1, 1, 64, 0), ["does not fit", "dense state overflows"]),
    ((8, 2, 4, 16, 1), ["1.25×", "EP all-to-alls", "spans nodes", "within a node"]),
    ((16, 4, 1, 64, 1), ["EP all-to-alls", "spans nodes"]),
])
def test_plausible_wrong_layouts_fail_with_the_right_hint(answer, words):
    fails_with(check(answer), *words)


def test_the_experts_and_activation_hints_in_other_scenarios():
    mixtral = dict(model="mixtral-8x7b", gpu="h100-sxm", n_gpus=64, global_batch=256)
    ok, why = experts.check_moe_layout(mixtral, (8, 2, 4, 16, 1))
    assert not ok and "does not divide the 8 experts" in why
    qwen = dict(ml.EXERCISE_SCENARIO, checkpointing="none")
    ok, why = experts.check_moe_layout(qwen, (2, 1, 32, 1, 1))
    assert not ok and "activations overflow" in why


@pytest.mark.parametrize("answer, words", [
    ("x", ["a str", "tuple or a dict"]), ((1, 2, 3), ["five numbers"]),
    ({"dp": 4}, ["exactly dp, tp, pp, ep"]), ((4.5, 2, 8, 8, 1), ["your dp", "whole number"]),
    ((True, 2, 8, 8, 1), ["a bool"]), ((0, 2, 8, 8, 1), ["at least 1"]),
    ((4, 2, 8, 8, 5), ["ZeRO stage"]),
    (object(), ["give (dp, tp, pp, ep, zero_stage)"]),
])
def test_bad_answers_fail_with_a_message_and_never_raise(answer, words):
    fails_with(check(answer), *words)


def test_the_placeholder_is_not_attempted():
    for blank in (None, (None,) * 5, dict(dp=None, tp=None, pp=None, ep=None, zero_stage=None)):
        res = check(blank)
        assert not res.attempted and not res.passed


def test_a_bad_scenario_is_a_config_error():
    with pytest.raises(ConfigError):
        experts.check_moe_layout({"model": "qwen3-235b-a22b"}, (4, 2, 8, 8, 1))
    with pytest.raises(ConfigError):
        experts.check_moe_layout(dict(ml.EXERCISE_SCENARIO, model="qwen3"), (4, 2, 8, 8, 1))


def test_the_hints_name_a_step_part_as_the_layout_model_does():
    from labkit.check.compose import WORDS
    assert {k: WORDS.sentences[f"part-{k}"] for k in ml.PART_NAMES} == ml.PART_NAMES
