"""The otter-grader build of the course (issue 32): ``python -m labkit assignments --tool otter OUT``.

``build_otter(out_dir)`` writes ``OUT/<chapter>/<chapter>.ipynb``, one otter-grader *source notebook* per chapter
(otter-grader 7's assignment format), on which ``otter assign OUT/<chapter>/<chapter>.ipynb DIST`` runs as it is
and writes the learner's notebook (``DIST/student``) and the autograder zip (``DIST/autograder``) that
``otter run`` and Gradescope grade with. In each chapter:

* a raw ``# ASSIGNMENT CONFIG`` cell opens the notebook (``CONFIG``): exception-based tests, kept in the
  notebook's metadata; no PDF; each question's result reaches the learner once grades are published. A chapter
  with measured exercises (``grading.MEASURED``) has the learner's export zip carry ``labkit-measurements.json``,
  which the grader's checks judge, and ``otter assign`` skip grading the reference (it has no such file);
* each check (``lk.check.<name>(...)``) is a **question** named after its checker, worth the checker's points
  (``labkit.instructor.grading.POINTS``). It holds the exercise cell as a *solution* cell: the placeholder stays as
  the learner knows it and the reference answer (``exercises.solution_code``) follows it between otter's
  ``# BEGIN SOLUTION NO PROMPT`` and ``# END SOLUTION``, which ``otter assign`` takes out of the learner's copy.
  The chapter's own check call stays in the cell: the learner's feedback, as in the course;
* the question's **tests** call the checker again, with the names it reads from the notebook: a public case
  (0 points), the one ``grader.check`` runs in the learner's notebook, and a hidden case (all the question's
  points), both asserting that the check passed (``result.passed``): ``grader.check`` fails on a wrong answer with
  the check's hint, and the hidden case decides the grade. A failing case's message is the check's verdict --
  "not attempted yet", or "not yet" and the checker's hint: the feedback line in otter's results;
* every other cell -- prediction cells (``my_guess_*``) included -- stays as the chapter has it.

otter-grader's behaviour this relies on, read in its installed source (otter 7.0.0): ``otter/assign/blocks.py``
(raw boundary cells ``# BEGIN QUESTION`` ... with YAML), ``assign/solutions.py`` (the solution markers),
``assign/tests_manager.py`` (a test cell: an optional ``\"\"\" # BEGIN TEST CONFIG`` block, then one function;
case points resolved by ``test_files/abstract_test.py``), ``execute/preprocessor.py`` (grading runs the
notebook with ``Notebook.init_grading_mode`` and runs each question's tests where its ``grader.check`` cell is,
or at the end), ``test_files/__init__.py`` (the results JSON).
"""
from __future__ import annotations

import ast
import builtins
import json
import re
from pathlib import Path

from ..base.paths import write_atomic
from ..base.release import SOURCE
from ..chapters.measured import FILE
from ..content import pages
from . import answers, grading
from .assignments import SEAL_CHECK, private_file, private_folder
from .exercises import chapter_paths, check_of, exercise_tag, is_check_call, placeholder_end, solution_code

__all__ = ["CONFIG", "MEASURED", "BEGIN", "END", "otter_cells", "build_otter"]

BEGIN, END = "# BEGIN SOLUTION NO PROMPT", "# END SOLUTION"  # NO PROMPT: the chapter's placeholder is the prompt

# The text otter's build writes: templates/otter.md.
CONFIG = pages.section("otter.md", "config") + "\n"

# The autograder image on Gradescope starts without labkit: otter assign adds this file's lines to the zip's
# environment.yml, which the image installs (``otter run`` grades in the environment it is run from).
REQUIREMENTS = pages.section("otter.md", "requirements").format(
    source=SOURCE or pages.section("otter.md", "unpublished")) + "\n"

# A chapter with measured exercises (grading.MEASURED): the learner's export zip carries the file their checks
# saved, which the grader's checks judge (labkit.check.measurements); otter runs the notebook in the folder the
# zip is unpacked in. Without the file otter's export stops and names it. ``otter assign`` would grade the
# reference notebook without such a file, and fail: it does not.
MEASURED = {
    "run_tests": pages.section("otter.md", "measured-run-tests") + "\n",
    "files": pages.section("otter.md", "measured-files").format(file=FILE) + "\n",
}


# otter's export stops when a file it is told to zip is missing: a learner who has not run a measured exercise
# yet must still be able to hand in the rest, so the chapter starts with an empty file (labkit's checks add to it).
EMPTY_MEASUREMENTS = pages.section("otter.md", "empty-measurements").format(file=FILE)


