"""Chapter 12's HSDP and order-of-transforms instruments: the formulas pinned by hand, bad input refused before
any process starts, and one real run of each lab (4 gloo ranks) whose counts must equal the formulas and whose
outcomes must be the ones the chapter explains."""
from __future__ import annotations

import copy

import pytest

from labkit.base.runtime import ConfigError
from labkit.chapters.ch12_compose import hsdp, order
from labkit.engine.config import PRESETS
from labkit.tools import collectives

TINY = PRESETS["tiny"]


# ---- the formulas ----------------------------------------------------------------------------------------------

def test_unit_bytes_are_the_tiny_gpt_units_and_pad_dim0():
    shapes = hsdp.unit_shapes(TINY)
    # root: wte 256 x 64 + wpe 64 x 64 + ln_f 2 x 64 = 20,608 fp32; a block 49,984 parameters
    assert hsdp.unit_bytes(shapes["root"], 2) == 20_608 * 4
    assert hsdp.unit_bytes(shapes["block"], 4) == 49_984 * 4
    assert hsdp.unit_bytes([(3,), (5, 2)], 2) == (4 + 6 * 2) * 4  # rows rounded up to a multiple of 2
    assert hsdp.unit_bytes([(3, 3)], 4, dtype_bytes=2) == 4 * 3 * 2


def test_expected_calls_and_bytes():
    assert hsdp.expected_calls(2, 2, 2) == {"all_gather": {"calls": 5, "dim": "shard"},
                                            "reduce_scatter": {"calls": 3, "dim": "shard"},
                                            "all_reduce": {"calls": 3, "dim": "replicate"}}
    assert hsdp.expected_calls(4, 1, 4)["all_reduce"]["calls"] == 0  # plain FSDP: no AllReduce
    b = hsdp.expected_bytes(TINY, 2)
    assert b["all_gather"]["block"] == b["reduce_scatter"]["block"] == 199_936
    assert b["all_reduce"] == {"root": 41_216, "block": 99_968}
    with pytest.raises(ConfigError):
        hsdp.expected_calls(2, 2, 1)


def test_nodes_and_ring_bytes():
    assert hsdp.crosses_nodes((0, 2), 2) and not hsdp.crosses_nodes((2, 3), 2)
    assert hsdp.sent_bytes("all_gather", 100, 4) == 75
    assert hsdp.sent_bytes("all_reduce", 100, 2) == 100
    with pytest.raises(ConfigError):
        hsdp.sent_bytes("broadcast", 100, 2)


def test_step_comm_by_hand():
    # 1e9 bf16 params, 16 blocks: a block is 1.25e8 bytes
    h = hsdp.step_comm_s(1e9, 16, replicate=2, shard=8)
    gather = 7 / 8 * 1.25e8 / 450e9 + 7 * 3e-6                 # half a ring over 8 on NVLink
    reduce = 2 * 1 / 2 * (1.25e8 / 8) / 50e9 + 2 * 5e-6          # ring AllReduce of the shard over 2, IB
    assert h["all_gather"] == pytest.approx(32 * gather)
    assert h["reduce_scatter"] == pytest.approx(16 * gather)
    assert h["all_reduce"] == pytest.approx(16 * reduce)
    f = hsdp.step_comm_s(1e9, 16, replicate=1, shard=16)
    assert f["all_reduce"] == 0
    assert f["all_gather"] == pytest.approx(32 * (15 / 16 * 1.25e8 / 50e9 + 15 * 5e-6))  # leaves the node: IB


def test_predicted_rows_and_verdicts():
    rows = hsdp.predicted_rows()
    assert {r["label"] for r in rows} == {"predicted"}
    seventy = {r["layout"]: r for r in rows if r["model"] == "70B"}
    assert seventy["hsdp"]["state_bytes"] == pytest.approx(16 * 70e9 / 8)
    assert seventy["fsdp"]["state_bytes"] == pytest.approx(16 * 70e9 / 16)
    assert hsdp.predicted_verdicts(rows) == {"1B": "hsdp", "7B": "hsdp", "70B": "fsdp_only_fits"}
    with pytest.raises(ConfigError):
        hsdp.predicted_rows(sizes=[])


