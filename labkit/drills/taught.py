"""Where the course teaches a drill: the chapter notebook and the section heading above the cell a case
names in ``teaches`` -- what the score card links to, since JupyterLab shows a chapter's headings and
never its cell tags. Read from the course's own notebooks (a checkout's, or the copy an installed labkit
carries), so a renamed heading is followed, not remembered.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from ..base.page import anchor
from ..base.phrases import notebooks_dir
from .cases import Case


@functools.lru_cache(maxsize=None)
def _sections(folder: Path, chapter: str) -> tuple:
    """(notebook file name, {tag: the heading above it}) of chapter ``chapter`` ("06") in ``folder``."""
    found = sorted(folder.glob(f"{chapter}_*.ipynb"))
    if not found:
        return "", {}
    heading, under = "", {}
    for cell in json.loads(found[0].read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            lines = [ln for ln in "".join(cell["source"]).splitlines() if ln.startswith("#")]
            heading = lines[-1].lstrip("#").strip() if lines else heading
        for tag in cell.get("metadata", {}).get("tags", []):
            under[tag] = heading
    return found[0].name, under


def where_taught(case: Case) -> dict:
    """{"tag", "chapter", "notebook", "heading", "href"} for ``case``: ``href`` is the notebook and the
    heading's anchor, relative (the chapters sit beside the interview notebook in a checkout's notebooks/
    and in a folder ``labkit course`` made). Without the notebooks at hand: the chapter alone, "" for the
    rest."""
    chapter = case.teaches.split("-")[1]
    folder = notebooks_dir()
    notebook, under = _sections(folder, chapter) if folder is not None else ("", {})
    heading = under.get(case.teaches, "")
    href = f"{notebook}#{anchor(heading)}" if notebook and heading else notebook
    return {"tag": case.teaches, "chapter": chapter, "notebook": notebook, "heading": heading, "href": href}


__all__ = ["where_taught", "anchor", "notebooks_dir"]
