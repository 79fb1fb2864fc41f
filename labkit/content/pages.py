"""The course's own files as labkit reads and copies them: the chapters' cells (source, tags, headings, and the labkit
functions a cell shows with ``lk.course.show(lk.a.b.c)``: ``shown``, ``resolve``), read by the bank's link check,
the cheat sheet, the graded builds and tests/test_show_the_code.py; the templates of the quiz and the instructor kit
(``templates/*.md``: ``sections``, ``section``, ``items``); and where the course files are and ``labkit course
[DIR]``, which copies the chapters out of the package into a folder of the learner's own (``copy_course``).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import json
import os
import re
from pathlib import Path

from ..base import paths, release
from ..base.runtime import ConfigError
from ..base.page import anchor  # noqa: F401 -- pages.anchor, as the cheat sheet and the bank call it

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CODE_TAG = "code-"          # a "the code" cell: tag code-<chapter>-<what>, e.g. code-03-accumulation-loop


LANGUAGES = ("en", "ru")  # the course's editions: English in notebooks/, Russian in notebooks/ru/ (issue #51)


def chapters(lang: str = "en") -> list:
    """The chapters' notebooks of one edition (the Russian: those built so far)."""
    if lang not in LANGUAGES:
        raise ConfigError("lang", lang, "one of " + ", ".join(LANGUAGES))
    return sorted((NOTEBOOKS if lang == "en" else NOTEBOOKS / lang).glob("[0-9][0-9]_*.ipynb"))


def cells(nb: Path) -> list:
    return json.loads(Path(nb).read_text())["cells"]


def source(cell) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def tags(cell) -> list:
    return list(cell.get("metadata", {}).get("tags", []))


@functools.lru_cache(maxsize=1)
def aliases() -> dict:
    """The names the chapters import labkit's packages under (``from labkit.chapters import ch11_longrun as lr``
    -> {"lr": "labkit.chapters.ch11_longrun"}; ``from labkit.chapters.ch12_compose import moe`` -> {"moe": ...}),
    read from their code cells."""
    found = {}
    for nb in chapters():
        for c in cells(nb):
            if c["cell_type"] != "code":
                continue
            try:
                tree = ast.parse(source(c))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
                    found.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
                elif isinstance(node, ast.Import):
                    found.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("labkit")})
    return found


def resolve(dotted: str):
    """``lk.engine.step.micro_steps`` (or a chapter's alias, ``lr.state.save_checkpoint``) -> the function
    (submodules imported as needed)."""
    parts = dotted.split(".")
    if parts[0] not in ("lk", "labkit") and parts[0] in aliases():
        parts = aliases()[parts[0]].split(".") + parts[1:]
    if parts[0] not in ("lk", "labkit"):
        raise ValueError(f"lk.course.show takes lk.-dotted names (where the code lives), not {dotted!r}")
    obj, path = importlib.import_module("labkit"), "labkit"
    for p in parts[1:]:
        path += "." + p
        try:
            obj = getattr(obj, p)
        except AttributeError:
            obj = importlib.import_module(path)
    return obj


def shown(src: str) -> list:
    """The dotted names a cell passes to ``lk.course.show(...)``."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("lk.course.show", "course.show"):
            names += [ast.unparse(a) for a in node.args]
    return names


# A link's fragment JupyterLab (>= 4.0) scrolls to: #cell-id=c05, the cell of that id. It does not scroll to a
# Cyrillic heading's anchor (it compares the percent-encoded fragment with the id, jupyterlab#12402), nor to any
# heading of a notebook the link has just opened: the Russian build's and the quiz's section links use this.
CELL_ID = "cell-id="
HEADING = re.compile(r"^#+ (.+)$", re.M)


def heading_cells(nb_cells: list) -> dict:
    """{JupyterLab's anchor of a heading: the id of the markdown cell that holds it} (the first such cell)."""
    out = {}
    for c in nb_cells:
        if c["cell_type"] == "markdown":
            for m in HEADING.finditer(source(c)):
                out.setdefault(anchor(m.group(1)), c["id"])
    return out


def heading_cell(nb_cells: list, index: int) -> dict:
    """The markdown cell holding the nearest heading above cell ``index`` (``heading_before``'s)."""
    return next(c for c in reversed(nb_cells[:index]) if c["cell_type"] == "markdown"
                and any(ln.startswith("#") for ln in source(c).splitlines()))


def heading_before(nb_cells: list, index: int) -> str:
    """The nearest markdown heading above cell ``index`` (its text, without the #s)."""
    for c in reversed(nb_cells[:index]):
        if c["cell_type"] == "markdown":
            for ln in reversed(source(c).splitlines()):
                if ln.startswith("#"):
                    return ln.lstrip("#").strip()
    return ""


# ---- the templates ----------------------------------------------------------------------------------------
# Words live where they are read (issue #47): a document's text in a document, not in Python strings. A template is
# a markdown file whose ``## name`` sections each hold one piece: the lines of the first fenced block under the
# heading (```` ``` ```` or ``~~~``, closed by the same fence; exactly those lines, no newline after the last), or,
# with no fence, the section's text without the blank lines around it. Placeholders are ``str.format``'s. The
# folder ships in the wheel (pyproject.toml's package-data).
TEMPLATES = Path(__file__).resolve().parent / "templates"
_SECTION = re.compile(r"^## (?P<name>\S.*?)\s*$")
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})")


@functools.lru_cache(maxsize=None)
def sections(name: str) -> dict:
    """{section name: its text} of templates/NAME."""
    out, current, body = {}, None, []
    for line in (TEMPLATES / name).read_text(encoding="utf-8").split("\n") + ["## "]:
        m = _SECTION.match(line) if not (body and _open_fence(body)) else None
        if m or line == "## ":
            if current is not None:
                out[current] = _piece(body)
            current, body = (m.group("name") if m else None), []
        elif current is not None:
            body.append(line)
    return out


def _open_fence(body: list) -> bool:
    """Whether ``body`` ends inside a fenced block (a heading there is the template's text, not a section)."""
    fence = None
    for line in body:
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group("fence")
        elif fence is not None and line.rstrip() == fence:
            fence = None
    return fence is not None


def _piece(body: list) -> str:
    start = next((i for i, ln in enumerate(body) if _FENCE.match(ln)), None)
    if start is None:
        return "\n".join(body).strip("\n")
    fence = _FENCE.match(body[start]).group("fence")
    end = next(i for i in range(start + 1, len(body)) if body[i].rstrip() == fence)
    return "\n".join(body[start + 1:end])


def section(name: str, key: str) -> str:
    return sections(name)[key]


def items(name: str, key: str) -> dict:
    """A section of ``- key: text`` lines as {key: text}, in order."""
    pairs = (line[2:].split(": ", 1) for line in section(name, key).splitlines() if line.startswith("- "))
    return {k.strip(): v.strip() for k, v in pairs}


# ---- the course files and `labkit course [DIR]` -------------------------------------------------------------
# An installed labkit carries its course (``base/release.COURSE_FILES``: the chapters, their markdown, the GPU
# reference measurements) under ``labkit/coursefiles/``; a checkout's are its own files. The copy is flat --
# ``DIR/00_start_here.ipynb`` ... beside ``DIR/data/`` and the Russian edition's ``DIR/ru/`` -- and
# ``DIR/.labkit-course.json`` records the SHA-256 of every file as copied, which is how a later run tells a
# notebook the learner has changed (it is kept, and the course's new copy is put beside it under another name)
# from one they have not (it is updated). The chapters opened there keep their data and outputs there
# (``paths.course_root``).
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

