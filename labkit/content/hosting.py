"""The course on a free GPU: the set-up cell that opens every chapter, and the "Open in Colab" /
"Open in Kaggle" badges of the course maps -- all built from one setting, ``base/release`` (the
repository and the release tag).

    python -m labkit.content.hosting --write   # fill them in: every notebook's first cell, README.md's
                                               # and notebooks/README.md's course maps
    python -m labkit.content.hosting --check   # exit 1 when one is out of step (tests/test_hosting.py)

The set-up cell is plain Python (labkit may not be importable yet). Where labkit is importable it only
says the version and the device. Where it is not: in Colab (``google.colab`` importable) or Kaggle
(``KAGGLE_KERNEL_RUN_TYPE`` set) it installs labkit from ``release.SOURCE`` with ``--no-deps`` -- the
platform's CUDA build of torch is never replaced -- and then only the packages the platform lacks;
anywhere else it installs nothing and prints the two commands to run. ``LABKIT_SOURCE`` in the
environment points it at another source (a wheel file: how the tests install it).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ..base import paths, release
from . import pages

__all__ = ["SETUP_ID", "setup_cell_source", "colab_url", "kaggle_url", "badges", "notebooks", "expected", "write",
           "stale"]

SETUP_ID = "labkit-setup"   # the set-up cell's id in every notebook
NEEDS = ("numpy", "matplotlib", "ipywidgets", "psutil")  # what labkit imports besides torch (and IPython)
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"
MAP_START, MAP_END = "<!-- course-map: written by python -m labkit.content.hosting --write -->", "<!-- /course-map -->"

_CELL = '''\
# @title Set-up: labkit's version and your device (in Colab or Kaggle it installs labkit first)
# The same first cell in every chapter. In Colab or Kaggle it installs labkit and only what the platform
# lacks, never over the platform's CUDA build of torch; anywhere else it installs nothing.
import importlib.util, os, subprocess, sys
_have = importlib.util.find_spec
_source = os.environ.get("LABKIT_SOURCE") or "{source}"
_hosted = os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or (_have("google") and _have("google.colab"))
if _have("labkit") is None and _hosted:
    _pip = [sys.executable, "-m", "pip", "install", "-q"]
    _lacking = [m for m in {needs!r} if _have(m) is None]
    if subprocess.call(_pip + ["--no-deps", _source]) or _lacking and subprocess.call(_pip + _lacking):
        print("pip could not install labkit: on Kaggle turn the notebook's Internet on (Settings), then rerun")
    importlib.invalidate_caches()
if _have("labkit") is None:
    print("labkit is not installed in this Python. In a terminal:\\n  python -m pip install", _source,
          "\\n  python -m labkit course   # copies the chapters into ./labkit-course: open them there")
else:
    import labkit
    labkit.hello()  # the version and the device the chapter runs on'''


def setup_cell_source() -> str:
    return _CELL.format(source=release.SOURCE, needs=NEEDS)


def _blob(name: str) -> str:
    """notebooks/NAME at the release tag, as a GitHub page address without its scheme and host."""
    owner_repo = release.REPOSITORY.removeprefix("https://github.com/")
    return f"{owner_repo}/blob/{release.TAG}/notebooks/{name}"


def colab_url(name: str) -> str:
    return f"https://colab.research.google.com/github/{_blob(name)}"


def kaggle_url(name: str) -> str:
    return f"https://kaggle.com/kernels/welcome?src=https://github.com/{_blob(name)}"


def badges(name: str) -> tuple:
    """The two badges of one notebook, as markdown: (Colab's, Kaggle's) -- a table column each, so neither
    is squeezed beside the other."""
    return (f"[![Open in Colab]({COLAB_BADGE})]({colab_url(name)})",
            f"[![Open in Kaggle]({KAGGLE_BADGE})]({kaggle_url(name)})")


def notebooks(root: Path | None = None) -> list:
    """Every notebook of the course (the chapters and the interview questions), in order."""
    return sorted((root or pages.NOTEBOOKS).glob("*.ipynb"))


def _setup_cell() -> dict:
    # its code folded: JupyterLab shows one line and the output, Colab shows the @title as a form
    meta = {"cellView": "form", "jupyter": {"source_hidden": True}, "tags": ["setup"]}
    return {"cell_type": "code", "execution_count": None, "id": SETUP_ID, "metadata": meta,
            "outputs": [], "source": setup_cell_source().splitlines(keepends=True)}


def _with_setup(text: str) -> str:
    nb = json.loads(text)
    cells = [c for c in nb["cells"] if c.get("id") != SETUP_ID]
    nb["cells"] = [_setup_cell()] + cells
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _title(path: Path) -> str:
    """A chapter's title: the first heading of its first markdown cell, without the '#'."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    md = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    return "".join(md["source"]).splitlines()[0].lstrip("# ").strip()


def _readme_map(readme: str, nbs: list) -> str:
    """README.md's course map: every notebook with its badges, and the install line, between the markers."""
    rows = ["| chapter | on Colab | on Kaggle |", "|---|---|---|"]
    rows += [f"| [{_title(p)}](notebooks/{p.name}) | " + " | ".join(badges(p.name)) + " |" for p in nbs]
    block = "\n".join([MAP_START, *rows, "", "Outside a checkout (a lab's JupyterHub, your own Python):",
                       "", "```bash", f'python -m pip install "{release.SOURCE}"',
                       "python -m labkit course        # copies the chapters into ./labkit-course", "```",
                       MAP_END])
    start, end = readme.find(MAP_START), readme.find(MAP_END)
    if start < 0 or end < 0:
        raise ValueError(f"README.md has no course-map markers ({MAP_START} ... {MAP_END})")
    return readme[:start] + block + readme[end + len(MAP_END):]


_MAP_ROW = re.compile(r"^\| \[[^\]]+\]\((?P<nb>[^)]+\.ipynb)\) \|.*$", re.M)


def _notebooks_map(text: str) -> str:
    """notebooks/README.md's course map (its "## Course map" section only): the last two columns of each
    notebook's row hold its badges."""
    def row(m):
        colab, kaggle = badges(m.group("nb"))
        return " | ".join(m.group(0).split(" | ")[:-2] + [colab, kaggle + " |"])

    start = text.index("## Course map")
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    return text[:start] + _MAP_ROW.sub(row, text[start:end]) + text[end:]


def expected(root: Path | None = None) -> dict:
    """{path: the text it should have}: every notebook with the set-up cell first, both course maps."""
    root = root or paths.checkout_root()
    nbs = notebooks(root / "notebooks")
    out = {p: _with_setup(p.read_text(encoding="utf-8")) for p in nbs}
    out[root / "README.md"] = _readme_map((root / "README.md").read_text(encoding="utf-8"), nbs)
    nb_readme = root / "notebooks" / "README.md"
    out[nb_readme] = _notebooks_map(nb_readme.read_text(encoding="utf-8"))
    return out


def stale(root: Path | None = None) -> list:
    """The files whose set-up cell or badges are out of step with base/release."""
    return [p for p, text in expected(root).items() if p.read_text(encoding="utf-8") != text]


def write(root: Path | None = None) -> list:
    """Bring every file in step; returns the ones changed."""
    changed = []
    for p, text in expected(root).items():
        if p.read_text(encoding="utf-8") != text:
            paths.write_atomic(p, text.encode("utf-8"))
            changed.append(p)
    return changed


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        print("\n".join(f"wrote {p}" for p in write()) or "everything was in step")
    else:
        late = stale()
        print("\n".join(f"out of step: {p} (python -m labkit.content.hosting --write)" for p in late) or "in step")
        sys.exit(1 if late else 0)
