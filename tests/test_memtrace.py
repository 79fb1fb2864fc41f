"""labkit.chapters.ch04_checkpointing (its trace: labkit.tools.memory): what the forward pass keeps, per op and over one step, in every checkpointing mode."""
import json
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.chapters import ch04_checkpointing as memtrace
from labkit.engine.measure import activation_bytes
from labkit.engine.model import GPT

MODES = [("none", 1), ("full", 1), ("full", 2), ("selective", 1)]


@pytest.mark.parametrize("mode,every", MODES)
def test_kept_bytes_match_the_engines_probe(mode, every):
    cfg = lk.Config(model="tiny", checkpointing=mode, checkpoint_every=every)
    trace = memtrace.trace_step(cfg, batch=3)
    probe, _ = activation_bytes(cfg, torch.device("cpu"), batch=3)
    # the probe also counts the returned loss (a scalar); the trace lists the tensors backward needs
    assert abs(trace.kept_bytes() - probe) <= 64


def test_block_bytes_match_the_formula_in_fp32():
    cfg = lk.Config(model="tiny")
    s = cfg.spec
    trace = memtrace.trace_step(cfg, batch=2)
    blocks = trace.block_bytes()
    assert sorted(blocks) == list(range(s.n_layer))
    formula = memtrace.block_bytes_formula(s.d_model, s.n_head, s.seq_len, 2)
    for b in blocks.values():
        # the fused CPU attention returns its output in the layout the projection reads: no extra copy
        assert b == formula


def test_full_checkpointing_keeps_block_inputs_only():
    cfg = lk.Config(model="tiny", checkpointing="full")
    s = cfg.spec
    trace = memtrace.trace_step(cfg, batch=2)
    for b in trace.block_bytes().values():
        assert b == 2 * s.seq_len * s.d_model * 4  # one fp32 [B, T, d] tensor per block
    assert trace.recompute_ops() > 0


def test_every_k_recomputes_only_the_checkpointed_blocks():
    full = memtrace.trace_step(lk.Config(model="tiny", checkpointing="full"), batch=2)
    every2 = memtrace.trace_step(lk.Config(model="tiny", checkpointing="full", checkpoint_every=2), batch=2)
    none = memtrace.trace_step(lk.Config(model="tiny"), batch=2)
    assert none.recompute_ops() == 0
    assert 0 < every2.recompute_ops() < full.recompute_ops()
    assert full.kept_bytes() < every2.kept_bytes() < none.kept_bytes()


def test_selective_keeps_matmul_outputs_and_recomputes_the_rest():
    trace = memtrace.trace_step(lk.Config(model="tiny", checkpointing="selective"), batch=2)
    kept_ops = {r["op"] for r in trace.kept() if r["module"].startswith("blocks.")}
    assert "addmm" in kept_ops
    assert "gelu" not in kept_ops and "native_layer_norm" not in kept_ops
    assert trace.recompute_ops() > 0


@pytest.mark.parametrize("mode,every", MODES)
def test_timeline_rises_in_forward_and_ends_with_the_gradients(mode, every):
    cfg = lk.Config(model="tiny", checkpointing=mode, checkpoint_every=every)
    trace = memtrace.trace_step(cfg, batch=2)
    t = trace.timeline()
    total = [sum(t[c][i] for c, _ in memtrace.CATEGORIES) for i in t["index"]]
    assert total[0] == 0 and min(total) >= 0
    assert total[trace.forward_end] >= trace.kept_bytes()  # everything kept is held when backward starts
    assert trace.peak_bytes() >= trace.kept_bytes()
    params = sum(p.numel() * 4 for p in GPT(cfg.spec).parameters())
    # at the end only the parameters' gradients are left (plus a few bytes: the loss, the targets' view)
    assert trace.grad_bytes() == params
    assert abs(total[-1] - params) <= 16 * 1024
    assert t["forward"][-1] <= 16 * 1024 and t["recompute"][-1] == 0  # activations all freed


def test_recompute_happens_only_in_backward():
    trace = memtrace.trace_step(lk.Config(model="tiny", checkpointing="full"), batch=2)
    for i, phase, _, _ in trace.ops:
        if phase == "recompute":
            assert i > trace.forward_end


def test_bf16_weight_copies_are_counted_apart():
    cfg = lk.Config(model="tiny", precision="bf16")
    trace = memtrace.trace_step(cfg, batch=2)
    acts, copies = activation_bytes(cfg, torch.device("cpu"), batch=2)
    assert trace.weight_copy_bytes() == copies > 0
    assert abs(trace.kept_bytes() - acts) <= 64


