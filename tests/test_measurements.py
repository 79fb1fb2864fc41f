"""The measured exercises graded from the learner's saved file, ``labkit-measurements.json`` (issue 32).

Without a grader: which grader ``grading_tool()`` sees; each of the five measured checkers saves what it judged
after a real check and, while grading, judges that entry again whatever it is passed, and says so; an entry
edited after it was saved, a missing file and a missing entry fail with what to do; the file is JSON (no
pickle); an unattempted answer saves nothing; grading implies the short mode; the chapters' measured cells
take the saved table, pick and runs while grading. After a review: a judge takes only measurements from an
entry (a sealed entry with another target, budget or shape fails), labkit's writer refuses while grading,
nbgrader's Validate saves nothing, and the instructor kit says what is graded and what the hash cannot catch. With nbgrader itself: chapter 08 autograded from a
submitted file -- the budget's runs are not made again, and a wrong calculator, an edited locked check cell and
a deleted locked cell leave the grade to the file.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import pickle
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import labkit as lk
from conftest import load_solutions
from labkit.chapters import course, measured
from labkit.chapters import ch09_playbook as pb
from labkit.chapters.ch07_kernels import saved_profile
from labkit.chapters.ch08_memory import budget_beside_run
from labkit.base.runtime import ConfigError
from labkit.check import capstone, measurements
from labkit.instructor import grading
from test_check_capstone import BUDGET, _rows
from test_check_practice import _table
from test_check_profiling import SUSPECT, _loader_runs, _run, mean_reader

ROOT = Path(__file__).resolve().parent.parent
sol = load_solutions("practice")
SIGNALS = ("NBGRADER_EXECUTION", "LABKIT_GRADING", "LABKIT_MODE", "CI")


@pytest.fixture(autouse=True)
def _no_grader(monkeypatch, tmp_path):
    """No grader and no mode switch, in a fresh folder (the file is written where the kernel runs)."""
    for name in SIGNALS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "otter.check.notebook", raising=False)
    monkeypatch.chdir(tmp_path)


def _grading(monkeypatch):
    monkeypatch.setenv("LABKIT_GRADING", "1")


def _answers(name, right: bool):
    """(args, kwargs) of a real check of ``name``: a right answer or a wrong one, on measured-like input."""
    if name == "low_mfu_fix":
        after = {**SUSPECT, "micro_batch": 8, "accum": 1} if right else {**SUSPECT, "workers": 2}
        return (_run(after, 0.16), _run(SUSPECT, 0.05)), {}
    if name == "loader_reading":
        return (mean_reader if right else (100.0, 60.0, 1), _loader_runs()), {}
    if name == "read_profile":
        return (("aten::mm" if right else "aten::linear", 0.07), _table()), {}
    if name == "memory_budget":
        return (sol.my_budget if right else (lambda config: 2 * sol.my_budget(config)),), {}
    pick = dict(precision="bf16", micro_batch=4 if right else 8, checkpointing="none")
    return (pick,), dict(rows=_rows(), budget_bytes=BUDGET)


def _check(name, args=(), kwargs=None):
    return getattr(lk.check, name)(*args, **(kwargs or {}))


def _file() -> dict:
    return json.loads(Path(measured.FILE).read_text())


# ---- which grader ---------------------------------------------------------------------------------------

def test_grading_tool_sees_each_signal(monkeypatch):
    assert lk.check.grading_tool() is None and course.grading_tool() is None
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")  # nbgrader's validate runs the learner's own cells
    assert lk.check.grading_tool() is None
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert lk.check.grading_tool() == "nbgrader"
    monkeypatch.delenv("NBGRADER_EXECUTION")
    otter = types.ModuleType("otter.check.notebook")
    otter.Notebook = type("Notebook", (), {"_grading_mode": False})
    monkeypatch.setitem(sys.modules, "otter.check.notebook", otter)
    assert lk.check.grading_tool() is None
    otter.Notebook._grading_mode = True  # what otter.Notebook.init_grading_mode sets
    assert lk.check.grading_tool() == "otter"
    monkeypatch.delitem(sys.modules, "otter.check.notebook")
    monkeypatch.setenv("LABKIT_GRADING", " ")
    assert lk.check.grading_tool() is None
    monkeypatch.setenv("LABKIT_GRADING", "1")
    assert lk.check.grading_tool() == "labkit"


def test_grading_tool_is_no_checker():
    assert "grading_tool" in lk.check.__all__ and "grading_tool" not in lk.check.names()
    assert sorted(lk.check.names()) == sorted(grading.POINTS)


def test_grading_implies_the_short_mode_unless_the_mode_is_set(monkeypatch):
    assert not course.smoke()
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert course.smoke() and course.grading_tool() == "nbgrader"
    monkeypatch.setenv("LABKIT_MODE", "full")
    assert not course.smoke()
    monkeypatch.setenv("LABKIT_MODE", "short")
    assert course.smoke()


# ---- saved, then judged again from the file ------------------------------------------------------------

@pytest.mark.parametrize("right", [True, False], ids=["right", "wrong"])
@pytest.mark.parametrize("name", grading.MEASURED)
def test_a_check_saves_its_entry_and_grading_judges_it_without_the_live_answer(name, right, monkeypatch):
    args, kwargs = _answers(name, right)
    live = _check(name, args, kwargs)
    assert live.attempted and live.passed is right, live
    entry = _file()["entries"][name]
    assert entry["checker"] == name and entry["sha256"] == measured.digest(entry)
    assert set(entry["measured_on"]) >= {"device", "cpu", "gpu", "torch", "labkit"} and entry["saved_at"]
    _grading(monkeypatch)
    other, other_kw = _answers(name, not right)
    for graded in (_check(name, (None,)), _check(name, other, other_kw)):  # no answer, or the opposite one
        assert graded.attempted and graded.passed is right, graded
        assert graded.message.startswith(live.message)
        assert f"(graded from {measured.FILE}, measured on {entry['measured_on']['device']} at" in graded.message
    assert _file()["entries"][name] == entry  # grading writes nothing


def _bump_a_number(data):
    """``data`` with its first number (not a bool) changed by one; returns whether one was found."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            data[key] = value + 1
            return True
        if _bump_a_number(value):
            return True
    return False


