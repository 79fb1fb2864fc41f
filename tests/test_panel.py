"""The lab panel (labkit.panel.lab.Lab) driven through its Python API, as notebooks and nbval do."""
import html
import json
import time

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.engine import train
from labkit.tools import plots
from labkit.panel import lab as widgets  # noqa: E402
from labkit.engine.device import Capabilities, capabilities, max_world_size  # noqa: E402

from conftest import live_children, wait_no_children  # noqa: E402

CPU_ONLY = capabilities().kind == "cpu"
PNG = b"\x89PNG\r\n\x1a\n"
_LAB = {}


def shared_lab():
    """One panel for the tests that only move knobs (building one draws six empty charts)."""
    if "lab" not in _LAB:
        _LAB["lab"] = lk.Lab(model="tiny", steps=3)
    return _LAB["lab"]


def tiny_lab(**kw):
    return lk.Lab(**{"model": "tiny", "steps": 3, **kw})


def wait_until(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


# ---- controls <-> Config --------------------------------------------------------------------------

ALLOWED = dict(
    precision=st.sampled_from(["fp32", "fp16", "bf16"] + ([] if CPU_ONLY else ["tf32"])),
    loss_scaling=st.sampled_from(["auto", "on", "off"]),
    accum=st.integers(1, 80),
    ddp_sync=st.sampled_from(["no_sync", "every_micro"]),
    micro_batch=st.integers(1, 70),
    checkpointing=st.sampled_from(["none", "full", "selective"]),
    checkpoint_every=st.integers(1, 2),
    optimizer=st.sampled_from(["adamw", "sgd"]),
    workers=st.integers(0, 6),
    data_cost_ms=st.sampled_from([0.0, 0.5, 2.0, 12.5]),
    world_size=st.integers(1, max_world_size(capabilities())),
    model=st.sampled_from(["tiny", "small"]),
    steps=st.integers(1, 300),
    lr=st.sampled_from([3e-4, 1e-3]),  # a field without a control must survive too
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries(ALLOWED))
def test_set_then_config_round_trips(knobs):
    lab = shared_lab()
    lab.set(**knobs)
    cfg = lab.config
    for k, v in knobs.items():
        assert getattr(cfg, k) == v, k
    assert lk.Lab.config.fget(lab) == cfg
    # and back: a Config's values put on the controls give the same Config
    other = lk.Config(**{**cfg.to_dict(), "accum": cfg.accum % 7 + 1})
    lab.set(**other.to_dict())
    assert lab.config == other


def test_controls_show_what_set_put_there():
    lab = shared_lab()
    lab.set(precision="bf16", accum=8, checkpointing="full", checkpoint_every=2, workers=1)
    c = lab._knobs.controls
    assert c["precision"].value == "bf16" and c["precision"].button("bf16").value
    assert not c["precision"].button("fp32").value
    assert c["accum"].value == 8 and c["workers"].value == 1
    assert c["checkpointing"].value == "every_k" and c["checkpoint_every"].value == 2
    lab.set(checkpointing="full", checkpoint_every=1)
    assert c["checkpointing"].value == "full" and c["checkpoint_every"].disabled


def test_clicking_controls_changes_the_config():
    lab = shared_lab()
    lab.set(precision="fp32", accum=1, checkpointing="none", checkpoint_every=1, model="tiny")
    c = lab._knobs.controls
    c["precision"].button("fp16").value = True  # what a click on the fp16 button does
    assert lab.config.precision == "fp16" and not c["precision"].button("fp32").value
    c["precision"].button("fp16").value = False  # clicking the chosen option keeps it chosen
    assert c["precision"].button("fp16").value and lab.config.precision == "fp16"
    c["accum"].value = 4
    c["checkpointing"].button("every_k").value = True
    cfg = lab.config
    assert (cfg.accum, cfg.checkpointing, cfg.checkpoint_every) == (4, "full", 2)
    c["checkpointing"].button("full").value = True
    assert (lab.config.checkpointing, lab.config.checkpoint_every) == ("full", 1)
    c["model"].button("small").value = True
    assert c["checkpoint_every"].max == 4  # small has 4 blocks
    lab.set(model="tiny", precision="fp32", accum=1, checkpointing="none")


def test_bad_values_are_refused_before_any_control_moves():
    lab = shared_lab()
    lab.set(accum=2)
    with pytest.raises(lk.ConfigError):
        lab.set(accum=0)
    assert lab._knobs.controls["accum"].value == 2 and "accum=0" in lab.message
    with pytest.raises(TypeError, match="unknown knob"):
        lab.set(acum=4)


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="precision"):
        lk.Lab(preset="nope")


