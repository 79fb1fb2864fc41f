import contextlib
import functools
import importlib.util
import subprocess
import re
import time
import warnings
from pathlib import Path

import pytest

# nbval's run of each chapter ends with its exercises re-run with the reference answers (same kernel)
from test_rerun_exercises import pytest_collection_modifyitems  # noqa: F401


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """After nbval runs a chapter's cell: what it showed must read as a lesson (tests/output_rules.py); in a
    Russian chapter (notebooks/ru/), it must show no English from labkit but what tests/test_translate.py's
    STILL_ENGLISH lists (``english_shown``)."""
    result = yield
    parent = getattr(item, "parent", None)
    if type(item).__name__ != "IPyNbCell":
        return result
    path = Path(str(getattr(parent, "path", "")))
    if path.parent.name == "notebooks":
        from output_rules import problems

        found = problems(getattr(item, "test_outputs", None))
        if found:
            raise AssertionError(f"{path.name}, {item.name}: " + "; ".join(found))
    elif path.parent.name == "ru" and path.parent.parent.name == "notebooks":
        found = english_shown(path.name, item.cell.get("id", ""), getattr(item, "test_outputs", None) or [])
        if found:
            raise AssertionError(f"{path.name}, {item.name}: English from labkit on a Russian page (translate it, "
                                 f"or list it in tests/test_translate.py's STILL_ENGLISH with why): " + "; ".join(found))
    return result


def english_shown(notebook: str, cell_id: str, outputs: list) -> list:
    """["<notebook> <cell id>: what"] of the English a Russian chapter's cell showed (test_translate.english_in)
    that STILL_ENGLISH does not list. nbval's run of the Russian chapters is where CI looks: each runs once."""
    import re
    import types

    from nbformat import NotebookNode
    from test_translate import STILL_ENGLISH, english_in

    cell = NotebookNode(id=cell_id, outputs=[NotebookNode(o) for o in outputs])
    found = [f"{notebook} {f}" for f in english_in(types.SimpleNamespace(cells=[cell]))]
    return [f for f in found if not any(re.search(p, f) for p, _ in STILL_ENGLISH)]


def grading_scope() -> str:
    """How much of the slow, real-tool work a run does: "all" (LABKIT_GRADE_ALL=1), "ci" (the CI variable set, not
    to a false value, as .ci/run does) or "sample" (a plain `python3 course.py test`, which must end within 12
    minutes on 2 cores): nbgrader grades one chapter instead of nine, otter skips chapter 03's run and the
    clean-machine test runs chapter 00 alone and `labkit grade`'s no-isolation class is left to CI
    (tests/test_assignments.py, test_assignments_otter.py, test_coursefiles.py, test_classgrade_isolation.py)."""
    import os

    from labkit.chapters.course import on_ci

    if os.environ.get("LABKIT_GRADE_ALL") == "1":
        return "all"
    return "ci" if on_ci() else "sample"


def ddp_alive_at(monkeypatch, owner, name: str) -> list:
    """Replace ``owner.name`` -- what destroys a process group -- by itself preceded by a count of the live DDP
    modules (after a collection), appended to the list returned. DDP's reducer holds the group: one still alive
    when the group goes is freed later, and its destructor can deadlock (chapter 11's demo did)."""
    import gc

    import torch

    alive, real = [], getattr(owner, name)

    def destroy(*args, **kwargs):
        gc.collect()
        alive.append(sum(type(o) is torch.nn.parallel.DistributedDataParallel for o in gc.get_objects()))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, destroy)
    return alive


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


def fails_with(res, *words):
    """A wrong answer's result: attempted, failed (not as tampering), its message naming each word."""
    assert res.attempted and not res.passed and not res.tampered, res
    for w in words:
        assert w in res.message, (w, res.message)


def assert_family_registered(family):
    """Every checker a family exports is listed by lk.check.names() and reachable as lk.check.<name>."""
    import labkit as lk
    names = lk.check.names()
    for n in family.__all__:
        assert n in names
        assert getattr(lk.check, n) is getattr(family, n)


def run_in_fresh_python(script: str, tmp: Path, timeout: int = 240) -> dict:
    """Run ``script`` (a ``python -c`` text that pickles its results to argv[1]; argv[2] is an empty folder it
    may use) in a new Python with this checkout first on the path, and return what it pickled, with
    ``store_dir`` (that folder). For demos that must not run in pytest's own process (FSDP2: later
    DataLoader-worker forks crashed in a process that had run it)."""
    import os
    import pickle
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    (tmp / "store").mkdir()
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp / "out.pkl"), str(tmp / "store")], env=env,
                          cwd=root, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp / "out.pkl", "rb") as f:
        out = pickle.load(f)
    out["store_dir"] = tmp / "store"
    return out


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
def fresh_probes(tmp_path, monkeypatch):
    """The what-if probes in a sandbox: an empty cache, short probes, and a machine whose load the test decides
    (``state["busy"]``, True to start with)."""
    import math

    from labkit.engine import device
    from labkit.whatif import probes

    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(probes, "_PROBED", {})
    monkeypatch.setattr(probes, "_TRIED", {})
    monkeypatch.setattr(probes, "PROBE_BUDGET_S", 0.1)
    monkeypatch.setattr(probes, "PEAK_BUDGET_S", 0.1)
    monkeypatch.setattr(probes, "SPREAD_LIMIT", math.inf)
    monkeypatch.setattr(device, "_MEASURED", {})
    state = {"busy": True}
    monkeypatch.setattr(probes._device, "contended", lambda reading, threads: state["busy"])
    return tmp_path, state


