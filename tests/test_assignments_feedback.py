"""The nbgrader release teaches as much as the plain chapter (issue 49, item 3), with the real tool.

Chapter 00 (the cheapest with three exercises) is built, released with ``nbgrader generate_assignment``, and
answered twice by a learner: with every typical wrong answer (``grading.WRONG``), then with the reference. The
learner's own run of the release shows each check's verdict and hint under its test cell, as the chapter does, and
``nbgrader validate`` fails on the wrong answers -- naming each failing check with its hint -- and passes the
right ones. The points stay with the hidden half: tests/test_assignments.py grades wrong answers 0 with autograde.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import nbclient
import nbformat
import pytest

from conftest import grading_scope
from labkit.instructor import assignments
from test_assignments import _env_nbgrader, _nb, _nbg, _submission, _tests_of, _text

CHAPTER = "00_start_here"
# two runs of chapter 00 and two of nbgrader validate: a few minutes on 2 shared cores, so CI runs them (a plain
# course.py test must end within 12 minutes)
REAL_RUNS = pytest.mark.skipif(grading_scope() == "sample", reason="CI=true runs the learner's run and Validate")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    assignments.build_nbgrader(course, [CHAPTER[:2]])
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", CHAPTER, "--force"], cwd=course,
                          env=_env_nbgrader(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return course, _nb(course, CHAPTER), _nb(course, CHAPTER, "release")


def _answered(tmp_path, release, role: str):
    course, source, released = release
    tests = _tests_of(source)
    nb = _submission(source, released, dict.fromkeys(tests, role))
    path = tmp_path / role / f"{CHAPTER}.ipynb"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(nb, indent=1))
    return path, {t.split("-", 2)[2] for t in tests.values()}


def _validate(path, course) -> subprocess.CompletedProcess:
    """``nbgrader validate`` with the course's nbgrader_config.py (its cell and output time limits)."""
    return subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path)], cwd=course,
                          env=_env_nbgrader(), capture_output=True, text=True, timeout=900)


@REAL_RUNS
def test_the_learners_run_shows_each_verdict_and_hint_and_validate_fails_on_a_wrong_answer(tmp_path, release):
    path, checks = _answered(tmp_path, release, "wrong")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, allow_errors=True, resources={"metadata": {"path": str(path.parent)}},
                            env=_env_nbgrader()).execute()
    for cell in nb.cells:  # under each test cell: the verdict with its hint (an error, for nbgrader a 0)
        if _nbg(cell).get("grade"):
            name = _nbg(cell)["grade_id"].split("-", 2)[2]
            shown = "\n".join(str(o.get("evalue", "")) + json.dumps(o.get("data", {}), ensure_ascii=False)
                              for o in cell.outputs)
            assert f"not yet [{name}]" in shown, (name, shown)
    done = _validate(path, release[0])
    out = done.stdout + done.stderr
    assert "Success! Your notebook passes all the tests." not in out, out[-3000:]
    assert "VALIDATION FAILED" in out, out[-3000:]
    for name in checks:
        assert re.search(rf"not yet \[{name}\] \S", out), (name, out[-3000:])


@REAL_RUNS
def test_validate_passes_the_reference_answers(tmp_path, release):
    path, _ = _answered(tmp_path, release, "reference")
    done = _validate(path, release[0])
    assert "Success! Your notebook passes all the tests." in done.stdout + done.stderr, done.stdout[-3000:]


def test_a_test_cell_shows_the_result_where_the_chapter_did_and_ends_with_no_value(release):
    _, source, _ = release
    for cell in source["cells"]:
        if _nbg(cell).get("grade"):
            text = _text(cell)
            last = text.split(assignments.HIDDEN_BEGIN)[0].rstrip().splitlines()[-1]
            assert last.startswith("assert "), text  # a value last would be read by nbgrader as a partial score
            assert "display(graded)" in text or "graded" not in text, text
