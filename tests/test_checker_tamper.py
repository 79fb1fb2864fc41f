"""A learner's code cannot talk a checker into passing (issue 25, item 13).

Each trick that once worked now fails the check, and the right answers still pass:
- reading the expected answer from the checker's frame (``sys._getframe(1).f_locals["want"]``) -- no frame
  the learner's code can walk up to holds one, because none is worked out before that code has returned;
- changing the checker's helpers, tables or tolerances for the rest of the kernel (``basics._rel = lambda a,
  b: 0``), or what their references rely on (a torch function, a builtin, another labkit module): the seal
  (labkit/check/_guard.py) names the change and every check fails until the kernel restarts;
- switching off, blocking or replacing the time limit (``signal.setitimer(ITIMER_REAL, 0)``), or holding it
  off past its end: found after the learner's code returns, and the check fails;
- forging the grade log (``_core._LOG.append(...)``, an edited, repeated or removed entry) or replacing
  ``export_csv``: the log's entries are signed, so what no check recorded is exported as failed, with a note.
"""
import csv
import signal
import sys
import time
import types
from pathlib import Path

import pytest
import torch

import labkit as lk
from conftest import load_solutions
from labkit.chapters import ch09_playbook as pb
from labkit.check import _core, _guard, basics, capstone, practice

CHECK_DIR = str(Path(basics.__file__).resolve().parent)
ANSWER_NAMES = {"want", "want_scales", "want_taken", "want_op", "want_share", "right", "expected", "measured",
                "ref", "ref_grads", "ref_bytes", "best", "real_calls", "real_bytes", "calls16", "bytes16",
                "prev_want", "last", "exact", "naive", "load", "compute"}

basics_sol, scaling_sol = load_solutions("basics"), load_solutions("scaling")
precision_sol, accumulation_sol, ddp_sol = (load_solutions(n) for n in ("precision", "accumulation", "ddp"))
capstone_sol, practice_sol, diagnose_sol = (load_solutions(n) for n in ("capstone", "practice", "profiling"))
parallel_sol, longrun_sol = load_solutions("parallel"), load_solutions("longrun")


def checker_frames():
    """The frames of labkit's checkers above the caller, innermost first."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.startswith(CHECK_DIR):
            yield f
        f = f.f_back


def found_in_frames(*names):
    """What the learner's code could read: the first local of a checker frame with one of these names."""
    for f in checker_frames():
        for n in names:
            if n in f.f_locals:
                return f.f_locals[n]
    return None


@pytest.fixture
def restore(monkeypatch):
    """Put back afterwards whatever a test's 'learner' changes: monkeypatch records each original now."""
    def keep(obj, *names):
        for n in names:
            monkeypatch.setattr(obj, n, getattr(obj, n))
    return keep


# ---- 1. the expected answer is in no frame the learner's code can reach ------------------------------

def test_reading_want_from_the_callers_frame_no_longer_passes_flops_linear():
    def peek(tokens, d_in, d_out):
        return sys._getframe(1).f_locals["want"]  # the trick, verbatim

    res = lk.check.flops_linear(peek)
    assert not res.passed and "KeyError" in res.message, res

    def walk(tokens, d_in, d_out):  # the thorough version: every frame up, any name that holds an answer
        got = found_in_frames(*ANSWER_NAMES)
        return got if got is not None else 0

    assert not lk.check.flops_linear(walk).passed


def test_reading_the_scalers_expected_trace_no_longer_passes_loss_scaler():
    class Peeking:
        def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
            self.scale, self.i = init_scale, 0

        def update(self, found_inf):
            scales, taken = found_in_frames("want_scales"), found_in_frames("want_taken")
            if scales is None or taken is None:
                return not found_inf  # nothing to read: a guess, wrong once the scale must move
            self.scale, take = scales[self.i], taken[self.i]
            self.i += 1
            return take

    res = lk.check.loss_scaler(Peeking)
    assert res.attempted and not res.passed, res


def test_reading_the_big_batch_gradients_no_longer_passes_accumulation_loop():
    def peek(model, optimizer, micro_batches):
        want = found_in_frames("want")
        if want is not None:  # the big batch's gradients, straight into .grad: no accumulation at all
            for p, g in zip(model.parameters(), want):
                p.grad = g.clone()
        optimizer.step()

    res = lk.check.accumulation_loop(peek)
    assert res.attempted and not res.passed, res


