"""Chapter 10's layout chooser, FP8 and context-parallel arithmetic: pure, fast (no processes, no timing)."""
import pytest

from labkit.base.runtime import ConfigError
from labkit.chapters.ch10_parallel import formulas as F
from labkit.chapters.ch10_parallel import layout as L
from labkit.check.parallel import check_layout
from labkit.chapters.ch10_parallel.formulas import Shape, layout_state_bytes
from labkit.engine.config import PRESETS
from labkit.engine.measure import count_flops
from labkit.engine.model import GPT, n_params

SC = dict(model="llama2-70b", gpu="h100-sxm", n_gpus=64, node_size=8, interconnect="infiniband", global_batch=128)


@pytest.fixture(scope="module")
def rows():
    return L.layouts(SC["model"], SC["gpu"], SC["n_gpus"], node_size=8, interconnect="infiniband", global_batch=128)


def test_parameter_counts_from_shapes():
    for key in ("tiny", "small"):  # the formula reproduces labkit's own GPT exactly
        assert L.MODELS[key].n_params == n_params(GPT(PRESETS[key]))
    assert 174e9 < L.MODELS["gpt3-175b"].n_params < 176e9
    assert 68e9 < L.MODELS["llama2-70b"].n_params < 70e9
    assert 400e9 < L.MODELS["llama3-405b"].n_params < 410e9


def test_flops_per_token_match_the_course_counter():
    spec = PRESETS["small"]
    counted = count_flops(spec) / spec.seq_len
    assert L.flops_per_token(L.MODELS["small"])["total"] == pytest.approx(counted, rel=0.02)


def test_every_row_obeys_the_rules(rows):
    shape = L.MODELS["llama2-70b"]
    assert rows and all(r["label"] == "predicted" for r in rows)
    for r in rows:
        assert r["dp"] * r["tp"] * r["pp"] == 64
        assert r["tp"] <= 8 and 8 % r["tp"] == 0 and shape.n_head % r["tp"] == 0
        assert shape.n_layer % r["pp"] == 0 and 128 % (r["dp"] * 1) == 0
        assert r["dp"] > 1 or r["zero_stage"] == 0
        assert r["pp"] == 1 or r["zero_stage"] <= 1                  # ZeRO-2/3 not with PP
        assert r["micro_batches"] >= r["pp"]                          # 1F1B fills: m >= p
        assert shape.kv_heads % r["tp"] == 0                          # whole K/V heads (GQA)
        assert r["checkpointing"] in ("none", "full")
        assert r["step_s"] > 0 and r["fits"] == (r["bytes_per_gpu"] <= r["usable_bytes"])
        assert r["step_s"] == pytest.approx(sum(r["parts"].values()))
    combos = {(r["dp"], r["tp"], r["pp"], r["zero_stage"], r["checkpointing"]) for r in rows}
    assert len(combos) == len(rows)
    assert (8, 8, 1, 3, "none") in combos and (1, 8, 8, 0, "full") in combos  # a few that must be there
    assert not any(c[:4] == (2, 4, 8, 2) for c in combos)     # the old pick, ZeRO-2 with PP 8: not a real config


def test_zero2_and_3_with_accumulation_charge_a_reducescatter_per_micro_batch():
    """pp = 1, m micro-batches: ZeRO-2 = m ReduceScatters + 1 AllGather, ZeRO-3 = m x (1 RS + 2 AG), each half
    a ring AllReduce; ZeRO-0/1 one AllReduce per step whatever m is."""
    from labkit.whatif.roofline import ring_allreduce_s
    kw = dict(global_batch=64, checkpointing="none")
    for gb, m in ((16, 1), (64, 4)):
        rows = {(r["dp"], r["tp"], r["pp"], r["zero_stage"]): r
                for r in L.layouts("llama2-70b", "h100-sxm", 64, **{**kw, "global_batch": gb})}
        link = L.LINKS["infiniband"]
        ar = ring_allreduce_s(2 * L.MODELS["llama2-70b"].n_params / 4, 16, link.bandwidth, link.latency)
        assert rows[(16, 4, 1, 1)]["micro_batches"] == m
        assert rows[(16, 4, 1, 1)]["parts"]["dp_comm"] == pytest.approx(ar)
        assert rows[(16, 4, 1, 2)]["parts"]["dp_comm"] == pytest.approx((m + 1) * ar / 2)
        assert rows[(16, 4, 1, 3)]["parts"]["dp_comm"] == pytest.approx(3 * m * ar / 2)
        assert rows[(16, 4, 1, 2)]["states"]["grads"] == pytest.approx(rows[(16, 4, 1, 1)]["states"]["grads"] / 16)


