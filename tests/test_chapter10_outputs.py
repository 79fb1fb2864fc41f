"""Chapter 10 as a learner reads it (issue 46, items 6-8): no prose block over eight lines under a result, no
maintainer's provenance in the lesson, an expected error introduced before it is shown, no stale torch version,
and no note builder left (issue 47: the words are the chapter's, the package returns data).

The static tests read the notebook; what the run shows is checked in nbval's run of every chapter
(tests/conftest.py applies tests/output_rules.py to each cell's outputs)."""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import nbformat
import pytest

from output_rules import MAX_LINES, PROVENANCE, prose_blocks, rendered_lines, stale_versions

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
CH10 = NB_DIR / "10_when_the_model_does_not_fit.ipynb"


def test_the_measure_counts_a_long_paragraph_and_skips_tables():
    wall = " ".join(["word"] * 400)  # about 2,000 characters: the old reshard note's size
    assert rendered_lines(wall) == 20
    assert prose_blocks("| a | b |\n|---|---|\n| 1 | 2 |\n\n- item\n\nText.") == ["Text."]


def _cells():
    return nbformat.read(str(CH10), as_version=4).cells


def test_markdown_under_a_result_is_at_most_eight_lines():
    cells = _cells()
    for before, c in zip(cells, cells[1:]):
        if before.cell_type == "code" and c.cell_type == "markdown":
            for b in prose_blocks(c.source):
                assert rendered_lines(b) <= MAX_LINES, f"{c.id}: {rendered_lines(b)} lines: {b[:80]!r}"


def _explain_sentences(src: str) -> list:
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("course.explain"):
            out += [kw.value.value for kw in node.keywords
                    if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)]
    return out


def test_every_sentence_a_cell_can_choose_fits_eight_lines_and_no_note_builder_is_called():
    sentences = []
    for c in _cells():
        if c.cell_type != "code" or c.id == "labkit-setup":
            continue
        sentences += _explain_sentences(c.source)
        called = re.findall(r"\b(\w+_note)\(", c.source)
        assert not called, f"{c.id} calls a paragraph builder: {called}"
    assert len(sentences) >= 30
    for s in sentences:
        assert rendered_lines(s) <= MAX_LINES and not PROVENANCE.search(s), s


def test_an_expected_error_is_introduced_before_it_is_shown():
    cells = _cells()
    shown = [i for i, c in enumerate(cells) if c.cell_type == "code" and "unchanged_attention" in c.source]
    assert shown, "the chapter shows what the unchanged Attention did under ColwiseParallel"
    for i in shown:
        before = next(p for p in reversed(cells[:i]) if p.cell_type == "markdown")
        assert "Expected: an error" in before.source


def test_no_stale_torch_version_and_no_provenance_in_the_markdown():
    for c in _cells():
        if c.cell_type != "markdown":
            continue
        assert not PROVENANCE.search(c.source), c.id
        assert not stale_versions(c.source), c.id


def test_the_bubble_exercise_says_which_bubble_it_asks_for():
    cells = _cells()
    i = next(i for i, c in enumerate(cells) if "exercise-10-bubble" in c.metadata.get("tags", []))
    ask = cells[i - 1].source
    assert "formula's" in ask and "not against this run" in ask
    assert "yours: the ideal pipeline" in cells[i].source and "measured: with this machine's waits" in cells[i].source
