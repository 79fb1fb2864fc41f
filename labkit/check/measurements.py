"""The measured exercises graded from the learner's saved measurements, not from a grader's own runs.

Five checkers (``grading.MEASURED``) judge the learner's measurements: runs on their device, the profiler
table their chapter printed. A grader (nbgrader autograde, otter, a Gradescope container) runs every cell
again on its own CPU, which would judge other numbers. So:

* outside grading, each of the five saves what it judged -- the runs' summaries or records, the table's rows,
  the learner's answers -- in ``labkit-measurements.json`` beside the notebook, once it has judged real
  measured input (an unattempted answer or input of the wrong kind saves nothing);
* while grading (``grading_tool()`` is not None), each judges that saved entry instead of whatever arguments
  the re-run notebook gave it, and says so; no file or no entry fails with what to submit, and an entry
  edited after it was saved fails with a note;
* nothing is saved while grading or under nbgrader's Validate (``chapters.measured.not_saving``);
* a judge takes only measurements (and the learner's answers) from an entry: what is not measured -- the
  cases, the target share, the largest budget -- is the checker's own constant, and an entry of another shape
  than the checker saves (``need``, ``fields``, ``finite``, ``numbers``, ``run_list``) fails with ``SHAPE``.

The file is JSON, never pickle, and each entry carries a sha256 over its canonical JSON
(``labkit.chapters.measured``, which the chapters' measured cells read too). A hash stops an accidental or a
naive edit, not a learner who edits a number and computes the hash again: like the seal on the checkers'
code, it makes cheating deliberate work, it does not make it impossible (the instructor kit says so).
"""
from __future__ import annotations

import functools
import math

from ..base.errors import ConfigError
from ..chapters import measured as _file
from ..chapters.measured import FILE, grading_tool
from ..tools.timing import as_runs, summary_of
from ._core import AnswerError, shielded

NO_ENTRY = (f"no measurement saved: run the exercise in the notebook and submit {FILE} with it")
EDITED = "the measurement file was edited after it was saved"
SHAPE = "the saved entry is not what this check saves: run the exercise again"


class _Saved:
    """What a measured checker gets as its answer while grading: "judge the saved entry"."""

    def __repr__(self):
        return f"<the entry saved in {FILE}>"


SAVED = _Saved()


def graded_from_file(check):
    """Put above ``@checker``: while grading, the check judges the saved entry (it gets ``SAVED`` as its
    answer, whatever the notebook passed -- even a placeholder, since a measured cell may have been emptied);
    otherwise it runs as written."""
    @functools.wraps(check)
    def wrapped(*args, **kwargs):
        if grading_tool() is not None:
            return check(SAVED)
        return check(*args, **kwargs)
    return wrapped


def _entry(checker: str) -> dict:
    """The saved entry of ``checker``, sealed and whole; else an AnswerError saying what is wrong."""
    try:
        entry = _file.read().get(checker)
    except ConfigError as e:
        raise AnswerError(f"{NO_ENTRY} ({FILE} could not be read: {e})") from None
    if not isinstance(entry, dict) or "data" not in entry:
        raise AnswerError(NO_ENTRY)
    if entry.get("sha256") != _file.digest(entry):
        raise AnswerError(f"{EDITED}: its {checker} entry no longer matches the sha256 saved with it. Run the "
                          f"exercise again in the notebook (that saves a fresh entry) and submit {FILE} as it is.")
    return entry


def _where(entry: dict) -> str:
    dev = entry.get("measured_on") or {}
    device = dev.get("device") or "an unnamed device"
    return f"graded from {FILE}, measured on {device} at {entry.get('saved_at', 'an unknown time')}"


def judged(checker: str, chapter: str, answer, gather, judge) -> tuple:
    """One measured check. While grading (``answer is SAVED``): ``judge(saved data)``, said to come from the
    file. Otherwise ``gather()`` -> the data to judge (it raises NotAttempted or AnswerError before anything is
    measured or saved), judged as it will be saved (plain JSON), then saved. Returns (passed, message)."""
    if answer is SAVED:
        entry = _entry(checker)
        passed, message = judge(entry["data"])
        return passed, f"{message} ({_where(entry)})"
    data = _file.plain(gather())
    passed, message = judge(data)
    why = _file.not_saving()
    if why is not None:  # nbgrader's Validate: judged as usual, the learner's saved entry kept
        return passed, f"{message} (not saved: {why})"
    try:
        with shielded():  # the time limit must not cut the file's write half-way
            _file.write(checker, chapter, data)
    except (OSError, ValueError) as e:  # a read-only folder: the check still says its verdict
        message += f" (not saved to {FILE}: {e}; a grader will find no measurement for this exercise)"
    return passed, message


def need(ok, what: str) -> None:
    """An AnswerError (``SHAPE``, then ``what``) unless ``ok``: a judge's test of the data's shape."""
    if not ok:
        raise AnswerError(f"{SHAPE} ({what})")


def finite(value) -> bool:
    """A real, finite number (not a bool): what a measured or answered number in an entry must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fields(data, keys, what: str = "the entry") -> dict:
    """``data`` as a dict holding every one of ``keys``; else SHAPE naming the missing ones."""
    need(isinstance(data, dict), f"{what} is not an object")
    missing = [k for k in keys if k not in data]
    need(not missing, f"{what} lacks {', '.join(missing)}")
    return data


def numbers(values, count: int, what: str) -> list:
    """``values`` as a list of exactly ``count`` finite numbers; else SHAPE."""
    need(isinstance(values, list) and len(values) == count, f"{what}: not {count} values")
    need(all(finite(v) for v in values), f"{what}: not all finite numbers")
    return values


def run_list(values, what: str, least: int = 1, records: bool = False) -> list:
    """``values`` as ``runs_data`` saves runs: at least ``least`` {"summary": {...}, "records": [...]} dicts
    (with ``records``, each run's records non-empty dicts); else SHAPE."""
    need(isinstance(values, list) and len(values) >= least, f"{what}: fewer than {least} run(s)")
    for r in values:
        fields(r, ("summary", "records"), f"a run of {what}")
        need(isinstance(r["summary"], dict) and isinstance(r["records"], list), f"a run of {what}")
        need(not records or (r["records"] and all(isinstance(x, dict) for x in r["records"])),
             f"a run of {what} has no records")
    return values


def runs_data(runs, records: bool = False) -> list:
    """Runs (Results, dicts or lists of them) as plain {"summary": ..., "records": ...} dicts."""
    out = []
    for r in as_runs(runs):
        recs = (r.get("records") if isinstance(r, dict) else getattr(r, "records", None)) if records else None
        out.append({"summary": dict(summary_of(r)), "records": list(recs or [])})
    return out


__all__ = ["FILE", "SAVED", "SHAPE", "grading_tool", "graded_from_file", "judged", "runs_data"]
