"""nbgrader grades the other half of the chapters: the same test as tests/test_assignments.py's (see its
docstring), in a file of its own so that ``--dist loadfile`` gives the two halves to two xdist workers."""
from __future__ import annotations

import pytest

from test_assignments import GRADE_ALL_ONLY, GRADED_THERE, chapter_params, grade_chapter


@pytest.mark.parametrize("chapter", chapter_params(GRADED_THERE + GRADE_ALL_ONLY[1::2]))
def test_nbgrader_grades_the_reference_full_wrong_and_failing_answers_zero_and_a_blank_not_attempted(tmp_path, chapter):
    grade_chapter(tmp_path, chapter)
