#!/usr/bin/env python3
"""Set up labkit's environment (first time only) and open the course or run the tests.

    python3 course.py lab     # open the course in JupyterLab (http://127.0.0.1 only, token kept)
    python3 course.py test    # run every test, notebooks included, the chapters in their short mode
    python3 course.py test --full   # the same with the chapters at the lessons' sizes (slower)

The environment is ``.venv`` next to this file. It sees the packages of the Python that created
it (``--system-site-packages``), so a CUDA build of PyTorch you already have is used as it is.
``lab`` installs what a learner needs (requirements.txt); ``test`` adds the rest (requirements-test.txt:
the test tools and the grading tools of requirements-grading.txt).
Extra arguments after ``test`` go to pytest; after ``lab`` to JupyterLab.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
# What each command installs: a learner's set for `lab`; for `test` (and CI's `course.setup()`) that and the rest.
ROLES = {"lab": ["requirements.txt"],
         "test": ["requirements.txt", "requirements-test.txt", "requirements-grading.txt"]}


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp(role: str) -> Path:
    return VENV / f".labkit-installed-{role}"


def _digest(role: str) -> str:
    """What ``role``'s install read: its requirements files and pyproject.toml (labkit's own dependencies)."""
    files = ROLES[role] + ["pyproject.toml"]
    return hashlib.sha256(b"".join((ROOT / r).read_bytes() for r in files if (ROOT / r).exists())).hexdigest()


def installed(role: str) -> bool:
    """``role``'s requirements are installed as they read now (a test install covers a lab install too)."""
    roles = ["lab", "test"] if role == "lab" else ["test"]
    return any(_stamp(r).exists() and _stamp(r).read_text() == _digest(r) for r in roles)


def setup(role: str = "test") -> Path:
    """``.venv`` with ``role``'s requirements ("lab": a learner's; "test": everything the tests need) and labkit
    installed editable; pip runs only when what ``role`` reads changed since its last install."""
    if sys.version_info < (3, 10):
        sys.exit(f"labkit needs Python 3.10 or newer; this is {sys.version.split()[0]}")
    py = venv_python()
    if not py.exists():
        print(f"[labkit] creating {VENV} ...", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)])
    if not installed(role):
        print(f"[labkit] installing the requirements for `{role}` (first time: a few minutes) ...", flush=True)
        pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        reqs = [a for r in ROLES[role] if r != "requirements-grading.txt" for a in ("-r", str(ROOT / r))]
        subprocess.check_call(pip + reqs)  # requirements-test.txt reads requirements-grading.txt itself
        subprocess.check_call(pip + ["--no-deps", "-e", str(ROOT)])
        _stamp(role).write_text(_digest(role))
    return py


def main(argv) -> int:
    if not argv or argv[0] not in ("lab", "test"):
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    py = setup(cmd)
    if cmd == "test":
        return run_tests(py, rest)
    # the notebooks read as this environment's kernel describes them: JupyterLab then opens them unmodified
    contents = "--ServerApp.contents_manager_class=labkit.base.jupyter_contents.KernelLanguageContents"
    args = [str(py), "-m", "jupyter", "lab", "--ip=127.0.0.1", contents,
            str(ROOT / "notebooks" / "00_start_here.ipynb")]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")  # JupyterLab refuses to run as root without it (containers, CI)
    try:
        return subprocess.call(args + rest, cwd=ROOT)
    except KeyboardInterrupt:
        return 0


def _workers(py: Path, rest: list) -> int:
    """Test processes for the default run: 2 on a machine with 2 cores or more where pytest-xdist is
    installed (the suite is mostly waiting on spawned processes and imports, so two share 2 cores well);
    1 when the run was narrowed or given its own -n / -m, or with ``LABKIT_TEST_WORKERS=1``."""
    if any(not a.startswith("-") for a in rest) or any(a.startswith(("-n", "-m", "--dist")) for a in rest):
        return 1
    want = os.environ.get("LABKIT_TEST_WORKERS", "").strip()
    n = int(want) if want.isdigit() else min(2, os.cpu_count() or 1)
    if n < 2:
        return 1
    try:
        has_xdist = subprocess.run([str(py), "-c", "import xdist"], capture_output=True).returncode == 0
    except OSError:  # no such Python
        return 1
    return n if has_xdist else 1


def _grading_words() -> str:
    """How many chapters real nbgrader graded (tests/conftest.py's ``grading_scope``, in words). The CI test is
    labkit's ``lk.course.on_ci``, written out: this file runs before labkit's environment exists."""
    if os.environ.get("LABKIT_GRADE_ALL") == "1":
        return "nbgrader graded every chapter (LABKIT_GRADE_ALL=1)"
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        return "nbgrader graded CI's set of chapters (LABKIT_GRADE_ALL=1 grades every one)"
    return "nbgrader graded one chapter as a sample (CI=true grades nine, LABKIT_GRADE_ALL=1 every one)"


def run_tests(py: Path, rest: list) -> int:
    """pytest over the tests and the notebooks. The notebooks run in their short mode unless ``--full``
    is given: the tests check that every cell works, not the lessons' sizes (``LABKIT_MODE``, read by
    ``lk.course.smoke``). With 2 cores and pytest-xdist, two test processes share the files (each file,
    a notebook included, runs whole in one of them, but for the chapters nbgrader grades, one unit each; the long
    units first: tests/conftest.py's ``pytest_xdist_make_scheduler``); the browser test then runs alone, after them."""
    full = "--full" in rest
    rest = [a for a in rest if a != "--full"]
    mode = "full" if full else "short"
    paths = [] if any(not a.startswith("-") for a in rest) else ["tests", "notebooks"]
    base = [str(py), "-m", "pytest", *paths, "--nbval-lax", "-p", "no:cacheprovider"]
    env = {**os.environ, "LABKIT_MODE": mode}
    start = time.monotonic()
    n = _workers(py, rest)
    if n > 1:
        code = subprocess.call(base + ["-n", str(n), "--dist", "loadfile", "-m", "not browser"] + rest, cwd=ROOT,
                               env=env)
        # JupyterLab and Chromium beside a second test process can miss the test's time limits: alone
        code = subprocess.call(base[:3] + ["tests/test_browser.py", "-p", "no:cacheprovider"] + rest, cwd=ROOT,
                               env=env) or code
    else:
        code = subprocess.call(base + rest, cwd=ROOT, env=env)
    minutes, seconds = divmod(round(time.monotonic() - start), 60)
    other = "--full runs them at the lessons' sizes" if not full else "without --full they run short"
    how = f", {n} test processes" if n > 1 else ""
    print(f"[labkit] tests took {minutes} min {seconds:02d} s, chapters in their {mode} mode ({other}){how}; "
          f"{_grading_words()}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
