"""Chapters 00 and 01 show their measurements through labkit.chapters.measurelab (issue 27): every sentence
follows the numbers it is given, a table renders as markdown and stays the list of rows code reads, and bad
input is refused by name."""
import types

import pytest

import labkit as lk
from labkit.base.errors import ConfigError
from labkit.chapters import measurelab as ml
from labkit.chapters import profiling


def result(**summary):
    return types.SimpleNamespace(summary=summary, records=[{}] * 5)


BASE = dict(device_name="test|CPU", tokens_per_s=6120.4, step_time_s=0.21, timed_updates=4, mfu=0.123,
            hfu=0.123, peak_flops_source="measured: probe", precision="fp32", first_loss=5.55, final_loss=5.01,
            data_wait_s=0.0012, compute_s=0.18, optimizer_s=0.0291, intra_op_threads=1, model_flops_per_step=4.2e9,
            data_wait_frac=0.006, tokens_per_step=1024)


# ---- Table -------------------------------------------------------------------------------------------

def test_a_table_renders_markdown_and_is_still_its_rows():
    rows = [dict(a=1, b=0.5), dict(a=2, b=None)]
    t = ml.Table(rows, [("a", "A", "{}"), ("b", "B", "{:.0%}"), (lambda r: r["a"] * 10, "A×10", "{} s")])
    assert t == rows and isinstance(t, list) and t[1]["a"] == 2
    md = t._repr_markdown_().splitlines()
    assert md[0] == "| A | B | A×10 |" and md[2] == "| 1 | 50% | 10 s |" and md[3] == "| 2 | – | 20 s |"


def test_a_table_escapes_a_pipe_and_refuses_bad_columns():
    assert "a\\|b" in ml.Table([dict(x="a|b")], [("x", "x", "{}")])._repr_markdown_()
    with pytest.raises(ConfigError, match="^columns="):
        ml.Table([], [("x", "x")])


# ---- chapter 00 ---------------------------------------------------------------------------------------

def test_the_timer_words_on_a_gpu_name_the_queueing():
    text = ml.timer_words(0.001, 0.004, "cuda", 4096, 50)
    assert "**0.25×** the real time" in text and "queued" in text and "4096×4096" in text


@pytest.mark.parametrize("unsynced, words", [(1.1, "agree within 20% (ratio 1.10)"),
                                             (0.7, "differ by more than 20% (ratio 0.70"),
                                             (1.3, "was slower")])
def test_the_timer_words_on_a_cpu_follow_the_ratio(unsynced, words):
    text = ml.timer_words(unsynced, 1.0, "cpu", 384, 8)
    assert words in text and "no GPU" in text
    assert ("agree" in text) == (abs(unsynced - 1) <= ml.TIMER_TOLERANCE)


def test_the_timer_words_read_the_median_of_interleaved_rounds_and_its_spread():
    text = ml.timer_words(1.0, 1.0, "cpu", 384, 8, ratios=[0.55, 0.98, 1.02, 1.01, 1.4])
    assert "agree within 20% (median ratio 1.01)" in text and "medians of 5 interleaved rounds" in text
    assert "ranged 0.55–1.4" in text
    with pytest.raises(ConfigError, match="^ratios="):
        ml.timer_words(1.0, 1.0, "cpu", 384, 8, ratios=[])


@pytest.mark.parametrize("args, field", [((0.0, 1.0, "cpu", 4, 2), "unsynced"),
                                         ((1.0, float("nan"), "cpu", 4, 2), "synced"),
                                         ((1.0, 1.0, "tpu", 4, 2), "kind")])
def test_the_timer_words_refuse_what_is_no_timing(args, field):
    with pytest.raises(ConfigError, match=f"^{field}="):
        ml.timer_words(*args)


def test_the_timing_references_start_with_the_reference_note(monkeypatch):
    point = dict(status="ok", label="H200", summary=dict(matmul=dict(count=50, n=4096, dtype="bf16",
                                                                    no_sync_over_sync=0.01)))
    monkeypatch.setattr(ml, "reference_points", lambda section=None: [point])
    note = ml.timing_references()
    assert note.startswith(lk.course.reference_note("timing")._repr_markdown_()) and "0.01× the real time" in note
    # none shipped: nothing here, the chapter's first cell said so once
    monkeypatch.setattr(ml, "reference_points", lambda section=None: [])
    assert ml.timing_references() == "" and "No GPU reference" in ml.reference_overview()


