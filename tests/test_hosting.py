"""The course on a free GPU (labkit/content/hosting.py): every chapter opens with the one set-up cell, the
badges of both course maps point at notebooks that exist, all built from base/release; and the set-up cell's
three branches -- Colab, Kaggle, anywhere else -- run for real in a brand-new venv that has only torch and
what Colab has besides (tests/conftest.py: preinstalled, new_venv)."""
import json
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from conftest import REPO, new_venv
from labkit.base import release
from labkit.content import hosting

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CHAPTERS = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name)]
MAPS = [REPO / "README.md", REPO / "notebooks" / "README.md"]
BADGE = re.compile(r"\[!\[Open in (?:Colab|Kaggle)\]\([^)\s]+\)\]\(([^)\s]+)\)")  # [![alt](image)](link)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_notebook_opens_with_the_set_up_cell(path):
    first = json.loads(path.read_text(encoding="utf-8"))["cells"][0]
    assert first["cell_type"] == "code" and first["id"] == hosting.SETUP_ID, f"{path.name}: the set-up cell is not first"
    assert "".join(first["source"]) == hosting.setup_cell_source(), \
        f"{path.name}: its set-up cell differs: run python -m labkit.content.hosting --write"
    assert not first["outputs"]


def test_set_up_cells_and_badges_are_in_step_with_the_release():
    assert hosting.stale() == [], "run python -m labkit.content.hosting --write"
    src = hosting.setup_cell_source()
    assert f'"{release.SOURCE}"' in src and release.TAG in release.SOURCE and release.REPOSITORY in release.SOURCE
    assert release.TAG == "v" + release.VERSION


def test_the_set_up_cell_is_short_and_never_replaces_torch():
    src = hosting.setup_cell_source()
    assert len(src.splitlines()) <= 20  # the course's rule for every code cell (tests/test_show_the_code.py)
    installs = [ln for ln in src.splitlines() if "subprocess.call(" in ln]
    assert installs and all('"--no-deps", _source' in ln for ln in installs)
    assert "torch" not in hosting.NEEDS and "torch" not in src.split("_lacking =")[1].split("\n")[0]
    compile(src, "set-up cell", "exec")


def _badge_links(text: str) -> list:
    return BADGE.findall(text)


def _notebook_of(url: str) -> str:
    """The repository path a badge opens: notebooks/NAME.ipynb at the release tag, or '' when it points elsewhere."""
    u = urlparse(url)
    page = parse_qs(u.query)["src"][0] if u.netloc == "kaggle.com" else "https://github.com" + u.path[len("/github"):]
    prefix = f"{release.REPOSITORY}/blob/{release.TAG}/"
    return page[len(prefix):] if page.startswith(prefix) else ""


@pytest.mark.parametrize("md", MAPS, ids=["README.md", "notebooks/README.md"])
def test_every_badge_points_at_an_existing_notebook(md):
    links = _badge_links(md.read_text(encoding="utf-8"))
    assert links
    for url in links:
        target = _notebook_of(url)
        assert target.startswith("notebooks/") and (REPO / target).is_file(), f"{md.name}: a badge opens {url}"
        assert url in (hosting.colab_url(Path(target).name), hosting.kaggle_url(Path(target).name))
    for nb in NOTEBOOKS:  # every chapter (and the question bank) has both badges
        assert hosting.colab_url(nb.name) in links and hosting.kaggle_url(nb.name) in links, f"{md.name}: {nb.name}"


def test_a_wrong_badge_is_caught():
    wrong = hosting.colab_url("00_start_here.ipynb").replace(release.TAG, "v9.9.9")
    assert _notebook_of(wrong) == ""
    assert _notebook_of(hosting.kaggle_url("no_such.ipynb")) == "notebooks/no_such.ipynb"
    assert not (REPO / "notebooks/no_such.ipynb").is_file()


# ---- the three branches, for real ------------------------------------------------------------------------

def _torch_state(py) -> dict:
    code = ("import hashlib, importlib.metadata as md, torch; d = md.distribution('torch'); "
            "print(torch.__version__); print(torch.__file__); "
            "print(hashlib.sha256((d.read_text('RECORD') or '').encode()).hexdigest())")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=py.parent).stdout  # never the repository's folder: its labkit/ would be found first
    version, where, record = out.split()
    return {"version": version, "file": where, "record": record}


@pytest.fixture(scope="module")
def platform(tmp_path_factory, preinstalled):
    """A brand-new venv standing in for Colab's or Kaggle's Python: torch and the rest preinstalled, no labkit."""
    return new_venv(tmp_path_factory.mktemp("platform") / "venv", preinstalled)


def _run_cell(py, tmp_path, env_extra: dict, pythonpath=None):
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "labkit"], capture_output=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KAGGLE_KERNEL_RUN_TYPE", "LABKIT_SOURCE")}
    env.update(env_extra)
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    cell = tmp_path / "setup_cell.py"
    cell.write_text(hosting.setup_cell_source())
    return subprocess.run([str(py), str(cell)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _installed_labkit(py) -> str:
    out = subprocess.run([str(py), "-c", "import importlib.util as u; s = u.find_spec('labkit'); print(s and s.origin)"],
                         capture_output=True, text=True, timeout=60, cwd=py.parent)
    return out.stdout.strip()


def _stand_in_colab(tmp_path) -> Path:
    d = tmp_path / "colab-stand-in"
    (d / "google" / "colab").mkdir(parents=True)
    (d / "google" / "colab" / "__init__.py").write_text("# a stand-in for Colab's own package\n")
    return d


@pytest.mark.parametrize("hosted", ["colab", "kaggle"])
def test_the_set_up_cell_installs_labkit_on_colab_and_kaggle_and_keeps_torch(hosted, platform, labkit_wheel, tmp_path):
    before = _torch_state(platform)
    extra = {"LABKIT_SOURCE": str(labkit_wheel)}
    if hosted == "kaggle":
        extra["KAGGLE_KERNEL_RUN_TYPE"] = "Interactive"
    out = _run_cell(platform, tmp_path, extra, _stand_in_colab(tmp_path) if hosted == "colab" else None)
    assert out.returncode == 0, out.stderr[-3000:]
    origin = _installed_labkit(platform)
    assert origin and Path(origin).is_relative_to(platform.parent.parent) and str(REPO) not in origin, origin
    assert re.search(rf"^labkit {re.escape(release.VERSION)} · torch \S+ · device: ", out.stdout, re.M), out.stdout
    assert _torch_state(platform) == before  # the platform's torch: same version, same files


def test_the_set_up_cell_installs_nothing_anywhere_else(platform, labkit_wheel, tmp_path):
    out = _run_cell(platform, tmp_path, {"LABKIT_SOURCE": str(labkit_wheel)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert _installed_labkit(platform) in ("", "None")
    assert "python -m pip install" in out.stdout and "python -m labkit course" in out.stdout


def test_where_labkit_is_importable_the_cell_only_says_the_version_and_device(tmp_path):
    import sys

    cell = tmp_path / "setup_cell.py"
    cell.write_text(hosting.setup_cell_source())
    env = dict(os.environ, KAGGLE_KERNEL_RUN_TYPE="Interactive", LABKIT_SOURCE="/nonexistent/should-not-be-used.whl")
    out = subprocess.run([sys.executable, str(cell)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "pip" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert out.stdout.startswith(f"labkit {release.VERSION} · torch ")
