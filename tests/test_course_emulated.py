"""lk.course.emulated: a format is called emulated (and left out of chapter 09's grid, and chapter 02's verdict) only
when a second probe agrees -- one probe under load read bf16 5,760x slower than fp32 on a CPU with bf16 units --
and, where the second probe shared the cores too, only on a CPU whose flags name no units for it (a learner's
pass under load read bf16 836x slower twice on a CPU with AVX512-BF16, and chapter 02 said it had no bf16 units)."""
from types import SimpleNamespace

import labkit as lk
import labkit.chapters.course as course


def _probes(monkeypatch, readings, loaded=False, flags=()):
    """fp32 at 1e11 FLOP/s; bf16 at each of ``readings`` in turn, one per probe (a re-probe keeps the higher);
    ``loaded``: whether other programs used the cores during the re-probe; ``flags``: the CPU's."""
    best, probed = {"bf16": readings[0]}, []
    monkeypatch.setattr(course, "capabilities", lambda kind: SimpleNamespace(kind="cpu", cpu_flags=list(flags)))
    monkeypatch.setattr(course, "contended", lambda load, threads: loaded)

    def slowdown(caps, precision):
        return 1e11 / best[precision]

    def measured_peak(caps, precision, remeasure=False, **kw):
        probed.append(precision)
        best[precision] = max(best[precision], readings[len(probed)])
        return best[precision], {}

    monkeypatch.setattr(course, "slowdown", slowdown)
    monkeypatch.setattr(course, "measured_peak", measured_peak)
    return probed


def test_a_probe_read_far_too_slow_under_load_is_probed_again_before_calling_a_format_emulated(monkeypatch):
    probed = _probes(monkeypatch, [1e11 / 5760, 2e11])
    assert lk.course.emulated("bf16") is None and probed == ["bf16"]


def test_a_format_slow_in_both_probes_is_emulated(monkeypatch):
    probed = _probes(monkeypatch, [1e11 / 40, 1e11 / 30])
    assert lk.course.emulated("bf16") == 30 and probed == ["bf16"]


def test_a_fast_format_is_not_probed_again(monkeypatch):
    probed = _probes(monkeypatch, [2e11, 2e11])
    assert lk.course.emulated("bf16") is None and probed == []


def test_slow_in_both_probes_under_load_with_bf16_units_is_not_emulated(monkeypatch):
    probed = _probes(monkeypatch, [1e11 / 900, 1e11 / 836], loaded=True, flags=["avx2", "avx512_bf16"])
    assert lk.course.emulated("bf16") is None and probed == ["bf16"]


def test_slow_in_both_probes_under_load_without_bf16_units_is_emulated(monkeypatch):
    _probes(monkeypatch, [1e11 / 40, 1e11 / 30], loaded=True, flags=["avx2", "avx512f"])
    assert lk.course.emulated("bf16") == 30


def test_on_a_quiet_machine_the_measurement_wins_over_the_flags(monkeypatch):
    _probes(monkeypatch, [1e11 / 40, 1e11 / 30], loaded=False, flags=["avx512_bf16", "amx_bf16"])
    assert lk.course.emulated("bf16") == 30  # units listed, yet switched off (ONEDNN_MAX_CPU_ISA): measured