SNOOPED = [  # (checker, the reference answer, extra arguments): every checker that runs a learner's code
    ("training_state_bytes", basics_sol.training_state_bytes, ()),
    ("flops_linear", basics_sol.linear_flops, ()),
    ("find_bottleneck", basics_sol.bottleneck, ()),
    ("fp16_flush_fraction", precision_sol.flush_fraction, ()),
    ("token_weights", accumulation_sol.token_weights, ()),
    ("accumulation_loop", accumulation_sol.accumulate_update, ()),
    ("fixed_training_loop", precision_sol.train_update, ()),
    ("checkpoint_blocks", scaling_sol.run_block, ()),
    ("ideal_step", scaling_sol.ideal_step_s, ()),
    ("wait_fraction", scaling_sol.wait_fraction, ()),
    ("fewest_workers", scaling_sol.fewest_workers, ()),
    ("counting_hook", ddp_sol.count_and_average, ()),
    ("fix_no_sync", ddp_sol.accumulate, ()),
    ("ring_allreduce_time", ddp_sol.ring_time, ()),
    ("pareto_front", capstone_sol.my_pareto_front, ()),
    ("zero_bytes_per_gpu", capstone_sol.my_zero_bytes, ()),
    ("pad_vocab", practice_sol.pad_vocab, ()),
    ("compile_breakeven", practice_sol.breakeven_steps, ()),
    ("activation_formula", practice_sol.activation_bytes_formula, ()),
    ("memory_budget", practice_sol.my_budget, ()),
    ("loader_reading", diagnose_sol.read_loader, ()),
    ("tp_allreduces", parallel_sol.my_tp_allreduces, ()),
    ("bubble", parallel_sol.my_bubble, ()),
    ("layout_bytes", parallel_sol.my_layout_bytes, ()),
    ("resume_needs", longrun_sol.my_resume_needs, ()),
    ("young_daly", longrun_sol.my_interval, ()),
    ("lost_work", longrun_sol.my_lost_work, ()),
]


def _numbers(value):
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, (list, tuple)) and len(value) < 64:
        return [x for v in value for x in _numbers(v) if not isinstance(v, (list, tuple))]
    return []


@pytest.mark.parametrize("name,solution,extra", SNOOPED, ids=[s[0] for s in SNOOPED])
def test_no_checker_frame_holds_an_answer_while_the_learners_code_runs(name, solution, extra):
    """The reference answer, snooping: at every call it notes each local of every checker frame above it.
    No local may be named as an answer, and none may hold this call's right return value (unless that
    value is also one of the call's inputs or an answer the function itself returned before)."""
    names, leaks, given = set(), [], []

    def snoop(*args, **kwargs):
        out = solution(*args, **kwargs)
        mine = set(_numbers(list(args))) | set(given)
        right = _numbers(out)
        for f in checker_frames():
            for k, v in f.f_locals.items():
                names.add(k)
                if k != "limit" and any(x in right and x not in mine for x in _numbers(v)):  # limit: 30 s
                    leaks.append((f.f_code.co_name, k))
        given.extend(right)
        return out

    res = getattr(lk.check, name)(snoop, *extra)
    assert res.passed, res.message
    assert not names & ANSWER_NAMES, sorted(names & ANSWER_NAMES)
    assert not leaks, leaks


def test_no_frame_holds_the_process_groups_own_count_while_a_hook_runs():
    """counting_hook compares state['calls'] with the count of the stand-in process group: that group may
    not sit in a frame the hook can walk up to (reading its count would fill state without counting)."""
    seen = []

    def hook(state, bucket):
        seen.extend(type(v).__name__ for f in checker_frames() for v in f.f_locals.values())
        return ddp_sol.count_and_average(state, bucket)

    assert lk.check.counting_hook(hook).passed
    assert seen and "TwinGroup" not in seen


# ---- 2. the checker's helpers, tables and references cannot be changed --------------------------------

