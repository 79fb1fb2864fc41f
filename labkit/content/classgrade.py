"""Grading a class without a grading tool: ``python -m labkit grade SUBMISSIONS OUT`` (the instructor kit's
third path, beside nbgrader and otter; issue 32).

SUBMISSIONS holds one folder per learner with their chapters (``NN_*.ipynb``) and, for the measured exercises,
the ``labkit-measurements.json`` their checks saved. Each notebook runs top to bottom in a fresh kernel started
in the learner's folder, with ``LABKIT_GRADING=labkit`` -- so the chapters run in their short mode and the
measured checks judge the saved file, not a re-run on this machine -- and with errors allowed: a cell that
raises costs the checks that need it, not the rest. A last cell, added here, writes that kernel's grade log.

Written in OUT:

* ``checks/<learner>.csv``: every check the learner's notebooks ran, as ``lk.check.export_csv`` writes it;
* ``grades.csv``: one row per learner and exercise of the chapters submitted -- the last check of an exercise
  decides, its points from ``labkit.check.grading.POINTS``; an exercise no check ran is "not attempted", a check
  whose row carries a note (labkit's code changed in that kernel, a row no check recorded) scores 0.

Running submissions runs the learners' code: do it in a throw-away account or container.
"""
from __future__ import annotations

import csv
import io
import os
import re
import tempfile
import time
from pathlib import Path

from ..base.errors import ConfigError
from ..base.paths import write_atomic
from ..check import grading

__all__ = ["GRADES", "chapter_checks", "grade_class"]

GRADES = ["learner", "chapter", "exercise", "score", "max_score", "status"]
CHAPTER = re.compile(r"^\d\d_\w+\.ipynb$")
CHECK_CALL = re.compile(r"\blk\.check\.(\w+)\(")
CELL_TIMEOUT_S = 600  # a chapter's cells train small models: a grader's CPU needs more than a few seconds


def chapter_checks(nb) -> list:
    """The checkers a chapter's code cells call, in order (each once): the exercises it is graded on."""
    names = [n for c in nb.cells if c.cell_type == "code" for n in CHECK_CALL.findall(c.source)]
    return [n for n in dict.fromkeys(names) if n in grading.POINTS]


def _learners(submissions: Path) -> list:
    if not submissions.is_dir():
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner")
    folders = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner (it has none)")
    return folders


def _run(path: Path, learner: str, log: Path):
    """Run one notebook in a fresh kernel in its folder, grading mode on; its grade log goes to ``log``."""
    import nbformat  # deferred: notebook libraries are for this command only
    from nbclient import NotebookClient  # deferred: likewise

    nb = nbformat.read(path, as_version=4)
    checks = chapter_checks(nb)
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import labkit as lk\nlk.check.export_csv({str(log)!r}, learner={learner!r})"))
    env = {**os.environ, "LABKIT_GRADING": "labkit"}
    env.pop("NBGRADER_EXECUTION", None)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=env)
    return checks


def _status(row) -> tuple:
    """(passed, status) of the last logged check of an exercise (None: no check ran)."""
    if row is None or row["attempted"] != "True":
        return False, "not attempted"
    if row["note"]:
        return False, f"not counted: {row['note']}"
    return (True, "passed") if row["passed"] == "True" else (False, "not passed")


def grade_class(submissions, out, chapters=None, say=print) -> list:
    """Grade every learner's chapters in ``submissions`` (``chapters``: numbers such as ["03", "11"]; None:
    every ``NN_*.ipynb`` found); write OUT/checks/<learner>.csv and OUT/grades.csv. Returns grades.csv's rows."""
    submissions, out = Path(submissions), Path(out)
    wanted = None if chapters is None else {str(c) for c in chapters}
    if wanted is not None and (not wanted or any(not re.fullmatch(r"\d\d", c) for c in wanted)):
        raise ConfigError("chapters", sorted(wanted), "two-digit chapter numbers, e.g. 03,11")
    learners = _learners(submissions)
    (out / "checks").mkdir(parents=True, exist_ok=True)
    grades = []
    for folder in learners:
        logged, learner = [], folder.name
        for path in sorted(p for p in folder.iterdir() if CHAPTER.match(p.name)):
            if wanted is not None and path.name[:2] not in wanted:
                continue
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                log = Path(tmp) / "log.csv"
                checks = _run(path, learner, log)
                rows = list(csv.DictReader(log.open())) if log.exists() else []
            logged += rows
            last = {r["exercise"]: r for r in rows}  # the log is oldest first: the last check decides
            got = 0.0
            for name in checks:
                passed, status = _status(last.get(name))
                points = float(grading.POINTS[name])
                got += points if passed else 0.0
                grades.append({"learner": learner, "chapter": path.stem, "exercise": name,
                               "score": points if passed else 0.0, "max_score": points, "status": status})
            total = sum(grading.POINTS[n] for n in checks)
            note = "" if rows else " (its grade log was not written: the notebook's kernel died or was stopped)"
            say(f"{learner} {path.stem}: {got:g} of {total:g} points, {time.perf_counter() - t0:.0f} s{note}")
        write_atomic(out / "checks" / f"{learner}.csv", _csv(logged, ["learner", "exercise", "passed", "attempted",
                                                           "timestamp", "note"]))
    write_atomic(out / "grades.csv", _csv(grades, GRADES))
    return grades


def _csv(rows, fields) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
