"""Where labkit keeps what it makes (corpus cache, measured peaks): one place, with a fallback when the
first choice cannot be written (a read-only checkout, a read-only LABKIT_DATA_DIR)."""
from __future__ import annotations

import os
from pathlib import Path


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def cache_dir() -> Path:
    """$LABKIT_DATA_DIR, else the repository's data/cache, else ~/.cache/labkit, else the temp folder:
    the first of them that can be written."""
    repo = Path(__file__).resolve().parent.parent / "data"
    candidates = []
    if os.environ.get("LABKIT_DATA_DIR"):
        candidates.append(Path(os.environ["LABKIT_DATA_DIR"]))
    if repo.is_dir():
        candidates.append(repo / "cache")
    candidates += [Path.home() / ".cache" / "labkit", Path(os.environ.get("TMPDIR", "/tmp")) / "labkit-cache"]
    for c in candidates:
        if _writable(c):
            return c
    return candidates[-1]
