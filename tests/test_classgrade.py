"""The instructor kit's third path: ``python -m labkit grade SUBMISSIONS OUT`` (labkit/content/classgrade.py).

Two learners hand in a small chapter-shaped notebook (four checks, one of them measured): one answers right,
one answers wrong, has a cell that raises and leaves an exercise blank. Each notebook runs in a fresh kernel
in the learner's folder, graded: grades.csv gives each exercise its points from POINTS when its last check
passed, 0 otherwise with why; a raising cell costs only the check that needed it; the measured check is judged
from the learner's saved file, never re-measured (no file: "no measurement saved").
"""
from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path

import nbformat
import pytest

from labkit import __main__ as cli
from labkit.base.errors import ConfigError
from labkit.check import grading
from labkit.content import classgrade

SETUP = "import labkit as lk"
ROOT = Path(__file__).resolve().parent.parent


def _reference(family: str, name: str):
    spec = importlib.util.spec_from_file_location(f"solutions_{family}", ROOT / "notebooks" / "solutions" / f"{family}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def _save_measurement(folder: Path):
    """The learner's own check of the measured exercise, run where they work: it saves the measurement file."""
    import labkit as lk

    here = os.getcwd()
    os.chdir(folder)
    try:
        assert lk.check.memory_budget(_reference("practice", "my_budget")).passed
    finally:
        os.chdir(here)
    assert (folder / "labkit-measurements.json").is_file()


def _notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP)] + [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def _hand_in(root: Path, learner: str, nb, name="03_mini.ipynb") -> Path:
    folder = root / learner
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / name)
    return folder


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("grades")
    # ada: right answers; a check run twice (wrong, then right: the last one counts); the measured check with the
    # file her own check saved, and a cell that now passes it a wrong answer (judged from the file all the same)
    ada = _hand_in(root, "ada", _notebook(
        "lk.check.accum_steps_needed(64)",
        "lk.check.accum_steps_needed(8)",
        "def token_weights(counts):\n    return [n / sum(counts) for n in counts]\n"
        "lk.check.token_weights(token_weights)",
        "lk.check.pad_vocab(lambda v, m=64: -(-v // m) * m)",
        "lk.check.memory_budget(lambda config: 0)"))
    _save_measurement(ada)
    # bob: a wrong answer, a cell that raises before its check, an exercise left blank
    _hand_in(root, "bob", _notebook(
        "lk.check.accum_steps_needed(64)",
        "raise RuntimeError('my cell is broken')\nlk.check.token_weights(None)",
        "lk.check.pad_vocab(None)",
        "lk.check.memory_budget(None)"))
    said = []
    rows = classgrade.grade_class(root, out, say=said.append)
    return rows, out, said, root


def _by(rows, learner) -> dict:
    return {r["exercise"]: r for r in rows if r["learner"] == learner}


def test_right_answers_get_their_points_and_the_last_check_decides(graded):
    rows, _, _, _ = graded
    ada = _by(rows, "ada")
    assert sorted(ada) == ["accum_steps_needed", "memory_budget", "pad_vocab", "token_weights"]
    for name in ("accum_steps_needed", "token_weights", "pad_vocab"):
        assert ada[name]["status"] == "passed", ada[name]
        assert ada[name]["score"] == ada[name]["max_score"] == grading.POINTS[name]


def test_the_measured_check_is_judged_from_the_saved_file_not_rerun(graded):
    rows, out, _, root = graded
    ada = _by(rows, "ada")["memory_budget"]
    # the re-run cell passes a wrong calculator; the grade comes from what her own check saved
    assert ada["status"] == "passed" and ada["score"] == grading.POINTS["memory_budget"], ada
    log = list(csv.DictReader((out / "checks" / "ada.csv").open()))
    assert [r["exercise"] for r in log].count("memory_budget") == 1
    # bob saved nothing, and grading writes no file for him
    assert _by(rows, "bob")["memory_budget"]["score"] == 0
    assert not (root / "bob" / "labkit-measurements.json").exists()


def test_wrong_raising_and_blank_score_zero_each_with_its_reason(graded):
    rows, _, said, root = graded
    bob = _by(rows, "bob")
    assert bob["accum_steps_needed"]["score"] == 0 and bob["accum_steps_needed"]["status"] == "not passed"
    assert bob["token_weights"]["status"] == "not attempted"  # its cell raised before the check ran
    assert bob["pad_vocab"]["status"] == "not attempted"
    assert bob["memory_budget"]["status"] == "not passed"  # graded from a file he did not submit
    assert all(r["max_score"] == grading.POINTS[r["exercise"]] for r in rows)
    assert any(s.startswith("ada 03_mini: 6 of 6 points") for s in said), said
    assert any(s.startswith("bob 03_mini: 0 of 6 points") for s in said), said


def test_files_written(graded):
    rows, out, _, _ = graded
    table = list(csv.DictReader((out / "grades.csv").open()))
    assert [list(r) for r in table[:1]] == [classgrade.GRADES]
    assert len(table) == len(rows) == 8
    assert sorted(p.name for p in (out / "checks").iterdir()) == ["ada.csv", "bob.csv"]
    ada_log = list(csv.DictReader((out / "checks" / "ada.csv").open()))
    assert [r["exercise"] for r in ada_log][:2] == ["accum_steps_needed", "accum_steps_needed"]
    assert {r["learner"] for r in ada_log} == {"ada"}


def test_chapter_checks_are_the_checkers_a_notebook_calls():
    nb = _notebook("lk.check.pad_vocab(x)\nlk.check.names()", "lk.check.pad_vocab(y)  # again",
                   "lk.check.export_csv('a.csv')")
    assert classgrade.chapter_checks(nb) == ["pad_vocab"]


def test_bad_input_is_refused_before_any_notebook_runs(tmp_path, capsys):
    with pytest.raises(ConfigError, match="submissions="):
        classgrade.grade_class(tmp_path / "none", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="it has none"):
        classgrade.grade_class(tmp_path / "empty", tmp_path / "out")
    _hand_in(tmp_path / "subs", "ada", _notebook())
    with pytest.raises(ConfigError, match="chapters="):
        classgrade.grade_class(tmp_path / "subs", tmp_path / "out", chapters=["3"])
    assert cli.main(["grade", str(tmp_path / "none"), str(tmp_path / "out")]) == 2
    assert "submissions=" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
