"""Issue 27: chapters 08 and 09 say what their cells measured through memlab's and the playbook's note functions
(``lk.course.Note``), so the cells read like the technique. Each function is fed a cell's results (synthetic
here: nothing runs) and must render markdown that quotes those numbers, with nothing left unfilled.

The FSDP2 code chapter 09 shows (``pb.shard``) is checked in one process of a gloo group of one."""
import math
import re
import types

import pytest
import torch

import labkit as lk
from labkit.chapters import memlab
from labkit.chapters import playbook as pb
from labkit.chapters.course import Note
from labkit.engine.model import GPT

MIB = 2**20


def rendered(note):
    assert isinstance(note, Note), type(note)
    md = note._repr_markdown_()
    unfilled = r"\{[a-z_]+[^}]*\}|\(s\)|\bnan\b|\binf\b|\de[-+]0\d"  # a placeholder, "(s)", e-notation
    assert not re.search(unfilled, md), md
    return md


# ---- chapter 09 ----------------------------------------------------------------------------------------------

ENV = {"name": "Test CPU", "kind": "cpu", "cpu_flags": ["avx512_bf16"]}
SUMMARY = dict(tokens_per_s=1234.0, param_bytes=4 * MIB, grad_bytes=4 * MIB, optimizer_bytes=8 * MIB,
               activation_bytes=3 * MIB, n_params=MIB, peak_mem_bytes=None)
ROWS = [dict(label="fp32 mb=8 K=1", precision="fp32", tokens_per_s=1000.0, memory_bytes=40 * MIB, status="ok"),
        dict(label="bf16 mb=4 K=2", precision="bf16", tokens_per_s=1500.0, memory_bytes=30 * MIB, status="ok")]


def test_the_chapter_09_notes_quote_their_numbers():
    baseline = dict(precision="fp32", micro_batch=8, accum=1, checkpointing="none", workers=0)
    assert "2.0 minutes" in rendered(pb.chapter_note(ENV, "bf16", 120))
    assert "2 CPU threads" in rendered(pb.problem_note(dict(model="small", seq_len=64), 1_000, 8, 62 * MIB, 2))
    md = rendered(pb.baseline_note(SUMMARY, baseline, 62 * MIB))
    assert "1,234 tokens/s" in md and "16.0 bytes each" in md and "the baseline fits" in md
    md = rendered(pb.grid_note(ROWS, ROWS, ROWS[1], baseline, 1000.0, 0.05, [ROWS[0]]))
    assert "**2 of 2**" in md and "1,500 tokens/s" in md and "5%" in md and "bf16 mb=4" not in md  # not which
    assert "rough" in rendered(pb.grid_note(ROWS, ROWS, ROWS[1], baseline, 1000.0, None, []))
    assert "fp32 mb=8 K=1, bf16 mb=4 K=2" in rendered(pb.front_note(ROWS, ROWS))
    assert "avx512_bf16" in rendered(pb.units_note(ENV, "bf16", None))
    assert "converted in software" in rendered(pb.units_note(ENV, "bf16", 8.0, "smaller run."))
    run = types.SimpleNamespace(summary=dict(SUMMARY, tokens_per_s=1400.0, peak_mem_bytes=2**30))
    md = rendered(pb.pick_note(dict(precision="bf16", micro_batch=4, accum=2), run, ROWS, 62 * MIB))
    assert "1,400 tokens/s" in md and "1,500 in the grid" in md
    assert "**bf16 mb=4 K=2**" in rendered(pb.best_note(ROWS[1], [ROWS[0]]))
    assert "ran out of memory: boom" in rendered(pb.cap_note(2**30, error="boom"))
    assert "1.00 GiB" in rendered(pb.cap_note(2**30, run))
    assert "2.5 ms per sample" in rendered(pb.data_cost_note(2.5, "the pick"))


def test_the_memory_arithmetic_notes_agree_with_the_playbook():
    md = rendered(pb.remedies_table({"7 B": 7e9}, 8, 80e9))
    for stage in (0, 3):
        assert f"{pb.zero_bytes_per_gpu(7e9, 8, stage) / 1e9:,.1f}" in md
    assert "13.0 GB" in rendered(pb.activations_note({"none": 13e9, "full": 1e9}))
    assert "activations count" in rendered(pb.fix_note("zero1", "zero3", 20e9))


