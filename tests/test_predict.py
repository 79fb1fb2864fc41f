"""labkit.whatif (lk.predict): the roofline model's arithmetic (a hand-computed case per group), the device catalogue's
schema and sources, and sane predictions. No timing assertions: nothing here depends on how fast this
machine is."""
import math

import pytest
import torch

import labkit as lk
from labkit import whatif as pr
from labkit.whatif import devices, probes, report, roofline, trace  # noqa: F401 (the code's home)
from labkit.engine.config import ConfigError

DEVICE_KEYS = ("t4", "p100-pcie", "p100-sxm2", "v100-sxm2", "v100-pcie", "l4", "rtx4090", "a100-40gb", "a100-80gb",
               "h100-sxm", "h100-pcie", "h200-sxm", "h200-nvl", "mi300x")
FORMATS = ("bf16", "fp16", "tf32", "fp32")


# ---- the arithmetic, by hand ---------------------------------------------------------------------

def test_roofline_takes_the_slower_of_compute_and_memory():
    # 2 TFLOP at 1 PFLOP/s x 0.5 = 4 s; 1 GB at 1 TB/s = 1 ms -> compute-bound, 4 s
    assert pr.roofline_s(2e12, 1e9, 1e15, 1e12, 0.5, 1.0) == (pytest.approx(4e-3), "compute")
    # 1 GFLOP at 1 PFLOP/s = 1 us; 1 GB at 1 TB/s x 0.5 = 2 ms -> memory-bound, 2 ms
    assert pr.roofline_s(1e9, 1e9, 1e15, 1e12, 1.0, 0.5) == (pytest.approx(2e-3), "memory")
    assert pr.roofline_s(0, 4000, 1e12, 1e9) == (pytest.approx(4e-6), "memory")  # no FLOPs: a copy


def test_matmul_flops_are_six_n_per_token():
    # tiny: 2 blocks of width 64, head 256 x 64. Linear weights N = 2 x 12 x 64^2 + 256 x 64 = 114,688;
    # forward 2N + backward 4N per token, 64 tokens (one sequence)
    trace = pr.trace_step(lk.Config(model="tiny", micro_batch=1))
    assert trace.micro["matmul"]["flops"] == {"fp32": 6 * 114_688 * 64}


def test_attention_flops_by_hand_and_against_the_course_count():
    cfg = lk.Config(model="tiny", micro_batch=1)
    B, H, T, dh, L = 1, 4, 64, 16, 2
    # fused causal kernel: forward 2 bmm (4·B·H·T²·dh) + backward 5 bmm (10·B·H·T²·dh), half of it executed
    fused = pr.trace_step(cfg).micro["attention"]["flops"]["fp32"]
    assert fused == L * (4 + 10) * B * H * T * T * dh // 2
    # math backend: the full T x T, forward 2 + backward 4 bmm -- with the matmuls, measure.count_flops
    from labkit.engine.measure import count_flops

    math_trace = pr.trace_step(lk.Config(model="tiny", micro_batch=1, attention="math"))
    assert math_trace.micro["attention"]["flops"]["fp32"] == L * 12 * B * H * T * T * dh
    total = math_trace.micro["attention"]["flops"]["fp32"] + math_trace.micro["matmul"]["flops"]["fp32"]
    assert total == count_flops(cfg.spec)


def test_elementwise_bytes_are_inputs_plus_outputs_and_views_move_none():
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = trace._Recorder(torch.nn.Module(), seq_len=7)  # no parameters: every storage counts
    with FakeTensorMode(), rec:
        a, b = torch.ones(1000), torch.ones(1000)
        c = a + b           # reads 2 x 4000, writes 4000
        c.add_(a)           # reads c and a, writes c: 12,000 too
        c.view(10, 100)     # a view: no bytes
        a.to(torch.bfloat16)  # reads 4000, writes 2000
    ops = {name: row for (_, _, name), row in rec.op_totals.items()}
    assert ops["add"][:3] == [1, 0, 12_000]
    assert ops["add_"][:3] == [1, 0, 12_000]
    assert ops["view"][:3] == [1, 0, 0]
    assert ops["_to_copy"][2] == 6_000
    assert rec.op_totals[("forward", "elementwise", "add")][0] == 1


