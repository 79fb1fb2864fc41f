"""Chapter 00 (start here): notebooks/00_start_here.ipynb, labkit.chapters.ch00_start and lk.course.
The timer cell's sentence follows from the measured ratio (agree only within the stated tolerance), run on the
CPU with a clock that returns chosen times; the device report says where each peak came from and why a 16-bit
format is slower; and the chapter helpers refuse impossible arguments before any work."""
import json
import re
import statistics
import types
import unittest.mock as mock
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.base import page
from labkit.chapters import ch00_start as ch00
from labkit.tools import timing

NB = Path(__file__).resolve().parent.parent / "notebooks" / "00_start_here.ipynb"


def run_timer_cell(monkeypatch, unsynced_s, synced_s):
    """The chapter's timer ("the code" cell code-00-sync-timer) and the cell that measures with it, in one
    namespace; what the cells display (a Note) or say is collected."""
    cells = json.loads(NB.read_text())["cells"]
    code, measure = ("".join(next(c for c in cells if tag in c.get("metadata", {}).get("tags", []))["source"])
                     for tag in ("code-00-sync-timer", "measure-00-sync-timing"))
    def clock():  # t0 and end of each timing; the interleaved rounds alternate unsynced, synced
        t = 0.0
        while True:
            for d in (unsynced_s, synced_s):
                yield t
                yield t + d
                t += 100.0
    ticks = clock()
    said = []
    monkeypatch.setattr(lk.course, "say", said.append)
    monkeypatch.setattr(lk.course, "sizes", lambda cpu, gpu: dict(cpu))
    ns = {"torch": torch, "lk": lk, "device": torch.device("cpu"), "synchronize": lambda d: None,
          "time": types.SimpleNamespace(perf_counter=lambda: next(ticks)), "my_guess_timer_ratio": None,
          "ch00": ch00, "display": said.append, "statistics": statistics, "timing": timing}
    exec(code, ns)
    exec(measure, ns)
    exec(cell("00-10v"), ns)  # the cell that chooses the sentence
    table = next(str(t._repr_markdown_()) for t in said if hasattr(t, "_repr_markdown_"))
    return ns["timer"]["verdict"], table


@pytest.mark.parametrize("unsynced,synced", [(0.73, 1.0), (1.0, 0.73), (1.5, 1.0)])
def test_a_ratio_far_from_1_is_not_called_agreement(monkeypatch, unsynced, synced):
    verdict, table = run_timer_cell(monkeypatch, unsynced, synced)
    assert verdict == "scatter" and f"| {unsynced / synced:.2f} | {unsynced / synced:.2f} |" in table, table


def test_a_ratio_near_1_agrees_within_the_tolerance(monkeypatch):
    verdict, table = run_timer_cell(monkeypatch, 1.05, 1.0)
    assert verdict == "agree" and "| 1.05 | 1.05 |" in table, table


# ---- the device report: where each peak came from, and why fp16 can be slower ----------------------------

from labkit.engine.device import table_peak  # noqa: E402
from labkit.base.runtime import ConfigError  # noqa: E402

SPR_FLAGS = ["amx_bf16", "amx_tile", "amx_int8", "avx512f", "avx512_bf16", "avx512_fp16", "avx2", "fma"]


def cpu_env(flags, fp32=0.24e12, fp16=0.10e12, bf16=1.0e12, fast=("bf16",)):
    src = "measured: best of 3 short probes of {} matmuls up to 512x512 with 2 threads, the highest kept"
    return dict(name="Intel Xeon", kind="cpu", reason="no GPU", compute_capability=None, memory_bytes=2**33,
                cores=2, cpu_flags=list(flags), fast_formats=list(fast),
                peak_flops={p: dict(flops=f, source=src.format(p)) for p, f in (("fp32", fp32), ("fp16", fp16),
                                                                                   ("bf16", bf16))})


def gpu_env(name="NVIDIA H200"):
    peaks = {p: dict(zip(("flops", "source"), table_peak(name, p))) for p in ("fp32", "tf32", "fp16", "bf16")}
    return dict(name=name, kind="cuda", reason="CUDA GPU", compute_capability="9.0", memory_bytes=141 * 2**30,
                cores=16, cpu_flags=[], fast_formats=["tf32", "fp16", "bf16"], peak_flops=peaks)


def _ratios(reading):
    return {r["format"]: round(r["vs_fp32"], 2) for r in reading["rows"] if r["vs_fp32"] is not None}


