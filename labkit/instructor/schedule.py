"""The instructor kit's schedules and its table of graded exercises, written from the one table of
points.

    python -m labkit.instructor.schedule            # says whether notebooks/README.md is in step
    python -m labkit.instructor.schedule --write    # writes the blocks between its markers

notebooks/README.md's "Which exercises to grade" table, twelve-week course and four-week module are
written from ``grading.CHAPTERS``, so that a week's graded list can never disagree with the table
(issue 49). What that table does not hold -- which chapters go in which week, what happens in class
-- is said once, in templates/schedule.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..base import paths
from ..content import pages
from . import grading

__all__ = ["NOTES", "SHORT", "TWELVE_WEEKS", "FOUR_WEEKS", "graded", "practice", "blocks", "expected", "stale",
           "write"]

# The kit's words that the table of points does not hold: templates/schedule.md.
NOTES = pages.items("schedule.md", "notes")  # {exercise: how it is judged}, where the kit's reader needs to know
# (chapters, what happens in class): one chapter a week (00 with 01), then the same chapters in four weeks
TWELVE_WEEKS = [(k.split(), v) for k, v in pages.items("schedule.md", "twelve-weeks").items()]
FOUR_WEEKS = [(k.split(), v) for k, v in pages.items("schedule.md", "four-weeks").items()]
SHORT = pages.items("schedule.md", "short")  # each chapter's short name, as the kit's other tables call it

_WRITTEN = "written by python -m labkit.instructor.schedule --write"
MARKS = {key: (f"<!-- {key}: {_WRITTEN} -->", f"<!-- /{key} -->") for key in ("grade-table", "twelve-weeks", "four-weeks")}


def graded(chapter: str) -> list:
    """The exercises of ``chapter`` worth ``GRADE`` points, in the table's order."""
    return [n for n, p in grading.CHAPTERS[chapter].items() if p == grading.GRADE]


def practice(chapter: str) -> list:
    return [n for n, p in grading.CHAPTERS[chapter].items() if p != grading.GRADE]


def _names(names: list, notes: bool = True) -> str:
    return ", ".join(f"`{n}`" + (f" ({NOTES[n]})" if notes and n in NOTES else "") for n in names) or "—"


def _title(number: str) -> str:
    """``[03 Gradient accumulation](03_gradient_accumulation.ipynb)``: the chapter's short name, linked."""
    path = next((pages.source_root() / "notebooks").glob(f"{number}_*.ipynb"))
    return f"[{number} {SHORT[number]}]({path.name})"


def grade_table() -> str:
    rows = [pages.section("schedule.md", "grade-row").format(chapter=c, grade=_names(graded(c)),
                                                             practice=_names(practice(c))) for c in grading.CHAPTERS]
    return "\n".join([pages.section("schedule.md", "grade-table"), *rows])


def _weeks(plan: list) -> str:
    rows = []
    for week, (chapters, in_class) in enumerate(plan, start=1):
        names = ", ".join(_title(c) for c in chapters)
        rows.append(pages.section("schedule.md", "week-row").format(
            week=week, chapters=names, grade=_names([n for c in chapters for n in graded(c)], notes=False),
            practice=_names([n for c in chapters for n in practice(c)], notes=False), in_class=in_class))
    return "\n".join([pages.section("schedule.md", "weeks-table"), *rows])


def blocks() -> dict:
    return {"grade-table": grade_table(), "twelve-weeks": _weeks(TWELVE_WEEKS), "four-weeks": _weeks(FOUR_WEEKS)}


def _readme(root: Path | None) -> Path:
    return (root or pages.source_root()) / "notebooks" / "README.md"


def expected(root: Path | None = None) -> str:
    """notebooks/README.md with every block written from the tables; a ValueError names missing markers."""
    text = _readme(root).read_text()
    for key, block in blocks().items():
        start, end = MARKS[key]
        if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
            raise ValueError(f"notebooks/README.md has no markers {start} ... {end}: put them back where the "
                             f"{key} goes")
        head, rest = text.split(start)
        text = f"{head}{start}\n{block}\n{end}{rest.split(end, 1)[1]}"
    return text


def stale(root: Path | None = None) -> bool:
    """Whether notebooks/README.md differs from what ``write`` would make of it."""
    return expected(root) != _readme(root).read_text()


def write(root: Path | None = None) -> bool:
    """Write the blocks; returns whether the file changed."""
    if not stale(root):
        return False
    paths.write_atomic(_readme(root), expected(root).encode("utf-8"))
    return True


def main(argv) -> int:
    try:
        if "--write" in argv:
            print("wrote notebooks/README.md" if write() else "notebooks/README.md was in step")
            return 0
        late = stale()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("out of step: notebooks/README.md (python -m labkit.instructor.schedule --write)" if late else "in step")
    return 1 if late else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
