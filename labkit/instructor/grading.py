"""An exercise as every grading path reads it (the graded builds, ``labkit grade``, a Gradescope
results file): what each checker is worth, which reference answer fills each exercise, and where the
exercise is in its chapter.

``POINTS``: ``GRADE`` for an exercise where the learner writes code, ``PRACTICE`` for a number or a
choice (the instructor kit's "Which exercises to grade" table, notebooks/README.md; an instructor
changes a weight here). ``MEASURED``: the checkers that judge the learner's own measurements; re-run
on a grader's CPU they would judge other numbers, so while graded they judge the file the learner's
checks saved (``labkit.check.measurements``). ``ANSWERS`` (templates/answers.md): for each exercise
cell (tagged ``exercise-NN-name``), which placeholder takes which answer, a Python expression in the
chapter's kernel (``sol.<family>``: notebooks/solutions/<family>.py, in a checkout only:
``solutions_dir``). ``WRONG`` (templates/wrong-answers.md), in the same form: one typical wrong
answer per exercise, which the graded builds' tests must score 0 with the checker's hint as
feedback.

    exercise_tag(cell)        # "exercise-08-budget" on an exercise cell, else None
    check_calls(source)       # ["memory_budget"]: the lk.check.<name>(...) calls of a cell, in order
    solution_code(tag)        # the reference answer: the notebooks/solutions/ code ANSWERS names
"""
from __future__ import annotations

import ast
import difflib
import json
import os
import re
from pathlib import Path

from ..base.runtime import ConfigError
from ..base.paths import write_atomic
from ..check._core import history
from ..content import pages

__all__ = ["GRADE", "PRACTICE", "CHAPTERS", "POINTS", "MEASURED", "PLAIN_ANSWERS", "VISIBILITIES",
           "gradescope_results", "ANSWERS", "WRONG", "FAMILIES", "solutions_dir", "binds",
           "solution_code", "is_check_call", "check_of", "check_calls", "placeholder_end",
           "exercise_tag", "chapter_paths"]

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


# ---- the reference answers -----------------------------------------------------------------------------

FAMILIES = ("basics", "precision", "accumulation", "profiling", "scaling", "ddp", "practice", "capstone", "parallel",
            "longrun", "compose", "experts", "wrong")


def _answer_table(name: str) -> dict:
    """{exercise tag: {placeholder: an expression in the chapter's kernel}} from templates/NAME."""
    return {tag: dict(line.split(" = ", 1) for line in code.splitlines())
            for tag, code in pages.sections(name).items()}


ANSWERS = _answer_table("answers.md")
WRONG = _answer_table("wrong-answers.md")  # ``sol.wrong``: the mistakes an expression cannot say


def solutions_dir() -> Path:
    """notebooks/solutions/ of the checkout (an installed labkit carries no solutions: they are not for learners)."""
    folder = pages.source_root() / "notebooks" / "solutions"
    if not folder.is_dir():
        raise FileNotFoundError(f"no reference solutions in {folder.parent}: the graded builds need a checkout of "
                                "labkit (git clone), where notebooks/solutions/ holds them")
    return folder


def binds(stmt) -> set:
    """The module-level names a statement defines."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}


def _is_plumbing(stmt) -> bool:
    """The module's docstring, ``from __future__`` and ``__all__``: not part of any answer."""
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            or isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
            or "__all__" in binds(stmt))


def _segment(lines: list, stmt) -> str:
    """A statement's text with its decorators and the comment lines right above it."""
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])]) - 1
    while first > 0 and lines[first - 1].lstrip().startswith("#"):
        first -= 1
    return "\n".join(lines[first:stmt.end_lineno])


def _needed(src: str, names: set) -> list:
    """The texts of the statements of a solution module that ``names`` need, with what they use in turn, in
    the module's order."""
    body = [s for s in ast.parse(src).body if not _is_plumbing(s)]
    defined = set().union(*(binds(s) for s in body))
    missing = names - defined
    if missing:
        raise KeyError(f"the solutions define no {sorted(missing)}")
    want, chosen = set(names), set()
    while True:
        new = {i for i, s in enumerate(body) if i not in chosen and binds(s) & want}
        if not new:
            break
        chosen |= new
        for i in new:
            want |= {n.id for n in ast.walk(body[i]) if isinstance(n, ast.Name)} & defined
    lines = src.splitlines()
    return [_segment(lines, body[i]) for i in sorted(chosen)]