def test_recomputation_costs_a_forward_and_keeps_layer_inputs(rows):
    by = {(r["dp"], r["tp"], r["pp"], r["zero_stage"], r["checkpointing"]): r for r in rows}
    none, full = by[(2, 4, 8, 1, "none")], by[(2, 4, 8, 1, "full")]
    assert full["parts"]["compute"] == pytest.approx(4 / 3 * none["parts"]["compute"])
    assert full["parts"]["tp_comm"] == pytest.approx(6 / 4 * none["parts"]["tp_comm"])  # forward AllReduces again
    s, h, L_ = 4096, 8192, 10                                      # 80 layers / 8 stages
    assert none["activation_bytes"] == pytest.approx(8 * L_ * 34 * s * h / 4)        # SP: / tp; 8 in flight
    assert full["activation_bytes"] == pytest.approx(8 * L_ * 2 * s * h / 4 + 34 * s * h / 4)
    assert full["state_bytes"] == none["state_bytes"]
    only = L.layouts(**{**SC, "checkpointing": "none"})
    assert all(r["checkpointing"] == "none" for r in only) and len(only) * 2 == len(rows)


def test_bytes_per_gpu_equal_the_formula(rows):
    n = L.MODELS["llama2-70b"].n_params
    for r in rows:
        assert r["state_bytes"] == layout_state_bytes(n, dp=r["dp"], tp=r["tp"], pp=r["pp"],
                                                      zero_stage=r["zero_stage"])["total"]


def test_best_fits_and_is_fastest(rows):
    best = L.best_layout(rows)
    assert best["fits"] and best["step_s"] == min(r["step_s"] for r in rows if r["fits"])
    c = L.choice(rows)
    assert c["verdict"] == "fits" and c["name"] == L._name(best) and c["step_s"] == best["step_s"]
    assert c["total_gb"] == pytest.approx(c["state_gb"] + c["act_gb"]) and c["total_gb"] <= c["usable_gb"]
    assert c["state_gb"] == pytest.approx(c["params_gb"] + c["grads_gb"] + c["optimizer_gb"])
    assert c["runner_up"] in ("tie", "faster") and c["ru_step_s"] >= c["step_s"]
    assert (best["dp"], best["tp"], best["pp"], best["zero_stage"]) == (2, 4, 8, 1)  # the review's ZeRO-1, 6.17 s


def test_choice_calls_a_near_tie_a_tie():
    rows = L.layouts(**SC)
    best = L.best_layout(rows)
    other = [r for r in rows if r["fits"] and (r["dp"], r["tp"], r["pp"]) != (best["dp"], best["tp"], best["pp"])]
    ru = min(other, key=lambda r: r["step_s"])
    c = L.choice(rows)
    assert c["ratio"] == ru["step_s"] / best["step_s"] and c["ru_name"] == L._name(ru)
    assert c["runner_up"] == ("tie" if ru["step_s"] / best["step_s"] - 1 < L.TIE else "faster")
    far = [best, {**ru, "step_s": best["step_s"] * 1.3}]       # a clear gap: the part that differs most
    f = L.choice(far)
    assert f["runner_up"] == "faster" and f["ratio"] == pytest.approx(1.3)
    diff = {k: ru["parts"][k] - best["parts"][k] for k in L.PARTS}
    assert f["part"] == max(diff, key=diff.get) and f["part_name"] == L.PART_NAMES[f["part"]]
    assert L.choice([best])["runner_up"] is None             # no other split fits: nothing to compare


