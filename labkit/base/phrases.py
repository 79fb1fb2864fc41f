"""Sentences a learner reads, kept in a markdown page of the course rather than in Python (issue #47).

A page (``notebooks/NAME.md``) lists its sentences as ``- key: template`` items under ``##``/``###``
headings; a template's ``{name}`` placeholders are filled by the code with figures it formatted. The code
declares each key and the placeholders it fills (``spec``); ``sentences`` checks the page against it: every
key once, no other, no placeholder the code does not fill, no format in a placeholder, plain text (the
widgets and the terminal show it as written). A malformed entry raises ``PageError`` naming the file and
line, the entry, the field, the value and what is allowed.

An installed labkit reads the copy its wheel carries (``labkit/coursefiles/notebooks/``, where setup.py puts
every ``notebooks/*.md``); a checkout reads its own file.

    WORDS = phrases.load("lab_messages.md", {"oom": ("error",), ...})
    WORDS.say("oom", error=str(e))
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import paths
from .errors import ConfigError

PACKAGED = Path(__file__).resolve().parents[1] / "coursefiles" / "notebooks"  # where a wheel carries them
ITEM = re.compile(r"- (?P<key>[^:]+): (?P<value>.*)$")
NOT_PLAIN = ("`", "*", "<", "\\")  # what markdown would render otherwise: the text is shown as written


class PageError(ConfigError):
    """A malformed entry of a course page: names the file and line, the entry, the field, the value and what
    is allowed (a ConfigError: raised when the page is read, before anything uses it)."""

    KIND = ""  # what an entry is called in the message ("question" for the bank's)

    def __init__(self, where: str, entry, field_name: str, value, allowed: str):
        self.where, self.entry = where, entry
        who = f"{self.KIND + ' ' if self.KIND else ''}{entry!r}, " if entry else ""
        super().__init__(f"{where}: {who}{field_name}", value, allowed)


@dataclass(frozen=True)
class Phrases:
    """A page's sentences: {key: template}; ``say`` fills one."""
    sentences: dict
    where: str = ""

    def say(self, key: str, **values) -> str:
        """The sentence ``key`` with its placeholders filled from ``values`` (figures the caller formatted)."""
        return self.sentences[key].format(**values)


def notebooks_dir() -> Optional[Path]:
    """The folder of the course's notebooks and pages: the checkout's, else the installed package's; None
    without either."""
    checkout = paths.checkout_root()
    for folder in ((checkout / "notebooks") if checkout is not None else None, PACKAGED):
        if folder is not None and folder.is_dir():
            return folder
    return None


PAGES = ("lab_messages.md", "interview_drills.md")  # the pages labkit's own code reads (labkit grade's sandbox binds them)
BESIDE = Path(__file__).resolve().parents[2] / "notebooks"  # a checkout's pages, also where only they are at hand


def page_path(name: str) -> Path:
    """``notebooks/name`` of the checkout, else of the installed package's copy, else the page alone beside the
    package (what ``labkit grade``'s sandbox shows of a checkout: the package and these pages, read-only)."""
    folder = notebooks_dir()
    if folder is None and (BESIDE / name).is_file():
        return BESIDE / name
    if folder is None:
        raise FileNotFoundError(f"the course page {name} is not at hand: install labkit from a wheel or a checkout "
                                "(pip install .), not from a copy of the labkit/ folder alone")
    return folder / name


# ---- parsing ----------------------------------------------------------------------------------------------

def visible(lines: list) -> list:
    """[(line number, line)] outside HTML comments, blank lines kept (they end paragraphs and items)."""
    out, in_comment = [], False
    for n, ln in enumerate(lines, 1):
        if in_comment:
            in_comment = "-->" not in ln
            continue
        if ln.lstrip().startswith("<!--"):
            in_comment = "-->" not in ln
            continue
        out.append((n, ln))
    return out


def split(rows: list, level: str) -> list:
    """[(line number, heading text, [(n, line)] under it)] of the headings ``level`` ("## " or "### ")."""
    out, head = [], None
    for n, ln in rows:
        if ln.startswith(level):
            head = (n, ln[len(level):].strip(), [])
            out.append(head)
        elif head is not None:
            head[2].append((n, ln))
    return out


