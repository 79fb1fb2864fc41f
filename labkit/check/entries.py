"""What a measured checker's saved entry must hold before its judge reads it (issue 32, after a review).

While grading, a measured check judges the entry the learner's own check saved in ``labkit-measurements.json``
(``measurements.judged``). A sealed entry is only as good as the code that sealed it: a learner can call
labkit's writer with any data. So a judge takes only measurements and the learner's answers from an entry --
what is not measured (the cases, the test records, a target) is the checker's own -- and first asks these
functions whether the entry has the shape its checker saves: the keys it writes, lists as long as the checker's
own cases, finite numbers where numbers are judged. Any other entry fails with ``measurements.SHAPE``.

Each function returns the parts its judge uses (or raises AnswerError through ``measurements.need``). They sit
here, not beside their checkers, to keep those modules short; they import no checker (the constants they need
are passed in), so the checkers can import them.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from ..chapters.ch07_kernels.profile import ProfileTable
from ..chapters.measured import plain
from .measurements import fields, finite, need, numbers, run_list

BYTES = ("total", "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes")  # a budget run's parts
TABLE_FIELDS = tuple(f.name for f in dataclasses.fields(ProfileTable))
VERDICT = ("metric", "decided", "better", "sentence")  # a comparison's, as low_mfu_fix saves it


def profile(data) -> tuple:
    """read_profile's entry -> (top_op, optimizer_share, ProfileTable): a table of ProfileTable's fields, its
    rows named with finite self and total times, its phases finite seconds."""
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


def budget(data, cases) -> tuple:
    """memory_budget's entry -> (estimates, runs): saved for exactly the checker's ``cases``, one finite
    estimate and one run's finite bytes per case."""
    data = fields(data, ("cases", "estimates", "runs"))
    need(data["cases"] == plain(cases), "its cases are not this check's")
    estimates = numbers(data["estimates"], len(cases), "the estimates")
    runs = data["runs"]
    need(isinstance(runs, list) and len(runs) == len(cases), f"runs: not {len(cases)} runs")
    for m in runs:
        fields(m, BYTES, "a run")
        need(all(finite(m[k]) for k in BYTES) and m["total"] > 0, "a run's bytes")
    return estimates, runs


def mfu(data) -> tuple:
    """low_mfu_fix's entry -> (before, after, suspect, comparison or None): runs with summaries, any MFU in them
    a finite number, a comparison's verdict with its four fields."""
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


def reading(data, n_cases: int, wrong_on_test_records) -> tuple:
    """loader_reading's entry -> (synthetic, answer, runs): a reading of each of the checker's ``n_cases`` test
    records (or none: three numbers were passed), three finite numbers for the runs unless
    ``wrong_on_test_records(synthetic)`` found a mistake first, and runs of 0 loader workers whose records hold
    finite data_wait_s and step_time_s."""
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
