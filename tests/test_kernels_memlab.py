"""labkit.chapters.ch07_kernels and ch08_memory (07, 08; 03): the tools compute what they claim, on the CPU.

Nothing here asserts a speed: timings are only checked for their shape (one sample per repeat, the
order of the calls), byte counts against exact arithmetic. GPU-only tools must refuse the CPU clearly;
their GPU behaviour is checked under ``-m gpu``.
"""
from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

import labkit as lk
from labkit.chapters import ch03_accumulation as acc, ch07_kernels as kernels, ch08_memory as memlab
from labkit.chapters.ch07_kernels import fusion
from labkit.tools.compare import Comparison

TINY = dict(model="tiny", micro_batch=2, threads=1)


# ---- reading a profile ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,kind", [("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"),
                                       ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
                                       ("aten::_efficient_attention_backward", "attention"),
                                       ("aten::gelu", "other"), ("aten::copy_", "other"), ("forward", "range"),
                                       ("Optimizer.step#AdamW.step", "range"),
                                       ("autograd::engine::evaluate_function: MmBackward0", "range")])
def test_op_kind(name, kind):
    assert kernels.op_kind(name) == kind


def _table():
    rows = [dict(name="aten::mm", self_s=0.5, total_s=0.5, calls=3, kind="matmul"),
            dict(name="step", self_s=0.2, total_s=1.0, calls=1, kind="range"),     # a range with a big self time
            dict(name="aten::gelu", self_s=0.2, total_s=0.2, calls=2, kind="other"),
            dict(name="aten::_scaled_dot_product_flash_attention_for_cpu", self_s=0.1, total_s=0.1, calls=1,
                 kind="attention")]
    return kernels.ProfileTable(rows=rows, phases={"step": 1.0, "optimizer": 0.25}, device="cpu", time_source="t")


def test_profile_table_reading():
    t = _table()
    assert t.top_op() == "aten::mm" and [r["name"] for r in t.top(2)] == ["aten::mm", "aten::gelu"]
    assert t.total_s() == pytest.approx(1.0)
    assert t.share("matmul") == pytest.approx(0.5) and t.share("range") == pytest.approx(0.2)
    assert sum(t.share(k) for k in ("matmul", "attention", "other", "range")) == pytest.approx(1.0)
    assert t.calls("other") == 2 and t.phase_share("optimizer") == pytest.approx(0.25)
    top = t.top_rows(3)
    assert [r["name"] for r in top] == ["aten::mm", "aten::gelu", "aten::_scaled_dot_product_flash_attention_for_cpu"]
    assert [r["rank"] for r in top] == [1, 2, 3] and top[0]["share"] == pytest.approx(0.5)
    assert top[0]["self_ms"] == pytest.approx(500) and top[1]["calls"] == 2 and top[2]["kind"] == "attention"
    assert t.phase_rows() == [{"range": "step", "ms": 1000.0}, {"range": "optimizer", "ms": 250.0}]


def test_profile_step_of_tiny(tmp_path):
    path = tmp_path / "trace.json"
    t = kernels.profile_step(lk.Config(**TINY), trace_path=path, warmup=1)
    assert set(kernels.PHASES) <= set(t.phases)
    assert t.phases["step"] >= t.phases["optimizer"] > 0 and t.phases["step"] >= t.phases["forward"] > 0
    assert t.top_op().startswith("aten::") and t.share("matmul") > 0
    assert sum(t.share(k) for k in ("matmul", "attention", "other", "range")) == pytest.approx(1.0)
    assert t.rows == sorted(t.rows, key=lambda r: -r["self_s"])
    assert t.total_s() == pytest.approx(t.phases["step"], rel=0.2)  # all the step's time, each op once
    assert "Self CPU" in t.text and t.threads == 1
    events = json.loads(path.read_text())["traceEvents"]
    assert {"forward", "backward", "optimizer"} <= {e.get("name") for e in events}


# ---- sweeps and interleaved timing ------------------------------------------------------------------------

class _FakeResult:
    def __init__(self, config):
        self.config = config
        tokens = config.tokens_per_update
        self.summary = {"mfu": 0.01 * config.micro_batch, "tokens_per_s": 1000.0, "step_time_s": tokens / 1000.0,
                        "model_flops_per_step": 6 * 1000 * tokens, "n_params": 1000}