def test_a_patched_helper_fails_every_later_check_until_restored(restore):
    restore(basics, "_rel")
    basics._rel = lambda a, b: 0  # the trick: made every later check pass, llm_memory_gb(1) included
    res = lk.check.llm_memory_gb(1)
    assert not res.passed and res.tampered and "labkit.check.basics._rel" in res.message, res
    assert "Restart the kernel" in res.message
    assert not lk.check.flops_linear(lambda t, i, o: 0).passed
    row = lk.check.history()[-1]
    assert row["passed"] is False and "labkit.check.basics._rel" in row["note"]


def test_a_helper_patched_by_the_learners_own_code_fails_that_check(restore):
    restore(basics, "_rel")

    def sneaky(tokens, d_in, d_out):
        basics._rel = lambda a, b: 0  # from inside the checked code, before the references are compared
        return 1

    res = lk.check.flops_linear(sneaky)
    assert not res.passed and res.tampered and "basics._rel" in res.message, res
    assert not lk.check.llm_memory_gb(1).passed  # and every later one


def _cell(fn, name):
    """The closure cell of a checker's wrapper that holds ``name`` (its own reference to the seal, say)."""
    return fn.__closure__[fn.__code__.co_freevars.index(name)]


PATCHES = {  # what a learner's cell could change, by the name the check reports
    "practice.FORMULA_TOLERANCE": lambda mp: mp.setattr(practice, "FORMULA_TOLERANCE", 1.0),
    "capstone.CHALLENGE_FRACTION": lambda mp: mp.setattr(capstone, "CHALLENGE_FRACTION", 0.0),
    "torch.allclose": lambda mp: mp.setattr(torch, "allclose", lambda *a, **k: True),
    "builtins.abs": lambda mp: mp.setattr(__import__("builtins"), "abs", lambda x: 0),
    "labkit.chapters.ch09_playbook.zero_bytes_per_gpu": lambda mp: mp.setattr(pb, "zero_bytes_per_gpu", lambda *a: 0),
    "labkit.check._guard.changes": lambda mp: mp.setattr(_guard, "changes", lambda: []),
    # the signer is no attribute of _core (issue 45): one set there is a name added to a sealed module
    "labkit.check._core._record": lambda mp: mp.setattr(_core, "_record", lambda entry: None, raising=False),
    "labkit.check._core.export_csv": lambda mp: mp.setattr(_core, "export_csv", lambda *a, **k: "forged.csv"),
    "labkit.check.export_csv": lambda mp: mp.setattr(lk.check, "export_csv", lambda *a, **k: "forged.csv"),
    "labkit.check.basics.flops_linear": lambda mp: mp.setattr(_cell(basics.flops_linear, "changes"),
                                                              "cell_contents", lambda: []),
    # issue 45: labkit.check replaced where a test cell finds it (sys.modules, or labkit's attribute)
    "sys.modules['labkit.check']": lambda mp: mp.setitem(sys.modules, "labkit.check", types.ModuleType("fake")),
    "labkit.check": lambda mp: mp.setattr(sys.modules["labkit"], "check", types.ModuleType("fake")),
    "TIME_LIMIT_S = 0": lambda mp: mp.setattr(_core, "TIME_LIMIT_S", 0),
    "TIME_LIMIT_S = 1000000000.0": lambda mp: mp.setattr(_core, "TIME_LIMIT_S", 1e9),
}


@pytest.mark.parametrize("shown", list(PATCHES))
def test_each_kind_of_change_is_named_and_fails_the_check(monkeypatch, shown):
    check = basics.llm_memory_gb  # the real checker, whatever labkit.check now is
    PATCHES[shown](monkeypatch)
    res = check(208)  # a right answer: it fails, and says why
    assert not res.passed and res.tampered and shown in res.message, res
    monkeypatch.undo()
    assert lk.check.llm_memory_gb(208).passed  # put back: checks work again


def test_a_checker_shadowed_in_the_package_is_found():
    lk.check.flops_linear = lambda fn: lk.check.CheckResult("flops_linear", True, "forged")
    try:
        assert lk.check.flops_linear(None).passed  # the fake answers for itself...
        res = lk.check.llm_memory_gb(208)          # ...but every real check sees it
        assert not res.passed and res.tampered and "labkit.check.flops_linear" in res.message, res
    finally:
        del lk.check.flops_linear
    assert lk.check.llm_memory_gb(208).passed