def test_a_model_too_big_has_no_fitting_row_and_says_so():
    rows = L.layouts("llama3-405b", "h100-sxm", 8, global_batch=16)
    assert rows and not any(r["fits"] for r in rows) and L.best_layout(rows) is None
    c = L.choice(rows)
    least = min(rows, key=lambda r: r["bytes_per_gpu"])
    assert c["verdict"] == ("none_fits_recomputed" if least["checkpointing"] == "full" else "none_fits")
    assert c["total_gb"] == least["bytes_per_gpu"] / 1e9 > c["usable_gb"]
    assert L.choice([])["verdict"] == "no_layout"


@pytest.mark.parametrize("answer", [{"dp": 2, "tp": 4, "pp": 8, "zero_stage": 1}, (2, 4, 8, 1), [2, 4, 8, 0],
                                    {"dp": 4, "tp": 8, "pp": 2, "zero_stage": 1}, (16, 4, 1, 3)])
def test_check_layout_accepts_right_answers_in_any_form(answer):
    ok, why = check_layout(SC, answer)
    assert ok, why


@pytest.mark.parametrize("answer, words", [
    ((4, 4, 8, 1), "more than the 64"),            # too many GPUs
    ((1, 4, 8, 1), "fewer than the 64"),
    ((1, 16, 4, 0), "larger than a node"),         # tp > node size
    ((16, 3, 1, 0), "multiply"),                   # 48 GPUs
    ((2, 32, 1, 0), "larger than a node"),
    ((4, 1, 16, 0), "fit"),                        # fits? 70B / 16 stages at ZeRO-0: check below
    ((1, 8, 8, 5), "does not exist"),
    ((2, 4, 8, 2), "ZeRO-2 with pipeline parallelism"),   # the old pick: DeepSpeed refuses it, Megatron is ZeRO-1
    ((4, 8, 2, 3), "ZeRO-0 or ZeRO-1"),
])
def test_check_layout_names_what_is_wrong(answer, words):
    ok, why = check_layout(SC, answer)
    if words == "fit":  # whichever it is, the checker agrees with the row
        row = next(r for r in L.layouts(**{**SC, "zero_stages": (0,)}) if (r["dp"], r["tp"], r["pp"]) == answer[:3])
        assert ok == row["fits"]
        return
    assert not ok and words in why, why


def test_check_layout_heads_layers_and_memory():
    ok, why = check_layout({**SC, "n_gpus": 48, "node_size": 8, "global_batch": 96}, (16, 3, 1, 0))
    assert not ok and "node size" in why                              # 3 does not divide the node of 8
    ok, why = check_layout({**SC, "model": "large", "n_gpus": 6, "node_size": 6, "global_batch": 12},
                             (1, 6, 1, 0))
    assert not ok and "16 attention heads" in why                     # 6 does not divide 16 heads
    ok, why = check_layout({**SC, "global_batch": 100}, (8, 8, 1, 3))
    assert not ok and "global batch" in why                           # 8 does not divide 100 sequences
    ok, why = check_layout({**SC, "model": "llama3-405b"}, (1, 8, 8, 0))
    assert not ok and "126 layers" in why                             # 8 does not divide 126
    ok, why = check_layout(SC, (64, 1, 1, 0))
    assert not ok and "does not fit" in why and "GB per GPU" in why   # plain DDP of 70B
    ok, why = check_layout({**SC, "global_batch": 64}, (16, 1, 4, 1))
    assert "m ≥ p" not in why                                         # 4 micro-batches for 4 stages is fine...
    ok, why = check_layout({**SC, "global_batch": 32}, (16, 1, 4, 1))
    assert not ok and "m ≥ p" in why and "2 micro-batches" in why     # ...2 for 4 stages is not
    gqa = Shape("a GQA model", 8, 1024, 16, 2048, n_kv_head=2)
    ok, why = check_layout({**SC, "model": gqa, "n_gpus": 4, "node_size": 4, "global_batch": 8}, (1, 4, 1, 0))
    assert not ok and "2 K/V heads" in why                            # 4 divides 16 heads but not 2 K/V heads
    assert all(r["tp"] <= 2 for r in L.layouts(gqa, "h100-sxm", 4, node_size=4, global_batch=8))


