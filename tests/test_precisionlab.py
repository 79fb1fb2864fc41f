"""labkit.chapters.ch02_precision and chapter 02's cells that read it: figures as data, and the outcome each
cell's sentence is chosen by -- pinned with planted numbers (nothing trains, no probe runs)."""
import json
import math
from pathlib import Path

import pytest
import torch

import labkit as lk
import labkit.chapters.course  # noqa: F401  (lk.course)
from labkit.base.runtime import ConfigError
from labkit.chapters import ch02_precision as pl

NB = Path(__file__).resolve().parent.parent / "notebooks" / "02_mixed_precision.ipynb"
LOADED = "measured: best of 1 short probe ...; other programs were using the cores meanwhile, so it reads low"


def cells():
    return json.loads(NB.read_text(encoding="utf-8"))["cells"]


def cell(cid):
    return "".join(next(c for c in cells() if c["id"] == cid)["source"])


def run_cell(cid, namespace, monkeypatch):
    """Execute one chapter cell with ``namespace``; returns [(outcome chosen, values)] of its explain calls."""
    chosen, real = [], lk.course.explain

    def spy(measured, **kw):
        key = real(measured, **kw)
        chosen.append((key, kw.get("values")))
        return key
    monkeypatch.setattr(lk.course, "explain", spy)
    scope = {"lk": lk, "torch": torch, "mp": pl, "display": lambda *a: None, **namespace}
    exec(compile(cell(cid), cid, "exec"), scope)
    namespace.update(scope)  # what the cell defined, for the test to read
    return chosen


def env(**peaks):
    return {"precisions": list(peaks), "peak_flops": {p: {"flops": f, "source": s} for p, (f, s) in peaks.items()}}


# ---- #46 item 5: a "faster" follows the statistic printed beside it; a peak probed under load is not used ----

def test_a_format_is_faster_only_by_the_ratio_the_table_prints():
    rows = {r["format"]: r for r in pl.matmul_speeds(env(fp32=(1e11, "measured: x"), bf16=(1.3e11, "measured: x"),
                                                         fp16=(0.5e11, "measured: x")), remeasure=False)}
    assert rows["fp32"]["verdict"] == "reference"
    assert rows["bf16"]["vs_fp32"] == pytest.approx(1.3) and rows["bf16"]["verdict"] == "faster"
    assert rows["fp16"]["vs_fp32"] == pytest.approx(0.5) and rows["fp16"]["verdict"] == "not_faster"


def test_a_peak_probed_under_load_is_probed_again_and_refused_if_still_loaded():
    asked = []

    def again(p, result):
        asked.append(p)
        return result
    planted = env(fp32=(1e11, "measured: x"), bf16=(0.4e11, LOADED))
    quiet = {r["format"]: r for r in pl.matmul_speeds(planted, remeasure=lambda p: again(p, (1.5e11, False)))}
    assert asked == ["bf16"] and quiet["bf16"]["remeasured"] and quiet["bf16"]["verdict"] == "faster"
    busy = {r["format"]: r for r in pl.matmul_speeds(planted, remeasure=lambda p: again(p, (0.4e11, True)))}
    assert busy["bf16"]["verdict"] == "refused" and busy["bf16"]["vs_fp32"] is not None
    # fp32's own peak under load makes every ratio meaningless: all refused, none called faster
    base_loaded = pl.matmul_speeds(env(fp32=(1e10, LOADED), bf16=(1e11, "measured: x")), remeasure=False)
    assert [r["verdict"] for r in base_loaded] == ["refused", "refused"]
    assert pl.speeds_verdict(base_loaded) == "refused" and pl.speeds_verdict(busy.values()) == "refused"
    assert pl.speeds_verdict(quiet.values()) == "faster"


def test_chapter_02s_environment_cell_says_faster_from_its_own_table(monkeypatch):
    monkeypatch.setattr(lk, "env", lambda: env(fp32=(1e11, "measured: x"), bf16=(1.5e11, LOADED),
                                               fp16=(0.5e11, "measured: x")))
    monkeypatch.setattr(pl, "remeasure_peak", lambda p: (1.5e11, True))  # still busy: refused
    ns = {}
    chosen = run_cell("02-01b", ns, monkeypatch)
    assert chosen[0][0] == "refused"  # the old line printed env["fast_formats"], whatever the load
    monkeypatch.setattr(pl, "remeasure_peak", lambda p: (1.5e11, False))  # quiet now: the re-measured peak counts
    chosen = run_cell("02-01b", ns, monkeypatch)
    assert chosen[0] == ("faster", {"fast": "bf16", "refused": ""})
    monkeypatch.setattr(lk, "env", lambda: env(fp32=(1e11, "measured: x"), bf16=(1.1e11, "measured: x")))
    assert run_cell("02-01b", ns, monkeypatch)[0][0] == "none" and ns["low"] == "bf16"


