"""labkit.chapters.ch12_compose.moe: the capacity and aux-loss formulas, the router's top-k, dropping
at capacity exactly, bad input refused before any work, expert parallelism on 4 real gloo ranks against the
one-process layer and the byte formula (one spawn for the module), the balance run's verdicts, the active-versus-
total arithmetic."""
import math

import pytest
import torch

import labkit as lk
from labkit.chapters.ch12_compose import moe
from labkit.engine.launch import live_children
from labkit.tools import collectives


# ---- the formulas ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, E, k, cf, slots", [
    (256, 8, 2, 1.25, 80), (256, 8, 2, 1.0, 64), (10, 4, 1, 1.0, 3), (512, 8, 2, 0.5, 64), (7, 8, 2, 2.0, 4),
    (1, 8, 1, 1.0, 1), (100, 3, 2, 1.0, 67)])
def test_capacity_is_ceil_of_factor_times_balanced_load(tokens, E, k, cf, slots):
    assert moe.capacity(tokens, E, k, cf) == slots == math.ceil(cf * tokens * k / E)


def test_aux_loss_is_one_for_a_uniform_router_and_E_for_a_collapsed_one():
    E, n = 8, 64
    uniform = torch.full((n, E), 1 / E)
    for chosen in (torch.randint(0, E, (n, 2)), torch.zeros(n, 2, dtype=torch.long)):
        assert moe.load_balancing_loss(uniform, chosen, E).item() == pytest.approx(1.0)
    collapsed = torch.zeros(n, E)
    collapsed[:, 3] = 1.0
    assert moe.load_balancing_loss(collapsed, torch.full((n, 1), 3), E).item() == pytest.approx(E)
    # f and P spread evenly: 1; f_e from the assignments, P_e the mean probability
    probs = torch.softmax(torch.randn(n, E), dim=-1)
    chosen = probs.topk(2, dim=-1).indices
    f = torch.bincount(chosen.flatten(), minlength=E).float() / chosen.numel()
    assert moe.load_balancing_loss(probs, chosen, E).item() == pytest.approx(E * (f * probs.mean(0)).sum().item())


def test_router_keeps_the_top_k_of_the_softmax_with_renormalised_gates():
    torch.manual_seed(0)
    router = moe.Router(16, 8, 2)
    x = torch.randn(50, 16)
    probs, gates, chosen = router(x)
    want = torch.softmax(x @ router.gate.weight.t(), dim=-1)
    assert torch.allclose(probs, want, atol=1e-6)
    assert torch.equal(chosen, want.topk(2, dim=-1).indices)
    assert torch.allclose(gates.sum(-1), torch.ones(50))
    top = want.gather(1, chosen)
    assert torch.allclose(gates, top / top.sum(-1, keepdim=True), atol=1e-6)


def test_within_capacity_drops_exactly_the_arrivals_over_the_slots():
    # 5 tokens choose expert 0 first; their second choices spread over 1, 2, 3 (at most 2 each)
    chosen = torch.tensor([[0, 1], [0, 2], [0, 3], [0, 1], [0, 2]])
    kept = moe.within_capacity(chosen, 4, slots=3)
    assert kept[:, 0].tolist() == [True, True, True, False, False]  # the first 3 arrivals at expert 0
    assert kept[:, 1].all()
    assert moe.within_capacity(chosen, 4, slots=5).all()  # load == slots: nothing dropped
    assert (~moe.within_capacity(chosen, 4, slots=4)).sum() == 1  # one over: one dropped
    # first choices queue before any second choice: token 2's first choice beats token 0's second
    chosen = torch.tensor([[1, 0], [2, 3], [0, 1]])
    assert moe.within_capacity(chosen, 4, slots=1).tolist() == [[True, False], [True, True], [True, False]]


def test_the_layer_is_the_gated_sum_of_its_experts_and_a_dropped_token_gets_nothing():
    torch.manual_seed(1)
    layer = moe.MoE(16, 4, 2, 32, capacity_factor=2.0)  # capacity = all tokens: nothing dropped
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        y = layer(x)
        _, gates, chosen = layer.router(x.reshape(-1, 16))
        flat = x.reshape(-1, 16)
        want = torch.stack([sum(gates[n, j] * layer.experts[int(chosen[n, j])](flat[n]) for j in range(2))
                            for n in range(15)])
    assert layer.dropped == 0 and y.shape == x.shape
    assert torch.allclose(y.reshape(-1, 16), want, atol=1e-6)
    assert layer.load.sum() == 30
    layer.capacity_factor = 0.25  # 2 slots per expert for 30 assignments: at least 22 dropped
    with torch.no_grad():
        y = layer(x).reshape(-1, 16)
    assert layer.dropped == 30 - (layer.load.clamp(max=2)).sum().item() >= 22
    kept = moe.within_capacity(chosen, 4, moe.capacity(15, 4, 2, 0.25))
    assert torch.equal(y[~kept.any(1)], torch.zeros_like(y[~kept.any(1)]))  # fully dropped: the residual alone


