"""Grading a class without a grading tool: ``python -m labkit grade SUBMISSIONS OUT`` (issues 32 and
45; the instructor kit in notebooks/README.md says what it guarantees and what it does not).

SUBMISSIONS holds one folder per learner with their chapters (``chapter_of`` names a renamed copy's
chapter) and the ``labkit-measurements.json`` their checks saved. ``jobs`` notebooks run at once,
each apart (``gradebox``); the grader's own judging and every write of OUT happen in the calling
thread: it reads at most a few MiB of each kernel's grade log, refuses any other shape, and judges
again every plain-data and measured check (``judged_by``). OUT (0700, files 0600) gets
``checks/<learner>.csv`` and ``grades.csv`` (``GRADES``: a contract, read by position).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import io
import queue
import json
import re
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from ..base import runtime as cpus  # the figure engine.device.cores() gives, without loading torch
from ..base.runtime import ConfigError
from ..base.paths import write_atomic
from ..check._core import csv_cell
from ..content import pages
from . import gradebox, grading

__all__ = ["GRADES", "GradesNotWritten", "chapter_checks", "course_checks", "grade_class"]

# grades.csv's columns: a contract (spreadsheets and scripts read them by position too): new ones go at the end
GRADES = ["learner", "chapter", "exercise", "score", "max_score", "status", "judged_by",
          "hint", "learner_total", "learner_max_total"]
LOG_FIELDS = ["learner", "exercise", "passed", "attempted", "timestamp", "note"]
HINT_CHARS = 500  # of a check's message kept in grades.csv
CELL_TIMEOUT_S = 600  # a chapter's cells train small models: a grader's CPU needs more than a few seconds
NOTEBOOK_TIMEOUT_S = 3600  # a whole notebook, whatever its cells do: then its process tree is killed
NOTEBOOK_BYTES = 64 << 20  # a submitted notebook larger than this is not read
ANSWER_BYTES = 1 << 16     # a logged answer longer than this is not judged again

NUMBERED = re.compile(r"^(\d\d)[_ -]")  # a notebook named from its chapter's number: 03_..., 03 ..., 03-...


def _learners(submissions: Path, say) -> list:
    """The learners' folders; what else SUBMISSIONS holds is said, never skipped silently."""
    if not submissions.is_dir():
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner")
    folders = []
    for p in sorted(submissions.iterdir()):
        if p.name.startswith("."):
            say(f"not graded: {p.name}: a hidden name (rename it without the dot to grade it)")
        elif p.is_symlink():
            say(f"not graded: {p.name}: a symbolic link (hand in the folder itself)")
        elif not p.is_dir():
            say(f"not graded: {p.name}: not a folder (SUBMISSIONS holds one folder per learner)")
        else:
            folders.append(p)
    if not folders:
        raise ConfigError("submissions", str(submissions), "a folder holding one folder per learner (it has none)")
    return folders


def chapter_of(name: str, stems: dict):
    """The chapter number a submitted notebook's file name stands for, or None (none, or two). Besides the
    chapter's own name, what Jupyter's Duplicate and a browser's second download make of it
    (``03_gradient_accumulation-Copy1.ipynb``, ``03_gradient_accumulation (1).ipynb``) and a learner's own prefix
    (``alice_03_gradient_accumulation.ipynb``): the chapter's name inside it, or its number and a separator first."""
    if not name.endswith(".ipynb") or name.startswith("."):
        return None
    low = name.lower()
    found = {n for n, stem in stems.items() if stem.lower() in low}
    numbered = NUMBERED.match(name)
    if numbered and numbered.group(1) in stems:
        found.add(numbered.group(1))
    return found.pop() if len(found) == 1 else None


