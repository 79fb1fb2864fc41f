"""Honest numbers: verdicts from interleaved repeats, a bounded and cached peak probe, MFU never above
100 % unflagged. No timing assertions: clocks are faked where time matters."""
from __future__ import annotations

import json
import random

import pytest

import labkit as lk
from labkit.tools import compare
from labkit.engine import device
from labkit.tools.compare import verdict


def _noisy(center, n, spread=0.02, seed=0):
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


# --- the verdict ----------------------------------------------------------------------------------

def test_a_clear_difference_gives_its_direction_and_the_better_arm():
    c = verdict(_noisy(100, 8), _noisy(150, 8, seed=1), "tokens_per_s")
    assert c.verdict == "higher" and c.better == "b"
    assert c.low > 1 and c.ratio == pytest.approx(1.5, rel=0.05)
    assert "% more** tokens per second" in c.sentence and "**b** is better here" in c.sentence
    # the same data as times: higher is worse
    t = verdict(_noisy(1.0, 8), _noisy(1.5, 8, seed=1), "step_time_s")
    assert t.verdict == "higher" and t.better == "a"
    lower = verdict(_noisy(1.0, 8), _noisy(0.6, 8, seed=1), "cpu_s_per_update")
    assert lower.verdict == "lower" and lower.better == "b"
    # counted words take "fewer", amounts "less"
    assert "% fewer** tokens per second" in verdict(_noisy(150, 8), _noisy(100, 8, seed=1)).sentence
    assert "% less** wall time per update" in verdict(_noisy(1.5, 8), _noisy(1.0, 8, seed=1), "step_time_s").sentence


def test_overlapping_samples_give_same():
    a = _noisy(100, 10, spread=0.3, seed=2)
    b = _noisy(103, 10, spread=0.3, seed=3)
    c = verdict(a, b)
    assert c.verdict == "same" and c.better is None
    assert "no difference measurable" in c.sentence


def test_too_few_repeats_never_give_a_direction():
    # fewer than 4 runs per arm: no exact 95 % interval exists, so no verdict however far apart the arms are
    for n in (1, 2, 3):
        c = verdict(_noisy(100, n), _noisy(200, n, seed=1), min_repeats=5)
        assert c.verdict == "same" and c.better is None and not c.decided
        assert "no verdict" in c.sentence
    # 4 runs per arm whose exact interval straddles the threshold band: still no verdict
    c = verdict([100, 110, 90, 100], [104, 95, 112, 108], min_repeats=5)
    assert not c.decided and c.better is None and "no verdict" in c.sentence
    assert verdict(_noisy(100, 5), _noisy(200, 5, seed=1), min_repeats=5).verdict == "higher"


def test_a_small_but_certain_difference_is_below_the_practical_threshold():
    a, b = [100.0 + 0.01 * i for i in range(10)], [102.0 + 0.01 * i for i in range(10)]
    c = verdict(a, b, threshold=0.05)
    assert c.low > 1 and c.verdict == "same"  # the interval excludes 1, but 2 % < 5 %
    assert verdict(a, b, threshold=0.01).verdict == "higher"


def test_interval_is_deterministic_and_contains_the_ratio():
    a, b = _noisy(10, 7, 0.2), _noisy(12, 7, 0.2, seed=9)
    r1, r2 = compare.ratio_interval(a, b), compare.ratio_interval(a, b)
    assert r1 == r2 and r1[1] <= r1[0] <= r1[2]


def test_busy_machine_is_said_in_the_sentence():
    c = verdict(_noisy(1, 6), _noisy(1, 6, seed=1), busy=True, load={"other_cores": 1.3})
    assert "busy" in c.sentence and "1.3 cores" in c.sentence


def test_unknown_metric_is_a_config_error():
    with pytest.raises(lk.ConfigError, match="metric"):
        verdict([1.0], [1.0], "allreduce_calls")


# --- compare_configs: order, budget, threads ----------------------------------------------------

class _FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _fake_runner(clock, values, order, step_s=1.0):
    def run_fn(cfg):
        arm = "b" if cfg.accum == 2 else "a"
        order.append(arm)
        clock.t += step_s
        v = values[arm]() if callable(values[arm]) else values[arm]
        return lk.Result(cfg, {"tokens_per_s": v, "device": "cpu", "activation_bytes": 10 if arm == "a" else 20})
    return run_fn


