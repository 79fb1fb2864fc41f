"""Every chapter 12 checker accepts the reference solution and its other right forms, and fails (never raises
on) the mistakes learners make, with a hint that names the mistake. The layout checker with experts
(exercise-12-moe-layout) also passes every layout the chapter's model passes."""
import collections
import fractions
import math

import numpy as np
import pytest
import torch

import labkit as lk
from conftest import assert_family_registered, attempted_and_passed, fails_with, load_solutions
from labkit.base.runtime import ConfigError
from labkit.chapters.ch12_compose import moelayout as ml
from labkit.check import compose

sol = load_solutions("compose")
moe_sol = load_solutions("experts")
moe_check = lk.check.moe_layout_fits
FUNCTIONS = ["sp_collectives", "expert_capacity", "interleaved_bubble"]  # the checkers of a function
passes = attempted_and_passed


def test_every_checker_is_listed_and_found_by_name():
    assert_family_registered(compose)
    assert compose.__all__ == FUNCTIONS + ["moe_layout_fits"]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_placeholders_are_not_attempted(name):
    for placeholder in (None, ...):
        res = getattr(lk.check, name)(placeholder)
        assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_function_whose_body_is_still_ellipsis_is_not_attempted(name):
    def todo(*args):
        ...  # the notebook's placeholder body

    res = getattr(lk.check, name)(todo)
    assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("name", FUNCTIONS)
def test_garbage_and_crashing_answers_fail_with_a_message(name):
    def boom(*args):
        raise ValueError("oops")

    for bad in (42, "nonsense", boom, {1, 2}, lambda *a: "12", lambda *a: [1, 2], lambda *a: float("nan"),
                lambda *a: {"all_reduce": "4"}, lambda *a: True, lambda *a: 1 / 0):
        res = getattr(lk.check, name)(bad)
        assert res.attempted and not res.passed and not res.tampered and res.message, (bad, res)


def test_the_learners_function_runs_on_every_case():
    seen = []

    def spy(*args):
        seen.append(args)
        return sol.my_interleaved_bubble(*args)

    assert passes(lk.check.interleaved_bubble(spy))
    assert seen == compose.BUBBLE_CASES


# ---- exercise-12-sp-collectives -------------------------------------------------------------------------

def test_sp_collectives_the_cells_dict_still_blank_is_not_attempted():
    res = lk.check.sp_collectives(lambda n, sp: {"all_reduce": ..., "all_gather": ..., "reduce_scatter": ...})
    assert not res.passed and not res.attempted, res
    half = lk.check.sp_collectives(lambda n, sp: {"all_reduce": 4 * n, "all_gather": ..., "reduce_scatter": ...})
    assert half.attempted and not half.passed and "'all_gather'" in half.message, half


def test_sp_collectives_reference_is_chapter_12s_formula():
    assert sol.my_sp_collectives(2, False) == {"all_reduce": 8, "all_gather": 0, "reduce_scatter": 0}
    assert sol.my_sp_collectives(2, True) == {"all_reduce": 0, "all_gather": 8, "reduce_scatter": 8}
    for n, sp in compose.SP_CASES:
        assert sol.my_sp_collectives(n, sp) == compose.sp_counts(n, sp)


def test_sp_collectives_accepts_the_solution_and_other_right_forms():
    assert passes(lk.check.sp_collectives(sol.my_sp_collectives))
    for right in (
            lambda n, sp: {k: np.int64(v) for k, v in sol.my_sp_collectives(n, sp).items()},
            lambda n, sp: {k: float(v) for k, v in sol.my_sp_collectives(n, sp).items()},
            lambda n, sp: {k: torch.tensor(v) for k, v in sol.my_sp_collectives(n, sp).items()},
            lambda n, sp: {k: fractions.Fraction(v) for k, v in sol.my_sp_collectives(n, sp).items()},
            lambda n, sp: collections.Counter(sol.my_sp_collectives(n, sp)),
            lambda n, sp: {"AllReduce": 0 if sp else 4 * n, "all-gather": 4 * n if sp else 0,
                           "Reduce_Scatter": 4 * n if sp else 0},                  # other spellings of the kinds
            lambda n, sp: {**sol.my_sp_collectives(n, sp), "all_to_all": 0, "broadcast": 0},  # extra kinds at 0
            lambda layers, seq: dict(zip(compose.KINDS, (0, 4 * layers, 4 * layers) if seq else (4 * layers, 0, 0)))):
        assert passes(lk.check.sp_collectives(right)), right