def test_mfu_sweep_moves_one_knob_with_a_fixed_thread_count():
    seen = []

    def fake_run(cfg):
        seen.append(cfg)
        return _FakeResult(cfg)

    rows = kernels.mfu_sweep(lk.Config(model="tiny"), "micro_batch", [1, 2, 4], steps=3, n_threads=1, run_fn=fake_run)
    assert [r["value"] for r in rows] == [1, 2, 4] and [c.micro_batch for c in seen] == [1, 2, 4]
    assert all(c.threads == 1 and c.steps == 3 and c.model == "tiny" for c in seen)
    assert all(r["flops_per_token"] == 6000 for r in rows)  # per token: the same at every micro-batch
    assert [r["mfu"] for r in rows] == [0.01, 0.02, 0.04]


def test_interleaved_runs_a_b_a_b_and_drops_the_warmup():
    calls = []
    out = kernels.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert len(out["a"]) == len(out["b"]) == 3 and all(x >= 0 for x in out["a"] + out["b"])


def test_interleaved_stops_at_its_budget_after_three_rounds():
    out = kernels.interleaved({"a": lambda: None}, repeats=1000, warmup=0, budget_s=0.0)
    assert len(out["a"]) == 3


def test_head_step_and_shape_comparison():
    step = kernels.head_step(257, tokens=16, d_model=8)
    step()  # forward, loss, backward; gradients dropped after
    cmp = kernels.compare_head_shapes(256, 257, tokens=16, d_model=8, repeats=5, n_threads=1)
    assert isinstance(cmp, Comparison) and len(cmp.samples_a) == len(cmp.samples_b) == 5
    assert "256" in cmp.label_a and "257" in cmp.label_b and cmp.metric == "step_time_s"


# ---- compile --------------------------------------------------------------------------------------------

def test_compile_ready_names_a_missing_compiler(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    assert kernels.cxx_compiler() is None
    assert kernels.compile_ready("cpu") == (False, "no_cxx")
    res = kernels.fusion_demo()
    assert res["ok"] is False and res["reason"] == "no_cxx"


def test_compile_ready_on_mps_and_cuda_without_triton(monkeypatch):
    assert kernels.compile_ready("mps") == (False, "unsupported")
    monkeypatch.setattr(fusion.importlib.util, "find_spec", lambda name: None)
    assert kernels.compile_ready("cuda") == (False, "no_triton")


def test_compile_run_keeps_the_compile_time_apart():
    class Res:
        records = [{"step_time_s": s} for s in (10.0, 0.2, 0.3, 0.25)]
        summary = {}

    seen = []
    out = kernels.compile_run(lk.Config(model="tiny", warmup=0), run_fn=lambda c: seen.append(c) or Res())
    assert seen[0].compile and seen[0].warmup == 1  # the compiling update is a warm-up: not in the step time
    assert out["first_update_s"] == 10.0 and out["steady_step_s"] == 0.25
    assert out["compile_s"] == pytest.approx(9.75)


@pytest.mark.skipif(kernels.cxx_compiler() is None, reason="no C++ compiler: Inductor cannot build CPU kernels")
def test_fusion_demo_fuses_three_ops_into_one_kernel():
    torch._dynamo.reset()  # a fresh compile: an earlier one in this process would be reused (0 new kernels)
    res = kernels.fusion_demo(rows=64, cols=32, repeats=3, n_threads=1)
    assert res["ok"] and res["eager_ops"] == ["add", "gelu", "add"]
    assert res["same_result"] and res["kernels"] in (None, 1)
    assert res["compile_s"] > 0 and isinstance(res["comparison"], Comparison)


# ---- optimizers -----------------------------------------------------------------------------------------------

def test_adamw_implementations_on_the_cpu():
    ok, error = kernels.fused_supported("cpu")
    assert ok and error is None, error  # torch >= 2.4 has a fused CPU AdamW
    assert kernels.adamw_impls("cpu") == ["for-loop", "foreach", "fused"]
    assert kernels.default_adamw([torch.nn.Parameter(torch.zeros(2))]) == "for-loop"


def test_optimizer_steps_times_every_implementation():
    out = kernels.optimizer_steps(lk.Config(model="tiny"), repeats=3, n_threads=1)
    assert set(out["times"]) == {"for-loop", "foreach", "fused"}
    assert all(len(t) == 3 for t in out["times"].values())
    assert out["default"] == "for-loop" and out["n_params"] > 0


def test_the_three_adamw_implementations_compute_the_same_update():
    # what the chapter compares must be the same arithmetic: only the implementation may differ
    torch.manual_seed(0)
    ref = [torch.randn(5, 3) for _ in range(3)]
    grads = [torch.randn_like(p) for p in ref]
    results = {}
    for impl, kw in kernels.ADAMW_IMPLS.items():
        ps = [torch.nn.Parameter(p.clone()) for p in ref]
        opt = torch.optim.AdamW(ps, lr=1e-2, **kw)
        for _ in range(3):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
        results[impl] = ps
    for a, b in zip(results["for-loop"], results["fused"]):
        assert torch.allclose(a, b, atol=1e-6)


def test_tf32_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="tensor cores"):
        kernels.tf32_matmul(64)


