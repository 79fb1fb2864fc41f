"""Chapter 10's layout chooser, FP8 and context-parallel arithmetic: pure, fast (no processes, no timing)."""
import pytest

from labkit.base.errors import ConfigError
from labkit.chapters.parallel import context as cx
from labkit.chapters.parallel import fp8
from labkit.chapters.parallel import layout as L
from labkit.chapters.parallel.formulas import layout_state_bytes
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
        assert r["step_s"] > 0 and r["fits"] == (r["bytes_per_gpu"] <= r["usable_bytes"])
        assert r["step_s"] == pytest.approx(sum(r["parts"].values()))
    combos = {(r["dp"], r["tp"], r["pp"], r["zero_stage"]) for r in rows}
    assert len(combos) == len(rows)
    assert (8, 8, 1, 3) in combos and (1, 8, 8, 0) in combos  # a few that must be there


def test_bytes_per_gpu_equal_the_formula(rows):
    n = L.MODELS["llama2-70b"].n_params
    for r in rows:
        assert r["state_bytes"] == layout_state_bytes(n, dp=r["dp"], tp=r["tp"], pp=r["pp"],
                                                      zero_stage=r["zero_stage"])["total"]


def test_best_fits_and_is_fastest(rows):
    best = L.best_layout(rows)
    assert best["fits"] and best["step_s"] == min(r["step_s"] for r in rows if r["fits"])
    note = L.choice_note(rows)
    assert "predicted" in note.lower() and "fits because" in note and "next split" in note


def test_a_model_too_big_has_no_fitting_row_and_says_so():
    rows = L.layouts("llama3-405b", "h100-sxm", 8, global_batch=16)
    assert rows and not any(r["fits"] for r in rows) and L.best_layout(rows) is None
    assert "No layout fits" in L.choice_note(rows)


@pytest.mark.parametrize("answer", [{"dp": 2, "tp": 4, "pp": 8, "zero_stage": 1}, (2, 4, 8, 1), [2, 4, 8, 2],
                                    {"dp": 4, "tp": 8, "pp": 2, "zero_stage": 3}])
def test_check_layout_accepts_right_answers_in_any_form(answer):
    ok, why = L.check_layout(SC, answer)
    assert ok, why


@pytest.mark.parametrize("answer, words", [
    ((4, 4, 8, 1), "more than the 64"),            # too many GPUs
    ((1, 4, 8, 1), "fewer than the 64"),
    ((1, 16, 4, 0), "larger than a node"),         # tp > node size
    ((16, 3, 1, 0), "multiply"),                   # 48 GPUs
    ((2, 32, 1, 0), "larger than a node"),
    ((4, 1, 16, 0), "fit"),                        # fits? 70B / 16 stages at ZeRO-0: check below
    ((1, 8, 8, 5), "does not exist"),
])
def test_check_layout_names_what_is_wrong(answer, words):
    ok, why = L.check_layout(SC, answer)
    if words == "fit":  # whichever it is, the checker agrees with the row
        row = next(r for r in L.layouts(**{**SC, "zero_stages": (0,)}) if (r["dp"], r["tp"], r["pp"]) == answer[:3])
        assert ok == row["fits"]
        return
    assert not ok and words in why, why


def test_check_layout_heads_layers_and_memory():
    ok, why = L.check_layout({**SC, "n_gpus": 48, "node_size": 8, "global_batch": 96}, (16, 3, 1, 0))
    assert not ok and "node size" in why                              # 3 does not divide the node of 8
    ok, why = L.check_layout({**SC, "model": "large", "n_gpus": 6, "node_size": 6, "global_batch": 12},
                             (1, 6, 1, 0))
    assert not ok and "16 attention heads" in why                     # 6 does not divide 16 heads
    ok, why = L.check_layout({**SC, "global_batch": 100}, (8, 8, 1, 3))
    assert not ok and "global batch" in why                           # 8 does not divide 100 sequences
    ok, why = L.check_layout({**SC, "model": "llama3-405b"}, (1, 8, 8, 0))
    assert not ok and "126 layers" in why                             # 8 does not divide 126
    ok, why = L.check_layout(SC, (64, 1, 1, 0))
    assert not ok and "does not fit" in why and "GB per GPU" in why   # plain DDP of 70B


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
        L.check_layout(SC, "2x4x8")


