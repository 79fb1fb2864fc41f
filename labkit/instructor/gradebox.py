"""Where ``labkit grade`` runs one learner's notebook: apart from the grader, from OUT and from the
other learners.

Each notebook runs in a runner process (``_gradeone.py``, a script that imports no labkit) with its
kernel under it, in the first of ``MODES`` this machine allows (``isolation()``): a bubblewrap
sandbox (new PID, network, IPC and UTS namespaces; only what a kernel needs, read-only, and the
learner's copied folder in a size-limited tmpfs; as root, a fresh user id too), a fresh user id
alone, or no isolation (said in one line). notebooks/README.md ("Running learners' code") says what
each prevents and why bubblewrap: no daemon, no image, packaged by Debian.

In every mode: the runner's limits, a clean environment, a wall-clock limit per notebook, the grader
made a child subreaper so that a detached process is killed with the rest, and only the grader
writes OUT, from what it read back (at most ``RESULT_CAP`` bytes) and checked. Several notebooks may
run at once (``--jobs``): see ``_LOCK``.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..base import phrases

__all__ = ["MODES", "isolation", "run_notebook", "children", "sweep", "subreaper", "interrupt", "resume"]

MODES = ("bwrap", "user", "none")
RUNNER = Path(__file__).with_name("_gradeone.py")
RESULT_CAP = 8 << 20            # bytes of a runner's result read back
OUTPUT_CAP = 32 << 20           # bytes of cell output the runner keeps (the rest is dropped)
WORK_BYTES = 2 << 30            # the sandbox's working tmpfs
LIMITS = {                      # every process of the notebook: rlimits set by the runner before the kernel starts
    "RLIMIT_NPROC": 512,        # processes of the learner's user id (torch's threads count: it starts dozens)
    "RLIMIT_AS": 16 << 30,      # address space of each process (torch on a CPU needs a few GiB)
    "RLIMIT_FSIZE": 1 << 30,    # the largest file it may write
    "RLIMIT_CORE": 0,
}
FREE_UIDS = range(990_000, 1_000_000)  # where a fresh user id is looked for
# Several notebooks run at once (``labkit grade --jobs``): a runner is started, and a finished one's processes are
# swept, under one lock, and the sweep spares the other runners' trees; a fresh user id is reserved until its
# runner has ended, so that two learners never share one (nor are killed together).
_LOCK = threading.Lock()
_RUNNING: set = set()     # the pids of the runners started and not yet ended
_RESERVED: set = set()    # the user ids given to those runners
_STOP = threading.Event()  # set by ``interrupt``: no runner starts any more
_PR_SET_CHILD_SUBREAPER = 36


def _bwrap_works() -> bool:
    path = shutil.which("bwrap")
    if not path:
        return False
    try:
        return subprocess.run([path, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                               "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _user_runs_python(uid: int) -> bool:
    """Whether a process under ``uid`` can start this Python (a root-only home folder holds some installs)."""
    try:
        return subprocess.run([sys.executable, "-c", "import nbclient"], capture_output=True, timeout=60,
                              preexec_fn=lambda: (os.setgroups([]), os.setgid(uid), os.setuid(uid)),
                              env=_clean_env(Path(tempfile.gettempdir())), cwd="/").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def isolation(force: str | None = None) -> tuple:
    """(mode, one line saying what it means here). ``force``: a mode of ``MODES`` (tests)."""
    root = hasattr(os, "getuid") and os.getuid() == 0
    if force is None:
        force = "bwrap" if _bwrap_works() else ("user" if root and _user_runs_python(fresh_uid()) else "none")
    if force not in MODES:
        raise ValueError(f"isolation={force!r}: one of {', '.join(MODES)}")
    return force, {
        "bwrap": "each notebook runs in a bubblewrap sandbox" + (" under a fresh user id" if root else ""),
        "user": "each notebook runs under a fresh user id (no bubblewrap: install it to hide other files too)",
        "none": ("no isolation: each notebook runs as you, in a process of its own, and can read and change your "
                 "files; install bubblewrap (apt-get install bubblewrap) or run the grader as root"),
    }[force]


def fresh_uid() -> int:
    """A user id with no account, no process and no other runner: the learner's code runs as nobody else."""
    used = set(_RESERVED)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                used.add(entry.stat().st_uid)
            except OSError:
                continue
    for uid in FREE_UIDS:
        if uid in used:
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise OSError(f"no free user id in {FREE_UIDS.start}..{FREE_UIDS.stop - 1} for a learner's notebook")


