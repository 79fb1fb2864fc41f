"""Grading a class without a grading tool: ``python -m labkit grade SUBMISSIONS OUT`` (the instructor kit's
third path, beside nbgrader and otter; issues 32 and 45).

SUBMISSIONS holds one folder per learner with their chapters (``NN_*.ipynb``) and, for the measured exercises,
the ``labkit-measurements.json`` their checks saved. Each notebook runs apart (``gradebox``): in a sandbox or
under a user id of its own where the machine allows it, on the grader's copy of that learner's folder only
(plain files; links are left out), with a clean environment, limits on processes, memory, file size and output,
a time limit per cell and per notebook, and its whole process tree killed afterwards. It runs top to bottom in a
fresh kernel with ``LABKIT_GRADING=labkit`` -- the chapters run in their short mode and the measured checks judge
the saved file -- and with errors allowed: a cell that raises costs the checks that need it, not the rest. A last
cell, added here, writes the kernel's grade log, which the runner hands back.

That log is the learner's kernel's word: the grader reads at most a few MiB of it, refuses any other shape, and
judges again in its own process -- which no learner code reaches -- every check whose answer was plain data (a
number, a string, a list) and every measured check (from the learner's saved file). A check whose answer was a
function is judged in the learner's kernel only (``judged_by`` says which). What a learner's code can still do
there is said in the instructor kit.

Written in OUT (made 0700, its files 0600), by the grader's process only:

* ``checks/<learner>.csv``: every check the learner's notebooks ran, as ``lk.check.export_csv`` writes it;
* ``grades.csv``: one row per learner and exercise of the chapters submitted. The exercises are those of the
  course's own chapter (a check deleted from a submission still counts, one added to it does not); the last
  check of an exercise decides, its points from ``labkit.check.grading.POINTS``; an exercise no check ran is
  "not attempted", a check whose row carries a note (labkit's code changed in that kernel, a row no check
  recorded) scores 0, and a chapter that could not be graded (two notebooks for it, a file that is not a
  notebook, a link, a dead kernel, a cell that ignored its interrupt) says why.

A CSV cell that starts with ``= + - @``, a tab or a carriage return is written with a ``'`` before it.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

from ..base.errors import ConfigError
from ..base.paths import write_atomic
from ..check import grading
from ..check._core import csv_cell
from . import coursefiles, gradebox
from .exercises import check_calls

__all__ = ["GRADES", "GradesNotWritten", "chapter_checks", "course_checks", "grade_class"]

GRADES = ["learner", "chapter", "exercise", "score", "max_score", "status", "judged_by"]
LOG_FIELDS = ["learner", "exercise", "passed", "attempted", "timestamp", "note"]
CHAPTER = re.compile(r"^\d\d_\w+\.ipynb$")
CELL_TIMEOUT_S = 600  # a chapter's cells train small models: a grader's CPU needs more than a few seconds
NOTEBOOK_TIMEOUT_S = 3600  # a whole notebook, whatever its cells do: then its process tree is killed
NOTEBOOK_BYTES = 64 << 20  # a submitted notebook larger than this is not read
ANSWER_BYTES = 1 << 16     # a logged answer longer than this is not judged again


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


def _learners(submissions: Path, say) -> list:
    """The learners' folders; what else SUBMISSIONS holds is said, never skipped silently."""
    if not submissions.is_dir():
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner")
    folders = []
    for p in sorted(submissions.iterdir()):
        if p.name.startswith("."):
            say(f"skipped {p.name}: a hidden name (rename it without the dot to grade it)")
        elif p.is_symlink():
            say(f"skipped {p.name}: a symbolic link (hand in the folder itself)")
        elif not p.is_dir():
            say(f"skipped {p.name}: not a folder (SUBMISSIONS holds one folder per learner)")
        else:
            folders.append(p)
    if not folders:
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner (it has none)")
    return folders


def _handed_in(folder: Path, known: dict, wanted, say) -> dict:
    """{chapter number: [the learner's notebooks for it]} for the course's chapters; every other notebook (a
    renamed one, another chapter's number, a hidden one) is said."""
    out = {}
    for path in sorted(folder.iterdir()):
        if not path.name.endswith(".ipynb"):
            continue
        if not CHAPTER.match(path.name) or path.name[:2] not in known:
            say(f"{folder.name}: {path.name} is not graded: name it as the course's chapter (NN_name.ipynb)")
        elif wanted is None or path.name[:2] in wanted:
            out.setdefault(path.name[:2], []).append(path)
    return out


def _copy(folder: Path, into: Path) -> list:
    """The learner's plain files (no link, nothing under a subfolder) into ``into``; returns the names left out."""
    left = []
    for p in sorted(folder.iterdir()):
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            shutil.copyfile(p, into / p.name, follow_symlinks=False)
        else:
            left.append(p.name)
    return left