@pytest.fixture
def clock(monkeypatch):
    c = _FakeClock()
    monkeypatch.setattr(compare.time, "perf_counter", c)
    monkeypatch.setattr(compare, "machine_load", lambda: {"busy": False, "other_cores": 0.0})
    return c


def test_runs_are_interleaved_and_the_warm_up_pair_is_discarded(clock):
    rng = random.Random(0)
    order = []
    a = lk.Config(model="tiny", steps=2)
    run_fn = _fake_runner(clock, {"a": lambda: rng.gauss(100, 20), "b": lambda: rng.gauss(100, 20)}, order)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=12, run_fn=run_fn, progress=False)
    assert order[:6] == ["a", "b", "a", "b", "a", "b"]
    assert all(order[i] != order[i + 1] for i in range(0, len(order) - 1, 2))
    assert len(c.samples_a) == len(c.samples_b) == len(order) // 2 - 1  # first pair = warm-up
    assert c.exact["activation_bytes"] == (10, 20)
    assert clock.t <= 12 + 2  # never starts a pair it cannot finish within the budget


def test_budget_too_short_for_min_repeats_gives_no_direction(clock):
    order = []
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=5, min_repeats=5, progress=False,
                           run_fn=_fake_runner(clock, {"a": 100.0, "b": 300.0}, order))
    assert len(c.samples_a) < 5 and c.verdict == "same" and "no verdict" in c.sentence


def test_early_stop_only_when_the_interval_is_narrow(clock):
    order = []
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=1000, min_repeats=5, progress=False,
                           run_fn=_fake_runner(clock, {"a": 100.0, "b": 130.0}, order))
    # constant samples: the exact interval (1.3, 1.3) settles it at 4 pairs, before min_repeats
    assert len(c.samples_a) == 4 and c.verdict == "higher" and c.decided and c.early
    rng = random.Random(1)
    order.clear()
    wide = lk.compare_configs(a, a.replace(accum=2), budget_s=40, min_repeats=5, progress=False,
                              run_fn=_fake_runner(clock, {"a": lambda: rng.uniform(50, 150),
                                                          "b": lambda: rng.uniform(50, 150)}, order))
    assert len(wide.samples_a) > 5  # noisy: it kept going until the budget


def test_both_arms_run_with_one_thread_count_on_a_cpu(clock):
    seen = []

    def run_fn(cfg):
        seen.append((cfg.workers, cfg.threads))
        clock.t += 1
        return lk.Result(cfg, {"tokens_per_s": 1.0})

    a = lk.Config(model="tiny", steps=2)
    b = a.replace(workers=1)
    c = lk.compare_configs(a, b, budget_s=6, run_fn=run_fn, progress=False)
    assert {t for _, t in seen} == {c.threads} and c.threads is not None
    assert c.threads == min(lk.engine.train.threads_for(x, "cpu", 1) for x in (a, b))


def test_real_runs_compare_exact_quantities_exactly():
    a = lk.Config(model="tiny", steps=2, warmup=1)
    c = lk.compare_configs(a, a.replace(checkpointing="full"), metric="cpu_s_per_update", budget_s=4,
                           min_repeats=2, progress=False)
    acts_a, acts_b = c.exact["activation_bytes"]
    assert acts_b < acts_a
    flops_a, flops_b = c.exact["hardware_flops_per_step"]
    assert flops_b > flops_a
    assert all(s > 0 for s in c.samples_a + c.samples_b)


# --- the peak probe: bounded, cached, a ceiling ----------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    # These tests are about the cache, not the load: a probe under load is never cached (tested apart)
    monkeypatch.setattr(device, "contended", lambda reading, threads: False)
    device._MEASURED.clear()
    yield tmp_path / "peak_flops.json"
    device._MEASURED.clear()


def test_probe_respects_its_budget_with_a_slow_clock(cache, monkeypatch):
    t = {"now": 0.0}

    def slow_clock():
        t["now"] += 0.4  # every look at the clock costs 0.4 s: an emulated format
        return t["now"]

    monkeypatch.setattr(device.time, "perf_counter", slow_clock)
    out = device.probe_matmul("cpu", "bf16", budget_s=3.0)
    assert out["seconds"] <= 3.0 + 2 * 0.4 * 3  # stops at the first look past the deadline
    assert out["n"] == 64  # never grew: one call already "took" 0.4 s


