"""labkit.chapters.ch09_playbook: memory arithmetic (pure), grid and Pareto front, a real tiny grid search, the FSDP demo."""
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import labkit as lk
from labkit.chapters import ch09_playbook as pb

MiB = 2**20


# ---- memory arithmetic -----------------------------------------------------------------------------------

@pytest.mark.parametrize("stage, per_param", [(0, lambda g: 16), (1, lambda g: 4 + 12 / g),
                                              (2, lambda g: 2 + 14 / g), (3, lambda g: 16 / g)])
@pytest.mark.parametrize("n_gpus", [1, 2, 8, 64])
def test_zero_stages_follow_the_zero_paper(stage, per_param, n_gpus):
    n = 7e9
    assert math.isclose(pb.zero_bytes_per_gpu(n, n_gpus, stage), per_param(n_gpus) * n)


def test_seven_billion_on_eight_gpus():
    assert pb.zero_bytes_per_gpu(7e9, 8, 0) == 112e9  # the classic 16 bytes/param
    assert math.isclose(pb.zero_bytes_per_gpu(7e9, 8, 1), 38.5e9)
    assert math.isclose(pb.zero_bytes_per_gpu(7e9, 8, 3), 14e9)


@given(n=st.floats(1e6, 1e12), g=st.integers(1, 1024))
@settings(max_examples=60, deadline=None)
def test_each_stage_needs_no_more_than_the_one_before(n, g):
    per = [pb.zero_bytes_per_gpu(n, g, s) for s in range(4)]
    assert all(a >= b * (1 - 1e-12) for a, b in zip(per, per[1:]))
    assert math.isclose(per[3] * g, per[0])  # stage 3: exactly one n_gpus-th of everything


@given(n=st.floats(1e6, 1e12), g=st.integers(1, 64), stage=st.integers(0, 3),
       opt=st.sampled_from(sorted(pb.OPTIMIZER_BYTES)))
@settings(max_examples=60, deadline=None)
def test_offload_moves_bytes_and_loses_none(n, g, stage, opt):
    plain = pb.state_bytes_per_gpu(n, g, stage, opt)
    for kw in (dict(offload_optimizer=True), dict(offload_params=True)):
        off = pb.state_bytes_per_gpu(n, g, stage, opt, **kw)
        assert math.isclose(off["total"] + off["cpu"], plain["total"], rel_tol=1e-9)
        assert off["optimizer"] == 0
    assert pb.state_bytes_per_gpu(n, g, stage, opt, offload_params=True)["total"] == 0


def test_eight_bit_adam_shrinks_only_the_moments():
    plain = pb.state_bytes_per_gpu(1e9, 1, 0, "adam")
    small = pb.state_bytes_per_gpu(1e9, 1, 0, "adam8bit")
    assert plain["total"] == 16e9 and small["total"] == 10e9
    assert small["params"] == plain["params"] and small["grads"] == plain["grads"]


def test_bad_arguments_are_refused():
    for kw in (dict(stage=4), dict(n_gpus=0), dict(optimizer="lion")):
        with pytest.raises(lk.ConfigError):  # a ValueError, in the course's field=value style
            pb.state_bytes_per_gpu(1e9, **{"n_gpus": 1, **kw})


def test_activation_estimate():
    none = pb.activation_bytes_estimate(32, 4096, 32, 4096, 1)
    assert none == 32 * 4096 * 4096 * 34  # s·b·h·34 per layer with a fused attention kernel
    assert pb.activation_bytes_estimate(32, 4096, 32, 4096, 1, flash=False) > none  # + the s×s scores
    assert pb.activation_bytes_estimate(32, 4096, 32, 4096, 1, checkpointing="full") == 32 * 2 * 4096 * 4096
    assert pb.activation_bytes_estimate(32, 4096, 32, 4096, 2) == 2 * none


@pytest.mark.parametrize("n, acts, fix", [(1.3e9, 0, "ddp"), (7e9, 0, "zero1"), (13e9, 20e9, "zero2"),
                                          (30e9, 0, "zero3"), (100e9, 0, "zero3+offload_optimizer"),
                                          (2e12, 10e9, "zero3+offload_params"), (1e9, 100e9, None)])
def test_smallest_fix_on_an_eight_gpu_node(n, acts, fix):
    assert pb.smallest_fix(n, 8, 80e9, activation_bytes=acts) == fix


