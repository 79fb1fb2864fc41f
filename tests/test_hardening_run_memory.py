"""A CPU run that cannot fit in host memory is refused before any work, with the estimate and what is
available; runs that fit are not."""
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.engine import launch as launch_mod
from labkit.engine import limits
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


@pytest.fixture
def no_work(monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("run() started work on a run that cannot fit")

    monkeypatch.setattr(train_mod, "train_worker", started)
    monkeypatch.setattr(launch_mod, "run_ranks", started)


def test_run_refuses_before_any_work(no_work):
    cfg = lk.Config(model="large", micro_batch=64, seq_len=2048, device="cpu")
    with pytest.raises(lk.OutOfMemory) as err:
        lk.run(cfg)
    est = limits.host_memory_estimate(cfg)
    assert f"{est['total_bytes'] / GIB:.1f} GiB" in str(err.value)


def test_the_estimate_counts_every_process(monkeypatch, no_work):
    cfg = lk.Config(model="tiny", world_size=2, device="cpu")
    one = limits.host_memory_estimate(cfg, 1)["total_bytes"]
    monkeypatch.setattr(limits, "available_memory", lambda: int(1.5 * one))  # fits one rank, not two
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
            assert limits.param_count(spec) == n_params(GPT(spec)), name
    r = lk.run(lk.Config(model="small", steps=1, micro_batch=4))
    est = limits.host_memory_estimate(r.config)
    assert est["activation_bytes"] <= r.summary["activation_bytes"]
    assert est["state_bytes"] <= r.summary["param_bytes"] + r.summary["grad_bytes"] * 2 + r.summary["optimizer_bytes"]
