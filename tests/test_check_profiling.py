"""The measure and diagnose checkers of chapters 01 and 05: each passes the right answer in several forms, fails
every plausible wrong one with a hint that names it, says 'not attempted' for placeholders and never raises.

The runs they judge are built here as summaries and records (no timing enters a verdict of these tests); the
few real runs at the end only check that real Results are read alike, never how fast anything was."""
import math
import re
import statistics

import pytest

import labkit as lk
from conftest import ENGLISH_RUN, assert_family_registered, load_solutions
from labkit.chapters import ch01_measure as dg
from labkit.check import profiling
from labkit.tools import timing as tools_timing
from labkit.tools.compare import verdict
from labkit.engine.measure import count_flops
from labkit.engine.config import config_echo as _config_keys  # was train._config_keys
from labkit.engine.train import Result

sol = load_solutions("profiling")


def check(name, *args):
    res = getattr(lk.check, name)(*args)
    assert isinstance(res, lk.check.CheckResult)
    return res


def passes(name, *args):
    res = check(name, *args)
    assert res.passed and res.attempted, res.message
    return res


def fails(name, *args, words=()):
    res = check(name, *args)
    assert not res.passed and res.attempted, res.message
    for w in words:
        assert w.lower() in res.message.lower(), f"hint should mention {w!r}: {res.message}"
    return res


def test_every_checker_is_listed_and_found_by_name():
    assert_family_registered(profiling)


@pytest.mark.parametrize("name", profiling.__all__)
def test_placeholders_are_not_attempted(name):
    for placeholder in (None, ...):
        res = check(name, placeholder, None)
        assert not res.passed and not res.attempted


@pytest.mark.parametrize("name", profiling.__all__)
@pytest.mark.parametrize("junk", ["8", 8, 3.5, True, [1, 2], {"a": 1}, object(), lambda *a: "x", float("nan")])
def test_junk_answers_fail_and_never_raise(name, junk):
    res = check(name, junk, _run(SUSPECT, mfu=0.05) if name == "low_mfu_fix" else _loader_runs())
    assert not res.passed


# ================================================================================================
# 01 -- low_mfu_fix
# ================================================================================================

SUSPECT = dict(model="tiny", micro_batch=1, accum=8, precision="fp32", threads=1, workers=0, data_cost_ms=0.0, steps=6)


def _summary(knobs, mfu, wait=0.02, device="cpu", threads=None, status="completed", **extra):
    """What lk.run's summary holds for ``knobs``, with the measured parts given (a 40 ms update)."""
    cfg = lk.Config(**knobs)
    s = dict(_config_keys(cfg), status=status, device=device, mfu=mfu, data_wait_frac=wait,
             intra_op_threads=threads or cfg.threads or 2, step_time_s=0.04, data_wait_s=wait * 0.04,
             compute_s=0.035, optimizer_s=0.004, timed_updates=cfg.steps - cfg.warmup,
             model_flops_per_step=count_flops(cfg.spec) * cfg.micro_batch * cfg.accum)
    s["tokens_per_s"] = s["tokens_per_step"] / s["step_time_s"]
    s.update(extra)
    return s


def _run(knobs, mfu, **kw):
    return {"summary": _summary(knobs, mfu, **kw), "records": []}


def fix(mfu=0.15, **changes):
    return _run({**SUSPECT, **changes}, mfu)


suspect = _run(SUSPECT, mfu=0.05)


# ---- right answers, in several forms ------------------------------------------------------------

def test_the_reference_fix_passes():
    cfg = sol.fixed_config(lk.Config(**SUSPECT))
    assert (cfg.micro_batch, cfg.accum) == (8, 1)
    res = passes("low_mfu_fix", _run(cfg.to_dict(), 0.16), suspect)
    assert "5.00% → 16.00%" in res.message and "bigger matmuls" in res.message


@pytest.mark.parametrize("mb, accum", [(8, 1), (4, 2), (2, 4)])
def test_any_split_with_bigger_micro_batches_passes(mb, accum):
    passes("low_mfu_fix", fix(micro_batch=mb, accum=accum, mfu=0.09), suspect)