# Lines otter-grader rewrites or drops wherever they are (otter/assign/solutions.py, plugins.py, utils.py):
# a chapter holding one would not reach the learner as written.
_OTTER_LINES = [
    (re.compile(r"#\s*(IGNORE|END IGNORE|SEED|BEGIN PLUGIN|END PLUGIN|BEGIN PLUGIN EXPORT)\s*$"),
     "an otter line marker"),
    (re.compile(r"^\s*#\s*BEGIN\s*IGNORE", re.I), "otter's BEGIN IGNORE"),
    (re.compile(r"^\s*```otter\s*$"), "an otter config fence"),
]
_IGNORED_CELL = re.compile(r"(##\s*ignore\s*##\s*|#\s*ignore\s*)", re.I)  # a cell that starts so is dropped
_BOUNDARY = re.compile(r"#\s+(begin|end)\s+(question|prompt|solution|tests)\b|#\s+assignment\s+config", re.I)
# ... and inside a solution cell, lines that become "..." or go (otter/assign/solutions.py)
_SOLUTION_LINE = re.compile(r"# ?SOLUTION|#\s*(BEGIN|END) PROMPT\s*$")


def _raw(cell_id: str, text: str) -> dict:
    return {"cell_type": "raw", "id": cell_id, "metadata": {}, "source": text}


def _code(cell_id: str, text: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": cell_id, "metadata": {}, "outputs": [],
            "source": text}


def _refuse_otter_markers(chapter: str, cell: dict, solution: bool) -> None:
    """A chapter's cell must reach otter's output as written: no line of it may be one of otter's markers."""
    text = pages.source(cell)
    where = f"{chapter}, cell {cell.get('id')}"
    if cell["cell_type"] == "raw" and _BOUNDARY.match(text):
        raise ValueError(f"{where}: a raw cell otter would read as a block boundary: {text.splitlines()[0]!r}")
    if cell["cell_type"] != "markdown" and _IGNORED_CELL.match(text):
        raise ValueError(f"{where}: otter drops a cell whose first line is {text.splitlines()[0]!r}")
    for line in text.splitlines():
        for pattern, what in _OTTER_LINES + [(_SOLUTION_LINE, "a solution marker")] * solution:
            if pattern.search(line):
                raise ValueError(f"{where}: {what} that otter would rewrite: {line.strip()!r}")


def _with_answer(cell: dict, tag: str, chapter: str, solutions: Path | None) -> dict:
    """The exercise cell with its reference answer right after the placeholder, inside otter's markers."""
    text = pages.source(cell)
    tree = ast.parse(text)
    end = placeholder_end(tree, answers.ANSWERS[tag])
    if not end:
        raise ValueError(f"{chapter}, {tag}: no placeholder of {sorted(answers.ANSWERS[tag])} in its cell")
    code = solution_code(tag, solutions)
    for line in code.splitlines():
        if re.search(r"# ?(BEGIN|END) SOLUTION", line):
            raise ValueError(f"{chapter}, {tag}: the reference answer holds otter's marker {line.strip()!r}")
    lines = text.splitlines()
    return {**cell, "source": "\n".join(lines[:end] + [BEGIN, code, END] + lines[end:])}