@pytest.fixture
def no_leftover_processes():
    before = {p.pid for p in live_children()}
    yield
    left = [p for p in wait_no_children() if p.pid not in before]
    assert not left, f"processes outlived the run: {[(p.pid, p.name()) for p in left]}"


# ---- file faults made real (benchmarks/faults.py): one tmpfs, one fill -- for tests of atomic writes ---------

@functools.lru_cache(maxsize=None)
def _file_faults():
    """benchmarks/faults.py, loaded on first use without putting benchmarks/ on sys.path."""
    spec = importlib.util.spec_from_file_location(
        "labkit_bench_faults", Path(__file__).resolve().parent.parent / "benchmarks" / "faults.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def mounted(tmp_path):
    """A 64 KiB tmpfs (root only); skipped with a reason where mounting is not allowed."""
    faults = _file_faults()
    try:
        with faults.tmpfs() as mnt:
            yield mnt
    except faults.Skipped as why:
        pytest.skip(f"{why}: the fault cannot be made real here")


def fill(mnt: Path) -> None:
    """Fill the tmpfs mounted at mnt."""
    _file_faults().fill(mnt)


def remount_ro(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)


def temps(folder: Path) -> list:
    """The names of the temporary files labkit's atomic writes left in folder."""
    from labkit.base import paths

    return [p.name for p in folder.iterdir() if paths.temp_owner(p.name) is not None]


@pytest.fixture
def no_work(monkeypatch):
    """Any training started (in this process or in ranks) fails the test: for configs run() must refuse."""
    from labkit.engine import launch as launch_mod
    from labkit.engine import train as train_mod

    def started(*args, **kwargs):
        raise AssertionError("run() started work on a config it should have refused")

    monkeypatch.setattr(train_mod, "train_worker", started)
    monkeypatch.setattr(launch_mod, "run_ranks", started)


@pytest.fixture(autouse=True)
def _quiet_threads():
    # Tests must not leave torch's global thread count changed (labkit restores it after a run).
    import torch

    n = torch.get_num_threads()
    yield
    assert torch.get_num_threads() == n, "a run left torch.set_num_threads changed"


# ---- a clean machine, simulated: labkit's wheel, and a Python that has only torch (tests/test_hosting.py,
# tests/test_coursefiles.py) ------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def _tracked_copy(dest: Path) -> Path:
    """The repository's files as a clean clone has them (tracked, and new files git does not ignore): a
    checkout's own build/ or data/cache never reaches the wheel."""
    import shutil
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True)
    names = [n for n in listed.stdout.decode().split("\0") if n] if listed.returncode == 0 else None
    if not names:  # not a git checkout (an unpacked source archive): copy it, leaving out what is made here
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".venv", "build", "cache", "out", "*.egg-info", ".git"))
        return dest
    for n in names:
        if (REPO / n).is_file():
            (dest / n).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / n, dest / n)
    return dest


@pytest.fixture(scope="session")
def labkit_wheel(tmp_path_factory):
    """labkit built as a wheel (pip wheel, from a clean copy of the repository), its path."""
    import subprocess
    import sys

    src = _tracked_copy(tmp_path_factory.mktemp("labkit-src"))
    out = tmp_path_factory.mktemp("labkit-wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                    "-w", str(out)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("labkit-*.whl")
    return wheel


# What Colab and Kaggle have before labkit: torch (their CUDA build; here this Python's) and the packages a
# chapter imports besides labkit, with a kernel to run it.
PREINSTALLED = ("torch", "numpy", "matplotlib", "ipywidgets", "psutil", "ipykernel")


@pytest.fixture(scope="session")
def preinstalled(tmp_path_factory):
    """A folder holding links to this Python's PREINSTALLED packages and what they need: a new venv that lists
    it in a .pth file sees the very torch build the suite uses -- no copy, no download -- and nothing of
    labkit (a folder named in a .pth file has its own .pth files ignored, so the editable install's finder
    does not come along)."""
    import importlib.metadata as md
    import re

    d = tmp_path_factory.mktemp("preinstalled")
    seen, todo = set(), list(PREINSTALLED)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if key in seen or key == "labkit":
            continue
        seen.add(key)
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or [] if "extra ==" not in r]
        base = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__", "_distutils_hack"}:
            if not top.endswith(".pth") and (base / top).exists() and not (d / top).exists():
                (d / top).symlink_to(base / top)
    return d