def test_other_forms_pass():
    # a bare summary, a list of repeats (medians), an lk.Result, settings that do not touch speed changed too
    passes("low_mfu_fix", fix(micro_batch=8, accum=1)["summary"], suspect["summary"])
    passes("low_mfu_fix", [fix(0.14, micro_batch=8, accum=1), fix(0.2, micro_batch=8, accum=1),
                           fix(0.03, micro_batch=8, accum=1)], [suspect, _run(SUSPECT, mfu=0.06)])
    cfg = lk.Config(**{**SUSPECT, "micro_batch": 8, "accum": 1})
    passes("low_mfu_fix", Result(cfg, _summary(cfg.to_dict(), 0.2), []), suspect)
    passes("low_mfu_fix", fix(micro_batch=8, accum=1, lr=1e-3, seed=3, steps=20), suspect)


def _comparison(before, after, mfu_a, mfu_b, samples_a, samples_b):
    cmp = verdict(samples_a, samples_b, "tokens_per_s", label_a="suspect", label_b="fix")
    cmp.results_a = [_run(before, m) for m in mfu_a]
    cmp.results_b = [_run(after, m) for m in mfu_b]
    return cmp


def test_a_comparison_passes_on_its_verdict():
    after = {**SUSPECT, "micro_batch": 8, "accum": 1}
    a, b = [100, 101, 99, 100, 102], [112, 113, 111, 112, 114]  # +12 %: under MIN_GAIN, but decided
    res = passes("low_mfu_fix", _comparison(SUSPECT, after, [0.05] * 5, [0.056] * 5, a, b))
    assert "5.00% → 5.60%" in res.message
    passes("low_mfu_fix", _comparison(SUSPECT, after, [0.05] * 5, [0.056] * 5, a, b), suspect)
    # a comparison of two other configurations does not answer for the suspect
    other = {**SUSPECT, "micro_batch": 2, "accum": 4}
    fails("low_mfu_fix", _comparison(other, after, [0.05] * 5, [0.056] * 5, a, b), suspect,
          words=("first configuration", "micro_batch 1 → 2"))
    # the same small gain from two single runs is not enough to call it measured
    fails("low_mfu_fix", fix(0.056, micro_batch=8, accum=1), suspect, words=("do not show", "compare_configs"))


def test_compile_passes_when_measured():
    res = passes("low_mfu_fix", fix(0.08, compile=True), suspect)
    assert "torch.compile" in res.message


# ---- wrong answers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, words", [
    (dict(workers=2), ("loader was not the problem", "1.02×")),           # workers when nothing waits
    (dict(workers=1, micro_batch=8, accum=1), ("loader",)),               # a right change mixed with workers
    (dict(data_cost_ms=0.5), ("loader",)),
    (dict(accum=1), ("accum alone",)),                                      # fewer micro-batches, as small as before
    (dict(accum=32), ("accum alone",)),
    (dict(micro_batch=8), ("tokens per update", "4,096")),                 # a bigger batch: another training run
    (dict(model="small"), ("changed the model", "flops per token")),
    (dict(d_model=128, n_head=4), ("changed the model",)),
    (dict(seq_len=128), ("changed the sequence length",)),
    (dict(precision="bf16"), ("peak of the number format",)),
    (dict(threads=2), ("threads",)),
    (dict(checkpointing="full"), ("recomputes",)),
    (dict(optimizer="sgd"), ("training algorithm",)),
    (dict(attention="math"), ("attention 'auto' → 'math'", "as small as before")),
    (dict(grad_clip=None), ("grad_clip 1.0 → None", "optimizer step")),
    (dict(loss_scaling="on"), ("loss_scaling", "fp16")),
    (dict(attention="math", micro_batch=8, accum=1), ("besides micro_batch 1 → 8", "also changed attention")),
])
def test_wrong_changes_fail_even_when_mfu_rose(changes, words):
    fails("low_mfu_fix", fix(0.2, **changes), suspect, words=words)


@pytest.mark.parametrize("changes", [dict(attention="math"), dict(grad_clip=None), dict(loss_scaling="on"),
                                     dict(seq_len=128), dict(workers=2), dict(optimizer="sgd")])
