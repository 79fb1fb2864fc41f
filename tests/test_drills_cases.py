"""lk.drills' catalogue: every case that runs on a CPU, run with its healthy twin, shows the signal that
tells it apart; every "nothing wrong" case matches its twin on every symptom; GPU-only cases are checked
by their set-up and skip with the reason.

No timing assertion: the signals compared are counts, bytes, FLOP ratios and losses -- the same on every
run of one machine. The one timing-based signal tested (data-wait share of a loader doing 16 ms of real
CPU work per batch with 0 workers, against about 20 ms of compute) is a share of the step, not a speed,
compared with the twin's: measured 0.35-0.54 against the 1-worker twin's 0.06-0.14 on a shared 2-core
machine (24 ms a batch gave 0.54-0.63 against 0.18-0.32: one worker no longer kept up). Cases that only
speed tells apart (``speed_only``) are tested by their set-up here; their speed belongs to the benchmarks.

A healthy case's "spread": the twin run again with another seed. A continuous symptom (losses, gradient
norms) must lie within |twin(seed 0) - twin(seed 1)| of the twin; a count (AllReduce calls, skipped
steps, the recompute ratio) must be equal.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit import drills
from labkit.drills.evidence import NOISE, SIGNAL_ROWS, SYMPTOMS, evidence, evidence_rows, separated
from labkit.engine.device import LoadMeter
from labkit.drills.attempt import runnable
from labkit.drills.bank import fix_key

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CPU_CASES = [c for c in drills.CASES if not c.needs_gpu]
GPU_CASES = [c for c in drills.CASES if c.needs_gpu]
COUNTS = ("allreduce_calls_per_update", "recompute_ratio", "skipped_steps", "nonfinite_steps", "timed_out")


@pytest.fixture(autouse=True)
def _ci(monkeypatch):
    monkeypatch.setenv("LABKIT_MODE", "short")  # CI-sized runs, whatever the environment says


@functools.lru_cache(maxsize=None)
def ev(case_id: str, which: str) -> dict:
    return drills.run_case(case_id, which)


# Per case: how its signal separates it from its twin (case evidence, twin evidence) -> assertion.
def _sync(c, t):
    assert c["allreduce_calls_per_update"] == 4 * t["allreduce_calls_per_update"] == 4.0  # x K
    assert c["allreduce_bytes_per_update"] == 4 * t["allreduce_bytes_per_update"]


def _loader(c, t):
    assert c["data_wait_frac"] > 0.25  # the planted loading cost shows as waiting, on any machine
    if c["data_wait_frac"] > 2 * t["data_wait_frac"]:
        return  # one worker hid most of it
    # A worker hides the wait only on a core of its own (what the drill's reveal says): on a 2-core machine
    # that other programs keep busy (CI runs two test processes) it cannot. Run the twin again and judge the
    # separation only if the machine was quiet meanwhile.
    meter = LoadMeter()
    again = drills.run_case("loader-no-workers", "twin")
    if not meter.read()["busy"]:
        assert c["data_wait_frac"] > 2 * again["data_wait_frac"], (c["data_wait_frac"], again["data_wait_frac"])


def _underflow(c, t):
    assert c["grad_zero_frac"] > 0 and t["grad_zero_frac"] == 0  # flushed to zero where fp32 had a value
    assert c["skipped_steps"] == 0  # nothing overflowed: no inf to skip
    assert all(math.isfinite(x) for x in c["losses"])  # underflow is silent: no NaN


def _ckpt(c, t):
    assert c["recompute_ratio"] > 1.1 and t["recompute_ratio"] == 1.0  # HFU / MFU
    assert c["activation_bytes"] < t["activation_bytes"]
    assert c["final_loss"] == pytest.approx(t["final_loss"], abs=1e-5)  # same training, more work


def _lr(c, t):
    # the log beside the curve: 4x the course's batch at the lr tuned for it; the fix is AdamW's square-root rule
    # (linear is SGD's), and the twin's larger lr drops the loss further -- as any larger lr would over a few
    # updates from init (short-horizon bias), which is why the log, not the curve, is the evidence
    base = lk.Config()
    assert c["samples_per_update"] == 4 * base.micro_batch and c["logged_lr"] == base.lr
    assert t["samples_per_update"] == c["samples_per_update"]
    assert t["logged_lr"] == pytest.approx(base.lr * math.sqrt(c["samples_per_update"] / base.micro_batch))
    assert drills.fix_key(drills.case_by_id("lr-not-scaled")) in drills.all_fixes()
    assert c["loss_drop"] < t["loss_drop"]
    assert c["lr_vs_sqrt_rule"] == pytest.approx(0.5) and t["lr_vs_sqrt_rule"] == pytest.approx(1.0)


def _not_divided(c, t):
    assert c["grad_norm"] == pytest.approx(4 * t["grad_norm"], rel=1e-3)  # x K, before clipping
    assert c["clip_frac"] == 1.0


def _zero_inside(c, t):
    # one micro-batch's gradient divided by K: the norm falls by between sqrt(K) (noise-dominated micro-batch
    # gradients) and K (signal-dominated); measured 3.7x at K = 4 here
    assert 2 <= t["grad_norm"] / c["grad_norm"] <= 4


def _dropout(c, t):
    assert c["eval_loss_spread"] > 0 and t["eval_loss_spread"] == 0


def _hang(c, t):
    assert c["timed_out"] and "Timed out" in c["hang_error"] and not t["timed_out"]
    calls = c["collectives_per_rank"]
    assert calls[0] == calls[1] + 1  # rank 1 left one out: the per-rank counts a flight recorder compares
    assert t["collectives_per_rank"][0] == t["collectives_per_rank"][1]
    # Collectives pair by call order: rank 0's update-2 all_reduce completed (with rank 1's update 3), and so
    # did every later one but its last -- the silent corruption shows as parameters that differ from update 2.
    norms = c["param_norms_per_rank"]
    assert len(norms[0]) == calls[0] - 1 and len(norms[1]) == calls[0]  # only rank 0's last call hung
    assert c["ranks_diverge_at_update"] == 2 and norms[0][0] == norms[1][0]
    assert all(a != b for a, b in zip(norms[0][1:], norms[1][1:]))  # and they never agree again
    assert t["ranks_diverge_at_update"] is None and t["param_norms_per_rank"][0] == t["param_norms_per_rank"][1]


def _moe_balance(c, t):
    # without the balancing loss one expert takes most tokens (0.83-1.0 of the last quarter's over 30 seeds
    # here); with it the busiest is near 1/E (0.26-0.36); the shares are counts, the same every run
    e = len(c["expert_shares"])
    assert c["max_expert_share"] > 2 / e and t["max_expert_share"] < 1.5 / e, (c["expert_shares"], t["expert_shares"])
    assert sum(c["expert_shares"]) == pytest.approx(1.0) and sum(t["expert_shares"]) == pytest.approx(1.0)
    assert min(c["expert_shares"]) < 0.1 / e  # an expert left idle: what the twin never shows
    assert min(t["expert_shares"]) > 0.5 / e
    again = drills.run_case("moe-no-balance-loss", "case")  # seeded: the same counts on a second run
    assert again["expert_shares"] == c["expert_shares"]


def _sp_rowwise(c, t):
    # two blocks, one update's forward and backward: the plan's AllGathers (2 a block: one forward, the
    # reduce-scatter's backward) stay; the forward ReduceScatters (1 a block) became AllReduces
    assert t["tp_collectives"] == {"all_gather": 4, "reduce_scatter": 4, "all_reduce": 0}
    assert c["tp_collectives"] == {"all_gather": 4, "reduce_scatter": 2, "all_reduce": 2}
    assert c["tp_allreduce_calls"] == 2 and t["tp_allreduce_calls"] == 0
    assert c["losses"] == t["losses"] and c["grad_norms"] == t["grad_norms"]  # silent: the same numbers


SIGNAL_CHECKS = {"sync-every-micro": _sync, "loader-no-workers": _loader, "fp16-no-scaling": _underflow,
                 "full-ckpt-ample-memory": _ckpt, "lr-not-scaled": _lr, "loss-not-divided": _not_divided,
                 "zero-grad-inside": _zero_inside, "dropout-in-eval": _dropout, "rank-skips-collective": _hang,
                 "moe-no-balance-loss": _moe_balance, "sp-rowwise-replicated": _sp_rowwise}


def test_catalogue_invariants():
    ids = [c.id for c in drills.CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 15
    assert sum(c.healthy for c in drills.CASES) >= 3
    assert set(drills.CAUSES) == {c.cause for c in drills.CASES} and drills.HEALTHY in drills.CAUSES
    fields = {f.name for f in dataclasses.fields(lk.Config)}
    for c in drills.CASES:
        assert isinstance(c, drills.Case) and c.cause and c.words and c.signal, c.id
        assert set(c.fix) <= fields and set(c.knobs) <= fields and set(c.twin) <= fields, c.id
        lk.Config.from_dict({**drills.bank.BASE, **c.knobs, **c.fix})  # the fix is a valid change
        if c.healthy:
            assert c.fix == {}, c.id
        elif not c.mistake:
            assert c.fix, f"{c.id}: a mistake made by knobs is fixed by knobs"
        if c.mistake:
            assert callable(getattr(drills.mistakes, c.mistake)), c.id
        if not c.healthy and not c.mistake:
            assert c.knobs != c.twin and lk.Config.from_dict({**drills.bank.BASE, **c.knobs, **c.fix}) == \
                lk.Config.from_dict({**drills.bank.BASE, **c.twin}), f"{c.id}: the fix makes the twin"


def test_every_cpu_case_has_its_check():
    planted = {c.id for c in CPU_CASES if not c.healthy and not c.speed_only}
    assert planted == set(SIGNAL_CHECKS)


def test_every_teaches_tag_exists_in_its_chapter():
    """measure-06-... lives in chapter 06's notebook (the question bank's rule for its tags too)."""
    from labkit.content.questions import CHAPTER_NOTEBOOKS

    for c in drills.CASES:
        assert c.teaches.startswith("measure-"), c.id
        nb = json.loads((NOTEBOOKS / CHAPTER_NOTEBOOKS[c.teaches.split("-")[1]]).read_text())
        tags = {t for cell in nb["cells"] for t in cell.get("metadata", {}).get("tags", [])}
        assert c.teaches in tags, c.id


def test_code_fixes_name_every_code_level_mistake():
    for c in drills.CASES:
        assert bool(c.code_fix) == bool(c.mistake) and not (c.code_fix and c.healthy), c.id


@pytest.mark.parametrize("case_id", sorted(SIGNAL_CHECKS))
def test_case_shows_its_signal(case_id):
    case, twin = ev(case_id, "case"), ev(case_id, "twin")
    assert drills.case_by_id(case_id).signal in case
    SIGNAL_CHECKS[case_id](case, twin)


@pytest.mark.parametrize("case_id", [c.id for c in CPU_CASES if c.healthy])
def test_healthy_case_within_twin_spread(case_id):
    config = drills.config_for(case_id, "twin")
    other = evidence(lk.run(config.replace(seed=config.seed + 1)))  # the twin's own spread
    case, twin = ev(case_id, "case"), ev(case_id, "twin")
    for key in SYMPTOMS:
        if key not in twin:
            continue
        if key in COUNTS:
            assert case[key] == twin[key], (case_id, key)
        else:
            spread = abs(twin[key] - other[key])
            assert abs(case[key] - twin[key]) <= spread, (case_id, key, case[key], twin[key], spread)
    assert case["losses"] == pytest.approx(twin["losses"], abs=1e-4)


@pytest.mark.parametrize("case_id", [c.id for c in drills.CASES if c.speed_only])
def test_speed_only_case_set_up(case_id):
    """Only a speed tells these apart: the set-up is tested (the same update, so the same losses, and no
    data wait to blame); the speed itself is the benchmarks' business. A case that needs a GPU runs there."""
    case, twin = drills.config_for(case_id, "case"), drills.config_for(case_id, "twin")
    assert case.tokens_per_update == twin.tokens_per_update
    reason = drills.case_by_id(case_id).needs_gpu
    if reason and not torch.cuda.is_available():
        pytest.skip(f"{case_id}: {reason}")
    c, t = ev(case_id, "case"), ev(case_id, "twin")
    assert c["losses"] == pytest.approx(t["losses"], abs=1e-4)
    assert c["mfu"] is not None and t["mfu"] is not None