def test_tables_and_picture():
    traces = {m: memtrace.trace_step(lk.Config(model="tiny", checkpointing=m), batch=2) for m in ("none", "full")}
    rows = memtrace.kept_rows(traces["none"], "blocks.0")
    assert any(r["module"] == "blocks.0.attn.qkv" for r in rows) and rows[-1]["module"] == "total"
    assert rows[-1]["bytes"] == sum(r["bytes"] for r in rows[:-1]) == traces["none"].block_bytes()[0]
    fig = memtrace.plot_timelines(traces)
    assert len(fig.axes) == 2
    from labkit.tools import plots

    assert plots.to_png(fig)[:4] == b"\x89PNG"


def test_tracing_leaves_grad_mode_and_threads_alone():
    before = (torch.is_grad_enabled(), torch.get_num_threads())
    memtrace.trace_step(lk.Config(model="tiny", checkpointing="selective"), batch=1)
    assert (torch.is_grad_enabled(), torch.get_num_threads()) == before


def test_in_place_updates_of_storages_made_before_the_trace_allocate_nothing():
    # AdamW's state exists from the first step() on: a traced second step() holds only its temporaries
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256, bias=False)
    opt = torch.optim.AdamW(lin.parameters(), foreach=False)
    peaks = []
    for _ in range(2):
        lin(torch.randn(4, 256)).sum().backward()
        tracer = memtrace.Tracer(lin)
        with tracer:
            opt.step()
            trace = tracer.finish(lin)
        peaks.append(trace)
        opt.zero_grad(set_to_none=True)
    first, second = peaks
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    weight = 256 * 256 * 4
    assert first.peak_bytes() >= state            # the first step creates exp_avg and exp_avg_sq
    assert second.peak_bytes() < state            # the second only updates them in place
    assert all(h.died is not None for h in second.held)  # every storage it made was a temporary
    assert {h.op for h in second.held}.isdisjoint({"lerp_", "mul_", "addcmul_", "add_"})
    assert second.peak_bytes() <= 2 * weight      # e.g. sqrt(v) and its quotient, one weight's size each
    # a plain in-place op on a tensor the caller made earlier
    x = torch.randn(1024, 1024)
    tracer = memtrace.Tracer(lin)
    with tracer:
        x.mul_(2)
        torch.add(x, 1, out=x)
        trace = tracer.finish(lin)
    assert trace.peak_bytes() == 0 and trace.held == []


@pytest.mark.parametrize("mode,precision", [("none", "fp32"), ("selective", "fp32"), ("full", "bf16")])
def test_the_engines_probe_is_the_same_tracer(mode, precision):
    # one dispatch mode: measure.activation_bytes reads memtrace's Tracer (labkit.engine.tracer), nothing of its own
    from labkit.engine import measure, tracer as tracer_mod

    assert measure.Tracer is memtrace.Tracer is tracer_mod.Tracer
    cfg = lk.Config(model="tiny", checkpointing=mode, precision=precision)
    torch.manual_seed(0)
    model = GPT(cfg.spec, checkpointing_mode=mode)
    idx = torch.randint(0, 256, (2, cfg.spec.seq_len))
    tracer = memtrace.Tracer(model)
    with tracer:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(idx, idx)
        acts, copies = tracer.alive_bytes()
        tracer.end_forward()
    trace = tracer.finish(model)
    assert (acts, copies) == activation_bytes(cfg, torch.device("cpu"), batch=2)
    # exactly what the trace keeps, plus what the forward pass's last op made (the loss backward starts from)
    last = sum(h.nbytes for h in trace.held if h.born == trace.forward_end and not h.weight_copy)
    assert acts == trace.kept_bytes() + last and 0 < last <= 64
    assert copies == trace.weight_copy_bytes()
    del loss


# ---- chapter 04's results display themselves: Notes built from the measurements passed in ----------------

class _Run:
    def __init__(self, **summary):
        self.summary = summary


class _Cmp:
    """A none-against-option comparison as the chapter reads it: ratio and interval, counted extras, repeats."""

    def __init__(self, ratio, low, high, a_bytes=8 * 2**20, b_bytes=2 * 2**20):
        self.ratio, self.low, self.high = ratio, low, high
        self.exact = {"activation_bytes": (a_bytes, b_bytes), "hardware_flops_per_step": (100, 130),
                      "model_flops_per_step": (100, 100)}


NB4 = Path(__file__).resolve().parent.parent / "notebooks" / "04_activation_checkpointing.ipynb"


def _runs(act, hw, times, mfu=0.02, hfu=0.026):
    return [_Run(activation_bytes=act, hardware_flops_per_step=hw, model_flops_per_step=100, step_time_s=t, mfu=mfu,
                 hfu=hfu, peak_flops_source="measured on this machine (a matmul probe)") for t in times]


