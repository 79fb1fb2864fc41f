"""labkit.instructor.grading.gradescope_results: the results.json Gradescope's autograder reads, from this kernel's grade log --
checked against the fields of Gradescope's autograder specification (a results file: optional score,
visibility, output, and tests[] with name, score, max_score, status, visibility, output, number)."""
import json

import jsonschema
import pytest

import labkit as lk
from conftest import load_solutions
from labkit.base.runtime import ConfigError
from labkit.check import _core
from labkit.instructor import grading

sol = load_solutions("longrun")
VIS = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
SCHEMA = {  # what Gradescope documents for results.json; nothing else may appear
    "type": "object",
    "properties": {
        "score": {"type": "number"}, "execution_time": {"type": "number"}, "output": {"type": "string"},
        "visibility": VIS, "stdout_visibility": VIS, "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object", "required": ["name", "score", "max_score"], "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "score": {"type": "number"}, "max_score": {"type": "number"},
                           "status": {"enum": ["passed", "failed"]}, "number": {"type": "string"},
                           "output": {"type": "string"}, "tags": {"type": "array"}, "visibility": VIS,
                           "extra_data": {"type": "object"}}}},
    },
    "additionalProperties": False,
}


@pytest.fixture
def log():
    lk.check.reset_history()
    yield
    lk.check.reset_history()


def test_scores_follow_the_last_check_of_each_exercise_and_the_file_fits_the_schema(log, tmp_path):
    lk.check.young_daly(lambda c, m: c * m)  # wrong first ...
    lk.check.young_daly(sol.my_interval)     # ... then right: the last check counts
    lk.check.lost_work(lambda f, i, r: f % i)  # wrong (the restart left out)
    lk.check.resume_needs(None)               # not attempted
    path = tmp_path / "results.json"
    out = grading.gradescope_results(path, exercises=["resume_needs", "young_daly", "lost_work", "inexact_resume"])
    written = json.loads(path.read_text())
    assert written == out
    jsonschema.validate(written, SCHEMA)
    tests = {t["name"]: t for t in written["tests"]}
    assert tests["young_daly"]["score"] == tests["young_daly"]["max_score"] == grading.POINTS["young_daly"]
    assert tests["young_daly"]["status"] == "passed"
    assert tests["lost_work"]["score"] == 0 and "lk.check.lost_work" in tests["lost_work"]["output"]
    assert tests["resume_needs"]["score"] == 0 and tests["resume_needs"]["output"] == "not attempted"
    assert tests["inexact_resume"]["output"] == "not attempted"  # listed, never checked
    assert written["score"] == grading.POINTS["young_daly"]
    assert [t["number"] for t in written["tests"]] == ["1", "2", "3", "4"]


def test_by_default_it_reports_what_the_log_holds(log, tmp_path):
    lk.check.young_daly(sol.my_interval)
    out = grading.gradescope_results(tmp_path / "r.json", visibility="after_due_date")
    assert [t["name"] for t in out["tests"]] == ["young_daly"]
    assert {t["visibility"] for t in out["tests"]} == {"after_due_date"} == {out["visibility"]}


def test_a_forged_log_entry_scores_nothing(log, tmp_path):
    lk.check.young_daly(lambda c, m: c * m)
    _core._LOG.append({"exercise": "young_daly", "passed": True, "attempted": True, "timestamp": "now", "note": ""})
    out = grading.gradescope_results(tmp_path / "r.json", exercises=["young_daly"])
    assert out["tests"][0]["score"] == 0 and out["tests"][0]["status"] == "failed"


@pytest.mark.parametrize("kw, field", [
    (dict(visibility="public"), "visibility"),
    (dict(exercises=["young_dally"]), "exercises"),
    (dict(exercises="young_daly"), "exercises"),
    (dict(exercises=[]), "exercises"),          # issue 45: an empty list reported nothing, and said nothing
    (dict(chapter="13"), "chapter"),
    (dict(chapter="11", exercises=["young_daly"]), "chapter"),
])
def test_bad_arguments_name_the_field_before_anything_is_written(log, tmp_path, kw, field):
    with pytest.raises(ConfigError, match=field):
        grading.gradescope_results(tmp_path / "r.json", **kw)
    assert not (tmp_path / "r.json").exists()


def test_every_checker_has_points():
    assert set(grading.POINTS) == set(lk.check.names())


def test_a_generator_of_exercises_is_read_once_and_reported(log, tmp_path):
    """Issue 45: the type check consumed a generator, and an empty results file was written."""
    lk.check.young_daly(sol.my_interval)
    out = grading.gradescope_results(tmp_path / "r.json", exercises=(n for n in ["young_daly", "lost_work"]))
    assert [t["name"] for t in out["tests"]] == ["young_daly", "lost_work"]
    assert out["score"] == grading.POINTS["young_daly"]


def test_a_check_of_another_chapter_is_not_counted_by_default(log, tmp_path):
    """Issue 45: by default the results counted every checker in the log, another chapter's added check too."""
    lk.check.young_daly(sol.my_interval)        # chapter 11's
    lk.check.pad_vocab(lambda v, m=64: -(-v // m) * m)  # chapter 07's, added to the notebook
    with pytest.raises(ConfigError, match="chapters 07, 11"):
        grading.gradescope_results(tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
    out = grading.gradescope_results(tmp_path / "r.json", chapter="11")
    assert [t["name"] for t in out["tests"]] == list(grading.CHAPTERS["11"])
    assert out["score"] == grading.POINTS["young_daly"]


def test_each_chapters_checkers_are_the_ones_its_notebook_calls():
    from labkit.instructor import classgrade

    assert {c: set(checks) for c, checks in grading.CHAPTERS.items()} == {
        c: set(checks) for c, checks in classgrade.course_checks().items()}
