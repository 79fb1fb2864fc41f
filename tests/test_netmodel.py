"""labkit.chapters.ch06_ddp and whatif.roofline: the ring AllReduce cost model (pure functions) and the torchrun command."""
import math
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import labkit as lk
from labkit.chapters import ch06_ddp as nm
from labkit.whatif import roofline as rl


def test_link_figures_are_the_cited_ones():
    assert rl.LINKS["nvlink"].bandwidth == 450e9
    assert rl.LINKS["infiniband"].bandwidth == 50e9  # 400 Gb/s
    assert rl.LINKS["ethernet"].bandwidth == pytest.approx(3.125e9)  # 25 Gb/s


def test_ring_small_cases():
    assert rl.ring_allreduce_s(1e9, 1, 50e9, 1e-3) == 0.0
    assert rl.ring_allreduce_s(1e9, 2, 50e9) == pytest.approx(1e9 / 50e9)  # 2·(1/2)·B/β
    assert rl.ring_allreduce_s(1e9, 2, 50e9, 1e-6) == pytest.approx(1e9 / 50e9 + 2e-6)
    with pytest.raises(ValueError):
        rl.ring_allreduce_s(1, 2, 0)


@settings(deadline=None)  # a busy CI machine must not turn a slow example into a failure
@given(st.floats(1e3, 1e11), st.integers(2, 4096), st.floats(1e8, 1e12))
def test_bandwidth_term_tends_to_twice_bytes_over_bandwidth(nbytes, n, bw):
    t = rl.ring_allreduce_s(nbytes, n, bw)
    assert nbytes / bw - 1e-12 <= t <= 2 * nbytes / bw + 1e-12
    assert rl.ring_bytes_sent(nbytes, n) == pytest.approx(2 * (n - 1) / n * nbytes)


@settings(deadline=None)  # a busy CI machine must not turn a slow example into a failure
@given(st.integers(2, 2048), st.floats(1e-7, 1e-4))
def test_latency_term_grows_linearly(n, lat):
    a = rl.ring_allreduce_s(0, n, 1e9, lat)
    assert a == pytest.approx(2 * (n - 1) * lat)
    assert rl.ring_allreduce_s(0, n + 1, 1e9, lat) > a


def test_allreduce_calls():
    assert rl.allreduce_calls(3, 4, "no_sync") == 3
    assert rl.allreduce_calls(3, 4, "every_micro") == 12
    with pytest.raises(ValueError):
        rl.allreduce_calls(1, 1, "sometimes")


@settings(deadline=None)  # a busy CI machine must not turn a slow example into a failure
@given(st.floats(1e-3, 1.0), st.floats(1e6, 1e10), st.sampled_from([8, 64, 512]),
       st.sampled_from(list(rl.LINKS)), st.sampled_from([1, 2, 4, 16]))
def test_accumulation_never_raises_the_communication_share(compute, grad_bytes, n, link, k):
    L = rl.LINKS[link]
    one = rl.update_time(compute, grad_bytes, n, L, accum=1)
    more = rl.update_time(compute, grad_bytes, n, L, accum=k)
    assert more["comm_s"] == pytest.approx(one["comm_s"])  # no_sync: one synchronisation per update
    assert more["comm_frac"] <= one["comm_frac"] + 1e-12
    every = rl.update_time(compute, grad_bytes, n, L, accum=k, ddp_sync="every_micro")
    assert every["comm_s"] == pytest.approx(k * one["comm_s"])


def test_overlap_hides_at_most_the_backward():
    L = rl.LINKS["ethernet"]
    no = rl.update_time(0.1, 4e8, 64, L)
    full = rl.update_time(0.1, 4e8, 64, L, overlap=1.0)
    assert full["exposed_comm_s"] == pytest.approx(max(0.0, no["comm_s"] - 0.1 * 2 / 3))
    with pytest.raises(ValueError):
        rl.update_time(0.1, 4e8, 64, L, overlap=1.5)


def test_crossover_is_the_first_dominated_count():
    L = rl.LINKS["ethernet"]
    n = rl.crossover(0.05, 4e8, L)
    assert n is not None and n >= 2
    dom = lambda m: (lambda r: r["exposed_comm_s"] >= r["compute_s"])(rl.update_time(0.05, 4e8, m, L))  # noqa: E731
    assert dom(n) and (n == 2 or not dom(n - 1))
    # accumulation pushes the point out (or away entirely)
    later = rl.crossover(0.05, 4e8, L, accum=8)
    assert later is None or later > n
    assert rl.crossover(10.0, 1e3, rl.LINKS["nvlink"], max_n=4096) is None


