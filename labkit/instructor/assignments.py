"""The graded builds (issue 32): ``python -m labkit assignments --tool nbgrader|otter OUT``.
notebooks/README.md (paths 1 and 2 of "Grading") says what each build makes of a chapter, and how to
grade with it.

``build_nbgrader(out_dir)``: an nbgrader course folder (``nbgrader_config.py``,
``source/<chapter>/<chapter>.ipynb``) on which ``nbgrader generate_assignment`` and ``autograde``
run as they are. An exercise cell becomes a solution cell from its first placeholder on (the
reference answer, ``grading.solution_code``, between nbgrader's markers), the statements above it a
locked cell (nbgrader never puts back a solution cell's source); each ``lk.check.<name>(...)`` an
autograded test cell whose public half asserts an attempt while graded and whose hidden half asserts
the pass; a prediction cell (``my_guess_*``) stays the learner's; every other cell is locked.
nbgrader's behaviour this relies on, with its source lines: /work/notes/nbgrader_facts.md (the
lead's notes).

``build_otter(out_dir)``: one otter-grader 7 source notebook per chapter, on which ``otter assign``
runs as it is: a raw ``# ASSIGNMENT CONFIG`` cell (``OTTER_CONFIG``), then each check a question
worth its checker's points with a public case (0 points, the one ``grader.check`` runs) and a hidden
one. otter's behaviour this relies on, read in its installed source (otter 7.0.0):
``assign/blocks.py``, ``assign/solutions.py``, ``assign/tests_manager.py``,
``test_files/abstract_test.py``, ``execute/preprocessor.py``, ``test_files/__init__.py``.
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import json
import os
import re
from pathlib import Path

from ..base.runtime import ConfigError
from ..base.paths import write_atomic
from ..base.release import SOURCE
from ..chapters.measured import FILE as MEASUREMENTS
from ..content import pages
from . import grading
from .grading import (binds, chapter_paths, check_of, exercise_tag, is_check_call, placeholder_end,
                      solution_code)

__all__ = ["SCHEMA_VERSION", "CONFIG", "nbgrader_cells", "build_nbgrader", "OTTER_CONFIG",
           "OTTER_MEASURED", "OTTER_BEGIN", "OTTER_END", "otter_cells", "build_otter"]

SCHEMA_VERSION = 3  # nbgrader's cell-metadata schema (nbgrader/nbgraderformat/v3.json, nbgrader 0.9)
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"  # nbgrader's ClearHiddenTests defaults
# The text the build writes: templates/assignments.md. labkit's seal (issue 45) and the start of every test cell.
SEAL_CHECK = pages.section("assignments.md", "seal-check")
TEST_PREAMBLE = pages.section("assignments.md", "test-preamble").format(seal=SEAL_CHECK)
GUESS = re.compile(r"^my_guess\w*$")

CONFIG = pages.section("assignments.md", "config") + "\n"  # nbgrader_config.py


# ---- one chapter's cells -----------------------------------------------------------------------------


def _meta(cell: dict, grade_id: str, *, grade=False, solution=False, locked=False, points=None) -> dict:
    nb = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": SCHEMA_VERSION,
          "solution": solution}
    if points is not None:
        nb["points"] = points
    return {**cell, "metadata": {**cell.get("metadata", {}), "nbgrader": nb}}


def _code_cell(cell_id: str, text: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": cell_id, "metadata": {}, "outputs": [],
            "source": text}


def _indented(text: str) -> str:
    """``text`` one level in, for a ``with`` block; as ast.unparse writes it where indenting would change the
    code (a string over several lines)."""
    inner = "\n".join("    " + ln if ln.strip() else ln for ln in text.splitlines())
    try:
        same = ([ast.dump(s) for s in ast.parse("if 1:\n" + inner).body[0].body]
                == [ast.dump(s) for s in ast.parse(text).body])
    except SyntaxError:
        same = False
    return inner if same else "\n".join("    " + ast.unparse(s) for s in ast.parse(text).body)


def _test_source(stmt, text: str) -> str:
    """The check, kept as written when it binds its result (``check = lk.check.x(...)``), then the asserts. The
    check runs with the real labkit whatever the notebook bound to ``lk``, and with stderr sent to stdout: nbgrader
    scores 0 a test cell that writes to stderr (a warning raised in the learner's function during the check would
    cost a right answer its points; Python's warnings are written to ``sys.stderr`` as it is when shown)."""
    shown = ""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        result = stmt.targets[0].id  # the chapter shows it in the code after the check (a cell of its own here)
    elif isinstance(stmt, ast.Expr):
        result, text = "graded", "graded = " + text
        # the chapter's cell showed the result: so does this one (display_data; an execute_result -- the cell's
        # value -- would be read by nbgrader as a partial score)
        shown = _text("shown", result=result) + "\n"
    else:
        raise ValueError(f"a check inside a {type(stmt).__name__} statement: {text.splitlines()[0]}")
    name = check_of(stmt)
    if name in grading.MEASURED and is_check_call(stmt.value):
        # graded, a measured check judges the saved file whatever it is passed; its arguments are not even read,
        # so a locked cell deleted above (nbgrader does not put those back) cannot cost the grade
        text = _text("measured", file=MEASUREMENTS, result=result, name=name, call=ast.unparse(stmt.value))
    # A failed assert's message is the check's verdict ("not attempted yet", "not yet" and its hint): the learner's
    # feedback, and the error nbgrader scores 0. The public half, in the release, fails on a wrong answer in the
    # learner's kernel and in Validate; while graded it asks for an attempt only, and the hidden half -- stripped
    # from the release, put back from the gradebook when graded -- decides the points.
    asserts = _text("asserts", public=_text("public", result=result), result=result, hidden_begin=HIDDEN_BEGIN,
                    hidden_end=HIDDEN_END)
    return f"{TEST_PREAMBLE}\n{_indented(text)}\n{shown}{asserts}"


def _text(key: str, **values) -> str:
    return pages.section("assignments.md", key).format(**values)


def _split_at_check(cell: dict, chapter: str, solutions: Path | None) -> list:
    """One cell -> its cells in the graded build: [code before the check (for an exercise: its context, locked,
    then the solution cell from the first placeholder on; else locked), the test cell, code after the check
    (locked)]; a cell without a check -> itself, marked."""
    text, cid, tag = pages.source(cell), cell["id"], exercise_tag(cell)
    tree = ast.parse(text)
    lines = text.splitlines()
    at = next((i for i, s in enumerate(tree.body) if check_of(s)), None)
    cut = tree.body[at].lineno - 1 if at is not None else len(lines)
    before, context = lines[:cut], []
    if tag:
        end = placeholder_end(tree, grading.ANSWERS[tag])
        if not end or end > cut:
            raise ValueError(f"{chapter}, {tag}: no placeholder of {sorted(grading.ANSWERS[tag])} "
                             "before its check")
        # the statements above the first placeholder (``n_params = fu["n_params"]``) are the exercise's given
        # context: locked, so that grading puts them back (nbgrader never restores a solution cell)
        first = next(i for i, s in enumerate(tree.body) if binds(s) & set(grading.ANSWERS[tag]))
        start = tree.body[first - 1].end_lineno if first else 0
        region = [BEGIN, solution_code(tag, solutions), END]
        context, before = before[:start], before[start:end] + region + before[end:]
    out = []
    if "\n".join(context).strip():
        out.append(_meta(_code_cell(f"{cid}-context", "\n".join(context).strip()), f"cell-{cid}-context", locked=True))
    if "\n".join(before).strip():
        body = {**cell, "source": "\n".join(before).strip("\n").rstrip()}
        out.append(_meta(body, tag, solution=True) if tag else _meta(body, f"cell-{cid}", locked=True))
    if at is None:
        return out
    stmt, name = tree.body[at], check_of(tree.body[at])
    test = _code_cell(f"{cid}-check", _test_source(stmt, "\n".join(lines[stmt.lineno - 1:stmt.end_lineno])))
    out.append(_meta(test, f"check-{chapter}-{name}", grade=True, locked=True, points=grading.POINTS[name]))
    after = "\n".join(lines[stmt.end_lineno:]).strip()
    if after:
        out.append(_meta(_code_cell(f"{cid}-after", after), f"cell-{cid}-after", locked=True))
    return out


def _is_prediction(cell) -> bool:
    try:
        tree = ast.parse(pages.source(cell))
    except SyntaxError:
        return False
    return any(isinstance(s, ast.Assign) and any(GUESS.match(n) for n in binds(s)) for s in tree.body)


def nbgrader_cells(nb: dict, chapter: str, solutions: Path | None = None) -> list:
    """A chapter's cells (a notebook's JSON ``cells``) as nbgrader's source version of the assignment."""
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and (exercise_tag(cell) or check_of(ast.parse(pages.source(cell)))):
            out += _split_at_check(cell, chapter, solutions)
        elif cell["cell_type"] == "code" and _is_prediction(cell):
            out.append(cell)  # the learner's prediction: theirs to write, never graded
        else:
            out.append(_meta(cell, f"cell-{cell['id']}", locked=True))
    for cell in out:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return out


# ---- the course folder ----------------------------------------------------------------------------------


UPDATES = "labkit-updates"  # where the new version of a file the instructor edited goes (outside source/:
# nbgrader would take a second notebook there for part of the assignment, and release any other file in it)


def _built_mark(nb: dict) -> str:
    """The SHA-256 of a notebook's content as labkit built it (its own mark left out, keys sorted): a
    notebook whose content no longer gives its mark was edited after the build."""
    meta = {k: v for k, v in nb.get("metadata", {}).items() if k != "labkit"}
    return hashlib.sha256(json.dumps({**nb, "metadata": meta}, sort_keys=True).encode()).hexdigest()


def _edited(path: Path, new_text: str) -> bool:
    """Whether ``path`` holds an instructor's edit that the new build would lose: it exists, differs from
    the new text, and (a notebook) no longer matches the mark labkit left in it -- or has none (built by an
    older labkit, or not by labkit at all: kept, to be safe)."""
    if not path.exists():
        return False
    old = path.read_text(errors="replace")
    if old == new_text:
        return False
    if path.suffix != ".ipynb":
        return True
    try:
        nb = json.loads(old)
        mark = nb["metadata"]["labkit"]["built_sha256"]
    except (ValueError, KeyError, TypeError):
        return True
    return mark != _built_mark(nb)


def _no_links(out: Path, names) -> None:
    """Refuse (ConfigError, one line, before anything is written) a symbolic link, or a non-folder where a
    folder goes, anywhere below ``out`` that the build writes in or through."""
    folders = [out / "source", out / UPDATES, out / UPDATES / "source"] + \
              [d / "source" / n for d in (out, out / UPDATES) for n in names]
    files = [out / "nbgrader_config.py"] + [out / "source" / n / f"{n}.ipynb" for n in names]
    for path in folders + files:
        if path.is_symlink():
            raise ConfigError("out", str(out), f"a course folder without symbolic links: {path} is one (to "
                                               f"{os.readlink(path)}); labkit does not write through links, remove it")
        if path.exists() and (path in folders) != path.is_dir():
            raise ConfigError("out", str(out), f"a course folder labkit can write: {path} is "
                                               f"{'not a folder' if path in folders else 'not a file'}")


def _write_kept(out: Path, rel: str, text: str, force: bool, kept: list, private: bool = False) -> None:
    """Write ``out / rel``; an instructor's edit of it is kept (unless ``force``) and the new version goes
    to ``out / UPDATES / rel``, the pair noted in ``kept``. ``private``: it holds solutions or hidden tests,
    so its folders are 0700 and the file 0600."""
    target = out / rel
    if not force and _edited(target, text):
        target = out / UPDATES / rel
        kept.append((str(out / rel), str(target)))
    if private:
        for folder in reversed(target.relative_to(out).parents[:-1]):
            private_folder(out / folder)
        private_file(target, text)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, text)


