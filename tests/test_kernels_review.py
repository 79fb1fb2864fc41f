"""Chapter 07's review fixes in labkit.chapters.ch07_kernels: a sweep that tells compute from the optimizer, a compile
that is called a compile only when Inductor compiled (not when it loaded from its disk cache), graph
breaks with Dynamo's reasons, and the reference note said once per chapter.

Nothing here asserts a speed: counters, medians of fake summaries and the words chosen from them."""
from __future__ import annotations

import json
import math
import logging
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.chapters import ch07_kernels as kernels
from labkit.chapters.ch07_kernels import fusion
from labkit.tools import sweep as tools_sweep
from test_frontend import RecordingProgress  # the one stand-in for labkit.base.frontend.Progress

NB = Path(__file__).resolve().parent.parent / "notebooks" / "07_kernels_and_compile.ipynb"


# ---- the MFU sweep: repeats, alternating order, a per-token split ---------------------------------------


class _Res:
    def __init__(self, summary):
        self.summary = summary


def _fake_run(seen):
    """A run whose optimizer costs 30 ms per update whatever the micro-batch; compute 10 ms per sequence."""
    def run(cfg):
        seen.append(cfg.micro_batch)
        compute, opt = 0.010 * cfg.micro_batch, 0.030
        step = compute + opt
        return _Res({"mfu": 0.1 * cfg.micro_batch, "tokens_per_s": cfg.tokens_per_update / step, "step_time_s": step,
                     "compute_s": compute, "optimizer_s": opt, "data_wait_s": 0.0,
                     "model_flops_per_step": 1e6 * cfg.tokens_per_update, "n_params": 123})
    return run


def test_the_sweep_alternates_its_order_and_splits_each_token(capsys, monkeypatch):
    seen = []
    RecordingProgress.made = []
    monkeypatch.setattr(tools_sweep, "Progress", RecordingProgress)  # the one sweep (tools.sweep) draws the bar
    base = lk.Config(model="tiny", seq_len=16, threads=1)
    rows = kernels.mfu_sweep(base, "micro_batch", [1, 2, 4], steps=2, repeats=3, run_fn=_fake_run(seen),
                             progress=True)
    assert seen == [1, 2, 4, 4, 2, 1, 1, 2, 4]  # a drift in load hits every size alike
    bar = RecordingProgress.made[0]  # progress through base.frontend.Progress, never a hand-written stderr line
    assert (bar.total, bar.label, bar.delay) == (9, "micro-batch sweep", 1.0)
    assert bar.updates == list(range(10)) and bar.notes[-2].startswith("micro_batch 4 [pass 3/3]")
    assert capsys.readouterr().err == ""
    kernels.mfu_sweep(base, "micro_batch", [1], steps=2, run_fn=_fake_run([]))
    assert RecordingProgress.made[1].delay == float("inf")  # progress=False: the line never shows
    r1, r4 = rows[0], rows[-1]
    assert r1["runs"] == 3 and r1["value"] == 1 and r1["field"] == "micro_batch"
    assert r1["flops_per_token"] == pytest.approx(1e6)
    # per token: compute is 10 ms per 16-token sequence at every size; the 30 ms optimizer is shared
    assert r1["compute_us_per_token"] == pytest.approx(1e6 * 0.010 / 16)
    assert r4["compute_us_per_token"] == pytest.approx(1e6 * 0.010 / 16)
    assert r1["optimizer_us_per_token"] == pytest.approx(1e6 * 0.030 / 16)
    assert r4["optimizer_us_per_token"] == pytest.approx(1e6 * 0.030 / 64)
    assert r1["optimizer_frac"] == pytest.approx(0.75) and r4["optimizer_frac"] == pytest.approx(0.030 / 0.070)
    assert (r1["mfu_low"], r1["mfu"], r1["mfu_high"]) == pytest.approx((0.1, 0.1, 0.1))