# ---- attention backends ----------------------------------------------------------------------------------------

def test_attention_sweep_counts_the_t_by_t_matrix_only_for_math():
    rows = kernels.attention_sweep([32, 64], ["math", "flash"], batch=1, n_head=2, head_dim=8, repeats=2, n_threads=1)
    by = {(r["seq_len"], r["backend"]): r for r in rows}
    for T in (32, 64):
        m, f = by[(T, "math")], by[(T, "flash")]
        assert m["scores_bytes"] == 1 * 2 * T * T * 4
        assert m["kept_bytes"] >= m["scores_bytes"] > f["kept_bytes"]  # math keeps the probabilities
        assert f["kept_bytes"] == 2 * T * 8 * 4 + 2 * T * 4            # flash: the output and a log-sum-exp
        assert m["peak_bytes"] >= m["kept_bytes"] and len(m["samples"]) == 2
    assert by[(64, "math")]["kept_bytes"] - by[(64, "flash")]["kept_bytes"] > \
        by[(32, "math")]["kept_bytes"] - by[(32, "flash")]["kept_bytes"]


def test_a_backend_the_device_lacks_gives_a_row_with_its_error():
    rows = kernels.attention_sweep([32], ["math", "efficient"], batch=1, n_head=2, head_dim=8, repeats=1, n_threads=1)
    eff = next(r for r in rows if r["backend"] == "efficient")
    if torch.cuda.is_available():
        pytest.skip("the efficient kernel exists on CUDA")
    assert "error" in eff and "time_s" not in eff
    assert kernels.attention_verdict(rows, "math", "efficient") is None


def test_attention_verdict_uses_the_longest_common_length():
    rows = [dict(seq_len=T, backend=b, samples=[1.0 if b == "math" else 0.5] * 5) for T in (8, 16) for b in ("math", "flash")]
    cmp = kernels.attention_verdict(rows)
    assert "T=16" in cmp.label_a and cmp.better == "b" and cmp.ratio == pytest.approx(0.5)


def test_sdpa_backends_per_device():
    assert kernels.sdpa_backends("cpu") == ["math", "flash"]
    assert "efficient" in kernels.sdpa_backends("cuda") and kernels.sdpa_backends("mps") == ["math"]


def test_plots_return_figures_that_show_as_png():
    rows = [dict(field="micro_batch", value=v, mfu=0.1 * v, flops_per_token=6e6) for v in (1, 2)]
    att = [dict(seq_len=T, backend=b, time_s=0.001 * T, peak_bytes=T * 1024) for T in (8, 16) for b in ("math", "flash")]
    figs = [kernels.plot_sweeps({"micro-batch": rows}), kernels.plot_shares({"x": _table()}),
            kernels.plot_attention(att), kernels.plot_optimizers({"for-loop": [0.01, 0.02], "fused": [0.005]})]
    for fig in figs:
        assert fig.axes and fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"


def test_out_dir_is_out_under_the_repository_from_notebooks(tmp_path, monkeypatch):
    from labkit.base import paths

    monkeypatch.setattr(paths, "checkout_root", lambda: tmp_path)  # a checkout at tmp_path
    nb = tmp_path / "notebooks"
    nb.mkdir()
    monkeypatch.chdir(nb)
    assert kernels.out_dir() == tmp_path / "out" and (tmp_path / "out").is_dir()
    elsewhere = tmp_path / "other" / "notebooks"  # a folder of that name outside the checkout: not the course
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    assert kernels.out_dir() != tmp_path / "other" / "out"


