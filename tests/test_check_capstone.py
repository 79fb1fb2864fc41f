"""Every chapter 09 and 11 checker accepts the reference solution (and its other right forms) and rejects the
mistakes learners make, with a hint that names the mistake; it never raises."""
import math

import pytest

import labkit as lk
from conftest import assert_family_registered, attempted_and_passed, fails_with, load_solutions
from labkit.chapters import ch09_playbook as pb
from labkit.check import capstone

sol = load_solutions("capstone")
lr_sol = load_solutions("longrun")
CH09 = ["pareto_front", "budget_challenge", "zero_bytes_per_gpu", "smallest_fix"]
CH11 = ["resume_needs", "young_daly", "lost_work", "inexact_resume"]

MiB = 2**20


passes = attempted_and_passed


def test_every_checker_is_listed_and_found_by_name():
    assert_family_registered(capstone)
    assert capstone.__all__ == CH09 + CH11


@pytest.mark.parametrize("name", CH09)
def test_unattempted_answers_never_raise(name):
    fn = getattr(lk.check, name)
    for placeholder in (None, ...):
        res = fn(placeholder)
        assert not res.passed and not res.attempted


@pytest.mark.parametrize("name", ["pareto_front", "zero_bytes_per_gpu"])
def test_a_function_whose_body_is_still_ellipsis_is_not_attempted(name):
    def todo(*args):
        ...  # the notebook's placeholder body

    res = getattr(lk.check, name)(todo)
    assert not res.passed and not res.attempted


@pytest.mark.parametrize("name", CH09)
def test_garbage_and_crashing_answers_fail_with_a_message(name):
    def boom(*args):
        raise ZeroDivisionError("oops")

    for bad in (42, "nonsense", boom, [1, 2]):
        res = getattr(lk.check, name)(bad)
        assert not res.passed and res.message


# ---- exercise-09-pareto ----------------------------------------------------------------------------

def test_pareto_front_accepts_the_solution():
    assert passes(lk.check.pareto_front(sol.my_pareto_front))


def test_pareto_front_rejects_keeping_only_the_fastest():
    res = lk.check.pareto_front(lambda pts: [max(pts, key=lambda p: p[1])])
    assert not passes(res) and "only the fastest" in res.message


def test_pareto_front_rejects_comparing_with_the_neighbour_only():
    def neighbour(pts):  # the classic bug: faster than the previous point, not than all cheaper ones
        pts = sorted(pts, key=lambda p: (p[0], -p[1]))
        return [p for i, p in enumerate(pts) if i == 0 or p[1] > pts[i - 1][1]]

    res = lk.check.pareto_front(neighbour)
    assert not passes(res) and "running maximum" in res.message


def test_pareto_front_rejects_the_wrong_direction():
    def most_memory(pts):
        front, best = [], float("-inf")
        for m, s in sorted(pts, key=lambda p: (-p[0], -p[1])):
            if s > best:
                front.append((m, s))
                best = s
        return front

    res = lk.check.pareto_front(most_memory)
    assert not passes(res) and "MOST memory" in res.message


def test_pareto_front_rejects_keeping_ties_on_memory():
    def ties(pts):  # running maximum, but sorted by memory only and keeping >=
        front, best = [], float("-inf")
        for m, s in sorted(pts, key=lambda p: (p[0], p[1])):
            if s >= best:
                front.append((m, s))
                best = s
        return front

    res = lk.check.pareto_front(ties)
    assert not passes(res) and "equal memory" in res.message


# ---- exercise-09-budget ----------------------------------------------------------------------------

