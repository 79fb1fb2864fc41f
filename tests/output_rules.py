"""What a chapter shows under a result must read as a lesson (issue 46, items 6-8; issue 47): no prose block over
eight rendered lines (a table instead), no maintainer's provenance, no torch version remark that is stale on the
torch the course runs. ``problems(outputs)`` reads one cell's outputs; tests/conftest.py applies it to every cell
of every chapter nbval runs, so no chapter runs a second time for it."""
from __future__ import annotations

import math
import re

LINE = 100      # characters of a rendered line: JupyterLab's column at 1366 px holds about that much prose
MAX_LINES = 8   # issue 46: no prose block over 8 lines under a result
PROVENANCE = re.compile(r"reference search|the review cited|verified on the|from the review|maintainer", re.I)


def prose_blocks(text: str) -> list:
    """The paragraphs of markdown ``text`` that read as prose: tables, lists, headings, code and HTML left out."""
    blocks, para, fenced = [], [], False
    for line in text.splitlines() + [""]:
        s = line.strip()
        if s.startswith("```"):
            fenced = not fenced
            continue
        if fenced or not s or s.startswith(("|", "- ", "* ", "#", "<", "![")) or re.match(r"\d+\. ", s):
            if para:
                blocks.append("\n".join(para))
            para = []
            continue
        para.append(line)
    return blocks


def stale_versions(text: str) -> list:
    """Sentences that speak of torch 2.13 without saying what holds on the course's torch (2.14)."""
    return [s for s in re.split(r"(?<=[.;:])\s", text) if re.search(r"\b2\.13\b", s) and not re.search(r"\b2\.14", s)]


def rendered_lines(block: str) -> int:
    """Lines the paragraph takes on the page: markdown flows its source lines into one paragraph."""
    return max(1, math.ceil(len(" ".join(line.strip() for line in block.splitlines())) / LINE))


def outputs_text(outputs) -> list:
    """The text a learner reads in a cell's outputs: markdown where there is some, else the plain text (a
    shown function's source -- HTML only, or markdown fenced as code -- is code, not prose)."""
    texts = []
    for o in outputs or []:
        kind = o.get("output_type")
        if kind == "stream":
            texts.append(o.get("text", ""))
        elif kind in ("display_data", "execute_result"):
            data = o.get("data", {})
            if "text/html" in data and "text/markdown" not in data:
                continue  # widgets, tables and highlighted code drawn as HTML
            texts.append(data.get("text/markdown") or data.get("text/plain") or "")
        elif kind == "error":
            texts.append(f"{o.get('ename')}: {o.get('evalue')}")
    return texts


def problems(outputs) -> list:
    out = []
    for text in outputs_text(outputs):
        if PROVENANCE.search(text):
            out.append(f"maintainer's provenance shown: {PROVENANCE.search(text).group(0)!r}")
        out += [f"stale version remark: {s[:120]!r}" for s in stale_versions(text)]
        out += [f"a {rendered_lines(b)}-line prose block (at most {MAX_LINES}; a table instead): {b[:120]!r}"
                for b in prose_blocks(text) if rendered_lines(b) > MAX_LINES]
    return out