def test_chapter_presets_fold_the_other_knobs_away():
    lab = lk.Lab(preset="precision", model="tiny")
    shown = {row.children[0].value for row in lab._knobs.box.children}
    assert any(">precision<" in s for s in shown) and not any(">accumulation steps<" in s for s in shown)
    folded = lab._knobs.more.children[0].children
    assert any(">accumulation steps<" in row.children[0].value for row in folded)
    assert lab._knobs.more.selected_index is None  # folded
    assert lab._charts.shown == ["step_time", "memory", "throughput", "loss"]
    lab._all_charts.value = True
    assert lab._charts.shown == list(lk.plots.CHARTS)
    ddp = lk.Lab(preset="ddp", model="tiny")
    assert ddp.config.world_size == 2 and ddp.config.accum == 4



@pytest.mark.parametrize("preset", list(widgets.CHAPTER_PRESETS))
def test_every_chapter_preset_builds_with_its_own_knobs_open(preset):
    chapter = widgets.CHAPTER_PRESETS[preset]
    lab = lk.Lab(preset=preset, model="tiny")
    shown = [row.children[0].value for row in lab._knobs.box.children]
    for knob in chapter["knobs"] or widgets.KNOB_WORDS:
        assert any(f">{html.escape(widgets.KNOB_WORDS[knob][0])}<" in s for s in shown), (preset, knob)
    assert lab._charts.shown == [c for c in lk.plots.CHARTS if c in chapter["charts"]]


def test_the_lab_owns_its_parts_as_objects_not_mixins():
    from labkit.panel import history, knobs, parts
    assert lk.Lab.__mro__ == (lk.Lab, object)  # composed: no part reaches into another's attributes
    lab = shared_lab()
    assert isinstance(lab._knobs, knobs.Knobs) and isinstance(lab._history, history.History)
    assert isinstance(lab._whatif, history.WhatIf) and isinstance(lab._messages, parts.Messages)
    assert lab.history is lab._history.runs and lab.config == lab._knobs.config


def test_the_knobs_offer_configs_own_choices():
    from labkit.engine import config
    c = shared_lab()._knobs.controls
    for knob, choices in (("precision", config.PRECISIONS), ("loss_scaling", config.LOSS_SCALING),
                          ("optimizer", config.OPTIMIZERS), ("ddp_sync", config.DDP_SYNC),
                          ("model", tuple(config.PRESETS))):
        assert c[knob].options == list(choices), knob
    assert c["checkpointing"].options == list(config.CHECKPOINTING) + ["every_k"]  # the panel's own "every k"


def test_the_panel_displays_as_a_widget():
    from test_widgets_display import assert_displays_as_widget  # as a cell's last line, on ipywidgets 7 and 8

    assert_displays_as_widget(shared_lab())


# ---- what this device cannot serve ---------------------------------------------------------------

@pytest.mark.skipif(not CPU_ONLY, reason="checks the CPU-only case")
def test_controls_the_cpu_cannot_serve_are_disabled_with_the_reason():
    lab = shared_lab()
    c = lab._knobs.controls
    tf32 = c["precision"].button("tf32")
    assert tf32.disabled and "CUDA" in tf32.tooltip
    assert not c["precision"].button("bf16").disabled and not c["precision"].button("fp16").disabled
    assert c["pin_memory"].disabled and "host-to-GPU" in c["pin_memory"].tooltip
    assert c["memory_budget_gb"].disabled and "CUDA" in c["memory_budget_gb"].tooltip
    assert c["world_size"].max == max_world_size(lab.caps)
    notes = lab._knobs.notes.value
    for words in ("tf32", "pin memory", "memory budget", f"world size above {max_world_size(lab.caps)}"):
        assert words in notes
    with pytest.raises(lk.ConfigError):
        lab.set(precision="tf32")


def caps(**kw):
    base = dict(kind="cuda", name="Tesla T4", reason="test", n_devices=1, compute_capability="7.5",
                bf16=False, fp16=True, tf32=False, memory_bytes=16 * 2**30, cores=8, ddp_backend="nccl")
    return Capabilities(**{**base, **kw})


def test_a_t4_greys_out_bf16_and_tf32_and_extra_gpus():
    out = widgets.unavailable(caps())
    assert "compute capability 7.5" in out["precision"]["bf16"] and "fp16" in out["precision"]["bf16"]
    assert "8.0" in out["precision"]["tf32"]
    assert "1 GPU visible" in out["world_size"]["above 1"]
    assert "pin_memory" not in out and "memory_budget_gb" not in out  # a GPU serves both


