"""labkit as a package that carries its course (labkit/content/pages.py, setup.py, base/paths): the wheel
holds the chapters and no solutions; `labkit course DIR` copies them and never overwrites a notebook the learner
changed; chapters opened there keep their data and outputs there. Last, a clean machine, simulated: the wheel in
a brand-new venv, `labkit course` into an empty folder, chapters 00 and 03 run from it with the repository
nowhere on sys.path."""
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from conftest import REPO, grading_scope, new_venv
from labkit.base import paths, release
from labkit.base.runtime import ConfigError
from labkit.chapters import ch07_kernels as kernels
from labkit.content import pages as coursefiles
from labkit.tools import reference

CHAPTER_NAMES = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))


# ---- the copy ----------------------------------------------------------------------------------------------

def test_the_course_is_every_chapter_and_its_markdown_and_no_solution():
    files = coursefiles.course_files()
    assert [n for n in files if n.endswith(".ipynb") and "/" not in n] == CHAPTER_NAMES
    russian = sorted("ru/" + p.name for p in (REPO / "notebooks" / "ru").glob("*.ipynb"))
    assert [n for n in files if n.startswith("ru/") and n.endswith(".ipynb")] == russian and "ru/00_start_here.ipynb" in russian
    assert {"README.md", "cheatsheet.md", "interview_questions.md", "data/README.md", "ru/lab_messages.md",
            "ru/GLOSSARY.md"} <= set(files)
    assert not [n for n in files if n.endswith(".po")]  # the translators' catalogues stay in the checkout
    assert not [n for n in files if "solution" in n]


def test_copy_then_again_changes_nothing(tmp_path):
    first = coursefiles.copy_course(tmp_path / "c")
    assert sorted(first["copied"]) == sorted(coursefiles.course_files()) and not first["kept"]
    assert (tmp_path / "c" / "00_start_here.ipynb").read_bytes() == (REPO / "notebooks/00_start_here.ipynb").read_bytes()
    ru = tmp_path / "c" / "ru" / "00_start_here.ipynb"  # the Russian edition, in its own folder
    assert ru.read_bytes() == (REPO / "notebooks/ru/00_start_here.ipynb").read_bytes()
    assert paths.course_root(ru.parent) == (tmp_path / "c").resolve()  # its data and outputs: the course's
    assert "ru && jupyter lab 00_start_here.ipynb" in coursefiles.describe(first)
    again = coursefiles.copy_course(tmp_path / "c")
    assert sorted(again["unchanged"]) == sorted(first["copied"]) and not (again["copied"] or again["kept"])


def test_a_notebook_the_learner_changed_is_kept_and_the_new_one_put_beside_it(tmp_path):
    dest = tmp_path / "c"
    coursefiles.copy_course(dest)
    mine = dest / "03_gradient_accumulation.ipynb"
    mine.write_text(mine.read_text() + " ")  # the learner's edit
    report = coursefiles.copy_course(dest)
    assert report["kept"] == [("03_gradient_accumulation.ipynb", f"03_gradient_accumulation.labkit-{release.VERSION}.ipynb")]
    assert mine.read_text().endswith(" ")  # never overwritten
    side = dest / report["kept"][0][1]
    assert side.read_bytes() == (REPO / "notebooks/03_gradient_accumulation.ipynb").read_bytes()
    text = coursefiles.describe(report)
    assert "kept 03_gradient_accumulation.ipynb" in text and side.name in text
    assert coursefiles.copy_course(dest)["kept"] == report["kept"]  # a third run: same names, no .1 copies
    assert not list(dest.glob("*.labkit-*.1.ipynb"))


