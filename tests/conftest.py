import importlib.util
import time
from pathlib import Path

import pytest

# nbval's run of each chapter ends with its exercises re-run with the reference answers (same kernel)
from test_rerun_exercises import pytest_collection_modifyitems  # noqa: F401

try:  # the GPU reference machine may lack psutil; only the process-hygiene checks need it
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


SOLUTIONS = Path(__file__).resolve().parent.parent / "notebooks" / "solutions"


def load_solutions(name: str):
    """The instructor's reference answers for one checker family (notebooks/solutions/<name>.py)."""
    spec = importlib.util.spec_from_file_location(f"solutions_{name}", SOLUTIONS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def attempted_and_passed(res):
    """A checker result for a real answer: it must count as attempted; returns whether it passed."""
    assert res.attempted, res
    return res.passed


def assert_family_registered(family):
    """Every checker a family exports is listed by lk.check.names() and reachable as lk.check.<name>."""
    import labkit as lk
    names = lk.check.names()
    for n in family.__all__:
        assert n in names
        assert getattr(lk.check, n) is getattr(family, n)


def live_children(root=None):
    """Descendants of this test process (or of ``root``) still running, as labkit itself lists them."""
    if psutil is None:
        pytest.skip("psutil is not installed: cannot list child processes")
    from labkit.engine.launch import live_children as _live

    return _live(root)


def wait_no_children(timeout=10.0):
    """The run promises nothing outlives it; give the OS a moment to reap, then report survivors."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = live_children()
        if not kids:
            return []
        time.sleep(0.1)
    return live_children()


@pytest.fixture
def no_leftover_processes():
    before = {p.pid for p in live_children()}
    yield
    left = [p for p in wait_no_children() if p.pid not in before]
    assert not left, f"processes outlived the run: {[(p.pid, p.name()) for p in left]}"


@pytest.fixture(autouse=True)
def _quiet_threads():
    # Tests must not leave torch's global thread count changed (labkit restores it after a run).
    import torch

    n = torch.get_num_threads()
    yield
    assert torch.get_num_threads() == n, "a run left torch.set_num_threads changed"
