"""Every chapter 10 checker accepts the reference solution and its other right forms, and fails (never
raises on) the mistakes learners make, with a hint that names the mistake.

``layout_fits`` asks the chapter's layout model (``labkit.check.parallel.check_layout``) whether a
layout fits. This file also holds an independent reference for that judgement (``reference_fits``: the
model-state bytes of ``formulas.layout_state_bytes`` plus an activation estimate stated below), so that the
two can be set against each other once the layout model is there; the tests that need it skip until then.
"""
import fractions
import itertools

import numpy as np
import pytest
import torch

import labkit as lk
from conftest import assert_family_registered, attempted_and_passed, fails_with, load_solutions
from labkit.chapters import ch09_playbook as pb
from labkit.chapters.ch10_parallel import formulas
from labkit.check import parallel

sol = load_solutions("parallel")
passes = attempted_and_passed
SCENARIO = parallel.LAYOUT_SCENARIO
has_layout_model = parallel._layout is not None
needs_layout_model = pytest.mark.skipif(not has_layout_model, reason="labkit.chapters.ch10_parallel.layout "
                                        "(check_layout) is not in this branch yet: the layout helper's part")


def test_every_checker_is_listed_and_found_by_name():
    assert_family_registered(parallel)
    assert parallel.__all__ == ["tp_allreduces", "bubble", "layout_bytes", "layout_fits"]


@pytest.mark.parametrize("name", parallel.__all__)
def test_placeholders_are_not_attempted(name):
    for placeholder in (None, ...):
        res = getattr(lk.check, name)(placeholder)
        assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("name", ["tp_allreduces", "bubble", "layout_bytes"])
def test_a_function_whose_body_is_still_ellipsis_is_not_attempted(name):
    def todo(*args):
        ...  # the notebook's placeholder body

    res = getattr(lk.check, name)(todo)
    assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("name", parallel.__all__)
def test_garbage_and_crashing_answers_fail_with_a_message(name):
    def boom(*args):
        raise ValueError("oops")

    for bad in (42, "nonsense", boom, {1, 2}, lambda *a: "12", lambda *a: [1, 2], lambda *a: float("nan")):
        res = getattr(lk.check, name)(bad)
        assert res.attempted and not res.passed and res.message, (bad, res)


# ---- exercise-10-tp-allreduces ----------------------------------------------------------------------

def by_formula(n, m, q):
    calls = formulas.tp_collectives_per_block(q)
    return (calls["forward"] + calls["backward"]) * n * m


def test_tp_allreduces_accepts_the_solution_and_other_right_forms():
    assert sol.my_tp_allreduces(12, 4, "per_head") == 12 * 4 * 4 and sol.my_tp_allreduces(12, 4, "separate") == 288
    assert passes(lk.check.tp_allreduces(sol.my_tp_allreduces))
    per_block = {"per_head": 4, "separate": 6}
    for right in (lambda n, m, q: float(per_block[q] * n * m),               # a float
                  lambda n, m, q: np.int64(per_block[q] * n * m),            # a numpy integer
                  lambda n, m, q: torch.tensor(per_block[q] * n * m),        # a one-element tensor
                  lambda layers, mb, layout="per_head": mb * layers * (2 + (2 if layout == "per_head" else 4)),
                  by_formula):
        assert passes(lk.check.tp_allreduces(right))


def _tp(per_head, separate):
    """A learner's function: per_head / separate give (n_layer, micro_batches) -> calls."""
    return lambda n, m, q: per_head(n, m) if q == "per_head" else separate(n, m)


@pytest.mark.parametrize("wrong, words", [
    (lambda n, m, q: 2 * n * m, ["forward pass only"]),
    (lambda n, m, q: 4 * n * m, ["4 per block whatever the qkv layout"]),
    (_tp(lambda n, m: 6 * n * m, lambda n, m: 4 * n * m), ["swapped the layouts"]),
    (_tp(lambda n, m: 4 * n * m, lambda n, m: 5 * n * m), ["3 backward", "fc"]),
    (_tp(lambda n, m: 4 * n, lambda n, m: 6 * n), ["left out the micro-batches"]),
    (_tp(lambda n, m: 4 * (n + 1) * m, lambda n, m: 6 * (n + 1) * m), ["n_layer + 1 blocks", "replicated"]),
    (_tp(lambda n, m: (4 * n + 2) * m, lambda n, m: (6 * n + 2) * m), ["embeddings and the head", "replicated"]),
    (_tp(lambda n, m: 4 * m, lambda n, m: 6 * m), ["one block"]),
    (_tp(lambda n, m: 8 * n * m, lambda n, m: 12 * n * m), ["AllGather plus a ReduceScatter"]),
    # bytes: each AllReduce sums a (micro_batch, seq, d_model) bf16 tensor
    (_tp(lambda n, m: 4 * n * m * 8 * 1024 * 768 * 2, lambda n, m: 6 * n * m * 8 * 1024 * 768 * 2), ["bytes"]),
    (lambda n, m, q: 4.5 * n * m, ["whole number"]),
])
def test_tp_allreduces_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.tp_allreduces(wrong), *words)


