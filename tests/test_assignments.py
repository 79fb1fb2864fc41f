"""The graded build (issue 32), with the real tool: ``python -m labkit assignments --tool nbgrader OUT``.

Without a kernel: every checker has its points, and the instructor kit's table says the same; every chapter
builds, nbgrader's own metadata validator accepts every notebook, each exercise is one solution cell holding
its reference answer, each check one test cell. With nbgrader itself (in a temporary course folder):
``generate_assignment`` accepts the folder as written and its release holds no solution; ``autograde`` gives
the reference solutions every point and an untouched release none, each failed test saying "not attempted".
Chapter 03 is the one autograded: its cells are cheap (about 50 s a run in CI mode on 2 cores).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import labkit.check
from labkit import __main__ as cli
from labkit.check import grading
from labkit.content import answers, assignments, pages

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = "03_gradient_accumulation"  # the chapter autograded here


def _kit_table() -> dict:
    """{checker: "grade" | "practice"} from notebooks/README.md's "Which exercises to grade"."""
    text = (ROOT / "notebooks" / "README.md").read_text()
    section = text.split("## Which exercises to grade")[1].split("\n## ")[0]
    out = {}
    for line in section.splitlines():
        if re.match(r"\| \d\d ", line):
            cols = line.split("|")
            out.update({n: "grade" for n in re.findall(r"`(\w+)`", cols[2])})
            out.update({n: "practice" for n in re.findall(r"`(\w+)`", cols[3])})
    return out


def test_every_checker_has_points_and_the_kit_says_the_same():
    assert sorted(grading.POINTS) == sorted(labkit.check.names())
    kit = _kit_table()
    assert sorted(kit) == sorted(grading.POINTS), "the instructor kit's table and POINTS name other checkers"
    for name, kind in kit.items():
        assert grading.POINTS[name] == {"grade": grading.GRADE, "practice": grading.PRACTICE}[kind], name
    assert set(grading.MEASURED) <= set(grading.POINTS)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    out = tmp_path_factory.mktemp("labkit-class")
    return out, assignments.build_nbgrader(out)


def _nb(out: Path, name: str, step="source") -> dict:
    return json.loads((out / step / name / f"{name}.ipynb").read_text())


def _text(cell) -> str:
    return pages.source(cell)


def test_every_chapter_builds_and_nbgrader_accepts_its_metadata(course):
    from nbgrader.nbgraderformat import MetadataValidator  # the real tool's own check of the cells
    import nbformat

    out, built = course
    assert sorted(built) == [p.stem for p in pages.chapters()]
    assert (out / "nbgrader_config.py").is_file()
    for name, summary in built.items():
        nb = nbformat.reads((out / "source" / name / f"{name}.ipynb").read_text(), as_version=4)
        nbformat.validate(nb)
        MetadataValidator().validate_nb(nb)
        cells = nb.cells
        graded = [c for c in cells if c.metadata.get("nbgrader", {}).get("grade")]
        solutions = [c for c in cells if c.metadata.get("nbgrader", {}).get("solution")]
        original = json.loads(pages.chapters()[int(name[:2])].read_text())["cells"]
        n_checks = sum(len(re.findall(r"\blk\.check\.\w+\(", _text(c))) for c in original)
        assert len(graded) == summary["checks"] == n_checks, name
        assert len(solutions) == summary["exercises"] >= 3, name
        assert summary["points"] == sum(grading.POINTS[c.metadata.nbgrader.grade_id.split("-", 2)[2]]
                                        for c in graded)
        for c in graded:  # the test: the check, then the assert; no trailing expression (nbgrader's score)
            tree = ast.parse(c.source)
            assert isinstance(tree.body[-1], ast.Assert) and c.metadata.nbgrader.locked
        for c in solutions:
            assert c.source.count(assignments.BEGIN) == 1 == c.source.count(assignments.END)
        unmarked = [c for c in cells if "nbgrader" not in c.metadata]
        assert all(re.search(r"^my_guess\w* = ", c.source, re.M) for c in unmarked), "only predictions unlocked"