def test_the_sweep_split_credits_the_optimizer_when_only_it_saved_time():
    rows = kernels.mfu_sweep(lk.Config(model="tiny", seq_len=16, threads=1), "micro_batch", [1, 4], steps=2,
                             run_fn=_fake_run([]))
    split = kernels.sweep_split(rows)
    assert split["verdict"] == "optimizer_only" and split["field"] == "micro-batch" and split["low"] == 1
    assert split["opt_share_low_pct"] == pytest.approx(75)  # the optimizer's share of an update at micro-batch 1


def test_the_sweep_split_divides_the_saving_between_compute_and_optimizer():
    rows = [dict(field="micro_batch", value=1, compute_us_per_token=600.0, optimizer_us_per_token=250.0,
                 optimizer_frac=0.3),
            dict(field="micro_batch", value=16, compute_us_per_token=300.0, optimizer_us_per_token=50.0,
                 optimizer_frac=0.05)]
    split = kernels.sweep_split(rows)
    assert split["verdict"] == "both" and split["saved_us"] == pytest.approx(500)
    assert (split["from_compute_pct"], split["from_optimizer_pct"]) == pytest.approx((60, 40))
    rows[1].update(compute_us_per_token=700.0, optimizer_us_per_token=250.0)
    assert kernels.sweep_split(rows)["verdict"] == "no_saving"
    assert kernels.sweep_split([dict(rows[0], compute_us_per_token=None), rows[1]])["verdict"] == "no_split"


def test_plot_sweeps_draws_whiskers_and_the_split():
    rows = kernels.mfu_sweep(lk.Config(model="tiny", seq_len=16, threads=1), "micro_batch", [1, 2], steps=2,
                             repeats=2, run_fn=_fake_run([]))
    fig = kernels.plot_sweeps({"micro-batch": rows, "again": rows})
    assert len(fig.axes) == 6  # per sweep: MFU, its FLOPs twin axis, the per-token split
    assert fig._repr_png_()[:4] == b"\x89PNG"


# ---- compile: compiled, loaded from the cache, or reused ---------------------------------------------------


def _counters(hit=0, miss=0, frames=0, breaks=None):
    return {"inductor": {"fxgraph_cache_hit": hit, "fxgraph_cache_miss": miss}, "frames": {"ok": frames},
            "graph_break": dict(breaks or {})}


@pytest.mark.parametrize("after,state", [(_counters(miss=2, frames=5), "cold"), (_counters(hit=2, frames=5), "cached"),
                                         (_counters(hit=1, miss=1, frames=5), "mixed"), (_counters(), "reused")])
def test_the_cache_state_comes_from_inductors_counters(after, state):
    got = fusion._cache_state(_counters(), after)
    assert got["cache"] == state
    assert fusion._cache_state(None, after)["cache"] is None  # no counters: say so, never guess


BREAK = ("Attempted to call function marked as skipped\n  Explanation: Dynamo developers have intentionally marked "
         "that the function `DistributedDataParallel._inside_ddp_forward` in file `/x/torch/_compile.py` should not "
         "be traced.\n  Hint: Avoid calling it.\n")


def test_graph_break_reasons_are_dynamos_own_words_without_paths():
    before = _counters(breaks={BREAK: 1})
    after = _counters(breaks={BREAK: 3, "Unsupported method call\n  Explanation: Dynamo does not know how to trace "
                              "method `f` of class `Logger`.\n": 1})
    reasons = fusion._break_reasons(before, after)
    assert reasons[0] == ("Dynamo developers have intentionally marked that the function "
                          "`DistributedDataParallel._inside_ddp_forward` should not be traced", 2)
    assert reasons[1] == ("Dynamo does not know how to trace method `f` of class `Logger`", 1)


def _compiled(state, **kw):
    return dict(dict(first_update_s=2.8, steady_step_s=0.01, compile_s=2.79, kernels=99, graph_breaks=3,
                     break_reasons=[("reason A", 2), ("reason B", 1)], cold=False, cache=state, cache_hits=2,
                     cache_misses=0), **kw)