def new_venv(where: Path, preinstalled: Path) -> Path:
    """A brand-new venv at ``where`` (pip in it, no other package) that also sees ``preinstalled``; its python."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True, timeout=300)
    py = where / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "labkit-test-preinstalled.pth").write_text(str(preinstalled) + "\n")
    return py


# ---- the order of `python3 course.py test`'s two test processes (pytest-xdist, --dist loadfile) ----------------
# xdist hands a process the next unit of work (a file) when it has two tests or fewer left, and by its own rule the
# files with the most tests go first: the nbgrader files -- a few tests of one to four minutes each -- came last,
# where one process could be handed both while the other had nothing left (CI's main pass: 20 to 30 minutes with
# less grading). Here each nbgrader chapter is a unit of its own, and the units known to take a minute or more go
# first, the longest first (each process takes the next when it is nearly done, so the last ones are short); then
# the chapters' notebooks (nbval), then the rest in xdist's order. The seconds are rough (CI's --durations on an
# idle 2-core machine, and the ratios of a run on a loaded one, scaled to it) and only order the units: a wrong one,
# or a renamed or new slow file, only runs later than it could (test_course_command checks each name is a file).

SPLIT = ("test_nbgrader_grades_the_reference_full_wrong_and_failing_answers_zero_and_a_blank_not_attempted",
         "test_nbgrader_grades_the_measured_exercises_from_the_learners_saved_file")  # one unit per chapter
UNIT_SECONDS = {  # a file (its tests other than SPLIT's), or "[NN" for one chapter graded by nbgrader
    "tests/test_assignments_otter.py": 300, "tests/test_coursefiles.py": 150, "tests/test_classgrade_isolation.py": 120,
    "tests/test_measurements.py": 90, "tests/test_classgrade.py": 90, "tests/test_assignments_feedback.py": 90,
    "tests/test_reliability.py": 90, "tests/test_drills_cases.py": 80, "tests/test_assignments_grade.py": 60,
    "tests/test_assignments.py": 60, "tests/test_classgrade_scale.py": 60,
    # chapter 12's instruments on four real processes (a loaded 2-core machine: 20 to 40 s each)
    "tests/test_ch12_hsdp.py": 40, "tests/test_ch12_schedules.py": 35, "tests/test_ch12_moe.py": 30,
    "tests/test_ch12_twod.py": 30,
    # the Russian chapters run in Russian, their outputs searched for English (test_translate's slow tests)
    "tests/test_translate.py": 150,
    # CI grades these chapters once (tests/test_assignments.py's fully_graded: 08 three times, as every chapter
    # with LABKIT_GRADE_ALL=1, where 03, 09 and 10 are graded too)
    "[05": 80, "[08": 80, "[04": 55, "[01": 50, "[02": 50, "[06": 50, "[07": 50, "[11": 50, "[00": 35,
    "[09": 70, "[10": 50, "[12": 50, "[03": 40,
}
NOTEBOOK_SECONDS = 25  # a chapter under nbval with its exercises re-run (CI mode): most take 10 s to a minute


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or itself for a test of SPLIT (one nbgrader chapter)."""
    file, _, rest = nodeid.partition("::")
    return nodeid if rest.split("[", 1)[0] in SPLIT else file


def unit_seconds(unit: str) -> float:
    """About how long a unit takes (UNIT_SECONDS), for the order only; 0 for the many short files."""
    if "::" in unit and "[" in unit:
        return UNIT_SECONDS.get("[" + unit.split("[", 1)[1][:2], 60)
    if unit.endswith(".ipynb"):
        return NOTEBOOK_SECONDS
    return UNIT_SECONDS.get(unit, 0)


def longest_first(units: list) -> list:
    """``units`` (in xdist's order) with the long ones first, the longest first; the rest keep their order."""
    return sorted(units, key=lambda u: -unit_seconds(u))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with SPLIT's tests one unit each and the units in ``longest_first`` order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

        def _assign_work_unit(self, node):
            if not getattr(self, "_ordered", False):  # the first call: the queue is complete, nothing handed out
                self._ordered = True
                self.workqueue = OrderedDict((u, self.workqueue[u]) for u in longest_first(list(self.workqueue)))
            return super()._assign_work_unit(node)

    return LongestFirst(config, log)


# six ASCII words or more in a row, figures and signs between them allowed: English prose in a Russian message
ENGLISH_RUN = re.compile(r"[A-Za-z][A-Za-z'’-]*(?:[ ,;:()\d.%×+±–-]+[A-Za-z][A-Za-z'’-]*){5,}")


@pytest.fixture
def speaks_russian(monkeypatch):
    """labkit speaks Russian in this test (English again after it); an English fallback's warning is an error."""
    from labkit.base import phrases
    monkeypatch.setenv("LABKIT_LANG", "en")  # choose_language sets it: restored after the test
    monkeypatch.setattr(phrases, "_chosen", [])
    monkeypatch.setattr(phrases, "_said", set())
    phrases.choose_language("ru")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an English fallback warns
        yield
