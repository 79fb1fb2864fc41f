"""A loader worker killed anywhere in an update ends the run with RunError, not PyTorch's traceback."""
import os
import signal
import time

import pytest

import labkit as lk
from labkit.engine import ddp as ddp_mod
from labkit.engine import train as train_mod

from conftest import ddp_alive_at, live_children


def _kill_a_worker_and_wait():
    """SIGKILL one loader worker, then idle where we are: PyTorch's SIGCHLD handler raises here."""
    os.kill(live_children()[0].pid, signal.SIGKILL)
    time.sleep(5.0)


@pytest.fixture
def kill_in_backward(monkeypatch):
    """Kill during the 3rd update's backward pass, from inside DDP's comm hook."""
    real, calls = ddp_mod.counting_hook, []

    def hook(state, bucket):
        calls.append(1)
        if len(calls) == 3:
            _kill_a_worker_and_wait()
        return real(state, bucket)

    monkeypatch.setattr(ddp_mod, "counting_hook", hook)


@pytest.fixture
def kill_in_optimizer_step(monkeypatch):
    real, calls = train_mod.optimizer_step, []

    def step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            _kill_a_worker_and_wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(train_mod, "optimizer_step", step)


@pytest.mark.parametrize("where", ["kill_in_backward", "kill_in_optimizer_step"])
def test_a_worker_killed_mid_update_is_a_run_error(where, request, no_leftover_processes):
    request.getfixturevalue(where)
    t0 = time.monotonic()
    with pytest.raises(lk.RunError) as err:
        lk.run(lk.Config(model="tiny", micro_batch=2, steps=50, workers=2))
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "DataLoader worker" in msg and "killed by signal" in msg, msg
    assert "\n" not in msg


def test_the_next_run_works_after_a_worker_died_in_backward(kill_in_backward, monkeypatch):
    with pytest.raises(lk.RunError):
        lk.run(lk.Config(model="tiny", micro_batch=2, steps=50, workers=2))
    monkeypatch.undo()
    assert lk.run(lk.Config(model="tiny", steps=2, workers=1)).summary["status"] == "completed"


def test_other_runtime_errors_are_not_blamed_on_the_loader(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the optimizer step")

    monkeypatch.setattr(train_mod, "optimizer_step", broken)
    with pytest.raises(RuntimeError, match="a bug in the optimizer step") as err:
        lk.run(lk.Config(model="tiny", steps=2))
    assert not isinstance(err.value, lk.RunError)


def test_no_ddp_module_outlives_its_group_after_an_error_mid_update(kill_in_backward, monkeypatch):
    """The error's traceback holds the frames it came through: micro_steps' ``net`` is the DDP module. Freed after
    the group is destroyed, the reducer's destructor can deadlock (chapter 11's demo did, in the ninth session's
    CI), so the frames let go of their locals before the teardown."""
    alive = ddp_alive_at(monkeypatch, ddp_mod, "destroy_group")
    with pytest.raises(lk.RunError):
        lk.run(lk.Config(model="tiny", micro_batch=2, steps=50, workers=2))
    assert alive == [0]