def test_chapter_04_rows_hold_what_the_trace_counted():
    cfg = lk.Config(model="tiny", micro_batch=2)
    traces = {m: memtrace.trace_step(cfg.replace(checkpointing=m)) for m in ("none", "full")}
    parts = memtrace.part_rows(traces["none"])
    assert parts[-1] == dict(part="all", bytes=traces["none"].kept_bytes())
    assert sum(r["bytes"] for r in parts[:-1]) == traces["none"].kept_bytes() and parts[1]["part"] == "block 0"
    assert [r["n"] for r in memtrace.kept_rows(traces["none"], limit=3)] == [1, 2, 3, None]
    assert memtrace.size(3 * 2**20) == "3.00 MiB" and memtrace.size(1536) == "1.50 KiB" and memtrace.size(12) == "12 B"


def test_chapter_04_counted_figures_and_utilization_come_from_the_comparison():
    assert memtrace.counted_figures(_Cmp(1.2, 1.1, 1.3)) == dict(none_mib=8.0, full_mib=2.0, kept_pct=25.0,
                                                                  flops_ratio=1.3)
    rows = memtrace.utilization_rows({"none": _runs(1, 100, [1.0, 2.0]), "full": _runs(1, 130, [1.0])})
    assert [(r["option"], r["runs"], r["peak_from"]) for r in rows] == [("none", 2, "probe"), ("full", 1, "probe")]
    assert rows[0]["mfu"] == 0.02 and rows[0]["ratio"] == pytest.approx(1.3)


def test_utilization_rows_say_whole_where_the_peak_came_from():
    # the engine's sentence for a peak probed under load ends with that fact: cut at 50 characters, it was lost
    source = ("measured: best of 1 short probe of fp32 matmuls up to 1024x1024 with 1 thread, the highest kept; "
              "other programs were using the cores meanwhile, so it reads low and is not cached on this cpu")
    loaded = [_Run(**{**r.summary, "peak_flops_source": source}) for r in _runs(1, 100, [1.0])]
    rows = memtrace.utilization_rows({"none": loaded, "full": _runs(1, 130, [1.0])})
    assert [r["peak_from"] for r in rows] == ["probe_loaded", "probe"] and rows[0]["source"] == source
    assert memtrace.peak_from("NVIDIA H100 SXM datasheet") == "datasheet"


def test_chapter_04_options_rows_costs_and_axes():
    repeats = {"none": _runs(8, 100, [1.0, 3.0, 2.0]), "full": _runs(2, 130, [2.5])}
    rows = memtrace.options_rows(repeats)
    assert rows[0] == dict(name="none", activation_bytes=8, step_time_s=2.0, hardware_flops=100, flops_ratio=1.0)
    assert rows[1]["flops_ratio"] == 1.3
    cmp = _Cmp(1.25, 1.0, 1.6)
    assert memtrace.relative_cost(None, "cpu_s_per_update") == (1.0, 1.0, 1.0)
    assert memtrace.relative_cost(cmp, "cpu_s_per_update") == (1.25, 1.0, 1.6)
    assert memtrace.relative_cost(cmp, "tokens_per_s") == (0.8, 1 / 1.6, 1.0)  # time is 1 / throughput
    ax = memtrace.options_axes([dict(name="none", activation_bytes=8 * 2**20), dict(name="full", activation_bytes=2**20)],
                               {"full": cmp}, "cpu_s_per_update")
    assert ax.get_ylim()[1] == pytest.approx(1.6 * 1.2) and [t.get_text() for t in ax.texts] == ["none", "full"]


def _sweep_counts(T, selective=60.0):
    kept = {}
    for T_ in T:
        kept.update({("math", "none", T_): 100.0 * T_, ("math", "attention", T_): 40.0 * T_,
                     ("math", "selective", T_): (selective if T_ == T[0] else 60.0) * T_,
                     ("math", "full", T_): 10.0 * T_, ("auto", "none", T_): 50.0 * T_,
                     ("auto", "attention", T_): 49.0 * T_, ("auto", "selective", T_): 30.0 * T_,
                     ("auto", "full", T_): 10.0 * T_})
    return kept


def test_chapter_04_attention_sweep_figures_read_the_counts():
    T = [64, 128]
    kept = _sweep_counts(T)
    got = memtrace.attention_sweep_figures(kept, T, {"attention": 0.03, "full": 0.3})
    assert (got["lo"], got["hi"], got["math_attention_lo"], got["math_attention_hi"]) == (64, 128, 40.0, 40.0)
    assert got["tt_share_pct"] == pytest.approx(50.0) and got["auto_attention_hi"] == pytest.approx(98.0)
    assert got["math_selective_hi"] == pytest.approx(60.0) and got["dropped_kib"] == pytest.approx(128 / 1024)
    assert got["recompute_attention_pct"] == pytest.approx(3.0) and got["recompute_full_pct"] == pytest.approx(30.0)
    assert (got["less"], got["attention_at"], got["sac_at"]) == ("attention", "64, 128", "")
    split = memtrace.attention_sweep_figures(_sweep_counts(T, selective=20.0), T, {"attention": 0.03, "full": 0.3})
    assert (split["less"], split["sac_at"], split["attention_at"]) == ("split", "64", "128")
    fig = memtrace.plot_attention_sweep(kept, T, {"none": "none", "attention": "a", "selective": "s", "full": "f"},
                                        {"math": "math", "auto": "fused"})
    assert len(fig.axes) == 2


