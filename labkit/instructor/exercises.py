"""What a chapter's exercise is, read from the chapter itself: its tag, where its placeholder ends, the checker
call that grades it, and its reference answer as code. The graded builds (``assignments`` for nbgrader,
``otter``) and ``labkit grade`` (``classgrade``) all read the chapters through these.

    exercise_tag(cell)        # "exercise-08-budget" on an exercise cell, else None
    check_calls(source)       # ["memory_budget"]: the lk.check.<name>(...) calls of a cell, in order
    solution_code(tag)        # the reference answer: notebooks/solutions/ code that answers.ANSWERS names
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from ..base.runtime import ConfigError
from ..content import pages
from . import answers

__all__ = ["binds", "solution_code", "is_check_call", "check_of", "check_calls", "placeholder_end", "exercise_tag",
           "chapter_paths"]


# ---- the reference answers -----------------------------------------------------------------------------


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
    answers in ANSWERS' form (``answers.WRONG``: the typical wrong answer, as code for a test's submission)."""
    folder = solutions or answers.solutions_dir()
    table = answers.ANSWERS if table is None else table
    what = "the reference answer" if table is answers.ANSWERS else "an answer"
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
