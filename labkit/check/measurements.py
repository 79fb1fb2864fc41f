"""The measured exercises graded from the learner's saved measurements, not from a grader's own runs.

Five checkers (``grading.MEASURED``) judge the learner's measurements: runs on their device, the profiler
table their chapter printed. A grader (nbgrader autograde, otter, a Gradescope container) runs every cell
again on its own CPU, which would judge other numbers. So:

* outside grading, each of the five saves what it judged -- the runs' summaries or records, the table's rows,
  the learner's answers -- in ``labkit-measurements.json`` beside the notebook, once it has judged real
  measured input (an unattempted answer or input of the wrong kind saves nothing);
* while grading (``grading_tool()`` is not None), each judges that saved entry instead of whatever arguments
  the re-run notebook gave it, and says so; no file or no entry fails with what to submit, and an entry
  edited after it was saved fails with a note.

The file is JSON, never pickle, and each entry carries a sha256 over its canonical JSON
(``labkit.chapters.measured``, which the chapters' measured cells read too). A hash stops an accidental or a
naive edit, not a learner who edits a number and computes the hash again: like the seal on the checkers'
code, it makes cheating deliberate work, it does not make it impossible (the instructor kit says so).
"""
from __future__ import annotations

import functools

from ..base.errors import ConfigError
from ..chapters import measured as _file
from ..chapters.measured import FILE, grading_tool
from ..tools.timing import as_runs, summary_of
from ._core import AnswerError, shielded

NO_ENTRY = (f"no measurement saved: run the exercise in the notebook and submit {FILE} with it")
EDITED = "the measurement file was edited after it was saved"


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
    try:
        with shielded():  # the time limit must not cut the file's write half-way
            _file.write(checker, chapter, data)
    except (OSError, ValueError) as e:  # a read-only folder: the check still says its verdict
        message += f" (not saved to {FILE}: {e}; a grader will find no measurement for this exercise)"
    return passed, message


def runs_data(runs, records: bool = False) -> list:
    """Runs (Results, dicts or lists of them) as plain {"summary": ..., "records": ...} dicts."""
    out = []
    for r in as_runs(runs):
        recs = (r.get("records") if isinstance(r, dict) else getattr(r, "records", None)) if records else None
        out.append({"summary": dict(summary_of(r)), "records": list(recs or [])})
    return out


__all__ = ["FILE", "SAVED", "grading_tool", "graded_from_file", "judged", "runs_data"]