# ---- memlab: sequence length ----------------------------------------------------------------------------------

def test_activation_formula_parts():
    f = memlab.activation_formula(2, 64, 4, 128, 3, "math")
    assert f["blocks_linear"] == 2 * 3 * 128 * (16 * 64 + 4 + 4) * 4
    assert f["attention_square"] == 2 * 3 * 4 * 128 * 127 * 4
    assert f["outside"] == 3 * 128 * (2 * 64 + 2 + 256) * 4
    assert f["total"] == f["blocks_linear"] + f["attention_square"] + f["outside"]
    assert memlab.activation_formula(2, 64, 4, 128, 3, "auto")["attention_square"] == 0


def test_seq_sweep_matches_the_formula_for_both_backends():
    rows = memlab.seq_sweep(lk.Config(model="tiny"), [32, 96], batch=2)
    assert {(r["seq_len"], r["attention"]) for r in rows} == {(32, "auto"), (32, "math"), (96, "auto"), (96, "math")}
    for r in rows:
        assert abs(r["ratio"] - 1) < 0.005, r  # the formula counts every tensor but a few int64 positions and targets


def test_attention_recompute_drops_the_square_part():
    ok, why = memlab.attention_recompute_ready()
    if not ok:
        pytest.skip(why)
    rows = memlab.attention_recompute(lk.Config(model="tiny"), [32, 128])
    for r in rows:
        assert r["bytes_attention"] < r["bytes_none"] and r["flops_ratio"] > 1
    assert rows[1]["saved_frac"] > rows[0]["saved_frac"]  # the T² part grows faster than the rest


# ---- memlab: the first updates ---------------------------------------------------------------------------------

def test_first_updates_show_adamw_state_appearing_at_the_first_step():
    res = memlab.first_updates(lk.Config(model="tiny", micro_batch=2))
    ms = {m["moment"]: m for m in res["moments"]}
    assert len(res["moments"]) == 7
    n = res["n_params"]
    assert all(m["weights"] == 4 * n for m in res["moments"])
    assert ms["update 1: forward done"]["optimizer"] == 0 and ms["update 1: forward done"]["activations"] > 0
    assert ms["update 1: backward done"]["grads"] == 4 * n and ms["update 1: backward done"]["optimizer"] == 0
    state = ms["update 1: optimizer step done"]["optimizer"]
    assert 8 * n <= state <= 8 * n + 64 * 8  # two fp32 moments, plus one step counter per parameter tensor
    assert ms["update 2: forward done"]["optimizer"] == state and ms["update 2: optimizer step done"]["grads"] == 0
    p1, p2, extra = memlab.update_peaks(res)
    assert p2 > p1 and abs(extra - state) <= 0.1 * state


# ---- memlab: allocator, history, bytes per parameter -------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusals")
def test_cuda_only_tools_refuse_the_cpu_clearly(tmp_path):
    with pytest.raises(RuntimeError, match="CUDA"):
        memlab.allocator_stats()
    with pytest.raises(RuntimeError, match="CUDA"):
        memlab.fragmentation_demo(True)
    with pytest.raises(RuntimeError, match="CUDA"):
        memlab.record_cuda_history(lk.Config(model="tiny"), tmp_path / "snap.pickle")
    assert not (tmp_path / "snap.pickle").exists()


def test_bytes_per_param_counts_16_16_and_20():
    rows = {r["recipe"]: r for r in memlab.bytes_per_param(lk.Config(model="tiny", micro_batch=2))}
    assert list(rows) == list(memlab.RECIPES)
    got = [rows[k]["bytes_per_param"] for k in memlab.RECIPES]
    assert [round(x, 2) for x in got] == [16.0, 16.0, 20.0]
    n = rows["autocast"]["n_params"]
    acc = rows["16-bit weights + fp32 master + fp32 grad accumulation"]
    assert acc["weights"] == acc["grads"] == 2 * n and acc["master"] == acc["accumulator"] == 4 * n
    # nothing alive beyond the roles: the master recipe's fp32 gradient copy is freed after the step
    assert all(r["traced_bytes"] == r["total"] for r in rows.values())