def test_the_hint_names_what_is_too_big():
    ok, why = check_layout(SC, (8, 1, 8, 1))        # 47 GB of state, 91 GB of activations on stage 0
    assert not ok and "too big is the activations" in why and "recomputation" in why and "more TP" in why
    assert "No ZeRO stage shards activations" in why and "whatever pp is" in why
    assert "higher ZeRO stage" not in why
    ok, why = check_layout(SC, (64, 1, 1, 3))       # FSDP alone: the state is sharded, the activations are not
    assert not ok and "too big is the activations" in why and "it would fit" in why
    ok, why = check_layout(SC, (8, 8, 1, 0))        # 138 GB of state, 11 GB of activations
    assert not ok and "too big is the model state" in why and "ZeRO-1 on this split" in why
    assert "recomputation" not in why
    ok, why = check_layout(SC, (64, 1, 1, 0))       # plain DDP: both
    assert not ok and "Both are too big" in why


def test_config_errors_before_work():
    with pytest.raises(ConfigError, match="did you mean 'h100-sxm'"):
        L.layouts("llama2-70b", "h100-sxn", 64)
    with pytest.raises(ConfigError, match="n_gpus"):
        L.layouts("llama2-70b", "h100-sxm", 0)
    with pytest.raises(ConfigError, match="node_size"):
        L.layouts("llama2-70b", "h100-sxm", 60, node_size=8)
    with pytest.raises(ConfigError, match="did you mean 'llama2-70b'"):
        L.layouts("llama2-70", "h100-sxm", 64)
    with pytest.raises(ConfigError, match="interconnect"):
        L.layouts("llama2-70b", "h100-sxm", 64, interconnect="carrier pigeon")
    with pytest.raises(ConfigError, match="zero_stages"):
        L.layouts("llama2-70b", "h100-sxm", 64, zero_stages=(4,))
    with pytest.raises(ConfigError, match="FP8"):
        L.layouts("llama2-70b", "a100-80gb", 64, precision="fp8")
    with pytest.raises(ConfigError, match="answer"):
        check_layout(SC, "2x4x8")


def test_the_widget_draws_with_the_chapters_function():
    rows = L.layouts("llama2-70b", "h100-sxm", 64, global_batch=128)
    drawn = []
    box = L.layout_widget(drawn.append, global_batch=128)
    r0 = box.view()
    assert L.best_layout(r0) == L.best_layout(rows) and drawn == [r0]
    box.controls["model"].value = "gpt3-175b"           # redraws: a different model, different rows
    assert box.view()[0]["states"] != r0[0]["states"] and drawn[-1] is box.view()
    box.controls["n_gpus"].value = 16                    # too small for 175B: drawn, and no row fits
    assert L.choice(box.view())["verdict"].startswith("none_fits") and drawn[-1] is box.view()
    with pytest.raises(ConfigError, match="draw"):
        L.layout_widget("not a function")


def test_published_layouts_checked():
    entries = L.published_layouts()
    assert len(entries) >= 2 and all(e["dp"] * e["tp"] * e["pp"] * e.get("cp", 1) == e["n_gpus"] for e in entries)
    assert all(e["source"] and e["verified"] for e in entries)
    checks = L.published_check()
    by = {c["name"]: c for c in checks}
    nemo = by["GPT-3 175B on 512 H100 (NeMo, FP8)"]
    assert nemo["row"] is not None and nemo["rank"] is not None and nemo["rank"] >= 1
    meta = by["Llama 3 405B on 16,384 H100 (Meta)"]
    assert not meta["strict_rules_allow"]               # PP 16 does not divide 126 layers
    assert all("latest" not in e["url"] for e in entries)
    rows = {r["name"]: r for r in L.published_rows(checks)}
    assert all(r["label"] == "predicted" for r in rows.values()) and "Table 4" in rows[meta["name"]]["cite"]
    assert rows[meta["name"]]["uneven"] and rows[nemo["name"]]["verdict"] in ("own_pick", "tie", "differs")
    # provenance (what a maintainer checked, and how) stays in the data, never in a row the chapter draws
    assert not any("reference search" in str(v) or "review" in str(v) for r in rows.values() for v in r.values())
    # predicted step against the published one, for every row whose source gives a throughput
    assert nemo["published_step_s"] == pytest.approx(2048 * 2048 / (825 * 512))          # ~9.9 s
    assert nemo["predicted_over_published"] == pytest.approx(nemo["row"]["step_s"] / nemo["published_step_s"])
    assert meta["published_step_s"] == pytest.approx(meta["row"]["model_flops"] / (400e12 * 16384))
    own = by["Llama 2 70B on 64 H100 (NeMo, FP8): the chapter's scenario"]                # the 4th check
    assert own["published"] == (4, 4, 4) and own["published_step_s"] == pytest.approx(128 * 4096 / (1728 * 64))
    assert own["rank"] is not None
    for c in checks:
        assert rows[c["name"]]["ratio"] == c["predicted_over_published"]
        assert rows[c["name"]]["verdict"] == L.published_verdict(c)