def test_ring_allreduce_time_by_hand():
    # 1 GB over 4 devices at 100 GB/s, 5 us per step: 2·3/4 · 1e9/1e11 = 15 ms, plus 2·3 · 5 us
    assert pr.ring_allreduce_s(1e9, 4, 100e9, 5e-6) == pytest.approx(0.015 + 30e-6)
    assert pr.ring_allreduce_s(1e9, 1, 100e9, 5e-6) == 0.0  # one device sends nothing


def test_ddp_buckets_fill_in_reverse_order_first_one_small():
    MiB = 2**20
    # parameters of 1, 2, 3, 4 MiB; reversed: 4 (alone: over the 1 MiB first bucket), then 3+2 (cap 5), then 1
    assert pr.ddp_buckets([1 * MiB, 2 * MiB, 3 * MiB, 4 * MiB], 5 * MiB) == [4 * MiB, 5 * MiB, 1 * MiB]
    assert pr.ddp_buckets([100, 200], 25 * MiB) == [300]


def test_data_time_by_hand():
    # 8 samples x (2 ms + 20 us) in the step without workers
    assert pr.data_time_s(8, 2.0, 0, 20e-6) == pytest.approx(8 * 2.02e-3)
    # 2 workers prepare them beside a 5 ms step: 16.16 / 2 - 5 = 3.08 ms left waiting
    assert pr.data_time_s(8, 2.0, 2, 20e-6, hidden_s=5e-3) == pytest.approx(3.08e-3)
    assert pr.data_time_s(8, 2.0, 2, 20e-6, hidden_s=10e-3) == 0.0


def test_shape_keys_rebuild_each_matmul_and_attention_call():
    """On 'this' every matmul / fused-attention shape is timed alone; its key must rebuild a call doing
    exactly the FLOPs the trace counted for it."""
    trace = pr.trace_step(lk.Config(model="tiny", micro_batch=1))
    mm = trace.micro["matmul"]["shapes"]
    # the forward qkv projection: (64 tokens x 64) @ W.t() (64 x 192, a Linear's weight stored transposed) + bias
    assert mm["addmm|64|64|192|fp32|nt"] == [2, 2 * 2 * 64 * 64 * 192]
    att = trace.micro["attention"]["shapes"]
    assert "sdpa|1|4|64|16|1|fp32|bthd" in att and "sdpa_bwd|1|4|64|16|1|fp32|bthd" in att
    for key, (calls, flops) in {**mm, **att}.items():
        _, per_call = probes._shape_call(key)
        assert per_call * calls == flops, key
    rates = pr.probe_shapes(["mm|8|8|8|fp32|nn", "sdpa|1|1|8|4|1|fp32|bhtd"], peak_flops=1e9, budget_s=5.0)
    assert set(rates) == {"mm|8|8|8|fp32|nn", "sdpa|1|1|8|4|1|fp32|bhtd"} and all(r > 0 for r in rates.values())


