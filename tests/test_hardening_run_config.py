"""run() validates its Config again: fields changed after construction fail with ConfigError before any work."""
import pytest

import labkit as lk
from labkit.engine import launch as launch_mod
from labkit.engine import train as train_mod
from labkit.engine.device import capabilities, max_world_size


@pytest.fixture
def no_work(monkeypatch):
    """Any training started (in this process or in ranks) fails the test."""
    def started(*args, **kwargs):
        raise AssertionError("run() started work on a config it should have refused")

    monkeypatch.setattr(train_mod, "train_worker", started)
    monkeypatch.setattr(launch_mod, "run_ranks", started)


# Before: IndexError after ~10 s, ZeroDivisionError, a RuntimeError from autograd, a reshape error,
# and more ranks than cores.
CHANGES = [("micro_batch", 0), ("steps", 0), ("accum", 0), ("n_head", 3), ("precision", "fp8"),
           ("model", "huge"), ("world_size", None)]


@pytest.mark.parametrize("field,value", CHANGES, ids=[f for f, _ in CHANGES])
def test_a_config_changed_after_validation_is_checked_again(field, value, no_work):
    c = lk.Config(model="tiny")
    if field == "world_size":
        value = max_world_size(capabilities(c.device)) + 1
    setattr(c, field, value)
    with pytest.raises(lk.ConfigError) as err:
        lk.run(c)
    assert err.value.field == field and err.value.value == value, str(err.value)


def test_a_valid_changed_config_still_runs():
    c = lk.Config(model="tiny")
    c.steps = 2
    assert lk.run(c).summary["steps"] == 2
