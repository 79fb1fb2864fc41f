"""``labkit grade`` with hostile learners (issue 45): every notebook runs apart, and only the grader writes OUT.

One class, graded in a bubblewrap sandbox: a cheater (who tries to overwrite a classmate's notebook, OUT's files
and labkit's code, to read the solutions, starts a detached process meant to forge grades.csv after the grader
exits, and signs forged rows into its own grade log), a broken learner (a 0-byte and a truncated notebook), a
learner whose notebook kills its runner, a formula-named learner, one whose cell ignores SIGINT in a loop, a
learner whose notebook is a link to a classmate's, and an honest learner. The honest learner keeps her notebook
and full marks; nothing the cheater did reaches anyone; grading goes on past each; no CSV cell starts with a
formula character; no process outlives the run; labkit's files are the same afterwards. The same hardening
without any isolation (a machine with no bubblewrap, not root) is graded too.
"""
from __future__ import annotations

import csv
import hashlib
import os
import time
from pathlib import Path

import nbformat
import pytest

import labkit
from conftest import grading_scope
from labkit import __main__ as cli
from labkit.instructor import classgrade, gradebox, grading

CH00 = "00_start_here.ipynb"
PKG = Path(labkit.__file__).resolve().parent
REPO = PKG.parent
MARKER = "labkit-issue45-detached-marker"
HONEST = [
    "import labkit as lk",
    "def training_state_bytes(n_params, optimizer):\n"
    "    return n_params * (4 + 4 + {'adamw': 8, 'sgd': 4}[optimizer])\n"
    "lk.check.training_state_bytes(training_state_bytes)",
    "lk.check.bytes_per_param_mixed_adam(16)",
    "lk.check.llm_memory_gb(13e9 * 16 / 1e9)",
]
FORMULA = '=HYPERLINK("example.invalid","x")'
BAD_START = ("=", "+", "-", "@", "\t", "\r")
BWRAP = gradebox.isolation()[0] == "bwrap"


def _write(folder: Path, name: str, cells) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder / name