def test_balanced_drop_share():
    assert moe.balanced_drop_share(512, 8, 2, 0.5) == 0.5
    for cf in (1.0, 1.25, 2.0):
        assert moe.balanced_drop_share(512, 8, 2, cf) == 0.0


def test_dropped_share_restores_the_factor():
    model = moe.tiny_model(seed=0)
    x = torch.randint(0, 256, (2, 64))
    share = moe.dropped_share(model, x, x, 0.5)
    assert 0.5 <= share < 1  # at factor 0.5 at least half the assignments cannot fit
    assert all(m.capacity_factor == 1.25 for m in model.moes())


# ---- bad input ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [(0, 8, 2, 1.0), (256, 0, 2, 1.0), (256, 8, 0, 1.0), (256, 8, 9, 1.0),
                                  (256, 8, 2, 0), (256, 8, 2, float("nan")), (256, 8, 2, -1.0), (2.5, 8, 2, 1.0),
                                  (256, 8, True, 1.0), (256, 8, 2, "1.25")])
def test_bad_capacity_input_is_refused(args):
    with pytest.raises(lk.ConfigError):
        moe.capacity(*args)


@pytest.mark.parametrize("kw", [dict(d_model=0), dict(n_experts=4, top_k=5), dict(capacity_factor=0.0),
                                dict(d_expert=-1)])
def test_bad_layer_input_is_refused(kw):
    with pytest.raises(lk.ConfigError):
        moe.MoE(**{**dict(d_model=16, n_experts=4, top_k=2, d_expert=32), **kw})


@pytest.mark.parametrize("kw", [dict(world_size=3), dict(world_size=1), dict(n_experts=6), dict(top_k=9),
                                dict(tokens=0), dict(factors=()), dict(factors="1.0"), dict(factors=(0.0,)),
                                dict(timeout_s=0), dict(world_size=4.0), dict(seed=-1)])
def test_bad_ep_input_is_refused_before_any_process(kw, monkeypatch):
    def no_spawn(*a, **k):
        raise AssertionError("a process was started for bad input")

    monkeypatch.setattr(collectives, "spawn_ranks", no_spawn)
    with pytest.raises(lk.ConfigError):
        moe.ep_demo(**kw)


@pytest.mark.parametrize("kw, field", [(dict(world_size=0, top_k=0), "world_size"),
                                       (dict(tokens=-1, world_size=0), "world_size"),
                                       (dict(d_model=0, top_k=9), "d_model"),
                                       (dict(top_k=9, world_size=0), "world_size")])
def test_bad_ep_input_names_the_fields_in_their_order(kw, field):
    with pytest.raises(lk.ConfigError) as e:
        moe.ep_demo(**kw)
    assert e.value.field == field


@pytest.mark.parametrize("kw", [dict(aux_weight=0.0), dict(aux_weight=-0.1), dict(steps=2), dict(seed=-1),
                                dict(batch=0), dict(aux_weight=float("inf"))])
def test_bad_balance_input_is_refused_before_training(kw, monkeypatch):
    monkeypatch.setattr(moe, "balance_run", lambda *a, **k: pytest.fail("training started for bad input"))
    with pytest.raises(lk.ConfigError):
        moe.balance_lab(**kw)


def test_bad_arithmetic_and_sweep_input_is_refused():
    with pytest.raises(lk.ConfigError):
        moe.capacity_rows({})
    with pytest.raises(lk.ConfigError):
        moe.capacity_rows({"fresh": moe.tiny_model()}, factors=(1.0, 0))
    with pytest.raises(lk.ConfigError):
        moe.ep_rows({"ok": False})


# ---- expert parallelism on 4 real ranks ------------------------------------------------------------------

def test_counted_bytes_formula_by_hand():
    send = [[3, 1], [2, 4]]  # rank 0 sends 3 rows to itself, 1 to rank 1; rank 1 sends 2 to rank 0, 4 to itself
    got = moe.counted_bytes(send, d_model=2, n_experts=4)
    assert got == [{"counts": 32, "dispatch": 5 * 8, "combine": 4 * 8, "off_rank": 1 * 8},
                   {"counts": 32, "dispatch": 5 * 8, "combine": 6 * 8, "off_rank": 2 * 8}]
    assert moe.alltoall_bytes(256, 2, 64, 4) == {"buffer": 131072, "off_rank": 98304.0}


