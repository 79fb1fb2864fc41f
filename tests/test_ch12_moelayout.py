"""Chapter 12's layout chooser with experts (labkit.chapters.ch12_compose.moelayout): the published
shapes' parameter counts, the EP bytes and all-to-all formulas, the bytes per GPU, the rules every
layout obeys, and the chooser's pick for the section's and the exercise's scenarios (predicted)."""
import math

import pytest

from labkit.base.runtime import ConfigError
from labkit.chapters.ch10_parallel import formulas
from labkit.chapters.ch12_compose import moe
from labkit.chapters.ch12_compose import moelayout as ml
from labkit.whatif import layouts as shared
from labkit.whatif.roofline import LINKS


def _without_ck(sc):
    return {k: v for k, v in sc.items() if k != "checkpointing"}


@pytest.mark.parametrize("model", sorted(ml.MOE_MODELS))
def test_published_totals_and_active_counts_follow_from_the_shapes(model):
    p, pub = ml.param_counts(ml.MOE_MODELS[model]), ml.published(model)
    assert p["total"] == pytest.approx(pub["total"], rel=0.01)
    assert p["active"] == pytest.approx(pub["active"], rel=0.02)   # embeddings counted in "active"
    assert p["total"] == p["routed"] + p["dense"] and p["active"] < p["total"]
    assert pub["shape"] and pub["published"] and pub["url"].startswith("https://")


def test_deepseek_v3_by_hand():
    s = ml.MOE_MODELS["deepseek-v3"]
    d, h = 7168, 128
    mla = (d * 1536 + 1536 + 1536 * h * 192 + d * (512 + 64) + 512 + 512 * h * 256 + h * 128 * d
           + 2 * d)
    assert ml.attention_params(s) == mla
    expert = 3 * d * 2048
    total = 61 * mla + 3 * 3 * d * 18432 + 58 * (257 * expert + 256 * d) + 2 * 129280 * d + d
    active = total - 58 * (256 - 8) * expert
    p = ml.param_counts(s)
    assert (p["total"], p["active"]) == (total, active)
    assert p["total"] / 1e9 == pytest.approx(671.0, abs=0.5)
    assert p["active"] / 1e9 == pytest.approx(37.5, abs=0.1)


def test_mixtral_by_hand_and_flops_from_the_active_parameters():
    s = ml.MOE_MODELS["mixtral-8x7b"]
    d, f = 4096, 14336
    layer = 2 * d * 4096 + 2 * d * 1024 + 2 * d + 8 * 3 * d * f + 8 * d
    assert ml.param_counts(s)["total"] == 32 * layer + 2 * 32000 * d + d
    fl = ml.flops_per_token(s, 4096)
    assert fl["matmul"] == 6 * (ml.param_counts(s)["active"] - 32000 * d)
    assert fl["attention"] == 6 * 32 * 4096 * 32 * (128 + 128)


def test_the_all_to_all_bytes_and_seconds():
    a = ml.alltoall_bytes(1024, 8, 7168, 8)
    assert a["payload"] == 1024 * 8 * 7168 * 2 and a["leaving"] == a["payload"] * 7 / 8
    assert ml.alltoall_bytes(1024, 8, 7168, 1)["leaving"] == 0
    nv, ib = LINKS["nvlink"], LINKS["infiniband"]
    p = a["payload"]
    assert ml.alltoall_s(p, 1, 8, nv, ib) == 0.0
    assert ml.alltoall_s(p, 8, 8, nv, ib) == pytest.approx(p * 7 / 8 / nv.bandwidth + nv.latency)
    # 16 ranks over 2 nodes: 7 peers over NVLink, 8 over InfiniBand, at once: InfiniBand sets it
    assert ml.alltoall_s(p, 16, 8, nv, ib) == pytest.approx(p * 8 / 16 / ib.bandwidth + ib.latency)
    assert ml.alltoall_s(p, 64, 8, nv, ib) > 5 * ml.alltoall_s(p, 8, 8, nv, ib)


