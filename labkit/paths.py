"""Where labkit keeps what it makes (corpus cache, measured peaks): one list of places, with a fallback
when the first cannot be written (a read-only checkout, a read-only LABKIT_DATA_DIR)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dirs() -> list:
    """Candidate cache folders, best first: $LABKIT_DATA_DIR, else the repository's data/cache (when
    data/ is writable); then ~/.cache/labkit and the temp folder as fallbacks."""
    env = os.environ.get("LABKIT_DATA_DIR")
    repo_data = Path(__file__).resolve().parent.parent / "data"
    if env:
        first = Path(env)
    elif repo_data.is_dir() and os.access(repo_data, os.W_OK):
        first = repo_data / "cache"
    else:
        first = Path.home() / ".cache" / "labkit"
    more = [Path.home() / ".cache" / "labkit", Path(tempfile.gettempdir()) / "labkit-cache"]
    return [first] + [d for d in more if d != first]


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def cache_dir() -> Path:
    """The first of ``cache_dirs()`` that can be written (the last one when none can)."""
    dirs = cache_dirs()
    return next((d for d in dirs if _writable(d)), dirs[-1])