def test_an_unknown_gpu_is_refused_as_every_choice_is():
    from labkit.engine.config import _choice
    from labkit.whatif.devices import catalogue
    with pytest.raises(ConfigError) as got:
        hsdp.predicted_rows(gpu="a100-sxm-80gb")
    with pytest.raises(ConfigError) as choice:
        _choice("gpu", "a100-sxm-80gb", list(catalogue()["devices"]))
    assert (got.value.field, got.value.allowed) == (choice.value.field, choice.value.allowed)


# ---- bad input: refused before any process starts ---------------------------------------------------------------

@pytest.fixture
def no_spawn(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a process started before the input was checked")
    monkeypatch.setattr(collectives, "spawn_ranks", refuse)  # hsdp's and order's labs spawn through it


@pytest.mark.parametrize("kw", [dict(model="huge"), dict(world_size=3), dict(world_size=16),
                                dict(replicate=3), dict(replicate=1), dict(world_size=4, replicate=4),
                                dict(micro_batch=0), dict(timeout_s=-1)])
def test_hsdp_lab_refuses_bad_input(no_spawn, kw):
    with pytest.raises(ConfigError):
        hsdp.hsdp_lab(**kw)


@pytest.mark.parametrize("kw", [dict(model="huge"), dict(world_size=3), dict(world_size=10),
                                dict(compile_check="yes"), dict(seed=-1)])
def test_order_lab_refuses_bad_input(no_spawn, kw):
    with pytest.raises(ConfigError):
        order.order_lab(**kw)


# ---- one real run of each lab ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hs():
    lab = hsdp.hsdp_lab(model="tiny", micro_batch=2, world_size=4, replicate=2)
    assert lab["ok"], lab.get("error")
    return lab


@pytest.fixture(scope="module")
def od():
    lab = order.order_lab(model="tiny", micro_batch=2, world_size=4, compile_check=True)
    assert lab["ok"], lab.get("error")
    return lab


def test_hsdp_counts_equal_the_formulas_on_every_rank(hs):
    assert hsdp.counts_verdict(hs) == "agree"
    for r in range(4):
        for row in hsdp.count_rows(hs, r):
            assert row["calls"] == row["expected"]
            assert row["bytes"] == row["expected_bytes"]
    rows = {(r["layout"], r["collective"]): r for r in hsdp.count_rows(hs)}
    assert not rows["hsdp", "all_gather"]["crosses_nodes"] and not rows["hsdp", "reduce_scatter"]["crosses_nodes"]
    assert rows["hsdp", "all_reduce"]["crosses_nodes"] and rows["hsdp", "all_reduce"]["groups"] == "0,2"
    assert rows["fsdp", "all_gather"]["groups"] == "0,1,2,3"


def test_hsdp_crossing_memory_and_gradients(hs):
    h, f = hsdp.crossing_rows(hs)
    assert h["crossing_calls"] == TINY.n_layer + 1 and f["crossing_calls"] == f["calls"] == 3 * TINY.n_layer + 2
    assert h["param_bytes"] == 2 * f["param_bytes"]
    assert h["crossing_sent"] < f["crossing_sent"]
    assert h["grad_diff"] < 1e-6


def test_the_verdict_catches_a_wrong_count_or_group(hs):
    bad = copy.deepcopy(hs)
    bad["ranks"][1]["hsdp"]["calls"].pop()
    assert hsdp.counts_verdict(bad) == "differ"
    moved = copy.deepcopy(hs)
    moved["ranks"][0]["hsdp"]["calls"][0]["ranks"] = (0, 2)  # an AllGather across the nodes
    assert hsdp.counts_verdict(moved) == "differ"


def test_order_outcomes_are_the_chapters(od):
    assert order.verdicts(od) == {"torchtitan": "ran", "fsdp_first": "raised", "ac": "more_gathered",
                                  "compile": "same_graphs"}
    for rank in od["ranks"]:
        per, stack = rank["ac_per_block"], rank["ac_stack"]
        L = stack["n_layer"]
        assert per["all_gather"] == stack["all_gather"] == 2 * L + 1
        assert per["recomputed"] == stack["recomputed"] == L
        assert stack["most_gathered_backward"] == L and per["most_gathered_backward"] <= 2
        assert rank["torchtitan"]["all_gather"] == 2 * TINY.n_layer + 1
        assert rank["torchtitan"]["loss_diff"] < 1e-5
        assert "DTensor" in rank["fsdp_first"]["error"]
    rows = order.order_rows(od)
    assert [r["case"] for r in rows] == list(order.ORDERS)
