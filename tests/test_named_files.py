"""A module or a test file the project's text names by its path exists: a merge that removes a file (a check
module folded into another, a test file merged) leaves no pointer to it behind -- in a docstring, a README,
a solution's note for instructors."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMED = re.compile(r"\b(?:labkit/[a-z_]+(?:/[a-z0-9_]+)*|tests/test_[a-z0-9_]+)\.py\b")
# files that name paths of another tree on purpose (a fixture of a made-up revision)
OTHER_TREES = {"tests/test_lost_sentences.py"}


def _tracked() -> list:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if f not in OTHER_TREES]


def test_every_path_named_in_the_checkout_exists():
    missing = []
    for name in _tracked():
        path = ROOT / name
        if not path.is_file() or path.suffix not in (".py", ".md", ".ipynb", ".po", ".txt", ".cfg", ".toml", ""):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        missing += [f"{name}: {m}" for m in sorted(set(NAMED.findall(text))) if not (ROOT / m).exists()]
    assert not missing, "\n".join(missing)
