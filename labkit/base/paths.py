"""Where labkit keeps what it makes (corpus cache, measured peaks), and how it writes a file.

One list of cache places, with a fallback when the first cannot be written (a read-only checkout, a
read-only LABKIT_DATA_DIR); the last fallback is a per-user private folder in the temp directory, never
a fixed shared name another local user could create first and aim. Every file labkit writes goes
through ``write_atomic``: a temp file beside it, renamed onto it, so a full disk or a killed process
leaves the old file whole and no half-written one; ``read_json`` turns a damaged file into one line.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import sys
import tempfile
import time
from pathlib import Path

# A temp file of write_atomic: "<name>.<pid>-<hex>.tmp". The two older spellings are swept as well:
# device.py's "peak_flops.json.<pid>.tmp" and data.py's "stdlib-....tmp<pid>" / "....json.tmp<pid>".
_TEMP_NAMES = (re.compile(r"\.(\d+)-[0-9a-f]+\.tmp$"), re.compile(r"\.(\d+)\.tmp$"), re.compile(r"\.tmp(\d+)$"))
STALE_AFTER_S = 30.0  # a temp file this old whose process is gone is litter (younger: maybe another pid namespace)
_SWEPT: set = set()   # folders already swept by this process
# O_EXCL|O_NOFOLLOW: a name planted in the folder (a symlink to a victim) is never opened through
_NEW_FILE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_BINARY", 0))


# ---- private folders -----------------------------------------------------------------------------

def _user_tag() -> str:
    if hasattr(os, "getuid"):
        return str(os.getuid())
    import getpass  # deferred: only Windows (no uid) needs it; its temp folder is per user already
    return re.sub(r"[^A-Za-z0-9_.-]", "_", getpass.getuser()) or "user"


def private_root() -> Path:
    """``<tempdir>/labkit-<uid>``: the parent of every private_dir (not created here)."""
    return Path(tempfile.gettempdir()) / f"labkit-{_user_tag()}"


def _ensure_private(path: Path) -> None:
    """Create ``path`` with mode 0o700 if missing; refuse one that is not a real folder of ours."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)  # lstat: a planted symlink is seen as a symlink, never followed
    if stat.S_ISLNK(st.st_mode):
        raise OSError(f"{path} is a symbolic link, not a folder: labkit will not follow it (remove it)")
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} exists and is not a folder (remove it)")
    if os.name != "posix":
        return  # Windows: ACLs, not mode bits, guard the per-user temp folder
    if st.st_uid != os.getuid():
        raise OSError(f"{path} belongs to user id {st.st_uid}, not to you (uid {os.getuid()}): another user "
                      f"may have created it to aim labkit's writes; remove it or set LABKIT_DATA_DIR")
    if st.st_mode & 0o022:
        raise OSError(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): another user "
                      f"could plant files in it; run chmod 700 on it, remove it, or set LABKIT_DATA_DIR")


def foreign_folder(path) -> "str | None":
    """Why the existing folder ``path`` (links followed) is not safely the user's own -- another user owns
    it, or group/others can write in it, so anyone could plant a file there -- in words; None when it is
    ours (and on Windows, where ACLs, not mode bits, decide)."""
    if os.name != "posix":
        return None
    st = os.stat(path)
    if st.st_uid != os.getuid():
        return f"it belongs to user id {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"group or others can write in it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir(name: str) -> Path:
    """A per-user folder ``<tempdir>/labkit-<uid>/<name>``, created with mode 0o700.

    Raises OSError (one line) if it or its parent is a symlink, is owned by another user or is
    writable by group/others -- a shared temp folder is where another local user would plant those."""
    if not name or name in (".", "..") or "/" in name or os.sep in name or (os.altsep and os.altsep in name):
        raise ValueError(f"private_dir name {name!r}: a plain folder name (no path separators, not '.' or '..')")
    root = private_root()
    _ensure_private(root)
    _ensure_private(root / name)
    return root / name


# ---- writing and reading files -------------------------------------------------------------------

_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device", stat.S_IFIFO: "a pipe", stat.S_IFSOCK: "a socket"}  # what is not a file


def _failed(what: str, path: Path, err: OSError) -> OSError:
    """One line saying what failed and where; keeps the errno (ENOSPC, EROFS, ...) for callers."""
    out = OSError(f"could not {what} {path}: {err.strerror or err} (nothing was replaced)")
    out.errno = err.errno
    return out


def _existing_regular(path: Path):
    """The stat of ``path`` when it is a regular file, None when it does not exist; ValueError otherwise."""
    try:
        old = os.lstat(path)  # lstat: a symlink is refused as a symlink, never followed
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _failed("inspect", path, e) from None
    if not stat.S_ISREG(old.st_mode):
        kind = _KINDS.get(stat.S_IFMT(old.st_mode), "not a regular file")
        raise ValueError(f"{path} exists and is {kind}: labkit writes only regular files and "
                         f"will not replace it; choose a file name")
    return old


