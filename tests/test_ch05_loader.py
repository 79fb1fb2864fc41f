"""labkit.chapters.ch05_loader: chapter 05's figures as data (no words) and the outcome each of the chapter's
sentences is chosen by -- pinned with planted numbers and fake runs (nothing trains)."""
import json
from pathlib import Path

import pytest

import labkit as lk
import labkit.chapters.course  # noqa: F401  (lk.course)
from labkit.base.runtime import ConfigError
from labkit.chapters import ch05_loader as ch05
from labkit.tools.compare import verdict

NB = Path(__file__).resolve().parent.parent / "notebooks" / "05_data_loader.ipynb"
FAST, SLOW = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98], [2.0, 2.02, 1.98, 2.0, 2.01, 1.99]


class _Run:
    def __init__(self, **summary):
        self.summary = summary


def _runs(step_s, wait_frac, mfu=0.01, n=3):
    return [_Run(step_time_s=step_s, data_wait_s=wait_frac * step_s, compute_s=(1 - wait_frac) * step_s,
                 data_wait_frac=wait_frac, tokens_per_s=1 / step_s, intra_op_threads=1, mfu=mfu) for _ in range(n)]


def cell(cid):
    nb = json.loads(NB.read_text(encoding="utf-8"))
    return "".join(next(c for c in nb["cells"] if c["id"] == cid)["source"])


def run_cell(cid, namespace, monkeypatch):
    """Execute one chapter cell; returns the outcomes its explain calls chose and what it displayed."""
    chosen, shown, real = [], [], lk.course.explain

    def spy(measured, **kw):
        chosen.append(real(measured, **kw))
        return chosen[-1]
    monkeypatch.setattr(lk.course, "explain", spy)
    exec(compile(cell(cid), cid, "exec"), {"lk": lk, "ch05": ch05, "display": shown.append, **namespace})
    return chosen, shown


# ---- #46 item 14: the cost per sample says when a limit changed the promised ratio --------------------------

@pytest.mark.parametrize("compute_ms,cost,clamp", [(17.3, 6.5, "as_asked"), (3.0, 5, "raised"), (91.3, 30, "capped"),
                                                   (12.0, 5, "raised"), (30.4, 11, "as_asked")])
def test_the_sample_cost_is_kept_within_its_limits_and_says_so(compute_ms, cost, clamp):
    c = ch05.sample_cost(compute_ms, 4, 1.5, 5, 30)
    assert (c["cost_ms"], c["clamp"]) == (cost, clamp)
    assert c["load_ms"] == pytest.approx(4 * cost) and c["ratio"] == pytest.approx(4 * cost / compute_ms)


def test_the_baseline_cell_says_when_a_limit_changed_the_cost(monkeypatch):
    # the learner's run: 91.3 ms of compute, 1.5x asked, 30 ms/sample cap -> 120 ms of loading, 1.31x
    cost = ch05.sample_cost(91.3, 4, 1.5, 5, 30)
    chosen, _ = run_cell("c03b", {"cost": cost, "free": _Run(intra_op_threads=1), "lab": None}, monkeypatch)
    assert chosen == ["capped"]


def test_one_ratio_is_stated_the_measured_one(monkeypatch):
    # the learner read "the capped cost reaches 1.2x" (one run, c03b) against "loading is 1.95x" (the interleaved
    # runs, c06ratio) as a contradiction: c03b now states the cost and its target, c06ratio the one measured ratio
    cost = ch05.sample_cost(200.0, 4, 1.5, 5, 60)  # capped: 75 ms wanted, 60 ms run (1.2x of that one run)
    chosen, _ = run_cell("c03b", {"cost": cost, "free": _Run(intra_op_threads=1), "lab": None}, monkeypatch)
    assert chosen == ["capped"] and "{ratio}" not in cell("c03b")
    cmp = verdict(FAST, SLOW, "step_time_s", label_a="free", label_b="costly")
    cmp.results_a, cmp.results_b = _runs(0.2, 0.0), _runs(0.59, 0.66)  # a batch loads in 389 ms: 1.95x
    chosen, _ = run_cell("c06ratio", {"cmp_starving": cmp, "cost": cost}, monkeypatch)
    free, costly = ch05.arm_rows(cmp)
    assert chosen == ["starves"] and costly["data_wait_ms"] / free["step_time_ms"] == pytest.approx(1.95, abs=0.01)


