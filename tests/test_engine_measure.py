"""labkit.engine.measure's memory pre-flight: a CPU run that cannot fit in host memory is refused before
any work, with the estimate and what is available; runs that fit are not; and a run's teardown frees its
model."""
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.engine import measure
from labkit.engine import train as train_mod
from labkit.engine.model import GPT, n_params

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30


def _cap_address_space():
    """If the check were gone, the run would grab all the machine's memory for a minute: cap it at 6 GiB."""
    resource.setrlimit(resource.RLIMIT_AS, (6 * GIB, 6 * GIB))


def test_the_cli_refuses_a_run_that_cannot_fit_at_once():
    """Before: accepted, then a 60-line allocator error about 45 s later."""
    cmd = [sys.executable, "-m", "labkit", "run", "--model", "large", "--micro-batch", "64", "--seq-len", "2048"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=_cap_address_space)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-2000:]
    assert "not enough memory" in lines[0] and "GiB available" in lines[0] and "needs at least" in lines[0]
    assert elapsed < 60, elapsed  # generous: start-up only, no training


def test_run_refuses_before_any_work(no_work):
    cfg = lk.Config(model="large", micro_batch=64, seq_len=2048, device="cpu")
    with pytest.raises(lk.OutOfMemory) as err:
        lk.run(cfg)
    est = measure.host_memory_estimate(cfg)
    assert f"{est['total_bytes'] / GIB:.1f} GiB" in str(err.value)


def test_the_estimate_counts_every_process(monkeypatch, no_work):
    cfg = lk.Config(model="tiny", world_size=2, device="cpu")
    one = measure.host_memory_estimate(cfg, 1)["total_bytes"]
    monkeypatch.setattr(measure, "available_memory", lambda: int(1.5 * one))  # fits one rank, not two
    with pytest.raises(lk.OutOfMemory, match="on 2 process"):
        lk.run(cfg)


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_normal_runs_are_accepted(model):
    assert lk.run(lk.Config(model=model, steps=1)).summary["status"] == "completed"


def test_the_estimate_is_a_floor_of_what_a_run_holds():
    """Parameters from the shapes equal the real model's; the activation count stays at or below the
    bytes measured after a forward pass (so a refused run really could not fit)."""
    for name in lk.PRESETS:
        spec = lk.Config(model=name).spec
        with torch.device("meta"):  # shapes only: no memory
            assert measure.param_count(spec) == n_params(GPT(spec)), name
    r = lk.run(lk.Config(model="small", steps=1, micro_batch=4))
    est = measure.host_memory_estimate(r.config)
    assert est["activation_bytes"] <= r.summary["activation_bytes"]
    assert est["state_bytes"] <= r.summary["param_bytes"] + r.summary["grad_bytes"] * 2 + r.summary["optimizer_bytes"]


# ---- teardown frees the model without a full collection, and with one when it must (issue 34) ----------

@pytest.fixture
def built_models(monkeypatch):
    """Weak references to every model the engine trains; ``cycle=True`` makes each hold itself in a cycle
    (what reference counting alone cannot free); counts the engine's gc.collect calls."""
    import gc
    import weakref
    made, collects = [], []
    state = {"cycle": False}

    def model(*args, **kwargs):
        m = GPT(*args, **kwargs)
        if state["cycle"]:
            object.__setattr__(m, "_me", [m])  # a plain attribute, not a submodule: a cycle nn.Module ignores
        made.append(weakref.ref(m))
        return m

    real_collect = gc.collect
    monkeypatch.setattr(train_mod, "GPT", model)
    monkeypatch.setattr(train_mod.gc, "collect", lambda *a: collects.append(a) or real_collect(*a))
    was_enabled = gc.isenabled()
    gc.disable()  # Python's own collector must not free them behind the test's back
    yield made, collects, state
    if was_enabled:
        gc.enable()


def test_a_run_frees_its_model_by_reference_counting_alone(built_models):
    made, collects, _ = built_models
    lk.run(lk.Config(model="tiny", steps=2, device="cpu"))
    assert len(made) == 1 and made[0]() is None  # nothing holds it in a cycle: freed the moment run() ends
    assert collects == []  # ... so no 0.2 s collection at teardown


def test_a_large_model_held_in_a_cycle_is_collected_before_run_returns(built_models, monkeypatch):
    made, collects, state = built_models
    state["cycle"] = True
    monkeypatch.setattr(train_mod, "COLLECT_ABOVE_BYTES", 0)  # tiny counts as large here
    lk.run(lk.Config(model="tiny", steps=2, device="cpu"))
    assert made[0]() is None and len(collects) == 1


def test_a_small_model_in_a_cycle_is_left_to_pythons_collector(built_models):
    made, collects, state = built_models
    state["cycle"] = True
    lk.run(lk.Config(model="tiny", steps=2, device="cpu"))
    assert collects == [] and made[0]() is not None  # 0.5 MiB: not worth a full collection now
    import gc
    gc.collect()
    assert made[0]() is None  # garbage, not leaked: the next collection frees it


def test_what_must_be_collected():
    tiny = train_mod.COLLECT_ABOVE_BYTES - 1
    assert not train_mod.must_collect(torch.device("cpu"), tiny)
    assert train_mod.must_collect(torch.device("cpu"), train_mod.COLLECT_ABOVE_BYTES)
    # on a GPU any leftover would count in the next run's peak memory and against its budget
    assert train_mod.must_collect(torch.device("cuda", 0), 0)
