"""Chapter 11 as a learner reads it (issues 46 and 47): an exercise comes before the cell that reveals its
answer, the words are the chapter's (no notes module, sentences chosen with lk.course.explain), no prose block
over 8 lines, and no version remark that is not the running range."""
import json
import re
from pathlib import Path

import pytest

from labkit.chapters import ch11_longrun as lr

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / "notebooks" / "11_long_runs_and_failures.ipynb"
MAX_PARAGRAPH_LINES = 8


@pytest.fixture(scope="module")
def cells():
    return json.loads(NB.read_text(encoding="utf-8"))["cells"]


def _src(c) -> str:
    return "".join(c["source"])


def _index(cells, pred, what) -> int:
    found = [i for i, c in enumerate(cells) if pred(c)]
    assert found, f"no cell {what}"
    return found[0]


def _tagged(tag):
    return lambda c: tag in c.get("metadata", {}).get("tags", [])


def test_the_log_matching_exercise_comes_before_the_ablation_that_shows_each_signature(cells):
    exercise = _index(cells, _tagged("exercise-11-inexact-resume"), "tagged exercise-11-inexact-resume")
    logs = _index(cells, lambda c: "RESUME_LOGS" in _src(c), "printing the logs")
    ablation = _index(cells, _tagged("measure-11-ablation"), "tagged measure-11-ablation")
    reveals = _index(cells, lambda c: "ablation_rows" in _src(c) or "ablation_chart" in _src(c), "drawing it")
    assert logs < exercise < ablation <= reveals
    # the mechanisms, written in markdown, come after it too (the loss scale, "sign-like", "warm-up")
    told = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and i < exercise
            and re.search(r"warm-up restarts|sign of each gradient|subnormal|replayed first", _src(c))]
    assert not told, f"cells {told} describe a missing item's signature above the matching exercise"


def test_my_interval_comes_before_young_s_formula_is_stated_shown_or_computed(cells):
    exercise = _index(cells, _tagged("exercise-11-young-daly"), "tagged exercise-11-young-daly")
    shown = _index(cells, _tagged("code-11-young-daly"), "tagged code-11-young-daly")
    computed = _index(cells, lambda c: c["cell_type"] == "code" and "spikes.young_daly(" in _src(c),
                      "computing Young's interval")
    assert exercise < shown and exercise < computed
    above = "\n".join(_src(c) for c in cells[:exercise])
    assert not re.search(r"sqrt\(2|√\(2|2\s*C\s*M|2·C·M", above), "Young's formula is written above the exercise"


def test_no_notes_module_and_every_sentence_is_the_chapter_s(cells):
    assert not [m for m in lr._MODULES if "notes" in m]
    code = "\n".join(_src(c) for c in cells if c["cell_type"] == "code")
    assert not re.search(r"\bnotes\w*\.", code), "a cell still calls a notes module"
    assert code.count("lk.course.explain(") >= 10 and code.count("lk.course.table(") >= 10


def test_no_version_remark_outside_the_range_the_course_runs_on(cells):
    texts = [_src(c) for c in cells] + [p.read_text(encoding="utf-8")
                                         for p in (ROOT / "labkit" / "chapters" / "ch11_longrun").glob("*.py")]
    stale = [m.group(0) for t in texts for m in re.finditer(r"torch 2\.(\d+)(\.\d+)?", t)
             if not (9 <= int(m.group(1)) <= 14)]
    assert not stale, stale
    assert any("torch 2.9.1 to 2.14.1" in t for t in texts)  # the DCP pickle and TCPStore remarks say the range


def test_no_prose_block_over_eight_lines(cells):
    """A paragraph of a markdown cell (tables, lists, code blocks, headings and the interview answers'
    <details> aside) is at most 8 source lines."""
    long = []
    for i, c in enumerate(cells):
        if c["cell_type"] != "markdown":
            continue
        for block in re.split(r"\n\s*\n", _src(c)):
            lines = [ln for ln in block.splitlines() if ln.strip()]
            if not lines or re.match(r"\s*(\||[-*] |#|```|<|\d+\. )", lines[0]):
                continue
            if len(lines) > MAX_PARAGRAPH_LINES:
                long.append((i, c["id"], len(lines)))
    assert not long, f"paragraphs (cell index, id, lines) over {MAX_PARAGRAPH_LINES} lines: {long}"