def test_an_h100_serves_everything_but_more_gpus_than_it_has():
    out = widgets.unavailable(caps(name="NVIDIA H100", compute_capability="9.0", bf16=True, tf32=True, n_devices=8))
    assert set(out) == {"world_size"} and "8 GPUs visible" in out["world_size"]["above 8"]


def test_a_build_without_fp16_greys_it_out():
    out = widgets.unavailable(caps(kind="cpu", name="old CPU", fp16=False, bf16=False, n_devices=1, cores=4))
    assert "no fp16" in out["precision"]["fp16"] and "no bf16" in out["precision"]["bf16"]


# ---- real runs through the panel ---------------------------------------------------------------

@pytest.fixture(scope="module")
def two_runs():
    """A panel after two real tiny runs (fp32, then bf16 with accumulation), and its empty charts."""
    lab = tiny_lab(preset="all")
    empty = {k: bytes(v) for k, v in lab._charts.empty.items()}
    lab.run()
    first = {name: bytes(img.value) for name, img in lab._charts.images.items()}
    lab.run(precision="bf16", accum=2)
    return lab, empty, first


def test_a_real_run_updates_history_table_and_charts(two_runs):
    lab, empty, first = two_runs
    r, r2 = lab.history
    assert r.summary["status"] == "completed" and len(r.records) == 3
    assert r2.summary["precision"] == "bf16" and r2.config.accum == 2
    assert lab._history.table.value.count("<tr>") == 3  # header + two runs
    for name in lk.plots.CHARTS:
        assert first[name].startswith(PNG) and first[name] != empty[name], name
    assert lab._progress.value == 3 and lab._progress.bar_style == "success"
    assert "done" in lab._messages.status_line.value
    t = lab.last_timing
    assert t["renders"] >= 1 and t["first_chart_s"] is not None and 0 <= t["chart_overhead"] < 1


def test_showing_all_charts_draws_the_last_run_in_them(two_runs):
    lab = two_runs[0]
    lab._all_charts.value = False
    lab._chapter_charts = ("loss",)
    lab._show_charts()
    assert lab._charts.shown == ["loss"]
    before = bytes(lab._charts.images["utilization"].value)
    lab._all_charts.value = True
    assert lab._charts.shown == list(lk.plots.CHARTS)
    assert bytes(lab._charts.images["memory"].value) != bytes(lab._charts.empty["memory"])
    assert bytes(lab._charts.images["utilization"].value).startswith(PNG) and before


def test_compare_against_a_baseline(two_runs):
    lab = two_runs[0]
    lines = lab.compare(baseline=0)
    assert len(lines) == 1 and lines[0].startswith("bf16 accum=2: ") and "× tokens/s" in lines[0]
    assert bytes(lab._history.compare_img.value).startswith(PNG) and lab._history.compare_img.layout.display is None
    assert "× tokens/s" in lab._history.ratios.value
    assert lab.compare(baseline=1)[0].startswith("fp32 accum=1: ")
    assert lab._history.picker.value == 1
    lab.compare(baseline=0)
    with pytest.raises(IndexError):
        lab.compare(baseline=5)


def test_history_json_round_trip(two_runs, tmp_path):
    lab = two_runs[0]
    path = lab.save_history(tmp_path / "history.json")
    other = shared_lab()
    loaded = other.load_history(path)
    assert len(loaded) == 2
    for a, b in zip(lab.history, loaded):
        assert a.config == b.config
        assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)
        assert a.records == b.records
    assert other._history.table.value == lab._history.table.value
    assert other.compare(0) == lab.compare(0)
    # a run saved on a GPU machine (tf32 is refused here) still loads, to be compared
    data = json.loads((tmp_path / "history.json").read_text())
    data["runs"][1]["config"]["precision"] = "tf32"
    data["runs"][1]["summary"]["precision"] = "tf32"
    (tmp_path / "gpu.json").write_text(json.dumps(data))
    assert other.load_history(tmp_path / "gpu.json", append=True)[-1].config.precision == "tf32"
    assert len(other.history) == 4
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a labkit history"):
        other.load_history(tmp_path / "bad.json")
    other.load_history(path)


