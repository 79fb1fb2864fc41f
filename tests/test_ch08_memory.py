"""Chapter 08 (memory): labkit.chapters.ch08_memory (with the tracer of ch04_checkpointing and the
accumulation reading of ch03_accumulation), on the CPU.

* the fragmentation demo's patterns: the request is larger than the largest hole and smaller than all
  holes together (the old pattern's 512 MiB request fitted its largest, 552 MiB hole), and the growth
  pattern's arithmetic; what each arm is expected to show is judged against measured numbers;
* one update's traced peak against the accumulation steps: K = 2 adds the gradients' bytes over K = 1,
  K = 4 adds nothing over K = 2;
* bytes per parameter: every byte the update's own tensors hold afterwards is counted by a role (the
  fp32 gradient copy of the master-weights recipe used to stay alive: 20 bytes per parameter held, 16 shown);
* the memory figures: text at least ~10 px at the size the notebook shows them;
* every public function of the room refuses bad arguments with a ConfigError before any work."""
from __future__ import annotations

import os
import subprocess

import pytest
import torch

import labkit as lk
from labkit.chapters import ch03_accumulation as acc, ch04_checkpointing as memtrace, ch08_memory as memlab
from labkit.chapters.ch08_memory import allocator
from labkit.engine.config import ConfigError

MIB = 2**20
TINY = lk.Config(model="tiny", micro_batch=2)


# ---- 23.1: the fragmentation patterns ---------------------------------------------------------------------------

@pytest.mark.parametrize("expandable", [False, True])
def test_the_request_is_larger_than_every_hole_and_smaller_than_their_sum(expandable):
    p = memlab.hole_pattern(expandable=expandable)
    assert p["largest_hole_mib"] < p["request_mib"] < p["sum_holes_mib"]
    assert max(p["holes_mib"]) == p["largest_hole_mib"] and sum(p["holes_mib"]) == p["sum_holes_mib"]
    # every other block freed: the holes are the freed blocks (plus, with 20 MiB pages, the segment's tail)
    assert p["freed_mib"] == p["count"] // 2 * p["block_mib"] == p["arena_mib"] - p["live_mib"]
    assert p["request_mib"] < p["freed_mib"]  # it would fit if the holes were one


def test_hole_pattern_refuses_a_request_that_fits_a_hole_or_not_even_their_sum():
    with pytest.raises(ConfigError, match="largest hole"):
        memlab.hole_pattern(block_mib=64, request_mib=64)      # fits the largest hole: nothing to show
    with pytest.raises(ConfigError, match="holes together"):
        memlab.hole_pattern(block_mib=64, count=4, request_mib=200)  # more than all holes: plain out of memory
    with pytest.raises(ConfigError, match="even"):
        memlab.hole_pattern(count=7)


def test_expandable_segments_can_unmap_the_holes_whole_pages():
    p = memlab.hole_pattern(expandable=True)
    # blocks of 64 MiB at multiples of 128 MiB hold two or three whole 20 MiB pages each: 400 MiB in all
    assert p["unmappable_mib"] == 400
    # enough for the capped arm: the cap leaves half the request, the pages must make up the other half
    assert p["unmappable_mib"] >= p["request_mib"] / 2
    assert memlab.hole_pattern()["unmappable_mib"] == 0  # fixed segments: the one segment holds live blocks


def test_growth_pattern_arithmetic():
    g = memlab.growth_pattern(live_mib=64, first_mib=256, step_mib=32, steps=8)
    assert g["sizes_mib"] == [256 + 32 * i for i in range(8)]
    assert g["fixed_reserved_mib"] == 64 + sum(g["sizes_mib"])    # a new segment per step, all kept cached
    assert g["expandable_reserved_mib"] == 560                     # 64 + 480 = 544 MiB, in 20 MiB pages
    assert g["cap_mib"] > g["expandable_reserved_mib"]
    assert g["expandable_retries"] == 0 and g["fixed_retries"] >= 1  # the capped arms differ


def _arm(ok=True, reserved=0, unallocated=0, segments=1, retries=0, ooms=0, error=None):
    return {"ok": ok, "error": error, "allocated": reserved - unallocated, "reserved": reserved,
            "reserved_unallocated": unallocated, "segments": segments, "inactive_split": 0,
            "alloc_retries": retries, "ooms": ooms, "device_allocs": 0, "device_frees": 0}


