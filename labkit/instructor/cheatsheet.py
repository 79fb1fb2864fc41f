"""The one-page cheat sheet, ``notebooks/cheatsheet.md``: every chapter's "the code" cells (tagged
``code-<chapter>-<what>``), grouped by chapter, each with a link to its section, then the interview questions
the chapter measures (read from the bank, ``notebooks/interview_questions.md``) -- what a learner rereads
the night before an interview. Generated from the notebooks and the bank, never edited by hand:

    python -m labkit.instructor.cheatsheet --write     # rewrites notebooks/cheatsheet.md
    python -m labkit.instructor.cheatsheet             # prints it

A cell that shows a labkit function (``lk.course.show(lk.engine.step.micro_steps)``) contributes that
function's current source, so the sheet holds the code the chapters' measurements ran.
"""
from __future__ import annotations

import argparse
import inspect

from ..content import pages, questions

PATH = pages.NOTEBOOKS / "cheatsheet.md"


def entries(nb) -> list:
    """[(heading, tag, code)] for the chapter's "the code" cells, in order."""
    cs = pages.cells(nb)
    out = []
    for i, c in enumerate(cs):
        tag = next((t for t in pages.tags(c) if t.startswith(pages.CODE_TAG)), None)
        if c["cell_type"] != "code" or tag is None:
            continue
        src = pages.source(c).strip()
        names = pages.shown(src)
        code = "\n\n".join(inspect.getsource(pages.resolve(n)).rstrip() for n in names) if names else src
        out.append((pages.heading_before(cs, i), tag, code))
    return out


def bank_questions(nb) -> list:
    """The bank's questions this chapter measures most directly (their first "Measured in" link is here)."""
    return [q for q in questions.QUESTIONS if q.links[0].notebook == nb.name]


def title(nb) -> str:
    first = next(c for c in pages.cells(nb) if c.get("cell_type") == "markdown")  # after the set-up cell
    return next((ln.lstrip("#").strip() for ln in pages.source(first).splitlines() if ln.startswith("#")), nb.stem)


def build() -> str:
    parts = [_text("head"), ""]
    for nb in pages.chapters():
        found, asked = entries(nb), bank_questions(nb)
        if not (found or asked):
            continue
        parts += [f"## {title(nb)}", ""]
        for heading, tag, code in found:
            parts += [_text("entry", heading=heading or tag, notebook=nb.name, anchor=pages.anchor(heading), tag=tag,
                            code=code), ""]
        if asked:
            parts += [_text("asked"), ""]
            parts += [_text("question", heading=q.heading, file=questions.FILE, anchor=pages.anchor(q.question))
                      for q in asked] + [""]
    return "\n".join(parts).rstrip() + "\n"


def _text(key: str, **values) -> str:
    return pages.section("cheatsheet.md", key).format(**values)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {PATH.name}")
    ns = ap.parse_args(argv)
    text = build()
    if ns.write:
        PATH.write_text(text)
        print(f"wrote {PATH} ({len(text.splitlines())} lines)")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()

__all__ = ["build", "entries", "bank_questions", "PATH"]