def counts(ar, ag, rs, ar_sp=None, ag_no=0, rs_no=0, per=lambda n: n):
    """A learner's function giving (ar, 0, 0)·n without SP (plus ag_no, rs_no) and (ar_sp, ag, rs)·n with it."""
    def fn(n, sp):
        if sp:
            return {"all_reduce": (ar_sp or 0) * per(n), "all_gather": ag * per(n), "reduce_scatter": rs * per(n)}
        return {"all_reduce": ar * per(n), "all_gather": ag_no * per(n), "reduce_scatter": rs_no * per(n)}
    return fn


@pytest.mark.parametrize("wrong, words", [
    (counts(2, 2, 2), ["one pass", "attention only, or the MLP only"]),             # forward only, or one region
    (counts(4, 2, 2), ["forward only", "AllGather's backward is a ReduceScatter"]),  # SP: forgot the backward
    (counts(2, 4, 4), ["without sequence parallelism you counted the forward only"]),
    (counts(4, 0, 0, ar_sp=4), ["still counted AllReduces"]),                        # AllReduce counted under SP
    (counts(4, 4, 4, ar_sp=4), ["kept the AllReduces and added"]),
    (counts(4, 2, 2, ar_sp=2), ["kept the backward's AllReduces"]),
    (counts(4, 4, 4, ag_no=4, rs_no=4), ["plain TP has only the AllReduces"]),
    (counts(0, 4, 4, ag_no=4, rs_no=4), ["whatever sequence_parallel is"]),
    (counts(4, 8, 0), ["only AllGathers"]),
    (counts(4, 0, 8), ["only ReduceScatters"]),
    (counts(4, 4, 0), ["AllGathers only"]),
    (counts(4, 0, 4), ["ReduceScatters only"]),
    (counts(4, 6, 4), ["Megatron's extra AllGather"]),
    (counts(6, 6, 6), ["recomputation"]),
    (counts(6, 4, 4), ["recomputation"]),
    (counts(8, 8, 8), ["twice as many"]),
    (counts(4, 4, 4, per=lambda n: 1), ["ONE block", "n_layer"]),                     # per block, not n_layer
    (counts(4, 4, 4, per=lambda n: n + 1), ["n_layer + 1"]),
    (counts(4, 4, 4, per=lambda n: 2), ["not it", "two TP regions"]),                # no named mistake
])
def test_sp_collectives_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.sp_collectives(wrong), *words)


def test_sp_collectives_names_a_mistake_made_for_some_layer_counts_only():
    def one_layer_special(n, sp):
        return sol.my_sp_collectives(n, sp) if n > 1 else {"all_reduce": 2, "all_gather": 0, "reduce_scatter": 0}

    fails_with(lk.check.sp_collectives(one_layer_special), "my_sp_collectives(1, False)", "one pass")


@pytest.mark.parametrize("wrong, words", [
    (lambda n, sp: (4 * n, 0, 0), ["return a dict", "all_reduce"]),
    (lambda n, sp: {"all_reduce": 4 * n}, ["give all three", "all_gather, reduce_scatter missing"]),
    (lambda n, sp: {**sol.my_sp_collectives(n, sp), "all_to_all": 2}, ["'all_to_all'", "count those three"]),
    (lambda n, sp: {**sol.my_sp_collectives(n, sp), "allreduce": 0}, ["two keys for all_reduce"]),
    (lambda n, sp: {k: v / 3 for k, v in sol.my_sp_collectives(n, sp).items()}, ["whole number"]),
    (lambda n, sp: {k: -v for k, v in sol.my_sp_collectives(n, sp).items()}, ["whole number, 0 or more"]),
    (lambda n, sp: None if sp else sol.my_sp_collectives(n, sp), ["returned None", "True"]),
])
def test_sp_collectives_refuses_a_malformed_answer_with_a_hint(wrong, words):
    fails_with(lk.check.sp_collectives(wrong), *words)