def test_a_new_release_updates_the_notebooks_the_learner_did_not_touch(tmp_path, monkeypatch):
    dest = tmp_path / "c"
    coursefiles.copy_course(dest)
    mine = dest / "00_start_here.ipynb"
    mine.write_text("{}")  # changed by the learner
    newer = tmp_path / "newer"
    files = {}
    for name, src in coursefiles.course_files().items():
        (newer / name).parent.mkdir(parents=True, exist_ok=True)
        (newer / name).write_bytes(src.read_bytes() + (b" " if name.startswith(("00", "01")) else b""))
        files[name] = newer / name
    monkeypatch.setattr(coursefiles, "course_files", lambda root=None: files)
    report = coursefiles.copy_course(dest)
    assert report["updated"] == ["01_measure_first.ipynb"]
    assert [k for k, _ in report["kept"]] == ["00_start_here.ipynb"] and mine.read_text() == "{}"
    assert (dest / "01_measure_first.ipynb").read_bytes() == files["01_measure_first.ipynb"].read_bytes()


def test_a_damaged_record_counts_every_differing_file_as_the_learners(tmp_path):
    dest = tmp_path / "c"
    coursefiles.copy_course(dest)
    (dest / paths.COURSE_MARK).write_text("{not json")
    (dest / "05_data_loader.ipynb").write_text("mine")
    report = coursefiles.copy_course(dest)
    assert [k for k, _ in report["kept"]] == ["05_data_loader.ipynb"] and (dest / "05_data_loader.ipynb").read_text() == "mine"


def test_a_file_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="DIR.*a folder"):
        coursefiles.copy_course(tmp_path / "f")


def test_the_command_copies_into_labkit_course_by_default(tmp_path):
    out = subprocess.run([sys.executable, "-m", "labkit", "course"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / coursefiles.DEFAULT_DIR / "00_start_here.ipynb").is_file()
    assert "the course is in" in out.stdout and "copied" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "labkit", "course", str(tmp_path / "labkit-course" / "README.md")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert bad.returncode == 2 and bad.stderr.startswith("error: DIR=") and "Traceback" not in bad.stderr


# ---- where a chapter opened in that folder keeps its data and outputs -------------------------------------

def test_a_chapter_opened_in_the_course_folder_keeps_its_data_and_outputs_there(tmp_path, monkeypatch):
    dest = tmp_path / "c"
    coursefiles.copy_course(dest)
    monkeypatch.delenv("LABKIT_DATA_DIR", raising=False)
    monkeypatch.setattr(paths, "checkout_root", lambda: None)  # as an installed labkit sees it
    monkeypatch.chdir(dest)
    assert paths.course_root() == dest.resolve()
    assert paths.cache_dirs()[0] == dest.resolve() / "data" / "cache"
    assert kernels.out_dir() == dest.resolve() / "out"
    assert reference.reference_dir() == dest.resolve() / "data" / "reference"
    monkeypatch.chdir(tmp_path)  # anywhere else: the user's cache, the private out folder, the wheel's references
    assert paths.course_root() is None and paths.cache_dirs()[0] == Path.home() / ".cache" / "labkit"
    assert reference.reference_dir() == reference.PACKAGED_DIR


def test_the_checkout_is_found_only_where_it_is():
    assert paths.checkout_root() == REPO
    assert paths.course_root(REPO / "notebooks") == REPO and paths.course_root(REPO / "labkit") is None
    assert paths.course_root(REPO / "notebooks" / "ru") == REPO  # the Russian edition keeps its data there too


# ---- the wheel, and a clean machine -------------------------------------------------------------------------

def test_the_wheel_carries_the_course_and_not_the_solutions(labkit_wheel):
    names = zipfile.ZipFile(labkit_wheel).namelist()
    packaged = {n.removeprefix("labkit/coursefiles/notebooks/") for n in names if n.startswith("labkit/coursefiles/notebooks/")}
    assert set(CHAPTER_NAMES) <= packaged and "interview_questions.md" in packaged and "README.md" in packaged
    assert {"ru/00_start_here.ipynb", "ru/lab_messages.md"} <= packaged and not [n for n in packaged if n.endswith(".po")]
    assert {"labkit/chapters/ch10_parallel/published_layouts.json", "labkit/chapters/ch10_parallel/shapes.json"} <= set(names)
    assert "labkit/whatif/devices.json" in names and "labkit/coursefiles/data/README.md" in names
    from labkit.content import pages  # the kit's templates, read at run time (pyproject.toml's package-data)
    templates = sorted(p.name for p in pages.TEMPLATES.glob("*.md"))
    assert templates and {f"labkit/content/templates/{n}" for n in templates} <= set(names), templates
    assert not [n for n in names if "solutions" in n or n.startswith(("tests/", "notebooks/", "data/cache"))]
    print(f"\nwheel {labkit_wheel.name}: {labkit_wheel.stat().st_size / 1e3:.0f} kB, {len(names)} files")


CHECK_CELL = """import sys, labkit
repo = {repo!r}
print("LABKIT_FROM", labkit.__file__)
print("REPO_ON_PATH", [p for p in sys.path if p and (p == repo or p.startswith(repo + "/"))])"""


def _kernel_spec(where: Path, py: Path) -> Path:
    spec = where / "kernels" / "labkit-clean"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                                  "display_name": "labkit clean venv", "language": "python"}))
    return where