def test_out_of_memory_is_explained_and_the_next_run_works(monkeypatch):
    lab = tiny_lab()

    def oom(*args, **kwargs):  # where a real CUDA OOM surfaces: inside the forward/backward micro-steps
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                     "capacity of 15.74 GiB of which 1.12 GiB is free.")

    real = train.micro_steps
    monkeypatch.setattr(train, "micro_steps", oom)
    with pytest.raises(lk.OutOfMemory):
        lab.run()
    assert lab.message.startswith("Out of memory") and "Tried to allocate 2.00 GiB" in lab.message
    assert "micro_batch=8" in lab.message  # the numbers that explain it
    assert lab._progress.bar_style == "danger" and lab.history == [] and not lab.running
    # the Run button's path shows the same message and does not raise
    lab.start()
    assert lab.wait(60)
    assert lab.message.startswith("Out of memory") and not lab.running
    monkeypatch.setattr(train, "micro_steps", real)
    assert lab.run().summary["status"] == "completed"
    assert len(lab.history) == 1


def poison_gradients_from(update):
    """A stand-in for fp16 overflow: from ``update`` on, every gradient holds NaN after the backward."""
    real = train.micro_steps
    calls = {"n": 0}

    def micro_steps(net, *args, **kwargs):
        out = real(net, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] >= update:
            for p in net.parameters():
                p.grad.fill_(float("nan"))
        return out

    return micro_steps


def test_nan_with_fp16_and_no_loss_scaling_is_explained(monkeypatch):
    lab = tiny_lab(precision="fp16", loss_scaling="off", steps=20)
    monkeypatch.setattr(train, "micro_steps", poison_gradients_from(3))
    with pytest.raises(lk.NonFiniteError):
        lab.run()
    msg = lab.message
    assert "inf/NaN" in msg and "update 3" in msg and "65504" in msg and "loss scaling" in msg
    assert "The last good update was 2: loss" in msg  # the numbers before it went wrong
    assert lab.history == [] and lab._progress.bar_style == "danger" and not lab.running


def test_skipped_updates_are_reported_and_marked(monkeypatch):
    lab = tiny_lab(precision="fp16", loss_scaling="off", on_nonfinite="skip", steps=4)
    monkeypatch.setattr(train, "micro_steps", poison_gradients_from(3))
    r = lab.run()
    assert r.summary["status"] == "completed" and r.summary["skipped_steps"] == 2
    assert lab.message.startswith("2 of 4 updates were skipped")
    assert "x = skipped update" in [t.get_text() for t in lab._charts.live["loss"].ax.texts]


def test_the_run_button_trains_in_the_background_and_stop_ends_it(no_leftover_processes):
    lab = tiny_lab(steps=100000, workers=1)
    lab._run_button.click()
    assert wait_until(lambda: len(lab._records) >= 2), lab.message
    assert lab.running
    assert live_children(), "a loader worker should be running"
    lab._run_button.click()  # a second Run while one is going
    assert "already going" in lab.message
    with pytest.raises(lk.RunError, match="already going"):
        lab.run()
    lab._stop_button.click()
    assert lab.wait(60) and not lab.running
    assert "Stopped after" in lab.message and lab.history == []
    assert "stopped" in lab._messages.status_line.value
    assert not wait_no_children(), "the loader worker outlived the stopped run"
    lab.set(steps=3, workers=0)
    lab._run_button.click()
    assert lab.wait(60)
    assert len(lab.history) == 1 and lab.history[0].summary["status"] == "completed"


def test_reference_overlay_from_a_reference_file(tmp_path):
    assert shared_lab()._history.ref_toggle.disabled  # data/reference/ holds nothing yet
    cfg = lk.Config(model="tiny", steps=3)
    keys = dict(model="tiny", precision="fp32", micro_batch=cfg.micro_batch, seq_len=cfg.context, accum=1,
                checkpointing="none", checkpoint_every=1, workers=0, world_size=1, ddp_sync="no_sync",
                data_cost_ms=0.0, compile=False)
    summary = {**keys, "tokens_per_s": 2.5e6, "step_time_s": 2e-4, "mfu": 0.31, "device": "cuda"}
    ref = {"schema": 1,
           "provenance": {"gpu": "NVIDIA H200", "torch_version": "2.11.0", "date": "2026-11-20T10:00:00",
                          "command": "python -m labkit run --model tiny", "git_commit": "abc", "corpus_sha": "x"},
           "points": [{"id": "precision/fp32", "section": "precision", "label": "fp32", "command": "...",
                       "status": "ok", "summary": summary},
                      {"id": "precision/bf16", "section": "precision", "label": "bf16", "command": "...",
                       "status": "ok", "summary": {**summary, "precision": "bf16"}}]}
    (tmp_path / "h200.json").write_text(json.dumps(ref))
    lab = tiny_lab(reference_dir=tmp_path)
    assert not lab._history.ref_toggle.disabled
    assert lab.show_reference(True) == []  # nothing run yet
    lab.run()
    matches = lab._history.reference_matches()
    assert len(matches) == 1 and matches[0]["label"] == "fp32"  # the same configuration only
    assert bytes(lab._history.ref_img.value).startswith(PNG) and lab._history.ref_img.layout.display is None
    assert "NVIDIA H200, torch 2.11.0, 2026-11-20" in lab._history.ref_text.value
    lab.run(precision="bf16")  # the overlay follows the latest run
    assert lab._history.reference_matches()[0]["label"] == "bf16" and "NVIDIA H200" in lab._history.ref_text.value
    lab.run(precision="fp16")
    assert "No reference measurement has this configuration" in lab._history.ref_text.value
    lab.show_reference(False)
    assert lab._history.ref_img.layout.display == "none"


