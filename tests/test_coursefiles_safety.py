"""Issue 45, items 7 and 13 (labkit course): a folder another user owns or can write in is refused (a planted
notebook would open as the learner's, the chapters' data and outputs would land there), and a chapter
opened in such a folder keeps nothing there; a damaged record (``[]``, ``null``) or a symbolic link in
the folder gives one line and the copy carries on, never writing through the link."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO
from labkit.base import paths
from labkit.base.runtime import ConfigError
from labkit.content import pages as coursefiles


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "labkit", "course", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_folder_others_can_write_in_is_refused_in_one_line(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "00_start_here.ipynb").write_text("planted")
    with pytest.raises(ConfigError, match="group or others can write in it .mode 777.*chmod go-w") as e:
        coursefiles.copy_course(shared)
    assert e.value.field == "DIR" and "\n" not in str(e.value)
    assert (shared / "00_start_here.ipynb").read_text() == "planted" and not (shared / paths.COURSE_MARK).exists()
    out = _cli(shared, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: DIR=") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_folder_another_user_owns_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)  # as another user sees the folder
    with pytest.raises(ConfigError, match=f"belongs to user id {real}, not to you"):
        coursefiles.copy_course(theirs)
    assert not list(theirs.iterdir())


def test_a_data_folder_linked_to_a_shared_one_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    dest = tmp_path / "c"
    dest.mkdir()
    (dest / "data").symlink_to(shared)
    with pytest.raises(ConfigError, match="group or others can write"):
        coursefiles.copy_course(dest)
    assert not list(shared.iterdir())


def test_a_new_folder_is_made_0755_even_under_a_group_writable_umask(tmp_path):
    old = os.umask(0o002)
    try:
        coursefiles.copy_course(tmp_path / "c")
        again = coursefiles.copy_course(tmp_path / "c")  # its own folders pass its own check
    finally:
        os.umask(old)
    assert again["unchanged"] and os.stat(tmp_path / "c").st_mode & 0o777 == 0o755
    assert os.stat(tmp_path / "c" / "data").st_mode & 0o777 == 0o755


def test_a_chapter_opened_in_a_shared_course_folder_keeps_nothing_there(tmp_path, monkeypatch, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / paths.COURSE_MARK).write_text("{}")
    os.chmod(shared, 0o777)
    monkeypatch.delenv("LABKIT_DATA_DIR", raising=False)
    monkeypatch.setattr(paths, "checkout_root", lambda: None)
    monkeypatch.chdir(shared)
    assert paths.course_root() is None
    assert paths.cache_dirs()[0] != shared / "data" / "cache"
    assert "not using" in capsys.readouterr().err


@pytest.mark.parametrize("record", ["[]", "null", '{"files": []}', '{"files": {"a": 1}}', '"x"'])
def test_a_damaged_record_is_one_note_and_the_copy_goes_on(tmp_path, record):
    dest = tmp_path / "c"
    coursefiles.copy_course(dest)
    (dest / paths.COURSE_MARK).write_text(record)
    (dest / "05_data_loader.ipynb").write_text("mine")
    report = coursefiles.copy_course(dest)
    assert [k for k, _ in report["kept"]] == ["05_data_loader.ipynb"]
    assert (dest / "05_data_loader.ipynb").read_text() == "mine"
    assert len(report["notes"]) == 1 and "damaged" in report["notes"][0]
    assert "note:" in coursefiles.describe(report)
    assert coursefiles.copy_course(dest)["notes"] == []  # the record was written whole again


def test_the_command_with_a_damaged_record_says_so_without_a_traceback(tmp_path):
    dest = tmp_path / "c"
    coursefiles.copy_course(dest)
    (dest / paths.COURSE_MARK).write_text("null")
    out = _cli(dest, cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "damaged" in out.stdout


def test_a_dangling_link_in_the_folder_is_left_alone_and_the_copy_goes_on(tmp_path):
    dest = tmp_path / "c"
    dest.mkdir()
    victim = tmp_path / "victim.ipynb"
    (dest / "00_start_here.ipynb").symlink_to(victim)  # dangling: writing through it would create victim
    (dest / "01_measure_first.ipynb").symlink_to(tmp_path / "elsewhere.ipynb")
    (tmp_path / "elsewhere.ipynb").write_text("someone's file")
    report = coursefiles.copy_course(dest)
    assert not victim.exists() and (tmp_path / "elsewhere.ipynb").read_text() == "someone's file"
    assert (dest / "00_start_here.ipynb").is_symlink()
    kept = dict(report["kept"])
    assert set(kept) == {"00_start_here.ipynb", "01_measure_first.ipynb"}
    assert (dest / kept["00_start_here.ipynb"]).read_bytes() == (REPO / "notebooks/00_start_here.ipynb").read_bytes()
    assert len(report["notes"]) == 2 and "02_mixed_precision.ipynb" in report["copied"]


def test_a_dangling_link_as_the_folder_or_the_record_is_one_line(tmp_path):
    link = tmp_path / "course"
    link.symlink_to(tmp_path / "nowhere")
    out = _cli(link, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: DIR=") and "does not exist" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "nowhere").exists()
    dest = tmp_path / "c"
    dest.mkdir()
    (dest / paths.COURSE_MARK).symlink_to(tmp_path / "record-elsewhere.json")
    report = coursefiles.copy_course(dest)
    assert not (tmp_path / "record-elsewhere.json").exists() and report["copied"]
    assert any(paths.COURSE_MARK in n for n in report["notes"])
