"""Points per checker, for the graded builds of the course (``python -m labkit assignments``, issue 32).

One place for them: every builder (nbgrader, otter, a Gradescope results file) reads ``POINTS``. The defaults
follow the instructor kit's "Which exercises to grade" table (notebooks/README.md): an exercise where the
learner writes code is worth ``GRADE`` points, a number or a choice (which can be found by trying values) is
practice, worth ``PRACTICE``. An instructor changes a weight here; tests/test_assignments.py checks that every
checker has points and that the table and this mapping agree.

``MEASURED``: the checkers that judge the learner's own measurements (runs on the learner's device, the
profiler table their chapter printed). Re-running them on a grader's CPU would judge other numbers: while a
grader runs the notebook they judge the file the learner's checks saved, ``labkit-measurements.json``
(``labkit.check.measurements``).
"""
from __future__ import annotations

import difflib
import json
import os

from ..base.runtime import ConfigError
from ..base.paths import write_atomic
from ..check._core import history

GRADE = 2      # "grade (code)": a function or a class
PRACTICE = 1   # "practice": a number or a choice

# {chapter: {checker: points}}: each chapter's own exercises (tests/test_gradescope.py checks them against the
# chapters' notebooks), so that a results file counts one chapter's, not a check of another chapter added to it
CHAPTERS = {
    "00": {"training_state_bytes": GRADE, "bytes_per_param_mixed_adam": PRACTICE, "llm_memory_gb": PRACTICE},
    "01": {"flops_linear": GRADE, "find_bottleneck": GRADE, "low_mfu_fix": GRADE, "mfu_from_numbers": PRACTICE},
    "02": {"fp16_flush_fraction": GRADE, "loss_scaler": GRADE, "fixed_training_loop": GRADE},
    "03": {"token_weights": GRADE, "accumulation_loop": GRADE, "accum_steps_needed": PRACTICE},
    "04": {"checkpoint_blocks": GRADE, "checkpoint_overhead": PRACTICE, "checkpoint_budget": PRACTICE},
    "05": {"wait_fraction": GRADE, "ideal_step": GRADE, "fewest_workers": GRADE, "loader_reading": GRADE},
    "06": {"counting_hook": GRADE, "fix_no_sync": GRADE, "ring_allreduce_time": GRADE,
           "predict_allreduce_calls": PRACTICE},
    "07": {"read_profile": GRADE, "compile_breakeven": GRADE, "pad_vocab": PRACTICE},
    "08": {"memory_budget": GRADE, "activation_formula": GRADE, "step2_extra_bytes": PRACTICE,
           "bytes_per_param_fp32_accum": PRACTICE},
    "09": {"pareto_front": GRADE, "zero_bytes_per_gpu": GRADE, "budget_challenge": GRADE, "smallest_fix": PRACTICE},
    "10": {"tp_allreduces": GRADE, "bubble": GRADE, "layout_bytes": GRADE, "layout_fits": PRACTICE},
    "11": {"resume_needs": GRADE, "young_daly": GRADE, "lost_work": GRADE, "inexact_resume": PRACTICE},
    "12": {"sp_collectives": GRADE, "expert_capacity": GRADE, "interleaved_bubble": GRADE,
           "moe_layout_fits": PRACTICE},
}
POINTS = {name: points for chapter in CHAPTERS.values() for name, points in chapter.items()}

MEASURED = ("low_mfu_fix", "loader_reading", "memory_budget", "budget_challenge", "read_profile")

# The checkers whose answer (every argument the chapter passes) is plain data -- a number, a string, a dict or list
# of them. ``labkit grade`` judges each logged check of these again in its own process, out of the learner's code's
# reach, and counts none whose answer the log does not carry (a forged row would leave it out).
PLAIN_ANSWERS = ("bytes_per_param_mixed_adam", "llm_memory_gb", "mfu_from_numbers", "accum_steps_needed",
                 "step2_extra_bytes", "bytes_per_param_fp32_accum", "smallest_fix", "layout_fits", "inexact_resume",
                 "moe_layout_fits")

# Gradescope's results.json: a test's visibility to the learner (its autograder specification's four values)
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")