def test_remedies_are_ordered_and_include_activations():
    rows = pb.remedies(13e9, 8, 80e9, activation_bytes=20e9)
    assert [r["remedy"] for r in rows] == list(pb.REMEDIES)
    assert all(r["per_gpu"] == r["total"] + 20e9 for r in rows)
    assert [r["fits"] for r in rows] == [False, False, True, True, True, True]
    fig = pb.remedy_chart(rows, 80e9)
    assert len(fig.axes) == 1


# ---- grid, Pareto front, budget ----------------------------------------------------------------------------

def test_grid_keeps_the_effective_batch():
    pts = pb.grid(precision=("fp32", "bf16"), micro_batch=(1, 2, 3, 4, 16), checkpointing=("none", "full"),
                  effective_batch=8)
    assert {p["micro_batch"] * p["accum"] for p in pts} == {8}
    assert {p["micro_batch"] for p in pts} == {1, 2, 4}  # 3 does not divide 8, 16 is larger
    assert len(pts) == 2 * 3 * 2
    assert len(pb.grid(micro_batch=(1, 2), accum=(1, 4))) == 2 * 2 * 2 * 2


def _row(mem, speed, **knobs):
    point = {**dict(precision="bf16", micro_batch=1, accum=1, checkpointing="none", workers=0), **knobs}
    return pb.row_from_summary(point, dict(tokens_per_s=speed, param_bytes=mem, grad_bytes=0, optimizer_bytes=0,
                                           activation_bytes=0))


pairs = st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), min_size=1, max_size=25)


@given(pairs)
@settings(max_examples=100, deadline=None)
def test_pareto_front_is_exactly_the_undominated_points(pts):
    rows = [_row(m, s) for m, s in pts]
    front = pb.pareto_front(rows)
    f = [(r["memory_bytes"], r["tokens_per_s"]) for r in front]
    assert f == sorted(f) and all(a[1] < b[1] for a, b in zip(f, f[1:]))  # cheaper -> slower, strictly
    for m, s in f:  # nothing beats a front point on both axes
        assert not any(m2 <= m and s2 >= s and (m2, s2) != (m, s) for m2, s2 in pts)
    for m, s in pts:  # everything else is matched or beaten by a front point
        assert any(fm <= m and fs >= s for fm, fs in f)


def test_best_within_and_memory_of():
    rows = [_row(50 * MiB, 100), _row(60 * MiB, 300), _row(70 * MiB, 500)]
    assert pb.best_within(rows, 65 * MiB)["tokens_per_s"] == 300
    assert pb.best_within(rows, 10 * MiB) is None
    assert pb.memory_of(dict(peak_mem_bytes=123, param_bytes=1)) == (123.0, "peak")
    assert pb.memory_of(dict(peak_mem_bytes=None, param_bytes=1, grad_bytes=2, optimizer_bytes=3,
                             activation_bytes=4)) == (10.0, "breakdown")
    assert pb.memory_of(dict(peak_mem_bytes=None)) == (None, None)


def test_table_and_labels():
    rows = [_row(50 * MiB, 100), _row(70 * MiB, 500)]
    rows.append(pb.row_from_summary(dict(precision="tf32", micro_batch=2, accum=4, checkpointing="full"), None,
                                    "refused", "no tf32 here"))
    table, unit = pb.table_rows(rows, 60 * MiB)
    assert unit == "MiB" and [r["fits"] for r in table] == [False, True, None]   # fastest first
    assert [r["memory"] for r in table[:2]] == [70, 50] and table[2]["status"] == "refused"
    assert table[2]["tokens_per_s"] is None and [r["fits"] for r in pb.table_rows(rows)[0]] == [None] * 3
    assert pb.label(dict(precision="bf16", micro_batch=4, accum=2, checkpointing="full", workers=2)) == \
        "bf16 mb=4 K=2 ckpt w=2"


def _texts(fig):
    """Every piece of text a figure draws: titles, labels, tick labels, legends, annotations."""
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_text().strip()]


