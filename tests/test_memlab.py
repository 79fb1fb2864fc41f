"""Chapter 08's instruments return tables, figures and verdict keys; the chapter writes the words (issue 47).
These pin figures and verdicts, never a sentence -- and the chapter's order and clutter (issue 46): the step-2
exercise comes before the cell that shows AdamW's state, the GPU-only allocator demo is one line on a CPU, and
no cell leaves a helper's (possibly empty) value as its output."""
import ast
import json
import math
import types
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.chapters import ch03_accumulation as acc, ch08_memory as memlab

MIB = 2**20
NB = Path(__file__).resolve().parent.parent / "notebooks" / "08_memory_in_practice.ipynb"


def _cells():
    return json.loads(NB.read_text(encoding="utf-8"))["cells"]


def _index(tag):
    return next(i for i, c in enumerate(_cells()) if tag in c["metadata"].get("tags", []))


def _seq_rows():
    out = []
    for t in (64, 128):
        for att, extra in (("auto", 0), ("math", t * MIB // 64)):
            out.append(dict(seq_len=t, attention=att, measured_bytes=t * MIB // 8 + extra, formula_total=t * MIB // 8
                            + extra, ratio=1.0005, formula_attention_square=extra))
    return out


def test_the_sequence_sweep_figures():
    rows = _seq_rows()
    assert "| 128 | math | 18.00 MiB | 18.00 MiB | 1.000 | 2.00 MiB |" in memlab.seq_table(rows)._repr_markdown_()
    assert math.isclose(memlab.square_share(rows), 2 / 18)
    s = memlab.seq_summary(lk.Config(model="tiny", precision="fp32", micro_batch=2), rows)
    assert s["t_max"] == 128 and s["ratio"] == pytest.approx(18 / 16) and s["worst_pct"] == pytest.approx(0.05)
    spec = lk.PRESETS["tiny"]
    assert s["crossover"] == round((16 * spec.d_model + 4) / spec.n_head + 1)


def test_the_recompute_figures():
    rec = [dict(seq_len=64, bytes_none=2 * MIB, bytes_attention=MIB, saved_frac=0.5, flops_ratio=1.01,
                core_flops_ratio=1.02),
           dict(seq_len=128, bytes_none=4 * MIB, bytes_attention=MIB, saved_frac=0.75, flops_ratio=1.02,
                core_flops_ratio=1.04)]
    assert "| 128 | 4.00 MiB | 1.00 MiB | 75% | 1.020 |" in memlab.recompute_table(rec)._repr_markdown_()
    r = memlab.recompute_summary(rec)
    assert (r["saved_lo"], r["saved_hi"]) == (50, 75) and r["flops_hi"] == pytest.approx(2.0)
    assert r["of_core"] == pytest.approx(0.5)


def _fu(p1_fb, p1_step, p2_fb, p2_step, state=800, n=100):
    moments = [dict(moment="update 2: optimizer step done", weights=400, grads=0, optimizer=state, activations=0)]
    return {"moments": moments, "n_params": n, "device": "cpu",
            "peaks": {"update 1": max(p1_fb, p1_step), "update 2": max(p2_fb, p2_step)},
            "peak_phases": {"update 1": {"forward and backward": p1_fb, "optimizer step": p1_step},
                            "update 2": {"forward and backward": p2_fb, "optimizer step": p2_step}}}


@pytest.mark.parametrize("phases, verdict", [
    ((1000, 900, 1800, 1700), "both_in_backward"),
    ((900, 1000, 1700, 1600), "step_then_backward"),
    ((900, 1000, 900, 1050), "step_sets_peak"),
])
def test_the_step2_verdict_follows_where_each_peak_was(phases, verdict):
    f = memlab.step2_figures(_fu(*phases))
    assert f["verdict"] == verdict and f["per_param"] == 8.0
    assert f["extra"] * MIB == max(phases[2:]) - max(phases[:2])


def test_the_bytes_per_param_table_shows_untracked_bytes():
    row = dict(recipe="autocast", n_params=1000, weights=4000, grads=4000, master=0, accumulator=0, optimizer=8000,
               bytes_per_param=16.0, total=16000, traced_bytes=16000, half="bf16", param_tensors=10,
               step_counter_bytes=40)
    t = memlab.bpp_table([row, dict(row, recipe="leaky", traced_bytes=17000)])
    assert [r["untracked"] for r in t] == [0.0, 1.0]
    assert "| autocast | 4.00 | 4.00 | 0.00 | 0.00 | 8.00 | 16.00 | 0.00 |" in t._repr_markdown_()


# ---- issue 46.15: AdamW's state is not shown above the exercise that asks for it ---------------------------------

def test_the_step2_exercise_comes_before_adamw_state_is_shown():
    cs, ex = _cells(), _index("exercise-08-step2")
    above = "\n".join("".join(c["source"]) for c in cs[:ex])
    for answer in ("two fp32 tensors per parameter", "moments_table(", "plot_first_updates(", "step2_figures(",
                   "step2_note(", "8 bytes per parameter"):
        assert answer not in above, answer
    below = "\n".join("".join(c["source"]) for c in cs[ex + 1:ex + 3])
    assert "moments_table(" in below and "step2_figures(" in below


# ---- issue 46.19: a GPU-only demo is one line on a CPU, and no cell shows a helper's empty value ---------------

def test_on_a_cpu_the_allocator_demo_is_one_line(monkeypatch):
    said, shown = [], []
    monkeypatch.setattr(lk.course, "say", said.append)
    tag = _index("measure-08-allocator")
    for c in _cells()[tag:tag + 3]:
        exec(compile("".join(c["source"]), "cell", "exec"),
             {"device": torch.device("cpu"), "lk": lk, "ch08": memlab, "display": lambda *a: shown.extend(a)})
    assert len(said) == 1 and "\n" not in said[0] and "needs CUDA" in said[0], said
    assert shown == [] or any(lk.reference.points(section="memory")), shown  # only a shipped GPU demo may show


def test_no_cell_leaves_a_helpers_value_as_its_output():
    """A bare call at the end of a cell shows its value: an empty note showed an empty output prompt. Only charts
    (and the chapter's own objects) may be left bare; tables and words are displayed or explained."""
    for c in _cells():
        if c["cell_type"] != "code" or c["id"] == "labkit-setup":
            continue
        body = ast.parse("".join(c["source"])).body
        last = body[-1] if body else None
        if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
            name = ast.unparse(last.value.func)
            if name.startswith(("memlab.", "kernels.", "memtrace.")):
                assert name.split(".")[-1].startswith("plot_"), (c["id"], name)


def test_the_allocator_code_shown_in_chapter_08_makes_the_calls():
    import inspect

    peak, stats = inspect.getsource(memlab.AllocatorPeak), inspect.getsource(memlab.allocator_stats)
    assert "reset_peak_memory_stats(" in peak and "max_memory_allocated(" in peak and "memory_stats(" in stats
    if not torch.cuda.is_available():  # on a CPU the statistics are refused, never made up
        with pytest.raises(RuntimeError, match="CUDA"):
            memlab.allocator_stats()