def _clean_env(home: Path) -> dict:
    """What the runner and the kernel see: no variable of the grader's, but where Python and the caches go."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
           "HOME": str(home), "TMPDIR": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "LABKIT_GRADING": "labkit", "LABKIT_DATA_DIR": str(home / ".labkit-data"),
           "JUPYTER_RUNTIME_DIR": str(home / ".jupyter-runtime"), "JUPYTER_PLATFORM_DIRS": "1",
           "IPYTHONDIR": str(home / ".ipython"), "MPLCONFIGDIR": str(home / ".matplotlib"),
           "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(_package_root())}
    for keep in ("LABKIT_MODE", "OMP_NUM_THREADS"):  # the instructor's choice of mode and threads
        if os.environ.get(keep):
            env[keep] = os.environ[keep]
    return env


def _package_root() -> Path:
    """The folder that holds labkit's package folder (a checkout's root, or site-packages)."""
    return Path(__file__).resolve().parent.parent.parent


def _bwrap_argv(copy: Path, uid) -> list:
    pkg = _package_root() / "labkit"
    ro = [Path(sys.base_prefix), Path(sys.prefix), pkg, Path(sys.executable).resolve().parent]
    # labkit reads its sentences from the course's pages (base/phrases.py): in a checkout they lie beside the
    # package, not in it -- those pages alone, never the notebooks folder (its solutions stay out of reach)
    ro += [page for page in (phrases.BESIDE / name for name in phrases.PAGES) if page.is_file()]
    argv = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session"]
    if uid is None:  # not root: an unprivileged user namespace (as root, the runner becomes a fresh uid instead)
        argv += ["--unshare-user"]
    for sysdir in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"):
        argv += ["--ro-bind-try", sysdir, sysdir]
    paths = list(dict.fromkeys(str(p) for p in ro))
    parents = {str(a) for p in paths for a in Path(p).parents if str(a) != "/"}
    for folder in sorted(parents, key=lambda a: a.count("/")):  # bwrap would make them 0700: the user could not pass
        argv += ["--perms", "0755", "--dir", folder]
    for path in paths:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm",
             "--perms", "1777", "--tmpfs", "/tmp", "--ro-bind", str(copy), "/submission",
             "--size", str(WORK_BYTES), "--tmpfs", "/grading", "--chdir", "/grading"]
    return argv


def subreaper(on: bool = True) -> bool:
    """Make this process the child subreaper (Linux): a learner's detached process is re-parented to it, not to
    init, so ``sweep`` finds and kills it. Returns whether it took."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children(pid: int, skip=()) -> list:
    """Every descendant of ``pid`` (from /proc), but ``skip`` and what lies under them."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in skip]
        out += kids
        frontier += kids
    return out


def children() -> list:
    """This process's descendants now (the grader's own, kept out of ``sweep``)."""
    return _children(os.getpid())


def sweep(keep=()) -> int:
    """Kill every descendant of this process but ``keep`` (and reap them); repeat until none is left. Returns how
    many were killed."""
    killed = 0
    for _ in range(50):
        found = _children(os.getpid(), set(keep))
        if not found:
            return killed
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.05)  # noqa: sleep-ok -- a killed process needs a moment to exit before it is reaped
        _reap(found)
    return killed


def interrupt(keep=()) -> None:
    """Stop grading: no runner starts from now on (until ``resume``), and every one running is killed."""
    with _LOCK:
        _STOP.set()
        sweep(keep)


def resume() -> None:
    """Let runners start again (a new grading run)."""
    _STOP.clear()


def _reap(pids) -> None:
    """Collect the exit of those of ``pids`` that are (or became, as orphans) this process's children."""
    for p in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p, os.WNOHANG)


