"""No exercise of chapters 00 and 01 is answered above itself (#46 items 4 and 15): an exercise comes before
the cell that reveals its answer, or asks something no cell above it states. Each exercise lists the
give-aways that would answer it -- a formula, a table row, a printed ratio -- and no markdown or code cell
above the exercise may hold one."""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

GIVE_AWAYS = {
    ("00_start_here", "exercise-00-state-bytes"): [
        r"param_bytes\s*=\s*4\s*\*\s*n", r"optimizer_bytes\s*=\s*8\s*\*\s*n",  # formula()'s answer
        r"\|\s*4\s*\|",  # the memory table's bytes-per-number column
        r"AdamW: 2N"],
    ("00_start_here", "exercise-00-bytes-per-param"): [
        r"2\s*\+\s*2\s*\+\s*4", r"4\s*\+\s*4\s*\+\s*8", r"\(2 bytes\)", r"\(4 \+ 4\)", r"16\s+bytes per parameter",
        r"bytes_per_param\s*=\s*16", r"measured_bpp"],
    ("00_start_here", "exercise-00-llm-memory"): [r"13e9", r'"13 B"', r"208 GB"],
    ("01_measure_first", "exercise-01-linear-flops"): [
        r"3× forward", r"three forward passes", r"2·T·d_in·d_out", r"2·tokens·d_in·d_out",
        r"6·T·d_in", r"two products of the same size", r"fwd_bwd / fwd"],
    ("01_measure_first", "exercise-01-mfu"): [r"0\.23\d", r"23\.\d\s*%"],
}


def cells(name):
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]


def above(name, tag):
    cs = cells(name)
    i = next(i for i, c in enumerate(cs) if tag in c.get("metadata", {}).get("tags", []))
    return [(c.get("id"), "".join(c["source"])) for c in cs[:i]]


@pytest.mark.parametrize("name, tag", sorted(GIVE_AWAYS))
def test_no_cell_above_an_exercise_gives_its_answer_away(name, tag):
    found = [(cid, p) for cid, src in above(name, tag) for p in GIVE_AWAYS[(name, tag)] if re.search(p, src)]
    assert not found, f"{name} {tag}: answered above it in (cell id, give-away): {found}"


def test_the_cells_that_reveal_the_answers_still_come_after_their_exercises():
    # the revealing cells exist: moving them below the exercise keeps what they teach
    def index(name, key):
        return next(i for i, c in enumerate(cells(name))
                    if key == c.get("id") or key in c.get("metadata", {}).get("tags", []))

    assert index("00_start_here", "exercise-00-state-bytes") < index("00_start_here", "00-13t")
    assert index("00_start_here", "exercise-00-state-bytes") < index("00_start_here", "measure-00-memory-breakdown")
    assert index("00_start_here", "exercise-00-llm-memory") < index("00_start_here", "measure-00-llm-scale")
    assert index("01_measure_first", "exercise-01-linear-flops") < index("01_measure_first", "measure-01-linear-flops")
