"""``labkit grade`` at class scale (issue 49, item 4): renamed notebooks, everything not graded listed, the exit
status, each learner's total and the hints in grades.csv, and ``--jobs`` (several notebooks at once, each pinned
to its own share of the cores).

Most of these replace the notebook's run by its report (``gradebox.run_notebook``): what is tested is what the
grader makes of it. The ``--jobs`` test runs real kernels: two learners' notebooks that each wait for the other's
to start -- they can both pass only if they run at the same time (with one job the first one's wait runs out) --
and record the CPUs they were given.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import nbformat
import pytest

from conftest import grading_scope
from labkit import __main__ as cli
from labkit.instructor import classgrade, grading

CH03 = "03_gradient_accumulation"
OLD_COLUMNS = ["learner", "chapter", "exercise", "score", "max_score", "status", "judged_by"]


def _hand_in(root: Path, learner: str, name: str, *cells) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in ("import labkit as lk", *cells)]
    (root / learner).mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, root / learner / name)


def _fake(report):
    """A run_notebook that reports ``report`` (a dict, or a function of the notebook's name giving one)."""
    return lambda copy, notebook, *a, **k: report(notebook) if callable(report) else report


EMPTY = {"stopped": "", "log": '{"rows": []}'}


@pytest.mark.parametrize("name,chapter", [
    (f"{CH03}.ipynb", "03"),
    (f"{CH03}-Copy1.ipynb", "03"),                      # Jupyter's Duplicate
    (f"{CH03} (1).ipynb", "03"),                         # a browser's second download
    (f"alice_{CH03}.ipynb", "03"),                       # the learner's own prefix
    ("03_my_copy.ipynb", "03"),                          # the chapter's number first
    ("Untitled.ipynb", None),
    (f"{CH03}_and_04_activation_checkpointing.ipynb", None),  # two chapters' names: neither
    (f".{CH03}.ipynb", None),                            # hidden
    (f"{CH03}.py", None),
])
def test_a_notebook_is_its_chapter_by_name_renamed_or_not(name, chapter):
    assert classgrade.chapter_of(name, classgrade.course_stems()) == chapter


def test_a_renamed_notebook_is_graded_as_its_chapter_when_it_is_the_only_one(tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    for learner, name in [("ann", f"{CH03}-Copy1.ipynb"), ("bob", f"{CH03} (1).ipynb"),
                          ("cy", f"cy_{CH03}.ipynb"), ("dee", f"{CH03}.ipynb"), ("dee", f"{CH03}-Copy1.ipynb")]:
        _hand_in(subs, learner, name)
    monkeypatch.setattr(classgrade.gradebox, "run_notebook", _fake(EMPTY))
    said = []
    rows = classgrade.grade_class(subs, tmp_path / "out", say=said.append, isolation="none", jobs=2)
    by = {(r["learner"], r["exercise"]): r["status"] for r in rows}
    for learner in ("ann", "bob", "cy"):  # graded: its checks ran (here: none), not "not graded"
        assert {s for (who, _), s in by.items() if who == learner} == {"not attempted"}, learner
    assert {s for (who, _), s in by.items() if who == "dee"} == {
        f"not graded: 2 notebooks for chapter 03 ({CH03}-Copy1.ipynb, {CH03}.ipynb): hand in one"}
    assert any(s.startswith(f"ann: {CH03}-Copy1.ipynb graded as chapter 03") for s in said), said


def test_what_is_not_graded_is_listed_at_the_end_and_nothing_graded_exits_1(tmp_path, monkeypatch, capsys):
    subs = tmp_path / "subs"
    _hand_in(subs, "ann", "Untitled.ipynb")
    (subs / "bob" / "work").mkdir(parents=True)  # a subfolder, no notebook
    monkeypatch.setattr(classgrade.gradebox, "run_notebook", _fake(EMPTY))
    assert cli.main(["grade", str(subs), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.splitlines()
    end = err[next(i for i, ln in enumerate(err) if ln.startswith("not graded (")):]
    assert end[0] == "not graded (4):", err
    listed = "\n".join(end)
    assert "ann/Untitled.ipynb" in listed and "bob/work/" in listed and "ann: no notebook" in listed \
        and "bob: no notebook" in listed
    assert err[-1].startswith("error: nothing was graded")


def test_a_chapter_that_could_not_be_run_counts_as_nothing_graded(tmp_path, monkeypatch):
    _hand_in(tmp_path / "subs", "ann", f"{CH03}.ipynb")
    monkeypatch.setattr(classgrade.gradebox, "run_notebook", _fake({"stopped": "the notebook's kernel died",
                                                                       "log": None}))
    assert cli.main(["grade", str(tmp_path / "subs"), str(tmp_path / "out")]) == 1


def test_grades_csv_keeps_its_columns_and_adds_each_hint_and_the_learners_total(tmp_path, monkeypatch):
    """A plain answer is judged again here (the grader's own hint); a function answer's hint is the one the
    learner's kernel showed; a passed exercise has none; the total is the learner's over the run."""
    _hand_in(tmp_path / "subs", "ann", f"{CH03}.ipynb")
    rows = [{"exercise": "accum_steps_needed", "passed": False, "attempted": True, "timestamp": "t", "note": "",
             "answer": json.dumps({"args": [64], "kwargs": {}})},
            {"exercise": "token_weights", "passed": False, "attempted": True, "timestamp": "t", "note": "",
             "answer": None},
            {"exercise": "accumulation_loop", "passed": True, "attempted": True, "timestamp": "t", "note": "",
             "answer": None}]
    report = {"stopped": "", "log": json.dumps({"rows": rows}),
              "hints": {"token_weights": "1/K is right only when every micro-batch holds the same tokens"}}
    monkeypatch.setattr(classgrade.gradebox, "run_notebook", _fake(report))
    classgrade.grade_class(tmp_path / "subs", tmp_path / "out", say=lambda s: None, isolation="none", jobs=1)
    table = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert list(table[0])[:7] == OLD_COLUMNS and list(table[0]) == classgrade.GRADES
    got = {r["exercise"]: r for r in table}
    assert got["accum_steps_needed"]["judged_by"] == "grader" and got["accum_steps_needed"]["hint"]
    assert got["token_weights"]["hint"] == report["hints"]["token_weights"]
    assert got["accumulation_loop"]["score"] == "2.0" and got["accumulation_loop"]["hint"] == ""
    total = grading.POINTS["accumulation_loop"]
    assert {(r["learner_total"], r["learner_max_total"]) for r in table} == {
        (str(float(total)), str(float(sum(grading.CHAPTERS["03"].values()))))}


def test_jobs_is_refused_unless_a_whole_number_from_1(tmp_path):
    _hand_in(tmp_path / "subs", "ann", f"{CH03}.ipynb")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(Exception, match="jobs="):
            classgrade.grade_class(tmp_path / "subs", tmp_path / "out", jobs=bad, isolation="none")
    assert not (tmp_path / "out").exists()


def test_the_cores_are_split_between_the_jobs():
    mine = sorted(os.sched_getaffinity(0))
    slots = classgrade._core_slots(2)
    assert len(slots) == 2 and all(slots)
    if len(mine) >= 2:
        assert not set(slots[0]) & set(slots[1]) and sorted(slots[0] + slots[1]) == mine
    assert classgrade.default_jobs() >= 1


MEET = """import os, pathlib, time
me, other = pathlib.Path({mine!r}), pathlib.Path({other!r})
me.write_text(" ".join(map(str, sorted(os.sched_getaffinity(0)))))
deadline = time.monotonic() + 240  # the other learner's notebook must start meanwhile: only if both run at once
while not other.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
met = other.exists()"""


@pytest.mark.skipif(grading_scope() == "sample", reason="two kernels at once: CI=true runs it")
def test_two_jobs_run_two_learners_at_once_each_on_its_own_cores(tmp_path):
    rendezvous = tmp_path / "meet"
    rendezvous.mkdir()
    subs = tmp_path / "subs"
    for me, other in (("ann", "bob"), ("bob", "ann")):
        _hand_in(subs, me, f"{CH03}.ipynb", MEET.format(mine=str(rendezvous / me), other=str(rendezvous / other)),
                 "lk.check.accum_steps_needed(8 if met else 1)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(classgrade, "CELL_TIMEOUT_S", 300)
        rows = classgrade.grade_class(subs, tmp_path / "out", say=lambda s: None, isolation="none", jobs=2)
    got = {r["learner"]: r["status"] for r in rows if r["exercise"] == "accum_steps_needed"}
    assert got == {"ann": "passed", "bob": "passed"}, rows
    cpus = [set(map(int, (rendezvous / who).read_text().split())) for who in ("ann", "bob")]
    if len(os.sched_getaffinity(0)) >= 2:
        assert cpus[0] and cpus[1] and not cpus[0] & cpus[1], cpus
