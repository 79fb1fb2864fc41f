"""Chapters 03 and 04 word their readings in the cells (#47): every verdict key an instrument can return has
its sentence there, and every figure a sentence quotes is in the reading. The cells run here on chosen
readings; what they say is collected. Trains nothing."""
import json
import unittest.mock as mock
from pathlib import Path

import pytest

import labkit as lk
import labkit.chapters.course  # noqa: F401
from labkit.base import page
from labkit.chapters import ch03_accumulation as acc, ch04_checkpointing as memtrace, ch08_memory as memlab

NB = Path(__file__).resolve().parent.parent / "notebooks"
MIB = 2**20


def cell(notebook, cid):
    cells = json.loads((NB / notebook).read_text(encoding="utf-8"))["cells"]
    return next("".join(c["source"]) for c in cells if c.get("id") == cid)


def said_by(notebook, ids, ns):
    said = []
    with mock.patch.object(page, "say", said.append), mock.patch.object(lk.course, "say", said.append):
        for cid in ids:
            exec(cell(notebook, cid), {"lk": lk, "ch03": acc, "ch04": memtrace, "ch08": memlab,
                                       "display": said.append, **ns})
    return said


def _peaks(p1, p2, phases, p4=None):
    by_k = {1: {"peak": p1, "grads": 10 * MIB, "phase": phases[0], "source": "counted"},
            2: {"peak": p2, "grads": 10 * MIB, "phase": phases[1], "source": "counted"}}
    if p4 is not None:
        by_k[4] = {"peak": p4, "grads": 10 * MIB, "phase": phases[1], "source": "counted"}
    return by_k


STEP, FB = "optimizer step", "forward and backward"


@pytest.mark.parametrize("by_k, keys", [
    (_peaks(100 * MIB, 100 * MIB, (STEP, STEP), 100 * MIB), ("rose", "unchanged", "step_both")),
    (_peaks(100 * MIB, 103 * MIB, (STEP, FB), 103 * MIB + 2**16), ("rose", "flat", "step_then_pass")),
    (_peaks(100 * MIB, 100 * MIB, (STEP, FB)), ("rose", "none", "step_then_level")),
    (_peaks(100 * MIB, 97 * MIB, (FB, STEP), 120 * MIB), ("fell", "moved", "pass_then_step")),
    (_peaks(100 * MIB, 110 * MIB, (FB, FB), 110 * MIB), ("rose", "unchanged", "pass_full")),
    (_peaks(100 * MIB, 103 * MIB, (FB, FB), 103 * MIB), ("rose", "unchanged", "pass_partial")),
    (_peaks(100 * MIB, 100 * MIB, (FB, FB), 100 * MIB), ("rose", "unchanged", "pass_none")),
])
def test_chapter_03_words_every_case_of_the_peak_against_k(by_k, keys):
    reading = acc.accumulation_reading(by_k)
    assert (reading["head"], reading["later"], reading["why"]) == keys
    said = said_by("03_gradient_accumulation.ipynb", ("03-12v", "03-12w"), {"reading": reading})
    assert len(said) == 3 and not any("{" in s for s in said), said
    assert f"{reading['rise_mib']:g} MiB" in said[0]


def test_chapter_03_shows_the_unequal_means_as_figures():
    said = said_by("03_gradient_accumulation.ipynb", ("03-08t",), dict(
        counts=[32, 8], true_mean=5.5, mean_of_means=5.25, weighted=5.5))
    table = said[0]._repr_markdown_()
    assert "| 32, 8 | 5.5000 | 5.2500 | 0.25 | 5.5000 |" in table, table


@pytest.mark.parametrize("outcome, verdict", [
    ({}, "skipped"), ({"none": "fits", "full": "fits"}, "all_fit"),
    ({"none": "out of memory", "full": "fits"}, "recovered"), ({"full": "fits", "none": "out of memory"}, "none_after"),
])
def test_chapter_04_words_every_out_of_memory_outcome(outcome, verdict):
    oom = memtrace.oom_reading(outcome)
    assert oom["verdict"] == verdict
    said = said_by("04_activation_checkpointing.ipynb", ("c28v",), {"oom": oom})
    assert len(said) == 1 and "{" not in said[0] and "None" not in said[0], said


@pytest.mark.parametrize("selective", [60.0, 20.0, 10.0])
def test_chapter_04_words_the_attention_sweep_from_its_figures(selective):
    T = [64, 128]
    kept = {}
    for t in T:
        kept.update({("math", "none", t): 100.0 * t, ("math", "attention", t): 40.0 * t,
                     ("math", "selective", t): (selective if t == T[0] or selective == 10.0 else 60.0) * t,
                     ("auto", "none", t): 50.0 * t, ("auto", "attention", t): 49.0 * t})
    sweep = memtrace.attention_sweep_figures(kept, T, {"attention": 0.03, "full": 0.3})
    said = said_by("04_activation_checkpointing.ipynb", ("attn1c",), {"sweep": sweep})
    assert len(said) == 2 and not any("{" in s for s in said), said
    assert "**3 %**" in said[0] and "**30 %**" in said[0]
    # the cell before it counts the recompute itself (at the longest T) and says what each backend keeps
    from labkit.engine.measure import count_flops
    said = said_by("04_activation_checkpointing.ipynb", ("attn1b",), dict(
        kept=kept, seq_lens=T, probe=lk.Config(model="tiny", micro_batch=1), count_flops=count_flops))
    assert len(said) == 2 and not any("{" in s for s in said), said
    assert "**40 %** of the bytes none keeps at T = 64" in said[0] and "**98 %**" in said[1], said
    assert sweep["less"] == {60.0: "attention", 20.0: "split", 10.0: "sac"}[selective]


def test_chapter_04_shows_the_counted_figures_of_none_against_full():
    class Cmp:
        exact = {"activation_bytes": (8 * MIB, 2 * MIB), "hardware_flops_per_step": (100, 130),
                 "model_flops_per_step": (100, 100)}
    counted = memtrace.counted_figures(Cmp())
    table = lk.course.table([counted], [("none_mib", "none", "{:.1f}"), ("kept_pct", "kept", "{:.0f} %"),
                                        ("flops_ratio", "ratio", "{:.2f}×")])._repr_markdown_()
    assert "| 8.0 | 25 % | 1.30× |" in table
    assert "ch04.counted_figures(cmp)" in cell("04_activation_checkpointing.ipynb", "c17b")
