"""Issue 45, item 14: a measurement cache with wrong types (peak_flops.json, roofline_probe.json) raised on
every call until deleted; a planted peak reported MFU 2200.8 as measured. Now a damaged, non-finite or
absurd entry is measured again (said in one line), and an MFU above 1 is shown everywhere as "MFU > 1: the
peak is wrong", never as a measurement."""
from __future__ import annotations

import json
import math

import pytest
import torch

import labkit as lk
from labkit.engine import device, gpus

FAKE_PROBE = {"flops": 5e10, "n": 64, "timed_calls": 3, "seconds": 0.01}


@pytest.fixture
def peak_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(device, "contended", lambda reading, threads: False)
    monkeypatch.setattr(device, "_MEASURED", {})
    monkeypatch.setattr(gpus, "_SAID", set(), raising=False)
    probed = []
    monkeypatch.setattr(device, "probe_matmul", lambda *a, **k: probed.append(a) or dict(FAKE_PROBE))
    caps = device.capabilities("cpu")
    return tmp_path / gpus.PEAK_CACHE, caps, device.peak_cache_key(caps, torch.get_num_threads()), probed


@pytest.mark.parametrize("planted", [[], "x", None, {"fp32": []}, {"fp32": {"flops": "fast"}},
                                     {"fp32": {"flops": 1e30}}, {"fp32": {"flops": float("inf")}},
                                     {"fp32": {"flops": 5e10, "probes": "many"}}])
def test_a_damaged_peak_is_measured_again_and_said_once(peak_cache, planted, capsys):
    path, caps, key, probed = peak_cache
    path.write_text(json.dumps({key: planted}))
    for _ in range(2):  # not only the first call: every call works
        device._MEASURED.clear()
        flops, _ = device.measured_peak(caps, "fp32")
        assert flops == FAKE_PROBE["flops"]
    assert len(probed) == 1  # the second call read the repaired cache
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "peak cache" in err[0] and "measuring again" in err[0]
    assert json.loads(path.read_text())[key]["fp32"]["flops"] == FAKE_PROBE["flops"]  # rewritten whole


def test_a_sound_peak_is_used_without_a_word(peak_cache, capsys):
    path, caps, key, probed = peak_cache
    path.write_text(json.dumps({key: {"fp32": {"flops": 7e10, "n": 256, "probes": 2}}}))
    assert device.measured_peak(caps, "fp32")[0] == 7e10 and not probed and not capsys.readouterr().err


@pytest.mark.parametrize("planted", [
    [], {"curve": "x", "bytes_per_s": 1e10, "sample_overhead_s": 0.0, "op_overhead_s": 1e-5,
         "update_overhead_s": 1e-3, "small_step_s": 1e-2, "quiet": True},
    {"curve": [[1e6, 1e10]], "op_overhead_s": 1e-5, "update_overhead_s": 1e-3, "small_step_s": 1e-2, "quiet": True},
    {"curve": [[1e6, float("nan")]], "bytes_per_s": 1e10, "sample_overhead_s": 0.0, "op_overhead_s": 1e-5,
     "update_overhead_s": 1e-3, "small_step_s": 1e-2, "quiet": True},
    {"peaks_checked": [], "quiet": True}, {"shape_rates": {"mm": "fast"}, "shape_timing": "caches swept"},
    {"op_times": {"add": -1.0}}, {"op_overhead_s": "x"}])
def test_a_damaged_probe_entry_is_measured_again(fresh_probes, monkeypatch, planted, capsys, tmp_path):
    from labkit.whatif import probes

    monkeypatch.setattr(gpus, "_SAID", set(), raising=False)
    fresh_probes[1]["busy"] = False
    key = probes._probe_key(1)
    (tmp_path / probes.PROBE_CACHE).write_text(json.dumps({key: planted}))
    out = probes.this_probes(1)
    assert out["bytes_per_s"] > 0 and math.isfinite(out["op_overhead_s"]) and len(out["curve"]) > 1
    assert probes.probe_entry_problem(planted)
    assert "roofline probe cache" in capsys.readouterr().err
    assert not probes.probe_entry_problem(json.loads((tmp_path / probes.PROBE_CACHE).read_text())[key])


# ---- MFU above 1: never shown as measured ----------------------------------------------------------------

@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """A run whose peak comes from a planted cache entry: 2 MFLOP/s, within the range a device could have,
    so only the MFU tells it is wrong."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LABKIT_DATA_DIR", str(tmp_path_factory.mktemp("planted")))
    mp.setattr(device, "_MEASURED", {})
    caps = device.capabilities("cpu")
    key = device.peak_cache_key(caps, 1)
    (device.cache_dir() / gpus.PEAK_CACHE).write_text(json.dumps({key: {"fp32": {"flops": 2e6, "n": 64, "probes": 1}}}))
    try:
        yield lk.run(lk.Config(model="tiny", steps=2, threads=1))
    finally:
        mp.undo()


def test_a_planted_peak_is_flagged_in_the_summary_and_the_cli_table(planted_run):
    s = planted_run.summary
    assert s["peak_flops"] == 2e6 and s["mfu"] > 1
    assert s["mfu_note"].startswith("MFU > 1: the peak is wrong (")
    from labkit.__main__ import table

    text = table(s)
    mfu_row = next(line for line in text.splitlines() if "MFU / HFU" in line)
    assert "MFU > 1: the peak is wrong" in mfu_row and f"{100 * s['mfu']:.1f} %" not in text


def test_a_planted_peak_is_flagged_in_the_panel_and_compare_and_drill(planted_run):
    from labkit.drills import evidence_rows
    from labkit.panel import parts
    from labkit.tools import plots

    cells = parts.row_cells(planted_run)
    assert f"{100 * planted_run.summary['mfu']:.2f}" not in cells and "⚠ > 100 (not real)" in cells
    assert "MFU > 1: the peak is wrong" in cells[-1]
    honest = {"summary": {**planted_run.summary, "mfu": 0.3, "hfu": 0.4, "mfu_note": None}}
    rows = plots.ratios([honest, planted_run])
    assert rows[1]["mfu"] is None
    assert "MFU not compared (MFU > 1: the peak is wrong" in plots.ratio_lines([honest, planted_run])[0]
    shown = dict(evidence_rows({"mfu": planted_run.summary["mfu"], "hfu": planted_run.summary["hfu"]}))
    assert shown["MFU / HFU"].startswith("MFU > 1: the peak is wrong")


def test_mfu_note_says_the_peak_is_wrong_for_either_source():
    from labkit.engine.measure import mfu_note

    assert mfu_note(0.9, "measured: x", mfu=0.8) is None
    assert mfu_note(22.0, "measured: best of 1 short probe; under load", mfu=22.008, peak_flops=1e6).startswith(
        "MFU > 1: the peak is wrong (MFU 2201% of 1,000,000 FLOP/s, measured: best of 1 short probe)")
    assert "datasheet" in mfu_note(1.3, "NVIDIA H100 datasheet", mfu=1.1)
    assert mfu_note(1.3, "measured: x", mfu=0.9).startswith("HFU > 1: the peak is wrong")
