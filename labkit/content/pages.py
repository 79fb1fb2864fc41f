"""The course's pages as labkit reads them: the chapters' cells (source, tags, headings, and the labkit functions a
cell shows with ``lk.course.show(lk.a.b.c)``: ``shown``, ``resolve``), read by the bank's link check, the cheat
sheet, the graded builds and tests/test_show_the_code.py; and the templates of the quiz and the instructor kit
(``templates/*.md``: ``sections``, ``section``, ``items``).
"""
from __future__ import annotations

import ast
import functools
import importlib
import json
import re
from pathlib import Path

from ..base.errors import ConfigError
from ..base.page import anchor  # noqa: F401 -- pages.anchor, as the cheat sheet and the bank call it

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CODE_TAG = "code-"          # a "the code" cell: tag code-<chapter>-<what>, e.g. code-03-accumulation-loop


LANGUAGES = ("en", "ru")  # the course's editions: English in notebooks/, Russian in notebooks/ru/ (issue #51)


def chapters(lang: str = "en") -> list:
    """The chapters' notebooks of one edition (the Russian: those built so far)."""
    if lang not in LANGUAGES:
        raise ConfigError("lang", lang, "one of " + ", ".join(LANGUAGES))
    return sorted((NOTEBOOKS if lang == "en" else NOTEBOOKS / lang).glob("[0-9][0-9]_*.ipynb"))


def cells(nb: Path) -> list:
    return json.loads(Path(nb).read_text())["cells"]


def source(cell) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def tags(cell) -> list:
    return list(cell.get("metadata", {}).get("tags", []))


@functools.lru_cache(maxsize=1)
def aliases() -> dict:
    """The names the chapters import labkit's packages under (``from labkit.chapters import ch11_longrun as lr``
    -> {"lr": "labkit.chapters.ch11_longrun"}; ``from labkit.chapters.ch12_compose import moe`` -> {"moe": ...}),
    read from their code cells."""
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
                    found.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
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


# A link's fragment JupyterLab (>= 4.0) scrolls to: #cell-id=c05, the cell of that id. It does not scroll to a
# Cyrillic heading's anchor (it compares the percent-encoded fragment with the id, jupyterlab#12402), nor to any
# heading of a notebook the link has just opened: the Russian build's and the quiz's section links use this.
CELL_ID = "cell-id="
HEADING = re.compile(r"^#+ (.+)$", re.M)


def heading_cells(nb_cells: list) -> dict:
    """{JupyterLab's anchor of a heading: the id of the markdown cell that holds it} (the first such cell)."""
    out = {}
    for c in nb_cells:
        if c["cell_type"] == "markdown":
            for m in HEADING.finditer(source(c)):
                out.setdefault(anchor(m.group(1)), c["id"])
    return out


def heading_cell(nb_cells: list, index: int) -> dict:
    """The markdown cell holding the nearest heading above cell ``index`` (``heading_before``'s)."""
    return next(c for c in reversed(nb_cells[:index]) if c["cell_type"] == "markdown"
                and any(ln.startswith("#") for ln in source(c).splitlines()))


def heading_before(nb_cells: list, index: int) -> str:
    """The nearest markdown heading above cell ``index`` (its text, without the #s)."""
    for c in reversed(nb_cells[:index]):
        if c["cell_type"] == "markdown":
            for ln in reversed(source(c).splitlines()):
                if ln.startswith("#"):
                    return ln.lstrip("#").strip()
    return ""


# ---- the templates ----------------------------------------------------------------------------------------
# Words live where they are read (issue #47): a document's text in a document, not in Python strings. A template is
# a markdown file whose ``## name`` sections each hold one piece: the lines of the first fenced block under the
# heading (```` ``` ```` or ``~~~``, closed by the same fence; exactly those lines, no newline after the last), or,
# with no fence, the section's text without the blank lines around it. Placeholders are ``str.format``'s. The
# folder ships in the wheel (pyproject.toml's package-data).
TEMPLATES = Path(__file__).resolve().parent / "templates"
_SECTION = re.compile(r"^## (?P<name>\S.*?)\s*$")
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})")


@functools.lru_cache(maxsize=None)
def sections(name: str) -> dict:
    """{section name: its text} of templates/NAME."""
    out, current, body = {}, None, []
    for line in (TEMPLATES / name).read_text(encoding="utf-8").split("\n") + ["## "]:
        m = _SECTION.match(line) if not (body and _open_fence(body)) else None
        if m or line == "## ":
            if current is not None:
                out[current] = _piece(body)
            current, body = (m.group("name") if m else None), []
        elif current is not None:
            body.append(line)
    return out


def _open_fence(body: list) -> bool:
    """Whether ``body`` ends inside a fenced block (a heading there is the template's text, not a section)."""
    fence = None
    for line in body:
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group("fence")
        elif fence is not None and line.rstrip() == fence:
            fence = None
    return fence is not None


def _piece(body: list) -> str:
    start = next((i for i, ln in enumerate(body) if _FENCE.match(ln)), None)
    if start is None:
        return "\n".join(body).strip("\n")
    fence = _FENCE.match(body[start]).group("fence")
    end = next(i for i in range(start + 1, len(body)) if body[i].rstrip() == fence)
    return "\n".join(body[start + 1:end])


def section(name: str, key: str) -> str:
    return sections(name)[key]


def items(name: str, key: str) -> dict:
    """A section of ``- key: text`` lines as {key: text}, in order."""
    pairs = (line[2:].split(": ", 1) for line in section(name, key).splitlines() if line.startswith("- "))
    return {k.strip(): v.strip() for k, v in pairs}