def test_fp8_mfu_same_flops_two_peaks():
    m = L.mfu_both(1e18, 2.0, 8, "h100-sxm")
    assert m["mfu_bf16_peak"] == pytest.approx(1e18 / 2 / 8 / 989.5e12)
    assert m["mfu_bf16_peak"] / m["mfu_fp8_peak"] == pytest.approx(1979.0 / 989.5) == m["peak_ratio"]
    c = L.fp8_compare("llama2-70b", "h100-sxm", 64, dp=2, tp=4, pp=8, zero_stage=1, global_batch=128)
    assert c["fp8"]["step_s"] < c["bf16"]["step_s"] and 1 < c["speedup"] < 2
    assert c["fp8"]["parts"]["tp_comm"] == c["bf16"]["parts"]["tp_comm"]  # only the linear GEMMs change
    bf16_row, fp8_row = L.fp8_rows(c)
    assert fp8_row["mfu_bf16_peak"] / fp8_row["mfu_fp8_peak"] == pytest.approx(2.0)
    assert bf16_row["step_s"] / fp8_row["step_s"] == pytest.approx(c["speedup"])
    with pytest.raises(ConfigError, match="FP8 peak"):
        L.fp8_peak("a100-80gb")


def test_fp8_skips_on_this_cpu():
    import torch
    if not torch.cuda.is_available():
        assert L.fp8_here() == {"verdict": "no_gpu", "name": None, "capability": None}


def test_context_parallel_bytes_and_memory():
    assert F.ring_step_bytes(131072, 16, 1024) == 2 * 8192 * 1024 * 2
    assert F.ring_step_bytes(4096, 4, 512, dtype_bytes=4, micro_batch=2) == 2 * 1024 * 512 * 4 * 2
    rows = F.context_rows("llama3-405b", "h100-sxm", 131072, cps=(1, 2, 4))
    assert [r["steps"] for r in rows] == [0, 1, 3]
    assert rows[1]["step_bytes_bwd"] == 2 * rows[1]["step_bytes_fwd"]
    assert rows[0]["activation_bytes_per_layer"] == pytest.approx(4 * rows[2]["activation_bytes_per_layer"])
    assert rows[1]["compute_step_s"] == pytest.approx(4 * rows[2]["compute_step_s"])  # T² per block
    s = F.hide_threshold_tokens("llama3-405b", "h100-sxm")
    r = F.ring_attention_layer(L.MODELS["llama3-405b"], L.gpu_spec("h100-sxm"), int(round(s)) * 4, 4,
                                L.LINKS["infiniband"].__class__("no latency", L.LINKS["infiniband"].bandwidth, 0.0))
    assert r["comm_step_s"] == pytest.approx(r["compute_step_s"], rel=0.01)  # the threshold is where they meet
    with pytest.raises(ConfigError, match="cp"):
        F.ring_step_bytes(1000, 3, 64)


