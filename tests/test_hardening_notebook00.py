"""Chapter 00's timer cell: its sentence follows from the measured ratio (agree only within the stated
tolerance), run on the CPU with a clock that returns chosen times."""
import json
import types
from pathlib import Path

import pytest
import torch

import labkit as lk

NB = Path(__file__).resolve().parent.parent / "notebooks" / "00_start_here.ipynb"


def run_timer_cell(monkeypatch, unsynced_s, synced_s):
    cell = next(c for c in json.loads(NB.read_text())["cells"]
                if "measure-00-sync-timing" in c.get("metadata", {}).get("tags", []))
    ticks = iter([0.0, unsynced_s, 100.0, 100.0 + synced_s])  # t0 and end of each of the two timings
    said = []
    monkeypatch.setattr(lk.course, "say", said.append)
    monkeypatch.setattr(lk.course, "sizes", lambda cpu, gpu: dict(cpu))
    ns = {"torch": torch, "lk": lk, "device": torch.device("cpu"), "synchronize": lambda d: None,
          "time": types.SimpleNamespace(perf_counter=lambda: next(ticks)), "my_guess_timer_ratio": None}
    exec("".join(cell["source"]), ns)
    return said[-1]


@pytest.mark.parametrize("unsynced,synced", [(0.73, 1.0), (1.0, 0.73), (1.5, 1.0)])
def test_a_ratio_far_from_1_is_not_called_agreement(monkeypatch, unsynced, synced):
    text = run_timer_cell(monkeypatch, unsynced, synced)
    assert f"ratio {unsynced / synced:.2f}" in text
    assert "agree" not in text and "differ by more than 20%" in text, text
    assert ("faster" if unsynced < synced else "slower") in text and "scatter" in text


def test_a_ratio_near_1_agrees_within_the_tolerance(monkeypatch):
    text = run_timer_cell(monkeypatch, 1.05, 1.0)
    assert "agree within 20% (ratio 1.05)" in text, text