def test_a_tensor_method_shadowed_by_the_learners_code_fails_that_check():
    """fp16_flush_fraction's reference casts with Tensor.half(): a replacement that never flushes would make
    a 'nothing flushes' answer right. torch.Tensor must not gain a name that shadows its C methods."""
    def never_flushes(g):
        torch.Tensor.half = lambda self: self  # fp16 'holds' every value now
        return 0.0

    try:
        res = lk.check.fp16_flush_fraction(never_flushes)
        assert not res.passed and res.tampered and "torch.Tensor.half" in res.message, res
    finally:
        if "half" in vars(torch.Tensor):
            del torch.Tensor.half
    assert lk.check.fp16_flush_fraction(precision_sol.flush_fraction).passed


def test_a_table_cleared_by_the_learners_code_fails_that_check():
    saved = list(practice.PAD_CASES)

    def clears(n, m):
        practice.PAD_CASES.clear()  # no case left to fail on
        return 0

    try:
        res = lk.check.pad_vocab(clears)
        assert not res.passed and res.tampered and "PAD_CASES" in res.message, res
    finally:
        practice.PAD_CASES[:] = saved
    assert lk.check.pad_vocab(practice_sol.pad_vocab).passed  # put back: checks work again


def test_a_function_written_in_a_notebook_inside_labkit_is_found_even_when_sealed_late():
    code = compile("def fake(n, g, s):\n    return 0\n", "/tmp/ipykernel_1234/567.py", "exec")
    ns = {"__name__": "__main__"}
    exec(code, ns)
    assert _guard.from_notebook(ns["fake"])
    assert not _guard.from_notebook(practice_sol.pad_vocab) and not _guard.from_notebook(basics._rel)


# ---- 3. the time limit ------------------------------------------------------------------------------

@pytest.fixture
def tight(monkeypatch):
    monkeypatch.setattr(_core, "TIME_LIMIT_S", 0.5)


def test_switching_the_timer_off_fails_the_check(tight):
    def stops_the_clock(*args):
        signal.setitimer(signal.ITIMER_REAL, 0)  # the trick
        return scaling_sol.ideal_step_s(*args)

    res = lk.check.ideal_step(stops_the_clock)
    assert not res.passed and res.tampered and "interval timer" in res.message, res
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert lk.check.ideal_step(scaling_sol.ideal_step_s).passed  # the limit is labkit's again


@pytest.mark.parametrize("trick,shown", [
    (lambda: signal.signal(signal.SIGALRM, signal.SIG_IGN), "SIGALRM handler"),
    (lambda: signal.signal(signal.SIGALRM, lambda s, f: None), "SIGALRM handler"),
    (lambda: signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM]), "SIGALRM blocked"),
    (lambda: signal.setitimer(signal.ITIMER_REAL, 1e6), "interval timer"),
    (lambda: signal.alarm(0), "interval timer"),
    (lambda: _core._SHIELDED.__setitem__(0, _core._SHIELDED[0] + 1), "shield"),
])
def test_every_way_of_changing_the_limit_fails_and_is_put_back(tight, trick, shown):
    def changes_it(*args):
        trick()
        return scaling_sol.ideal_step_s(*args)

    res = lk.check.ideal_step(changes_it)
    assert not res.passed and res.tampered and shown in res.message, res
    assert _core._SHIELDED == [0] and signal.SIGALRM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
    assert lk.check.ideal_step(scaling_sol.ideal_step_s).passed


def test_code_that_holds_the_limit_off_past_its_end_fails(tight):
    def slow_right_answer(*args):
        _core._SHIELDED[0] += 1  # labkit's own shield, raised by the learner: no TimeUp while it is up
        t = time.monotonic()
        while time.monotonic() - t < 1.0:
            pass
        _core._SHIELDED[0] -= 1  # and lowered before returning: only the clock can tell
        return scaling_sol.ideal_step_s(*args)

    res = lk.check.ideal_step(slow_right_answer)
    assert not res.passed and "did not finish in 0.5 s" in res.message, res


def test_a_blocked_alarm_before_the_check_fails_it(tight):
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    try:
        res = lk.check.ideal_step(scaling_sol.ideal_step_s)
        assert not res.passed and res.tampered and "SIGALRM blocked" in res.message, res
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGALRM])


