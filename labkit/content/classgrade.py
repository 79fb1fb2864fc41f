"""Grading a class without a grading tool: ``python -m labkit grade SUBMISSIONS OUT`` (the instructor kit's
third path, beside nbgrader and otter; issue 32).

SUBMISSIONS holds one folder per learner with their chapters (``NN_*.ipynb``) and, for the measured exercises,
the ``labkit-measurements.json`` their checks saved. Each notebook runs top to bottom in a fresh kernel started
in the learner's folder, with ``LABKIT_GRADING=labkit`` -- so the chapters run in their short mode and the
measured checks judge the saved file, not a re-run on this machine -- and with errors allowed: a cell that
raises costs the checks that need it, not the rest. A last cell, added here, writes that kernel's grade log.

Written in OUT:

* ``checks/<learner>.csv``: every check the learner's notebooks ran, as ``lk.check.export_csv`` writes it;
* ``grades.csv``: one row per learner and exercise of the chapters submitted. The exercises are those of the
  course's own chapter (a check deleted from a submission still counts, one added to it does not); the last
  check of an exercise decides, its points from ``labkit.check.grading.POINTS``; an exercise no check ran is
  "not attempted", a check whose row carries a note (labkit's code changed in that kernel, a row no check
  recorded) scores 0, and a chapter that could not be graded (two notebooks for it, a dead kernel) says why.

A cell past the time limit is interrupted and the run goes on, like a cell that raises. The checks run in the
learner's kernel, after the learner's own cells: what a check there can and cannot guarantee is in the
instructor kit. Running submissions runs the learners' code: do it in a throw-away account or container.
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
from . import coursefiles
from .exercises import check_calls

__all__ = ["GRADES", "chapter_checks", "course_checks", "grade_class"]

GRADES = ["learner", "chapter", "exercise", "score", "max_score", "status"]
CHAPTER = re.compile(r"^\d\d_\w+\.ipynb$")
CELL_TIMEOUT_S = 600  # a chapter's cells train small models: a grader's CPU needs more than a few seconds


def chapter_checks(nb) -> list:
    """The checkers a chapter's code cells call, in order (each once): the exercises it is graded on."""
    names = [n for c in nb.cells if c.cell_type == "code" for n in check_calls(c.source)]
    return [n for n in dict.fromkeys(names) if n in grading.POINTS]


def course_checks() -> dict:
    """{chapter number: the checkers of the course's own chapter}: what each chapter is graded on, whatever a
    submitted notebook still calls (a learner who deletes a check does not remove its exercise)."""
    import nbformat  # deferred: notebook libraries are for this command only

    chapters = sorted((coursefiles.source_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))  # checkout or package
    return {p.name[:2]: chapter_checks(nbformat.read(p, as_version=4)) for p in chapters}


def _learners(submissions: Path) -> list:
    if not submissions.is_dir():
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner")
    folders = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner (it has none)")
    return folders


def _handed_in(folder: Path, known: dict, wanted) -> dict:
    """{chapter number: [the learner's notebooks for it]} for the course's chapters (others are not graded)."""
    out = {}
    for path in sorted(p for p in folder.iterdir() if CHAPTER.match(p.name)):
        number = path.name[:2]
        if number in known and (wanted is None or number in wanted):
            out.setdefault(number, []).append(path)
    return out


def _run(path: Path, learner: str, log: Path) -> str:
    """Run one notebook in a fresh kernel in its folder, grading mode on; its grade log goes to ``log``.
    Returns "" when it ran to the end, else why it stopped (a cell past the time limit, a dead kernel)."""
    import nbformat  # deferred: notebook libraries are for this command only
    from nbclient import NotebookClient  # deferred: likewise
    from nbclient.exceptions import CellTimeoutError, DeadKernelError  # deferred: likewise

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import labkit as lk\nlk.check.export_csv({str(log)!r}, learner={learner!r})"))
    env = {**os.environ, "LABKIT_GRADING": "labkit"}
    env.pop("NBGRADER_EXECUTION", None)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute(env=env)
    except CellTimeoutError:  # the interrupt did not stop it
        return f"a cell ran past {CELL_TIMEOUT_S} s and could not be interrupted"
    except DeadKernelError:
        return "the notebook's kernel died"
    return ""


def _status(row) -> tuple:
    """(passed, status) of the last logged check of an exercise (None: no check ran)."""
    if row is None or row["attempted"] != "True":
        return False, "not attempted"
    if row["note"]:
        return False, f"not counted: {row['note']}"
    return (True, "passed") if row["passed"] == "True" else (False, "not passed")


def grade_class(submissions, out, chapters=None, say=print) -> list:
    """Grade every learner's chapters in ``submissions`` (``chapters``: numbers such as ["03", "11"]; None:
    every chapter of the course a learner handed in); write OUT/checks/<learner>.csv and OUT/grades.csv (after
    each learner, so a stopped run keeps what it graded). Returns grades.csv's rows."""
    submissions, out = Path(submissions), Path(out)
    wanted = None if chapters is None else {str(c) for c in chapters}
    known = course_checks()
    if wanted is not None and (not wanted or not wanted <= set(known)):
        raise ConfigError("chapters", sorted(wanted), f"chapter numbers among {', '.join(sorted(known))}")
    learners = _learners(submissions)
    (out / "checks").mkdir(parents=True, exist_ok=True)
    grades = []
    for folder in learners:
        logged, learner = [], folder.name
        for number, paths in _handed_in(folder, known, wanted).items():
            checks, rows, why, t0 = known[number], [], "", time.perf_counter()
            if len(paths) > 1:
                why = f"{len(paths)} notebooks for chapter {number} ({', '.join(p.name for p in paths)}): hand in one"
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    log = Path(tmp) / "log.csv"
                    why = _run(paths[0], learner, log)
                    rows = list(csv.DictReader(log.open())) if log.exists() else []
                if not rows and not why:
                    why = "its grade log was not written (the kernel was stopped, or the notebook ended it)"
            logged += rows
            last = {r["exercise"]: r for r in rows}  # the log is oldest first: the last check decides
            for name in checks:
                passed, status = _status(last.get(name)) if not why else (False, f"not graded: {why}")
                points = float(grading.POINTS[name])
                grades.append({"learner": learner, "chapter": number, "exercise": name,
                               "score": points if passed else 0.0, "max_score": points, "status": status})
            got = sum(g["score"] for g in grades if g["learner"] == learner and g["chapter"] == number)
            total = sum(grading.POINTS[n] for n in checks)
            note = f" ({why})" if why else ""
            say(f"{learner} {number}: {got:g} of {total:g} points, {time.perf_counter() - t0:.0f} s{note}")
        write_atomic(out / "checks" / f"{learner}.csv", _csv(logged, ["learner", "exercise", "passed", "attempted",
                                                                      "timestamp", "note"]))
        write_atomic(out / "grades.csv", _csv(grades, GRADES))
    write_atomic(out / "grades.csv", _csv(grades, GRADES))
    return grades


def _csv(rows, fields) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
