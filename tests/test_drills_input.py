"""Issue 45, items 11 and 12 (the gauntlet): lk.drills refuses bad input in one line before any work
(an empty pool used to loop forever, NaN seconds made a score card of invalid JSON), and a gauntlet
stopped by Ctrl-C keeps the card of the drills answered so far -- in the terminal and in the widget."""
from __future__ import annotations

import json
import signal

import pytest

from labkit import drills
from labkit.__main__ import main as cli
from labkit.base.runtime import ConfigError
from labkit.drills import attempt

CASE = drills.case_by_id("dropout-in-eval")


@pytest.fixture(autouse=True)
def _ci(monkeypatch):
    monkeypatch.setenv("LABKIT_MODE", "short")


def _refused(field, fn, *args, **kwargs):
    with pytest.raises(ConfigError) as e:
        fn(*args, **kwargs)
    assert e.value.field == field, str(e.value)
    assert "\n" not in str(e.value)


def _alarm(signum, frame):
    raise TimeoutError("still drawing after 10 s: an endless loop")


def test_an_empty_pool_is_refused_not_drawn_from_forever():
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(10)  # the old code never returned: fail, don't hang
    try:
        _refused("pool", drills.draw, 0, 3, pool=[])
        _refused("pool[0]", drills.draw, 0, 3, pool=["dropout-in-eval"])
        _refused("pool", drills.draw, 0, 3, pool=5)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert [c.id for c in drills.draw(1, 3, pool=[CASE])] == [CASE.id] * 3


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -5, "3", None, True])
def test_score_refuses_seconds_that_are_not_a_time(seconds):
    _refused("seconds", drills.score, CASE, CASE.cause, drills.fix_key(CASE), seconds)


@pytest.mark.parametrize("call, field", [
    (lambda: drills.score("dropout-in-eval", None, None, 3), "case"),
    (lambda: drills.score(CASE, 3, None, 3), "cause"),
    (lambda: drills.score(CASE, None, ["x"], 3), "fix"),
    (lambda: drills.score(CASE, None, None, 3, limit_s=float("nan")), "limit_s"),
    (lambda: drills.card(None), "rows"),
    (lambda: drills.card([{"case": 1}]), "rows[0]['case']"),
    (lambda: drills.card([{**drills.score(CASE, None, None, 3), "seconds": float("nan")}]), "rows[0]['seconds']"),
    (lambda: drills.card([], seed="x"), "seed"),
    (lambda: drills.card([], limit_s=-1), "limit_s"),
    (lambda: drills.record([]), "scorecard"),
    (lambda: drills.record({"drills": [None]}), "scorecard['drills'][0]"),
    (lambda: drills.record({"drills": [{**drills.score(CASE, None, None, 3), "case": "a b"}]}),
     "scorecard['drills'][0]['case']"),
    (lambda: drills.options("dropout-in-eval"), "case"),
    (lambda: drills.options(CASE, seed="x"), "seed"),
    (lambda: drills.fix_key(None), "case"),
    (lambda: drills.evidence_rows(None), "ev"),
    (lambda: drills.evidence_rows({"tokens_per_s": "fast", "step_time_s": 1.0}), "ev['tokens_per_s']"),
    (lambda: drills.evidence_rows({"losses": [3.0, 2.0]}), "ev['first_loss']"),
    (lambda: drills.evidence_rows({"eval_losses": "x"}), "ev['eval_losses']"),
    (lambda: drills.Attempt(seed="x"), "seed"),
    (lambda: drills.Attempt("dropout-in-eval", seed=-1), "seed"),
    (lambda: drills.Attempt("dropout-in-eval", clock=3), "clock"),
])
def test_bad_input_is_one_line_naming_the_field(call, field):
    _refused(field, call)



def test_evidence_rows_checks_the_keys_it_reads_and_no_other():
    ev = {"step_time_s": 1.0, "tokens_per_s": 100.0}
    rows = drills.evidence_rows(ev)
    for unread in ("autocast_weight_copy_bytes", "nonfinite_steps"):  # in a run's summary, on no row
        assert drills.evidence_rows({**ev, unread: "n/a"}) == rows

def test_record_refuses_a_bad_card_before_recording_any_row():
    import labkit as lk
    good = drills.score(CASE, None, None, 3)
    lk.check.reset_history()
    _refused("scorecard['drills'][1]['timed_out']", drills.record, {"drills": [good, {**good, "timed_out": "no"}]})
    assert lk.check.history() == []  # nothing half-recorded


