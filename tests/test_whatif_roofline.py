"""labkit.whatif (lk.predict): the roofline charged per op, deep models at a cost that does not grow
with depth, probes measured under load, the per-op overhead term, and every argument checked before work.
No timing assertions: load is simulated, never relied on."""
import math
import re

import pytest

import labkit as lk
from labkit.engine import device
from labkit import whatif as pr
from labkit.whatif import devices, probes, report, roofline, trace  # noqa: F401 (the code's home)
from labkit.engine.config import ConfigError

E_NOTATION = re.compile(r"\d[eE][+-]?\d")


# ---- item 9: one roofline per op, summed -------------------------------------------------------------

def test_a_memory_bound_op_does_not_hide_behind_a_compute_bound_one():
    dev = {"peak_flops": {"fp32": 1e12}, "bandwidth": 1e11}
    # a matmul: 4 GFLOP at 1 TFLOP/s = 4 ms of arithmetic, its 1 MB = 0.01 ms of bytes: compute-bound
    # a softmax: no FLOPs, 100 MB at 100 GB/s = 1 ms: memory-bound
    # per op: 4 + 1 = 5 ms. The old per-group max(4 GFLOP / peak, 101 MB / bandwidth) said 4 ms.
    ops = [{"count": 1, "flops": 4e9, "fmt": "fp32", "bytes": 1e6}, {"count": 1, "flops": 0, "fmt": None, "bytes": 1e8}]
    g = roofline._group_cost(ops, dev, "fp32", 1.0, 1.0, 0.0)
    assert g.time_s == pytest.approx(5e-3)
    assert g.compute_s == pytest.approx(4e-3) and g.memory_s == pytest.approx(1e-3) and g.bound == "compute"
    old_group_max = max(4e9 / 1e12, (1e6 + 1e8) / 1e11)
    assert g.time_s > old_group_max * 1.2


def _by_hand(trace, group, dev, precision, fraction, bw_fraction, overhead):
    """A group's time from the trace's op kinds, computed here without _group_cost."""
    total = n_ops = 0
    for r in trace.kinds:
        if r["group"] != group or r["phase"] not in ("forward", "backward"):
            continue
        peak = dev["peak_flops"].get(r["fmt"]) or dev["peak_flops"]["fp32"]
        compute = r["flops"] / (peak * fraction)
        memory = r["bytes"] / r["count"] / (dev["bandwidth"] * bw_fraction)
        total += r["count"] * max(compute, memory)
        n_ops += r["count"]
    return total + n_ops * overhead


def test_predicted_groups_are_sums_of_their_ops_on_a_gpu():
    # math attention in fp32 on a T4: the T x T products are compute-bound, the softmax over them is not
    cfg = lk.Config(model="base", attention="math", micro_batch=1)
    p = pr.predict(cfg, "t4")
    dev, trace = devices._catalogue_device("t4"), pr.trace_step(cfg, foreach=True)
    fr = dev["fractions"]
    for group, fraction in (("attention", fr["attention_fraction"]), ("matmul", fr["matmul_fraction"])):
        want = _by_hand(trace, group, dev, "fp32", fraction, fr["bandwidth_fraction"], dev["op_overhead_s"])
        assert p.groups[group].time_s == pytest.approx(want, rel=1e-9), group
    att = p.groups["attention"]
    assert att.compute_s > 0 and att.memory_s > 0  # a mixed group
    assert att.time_s == pytest.approx(att.compute_s + att.memory_s + att.overhead_s)
    # the old model: the group's summed FLOPs against its summed bytes, one max for the whole group
    flops = sum(trace.micro["attention"]["flops"].values())
    old = max(flops / (dev["peak_flops"]["fp32"] * fr["attention_fraction"]),
              trace.micro["attention"]["bytes"] / (dev["bandwidth"] * fr["bandwidth_fraction"])) + att.overhead_s
    assert att.time_s > old * 1.05


# ---- deep models: summed from small traces, exactly --------------------------------------------------

