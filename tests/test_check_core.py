"""The checkers' core (labkit.check._core): a wrong answer type is named as such, the untouched
fix-the-code exercise is 'not attempted', and learner code that never ends (or exits) is stopped and reported,
never hangs or ends the kernel."""
import json
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import labkit as lk
from labkit.check import _core

ROOT = Path(__file__).resolve().parent.parent


# ---- 1. wrong answer types --------------------------------------------------------------------

VALUE_CHECKS = [
    ("bytes_per_param_mixed_adam", (), {}),
    ("llm_memory_gb", (), {}),
    ("mfu_from_numbers", (), {}),
    ("accum_steps_needed", (), {}),
    ("checkpoint_overhead", (lk.Config(model="tiny"),), {}),
    ("predict_allreduce_calls", (), dict(n_buckets=2, accum=8, ddp_sync="every_micro", world_size=4)),
]


def test_a_str_where_a_number_is_expected_is_named():
    res = lk.check.llm_memory_gb("208")
    assert res.attempted and not res.passed
    assert "raised" not in res.message and "line" not in res.message, res.message
    assert "str ('208')" in res.message and "number in GB" in res.message, res.message


@pytest.mark.parametrize("name,args,kwargs", VALUE_CHECKS)
@pytest.mark.parametrize("answer,shown", [("208", "str ('208')"), ([1, 2], "list ([1, 2])"),
                                          (True, "bool (True)"), (float("nan"), "nan")])
def test_every_value_checker_names_a_wrong_type(name, args, kwargs, answer, shown):
    res = getattr(lk.check, name)(answer, *args, **kwargs)
    assert res.attempted and not res.passed
    assert res.message.startswith("your answer is"), res.message
    assert shown in res.message and "raised" not in res.message, res.message


def test_numbers_of_other_kinds_still_count():
    import numpy as np
    import torch

    for answer in (np.int64(208), np.float32(208.0), torch.tensor(208.0)):
        assert lk.check.llm_memory_gb(answer).passed


@pytest.mark.parametrize("name,fn,words", [
    ("training_state_bytes", lambda n, opt: "16", "returned a str ('16')"),
    ("flops_linear", lambda t, i, o: [1], "returned a list ([1])"),
    ("token_weights", lambda counts: 0.5, "returned a float (0.5)"),
    ("ideal_step", lambda d, c, w: "0.5", "returned a str ('0.5')"),
    ("zero_bytes_per_gpu", lambda n, g, s: "x", "returned a str ('x')"),
    ("pareto_front", lambda pts: 3, "returned an int (3)"),
])
def test_a_wrong_type_returned_by_a_learner_function_is_named(name, fn, words):
    res = getattr(lk.check, name)(fn)
    assert res.attempted and not res.passed
    assert words in res.message and "raised" not in res.message, res.message


def test_a_number_where_a_function_is_expected_is_named():
    res = lk.check.flops_linear(5)
    assert "your answer is an int (5)" in res.message and "raised" not in res.message, res.message


# ---- 2. the fix-the-code exercise, untouched --------------------------------------------------

def _cell_function(notebook, name):
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and f"def {name}(" in src:
            ns = {}
            exec(src.split("lk.check")[0], ns)  # the definition, not the check call
            return ns[name]
    raise AssertionError(f"no cell defines {name} in {notebook}")


def test_untouched_fix_no_sync_is_not_attempted():
    res = lk.check.fix_no_sync(_cell_function("06_ddp_allreduce.ipynb", "accumulate"))
    assert not res.passed and not res.attempted, res


def test_a_changed_fix_no_sync_is_attempted():
    def accumulate(ddp_model, batches, K):  # still wrong: sums the losses, syncs every micro-batch
        for k in range(K):
            x, y = next(batches)
            loss = ddp_model(x, y)
            loss.backward()

    res = lk.check.fix_no_sync(accumulate)
    assert res.attempted and not res.passed, res


# ---- 3. code that never finishes or exits -----------------------------------------------------

def forever(*args, **kwargs):
    while True:
        pass


def forever_swallowing(*args, **kwargs):
    while True:
        try:
            while True:
                pass
        except Exception:  # a learner's catch-all must not keep the check going
            pass


class Forever:
    def __init__(self, *args, **kwargs):
        forever()


FUNCTION_CHECKS = ["training_state_bytes", "flops_linear", "find_bottleneck", "fp16_flush_fraction",
                   "loss_scaler", "fixed_training_loop", "token_weights", "accumulation_loop",
                   "checkpoint_blocks", "ideal_step", "wait_fraction", "fewest_workers", "counting_hook",
                   "fix_no_sync", "ring_allreduce_time", "pareto_front", "zero_bytes_per_gpu"]


@pytest.fixture
def tight(monkeypatch):
    monkeypatch.setattr(_core, "TIME_LIMIT_S", 0.3)


@pytest.mark.parametrize("name", FUNCTION_CHECKS)
def test_an_endless_loop_is_stopped(tight, name):
    res = getattr(lk.check, name)(Forever if name == "loss_scaler" else forever)
    assert res.attempted and not res.passed
    assert "did not finish in 0.3 s" in res.message, res.message