def test_a_gpu_ratio_comes_with_its_datasheet_source():
    reading = lk.course.peak_reading(gpu_env())
    assert _ratios(reading)["bf16"] == 14.77 and reading["why"] == "tensor_cores"
    assert all(not str(r["source"]).startswith("measured") for r in reading["rows"])


def test_a_cpu_ratio_comes_with_its_probe_and_its_threads():
    reading = lk.course.peak_reading(cpu_env(SPR_FLAGS))
    assert _ratios(reading) == {"fp32": 1.0, "fp16": 0.42, "bf16": 4.17}
    assert all("with 2 threads" in r["source"] for r in reading["rows"])  # the probe's own words, in the table


@pytest.mark.parametrize("env, why, fp16", [
    (cpu_env(SPR_FLAGS), "bf16_units", "avx512_amx"),
    (cpu_env(SPR_FLAGS + ["amx_fp16"]), "bf16_units", "amx_fp16"),  # not told it lacks AMX-FP16
    (cpu_env(["avx512_fp16", "avx2"], fast=()), "bf16_par", "avx512_no_amx"),
    (cpu_env(["avx2", "fma"], bf16=0.02e12, fast=()), "bf16_emulated", "software"),
    (cpu_env(["avx2", "fma"], fp16=0.3e12), "bf16_unlisted", "not_slower"),  # fast without units it names
    (cpu_env(SPR_FLAGS, fp16=0.5e12), "bf16_units", "not_slower"),  # fp16 faster than fp32: nothing to explain
    (gpu_env("Tesla T4"), "tensor_cores_some", "not_slower"),
])
def test_the_device_case_follows_the_numbers_and_the_flags(env, why, fp16):
    """Issue 23 review: fp16 below fp32 is explained only by what the flags show (fp32 has no matrix unit
    either, so "no amx_fp16" alone does not explain it); a bf16 that is not fast is not called fast."""
    reading = lk.course.peak_reading(env)
    assert (reading["why"], reading["fp16"]) == (why, fp16), reading


def test_the_amx_tiles_and_the_bf16_advice_come_from_the_flags():
    reading = lk.course.peak_reading(cpu_env(SPR_FLAGS))
    assert reading["tiles"] == "bf16 and int8" and reading["bf16_fast"]
    assert not lk.course.peak_reading(cpu_env(SPR_FLAGS, bf16=0.2e12, fast=()))["bf16_fast"]


@pytest.mark.parametrize("name, sheet, missing", [
    ("NVIDIA H200", "bf16 and fp16", ""),
    ("Tesla T4", "fp16", "bf16"),
    ("Tesla V100-SXM2-16GB", "fp16", "bf16"),
])
def test_a_gpu_is_told_only_the_tensor_core_formats_its_datasheet_gives(name, sheet, missing):
    """Issue 23 review: a T4 or V100 has no bf16 tensor cores; the sentence names only formats with a peak."""
    reading = lk.course.peak_reading(gpu_env(name))
    assert (reading["sheet"], reading["missing"]) == (sheet, missing), reading


def test_a_gpu_outside_the_datasheet_table_is_not_guessed_at():
    src = "measured: best of 1 short probe of {} matmuls"
    env = gpu_env("NVIDIA Unknown")
    env["peak_flops"] = {p: dict(flops=f, source=src.format(p)) for p, f in (("fp32", 20e12), ("bf16", 150e12))}
    reading = lk.course.peak_reading(env)
    assert (reading["why"], reading["fp16"]) == ("unknown_gpu", "no_peak")
    no_low = dict(env, peak_flops={"fp32": env["peak_flops"]["fp32"]})
    assert lk.course.peak_reading(no_low)["why"] == "none"


def _said_by_the_device_cells(env):
    said = []
    ns = {"lk": lk, "env": env, "display": said.append}
    with mock.patch.object(lk.course, "say", said.append), mock.patch.object(page, "say", said.append):
        exec(cell("00-05"), ns)
        exec(cell("00-05f"), ns)
    return said


@pytest.mark.parametrize("env", [
    cpu_env(SPR_FLAGS), cpu_env(SPR_FLAGS + ["amx_fp16"]), cpu_env(["avx512_fp16", "avx2"], fast=()),
    cpu_env(["avx2", "fma"], bf16=0.02e12, fast=()), cpu_env(SPR_FLAGS, fp16=0.5e12), gpu_env(),
    cpu_env(["avx2", "fma"]),
    gpu_env("Tesla T4")])
