"""No reference chart without reference data; Config.from_dict and Lab.load_history refuse broken input
in one line that names the field."""
import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.tools import plots
from labkit.engine import train  # noqa: E402
from labkit.engine.config import ConfigError  # noqa: E402

# ---- 4. the reference chart with nothing to compare ---------------------------------------------


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


# ---- 7. Config.from_dict and Lab.load_history ------------------------------------------------------

@pytest.mark.parametrize("values", [None, [], ["model"], "tiny", 5])
def test_from_dict_of_something_else_names_what_is_allowed(values):
    with pytest.raises(ConfigError, match="a dict of Config fields") as e:
        lk.Config.from_dict(values)
    assert e.value.field == "config" and e.value.value == values


def test_from_dict_still_builds_a_config():
    assert lk.Config.from_dict({"model": "tiny", "steps": 2}).steps == 2


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