@pytest.mark.parametrize("kw, foreach", [
    (dict(n_layer=5), False),
    (dict(n_layer=5, checkpointing="full", checkpoint_every=2), True),
    (dict(n_layer=4, checkpointing="attention", checkpoint_every=3, precision="bf16"), False),
    (dict(n_layer=3, checkpointing="selective", optimizer="sgd"), True),
    (dict(n_layer=3, checkpointing="full", attention="math", grad_clip=None), True),
])
def test_a_deep_trace_is_summed_from_small_ones_exactly(kw, foreach, monkeypatch):
    cfg = lk.Config(model="tiny", micro_batch=2, **kw)
    spec = trace._spec_for(cfg)
    choices = (cfg.micro_batch, cfg.precision, cfg.checkpointing, cfg.checkpoint_every, cfg.attention,
               cfg.optimizer, bool(cfg.grad_clip), foreach)
    exact = trace._trace(spec, *choices)
    depths = []
    real = trace._trace

    def small_only(spec_, *rest):
        depths.append(spec_.n_layer)
        return real(spec_, *rest)

    monkeypatch.setattr(trace, "_trace", small_only)
    trace._folded.cache_clear()
    folded = trace._folded(spec, *choices)
    assert depths and max(depths) <= 2  # never fell back to tracing every block
    assert folded == exact  # every op kind, every byte count, the parameter sizes


def test_a_deep_prediction_traces_at_most_two_blocks(monkeypatch):
    depths = []
    real = trace._trace
    monkeypatch.setattr(trace, "_trace", lambda spec, *rest: depths.append(spec.n_layer) or real(spec, *rest))
    trace._folded.cache_clear()
    # the largest configuration Config allows: once 160 s for one prediction
    cfg = lk.Config(model="large", n_layer=256, d_model=4096, n_head=32, micro_batch=65536, seq_len=65536,
                    accum=4096, world_size=4096, checkpointing="full", checkpoint_every=3)
    p = pr.predict(cfg, "h100-sxm")
    assert depths and max(depths) <= 2
    assert math.isfinite(p.step_time_s) and p.step_time_s > 0 and not p.fits
    from labkit.engine.measure import count_flops
    small = lk.Config(model="small", n_layer=5)
    assert roofline._model_flops(trace._spec_for(small)) == count_flops(trace._spec_for(small))
    for text in (p.table(), repr(p)):
        assert not E_NOTATION.search(text), text  # contract 5: plain digits, however large


# ---- issue 24 item 2: probes measured under load -----------------------------------------------------

# fresh_probes: tests/conftest.py


def test_a_probe_under_load_is_not_cached_and_the_prediction_says_so(fresh_probes, monkeypatch):
    tmp_path, state = fresh_probes
    cfg = lk.Config(model="tiny", threads=1)
    p = pr.predict(cfg, "this")
    assert p.caveat and "\n" not in p.caveat and "under load" in p.caveat and "leans slow" in p.caveat
    assert not E_NOTATION.search(p.caveat)
    for what in ("memory bandwidth", "per-op overhead", "fp32 matmul peak", "matmul shape timings",
                 "element-wise op timings"):
        assert what in p.caveat, what
    assert "Caveat" in p.table()
    cache = tmp_path / "roofline_probe.json"
    assert not cache.exists() or "bytes_per_s" not in cache.read_text()  # nothing measured under load is kept
    entry = pr.this_probes(1)
    assert entry["quiet"] is False and entry["curve"]
    # the machine quietens: the next prediction measures again (once due), caches, and has no caveat
    state["busy"] = False
    monkeypatch.setattr(probes, "PROBE_RETRY_S", 0.0)
    q = pr.predict(cfg, "this")
    assert q.caveat is None, q.caveat
    text = cache.read_text()
    assert '"quiet": true' in text and "shape_rates" in text and "peaks_checked" in text and "op_times" in text
    # a new process reads the quiet figures from the cache: no probe, no caveat
    monkeypatch.setattr(probes, "_PROBED", {})
    monkeypatch.setattr(probes, "probe_bandwidth", lambda *a, **k: pytest.fail("measured again"))
    assert pr.predict(cfg, "this").caveat is None


