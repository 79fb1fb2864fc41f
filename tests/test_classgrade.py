"""The instructor kit's third path: ``python -m labkit grade SUBMISSIONS OUT`` (labkit/instructor/classgrade.py).

Three learners hand in small notebooks named as chapters 03 and 08. ada answers right (one check run twice:
the last decides; a check of another chapter added: not counted; a check deleted: still counted, not
attempted) and her measured check is judged from the file her own check saved, whatever the re-run cell
passes. bob answers wrong, has a cell that raises, a cell that never ends (interrupted at the time limit) and no
measurement file. cy hands in two notebooks for one chapter and one whose kernel dies: each of those chapters
says why it was not graded. Each notebook runs in a fresh kernel in the learner's folder, graded.
"""
from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path

import nbformat
import pytest

from labkit import __main__ as cli
from labkit.base.runtime import ConfigError
from labkit.instructor import classgrade, grading

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


def _hand_in(root: Path, learner: str, nb, name: str) -> Path:
    folder = root / learner
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder


CH03, CH08 = "03_gradient_accumulation.ipynb", "08_memory_in_practice.ipynb"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("grades")
    # ada: right answers; a check run twice (wrong, then right: the last one counts); a check of another chapter
    # added (not counted); chapter 08's measured check with the file her own check saved, and a cell that now
    # passes it a wrong answer (judged from the file all the same)
    ada = _hand_in(root, "ada", _notebook(
        "lk.check.accum_steps_needed(64)",
        "lk.check.accum_steps_needed(8)",
        "def token_weights(counts):\n    return [n / sum(counts) for n in counts]\n"
        "lk.check.token_weights(token_weights)",
        "lk.check.pad_vocab(lambda v, m=64: -(-v // m) * m)"), CH03)
    _hand_in(root, "ada", _notebook("lk.check.memory_budget(lambda config: 0)"), CH08)
    _save_measurement(ada)
    # bob: a wrong answer, a cell that raises before its check, a cell that never ends (interrupted at the time
    # limit; the checks after it still run); chapter 08 without the measurement file
    _hand_in(root, "bob", _notebook(
        "lk.check.accum_steps_needed(64)",
        "raise RuntimeError('my cell is broken')\nlk.check.token_weights(None)",
        "while True:\n    pass",
        "lk.check.accumulation_loop(None)"), CH03)
    _hand_in(root, "bob", _notebook("lk.check.memory_budget(None)"), CH08)
    # cy: two notebooks for chapter 03; a chapter 08 whose kernel dies
    _hand_in(root, "cy", _notebook("lk.check.accum_steps_needed(8)"), CH03)
    _hand_in(root, "cy", _notebook("lk.check.accum_steps_needed(8)"), "03_my_copy.ipynb")
    _hand_in(root, "cy", _notebook("import os\nos._exit(1)"), CH08)
    said = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(classgrade, "CELL_TIMEOUT_S", 15)  # a first import of torch under load takes seconds
        rows = classgrade.grade_class(root, out, say=said.append)
    return rows, out, said, root


def _by(rows, learner, chapter) -> dict:
    return {r["exercise"]: r for r in rows if r["learner"] == learner and r["chapter"] == chapter}


def test_the_course_chapter_says_what_is_graded_and_the_last_check_decides(graded):
    rows, _, said, _ = graded
    ada = _by(rows, "ada", "03")
    assert list(ada) == ["accum_steps_needed", "token_weights", "accumulation_loop"]  # 03's own, in order
    for name in ("accum_steps_needed", "token_weights"):
        assert ada[name]["status"] == "passed", ada[name]
        assert ada[name]["score"] == ada[name]["max_score"] == grading.POINTS[name]
    assert ada["accumulation_loop"]["status"] == "not attempted"  # deleted from her notebook: still counted
    assert "pad_vocab" not in {r["exercise"] for r in rows}  # a check of another chapter, added: not counted
    assert any(s.startswith("ada 03: 3 of 5 points") for s in said), said


def test_the_measured_check_is_judged_from_the_saved_file_not_rerun(graded):
    rows, out, _, root = graded
    ada = _by(rows, "ada", "08")["memory_budget"]
    # the re-run cell passes a wrong calculator; the grade comes from what her own check saved
    assert ada["status"] == "passed" and ada["score"] == grading.POINTS["memory_budget"], ada
    log = list(csv.DictReader((out / "checks" / "ada.csv").open()))
    assert [r["exercise"] for r in log].count("memory_budget") == 1
    # bob saved nothing, and grading writes no file for him
    assert _by(rows, "bob", "08")["memory_budget"]["status"] == "not passed"
    assert not (root / "bob" / "labkit-measurements.json").exists()


def test_wrong_raising_hanging_and_blank_score_zero_each_with_its_reason(graded):
    rows, _, said, _ = graded
    bob = _by(rows, "bob", "03")
    assert bob["accum_steps_needed"]["score"] == 0 and bob["accum_steps_needed"]["status"] == "not passed"
    assert bob["token_weights"]["status"] == "not attempted"  # its cell raised before the check ran
    assert bob["accumulation_loop"]["status"] == "not attempted"  # checked after the interrupted cell
    assert all(r["max_score"] == grading.POINTS[r["exercise"]] for r in rows)
    assert any(s.startswith("bob 03: 0 of 5 points") for s in said), said


def test_a_chapter_that_cannot_be_graded_says_why(graded):
    rows, _, said, _ = graded
    cy03, cy08 = _by(rows, "cy", "03"), _by(rows, "cy", "08")
    assert {r["status"] for r in cy03.values()} == {
        "not graded: 2 notebooks for chapter 03 (03_gradient_accumulation.ipynb, 03_my_copy.ipynb): hand in one"}
    assert {r["status"] for r in cy08.values()} == {"not graded: the notebook's kernel died"}
    assert all(r["score"] == 0 for r in list(cy03.values()) + list(cy08.values()))
    assert len(cy08) == len(classgrade.course_checks()["08"]) >= 4


def test_files_written(graded):
    rows, out, _, _ = graded
    table = list(csv.DictReader((out / "grades.csv").open()))
    assert [list(r) for r in table[:1]] == [classgrade.GRADES]
    assert len(table) == len(rows) == 3 * (3 + len(classgrade.course_checks()["08"]))
    assert sorted(p.name for p in (out / "checks").iterdir()) == ["ada.csv", "bob.csv", "cy.csv"]
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
    _hand_in(tmp_path / "subs", "ada", _notebook(), CH03)
    for bad in (["3"], ["99"], []):
        with pytest.raises(ConfigError, match="chapters="):
            classgrade.grade_class(tmp_path / "subs", tmp_path / "out", chapters=bad)
    assert cli.main(["grade", str(tmp_path / "none"), str(tmp_path / "out")]) == 2
    assert "submissions=" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