@pytest.mark.parametrize("wrong, words, not_words", [
    # backward only: 2 per block fused, 4 separate -- not "the forward pass only"
    (_tp(lambda n, m: 2 * n * m, lambda n, m: 4 * n * m), ["backward pass only", "row-parallel"], ["forward pass only"]),
    # with activation recomputation's second forward: 6 / 8 per block -- not "swapped the layouts"
    (_tp(lambda n, m: 6 * n * m, lambda n, m: 8 * n * m), ["recomputation", "2 + 2 and 2 + 4"], ["swapped"]),
    (_tp(lambda n, m: 4 * n * m, lambda n, m: 8 * n * m), ["recomputation"], ["swapped"]),  # separate only
    (_tp(lambda n, m: 6 * n * m, lambda n, m: 4 * n * m), ["swapped the layouts"], ["recomputation"]),
    (_tp(lambda n, m: 2 * n * m, lambda n, m: 6 * n * m), ["fused per-head qkv you counted one pass"], []),
    (lambda n, m, q: 4 * n * m, ["their own f", "TPBlockSeparateQKV", "One f before all three"], []),
])
def test_tp_allreduces_tells_backward_only_and_recomputation_apart(wrong, words, not_words):
    res = lk.check.tp_allreduces(wrong)
    fails_with(res, *words)
    for w in not_words:
        assert w not in res.message, (w, res.message)


def test_tp_allreduces_names_a_layout_that_returns_nothing():
    def only_per_head(n, m, q):
        if q == "per_head":
            return 4 * n * m

    fails_with(lk.check.tp_allreduces(only_per_head), "returned None", "separate")
    fails_with(lk.check.tp_allreduces(48), "pass your function itself")


# ---- exercise-10-bubble ---------------------------------------------------------------------------

def test_bubble_cases_cover_one_stage_one_micro_batch_and_fewer_micro_batches_than_stages():
    cases = set(parallel.BUBBLE_CASES)
    assert any(p == 1 for p, m in cases) and any(m == 1 and p > 1 for p, m in cases)
    assert any(m < p for p, m in cases) and any(m > 2 * p for p, m in cases)
    assert sol.my_bubble(1, 8) == 0 and sol.my_bubble(4, 1) == 0.75 and sol.my_bubble(4, 8) == 3 / 11


def test_bubble_accepts_the_solution_and_other_right_forms():
    assert passes(lk.check.bubble(sol.my_bubble))
    for right in (lambda p, m: 1 - m / (m + p - 1),                          # one minus the busy share
                  lambda p, m: fractions.Fraction(p - 1, m + p - 1),         # an exact fraction
                  lambda p, m: np.float64(p - 1) / (m + p - 1),
                  lambda p, m: torch.tensor((p - 1) / (m + p - 1)),
                  lambda p, m: formulas.bubble_fraction(p, m, relative_to="step"),
                  lambda stages, micro: (stages - 1) * 1.0 / (stages - 1 + micro)):
        assert passes(lk.check.bubble(right))


@pytest.mark.parametrize("wrong, words", [
    (lambda p, m: (p - 1) / m, ["Megatron-LM", "ideal", "idle time ÷ step time"]),
    (lambda p, m: formulas.bubble_fraction(p, m, relative_to="ideal"), ["Megatron-LM"]),
    (lambda p, m: (p - 1) / (m + p), ["m + p − 1 slots, not m + p"]),
    (lambda p, m: 1 / m, ["grows with the number of stages"]),
    (lambda p, m: p / (m + p - 1), ["p − 1 slots", "not p"]),
    (lambda p, m: (p - 1) / (m - 1), ["(p − 1)/(m − 1)", "divides by zero"]),
    (lambda p, m: m / (m + p - 1), ["BUSY share"]),
    (lambda p, m: 100 * (p - 1) / (m + p - 1), ["percentage"]),
    (lambda p, m: (p - 1) // (m + p - 1), ["integer division"]),
    (lambda p, m: (p - 1) / (2 * m + p - 1), ["Draw the schedule"]),       # no named mistake: the general hint
])
def test_bubble_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.bubble(wrong), *words)