def build_nbgrader(out_dir, chapters=None, force: bool = False, lang: str = "en") -> dict:
    """Write the nbgrader course folder ``out_dir``: nbgrader_config.py and source/<chapter>/<chapter>.ipynb
    for each chapter (``chapters``: numbers such as ["03", "11"]; None: all). Only those files are written:
    an existing gradebook, release or submissions stay. A file the instructor edited since labkit wrote it
    is kept (``force``: replaced) and the new version written under ``labkit-updates/``; no symbolic link
    below ``out_dir`` is written through (refused before anything is written). Returns {assignment:
    {"checks", "exercises", "points", "kept": [(kept file, where the new version went)]}} (the config's
    pair, if kept, in the first assignment's list). ``lang="ru"`` builds the Russian edition's chapters
    (notebooks/ru/): the same cells and checks, their words and the checkers' hints in Russian."""
    paths = chapter_paths(chapters, lang)  # first: an unknown chapter is the caller's error
    solutions = grading.solutions_dir()
    built = {}
    for path in paths:  # every chapter is built before anything is written
        nb = json.loads(path.read_text())
        cells = nbgrader_cells(nb, path.name[:2], solutions)
        graded = [c["metadata"]["nbgrader"] for c in cells if c["metadata"].get("nbgrader", {}).get("grade")]
        built[path.stem] = ({**nb, "cells": cells},
                            {"exercises": sum(1 for c in nb["cells"] if exercise_tag(c)), "checks": len(graded),
                             "points": sum(g["points"] for g in graded), "kept": []})
    out = Path(out_dir)
    _no_links(out, list(built))
    private_folder(out / "source")  # the reference answers and hidden tests: for the instructor's account only
    _write_kept(out, "nbgrader_config.py", CONFIG, force, next(iter(built.values()))[1]["kept"])
    for name, (nb, summary) in built.items():
        nb = {**nb, "metadata": {**nb.get("metadata", {}), "labkit": {"built_sha256": _built_mark(nb)}}}
        _write_kept(out, f"source/{name}/{name}.ipynb", json.dumps(nb, indent=1, ensure_ascii=False) + "\n", force,
                    summary["kept"], private=True)
    return {name: summary for name, (_, summary) in built.items()}


