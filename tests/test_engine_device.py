"""labkit.engine.device: a peak probed under load serves its process only and is not cached, and what
counts as a contended machine."""


def test_a_peak_probed_under_load_is_not_cached(monkeypatch, tmp_path):
    """#24 item 2: the first peak probe on a busy machine was cached for good, and every later MFU and
    what-if prediction read it; now such a probe serves its process only, and its source says why."""
    from labkit.engine import device
    monkeypatch.setattr(device, "_MEASURED", {})
    written = []
    monkeypatch.setattr(device, "_write_cache", lambda *a: written.append(a))
    monkeypatch.setattr(device, "_read_cache", lambda: {})
    monkeypatch.setattr(device, "probe_matmul", lambda *a, **k: {"flops": 1e9, "n": 64})
    caps = device.capabilities("cpu")
    monkeypatch.setattr(device, "contended", lambda reading, threads: True)
    flops, entry = device.measured_peak(caps, "fp32")
    assert flops == 1e9 and entry["under_load"] and written == []
    assert "not cached" in device._measured_words("fp32", entry, 1)
    monkeypatch.setattr(device, "_MEASURED", {})
    monkeypatch.setattr(device, "contended", lambda reading, threads: False)
    flops, entry = device.measured_peak(caps, "fp32")
    assert len(written) == 1 and "under_load" not in entry


def test_contended_counts_the_cores_a_probe_needed():
    from labkit.engine import device
    n = device.cores()
    assert device.contended({"other_cores": n + 1.0, "steal_frac": 0.0}, 1)
    assert not device.contended({"other_cores": 0.0, "steal_frac": 0.0}, 1)
    assert device.contended({"other_cores": 0.0, "steal_frac": 0.5}, 1)
