"""Chapter 02's sentences follow what its demos did: the GradScaler demo says S grew only when it did."""
import math

from labkit.chapters import precisionnotes as pn


def steps(*scales, skipped=()):
    return [dict(scale=s, skipped=i + 1 in skipped, loss=5.0 - i) for i, s in enumerate(scales)]


def test_the_scaler_note_says_whether_the_scale_grew_again():
    grew = pn.scaler_note(steps(2.0**20, 2.0**19, 2.0**19, 2.0**20, skipped=(1,)), steps(1, 1, 1, 1), 2)
    assert "1 of 4 steps were skipped while S came down from 1,048,576 to 524,288" in grew
    assert "after 2 good steps in a row S doubled again, at step 4" in grew
    flat = pn.scaler_note(steps(2.0**20, 2.0**19, 2.0**19, skipped=(1,)), steps(1, 1, 1), 6)
    assert "S never grew again" in flat and "doubled" not in flat


def test_the_bf16_scaler_note_counts_the_steps():
    with_scaler = [dict(loss=1.0, skipped=i == 4, scale=1.0, finite=True) for i in range(1, 9)]
    without = [dict(loss=1.0 if i < 4 else math.nan, finite=i < 4) for i in range(1, 9)]
    note = pn.bf16_scaler_note(with_scaler, without, bad_step=4)
    assert "steps skipped [4] (0 of the 7 normal ones)" in note and "weights are NaN" in note
    assert "4 of the 4 later losses read nan" in note
    assert pn.bf16_scaler_table(with_scaler, without)._repr_markdown_().count("\n") == 9
