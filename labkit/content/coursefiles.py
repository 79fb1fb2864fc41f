"""`labkit course [DIR]`: copy the chapters out of the package into a folder of the learner's own.

An installed labkit carries its course (``base/release.COURSE_FILES``: the chapters, their markdown, the
GPU reference measurements) under ``labkit/coursefiles/``; a checkout's are its own files. The copy is
flat -- ``DIR/00_start_here.ipynb`` ... beside ``DIR/data/`` and the Russian edition's ``DIR/ru/`` -- and ``DIR/.labkit-course.json`` records
the SHA-256 of every file as copied, which is how a later run tells a notebook the learner has changed
(it is kept, and the course's new copy is put beside it under another name) from one they have not
(it is updated). The chapters opened there keep their data and outputs there (``paths.course_root``).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..base import paths, release
from ..base.errors import ConfigError

DEFAULT_DIR = "labkit-course"
PACKAGED = Path(__file__).resolve().parents[1] / "coursefiles"  # where setup.py puts them in a wheel


def source_root() -> Path:
    """The folder the course files are read from: the checkout, else the installed package's copy."""
    checkout = paths.checkout_root()
    root = checkout if checkout is not None else PACKAGED
    if not (root / "notebooks").is_dir():
        raise FileNotFoundError(f"this labkit ({root.parent}) carries no course files: install it from a wheel "
                                "or a checkout (pip install .), not from a copy of the labkit/ folder alone")
    return root


def course_files(root: Path | None = None) -> dict:
    """{name in the learner's folder: file it is copied from}, in COURSE_FILES' order: notebooks/X lands
    as X, the data files keep their data/ path."""
    root = root or source_root()
    out = {}
    for pattern in release.COURSE_FILES:
        for f in sorted(root.glob(pattern)):
            rel = f.relative_to(root).as_posix()
            out[rel.removeprefix("notebooks/")] = f
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _side_name(dest: Path, name: str, sha: str) -> str:
    """Where the course's copy goes beside a notebook the learner changed: NAME.labkit-<version>.EXT
    (.1, .2 ... when that name holds something else)."""
    stem, dot, ext = name.rpartition(".")
    base = f"{stem}.labkit-{release.VERSION}"
    n, candidate = 0, f"{base}{dot}{ext}"
    while (dest / candidate).exists() and not _same(dest / candidate, sha):
        n += 1
        candidate = f"{base}.{n}{dot}{ext}"
    return candidate


def _same(path: Path, sha) -> bool:
    return sha is not None and path.is_file() and _sha(path) == sha


def _check_dest(dest: Path) -> None:
    """Refuse (ConfigError, one line) a DIR that is not a folder of the user's own: a file, a link to
    nothing, or a folder another user owns or can write in (a notebook planted there would open as
    "yours", and the chapters' data and outputs would land there)."""
    if dest.is_symlink() and not dest.exists():
        raise ConfigError("DIR", str(dest), f"a folder: it is a symbolic link to {os.readlink(dest)}, which does "
                                            "not exist; remove the link or choose another folder")
    if dest.exists() and not dest.is_dir():
        raise ConfigError("DIR", str(dest), "a folder (new or one `labkit course` made), not a file")
    if dest.exists():
        _check_own(dest)


def _check_own(folder: Path) -> None:
    problem = paths.foreign_folder(folder)
    if problem:
        mine = os.stat(folder).st_uid == os.getuid()  # then only its mode is wrong, and the owner can fix that
        todo = f"run chmod go-w {folder}, or choose" if mine else "choose"
        raise ConfigError("DIR", str(folder), f"a folder only you can write: {problem}, so another user could "
                                              f"plant files in it; {todo} a folder of your own (e.g. ~/{DEFAULT_DIR})")


def _read_record(mark: Path, notes: list) -> dict:
    """{name: SHA-256 as copied} from the course's record; a damaged one ({} and one note): every file
    that differs from the course then counts as the learner's and is kept."""
    if not os.path.lexists(mark):
        return {}
    if mark.is_symlink() or not mark.is_file():
        notes.append(f"{mark.name} is not a regular file (a link or a folder): not read, not replaced; "
                     "every file that differs from the course was kept as yours")
        return {}
    try:
        data = paths.read_json(mark, what="the course's record")
    except (OSError, ValueError) as e:
        reason = str(e)
    else:
        files = data.get("files") if isinstance(data, dict) else None
        if isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return files
        reason = f"the course's record {mark} is damaged: not an object whose \"files\" maps names to SHA-256s"
    notes.append(f"{reason}; every file that differs from the course was kept as yours")
    return {}


