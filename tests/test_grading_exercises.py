"""labkit.instructor.grading: what a chapter's exercise is, read from the chapter -- the reading the nbgrader and
otter builds and ``labkit grade`` share."""
from __future__ import annotations

import ast

import nbformat
import pytest

from labkit.base.runtime import ConfigError
from labkit.content import pages
from labkit.instructor import grading


def test_check_calls_are_real_calls_in_the_order_written():
    source = ('r = lk.check.token_weights(my_weights)  # then lk.check.not_this(x) in a comment\n'
              'print("lk.check.nor_this(1)")\n'
              'ok = lk.check.accumulation_loop(loop) and lk.check.accum_steps_needed(8)\n'
              'lk.checks.other(1); check.plain(2); lk.check.pad_vocab\n')
    assert grading.check_calls(source) == ["token_weights", "accumulation_loop", "accum_steps_needed"]
    assert grading.check_of(ast.parse("x = lk.check.pad_vocab(v)").body[0]) == "pad_vocab"
    assert grading.check_of(ast.parse("x = lk.pad_vocab(v)").body[0]) is None


def test_every_chapter_exercise_has_a_tag_a_placeholder_and_a_graded_check():
    seen = set()
    for path in pages.chapters():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            tag = grading.exercise_tag(cell) if cell.cell_type == "code" else None
            if tag:
                assert tag.startswith(f"exercise-{path.name[:2]}-"), tag
                assert grading.placeholder_end(ast.parse(cell.source), grading.ANSWERS[tag]) > 0, tag
                seen.add(tag)
    assert seen == set(grading.ANSWERS)  # every answered exercise is in a chapter, and the other way round


def test_the_reference_answer_is_code_that_defines_every_placeholder():
    for tag, names in grading.ANSWERS.items():
        code = grading.solution_code(tag)
        defined = {n for s in ast.parse(code).body for n in grading.binds(s)}
        assert set(names) <= defined, tag


def test_chapter_paths_by_number_and_an_unknown_one_refused_by_name():
    assert [p.name[:2] for p in grading.chapter_paths(["03", "00", "03"])] == ["00", "03"]
    assert grading.chapter_paths(None) == pages.chapters()
    for bad in (["3"], ["99"], []):
        with pytest.raises(ConfigError) as e:
            grading.chapter_paths(bad)
        assert e.value.field == "chapters"