# ---- #46 item 14: the summary's line on one worker follows the oversubscription measurement ------------------

@pytest.mark.parametrize("one_worker,expected", [(SLOW, "slower"), (FAST, "faster")])
def test_the_summary_line_on_workers_follows_the_measurement(monkeypatch, one_worker, expected):
    none = FAST if one_worker is SLOW else SLOW
    over = verdict(none, one_worker, "step_time_s", label_a="0 workers", label_b="1 worker")
    chosen, _ = run_cell("c31b", {"over": over}, monkeypatch)
    assert chosen == [expected]


def test_the_summary_markdown_no_longer_states_a_direction_of_its_own():
    summary = cell("c31").split("## Summary", 1)[1]
    assert "slower" not in summary and "slow things down" not in summary


# ---- #46 item 20: MFU on a CPU -- what it is a share of, or not shown -------------------------------------------

@pytest.mark.parametrize("summary,basis", [
    (dict(mfu=0.74, peak_flops=2e11, peak_flops_source="measured: best of 2 short probes ... on this cpu"), "probe"),
    (dict(mfu=0.74, peak_flops=2e11, peak_flops_source="measured: ...; other programs were using the cores "
                                                         "meanwhile, so it reads low and is not cached"), "under_load"),
    (dict(mfu=0.31, peak_flops=9.89e14, peak_flops_source="NVIDIA H100 SXM datasheet"), "datasheet"),
    (dict(mfu=None, peak_flops=None, peak_flops_source=None), "none")])
def test_mfu_basis_names_the_peak_it_divides_by(summary, basis):
    assert ch05.mfu_basis(summary) == basis


def test_the_starving_cell_shows_mfu_only_beside_its_peak():
    src = cell("c06")
    assert "mfu_basis(" in src and 'if basis in ("datasheet", "probe")' in src


# ---- #46 item 19: a helper with nothing to show shows nothing ---------------------------------------------------

def test_no_reference_runs_means_no_output(monkeypatch):
    monkeypatch.setattr(ch05, "reference_points", lambda section=None: [])
    _, shown = run_cell("c14", {}, monkeypatch)
    assert ch05.reference_rows() == [] and shown == []


# ---- the tables' rows -------------------------------------------------------------------------------------------

def test_arm_rows_are_medians_of_each_arm():
    cmp = verdict([1.0] * 6, [2.0] * 6, "step_time_s", label_a="free", label_b="costly")
    cmp.results_a, cmp.results_b = _runs(1.0, 0.02, mfu=0.03), _runs(2.0, 0.5, mfu=0.015)
    free, costly = ch05.arm_rows(cmp)
    assert (costly["arm"], costly["step_time_ms"], costly["data_wait_ms"], costly["data_wait_frac"], costly["mfu"]) \
        == ("costly", 2000, 1000, 0.5, 0.015)
    assert free["mfu"] == 0.03 and free["runs"] == 3


def test_workers_outcome_flags_a_win_without_less_waiting():
    cmp = verdict(SLOW, FAST, "step_time_s")
    cmp.results_a, cmp.results_b = _runs(2.0, 0.5), _runs(1.0, 0.01)
    assert ch05.workers_outcome(cmp) == "faster"
    cmp.results_a, cmp.results_b = _runs(2.0, 0.1), _runs(1.0, 0.9)
    assert ch05.workers_outcome(cmp) == "odd"
    cmp = verdict(FAST, SLOW, "step_time_s")
    cmp.results_a, cmp.results_b = _runs(1.0, 0.5), _runs(2.0, 0.3)
    assert ch05.workers_outcome(cmp) == "slower"