def test_replacing_the_signal_and_time_modules_functions_changes_nothing(tight, monkeypatch):
    """The limit uses its own references, taken at import: a no-op signal.setitimer or a frozen clock
    in the learner's kernel neither stops it nor hides a check that ran too long."""
    monkeypatch.setattr(signal, "setitimer", lambda *a, **k: (0.0, 0.0))
    monkeypatch.setattr(time, "monotonic", lambda: 0.0)

    def forever(*args):
        while True:
            pass

    assert "did not finish in 0.5 s" in lk.check.ideal_step(forever).message


# ---- 4. the grade log and its export ---------------------------------------------------------------

def _exported(tmp_path):
    path = lk.check.export_csv(tmp_path / "checks.csv", learner="ada")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_an_appended_log_entry_is_exported_as_failed(tmp_path):
    lk.check.reset_history()
    assert lk.check.llm_memory_gb(208).passed
    _core._LOG.append({"exercise": "flops_linear", "passed": True, "attempted": True,
                       "timestamp": "2026-01-01T00:00:00"})  # the trick
    rows = _exported(tmp_path)
    assert [(r["exercise"], r["passed"]) for r in rows] == [("llm_memory_gb", "True"), ("flops_linear", "False")]
    assert rows[0]["note"] == "" and "not recorded by a check" in rows[1]["note"]
    assert list(rows[0]) == ["learner", "exercise", "passed", "attempted", "timestamp", "note"]


def test_an_edited_repeated_or_removed_entry_is_found(tmp_path):
    lk.check.reset_history()
    lk.check.llm_memory_gb(1)  # wrong
    lk.check.llm_memory_gb(208)  # right
    _core._LOG[0]["passed"] = True  # edited
    rows = _exported(tmp_path)
    assert rows[0]["passed"] == "False" and "not recorded" in rows[0]["note"]
    assert rows[1]["passed"] == "True" and rows[1]["note"] == ""

    _core._LOG.append(dict(_core._LOG[1]))  # a genuine pass, repeated
    assert "not recorded" in _exported(tmp_path)[-1]["note"]

    del _core._LOG[:]  # every failure (and everything else) removed
    rows = _exported(tmp_path)
    assert rows and rows[-1]["passed"] == "False" and "missing" in rows[-1]["note"]
    lk.check.reset_history()
    assert _exported(tmp_path) == [] and lk.check.history() == []


def test_history_shows_what_the_checks_recorded_and_cannot_be_edited_through():
    lk.check.reset_history()
    lk.check.llm_memory_gb(1)
    lk.check.history()[0]["passed"] = True  # a copy: the log is untouched
    assert lk.check.history()[0]["passed"] is False and lk.check.history()[0]["note"] == ""


def test_a_replaced_export_is_found_by_the_next_check_and_logged(monkeypatch, tmp_path):
    lk.check.reset_history()
    real = lk.check.export_csv
    monkeypatch.setattr(lk.check, "export_csv", lambda path, learner=None: str(path))
    res = lk.check.llm_memory_gb(208)
    assert not res.passed and res.tampered and "labkit.check.export_csv" in res.message
    monkeypatch.undo()
    rows = list(csv.DictReader(open(real(tmp_path / "c.csv", learner="ada"), newline="")))
    assert rows[-1]["passed"] == "False" and "export_csv" in rows[-1]["note"]


# ---- 5. right answers still pass ------------------------------------------------------------------

def test_right_answers_pass_and_are_logged_as_genuine(tmp_path):
    lk.check.reset_history()
    for name, answer in (("flops_linear", basics_sol.linear_flops), ("loss_scaler", precision_sol.MyLossScaler),
                         ("accumulation_loop", accumulation_sol.accumulate_update), ("llm_memory_gb", basics_sol.llm_gb),
                         ("pad_vocab", practice_sol.pad_vocab)):
        res = getattr(lk.check, name)(answer)
        assert res.passed and not res.tampered, res
    rows = _exported(tmp_path)
    assert [r["passed"] for r in rows] == ["True"] * 5 and all(r["note"] == "" for r in rows)
    assert _guard.changes() == []
