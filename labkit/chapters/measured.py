"""The learner's measurement file, ``labkit-measurements.json``, and whether a grader is running the notebook.

Five exercises (``labkit.instructor.grading.MEASURED``) judge the learner's own measurements: runs on their device,
the profiler table their chapter printed. A grader (nbgrader's autograde, otter, a Gradescope container)
clears the outputs and runs every cell again on its own CPU, which would judge other numbers. So, outside
grading, those checks save what they judged in this file, beside the notebook (the folder a learner submits);
while grading, the checks and the measured cells that feed them read it instead of measuring.

The file is JSON only (never pickle: loading it runs no code). Each entry carries a sha256 over its own
canonical JSON: that finds an accidental or naive edit only, not a recomputed hash -- the checkers' seal's
limit, said in the instructor kit (notebooks/README.md).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import torch

from ..base.runtime import ConfigError
from ..base.paths import write_atomic
from ..base.release import VERSION
from ..engine.device import _cpu_name, capabilities

FILE = "labkit-measurements.json"
FORMAT = 1  # the file's layout: {"format": 1, "entries": {checker: entry}}


def grading_tool() -> str | None:
    """Which grader runs this kernel, or None: "nbgrader" while ``nbgrader autograde`` runs it (nbgrader sets
    ``NBGRADER_EXECUTION=autograde`` in the kernel), "otter" once otter's grading preprocessor has called
    ``otter.Notebook.init_grading_mode`` (``Notebook._grading_mode``), "labkit" with ``LABKIT_GRADING`` set
    non-empty (the switch any grader script can set)."""
    if os.environ.get("NBGRADER_EXECUTION", "") == "autograde":
        return "nbgrader"
    otter = sys.modules.get("otter.check.notebook")
    if otter is not None and getattr(getattr(otter, "Notebook", None), "_grading_mode", False) is True:
        return "otter"
    if os.environ.get("LABKIT_GRADING", "").strip():
        return "labkit"
    return None


def not_saving() -> str | None:
    """Why nothing may be saved in this kernel, or None: a grader runs it (the saved entry is what it judges),
    or nbgrader's Validate does (``NBGRADER_EXECUTION=validate``: it re-runs the notebook in the learner's folder
    on the grader's terms, and must not overwrite the learner's measurements)."""
    tool = grading_tool()
    if tool is not None:
        return f"a grader ({tool}) runs this notebook"
    if os.environ.get("NBGRADER_EXECUTION", "") == "validate":
        return "nbgrader validate"
    return None


def path(folder=None) -> Path:
    """The file in ``folder``: the notebook's working directory by default (where a kernel starts)."""
    return Path(folder if folder is not None else os.getcwd()) / FILE


def plain(data):
    """``data`` as JSON gives it back (tuples as lists, keys as strings): what is judged is what is saved."""
    return json.loads(json.dumps(data, default=_jsonable))


def _jsonable(value):
    item = getattr(value, "item", None)  # a numpy or torch scalar
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def digest(entry: dict) -> str:
    """sha256 over the entry's canonical JSON (sorted keys, no spaces), its own ``sha256`` left out."""
    body = {k: v for k, v in entry.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def fingerprint() -> dict:
    """What the measurements ran on: the device, its CPU (and GPU) model, torch's and labkit's versions."""
    caps = capabilities("auto")
    return {"kind": caps.kind, "device": caps.name, "cpu": _cpu_name(),
            "gpu": caps.name if caps.kind == "cuda" else None, "torch": torch.__version__, "labkit": VERSION,
            "python": platform.python_version()}


def read(folder=None) -> dict:
    """The file's entries ({checker: entry}); {} when there is no file. A file that is not the measurement
    file's JSON is an error naming it (ConfigError), never loaded any other way."""
    p = path(folder)
    if not p.is_file():
        return {}
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(str(p), f"unreadable JSON ({e})", "the JSON labkit's checks save") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
        raise ConfigError(str(p), "no 'entries' object", f'{{"format": {FORMAT}, "entries": {{...}}}}')
    return doc["entries"]


def write(checker: str, chapter: str, data, folder=None) -> dict:
    """Save one checker's entry, merged with the others (written atomically). Returns the entry. Refused
    (ConfigError) while ``not_saving()`` says why: a grader judges the file, it never takes a new entry."""
    why = not_saving()
    if why is not None:
        raise ConfigError(FILE, f"a new {checker} entry",
                          f"nothing is saved while {why}: the learner's own run of the check saves it")
    entry = {"checker": checker, "chapter": chapter, "measured_on": fingerprint(),
             "saved_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "data": plain(data)}
    entry["sha256"] = digest(entry)
    try:
        entries = read(folder)
    except ConfigError:
        entries = {}  # a broken file is replaced by one that holds this entry
    entries[checker] = entry
    # keys in the order judged (the seal sorts its own copy): a reloaded entry reads, and is judged, the same
    write_atomic(path(folder), json.dumps({"format": FORMAT, "entries": entries}, indent=1) + "\n")
    return entry


def saved(checker: str, folder=None):
    """While grading, the data the learner's check of ``checker`` saved (as JSON gives it), for a measured cell
    to use instead of measuring; None outside grading, or when there is no such entry. The check itself says
    why an entry is missing or edited: a cell only needs to know whether to measure."""
    if grading_tool() is None:
        return None
    try:
        entry = read(folder).get(checker)
    except ConfigError:
        return None
    return entry.get("data") if isinstance(entry, dict) and entry.get("sha256") == digest(entry) else None