# ---- exercise-12-capacity -------------------------------------------------------------------------------

def test_capacity_cases_tell_ceil_from_floor_and_round_and_include_whole_shares():
    exact = [fractions.Fraction(c).limit_denominator(1000) * t * k / e for t, e, k, c in compose.CAPACITY_CASES]
    assert any(x.denominator == 1 for x in exact)                     # floor = ceil there (a +1 shows)
    assert any(x.denominator > 1 and x % 1 < fractions.Fraction(1, 2) for x in exact)   # round != ceil
    assert any(k == 1 for _, _, k, _ in compose.CAPACITY_CASES) and any(k > 2 for _, _, k, _ in compose.CAPACITY_CASES)
    assert sol.my_expert_capacity(4096, 8, 2, 1.25) == 1280 and sol.my_expert_capacity(1, 8, 2, 1.25) == 1
    for case in compose.CAPACITY_CASES:
        assert sol.my_expert_capacity(*case) == compose.capacity_slots(*case)


def test_capacity_accepts_the_solution_and_other_right_forms():
    assert passes(lk.check.expert_capacity(sol.my_expert_capacity))
    for right in (lambda t, e, k, c: -(-t * k * c // e),                                 # ceil by floor division
                  lambda t, e, k, c: math.ceil(t / e * k * c),                          # another order
                  lambda t, e, k, c: np.ceil(np.float32(c) * t * k / e),               # a numpy float32
                  lambda t, e, k, c: np.int64(math.ceil(c * t * k / e)),
                  lambda t, e, k, c: torch.tensor(c * t * k / e).ceil(),
                  lambda t, e, k, c: float(math.ceil(fractions.Fraction(c) * t * k / e)),
                  lambda tokens, experts, k, factor: math.ceil(factor * tokens * k / experts)):
        assert passes(lk.check.expert_capacity(right)), right


@pytest.mark.parametrize("wrong, words", [
    (lambda t, e, k, c: math.floor(c * t * k / e), ["rounded down", "math.ceil"]),
    (lambda t, e, k, c: int(c * t * k / e), ["rounded down"]),
    (lambda t, e, k, c: c * t * k // e, ["rounded down"]),
    (lambda t, e, k, c: round(c * t * k / e), ["nearest"]),
    (lambda t, e, k, c: int(c * t * k / e) + 1, ["added 1"]),
    (lambda t, e, k, c: math.ceil(c * t / e), ["left out top_k"]),                   # tokens, not tokens · top_k
    (lambda t, e, k, c: math.ceil(c * t / e / k), ["divided by top_k"]),
    (lambda t, e, k, c: math.ceil(t * k / e), ["left out the capacity factor"]),
    (lambda t, e, k, c: math.ceil(t * k / e / c), ["divided by the capacity factor"]),
    (lambda t, e, k, c: math.ceil(c * t * k), ["all the experts together"]),
    (lambda t, e, k, c: math.ceil(c * t / e) * k, ["rounded up before multiplying by top_k"]),
    (lambda t, e, k, c: math.ceil(t * k / e) * c, ["rounded up before the capacity factor"]),
    (lambda t, e, k, c: c * t * k / e, ["did not round"]),
    (lambda t, e, k, c: math.ceil(c * t * k / e) * e, ["all the experts together"]),
    (lambda t, e, k, c: math.ceil(c * t * k / e) + 1, ["added 1"]),          # one too many where whole
    (lambda t, e, k, c: math.ceil(c * t * k / e) + 2, ["not it"]),                    # no named mistake
    (lambda t, e, k, c: c * t * k / e + 0.1, ["whole number"]),
])
def test_capacity_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.expert_capacity(wrong), *words)


# ---- exercise-12-interleaved-bubble ---------------------------------------------------------------------

def test_bubble_cases_cover_one_stage_one_chunk_one_micro_batch():
    cases = set(compose.BUBBLE_CASES)
    assert any(p == 1 for p, m, v in cases) and any(v == 1 and p > 1 for p, m, v in cases)
    assert any(m == 1 and p > 1 for p, m, v in cases) and any(m < p for p, m, v in cases)
    assert sol.my_interleaved_bubble(1, 8, 2) == 0 and sol.my_interleaved_bubble(4, 8, 1) == 3 / 11
    assert sol.my_interleaved_bubble(4, 8, 2) == 3 / 19
    for case in compose.BUBBLE_CASES:
        assert sol.my_interleaved_bubble(*case) == compose.interleaved_bubble_share(*case)


def test_interleaved_bubble_is_chapter_10s_at_one_chunk():
    from labkit.chapters.ch10_parallel import formulas
    for p, m, v in compose.BUBBLE_CASES:
        if v == 1:
            assert math.isclose(compose.interleaved_bubble_share(p, m, 1), formulas.bubble_fraction(p, m))


def test_interleaved_bubble_accepts_the_solution_and_other_right_forms():
    assert passes(lk.check.interleaved_bubble(sol.my_interleaved_bubble))
    for right in (lambda p, m, v: 1 - v * m / (v * m + p - 1),                       # one minus the busy share
                  lambda p, m, v: fractions.Fraction(p - 1, v * m + p - 1),
                  lambda p, m, v: np.float32(p - 1) / np.float32(v * m + p - 1),
                  lambda p, m, v: torch.tensor((p - 1) / (v * m + p - 1)),
                  lambda p, m, v: ((p - 1) / v) / (m + (p - 1) / v),                   # in units of a whole stage
                  lambda stages, micro, chunks: (stages - 1) / (chunks * micro + stages - 1)):
        assert passes(lk.check.interleaved_bubble(right)), right


@pytest.mark.parametrize("wrong, words", [
    (lambda p, m, v: (p - 1) / (m + p - 1), ["chapter 10's bubble", "left out v"]),   # forgot v (m + p − 1)
    (lambda p, m, v: (p - 1) / (v * (m + p - 1)), ["divided by v", "v·m + p − 1"]),
    (lambda p, m, v: (p - 1) / (m + v * (p - 1)), ["v multiplied the p − 1 in the denominator"]),
    (lambda p, m, v: (p - 1) / (v * m), ["Megatron-LM", "ideal"]),                   # ideal-relative
    (lambda p, m, v: (p - 1) / m, ["ideal-relative", "without v"]),
    (lambda p, m, v: v * (p - 1) / (v * m + p - 1), ["multiplied the idle time"]),
    (lambda p, m, v: (p - 1) / (v * m + p), ["not v·m + p"]),
    (lambda p, m, v: p / (v * m + p - 1), ["p − 1 chunk slots", "not p"]),
    (lambda p, m, v: v * m / (v * m + p - 1), ["BUSY share"]),
    (lambda p, m, v: 100 * (p - 1) / (v * m + p - 1), ["percentage"]),
    (lambda p, m, v: (p - 1) // (v * m + p - 1), ["integer division"]),
    (lambda p, m, v: (p - 1) / (2 * v * m + p - 1), ["not it", "chunk slots"]),      # no named mistake
])
def test_interleaved_bubble_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.interleaved_bubble(wrong), *words)


def test_interleaved_bubble_fails_a_formula_right_only_for_some_cases():
    def right_but_one_stage(p, m, v):
        return (p - 1) / (v * m + p - 1) if p > 1 else 1 / (p - 1)

    fails_with(lk.check.interleaved_bubble(right_but_one_stage), "ZeroDivisionError")

    def forgot_v_only_when_two(p, m, v):
        return (p - 1) / ((v if v != 2 else 1) * m + p - 1)

    fails_with(lk.check.interleaved_bubble(forgot_v_only_when_two), "my_interleaved_bubble(4, 8, 2)", "left out v")


# ---- the room's instruments count with the same formulas (once they are written) --------------------------

def test_the_rooms_instruments_agree_with_the_checkers_formulas():
    from labkit.chapters.ch12_compose import moe, schedules
    if not hasattr(moe, "capacity") or not hasattr(schedules, "bubble"):
        pytest.skip("moe.capacity / schedules.bubble are not in this branch yet (the moe and schedules helpers')")
    for case in compose.CAPACITY_CASES:
        assert moe.capacity(*case) == compose.capacity_slots(*case), case
    for p, m, v in compose.BUBBLE_CASES:
        assert math.isclose(schedules.bubble(p, m, v), compose.interleaved_bubble_share(p, m, v)), (p, m, v)


def test_the_2d_formula_agrees_with_the_checkers():
    mesh2d = pytest.importorskip("labkit.whatif.layouts",
                                 reason="labkit.whatif.layouts (block_collectives) is not "
                                 "in this branch yet (the twod helper's)")
    for n, sp in compose.SP_CASES:
        assert mesh2d.block_collectives(n, sp) == compose.sp_counts(n, sp), (n, sp)


# ---- exercise-12-moe-layout ---------------------------------------------------------------------------

def test_the_checker_is_listed_and_found_by_name():
    assert_family_registered(compose)
    assert compose.__all__[-1:] == ["moe_layout_fits"]
    assert compose.MOE_SCENARIO == ml.EXERCISE_SCENARIO


def test_the_reference_and_its_other_forms_pass():
    assert attempted_and_passed(moe_check(moe_sol.my_moe_layout))
    lay = moe_sol.my_moe_layout
    assert attempted_and_passed(moe_check(tuple(lay[k] for k in compose.KEYS)))
    assert attempted_and_passed(moe_check([lay[k] for k in compose.KEYS]))
    assert attempted_and_passed(moe_check({"DP": 4, "tp": 2, "pp": 8, "ep": 8, "zero": 1}))


def test_exactly_the_fitting_layouts_within_the_factor_pass():
    rows = ml.layouts(**{k: v for k, v in ml.EXERCISE_SCENARIO.items() if k != "checkpointing"},
                      checkpointing=("full",))
    best = ml.best_layout(rows)["step_s"]
    good = [r for r in rows if r["fits"] and r["step_s"] <= ml.SLOW_FACTOR * best]
    assert 2 <= len(good) < len(rows) / 10   # a choice to make, not a lottery
    for r in rows[:40]:
        res = moe_check(tuple(r[k] for k in compose.KEYS))
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
    fails_with(moe_check(answer), *words)


def test_the_experts_and_activation_hints_in_other_scenarios():
    mixtral = dict(model="mixtral-8x7b", gpu="h100-sxm", n_gpus=64, global_batch=256)
    ok, why = compose.check_moe_layout(mixtral, (8, 2, 4, 16, 1))
    assert not ok and "does not divide the 8 experts" in why
    qwen = dict(ml.EXERCISE_SCENARIO, checkpointing="none")
    ok, why = compose.check_moe_layout(qwen, (2, 1, 32, 1, 1))
    assert not ok and "activations overflow" in why


@pytest.mark.parametrize("answer, words", [
    ("x", ["a str", "tuple or a dict"]), ((1, 2, 3), ["five numbers"]),
    ({"dp": 4}, ["exactly dp, tp, pp, ep"]), ((4.5, 2, 8, 8, 1), ["your dp", "whole number"]),
    ((True, 2, 8, 8, 1), ["a bool"]), ((0, 2, 8, 8, 1), ["at least 1"]),
    ((4, 2, 8, 8, 5), ["ZeRO stage"]),
    (object(), ["give (dp, tp, pp, ep, zero_stage)"]),
])
def test_bad_answers_fail_with_a_message_and_never_raise(answer, words):
    fails_with(moe_check(answer), *words)


def test_the_placeholder_is_not_attempted():
    for blank in (None, (None,) * 5, dict(dp=None, tp=None, pp=None, ep=None, zero_stage=None)):
        res = moe_check(blank)
        assert not res.attempted and not res.passed


def test_a_bad_scenario_is_a_config_error():
    with pytest.raises(ConfigError):
        compose.check_moe_layout({"model": "qwen3-235b-a22b"}, (4, 2, 8, 8, 1))
    with pytest.raises(ConfigError):
        compose.check_moe_layout(dict(ml.EXERCISE_SCENARIO, model="qwen3"), (4, 2, 8, 8, 1))


def test_the_hints_name_a_step_part_as_the_layout_model_does():
    assert {k: compose.WORDS.sentences[f"part-{k}"] for k in ml.PART_NAMES} == ml.PART_NAMES