def test_a_single_change_is_never_called_an_extra_one(changes):
    # "you also changed X" only when X came with another change; alone, the hint says why X is no answer
    res = fails("low_mfu_fix", fix(0.2, **changes), suspect)
    assert "also" not in res.message.lower() and "right kind" not in res.message, res.message


@pytest.mark.parametrize("changes, words, not_words", [
    (dict(seq_len=128), ("sequence length", "seq_len 64 → 128", "12·L·d·T", "1,024 tokens instead of 512",
                         "longer sequences"), ("wider", "deeper")),
    (dict(seq_len=32), ("sequence length", "shorter sequences"), ("wider", "longer")),
    (dict(d_model=128), ("d_model 64 → 128", "a wider model"), ("sequence length",)),
    (dict(d_model=32, n_head=2), ("a narrower model",), ("wider",)),
    (dict(n_layer=4), ("n_layer 2 → 4", "a deeper model"), ("wider", "sequence length")),
    (dict(model="small"), ("another preset", "model 'tiny' → 'small'"), ("wider",)),
])
def test_a_model_change_is_named_for_what_changed(changes, words, not_words):
    res = fails("low_mfu_fix", fix(0.2, **changes), suspect, words=("flops per token",) + words)
    for w in not_words:
        assert w.lower() not in res.message.lower(), f"hint should not say {w!r}: {res.message}"


@pytest.mark.parametrize("changes, right", [
    (dict(workers=1, micro_batch=8, accum=1), "micro_batch 1 → 8, accum 8 → 1"),
    (dict(optimizer="sgd", compile=True), "compile False → True"),
    (dict(threads=2, micro_batch=4, accum=2), "micro_batch 1 → 4, accum 8 → 2"),
])
def test_a_right_change_mixed_with_a_wrong_one_is_named(changes, right):
    res = fails("low_mfu_fix", fix(0.2, **changes), suspect, words=(right, "right kind of change", "run it alone"))
    assert res.message.count("right kind") == 1


def test_a_smaller_micro_batch_mixed_with_a_wrong_change_is_not_called_right():
    start = _run({**SUSPECT, "micro_batch": 2, "accum": 4}, 0.05)
    res = fails("low_mfu_fix", _run({**SUSPECT, "workers": 2}, 0.2), start, words=("loader",))
    assert "right kind" not in res.message, res.message


def test_parallel_and_device_changes_fail():
    two = fix(0.2)
    two["summary"].update(world_size=2, ddp_sync="every_micro")
    fails("low_mfu_fix", two, suspect, words=("one process",))
    gpu = _run({**SUSPECT, "micro_batch": 8, "accum": 1}, 0.3, device="cuda")
    fails("low_mfu_fix", gpu, suspect, words=("different devices",))


def test_threads_differing_without_the_knob_fail():
    # threads=None in both configurations, but the engine gave the runs different counts
    knobs = {**SUSPECT, "threads": None}
    fails("low_mfu_fix", _run({**knobs, "micro_batch": 8, "accum": 1}, 0.2, threads=1), _run(knobs, 0.05, threads=2),
          words=("threads",))


def test_smaller_micro_batches_and_no_change_fail():
    start = {**SUSPECT, "micro_batch": 2, "accum": 4}
    fails("low_mfu_fix", _run({**start, "micro_batch": 1, "accum": 8}, 0.3), _run(start, 0.05), words=("smaller",))
    fails("low_mfu_fix", _run(SUSPECT, 0.2), suspect, words=("suspect configuration itself",))


def test_runs_that_do_not_show_the_rise_fail():
    fails("low_mfu_fix", fix(0.05, micro_batch=8, accum=1), suspect, words=("do not show",))
    fails("low_mfu_fix", fix(0.04, micro_batch=8, accum=1), suspect, words=("do not show",))
    after = {**SUSPECT, "micro_batch": 8, "accum": 1}
    same = _comparison(SUSPECT, after, [0.05] * 5, [0.2] * 5, [100, 120, 80, 110, 90], [105, 85, 115, 95, 100])
    fails("low_mfu_fix", same, words=("does not show",))


def test_a_suspect_that_waits_is_not_this_exercise():
    waits = _run(SUSPECT, 0.05, wait=0.4)
    fails("low_mfu_fix", fix(micro_batch=8, accum=1), waits, words=("data-wait case",))