def _tree_hash(root: Path) -> dict:
    """{file: sha256} for every file of the package (its bytecode caches aside: the grader itself writes those)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _lingering(marker: str) -> list:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _cheater(subs: Path, out: Path) -> list:
    detached = (f"import time\ntime.sleep(20)\nopen({str(out / 'grades.csv')!r}, 'w').write('zoe,00,forged')")
    return [
        "import labkit as lk\nimport os, subprocess, sys",
        "def attempt(fn):\n    try:\n        fn()\n    except Exception:\n        pass\n"
        f"attempt(lambda: open({str(subs / 'zoe' / CH00)!r}, 'w').write('{{}}'))\n"
        f"attempt(lambda: open({str(out / 'grades.csv')!r}, 'w').write('forged'))\n"
        f"attempt(lambda: open({str(out / 'checks' / 'zoe.csv')!r}, 'w').write('forged'))\n"
        f"attempt(lambda: open({str(PKG / 'check' / '_core.py')!r}, 'a').write('# forged'))\n"
        f"attempt(lambda: open('my_copy_of_the_solutions.py', 'w').write(open({str(REPO / 'notebooks' / 'solutions' / 'basics.py')!r}).read()))\n"
        f"subprocess.Popen([sys.executable, '-c', {detached!r}, {MARKER!r}], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
        # the signer, taken from a checker's closure: rows signed as genuine, passed, with no or a wrong answer
        "w = lk.check.llm_memory_gb\n"
        "sign = w.__closure__[w.__code__.co_freevars.index('record')].cell_contents\n"
        "row = dict(passed=True, attempted=True, timestamp='t', note='')\n"
        "sign(dict(row, exercise='bytes_per_param_mixed_adam', answer=None))\n"
        "sign(dict(row, exercise='llm_memory_gb', answer='{\"args\": [1.0], \"kwargs\": {}}'))\n"
        f"sign(dict(row, exercise={FORMULA!r}, answer=None))",
        # and labkit.check replaced by a module whose checkers all pass
        "import types\nfake = types.ModuleType('labkit.check')\n"
        "fake.__getattr__ = lambda name: (lambda *a, **k: True)\nsys.modules['labkit.check'] = fake\nlk.check = fake",
    ]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if not BWRAP:
        pytest.skip("bubblewrap (bwrap) is not installed or cannot make a sandbox here: apt-get install bubblewrap")
    subs, out = tmp_path_factory.mktemp("class"), tmp_path_factory.mktemp("out") / "grades"
    zoe = _write(subs / "zoe", CH00, HONEST)
    _write(subs / "aaa_cheater", CH00, _cheater(subs, out))
    (subs / "bob").mkdir()
    (subs / "bob" / CH00).write_bytes(b"")
    good = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]))
    (subs / "bob" / "03_gradient_accumulation.ipynb").write_text(good[:len(good) // 2])
    _write(subs / "kim", CH00, ["import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"])
    _write(subs / FORMULA, CH00, HONEST[:1] + HONEST[2:3])
    _write(subs / "hal", CH00, ["import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
                                "import labkit as lk\nlk.check.bytes_per_param_mixed_adam(16)"])
    (subs / "sym").mkdir()
    (subs / "sym" / CH00).symlink_to(zoe)
    zoe_before, pkg_before = zoe.read_bytes(), _tree_hash(PKG)
    said = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(classgrade, "CELL_TIMEOUT_S", 15)
        rows = classgrade.grade_class(subs, out, chapters=["00", "03"], say=said.append, isolation="bwrap")
    lingering = _lingering(MARKER)
    time.sleep(1)
    return dict(rows=rows, out=out, said=said, subs=subs, zoe_before=zoe_before, pkg_before=pkg_before,
                lingering=lingering)


def _by(rows, learner) -> dict:
    return {r["exercise"]: r for r in rows if r["learner"] == learner}


def test_the_honest_learner_keeps_her_notebook_and_full_marks(graded):
    zoe = _by(graded["rows"], "zoe")
    assert set(zoe) == set(grading.CHAPTERS["00"])
    assert all(r["score"] == r["max_score"] == grading.POINTS[n] and r["status"] == "passed" for n, r in zoe.items()), zoe
    assert zoe["bytes_per_param_mixed_adam"]["judged_by"] == "grader"  # a number: judged again out of the kernel
    assert zoe["training_state_bytes"]["judged_by"] == "kernel"         # a function: judged in her sandbox
    assert (graded["subs"] / "zoe" / CH00).read_bytes() == graded["zoe_before"]


def test_the_cheaters_edits_reach_nobody_and_nothing_outside_its_copy(graded):
    out, subs = graded["out"], graded["subs"]
    assert _tree_hash(PKG) == graded["pkg_before"]  # labkit's code is the same
    assert not list(subs.rglob("my_copy_of_the_solutions.py"))  # its copy was its own, and is gone
    table = list(csv.DictReader((out / "grades.csv").open()))
    assert len(table) == len(graded["rows"]) and "forged" not in (out / "grades.csv").read_text()
    assert "forged" not in (out / "checks" / "zoe.csv").read_text()
    assert graded["lingering"] == [] and _lingering(MARKER) == []  # the detached process died with the kernel
    cheat = _by(graded["rows"], "aaa_cheater")
    # its forged rows: a number without its answer is not counted, a wrong number is judged again and fails
    assert cheat["bytes_per_param_mixed_adam"]["score"] == 0, cheat
    assert cheat["bytes_per_param_mixed_adam"]["status"].startswith("not counted: its answer is not in the log")
    assert cheat["llm_memory_gb"]["score"] == 0 and cheat["llm_memory_gb"]["judged_by"] == "grader", cheat


def test_grading_goes_on_past_every_bad_learner_and_says_why(graded):
    rows = graded["rows"]
    status = {(r["learner"], r["chapter"]): r["status"] for r in rows}
    assert status[("bob", "00")].startswith("not graded: not a notebook (")
    assert status[("bob", "03")].startswith("not graded: not a notebook (")
    assert status[("kim", "00")].startswith("not graded: the notebook's runner ended without a report")
    assert status[("hal", "00")] == "not graded: timed out"
    assert status[("sym", "00")] == "not graded: a symbolic link (hand in the notebook itself)"
    assert _by(rows, FORMULA)["bytes_per_param_mixed_adam"]["status"] == "passed"
    assert {r["learner"] for r in rows} == {"zoe", "aaa_cheater", "bob", "kim", FORMULA, "hal", "sym"}
    assert any(s.startswith("each notebook runs in a bubblewrap sandbox") for s in graded["said"]), graded["said"]


def test_no_csv_cell_starts_with_a_formula_character_and_out_is_private(graded):
    out = graded["out"]
    files = [out / "grades.csv"] + sorted((out / "checks").iterdir())
    cells = [c for f in files for row in csv.reader(f.open()) for c in row]
    assert "'" + FORMULA in cells  # the learner's name, as text
    assert not [c for c in cells if c.startswith(BAD_START)]
    assert (out.stat().st_mode & 0o777) == 0o700 and (out / "checks").stat().st_mode & 0o777 == 0o700
    assert {f.stat().st_mode & 0o777 for f in files} == {0o600}


def _no_isolation_class(root: Path) -> Path:
    subs = root / "subs"
    _write(subs / "amy", CH00, ["import subprocess, sys\n"
                                f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {MARKER + '-2'!r}],"
                                " start_new_session=True)",
                                "import time\ntime.sleep(600)"])
    _write(subs / "zoe", CH00, HONEST)
    (subs / ".git").mkdir()
    _write(subs / "zoe", "chapter0.ipynb", ["1"])
    return subs


@pytest.mark.skipif(grading_scope() == "sample", reason="it waits out a hung notebook's 25 s limit: CI=true runs it "
                    "(a plain course.py test must end within 12 minutes on 2 cores)")
def test_without_isolation_it_says_so_and_still_kills_every_process_and_keeps_time(tmp_path):
    subs, out, said = _no_isolation_class(tmp_path), tmp_path / "out", []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(classgrade, "NOTEBOOK_TIMEOUT_S", 25)  # the wall-clock limit per notebook
        rows = classgrade.grade_class(subs, out, chapters=["00"], say=said.append, isolation="none")
    assert any(s.startswith("not graded: .git: a hidden name") for s in said), said
    assert any(s.startswith("no isolation: ") for s in said), said
    assert any("chapter0.ipynb (name it as the course's chapter" in s for s in said), said
    amy, zoe = _by(rows, "amy"), _by(rows, "zoe")
    assert {r["status"] for r in amy.values()} == {"not graded: timed out (the notebook ran past 25 s)"}
    assert all(r["status"] == "passed" for r in zoe.values()), zoe
    assert _lingering(MARKER + "-2") == []


def test_a_full_disk_keeps_what_was_graded(tmp_path, capsys, monkeypatch):
    """Issue 45: a write of OUT that failed ended the run with no grades.csv at all."""
    subs = tmp_path / "subs"
    _write(subs / "ann", CH00, ["1"])
    (subs / "bob").mkdir()
    (subs / "bob" / CH00).write_bytes(b"")

    def full(path, text):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(classgrade, "write_atomic", full)
    monkeypatch.setattr(classgrade.gradebox, "run_notebook", lambda *a, **k: {"stopped": "", "log": '{"rows": []}'})
    assert cli.main(["grade", str(subs), str(tmp_path / "out")]) == 1
    got = capsys.readouterr()
    assert "No space left on device" in got.err
    table = list(csv.DictReader(got.out.splitlines()))  # every learner's rows, printed instead
    assert {r["learner"] for r in table} == {"ann", "bob"} and len(table) == 2 * len(grading.CHAPTERS["00"])


def test_ctrl_c_ends_in_one_line_and_keeps_the_learners_graded(tmp_path, capsys, monkeypatch):
    subs = tmp_path / "subs"
    for name in ("ann", "bob"):
        _write(subs / name, CH00, ["1"])
    calls = []

    def run(*a, **k):
        calls.append(a)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"stopped": "", "log": '{"rows": []}'}
    monkeypatch.setattr(classgrade.gradebox, "run_notebook", run)
    assert cli.main(["grade", str(subs), str(tmp_path / "out"), "--jobs", "1"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted:")
    table = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert {r["learner"] for r in table} == {"ann"}


def test_an_empty_log_is_not_attempted_not_a_missing_log(tmp_path, monkeypatch):
    """Issue 45: a notebook that ran and logged no check was reported as 'its grade log was not written'."""
    _write(tmp_path / "subs" / "ann", CH00, ["1"])
    monkeypatch.setattr(classgrade.gradebox, "run_notebook", lambda *a, **k: {"stopped": "", "log": '{"rows": []}'})
    rows = classgrade.grade_class(tmp_path / "subs", tmp_path / "out", say=lambda s: None, isolation="none")
    assert {r["status"] for r in rows} == {"not attempted"}


@pytest.mark.parametrize("log", ["[]", '{"rows": [{"exercise": "llm_memory_gb", "passed": "yes"}]}', "x" * 100])
def test_a_log_of_another_shape_is_not_graded(tmp_path, monkeypatch, log):
    _write(tmp_path / "subs" / "ann", CH00, ["1"])
    monkeypatch.setattr(classgrade.gradebox, "run_notebook", lambda *a, **k: {"stopped": "", "log": log})
    rows = classgrade.grade_class(tmp_path / "subs", tmp_path / "out", say=lambda s: None, isolation="none")
    assert {r["status"] for r in rows} == {"not graded: its grade log is not what labkit writes (it was changed in "
                                           "the kernel)"}


def test_the_copy_leaves_out_links_so_a_classmates_file_is_never_graded(tmp_path):
    """Issue 45: links were followed (a learner graded on a classmate's work or measurements)."""
    ann, bob, into = tmp_path / "ann", tmp_path / "bob", tmp_path / "copy"
    for p in (ann, bob, into):
        p.mkdir()
    (ann / "labkit-measurements.json").write_text('{"format": 1, "entries": {}}')
    (bob / "labkit-measurements.json").symlink_to(ann / "labkit-measurements.json")
    (bob / "notes.txt").write_text("mine")
    assert classgrade._copy(bob, into) == ["labkit-measurements.json"]
    assert sorted(p.name for p in into.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("tool", ["nbgrader", "otter"])
def test_solutions_and_hidden_tests_are_written_for_their_owner_only(tmp_path, tool):
    """Issue 45: the graded builds (reference answers, hidden tests) were written 0644 in 0755 folders."""
    from labkit.instructor import assignments

    out = tmp_path / "course"
    (assignments.build_otter if tool == "otter" else assignments.build_nbgrader)(out, ["00"])
    notebooks = list(out.rglob("00_*.ipynb"))
    assert notebooks and {p.stat().st_mode & 0o777 for p in notebooks} == {0o600}
    assert {p.parent.stat().st_mode & 0o777 for p in notebooks} == {0o700}


def test_the_runner_keeps_at_most_its_cap_of_output(tmp_path):
    """Issue 45: 400 MiB printed by a learner's cell grew the grader to 1.5 GB. The runner (not the grader) now
    keeps at most ``OUTPUT_CAP`` bytes of outputs and drops the rest; the grader reads back only its report."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gradeone", gradebox.RUNNER)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('x')")])
    client = runner._client(nb, {"output_cap": 1 << 20, "cell_timeout_s": 5}, str(tmp_path))
    client.reset_execution_trackers()  # what nbclient does before a notebook runs
    client.clear_before_next_output = False  # ... and before a cell runs
    outs, chunk = [], "x" * (64 << 10)
    for _ in range(100):  # 6.4 MiB printed
        msg = {"msg_type": "stream", "parent_header": {"msg_id": "m"}, "header": {"msg_type": "stream"},
               "content": {"name": "stdout", "text": chunk}}
        client.output(outs, msg, None, 0)
    kept = sum(len(o["text"]) for o in outs)
    assert 0 < kept <= 1 << 20
    assert gradebox.RESULT_CAP < 64 << 20 and gradebox.OUTPUT_CAP < 64 << 20


@pytest.mark.skipif(os.getuid() != 0 or not gradebox._user_runs_python(gradebox.fresh_uid()),
                    reason="needs root and a Python that a user id without an account may run (this one is not)")
def test_as_root_without_bubblewrap_each_notebook_runs_under_a_fresh_user_id(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    _write(subs / "zoe", CH00, HONEST)
    rows = classgrade.grade_class(subs, out, chapters=["00"], say=lambda s: None, isolation="user")
    assert all(r["status"] == "passed" for r in rows), rows


@pytest.mark.parametrize("tool", ["nbgrader", "otter"])
def test_a_test_cell_fails_when_labkit_check_was_replaced_in_the_kernel(tool, monkeypatch):
    """Issue 45: ``labkit.check`` replaced by a module whose checkers pass gave full points with blank answers.
    A test cell now takes labkit's seal from sys.modules: a replaced labkit.check fails it."""
    import ast
    import sys
    import types

    from labkit.instructor import assignments

    stmt = ast.parse("graded = lk.check.llm_memory_gb(llm_gb)").body[0]
    if tool == "nbgrader":
        source = assignments._test_source(stmt, "graded = lk.check.llm_memory_gb(llm_gb)")
        run = lambda: exec(source, {"llm_gb": None})  # noqa: E731 -- a blank answer
    else:
        source = assignments._case_source(stmt.value, hidden=True, points=1).split('""" # END TEST CONFIG\n')[1]
        run = lambda: (exec(source, ns := {}), ns["passed"](None))  # noqa: E731
    fake = types.ModuleType("labkit.check")
    fake.__getattr__ = lambda name: (lambda *a, **k: types.SimpleNamespace(attempted=True, passed=True))
    monkeypatch.setattr(sys.modules["labkit"], "check", fake)
    with pytest.raises(AssertionError, match="labkit was changed in this kernel"):
        run()
    monkeypatch.undo()
    with pytest.raises(AssertionError, match="not attempted"):
        run()  # the real check: a blank answer is not attempted
