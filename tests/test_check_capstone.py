"""Every chapter 09 checker accepts the reference solution and rejects the mistakes learners make."""
import pytest

import labkit as lk
from conftest import assert_family_registered, attempted_and_passed, load_solutions
from labkit.chapters import ch09_playbook as pb
from labkit.check import capstone

sol = load_solutions("capstone")

MiB = 2**20


passes = attempted_and_passed


def test_every_checker_is_listed_and_found_by_name():
    assert_family_registered(capstone)


@pytest.mark.parametrize("name", capstone.__all__)
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


@pytest.mark.parametrize("name", capstone.__all__)
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