def plain(where: str, entry, name: str, text: str) -> str:
    """``text`` when it is non-empty plain text; else a PageError."""
    if not text:
        raise PageError(where, entry, name, text, "a text after the colon, not empty")
    bad = next((ch for ch in NOT_PLAIN if ch in text), None)
    if bad:
        raise PageError(where, entry, name, text[:60], f"plain text, shown as written: no {bad!r} (markdown "
                                                       f"would render it; labkit shows it raw)")
    return text


def items(rows: list, where: str, entry) -> list:
    """[(line number, key, value)] of ``- key: value`` items; a line indented under an item continues it;
    ``###`` headings group items and are skipped."""
    out = []
    for n, ln in rows:
        if not ln.strip() or ln.startswith("### "):
            continue
        m = ITEM.match(ln)
        if m:
            out.append([n, m["key"].strip(), m["value"].strip()])
        elif ln.startswith((" ", "\t")) and out:
            out[-1][2] += " " + ln.strip()
        else:
            raise PageError(f"{where}:{n}", entry, "line", ln.strip()[:60],
                            "a `- key: text` item (a longer text goes on indented lines under it)")
    return [tuple(i) for i in out]


def sentences(rows: list, where: str, spec: dict, section: str = "Sentences") -> dict:
    """{key: template} of the ``- key: template`` items in ``rows``, checked against ``spec`` {key: the
    placeholders the code fills}."""
    out = {}
    for n, key, value in items(rows, where, section):
        if key not in spec:
            raise PageError(f"{where}:{n}", key, "sentence", key, "one of the page's sentences: " + ", ".join(spec))
        if key in out:
            raise PageError(f"{where}:{n}", key, "sentence", key, "each sentence once")
        plain(f"{where}:{n}", key, "sentence", value)
        try:
            names = [(f, fmt, conv) for _, f, fmt, conv in string.Formatter().parse(value) if f is not None]
        except ValueError as e:
            raise PageError(f"{where}:{n}", key, "sentence", value[:60], f"balanced {{name}} placeholders ({e})")
        for name, fmt, conv in names:
            if name not in spec[key] or fmt or conv:
                raise PageError(f"{where}:{n}", key, "placeholder", "{" + name + (f":{fmt}" if fmt else "") + "}",
                                "{name} with name one of: " + (", ".join(spec[key]) or "none for this sentence")
                                + " (the code formats the figures)")
        out[key] = value
    missing = [k for k in spec if k not in out]
    if missing:
        raise PageError(where, missing[0], "sentence", None, f"a `- {missing[0]}: ...` item in ## {section}")
    return out


def parse(text: str, where: str, spec: dict) -> Phrases:
    """A page whose every ``##`` section lists sentences (the text above the first ``##`` is its introduction)."""
    rows = visible(text.splitlines())
    first = next((i for i, (_, ln) in enumerate(rows) if ln.startswith("## ")), len(rows))
    body = [(n, ln) for n, ln in rows[first:] if not ln.startswith("## ")]
    return Phrases(sentences(body, where, spec), where)


def load(name: str, spec: dict, path=None) -> Phrases:
    """The sentences of the course page ``name`` (``path``: another copy of it)."""
    path = Path(path) if path is not None else page_path(name)
    return parse(path.read_text(encoding="utf-8"), path.name, spec)




def _section_rows(text: str, where: str, heading: str) -> list:
    parts = {h: rows for _, h, rows in split(visible(text.splitlines()), "## ")}
    if heading not in parts:
        raise PageError(where, None, "section", heading, f"a `## {heading}` section (its sentences)")
    return parts[heading]


def load_section(name: str, heading: str, spec: dict, path=None) -> Phrases:
    """The sentences of the ``## heading`` section of the course page ``name``: a page several modules share,
    each checking its own section against its ``spec``."""
    path = Path(path) if path is not None else page_path(name)
    text = path.read_text(encoding="utf-8")
    return Phrases(sentences(_section_rows(text, path.name, heading), path.name, spec, heading), path.name)


def sections(name: str, path=None) -> list:
    """The ``##`` headings of the course page ``name``, in order."""
    path = Path(path) if path is not None else page_path(name)
    return [h for _, h, _ in split(visible(path.read_text(encoding="utf-8").splitlines()), "## ")]


__all__ = ["Phrases", "PageError", "notebooks_dir", "page_path", "parse", "load", "load_section", "sections",
           "sentences", "items", "plain", "visible", "split"]