def test_view_without_a_front_end_and_the_widget():
    rows, table, note = L.layout_view("llama2-70b", "h100-sxm", 64, global_batch=128)
    assert "predicted step s" in table and "Predicted choice" in note
    box = L.layout_widget(global_batch=128)
    r0 = box.view()[0]
    assert L.best_layout(r0) == L.best_layout(rows)
    box.controls["model"].value = "gpt3-175b"           # redraws: a different model, different rows
    assert box.view()[0][0]["states"] != r0[0]["states"]
    box.controls["n_gpus"].value = 16                    # too small for 175B: says so rather than fails
    assert "No layout fits" in box.view()[2]


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
    note = L.published_note(checks)
    assert "ranked" in note and "predicted" in note.lower() and "Table 4" in note


def test_fp8_mfu_same_flops_two_peaks():
    m = fp8.mfu_both(1e18, 2.0, 8, "h100-sxm")
    assert m["mfu_bf16_peak"] == pytest.approx(1e18 / 2 / 8 / 989.5e12)
    assert m["mfu_bf16_peak"] / m["mfu_fp8_peak"] == pytest.approx(1979.0 / 989.5) == m["peak_ratio"]
    c = fp8.fp8_compare("llama2-70b", "h100-sxm", 64, dp=2, tp=4, pp=8, zero_stage=1, global_batch=128)
    assert c["fp8"]["step_s"] < c["bf16"]["step_s"] and 1 < c["speedup"] < 2
    assert c["fp8"]["parts"]["tp_comm"] == c["bf16"]["parts"]["tp_comm"]  # only the linear GEMMs change
    assert "against the FP8 peak" in fp8.fp8_note(c, "h100-sxm")
    with pytest.raises(ConfigError, match="FP8 peak"):
        fp8.fp8_peak("a100-80gb")


def test_fp8_skips_on_this_cpu():
    import torch
    if not torch.cuda.is_available():
        assert fp8.fp8_skip_reason().startswith("skipped")


def test_context_parallel_bytes_and_memory():
    assert cx.ring_step_bytes(131072, 16, 1024) == 2 * 8192 * 1024 * 2
    assert cx.ring_step_bytes(4096, 4, 512, dtype_bytes=4, micro_batch=2) == 2 * 1024 * 512 * 4 * 2
    rows = cx.context_rows("llama3-405b", "h100-sxm", 131072, cps=(1, 2, 4))
    assert [r["steps"] for r in rows] == [0, 1, 3]
    assert rows[1]["step_bytes_bwd"] == 2 * rows[1]["step_bytes_fwd"]
    assert rows[0]["activation_bytes_per_layer"] == pytest.approx(4 * rows[2]["activation_bytes_per_layer"])
    assert rows[1]["compute_step_s"] == pytest.approx(4 * rows[2]["compute_step_s"])  # T² per block
    s = cx.hide_threshold_tokens("llama3-405b", "h100-sxm")
    r = cx.ring_attention_layer(L.MODELS["llama3-405b"], L.gpu_spec("h100-sxm"), int(round(s)) * 4, 4,
                                L.LINKS["infiniband"].__class__("no latency", L.LINKS["infiniband"].bandwidth, 0.0))
    assert r["comm_step_s"] == pytest.approx(r["compute_step_s"], rel=0.01)  # the threshold is where they meet
    with pytest.raises(ConfigError, match="cp"):
        cx.ring_step_bytes(1000, 3, 64)
