"""nbgrader grades the other half of the chapters: the same test as tests/test_assignments.py's (see its
docstring), in a file of its own so that ``--dist loadfile`` gives the two halves to two xdist workers; and
chapter 08 once more, with what a learner's notebook may do that must not cost (or win) points."""
from __future__ import annotations

import json
import time

import pytest

from labkit.instructor import assignments, grading
from test_assignments import (GRADE_ALL_ONLY, GRADED_THERE, _errors, _nb, _nbg, _nbgrader, _submission, _tests_of,
                              _text, chapter_params, grade_chapter)


@pytest.mark.parametrize("chapter", chapter_params(GRADED_THERE + GRADE_ALL_ONLY[1::2]))
def test_nbgrader_grades_the_reference_full_wrong_and_failing_answers_zero_and_a_blank_not_attempted(tmp_path, chapter):
    grade_chapter(tmp_path, chapter)


# ---- what a learner's notebook may do that must not cost (or win) points ------------------------------

WARNS = '''
import warnings
_reference_formula = activation_bytes_formula


def activation_bytes_formula(*args, **kwargs):  # the reference, with a warning raised on each call
    warnings.warn("a warning from the learner's function")
    return _reference_formula(*args, **kwargs)
'''


def _replace(nb: dict, grade_id: str, source: str) -> dict:
    cells = [{**c, "source": source} if _nbg(c).get("grade_id") == grade_id else c for c in nb["cells"]]
    assert cells != nb["cells"], grade_id
    return {**nb, "cells": cells}


def test_nbgrader_keeps_the_context_puts_back_a_deleted_test_and_ignores_warnings_and_a_rebound_lk(tmp_path):
    """Chapter 08 with the real nbgrader, one autograde call over two submissions, each holding every reference
    answer but: "edited", whose exercise context says ``n_params = 0`` and whose answer is then 0 (the locked
    context comes back: 0 points); "untidy", whose answer to one exercise warns at each call (full points: the
    warning goes to stdout), which binds ``lk = None`` in a solution cell (full points: each test imports labkit)
    and which deleted one test cell (put back from the gradebook and graded: full points)."""
    from nbgrader.api import Gradebook

    chapter, context, step2 = "08_memory_in_practice", "cell-c13-context", "exercise-08-step2"
    assignments.build_nbgrader(tmp_path, ["08"])
    source = _nb(tmp_path, chapter)
    _nbgrader(tmp_path, "generate_assignment", chapter, "--force")
    release = _nb(tmp_path, chapter, "release")
    kept = [c for c in release["cells"] if _nbg(c).get("grade_id") == context]
    assert [_text(c) for c in kept] == ['n_params = fu["n_params"]'] and _nbg(kept[0])["locked"], kept
    assert not _nbg(kept[0])["solution"] and kept[0]["metadata"].get("editable") is False

    tests = _tests_of(source)
    points = {_nbg(c)["grade_id"]: _nbg(c)["points"] for c in source["cells"] if _nbg(c).get("grade")}
    reference = _submission(source, release, {t: "reference" for t in tests})
    solution = {_nbg(c)["grade_id"]: _text(c) for c in reference["cells"] if _nbg(c).get("solution")}
    edited = _replace(reference, context, "n_params = 0  # the learner's edit of the given line")
    edited = _replace(edited, step2, "my_extra_bytes = 0")
    deleted = tests["exercise-08-bytes-per-param"]
    untidy = _replace(reference, "exercise-08-activation-formula", solution["exercise-08-activation-formula"] + WARNS)
    untidy = _replace(untidy, step2, solution[step2] + "\nlk = None  # the learner's own lk")
    untidy = {**untidy, "cells": [c for c in untidy["cells"] if _nbg(c).get("grade_id") != deleted]}
    for student, nb in (("edited", edited), ("untidy", untidy)):
        dest = tmp_path / "submitted" / student / chapter
        dest.mkdir(parents=True)
        (dest / f"{chapter}.ipynb").write_text(json.dumps(nb, indent=1))
    t0 = time.perf_counter()
    _nbgrader(tmp_path, "autograde", chapter, "--force")
    print(f"\nnbgrader autograde, {chapter}, 2 submissions: {time.perf_counter() - t0:.0f} s", flush=True)

    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        got = {s: {g.name: g.score for g in gb.find_submission_notebook(chapter, chapter, s).grades}
               for s in ("edited", "untidy")}
    graded = {s: json.loads((tmp_path / "autograded" / s / chapter / f"{chapter}.ipynb").read_text())
              for s in got}
    errors = {s: _errors(nb) for s, nb in graded.items()}
    step2_test = tests[step2]
    assert got["edited"][step2_test] == 0 and "✗ not yet" in errors["edited"][step2_test], (got, errors["edited"])
    assert [_text(c) for c in graded["edited"]["cells"] if _nbg(c).get("grade_id") == context] == [_text(kept[0])]
    measured = {g for g in points if g.split("-", 2)[2] in grading.MEASURED}  # no saved file: not at full points
    assert {g: got["untidy"][g] for g in set(points) - measured} == {g: points[g] for g in set(points) - measured}, (
        got["untidy"], errors["untidy"])
    assert [_nbg(c).get("grade_id") for c in graded["untidy"]["cells"]].count(deleted) == 1
    outputs = {_nbg(c).get("grade_id"): c.get("outputs", []) for c in graded["untidy"]["cells"]}
    shown = "".join("".join(o.get("text", "")) for o in outputs[tests["exercise-08-activation-formula"]])
    assert "a warning from the learner's function" in shown, outputs[tests["exercise-08-activation-formula"]]