def test_each_timed_shape_call_follows_a_read_of_twice_the_last_level_cache(monkeypatch):
    """In a step a layer's weights come back out of the caches; timed back to back they would not."""
    events, made = [], []

    class Sweep:
        def __init__(self, n):
            made.append(n)

        def sum(self):
            events.append("sweep")

    monkeypatch.setattr(probes, "_last_level_cache_bytes", lambda: 2**20)
    monkeypatch.setattr(probes.torch, "zeros", Sweep)
    monkeypatch.setattr(probes, "_shape_call", lambda key: (lambda: events.append("call"), 1000))
    rates = probes.probe_shapes(["mm|8|8|8|fp32|nn"], peak_flops=1e12, budget_s=5.0)
    assert made == [2 * 2**20 // 4] and set(rates) == {"mm|8|8|8|fp32|nn"}
    assert events == ["call"] + ["sweep", "call"] * 3  # the warm-up, then every timed call after a sweep


def test_a_cached_shape_rate_timed_without_the_sweep_is_timed_again():
    old = {"shape_rates": {"mm|1|1|1|fp32|nn": 1e9}, "bytes_per_s": 4e10}
    assert "shape_rates" not in probes._current(old) and probes._current(old)["bytes_per_s"] == 4e10
    assert "shape_rates" in old  # the cache's own entry is left as it was
    now = {**old, "shape_timing": probes.SHAPE_TIMING}
    assert probes._current(now)["shape_rates"] == old["shape_rates"]


def test_the_last_level_cache_is_read_from_sysfs_or_taken_as_32_mib(monkeypatch, tmp_path):
    for level, size in (("index0", "32K"), ("index2", "1024K"), ("index3", "32768K")):
        (tmp_path / level).mkdir()
        (tmp_path / level / "size").write_text(size + "\n")
    real_glob = probes.glob.glob
    monkeypatch.setattr(probes.glob, "glob", lambda pattern: real_glob(str(tmp_path / "index*" / "size")))
    assert probes._last_level_cache_bytes() == 32 * 2**20
    monkeypatch.setattr(probes.glob, "glob", lambda pattern: [])
    assert probes._last_level_cache_bytes() == 32 * 2**20
    (tmp_path / "index3" / "size").write_text("96M\n")
    monkeypatch.setattr(probes.glob, "glob", lambda pattern: real_glob(str(tmp_path / "index*" / "size")))
    assert probes._last_level_cache_bytes() == 96 * 2**20


def test_cpu_bandwidth_is_a_curve_over_op_size():
    # measured points: 100 GB/s for ops of 1 MB (in cache), 10 GB/s for 100 MB (from memory)
    dev = {"bandwidth": 10e9, "bandwidth_curve": [(1e6, 100e9), (1e8, 10e9)]}
    assert pr.bandwidth_at(dev, 1e5) == 100e9                                  # flat below the first point
    assert pr.bandwidth_at(dev, 1e7) == pytest.approx(math.sqrt(100e9 * 10e9))  # log-size midpoint
    assert pr.bandwidth_at(dev, 1e9) == 10e9                                   # flat beyond the last
    assert pr.bandwidth_at({"bandwidth": 3e12}, 1e3) == 3e12                   # a GPU: one figure
    assert pr.size_class(3 * 2**20) == 21 and pr.size_class(2**20) == 20
    # 1 GB in small ops and 1 GB in large ones: 1e9/100e9 + 1e9/10e9 = 0.11 s
    assert pr.memory_s({pr.size_class(1e5): 1e9, pr.size_class(1e9): 1e9}, dev) == pytest.approx(0.11)


def test_group_time_is_its_ops_rooflines_plus_overhead():
    dev = {"peak_flops": {"fp32": 1e12, "tf32": 8e12, "bf16": 4e12}, "bandwidth": 1e11}
    # 2 calls of 2 GFLOP bf16 matmuls (1e8 bytes in all): each 2e9 / (4e12 x 0.5) = 1 ms of arithmetic
    # against 5e7 / 1e11 = 0.5 ms of bytes -> compute-bound, 2 ms; 2 ops x 10 us of overhead
    mm = {"count": 2, "flops": 2e9, "fmt": "bf16", "bytes": 1e8}
    g = roofline._group_cost([mm], dev, "bf16", 0.5, 1.0, 1e-5)
    assert g.compute_s == pytest.approx(2e-3) and g.memory_s == 0.0 and g.n_ops == 2
    assert g.bound == "compute" and g.time_s == pytest.approx(2e-3 + 2 * 1e-5)
    assert g.flops == pytest.approx(4e9) and g.bytes == pytest.approx(1e8)
    # fp32 matmuls under precision tf32 run on the TF32 units: 8 GFLOP / 8 TFLOP/s = 1 ms < 10 ms of bytes
    g = roofline._group_cost([{"count": 1, "flops": 8e9, "fmt": "fp32", "bytes": 1e9}], dev, "tf32", 1.0, 1.0, 0.0)
    assert g.compute_s == 0.0 and g.memory_s == pytest.approx(1e-2)
    assert g.bound == "memory" and g.time_s == pytest.approx(1e-2)
    # a measured CPU: a timed shape runs at its own rate; "stream" picks the bandwidth of another size
    cpu = {"peak_flops": {"fp32": 1e12}, "bandwidth": 1e10, "bandwidth_curve": [(1e6, 1e11), (1e9, 1e10)],
           "shape_rates": {"mm|1|1|1|fp32|nn": 1e9}}
    g = roofline._group_cost([{"count": 1, "flops": 1e9, "fmt": "fp32", "bytes": 1e5, "shape": "mm|1|1|1|fp32|nn"},
                        {"count": 1, "flops": 0, "fmt": None, "bytes": 1e5, "stream": 1e9}], cpu, "fp32", 1.0, 1.0, 0.0)
    assert g.compute_s == pytest.approx(1.0) and g.memory_s == pytest.approx(1e5 / 1e10)


# ---- the catalogue -------------------------------------------------------------------------------

def _numbers(dev):
    yield from ((f"peak_tflops.{p}", e) for p, e in dev["peak_tflops"].items())
    for k in ("memory_gb", "memory_bandwidth_gbps", "interconnect_gbps"):
        yield k, dev[k]


def test_catalogue_has_every_device_and_field():
    cat = pr.catalogue()
    assert set(cat["devices"]) == set(DEVICE_KEYS)
    assert "this" not in cat["devices"]  # measured, never typed in
    assert pr.device_names() == list(DEVICE_KEYS) + ["this"]
    for key, dev in cat["devices"].items():
        for field in ("name", "vendor", "peak_tflops", "hardware_units", "memory_gb", "memory_bandwidth_gbps",
                      "interconnect_gbps"):
            assert field in dev, (key, field)
        assert set(dev["peak_tflops"]) == set(FORMATS), key
        assert set(dev["hardware_units"]) == set(FORMATS), key


def test_every_number_has_a_known_source():
    cat = pr.catalogue()
    for key, dev in cat["devices"].items():
        for what, entry in _numbers(dev):
            assert isinstance(entry, dict) and entry.get("source") in cat["sources"], (key, what)
    for sid, src in cat["sources"].items():
        assert src["kind"] in ("datasheet", "whitepaper", "vendor web page"), sid
        assert src["url"].startswith("https://") and src["title"], sid


def test_peaks_are_dense_and_plausible():
    devs = pr.catalogue()["devices"]
    for key, dev in devs.items():
        peaks = {p: e["value"] for p, e in dev["peak_tflops"].items()}
        for p in FORMATS:
            # a null peak exactly where there is no hardware unit
            assert (peaks[p] is None) == (not dev["hardware_units"][p]), (key, p)
        assert peaks["fp32"] and 5 <= peaks["fp32"] <= 200, key
        for p in ("bf16", "fp16", "tf32"):
            if peaks[p] is not None:
                assert peaks["fp32"] <= peaks[p] <= 1400, (key, p)  # 2:4-sparse figures would exceed this
        if peaks["tf32"] and peaks["bf16"]:
            assert peaks["tf32"] <= peaks["bf16"], key
        assert 100 <= dev["memory_bandwidth_gbps"]["value"] <= 10_000, key
        assert 8 <= dev["memory_gb"]["value"] <= 300, key
        assert 1 <= dev["interconnect_gbps"]["value"] <= 1000, key
    # the dense figures, not the datasheets' sparse headline numbers
    assert devs["h100-sxm"]["peak_tflops"]["bf16"]["value"] < 1000
    assert devs["a100-80gb"]["peak_tflops"]["bf16"]["value"] == 312.0
    # the NVL (PCIe) cards run slower than their SXM siblings
    for p in ("bf16", "tf32", "fp32"):
        assert devs["h200-nvl"]["peak_tflops"][p]["value"] < devs["h200-sxm"]["peak_tflops"][p]["value"]
        assert devs["h100-pcie"]["peak_tflops"][p]["value"] < devs["h100-sxm"]["peak_tflops"][p]["value"]
    assert devs["t4"]["peak_tflops"]["bf16"]["value"] is None  # no bf16 units on Turing


# ---- predictions ---------------------------------------------------------------------------------

def _sane(p, cfg, world_size=1):
    assert p.label == "predicted"
    assert set(p.groups) == set(pr.GROUPS)
    for name, g in p.groups.items():
        assert g.time_s >= 0 and g.flops >= 0 and g.bytes >= 0 and g.n_ops >= 0, name
        assert g.bound in (("overhead",) if name == "overhead" else ("compute", "memory")), name
        assert g.time_s == pytest.approx(g.compute_s + g.memory_s + g.overhead_s), name
    assert 0 < p.groups["overhead"].time_s <= p.overhead_s  # the overhead term: never free, its fixed part a row
    assert p.step_time_s == pytest.approx(sum(g.time_s for g in p.groups.values()))
    assert p.tokens_per_s == pytest.approx(cfg.micro_batch * cfg.context * cfg.accum * world_size / p.step_time_s)
    assert p.mfu is None or 0 < p.mfu < 1
    assert p.memory_bytes == pytest.approx(sum(p.memory.values()))
    assert p.memory["weights"] > 0 and p.memory["activations"] > 0
    for k in ("matmul_fraction", "attention_fraction", "bandwidth_fraction", "op_overhead_s", "overlap"):
        assert k in p.assumptions
    assert "Predicted" in p.table()


@pytest.mark.parametrize("device", ["t4", "a100-80gb", "h100-sxm", "mi300x"])
@pytest.mark.parametrize("kw", [dict(model="tiny"), dict(model="small", accum=2, checkpointing="full"),
                                dict(model="small", precision="bf16", checkpointing="selective")])
def test_predict_is_sane(device, kw):
    cfg = lk.Config(**kw)
    if device == "t4" and cfg.precision == "bf16":
        with pytest.raises(ConfigError, match="bf16"):
            pr.predict(cfg, device)
        return
    _sane(pr.predict(cfg, device), cfg)


def test_more_work_predicts_more_time_and_bf16_halves_matmul_bytes():
    small = pr.predict(lk.Config(model="small"), "a100-80gb")
    twice = pr.predict(lk.Config(model="small", micro_batch=16), "a100-80gb")
    assert twice.groups["matmul"].flops == pytest.approx(2 * small.groups["matmul"].flops)
    assert twice.step_time_s > small.step_time_s
    bf16 = pr.predict(lk.Config(model="small", precision="bf16"), "a100-80gb")
    assert bf16.groups["matmul"].bytes < 0.7 * small.groups["matmul"].bytes
    assert bf16.groups["matmul"].time_s < small.groups["matmul"].time_s  # faster units and fewer bytes
    ckpt = pr.predict(lk.Config(model="small", checkpointing="full"), "a100-80gb")
    assert ckpt.memory["activations"] < small.memory["activations"]
    assert ckpt.groups["matmul"].flops > small.groups["matmul"].flops  # the recomputed forward


def test_large_model_does_not_fit_a_t4():
    big = pr.predict(lk.Config(model="large", micro_batch=8), "t4")
    assert not big.fits and big.memory_bytes > 16e9
    assert pr.predict(lk.Config(model="tiny"), "t4").fits
    assert pr.predict(lk.Config(model="large", micro_batch=8), "h200-sxm").fits


def test_activation_bytes_match_memtrace():
    from labkit.chapters import ch04_checkpointing as memtrace

    for ck in ("none", "full", "selective"):
        cfg = lk.Config(model="tiny", micro_batch=2, checkpointing=ck, precision="bf16")
        trace = pr.trace_step(cfg)
        real = memtrace.trace_step(cfg, device="cpu")
        assert trace.activation_bytes == pytest.approx(real.kept_bytes(), rel=1e-3), ck
        assert trace.weight_copy_bytes == real.weight_copy_bytes(), ck


def test_overrides_and_refusals():
    cfg = lk.Config(model="tiny")
    tf32 = pr.predict(cfg, "a100-80gb", precision="tf32")
    fp32 = pr.predict(cfg, "a100-80gb")
    assert tf32.precision == "tf32" and tf32.groups["matmul"].time_s < fp32.groups["matmul"].time_s
    eight = pr.predict(cfg, "h100-sxm", world_size=8)
    _sane(eight, cfg, world_size=8)
    assert eight.groups["communication"].time_s > pr.predict(cfg, "h100-sxm").groups["communication"].time_s
    assert pr.predict(cfg, "h100-sxm", matmul_fraction=0.4).assumptions["matmul_fraction"] == 0.4
    with pytest.raises(ConfigError, match="device"):
        pr.predict(cfg, "v100")
    with pytest.raises(ConfigError, match="tf32"):
        pr.predict(cfg, "t4", precision="tf32")
    with pytest.raises(ConfigError, match="matmul_fraction"):
        pr.predict(cfg, "h100-sxm", matmul_fraction=1.5)
    with pytest.raises(ConfigError, match="world_size"):
        pr.predict(cfg, "h100-sxm", world_size=0)
    with pytest.raises(TypeError):
        pr.predict({"model": "tiny"}, "h100-sxm")


def test_this_machine_is_measured_offline(tmp_path, monkeypatch):
    """'this' probes bandwidth and overhead (cached beside the peak cache) and never needs a network.
    No timing assertions: only that the figures exist and were cached."""
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(probes, "_PROBED", {})
    monkeypatch.setattr(probes, "_TRIED", {})
    # this machine may be busy (tests share it): count every probe as quiet, so its figures are cached
    monkeypatch.setattr(probes._device, "contended", lambda reading, threads: False)
    monkeypatch.setattr(probes, "SPREAD_LIMIT", math.inf)
    cfg = lk.Config(model="tiny", threads=1)
    p = pr.predict(cfg, "this")
    _sane(p, cfg)
    assert p.assumptions["measured_device"] is True
    assert p.assumptions["bandwidth_bytes_per_s"] > 0 and p.assumptions["op_overhead_s"] > 0
    assert isinstance(p.assumptions["emulated_format"], bool)
    assert p.caveat is None  # every probe counted as quiet
    cache = (tmp_path / "roofline_probe.json").read_text()
    assert "threads=1" in cache and "bytes_per_s" in cache and "shape_rates" in cache and "peaks_checked" in cache
    with pytest.raises(ConfigError, match="tf32"):
        pr.predict(cfg, "this", precision="tf32")
    assert math.isfinite(pr.predict(cfg, "this").step_time_s)  # second call: from the cache


def test_a_prediction_built_without_its_memory_parts_keeps_the_old_defaults():
    p = lk.Prediction(device="t4", device_name="T4", precision="fp16", step_time_s=0.1, tokens_per_s=1e4,
                      mfu=0.3, memory_bytes=1e9, fits=True, groups={}, assumptions={})
    assert (p.memory, p.model_flops_per_step, p.tokens_per_step, p.label) == ({}, 0.0, 0, "predicted")
