"""labkit.whatif's element-wise op probe (issue 34, "what-if"): on "this" every element-wise call of the
micro-batch is rebuilt from the trace at its own shapes, timed alone, cached, and charged the slower of
that kernel time and its bytes. Correctness only -- no timing assertions: the tests put their own
kernel times in and check where they go."""
import json
import math

import pytest
import torch

import labkit as lk
from labkit import whatif as pr
from labkit.whatif import devices, probes, report, roofline, trace


def test_every_elementwise_call_of_the_step_has_a_key_that_rebuilds_it():
    tr = pr.trace_step(lk.Config(model="tiny", micro_batch=2))
    keys = devices.op_keys(tr)
    names = {k.split("|")[1] for k in keys}
    for op in ("aten.gelu.default", "aten.gelu_backward.default", "aten.native_layer_norm.default",
               "aten.native_layer_norm_backward.default", "aten._log_softmax.default"):
        assert op in names, op
    # no matmul, attention kernel or view has an element-wise key; no optimizer op either (state-bound)
    assert not any(n.split(".")[1] in ("mm", "addmm", "view", "t", "transpose") for n in names)
    assert all(r["phase"] in ("forward", "backward") for r in tr.kinds if (r["shape"] or "").startswith("op|"))
    # the matmul shape table is unchanged by them
    assert all(not k.startswith("op|") for k in probes.shape_keys(tr))
    for key in keys:  # every call rebuilds on real tensors of its traced shapes
        out = devices._op_call(key)()
        assert out is None or isinstance(out, (torch.Tensor, tuple, list)), key
    gelu = next(k for k in keys if k.split("|")[1] == "aten.gelu.default")
    (x,), _ = json.loads(gelu.split("|", 2)[2])
    assert devices._op_call(gelu)().shape == tuple(x["t"]) == (2, 64, 256)  # tiny: 2 x 64 tokens x 4 x 64


def test_op_key_encodes_tensors_by_shape_and_refuses_what_it_cannot_rebuild():
    t = torch.empty_strided((3, 4), (1, 3))
    key = trace.op_key(torch.ops.aten.masked_fill.Scalar, (t, t > 0, -math.inf), {})
    name, spec = key.split("|", 2)[1:]
    assert name == "aten.masked_fill.Scalar"
    args, kwargs = json.loads(spec)
    assert args[0] == {"t": [3, 4], "s": [1, 3], "d": "float32"} and args[1]["d"] == "bool"
    assert args[2] == {"f": "-inf"} and kwargs == {}
    assert devices._op_call(key)().shape == (3, 4)
    rebuilt = devices._decode(args)
    assert rebuilt[0].stride() == (1, 3) and rebuilt[2] == -math.inf  # the traced layout is rebuilt too
    cast = trace.op_key(torch.ops.aten._to_copy.default, (t,), {"dtype": torch.bfloat16})
    assert json.loads(cast.split("|", 2)[2])[1] == {"dtype": {"dtype": "bfloat16"}}
    assert devices._op_call(cast)().dtype == torch.bfloat16
    assert trace.op_key(torch.ops.aten.add.Tensor, (t, object()), {}) is None  # charged by its bytes alone


def test_an_op_roofline_takes_the_slower_of_the_kernel_and_its_bytes():
    # 1e5 bytes at 1e10 B/s = 10 us: a 30 us kernel (GELU-like arithmetic) is the slower part
    assert roofline.op_roofline_s(30e-6, 1e5, 1e10) == (pytest.approx(30e-6), "compute")
    # a 1 us kernel whose data is not in cache: the bytes decide
    assert roofline.op_roofline_s(1e-6, 1e5, 1e10) == (pytest.approx(10e-6), "memory")


