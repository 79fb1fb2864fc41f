"""checkpointing="attention": Megatron-style selective recomputation of the attention core (the T×T part).

Not to be confused with checkpointing="selective", PyTorch's selective-activation-checkpoint policy that
keeps matmul outputs. Gradients must not change; activation bytes must drop under the math attention
backend (where the T×T matrices are stored) and hardly at all under the fused one; the recompute FLOPs
must be counted for HFU; Config, CLI and panel must accept the new value."""
import json

import pytest
import torch

import labkit as lk
from labkit.engine import measure
from labkit.chapters import ch04_checkpointing as memtrace
from labkit.engine.model import GPT

CPU = torch.device("cpu")


def grads_of(mode, every=1, dropout=0.0, attention="auto", T=64):
    """Loss and parameter gradients of the tiny GPT in one checkpointing mode, from the same weights and batch."""
    spec = lk.Config(model="tiny", seq_len=T).spec
    torch.manual_seed(0)
    model = GPT(spec, dropout=dropout, checkpointing_mode=mode, checkpoint_every=every)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 256, (3, T), generator=g) for _ in range(2))
    torch.manual_seed(2)  # the dropout masks: checkpoint restores this RNG state for the recompute
    with measure.attention_backend(attention):
        loss = model(x, y)
        loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


# ---- the engine: same gradients, less memory ----------------------------------------------------------

@pytest.mark.parametrize("every,dropout,attention", [(1, 0.0, "auto"), (1, 0.0, "math"), (2, 0.0, "math"),
                                                     (1, 0.1, "math")])
def test_gradients_equal_those_without_checkpointing(every, dropout, attention):
    loss_ref, ref = grads_of("none", dropout=dropout, attention=attention)
    loss, got = grads_of("attention", every, dropout=dropout, attention=attention)
    assert loss == pytest.approx(loss_ref, abs=1e-6)
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def _act_bytes(mode, attention, T=256, every=1):
    cfg = lk.Config(model="tiny", seq_len=T, checkpointing=mode, checkpoint_every=every, attention=attention)
    return measure.activation_bytes(cfg, CPU)[0]


def test_math_backend_at_long_sequences_keeps_far_less():
    none, attn = _act_bytes("none", "math"), _act_bytes("attention", "math")
    # tiny at T=256: per block 16·d values per token against 2·n_head·T for the scores and probabilities
    assert attn < 0.6 * none
    assert _act_bytes("full", "math") < attn  # whole blocks keep only their input: still the least


def test_every_k_recomputes_the_core_in_fewer_blocks():
    none, every2, every1 = (_act_bytes(m, "math", every=k) for m, k in (("none", 1), ("attention", 2),
                                                                          ("attention", 1)))
    assert every1 < every2 < none  # tiny has 2 blocks: every 2 wraps block 0 only


def test_fused_backend_saves_little():
    # A fused kernel never stores the T×T matrices: only its log-sum-exp (one value per head and token) goes.
    none, attn = _act_bytes("none", "auto"), _act_bytes("attention", "auto")
    spec = lk.Config(model="tiny", seq_len=256).spec
    assert attn <= none
    assert none - attn <= spec.n_layer * spec.n_head * spec.seq_len * 4 + 64
    assert attn == _act_bytes("attention", "math")  # the recomputed core leaves the same tensors either way


def test_memtrace_sees_the_core_recomputed_and_nothing_else():
    cfg = lk.Config(model="tiny", checkpointing="attention", attention="math")
    trace = memtrace.trace_step(cfg, batch=2)
    recomputed = {module for _, phase, _, module in trace.ops if phase == "recompute"}
    assert recomputed and all(m.endswith(".attn.core") for m in recomputed), recomputed
    probe, _ = measure.activation_bytes(cfg, CPU, batch=2)
    assert abs(trace.kept_bytes() - probe) <= 64  # the tracer and the engine's probe agree


# ---- FLOPs: the recompute is hardware work (HFU), not model work (MFU) ---------------------------------

@pytest.mark.parametrize("every", [1, 2])
def test_recompute_flops_are_the_score_matmul_of_the_wrapped_blocks(every):
    spec = lk.Config(model="tiny").spec
    L, d, T = spec.n_layer, spec.d_model, spec.seq_len
    wrapped = len(range(0, L, every))
    extra = measure.count_flops(spec, "attention", every, batch=2) - measure.count_flops(spec, batch=2)
    # Counted under the math backend, non-causal (the course's convention): the recompute runs q·kᵀ
    # (2·T·T·d FLOPs per sequence and block) and stops there -- backward needs the probabilities, not
    # ×v's output, so PyTorch's checkpoint never runs ×v again.
    assert extra == wrapped * 2 * 2 * T * T * d
    assert measure.count_flops(spec, "selective") == measure.count_flops(spec)  # SAC: no matmul recomputed


def test_run_reports_hfu_above_mfu_by_the_counted_ratio():
    r = lk.run(lk.Config(model="tiny", steps=2, checkpointing="attention"))
    s = r.summary
    assert s["checkpointing"] == "attention"
    ratio = s["hardware_flops_per_step"] / s["model_flops_per_step"]
    assert 1.0 < ratio < 1.2  # a few per cent of the FLOPs
    if s["mfu"]:
        assert s["hfu"] / s["mfu"] == pytest.approx(ratio, rel=1e-9)


# ---- the names: Config, CLI, panel ---------------------------------------------------------------------

def test_config_accepts_attention_and_suggests_it_for_a_typo():
    assert lk.Config(model="tiny", checkpointing="attention", checkpoint_every=2).checkpointing == "attention"
    with pytest.raises(lk.ConfigError) as e:
        lk.Config(checkpointing="attenton")
    msg = str(e.value)
    assert e.value.field == "checkpointing" and "did you mean 'attention'?" in msg
    for mode in ("none", "full", "selective", "attention"):
        assert mode in msg  # every allowed value is listed
    with pytest.raises(lk.ConfigError, match="choose one of") as e:
        lk.Config(checkpointing="megatron")  # nothing close: no suggestion
    assert "did you mean" not in str(e.value)


def test_cli_accepts_checkpointing_attention(capsys):
    from labkit.__main__ import main

    assert main(["run", "--model", "tiny", "--steps", "1", "--warmup", "0", "--checkpointing", "attention",
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["checkpointing"] == "attention"
    assert main(["run", "--model", "tiny", "--checkpointing", "attenton"]) == 2
    assert "did you mean 'attention'?" in capsys.readouterr().err


def test_names_cannot_be_confused():
    from labkit.panel.parts import CKPT_MODES

    labels = dict((v, label) for label, v in CKPT_MODES)
    assert set(lk.engine.config.CHECKPOINTING) <= set(labels)  # the panel offers every mode
    assert "SAC" in labels["selective"] and "attention" in labels["attention"]
    every2 = lk.Config(model="tiny", checkpointing="attention", checkpoint_every=2)
    assert memtrace.describe(every2) == "attention every 2"  # a trace's label says k too, as for full