def test_chapter_04_references_are_rows_and_none_when_none_are_shipped(monkeypatch):
    monkeypatch.setattr(memtrace, "reference_points", lambda section=None: [])
    assert memtrace.checkpointing_references() == [] and memtrace.budget_references() == []
    point = dict(id="p1", label="H100, full", status="ok", summary=dict(
        precision="bf16", compile=False, step_time_s=0.0125, activation_bytes=2**31, hfu=0.39, mfu=0.3,
        peak_mem_bytes=3 * 2**30))
    monkeypatch.setattr(memtrace, "reference_points", lambda section=None: [point] if section in (
        "checkpointing", "memory_budget") else [])
    assert memtrace.checkpointing_references() == [dict(label="H100, full", step_ms=12.5, activation_gib=2.0,
                                                        hfu_over_mfu=pytest.approx(1.3))]
    assert memtrace.budget_references() == [dict(label="H100, full", status="ok", peak_gib=3.0)]


def test_chapter_04_oom_budget_holds_the_state_and_half_the_activations():
    """The GPU cell's budget, computed here on the CPU (the same probe): training state + B/2 sequences + 0.5 GiB."""
    cfg = lk.Config(model="tiny")
    per_sample, _ = activation_bytes(cfg, torch.device("cpu"), batch=1)
    static = 16 * sum(p.numel() for p in GPT(cfg.spec).parameters())
    budget_gb, plan = memtrace.oom_budget(cfg, 16, torch.device("cpu"))
    assert budget_gb == pytest.approx((static + 8 * per_sample) / 2**30 + 0.5) == plan["budget_gib"]
    assert plan["micro_batch"] == 16 and plan["state_gib"] == static / 2**30
    assert plan["activations_gib"] == pytest.approx(16 * per_sample / 2**30)


def test_chapter_04_options_cost_is_the_compared_cost_the_chart_shows():
    """The table's cost column (chapter 04's cell c23t) reads relative_cost of each option's interleaved
    comparison with none, as the chart does -- not the median wall time of each option's own runs."""
    src = "".join(next(c for c in json.loads(NB4.read_text())["cells"] if c.get("id") == "c23t")["source"])
    assert "ch04.relative_cost(cmps.get(r[\"name\"]), metric)" in src and "step_time_s" not in src
    assert memtrace.relative_cost(_Cmp(1.19, 1.1, 1.3), "cpu_s_per_update") == (1.19, 1.1, 1.3)


def test_chapter_04_options_table_gives_an_interval_only_where_its_comparison_could():
    """A learner's pass under load: every A/B of the options had 2 + 2 runs and said 'fewer than 4 runs per arm
    give no 95 % interval', while c23t's column, headed '95 % interval', showed one for each. The cell's
    cost_words, run here on two comparisons: one with runs enough for a verdict, one without."""
    src = "".join(next(c for c in json.loads(NB4.read_text())["cells"] if c.get("id") == "c23t")["source"])
    scope = dict(ch04=memtrace, metric="cpu_s_per_update")
    exec(src[src.index("def cost_words"):src.index("display(")], scope)
    decided, few = _Cmp(1.19, 1.1, 1.3), _Cmp(1.11, 1.09, 1.13)
    decided.decided, few.decided = True, False
    scope["cmps"] = {"full": decided, "every 2": few}
    assert scope["cost_words"]({"name": "full"}) == "1.19× (1.10–1.30)"
    assert scope["cost_words"]({"name": "every 2"}) == "1.11× (too few runs)"
    assert scope["cost_words"]({"name": "none"}) == "1.00× (1.00–1.00)"


def test_chapter_04_oom_reading_says_what_the_cell_did():
    assert memtrace.oom_reading({})["verdict"] == "skipped"
    got = memtrace.oom_reading({"none": "out of memory", "full": "fits"})
    assert (got["verdict"], got["failed"], got["after"]) == ("recovered", "none", "full")
    assert memtrace.oom_reading({"none": "fits", "full": "fits"}) == dict(verdict="all_fit", failed=None, after=None,
                                                                            fit="none, full")
    assert memtrace.oom_reading({"full": "fits", "none": "out of memory"})["verdict"] == "none_after"
