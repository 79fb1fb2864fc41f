"""The drill widget's charts and lines: every chart shown at its own pixel size and no wider than a
JupyterLab column (a PNG stretched to the column was upscaled and blurred), the hang drill's curves drawn
from what it has (no empty axes), the reveal's progress line, and no glyph that needs an emoji font.

No timing assertion: the reveal runs a short comparison (its verdict is not checked), and the progress line
is checked by being drawn, not by when.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

import labkit as lk
from labkit import drills
from labkit.drills.widget import CHART_MAX_PX, evidence_figure, no_curves

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _ci(monkeypatch):
    monkeypatch.setenv("LABKIT_MODE", "short")


def png_size(data: bytes) -> tuple:
    """(width, height) in pixels from a PNG's header."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def assert_shown_at_own_size(image):
    w, h = png_size(image.value)
    assert image.layout.width == f"{w}px" and image.layout.max_width == "100%", image.layout
    assert w <= CHART_MAX_PX, w  # a JupyterLab column at 1366 x 768 holds it unscaled


def test_the_evidence_and_reveal_charts_are_shown_at_their_own_size(monkeypatch):
    monkeypatch.setattr(sys.modules["labkit.drills.evidence"], "budget",
                        lambda: {"budget_s": 3.0, "min_repeats": 2, "warmup_runs": 0})
    d = drills.Drill("loader-no-workers", seed=0, timer=None)
    d.start()
    assert_shown_at_own_size(d._chart)
    d.answer(d.attempt.case.cause, "workers=1")
    status = []
    d._status.observe(lambda change: status.append(change["new"]), "value")
    out = d.reveal()
    assert out["comparison"] is not None
    assert_shown_at_own_size(d._cmp_chart)
    # the comparison's runs told the drill's progress line (base.progress's bar) as they went
    assert any("reveal [" in s and "runs" in s for s in status), status


def _hang_evidence(records=3):
    norms = [[18.8470, 18.8476, 18.8490][:records], [18.8470, 18.8471, 18.8480, 18.8496][:records + 1]]
    recs = [{"update": u, "loss": 5.3 - 0.01 * u, "grad_norm": 3.0} for u in range(1, records + 1)]
    return {"records": recs, "losses": [r["loss"] for r in recs], "timed_out": True, "param_norms_per_rank": norms,
            "collectives_per_rank": [records + 1, records]}


def test_the_hang_drill_draws_the_ranks_parameters_and_never_empty_axes():
    fig = evidence_figure(_hang_evidence())
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 3 and titles[-1].startswith("Parameter norm")
    for ax in fig.axes:
        if ax.get_title():
            assert any(len(line.get_xdata()) > 0 for line in ax.get_lines()), ax.get_title()
    rank1 = [ln for ln in fig.axes[-1].get_lines() if ln.get_label() == "rank 1"][0]
    assert list(rank1.get_ydata()) == pytest.approx([0.0, 18.8471 - 18.8476, 18.8480 - 18.8490])
    assert round(fig.get_figwidth() * fig.dpi) <= CHART_MAX_PX
    # a hang before any update completed: no chart, one line that says why
    ev = _hang_evidence(records=0)
    assert evidence_figure(ev) is None and no_curves(ev) and "\n" not in no_curves(ev)


def test_no_glyph_that_needs_an_emoji_font():
    """⏳ (and its like) shows as a box where no emoji font is installed."""
    needs_emoji = ("⏳", "⌛", "⏱", "⏰", "✅", "❌")  # Chromium without an emoji font showed ✅/❌ as boxes too
    for path in [ROOT / "labkit" / "check" / "_core.py", *sorted((ROOT / "labkit" / "drills").glob("*.py")),
                 ROOT / "notebooks" / "interview_drills.md"]:  # the drills' words
        text = path.read_text(encoding="utf-8")
        assert not any(g in text for g in needs_emoji), path
    for passed, attempted in ((True, True), (False, True), (False, False)):
        res = lk.check._core.CheckResult("x", passed, "the hint", attempted=attempted)
        assert not any(g in res._repr_markdown_() + repr(res) for g in needs_emoji)
        # labkit grade reads a check's hint back from what the cell showed: both forms, every outcome
        from labkit.instructor._gradeone import SHOWN
        for shown in (res._repr_markdown_(), repr(res)):
            m = SHOWN.match(shown)
            assert m and "x" in m.groups() and any(g and g.endswith("the hint") for g in m.groups()), shown


def test_a_drill_this_machine_cannot_show_says_so_before_it_runs(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    d = drills.Drill("micro-batch-1", timer=None)
    assert d.attempt.cannot_show_here() == drills.case_by_id("micro-batch-1").needs_gpu
    assert "labkit-drill-gpu" in d._status.value
    ok = drills.Drill("loader-no-workers", timer=None)
    assert ok.attempt.cannot_show_here() == "" and "labkit-drill-gpu" not in ok._status.value