def test_save_card_writes_strict_json_or_nothing(tmp_path):
    card = drills.card([drills.score(CASE, None, None, 3)], seed=1)
    card["totals"]["seconds"] = float("nan")
    _refused("scorecard['totals']['seconds']", drills.save_card, tmp_path / "c.json", card)
    assert not (tmp_path / "c.json").exists()
    card["totals"]["seconds"] = 3.0
    json.loads((tmp_path / "c.json").read_text() if drills.save_card(tmp_path / "c.json", card) else "",
               parse_constant=lambda c: pytest.fail(f"{c} in the card"))


# ---- Ctrl-C mid-gauntlet ---------------------------------------------------------------------------------

EVIDENCE = {"status": "completed", "step_time_s": 0.01, "tokens_per_s": 100.0, "losses": []}


def _fake_runs(monkeypatch, interrupt_at: int):
    """Attempt.run without the training runs: evidence at once; the ``interrupt_at``-th run is Ctrl-C."""
    calls = []

    def run(self, progress=None):
        calls.append(self.case.id)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        self.evidence, self.twin, self.run_s = dict(EVIDENCE), dict(EVIDENCE), 0.0
        self.timer.start()
        return self.evidence

    monkeypatch.setattr(attempt.Attempt, "run", run)
    monkeypatch.setattr(attempt.Attempt, "reveal", lambda self, progress=False: {"sentence": "revealed"})
    return calls


def _right_answer(c, seed):
    causes, fixes = drills.options(c, seed)
    return f"{causes.index(c.cause) + 1},{fixes.index(drills.fix_key(c)) + 1}"


def test_ctrl_c_mid_gauntlet_keeps_and_writes_the_answered_drills_card(tmp_path, monkeypatch, capfd):
    _fake_runs(monkeypatch, interrupt_at=3)
    cases = drills.gauntlet_draw(2, 4)
    answers = [_right_answer(c, 2) for c in cases]
    out = tmp_path / "card.json"
    code = cli(["drill", "--gauntlet", "--n", "4", "--seed", "2", "--timer", "0", "--out", str(out),
                *[a for x in answers for a in ("--answer", x)]])
    assert code == 130
    saved = json.loads(out.read_text())
    assert saved["stopped"] is True
    assert [r["case"] for r in saved["drills"]] == [c.id for c in cases[:2]]
    assert saved["totals"]["drills"] == 2 and saved["totals"]["both_right"] == 2
    assert "Score card" in capfd.readouterr().out


def test_terminal_main_returns_the_card_after_ctrl_c(monkeypatch):
    _fake_runs(monkeypatch, interrupt_at=2)
    c = drills.gauntlet_draw(0, 3)
    got = attempt.main(seed=0, timer=0, gauntlet=True, n=3, answers=[_right_answer(x, 0) for x in c],
                       out=lambda text: None)
    assert got["stopped"] is True and [r["case"] for r in got["drills"]] == [c[0].id]


def test_a_gauntlet_widget_stopped_by_ctrl_c_keeps_its_card(tmp_path, monkeypatch):
    _fake_runs(monkeypatch, interrupt_at=2)
    monkeypatch.setattr("labkit.drills.widget.evidence_figure", lambda ev: None)
    monkeypatch.setattr("labkit.drills.widget.plots.to_png", lambda fig: b"")
    g = drills.Gauntlet(seed=3, n=3, timer=None)
    d = g.drill
    d.start()
    d.answer(d.attempt.case.cause, drills.fix_key(d.attempt.case))
    d2 = g.next()
    with pytest.raises(KeyboardInterrupt):
        d2.start()
    assert not d2._start.disabled  # it can run again
    card = g.stop()
    assert card["stopped"] is True and [r["case"] for r in card["drills"]] == [g.cases[0].id]
    assert g.next() is None and "Score card" in g._card.value
    saved = json.loads(open(g.save(tmp_path / "g.json")).read())
    assert saved["stopped"] is True and saved["totals"]["both_right"] == 1


def test_a_share_signal_is_shown_as_a_percentage_whatever_its_number_type():
    import importlib

    import numpy as np
    evidence = importlib.import_module("labkit.drills.evidence")
    assert evidence.show("data_wait_frac", 0.25) == evidence.show("data_wait_frac", np.float32(0.25)) == "25 %"