def _sol_ref(node):
    """``sol.<family>.<name>`` -> (family, name), else None."""
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name) and node.value.value.id == "sol"):
        return node.value.attr, node.attr
    return None


class _Unqualify(ast.NodeTransformer):
    def visit_Attribute(self, node):
        ref = _sol_ref(node)
        return ast.Name(ref[1], ast.Load()) if ref else self.generic_visit(node)


def solution_code(tag: str, solutions: Path | None = None, table: dict | None = None) -> str:
    """The reference answer of one exercise, as code for its cell: the solution modules' definitions it needs,
    then ``placeholder = answer`` where the answer is not the definition itself. ``table``: another table of
    answers in ANSWERS' form (``WRONG``: the typical wrong answer, as a test's submission)."""
    folder = solutions or solutions_dir()
    table = ANSWERS if table is None else table
    what = "the reference answer" if table is ANSWERS else "an answer"
    wanted, assigns = {}, []
    for name, expr in table[tag].items():
        tree = ast.parse(expr, mode="eval")
        for node in ast.walk(tree):
            ref = _sol_ref(node)
            if ref:
                wanted.setdefault(ref[0], set()).add(ref[1])
        text = ast.unparse(_Unqualify().visit(tree))
        if text != name:
            assigns.append(f"{name} = {text}")
    parts = [f"# {what}, from notebooks/solutions/{family}.py\n"
             + "\n\n".join(_needed((folder / f"{family}.py").read_text(), names)) for family, names in wanted.items()]
    return "\n\n".join(parts + ["\n".join(assigns)] * bool(assigns))


# ---- a chapter's cells ----------------------------------------------------------------------------------


def is_check_call(node) -> bool:
    """``lk.check.<name>(...)``."""
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "check"
            and isinstance(f.value.value, ast.Name) and f.value.value.id == "lk")


def check_of(stmt):
    """The checker's name when ``stmt`` calls one (``lk.check.x(...)`` or ``r = lk.check.x(...)``), else None."""
    calls = [n for n in ast.walk(stmt) if is_check_call(n)]
    return calls[0].func.attr if calls else None


def check_calls(source: str) -> list:
    """The checker names of every ``lk.check.<name>(...)`` call in ``source``, in the order they appear."""
    calls = [n for n in ast.walk(ast.parse(source)) if is_check_call(n)]
    return [c.func.attr for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def placeholder_end(tree, names) -> int:
    """The last line of the last statement that defines one of the exercise's placeholders."""
    ends = [s.end_lineno for s in tree.body if binds(s) & set(names)]
    return max(ends, default=0)


def exercise_tag(cell) -> str | None:
    """The cell's ``exercise-NN-name`` tag (a notebook's JSON cell or an nbformat one), else None."""
    return next((t for t in pages.tags(cell) if re.match(r"^exercise-\d\d-", t)), None)


def chapter_paths(chapters, lang: str = "en") -> list:
    """The course's chapter notebooks in ``lang``'s edition, all (``chapters`` None) or those numbered ("03", ...);
    a ConfigError names an unknown number (or one the edition does not have yet)."""
    every = pages.chapters(lang)
    if chapters is None:
        return every
    wanted = [str(c) for c in chapters]
    known = {p.name[:2]: p for p in every}
    bad = [c for c in wanted if c not in known]
    if bad or not wanted:
        raise ConfigError("chapters", bad or wanted, f"chapter numbers among {', '.join(sorted(known))}")
    return [known[c] for c in sorted(set(wanted))]


# ---- Gradescope ------------------------------------------------------------------------------


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
        chapters = sorted(c for c, checks in CHAPTERS.items() if logged & set(checks))
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
