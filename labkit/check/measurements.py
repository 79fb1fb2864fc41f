"""The measured exercises (``grading.MEASURED``), graded from the learner's saved measurements, not a grader's runs.

Outside grading each of the five saves what it judged (runs, the profiler table, the learner's answers) in
``labkit-measurements.json`` once it has judged real measured input; while grading (``grading_tool()`` is not
None) each judges that saved entry instead, and says so. A judge takes only measurements and answers from an
entry: the cases and targets are the checker's own, and an entry of another shape fails with ``SHAPE``. The
file's format and its sha256 live in ``labkit.chapters.measured``; what that hash stops, and what it does not, is
said in the instructor kit (notebooks/README.md, "Measured exercises").
"""
from __future__ import annotations

import dataclasses
import functools
import math
from types import SimpleNamespace

from ..base.runtime import ConfigError
from ..chapters import measured as _file
from ..chapters.ch07_kernels.profile import ProfileTable
from ..chapters.measured import FILE, grading_tool, plain
from ..tools.timing import as_runs, summary_of
from ._core import AnswerError, shielded
from .scaling import WORDS05 as WORDS  # ## Checks: chapter 05 of lab_messages.md, ### Graded from the saved ...

# the English of three messages, as tests compare them; the checks say them in the learner's language
NO_ENTRY = WORDS.sentences["no-entry"].format(file=FILE)
EDITED = WORDS.sentences["edited"]
SHAPE = WORDS.sentences["shape"]


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
        raise AnswerError(WORDS.say("unreadable", no_entry=WORDS.say("no-entry", file=FILE), file=FILE,
                                    error=f"{e}")) from None
    if not isinstance(entry, dict) or "data" not in entry:
        raise AnswerError(WORDS.say("no-entry", file=FILE))
    if entry.get("sha256") != _file.digest(entry):
        raise AnswerError(WORDS.say("edited-entry", edited=WORDS.say("edited"), checker=checker, file=FILE))
    return entry


def _where(entry: dict) -> str:
    dev = entry.get("measured_on") or {}
    device = dev.get("device") or WORDS.say("unnamed-device")
    return WORDS.say("where", file=FILE, device=device, time=entry.get("saved_at") or WORDS.say("unknown-time"))


def judged(checker: str, chapter: str, answer, gather, judge) -> tuple:
    """One measured check. While grading (``answer is SAVED``): ``judge(saved data)``, said to come from the
    file. Otherwise ``gather()`` -> the data to judge (it raises NotAttempted or AnswerError before anything is
    measured or saved), judged as it will be saved (plain JSON), then saved. Returns (passed, message)."""
    if answer is SAVED:
        entry = _entry(checker)
        passed, message = judge(entry["data"])
        return passed, WORDS.say("graded", message=message, where=_where(entry))
    data = _file.plain(gather())
    passed, message = judge(data)
    why = _file.not_saving()
    if why is not None:  # nbgrader's Validate: judged as usual, the learner's saved entry kept
        return passed, WORDS.say("not-saved", message=message, why=why)
    try:
        with shielded():  # the time limit must not cut the file's write half-way
            _file.write(checker, chapter, data)
    except (OSError, ValueError) as e:  # a read-only folder: the check still says its verdict
        message = WORDS.say("not-written", message=message, file=FILE, error=f"{e}")
    return passed, message


def need(ok, what: str) -> None:
    """An AnswerError (``SHAPE``, then ``what``) unless ``ok``: a judge's test of the data's shape."""
    if not ok:
        raise AnswerError(WORDS.say("shape-what", shape=WORDS.say("shape"), what=what))


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


# A saved entry's shape, asked before its judge reads it (a learner can call labkit's writer with any data):
# the keys its checker writes, lists as long as the checker's cases, finite numbers where numbers are judged.
# Each returns the parts its judge uses; the checker's constants are passed in.
BYTES = ("total", "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes")  # a budget run's parts
TABLE_FIELDS = tuple(f.name for f in dataclasses.fields(ProfileTable))
VERDICT = ("metric", "decided", "better", "sentence")  # a comparison's, as low_mfu_fix saves it


