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
