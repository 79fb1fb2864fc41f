"""The instructor kit's schedules and graded table, written from the one table of points (labkit/instructor/schedule.py,
issue 49 item 5): the kit is in step with ``grading.CHAPTERS``; each schedule covers the twelve chapters once and
its graded lists are exactly the "grade" exercises of its chapters; the 90-minute lab grades only those; a changed
weight makes the kit stale until ``--write``."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from labkit.instructor import grading, schedule

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "notebooks" / "README.md"


def _rows(section: str) -> list:
    """The table rows of a README section (its title's text up to the next ## heading), as lists of cells."""
    text = README.read_text().split(f"## {section}\n")[1].split("\n## ")[0]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines()
            if ln.startswith("| ") and not ln.startswith("| week |") and not ln.startswith("| minutes |")
            and not ln.startswith("| chapter |")]


def _names(cell: str) -> list:
    return re.findall(r"`(\w+)`", cell)


def test_the_kit_is_written_from_the_table_of_points():
    assert not schedule.stale(), "run python -m labkit.instructor.schedule --write"


@pytest.mark.parametrize("section,weeks", [("A twelve-week course", 12), ("A four-week module", 4)])
def test_each_schedule_covers_every_chapter_once_and_grades_what_the_table_grades(section, weeks):
    rows = _rows(section)
    assert [r[0] for r in rows] == [str(w) for w in range(1, weeks + 1)]
    seen = []
    for week, chapters, graded, practice, _ in rows:
        numbers = re.findall(r"\[(\d\d) ", chapters)
        seen += numbers
        points = [(n, grading.POINTS[n]) for c in numbers for n in grading.CHAPTERS[c]]
        assert _names(graded) == [n for n, p in points if p == grading.GRADE]
        assert _names(practice) == [n for n, p in points if p != grading.GRADE]
    assert seen == sorted(grading.CHAPTERS)


def test_the_graded_table_says_what_the_points_say():
    rows = {r[0]: r for r in _rows("Which exercises to grade")}
    assert sorted(rows) == sorted(grading.CHAPTERS)
    for chapter, (_, graded, practice) in rows.items():
        assert _names(graded) == schedule.graded(chapter) and _names(practice) == schedule.practice(chapter)


def test_the_90_minute_lab_grades_only_exercises_the_table_grades():
    for _, what, notes in _rows("A 90-minute lab"):
        chapters = set(re.findall(r"\((\d\d)_\w+\.ipynb\)", what))
        named = _names(notes.split("grade", 1)[1]) if "grade" in notes else []
        assert all(any(n in schedule.graded(c) for c in chapters) for n in named), (what, named)


def test_a_changed_weight_makes_the_kit_stale_until_written(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        shutil.copy(p, tmp_path / "notebooks" / p.name)
    shutil.copy(README, tmp_path / "notebooks" / "README.md")
    assert not schedule.stale(tmp_path)
    monkeypatch.setitem(grading.CHAPTERS, "09", {**grading.CHAPTERS["09"], "smallest_fix": grading.GRADE})
    monkeypatch.setitem(grading.POINTS, "smallest_fix", grading.GRADE)
    assert schedule.stale(tmp_path)
    assert schedule.write(tmp_path) and not schedule.stale(tmp_path)
    text = (tmp_path / "notebooks" / "README.md").read_text()
    week4 = next(ln for ln in text.splitlines() if ln.startswith("| 4 | [09 "))
    assert "`smallest_fix`" in week4.split("|")[3]  # now graded in the week that has chapter 09


def test_missing_markers_are_refused_naming_them(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "README.md").write_text("# no markers\n")
    with pytest.raises(ValueError, match="grade-table"):
        schedule.expected(tmp_path)