def test_compile_run_reads_the_counters_around_the_run():
    from torch._dynamo.utils import counters

    class Res:
        records = [{"step_time_s": s} for s in (3.0, 0.2, 0.2)]
        summary = {}

    def run(cfg):  # what a warm disk cache does: Dynamo traces, Inductor loads both graphs
        counters["inductor"]["fxgraph_cache_hit"] += 2
        counters["frames"]["ok"] += 4
        counters["graph_break"][BREAK] += 1
        return Res()

    out = kernels.compile_run(lk.Config(model="tiny"), run_fn=run)
    assert out["cache"] == "cached" and out["cache_hits"] == 2 and out["cold"] is False
    assert out["graph_breaks"] == 1 and "DistributedDataParallel" in out["break_reasons"][0][0]
    assert out["compile_s"] == pytest.approx(2.8)


def test_dynamos_profiler_note_is_filtered_only_while_compiling():
    log = logging.getLogger("torch._dynamo.variables.ctx_manager")
    note = log.makeRecord(log.name, logging.WARNING, __file__, 1,
                          "Profiler record function %s will be ignored", ("x",), None)
    other = log.makeRecord(log.name, logging.WARNING, __file__, 1, "something else", (), None)
    with fusion._quiet_dynamo():
        assert not log.filter(note) and log.filter(other)
    assert log.filter(note)  # the filter goes away afterwards


def test_the_no_cuda_runtime_note_of_inductors_first_import_is_dropped_while_compiling():
    # a learner's pass (#46, item 13): "No CUDA runtime is found, using CUDA_HOME=..." in a red box on a CPU
    log = logging.getLogger("torch.utils.cpp_extension")
    note = log.makeRecord(log.name, logging.WARNING, __file__, 1, "No CUDA runtime is found, using CUDA_HOME='%s'",
                          ("/usr/local",), None)
    other = log.makeRecord(log.name, logging.WARNING, __file__, 1, "something else", (), None)
    with fusion._quiet_dynamo():
        assert not log.filter(note) and log.filter(other)
    assert log.filter(note)


@pytest.mark.skipif(kernels.cxx_compiler() is None, reason="no C++ compiler: Inductor cannot build CPU kernels")
def test_cold_cached_and_reused_compiles_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # this test's own disk cache
    torch._dynamo.reset()
    cold = kernels.fusion_demo(rows=64, cols=32, repeats=3, n_threads=1)
    torch._dynamo.reset()  # a new "session": Dynamo traces again, Inductor finds the graph on disk
    cached = kernels.fusion_demo(rows=64, cols=32, repeats=3, n_threads=1)
    reused = kernels.fusion_demo(rows=64, cols=32, repeats=3, n_threads=1)
    assert cold["cache"] == "cold" and cached["cache"] == "cached" and reused["cache"] == "reused"
    assert reused["kernels"] == 0


@pytest.mark.skipif(kernels.cxx_compiler() is None, reason="no C++ compiler: Inductor cannot build CPU kernels")
def test_an_empty_cache_makes_the_next_compile_cold_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    kernels.fusion_demo(rows=64, cols=32, repeats=3, n_threads=1)  # whatever state: now it is on disk
    with fusion._empty_compile_cache():
        again = kernels.fusion_demo(rows=64, cols=32, repeats=3, n_threads=1)
    assert again["cache"] == "cold"


# ---- the chapter's reference note: once ---------------------------------------------------------------------


