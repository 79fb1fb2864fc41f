"""Issue 45, item 13 (labkit assignments): an instructor's edited source notebook or nbgrader_config.py is
kept (the new version goes to OUT/labkit-updates/, outside source/, and the command says where) unless
--force; a symbolic link below OUT (a linked source/, a linked notebook) is refused before anything is
written."""
from __future__ import annotations

import json
import os

import pytest

from labkit.__main__ import main as cli
from labkit.base.runtime import ConfigError
from labkit.instructor import assignments

NAME = "11_long_runs_and_failures"


def _build(out, **kw):
    return assignments.build_nbgrader(out, ["11"], **kw)


def test_an_edited_source_notebook_is_kept_and_the_new_one_goes_beside_outside_source(tmp_path, capsys):
    _build(tmp_path)
    nb_path = tmp_path / "source" / NAME / f"{NAME}.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"][0]["source"] = "# my course's own introduction\n"
    nb_path.write_text(json.dumps(nb, indent=1))
    mine = nb_path.read_text()
    assert cli(["assignments", "--tool", "nbgrader", "--chapters", "11", str(tmp_path)]) == 0
    assert nb_path.read_text() == mine
    new = tmp_path / assignments.UPDATES / "source" / NAME / f"{NAME}.ipynb"
    assert json.loads(new.read_text())["cells"][0]["source"] != nb["cells"][0]["source"]
    said = capsys.readouterr().out
    assert f"kept {nb_path}" in said and str(new) in said
    assert sorted(p.name for p in (tmp_path / "source" / NAME).iterdir()) == [f"{NAME}.ipynb"]  # nothing else released
    _build(tmp_path, force=True)
    assert nb_path.read_text() == new.read_text()


def test_an_unedited_build_is_replaced_and_an_edited_config_kept(tmp_path):
    first = _build(tmp_path)
    assert first[NAME]["kept"] == []
    nb_path = tmp_path / "source" / NAME / f"{NAME}.ipynb"
    reformatted = json.loads(nb_path.read_text())
    nb_path.write_text(json.dumps(reformatted, indent=2))  # formatting only: labkit's own build still
    (tmp_path / "nbgrader_config.py").write_text(assignments.CONFIG + 'c.CourseDirectory.course_id = "cs-999"\n')
    again = _build(tmp_path)
    assert again[NAME]["kept"] == [(str(tmp_path / "nbgrader_config.py"),
                                    str(tmp_path / assignments.UPDATES / "nbgrader_config.py"))]
    assert "cs-999" in (tmp_path / "nbgrader_config.py").read_text()
    assert (tmp_path / assignments.UPDATES / "nbgrader_config.py").read_text() == assignments.CONFIG
    assert nb_path.read_text().startswith('{\n "cells"')  # replaced by the new build (indent 1)


def test_a_notebook_without_labkits_mark_is_kept(tmp_path):
    nb_path = tmp_path / "source" / NAME / f"{NAME}.ipynb"
    nb_path.parent.mkdir(parents=True)
    nb_path.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    assert _build(tmp_path)[NAME]["kept"] and json.loads(nb_path.read_text())["cells"] == []


def test_a_linked_source_folder_is_refused_before_anything_is_written(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "course"
    out.mkdir()
    (out / "source").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="symbolic link") as e:
        _build(out)
    assert e.value.field == "out" and "\n" not in str(e.value)
    assert not list(elsewhere.iterdir()) and not (out / "nbgrader_config.py").exists()


def test_a_linked_notebook_or_config_is_refused_on_the_command_line(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file")
    out = tmp_path / "course"
    (out / "source" / NAME).mkdir(parents=True)
    (out / "source" / NAME / f"{NAME}.ipynb").symlink_to(victim)
    assert cli(["assignments", "--tool", "nbgrader", "--chapters", "11", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out=") and "symbolic link" in err[0]
    assert victim.read_text() == "someone's file"
    os.unlink(out / "source" / NAME / f"{NAME}.ipynb")
    (out / "nbgrader_config.py").symlink_to(tmp_path / "nowhere.py")
    assert cli(["assignments", "--tool", "nbgrader", "--chapters", "11", str(out)]) == 2
    assert not (tmp_path / "nowhere.py").exists()


@pytest.mark.parametrize("build", [assignments.build_nbgrader, assignments.build_otter])
def test_an_unknown_chapter_is_named_before_the_solutions_are_looked_for(build, tmp_path, monkeypatch):
    def no_solutions():
        raise FileNotFoundError("no reference solutions (an installed labkit)")
    monkeypatch.setattr(assignments.grading, "solutions_dir", no_solutions)
    with pytest.raises(ConfigError, match="chapters"):
        build(tmp_path, ["99"])
    assert not any(tmp_path.iterdir())