def private_folder(path: Path) -> Path:
    """``path`` as a folder only its owner may enter (0700, made so if it exists): it holds solutions or grades."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def private_file(path: Path, text: str) -> Path:
    """``text`` written atomically to ``path``, readable by its owner only (0600)."""
    write_atomic(path, text)
    os.chmod(path, 0o600)
    return path


# ---- otter-grader's source notebooks ----------------------------------------------------------


# NO PROMPT: the chapter's placeholder is the prompt
OTTER_BEGIN, OTTER_END = "# BEGIN SOLUTION NO PROMPT", "# END SOLUTION"

OTTER_CONFIG = pages.section("otter.md", "config") + "\n"  # the text: templates/otter.md

# The autograder image on Gradescope starts without labkit: otter assign adds this file's lines to the zip's
# environment.yml, which the image installs (``otter run`` grades in the environment it is run from).
OTTER_REQUIREMENTS = pages.section("otter.md", "requirements").format(
    source=SOURCE or pages.section("otter.md", "unpublished")) + "\n"

# A chapter with measured exercises (grading.MEASURED): the learner's export zip carries the file their checks
# saved, which the grader's checks judge (labkit.check.measurements); otter runs the notebook in the folder the
# zip is unpacked in. Without the file otter's export stops and names it. ``otter assign`` would grade the
# reference notebook without such a file, and fail: it does not.
OTTER_MEASURED = {
    "run_tests": pages.section("otter.md", "measured-run-tests") + "\n",
    "files": pages.section("otter.md", "measured-files").format(file=MEASUREMENTS) + "\n",
}


# otter's export stops when a file it is told to zip is missing: a learner who has not run a measured exercise
# yet must still be able to hand in the rest, so the chapter starts with an empty file (labkit's checks add to it).
EMPTY_MEASUREMENTS = pages.section("otter.md", "empty-measurements").format(file=MEASUREMENTS)


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
    end = placeholder_end(tree, grading.ANSWERS[tag])
    if not end:
        raise ValueError(f"{chapter}, {tag}: no placeholder of {sorted(grading.ANSWERS[tag])} "
                         "in its cell")
    code = solution_code(tag, solutions)
    for line in code.splitlines():
        if re.search(r"# ?(BEGIN|END) SOLUTION", line):
            raise ValueError(f"{chapter}, {tag}: the reference answer holds otter's marker {line.strip()!r}")
    lines = text.splitlines()
    return {**cell, "source": "\n".join(lines[:end] + [OTTER_BEGIN, code, OTTER_END] + lines[end:])}


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
            _code_cell(f"{qid}-public", _case_source(call, hidden=False, points=0)),
            _code_cell(f"{qid}-hidden", _case_source(call, hidden=True, points=points)),
            _raw(f"{qid}-end-tests", "# END TESTS"), _raw(f"{qid}-end", "# END QUESTION")]


def otter_cells(nb: dict, assignment: str, solutions: Path | None = None) -> list:
    """A chapter's cells (a notebook's JSON ``cells``) as otter's source notebook of the assignment
    (``assignment``: the chapter's name, e.g. 03_gradient_accumulation), config cell first. An exercise whose
    check is in a later cell (chapter 09's budget pick) makes one question of the cells from the exercise to
    the check."""
    chapter = assignment[:2]
    checks = {check_of(s) for c in nb["cells"] if c["cell_type"] == "code" for s in ast.parse(pages.source(c)).body}
    measured = OTTER_MEASURED if checks & set(grading.MEASURED) else dict.fromkeys(OTTER_MEASURED, "")
    config = OTTER_CONFIG.format(name=json.dumps(assignment), **measured)
    out = [_raw(f"otter-{chapter}-config", config)]
    if checks & set(grading.MEASURED):
        out.append(_code_cell(f"otter-{chapter}-measurements", EMPTY_MEASUREMENTS))
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
    paths = chapter_paths(chapters, lang)  # first: an unknown chapter is the caller's error
    solutions = grading.solutions_dir()
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
        write_atomic(out / name / "requirements.txt", OTTER_REQUIREMENTS)
    return {name: summary for name, (_, summary) in built.items()}