def test_an_endless_loop_that_catches_exceptions_is_stopped(tight):
    res = lk.check.ideal_step(forever_swallowing)
    assert "did not finish" in res.message, res.message


def test_the_previous_alarm_handler_and_timer_come_back(tight):
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGALRM, mine)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        assert "did not finish" in lk.check.ideal_step(forever).message
        assert signal.getsignal(signal.SIGALRM) is mine
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 100.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_no_timer_is_left_running(tight):
    lk.check.ideal_step(forever)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)


def test_exit_in_learner_code_is_a_failure_not_the_end():
    def quits(*args):
        sys.exit(3)

    res = lk.check.ideal_step(quits)
    assert res.attempted and not res.passed
    assert "sys.exit(3)" in res.message, res.message


def test_ctrl_c_still_stops_a_check():
    def interrupted(*args):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        lk.check.ideal_step(interrupted)


def test_off_the_main_thread_it_says_no_limit_applies_and_still_checks(capsys, monkeypatch):
    from conftest import load_solutions

    sol = load_solutions("scaling")
    monkeypatch.setattr(_core, "_SAID", set())
    out = []
    t = threading.Thread(target=lambda: out.append(lk.check.ideal_step(sol.ideal_step_s)))
    t.start()
    t.join()
    assert out and out[0].passed, out
    assert "no time limit" in capsys.readouterr().err


def test_an_endless_loop_ends_in_a_fresh_process():
    # the same in a child with an outer timeout, so that a regression fails here instead of hanging
    import subprocess

    code = ("import labkit as lk\nfrom labkit.check import _core\n_core.TIME_LIMIT_S = 0.5\n"
            "def f(*a):\n    while True:\n        pass\nprint(lk.check.wait_fraction(f).message)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "did not finish in 0.5 s" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("name,args", [("smallest_fix", ()), ("checkpoint_budget", ([{"name": "full"}], 1))])
def test_a_name_checker_names_a_wrong_type(name, args):
    res = getattr(lk.check, name)(3, *args)
    assert res.attempted and not res.passed and "your answer is an int (3)" in res.message, res.message


def test_the_time_limit_never_cuts_the_process_group_set_up(monkeypatch):
    """A limit striking inside labkit's own set-up or tear-down of the twin process group would leave
    the group behind and break every later DDP check in the kernel."""
    import torch.distributed as dist

    monkeypatch.setattr(_core, "TIME_LIMIT_S", 0.3)
    real_destroy = dist.destroy_process_group

    def slow_destroy(*a, **k):  # a loaded machine: the tear-down itself outlasts the limit
        t = time.monotonic()
        while time.monotonic() - t < 1.5:
            pass
        return real_destroy(*a, **k)

    monkeypatch.setattr(dist, "destroy_process_group", slow_destroy)
    res = lk.check.counting_hook(forever)
    assert "did not finish" in res.message, res.message
    assert not dist.is_initialized()  # torn down, not left behind


def test_a_ddp_check_while_the_run_slot_is_held_says_so_and_builds_no_group():
    """fixed_training_loop builds a process group of its own: it takes labkit's one-run slot, so a check
    run while a training run holds it is told to wait instead of colliding with the run's group."""
    import torch
    import torch.distributed as dist

    from labkit.base import runtime
    from labkit.check import precision

    called = []

    def update(net, opt, micro_batches):
        called.append(len(micro_batches))
        for x, y in micro_batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                (net(x, y) / len(micro_batches)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with runtime.one_run("a test holds the slot"):
        res = lk.check.fixed_training_loop(update)
        assert runtime.busy()  # the check left the run's slot alone
    assert res.attempted and not res.passed
    assert "a training run is going" in res.message and "wait for it" in res.message, res.message
    assert "raised" not in res.message and "line" not in res.message, res.message
    assert called == [] and not dist.is_initialized()  # the learner's code never ran; no group was built
    # the slot is the check's while it runs, and given back afterwards -- also when the learner's code fails
    seen = []
    precision.inspect_update_loop(lambda *a: seen.append(runtime.busy()) or update(*a), K=2, updates=1)
    assert seen == [True] and not runtime.busy() and not dist.is_initialized()

    def broken(net, opt, micro_batches):
        raise ValueError("boom")

    res = lk.check.fixed_training_loop(broken)
    assert "ValueError" in res.message, res.message
    assert not runtime.busy() and not dist.is_initialized()


def test_a_learners_loop_that_raises_frees_ddp_before_the_checks_group_goes(monkeypatch):
    """The learner's frame in the error's traceback holds the DDP module: freed after the check destroyed its
    group, the reducer's destructor can deadlock (as chapter 11's demo did), so the check clears the frames."""
    import torch.distributed as dist

    from conftest import ddp_alive_at
    from labkit.check import precision as prec

    def loop(model, optimizer, micro_batches):
        x, y = micro_batches[0]
        model(x, y).backward()
        raise ValueError("the learner's bug, mid-update")

    alive = ddp_alive_at(monkeypatch, prec.dist, "destroy_process_group")
    with pytest.raises(ValueError, match="learner's bug"):
        prec.inspect_update_loop(loop)
    assert alive == [0] and not dist.is_initialized()