def _temp_beside(path: Path) -> Path:
    """A fresh temp name in the same folder (same file system, so os.replace is atomic); its pid lets
    sweep_stale_temps tell a dead process's litter from a live write."""
    return path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:  # os.write may write less than asked (a nearly full disk): keep going until it raises
        view = view[os.write(fd, view):]
    os.fsync(fd)


def write_atomic(path, data) -> Path:
    """Write ``data`` (str as UTF-8, or bytes) to ``path``: a temp file in the same folder, fsync, rename.

    Refuses (ValueError) a ``path`` that exists and is not a regular file -- a folder, a device such as
    /dev/full, a symlink -- rather than replace it. On any failure the temp file is removed, the old
    file is untouched, and an OSError says in one line what failed and where."""
    path = Path(path)
    blob = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    old = _existing_regular(path)
    tmp = _temp_beside(path)
    try:
        fd = os.open(tmp, _NEW_FILE, 0o666)
    except OSError as e:
        raise _failed("create a temporary file to write", path, e) from None
    try:
        try:
            if old is not None and hasattr(os, "fchmod"):
                os.fchmod(fd, stat.S_IMODE(old.st_mode))  # a replaced file keeps its permissions
            _write_all(fd, blob)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # atomic: a reader sees the old file or the new one, never half of one
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a KeyboardInterrupt mid-write leaves no litter either
        if isinstance(e, OSError):
            raise _failed("write", path, e) from None
        raise
    return path


def check_writable(path) -> Path:
    """Before any work: refuse (ValueError, one line) a ``path`` that ``write_atomic`` would refuse, and
    raise OSError (one line) when its folder cannot take a new file -- missing, read-only, not ours.
    Creates and removes one empty temp file: a real probe, not os.access (which root always passes)."""
    path = Path(path)
    _existing_regular(path)
    tmp = _temp_beside(path)
    try:
        os.close(os.open(tmp, _NEW_FILE, 0o600))
    except OSError as e:
        raise _failed("create a file in the folder of", path, e) from None
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return path


def write_json_atomic(path, obj, sort_keys=False) -> Path:
    return write_atomic(path, json.dumps(obj, indent=1, sort_keys=sort_keys) + "\n")


