"""The panel's knobs say what differs from the panel's defaults (#46 item 17: a chapter's earlier
``data_cost_ms=44`` stayed set while the learner toggled only bf16, and nothing said so)."""
import matplotlib

matplotlib.use("Agg")

import labkit as lk  # noqa: E402


def test_a_knob_set_from_code_is_named_until_it_is_set_back():
    lab = lk.Lab(preset="mfu", model="tiny", steps=3)
    assert lab._knobs.changed() == {}  # the chapter's own knobs are the panel's defaults
    assert lab._knobs.changes.value == ""
    lab.set(data_cost_ms=44.0)
    assert lab._knobs.changed() == {"data_cost_ms": (0.0, 44.0)}
    assert "data_cost_ms" in lab._knobs.changes.value and "44" in lab._knobs.changes.value
    lab.set(precision="bf16")  # the learner's next move: the earlier one is still named beside it
    assert set(lab._knobs.changed()) == {"data_cost_ms", "precision"}
    lab.set(data_cost_ms=0.0, precision="fp32")
    assert lab._knobs.changed() == {} and lab._knobs.changes.value == ""


def test_a_moved_control_is_named_too():
    lab = lk.Lab(preset="mfu", model="tiny", steps=3)
    lab._knobs.controls["micro_batch"].value = lab.config.micro_batch + 1  # what dragging the slider does
    assert list(lab._knobs.changed()) == ["micro_batch"]
    assert "micro_batch" in lab._knobs.changes.value