def _handed_in(folder: Path, stems: dict, wanted, say) -> dict:
    """{chapter number: [the learner's notebooks for it]} for the course's chapters. A notebook named after no
    chapter, or after two, is said (with the folder's own, a subfolder, and nothing at all handed in)."""
    out, other = {}, []
    for path in sorted(folder.iterdir()):
        if path.is_dir() and not path.name.startswith("."):
            other.append(f"{path.name}/ (a subfolder: put the notebook itself in {folder.name}/)")
            continue
        if not path.name.endswith(".ipynb"):
            continue
        number = chapter_of(path.name, stems)
        if number is None:
            other.append(f"{path.name} (name it as the course's chapter, NN_name.ipynb)")
        elif wanted is None or number in wanted:
            out.setdefault(number, []).append(path)
    for what in other:
        say(f"not graded: {folder.name}/{what}")
    for number, paths in out.items():
        if len(paths) == 1 and paths[0].name != f"{stems[number]}.ipynb":
            say(f"{folder.name}: {paths[0].name} graded as chapter {number} (the only notebook for it)")
    if not out:
        say(f"not graded: {folder.name}: no notebook for "
            f"{'chapter ' + ', '.join(sorted(wanted)) if wanted else 'any chapter of the course'}")
    return out


def chapter_checks(nb) -> list:
    """The checkers a chapter's code cells call, in order (each once): the exercises it is graded on."""
    names = [n for c in nb.cells if c.cell_type == "code" for n in grading.check_calls(c.source)]
    return [n for n in dict.fromkeys(names) if n in grading.POINTS]