def test_bubble_fails_a_formula_right_only_for_some_cases():
    def right_but_m1(p, m):
        return (p - 1) / (m + p - 1) if m > 1 else 0.0  # "one micro-batch: no bubble"

    fails_with(lk.check.bubble(right_but_m1), "my_bubble(2, 1)")

    def divides_by_zero_at_one_stage(p, m):
        return (p - 1) / (m + p - 1) if p > 1 else 1 / (p - 1)

    fails_with(lk.check.bubble(divides_by_zero_at_one_stage), "divided by zero")


# ---- exercise-10-layout-bytes ------------------------------------------------------------------------

def test_layout_bytes_solution_matches_the_formula_and_passes():
    for case in parallel.LAYOUT_CASES:
        n, dp, tp, pp, s = case
        assert sol.my_layout_bytes(*case) == pytest.approx(formulas.layout_state_bytes(n, dp, tp, pp, s)["total"])
    assert sol.my_layout_bytes(70e9, 4, 8, 2, 1) == pytest.approx(70e9 / 16 * (2 + 2 + 12 / 4))
    assert passes(lk.check.layout_bytes(sol.my_layout_bytes))


def test_layout_bytes_accepts_other_right_forms():
    def by_shards(n_params, dp, tp, pp, zero_stage):  # dp first, then the model split: the same bytes
        per_dp = [2 / (dp if zero_stage >= 3 else 1), 2 / (dp if zero_stage >= 2 else 1),
                  12 / (dp if zero_stage >= 1 else 1)]
        return np.float64(sum(per_dp) * n_params) / tp / pp

    for right in (by_shards, lambda *a: formulas.layout_state_bytes(*a)["total"],
                  lambda n, dp, tp, pp, s: torch.tensor(sol.my_layout_bytes(n, dp, tp, pp, s), dtype=torch.float64),
                  lambda n, dp, tp, pp, s: round(sol.my_layout_bytes(n, dp, tp, pp, s))):  # whole bytes
        assert passes(lk.check.layout_bytes(right))


def _state(n, dp, tp, pp, s):
    return formulas.layout_state_bytes(n, dp, tp, pp, s)["total"]


def _shards(n, g, s, w, gr, o):
    return n * (w / (g if s >= 3 else 1) + gr / (g if s >= 2 else 1) + o / (g if s >= 1 else 1))


@pytest.mark.parametrize("wrong, words", [
    (lambda n, dp, tp, pp, s: 16 * n / (dp * tp * pp) if s == 0 else _state(n, dp, tp, pp, s), ["at stage 0"]),
    (lambda n, dp, tp, pp, s: 16 * n / (dp * tp * pp), ["divided everything by dp × tp × pp"]),
    (lambda n, dp, tp, pp, s: _state(n, dp, 1, pp, s), ["left out tp"]),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, 1, s), ["left out pp"]),
    (lambda n, dp, tp, pp, s: pb.zero_bytes_per_gpu(n, dp, s), ["left out tp and pp"]),  # chapter 09's
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, min(s + 1, 3)), ["one too high"]),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, max(s - 1, 0)), ["one too low"]),
    (lambda n, dp, tp, pp, s: _shards(n / (tp * pp), dp, s, 4, 4, 8), ["4 + 4 + 8", "2 + 2"]),
    (lambda n, dp, tp, pp, s: _shards(n / (tp * pp), dp, s, 2, 2, 8), ["master weights"]),
    (lambda n, dp, tp, pp, s: _state(n, dp * tp * pp, tp, pp, s), ["data-parallel group only"]),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, s) / 1e9, ["in GB"]),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, s) / 2**30, ["in GiB"]),
    (lambda n, dp, tp, pp, s: 16 * n, ["all 16 bytes of every parameter"]),
    (lambda n, dp, tp, pp, s: 16 * n / tp / pp / (dp if s else 1) * (1 + (s == 2)), ["Hint"]),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, s) * (1 + 1e-4), ["expected"]),  # outside the 1e-6 tolerance
])
def test_layout_bytes_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.layout_bytes(wrong), *words)


def test_layout_bytes_names_the_case_of_a_mistake_made_in_one_stage_only():
    def stage2_forgets_grads(n, dp, tp, pp, s):
        return _state(n, dp, tp, pp, 1) if s == 2 else _state(n, dp, tp, pp, s)

    fails_with(lk.check.layout_bytes(stage2_forgets_grads), "stage 2", "one too low")


# ---- exercise-10-layout-fits: the answer's form ------------------------------------------------------