def test_a_timed_call_is_charged_its_own_time_the_rest_their_bytes():
    cpu = {"peak_flops": {"fp32": 1e12}, "bandwidth": 1e10, "bandwidth_curve": [(1e6, 1e11), (1e9, 1e10)],
           "op_times": {"op|aten.gelu.default|x": 2e-3}}
    gelu = {"count": 3, "flops": 0, "fmt": None, "bytes": 3e5, "shape": "op|aten.gelu.default|x"}
    other = {"count": 2, "flops": 0, "fmt": None, "bytes": 2e5, "shape": "op|aten.add.Tensor|y"}  # not timed
    g = roofline._group_cost([gelu, other], cpu, "fp32", 1.0, 1.0, 1e-6)
    # 3 x 2 ms of kernel (its 1e5 bytes per call would take 1 us at 1e11 B/s); 2 x 1e5 / 1e11 = 2 us of bytes
    assert g.compute_s == pytest.approx(6e-3) and g.memory_s == pytest.approx(2e-6)
    assert g.time_s == pytest.approx(6e-3 + 2e-6 + 5 * 1e-6) and g.bound == "compute"
    # bytes that stream from memory ("stream": the model's state) are charged at memory speed when slower
    slow = {**gelu, "bytes": 3e8, "stream": 1e9}  # 1e8 per call / 1e10 = 10 ms > 2 ms
    assert roofline._group_cost([slow], cpu, "fp32", 1.0, 1.0, 0.0).memory_s == pytest.approx(3e-2)
    # a device without op times (a GPU from the catalogue): the same rows are charged by their bytes only
    gpu = {"peak_flops": {"fp32": 1e12}, "bandwidth": 1e11}
    assert roofline._group_cost([gelu, other], gpu, "fp32", 1.0, 1.0, 0.0).time_s == pytest.approx(5e5 / 1e11)


@pytest.fixture
def quiet_probes(fresh_probes):
    """conftest's probe sandbox on a machine the test says is quiet (or not)."""
    fresh_probes[1]["busy"] = False
    return fresh_probes


def test_the_probe_result_is_used_for_the_traced_ops(quiet_probes, monkeypatch):
    cfg = lk.Config(model="tiny", micro_batch=2, threads=1)
    keys = devices.op_keys(pr.trace_step(cfg))
    gelu = [k for k in keys if k.split("|")[1] == "aten.gelu.default"]
    monkeypatch.setattr(report, "this_op_times", lambda calls, threads: {})
    without = pr.predict(cfg, "this", progress=False)
    assert without.assumptions["measured_ops"] == 0
    monkeypatch.setattr(report, "this_op_times", lambda calls, threads: {k: 0.5 for k in gelu if k in calls})
    timed = pr.predict(cfg, "this", progress=False)
    assert timed.assumptions["measured_ops"] == len(gelu) == 1
    # tiny has 2 blocks: 2 GELUs of 0.5 s each replace their byte-charged time in the element-wise group
    extra = timed.groups["elementwise"].time_s - without.groups["elementwise"].time_s
    assert 1.0 - 1e-3 < extra <= 1.0
    assert timed.groups["matmul"].time_s == pytest.approx(without.groups["matmul"].time_s)


def test_op_times_are_cached_when_quiet_and_kept_in_process_under_load(quiet_probes, monkeypatch):
    tmp_path, state = quiet_probes
    keys = devices.op_keys(pr.trace_step(lk.Config(model="tiny", micro_batch=1)))
    state["busy"] = True
    first = pr.this_op_times(keys, 1)
    assert set(first) == set(keys) and all(v >= 0 for v in first.values())
    cache = tmp_path / "roofline_probe.json"
    assert not cache.exists() or "op_times" not in cache.read_text()  # timed under load: not kept
    assert set(probes._entry(probes._probe_key(1))["loaded_ops"]) == set(keys)
    state["busy"] = False
    monkeypatch.setattr(probes, "PROBE_RETRY_S", 0.0)
    pr.this_op_times(keys, 1)  # due again, quiet now: cached
    saved = json.loads(cache.read_text())[probes._probe_key(1)]["op_times"]
    assert set(saved) == set(keys)
    # a new process reads them: nothing is timed again
    monkeypatch.setattr(probes, "_PROBED", {})
    monkeypatch.setattr(probes, "probe_ops", lambda *a, **k: pytest.fail("timed again"))
    assert pr.this_op_times(keys, 1) == saved