def test_run_memory_adds_up_a_runs_parts():
    m = memlab.run_memory(lk.Config(**TINY))
    assert m["total"] == m["param_bytes"] + m["grad_bytes"] + m["optimizer_bytes"] + m["activation_bytes"]
    assert m["param_bytes"] == m["grad_bytes"] == 4 * m["n_params"]


def test_memlab_plots():
    res = memlab.first_updates(lk.Config(model="tiny", micro_batch=2))
    rows = memlab.seq_sweep(lk.Config(model="tiny"), [16, 32])
    bpp = memlab.bytes_per_param(lk.Config(model="tiny", micro_batch=2))
    for fig in (memlab.plot_first_updates(res), memlab.plot_seq_sweep(rows), memlab.plot_bytes_per_param(bpp)):
        assert fig.axes and fig._repr_png_()[:4] == b"\x89PNG"


# ---- on a GPU (pytest -m gpu) -----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_allocator_demo_and_stats():
    st = memlab.allocator_stats()
    assert st["reserved"] >= st["allocated"] >= 0
    demos = memlab.fragmentation_demos()
    for flag, d in demos.items():
        assert ("True" if flag else "False") in d["settings"]
        assert set(d["arms"]) == {"holes uncapped", "holes capped", "growth uncapped", "growth capped"}
        for arm in d["arms"].values():
            assert arm["reserved"] >= arm["allocated"] >= 0
    assert torch.cuda.memory_stats().get("num_ooms", 0) == 0  # the demo's out-of-memory stayed in its process
    rows = memlab.fragmentation_verdicts(demos)
    # the expectations come from the allocator's rules: print the verdicts, so a GPU run confirms or refutes them
    print("\n" + memlab.fragmentation_table(demos)._repr_markdown_())
    assert [r for r in rows if not r["confirmed"]] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_update_peak_rises_by_the_gradients_from_k1_to_k2():
    cfg = lk.Config(model="tiny", micro_batch=2, device="cuda")
    by_k = {k: acc.update_peak(cfg.replace(accum=k)) for k in (1, 2, 4)}
    rise, grads = by_k[2]["peak"] - by_k[1]["peak"], by_k[1]["grads"]
    print("\n", acc.accumulation_reading(by_k))
    assert by_k[1]["source"].startswith("the CUDA allocator") and -2**20 <= rise <= grads + 2**20
    assert abs(by_k[4]["peak"] - by_k[2]["peak"]) <= 2**20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_memory_history_snapshot(tmp_path):
    path = memlab.record_cuda_history(lk.Config(model="tiny", device="cuda", steps=2), tmp_path / "s.pickle")
    assert (tmp_path / "s.pickle").stat().st_size > 0 and path.endswith("s.pickle")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_first_updates_from_the_allocator():
    res = memlab.first_updates(lk.Config(model="tiny", micro_batch=2, device="cuda"))
    state = res["moments"][3]["optimizer"]
    _, _, extra = memlab.update_peaks(res)
    assert res["source"].startswith("the CUDA allocator") and abs(extra - state) <= 0.25 * state + 2**20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_tf32_and_attention_backends():
    if torch.cuda.get_device_capability()[0] >= 8:
        r = kernels.tf32_matmul(1024, reps=3)
        assert r["fp32"]["rel_error"] < r["tf32"]["rel_error"] < r["bf16"]["rel_error"] * 2
    rows = kernels.attention_sweep([256], batch=1, n_head=2, head_dim=64, repeats=2)
    ok = [r for r in rows if "error" not in r]
    assert any(r["backend"] == "math" for r in ok) and len(ok) >= 2
    math_row = next(r for r in ok if r["backend"] == "math")
    assert math_row["kept_bytes"] >= math_row["scores_bytes"]  # the allocator sees the T×T probabilities kept
    assert statistics.median(math_row["samples"]) > 0 and not math.isnan(math_row["time_s"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_profile_counts_each_kernel_once():
    t = kernels.profile_step(lk.Config(model="tiny", micro_batch=4, device="cuda"), warmup=1)
    assert t.time_source.startswith("device") and t.top_op().startswith("aten::")
    assert t.total_s() == pytest.approx(t.phases["step"], rel=0.2)  # each kernel counted once, not twice
    assert t.phases["step"] > 0 and 0 < t.phase_share("optimizer") < 1
    assert sum(t.share(k) for k in t.kinds()) == pytest.approx(1.0)
    assert t.wall_s > 0  # shares are of the step's wall time on a GPU; the idle share makes up the rest


# ---- chapter 07's instruments return data; the chapter's cells draw the tables and say the words (issue 47) ----

def _points(section=None):
    sections = {
        "kernels": [dict(id="kernels/optimizer", status="ok", summary=dict(device_name="H200", n_params=124e6,
                                                                        default="foreach", median_s={"fused": 0.002})),
                    dict(id="kernels/attention", status="ok", summary=dict(device_name="H200", rows=[
                        dict(seq_len=1024, backend="flash", time_s=0.001, peak_bytes=2**20),
                        dict(seq_len=1024, backend="math", error="no")])),
                    dict(id="kernels/tf32", status="ok", summary={n: dict(tflops=100.0, rel_error=3e-4)
                                                                  for n in ("fp32", "tf32", "bf16")})],
        "best": [dict(id="best/bf16-Bbig", status="ok", summary=dict(compile=False, tokens_per_s=1e5, mfu=0.4))],
        "precision": [dict(id="precision/bf16-compile", status="ok", records=[dict(step_time_s=30.0)],
                           summary=dict(compile=True, tokens_per_s=1.2e5, mfu=0.45))]}
    return sum(sections.values(), []) if section is None else sections.get(section, [])


def test_reference_rows_hold_the_shipped_gpu_points_and_no_table_shows_without_them(monkeypatch):
    import labkit.chapters.course as course

    monkeypatch.setattr(course, "reference_points", _points)
    assert kernels.reference_rows("optimizer") == [dict(device="H200", params_m=124.0, default="foreach",
                                                        impl="fused", ms=2.0)]
    assert [(r["T"], r["backend"], r["ms"]) for r in kernels.reference_rows("attention")] == [(1024, "flash", 1.0)]
    compiled = next(r for r in kernels.reference_rows("compile") if r["compile"])
    assert compiled["first_s"] == 30.0
    assert kernels.reference_rows("tf32")[-1]["rel_error"] == 3e-4
    assert "| fused | 2.00 |" in kernels.reference_table("optimizer")._repr_markdown_()
    monkeypatch.setattr(course, "reference_points", lambda section=None: [])
    # issue 46.19: a cell ending with these shows nothing (not an empty output) where no points are shipped
    assert kernels.reference_table("mfu") is None and kernels.reference_profile() is None
    with pytest.raises(lk.ConfigError, match="topic"):
        kernels.reference_rows("nope")


def test_attention_memory_rows_are_the_longest_sequences_and_name_the_fused_backend_that_ran():
    rows = [dict(seq_len=256, backend="math", kept_bytes=2**20, scores_bytes=2**19, peak_bytes=2**21),
            dict(seq_len=512, backend="math", kept_bytes=4 * 2**20, scores_bytes=2**20, peak_bytes=8 * 2**20),
            dict(seq_len=512, backend="flash", error="not built"),
            dict(seq_len=512, backend="efficient", kept_bytes=2**19, peak_bytes=2**20, scores_bytes=2**20)]
    assert kernels.fused_backend(rows) == "efficient"
    mem = kernels.memory_rows(rows)
    assert [r["backend"] for r in mem] == ["math", "flash", "efficient"] and {r["T"] for r in mem} == {512}
    assert mem[0]["kept_mib"] == 4.0 and mem[0]["scores_mib"] == 1.0 and mem[1]["error"] == "not built"
    assert mem[2]["kept_mib"] == 0.5 and "scores_mib" not in mem[2]  # a fused kernel never keeps the T × T
    with pytest.raises(lk.ConfigError, match="att"):
        kernels.fused_backend(rows[2:3])


def test_the_tf32_refusal_is_the_engines_own_on_this_cpu():
    refusal = kernels.tf32_refusal()
    assert refusal is not None and "tf32" in refusal  # what lk.run would say on a CPU, not a sentence of ours


def test_fusion_demo_names_what_inductor_made(monkeypatch):
    monkeypatch.setattr(fusion, "compile_ready", lambda kind=None: (False, "no_cxx"))
    assert kernels.fusion_demo(rows=8, cols=8, repeats=1) == {"ok": False, "made": "skipped", "reason": "no_cxx"}
