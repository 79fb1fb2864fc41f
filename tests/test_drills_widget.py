"""The drill widget's charts and lines: every chart shown at its own pixel size and no wider than a
JupyterLab column (a PNG stretched to the column was upscaled and blurred), the hang drill's curves drawn
from what it has (no empty axes), the reveal's progress line, and no glyph that needs an emoji font.

No timing assertion: the reveal runs a short comparison (its verdict is not checked), and the progress line
is checked by being drawn, not by when.
"""
from __future__ import annotations

import re
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
    # the comparison's runs told the drill's progress line (base.frontend's bar) as they went
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


# ---- the widget's own words come from the drills' page (issue #51) -------------------------------------------

def _every_row_evidence():
    """Evidence with every instrument evidence_rows reads (the values do not matter, only the words)."""
    recs = [{"update": u, "loss": 5.3 - 0.1 * u, "grad_norm": 3.0, "grad_scale": 2.0 ** 16, "skipped": u == 2,
             "step_time_s": 0.1, "data_wait_s": 0.01, "compute_s": 0.08, "optimizer_s": 0.01} for u in (1, 2, 3)]
    return {"status": "out of memory", "step_time_s": 0.1, "data_wait_s": 0.01, "compute_s": 0.08,
            "optimizer_s": 0.01, "data_wait_frac": 0.1, "tokens_per_s": 1000.0, "samples_per_s": 8.0, "mfu": 0.2,
            "hfu": 0.25, "allreduce_calls_per_update": 1, "allreduce_bytes_per_update": 2 ** 20,
            "param_bytes": 2 ** 22, "grad_bytes": 2 ** 22, "optimizer_bytes": 2 ** 23, "activation_bytes": 2 ** 21,
            "peak_mem_bytes": 2 ** 24, "oom_at_update": 2, "peak_mem_by_update": [2 ** 24], "matmul_dtype": "float32",
            "logged_lr": 3e-4, "samples_per_update": 32, "losses": [5.2, 5.1, 5.0], "first_loss": 5.2,
            "final_loss": 5.0, "loss_drop": 0.2, "grad_norm": 3.0, "clip_frac": 0.0, "grad_scale": 2.0 ** 16,
            "skipped_steps": 1, "grad_zero_frac": 0.3, "eval_losses": [5.0, 5.1, 5.2], "collectives_per_rank": [4, 3],
            "param_norms_per_rank": [[18.8, 18.9], [18.8, 18.95]], "ranks_diverge_at_update": 2, "timed_out": True,
            "hang_error": "timeout", "expert_shares": [0.9, 0.1], "max_expert_share": 0.9,
            "tp_collectives": {"all_gather": 2, "reduce_scatter": 2, "all_reduce": 0}, "records": recs}


def test_the_english_widget_says_what_it_said_before_the_page_held_its_words():
    """The page's English is the widget's old literal English: buttons, headers, rows, units, chart words."""
    from labkit.drills.evidence import evidence_rows
    d = drills.Drill("loader-no-workers", timer=180)
    assert [d._start.description, d._answer.description, d._reveal.description] == ["Start", "Answer", "Reveal"]
    assert d.widget.children[0].value.startswith("<b>Drill</b> &middot; ")
    d.attempt.evidence = {}
    d.attempt.timer.start()
    d.tick()
    assert re.search(r"\d:\d\d left</span>$", d._clock.value), d._clock.value
    assert drills.NO_FIX == "nothing to fix" and ("nothing to fix", "nothing to fix") in d._fix.options
    rows = dict(evidence_rows(_every_row_evidence()))
    assert rows["run"] == "out of memory" and rows["step time"].startswith("100 ms an update")
    assert "parameters 4.00 MiB" in rows["memory"] and "rank 1: 3" in rows["collectives"]
    assert list(rows)[:4] == ["run", "step time", "data wait", "throughput"] and "skipped updates" in rows
    fig = evidence_figure(_every_row_evidence())
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[:2] == ["Step time (ms), per update", "Loss and grad scale, per update"], titles
    assert {"data wait", "compute", "optimizer", "grad scale (right)"} <= {t.get_text() for ax in fig.axes
                                                                            for t in ax.texts}
    g = drills.Gauntlet(seed=0, n=2, timer=None)
    assert g._next.description == "Next drill" and g.widget.children[0].value.startswith("<b>Gauntlet</b> &middot; ")