def test_expert_state_is_split_by_ep_and_pp_and_sharded_by_zero_over_edp_only():
    s = ml.MOE_MODELS["qwen3-235b-a22b"]
    layers = math.ceil(94 / 8)
    experts = layers * 128 * 3 * 4096 * 1536 / 8
    m0 = ml.layout_bytes(s, 4, 2, 8, 8, 0, 4096, 1, 64, "full")
    assert m0["expert_params"] == experts and m0["expert_state"] == pytest.approx(16 * experts)
    m1 = ml.layout_bytes(s, 4, 2, 8, 4, 1, 4096, 1, 64, "full")     # ep 4: edp = 8 / 4 = 2
    assert m1["expert_state"] == pytest.approx((2 + 2 + 12 / 2) * 2 * experts)
    dense = ml.layout_bytes(s, 4, 2, 8, 8, 1, 4096, 1, 64, "full")
    assert dense["dense_state"] == pytest.approx((2 + 2 + 12 / 4) * dense["dense_params"])
    assert dense["total"] == pytest.approx(dense["dense_state"] + dense["expert_state"]
                                           + dense["activations"])


def test_every_layout_obeys_the_rules():
    rows = ml.layouts(**ml.EXAMPLE_SCENARIO)
    s = ml.MOE_MODELS["deepseek-v3"]
    assert rows and all(r["label"] == "predicted" for r in rows)
    for r in rows:
        assert r["dp"] * r["tp"] * r["pp"] == 256
        assert (r["dp"] * r["tp"]) % r["ep"] == 0 and s.n_experts % r["ep"] == 0
        assert 8 % r["tp"] == 0 and r["micro_batches"] >= r["pp"]
        assert r["pp"] == 1 or r["zero_stage"] <= 1
        assert r["edp"] == r["dp"] * r["tp"] // r["ep"]
        assert r["step_s"] == pytest.approx(sum(r["parts"].values()))
        assert (r["parts"]["ep_alltoall"] == 0) == (r["ep"] == 1)
    fits = [r["fits"] for r in rows]
    assert fits == sorted(fits, reverse=True)


def test_the_chooser_picks_for_the_sections_scenario():
    rows = ml.layouts(**ml.EXAMPLE_SCENARIO)
    best = ml.best_layout(rows)
    assert (best["dp"], best["tp"], best["pp"], best["ep"], best["zero_stage"],
            best["checkpointing"]) == (2, 4, 32, 8, 1, "none")
    c = ml.choice(rows)
    assert c["verdict"] == "in_node" and c["runner_up"] == "faster" and c["ep"] == 8
    assert c["expert_gb"] > c["dense_gb"]          # the experts' state is most of a GPU's bytes
    cross = [r for r in rows if r["fits"] and r["ep_crosses_nodes"]]
    assert cross and min(r["step_s"] for r in cross) > 1.25 * best["step_s"]


def test_the_chooser_picks_for_the_exercises_scenario():
    sc = ml.EXERCISE_SCENARIO
    rows = ml.layouts(**_without_ck(sc), checkpointing=(sc["checkpointing"],))
    best = ml.best_layout(rows)
    assert (best["dp"], best["tp"], best["pp"], best["ep"], best["zero_stage"]) == (2, 2, 16, 4, 1)
    assert ml.find(rows, 4, 2, 8, 8, 1)["fits"]


def test_choice_without_a_fit_or_a_row():
    rows = ml.layouts("deepseek-v3", "h100-sxm", 8, global_batch=64)
    assert not any(r["fits"] for r in rows)
    c = ml.choice(rows)
    assert c["verdict"] == "none_fits" and c["total_gb"] > c["usable_gb"]
    assert ml.choice([]) == {"verdict": "no_layout", "runner_up": None}