def test_chapter_00_words_every_device_case_it_can_meet(env):
    """The cells hold a sentence for every case peak_reading returns, with the figures it quotes."""
    said = _said_by_the_device_cells(env)
    words = [w for w in said if isinstance(w, str)]
    assert len(words) >= 2 and not any("{" in w for w in words), words
    table = next(t for t in said if hasattr(t, "_repr_markdown_"))._repr_markdown_()
    assert "| bf16 |" in table and "÷ fp32's peak" in table


def test_the_device_table_keeps_a_datasheet_asterisk_literal():
    said = _said_by_the_device_cells(gpu_env())
    table = next(t for t in said if hasattr(t, "_repr_markdown_"))._repr_markdown_()
    assert "1,979\\* TFLOP/s" in table
    assert all(line.count("|") - line.count("\\|") == 5 for line in table.splitlines())


def test_chapter_00_no_longer_calls_a_datasheet_ratio_measured_and_names_jupyterlab_4s_menu():
    text = NB.read_text()
    assert "(measured). {why}" not in text and "Restart & Run All" not in text
    assert "Restart Kernel and Run All Cells" in text and "lk.course.peak_reading(env)" in text


# ---- lk.course refuses impossible arguments before any work ----------------------------------------------

@pytest.mark.parametrize("call, field", [
    (lambda: lk.course.budget(float("nan")), "seconds"), (lambda: lk.course.budget(0), "seconds"),
    (lambda: lk.course.budget(float("inf")), "seconds"), (lambda: lk.course.budget("30"), "seconds"),
    (lambda: lk.course.emulated("fp64"), "precision"), (lambda: lk.course.steps(0), "n"),
    (lambda: lk.course.steps(2.5), "n"), (lambda: lk.course.sizes(cpu=None, gpu={}), "cpu"),
    (lambda: lk.course.low_precision_fit("bf16", [], {}), "knobs"), (lambda: lk.course.say(3), "text"),
    (lambda: lk.course.compare_prediction(1.0, float("nan"), "x"), "measured"),
    (lambda: lk.course.compare_prediction("5000", 4000.0, "tokens/s"), "your prediction"),
    (lambda: lk.course.compare_prediction(1.0, 2.0, "x", tolerance=-1), "tolerance"),
    (lambda: lk.course.reference_points(7), "section"),
])
def test_course_helpers_refuse_impossible_arguments_by_name(call, field):
    with pytest.raises(ConfigError, match=f"^{field}="):
        call()


def test_emulated_suggests_the_formats_it_knows():
    with pytest.raises(ConfigError, match="did you mean 'fp16'"):
        lk.course.emulated("fp61")


@pytest.mark.parametrize("x, text", [(6120.4, "6,120"), (0.000123, "0.000123"), (1.23456, "1.23"), (999.6, "1,000"),
                                     (123456789, "123,000,000"), (0.5, "0.5"), (0, "0"), (-0.00456, "-0.00456")])
def test_numbers_shown_to_a_learner_never_use_e_notation(x, text):
    assert lk.course.number(x) == text


def test_a_prediction_is_compared_without_e_notation(monkeypatch):
    said = []
    monkeypatch.setattr(lk.course, "say", said.append)
    lk.course.compare_prediction(5000, 6120.4, "tokens per second")
    assert "6,120" in said[-1] and "5,000" in said[-1] and "e+" not in said[-1]


# ---- a learner's pass (Chromium): no answer above its exercise, readable charts, one number one way ----------

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from labkit.engine import device as lk_device, rules  # noqa: E402


def chapter_cells():
    return json.loads(NB.read_text())["cells"]


def cell(key):
    """The source of the cell with this tag or id."""
    return next("".join(c["source"]) for c in chapter_cells()
                if key in c.get("metadata", {}).get("tags", []) or c.get("id") == key)


def index_of(tag):
    return next(i for i, c in enumerate(chapter_cells()) if tag in c.get("metadata", {}).get("tags", []))


def test_no_exercise_of_chapter_00_is_answered_above_itself():
    cells = chapter_cells()
    above = cells[:index_of("exercise-00-bytes-per-param")]
    text = "".join("".join(c["source"]) for c in above)
    assert "16\nbytes per parameter" not in text and "16 bytes per parameter" not in text, "the total is given away"
    assert "the same 16" not in text and "4 + 4 + 8" not in text
    # the cell that prints the measured bytes per parameter (and GB per model) comes after both exercises
    order = [index_of(t) for t in ("exercise-00-bytes-per-param", "exercise-00-llm-memory", "measure-00-llm-scale")]
    assert order == sorted(order), order
    assert "13e9" not in cell("measure-00-llm-scale") and '"13 B"' not in cell("measure-00-llm-scale")