RUSSIAN_WIDGET = r"""
import re, warnings
warnings.simplefilter("error")  # an English fallback warns: here it fails
from labkit import drills
from labkit.drills import widget as w
from labkit.drills.attempt import card, card_words, row_words, score
from labkit.drills.evidence import evidence_rows, show
from labkit.tools import compare, plots
from test_drills_widget import _every_row_evidence
w.prestart = lambda: None  # a DDP case's process server is not needed to read its words
said = []
d = drills.Drill("loader-no-workers", timer=180)
d.attempt.evidence = {}
d.attempt.timer.start()
d.tick()
said += [d._start.description, d._answer.description, d._reveal.description, d._clock.value, d._status.value]
said += [t for t, _ in d._fix.options if t] + [h.value for h in d._choices.children[0:3:2]]
said.append(d.widget.children[0].value)
rows = evidence_rows(_every_row_evidence())
said += [k for k, _ in rows] + [v for _, v in rows]
fig = w.evidence_figure(_every_row_evidence())
said += [t.get_text() for ax in fig.axes for t in [ax.title, ax.xaxis.label, *ax.texts]]
said += [ln.get_label() for ln in fig.axes[-1].get_lines() if not ln.get_label().startswith("_")]
# the names, buttons and chart words: no English word at all but the names practitioners say in English
names = [d._start.description, d._answer.description, d._reveal.description,
         re.sub(r"<[^>]+>|&\w+;", "", d._clock.value)]
names += [k for k, _ in rows] + [t.get_text() for ax in fig.axes for t in [ax.title, ax.xaxis.label, *ax.texts]]
for s in names:
    assert set(re.findall(r"[A-Za-z]+", s)) <= {"MFU", "HFU", "AllReduce", "x", "NaN", "inf"}, s
for a, b, busy in (([100, 101, 99, 100, 102], [180, 185, 184, 183, 186], True), ([100, 101], [150, 152], False)):
    cmp = compare.verdict(a, b, "tokens_per_s", busy=busy, label_a=w.say("label-case"),
                          label_b=w.say("label-right-fix"), load={"other_cores": 1.2})
    ax = plots.comparison(cmp).axes[0]  # the reveal's chart
    said += [ax.get_title(), ax.get_ylabel(), cmp.sentence]
said += [show("grad_norm", None), show("timed_out", True), show("timed_out", False)]
healthy = drills.case_by_id("bf16-with-scaler")
rows = [score(healthy, drills.HEALTHY, drills.NO_FIX, 10, 180), score(healthy, None, None, 180, 180)]
said += [row_words(r) for r in rows] + [card_words(card(rows, seed=0, limit_s=180, device="cpu"))]
g = drills.Gauntlet(seed=0, n=2, timer=None)
said += [g._next.description, g.widget.children[0].value, g.drill.widget.children[0].value]
for s in said:
    plain = re.sub(r"<[^>]+>|&\w+;|\S*[/_=.(]\S*", " ", s)
    run = re.search(r"\b[A-Za-z]+(?:[ ,:;]+[A-Za-z]+){2,}\b", plain)
    assert run is None, (run.group(0), s)
print(d._start.description, d._answer.description, d._reveal.description, g._next.description, sep="|")
print(drills.NO_FIX)
"""


def test_a_russian_learner_gets_the_widget_in_russian():
    """LABKIT_LANG=ru before labkit.drills is imported: the buttons, headers, clock, evidence rows and their units,
    the charts' words, the reveal's chart and the fix menu say no three English words in a row, and nothing
    falls back to English with a warning."""
    import os
    import subprocess
    out = subprocess.run([sys.executable, "-c", RUSSIAN_WIDGET], capture_output=True, text=True, cwd=ROOT,
                         timeout=300, env={**os.environ, "LABKIT_LANG": "ru", "LABKIT_MODE": "short",
                                           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["Пуск|Ответить|Разбор|Следующий тренажёр", "исправлять нечего"]