def test_the_speed_sentences_live_in_the_chapter():
    src = "\n".join(cell(c["id"]) for c in cells() if c["cell_type"] == "code")
    assert "precisionnotes" not in src and "mp.matmul_speeds(env)" in src


# ---- #46 item 4: the flush exercise comes before the cell that counts flushed values ------------------------

def test_the_flush_exercise_comes_before_any_cell_that_reveals_it():
    order = [c["id"] for c in cells()]
    revealing = [c["id"] for c in cells() if c["cell_type"] == "code" and (
        ".half() == 0" in "".join(c["source"]) or "flush_rows" in "".join(c["source"]))]
    exercise = next(c["id"] for c in cells() if "exercise-02-flush" in c["metadata"].get("tags", []))
    assert revealing and all(order.index(exercise) < order.index(r) for r in revealing)


def test_flush_rows_count_values_that_become_zero_or_subnormal():
    g = torch.tensor([0.0, 1e-9, 1e-6, 1.0])  # 1e-9 flushes in fp16; 1e-6 is subnormal; ×65536 rescues both
    plain, scaled = pl.flush_rows(g)
    assert plain["flushed"] == pytest.approx(0.25) and plain["subnormal"] == pytest.approx(0.5)
    assert scaled["flushed"] == 0 and scaled["subnormal"] == 0
    with pytest.raises(ConfigError, match="g32"):
        pl.flush_rows([1.0])


# ---- #46 item 10: one count per update, counted once ---------------------------------------------------------

def test_the_update_loop_counts_are_per_update_not_summed_or_listed(monkeypatch):
    report = {"K": 4, "allreduce_per_update": [4, 4], "grad_scalers": 2}
    counts = pl.update_loop_counts(report)
    assert counts["allreduce_per_update"] == 4 and counts["grad_scalers_per_update"] == 1
    assert counts["verdict"] == "same_each_update"
    assert pl.update_loop_counts({**report, "allreduce_per_update": [4, 1]})["verdict"] == "differs"
    chosen = run_cell("02-30", {"inspect_update_loop": lambda fn: report, "buggy_update": None}, monkeypatch)
    key, values = chosen[0]
    assert key == "same_each_update" and values["allreduce_per_update"] == 4 and values["grad_scalers_per_update"] == 1


# ---- the demos' figures -----------------------------------------------------------------------------------------

def steps(*scales, skipped=()):
    return [dict(scale=s, skipped=i + 1 in skipped, loss=5.0 - i) for i, s in enumerate(scales)]


def test_the_scaler_story_says_whether_the_scale_grew_again():
    grew = pl.scaler_story(steps(2.0**20, 2.0**19, 2.0**19, 2.0**20, skipped=(1,)), steps(1, 1, 1, 1))
    assert (grew["verdict"], grew["grew_at"], grew["skipped"], grew["start"], grew["low"]) == \
        ("grew", [4], 1, 1048576, 524288)
    flat = pl.scaler_story(steps(2.0**20, 2.0**19, 2.0**19, skipped=(1,)), steps(1, 1, 1))
    assert flat["verdict"] == "never_grew" and flat["grew_at"] == []


def test_the_bf16_scaler_summary_counts_the_steps():
    with_scaler = [dict(loss=1.0, skipped=i == 4, scale=1.0, finite=True) for i in range(1, 9)]
    without = [dict(loss=1.0 if i < 4 else math.nan, finite=i < 4) for i in range(1, 9)]
    seen = pl.bf16_scaler_summary(with_scaler, without, bad_step=4)
    assert (seen["verdict"], seen["skipped"], seen["over"], seen["normal"], seen["later_nan"], seen["later"]) == \
        ("hidden", "4", 0, 7, 4, 4)
    assert pl.bf16_scaler_summary(with_scaler, with_scaler, 4)["verdict"] == "both_finite"
    assert len(pl.bf16_scaler_rows(with_scaler, without)) == 8
