"""labkit.tools.plots: every chart renders to PNG from real records, without widgets and without training."""
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.tools import plots  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs():
    """Three real tiny runs: plain fp32, fp16 with a GradScaler, bf16 with accumulation and checkpointing."""
    base = lk.Config(model="tiny", steps=4)
    return [lk.run(base), lk.run(base.replace(precision="fp16")),
            lk.run(base.replace(precision="bf16", accum=2, checkpointing="full"))]


def png_ok(fig):
    data = plots.to_png(fig)
    assert data.startswith(PNG) and len(data) > 2000
    return data


@pytest.mark.parametrize("name", plots.CHARTS)
def test_every_live_chart_renders_from_result_dict_and_records(runs, name):
    draw = plots.DRAW[name]
    for data in (runs[1], {"records": runs[1].records, "summary": runs[1].summary}, runs[1].records):
        fig = draw(data)
        assert isinstance(fig, matplotlib.figure.Figure)
        png_ok(fig)


@pytest.mark.parametrize("name", plots.CHARTS)
def test_charts_say_why_when_there_is_nothing_to_draw(name):
    fig = plots.DRAW[name]({"records": []})
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any(texts), "an empty chart should say why it is empty"
    png_ok(fig)


def test_charts_draw_into_a_given_axes(runs):
    fig = plots.new_figure(8, 3)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    assert plots.step_time(runs[0], ax=ax1) is fig
    assert plots.loss(runs[1], ax=ax2) is fig
    assert ax1.collections, "the stacked step-time parts are drawn as filled areas"
    png_ok(fig)


def test_step_time_stacks_data_wait_compute_and_optimizer(runs):
    fig = plots.step_time(runs[0])
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["optimizer", "compute", "data wait"]  # top to bottom, as stacked
    top = max(fig.axes[0].collections[-1].get_paths()[0].vertices[:, 1])
    slowest = max(1000 * r["step_time_s"] for r in runs[0].records)
    assert top == pytest.approx(slowest, rel=1e-6), "the stack adds up to the step time"


def test_memory_splits_the_bytes_and_compares_runs(runs):
    fig = plots.memory(runs)
    ax = fig.axes[0]
    key = [t.get_text() for t in ax.texts]
    for words in ("parameters", "gradients", "optimizer state", "activations"):
        assert words in key
    ticks = [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()]
    assert ticks == [plots.run_label(r.summary) for r in runs]
    png_ok(fig)


def test_memory_draws_the_device_peak_as_a_line():
    summary = {"param_bytes": 2**20, "grad_bytes": 2**20, "optimizer_bytes": 2**21, "activation_bytes": 2**22,
               "peak_mem_bytes": 9 * 2**20, "precision": "fp32"}
    ax = plots.memory({"records": [], "summary": summary}).axes[0]
    peaks = [c for c in ax.collections if c.get_label() == "measured device peak"]
    assert peaks and peaks[0].get_segments()[0][0][1] == pytest.approx(9.0)  # MiB


def test_loss_marks_the_grad_scale_and_skipped_updates():
    recs = [dict(update=i, loss=5.0 - i / 10, grad_scale=2.0**16 / (2 if i >= 3 else 1), skipped=i == 3,
                 nonfinite=i == 3) for i in range(1, 6)]
    fig = plots.loss(recs)
    twin = fig.axes[1]
    assert twin.get_yscale() == "log"
    assert [line.get_label() for line in twin.lines] == ["grad scale", "skipped update"]
    assert twin.lines[1].get_xdata().tolist() == [3]
    key = [t.get_text() for t in fig.axes[0].texts]
    assert key == ["grad scale (right)", "▼ = NaN/inf loss", "x = skipped update"]
    png_ok(fig)


def test_allreduce_shows_per_update_and_cumulative(runs):
    fig = plots.allreduce(runs[2])
    key = [t.get_text() for t in fig.axes[0].texts]
    total = sum(r["allreduce_calls"] for r in runs[2].records)
    assert key == ["per update (left)", f"cumulative: {total} (right)"]
    assert fig.axes[1].lines[0].get_ydata()[-1] == total


def test_dashboard_redraws_without_piling_up_artists(runs):
    d = plots.Dashboard()
    d.draw(runs[0])
    counts = [len(ax.lines) + len(ax.collections) + len(ax.texts) for ax in d.fig.axes]
    for _ in range(3):
        d.draw(runs[0])
    assert [len(ax.lines) + len(ax.collections) + len(ax.texts) for ax in d.fig.axes] == counts
    assert d.png(runs[1]).startswith(PNG)


def test_live_chart_follows_a_growing_run(runs):
    chart = plots.LiveChart("throughput")
    records = runs[0].records
    sizes = [len(chart.png({"records": records[:n]})) for n in range(0, len(records) + 1)]
    assert all(s > 1000 for s in sizes)
    assert len(chart.ax.lines) == 2  # the line and its median, not one per redraw
    assert len(chart.ax.texts) == 1  # the median's value