def test_the_memory_table_holds_formula_and_measurement_per_part():
    s = dict(n_params=3_000_000, micro_batch=8, seq_len=128, param_bytes=12 * 2**20, grad_bytes=12 * 2**20,
             optimizer_bytes=24 * 2**20, activation_bytes=6 * 2**20)
    md = ml.memory_table({"tiny": s}, lambda s: {k: 2 * s[k] for k in ml.MEMORY_PARTS})
    assert "3.00 M params" in md and "| weights | 24.00 | 12.00 |" in md and md.count("\n") == 5
    with pytest.raises(ConfigError, match="^summaries="):
        ml.memory_table([], None)


def test_the_scale_words_quote_the_7b_and_70b_rows():
    text = ml.scale_words(16.02, {"1.3 B": 20.8, "7 B": 112.1, "70 B": 1121.4})
    assert "**16.02 bytes per parameter**" in text and "7 B model needs 112 GB" in text
    assert "70 B model needs 1,120 GB" in text and "| 1.3 B | 20.8 |" in text and "| 70 B | 1,120 |" in text


def test_the_baseline_words_say_which_peak_and_escape_the_device_name():
    text = ml.baseline_words(result(**BASE))
    assert "test\\|CPU" in text and "6,120 tokens/s" in text and "of the measured fp32 peak" in text
    assert "median of 4" in text and "5.55 → 5.01 in 5 updates" in text
    assert "datasheet" in ml.baseline_words(result(**{**BASE, "peak_flops_source": "NVIDIA datasheet"}))


# ---- chapter 01 ---------------------------------------------------------------------------------------

def test_the_breakdown_counts_threads_in_proper_plurals_and_says_where_the_peak_came_from():
    text = ml.breakdown_words(result(**BASE))
    assert "1 intra-op thread)" in text and "(s)" not in text and "measured on this device" in text
    assert "4.2 GFLOP per update" in text and "MFU **12.3%**" in text
    gpu = ml.breakdown_words(result(**{**BASE, "intra_op_threads": None, "peak_flops_source": "datasheet"}))
    assert "(medians)" in gpu and "from the datasheet" in gpu and "None" not in gpu


def test_the_peak_table_lists_the_rows_and_the_device_last_with_its_sources():
    env = dict(name="test CPU", peak_flops={"fp32": dict(flops=0.25e12, source="measured: probe"),
                                            "bf16": dict(flops=None, source="not measured")})
    md = ml.peak_table([(("NVIDIA H200",), {"bf16": 989.5, "fp32": 67.0}, "datasheet")], env)
    lines = md.splitlines()
    assert lines[0] == "| device | fp32 TFLOP/s | bf16 TFLOP/s |" and "| NVIDIA H200 | 67 | 990 |" in md
    assert lines[3] == "| your device: test CPU | 0.25 | – |" and "- fp32: measured: probe" in md
    with pytest.raises(ConfigError, match="^env="):
        ml.peak_table([], {"name": "x"})


def test_the_suspect_words_follow_its_summary():
    text = ml.suspect_words(result(**BASE))
    assert "MFU **12.30%**" in text and "**0.6%**" in text and "1,024 tokens" in text
    with pytest.raises(ConfigError, match="^result="):
        ml.suspect_words(BASE)


# ---- chapter 01's tables from labkit.chapters.profiling -------------------------------------------

def test_the_data_cost_plan_says_what_was_set_and_what_was_capped():
    plan = profiling.data_costs(0.48, 8, budget_s=1.0)
    text = profiling.plan_words(plan, 8, 0.48)
    assert text.count("\n- ") == 1 and "(480 ms)" in text and "capped for time, 2× wanted" in text
    assert "capped" not in profiling.plan_words(profiling.data_costs(0.48, 8), 8, 0.48)


def test_the_data_cost_rows_show_themselves_as_a_table():
    run = {"summary": dict(data_wait_s=0.5, compute_s=0.25, optimizer_s=0.02, mfu=0.05), "records": []}
    rows = profiling.data_cost_rows({"baseline": run})
    md = rows._repr_markdown_()
    assert rows[0]["label"] == "baseline" and "| baseline | 500 ms | 2.00× | 250 ms | 1.00× | 5.0% |" in md


def test_the_sweep_rows_show_themselves_and_still_pickle():
    import pickle

    rows = [dict(micro_batch=1, mfu=0.1, mfu_low=0.09, mfu_high=0.11, tokens_per_s=1234.5, flops_per_token=6e5,
                 data_wait_frac=0.001), dict(micro_batch=2, mfu=0.2, mfu_low=None, mfu_high=None, tokens_per_s=2e3,
                                             flops_per_token=6e5, data_wait_frac=0.0)]
    table = ml.Table(rows, profiling.SWEEP_COLUMNS)
    md = table._repr_markdown_()
    assert "| 1 | 10.00% | 9.00%–11.00% | 1,234 | 600,000 | 0.1% |" in md and "| 2 | 20.00% | – |" in md
    assert pickle.loads(pickle.dumps(table)) == rows