def _notebook_problem(path: Path):
    """Why ``path`` cannot be graded as a notebook, or None: a link, not a file, too large, not a notebook."""
    import nbformat  # deferred: notebook libraries are for this command only

    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link (hand in the notebook itself)"
    if not stat.S_ISREG(st.st_mode):
        return "not a file"
    if st.st_size > NOTEBOOK_BYTES:
        return f"not a notebook ({st.st_size} bytes, more than the {NOTEBOOK_BYTES >> 20} MiB read)"
    try:
        nbformat.reads(path.read_bytes().decode("utf-8"), as_version=4)
    except Exception as e:  # noqa: BLE001 -- empty, truncated, not JSON, not a notebook's JSON: all say so
        first = (str(e).strip().splitlines() or [""])[0][:120]
        return f"not a notebook ({type(e).__name__}{': ' + first if first else ''})"
    return None


# ---- what the runner handed back --------------------------------------------------------------------------

def _log_rows(report: dict):
    """The kernel's grade log rows as the grader accepts them, or None when the report holds none or holds
    anything else (each field's type is checked; the learner's code may have written it)."""
    text = report.get("log")
    if not isinstance(text, str):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        return None
    out = []
    for r in rows:
        if not (isinstance(r, dict) and isinstance(r.get("exercise"), str) and isinstance(r.get("passed"), bool)
                and isinstance(r.get("attempted"), bool) and isinstance(r.get("note", ""), str)
                and isinstance(r.get("timestamp", ""), str) and isinstance(r.get("answer"), (str, type(None)))):
            return None
        out.append({"exercise": r["exercise"][:200], "passed": r["passed"], "attempted": r["attempted"],
                    "timestamp": r.get("timestamp", "")[:40], "note": r.get("note", "")[:500],
                    "answer": r["answer"] if r["answer"] is None or len(r["answer"]) <= ANSWER_BYTES else None})
    return out


@contextlib.contextmanager
def _grading_in(folder: Path):
    """This process as a grader run in ``folder`` (where the learner's measurement file is), for a measured check."""
    old, here = os.environ.get("LABKIT_GRADING"), os.getcwd()
    os.environ["LABKIT_GRADING"] = "labkit"
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)
        if old is None:
            os.environ.pop("LABKIT_GRADING", None)
        else:
            os.environ["LABKIT_GRADING"] = old


def _judged_again(row: dict, copy: Path):
    """The grader's own verdict on a logged check (True/False), or None where only the kernel could judge it (a
    function as the answer). Run here, in the grader's process: the learner's code never ran in it."""
    from .. import check  # deferred: the checkers load torch; only a logged check needs them here

    name = row["exercise"]
    if name not in grading.POINTS:
        return None
    fn = getattr(check, name)
    if name in grading.MEASURED:
        with _grading_in(copy):
            return bool(fn(check.SAVED).passed)
    if row["answer"] is None:
        return None
    try:
        given = json.loads(row["answer"])
        args, kwargs = given["args"], given["kwargs"]
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return False
    except (ValueError, KeyError, TypeError):
        return False
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return bool(fn(*args, **kwargs).passed)


def _status(row, again) -> tuple:
    """(passed, status, judged_by) of the last logged check of an exercise (None: no check ran)."""
    if row is None or not row["attempted"]:
        return False, "not attempted", ""
    if row["note"]:
        return False, f"not counted: {row['note']}", "kernel"
    if again is None and row["exercise"] in grading.PLAIN_ANSWERS:  # a forged row would leave its answer out
        return False, "not counted: its answer is not in the log, and the grader checks this one itself", "grader"
    if again is None:
        return (row["passed"], "passed" if row["passed"] else "not passed", "kernel")
    if again != row["passed"]:
        return again, ("passed" if again else "not passed") + " (the grader's own check differs from the kernel's)", \
            "grader"
    return again, "passed" if again else "not passed", "grader"


# ---- the class -------------------------------------------------------------------------------------------

def _grade_one(path: Path, learner: str, mode: str, keep) -> tuple:
    """(why it was not graded or "", the log's rows, the copy's folder kept for the measured checks)."""
    problem = _notebook_problem(path)
    if problem:
        return problem, [], None
    work = Path(tempfile.mkdtemp(prefix="labkit-grade-copy-"))
    copy = work / "learner"
    copy.mkdir()
    _copy(path.parent, copy)
    report = gradebox.run_notebook(copy, path.name, learner, mode, CELL_TIMEOUT_S, NOTEBOOK_TIMEOUT_S, keep)
    rows = _log_rows(report)
    why = report.get("stopped") if isinstance(report.get("stopped"), str) else "its runner's report is unreadable"
    if not why and report.get("log") is None:
        why = "its grade log was not written (the kernel was stopped, or the notebook ended it)"
    elif not why and rows is None:
        why = "its grade log is not what labkit writes (it was changed in the kernel)"
    return why[:300], rows or [], work


