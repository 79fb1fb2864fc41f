"""labkit.chapters.loadernotes: chapter 05's measured results as Notes, every figure from the runs passed in
(fake runs here: nothing trains)."""
import pytest

import labkit as lk
import labkit.chapters.course  # noqa: F401  (lk.course)
from labkit.chapters import loadernotes as ln
from labkit.tools.compare import verdict


class _Run:
    def __init__(self, **summary):
        self.summary = summary


def _runs(step_s, wait_frac, mfu=0.01, n=3):
    return [_Run(step_time_s=step_s, data_wait_s=wait_frac * step_s, compute_s=(1 - wait_frac) * step_s,
                 data_wait_frac=wait_frac, tokens_per_s=1 / step_s, intra_op_threads=1, mfu=mfu) for _ in range(n)]


@pytest.mark.parametrize("compute_ms,expected", [(17.3, 6.5), (3.0, 5), (100.0, 30), (12.0, 5), (30.4, 11)])
def test_the_sample_cost_is_clamped_and_rounded_to_two_digits(compute_ms, expected):
    assert ln.sample_cost_ms(compute_ms, 4, 1.5, 5, 30) == expected


def test_the_starving_note_reads_both_arms():
    cmp = verdict([1.0] * 6, [2.0] * 6, "step_time_s", label_a="free", label_b="costly")
    cmp.results_a, cmp.results_b = _runs(1.0, 0.02, mfu=0.03), _runs(2.0, 0.5, mfu=0.015)
    note = ln.starving_note(cmp)
    assert "waiting **50%** (1000 ms of a 2000 ms update); with free data 2%" in note
    assert "MFU 1.50% with costly data, 3.00% with free data" in note and isinstance(note, lk.course.Note)


def test_the_sweep_rows_are_medians_per_worker_count():
    s = lambda t, f: dict(step_time_s=t, data_wait_s=f * t, data_wait_frac=f, intra_op_threads=1)  # noqa: E731
    rows = ln.sweep_rows({0: [s(1.0, 0.5), s(3.0, 0.5), s(2.0, 0.4)], 2: [s(0.5, 0.01)]})
    assert rows[0]["step_time_s"] == 2.0 and rows[0]["data_wait_frac"] == 0.5 and rows[0]["runs"] == 3
    table = ln.sweep_table(rows)
    assert "| 0 | 1 | 2000 ms | 50.0% (800 ms) | 3 |" in table and "| 2 | 1 | 500 ms |" in table


def test_fewest_note_follows_the_measured_wait():
    assert "under 5%, as the model said" in ln.fewest_note(2, 6.5, 0.01)
    assert "still above 5%" in ln.fewest_note(2, 6.5, 0.2) and "**20.0%**" in ln.fewest_note(2, 6.5, 0.2)


def test_the_startup_prefetch_and_memory_tables():
    cmp = verdict([0.2] * 6, [0.01] * 6, "step_time_s")
    cmp.first_epochs = {False: [0.3] * 6, True: [0.3] * 6}
    table = ln.startup_table(cmp)
    assert "| False | 300 ms | 200 ms | 6 |" in table and "| True | 300 ms | 10 ms | 6 |" in table
    pre = verdict([1.0] * 6, [1.0] * 6, "step_time_s", label_a="prefetch_factor=1", label_b="prefetch_factor=4")
    pre.results_a, pre.results_b = _runs(1.0, 0.1), _runs(1.0, 0.05)
    table = ln.prefetch_table(pre, 2, (1, 4), 4096)
    assert "| prefetch_factor=1 | 1000 ms | 10.0% | 2 batches = 8 KiB | 3 |" in table and "8 batches = 32 KiB" in table
    mib = 2**20
    mem = {None: {"main": {"rss": 500 * mib}, "start_method": "fork",
                  "workers": [{"rss": 400 * mib, "uss": 20 * mib, "pss": None}]},
           "spawn": {"main": {"rss": 500 * mib}, "start_method": "spawn",
                     "workers": [{"rss": 300 * mib, "uss": 250 * mib, "pss": 260 * mib}]}}
    table = ln.memory_table(mem)
    assert "| worker (fork) | 400 MiB | 20 MiB | n/a |" in table and "| worker (spawn) | 300 MiB | 250 MiB | 260 MiB |" in table
    assert "**20 MiB** under fork and **250 MiB** under spawn" in ln.memory_note(mem)


def test_the_spawn_note_quotes_the_error():
    note = ln.spawn_note({"class": "__main__.D", "ok": False, "seconds": 1.25, "error": "AttributeError: x"})
    assert "**FAILS** after 1.2 s" in note and "`AttributeError: x`" in note


def test_the_bandwidth_and_reference_notes():
    assert "pageable **3.2 GB/s**, pinned **25.0 GB/s**" in ln.bandwidth_note({"pageable": 3.21, "pinned": 25.0})
    note = ln.loader_references()  # none shipped: empty, the chapter's opening cell says so once
    assert isinstance(note, lk.course.Note) and (note.startswith("*") if lk.course.reference_points("loader")
                                                 else note == "")
