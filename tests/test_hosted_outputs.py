"""On Colab and Kaggle a chapter's files go where the platform shows them (labkit/base/paths.py: out_dir,
hosted_platform): /content/labkit-out (Colab's file pane) and /kaggle/working/labkit-out (kept by a saved
Kaggle version), not a private temp folder nobody sees. The platform is told apart as the set-up cell does:
KAGGLE_KERNEL_RUN_TYPE for Kaggle, an importable google.colab for Colab -- faked here, folders in tmp."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.base import paths
from labkit.chapters import ch07_kernels as kernels

REPO = Path(__file__).resolve().parent.parent


def test_the_platforms_folders_are_the_ones_they_show():
    assert paths.HOSTED_OUT == {"colab": Path("/content/labkit-out"), "kaggle": Path("/kaggle/working/labkit-out")}


def test_kaggle_is_told_by_its_environment_variable():
    assert paths.hosted_platform({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}) == "kaggle"
    assert paths.hosted_platform({"KAGGLE_KERNEL_RUN_TYPE": "Batch"}) == "kaggle"
    assert paths.hosted_platform({}) is None  # this machine: neither (no google.colab here)


@pytest.fixture
def fake_kaggle(tmp_path, monkeypatch):
    working = tmp_path / "kaggle" / "working"
    working.mkdir(parents=True)
    monkeypatch.setitem(paths.HOSTED_OUT, "kaggle", working / "labkit-out")
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    return working


def test_on_kaggle_a_chapters_files_go_under_kaggle_working(fake_kaggle, tmp_path, monkeypatch):
    monkeypatch.chdir(fake_kaggle)  # where Kaggle opens a notebook
    d = kernels.out_dir()
    assert d == fake_kaggle / "labkit-out" and d.is_dir()
    assert kernels.out_dir() == d  # a second call: the same folder, no error


def test_on_kaggle_even_a_course_folder_writes_where_kaggle_keeps_it(fake_kaggle, tmp_path, monkeypatch):
    course = tmp_path / "labkit-course"
    course.mkdir()
    (course / paths.COURSE_MARK).write_text('{"labkit": "0", "files": {}}\n')
    monkeypatch.chdir(course)
    assert paths.course_root() == course.resolve()
    assert paths.out_dir() == fake_kaggle / "labkit-out"


def test_where_the_platforms_folder_is_missing_the_usual_rule_holds(tmp_path, monkeypatch):
    monkeypatch.setitem(paths.HOSTED_OUT, "kaggle", tmp_path / "no-kaggle" / "working" / "labkit-out")
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert paths.out_dir() == paths.private_dir("out")  # the private temp folder, as off the platform
    assert not (tmp_path / "no-kaggle").exists()


def test_on_colab_a_chapters_files_go_under_content(tmp_path):
    stand_in = tmp_path / "colab-stand-in"
    (stand_in / "google" / "colab").mkdir(parents=True)
    (stand_in / "google" / "colab" / "__init__.py").write_text("# a stand-in for Colab's own package\n")
    content = tmp_path / "content"
    content.mkdir()
    code = ("from pathlib import Path; from labkit.base import paths; from labkit.chapters import ch07_kernels as kernels; "
            f"paths.HOSTED_OUT['colab'] = Path({str(content / 'labkit-out')!r}); "
            "print(paths.hosted_platform()); print(kernels.out_dir())")
    env = {k: v for k, v in os.environ.items() if k != "KAGGLE_KERNEL_RUN_TYPE"}
    env["PYTHONPATH"] = os.pathsep.join([str(stand_in), str(REPO)])
    out = subprocess.run([sys.executable, "-c", code], cwd=content, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["colab", str(content / "labkit-out")]
    assert (content / "labkit-out").is_dir()