def test_the_fsdp_notes_show_plain_numbers():
    demo = {"ranks": [dict(param_bytes=50, grad_bytes=50, optimizer_bytes=100)],
            "replica": dict(param_bytes=100, grad_bytes=100, optimizer_bytes=200), "losses": [5.0, 4.9], "seconds": 3.2}
    assert "| param | 100 | 50 | 0.50 |" in rendered(pb.fsdp_table(demo))
    assert "(identical)" in rendered(pb.fsdp_losses_note(demo, [5.0, 4.9]))
    assert "largest difference 0.0000004" in rendered(pb.fsdp_losses_note(demo, [5.0, 4.9000004]))


def _result(steps, losses, mb=4, accum=1):
    cfg = types.SimpleNamespace(steps=steps, micro_batch=mb, accum=accum)
    return types.SimpleNamespace(config=cfg, records=[dict(loss=v) for v in losses])


def test_the_convergence_notes_read_their_runs():
    final = lambda r: r.records[-1]["loss"]  # noqa: E731  (the test's own final loss)
    conv = {(4, 1e-3): _result(8, [3.0, 2.0]), (4, 3e-3): _result(8, [3.0, 1.8]),
            (16, 1e-3): _result(2, [3.0, 2.5], mb=16), (16, 3e-3): _result(2, [3.0, 2.2], mb=16)}
    md = rendered(pb.convergence_table(conv, (4, 16), (1e-3, 3e-3), final))
    assert "| 4 | 8 | 2.000 | 1.800 |" in md and "| 16 | 2 | 2.500 | 2.200 |" in md
    md = rendered(pb.gap_note(0.4, conv[16, 3e-3], conv[4, 3e-3]))
    assert "effective batch 16 ends +0.400" in md and "batch 4" in md and "2 updates against 8" in md
    md = rendered(pb.lr_batch_note(conv, {4: 3e-3, 16: 3e-3}, final))
    assert "4 → 0.003" in md and "1.800 (batch 4, 8 updates)" in md and "The larger the batch, the higher" in md


def test_the_critical_batch_caveat_claims_growth_only_with_separate_intervals():
    est = lambda b, lo, hi: dict(ok=True, b_crit=b, interval=(lo, hi))  # noqa: E731
    assert "it grows as the loss falls" in rendered(pb.critical_batch_caveat([est(40, 30, 50), est(10, 5, 20)]))
    assert "too noisy" in rendered(pb.critical_batch_caveat([est(40, 15, 50), est(10, 5, 20)]))
    assert "too noisy" in rendered(pb.critical_batch_caveat([dict(ok=False)]))


def test_the_what_if_notes_label_every_number_predicted():
    cfgs = {"fp32": lk.Config(model="tiny", micro_batch=2, steps=3, threads=1)}
    cfgs["bf16"] = cfgs["fp32"].replace(precision="bf16")
    ms = pb.predicted_ms(cfgs, ("t4", "h100-sxm"))
    md = rendered(pb.predicted_table(ms, cfgs))
    assert md.count("predicted ms/update") == 2 and "refused (no bf16 unit)" in md  # a T4 has no bf16 unit
    assert ms["bf16"]["t4"] is None and ms["fp32"]["h100-sxm"] > 0
    md = rendered(pb.launch_bound_note(cfgs, ms))
    assert "**predicted**" in md and "per-operation overhead" in md and "CUDA autocast's cast lists differ" in md