def test_sweep_rows():
    rows = rl.sweep(0.05, 4e8, accums=(1, 4))
    assert len(rows) == 3 * 3 * 2
    assert {r["n"] for r in rows} == {8, 64, 512}


def test_torchrun_command_is_a_valid_cli_line():
    cfg = lk.Config(model="base", precision="bf16", accum=4, micro_batch=16)
    cmd = nm.torchrun_command(cfg, nproc_per_node=8)
    assert cmd.startswith("torchrun --nproc_per_node=8 -m labkit run --model base")
    args = shlex.split(cmd)[4:]  # after "torchrun --nproc... -m labkit"
    import argparse

    from labkit.__main__ import _add_config_args

    ap = argparse.ArgumentParser()
    _add_config_args(ap)
    parsed = ap.parse_args(args[1:])  # after "run"
    assert parsed.accum == 4 and parsed.precision == "bf16" and parsed.micro_batch == 16
    two = nm.torchrun_command(cfg, nproc_per_node=8, nnodes=2)
    assert "--nnodes=2" in two and "--rdzv-endpoint=" in two


def test_flops_compute_s():
    assert rl.flops_compute_s(1e15, 1e15, 0.5) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        rl.flops_compute_s(1, 1, 0)


def test_bucket_timeline_on_this_machine():
    tl = nm.bucket_timeline(lk.Config(model="tiny", micro_batch=2, bucket_cap_mb=0.1))
    assert tl["first_update_buckets"] == 1  # DDP's first iteration: one bucket for everything
    assert len(tl["buckets"]) > 1 and tl["n_buckets"] == len(tl["buckets"])
    assert 0 <= tl["first_ready"] <= tl["last_ready"] <= 1 + 1e-3 / tl["backward_s"]
    assert all(0 <= b["t_s"] <= tl["backward_s"] + 1e-3 for b in tl["buckets"])
    total = sum(b["bytes"] for b in tl["buckets"])
    from labkit.engine.model import GPT

    n = sum(p.numel() for p in GPT(lk.Config(model="tiny").spec).parameters())
    assert total == 4 * n
    assert not math.isnan(tl["backward_s"])
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_model_rows_have_a_row_per_link_and_k_and_the_crossover():
    table, rows = nm.model_rows(0.05, 500e6, 20)
    assert len(table) == 3 * 3 and len(rows) == 3 * 3 * 3
    eth = next(r for r in table if r["link"] == rl.LINKS["ethernet"].name and r["K"] == 1)
    assert set(eth) == {"link", "K", 8, 64, 512, "crossover"} and 0 < eth[8] <= eth[512] <= 1
    assert eth["crossover"] == rl.crossover(0.05, 500e6, rl.LINKS["ethernet"], accum=1, n_buckets=20)
    seconds, basis = nm.micro_batch_compute(1e12)
    assert basis == {"verdict": "assumed", "peak_tflops": 989, "mfu_pct": 40, "sequences": 8}  # none shipped
    assert seconds == pytest.approx(rl.flops_compute_s(1e12, peak_flops=989e12, mfu=0.4))
    with pytest.raises(lk.ConfigError, match="flops_micro"):
        nm.micro_batch_compute(-1)


def test_the_model_chart_names_the_50_percent_line_in_its_legend_not_over_the_lines():
    # a learner's pass: the "communication = compute" label sat on the Ethernet K=16 line at 8 GPUs
    import matplotlib
    matplotlib.use("Agg")
    _, rows = nm.model_rows(0.05, 500e6, 20)
    fig = nm.plot_model(rows)
    ax = fig.axes[0]
    assert not [t for t in ax.texts if "compute" in t.get_text()]
    assert "communication = compute" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_chapter_06_asks_for_the_ring_formula_before_any_cell_states_it():
    # issue 46.4: the formula printed right above the exercise gave the answer away
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "06_ddp_allreduce.ipynb").read_text())
    cells = nb["cells"]
    exercise = next(i for i, c in enumerate(cells) if "exercise-06-ring-formula" in c["metadata"].get("tags", []))
    before = "\n".join("".join(c["source"]) for c in cells[:exercise])
    after = "\n".join("".join(c["source"]) for c in cells[exercise + 1:exercise + 3])
    for answer in ("2·(N−1)/N", "2·(N-1)/N", "t = 2", "/ β"):
        assert answer not in before
    assert "2·(N−1)/N · B / β + 2·(N−1) · α" in after  # revealed right after the exercise
