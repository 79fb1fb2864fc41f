"""The panel says when a format is emulated (before Run), when the machine was busy, and shows every
repeat of an A/B. Speeds are faked through the peak cache: no test depends on how fast this CPU is."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.engine import device
from labkit.panel import lab as widgets  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def fake_peaks(monkeypatch):
    """bf16 50x slower than fp32, as on an AVX2-only CPU; fp16 as fast as fp32."""
    speeds = {"fp32": 100e9, "bf16": 2e9, "fp16": 100e9}
    monkeypatch.setattr(device, "peak_flops", lambda caps, p, threads=None: (speeds[p], "measured: fake"))
    monkeypatch.setattr(widgets, "peak_flops", lambda caps, p, threads=None: (speeds[p], "measured: fake"))


def test_choosing_an_emulated_format_says_so_before_run(fake_peaks):
    lab = lk.Lab(model="tiny", steps=3)
    lab.set(precision="bf16")
    assert "bf16 runs about 50x slower than fp32 here" in lab.message
    assert "Predicted: at least" in lab.message
    lab.set(precision="fp16")  # not emulated: the warning goes
    assert "slower" not in lab.message


def test_slow_format_note_predicts_from_flops_and_the_measured_peak(fake_peaks):
    caps = device.capabilities("cpu")
    cfg = lk.Config(model="tiny", precision="bf16", steps=10)
    note = widgets.slow_format_note(caps, cfg)
    flops = lk.engine.measure.count_flops(cfg.spec) * cfg.micro_batch
    assert f"{10 * flops / 2e9:.2g} s" in note
    assert widgets.slow_format_note(caps, cfg.replace(precision="fp32")) is None


def test_busy_words():
    assert widgets.busy_words({"busy": False}) == ""
    assert "1.5 cores" in widgets.busy_words({"busy": True, "other_cores": 1.5})


def test_ab_shows_every_repeat_and_the_verdict(monkeypatch):
    lab = lk.Lab(model="tiny", steps=2)
    cmp = lab.ab(budget_s=3, metric="cpu_s_per_update", checkpointing="full")
    assert bytes(lab._history.compare_img.value).startswith(PNG)
    assert cmp.label_b == "checkpointing=full" and cmp.samples_a and cmp.samples_b
    assert cmp.sentence.replace("**", "") == lab.message
    assert "compared:" in lab._messages.status_line.value


def test_history_comparison_draws_each_runs_spread():
    from matplotlib.collections import LineCollection

    def fake(times):
        recs = [{"update": i + 1, "step_time_s": t, "tokens_per_s": 100 / t} for i, t in enumerate(times)]
        return {"summary": {"step_time_s": sorted(times)[len(times) // 2], "tokens_per_s": 100 / sorted(times)[len(times) // 2],
                            "model": "tiny"}, "records": recs}

    a, b = fake([1.0, 1.0, 1.1, 0.9, 1.0]), fake([2.0, 1.0, 3.0, 2.0, 1.5])
    ax = lk.plots.compare([a, b]).axes[0]
    whiskers = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert whiskers  # error bars exist
    bottoms = [seg[:, 1].min() for c in whiskers for seg in c.get_segments()]
    # tokens/s (the chart compares no step times: across accumulation settings they are not like for
    # like): run b's slow updates reach down to half the baseline's rate
    assert min(bottoms) <= 0.5