@pytest.fixture(scope="module")
def ep():
    demo = moe.ep_demo(world_size=4, n_experts=8, top_k=2, tokens=64, d_model=16, d_expert=32, factors=(None, 0.5))
    assert demo["ok"], demo.get("error")
    return demo


def test_ep_equals_the_one_process_layer_and_counts_equal_the_formula(ep):
    assert moe.ep_verdict(ep) == "agree"
    rows = moe.ep_rows(ep)
    assert len(rows) == 8 and all(r["calls"] == 3 for r in rows)
    for r in rows:
        assert r["counted"] == r["formula"]
        assert r["error"] <= moe.TOLERANCE
    loose = [r for r in rows if r["factor"] == 4.0]  # E / k: nothing can be dropped
    buffer = moe.alltoall_bytes(64, 2, 16, 4)["buffer"]
    assert all(r["dropped"] == 0 and r["counted"][2] == buffer for r in loose)  # each rank's own rows, back
    assert sum(r["counted"][1] for r in loose) == 4 * buffer  # every row dispatched is received somewhere
    tight = [r for r in rows if r["factor"] == 0.5]
    assert sum(r["dropped"] for r in tight) >= 4 * 64  # half the slots: at least half of 4*64*2 dropped
    assert all(r["counted"][2] == (128 - r["dropped"]) * 16 * 4 for r in tight)
    assert moe.ep_figures(ep)["rank0_rows_bytes"] == buffer
    assert moe.drop_verdict(ep) == "shrank"
    assert not live_children()


def test_ep_verdict_notices_a_wrong_count_or_output(ep):
    import copy

    bad = copy.deepcopy(ep)
    bad["settings"][0]["formula"][1]["dispatch"] += 4
    assert moe.ep_verdict(bad) == "bytes_differ"
    bad = copy.deepcopy(ep)
    bad["settings"][1]["ranks"][2]["error"] = 1e-3
    assert moe.ep_verdict(bad) == "outputs_differ"
    bad = copy.deepcopy(ep)
    bad["settings"][1]["ranks"][0]["calls"][2] = ("alltoall_base", 4)  # a combine of the wrong size
    assert moe.drop_verdict(bad) == "differ" and moe.ep_verdict(bad) == "bytes_differ"
    for r in bad["settings"][1]["ranks"]:
        r["dropped"] = 0
    assert moe.drop_verdict(bad) == "none_dropped"


# ---- the balance run -------------------------------------------------------------------------------------

def _lab(off, on):
    return {"off": {"imbalance": off, "lm_loss": [3.0] * len(off)}, "on": {"imbalance": on, "lm_loss": [2.9] * len(on)},
            "aux_weight": 0.01, "steps": len(off), "n_experts": 8, "top_k": 2}


def test_balance_verdict_names():
    assert moe.balance_verdict(_lab([3.9] * 10, [2.0, 2.1] * 5)) == "more_even"
    assert moe.balance_verdict(_lab([2.0, 2.1] * 5, [3.9] * 10)) == "less_even"
    assert moe.balance_verdict(_lab([2.0, 3.0] * 5, [2.1, 2.9] * 5)) == "no_clear_difference"
    # only the second half counts: an early gap that closes is no difference
    assert moe.balance_verdict(_lab([4.0] * 5 + [2.0, 3.0] * 3, [1.0] * 5 + [2.1, 2.9] * 3)) == "no_clear_difference"
    assert moe.loss_verdict(_lab([3.9] * 10, [2.0] * 10)) == "lower"


def test_the_short_balance_run_measures_a_more_even_load_with_the_loss():
    lab = moe.balance_lab(steps=30, aux_weight=0.01, seed=0)
    assert len(lab["off"]["imbalance"]) == len(lab["on"]["imbalance"]) == 30
    assert all(1.0 <= v <= 4.0 for k in ("off", "on") for v in lab[k]["imbalance"])  # 4 = E / k
    assert lab["off"]["imbalance"][0] == lab["on"]["imbalance"][0]  # same seed, same first batch
    assert moe.balance_verdict(lab) == "more_even"
    f = moe.balance_figures(lab)
    assert f["ratio"] == pytest.approx(f["off"] / f["on"]) and f["worst"] == 4.0
    rows = moe.capacity_rows({"off": lab["off"]["model"], "on": lab["on"]["model"]})
    assert [r["factor"] for r in rows] == [0.5, 1.0, 1.25, 2.0]
    assert all(r["off"] >= r["balanced"] and r["on"] >= r["balanced"] for r in rows)
    assert [r["off"] for r in rows] == sorted((r["off"] for r in rows), reverse=True)  # more slots, fewer drops