def test_context_columns_are_all_per_gpu_and_the_backward_bytes_are_stated():
    one = F.context_rows("llama3-405b", "h100-sxm", 131072, cps=(4,), tp=1)[0]
    eight = F.context_rows("llama3-405b", "h100-sxm", 131072, cps=(4,), tp=8)[0]
    for k in ("step_bytes_fwd", "step_bytes_bwd", "compute_step_s", "activation_bytes_per_layer"):
        assert eight[k] == pytest.approx(one[k] / 8, rel=1e-6), k          # one unit: per GPU
    assert eight["hidden"] == one["hidden"]                                  # the verdict does not change
    fp32 = F.context_rows("llama3-405b", "h100-sxm", 131072, cps=(4,), grad_dtype_bytes=4)[0]
    assert fp32["step_bytes_bwd"] == 3 * fp32["step_bytes_fwd"]              # dK/dV in fp32: 3x, not 2x
    rows = F.context_rows("llama3-405b", "h100-sxm", 131072, cps=(1, 2, 4), tp=8)
    summary = F.context_summary(rows, "llama3-405b")
    assert summary["tp"] == 8 and summary["bwd_over_fwd"] == 2 and summary["verdict"] in ("hides", "exposed", "both")
    assert summary["first_act_gb"] == pytest.approx(4 * summary["last_act_gb"])
    with pytest.raises(ConfigError, match="K/V heads"):
        F.context_rows("llama3-405b", "h100-sxm", 131072, cps=(2,), tp=16)


def test_fp8_prediction_is_set_against_nemo():
    pub = L.fp8_published_check()
    assert pub["predicted_over_published"] > 1                              # the model is the optimistic one
    assert pub["published_mfu_bf16_peak"] == pytest.approx(768 / 989.5)
    assert pub["predicted_tokens_per_s_per_gpu"] == pytest.approx(pub["row"]["tokens_per_s"] / 64)
    assert L.fp8_peak("l4") == pytest.approx(242.5e12)                     # datasheet 485 with sparsity, halved


def test_fp8_here_does_not_claim_fp8_units_without_a_catalogue_peak(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA GeForce RTX 4090")
    assert L.fp8_here() == {"verdict": "no_peak", "name": "NVIDIA GeForce RTX 4090", "capability": "8.9"}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert L.fp8_here()["verdict"] == "fp8_units"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert L.fp8_here()["verdict"] == "no_fp8_units" and L.fp8_here()["capability"] == "8.0"


@pytest.mark.parametrize("gpu", ["t4", "p100-pcie", "v100-sxm2"])
def test_gpus_without_bf16_units_get_layouts_at_their_fp16_peak(gpu):
    """The widget's GPU menu offers every catalogue card: one without bf16 units trains in fp16 (a T4 in the
    learner's browser pass divided by a bf16 peak of 0)."""
    rows = L.layouts("gpt3-175b", gpu, 512)
    assert rows and all(r["step_s"] > 0 for r in rows)


def test_pipeline_send_carries_one_tp_slice(rows):
    """Under TP with sequence parallelism each TP rank sends its 1/tp slice of the b·s·h activation (issue 44:
    the old model charged the whole activation per rank)."""
    from labkit.whatif.roofline import LINKS
    from labkit.chapters.ch10_parallel.formulas import tp_allreduce_bytes
    d = L.model_shape(SC["model"]).d_model
    link = LINKS["infiniband"]
    checked = 0
    for r in rows:
        if r["pp"] > 1 and r["tp"] > 1:
            act = tp_allreduce_bytes(1, L.model_shape(SC["model"]).seq_len, d)
            want = 2 * r["micro_batches"] * (act / r["tp"] / link.bandwidth + link.latency)
            assert r["parts"]["pp_p2p"] == pytest.approx(want, rel=1e-12), (r["dp"], r["tp"], r["pp"])
            checked += 1
    assert checked


def test_zero_with_pp_refusal_points_at_the_row_that_models_fsdp_with_pp():
    """DeepSpeed and Megatron refuse ZeRO-2/3 with PP; PyTorch's FSDP + PP holds ZeRO-1's bytes within a step: the
    refusal names the answer that models it, and that answer's verdict is the row's."""
    ok, why = check_layout(SC, (4, 4, 4, 3))
    assert not ok and "zero_stage 1" in why
    ok1, _ = check_layout(SC, (4, 4, 4, 1))
    row = next(r for r in L.layouts(**{**SC, "zero_stages": (1,), "checkpointing": "none"})
               if (r["dp"], r["tp"], r["pp"]) == (4, 4, 4))
    assert ok1 == row["fits"]