@pytest.mark.parametrize("name", grading.MEASURED)
def test_an_edited_entry_is_found_and_fails(name, monkeypatch):
    args, kwargs = _answers(name, True)
    assert _check(name, args, kwargs).passed
    doc = _file()
    assert _bump_a_number(doc["entries"][name]["data"])
    Path(measured.FILE).write_text(json.dumps(doc))
    _grading(monkeypatch)
    res = _check(name, args, kwargs)
    assert res.attempted and not res.passed
    assert res.message.startswith(measurements.EDITED + ":") and name in res.message


def test_no_file_no_entry_or_a_broken_file_fail_with_what_to_submit(monkeypatch):
    _grading(monkeypatch)
    res = lk.check.memory_budget(sol.my_budget)
    assert not res.passed and res.message == measurements.NO_ENTRY
    assert "submit labkit-measurements.json" in res.message
    monkeypatch.delenv("LABKIT_GRADING")
    assert lk.check.read_profile(*_answers("read_profile", True)[0]).passed  # another exercise's entry only
    _grading(monkeypatch)
    assert lk.check.memory_budget(None).message == measurements.NO_ENTRY
    Path(measured.FILE).write_text("{not json")
    res = lk.check.read_profile(None)
    assert not res.passed and res.message.startswith(measurements.NO_ENTRY) and "could not be read" in res.message