def test_answers_that_are_not_measurements_fail():
    fails("low_mfu_fix", lk.Config(**{**SUSPECT, "micro_batch": 8, "accum": 1}), suspect, words=("config", "lk.run"))
    fails("low_mfu_fix", fix(micro_batch=8, accum=1), None, words=("suspect run",))
    fails("low_mfu_fix", fix(micro_batch=8, accum=1), lk.Config(**SUSPECT), words=("config",))
    oom = _run({**SUSPECT, "micro_batch": 8, "accum": 1}, None, status="out_of_memory")
    fails("low_mfu_fix", oom, suspect, words=("completed",))
    empty = verdict([1.0], [2.0], "tokens_per_s")
    fails("low_mfu_fix", empty, words=("kept no runs",))


# ================================================================================================
# 01 -- the data-cost cell: costs from the measured compute, a sentence chosen by the numbers
# ================================================================================================

def _timed_run(compute_ms, wait_ms=0.0, opt_ms=20.0, mfu_scale=1.0, workers=0, cost=0.0):
    """A run whose timed updates took ``compute_ms`` each (list), waiting ``wait_ms`` for data; MFU from the
    median update time against a made-up 100 ms reference update at 10 %."""
    recs = [{"compute_s": c / 1e3, "data_wait_s": wait_ms / 1e3, "optimizer_s": opt_ms / 1e3,
             "step_time_s": (c + wait_ms + opt_ms) / 1e3} for c in compute_ms]
    step = statistics.median(r["step_time_s"] for r in recs)
    summary = {"timed_updates": len(recs), "compute_s": statistics.median(compute_ms) / 1e3,
               "data_wait_s": wait_ms / 1e3, "optimizer_s": opt_ms / 1e3, "step_time_s": step,
               "data_wait_frac": wait_ms / 1e3 / step, "mfu": 0.1 * 0.1 / step * mfu_scale,
               "tokens_per_s": 1000 / step, "workers": workers, "data_cost_ms": cost, "intra_op_threads": 1}
    return {"summary": summary, "records": recs}


def test_data_costs_follow_the_measured_compute_and_say_the_ratio_set():
    half, twice = dg.data_costs(0.48, 8)              # 480 ms of compute for 8 samples: 60 ms per sample
    assert (half["cost_ms"], twice["cost_ms"]) == (30.0, 120.0)
    assert twice["ratio"] == pytest.approx(2.0) and half["ratio"] == pytest.approx(0.5) and not twice["capped"]
    # two significant digits: the ratio set is what the rounded cost gives, said as it is
    odd = dg.data_costs(0.4762, 8)[1]
    assert odd["cost_ms"] == 120.0 and odd["ratio"] == pytest.approx(120 * 8 / 476.2)


def test_data_costs_are_capped_only_for_time_and_keep_their_levels_apart():
    # 6 updates of 8 samples may spend 2 s on data: at most 41.7 ms per sample; both costs shrink alike
    half, twice = dg.data_costs(0.48, 8, updates=6, budget_s=2.0)
    assert half["capped"] and twice["capped"] and twice["cost_ms"] == pytest.approx(2000 / 48, rel=0.05)
    assert twice["cost_ms"] / half["cost_ms"] == pytest.approx(4, rel=0.1) and twice["ratio"] < 1  # 2 digits each
    assert not dg.data_costs(0.48, 8, updates=6, budget_s=6.0)[1]["capped"]   # 120 ms x 48 = 5.76 s fits
    with pytest.raises(ValueError, match="compute_s"):
        dg.data_costs(0.0, 8)
    with pytest.raises(ValueError, match="samples_per_update"):
        dg.data_costs(0.5, 0)


@pytest.mark.parametrize("base, other, verdict", [
    ([470, 480, 490], [500, 510, 520], "same"),          # +6 %: within the 15 % floor
    ([470, 480, 490], [1050, 1080, 1100], "slower"),      # the review's case: 476 -> ~1080 ms
    ([470, 480, 490], [300, 310, 320], "faster"),
    ([300, 480, 700], [600, 650, 700], "unclear"),        # +35 %, inside a ±42 % scatter: cannot tell
])
def test_compute_change_judges_against_the_measured_spread(base, other, verdict):
    cc = dg.compute_change(_timed_run(base), _timed_run(other))
    assert cc["verdict"] == verdict, cc
    assert cc["spread"] >= dg.SAME_COMPUTE and cc["base_ms"] == pytest.approx(statistics.median(base))


