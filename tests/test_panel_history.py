"""The what-if model beside every run: ``lk.predict`` exported, the panel's predicted line after a run,
its "on another GPU" picker and chart (predicted bars labelled predicted), and chapter 09's what-if
helpers on made-up numbers."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.panel import history as panel_whatif
from labkit.tools import plots  # noqa: E402
from labkit import whatif as predict_mod  # noqa: E402


def test_predict_is_exported():
    assert "predict" in lk.__all__ and "Prediction" in lk.__all__
    p = lk.predict(lk.Config(model="tiny", micro_batch=2), device="t4")
    assert isinstance(p, lk.Prediction) and p.label == "predicted" and p.step_time_s > 0
    # the module stays reachable under the same name: its catalogue, its helpers
    assert "t4" in lk.whatif.catalogue()["devices"] and callable(predict_mod.trace_step)


@pytest.fixture(scope="module")
def lab_after_run():
    lab = lk.Lab(model="tiny", steps=2, micro_batch=2)
    lab.run()
    return lab


def test_panel_shows_a_predicted_line_after_a_run(lab_after_run):
    lab = lab_after_run
    assert "predicted" in lab.predicted_text
    assert "measured" in lab.predicted_text
    # an error beside the measurement, or -- when its inputs were measured under load (this machine's
    # load decides which) -- a warning instead, never both: an error of an untrusted number is no error
    assert ("error" in lab.predicted_text) != ("not trustworthy" in lab.predicted_text)
    assert "predicted" in lab._whatif.line.value


def test_gpu_picker_lists_every_catalogue_key(lab_after_run):
    keys = set(predict_mod.catalogue()["devices"])
    assert {v for _, v in lab_after_run._whatif.gpu.options} == keys
    assert {"t4", "l4", "rtx4090", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "h200-nvl",
            "mi300x"} <= keys


def test_picking_a_gpu_draws_a_predicted_bar(lab_after_run):
    fig = lab_after_run.show_whatif("a100-80gb")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert any("A100" in s and "PREDICTED" in s for s in labels)
    assert any("measured" in s for s in labels)
    assert "predicted" in lab_after_run._whatif.note.value
    assert lab_after_run._whatif.img.value  # a PNG was drawn


def test_chart_labels_predicted_bars_as_predicted():
    pred = {"step_time_s": 0.002, "device_name": "NVIDIA T4"}
    fig = plots.whatif([{"step_time_s": 0.05, "model": "tiny"}], [pred])
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == 2
    assert "measured" in labels[0] and "PREDICTED" not in labels[0]
    assert "T4" in labels[1] and "PREDICTED" in labels[1]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("(predicted)" in t for t in texts) and any("(predicted)" not in t and "ms" in t for t in texts)


def test_chart_without_runs_says_so():
    fig = plots.whatif([], [])
    assert "no run yet" in fig.axes[0].texts[0].get_text()


def test_predicted_line_words():
    class P:
        step_time_s = 0.040
    line = panel_whatif.predicted_line(P(), {"step_time_s": 0.050})
    assert line.startswith("predicted for this machine: 40 ms/step") and "measured 50" in line and "-20%" in line
    assert panel_whatif.predicted_line("no prediction for x: y", {}) == "no prediction for x: y"


def test_prediction_is_cached_per_config():
    cfg = lk.Config(model="tiny", micro_batch=2, steps=3)
    first = panel_whatif.cached_prediction(cfg, "t4")
    assert panel_whatif.is_cached(cfg.replace(steps=50), "t4")  # a run's length does not change its step
    assert panel_whatif.cached_prediction(cfg.replace(steps=50), "t4") is first


def test_this_device_key():
    class Caps:
        kind, name = "cpu", "whatever CPU"
    assert panel_whatif.this_device_key(Caps()) == "this"
    Caps.kind, Caps.name = "cuda", "NVIDIA H200"
    assert panel_whatif.this_device_key(Caps()) in ("h200-sxm", "h200-nvl")
    Caps.name = "Some Unknown GPU"
    assert panel_whatif.this_device_key(Caps()) is None


@pytest.mark.parametrize("name, memory_gb, key", [
    ("NVIDIA A100-SXM4-80GB", 85, "a100-80gb"), ("NVIDIA A100-SXM4-40GB", 42, "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", 42, "a100-40gb"), ("NVIDIA A100 80GB PCIe", 85, "a100-80gb"),
    ("NVIDIA A100-SXM4", 85, "a100-80gb"), ("NVIDIA H100 80GB HBM3", 85, "h100-sxm"),
    ("NVIDIA H100 PCIe", 85, "h100-pcie"), ("NVIDIA H100 NVL", 100, None), ("NVIDIA H200", 150, "h200-sxm"),
    ("NVIDIA H200 NVL", 150, "h200-nvl"), ("Tesla T4", 16, "t4"), ("NVIDIA L4", 24, "l4"),
    ("NVIDIA GeForce RTX 4090", 25, "rtx4090"), ("AMD Instinct MI300X", 206, "mi300x"),
    ("NVIDIA GeForce RTX 3090", 25, None), ("NVIDIA L40S", 48, None)])
def test_the_names_torch_gives_find_their_catalogue_entry(name, memory_gb, key):
    class Caps:
        kind = "cuda"
    Caps.name, Caps.memory_bytes = name, memory_gb * 1e9
    assert panel_whatif.this_device_key(Caps()) == key


# ---- chapter 09's what-if cell: its helpers on made-up numbers ----------------------------------------

def test_error_rows_and_sentence():
    rows = predict_mod.error_rows(["fp32", "bf16", "mb8"], [0.010, 0.020, 0.040], [0.012, 0.015, 0.040])
    assert [r["error"] for r in rows] == pytest.approx([0.2, -0.25, 0.0])
    words = predict_mod.error_sentence(rows)
    assert "median error is 20%" in words and "bf16 (-25%)" in words and "3 configurations" in words
    assert "faster for the rest" in words
    assert "slower than measured for every" in predict_mod.error_sentence(predict_mod.error_rows(["a"], [1.0], [2.0]))
    assert predict_mod.error_rows(["x"], [None], [1.0])[0]["error"] is None
    assert predict_mod.error_sentence([]).startswith("No configuration")


def test_predicted_vs_measured_chart_labels_predicted():
    rows = predict_mod.error_rows(["fp32", "bf16"], [0.010, 0.020], [0.012, 0.015])
    ax = plots.predicted_vs_measured(rows).axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert any("PREDICTED" in t for t in texts) and "+20%" in texts and "-25%" in texts
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16"]