def test_chapters_00_and_04_build_their_reference_line_from_the_points():
    """No instrument words the reference line: chapters 00 and 04 count the shipped points in a cell and choose
    between two variants on ``bool(refs)``, once, as chapter 07 does."""
    for name in ("00_start_here.ipynb", "04_activation_checkpointing.ipynb"):
        cells = json.loads((NB.parent / name).read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert "reference_overview" not in code and code.count("lk.course.reference_points(") == 1, name
        assert "lk.course.explain(\n    bool(refs)" in code, name
    assert not hasattr(kernels, "reference_overview")


def test_chapter_07_says_the_reference_note_once_and_asks_for_a_fraction():
    cells = json.loads(NB.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "reference_note(" not in code and code.count("lk.course.reference_points(") == 1
    exercise = next(i for i, c in enumerate(cells) if "exercise-07-read-profile" in c["metadata"].get("tags", []))
    words = "".join(cells[exercise - 1]["source"])
    assert "`optimizer` row of the phase table" in words and "fraction" in words and "not milliseconds" in words


def _cmp(better, eager=(0.011, 0.012, 0.011), compiled=(0.010, 0.010, 0.011)):
    from types import SimpleNamespace as NS

    return NS(better=better, results_a=[_Res({"step_time_s": s}) for s in eager],
              results_b=[_Res({"step_time_s": s}) for s in compiled])


def _payback(c, e, k):
    import math

    return math.inf if e <= k else math.ceil(c / (e - k))


def test_the_payback_quotes_the_comparisons_medians_the_one_figure_per_quantity():
    # issue 46.16: the compile run's own steady update (10 ms here) is not the figure quoted per update
    cmp = _cmp("b", eager=(0.5, 0.5, 0.75), compiled=(0.25, 0.125, 0.25))  # medians 0.5 and 0.25 s
    pay = kernels.payback(_compiled("cold", compile_s=1000.0), cmp)
    assert (pay["eager_step_s"], pay["compiled_step_s"], pay["compile_s"]) == (0.5, 0.25, 1000.0)
    assert pay["compiled_step_s"] != _compiled("cold")["steady_step_s"] and pay["cache"] == "cold"
    steps = _payback(pay["compile_s"], pay["eager_step_s"], pay["compiled_step_s"])
    assert steps == 4000 and kernels.payback_verdict(pay, steps) == "pays"
    assert kernels.payback(_compiled(None), cmp)["cache"] == "unknown"  # no counters: said, never guessed


def test_no_payback_is_claimed_where_the_comparison_found_no_speed_up():
    pay = kernels.payback(_compiled("cold"), _cmp(None))
    assert kernels.payback_verdict(pay, _payback(pay["compile_s"], pay["eager_step_s"], pay["compiled_step_s"])) \
        == "unproven"
    slower = kernels.payback(_compiled("cold"), _cmp("a", compiled=(0.02, 0.02, 0.02)))
    assert kernels.payback_verdict(slower, math.inf) == "unproven"
    assert kernels.payback_verdict(kernels.payback(_compiled("cold"), _cmp("b")), math.inf) == "never"
    assert kernels.payback_verdict(kernels.payback(_compiled("reused"), _cmp("b")), 3) == "reused"
    with pytest.raises(lk.ConfigError, match="cmp"):
        kernels.payback(_compiled("cold"), object())


def test_chapter_07_quotes_one_compiled_step_figure_in_its_table_and_its_payback():
    cells = {c["id"]: "".join(c["source"]) for c in json.loads(NB.read_text())["cells"]}
    assert "steady_step_s" not in "\n".join(cells.values())  # the compile run's own median is never shown
    assert 'r["compiled_step_s"]' in cells["c17-report"] and "pay = ch07.payback(compiled, cmp_compile)" in \
        cells["c17-report"]
    assert 'pay["compiled_step_s"]' in cells["c19"] and "ch07.payback(" not in cells["c19"]


# ---- #26: each job written once -- one timing loop, one MFU sweep, one median, the engine's update ----------


class _Clock:
    """A stand-in for the time module inside labkit.tools.timing: each call a test makes advances it 1 s."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_a_budget_never_starts_a_round_it_has_no_room_for(monkeypatch):
    from labkit.tools import timing

    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)

    def one_second():
        clock.now += 1.0

    out = timing.interleaved({"a": one_second}, max_rounds=100, budget_s=5.5, min_rounds=2)
    assert len(out["a"]) == 5  # a sixth round would end at 6 s, past the 5.5 s budget: it is not started
    # chapter 07's timer is this loop: the same budget, never overrun (it used to stop only after overrunning)
    out = kernels.interleaved({"a": one_second}, repeats=100, warmup=0, budget_s=5.5, device=torch.device("cpu"))
    assert len(out["a"]) == 5 and out["a"] == [1.0] * 5  # each call's own seconds, timed synchronised


def test_both_chapters_time_through_the_one_loop(monkeypatch):
    from labkit.chapters import ch05_loader as loaderlab
    from labkit.tools import timing

    calls, real = [], timing.interleaved

    def spy(fns, **kw):
        calls.append(kw)
        return real(fns, **kw)

    monkeypatch.setattr(timing, "interleaved", spy)
    kernels.interleaved({"a": lambda: None}, repeats=2, warmup=1)
    loaderlab.interleaved({"a": lambda: 1}, budget_s=60, max_repeats=2, progress=False)
    assert [c["max_rounds"] for c in calls] == [2, 2]
    assert calls[0]["timed_on"] is not None and calls[0]["min_rounds"] == 3  # kernels keeps seconds, synchronised
    assert calls[1].get("timed_on") is None and calls[1]["warmup_rounds"] == 1  # the loader loop keeps its returns


def test_the_mfu_sweeps_of_chapters_01_and_07_are_one(monkeypatch):
    from labkit.chapters import ch01_measure as profiling
    from labkit.tools import sweep

    passes = []
    real = sweep.run_configs

    def spy(configs, run_fn, **kw):
        passes.append(kw["label"])
        return real(configs, run_fn, **kw)

    monkeypatch.setattr(sweep, "run_configs", spy)  # the one sweep (tools.sweep) both chapters run through
    cfg = lk.Config(model="tiny", seq_len=16, threads=1, steps=2)
    ch01 = profiling.mfu_sweep(cfg, [1, 4], repeats=2, run_fn=_fake_run([]), progress=False)
    ch07 = kernels.mfu_sweep(cfg, "micro_batch", [1, 4], steps=2, n_threads=1, repeats=2, run_fn=_fake_run([]))
    assert passes == ["micro-batch sweep", "micro-batch sweep"]
    keys = ("micro_batch", "mfu", "mfu_low", "mfu_high", "tokens_per_s", "compute_us_per_token",
            "optimizer_us_per_token", "flops_per_token", "optimizer_frac", "runs")
    assert [{k: r[k] for k in keys} for r in ch01] == [{k: r[k] for k in keys} for r in ch07]


def test_one_median_of_run_summaries():
    from labkit.chapters import ch01_measure as profiling
    from labkit.chapters import ch05_loader as loaderlab
    from labkit.tools import timing

    assert profiling.median_of is timing.median_of  # chapter 01's notebook calls it by this name
    runs = [_Res({"step_time_s": s, "data_wait_s": 0.1, "compute_s": 0.2, "data_wait_frac": f})
            for s, f in ((1.0, 0.1), (3.0, float("nan")), (2.0, 0.3))]
    fig = loaderlab.wait_figures(runs)
    assert fig["step_time_s"] == 2.0 and fig["data_wait_frac"] == pytest.approx(0.2)  # NaN is not a measurement


def test_the_profiled_step_updates_the_way_the_engine_does(monkeypatch):
    from labkit.chapters.ch07_kernels import profile as profiles

    seen, real = [], profiles.optimizer_step

    def spy(model, opt, scaler, grad_clip, *a, **k):
        seen.append(grad_clip)
        return real(model, opt, scaler, grad_clip, *a, **k)

    monkeypatch.setattr(profiles, "optimizer_step", spy)
    cfg = lk.Config(model="tiny", seq_len=16, micro_batch=1, threads=1, grad_clip=0.5)
    table = kernels.profile_step(cfg, warmup=1)
    assert seen == [0.5, 0.5]  # the warm-up step and the profiled one: clip, step, zero -- lk.run's update
    assert table.phases.get("optimizer", 0) > 0
