"""Chapter 12's mesh and FSDP2-over-TP lab (labkit.chapters.ch12_compose.twod) and its formulas
(labkit.whatif.layouts): the figures pinned by hand, bad input refused before any process starts,
the head-major attention equal to labkit's, and one real spawn of 4 gloo ranks whose every count,
memory figure and loss equals the formula or the one-process reference."""
import pytest
import torch

import labkit as lk
from labkit.base.runtime import RunError
from labkit.chapters.ch12_compose import twod
from labkit.engine.config import PRESETS
from labkit.engine.ddp import demo_batches
from labkit.engine.launch import live_children
from labkit.engine.model import GPT
from labkit.tools import collectives

TINY = PRESETS["tiny"]  # 2 blocks, width 64, 4 heads, 64 tokens
ACT = 4 * 64 * 64 * 4  # one (micro-batch 4, seq 64, width 64) fp32 activation: 65,536 bytes
# tiny's parameters: the plan's matrices (qkv, proj, fc, out and the column biases) and the rest
SPLIT = 2 * (192 * 64 + 192 + 64 * 64 + 256 * 64 + 256 + 64 * 256)  # 99,200: TP divides these
WHOLE = 256 * 64 + 64 * 64 + 2 * 64 + 2 * (4 * 64 + 2 * 64)  # 21,376: embeddings, norms, row biases


# ---- the formulas --------------------------------------------------------------------------------

def test_block_collectives_are_the_exercise_formula():
    assert twod.block_collectives(2, False) == {"all_reduce": 8, "all_gather": 0, "reduce_scatter": 0}
    assert twod.block_collectives(3, True) == {"all_reduce": 0, "all_gather": 12, "reduce_scatter": 12}
    assert twod.block_collectives(1, 0) == {"all_reduce": 4, "all_gather": 0, "reduce_scatter": 0}