@pytest.mark.parametrize("case_id", [c.id for c in GPU_CASES])
def test_gpu_case_set_up(case_id):
    c = drills.case_by_id(case_id)
    assert len(c.needs_gpu) > 20  # a reason a learner can read
    case, twin = drills.config_for(c, "case"), drills.config_for(c, "twin")
    assert case != twin and case.replace(**c.fix) == twin
    if not torch.cuda.is_available():
        pytest.skip(f"{case_id}: {c.needs_gpu}")
    e, t = drills.run_case(c, "case"), drills.run_case(c, "twin")
    if c.signal == "oom_at_update":
        assert e.get("oom_at_update") == 2 and t["status"] == "completed"
    else:  # speed: the case slower than its twin
        assert e[c.signal] is not None and t[c.signal] is not None


# The cases a gauntlet (and a drill without a case) can draw: the default pool of attempt.draw.
POOL = runnable(gpu=False)


@pytest.mark.parametrize("case_id", [c.id for c in POOL if not c.healthy])
def test_no_other_drill_shows_this_ones_signal(case_id):
    """Two drills whose answers differ never show the same evidence on the signal that tells one of them: the
    broken case's signal is on screen (its evidence row), and every other drawable case's run -- healthy
    look-alikes included -- is outside noise (``evidence.NOISE``) of it. (The old catalogue failed here: the
    healthy "accum-equivalent" logged 32 sequences an update at the unscaled lr, as "lr-not-scaled" does, and
    so did "sync-every-micro"; "every-micro-k1" logged 16 at it.)"""
    a = drills.case_by_id(case_id)
    ea = ev(case_id, "case")
    assert a.signal in NOISE and SIGNAL_ROWS[a.signal] in dict(evidence_rows(ea)), a.signal
    for b in POOL:
        if (b.cause, fix_key(b)) == (a.cause, fix_key(a)):
            continue
        eb = ev(b.id, "case")
        assert separated(a.signal, ea.get(a.signal), eb.get(a.signal)), (case_id, b.id, a.signal, ea.get(a.signal),
                                                                         eb.get(a.signal))