def _run_chapter(path: Path, cwd: Path) -> tuple:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_CELL.format(repo=str(REPO))))
    client = NotebookClient(nb, timeout=600, kernel_name="labkit-clean", allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    errors = [f"cell {i}: {o['ename']}: {o['evalue'][:300]}" for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    streams = ["".join(o.get("text", "") for o in c.get("outputs", []) if o.get("output_type") == "stream")
               for c in nb.cells if c.cell_type == "code"]
    return errors, streams[-1] + "".join(streams[:-1])  # the check cell's lines first


def test_a_clean_machine_runs_the_chapters_from_the_installed_course(labkit_wheel, preinstalled, tmp_path, monkeypatch):
    """A new venv with the platform's packages, the wheel, `labkit course`: chapters 00 and 03 run from the copied
    folder with the installed labkit (a plain `course.py test`: chapter 00 alone, conftest's ``grading_scope``)."""
    t0 = time.perf_counter()
    # CI also runs 03 and the Russian 00 (from the copy's ru/: labkit's Russian sentences come from the wheel too)
    chapters = ["00_start_here.ipynb"] + ["03_gradient_accumulation.ipynb", "ru/00_start_here.ipynb"] * (
        grading_scope() != "sample")
    py = new_venv(tmp_path / "venv", preinstalled)
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", str(labkit_wheel)], capture_output=True, text=True,
                             timeout=600, cwd=tmp_path)
    assert install.returncode == 0, install.stderr[-3000:]
    course = tmp_path / "empty"
    course.mkdir()
    labkit_cmd = py.parent / ("labkit.exe" if os.name == "nt" else "labkit")
    made = subprocess.run([str(labkit_cmd), "course"], cwd=course, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    where = course / coursefiles.DEFAULT_DIR
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    package_before = {p for p in (site / "labkit").rglob("*") if "__pycache__" not in p.parts}
    monkeypatch.setenv("JUPYTER_PATH", str(_kernel_spec(tmp_path / "jupyter", py)))
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("LABKIT_MODE", "short")
    monkeypatch.delenv("LABKIT_DATA_DIR", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    for name in chapters:
        errors, last = _run_chapter(where / name, (where / name).parent)
        assert not errors, f"{name}:\n" + "\n".join(errors)
        if name.startswith("ru/"):  # no English fallback: the wheel carried ru/lab_messages.md
            assert "shown in English" not in last and "copy of" not in last, last
        assert f"LABKIT_FROM {site / 'labkit'}" in last and "REPO_ON_PATH []" in last, last
    assert (where / "data" / "cache").is_dir()  # the corpus cache sits in the course folder ...
    package_after = {p for p in (site / "labkit").rglob("*") if "__pycache__" not in p.parts}
    assert package_after == package_before  # ... and nothing was written inside site-packages
    print(f"\nclean machine: venv, wheel, `labkit course`, {' and '.join(c[:2] for c in chapters)} in "
          f"{time.perf_counter() - t0:.0f} s")