def test_the_mesh_fills_row_by_row():
    rows = twod.mesh_layout(2, 2)
    assert [(r["dp"], r["tp"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert rows[0]["tp_group"] == [0, 1] and rows[0]["dp_group"] == [0, 2] and rows[3]["dp_group"] == [1, 3]
    r5 = twod.mesh_layout(2, 8)[13]  # two nodes of 8: rank 13 is node 1's GPU 5
    assert (r5["dp"], r5["tp"], r5["dp_group"], r5["tp_group"]) == (1, 5, [5, 13], list(range(8, 16)))


def test_memory_per_rank_is_split_and_sharded_by_hand():
    assert SPLIT + WHOLE == sum(p.numel() for p in GPT(TINY).parameters())
    for (dp, tp), n in {(2, 2): SPLIT // 4 + WHOLE // 2, (4, 1): (SPLIT + WHOLE) // 4,
                        (1, 4): SPLIT // 4 + WHOLE, (1, 1): SPLIT + WHOLE}.items():
        m = twod.expected_memory(TINY, dp, tp)
        assert m == {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n, "total": 16 * n}, (dp, tp)
    assert twod.expected_memory(TINY, 2, 2)["total"] == 567_808
    # three dp ranks: rows in chunks of ceil(rows / 3), the largest rank's share (22 of a norm's 64)
    assert twod.expected_memory(TINY, 3, 1)["params"] // 4 == sum(
        -(-p.shape[0] // 3) * p[0].numel() for p in GPT(TINY).parameters())


def test_tp_collectives_with_and_without_sequence_parallelism():
    off = twod.expected_tp_calls(TINY, 4, 2, False)
    assert [(r["phase"], r["kind"], r["bytes"], r["calls"]) for r in off] == [
        ("forward", "all_reduce", ACT, 4), ("backward", "all_reduce", ACT, 4)]
    on = {(r["phase"], r["kind"]): r for r in twod.expected_tp_calls(TINY, 4, 2, True)}
    assert on["forward", "all_gather"]["bytes"] == ACT // 2 and on["forward", "reduce_scatter"]["bytes"] == ACT
    assert {k: (r["blocks"], r["edges"], r["grads"], r["calls"]) for k, r in on.items()} == {
        ("forward", "all_gather"): (4, 1, 0, 5), ("forward", "reduce_scatter"): (4, 0, 0, 4),
        ("backward", "all_gather"): (4, 1, 0, 5), ("backward", "reduce_scatter"): (4, 0, 0, 4),
        ("backward", "all_reduce"): (0, 0, 8, 8)}
    assert on["backward", "all_reduce"]["bytes"] == 64 * 4  # one LayerNorm weight (or bias)


def test_fsdp_collectives_gather_the_tp_local_units():
    block_tp2 = (192 * 64 + 192 + 64 * 64 + 256 * 64 + 256 + 64 * 256) // 2 + 4 * 64 + 2 * 64  # 25,184
    root = 256 * 64 + 64 * 64 + 2 * 64
    got = {(r["phase"], r["kind"], r["bytes"]): r["calls"] for r in twod.expected_fsdp_calls(TINY, 2, 2)}
    assert got == {("forward", "all_gather", 4 * root): 1, ("forward", "all_gather", 4 * block_tp2): 2,
                   ("backward", "all_gather", 4 * block_tp2): 2,
                   ("backward", "reduce_scatter", 4 * block_tp2): 2, ("backward", "reduce_scatter", 4 * root): 1}


def test_loss_parallel_formula():
    f = twod.expected_loss_parallel(4, 64, 64, 2)
    assert f["gathered_bytes"] == 4 * 64 * 256 * 4 and f["sharded_bytes"] == f["gathered_bytes"] // 2
    assert f["calls"][True] == {("all_reduce", 4 * 64 * 4): 3, ("all_reduce", ACT): 1}
    assert f["calls"][False] == {("all_gather", 4 * 64 * 128 * 4): 1, ("all_reduce", ACT): 1}


@pytest.mark.parametrize("call", [
    lambda: twod.expected_memory(TINY, 2, 3), lambda: twod.expected_memory(TINY, 1, 8),
    lambda: twod.expected_memory(TINY, 0, 2), lambda: twod.expected_tp_calls(TINY, 0, 2, True),
    lambda: twod.expected_fsdp_calls(TINY, 2, 2.0), lambda: twod.block_collectives(0, True),
    lambda: twod.mesh_layout(2, 0), lambda: twod.expected_loss_parallel(4, 64, 64, 3),
    lambda: twod.check_layout(TINY, 2, 3)])
def test_bad_formula_input_is_refused(call):
    with pytest.raises(lk.ConfigError):
        call()


@pytest.mark.parametrize("kw", [dict(model="tinny"), dict(micro_batch=0), dict(micro_batch=2.0),
                                dict(seed=-1), dict(timeout_s=0), dict(timeout_s=float("nan"))])
def test_bad_lab_input_is_refused_before_any_process(kw, monkeypatch):
    def no_spawn(*a, **k):
        raise AssertionError("a process was started for bad input")

    monkeypatch.setattr(collectives, "spawn_ranks", no_spawn)
    with pytest.raises(lk.ConfigError):
        twod.twod_lab(**kw)


def test_a_failed_spawn_is_reported_not_raised(monkeypatch):
    def failing(*a, **k):
        raise RunError("The 2-D lab: rank 1 failed: planted")

    monkeypatch.setattr(collectives, "spawn_ranks", failing)
    lab = twod.twod_lab(seed=12345)
    assert lab["ok"] is False and "planted" in lab["error"]


def test_head_major_attention_is_labkits_attention():
    torch.manual_seed(0)
    x, y = next(demo_batches(TINY, 2, 1, 0))
    torch.manual_seed(3)
    ref = GPT(TINY)(x, y)
    assert abs(twod.head_major_gpt(TINY, 3)(x, y).item() - ref.item()) < 1e-5
    attn = GPT(TINY).blocks[0].attn
    w = attn.qkv.weight.detach().clone()
    order = twod.head_major(attn)
    assert torch.equal(attn.qkv.weight[:48], torch.cat([w[0:16], w[64:80], w[128:144]]))  # head 0's q k v
    assert torch.equal(attn.qkv.weight[torch.argsort(order)], w)


# ---- one real spawn of 4 gloo ranks --------------------------------------------------------------

@pytest.fixture(scope="module")
def lab():
    before = {p.pid for p in live_children()}
    out = twod.twod_lab(model="tiny", micro_batch=4, reuse=False)
    assert out["ok"], out.get("error")
    assert {p.pid for p in live_children()} <= before  # no rank outlived the lab
    return out


def test_the_mesh_is_the_row_by_row_layout(lab):
    assert lab["mesh"] == twod.mesh_layout(2, 2) and twod.verdicts(lab)["mesh"] == "agree"


def test_every_count_equals_the_formula_with_and_without_sp(lab):
    assert twod.verdicts(lab)["counts"] == "agree"
    assert all(r["measured"] == r["formula"] for sp in (False, True) for r in twod.count_rows(lab, sp))
    assert twod.call_totals(lab, False, "TP") == twod.block_collectives(2, False)
    assert twod.call_totals(lab, True, "TP") == {"all_reduce": 8, "all_gather": 8 + 2, "reduce_scatter": 8}
    for sp in (False, True):
        assert twod.call_totals(lab, sp, "FSDP2") == {"all_reduce": 0, "all_gather": 5, "reduce_scatter": 3}


def test_the_2d_step_matches_one_process(lab):
    assert lab["loss_error"] < 1e-5 and lab["grad_error"] < 1e-5
    assert abs(lab["ref_loss"] - lab["steps"][True]["loss"]) < 1e-5


def test_memory_per_rank_equals_the_formula_and_orders_the_layouts(lab):
    rows = {r["layout"]: r for r in twod.memory_rows(lab)}
    assert all(r["total"] == r["formula"]["total"] for r in rows.values())
    assert rows["2-D"]["params"] == 4 * (SPLIT // 4 + WHOLE // 2)
    assert rows["FSDP"]["total"] < rows["2-D"]["total"] < rows["TP"]["total"]
    assert twod.verdicts(lab)["memory"] == "agree"


def test_loss_parallel_equals_the_gathered_loss_and_holds_half_the_logits(lab):
    gathered, parallel = twod.loss_parallel_rows(lab)
    assert gathered["loss_error"] < 1e-6 and parallel["loss_error"] < 1e-5 and parallel["grad_error"] < 1e-6
    assert parallel["logits_bytes"] * 2 == gathered["logits_bytes"] == 4 * 64 * 256 * 4
    assert twod.verdicts(lab)["loss_parallel"] == "agree"


def test_the_same_call_reuses_the_run_without_a_process(lab, monkeypatch):
    monkeypatch.setattr(collectives, "spawn_ranks", lambda *a, **k: pytest.fail("spawned again"))
    assert twod.twod_lab(model="tiny", micro_batch=4) is lab