@pytest.mark.parametrize("kw", [
    dict(model="deepseek"), dict(gpu="h100"), dict(n_gpus=0), dict(n_gpus=True), dict(node_size=7),
    dict(interconnect="wifi"), dict(global_batch=0), dict(seq_len=-1), dict(micro_batch=1.5),
    dict(zero_stages=(4,)), dict(zero_stages=()), dict(checkpointing="some"),
    dict(checkpointing=()),
])
def test_bad_input_is_a_config_error(kw):
    with pytest.raises(ConfigError):
        ml.layouts(**{**ml.EXAMPLE_SCENARIO, **kw})


def test_bad_formula_input_is_a_config_error():
    for args in ((0, 8, 7168, 8), (1024, 8, 7168, 0), (1024, True, 7168, 8)):
        with pytest.raises(ConfigError):
            ml.alltoall_bytes(*args)
    with pytest.raises(ConfigError):
        ml.published("gpt-4")


def test_chapter_10_re_imports_what_moved_down():
    assert formulas.gpu_spec is shared.gpu_spec
    assert formulas.bubble_fraction is shared.bubble_fraction
    assert formulas.GB == shared.GB and formulas.BUBBLE_DEFINITIONS == shared.BUBBLE_DEFINITIONS


def test_the_chapters_layout_section():
    import json
    import re
    from pathlib import Path

    nb = Path(__file__).resolve().parent.parent / "notebooks" / "12_composing_the_layout.ipynb"
    every = json.loads(nb.read_text())["cells"]
    heads = ["".join(c["source"]).split("\n", 1)[0] if c["cell_type"] == "markdown" else "" for c in every]
    start = heads.index("## Choosing a layout with experts")
    end = next(i for i in range(start + 1, len(every)) if heads[i].startswith("## "))
    cells = every[start:end]
    src = ["".join(c["source"]) for c in cells]
    assert cells[0]["cell_type"] == "markdown"
    assert src[0].startswith("## Choosing a layout with experts\n")
    tags = {t for c in cells for t in c["metadata"].get("tags", [])}
    assert {"measure-12-moe-layout", "exercise-12-moe-layout", "code-12-moe-layout"} <= tags
    code = [s for c, s in zip(cells, src) if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None
               for c in cells if c["cell_type"] == "code")
    assert all(len(s.splitlines()) <= 20 and max(map(len, s.splitlines())) <= 100 for s in code)
    for guess in re.findall(r"^(my_guess\w*) = None", "\n".join(code), re.M):
        assert re.search(rf"compare_prediction\({guess}\b", "\n".join(code))
    assert "lk.check.moe_layout_fits(my_moe_layout)" in "\n".join(code)


# ---- active versus total (moe_params) ---------------------------------------------------

def test_params_of_the_tiny_model_equal_its_modules():
    model = moe.tiny_model(seed=0)
    p = ml.moe_params(**ml.tiny_shape(model))
    assert p["total"] == sum(t.numel() for t in model.parameters())
    expert = sum(t.numel() for t in model.moes()[0].experts[0].parameters())
    assert p["active"] == p["total"] - 2 * (8 - 2) * expert
    assert p["weights_bytes"] == 4 * p["total"]


def test_mixtral_8x7b_is_46_7b_total_and_12_9b_active():
    p = ml.moe_params(**ml.MIXTRAL_8X7B)
    assert p["total"] == 46_702_792_704  # the released checkpoint's count
    assert p["active"] == pytest.approx(12.9e9, rel=0.005)
    assert p["weights_bytes"] == 2 * p["total"]
    expert = 3 * 4096 * 14336
    assert p["dense_flops_per_token"] - p["flops_per_token"] == 6 * 32 * 6 * expert


def test_bad_moe_params_input_is_refused():
    with pytest.raises(ConfigError):
        ml.moe_params(**{**ml.MIXTRAL_8X7B, "norm": "batch"})
    with pytest.raises(ConfigError):
        ml.moe_params(**{**ml.MIXTRAL_8X7B, "top_k": 9})