def _reading(base_ms, heavy_ms, wait_ms, **kw):
    base = _timed_run(base_ms)
    heavy = _timed_run(heavy_ms, wait_ms=wait_ms, **kw)
    return dg.data_cost_reading(base, heavy, 2.0)


def test_the_reading_claims_unchanged_matmuls_only_when_compute_stayed():
    # chapter 01's cell picks its sentence by r["compute"]: "same" only when compute stayed put
    assert _reading([470, 480, 490], [480, 490, 500], wait_ms=960)["compute"] == "same"
    # the review's case: MFU 9.8 % -> 2.3 % with a 35 % wait and compute 476 -> ~1080 ms
    slow = _reading([470, 476, 490], [1070, 1080, 1090], wait_ms=600)
    assert slow["compute"] == "slower" and slow["fell"]
    assert slow["compute_ms"] == pytest.approx(1080) and slow["base_compute_ms"] == pytest.approx(476)
    assert _reading([470, 480, 490], [300, 310, 320], wait_ms=960)["compute"] == "faster"
    assert _reading([300, 480, 700], [600, 650, 700], wait_ms=960)["compute"] == "unclear"


def test_the_reading_figures_are_the_runs_figures():
    base, heavy = _timed_run([470, 480, 490]), _timed_run([480, 490, 500], wait_ms=960)
    r = dg.data_cost_reading(base, heavy, 2.0)
    mb, mh = base["summary"]["mfu"], heavy["summary"]["mfu"]
    assert r["metric"] == "mfu" and (r["base"], r["heavy"]) == (mb, mh) and r["change"] == pytest.approx(mh / mb)
    assert r["wait_frac"] == heavy["summary"]["data_wait_frac"]
    # waiting alone: the baseline's update (500 ms) plus 960 ms of wait, at the same FLOPs per update
    assert r["wait_only"] == pytest.approx(mb * 500 / 1460)
    assert not r["drifted"]  # 960 ms of wait against 480 ms of compute: the 2.0x set is what was measured
    assert dg.data_cost_reading(base, _timed_run([1070, 1080, 1090], wait_ms=600, workers=2), 2.0)["workers"] == 2
    short = dg.data_cost_reading(base, _timed_run([480, 490, 500], wait_ms=500), 2.0)
    assert short["drifted"] and short["got"] == pytest.approx(500 / 480)
    no_peak = dict(heavy, summary={**heavy["summary"], "mfu": None})
    assert dg.data_cost_reading(base, no_peak, 2.0)["metric"] == "tokens_per_s"
    with pytest.raises(ValueError, match="ratio_set"):
        dg.data_cost_reading(base, heavy, 0.0)


def test_data_cost_rows_hold_each_runs_breakdown():
    rows = dg.data_cost_rows({"baseline": _timed_run([480]), "120 ms/sample": _timed_run([960], wait_ms=960, cost=120.0)})
    assert [r["label"] for r in rows] == ["baseline", "120 ms/sample"]
    assert rows[1]["compute_vs_baseline"] == pytest.approx(2.0) and rows[1]["wait_per_compute"] == pytest.approx(1.0)
    assert rows[1]["data_cost_ms"] == 120.0 and rows[0]["data_wait_ms"] == 0.0
    fig = dg.plot_data_cost(rows)
    assert len(fig.axes) == 2  # the bars and MFU's own axis


# ================================================================================================
# 05 -- loader_reading
# ================================================================================================

def _recs(loads_ms, computes_ms, opt_ms=10.0):
    return profiling._recs(loads_ms, computes_ms, opt_ms)


def _loader_runs(workers=0, B=4):
    """Two runs of 0 workers, each a warm-up update and four timed ones (the warm-up is slower)."""
    runs = []
    for loads, comps in (([100, 104, 96, 101], [60, 62, 58, 61]), ([99, 103, 97, 100], [59, 63, 60, 61])):
        recs = _recs([400] + loads, [300] + comps)
        runs.append({"summary": {"workers": workers, "micro_batch": B, "timed_updates": 4,
                                 "step_time_s": statistics.median(r["step_time_s"] for r in recs[1:])},
                     "records": recs})
    return runs