def test_pareto_chart_with_and_without_reference(tmp_path):
    """Issue 24.6: with no reference shipped the chart is one panel, not yours beside an empty one."""
    rows = [_row(50 * MiB, 100), _row(60 * MiB, 300, checkpointing="full")]
    fig = pb.pareto_chart(rows, 55 * MiB, [])
    assert len(fig.axes) == 1
    assert "mb=1" in " ".join(t.get_text() for t in fig.axes[0].texts)  # which configuration each dot is
    hidden = pb.pareto_chart(rows, 55 * MiB, [], mark_best=False)
    labels = lambda f: [t.get_text() for t in f.legends[0].get_texts()]  # noqa: E731
    assert "best within budget" in labels(fig) and "best within budget" not in labels(hidden)
    summary = dict(precision="bf16", micro_batch=8, accum=1, checkpointing="none", workers=0,
                   tokens_per_s=1e5, peak_mem_bytes=3 * 2**30)
    doc = {"schema": 1, "provenance": {"gpu": "NVIDIA H200", "torch_version": "2.11.0", "date": "2026-01-01"},
           "points": [{"id": "grid/bf16-B8-K1-none", "section": "grid", "command": "x", "status": "ok",
                       "summary": summary},
                      {"id": "grid/fp32-B8-K1-none", "section": "grid", "command": "x", "status": "oom"}]}
    (tmp_path / "ref.json").write_text(json.dumps(doc))
    ref = pb.reference_rows("grid", directory=tmp_path)
    assert len(ref) == 1 and ref[0]["memory_source"] == "peak" and "H200" in ref[0]["device"]
    fig = pb.pareto_chart(rows, 55 * MiB, ref, reference_budget_bytes=16 * 2**30)
    assert len(fig.axes) == 2 and "H200" in fig.axes[1].get_title()


def test_every_playbook_figure_is_readable_at_notebook_width():
    """Brief, figures: at least ~10 px of text where the notebook shows the figure unscaled (about 800-900 px
    wide): 8 pt at the course's 90 dpi; and no figure wider than the output area."""
    from labkit.tools import plots

    rows = [_row(50 * MiB, 100), _row(60 * MiB, 300, checkpointing="full")]
    res = lk.Result(lk.Config(model="tiny"), {}, [dict(update=i + 1, loss=5.0 - i / 10) for i in range(5)])
    figs = [pb.pareto_chart(rows, 55 * MiB, []), pb.pareto_chart(rows, 55 * MiB, rows),
            pb.remedy_chart(pb.remedies(13e9, 8, 80e9, activation_bytes=20e9), 80e9),
            pb.loss_chart([res], ["x"]), pb.lr_chart({4: {1e-3: 3.0, 1e-2: 2.5}})]
    curves = {(b, 1e-3): [3.0 + 0.02 * (20 * (1 + 8 / b) - i) for i in range(200)] for b in (2, 8, 32)}
    figs.append(pb.critical_batch_chart([pb.critical_batch_estimate(curves, 3.0, resamples=0)]))
    for fig in figs:
        assert fig.get_figwidth() * fig.dpi <= 860, fig.get_figwidth()
        small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig)
                 if t.get_fontsize() * fig.dpi / 72 < 9.9]
        assert not small, small


def test_grid_search_runs_real_points_and_keeps_refused_ones():
    seen = []
    pts = pb.grid(precision=("fp32", "tf32"), micro_batch=(1, 2), checkpointing=("none",), effective_batch=2)
    rows = pb.grid_search(dict(model="tiny", steps=2, device="cpu"), pts, progress=False, on_point=seen.append)
    assert len(rows) == len(seen) == 4
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["precision"] for r in ok} == {"fp32"}  # tf32 is CUDA-only: refused with the reason
    assert all(r["status"] == "refused" and "tf32" in r["error"] for r in rows if r["precision"] == "tf32")
    assert all(r["memory_source"] == "breakdown" and r["tokens_per_s"] > 0 for r in ok)
    small, big = sorted(ok, key=lambda r: r["micro_batch"])
    assert big["activation_bytes"] == 2 * small["activation_bytes"]  # activations scale with the micro-batch
    assert big["param_bytes"] == small["param_bytes"]
    assert pb.pareto_front(rows)  # refused rows are left out, not crashed on


# ---- convergence helpers ------------------------------------------------------------------------------------

def test_convergence_helpers():
    cfg = lk.Config(model="tiny", micro_batch=2, accum=2)
    res = lk.Result(cfg, {}, [dict(update=i + 1, loss=5.0 - i) for i in range(5)])
    assert pb.tokens_seen(res) == [cfg.tokens_per_update * (i + 1) for i in range(5)]
    assert pb.final_loss(res) == 2.0  # mean of the last three
    assert len(pb.loss_chart([res], ["x"]).axes) == 1
    assert len(pb.lr_chart({4: {1e-3: 3.0, 1e-2: 2.5}}).axes) == 1