def _regular_or_missing(path: Path) -> bool:
    """True when ``path`` is absent or a regular file (not a link, a folder, a device): labkit may write it."""
    return not os.path.lexists(path) or (not path.is_symlink() and path.is_file())


def _side_copy(target: Path, name: str, blob: bytes, sha: str, report: dict) -> None:
    side = _side_name(target.parent, target.name, sha)
    paths.write_atomic(target.parent / side, blob)
    report["kept"].append((name, str(Path(name).parent / side) if "/" in name else side))


def copy_course(dest=DEFAULT_DIR) -> dict:
    """Copy the course into ``dest`` (made if missing; refused when another user owns it or can write in it).
    Returns {"dir", "copied", "updated", "unchanged", "kept": [(learner's file, where the course's copy
    went)], "notes": [one line each: what was found damaged or left alone]}. Never writes over a file whose
    content differs from what labkit last copied there, nor through a symbolic link."""
    dest = Path(dest).expanduser()
    _check_dest(dest)
    files = course_files()
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    _check_own(dest)  # again after mkdir: a folder another user made meanwhile is caught too
    mark = dest / paths.COURSE_MARK
    notes: list = []
    before = _read_record(mark, notes)
    report = {"dir": str(dest.resolve()), "copied": [], "updated": [], "unchanged": [], "kept": [], "notes": notes}
    record = {}
    for name, src in files.items():
        target, blob = dest / name, src.read_bytes()
        new_sha = hashlib.sha256(blob).hexdigest()
        _ready_folder(target.parent, dest)
        if not _regular_or_missing(target):  # a link (even to nothing) or a folder: never written through
            notes.append(f"left {name} alone: it is not a regular file (a symbolic link or a folder)")
            _side_copy(target, name, blob, new_sha, report)
            continue
        if not target.exists():
            report["copied"].append(name)
        elif _same(target, new_sha):
            report["unchanged"].append(name)
        elif _same(target, before.get(name)):
            report["updated"].append(name)  # the learner never touched it: the new version replaces it
        else:  # the learner's own work: keep it, and put the course's copy beside it
            _side_copy(target, name, blob, new_sha, report)
            record[name] = before.get(name, "")
            continue
        paths.write_atomic(target, blob)
        record[name] = new_sha
    if _regular_or_missing(mark):
        paths.write_json_atomic(mark, {"labkit": release.VERSION, "files": record})
    else:
        notes.append(f"the record {paths.COURSE_MARK} was not written (it is not a regular file): remove it, "
                     "then run labkit course again")
    return report


def _ready_folder(folder: Path, dest: Path) -> None:
    """A folder inside DIR the copy writes in (data/): made 0755, and refused like DIR when it is not the
    user's own (a link to another user's folder, say)."""
    if folder == dest:
        return
    if folder.is_symlink() and not folder.exists():
        raise ConfigError("DIR", str(folder), f"a folder: it is a symbolic link to {os.readlink(folder)}, which "
                                              "does not exist; remove the link")
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    _check_own(folder)


def describe(report: dict) -> str:
    """The report in a few lines: where, how many, which files were kept and where the new ones went."""
    lines = [f"labkit {release.VERSION}: the course is in {report['dir']}"]
    counts = [f"{len(report[k])} {k}" for k in ("copied", "updated", "unchanged") if report[k]]
    lines.append("  " + ", ".join(counts) if counts else "  nothing to copy")
    for mine, side in report["kept"]:
        lines.append(f"  kept {mine} (you changed it); the course's copy is {side}")
    lines += [f"  note: {n}" for n in report.get("notes", [])]
    lines.append(f"Open it: cd {os.path.relpath(report['dir'])} && jupyter lab 00_start_here.ipynb")
    if (Path(report["dir"]) / "ru" / "00_start_here.ipynb").is_file():
        lines.append(f"По-русски: cd {os.path.relpath(os.path.join(report['dir'], 'ru'))} && jupyter lab 00_start_here.ipynb")
    return "\n".join(lines)