def test_probe_result_is_cached_and_reused(cache, monkeypatch):
    caps = device.capabilities("cpu")
    value, entry = device.measured_peak(caps, "fp32", budget_s=0.5)
    assert value > 0 and cache.exists()
    device._MEASURED.clear()  # a new process: only the disk cache remains
    monkeypatch.setattr(device, "probe_matmul", lambda *a, **k: pytest.fail("probed again"))
    again, _ = device.measured_peak(caps, "fp32")
    assert again == value


def test_cache_key_changes_with_what_decides_the_speed(monkeypatch):
    caps = device.capabilities("cpu")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # CI runs this under the AVX2 limit too
    base = device.peak_cache_key(caps, 2)
    assert device.peak_cache_key(caps, 1) != base
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert device.peak_cache_key(caps, 2) != base
    assert caps.name in base and "torch=" in base


def test_the_cache_keeps_the_highest_peak(cache, monkeypatch):
    caps = device.capabilities("cpu")
    probes = iter([{"flops": 5e9, "n": 256, "timed_calls": 6, "seconds": 0.1},
                   {"flops": 2e9, "n": 256, "timed_calls": 6, "seconds": 0.1},
                   {"flops": 9e9, "n": 512, "timed_calls": 6, "seconds": 0.1}])
    monkeypatch.setattr(device, "probe_matmul", lambda *a, **k: next(probes))
    assert device.measured_peak(caps, "bf16")[0] == 5e9
    assert device.measured_peak(caps, "bf16", remeasure=True)[0] == 5e9  # a slower probe never lowers it
    assert device.measured_peak(caps, "bf16", remeasure=True)[0] == 9e9
    stored = json.loads(cache.read_text())
    (entry,) = [v["bf16"] for v in stored.values()]
    assert entry["flops"] == 9e9 and entry["probes"] == 3


@pytest.mark.parametrize("content", ["[]", "null", "{not json", '{"k": 5}'])
def test_a_damaged_cache_is_probed_again(cache, monkeypatch, content):
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(content)
    caps = device.capabilities("cpu")
    monkeypatch.setattr(device, "probe_matmul", lambda *a, **k: {"flops": 3e9, "n": 64, "timed_calls": 3, "seconds": 0})
    assert device.measured_peak(caps, "fp32")[0] == 3e9


def test_env_report_says_fast_formats_from_measurements(cache, monkeypatch):
    flops = {"fp32": 100e9, "fp16": 2e9, "bf16": 500e9}
    monkeypatch.setattr(device, "probe_matmul",
                        lambda kind, precision, *a, **k: {"flops": flops[precision], "n": 64, "timed_calls": 3,
                                                          "seconds": 0})
    rep = device.env_report("cpu")
    assert rep["fast_formats"] == ["bf16"]  # fp16 is supported, and emulated: not fast
    assert set(rep["peak_flops"]) == {"fp32", "fp16", "bf16"}
    assert device.slowdown(device.capabilities("cpu"), "fp16") == pytest.approx(50)


def test_a_ddp_rank_reads_the_peak_its_parent_probed(cache, monkeypatch):
    calls = []
    real = device.probe_matmul

    def counting(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(device, "probe_matmul", counting)
    r = lk.run(lk.Config(model="tiny", steps=2, world_size=2))
    assert len(calls) == 1  # the parent probed once ...
    stored = json.loads(cache.read_text())
    assert [e["probes"] for v in stored.values() for e in v.values()] == [1]  # ... and no rank probed again
    assert r.summary["peak_flops_source"].startswith("measured")


# --- MFU above the ceiling is never silent --------------------------------------------------------

def test_mfu_above_100_percent_is_flagged(monkeypatch, capsys):
    monkeypatch.setattr(lk.engine.train, "peak_flops", lambda caps, precision, threads=None: (1e3, "measured: fake tiny peak"))
    r = lk.run(lk.Config(model="tiny", steps=2))
    assert r.summary["mfu"] > 1
    assert r.summary["mfu_note"] and "above 100 %" in r.summary["mfu_note"]
    from labkit.__main__ import table

    assert "above 100 %" in table(r.summary)


def test_mfu_within_the_peak_has_no_note():
    assert lk.engine.measure.mfu_note(0.4, "measured: x") is None
    assert lk.engine.measure.mfu_note(None, "measured: x") is None
    assert "datasheet" in lk.engine.measure.mfu_note(1.2, "NVIDIA H100 datasheet")
