"""Chapters 07, 08, 10 and 11 close with interview answers that point a learner at the section measuring each one
(issue 46, item 9: JupyterLab shows no cell tags, so an answer naming `measure-11-exact` points nowhere): a
link to the section's heading, the cell tags kept in the link's title as the question bank keeps them."""
import re
from pathlib import Path

import nbformat
import pytest

from labkit.content import pages

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = ["07_kernels_and_compile.ipynb", "08_memory_in_practice.ipynb",
            "10_when_the_model_does_not_fit.ipynb", "11_long_runs_and_failures.ipynb"]
LINK = re.compile(r'\[([^\]]+)\]\(#(\S+) "([^"]+)"\)')


def _sections(nb):
    """{tag: the anchors of the headings its cell sits under (its ## section and ### subsection)}."""
    under, out = {}, {}
    for c in nb.cells:
        if c.cell_type == "markdown":
            for m in re.finditer(r"^(#{2,3}) (.+)$", c.source, re.M):
                level = len(m.group(1))
                under = {lv: a for lv, a in under.items() if lv < level}
                under[level] = pages.anchor(m.group(2).strip())
        for t in c.metadata.get("tags", []):
            out[t] = set(under.values())
    return out


@pytest.mark.parametrize("name", CHAPTERS)
def test_interview_answers_link_the_section_that_measures_them(name):
    nb = nbformat.read(str(NB_DIR / name), as_version=4)
    closing = [c.source for c in nb.cells if c.cell_type == "markdown" and "<details>" in c.source]
    assert closing
    sections, links = _sections(nb), 0
    for text in closing:
        assert not re.search(r"`measure-\d\d-[a-z0-9-]+`", text), f"{name}: a bare cell tag a learner cannot find"
        for words, anchor, title in LINK.findall(text):
            links += 1
            assert anchor == pages.anchor(words), (name, words, anchor)
            for tag in title.split():
                assert anchor in sections.get(tag, ()), f"{name}: {tag} is not under #{anchor}"
    assert links >= 6