def _chapter_of(names) -> dict:
    return {n: c for c, checks in CHAPTERS.items() for n in checks if n in names}


def _exercises(exercises, chapter=None) -> list:
    """The checkers a results file reports: ``exercises`` (any iterable of names, read once), else the checkers of
    ``chapter``, else those the log holds -- of one chapter only (a check of another chapter, added to the
    notebook, must not count: name the chapter then)."""
    if chapter is not None:
        if exercises is not None:
            raise ConfigError("chapter", chapter, "either chapter or exercises, not both")
        if chapter not in CHAPTERS:
            raise ConfigError("chapter", chapter, f"a chapter number among {', '.join(CHAPTERS)}")
        return list(CHAPTERS[chapter])
    if exercises is None:
        logged = {row["exercise"] for row in history()}
        chapters = sorted(set(_chapter_of(logged).values()))
        if len(chapters) > 1:
            raise ConfigError("exercises", None, f"the log holds checks of chapters {', '.join(chapters)}: pass "
                              "chapter=\"NN\" (the assignment's) or exercises=[...]")
        return [name for name in POINTS if name in logged]
    if isinstance(exercises, (str, bytes)) or not hasattr(exercises, "__iter__"):
        raise ConfigError("exercises", exercises, "a list of checker names, e.g. [\"resume_needs\", \"young_daly\"]")
    exercises = list(exercises)  # once: a generator is read here and nowhere else
    if not exercises:
        raise ConfigError("exercises", exercises, "at least one checker name (or leave it out: the log's chapter)")
    if not all(isinstance(e, str) for e in exercises):
        raise ConfigError("exercises", exercises, "a list of checker names, e.g. [\"resume_needs\", \"young_daly\"]")
    for e in exercises:
        if e not in POINTS:
            close = difflib.get_close_matches(e, POINTS, n=1)
            raise ConfigError("exercises", e, "a checker's name" + (f" -- did you mean {close[0]!r}?" if close else
                                                                   " (lk.check.names() lists them)"))
    return list(dict.fromkeys(exercises))


def gradescope_results(path, exercises=None, visibility: str = "visible", chapter: str | None = None) -> dict:
    """Write the ``results.json`` Gradescope's autograder reads (``/autograder/results/results.json`` in its
    container): one test per exercise, ``name``, ``score``, ``max_score`` (from ``POINTS``), ``status``,
    ``visibility`` and ``output``, judged by the last check of that exercise in this kernel's grade log (a
    check that found labkit's code changed scores 0 and says so). ``exercises``: the checkers to report,
    those the log holds by default (of one chapter: the log holding checks of two is refused); ``chapter``
    ("03"): that chapter's checkers, the unanswered ones reported as not attempted. Returns what it wrote."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ConfigError("path", path, "a file path, e.g. \"/autograder/results/results.json\"")
    if visibility not in VISIBILITIES:
        raise ConfigError("visibility", visibility, ", ".join(VISIBILITIES))
    last = {}
    for row in history():
        last[row["exercise"]] = row  # the log is oldest first: the last check of each exercise decides
    tests = []
    for number, name in enumerate(_exercises(exercises, chapter), start=1):
        row, points = last.get(name), POINTS[name]
        if row is None or not row["attempted"]:
            passed, output = False, "not attempted"
        elif row["note"]:
            passed, output = False, f"not counted: {row['note']}"
        else:
            passed = bool(row["passed"])
            output = "passed" if passed else f"not passed yet: run lk.check.{name}(...) in the notebook for its hint"
        tests.append({"name": name, "number": str(number), "score": float(points if passed else 0),
                      "max_score": float(points), "status": "passed" if passed else "failed",
                      "visibility": visibility, "output": output})
    results = {"score": sum(t["score"] for t in tests), "visibility": visibility, "tests": tests}
    write_atomic(path, json.dumps(results, indent=1) + "\n")
    return results


__all__ = ["GRADE", "PRACTICE", "CHAPTERS", "POINTS", "MEASURED", "PLAIN_ANSWERS", "VISIBILITIES", "gradescope_results"]