def test_shard_is_fsdp2_with_a_precision_policy():
    """One process, a gloo group of one: every block and the root become FSDP units with the policy given.
    In a fresh Python: FSDP2 used in this (pytest's) process made every later DataLoader worker fork of it
    crash (segmentation fault inside os.fork), so it never runs here."""
    import subprocess
    import sys

    code = """
import math, torch, torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
import labkit as lk
from labkit.chapters import playbook as pb
from labkit.engine.model import GPT
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    model = pb.shard(GPT(lk.PRESETS["tiny"]))
    assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.blocks)
    x = torch.randint(0, 256, (2, lk.PRESETS["tiny"].seq_len))
    loss = model(x, x)
    loss.backward()
    assert math.isfinite(float(loss.detach()))
finally:
    dist.destroy_process_group()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# ---- chapter 08 ----------------------------------------------------------------------------------------------

def _seq_rows():
    out = []
    for t in (64, 128):
        for att, extra in (("auto", 0), ("math", t * MIB // 64)):
            out.append(dict(seq_len=t, attention=att, measured_bytes=t * MIB // 8 + extra, formula_total=t * MIB // 8
                            + extra, ratio=1.0005, formula_attention_square=extra))
    return out


def test_the_chapter_08_notes_quote_their_numbers():
    dev = torch.device("cpu")
    md = rendered(memlab.device_note(dev, []))
    assert "short mode:" in md.lower() and "GPU-only, skipped" in md  # the device: the set-up cell says it
    rows = _seq_rows()
    assert "| 128 | math | 18.00 MiB | 18.00 MiB | 1.000 | 2.00 MiB |" in rendered(memlab.seq_table(rows))
    assert math.isclose(memlab.square_share(rows), 2 / 18)
    base = lk.Config(model="tiny", precision="fp32", micro_batch=2)
    md = rendered(memlab.seq_note(base, rows))
    assert "at T = 128" in md and "**1.12×**" in md and "within 0.05%" in md
    rec = [dict(seq_len=64, bytes_none=2 * MIB, bytes_attention=MIB, saved_frac=0.5, flops_ratio=1.01,
                core_flops_ratio=1.02),
           dict(seq_len=128, bytes_none=4 * MIB, bytes_attention=MIB, saved_frac=0.75, flops_ratio=1.02,
                core_flops_ratio=1.04)]
    assert "| 128 | 4.00 MiB | 1.00 MiB | 75% | 1.020 |" in rendered(memlab.recompute_table(rec))
    md = rendered(memlab.recompute_note(rec))
    assert "**75%** for **2.0%**" in md and "0.50 of it" in md
    trace = types.SimpleNamespace(kept_bytes=lambda: 3 * MIB, peak_bytes=lambda: 5 * MIB, grad_bytes=lambda: MIB)
    assert "**3.0 MiB**" in rendered(memlab.timeline_note(trace))
    st = dict(allocated=100 * MIB, reserved=300 * MIB)
    run = types.SimpleNamespace(config=types.SimpleNamespace(model="base"), summary=dict(peak_mem_bytes=2**30))
    assert "reserved 300 MiB" in rendered(memlab.allocator_note(st, run))
    assert "Your calculator" in rendered(memlab.budget_note(10 * MIB, dict(total=11 * MIB)))


def test_the_bytes_per_param_notes():
    row = dict(recipe="autocast", n_params=1000, weights=4000, grads=4000, master=0, accumulator=0, optimizer=8000,
               bytes_per_param=16.0, total=16000, traced_bytes=16000, half="bf16", param_tensors=10,
               step_counter_bytes=40)
    last = dict(row, recipe="fp32 accumulator", bytes_per_param=20.0)
    assert "| autocast | 4.00 | 4.00 | 0.00 | 0.00 | 8.00 | **16.00** |" in rendered(memlab.bpp_table([row]))
    assert "found no byte alive" in rendered(memlab.bpp_note([row, last]))
    assert "is 28 GB" in rendered(memlab.bpp_7b_note([row, last]))


def test_the_allocator_code_shown_in_chapter_08_makes_the_calls():
    import inspect

    peak, stats = inspect.getsource(memlab.AllocatorPeak), inspect.getsource(memlab.allocator_stats)
    assert "reset_peak_memory_stats(" in peak and "max_memory_allocated(" in peak and "memory_stats(" in stats
    if not torch.cuda.is_available():  # on a CPU the statistics are refused, never made up
        with pytest.raises(RuntimeError, match="CUDA"):
            memlab.allocator_stats()
