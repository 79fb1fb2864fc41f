"""The course on a free GPU (labkit/instructor/hosting.py): every chapter opens with the one set-up cell, the
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
from labkit.instructor import hosting

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CHAPTERS = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name)]
MAPS = [REPO / "README.md", REPO / "notebooks" / "README.md"]
BADGE = re.compile(r"\[!\[Open in (?:Colab|Kaggle)\]\([^)\s]+\)\]\(([^)\s]+)\)")  # [![alt](image)](link)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_notebook_opens_with_the_set_up_cell(path):
    first = json.loads(path.read_text(encoding="utf-8"))["cells"][0]
    assert first["cell_type"] == "code" and first["id"] == hosting.SETUP_ID, f"{path.name}: the set-up cell is not first"
    assert "".join(first["source"]) == hosting.setup_cell_source(), \
        f"{path.name}: its set-up cell differs: run python -m labkit.instructor.hosting --write"
    assert not first["outputs"]


def test_set_up_cells_and_course_maps_are_in_step_with_the_release():
    assert hosting.stale() == [], "run python -m labkit.instructor.hosting --write"
    assert release.TAG == "v" + release.VERSION and release.REPOSITORY == release.UPSTREAM_REPOSITORY


def test_the_set_up_cell_is_short_and_never_replaces_torch():
    src = hosting.setup_cell_source()
    # generated and folded (like its width, exempt from a chapter cell's 20 lines: tests/test_show_the_code.py)
    assert len(src.splitlines()) <= hosting.MAX_SETUP_LINES
    installs = [ln for ln in src.splitlines() if "_pip(" in ln and "def _pip" not in ln]
    assert installs and '_pip("--no-deps", _source)' in installs[0]
    assert src.count("subprocess.run(") == 1 and "subprocess.call(" not in src
    assert "torch" not in hosting.NEEDS and "torch" not in src.split("_lacking =")[1].split("\n")[0]
    compile(src, "set-up cell", "exec")


# ---- unpublished: no link to an address that does not exist yet ----------------------------------------

UPSTREAM_ADDRESS = release.UPSTREAM_REPOSITORY.removeprefix("https://")


def _published_texts(monkeypatch, source=f"git+{release.UPSTREAM_REPOSITORY}@{'0123456789abcdef' * 2}01234567"):
    """Every file hosting writes, as it would be once published (the badge code path), read from the
    checkout without writing anything."""
    monkeypatch.setattr(release, "PUBLISHED", True)
    monkeypatch.setattr(release, "SOURCE", source)
    return {p.relative_to(REPO).as_posix(): text for p, text in hosting.expected(REPO).items()}


def test_while_unpublished_no_badge_no_install_line_points_at_the_repository():
    assert not release.UPSTREAM_PUBLISHED and not release.PUBLISHED and release.SOURCE == ""
    texts = {p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8") for p in hosting.expected(REPO)}
    for name, text in texts.items():
        assert not _badge_links(text) and UPSTREAM_ADDRESS not in text, name
    for name in ("README.md", "notebooks/README.md"):  # the one line, instead of the badges
        assert hosting.from_a_wheel() in texts[name], name
        assert "LABKIT_SOURCE" in hosting.from_a_wheel() and hosting.wheel_name() in hosting.from_a_wheel()
    outside = texts["README.md"].split("Outside a checkout")[1].split("<!-- /course-map -->")[0]
    assert f"pip install dist/{hosting.wheel_name()}" in outside and "pip wheel --no-deps -w dist ." in outside
    header = next(ln for ln in texts["notebooks/README.md"].splitlines() if ln.startswith("| chapter |"))
    assert "on Colab" not in header and "on Kaggle" not in header


def test_once_published_the_badges_and_the_pinned_install_line_are_written(monkeypatch):
    texts = _published_texts(monkeypatch)
    for name in ("README.md", "notebooks/README.md"):
        assert hosting.from_a_wheel() not in texts[name], name
    assert f'python -m pip install "{release.SOURCE}"' in texts["README.md"]
    header = next(ln for ln in texts["notebooks/README.md"].splitlines() if ln.startswith("| chapter |"))
    assert header.endswith("| on Colab | on Kaggle |")
    cell = "".join(json.loads(texts["notebooks/00_start_here.ipynb"])["cells"][0]["source"])
    assert f'or "{release.SOURCE}"' in cell and "@v" not in cell  # a commit, not the movable tag


def test_the_notebook_map_goes_published_and_back_unchanged(monkeypatch):
    unpublished = (REPO / "notebooks" / "README.md").read_text(encoding="utf-8")
    published = _published_texts(monkeypatch)["notebooks/README.md"]
    assert published != unpublished
    assert hosting._notebooks_map(published) == published  # writing twice changes nothing
    monkeypatch.setattr(release, "PUBLISHED", False)
    assert hosting._notebooks_map(published) == unpublished


def test_a_course_map_without_its_markers_is_refused():
    with pytest.raises(ValueError, match="course-map"):
        hosting._readme_map("# a README with no map\n", [])


def _badge_links(text: str) -> list:
    return BADGE.findall(text)


def _notebook_of(url: str) -> str:
    """The repository path a badge opens: notebooks/NAME.ipynb at the release tag, or '' when it points elsewhere."""
    u = urlparse(url)
    page = parse_qs(u.query)["src"][0] if u.netloc == "kaggle.com" else "https://github.com" + u.path[len("/github"):]
    prefix = f"{release.REPOSITORY}/blob/{release.TAG}/"
    return page[len(prefix):] if page.startswith(prefix) else ""


@pytest.mark.parametrize("md", ["README.md", "notebooks/README.md"])
def test_once_published_every_badge_points_at_an_existing_notebook(md, monkeypatch):
    links = _badge_links(_published_texts(monkeypatch)[md])
    assert links
    for url in links:
        target = _notebook_of(url)
        assert target.startswith("notebooks/") and (REPO / target).is_file(), f"{md}: a badge opens {url}"
        assert url in (hosting.colab_url(Path(target).name), hosting.kaggle_url(Path(target).name))
    for nb in NOTEBOOKS:  # every chapter (and the question bank) has both badges
        assert hosting.colab_url(nb.name) in links and hosting.kaggle_url(nb.name) in links, f"{md}: {nb.name}"


def test_a_wrong_badge_is_caught():
    wrong = hosting.colab_url("00_start_here.ipynb").replace(release.TAG, "v9.9.9")
    assert _notebook_of(wrong) == ""
    assert _notebook_of(hosting.kaggle_url("no_such.ipynb")) == "notebooks/no_such.ipynb"
    assert not (REPO / "notebooks/no_such.ipynb").is_file()


# `pip install labkit` installs PyPI's labkit, an unrelated package: never written anywhere a learner reads
PIP_LABKIT = re.compile(r"pip3?\s+install(?:\s+-\S+)*\s+[\"']?labkit(?![-\w.@/])(?:\[[^\]]*\])?(?!\s*@)(?=[\s\"'`)]|$)", re.M)


def test_no_page_says_pip_install_labkit():
    assert PIP_LABKIT.search("python -m pip install labkit") and PIP_LABKIT.search("pip install -U 'labkit[test]'")
    assert not PIP_LABKIT.search(f"pip install dist/{hosting.wheel_name()}")
    assert not PIP_LABKIT.search('pip install "labkit @ https://x/labkit-0.1.0-py3-none-any.whl#sha256=00"')
    files = [REPO / "README.md", REPO / "course.py", *(REPO / "notebooks").rglob("*.md"),
             *(REPO / "notebooks").rglob("*.ipynb"), *(REPO / "labkit").rglob("*.py"), *(REPO / "data").rglob("*.md")]
    said = [f.relative_to(REPO).as_posix() for f in files if PIP_LABKIT.search(f.read_text(encoding="utf-8"))]
    assert not said, f"these say `pip install labkit` (PyPI's labkit is another package): {said}"


def test_the_quick_start_is_exactly_two_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert [ln.split("#")[0].strip() for ln in block.splitlines()] == ["python3 course.py lab", "python3 course.py test"]


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
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv's own labkit, not a checkout on the path
    out = subprocess.run([str(py), "-c", "import importlib.util as u; s = u.find_spec('labkit'); print(s and s.origin)"],
                         capture_output=True, text=True, timeout=60, cwd=py.parent, env=env)
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


# ---- when it cannot install: which of three things happened, and the platform's own advice -------------

def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go): a proxy there refuses every connection."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git_repo_without_the_tag(tmp_path) -> str:
    repo = tmp_path / "fork"
    for args in (["init", "-q", str(repo)], ["-C", str(repo), "-c", "user.email=l@k", "-c", "user.name=lk", "commit", "-q",
                                             "--allow-empty", "-m", "a commit, no tag"]):
        subprocess.run(["git", *args], check=True, capture_output=True, timeout=60)
    return f"git+{repo.as_uri()}@v9.9.9"


def _failing_sources(tmp_path) -> dict:
    garbage = tmp_path / "labkit-0.1.0-py3-none-any.whl"
    garbage.write_bytes(b"not a zip file")
    return {"missing file": (str(tmp_path / "nowhere" / "labkit-0.1.0-py3-none-any.whl"), "not found"),
            "missing tag": (_git_repo_without_the_tag(tmp_path), "not found"),
            "no network": ("labkit @ https://example.invalid/labkit-0.1.0-py3-none-any.whl", "no network"),
            "no network, git": ("git+https://example.invalid/labkit.git@" + "0" * 40, "no network"),
            "pip's own": (str(garbage), "and said: ERROR")}


@pytest.mark.parametrize("hosted", ["colab", "kaggle"])
def test_a_failed_install_says_which_of_three_things_happened(hosted, platform, tmp_path):
    proxy = f"http://127.0.0.1:{_closed_port()}"  # no network, deterministically: every connection is refused
    net = {"HTTPS_PROXY": proxy, "https_proxy": proxy, "HTTP_PROXY": proxy, "http_proxy": proxy, "NO_PROXY": "",
           "no_proxy": "", "PIP_RETRIES": "0", "PIP_TIMEOUT": "10"}
    where = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"} if hosted == "kaggle" else {}
    colab = _stand_in_colab(tmp_path) if hosted == "colab" else None
    for case, (source, verdict) in _failing_sources(tmp_path).items():
        out = _run_cell(platform, tmp_path, {**net, **where, "LABKIT_SOURCE": source}, colab)
        said = out.stdout + out.stderr
        assert out.returncode == 0 and _installed_labkit(platform) in ("", "None"), (case, said)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("pip could not install labkit:")]
        assert len(lines) == 1 and verdict in lines[0], (case, said)
        assert ("Internet" in said) == (hosted == "kaggle" and verdict == "no network"), (case, said)  # Kaggle's switch
        assert ("/kaggle/input" in said) == (hosted == "kaggle") and ("/content" in said) == (hosted == "colab"), case
        if verdict == "and said: ERROR":
            assert "is invalid" in lines[0], said  # pip's own words, its last ERROR line


@pytest.mark.parametrize("source", ["--index-url=https://example.invalid/simple", "-e.", "-rrequirements.txt"])
def test_an_option_shaped_labkit_source_is_refused_in_one_line(source, platform, tmp_path):
    out = _run_cell(platform, tmp_path, {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "LABKIT_SOURCE": source})
    refused = [ln for ln in out.stdout.splitlines() if ln.startswith("LABKIT_SOURCE") and "refused" in ln]
    assert out.returncode == 0 and len(refused) == 1 and repr(source) in refused[0], out.stdout + out.stderr
    assert "pip could not install" not in out.stdout and _installed_labkit(platform) in ("", "None")


@pytest.mark.parametrize("hosted", ["colab", "kaggle"])
def test_unpublished_without_a_wheel_the_cell_says_how_to_bring_one(hosted, platform, tmp_path):
    assert not release.PUBLISHED  # the cell installs nothing by itself until the release exists
    where = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"} if hosted == "kaggle" else {}
    out = _run_cell(platform, tmp_path, where, _stand_in_colab(tmp_path) if hosted == "colab" else None)
    assert out.returncode == 0 and "pip could not" not in out.stdout, out.stdout + out.stderr
    assert "%env LABKIT_SOURCE=" in out.stdout and "pip wheel --no-deps" in out.stdout
    assert ("/kaggle/input" in out.stdout) == (hosted == "kaggle") and "Internet" not in out.stdout
