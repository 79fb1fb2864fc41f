"""The quiz's and the instructor kit's words and generated files' text, read from ``labkit/content/templates/``
(here, not in labkit.instructor, because the quiz reads quiz.md; issue #47: words
live where they are read -- a document's text in a document, not in Python strings).

A template is a markdown file whose ``## name`` sections each hold one piece: the lines of the first fenced block
under the heading (```` ``` ```` or ``~~~``, closed by the same fence; exactly those lines, no newline after the
last), or, with no fence, the section's text without the blank lines around it. Placeholders are
``str.format``'s (``{name}``; ``{{`` for a brace). ``items`` reads a section of ``- key: text`` lines. The folder
ships in the wheel (pyproject.toml's package-data).
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

__all__ = ["FOLDER", "sections", "section", "items"]

FOLDER = Path(__file__).resolve().parent / "templates"
_HEADING = re.compile(r"^## (?P<name>\S.*?)\s*$")
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})")


@functools.lru_cache(maxsize=None)
def sections(name: str) -> dict:
    """{section name: its text} of templates/NAME."""
    out, current, body = {}, None, []
    for line in (FOLDER / name).read_text(encoding="utf-8").split("\n") + ["## "]:
        m = _HEADING.match(line) if not (body and _open_fence(body)) else None
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