def mean_reader(records):
    load = 1e3 * sum(r["data_wait_s"] for r in records) / len(records)
    compute = 1e3 * sum(r["step_time_s"] - r["data_wait_s"] for r in records) / len(records)
    return {"load_ms": load, "compute_ms": compute, "workers": float(math.ceil(load / compute))}


def knee_reader(records):
    from labkit.tools.timing import fewest_workers

    load, compute, _ = sol.read_loader(records)
    return [load, compute, fewest_workers(load, 1, compute)]


# ---- right answers ---------------------------------------------------------------------------------

def test_the_reference_reading_passes():
    res = passes("loader_reading", sol.read_loader, _loader_runs())
    assert "labkit reads" in res.message
    passes("loader_reading", sol.read_loader)  # the test records alone


@pytest.mark.parametrize("reader", [mean_reader, knee_reader], ids=["mean-dict", "knee-list"])
def test_other_estimators_and_forms_pass(reader):
    passes("loader_reading", reader, _loader_runs())


def test_numbers_read_by_hand_pass_within_the_spread():
    ref = tools_timing.loader_reading(_loader_runs())
    assert ref["updates"] == 8 and ref["load_ms"] == pytest.approx(100.0) and ref["compute_ms"] == pytest.approx(70.5)
    passes("loader_reading", (ref["load_ms"], ref["compute_ms"], ref["workers"]), _loader_runs())
    passes("loader_reading", {"load": 102.0, "compute": 69.0, "workers": 2}, _loader_runs())
    # a reading that kept the slow warm-up update: the mean moves, but stays within the spread here
    everything = [r for run in _loader_runs() for r in run["records"]]
    load = 1e3 * statistics.median(r["data_wait_s"] for r in everything)
    passes("loader_reading", (load, 70.0, 2), _loader_runs())


def test_a_real_result_and_a_list_of_them_are_read():
    cfg = lk.Config(model="tiny", steps=5)
    res = [Result(cfg, r["summary"], r["records"]) for r in _loader_runs()]
    passes("loader_reading", sol.read_loader, res)
    passes("loader_reading", sol.read_loader, res[0])


# ---- wrong answers ---------------------------------------------------------------------------------

def _reader(load, compute, workers):
    def read(records):
        return load(records), compute(records), workers(load(records), compute(records))
    return read


def med(key, scale=1e3):
    return lambda recs: scale * statistics.median(r[key] for r in recs)


def busy(recs):
    return 1e3 * statistics.median(r["step_time_s"] - r["data_wait_s"] for r in recs)


def ceil(load, compute):
    return math.ceil(load / compute)


@pytest.mark.parametrize("read, words", [
    (_reader(med("step_time_s"), busy, ceil), ("whole update",)),                         # load = the update
    (_reader(lambda rs: 1e3 * sum(r["data_wait_s"] for r in rs), busy, ceil), ("total",)),
    (_reader(lambda rs: med("data_wait_s")(rs) / 4, busy, ceil), ("load time per batch",)),  # per sample
    (_reader(med("data_wait_s", 1), lambda rs: busy(rs) / 1e3, ceil), ("seconds",)),
    (_reader(lambda rs: 1e3 * statistics.mean(r["data_wait_s"] for r in rs[1:]), busy, ceil), ("warm-up",)),
    (_reader(med("data_wait_s"), med("compute_s"), ceil), ("compute_s alone",)),          # optimizer forgotten
    (_reader(med("data_wait_s"), med("step_time_s"), ceil), ("includes the waiting",)),
    (_reader(med("data_wait_s"), busy, lambda l, c: math.floor(l / c)), ("round up",)),
    (_reader(med("data_wait_s"), busy, lambda l, c: round(l / c)), ("round up",)),
    (_reader(med("data_wait_s"), busy, lambda l, c: l / c), ("whole process",)),
    (_reader(med("data_wait_s"), busy, lambda l, c: math.ceil(c / l)), ("compute / load",)),
    (_reader(med("data_wait_s"), busy, lambda l, c: 0), ("0 workers",)),
    (_reader(med("data_wait_s"), busy, lambda l, c: math.ceil(l / c) + 1), ("more than needed",)),
    (_reader(med("data_wait_s"), busy, lambda l, c: 2), ()),                              # one number for all
])
def test_wrong_readings_fail_on_the_test_records(read, words):
    fails("loader_reading", read, _loader_runs(), words=words)
    fails("loader_reading", read, words=words)  # without runs too


