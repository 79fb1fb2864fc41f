"""What a learner sees in a chapter's code cells, read from the notebooks (issue 27).

Shared by ``tests/test_show_the_code.py`` and the cheat sheet (``labkit.instructor.cheatsheet``):

* ``visible_code(nb)``: the text of every code cell a learner reads -- exercises' cells left out -- plus the
  current source of every labkit function a cell shows with ``lk.course.show(lk.a.b.c)``;
* ``formatting_lines(source)``: the lines of a cell that build prose (f-strings, ``.format``, ``+`` on strings);
* ``shown(source)``: the objects a cell shows, resolved from their ``lk.``-dotted names.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import io
import json
import re
import tokenize
from pathlib import Path

from ..base.page import anchor  # noqa: F401 -- pages.anchor, as the cheat sheet and the bank call it

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CODE_TAG = "code-"          # a "the code" cell: tag code-<chapter>-<what>, e.g. code-03-accumulation-loop
EXERCISE_TAG = "exercise-"  # an exercise's cell (what the learner writes does not count as shown)


def chapters() -> list:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def cells(nb: Path) -> list:
    return json.loads(Path(nb).read_text())["cells"]


def source(cell) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def tags(cell) -> list:
    return list(cell.get("metadata", {}).get("tags", []))


def is_exercise(cell) -> bool:
    return any(t.startswith(EXERCISE_TAG) for t in tags(cell)) or "# your code here" in source(cell)


@functools.lru_cache(maxsize=1)
def aliases() -> dict:
    """The names the chapters import labkit's packages under (``from labkit.chapters import longrun as lr``
    -> {"lr": "labkit.chapters.longrun"}), read from their code cells."""
    found = {}
    for nb in chapters():
        for c in cells(nb):
            if c["cell_type"] != "code":
                continue
            try:
                tree = ast.parse(source(c))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
                    found.update({a.asname: f"{node.module}.{a.name}" for a in node.names if a.asname})
                elif isinstance(node, ast.Import):
                    found.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("labkit")})
    return found


def resolve(dotted: str):
    """``lk.engine.step.micro_steps`` (or a chapter's alias, ``lr.state.save_checkpoint``) -> the function
    (submodules imported as needed)."""
    parts = dotted.split(".")
    if parts[0] not in ("lk", "labkit") and parts[0] in aliases():
        parts = aliases()[parts[0]].split(".") + parts[1:]
    if parts[0] not in ("lk", "labkit"):
        raise ValueError(f"lk.course.show takes lk.-dotted names (where the code lives), not {dotted!r}")
    obj, path = importlib.import_module("labkit"), "labkit"
    for p in parts[1:]:
        path += "." + p
        try:
            obj = getattr(obj, p)
        except AttributeError:
            obj = importlib.import_module(path)
    return obj


def shown(src: str) -> list:
    """The dotted names a cell passes to ``lk.course.show(...)``."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("lk.course.show", "course.show"):
            names += [ast.unparse(a) for a in node.args]
    return names


def visible_code(nb: Path) -> str:
    """Code cells a learner reads (not exercises), then the current source of every function they show."""
    out = []
    for c in cells(nb):
        if c["cell_type"] != "code" or is_exercise(c):
            continue
        src = source(c)
        out.append(src)
        out += [inspect.getsource(resolve(n)) for n in shown(src)]
    return "\n".join(out)


def code_lines(src: str) -> set:
    """Line numbers (1-based) holding code: not blank, not only a comment, not an IPython magic."""
    return {i + 1 for i, ln in enumerate(src.splitlines())
            if ln.strip() and not ln.strip().startswith(("#", "%", "!"))}


def formatting_lines(src: str) -> set:
    """Code lines that build prose: any line an f-string spans, a ``.format(``, ``.join(`` or ``%`` on a
    string, and a string joined to something with ``+`` (``say(note)`` of a prepared Note builds nothing)."""
    lines = set()
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return set()
    for t in toks:  # f-strings; "%"-formatting is the BinOp rule below
        if t.type == tokenize.STRING and "f" in re.match(r"[A-Za-z]*", t.string).group().lower():
            lines.update(range(t.start[0], t.end[0] + 1))
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return lines & code_lines(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)) and any(
                _is_text(side) for side in (node.left, node.right)):  # "words " + str(x): prose built by hand
            lines.update(range(node.lineno, node.end_lineno + 1))
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        on_literal = isinstance(getattr(node.func, "value", None), (ast.Constant, ast.JoinedStr))
        if on_literal and (name.endswith(".format") or name.endswith(".join")):  # "{} and {}".format, ", ".join
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines & code_lines(src)


def _is_text(node) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def heading_before(nb_cells: list, index: int) -> str:
    """The nearest markdown heading above cell ``index`` (its text, without the #s)."""
    for c in reversed(nb_cells[:index]):
        if c["cell_type"] == "markdown":
            for ln in reversed(source(c).splitlines()):
                if ln.startswith("#"):
                    return ln.lstrip("#").strip()
    return ""