def test_a_probe_under_load_is_not_repeated_at_every_prediction(fresh_probes, monkeypatch):
    _, state = fresh_probes
    calls = []
    real = pr.probe_bandwidth
    monkeypatch.setattr(probes, "probe_bandwidth", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = lk.Config(model="tiny", threads=1)
    pr.predict(cfg, "this")
    pr.predict(cfg, "this")
    assert len(calls) == 1  # within PROBE_RETRY_S: the figures measured under load are used, with the caveat
    assert pr.predict(cfg, "this").caveat


def test_an_old_cache_entry_is_checked_once(fresh_probes, monkeypatch):
    """A cache written before the load check (no "quiet" mark) may hold a probe measured under load: it
    is measured again, and the better of the two figures kept."""
    tmp_path, state = fresh_probes
    state["busy"] = False
    key = probes._probe_key(1)
    poisoned = {"bytes_per_s": 1.0, "curve": [[12 * n, 1.0] for n in probes.BANDWIDTH_SIZES], "op_overhead_s": 1.0,
                "sample_overhead_s": 1.0, "probes": 1}
    probes._write_probe(key, poisoned)
    entry = pr.this_probes(1)
    assert entry["quiet"] is True and entry["probes"] == 2
    assert entry["bytes_per_s"] > 1.0 and entry["op_overhead_s"] < 1.0


def test_repeats_that_disagree_count_as_load(fresh_probes, monkeypatch):
    _, state = fresh_probes
    state["busy"] = False
    monkeypatch.setattr(probes, "SPREAD_LIMIT", 0.5)  # every probe's median step is above half its fastest
    entry = pr.this_probes(1)
    assert entry["quiet"] is False
    assert "repeats disagreed" in report._caveat({"under_load": {"per-op overhead": None}, "threads": 1})


def test_what_counts_as_contended(monkeypatch):
    from labkit.engine import device
    monkeypatch.setattr(device, "cores", lambda: 2)
    # a 2-thread probe on 2 cores needs both: others using 0.6 of a core already slow every parallel op
    assert device.contended({"other_cores": 0.6, "steal_frac": 0.0}, 2)
    assert not device.contended({"other_cores": 0.2, "steal_frac": 0.0}, 2)
    # a 1-thread probe leaves a core free: one other busy program does not take its core
    assert not device.contended({"other_cores": 1.0, "steal_frac": 0.0}, 1)
    assert device.contended({"other_cores": 1.8, "steal_frac": 0.0}, 1)
    assert device.contended({"other_cores": 0.0, "steal_frac": 0.2}, 1)  # the hypervisor took the time
    assert device.contended({"other_cores": None, "load_avg_1min": 3.0}, 2)  # no /proc/stat: the load average
    assert not device.contended({"other_cores": None, "load_avg_1min": 1.0}, 1)


def test_catalogue_predictions_have_no_caveat():
    assert pr.predict(lk.Config(model="tiny"), "t4").caveat is None
    assert "caveat" in pr.predict(lk.Config(model="tiny"), "t4").to_dict()


# ---- issue 25 item 9: every argument checked before work ---------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(op_overhead_s=-1), "op_overhead_s"), (dict(op_overhead_s=math.nan), "op_overhead_s"),
    (dict(op_overhead_s=math.inf), "op_overhead_s"), (dict(op_overhead_s="4e-6"), "op_overhead_s"),
    (dict(op_overhead_s=True), "op_overhead_s"), (dict(op_overhead_s=5.0), "op_overhead_s"),
    (dict(link_latency_s=-1e-6), "link_latency_s"), (dict(link_latency_s=math.nan), "link_latency_s"),
    (dict(matmul_fraction=math.nan), "matmul_fraction"), (dict(matmul_fraction=0), "matmul_fraction"),
    (dict(attention_fraction=1.5), "attention_fraction"), (dict(bandwidth_fraction=True), "bandwidth_fraction"),
    (dict(bandwidth_fraction=-0.5), "bandwidth_fraction"),
    (dict(world_size=0), "world_size"), (dict(world_size=2.5), "world_size"), (dict(world_size=True), "world_size"),
    (dict(world_size=10**6), "world_size"),
    (dict(precision="bf15"), "precision"), (dict(precision=16), "precision"),
])
def test_bad_overrides_are_refused_before_any_work(kwargs, field, monkeypatch):
    monkeypatch.setattr(report, "trace_step", lambda *a, **k: pytest.fail("traced before checking"))
    monkeypatch.setattr(report, "_resolve_device",
                        lambda *a, **k: pytest.fail("probed before checking"))
    with pytest.raises(ConfigError) as err:
        pr.predict(lk.Config(model="tiny"), "h100-sxm", **kwargs)
    assert err.value.field == field and "not allowed" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("device", [{"name": "h100"}, ["t4"], None, 3, "h100", "this "])