@pytest.mark.parametrize("answer, words", [
    ((100.0 / 4, 70.5, 2), ("per sample",)),
    ((0.1, 70.5, 2), ("seconds",)),
    ((100.0, 0.0705, 2), ("seconds",)),
    ((100.0, 171.0, 1), ("whole update",)),
    ((200.0, 70.5, 3), ("data_wait_s",)),
    ((100.0, 70.5, 1), ("round up",)),
    ((100.0, 70.5, 3), ("more than needed",)),
    ((100.0, 70.5), ("three values",)),
    ({"load_ms": 100.0, "compute_ms": 70.5}, ("workers",)),
    (("100", 70.5, 2), ("str",)),
])
def test_wrong_numbers_fail_against_the_runs(answer, words):
    fails("loader_reading", answer, _loader_runs(), words=words)


def test_runs_with_workers_or_without_runs_fail():
    fails("loader_reading", sol.read_loader, _loader_runs(workers=2), words=("0 loader workers",))
    fails("loader_reading", (100.0, 70.5, 2), words=("pass the runs",))
    fails("loader_reading", sol.read_loader, "runs", words=("runs are",))


def test_a_function_that_returns_nothing_is_not_attempted_and_one_that_raises_fails():
    def unwritten(records):
        ...

    res = check("loader_reading", unwritten, _loader_runs())
    assert not res.attempted
    fails("loader_reading", lambda recs: recs[0]["no_such_key"], _loader_runs(), words=("KeyError",))


# ================================================================================================
# real runs: read alike (never judged on their speed)
# ================================================================================================

def test_real_runs_are_read_and_wrong_kinds_of_change_fail():
    base = lk.Config(**{**SUSPECT, "steps": 3})
    sus = lk.run(base)
    res = check("low_mfu_fix", lk.run(base.replace(optimizer="sgd")), sus)
    assert res.attempted and not res.passed and "training algorithm" in res.message
    res = check("low_mfu_fix", lk.run(sol.fixed_config(base)), sus)
    assert res.attempted  # right kind of change: it passes, or fails only because the runs did not show it
    assert res.passed or "do not show" in res.message, res.message


def test_a_real_zero_worker_run_is_read_by_the_reference():
    run = lk.run(lk.Config(model="tiny", steps=4, data_cost_ms=0.5, workers=0, threads=1))
    passes("loader_reading", sol.read_loader, run)
    ref = tools_timing.loader_reading(run)
    assert ref["updates"] == 3 and ref["load_ms"] > 0 and ref["compute_ms"] > 0


# ---- the hints in Russian (issue #51) ------------------------------------------------------------------------


@pytest.mark.parametrize("changes", [dict(accum=1), dict(workers=2), dict(d_model=128), dict(seq_len=128),
                                     dict(attention="math"), dict(micro_batch=8, accum=1, optimizer="sgd")],
                         ids=str)
def test_low_mfu_fix_says_its_typical_mistakes_in_russian(changes, speaks_russian):
    """The typical wrong answer (accum alone, templates/wrong-answers.md) and other kinds of change: a Russian
    hint, no English fallback."""
    res = lk.check.low_mfu_fix(fix(**changes), suspect)
    assert res.attempted and not res.passed, res
    assert re.search("[а-яё]", res.message) and "Warning" not in res.message, res.message
    assert not ENGLISH_RUN.search(res.message), res.message


def test_the_loader_reading_says_its_verdict_on_runs_in_russian(speaks_russian):
    res = lk.check.loader_reading((100.0, 60.0, 1), _loader_runs())
    assert res.attempted and not res.passed, res
    assert re.search("[а-яё]", res.message) and not ENGLISH_RUN.search(res.message), res.message