def test_the_file_is_json_merged_per_checker_and_no_pickle():
    for name in ("read_profile", "budget_challenge", "read_profile"):
        args, kwargs = _answers(name, True)
        assert _check(name, args, kwargs).passed
    raw = Path(measured.FILE).read_bytes()
    assert not raw.startswith(b"\x80")  # a pickle's protocol byte
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(raw)
    doc = json.loads(raw)
    assert doc["format"] == measured.FORMAT and sorted(doc["entries"]) == ["budget_challenge", "read_profile"]
    table = doc["entries"]["read_profile"]["data"]["table"]
    assert table["rows"][0]["name"] == "aten::mm" and table["phases"]["optimizer"] == 0.07


@pytest.mark.parametrize("name", grading.MEASURED)
def test_an_unattempted_or_unmeasured_answer_saves_nothing(name):
    args, kwargs = _answers(name, True)
    blank = {"read_profile": (None, None), "loader_reading": lambda records: None,
             "memory_budget": lambda config: None}.get(name)
    res = _check(name, (blank,) + tuple(args[1:]), kwargs)
    assert not res.attempted, res
    if name in ("low_mfu_fix", "loader_reading", "read_profile"):  # the measurement itself left out
        res = _check(name, args[:1])  # fails, or for a reader of records: judged on the test records only
        assert res.attempted and (not res.passed or "test records" in res.message), res
    assert not Path(measured.FILE).exists()


# ---- after the review: what a judge takes from an entry, and when nothing is saved ------------------------

def _resealed(name, change):
    """The file with ``change(data)`` made to ``name``'s entry and its sha256 computed again -- what a learner
    who calls labkit's writer (or recomputes the hash) in their own session can submit."""
    doc = _file()
    entry = doc["entries"][name]
    change(entry["data"])
    entry["sha256"] = measured.digest(entry)
    Path(measured.FILE).write_text(json.dumps(doc))


FASTEST = dict(precision="bf16", micro_batch=8, checkpointing="none")  # over the budget in _rows()


def _reshape(name, data):
    """One change per checker that leaves the entry sealed but not what the checker saves."""
    if name == "low_mfu_fix":
        data["after"] = []
    elif name == "loader_reading":
        data["runs"][0]["summary"]["workers"] = 2  # the check reads runs of 0 loader workers only
    elif name == "read_profile":
        data["table"]["rows"][-1]["self_s"] = math.nan
    elif name == "memory_budget":
        data.update(cases=[], estimates=[], runs=[])  # zip() over empty lists judged nothing
    else:
        data.update(budget_bytes=2**40, pick=FASTEST, summary=None)  # a budget the chapter never sets


@pytest.mark.parametrize("name", grading.MEASURED)
def test_a_sealed_entry_of_another_shape_fails(name, monkeypatch):
    args, kwargs = _answers(name, True)
    assert _check(name, args, kwargs).passed
    _resealed(name, lambda data: _reshape(name, data))
    _grading(monkeypatch)
    res = _check(name, args, kwargs)
    assert res.attempted and not res.passed, res
    assert res.message.startswith(measurements.SHAPE), res.message


def test_the_challenge_judges_against_its_own_target_and_budget(monkeypatch):
    slow = dict(precision="fp32", micro_batch=2, checkpointing="none")  # fits, a third of the best's speed
    assert "fraction" not in inspect.signature(lk.check.budget_challenge).parameters
    res = lk.check.budget_challenge(slow, rows=_rows(), budget_bytes=BUDGET, fraction=0)
    assert not res.passed and not Path(measured.FILE).exists()  # the keyword is gone: nothing saved
    # practising with a budget of one's own is allowed (the chapter says so for sizes of one's own) and saved;
    # a grader judges the entry against the chapter's budget
    assert lk.check.budget_challenge(FASTEST, rows=_rows(), budget_bytes=2**40).passed
    with monkeypatch.context() as graded:
        _grading(graded)
        res = lk.check.budget_challenge(None)
    assert not res.passed and "more than the chapter's budget" in res.message, res.message
    assert not lk.check.budget_challenge(slow, rows=_rows(), budget_bytes=BUDGET).passed
    _resealed("budget_challenge", lambda data: data.update(fraction=0))  # an entry of the old checker's shape
    _grading(monkeypatch)
    res = lk.check.budget_challenge(None)
    assert res.attempted and not res.passed and "the target is 90%" in res.message, res.message