def profile_entry(data) -> tuple:
    """read_profile's entry -> (top_op, optimizer_share, ProfileTable)."""
    data = fields(data, ("top_op", "optimizer_share", "table"))
    need(isinstance(data["top_op"], str) and finite(data["optimizer_share"]), "top_op or optimizer_share")
    kept = fields(data["table"], ("rows", "phases", "device", "time_source"), "the table")
    need(set(kept) <= set(TABLE_FIELDS), "the table has fields a profile table does not")
    rows, phases = kept["rows"], kept["phases"]
    need(isinstance(rows, list) and all(isinstance(r, dict) and isinstance(r.get("name"), str)
                                        and isinstance(r.get("kind"), str) and finite(r.get("self_s"))
                                        and finite(r.get("total_s")) for r in rows), "the table's rows")
    need(isinstance(phases, dict) and all(finite(v) for v in phases.values()), "the table's phases")
    return data["top_op"], data["optimizer_share"], ProfileTable(**kept)


def budget_entry(data, cases) -> tuple:
    """memory_budget's entry -> (estimates, runs), saved for exactly the checker's ``cases``."""
    data = fields(data, ("cases", "estimates", "runs"))
    need(data["cases"] == plain(cases), "its cases are not this check's")
    estimates = numbers(data["estimates"], len(cases), "the estimates")
    runs = data["runs"]
    need(isinstance(runs, list) and len(runs) == len(cases), f"runs: not {len(cases)} runs")
    for m in runs:
        fields(m, BYTES, "a run")
        need(all(finite(m[k]) for k in BYTES) and m["total"] > 0, "a run's bytes")
    return estimates, runs


def mfu_entry(data) -> tuple:
    """low_mfu_fix's entry -> (before, after, suspect, comparison or None)."""
    data = fields(data, ("before", "after", "suspect", "comparison"))
    before = run_list(data["before"], "the suspect run")
    after = run_list(data["after"], "your run")
    suspect = run_list(data["suspect"], "the comparison's suspect run", least=0)
    for r in before + after + suspect:
        need(r["summary"].get("mfu") is None or finite(r["summary"]["mfu"]), "a run's mfu is not a number")
    cmp = data["comparison"]
    if cmp is not None:
        cmp = fields(cmp, VERDICT, "the comparison")
        need(isinstance(cmp["decided"], bool) and cmp["better"] in (None, "a", "b")
             and isinstance(cmp["sentence"], str), "the comparison's verdict")
        cmp = SimpleNamespace(**{k: cmp[k] for k in VERDICT})
    return before, after, suspect, cmp


def _triple(value) -> bool:
    return isinstance(value, list) and len(value) == 3 and all(finite(x) for x in value)


def reading_entry(data, n_cases: int, wrong_on_test_records) -> tuple:
    """loader_reading's entry -> (synthetic, answer, runs): the readings of the checker's ``n_cases`` test records
    (or None: three numbers were passed), and of the runs unless ``wrong_on_test_records(synthetic)`` found a
    mistake first."""
    data = fields(data, ("synthetic", "answer", "runs"))
    synthetic, answer = data["synthetic"], data["answer"]
    need(synthetic is None or (isinstance(synthetic, list) and len(synthetic) == n_cases
                               and all(_triple(t) for t in synthetic)), "the readings of the test records")
    wrong = synthetic is not None and wrong_on_test_records(synthetic) is not None
    need(_triple(answer) or (answer is None and wrong), "the reading of the runs")
    runs = run_list(data["runs"], "the runs read", records=True)
    need(not any(r["summary"].get("workers") for r in runs), "runs with loader workers")
    for r in runs:
        need(all(finite(x.get("data_wait_s")) and finite(x.get("step_time_s")) for x in r["records"]),
             "a record without finite data_wait_s and step_time_s")
    return synthetic, answer, runs


__all__ = ["FILE", "SAVED", "SHAPE", "grading_tool", "graded_from_file", "judged", "runs_data"]