def grade_class(submissions, out, chapters=None, say=print, isolation=None) -> list:
    """Grade every learner's chapters in ``submissions`` (``chapters``: numbers such as ["03", "11"]; None:
    every chapter of the course a learner handed in); write OUT/checks/<learner>.csv and OUT/grades.csv (after
    each learner, so a stopped run keeps what it graded). ``isolation``: a mode of ``gradebox.MODES`` (None:
    the best this machine allows). Returns grades.csv's rows."""
    submissions, out = Path(submissions), Path(out)
    wanted = None if chapters is None else {str(c) for c in chapters}
    known = course_checks()
    if wanted is not None and (not wanted or not wanted <= set(known)):
        raise ConfigError("chapters", sorted(wanted), f"chapter numbers among {', '.join(sorted(known))}")
    learners = _learners(submissions, say)
    mode, line = gradebox.isolation(isolation)
    say(line)
    _private_dir(out)
    _private_dir(out / "checks")
    keep = gradebox.children()
    reaper = gradebox.subreaper(True)
    grades = []
    try:
        for folder in learners:
            logged = _grade_learner(folder, known, wanted, mode, keep, grades, say)
            _save(out / "checks" / f"{folder.name}.csv", _csv(logged, LOG_FIELDS), say)
            _save(out / "grades.csv", _csv(grades, GRADES), say)
    finally:
        gradebox.sweep(keep)
        if reaper:
            gradebox.subreaper(False)
    text = _csv(grades, GRADES)
    try:
        write_atomic(out / "grades.csv", text)
        os.chmod(out / "grades.csv", 0o600)
    except OSError as e:
        raise GradesNotWritten(f"could not write {out / 'grades.csv'}: {e}", text) from None
    return grades


class GradesNotWritten(OSError):
    """grades.csv could not be written at the end (a full disk): ``text`` holds it, for the command to print."""

    def __init__(self, message: str, text: str):
        super().__init__(message)
        self.text = text


def _grade_learner(folder: Path, known: dict, wanted, mode: str, keep, grades: list, say) -> list:
    """Grade one learner's chapters into ``grades``; returns the rows their kernels logged."""
    logged, learner = [], folder.name
    for number, paths in _handed_in(folder, known, wanted, say).items():
        checks, rows, why, work, t0 = known[number], [], "", None, time.perf_counter()
        try:
            if len(paths) > 1:
                why = f"{len(paths)} notebooks for chapter {number} ({', '.join(p.name for p in paths)}): hand in one"
            else:
                why, rows, work = _grade_one(paths[0], learner, mode, keep)
            logged += [{"learner": learner, **{k: r[k] for k in LOG_FIELDS[1:]}} for r in rows]
            last = {r["exercise"]: r for r in rows}  # the log is oldest first: the last check decides
            for name in checks:
                row = last.get(name)
                if why:
                    passed, status, judged = False, f"not graded: {why}", ""
                else:
                    again = _judged_again(row, work / "learner") if row and row["attempted"] and not row["note"] else None
                    passed, status, judged = _status(row, again)
                points = float(grading.POINTS[name])
                grades.append({"learner": learner, "chapter": number, "exercise": name,
                               "score": points if passed else 0.0, "max_score": points, "status": status,
                               "judged_by": judged})
        finally:
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
        got = sum(g["score"] for g in grades if g["learner"] == learner and g["chapter"] == number)
        total = sum(grading.POINTS[n] for n in checks)
        note = f" ({why})" if why else ""
        say(f"{learner} {number}: {got:g} of {total:g} points, {time.perf_counter() - t0:.0f} s{note}")
    return logged


def _private_dir(path: Path) -> None:
    """``path`` as a folder only its owner may enter (0700): the grades and every learner's log are in it."""
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise ConfigError("out", str(path), "a folder (not a link)")
    os.chmod(path, 0o700)


def _save(path: Path, text: str, say) -> None:
    """Write ``text`` (0600). A failed write (a full disk) is said and grading goes on: the grades stay in
    memory, grades.csv is written again after the next learner and at the end."""
    try:
        write_atomic(path, text)
        os.chmod(path, 0o600)
    except OSError as e:
        say(f"could not write {path}: {e} (grading goes on; grades.csv is written again after the next learner)")


def _csv(rows, fields) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows({k: csv_cell(v) for k, v in r.items()} for r in rows)
    return buf.getvalue()