def test_a_bad_device_lists_the_devices(device, monkeypatch):
    monkeypatch.setattr(report, "_resolve_device",
                        lambda *a, **k: pytest.fail("probed before checking"))
    with pytest.raises(ConfigError) as err:
        pr.predict(lk.Config(model="tiny"), device)
    assert err.value.field == "device" and "h100-sxm" in str(err.value) and "this" in str(err.value)
    if device == "h100":
        assert "did you mean" in str(err.value)


def test_predict_refuses_an_unknown_option():
    with pytest.raises(ConfigError, match="did you mean 'matmul_fraction'"):
        lk.predict(lk.Config(model="tiny"), "t4", matmul_fracton=0.5)
    with pytest.raises(ConfigError, match="precision"):
        lk.predict(lk.Config(model="tiny"), "this", precision="tf32")
    assert lk.predict(lk.Config(model="tiny"), "t4", op_overhead_s=0, link_latency_s=0).step_time_s > 0


# ---- issue 34 item 3: the per-update overhead term (Python, autograd, optimizer dispatch) --------------

def test_the_overhead_fit_by_hand():
    # 100 ops in 1.5 ms, 300 ops in 2.5 ms: 1 ms more for 200 more ops = 5 us per op; 1.5 - 0.5 = 1 ms fixed
    fixed, per_op = probes.overhead_fit(100, 1.5e-3, 300, 2.5e-3)
    assert per_op == pytest.approx(5e-6) and fixed == pytest.approx(1e-3)
    # noise tilted the line (the larger update ran faster): no fixed part, the whole step charged per op
    assert probes.overhead_fit(100, 2e-3, 300, 1e-3) == (0.0, pytest.approx(2e-5))
    # a line through below zero (fixed < 0) is noise too
    assert probes.overhead_fit(100, 1e-4, 300, 2.1e-3) == (0.0, pytest.approx(1e-6))


def test_the_overhead_term_by_hand():
    cfg = lk.Config(model="tiny", micro_batch=2)
    p = pr.predict(cfg, "t4", op_overhead_s=1e-5, update_overhead_s=2e-3)
    assert p.groups["overhead"].time_s == pytest.approx(2e-3) and p.groups["overhead"].bound == "overhead"
    n_ops = sum(g.n_ops for g in p.groups.values())
    assert n_ops > 100
    assert p.overhead_s == pytest.approx(2e-3 + n_ops * 1e-5)  # fixed + every op's dispatch
    # the term is in the step: another fixed cost moves the step by exactly the difference
    q = pr.predict(cfg, "t4", op_overhead_s=1e-5, update_overhead_s=5e-3)
    assert q.step_time_s - p.step_time_s == pytest.approx(3e-3)
    assert p.step_time_s == pytest.approx(sum(g.time_s for g in p.groups.values()))
    with pytest.raises(ConfigError, match="update_overhead_s"):
        pr.predict(cfg, "t4", update_overhead_s=-1)
    with pytest.raises(ConfigError, match="update_overhead_s"):
        pr.predict(cfg, "t4", update_overhead_sec=1e-3)  # a typo: did you mean


def test_more_ops_predict_more_overhead():
    base = pr.predict(lk.Config(model="tiny"), "t4")
    assert base.overhead_s > base.groups["overhead"].time_s > 0  # never free: a fixed part and a per-op part
    deeper = pr.predict(lk.Config(model="tiny", n_layer=4), "t4")
    accum = pr.predict(lk.Config(model="tiny", accum=4), "t4")
    for more in (deeper, accum):
        assert sum(g.n_ops for g in more.groups.values()) > sum(g.n_ops for g in base.groups.values())
        assert more.overhead_s > base.overhead_s
    # the fixed part is per update, whatever the model
    assert deeper.groups["overhead"].time_s == accum.groups["overhead"].time_s == base.groups["overhead"].time_s


