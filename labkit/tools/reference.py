"""Reference measurements from real GPUs, shipped in ``data/reference/*.json``.

File format (schema 1)::

    {"schema": 1,
     "provenance": {"gpu": ..., "driver": ..., "cuda": ..., "torch_version": ..., "python": ...,
                    "date": ..., "git_commit": ..., "command": ..., "corpus_sha": ...},
     "points": [{"id": "precision/bf16", "section": "precision", "label": "bf16",
                 "command": "python -m labkit run ...", "status": "ok" | "oom" | "error" | "timeout",
                 "error": null, "summary": {... the run's Result.summary ...}}]}

Everything here works when no file exists: ``load_all()`` then returns an empty list.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..base import paths

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "data" / "reference"  # the checkout's (see reference_dir)
PACKAGED_DIR = Path(__file__).resolve().parents[1] / "coursefiles" / "data" / "reference"  # an installed wheel's
MATCH_KEYS = ("model", "precision", "micro_batch", "seq_len", "accum", "checkpointing", "checkpoint_every",
              "workers", "world_size", "ddp_sync", "data_cost_ms", "compile")
REQUIRED_PROVENANCE = ("gpu", "torch_version", "date", "command", "git_commit", "corpus_sha")


def reference_dir() -> Path:
    """data/reference of the course the chapter was opened in (a checkout, or a folder `labkit course`
    made, which gets a copy of the shipped files), else the checkout's, else the wheel's own copy."""
    course = paths.course_root()
    if course is not None:
        return course / "data" / "reference"
    return REFERENCE_DIR if paths.checkout_root() is not None else PACKAGED_DIR


def load_all(directory=None) -> list:
    """Every reference file as a dict (with ``"file"`` added), newest first; [] when there are none."""
    d = Path(directory) if directory else reference_dir()
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("schema") == 1 and isinstance(data.get("points"), list):
            data["file"] = f.name
            out.append(data)
    return sorted(out, key=lambda r: r.get("provenance", {}).get("date", ""), reverse=True)


def points(directory=None, section=None) -> list:
    """Flattened points with their provenance attached, optionally one section only."""
    return [{**p, "provenance": ref.get("provenance", {})} for ref in load_all(directory)
            for p in ref["points"] if section is None or p.get("section") == section]


def match(query: dict, directory=None, keys=MATCH_KEYS) -> list:
    """Points whose summary agrees with ``query`` (a summary or config dict) on the ``keys`` it has."""
    wanted = {k: query[k] for k in keys if k in query}
    return [p for p in points(directory) if p.get("status") == "ok"
            and all(p.get("summary", {}).get(k) == v for k, v in wanted.items())]


def label(point: dict) -> str:
    """'NVIDIA H200, torch 2.11.0, 2026-12-01' -- what a chart legend should say."""
    pv = point.get("provenance", {})
    return f"{pv.get('gpu', '?')}, torch {pv.get('torch_version', '?')}, {str(pv.get('date', '?'))[:10]}"


def validate(data: dict) -> list:
    """Problems with a reference file's structure ([] when it is fine)."""
    problems = []
    if data.get("schema") != 1:
        problems.append("schema must be 1")
    pv = data.get("provenance")
    if not isinstance(pv, dict):
        problems.append("provenance missing")
    else:
        problems += [f"provenance.{k} missing" for k in REQUIRED_PROVENANCE if not pv.get(k)]
    pts = data.get("points")
    if not isinstance(pts, list) or not pts:
        problems.append("points must be a non-empty list")
        return problems
    for i, p in enumerate(pts):
        problems += [f"points[{i}].{k} missing" for k in ("id", "section", "command", "status")
                     if k not in p]
        if p.get("status") == "ok" and not isinstance(p.get("summary"), dict):
            problems.append(f"points[{i}].summary missing for an ok point")
    return problems