def test_a_deeper_queue_that_won_without_waiting_less_is_odd():
    # the learner's run: prefetch 4 won by 267 ms an update (729 -> 462 ms) while the median wait fell 12 -> 6 ms
    cmp = verdict([0.729] * 4, [0.462] * 4, "step_time_s", label_a="prefetch_factor=1", label_b="prefetch_factor=4")
    cmp.results_a, cmp.results_b = _runs(0.729, 0.012 / 0.729), _runs(0.462, 0.006 / 0.462)
    assert lk.course.outcome(cmp) == "faster" and not ch05.waiting_explains(cmp)
    assert ch05.prefetch_outcome(cmp) == "odd" and ch05.workers_outcome(cmp) == "odd"
    assert "prefetch_outcome(cmp_prefetch)" in cell("c25") and "odd=" in cell("c25")  # the cell measures: not run
    # a win that is mostly waiting no longer done: 0 -> 1 worker, 792 -> 526 ms, wait 300 -> 7 ms
    won = verdict([0.792] * 4, [0.526] * 4, "step_time_s")
    won.results_a, won.results_b = _runs(0.792, 0.300 / 0.792), _runs(0.526, 0.007 / 0.526)
    assert ch05.waiting_explains(won)
    assert ch05.workers_outcome(won) == "faster" and ch05.prefetch_outcome(won) == "faster"


def test_sweep_startup_prefetch_and_memory_rows():
    s = lambda t, f: dict(step_time_s=t, data_wait_s=f * t, data_wait_frac=f, intra_op_threads=1)  # noqa: E731
    rows = ch05.sweep_rows({0: [s(1.0, 0.5), s(3.0, 0.5), s(2.0, 0.4)], 2: [s(0.5, 0.01)]})
    assert (rows[0]["step_time_s"], rows[0]["data_wait_frac"], rows[0]["runs"]) == (2.0, 0.5, 3)
    with pytest.raises(ConfigError, match="by_workers"):
        ch05.sweep_rows({0: []})
    cmp = verdict([0.2] * 6, [0.01] * 6, "step_time_s")
    cmp.first_epochs = {False: [0.3] * 6, True: [0.3] * 6}
    off, on = ch05.startup_rows(cmp)
    assert (off["later_epoch_ms"], on["later_epoch_ms"], on["first_epoch_ms"], on["tries"]) == (200, 10, 300, 6)
    pre = verdict([1.0] * 6, [1.0] * 6, "step_time_s", label_a="prefetch_factor=1", label_b="prefetch_factor=4")
    pre.results_a, pre.results_b = _runs(1.0, 0.1), _runs(1.0, 0.05)
    one, four = ch05.prefetch_rows(pre, 2, (1, 4), 4096)
    assert (one["in_flight"], one["in_flight_kib"], four["in_flight"], four["in_flight_kib"]) == (2, 8, 8, 32)
    mib = 2**20
    mem = {None: {"main": {"rss": 500 * mib}, "start_method": "fork",
                  "workers": [{"rss": 400 * mib, "uss": 20 * mib, "pss": None}]},
           "spawn": {"main": {"rss": 500 * mib}, "start_method": "spawn",
                     "workers": [{"rss": 300 * mib, "uss": 250 * mib, "pss": 260 * mib}]}}
    main, fork, spawn = ch05.memory_rows(mem)
    assert main["rss"] == 500 and (fork["uss"], fork["pss"]) == (20, None) and (spawn["uss"], spawn["pss"]) == (250, 260)


def test_chapter_05_calls_no_note_builders():
    src = NB.read_text(encoding="utf-8")
    assert "loadernotes" not in src and "loaderlab.conclude(" not in src and "workers_verdict(" not in src