def test_ratios_against_a_baseline():
    base = {"precision": "fp32", "tokens_per_s": 1000.0, "activation_bytes": 100, "mfu": 0.1, "step_time_s": 1.0}
    bf16 = {**base, "precision": "bf16", "tokens_per_s": 2100.0, "activation_bytes": 52, "step_time_s": 0.5}
    rows = plots.ratios([{"summary": base}, {"summary": bf16}], baseline=0)
    assert rows[1]["tokens_per_s"] == pytest.approx(2.1)
    assert rows[1]["activation_bytes"] == pytest.approx(0.52)
    assert rows[1]["peak_mem_bytes"] is None  # missing on both: no ratio, not a zero
    line = plots.ratio_lines([{"summary": base}, {"summary": bf16}])[0]
    assert line.startswith("bf16: 2.1× tokens/s") and "0.52× activation memory" in line


def test_compare_and_reference_render(runs):
    fig = plots.compare(runs, baseline=0)
    assert "baseline" in " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    png_ok(fig)
    point = {"summary": {**runs[0].summary, "tokens_per_s": 4e6, "step_time_s": 1e-4, "mfu": 0.4},
             "provenance": {"gpu": "NVIDIA H200", "torch_version": "2.11.0", "date": "2026-11-01"}}
    fig = plots.reference(runs[0], [point])
    names = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_yticklabels()]
    assert "NVIDIA H200, torch 2.11.0, 2026-11-01" in names
    png_ok(fig)
    assert isinstance(plots.reference(runs[0].summary, []), plots.NoChart)  # nothing to compare: no chart


def test_run_labels_name_what_differs(runs):
    assert plots.run_label(runs[0].summary) == "tiny"
    assert plots.run_label(runs[2].summary, runs[0].summary) == "bf16 accum=2 checkpointing=full"


@pytest.mark.parametrize("mode, said", [("full", True), ("attention", True), ("selective", False), ("none", False)])
def test_run_labels_say_k_wherever_checkpointing_uses_it(mode, said):
    # attention checkpointing recomputes every k-th block's attention core: its k changes the run (a
    # label that named k for "full" only called attention k=1 and k=2 the same run)
    k2 = {"model": "small", "checkpointing": mode, "checkpoint_every": 2}
    assert ("checkpoint_every=2" in plots.run_label(k2)) is said
    k1 = {**k2, "checkpoint_every": 1}
    assert plots.run_label(k2, k1) == ("checkpoint_every=2" if said else "same knobs")


def test_run_labels_leave_out_configs_own_defaults():
    from labkit.tools.plots import figure
    assert plots.run_label(lk.Config().to_dict()) == "baseline"  # Config's defaults say nothing
    assert ({k: figure._DEFAULTS[k] for k in plots.LABEL_KNOBS}
            == {k: getattr(lk.Config(), k) for k in plots.LABEL_KNOBS})
    more = lk.Config().micro_batch + 1
    assert plots.run_label({"model": "small", "accum": 1, "micro_batch": more}) == f"micro_batch={more}"


def test_log_ticks_label_more_than_the_powers_of_ten():
    assert plots.log_ticks(0.8, 25) == [1, 2, 5, 10, 20]
    assert len(plots.log_ticks(3, 8)) >= 3  # inside one decade: still several labels
    assert len(plots.log_ticks(0.01, 300)) <= 7
    assert plots.log_ticks(5, 5) == [] and plots.log_ticks(0, 10) == []


def test_figures_show_in_a_notebook_without_pyplot(runs):
    assert plots.throughput(runs[0])._repr_png_().startswith(PNG)


def test_plots_never_use_pyplot():
    # pyplot would register figures with the notebook backend (double display, memory held forever)
    code = ("import sys, labkit as lk; from labkit import plots; "
            "plots.to_png(plots.loss([{'update': 1, 'loss': 5.0}])); "
            "assert 'matplotlib.pyplot' not in sys.modules; assert 'ipywidgets' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_hfu_equal_to_mfu_stays_visible_over_it():
    # #46 item 10: without recompute HFU equals MFU, and the HFU line vanished under the MFU one
    recs = [dict(update=i, mfu=0.1, hfu=0.1) for i in range(1, 5)]
    lines = {ln.get_label(): ln for ln in plots.utilization({"records": recs}).axes[0].lines}
    hfu, mfu = lines["HFU"], lines["MFU"]
    assert hfu.get_zorder() > mfu.get_zorder() and hfu.get_linestyle() != mfu.get_linestyle()
    assert hfu.get_linewidth() < mfu.get_linewidth()  # the wide MFU line shows round the dashed HFU one