def test_the_challenge_budgets_are_the_chapters():
    """The largest budget the checker takes is the one notebooks/09's sizes cell sets, per device."""
    nb = json.loads((ROOT / "notebooks" / "09_fixed_gpus_playbook.ipynb").read_text())
    src = "".join(next(c for c in nb["cells"] if c.get("id") == "sizes-09")["source"])
    found = [math.prod(int(x) if "**" not in x else 2 ** int(x.split("**")[1]) for x in expr.split(" * "))
             for expr in re.findall(r"budget_bytes=([0-9]+(?: \* [0-9*]+)*)", src)]
    assert found == [capstone.CHALLENGE_BUDGETS["cpu"], capstone.CHALLENGE_BUDGETS["gpu"]], found


@pytest.mark.parametrize("signal", ["LABKIT_GRADING=1", "NBGRADER_EXECUTION=autograde",
                                    "NBGRADER_EXECUTION=validate"])
def test_the_writer_refuses_while_grading_or_validating(signal, monkeypatch):
    monkeypatch.setenv(*signal.split("="))
    with pytest.raises(ConfigError, match="nothing is saved while"):
        measured.write("memory_budget", "08", {"cases": [], "estimates": [], "runs": []})
    assert not Path(measured.FILE).exists()


@pytest.mark.parametrize("name", grading.MEASURED)
def test_nbgrader_validate_judges_but_saves_nothing(name, monkeypatch):
    args, kwargs = _answers(name, True)
    assert _check(name, args, kwargs).passed
    before = Path(measured.FILE).read_text()
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    wrong, wrong_kw = _answers(name, False)
    res = _check(name, wrong, wrong_kw)  # judged live, as the learner's own run
    assert res.attempted and not res.passed and res.message.endswith("(not saved: nbgrader validate)"), res
    assert Path(measured.FILE).read_text() == before


def test_the_instructor_kit_says_what_is_graded_and_what_the_hash_cannot_catch():
    text = (ROOT / "notebooks" / "README.md").read_text()
    head = "### Measured exercises: submit `labkit-measurements.json` with the notebook"
    part = text[text.index(head):]
    part = " ".join(part[:part.index("\n## ", 1)].split())
    assert "The last run of each of these checks is what gets graded" in part
    assert "not the answer cell's current text" in part
    assert "labkit.chapters.measured.write" in part and "computes the hash again" in part
    assert "nbgrader validate" in part


# ---- the measured cells while grading --------------------------------------------------------------------

def test_the_measured_cells_take_the_saved_table_pick_and_runs_while_grading(monkeypatch):
    assert lk.check.read_profile(*_answers("read_profile", True)[0]).passed
    summary = next(dict(r) for r in _rows() if r["precision"] == "bf16" and r["micro_batch"] == 4)
    assert lk.check.budget_challenge(types.SimpleNamespace(summary=summary), rows=_rows(), budget_bytes=BUDGET)
    assert saved_profile() is None and pb.saved_pick() is None  # not grading: the chapter measures
    _grading(monkeypatch)
    table = saved_profile()
    assert table.top_op() == "aten::mm" and table.phase_share("optimizer") == _table().phase_share("optimizer")
    assert pb.saved_pick().summary == summary

    def never(config):
        raise AssertionError("the calculator (and the baseline's run) must not run while grading")

    assert budget_beside_run(never, lk.Config(model="tiny")) == {"graded": True, "predicted": None, "run": None}


# ---- with nbgrader: chapter 08 autograded from the submitted file ------------------------------------------