def _rows():
    """A grid like the chapter's: the fastest point is over the budget, the cheapest is slow."""
    spec = [("fp32", 8, "none", 200, 90), ("bf16", 8, "none", 500, 75), ("bf16", 8, "full", 420, 55),
            ("bf16", 4, "none", 450, 59), ("fp32", 2, "none", 150, 58), ("bf16", 1, "full", 120, 51),
            ("fp32", 4, "full", 210, 52)]
    rows = []
    for prec, mb, ck, tps, mib in spec:
        point = dict(precision=prec, micro_batch=mb, accum=8 // mb, checkpointing=ck, workers=0)
        rows.append(pb.row_from_summary(point, dict(tokens_per_s=tps, param_bytes=mib * MiB, grad_bytes=0,
                                                    optimizer_bytes=0, activation_bytes=0)))
    return rows


BUDGET = 62 * MiB


def test_budget_challenge_accepts_the_solution():
    rows = _rows()
    pick = sol.my_pick(rows, BUDGET)
    assert pick == dict(precision="bf16", micro_batch=4, checkpointing="none")
    assert passes(lk.check.budget_challenge(pick, rows=rows, budget_bytes=BUDGET))


def test_budget_challenge_accepts_a_measured_result_within_noise():
    rows = _rows()
    # A fresh run of the right point measured slower (noise): the grid's measurement of the same point counts.
    summary = dict(precision="bf16", micro_batch=4, accum=2, checkpointing="none", tokens_per_s=300,
                   param_bytes=59 * MiB, grad_bytes=0, optimizer_bytes=0, activation_bytes=0, peak_mem_bytes=None)
    result = lk.Result(lk.Config(model="tiny"), summary, [])
    assert passes(lk.check.budget_challenge(result, rows=rows, budget_bytes=BUDGET))
    # ... and a run close enough to the best passes on its own numbers too.
    other = dict(summary, checkpointing="full", tokens_per_s=430, param_bytes=55 * MiB)
    assert passes(lk.check.budget_challenge(other, rows=rows, budget_bytes=BUDGET))


def test_budget_challenge_rejects_the_fastest_overall():
    res = lk.check.budget_challenge(dict(precision="bf16", micro_batch=8, checkpointing="none"),
                                    rows=_rows(), budget_bytes=BUDGET)
    assert not passes(res) and "over the budget" in res.message and "fastest configuration overall" in res.message


def test_budget_challenge_rejects_the_smallest_and_slow():
    res = lk.check.budget_challenge(dict(precision="bf16", micro_batch=1, checkpointing="full"),
                                    rows=_rows(), budget_bytes=BUDGET)
    assert not passes(res) and "target is 90%" in res.message


def test_budget_challenge_hint_points_the_way_without_the_answer():
    """Issue 24 item 13: the hint named the best configuration that fits (its label and speed), verbatim."""
    rows = _rows()
    best = pb.best_within(rows, BUDGET)
    for slow in (dict(precision="bf16", micro_batch=1, checkpointing="full"),
                 dict(precision="fp32", micro_batch=2, checkpointing="none")):
        res = lk.check.budget_challenge(slow, rows=rows, budget_bytes=BUDGET)
        assert not passes(res) and "budget line" in res.message, res.message
        assert best["label"] not in res.message and f"{best['tokens_per_s']:,.0f}" not in res.message, res.message


def test_budget_challenge_needs_the_grid_and_a_known_point():
    assert "pass the grid" in lk.check.budget_challenge(dict(precision="bf16", micro_batch=4)).message
    res = lk.check.budget_challenge(dict(precision="fp16", micro_batch=3), rows=_rows(), budget_bytes=BUDGET)
    assert not passes(res) and "not one of the grid's points" in res.message
    res = lk.check.budget_challenge(dict(precision="bf16", micro_batch=4), rows=_rows(), budget_bytes=1)
    assert not passes(res) and "no grid configuration fits" in res.message


# ---- exercise-09-zero --------------------------------------------------------------------------------

def test_zero_bytes_accepts_the_solution():
    assert passes(lk.check.zero_bytes_per_gpu(sol.my_zero_bytes))


@pytest.mark.parametrize("wrong, words", [
    (lambda n, g, s: 8 * n if s == 0 else sol.my_zero_bytes(n, g, s), "16 bytes per parameter"),
    (lambda n, g, s: 16 * n / g if s else 16 * n, "Only stage 3 shards everything"),
    (lambda n, g, s: 4 * n + 8 * n / g if s == 1 else sol.my_zero_bytes(n, g, s), "master weights"),
    (lambda n, g, s: sol.my_zero_bytes(n, g, 2) if s == 1 else sol.my_zero_bytes(n, g, s), "only the optimizer"),
    (lambda n, g, s: sol.my_zero_bytes(n, g, 1) if s == 2 else sol.my_zero_bytes(n, g, s), "gradients as well"),
    (lambda n, g, s: 16 * n, "split across the GPUs"),
])
def test_zero_bytes_rejects_the_usual_mistakes(wrong, words):
    res = lk.check.zero_bytes_per_gpu(wrong)
    assert not passes(res) and words in res.message, res.message


# ---- exercise-09-which-fix ------------------------------------------------------------------------------

def test_smallest_fix_accepts_the_solution_and_aliases():
    assert passes(lk.check.smallest_fix(sol.my_fix))
    assert passes(lk.check.smallest_fix("ZeRO-2"))
    assert sol.my_fix == pb.smallest_fix(**capstone.FIX_SCENARIO)


def test_smallest_fix_rejects_too_little_and_too_much():
    res = lk.check.smallest_fix("zero1")
    assert not passes(res) and "more than" in res.message
    res = lk.check.smallest_fix("fsdp")  # works, but costs 1.5x the communication for nothing
    assert not passes(res) and "less intrusive" in res.message
    res = lk.check.smallest_fix("zero3+offload_params")
    assert not passes(res) and "less intrusive" in res.message
    res = lk.check.smallest_fix("tensor parallel")
    assert not passes(res) and "is not one of" in res.message


def test_budget_challenge_answer_not_revealed_before_the_challenge():
    """Chapter 09's cells before the budget challenge must not print the grid's best point that fits
    (its label is the answer): they used to say 'Highest median that fits: **<label>**'."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "09_fixed_gpus_playbook.ipynb")
                    .read_text(encoding="utf-8"))
    before = []
    for cell in nb["cells"]:
        if "exercise-09-budget" in cell.get("metadata", {}).get("tags", []):
            break
        if cell["cell_type"] == "code":
            before.append("".join(cell["source"]))
    else:
        raise AssertionError("no cell tagged exercise-09-budget")
    code = "\n".join(before)
    assert "best_fit['label']" not in code and 'best_fit["label"]' not in code
    assert "Highest median that fits:" not in code
    assert "r['label'] for r in close" not in code  # the points within scatter of the best would pass too


def test_budget_challenge_hints_in_russian(speaks_russian):
    """The fastest-overall pick (the exercise's typical wrong answer) is told why in Russian (issue #51)."""
    import re
    res = lk.check.budget_challenge(dict(precision="bf16", micro_batch=8, checkpointing="none"),
                                    rows=_rows(), budget_bytes=BUDGET)
    assert not passes(res) and res.attempted and re.search("[а-яё]", res.message)
    assert "бюджет" in res.message and "over the budget" not in res.message


# ==== chapter 11 =============================================================================

def test_chapter_11s_checkers_are_listed_and_found_by_name():
    assert_family_registered(capstone)
    assert capstone.__all__[-4:] == CH11


def test_the_items_are_the_chapters_own():
    from labkit.chapters.ch11_longrun import state
    assert capstone.ITEMS == tuple(state.ITEMS)


@pytest.mark.parametrize("name", CH11)
def test_placeholders_are_not_attempted(name):
    for placeholder in (None, ...):
        res = getattr(lk.check, name)(placeholder)
        assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("name", ["resume_needs", "young_daly", "lost_work"])
def test_a_chapter_11_function_whose_body_is_still_ellipsis_is_not_attempted(name):
    def todo(*args):
        ...

    res = getattr(lk.check, name)(todo)
    assert not res.passed and not res.attempted, res


@pytest.mark.parametrize("name", CH11)
def test_chapter_11s_garbage_and_crashing_answers_fail_with_a_message(name):
    def boom(*args):
        raise ValueError("oops")

    for bad in (42, "nonsense", boom, [1, 2], lambda *a: "12", lambda *a: [1, 2], lambda *a: float("nan")):
        res = getattr(lk.check, name)(bad)
        assert res.attempted and not res.passed and res.message, (bad, res)


# ---- exercise-11-resume-needs ------------------------------------------------------------------------

def test_resume_needs_accepts_the_solution_and_other_forms():
    assert passes(lk.check.resume_needs(lr_sol.my_resume_needs))
    as_list = lambda s: sorted(lr_sol.my_resume_needs(s))  # noqa: E731
    as_upper_tuple = lambda s: tuple(i.upper() for i in lr_sol.my_resume_needs(s))  # noqa: E731
    as_frozen = lambda s: frozenset(lr_sol.my_resume_needs(s))  # noqa: E731
    for fn in (as_list, as_upper_tuple, as_frozen):
        assert passes(lk.check.resume_needs(fn))


def test_resume_needs_cases_cover_every_item_both_ways():
    for item in capstone.ITEMS:
        ins = [item in capstone.needed(s) for s in capstone.RESUME_CASES]
        if item in ("model", "loader"):
            assert all(ins)
        else:
            assert any(ins) and not all(ins), item


def drop(item, when=lambda s: True):
    return lambda s: lr_sol.my_resume_needs(s) - ({item} if when(s) else set())


def add(item, when=lambda s: True):
    return lambda s: lr_sol.my_resume_needs(s) | ({item} if when(s) else set())


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
    (lambda s: set(capstone.ITEMS), ["save everything", "smallest set"]),
    (lambda s: {"model", "optimizer"}, ["lacks"]),
    (lambda s: {"model", "optimizer", "scheduler", "scaler", "rng"} if s["shuffle"] else lr_sol.my_resume_needs(s),
     ["'loader'"]),
])
def test_resume_needs_fails_the_usual_mistakes_with_their_hint(wrong, words):
    fails_with(lk.check.resume_needs(wrong), *words)