FAKE = dict(n_params=3_000_000, micro_batch=8, seq_len=128, n_layer=4, d_model=128, param_bytes=12e6, grad_bytes=12e6,
            optimizer_bytes=24e6, activation_bytes=60e6, peak_mem_bytes=None)


def run_chart_cell(key, monkeypatch, **ns):
    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    exec(cell(key), {"plt": plt, "lk": lk, **ns})
    assert len(shown) == 1
    fig = shown[0]
    fig.set_dpi(100)
    fig.canvas.draw()
    return fig


def test_the_memory_chart_legend_is_readable_and_off_the_bars(monkeypatch):
    runs = {m: types.SimpleNamespace(summary=dict(FAKE)) for m in ("tiny", "small")}
    formula = lambda s: {k: s[k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes")}
    fig = run_chart_cell("00-16", monkeypatch, runs=runs, formula=formula,
                         PARTS=("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes"))
    assert all(ax.get_legend() is None for ax in fig.axes), "a legend inside a panel covers its bars"
    (legend,) = fig.legends
    assert all(t.get_fontsize() >= 10 for t in legend.get_texts())
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in fig.axes)
    plt.close(fig)


def test_the_llm_scale_chart_labels_are_readable_apart_and_free_of_markup(monkeypatch):
    fig = run_chart_cell("measure-00-llm-scale", monkeypatch, small=dict(FAKE), ch00=ch00,
                         display=lambda note: None)
    (ax,) = fig.axes
    labels = [t for t in ax.texts if "GB" in t.get_text()]
    assert len(labels) == 2 and all(t.get_fontsize() >= 10 for t in labels)
    a, b = (t.get_window_extent() for t in labels)
    assert not a.overlaps(b) and min(abs(a.y0 - b.y1), abs(b.y0 - a.y1)) > 5  # pixels apart
    assert "`" not in ax.get_title()
    plt.close(fig)


class PlantedLoad:
    """LoadMeter readings planted one per run: busy, busy, quiet... (#46 item 5)."""
    busy = []

    def read(self):
        b = PlantedLoad.busy.pop(0)
        return dict(busy=b, other_cores=1.6 if b else 0.0)


def run_baseline_cells(monkeypatch, speeds, busy):
    """Chapter 00's baseline cells with a fake lab.run (each run the next planted tokens/s) and planted load."""
    said, runs = [], iter(speeds)
    PlantedLoad.busy = list(busy)
    monkeypatch.setattr(ch00, "LoadMeter", PlantedLoad)
    monkeypatch.setattr(lk.course, "say", said.append)
    monkeypatch.setattr(page, "say", said.append)  # explain's own say (labkit.base.page)
    s = dict(device_name="test CPU", step_time_s=0.2, timed_updates=3, mfu=0.1, precision="fp32", first_loss=5.5,
             final_loss=5.0)
    lab = types.SimpleNamespace(run=lambda: types.SimpleNamespace(summary=dict(s, tokens_per_s=next(runs))))
    ns = {"lk": lk, "ch00": ch00, "lab": lab, "display": said.append, "my_guess_tokens_per_s": None}
    exec(cell("measure-00-baseline"), ns)
    exec(cell("00-24b"), ns)
    return ns, said


def test_a_17x_slow_baseline_under_load_is_measured_again_not_used(monkeypatch):
    ns, said = run_baseline_cells(monkeypatch, [415, 6300], [True, False])
    assert ns["steady"]["verdict"] == "remeasured" and ns["result"].summary["tokens_per_s"] == 6300
    assert any("6,300" in str(getattr(t, "_repr_markdown_", lambda: t)()) for t in said)


def test_a_baseline_whose_repeats_never_agree_under_load_is_refused(monkeypatch):
    ns, said = run_baseline_cells(monkeypatch, [415, 6300, 2000], [True, True, True])
    assert ns["steady"]["verdict"] == "refused" and ns["result"] is None
    assert any("No baseline" in str(t) for t in said)  # the one line saying why
    # and the reference cell below does not treat the refused figure as a baseline
    exec(cell("00-25"), {"lk": lk, "result": None})


def test_no_reference_is_said_once_not_twice(monkeypatch):
    said = []
    monkeypatch.setattr(lk.course, "say", said.append)
    monkeypatch.setattr(lk.reference, "match", lambda summary: [])
    monkeypatch.setattr(lk.plots, "reference", lambda result, points: lk.plots.NoChart("none") if not points else None)
    exec(cell("00-25"), {"lk": lk, "result": types.SimpleNamespace(summary={})})
    assert said == [], "the reference note repeats the chart's own 'no GPU reference' line"


@pytest.mark.parametrize("probes, threads, words", [
    (1, 1, "best of 1 short probe of fp32 matmuls up to 64x64 with 1 thread,"),
    (3, 2, "best of 3 short probes of fp32 matmuls up to 64x64 with 2 threads,"),
])
def test_the_measured_peak_source_counts_in_proper_plurals(probes, threads, words):
    text = lk_device._measured_words("fp32", dict(probes=probes, n=64), threads)
    assert words in text and "(s)" not in text


@pytest.mark.parametrize("cores, words", [(1, "(1 CPU core)"), (2, "(2 CPU cores)")])
def test_too_many_cpu_ranks_are_refused_in_proper_plurals(monkeypatch, cores, words):
    monkeypatch.setattr(rules, "under_torchrun", lambda: False)
    caps = lk_device.Capabilities(kind="cpu", name="test CPU", reason="test", cores=cores)
    (err,) = rules._parallel(types.SimpleNamespace(world_size=8), caps)
    assert words in str(err) and "(s)" not in str(err)


def test_a_prediction_compared_returns_nothing_a_cell_would_print(capsys):
    """A cell ending with compare_prediction shows the sentence only, not a stray True/False after it."""
    import labkit as lk
    import labkit.chapters.course  # noqa: F401
    assert lk.course.compare_prediction(5000, 6120.4, "tokens per second") is None
    assert lk.course.compare_prediction(6000, 6120.4, "tokens per second", source="predicted") is None
    assert "predicted" in capsys.readouterr().out


def test_the_allreduce_count_at_world_size_1_is_explained_before_the_first_panel_run():
    # #46 item 10: "AllReduce calls, per update: 1" at world size 1 was unexplained until chapter 06
    cs = chapter_cells()
    first_run = next(i for i, c in enumerate(cs) if c["cell_type"] == "code" and "lab.run" in "".join(c["source"]))
    text = " ".join("".join(c["source"]) for c in cs[:first_run] if c["cell_type"] == "markdown")
    assert re.search(r"AllReduce[^.]*world size 1", text) and "group of one" in text


def test_chapter_00_draws_the_runs_charts_once():
    # the panel draws every run's charts; a dashboard below it drew the same charts a second time
    code = " ".join("".join(c["source"]) for c in chapter_cells() if c["cell_type"] == "code")
    assert "lk.plots.dashboard(" not in code and "lk.Lab(" in code


def test_chapter_00_probes_its_peaks_and_runs_its_baseline_with_the_threads_a_busy_cpu_allows(monkeypatch):
    # a learner's pass under load (#46, item 5): with two threads on two shared cores the fp32 probe read
    # 0.00002 TFLOP/s (a 64x64 matmul took 24 ms), fp16 "287x fp32", and the baseline showed MFU 49775 %
    import labkit as lk
    import labkit.chapters.course  # noqa: F401
    seen = {}
    monkeypatch.setattr(ch00, "bench_threads", lambda kind=None: 1)  # what a busy CPU gets
    monkeypatch.setattr(lk, "env", lambda: seen.setdefault("probe_threads", torch.get_num_threads()) and {})
    monkeypatch.setattr(lk.course, "say", lambda *a: None)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        exec(cell("00-04"), {"torch": torch, "lk": lk, "ch00": ch00, "display": lambda *a: None})
        assert seen["probe_threads"] == 1
    finally:
        torch.set_num_threads(old)
    assert "threads=threads" in cell("00-22")  # the baseline's Lab runs with the same count


def test_low_precision_fit_shrinks_only_an_emulated_run(monkeypatch):
    monkeypatch.setattr(lk.course, "emulated", lambda p: 3.5 if p == "bf16" else None)
    fit = lk.course.low_precision_fit("bf16", dict(model="small", steps=3), dict(model="tiny"))
    assert fit == dict(knobs=dict(model="tiny", steps=3), slowdown=3.5, verdict="emulated", smaller=dict(model="tiny"))
    native = lk.course.low_precision_fit("fp16", dict(model="small"), dict(model="tiny"))
    assert (native["knobs"], native["verdict"], native["slowdown"]) == (dict(model="small"), "native", None)