def test_each_reference_answer_is_code_that_defines_its_placeholders():
    for tag, placeholders in answers.ANSWERS.items():
        code = assignments.solution_code(tag)
        tree = ast.parse(code)
        defined = {n for s in tree.body for n in assignments._binds(s)}
        assert set(placeholders) <= defined, tag
        assert "sol." not in code, tag


def test_the_command_line_builds_and_says_what_is_not_built(tmp_path, capsys):
    assert cli.main(["assignments", "--tool", "nbgrader", "--chapters", "11", str(tmp_path)]) == 0
    assert "11_long_runs_and_failures: 4 exercises, 4 autograded tests, 7 points" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nbgrader_config.py", "source"]
    assert cli.main(["assignments", "--tool", "otter", str(tmp_path / "o")]) == 2
    assert "not built yet" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert cli.main(["assignments", "--tool", "nbgrader", "--chapters", "3", str(tmp_path / "b")]) == 2
    assert "chapters=['3']" in capsys.readouterr().err and not (tmp_path / "b").exists()


# ---- with nbgrader itself --------------------------------------------------------------------------------


def _nbgrader(course_dir: Path, *args, timeout=600):
    """`nbgrader <args>` in the course folder: CI-mode chapters, this checkout's labkit in the kernel, and the
    environment's bin/ on PATH (nbgrader runs `alembic` for its gradebook)."""
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course_dir, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _solution_lines(nb) -> set:
    """The lines of code inside the solution regions (comments and short lines aside)."""
    out = set()
    for c in nb["cells"]:
        text = _text(c)
        for region in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", text, re.S):
            out |= {ln.strip() for ln in region.splitlines() if len(ln.strip()) > 12 and not ln.strip().startswith("#")}
    return out


def test_nbgrader_releases_no_solution_and_autogrades_the_reference_full_and_a_blank_zero(tmp_path):
    from nbgrader.api import Gradebook

    assignments.build_nbgrader(tmp_path, [CHAPTER[:2]])
    source = _nb(tmp_path, CHAPTER)
    _nbgrader(tmp_path, "generate_assignment", CHAPTER, "--force")
    release = "\n".join(_text(c) for c in _nb(tmp_path, CHAPTER, "release")["cells"])
    assert "BEGIN SOLUTION" not in release and "reference answer" not in release
    chapter = "\n".join(_text(c) for c in json.loads(pages.chapters()[int(CHAPTER[:2])].read_text())["cells"])
    solution = _solution_lines(source)
    assert len(solution) > 5
    leaked = [ln for ln in solution if ln in release and ln not in chapter]  # the chapter's own lines aside
    assert not leaked, f"reference-solution lines in the release: {leaked}"

    for student, nb_path in (("ref", tmp_path / "source" / CHAPTER), ("blank", tmp_path / "release" / CHAPTER)):
        dest = tmp_path / "submitted" / student / CHAPTER
        dest.mkdir(parents=True)
        (dest / f"{CHAPTER}.ipynb").write_text((nb_path / f"{CHAPTER}.ipynb").read_text())
    t0 = time.perf_counter()
    _nbgrader(tmp_path, "autograde", CHAPTER, "--force")
    print(f"\nnbgrader autograde, {CHAPTER}, two submissions: {time.perf_counter() - t0:.0f} s", flush=True)

    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission_notebook(CHAPTER, CHAPTER, s) for s in ("ref", "blank")}
        ref, blank = scores["ref"], scores["blank"]
        assert ref.max_score == 5 and ref.score == ref.max_score, [(g.name, g.score) for g in ref.grades]
        assert blank.score == 0, [(g.name, g.score) for g in blank.grades]
    graded = json.loads((tmp_path / "autograded" / "blank" / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    errors = [o for c in graded["cells"] if c.get("id", "").endswith("-check") for o in c["outputs"]
              if o["output_type"] == "error"]
    assert len(errors) == 3 and all("not attempted" in o["evalue"] for o in errors), errors