def read_json(path, what: str = "file"):
    """The parsed JSON in ``path``; ValueError "<what> <path> is damaged: ..." (one line) for invalid
    JSON, nesting too deep to read, or bytes that are not UTF-8. A missing file raises OSError as usual."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        reason = f"not UTF-8 text (byte {e.start})"
    except json.JSONDecodeError as e:
        reason = f"not valid JSON ({e.msg}, line {e.lineno} column {e.colno})"
    except RecursionError:
        reason = "nested too deeply to read"
    except ValueError as e:  # e.g. an integer too long to convert
        reason = str(e).splitlines()[0]
    raise ValueError(f"{what} {path} is damaged: {reason}")


# ---- litter from processes that died mid-write ---------------------------------------------------

def _alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # os.kill(pid, 0) would terminate it on Windows: there, leave the file alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, another user's
    return True


def temp_owner(name: str):
    """The pid in a temp file name labkit writes (any of its spellings), or None for other names."""
    return next((int(m.group(1)) for pattern in _TEMP_NAMES if (m := pattern.search(name))), None)


def sweep_stale_temps(folder) -> list:
    """Remove temp files left in ``folder`` by labkit processes that are gone (killed mid-write, or from
    older versions that did not clean up). Returns the names removed; never raises."""
    removed, now = [], time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        pid = temp_owner(entry.name)
        if pid is None or pid == os.getpid():
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) or now - st.st_mtime < STALE_AFTER_S or _alive(pid):
                continue
            os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:
            continue
    return removed


# ---- where the course lives: a checkout, or a folder `labkit course` made -------------------------

COURSE_MARK = ".labkit-course.json"  # written by `labkit course DIR` (content/pages): what it copied


def checkout_root():
    """The repository labkit runs from (this file's ``../..`` holding pyproject.toml and notebooks/), or
    None for an installed labkit: the folder above an installed package is site-packages, and nothing
    is ever written there."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


def course_root(cwd=None):
    """The folder a chapter's data and outputs go in, found from where it is opened (``cwd``): the
    checkout when opened in its notebooks/ (or notebooks/ru/, the Russian edition), a folder made by `labkit
    course` (it holds COURSE_MARK) when opened there or in its ru/; None anywhere else (Colab's /content, a
    script's folder)."""
    here = Path(cwd or os.getcwd()).resolve()
    checkout = checkout_root()
    if checkout is not None and here in (checkout / "notebooks", checkout / "notebooks" / "ru"):
        return checkout
    found = next((d for d in (here, here.parent) if (d / COURSE_MARK).is_file()), None)
    return found if found is None or _own_course(found) else None


_WARNED_COURSES: set = set()


def _own_course(folder: Path) -> bool:
    """Whether a course folder is the user's own: one another user owns or can write in is not used for
    data and outputs (anyone could plant files there), and that is said once, in one line."""
    try:
        problem = foreign_folder(folder)
    except OSError as e:
        problem = f"it cannot be inspected ({e.strerror or e})"
    if problem and folder not in _WARNED_COURSES:
        _WARNED_COURSES.add(folder)
        print(f"[labkit] not using {folder} for data and outputs: {problem}; copy the course into a folder "
              f"of your own (labkit course DIR)", file=sys.stderr)
    return problem is None


# ---- where a chapter's files go: Colab and Kaggle show only their own folders --------------------------

# Colab's file pane shows /content; a saved Kaggle version keeps /kaggle/working (its "Output"). A private
# temp folder would be invisible on both, so there a chapter's traces and snapshots go here instead.
HOSTED_OUT = {"colab": Path("/content/labkit-out"), "kaggle": Path("/kaggle/working/labkit-out")}


def hosted_platform(environ=None):
    """"kaggle" or "colab" when labkit runs there, told apart as the chapters' set-up cell does: Kaggle sets
    KAGGLE_KERNEL_RUN_TYPE in every notebook's environment, Colab's own package ``google.colab`` is
    importable; None anywhere else."""
    env = os.environ if environ is None else environ
    if env.get("KAGGLE_KERNEL_RUN_TYPE"):  # first: Kaggle's image is built from Colab's
        return "kaggle"
    if env.get("COLAB_RELEASE_TAG") or sys.modules.get("google.colab") is not None:
        return "colab"
    import importlib.util  # deferred: only asked here
    try:
        colab = importlib.util.find_spec("google") is not None and importlib.util.find_spec("google.colab") is not None
    except (ImportError, ValueError):  # a "google" that is not a package, or a half-imported one
        colab = False
    return "colab" if colab else None


def out_dir(cwd=None, environ=None) -> Path:
    """Where chapters write files a learner opens elsewhere (profiler traces, memory snapshots), created:
    on Colab ``/content/labkit-out``, on Kaggle ``/kaggle/working/labkit-out`` (``HOSTED_OUT``; used when
    the platform's own folder exists); else out/ of the course the notebook was opened in (the
    repository's, or the folder `labkit course` made); else this user's private temp folder
    (``private_dir("out")``: mode 0o700, refused when another user owns it or could write to it)."""
    hosted = HOSTED_OUT.get(hosted_platform(environ))
    if hosted is not None and hosted.parent.is_dir():
        hosted.mkdir(exist_ok=True)
        return hosted
    course = course_root(cwd)
    if course is None:
        # never a fixed shared name under the temp dir: another local user could create it first and plant links
        return private_dir("out")
    d = course / "out"
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---- the cache folders ---------------------------------------------------------------------------

def cache_dirs() -> list:
    """Candidate cache folders, best first: $LABKIT_DATA_DIR, else the repository's data/cache (when
    data/ is writable), else the data/cache of the course folder the chapter was opened in; then
    ~/.cache/labkit and a private per-user temp folder as fallbacks."""
    env = os.environ.get("LABKIT_DATA_DIR")
    checkout, course = checkout_root(), course_root()
    repo_data = checkout / "data" if checkout is not None else None
    if env:
        first = Path(env)
    elif repo_data is not None and repo_data.is_dir() and os.access(repo_data, os.W_OK):
        first = repo_data / "cache"
    elif course is not None and os.access(course, os.W_OK):
        first = course / "data" / "cache"
    else:
        first = Path.home() / ".cache" / "labkit"
    more = [Path.home() / ".cache" / "labkit", private_root() / "cache"]
    return [first] + [d for d in more if d != first]


def is_private_fallback(path) -> bool:
    return Path(path) == private_root() / "cache"


def dir_problem(path: Path):
    """Make ``path`` ready to write cache files in -- created (privately, for the temp fallback), checked,
    and swept of dead processes' temp files the first time this process uses it. Returns None when it
    can be written, else one phrase saying why not."""
    try:
        if is_private_fallback(path):
            private_dir("cache")  # refuses a planted, shared or symlinked folder
        else:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    if not os.access(path, os.W_OK):
        return "PermissionError: not writable"
    if path not in _SWEPT:
        _SWEPT.add(path)
        sweep_stale_temps(path)
    return None


def usable_dir(path: Path) -> bool:
    return dir_problem(path) is None


def cache_dir() -> Path:
    """The first of ``cache_dirs()`` that can be written (the last one when none can)."""
    dirs = cache_dirs()
    return next((d for d in dirs if usable_dir(d)), dirs[-1])