# ---- FSDP on gloo -----------------------------------------------------------------------------------------

def test_fsdp_demo_shards_and_matches_one_process(no_leftover_processes):
    demo = pb.fsdp_demo(model="tiny", world_size=2, micro_batch=2, steps=2)
    assert demo["ok"], demo.get("error")
    rep = demo["replica"]
    for r in demo["ranks"]:
        for k in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert r[k] == rep[k] // 2, (k, r[k], rep[k])
    single = pb.single_process_losses(lk.PRESETS["tiny"], batch=4, steps=2)
    assert max(abs(a - b) for a, b in zip(demo["losses"], single)) < 1e-4


# ---- chapter 09 in Chromium: labels apart, plain tick labels, one digit count per column -------------------

def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def test_remedy_tick_labels_do_not_run_together():
    fig = pb.remedy_chart(pb.remedies(7e9, 8, 80e9, activation_bytes=20e9), 80e9)
    renderer = _drawn(fig)
    ticks = fig.axes[0].get_xticklabels()
    assert "zero3 +\noffload\noptimizer" in [t.get_text() for t in ticks]
    boxes = [t.get_window_extent(renderer) for t in ticks]
    for a, b in zip(boxes, boxes[1:]):
        assert a.x1 + 2 < b.x0, "two option labels touch"


def _tick_texts(fig):
    return [t.get_text() for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
            for t in axis.get_majorticklabels() + axis.get_minorticklabels() if t.get_text()]


def test_log_axes_have_plain_tick_labels():
    lr = pb.lr_chart({8: {1e-3: 3.1, 3e-3: 2.9, 1e-2: 3.0}, 32: {1e-3: 3.3, 3e-3: 3.0, 1e-2: 2.95}})
    _drawn(lr)
    assert [t.get_text() for t in lr.axes[0].get_xticklabels() if t.get_text()] == ["0.001", "0.003", "0.01"]
    curves = {(b, 1e-3): [3.0 + 0.02 * (20 * (1 + 8 / b) - i) for i in range(200)] for b in (2, 4, 8)}
    crit = pb.critical_batch_chart([pb.critical_batch_estimate(curves, t, resamples=0) for t in (3.0, 3.1)])
    _drawn(crit)
    for fig in (lr, crit):
        texts = _tick_texts(fig)
        assert texts and not [t for t in texts if "10^" in t or "×10" in t or "$" in t], texts
    assert len(crit.axes[0].yaxis.get_majorticklocs()) >= 2  # a span under a decade still gets labels


def test_checkpointing_labels_sit_below_their_dots_off_the_front():
    rows = [_row(40 * MiB, 1900), _row(36 * MiB, 1500, checkpointing="full"), _row(62 * MiB, 2300, micro_batch=8,
                                                                                    checkpointing="full")]
    fig = pb.pareto_chart(rows, 62 * MiB, [])
    offsets = {t.xy: t.xyann for t in fig.axes[0].texts if t.get_text().startswith("mb=")}
    assert offsets[(40.0, 1900)][1] > 0  # a plain dot: its label above-right
    assert offsets[(36.0, 1500)][1] < 0 and offsets[(62.0, 2300)][1] < 0


@pytest.mark.parametrize("v, text", [(1.7, "1.70"), (1.61, "1.61"), (1.6, "1.60"), (42.7, "42.7"), (879, "879"),
                                     (0.5, "0.500"), (2.0, "2.00"), (1720.0, "1,720"), (0, "0"), (None, "–"),
                                     (float("nan"), "–"), (-1.5, "-1.50")])
def test_fixed_digits_keeps_trailing_zeros(v, text):
    assert pb.fixed_digits(v) == text


# ---- the one sweep (labkit.tools.sweep): the grid search and the CLI's sweep run through it ----------------

class _Fake:
    def __init__(self, summary):
        self.summary = summary