@pytest.mark.parametrize("answer", [(None, None, None, None), dict(dp=None, tp=None, pp=None, zero_stage=None)])
def test_layout_fits_half_filled_placeholders_are_not_attempted(answer):
    res = lk.check.layout_fits(answer)
    assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("answer, words", [
    ((4, 8, 2), ["four numbers"]),
    ("4, 8, 2, 1", ["tuple or a dict"]),
    (dict(dp=4, tp=8, pp=2), ["keys", "zero_stage"]),
    (dict(dp=4, tp=8, pp=2, zero_stage=1, cp=1), ["keys"]),
    ((4, 8, 2.5, 1), ["whole number"]),
    ((4, 8, True, 1), ["whole number"]),
    ((4, 8, "2", 1), ["whole number"]),
    ((4, 8, 2, 4), ["0 (none), 1, 2 or 3"]),
    ((64, 0, 1, 1), ["at least 1"]),
    ((4, 8, 1, 1), ["dp × tp × pp = 32", "64 GPUs"]),
    ((8, 8, 2, 1), ["dp × tp × pp = 128"]),
])
def test_layout_fits_refuses_a_malformed_answer_with_a_hint(answer, words):
    fails_with(lk.check.layout_fits(answer), *words)


def test_layout_answer_reads_every_right_form_alike():
    want = dict(dp=4, tp=8, pp=2, zero_stage=1)
    for form in ((4, 8, 2, 1), [4, 8, 2, 1], dict(want), dict(DP=4, TP=8, PP=2, ZERO_STAGE=1),
                 dict(dp=4, tp=8, pp=2, zero=1), dict(zero_stage=1, pp=2, tp=8, dp=4),
                 (4.0, 8.0, 2.0, 1.0), tuple(np.int64(x) for x in (4, 8, 2, 1))):
        got = parallel.layout_answer(form)
        assert got == want and all(type(v) is int for v in got.values()), form


@pytest.mark.skipif(has_layout_model, reason="the layout model is here: the tests below judge layouts")
def test_layout_fits_without_the_layout_model_says_so():
    fails_with(lk.check.layout_fits(sol.my_layout), "no layout model yet")


# ---- exercise-10-layout-fits: an independent reference, to set against the layout model -------------------

def activation_bytes(sc, tp):
    """Activation bytes on the first pipeline stage (stated, not measured): bf16, a fused attention kernel, no
    recomputation, with sequence parallelism (the layout model's assumption: Megatron pairs it with TP) --
    34·s·b·h/tp a layer (Korthikanti et al. 2022: the 5·a·s/h term of the attention scores is gone with flash
    attention) -- and 1F1B keeps L layers' worth of one micro-batch on the first stage, whatever the number
    of stages."""
    s, b, h = sc["seq_len"], sc["micro_batch"], sc["d_model"]
    return sc["n_layer"] * s * b * h * 34 / tp


def reference_fits(sc, lay):
    """(fits, bytes per GPU or None, why): the scenario's rules, then model state + activations."""
    dp, tp, pp, stage = (lay[k] for k in ("dp", "tp", "pp", "zero_stage"))
    if dp * tp * pp != sc["n_gpus"]:
        return False, None, "not every GPU"
    if tp > sc["gpus_per_node"]:
        return False, None, "TP across nodes"
    if sc["n_head"] % tp or sc["d_model"] % tp:
        return False, None, "TP does not divide the heads"
    if parallel._layout.model_shape(sc["model"]).kv_heads % tp:
        return False, None, "TP does not divide the K/V heads (GQA)"
    if pp > 1 and stage >= 2:  # DeepSpeed's pipeline engine refuses ZeRO-2/3; Megatron's optimizer is ZeRO-1
        return False, None, "ZeRO-2/3 with pipeline parallelism"
    if sc["n_layer"] % pp:
        return False, None, "PP does not divide the layers"
    if sc["global_batch"] % (dp * sc["micro_batch"]) or sc["global_batch"] // (dp * sc["micro_batch"]) < pp:
        return False, None, "too few micro-batches"
    total = formulas.layout_state_bytes(sc["n_params"], dp, tp, pp, stage)["total"] + activation_bytes(sc, tp)
    return total <= sc["gpu_bytes"], total, "memory"


