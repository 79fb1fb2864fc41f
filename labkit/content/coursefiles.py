"""`labkit course [DIR]`: copy the chapters out of the package into a folder of the learner's own.

An installed labkit carries its course (``base/release.COURSE_FILES``: the chapters, their markdown, the
GPU reference measurements) under ``labkit/coursefiles/``; a checkout's are its own files. The copy is
flat -- ``DIR/00_start_here.ipynb`` ... beside ``DIR/data/`` -- and ``DIR/.labkit-course.json`` records
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

__all__ = ["source_root", "course_files", "copy_course", "describe"]

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


def copy_course(dest=DEFAULT_DIR) -> dict:
    """Copy the course into ``dest`` (made if missing). Returns {"dir", "copied", "updated", "unchanged",
    "kept": [(learner's file, where the course's copy went)]}. Never writes over a file whose content
    differs from what labkit last copied there."""
    dest = Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise ConfigError("DIR", str(dest), "a folder (new or one `labkit course` made), not a file")
    files = course_files()
    dest.mkdir(parents=True, exist_ok=True)
    mark = dest / paths.COURSE_MARK
    try:
        before = json.loads(mark.read_text()).get("files", {}) if mark.is_file() else {}
    except (OSError, ValueError):
        before = {}  # a damaged record: every differing file counts as the learner's
    report = {"dir": str(dest.resolve()), "copied": [], "updated": [], "unchanged": [], "kept": []}
    record = {}
    for name, src in files.items():
        target, blob = dest / name, src.read_bytes()
        new_sha = hashlib.sha256(blob).hexdigest()
        if not target.exists():
            report["copied"].append(name)
        elif _same(target, new_sha):
            report["unchanged"].append(name)
        elif _same(target, before.get(name)):
            report["updated"].append(name)  # the learner never touched it: the new version replaces it
        else:  # the learner's own work: keep it, and put the course's copy beside it
            side = _side_name(target.parent, target.name, new_sha)
            paths.write_atomic(target.parent / side, blob)
            report["kept"].append((name, str(Path(name).parent / side) if "/" in name else side))
            record[name] = before.get(name, "")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(target, blob)
        record[name] = new_sha
    paths.write_json_atomic(mark, {"labkit": release.VERSION, "files": record})
    return report


def describe(report: dict) -> str:
    """The report in a few lines: where, how many, which files were kept and where the new ones went."""
    lines = [f"labkit {release.VERSION}: the course is in {report['dir']}"]
    counts = [f"{len(report[k])} {k}" for k in ("copied", "updated", "unchanged") if report[k]]
    lines.append("  " + ", ".join(counts) if counts else "  nothing to copy")
    for mine, side in report["kept"]:
        lines.append(f"  kept {mine} (you changed it); the course's copy is {side}")
    lines.append(f"Open it: cd {os.path.relpath(report['dir'])} && jupyter lab 00_start_here.ipynb")
    return "\n".join(lines)