def _demos(holes_capped_fixed_ok=False):
    """What each arm is expected to measure, built from the patterns' arithmetic (a stand-in for a GPU run)."""
    out = {}
    for flag in (False, True):
        pats = memlab.fragmentation_patterns(flag)
        h, g = pats["holes"], pats["growth"]
        req = h["request_mib"] * MIB
        arms = {
            "holes uncapped": _arm(reserved=h["reserved_mib"] * MIB + req, unallocated=h["freed_mib"] * MIB),
            "holes capped": (_arm(reserved=(h["reserved_mib"] - h["unmappable_mib"]) * MIB + req,
                                  unallocated=(h["freed_mib"] - h["unmappable_mib"]) * MIB, retries=1) if flag else
                             _arm(ok=holes_capped_fixed_ok, reserved=h["reserved_mib"] * MIB,
                                  unallocated=h["freed_mib"] * MIB, retries=1, ooms=0 if holes_capped_fixed_ok else 1,
                                  error=None if holes_capped_fixed_ok else "CUDA out of memory. Tried to allocate")),
            "growth uncapped": _arm(reserved=g["reserved_mib"] * MIB, segments=0 if flag else g["steps"] + 1),
            "growth capped": _arm(reserved=g["reserved_mib"] * MIB, retries=0 if flag else g["fixed_retries"]),
        }
        out[flag] = {"expandable_segments": flag, "patterns": pats, "arms": arms, "settings": ""}
    return out


def test_each_arm_has_an_expectation_and_the_verdict_follows_the_numbers():
    assert len(memlab.EXPECTED) == 8
    rows = memlab.fragmentation_verdicts(_demos())
    assert len(rows) == 8 and all(r["confirmed"] for r in rows)
    table = memlab.fragmentation_table(_demos())
    assert len(table) == 8 and table._repr_markdown_().count("\n") == 9
    assert "out of memory" in table._repr_markdown_() and "| NO |" not in table._repr_markdown_()
    # a run where the fixed-segment holes request was served after all refutes that line, and says so
    bad = memlab.fragmentation_verdicts(_demos(holes_capped_fixed_ok=True))
    assert [(r["pattern"], r["expandable"], r["capped"]) for r in bad if not r["confirmed"]] == [("holes", False, True)]
    assert "| NO |" in memlab.fragmentation_table(_demos(holes_capped_fixed_ok=True))._repr_markdown_()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_the_demo_says_it_needs_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        memlab.fragmentation_demo(False)
    with pytest.raises(RuntimeError, match="CUDA"):
        memlab.fragmentation_demos()