def every_layout(sc):
    n = sc["n_gpus"]
    for tp, pp in itertools.product([d for d in range(1, n + 1) if n % d == 0], repeat=2):
        if n % (tp * pp) == 0:
            for stage in (0, 1, 2, 3):
                yield dict(dp=n // (tp * pp), tp=tp, pp=pp, zero_stage=stage)


# Plausible wrong picks, each with what is wrong with it
WRONG_LAYOUTS = {
    "plain DDP: 1.1 TB of state per GPU": dict(dp=64, tp=1, pp=1, zero_stage=0),
    "FSDP alone: 17 GB of state, but 91 GB of activations": dict(dp=64, tp=1, pp=1, zero_stage=3),
    "TP in a node, nothing sharded: 140 GB of state": dict(dp=8, tp=8, pp=1, zero_stage=0),
    "TP across two nodes": dict(dp=4, tp=16, pp=1, zero_stage=3),
    "64 stages for 80 layers": dict(dp=1, tp=1, pp=64, zero_stage=0),
    "PP without TP: 91 GB of activations on the first stage": dict(dp=8, tp=1, pp=8, zero_stage=1),
    "ZeRO-3 with PP: sharded gradients would need a ReduceScatter per micro-batch": dict(dp=4, tp=8, pp=2,
                                                                                           zero_stage=3),
}


def test_layout_fits_hint_names_what_is_too_big():
    res = lk.check.layout_fits(dict(dp=64, tp=1, pp=1, zero_stage=3))      # FSDP alone: activations
    fails_with(res, "too big is the activations", "recomputation", "No ZeRO stage shards activations")
    res = lk.check.layout_fits(dict(dp=8, tp=8, pp=1, zero_stage=0))      # TP alone, nothing sharded: state
    fails_with(res, "too big is the model state", "ZeRO-1 on this split")
    fails_with(lk.check.layout_fits(dict(dp=4, tp=8, pp=2, zero_stage=3)), "ZeRO-0 or ZeRO-1")


def test_the_reference_judges_the_solution_and_the_wrong_picks_with_a_margin():
    ok, total, _ = reference_fits(SCENARIO, sol.my_layout)
    assert ok and total < 0.85 * SCENARIO["gpu_bytes"], total / 1e9
    assert total == pytest.approx(SCENARIO["n_params"] / 16 * 7 + 80 * 4096 * 8192 * 34 / 8)
    for why, lay in WRONG_LAYOUTS.items():
        ok, total, _ = reference_fits(SCENARIO, lay)
        assert not ok and (total is None or total > 1.1 * SCENARIO["gpu_bytes"]), why
    fitting = [lay for lay in every_layout(SCENARIO) if reference_fits(SCENARIO, lay)[0]]
    assert len(fitting) >= 5 and all(lay["tp"] >= 2 for lay in fitting)  # several answers; none without TP


@needs_layout_model
def test_layout_fits_accepts_the_solution_and_its_other_forms():
    assert passes(lk.check.layout_fits(sol.my_layout))
    assert passes(lk.check.layout_fits((4, 8, 2, 1)))
    assert passes(lk.check.layout_fits(dict(DP=4.0, TP=8, PP=2, zero=1)))


@needs_layout_model
@pytest.mark.parametrize("why", list(WRONG_LAYOUTS))
def test_layout_fits_fails_the_wrong_picks(why):
    fails_with(lk.check.layout_fits(WRONG_LAYOUTS[why]))


@needs_layout_model
def test_the_layout_model_agrees_with_the_reference_away_from_the_edge():
    """Every layout of the scenario: where the reference's bytes are more than 10 % from the card's size (or it
    refuses the layout outright), the layout model must judge it the same way."""
    apart = []
    for lay in every_layout(SCENARIO):
        ok, total, why = reference_fits(SCENARIO, lay)
        if total is not None and abs(total / SCENARIO["gpu_bytes"] - 1) < 0.1:
            continue  # at the edge: the two estimates may differ by what each counts
        theirs, reason = parallel.check_layout(dict(SCENARIO), dict(lay))
        if bool(theirs) != ok:
            apart.append((lay, why, None if total is None else round(total / 1e9, 1), reason))
    assert not apart, apart


def test_the_learners_pass_wrong_answers_get_the_hint_that_names_their_mistake():
    """Answers a learner gave in the browser pass: 4 per block with no micro-batches, and bytes that ignore the
    ZeRO stage (or shard only the optimizer at every stage)."""
    res = lk.check.tp_allreduces(lambda n_layer, micro_batches, qkv: 4 * n_layer)
    assert res.attempted and not res.passed and "left out the micro-batches" in res.message
    assert "backward pass only" not in res.message
    res = lk.check.layout_bytes(lambda n, dp, tp, pp, s: 16 * n / (tp * pp))
    assert not res.passed and "same bytes at every ZeRO stage" in res.message and "one too low" not in res.message
    res = lk.check.layout_bytes(lambda n, dp, tp, pp, s: (4 + 12 / (dp if s >= 1 else 1)) * n / (tp * pp))
    assert not res.passed and "only the optimizer state at every stage" in res.message