def test_resume_needs_names_an_unknown_item_with_a_did_you_mean():
    fails_with(lk.check.resume_needs(lambda s: lr_sol.my_resume_needs(s) | {"schedular"}), "did you mean 'scheduler'")
    fails_with(lk.check.resume_needs(lambda s: "model"), "return a set of item names")


def test_resume_needs_names_a_set_up_that_returns_nothing():
    fails_with(lk.check.resume_needs(lambda s: None if s["precision"] == "fp16" else lr_sol.my_resume_needs(s)),
               "returned None", "fp16")


# ---- exercise-11-young-daly --------------------------------------------------------------------------

def test_young_daly_accepts_the_solution_and_other_forms():
    from labkit.chapters.ch11_longrun import spikes as interval
    assert passes(lk.check.young_daly(lr_sol.my_interval))
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
    assert passes(lk.check.lost_work(lr_sol.my_lost_work))
    assert passes(lk.check.lost_work(lambda f, i, r: f - i * math.floor(f / i) + r))
    assert passes(lk.check.lost_work(lambda f, i, r: r + (f - (f // i) * i)))


def test_lost_work_cases_include_a_failure_before_the_first_checkpoint_and_none_at_a_save():
    assert any(f < i for f, i, r in capstone.LOST_CASES)
    assert not any(f % i == 0 for f, i, r in capstone.LOST_CASES)  # "before or after that save?" has no answer


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
    assert passes(lk.check.inexact_resume(lr_sol.my_missing))
    assert passes(lk.check.inexact_resume({k.lower(): v.upper() + " " for k, v in lr_sol.my_missing.items()}))


def test_inexact_resume_half_filled_is_told_what_is_open_and_wrong_is_told_which_log():
    fails_with(lk.check.inexact_resume({"A": "loader", "B": None}), "C, D, E are still open")
    swapped = dict(lr_sol.my_missing, C="optimizer", D="scheduler")
    fails_with(lk.check.inexact_resume(swapped), "log C is not 'optimizer'", "2 of 5")
    fails_with(lk.check.inexact_resume(dict(lr_sol.my_missing, A="model")), "log A is not 'model'")
    fails_with(lk.check.inexact_resume(dict(lr_sol.my_missing, F="rng")), "the key")
    fails_with(lk.check.inexact_resume(dict(lr_sol.my_missing, A="sampler")), "the items are")
    assert not lk.check.inexact_resume({"A": None}).attempted


# ---- the hints in Russian (issue #51): chapters 09-12's typical wrong answers -----------------------------------
# {checker: the typical wrong answer of its exercise (labkit/content/templates/wrong-answers.md)}
TYPICAL_WRONG = {
    "resume_needs": lambda setup: set(capstone.ITEMS),
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
