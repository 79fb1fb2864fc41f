"""The graded build of the course (issue 32): ``python -m labkit assignments --tool nbgrader OUT``.

``build_nbgrader(out_dir)`` writes a ready nbgrader course folder -- ``nbgrader_config.py`` and
``source/<chapter>/<chapter>.ipynb``, one assignment per chapter -- in which ``nbgrader generate_assignment``
and ``nbgrader autograde`` run as they are. In each chapter:

* an exercise cell (tagged ``exercise-NN-name``) becomes a **solution cell** from its first placeholder on: the
  placeholder stays as the learner knows it (``...  # your code here``, ``x = None``) and the reference answer
  follows it between ``### BEGIN SOLUTION`` and ``### END SOLUTION``. The answer is the code of
  ``notebooks/solutions/`` that ``answers.ANSWERS`` names, with the module-level names it needs. generate_assignment
  replaces the region by an empty stub (``nbgrader_config.py`` says so): the learner's copy is the chapter as the
  course ships it. The statements above the first placeholder -- the exercise's given context, such as chapter
  08's ``n_params = fu["n_params"]`` -- are a **locked** cell of their own (grade_id ``cell-<id>-context``): nbgrader
  never puts back a solution cell's source, so there a learner could change what the answer is judged against;
* each ``lk.check.<name>(...)`` statement becomes an **autograded test cell** (grade_id ``check-NN-name``,
  the checker's points from ``labkit.instructor.grading.POINTS``) in two halves. It shows the check's result where the
  chapter's cell showed it (``display``: the verdict and its hint, as in the plain chapter). The public half, in the
  learner's release, asserts that the check passed -- in the learner's kernel and in nbgrader's Validate, so a
  wrong answer fails there with the checker's "not yet" and its hint -- and, while graded, only that the
  exercise was attempted. The hidden half -- between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN
  TESTS`` -- asserts that the check passed: generate_assignment strips it from the release (nbgrader's
  ClearHiddenTests, on by default), and autograde puts the test cell back as the gradebook saved it from the
  source, hidden half included, so grading runs both. A failed assert's message is the checker's verdict with
  its hint: the learner's feedback line. What the cell did after the check (a sentence, a display) follows in
  a cell of its own: a test cell ends with no expression, since nbgrader would read a displayed result as the
  score. Each test cell imports labkit itself (the notebook may have bound ``lk`` to something else) and runs the
  check with stderr sent to stdout: nbgrader scores 0 a test cell that wrote to stderr, so a warning raised in the
  learner's function during the check would cost a right answer its points (Python writes a warning to
  ``sys.stderr`` as it is when the warning is shown). A test cell deleted from a submission is put back from the
  gradebook and graded (``OverwriteCells.add_missing_cells``; nbgrader inserts it after the cell before it in the
  source, and fails that submission when that cell is neither a solution nor a test cell -- chapter 09's budget
  challenge, whose check follows a locked cell);
* a prediction cell (it sets a ``my_guess_*`` name) stays the learner's to edit, outside nbgrader;
* every other cell is **locked** (read-only in JupyterLab; nbgrader puts back its source when graded).

nbgrader's behaviour this relies on, with its source lines: /work/notes/nbgrader_facts.md (the lead's notes).
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from pathlib import Path

from ..base.runtime import ConfigError
from ..base.paths import write_atomic
from ..chapters.measured import FILE as MEASUREMENTS
from ..content import pages
from . import answers, grading
from .exercises import binds, chapter_paths, check_of, exercise_tag, is_check_call, placeholder_end, solution_code

__all__ = ["SCHEMA_VERSION", "CONFIG", "nbgrader_cells", "build_nbgrader"]

SCHEMA_VERSION = 3  # nbgrader's cell-metadata schema (nbgrader/nbgraderformat/v3.json, nbgrader 0.9)
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"  # nbgrader's ClearHiddenTests defaults
# The text the build writes: templates/assignments.md. labkit's seal (issue 45) and the start of every test cell.
SEAL_CHECK = pages.section("assignments.md", "seal-check")
TEST_PREAMBLE = pages.section("assignments.md", "test-preamble").format(seal=SEAL_CHECK)
GUESS = re.compile(r"^my_guess\w*$")

CONFIG = pages.section("assignments.md", "config") + "\n"  # nbgrader_config.py


# ---- the reference answers -----------------------------------------------------------------------------


# ---- one chapter's cells -----------------------------------------------------------------------------


def _meta(cell: dict, grade_id: str, *, grade=False, solution=False, locked=False, points=None) -> dict:
    nb = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": SCHEMA_VERSION,
          "solution": solution}
    if points is not None:
        nb["points"] = points
    return {**cell, "metadata": {**cell.get("metadata", {}), "nbgrader": nb}}


def _code_cell(cell_id: str, text: str, tags=()) -> dict:
    meta = {"tags": list(tags)} if tags else {}
    return {"cell_type": "code", "execution_count": None, "id": cell_id, "metadata": meta, "outputs": [],
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
        end = placeholder_end(tree, answers.ANSWERS[tag])
        if not end or end > cut:
            raise ValueError(f"{chapter}, {tag}: no placeholder of {sorted(answers.ANSWERS[tag])} before its check")
        # the statements above the first placeholder (``n_params = fu["n_params"]``) are the exercise's given
        # context: locked, so that grading puts them back (nbgrader never restores a solution cell)
        first = next(i for i, s in enumerate(tree.body) if binds(s) & set(answers.ANSWERS[tag]))
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
    paths = chapter_paths(chapters, lang)
    solutions = answers.solutions_dir()
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