CHAPTER = "08_memory_in_practice"
# Loaded by the grader's kernels (PYTHONPATH): counts every run of memlab.run_memory while autograding, so the
# test can see that none was made. Patched before labkit.check is imported, so the seal takes it as it is.
_COUNTER = '''
import os
if os.environ.get("NBGRADER_EXECUTION") == "autograde":
    from pathlib import Path
    from labkit.chapters import ch08_memory as memlab
    from labkit.chapters.ch08_memory import allocator as recipes
    _marks, _real = Path(os.environ["LABKIT_TEST_MARKS"]), recipes.run_memory
    def run_memory(config):
        with open(_marks / "runs", "a") as f:
            f.write(repr(config) + "\\n")
        return _real(config)
    recipes.run_memory = memlab.run_memory = run_memory
    (_marks / "loaded").write_text("yes")
'''


def _nbgrader(course_dir: Path, marks: Path, *args):
    env = {**os.environ, "CI": "true", "LABKIT_TEST_MARKS": str(marks),
           "PYTHONPATH": os.pathsep.join((str(marks / "site"), str(ROOT))),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course_dir, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _tampered(nb: dict) -> dict:
    """The learner's notebook after the measurement was saved: a wrong calculator, the locked check cell edited
    to pass anyway, and the locked cell after it (no points) deleted."""
    cells = []
    for c in nb["cells"]:
        cid = c.get("id", "")
        if cid == "c22":
            c["source"] = "def my_budget(config):\n    return 1.0\n"
        elif cid == "c22-check":
            c["source"] = "result = True\n"
        elif cid == "c22-after":
            continue
        cells.append(c)
    return {**nb, "cells": cells}


def test_nbgrader_grades_chapter_08_from_the_file_without_measuring_again(tmp_path):
    from nbgrader.api import Gradebook
    from labkit.instructor import assignments

    course_dir, marks = tmp_path / "course", tmp_path / "marks"
    (marks / "site").mkdir(parents=True)
    (marks / "site" / "sitecustomize.py").write_text(_COUNTER)
    assignments.build_nbgrader(course_dir, [CHAPTER[:2]])
    _nbgrader(course_dir, marks, "generate_assignment", CHAPTER, "--force")
    source = json.loads((course_dir / "source" / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    assert lk.check.memory_budget(sol.my_budget).passed  # the learner's check, in the learner's folder
    saved = Path(measured.FILE).read_text()
    for student, nb in (("ref", source), ("tampered", _tampered(json.loads(json.dumps(source))))):
        dest = course_dir / "submitted" / student / CHAPTER
        dest.mkdir(parents=True)
        (dest / f"{CHAPTER}.ipynb").write_text(json.dumps(nb))
        (dest / measured.FILE).write_text(saved)
    t0 = time.perf_counter()
    _nbgrader(course_dir, marks, "autograde", CHAPTER, "--force")
    print(f"\nnbgrader autograde, {CHAPTER}, two submissions: {time.perf_counter() - t0:.0f} s", flush=True)

    assert (marks / "loaded").exists(), "the run counter was not loaded in the grader's kernel"
    assert not (marks / "runs").exists(), (marks / "runs").read_text()  # no budget run made again
    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gb:
        for student in ("ref", "tampered"):
            nb = gb.find_submission_notebook(CHAPTER, CHAPTER, student)
            grade = {g.name: g.score for g in nb.grades}["check-08-memory_budget"]
            assert grade == grading.POINTS["memory_budget"], (student, [(g.name, g.score) for g in nb.grades])
    for student in ("ref", "tampered"):
        graded = json.loads((course_dir / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb").read_text())
        check = next(c for c in graded["cells"] if c.get("id") == "c22-check")
        assert "lk.check.memory_budget(my_budget)" in "".join(check["source"])  # put back by nbgrader
        after = [c for c in graded["cells"] if c.get("id") == "c22-after"]
        assert len(after) == (student == "ref")  # a deleted locked cell without points stays deleted
    graded = json.loads((course_dir / "autograded" / "ref" / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    after = next(c for c in graded["cells"] if c.get("id") == "c22-after")
    shown = json.dumps(after["outputs"])
    assert "graded from labkit-measurements.json" in shown and "not run again" in shown