def test_gpus_use_the_documented_default():
    assert 0 < devices.DEFAULTS["update_overhead_s"] <= 1e-3  # an order of magnitude, documented in devices.py
    source = open(devices.__file__).read()
    assert "update_overhead_s:" in source and "ASSUMPTION" in source  # its provenance, beside the number
    for name in pr.device_names():
        if name == "this":
            continue
        p = pr.predict(lk.Config(model="tiny"), name, precision="fp32" if name != "mi300x" else "bf16")
        assert p.assumptions["update_overhead_s"] == devices.DEFAULTS["update_overhead_s"], name
        assert p.groups["overhead"].time_s == devices.DEFAULTS["update_overhead_s"], name
        assert p.assumptions["overhead_term"].startswith("an assumption"), name


def test_the_breakdown_shows_the_overhead_term():
    p = pr.predict(lk.Config(model="tiny"), "h100-sxm")
    text = p.table()
    row = next(line for line in text.splitlines() if line.startswith("| overhead (fixed, per update) |"))
    assert f"{devices.DEFAULTS['update_overhead_s'] * 1000:,.2f}" in row
    assert "of which overhead ms" in text and "Predicted overhead term" in text and "**Predicted**" in text
    assert f"{p.overhead_s * 1000:,.2f} ms" in text
    assert not E_NOTATION.search(text)


def _fake_overhead_probe(calls, fixed=1e-3, per_op=5e-6):
    def probe(budget_s=0.4):
        calls.append(1)
        return {"op_overhead_s": per_op, "update_overhead_s": fixed, "small_step_s": fixed + 337 * per_op,
                "ops_per_step": [337, 825], "steps": 3, "spread": 1.0, "sample_overhead_s": 1e-5, "seconds": 0.0}
    return probe


def test_the_overhead_probe_is_cached_and_a_damaged_cache_is_measured_again(fresh_probes, monkeypatch):
    tmp_path, state = fresh_probes
    state["busy"] = False
    calls = []
    monkeypatch.setattr(probes, "probe_op_overhead", _fake_overhead_probe(calls))
    dev = probes.this_device(1, "fp32")
    assert dev["update_overhead_s"] == 1e-3 and dev["op_overhead_s"] == 5e-6 and calls == [1]
    cache = tmp_path / "roofline_probe.json"
    assert '"update_overhead_s": 0.001' in cache.read_text()
    monkeypatch.setattr(probes, "_PROBED", {})  # a new process: read from the cache, not probed
    assert probes.this_probes(1)["update_overhead_s"] == 1e-3 and calls == [1]
    cache.write_text('{"threads=1": {"update_overhead_s": 0.0')  # damaged (cut off mid-write)
    monkeypatch.setattr(probes, "_PROBED", {})
    assert probes.this_probes(1)["update_overhead_s"] == 1e-3 and calls == [1, 1]  # measured again, no error
    assert '"update_overhead_s": 0.001' in cache.read_text()  # and the cache is whole again
    key = probes._probe_key(1)
    for bad in ("1 ms", -1.0, None, True):  # an entry whose overhead pair is not a number: measured again
        entry = dict(probes._read_probes()[key], update_overhead_s=bad)
        probes._write_probe(key, entry)
        monkeypatch.setattr(probes, "_PROBED", {})
        assert probes.this_probes(1)["update_overhead_s"] == 1e-3
    assert len(calls) == 6


def test_the_probe_keeps_the_overhead_pair_of_its_faster_run(fresh_probes, monkeypatch):
    _, state = fresh_probes
    state["busy"] = False
    calls = []
    monkeypatch.setattr(probes, "probe_op_overhead", _fake_overhead_probe(calls, fixed=1e-3, per_op=5e-6))
    probes.this_probes(1)
    monkeypatch.setattr(probes, "probe_op_overhead", _fake_overhead_probe(calls, fixed=3e-3, per_op=1e-6))
    entry = probes.this_probes(1, remeasure=True)  # slower small update (3.3 ms vs 2.7): the first pair stays
    assert (entry["update_overhead_s"], entry["op_overhead_s"]) == (1e-3, 5e-6)