def _free_names(call: ast.Call) -> list:
    """The notebook's names a check reads (``lk`` and Python's builtins aside), in order."""
    names = [n.id for n in ast.walk(call) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return list(dict.fromkeys(n for n in names if n != "lk" and not hasattr(builtins, n)))


def _check_call(cell: dict) -> ast.Call:
    """The cell's (first) ``lk.check.<name>(...)`` call."""
    return next(n for n in ast.walk(ast.parse(pages.source(cell))) if is_check_call(n))


class _EnvName(ast.NodeTransformer):
    """``env`` -> ``env.get("env")``: the notebook's own ``env``, out of the globals otter passes as ``env``."""

    def visit_Name(self, node):
        if node.id == "env" and isinstance(node.ctx, ast.Load):
            return ast.Call(ast.Attribute(ast.Name("env", ast.Load()), "get", ast.Load()), [ast.Constant("env")], [])
        return node


def _case_source(call: ast.Call, hidden: bool, points) -> str:
    """One test case: otter's config block, then a function of the names the check reads (otter passes each
    from the notebook's globals, None when missing) that runs the checker and asserts on its result."""
    params = _free_names(call)
    if "env" in params:  # otter passes a parameter named env the notebook's whole globals: read the name from them
        call = _EnvName().visit(ast.parse(ast.unparse(call), mode="eval")).body
    result = next(n for n in ("result", "verdict", "graded_result") if n not in params)
    # both cases ask for a pass: grader.check (the public one) must not say "All test cases passed!" under the
    # check's own "not yet"; the hidden one carries the points
    name = "passed" if hidden else "checked"
    seal = "\n".join("    " + line for line in SEAL_CHECK.splitlines())
    return pages.section("otter.md", "case").format(hidden="true" if hidden else "false", points=points, name=name,
                                                    params=", ".join(params), seal=seal, result=result,
                                                    call=ast.unparse(call))


def _question(chapter: str, name: str, cells: list, call: ast.Call, opens: bool) -> list:
    """A question block around ``cells`` (their solution block first when ``opens``: the exercise cell)."""
    points = grading.POINTS[name]
    qid = f"otter-{chapter}-{name}"
    body = cells
    if opens:
        body = [_raw(f"{qid}-begin-solution", "# BEGIN SOLUTION"), cells[0],
                _raw(f"{qid}-end-solution", "# END SOLUTION"), *cells[1:]]
    return [_raw(f"{qid}-begin", pages.section("otter.md", "question").format(name=name, points=points)), *body,
            _raw(f"{qid}-begin-tests", "# BEGIN TESTS"),
            _code(f"{qid}-public", _case_source(call, hidden=False, points=0)),
            _code(f"{qid}-hidden", _case_source(call, hidden=True, points=points)),
            _raw(f"{qid}-end-tests", "# END TESTS"), _raw(f"{qid}-end", "# END QUESTION")]


def otter_cells(nb: dict, assignment: str, solutions: Path | None = None) -> list:
    """A chapter's cells (a notebook's JSON ``cells``) as otter's source notebook of the assignment
    (``assignment``: the chapter's name, e.g. 03_gradient_accumulation), config cell first. An exercise whose
    check is in a later cell (chapter 09's budget pick) makes one question of the cells from the exercise to
    the check."""
    chapter = assignment[:2]
    checks = {check_of(s) for c in nb["cells"] if c["cell_type"] == "code" for s in ast.parse(pages.source(c)).body}
    measured = MEASURED if checks & set(grading.MEASURED) else dict.fromkeys(MEASURED, "")
    out = [_raw(f"otter-{chapter}-config", CONFIG.format(name=json.dumps(assignment), **measured))]
    if checks & set(grading.MEASURED):
        out.append(_code(f"otter-{chapter}-measurements", EMPTY_MEASUREMENTS))
    pending = []  # an exercise cell whose check has not come yet, and the cells after it
    for cell in nb["cells"]:
        cell = {**cell}
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        tag = exercise_tag(cell) if cell["cell_type"] == "code" else None
        _refuse_otter_markers(assignment, cell, solution=bool(tag))
        check = cell["cell_type"] == "code" and any(check_of(s) for s in ast.parse(pages.source(cell)).body)
        if tag and pending:
            raise ValueError(f"{assignment}, {exercise_tag(pending[0])}: no check before the next exercise ({tag})")
        if tag:
            cell = _with_answer(cell, tag, assignment, solutions)
        if not check:
            (pending if tag or pending else out).append(cell)
            continue
        opened = pending + [cell]
        call = _check_call(cell)
        out += _question(chapter, call.func.attr, opened, call, opens=bool(tag or pending))
        pending = []
    if pending:
        raise ValueError(f"{assignment}, {exercise_tag(pending[0])}: an exercise without a check after it")
    return out


def _summary(cells: list) -> dict:
    """An assignment's counts: exercises, questions (one per check) and their points."""
    questions = [re.search(r"^name: (\w+)$", pages.source(c), re.M).group(1) for c in cells
                 if c["cell_type"] == "raw" and pages.source(c).startswith("# BEGIN QUESTION")]
    return {"exercises": sum(1 for c in cells if c["cell_type"] == "code" and exercise_tag(c)),
            "checks": len(questions), "points": sum(grading.POINTS[q] for q in questions)}


def build_otter(out_dir, chapters=None, lang: str = "en") -> dict:
    """Write ``out_dir/<chapter>/<chapter>.ipynb``, otter's source notebook, and the ``requirements.txt`` beside
    it, for each chapter (``chapters``: numbers such as ["03", "11"]; None: all). Only those files are written:
    what ``otter assign`` wrote beside them stays. Returns {assignment: {"exercises", "checks", "points"}} (``checks``: the questions).
    ``lang="ru"``: the Russian edition's chapters (notebooks/ru/)."""
    paths = chapter_paths(chapters, lang)
    solutions = answers.solutions_dir()
    built = {}
    for path in paths:  # every chapter is built before anything is written
        nb = json.loads(path.read_text())
        cells = otter_cells(nb, path.stem, solutions)
        built[path.stem] = ({**nb, "cells": cells}, _summary(cells))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, (nb, _) in built.items():  # the source notebooks hold the reference answers and hidden tests: 0700/0600
        private_folder(out / name)
        private_file(out / name / f"{name}.ipynb", json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        write_atomic(out / name / "requirements.txt", REQUIREMENTS)
    return {name: summary for name, (_, summary) in built.items()}