def test_the_grid_search_and_the_cli_sweep_run_through_the_one_sweep(monkeypatch, capsys):
    from labkit import __main__ as cli
    from labkit.tools import sweep

    calls, real = [], sweep.run_configs
    monkeypatch.setattr(sweep, "run_configs", lambda configs, *a, **k: calls.append(k["label"]) or real(configs, *a, **k))
    fake = lambda cfg: _Fake({"tokens_per_s": 1.0, "accum": cfg.accum})  # noqa: E731
    pts = pb.grid(precision=("fp32",), micro_batch=(1, 2), checkpointing=("none",), effective_batch=2)
    assert len(pb.grid_search(dict(model="tiny", steps=1), pts, progress=False, run_fn=fake)) == 2
    monkeypatch.setattr(cli, "run", fake)
    monkeypatch.setattr(cli, "check_device", lambda cfg: None)
    assert cli.main(["sweep", "--model", "tiny", "--steps", "1", "--grid", "accum=1,2"]) == 0
    assert calls == ["grid", "sweep"]
    assert [r["accum"] for r in json.loads(capsys.readouterr().out)] == [1, 2]


def test_the_sweep_alternates_its_passes_skips_a_failed_point_and_says_the_time_left(monkeypatch):
    from test_frontend import RecordingProgress

    from labkit.tools import sweep

    monkeypatch.setattr(sweep, "Progress", RecordingProgress)
    RecordingProgress.made = []
    order = []

    def run(cfg):
        order.append(cfg)
        if cfg == "b":
            raise lk.OutOfMemory("no room. Try a smaller micro-batch")
        return _Fake({"x": cfg})

    runs, failed = sweep.run_configs(["a", "b", "c"], run, label="grid", notes=["A", "B", "C"], repeats=3,
                                     failures=((lk.ConfigError, "refused"), (lk.OutOfMemory, "oom")))
    assert order == ["a", "b", "c", "c", "a", "a", "c"]  # forwards, backwards, forwards; b not retried
    assert runs == {0: [{"x": "a"}] * 3, 1: [], 2: [{"x": "c"}] * 3}
    assert failed[1][0] == "oom" and isinstance(failed[1][1], lk.OutOfMemory)
    bar = RecordingProgress.made[0]
    assert (bar.total, bar.label, bar.updates) == (9, "grid", list(range(9)) + [9])
    assert bar.notes[0] == "A [pass 1/3]" and "(oom)" in bar.notes[4] and bar.notes[4].startswith("B [pass 2/3]")
    assert all(" left" in n for n in bar.notes[1:9])  # measured from the runs so far, from the second run on
    with pytest.raises(RuntimeError, match="boom"):  # a failure not named in ``failures`` ends the sweep
        sweep.run_configs(["a"], lambda cfg: (_ for _ in ()).throw(RuntimeError("boom")), delay=math.inf)


def test_the_sweep_counts_a_grid_before_building_it():
    from labkit.tools import sweep

    assert sweep.count_runs({"a": [1, 2], "b": [1, 2, 3]}, 6) == 6 and sweep.count_runs({}, 1) == 1
    with pytest.raises(lk.ConfigError, match=r"at most 5 runs in one sweep \(2 a x 3 b\); pass --max-runs 6"):
        sweep.count_runs({"a": [1, 2], "b": [1, 2, 3]}, 5)
    for bad in (0, True, 2.5):
        with pytest.raises(lk.ConfigError, match="^max_runs="):
            sweep.count_runs({}, bad)


def test_the_fsdp_demo_out_of_time_says_so_and_leaves_nothing(no_leftover_processes, tmp_path, monkeypatch):
    """Its ranks are the launcher's: a demo that runs out of time is ok=False with the reason, every rank is
    reaped and the store's folder removed."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    demo = pb.fsdp_demo(model="tiny", world_size=2, micro_batch=2, steps=1, timeout_s=0.01)
    assert demo["ok"] is False and demo["error"].startswith("FSDP demo: no result after"), demo
    assert not list(tmp_path.glob("labkit-fsdp-*"))


def test_micro_batch_labels_of_dots_close_together_do_not_overlap():
    """Issue 46 (learner's pass): two checkpointed dots 1.8 MiB apart printed 'mb=4mb=8'."""
    rows = [_row(83.0 * MiB, 1046, micro_batch=8), _row(66.2 * MiB, 1014, micro_batch=4),
            _row(57.9 * MiB, 862, micro_batch=2), _row(51.2 * MiB, 696, micro_batch=4, checkpointing="full"),
            _row(53.0 * MiB, 694, micro_batch=8, checkpointing="full"),
            _row(50.3 * MiB, 616, micro_batch=2, checkpointing="full")]
    fig = pb.pareto_chart(rows, 62 * MiB, [])
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts if t.get_text().startswith("mb=")]
    assert len(boxes) == 6
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
