"""`python3 course.py test`: the chapters in their short mode unless --full, and the time it took."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import course  # noqa: E402  (the repository's course.py)
import labkit as lk  # noqa: E402


@pytest.mark.parametrize("mode, ci, short", [
    ("short", None, True), ("full", "true", False), ("FULL ", None, False),
    (None, "true", True), (None, None, False), (None, "false", False), ("", "1", True),
])
def test_the_short_mode_is_labkit_mode_first_then_ci(monkeypatch, mode, ci, short):
    for name, value in (("LABKIT_MODE", mode), ("CI", ci)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert lk.course.smoke() is short
    assert lk.course.steps(30) == (10 if short else 30)


@pytest.mark.parametrize("argv, mode, passed", [
    ([], "short", ["tests", "notebooks"]),
    (["--full"], "full", ["tests", "notebooks"]),
    (["tests/test_layers.py", "--full", "-q"], "full", ["tests/test_layers.py", "-q"]),
])
def test_course_test_runs_short_by_default_and_says_how_long(monkeypatch, capsys, argv, mode, passed):
    seen = {}

    def call(args, cwd, env):
        seen.update(args=args, env=env)
        return 3

    monkeypatch.setattr(course.subprocess, "call", call)
    assert course.run_tests(Path("py"), list(argv)) == 3  # pytest's exit status is the command's
    assert seen["env"]["LABKIT_MODE"] == mode
    args = [a for a in seen["args"][3:] if a not in ("--nbval-lax", "-p", "no:cacheprovider")]
    assert args == passed and "--full" not in seen["args"]
    out = capsys.readouterr().out
    assert "tests took" in out and f"{mode} mode" in out


@pytest.mark.parametrize("codes, expect", [((0, 0), 0), ((1, 0), 1), ((0, 2), 2), ((1, 2), 2)])
def test_with_two_test_processes_the_browser_test_runs_alone_after_the_rest(monkeypatch, capsys, codes, expect):
    calls = []

    def call(args, cwd, env):
        calls.append(args)
        return codes[len(calls) - 1]

    monkeypatch.setattr(course, "_workers", lambda py, rest: 2)
    monkeypatch.setattr(course.subprocess, "call", call)
    assert course.run_tests(Path("py"), []) == expect  # the browser run's failure first, else the rest's
    first, second = calls
    assert first[first.index("-n") + 1] == "2" and "loadfile" in first and "not browser" in first
    assert "tests" in first and "notebooks" in first
    assert "tests/test_browser.py" in second and "-n" not in second
    assert "2 test processes" in capsys.readouterr().out


@pytest.mark.parametrize("rest, env, n", [
    (["tests/test_layers.py"], None, 1), (["-n", "4"], None, 1), (["-m", "slow"], None, 1),
    ([], "1", 1), ([], "2", 2),
])
def test_a_narrowed_run_or_labkit_test_workers_1_runs_in_one_process(monkeypatch, rest, env, n):
    if env is None:
        monkeypatch.delenv("LABKIT_TEST_WORKERS", raising=False)
    else:
        monkeypatch.setenv("LABKIT_TEST_WORKERS", env)
    assert course._workers(Path(sys.executable), rest) == (n if n == 1 else (2 if _has_xdist() else 1))


def _has_xdist():
    try:
        import xdist  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("grade_all, ci, scope, graded", [
    (None, None, "sample", 1), (None, "false", "sample", 1), (None, "0", "sample", 1), (None, "true", "ci", 9),
    ("1", None, "all", 13), ("1", "true", "all", 13), ("0", "true", "ci", 9),
])
def test_how_many_chapters_nbgrader_grades_follows_ci_and_labkit_grade_all(monkeypatch, grade_all, ci, scope, graded):
    from test_assignments import CHAPTERS, GRADED_HERE, GRADED_THERE, SAMPLE, chapter_params, grading_scope
    for name, value in (("LABKIT_GRADE_ALL", grade_all), ("CI", ci)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert grading_scope() == scope
    params = chapter_params(CHAPTERS)
    assert sum(not p.marks[0].args[0] for p in params) == graded
    assert all(p.marks[0].kwargs["reason"] for p in params if p.marks[0].args[0])  # a skip says why
    if scope == "sample":
        assert [p.values[0] for p in params if not p.marks[0].args[0]] == SAMPLE and len(SAMPLE) == 1
    words = course._grading_words()  # what the command prints at the end says the same
    assert {"sample": "one chapter", "ci": "CI's set", "all": "every chapter"}[scope] in words
    assert scope != "sample" or ("nine" in words and len(GRADED_HERE + GRADED_THERE) == 9)
    assert lk.course.on_ci() is (scope == "ci" or (scope == "all" and ci == "true"))  # the one test of CI


def test_lab_installs_a_learners_requirements_and_test_the_rest(monkeypatch, tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    calls = []
    monkeypatch.setattr(course, "VENV", venv)
    monkeypatch.setattr(course.subprocess, "check_call", lambda args: calls.append(args))

    def files(args):
        return {Path(args[i + 1]).name for i, a in enumerate(args) if a == "-r"}

    course.setup("lab")
    assert [files(c) for c in calls] == [{"requirements.txt"}, set()] and "-e" in calls[1]
    calls.clear()
    course.setup("lab")
    assert calls == []  # installed, nothing changed
    course.setup("test")  # what .ci/run's course.setup() does: everything the tests need
    assert files(calls[0]) == {"requirements.txt", "requirements-test.txt"}
    calls.clear()
    course.setup("lab")
    course.setup()
    assert calls == []  # a test install covers a lab install
    tests = (course.ROOT / "requirements-test.txt").read_text()
    assert "-r requirements-grading.txt" in tests and "nbgrader" not in (course.ROOT / "requirements.txt").read_text()


# ---- the order of the two test processes' work (tests/conftest.py) -------------------------------------------

def test_each_nbgrader_chapter_is_a_unit_of_its_own_and_other_tests_go_with_their_file():
    from conftest import work_unit

    grade = "tests/test_assignments_grade.py::" + conftest_split()[0] + "[05_data_loader]"
    assert work_unit(grade) == grade
    assert work_unit("tests/test_assignments_grade.py::test_nbgrader_keeps_the_context") == "tests/test_assignments_grade.py"
    assert work_unit("tests/test_layers.py::test_x[a]") == "tests/test_layers.py"
    assert work_unit("notebooks/05_data_loader.ipynb::Cell 3") == "notebooks/05_data_loader.ipynb"


def test_the_long_units_go_first_longest_first_and_the_rest_keep_xdists_order():
    from conftest import longest_first, unit_seconds

    grade = "tests/test_assignments.py::" + conftest_split()[0]
    units = ["tests/test_layers.py", "notebooks/05_data_loader.ipynb", grade + "[00_start_here]",
             "tests/test_config.py", "tests/test_assignments_otter.py", grade + "[05_data_loader]"]
    assert unit_seconds(grade + "[05_data_loader]") > unit_seconds(grade + "[00_start_here]") > 0
    assert unit_seconds("tests/test_assignments_otter.py") > unit_seconds(grade + "[05_data_loader]")
    assert longest_first(units) == ["tests/test_assignments_otter.py", grade + "[05_data_loader]",
                                    grade + "[00_start_here]", "notebooks/05_data_loader.ipynb",
                                    "tests/test_layers.py", "tests/test_config.py"]


def conftest_split() -> tuple:
    from conftest import SPLIT
    return SPLIT


def test_the_order_names_test_files_and_functions_that_exist():
    """A renamed file or test would only run later than it could: each name the order reads is still there."""
    import re

    from conftest import SPLIT, UNIT_SECONDS

    root = Path(__file__).resolve().parent.parent
    chapters = {p.name[:2] for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    for key in UNIT_SECONDS:
        assert (key[1:] in chapters) if key.startswith("[") else (root / key).is_file(), key
    sources = "".join(p.read_text() for p in (root / "tests").glob("test_assignments*.py"))
    for name in SPLIT:
        assert re.search(rf"^def {name}\(", sources, re.M), name