def _course_chapters() -> list:
    """The course's own chapter notebooks (a checkout's or the package's)."""
    return sorted((pages.source_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def course_checks() -> dict:
    """{chapter number: the checkers of the course's own chapter}: what each chapter is graded on, whatever a
    submitted notebook still calls (a learner who deletes a check does not remove its exercise)."""
    import nbformat  # deferred: notebook libraries are for this command only

    return {p.name[:2]: chapter_checks(nbformat.read(p, as_version=4)) for p in _course_chapters()}


def course_stems() -> dict:
    """{chapter number: its notebook's name without .ipynb}, e.g. {"03": "03_gradient_accumulation"}."""
    return {p.name[:2]: p.stem for p in _course_chapters()}


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


def _judged_again(row: dict, copy: Path) -> tuple:
    """(the grader's own verdict on a logged check, True/False, and the check's message), or (None, "") where only
    the kernel could judge it (a function as the answer). Run here, in the grader's process: the learner's code
    never ran in it."""
    from .. import check  # deferred: the checkers load torch; only a logged check needs them here

    name = row["exercise"]
    if name not in grading.POINTS:
        return None, ""
    fn = getattr(check, name)
    if name in grading.MEASURED:
        with _grading_in(copy):
            got = fn(check.SAVED)
        return bool(got.passed), got.message
    if row["answer"] is None:
        return None, ""
    try:
        given = json.loads(row["answer"])
        args, kwargs = given["args"], given["kwargs"]
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return False, "its logged answer is not a check's arguments"
    except (ValueError, KeyError, TypeError):
        return False, "its logged answer is not a check's arguments"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        got = fn(*args, **kwargs)
    return bool(got.passed), got.message


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

def _kernel_hints(report: dict) -> dict:
    """{checker: the message its last displayed result showed} from the runner's report: the learner's kernel's
    word, used only as the hint of a check the grader cannot judge again (a function as the answer)."""
    hints = report.get("hints")
    if not isinstance(hints, dict):
        return {}
    return {k[:200]: v[:HINT_CHARS] for k, v in hints.items() if isinstance(k, str) and isinstance(v, str)}


def _grade_one(path: Path, learner: str, mode: str, keep, cpus=None) -> tuple:
    """(why it was not graded or "", the log's rows, the copy's folder kept for the measured checks, the
    kernel's hints). Runs in a worker thread: it only copies files and waits on the runner's process."""
    problem = _notebook_problem(path)
    if problem:
        return problem, [], None, {}
    work = Path(tempfile.mkdtemp(prefix="labkit-grade-copy-"))
    copy = work / "learner"
    copy.mkdir()
    _copy(path.parent, copy)
    report = gradebox.run_notebook(copy, path.name, learner, mode, CELL_TIMEOUT_S, NOTEBOOK_TIMEOUT_S, keep,
                                   cpus=cpus)
    rows = _log_rows(report)
    why = report.get("stopped") if isinstance(report.get("stopped"), str) else "its runner's report is unreadable"
    if not why and report.get("log") is None:
        why = "its grade log was not written (the kernel was stopped, or the notebook ended it)"
    elif not why and rows is None:
        why = "its grade log is not what labkit writes (it was changed in the kernel)"
    return why[:300], rows or [], work, _kernel_hints(report)


def default_jobs() -> int:
    """Notebooks graded at once by default: one per core this process may use (``labkit.engine.device.cores()``'s
    figure: the affinity, or the cgroup's CPU quota when smaller)."""
    return max(1, cpus.usable()[0])


def _core_slots(jobs: int) -> list:
    """The CPUs each of ``jobs`` runners is pinned to: this process's CPUs split into ``jobs`` parts (shared
    round-robin when there are fewer CPUs than jobs), so that a kernel's threads (``cores()`` in it) do not
    fight another learner's for the same cores."""
    try:
        mine = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return [None] * jobs
    if jobs >= len(mine):
        return [[mine[i % len(mine)]] for i in range(jobs)]
    size = len(mine) // jobs
    return [mine[i * size:(i + 1) * size] if i < jobs - 1 else mine[i * size:] for i in range(jobs)]


def grade_class(submissions, out, chapters=None, say=print, isolation=None, jobs=None) -> list:
    """Grade every learner's chapters in ``submissions`` (``chapters``: numbers such as ["03", "11"]; None:
    every chapter of the course a learner handed in), ``jobs`` notebooks at once (None: ``default_jobs()``);
    write OUT/checks/<learner>.csv and OUT/grades.csv (after each learner, so a stopped run keeps what it graded).
    ``isolation``: a mode of ``gradebox.MODES`` (None: the best this machine allows). Says each learner's total
    and, at the end, everything it did not grade. Returns grades.csv's rows."""
    submissions, out = Path(submissions), Path(out)
    wanted = None if chapters is None else {str(c) for c in chapters}
    known = course_checks()
    if wanted is not None and (not wanted or not wanted <= set(known)):
        raise ConfigError("chapters", sorted(wanted), f"chapter numbers among {', '.join(sorted(known))}")
    if jobs is None:
        jobs = default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError("jobs", jobs, "a whole number of notebooks graded at once, 1 or more")
    missed = []  # every "not graded: ..." line, said again at the end

    def note(line):
        if line.startswith("not graded: "):
            missed.append(line[len("not graded: "):])
        say(line)

    learners = _learners(submissions, note)
    stems = course_stems()
    plan = [(folder, _handed_in(folder, stems, wanted, note)) for folder in learners]
    mode, line = gradebox.isolation(isolation)
    say(line + f"; {jobs} notebook{'s' * (jobs > 1)} at once")
    _private_dir(out)
    _private_dir(out / "checks")
    keep = gradebox.children()
    gradebox.resume()
    reaper = gradebox.subreaper(True)
    grades = []
    try:
        _grade_all(plan, known, mode, keep, jobs, grades, out, note)
    finally:
        gradebox.sweep(keep)
        if reaper:
            gradebox.subreaper(False)
    if missed:
        say(f"not graded ({len(missed)}):")
        for what in missed:
            say(f"  {what}")
    text = _csv(grades, GRADES)
    try:
        write_atomic(out / "grades.csv", text)
        os.chmod(out / "grades.csv", 0o600)
    except OSError as e:
        raise GradesNotWritten(f"could not write {out / 'grades.csv'}: {e}", text) from None
    return grades


def _grade_all(plan: list, known: dict, mode: str, keep, jobs: int, grades: list, out: Path, say) -> None:
    """Run every handed-in notebook, ``jobs`` at once in worker threads (each only waits on its runner process);
    judge, score and write here, in this thread, as each learner's last notebook comes back. A learner's rows keep
    the order of ``plan`` in grades.csv whatever order they finish in."""
    slots = queue.Queue()
    for cpus in _core_slots(jobs):
        slots.put(cpus)

    def run(folder, number, paths):
        cpus = slots.get()
        try:
            if len(paths) > 1:
                names = ", ".join(p.name for p in paths)
                return f"{len(paths)} notebooks for chapter {number} ({names}): hand in one", [], None, {}, 0.0
            t0 = time.perf_counter()
            return (*_grade_one(paths[0], folder.name, mode, keep, cpus), time.perf_counter() - t0)
        finally:
            slots.put(cpus)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="labkit-grade")
    futures, left, done, finished = {}, {}, {}, {}

    def finish(i, results):
        finished[i] = _finish_learner(plan[i][0], results, known, out, say)
        grades[:] = [r for k in sorted(finished) for r in finished[k]]  # the order of plan, whatever finished first
        _save(out / "grades.csv", _csv(grades, GRADES), say)

    try:
        for i, (folder, handed) in enumerate(plan):
            left[i] = len(handed)
            done[i] = {}
            for number, paths in handed.items():
                futures[pool.submit(run, folder, number, paths)] = (i, number)
        for i in [i for i, n in left.items() if n == 0]:
            finish(i, {})
        for fut in concurrent.futures.as_completed(futures):
            i, number = futures[fut]
            done[i][number] = fut.result()  # a KeyboardInterrupt in a worker comes back here
            left[i] -= 1
            if left[i] == 0:
                finish(i, done.pop(i))
    except BaseException:
        for fut in futures:
            fut.cancel()
        gradebox.interrupt(keep)  # no runner starts any more; those running are killed: their threads return
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for fut in futures:  # the copies of notebooks graded but not scored (an interrupt came first)
            if fut.done() and not fut.cancelled() and fut.exception() is None and fut.result()[2] is not None:
                shutil.rmtree(fut.result()[2], ignore_errors=True)


class GradesNotWritten(OSError):
    """grades.csv could not be written at the end (a full disk): ``text`` holds it, for the command to print."""

    def __init__(self, message: str, text: str):
        super().__init__(message)
        self.text = text


def _chapter_rows(learner: str, number: str, checks: list, result: tuple) -> list:
    """One chapter's rows of grades.csv from its runner's result (why, log rows, copy, kernel hints, seconds)."""
    why, rows, work, hints, _ = result
    last = {r["exercise"]: r for r in rows}  # the log is oldest first: the last check decides
    out = []
    for name in checks:
        row = last.get(name)
        hint = ""
        if why:
            passed, status, judged = False, f"not graded: {why}", ""
        else:
            again, hint = (_judged_again(row, work / "learner") if row and row["attempted"] and not row["note"]
                           else (None, ""))
            passed, status, judged = _status(row, again)
            if judged == "kernel" and not row["note"]:
                hint = hints.get(name, "")  # the kernel's own display of its verdict
        points = float(grading.POINTS[name])
        out.append({"learner": learner, "chapter": number, "exercise": name, "score": points if passed else 0.0,
                    "max_score": points, "status": status, "judged_by": judged,
                    "hint": "" if passed else " ".join(hint.split())[:HINT_CHARS]})
    return out


def _finish_learner(folder: Path, results: dict, known: dict, out: Path, say) -> list:
    """Judge and score one learner's chapters (here, in the grader's thread), say them and the learner's total,
    write their checks; returns their rows of grades.csv."""
    learner, logged, mine = folder.name, [], []
    for number in sorted(results):
        result = results[number]
        try:
            logged += [{"learner": learner, **{k: r[k] for k in LOG_FIELDS[1:]}} for r in result[1]]
            rows = _chapter_rows(learner, number, known[number], result)
        finally:
            if result[2] is not None:
                shutil.rmtree(result[2], ignore_errors=True)
        mine += rows
        got, total = sum(r["score"] for r in rows), sum(r["max_score"] for r in rows)
        if result[0]:
            say(f"not graded: {learner}/chapter {number}: {result[0]}")
        say(f"{learner} {number}: {got:g} of {total:g} points, {result[4]:.0f} s"
            + (f" ({result[0]})" if result[0] else ""))
    got, total = sum(r["score"] for r in mine), sum(r["max_score"] for r in mine)
    for r in mine:
        r["learner_total"], r["learner_max_total"] = got, total
    if results:
        say(f"{learner}: {got:g} of {total:g} points in total ({len(results)} chapter{'s' * (len(results) > 1)})")
    _save(out / "checks" / f"{learner}.csv", _csv(logged, LOG_FIELDS), say)
    return mine


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
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    w.writerows({k: csv_cell(v) for k, v in r.items()} for r in rows)
    return buf.getvalue()