# ---- the reference chart with nothing to compare -------------------------------------------------


def test_no_reference_points_draw_nothing_and_say_so_in_one_line():
    out = plots.reference({"tokens_per_s": 1234.0, "step_time_s": 0.5, "mfu": 0.01, "device": "cpu"}, [])
    assert isinstance(out, plots.NoChart) and not hasattr(out, "savefig")
    text = repr(out)
    assert "no GPU reference yet" in text and "\n" not in text and not text.startswith("'")
    assert "no GPU reference yet" in out._repr_markdown_()


def test_reference_points_still_draw_a_chart():
    summary = {"tokens_per_s": 1234.0, "step_time_s": 0.5, "mfu": 0.01, "device": "cpu"}
    point = {"summary": {**summary, "tokens_per_s": 4e6}, "provenance": {"gpu": "NVIDIA H200"}}
    fig = plots.reference(summary, [point])
    assert plots.to_png(fig).startswith(b"\x89PNG")


def test_the_panel_hides_the_chart_when_no_reference_matches(tmp_path):
    point = {"id": "precision/bf16", "section": "precision", "label": "bf16", "command": "...", "status": "ok",
             "summary": {"model": "large", "precision": "bf16", "tokens_per_s": 4e6}}
    (tmp_path / "h200.json").write_text(json.dumps({
        "schema": 1, "provenance": {"gpu": "NVIDIA H200", "date": "2026-11-20"}, "points": [point]}))
    lab = lk.Lab(model="tiny", steps=3, reference_dir=tmp_path)
    cfg = lk.Config(model="tiny", steps=3)
    lab.history = [train.Result(cfg, {**cfg.to_dict(), "tokens_per_s": 10.0, "step_time_s": 1.0}, [])]
    assert lab.show_reference(True) == []
    assert lab._history.ref_img.layout.display == "none"
    assert "No reference measurement has this configuration" in lab._history.ref_text.value


# ---- Lab.load_history refuses broken input in one line ---------------------------------------------

@pytest.fixture(scope="module")
def lab():
    return lk.Lab(model="tiny", steps=3)


def _history(tmp_path, run):
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"schema": 1, "kind": "labkit-history", "runs": [run]}))
    return path


GOOD = lk.Config(model="tiny", steps=3).to_dict()


@pytest.mark.parametrize("run,words", [
    ({"config": 5, "summary": {}}, "config=5 is not allowed: a dict of Config fields"),
    ({"config": None, "summary": {}}, "config=None is not allowed"),
    ({"config": {}, "summary": {}}, "a dict of Config fields (it has none)"),
    ({"config": {"bogus": 1}, "summary": {}}, "it has none"),
    ({"config": {**GOOD, "model": "nope"}, "summary": {}}, "model='nope' is not allowed"),
    ({"config": {**GOOD, "micro_batch": -1}, "summary": {}}, "micro_batch=-1 is not allowed"),
    ({"config": GOOD, "summary": 3}, "summary=3 is not allowed"),
    ({"config": GOOD, "summary": {}, "records": "x"}, "records='x' is not allowed"),
    (7, "7 is not a saved run"),
])
def test_a_broken_history_is_one_clear_line(lab, tmp_path, run, words):
    lab.history = []
    with pytest.raises(ValueError) as e:
        lab.load_history(_history(tmp_path, run))
    msg = str(e.value)
    assert words in msg and "run 0" in msg and "\n" not in msg, msg
    assert lab.history == []  # nothing half-loaded


def test_a_run_from_another_machine_still_loads(lab, tmp_path):
    run = {"config": {**GOOD, "precision": "tf32", "corpus": "/elsewhere/text"}, "summary": {"precision": "tf32"},
           "records": []}
    loaded = lab.load_history(_history(tmp_path, run))
    assert loaded[-1].config.precision == "tf32" and loaded[-1].config.corpus == "/elsewhere/text"