def _kill_uid(uid: int) -> None:
    """Every process of ``uid``: a child that becomes it and sends SIGKILL to every process it may signal."""
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        # already collected, maybe: this child runs as ``uid``, so a _reap of uid's processes
        # (another grading thread) may have waited for it first
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def run_notebook(copy: Path, notebook: str, learner: str, mode: str, cell_timeout_s: float,
                 notebook_timeout_s: float, keep=(), cpus=None) -> dict:
    """Run ``copy/notebook`` (the grader's copy of the learner's folder) apart, as ``mode`` allows; ``cpus``: the
    CPUs its runner and kernel are pinned to (None: this process's). Safe to call from several threads at once.
    Returns {"stopped": why or "", "log": text or None, "hints": {...}} as the runner reported it (untrusted), or
    with "stopped" saying why no report came back."""
    root = os.getuid() == 0
    uid = None
    if root and mode in ("bwrap", "user"):
        with _LOCK:
            uid = fresh_uid()
            _RESERVED.add(uid)
    try:
        return _run(copy, notebook, learner, mode, cell_timeout_s, notebook_timeout_s, keep, cpus, uid)
    finally:
        with _LOCK:
            _RESERVED.discard(uid)


def _run(copy, notebook, learner, mode, cell_timeout_s, notebook_timeout_s, keep, cpus, uid) -> dict:
    folder = "/grading" if mode == "bwrap" else str(copy)
    home = Path(folder)
    spec = {"notebook": notebook, "learner": learner, "folder": folder,
            "src": "/submission" if mode == "bwrap" else None, "uid": uid, "gid": uid,
            "cell_timeout_s": cell_timeout_s, "output_cap": OUTPUT_CAP, "rlimits": LIMITS,
            "cpus": list(cpus) if cpus else None}
    with tempfile.TemporaryDirectory(prefix="labkit-grade-") as own:  # the grader's: never in the sandbox
        own = Path(own)
        spec_path = copy / ".labkit-grade-spec.json"  # in the sandbox: on the read-only copy, /submission
        spec_path.write_text(json.dumps(spec))
        inner_spec = "/submission/.labkit-grade-spec.json" if mode == "bwrap" else str(spec_path)
        argv = [sys.executable, str(RUNNER), inner_spec]
        if mode == "bwrap":
            argv = _bwrap_argv(copy, uid) + ["--"] + argv
        elif uid is not None:
            os.chmod(copy.parent, 0o711)
        result, err = own / "result.json", own / "stderr.txt"
        stopped = ""
        with result.open("wb") as out, err.open("wb") as errf:
            with _LOCK:  # no sweep runs while a runner starts (it would not yet be among the spared)
                if _STOP.is_set():
                    return {"stopped": "grading was interrupted", "log": None}
                # start_new_session: its own process group and session, the whole group killed afterwards (no
                # preexec_fn: not safe beside other threads; the runner sets its own limits, no core files included)
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=errf,
                                        env=_clean_env(home), cwd=str(copy), start_new_session=True, close_fds=True)
                _RUNNING.add(proc.pid)
            try:
                proc.wait(timeout=notebook_timeout_s)
            except subprocess.TimeoutExpired:
                stopped = f"timed out (the notebook ran past {notebook_timeout_s:g} s)"
            finally:
                _end(proc, uid, keep)
        with result.open("rb") as f:
            raw = f.read(RESULT_CAP + 1)
        if stopped:
            return {"stopped": stopped, "log": None}
        try:
            got = json.loads(raw.decode("utf-8")) if len(raw) <= RESULT_CAP else None
        except (UnicodeDecodeError, ValueError):
            got = None
        if not isinstance(got, dict):
            tail = err.read_bytes()[-300:].decode("utf-8", "replace").strip().splitlines()
            why = f" ({tail[-1]})" if tail else ""
            return {"stopped": f"the notebook's runner ended without a report{why}", "log": None}
        return got


def _end(proc, uid, keep) -> None:
    """The runner's whole process tree, whatever it did: its group, its user id's processes, its descendants."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    if uid is not None:
        _kill_uid(uid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with _LOCK:  # every descendant but the grader's own and the other runners' trees
        _RUNNING.discard(proc.pid)
        sweep(set(keep) | _RUNNING)