def test_a_demo_that_outlives_its_timeout_is_stopped(monkeypatch):
    seen = {}

    def slow(cmd, **kw):
        seen.update(kw)
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])  # run() has killed and reaped the child by now

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(subprocess, "run", slow)
    with pytest.raises(RuntimeError, match="did not finish within timeout_s=5 s; its process was stopped"):
        memlab.fragmentation_demo(True, timeout_s=5)
    assert seen["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # the child's, not ours
    assert "expandable_segments" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


# ---- 23.5: the peak against the accumulation steps --------------------------------------------------------------

def test_k2_adds_the_gradients_to_the_traced_peak_and_k4_adds_nothing():
    by_k, by_mb = acc.accumulation_peaks(TINY, (1, 2, 4))
    assert [v["accum"] for v in by_k.values()] == [1, 2, 4] and by_mb[1] is by_k[1]
    assert [v["micro_batch"] for v in by_mb.values()] == [2, 4, 8] and {v["accum"] for v in by_mb.values()} == {1}
    grads = by_k[1]["grads"]
    assert grads == 4 * sum(p.numel() for p in lk.engine.model.GPT(TINY.spec).parameters())  # fp32 .grad of every weight
    rise = by_k[2]["peak"] - by_k[1]["peak"]
    assert 0.9 * grads <= rise <= 1.05 * grads, (rise, grads)
    assert abs(by_k[4]["peak"] - by_k[2]["peak"]) <= 0.01 * by_k[2]["peak"]
    assert by_k[4]["micro_peaks"][1:] == [by_k[4]["micro_peaks"][1]] * 3  # micro-batches 2..K: the same state
    reading = acc.accumulation_reading(by_k)
    assert (reading["head"], reading["why"], reading["later"]) == ("rose", "pass_full", "unchanged"), reading
    assert by_mb[4]["peak"] > by_k[4]["peak"]  # a 4x larger micro-batch: the activations grow, not with K


def test_accumulation_reading_follows_the_numbers():
    def p(peak, grads=10 * MIB, phase="forward and backward"):
        return {"peak": peak, "grads": grads, "phase": phase}

    no_rise = acc.accumulation_reading({1: p(100 * MIB, phase="optimizer step"),
                                           2: p(100 * MIB, phase="optimizer step")})
    assert (no_rise["why"], no_rise["later"], no_rise["rise_mib"]) == ("step_both", "none", 0)
    moved = acc.accumulation_reading({1: p(100 * MIB), 2: p(110 * MIB), 4: p(120 * MIB)})
    assert (moved["later"], moved["k"], moved["moved_mib"]) == ("moved", 4, 10.0)
    assert (moved["rise_mib"], moved["share_pct"], moved["grads_mib"]) == (10.0, 100.0, 10.0)
    nearly = acc.accumulation_reading({1: p(100 * MIB), 2: p(110 * MIB), 4: p(110 * MIB + 2**16)})
    assert (nearly["later"], nearly["k_max"], nearly["flat_mib"]) == ("flat", 4, 0.0625)
    fell = acc.accumulation_reading({1: p(100 * MIB), 2: p(97 * MIB)})
    assert (fell["head"], fell["rise_mib"], fell["above_mib"]) == ("fell", 3.0, -3.0)
    with pytest.raises(ConfigError, match="by_k"):
        acc.accumulation_reading({1: p(1)})


STEP, FB = "optimizer step", "forward and backward"


@pytest.mark.parametrize("phases, rise, why", [
    # K = 1 peaked in its optimizer step; micro-batch 2 went 30 % of the gradients above it: not "late enough"
    ((STEP, FB), 3 * MIB, "step_then_pass"),
    ((STEP, FB), 0, "step_then_level"),
    ((FB, STEP), 0, "pass_then_step"),
    ((FB, FB), 10 * MIB, "pass_full"),
    ((FB, FB), 3 * MIB, "pass_partial"),
    # no rise with both peaks in forward and backward: K = 1's forward held no gradient, so not "whatever K is"
    ((FB, FB), 0, "pass_none"),
])
def test_accumulation_reading_explains_from_where_each_peak_was(phases, rise, why):
    """Issue 23 review: the case branches on by_k[1]["phase"] and by_k[2]["phase"], never on the rise alone."""
    by_k = {1: {"peak": 100 * MIB, "grads": 10 * MIB, "phase": phases[0]},
            2: {"peak": 100 * MIB + rise, "grads": 10 * MIB, "phase": phases[1]}}
    reading = acc.accumulation_reading(by_k)
    assert reading["why"] == why and reading["above_mib"] == rise / MIB, reading


def test_accumulation_reading_needs_each_peaks_phase():
    with pytest.raises(ConfigError, match="by_k"):
        acc.accumulation_reading({1: {"peak": 1, "grads": 1}, 2: {"peak": 1, "grads": 1}})


# ---- 23.10: bytes per parameter, every byte counted ---------------------------------------------------------------

def test_bytes_per_param_counts_every_byte_the_update_keeps():
    rows = memlab.bytes_per_param(TINY)
    # the tracer follows every storage each update made: alive afterwards == the roles' sum, for every recipe
    # (before the fix the master-weights recipe kept its fp32 gradient copy: 20 bytes per parameter held)
    assert [r["traced_bytes"] for r in rows] == [r["total"] for r in rows]
    assert [round(r["bytes_per_param"], 2) for r in rows] == [16.0, 16.0, 20.0]
    master = rows[1]
    assert master["grads"] == 2 * master["n_params"] and master["accumulator"] == 0


def test_the_tracer_leaves_out_tensors_made_before_it():
    x = torch.arange(128).view(2, 64)
    with memtrace.Tracer(torch.nn.Module(), exclude=(x,)) as t:
        v = x.view(-1)  # a view of an input: no new storage
        w = x.float()
        assert t.alive_bytes() == (w.numel() * 4, 0)
    del v


# ---- 24.6: figures readable at the notebook's width ----------------------------------------------------------------

def _texts_px(fig):
    from matplotlib.text import Text

    fig.canvas.draw()
    return [(t.get_text(), t.get_fontsize() * fig.dpi / 72) for t in fig.findobj(Text)
            if t.get_text().strip() and t.get_visible()]


def test_memlab_and_memtrace_figures_use_at_least_10_px_text():
    res = memlab.first_updates(TINY)
    by_k = {k: acc.update_peak(TINY.replace(accum=k)) for k in (1, 2)}
    figs = [memlab.plot_first_updates(res), memlab.plot_seq_sweep(memlab.seq_sweep(lk.Config(model="tiny"), [16, 32])),
            memlab.plot_bytes_per_param(memlab.bytes_per_param(TINY)), acc.plot_update_peaks(by_k, by_k),
            memtrace.plot_timelines({"one step": memtrace.trace_step(TINY)}, width=7.0)]
    for fig in figs:
        assert fig.get_size_inches()[0] * fig.dpi <= 900  # shown at its own size in an ~800-900 px output area
        small = [(s, round(px, 1)) for s, px in _texts_px(fig) if px < 9.9]
        assert not small, small


# ---- 25.11: arguments refused before any work ----------------------------------------------------------------------

BAD = [
    (lambda: memlab.seq_sweep(TINY, [64], batch=0), "batch=0"),
    (lambda: memlab.seq_sweep(TINY, [64], batch=-2), "batch=-2"),
    (lambda: memlab.seq_sweep(TINY, [], batch=2), "seq_lens"),
    (lambda: memlab.seq_sweep(TINY, "64"), "seq_lens"),
    (lambda: memlab.seq_sweep(TINY, [64, 1]), r"seq_lens\[1\]=1"),
    (lambda: memlab.seq_sweep(TINY, [64], attentions=["mathh"]), "did you mean 'math'"),
    (lambda: memlab.seq_sweep(TINY, [64], n_threads=0), "n_threads"),
    (lambda: memlab.seq_sweep("tiny", [64]), "base"),
    (lambda: memlab.attention_recompute(TINY, [64], batch=0), "batch"),
    (lambda: memlab.activation_formula(0, 64, 4, 64, 2), "n_layer"),
    (lambda: memlab.activation_formula(2, 64, 4, 64, 2, "bogus"), "attention"),
    (lambda: memlab.activation_formula(2, 64, 4, 64, 2.5), "batch"),
    (lambda: memlab.first_updates(TINY, updates=0), "updates"),
    (lambda: memlab.first_updates(None), "config"),
    (lambda: memlab.update_peaks({}), "first_updates"),
    (lambda: memlab.peak_phase({"peaks": {"update 1": 1}, "peak_phases": {}}, 3), "update=3"),
    (lambda: memlab.step2_figures([]), "first_updates"),
    (lambda: memlab.peaks_table({}), "first_updates"),
    (lambda: acc.update_peak(TINY, updates=-1), "updates"),
    (lambda: acc.update_peak({"model": "tiny"}), "config"),
    (lambda: acc.accumulation_peaks(TINY, [2, 4]), "holds 1"),
    (lambda: acc.accumulation_peaks(TINY, [1, 0]), r"factors\[1\]=0"),
    (lambda: memlab.fragmentation_demo("yes"), "expandable"),
    (lambda: memlab.fragmentation_demo(True, timeout_s=0), "timeout_s"),
    (lambda: memlab.fragmentation_demos(timeout_s=float("nan")), "timeout_s"),
    (lambda: memlab.fragmentation_patterns(1), "expandable"),
    (lambda: memlab.fragmentation_table({}), "demos"),
    (lambda: memlab.growth_pattern(steps=1), "steps"),
    (lambda: memlab.record_cuda_history(TINY, 3), "path"),
    (lambda: memlab.record_cuda_history(TINY, "x.pickle", steps=0), "steps"),
    (lambda: memlab.bytes_per_param("tiny"), "config"),
    (lambda: memlab.bytes_per_param(TINY, n_threads=-1), "n_threads"),
    (lambda: memlab.run_memory(None), "config"),
    (lambda: memlab.plot_seq_sweep([]), "rows"),
    (lambda: memlab.plot_bytes_per_param([{"recipe": "x"}]), "rows"),
    (lambda: memlab.plot_first_updates({}), "first_updates"),
    (lambda: acc.plot_update_peaks({}, {}), "by_k"),
]

MEMLAB_MODULES = (memlab, acc, allocator)


@pytest.mark.parametrize("call,words", BAD, ids=[w for _, w in BAD])
def test_memlab_refuses_bad_arguments_before_any_work(call, words, monkeypatch):
    def work(*_a, **_k):
        raise AssertionError("work started before the arguments were checked")

    # memlab is a folder of topic modules: the work is patched where each module looks it up (a patch on the
    # package's re-export would reach nothing), in every module that uses it
    patched = set()
    for mod in MEMLAB_MODULES:
        for name in ("GPT", "run", "make_loader", "activation_bytes", "count_flops", "_by_hand", "_fragment"):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, work)
                patched.add(name)
    assert len(patched) == 7, patched
    monkeypatch.setattr(subprocess, "run", work)
    with pytest.raises(ConfigError, match=words):
        call()


def _legend_words(fig):
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def test_memory_figures_name_the_roles_as_the_chapters_tables_do():
    # seen in Chromium: "grads" and "optimizer" in the legends beside tables headed "gradients" and "AdamW state",
    # and the bytes-per-parameter legend in the order rows first used a role (master after AdamW)
    assert _legend_words(memlab.plot_first_updates(memlab.first_updates(TINY))) == [
        "weights", "AdamW state", "gradients", "activations"]
    rows = memlab.bytes_per_param(TINY)
    assert _legend_words(memlab.plot_bytes_per_param(rows)) == [
        "weights", "gradients", "master", "accumulator", "AdamW state"]
    assert _legend_words(memlab.plot_bytes_per_param(rows[:1])) == ["weights", "gradients", "AdamW state"]
