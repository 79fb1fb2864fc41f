"""The course on a free GPU: the set-up cell that opens every chapter, and the course maps' "Open in
Colab" / "Open in Kaggle" badges and install lines -- all built from one setting, ``base/release``
(README.md says what the set-up cell does in Colab, Kaggle and elsewhere).

    python -m labkit.instructor.hosting --write   # fill them in: every notebook's first cell, README.md's
                                               # and notebooks/README.md's course maps
    python -m labkit.instructor.hosting --check   # exit 1 when one is out of step (tests/test_hosting.py)

Until ``release.PUBLISHED`` the maps show no badge and no install address that does not exist: one
line says how to run a chapter on Colab or Kaggle from a wheel you built.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ..base import paths, release
from ..content import pages
from .cheatsheet import title

__all__ = ["SETUP_ID", "setup_cell_source", "colab_url", "kaggle_url", "badges", "from_a_wheel", "notebooks",
           "expected", "write", "stale"]

SETUP_ID = "labkit-setup"   # the set-up cell's id in every notebook
NEEDS = ("numpy", "matplotlib", "ipywidgets", "psutil")  # what labkit imports besides torch (and IPython)
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"
MAP_START, MAP_END = "<!-- course-map: written by python -m labkit.instructor.hosting --write -->", "<!-- /course-map -->"

# The set-up cell's code and the course maps' text: templates/hosting.md. The cell tells pip's (or git's) words
# for no network at all from those for nothing at that address.
_CELL = pages.section("hosting.md", "setup-cell")
MAX_SETUP_LINES = 30  # generated and folded (JupyterLab source_hidden, Colab's form): not a chapter's 20-line cell


def setup_cell_source() -> str:
    """The set-up cell's code, from base/release: it installs ``release.SOURCE`` (a pinned commit or hashed
    wheel once published; nothing until then but ``LABKIT_SOURCE``, a wheel the learner uploaded)."""
    note = _text("source-pinned" if release.PUBLISHED else "source-unpublished")
    return _CELL.format(source=release.SOURCE, source_note=note, wheel=wheel_name(), needs=NEEDS)


def _text(key: str, **values) -> str:
    return pages.section("hosting.md", key).format(**values)


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
    return (_text("badge", platform="Colab", badge=COLAB_BADGE, url=colab_url(name)),
            _text("badge", platform="Kaggle", badge=KAGGLE_BADGE, url=kaggle_url(name)))


def wheel_name() -> str:
    return f"labkit-{release.VERSION}-py3-none-any.whl"


def from_a_wheel() -> str:
    """The one line the course maps carry while labkit is unpublished: a chapter on Colab or Kaggle from a
    wheel you built, uploaded with the notebook, named by ``LABKIT_SOURCE`` before the set-up cell runs."""
    return _text("from-a-wheel", wheel=wheel_name())


def _install_lines() -> list:
    """README's "Outside a checkout" lines: the release's pinned source once published; until then a wheel
    built in a clone -- never an address that does not exist yet."""
    first = (_text("install-published", source=release.SOURCE) if release.PUBLISHED else
             _text("install-unpublished", wheel=wheel_name()))
    return _text("install", first=first).split("\n")


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


def _between(text: str, start_mark: str, end_mark: str, block: str, where: str) -> str:
    start, end = text.find(start_mark), text.find(end_mark)
    if start < 0 or end < start:
        raise ValueError(f"{where} has no markers {start_mark} ... {end_mark}: put them back where the block goes")
    return text[:start] + block + text[end + len(end_mark):]


def _readme_map(readme: str, nbs: list) -> str:
    """README.md's course map, between the markers: once published, every notebook with its badges; until
    then the chapters and the one line on running one from a wheel. Then the install lines."""
    if release.PUBLISHED:
        rows = [_text("readme-row-published", title=title(p), name=p.name, colab=badges(p.name)[0],
                      kaggle=badges(p.name)[1]) for p in nbs]
        body = _text("readme-published", rows="\n".join(rows), install="\n".join(_install_lines()))
    else:
        rows = [_text("readme-row-unpublished", title=title(p), name=p.name) for p in nbs]
        body = _text("readme-unpublished", rows="\n".join(rows), from_a_wheel=from_a_wheel(),
                     install="\n".join(_install_lines()))
    block = "\n".join([MAP_START, body, MAP_END])
    return _between(readme, MAP_START, MAP_END, block, "README.md")


HOSTED_START, HOSTED_END = "<!-- hosted: written by python -m labkit.instructor.hosting --write -->", "<!-- /hosted -->"
_NB_LINK = re.compile(r"^\[[^\]]+\]\((?P<nb>[^)]+\.ipynb)\)")
HOSTED_COLUMNS = ("on Colab", "on Kaggle")


def _cells(line: str) -> list:
    return [c.strip() for c in line.strip()[1:-1].split("|")]


def _notebooks_map(text: str) -> str:
    """notebooks/README.md's course map (its "## Course map" section): the table's last two columns hold each
    notebook's badges once published and are not there before; the line between the hosted markers says how
    to run a chapter from a wheel until then."""
    start = text.index("## Course map")
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    lines = text[start:end].split("\n")
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    last = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    table = lines[first:last]
    had = _cells(table[0])[-2:] == list(HOSTED_COLUMNS)
    out = []
    for n, line in enumerate(table):
        cells = _cells(line)[:-2] if had else _cells(line)
        if release.PUBLISHED:
            m = _NB_LINK.match(cells[0])
            cells += (list(HOSTED_COLUMNS) if n == 0 else ["---", "---"] if n == 1 else
                      list(badges(m.group("nb"))) if m else ["—", "—"])
        out.append("|" + "|".join(cells) + "|" if n == 1 else "| " + " | ".join(cells) + " |")
    section = "\n".join(lines[:first] + out + lines[last:])
    block = [HOSTED_START] + ([] if release.PUBLISHED else [from_a_wheel()]) + [HOSTED_END]
    section = _between(section, HOSTED_START, HOSTED_END, "\n".join(block),
                       "notebooks/README.md's course map")
    return text[:start] + section + text[end:]


def expected(root: Path | None = None) -> dict:
    """{path: the text it should have}: every notebook with the set-up cell first, both course maps."""
    if release.OVERRIDE_PROBLEM:  # a fork's malformed address: write no link from it, and say which
        raise ValueError(release.OVERRIDE_PROBLEM)
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


def main(argv) -> int:
    try:
        if "--write" in argv:
            print("\n".join(f"wrote {p}" for p in write()) or "everything was in step")
            return 0
        late = stale()
    except ValueError as e:  # a malformed LABKIT_REPOSITORY / LABKIT_TAG, or a course map without its markers
        print(f"labkit.instructor.hosting: {e}", file=sys.stderr)
        return 2
    print("\n".join(f"out of step: {p} (python -m labkit.instructor.hosting --write)" for p in late) or "in step")
    return 1 if late else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