def test_separated_reads_noise_per_signal():
    assert separated("allreduce_calls_per_update", 4.0, 1.0) and not separated("allreduce_calls_per_update", 1.0, 1.0)
    assert separated("grad_norm", 12.6, 3.2) and not separated("grad_norm", 3.3, 3.2)
    assert not separated("lr_vs_sqrt_rule", 0.5, 2 ** -0.5) and separated("lr_vs_sqrt_rule", 0.5, 1.0)
    assert separated("eval_loss_spread", 0.01, None) and not separated("eval_loss_spread", None, None)
    with pytest.raises(lk.ConfigError):
        separated("no-such-signal", 1, 2)


def test_evidence_never_shows_the_configuration():
    e = ev("full-ckpt-ample-memory", "case")
    config_keys = set(lk.Config().to_dict()) | {"tokens_per_update", "tokens_per_step"}
    assert not (set(e) & config_keys), set(e) & config_keys


@pytest.mark.parametrize("call, field", [
    (lambda: drills.run_case("no-such-case"), "case"),
    (lambda: drills.run_case("micro-batch-1", which="healthy"), "which"),
    (lambda: drills.run_case("micro-batch-1", steps=1), "steps"),
    (lambda: drills.run_case("micro-batch-1", steps=True), "steps"),
    (lambda: drills.evidence(None), "result"),
])
def test_bad_arguments_name_the_field(call, field):
    with pytest.raises(lk.ConfigError) as info:
        call()
    assert info.value.field == field


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_moe_drill_signal_is_not_one_seeds_luck(seed):
    """The balancing-loss drill runs seed 0; its signal holds for other seeds too (checked here for three, over
    30 when it was written: without the loss the busiest expert held 0.83-1.0 of the tokens, with it 0.26-0.36)."""
    config = drills.config_for("moe-no-balance-loss", "case").replace(seed=seed)
    case = drills.mistakes.run_loop("router_without_balance_loss", config, buggy=True)["summary"]
    twin = drills.mistakes.run_loop("router_without_balance_loss", config, buggy=False)["summary"]
    e = len(case["expert_shares"])
    assert case["max_expert_share"] > 2 / e and twin["max_expert_share"] < 1.5 / e, (seed, case, twin)
    assert separated("max_expert_share", case["max_expert_share"], twin["max_expert_share"])
