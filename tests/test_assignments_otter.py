"""The otter-grader build (issue 32), with the real tool: ``python -m labkit assignments --tool otter OUT``.

Without a kernel: every chapter builds, and otter's own ``otter assign`` accepts each source notebook as written:
one question per check with the checker's points, a public case worth 0 and a hidden one worth them all, the
hidden case only in the autograder zip, and a learner's notebook that is the chapter as it ships (otter's own
cells aside) with no line of a reference answer. With otter itself (``otter assign``, then ``otter run``, the
grading Gradescope does, without a container), for two cheap chapters without measured exercises -- 03 (about 35 s
a run in CI mode) and 00 (about 20 s):

* the reference solutions score every point (00);
* each checker's typical wrong answer (``grading.WRONG``) scores 0 on its question, its public case (the one
  ``grader.check`` runs for the learner) and its hidden one failing with the checker's own verdict -- its hint -- in the results (00: all three
  in one notebook; 03: two, after the raising cell below; 03's third, a number, is left to the nbgrader tests);
* an exercise cell that raises scores 0 on its question, "not attempted", and the questions after it in the same
  notebook are still graded (03);
* the learner's notebook untouched scores 0, every question "not attempted" (00);

and every results.json ``otter run`` writes fits Gradescope's results-file fields (tests/test_gradescope.py's
schema). Then chapter 08, which has a measured exercise: the learner's export zip carries the measurement file
and grades full. Six chapter executions in all (00: three of about 20 s, 03: one of about 35 s, 08: two of
about 15 s; CI mode, 2 cores). A plain ``python3 course.py test`` leaves out 03's run, the untouched notebook's and
chapter 08's (conftest's ``grading_scope``; nbgrader's sample chapter grades a blank release and a measured file).
"""
from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path
from unittest import mock

import jsonschema
import nbformat
import pytest

import labkit as lk
from conftest import grading_scope, load_solutions
from labkit import __main__ as cli
from labkit.base.release import SOURCE as LABKIT_SOURCE
from labkit.content import pages
from labkit.instructor import assignments, grading
from test_gradescope import SCHEMA  # Gradescope's documented results.json fields

ROOT = Path(__file__).resolve().parent.parent
# otter's own cells, and the build's empty measurement file in the measured chapters (otter's export zips it)
SUBMISSION_CELLS = re.compile(r"^(# Initialize Otter\n|grader\.check\(|## Submission\n|# Save your notebook first"
                              r"|# labkit-measurements\.json: otter)")


def _text(cell) -> str:
    return pages.source(cell)


def _chapter(name: str) -> dict:
    return json.loads(next(p for p in pages.chapters() if p.stem == name).read_text())


def _checks(nb: dict) -> list:
    """The checkers a chapter calls, in order."""
    return [grading.check_of(s) for c in nb["cells"] if c["cell_type"] == "code"
            for s in ast.parse(_text(c)).body if grading.check_of(s)]


def _assign(source: Path, dist: Path) -> Path:
    """otter's own ``otter assign`` (in this process: twelve chapters in a second), no test run; the zip."""
    from otter.assign import main as otter_assign

    otter_assign(str(source), str(dist), no_run_tests=True)
    return next((dist / "autograder").glob("*-autograder_*.zip"))


def _cases(test_file: str) -> list:
    from otter.test_files.exception_test import ExceptionTestFile  # otter's own reading of a test file

    return ExceptionTestFile.from_string(test_file).test_cases


def _solution_lines(nb: dict) -> set:
    out = set()
    for c in nb["cells"]:
        for region in re.findall(rf"{assignments.OTTER_BEGIN}\n(.*?){assignments.OTTER_END}", _text(c), re.S):
            out |= {ln.strip() for ln in region.splitlines() if len(ln.strip()) > 12 and not ln.strip().startswith("#")}
    return out


def test_every_chapter_builds_and_otter_assign_accepts_it(tmp_path):
    built = assignments.build_otter(tmp_path)
    assert sorted(built) == [p.stem for p in pages.chapters()]
    for name, summary in built.items():
        chapter, source = _chapter(name), json.loads((tmp_path / name / f"{name}.ipynb").read_text())
        nbformat.validate(nbformat.from_dict(source))  # cell ids, raw cells: a valid notebook before otter reads it
        checks = _checks(chapter)
        assert summary == {"exercises": sum(1 for c in chapter["cells"] if grading.exercise_tag(c)),
                           "checks": len(checks), "points": sum(grading.POINTS[n] for n in checks)}, name
        zip_path = _assign(tmp_path / name / f"{name}.ipynb", tmp_path / name / "dist")
        with zipfile.ZipFile(zip_path) as zf:
            tests = {Path(n).stem: zf.read(n).decode() for n in zf.namelist() if n.startswith("tests/")}
            config = json.loads(zf.read("otter_config.json"))
            # Gradescope's image installs labkit: its environment.yml carries requirements.txt (otter run uses this one)
            assert LABKIT_SOURCE in zf.read("environment.yml").decode(), name
        assert config["assignment_name"] == name and config["show_hidden"] is True
        assert sorted(tests) == sorted(checks), name
        for check, text in tests.items():  # public: passed, 0 points (grader.check's); hidden: passed, every point
            cases = _cases(text)
            assert [(c.hidden, c.points) for c in cases] == [(False, 0), (True, grading.POINTS[check])], check
            assert text.count("assert result.passed, result") == 2 and "result.attempted" not in text, check
            assert f"lk.check.{check}(" in text

        graded = "\n".join(_text(c) for c in json.loads((zip_path.parent / f"{name}.ipynb").read_text())["cells"])
        for c in chapter["cells"]:  # the autograder's notebook: each exercise's reference answer, as written
            tag = grading.exercise_tag(c)
            assert not tag or grading.solution_code(tag) in graded, (name, tag)
        student = json.loads((tmp_path / name / "dist" / "student" / f"{name}.ipynb").read_text())
        public = student["metadata"]["otter"]["tests"]
        assert sorted(public) == sorted(checks)
        assert all(not c.hidden for text in public.values() for c in _cases(text)), "a hidden case in the release"
        # the learner's copy is the chapter as it ships, once otter's own cells (init, checks, export) are set aside
        theirs = [_text(c).rstrip() for c in student["cells"]
                  if not SUBMISSION_CELLS.match(_text(c)) and _text(c).strip()]
        assert theirs == [_text(c).rstrip() for c in chapter["cells"] if _text(c).strip()], name
        release = "\n".join(_text(c) for c in student["cells"])
        shipped = "\n".join(_text(c) for c in chapter["cells"])
        leaked = [ln for ln in _solution_lines(source) if ln in release and ln not in shipped]
        assert not leaked and "BEGIN SOLUTION" not in release, f"{name}: reference lines in the release: {leaked}"
        measured = bool(set(checks) & set(grading.MEASURED))  # the learner's zip carries the measurement file
        assert f"grader.export(pdf=False{', files=' if measured else ')'}" in release
        assert ("\nrun_tests: false" in _text(source["cells"][0])) == measured  # otter assign: nothing to grade


def test_the_command_line_builds_the_otter_notebooks(tmp_path, capsys):
    chapter = _chapter("11_long_runs_and_failures")
    checks = _checks(chapter)
    n_exercises = sum(1 for c in chapter["cells"] if grading.exercise_tag(c))
    assert cli.main(["assignments", "--tool", "otter", "--chapters", "11", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (f"11_long_runs_and_failures: {n_exercises} exercises, {len(checks)} autograded tests, "
            f"{sum(grading.POINTS[n] for n in checks)} points") in out and "next: otter assign" in out
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "11_long_runs_and_failures/11_long_runs_and_failures.ipynb", "11_long_runs_and_failures/requirements.txt"]
    assert cli.main(["assignments", "--tool", "otter", "--chapters", "3", str(tmp_path / "b")]) == 2
    assert "chapters=['3']" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_a_measured_chapter_starts_with_an_empty_measurement_file_so_export_never_stops(tmp_path, monkeypatch):
    """otter's export stops on a missing file it is told to zip: a learner who has not run a measured exercise
    must still hand in the rest. The build's first code cell makes an empty file that labkit reads as empty and
    keeps a saved one as it is; chapters without a measured exercise get no such cell."""
    from labkit.chapters import measured

    for path in pages.chapters():
        cells = assignments.otter_cells(json.loads(path.read_text()), path.stem)
        has = [c for c in cells if _text(c) == assignments.EMPTY_MEASUREMENTS]
        wants = bool(set(_checks(json.loads(path.read_text()))) & set(grading.MEASURED))
        assert len(has) == wants, path.stem
        if wants:
            first_code = next(c for c in cells if c["cell_type"] == "code")
            assert first_code is has[0], path.stem
            assert "labkit-measurements.json" in _text(cells[0])  # the export's files
    monkeypatch.chdir(tmp_path)
    exec(assignments.EMPTY_MEASUREMENTS, {})
    assert measured.read() == {}
    (tmp_path / measured.FILE).write_text('{"format": 1, "entries": {"x": {}}}\n')
    exec(assignments.EMPTY_MEASUREMENTS, {})  # a file the learner's checks wrote stays as it is
    assert "x" in json.loads((tmp_path / measured.FILE).read_text())["entries"]


def test_a_chapter_line_otter_would_rewrite_is_refused():
    nb = {"cells": [{"cell_type": "code", "id": "x1", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": "seed = 3  # SEED\n"}]}
    with pytest.raises(ValueError, match=r"03_x, cell x1: .*# SEED"):
        assignments.otter_cells(nb, "03_x")
    nb["cells"][0]["source"] = "# Ignore the warnings below\nx = 1\n"
    with pytest.raises(ValueError, match="otter drops a cell"):
        assignments.otter_cells(nb, "03_x")


# ---- with otter itself ------------------------------------------------------------------------------------


def _env() -> dict:
    """CI-mode chapters, this checkout's labkit in the kernel, the environment's bin/ first on PATH."""
    return {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT),
            "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """``otter assign`` of chapters 03 and 00: {name: (its output folder, the autograder zip)}."""
    out = tmp_path_factory.mktemp("otter-class")
    built = assignments.build_otter(out, ["00", "03"])
    return {name: (out / name / "dist", _assign(out / name / f"{name}.ipynb", out / name / "dist")) for name in built}


def _answer_code(tag: str, role: str) -> str:
    if role == "raise":  # the learner's cell fails before its answer is written
        return 'raise RuntimeError("a bug in the learner\'s cell")'
    if role == "wrong":  # the typical wrong answer, built as the reference one is
        with mock.patch.dict(grading.ANSWERS, {tag: grading.WRONG[tag]}):
            return grading.solution_code(tag)
    return grading.solution_code(tag)


def _submission(dist: Path, name: str, roles: dict, folder: Path) -> Path:
    """The learner's notebook from ``otter assign``, each exercise answered as ``roles`` says ({tag: "reference" |
    "wrong" | "raise"}; an exercise not named stays untouched): the answer right after the placeholder."""
    nb = json.loads((dist / "student" / f"{name}.ipynb").read_text())
    for cell in nb["cells"]:
        tag = grading.exercise_tag(cell) if cell["cell_type"] == "code" else None
        if tag in roles:
            lines = _text(cell).splitlines()
            end = grading.placeholder_end(ast.parse(_text(cell)), grading.ANSWERS[tag])
            cell["source"] = "\n".join(lines[:end] + [_answer_code(tag, roles[tag])] + lines[end:])
    folder.mkdir(parents=True)
    path = folder / f"{name}.ipynb"
    path.write_text(json.dumps(nb))
    return path


def _otter_run(zip_path: Path, notebook: Path, monkeypatch=None):
    """``otter run`` of one notebook: {question: its entry in results.json}, the file checked against Gradescope's
    fields first; and the notebook as it ran. ``monkeypatch`` given: otter run's own function in this process
    (what its command line calls), whose results hold the executed notebook; else the command line."""
    t0 = time.perf_counter()
    executed = None
    if monkeypatch is None:
        done = subprocess.run([sys.executable, "-m", "otter", "run", "--no-logo", "-a", str(zip_path), "-o",
                               str(notebook.parent), str(notebook)], env=_env(), capture_output=True, text=True,
                              timeout=600, cwd=notebook.parent)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    else:
        import otter.run

        for key, value in _env().items():
            monkeypatch.setenv(key, value)  # the kernel's environment
        executed = otter.run.main(str(notebook), autograder=str(zip_path), output_dir=str(notebook.parent),
                                  no_logo=True).notebook
    print(f"\notter run, {notebook.stem}, {notebook.parent.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    results = json.loads((notebook.parent / "results.json").read_text())
    jsonschema.validate(results, SCHEMA)
    tests = {t["name"]: t for t in results["tests"]}
    assert len(tests) == len(results["tests"]) and {t["visibility"] for t in tests.values()} == {"after_published"}
    return tests, executed


@functools.lru_cache(maxsize=1)
def _sol():
    return types.SimpleNamespace(**{f: load_solutions(f) for f in grading.FAMILIES})


def _verdict(tag: str, name: str) -> str | None:
    """The checker's own verdict on the wrong answer, judged here, or None where the answer needs the chapter's
    state (its kernel)."""
    sol = _sol()
    (expr,) = grading.WRONG[tag].values()
    try:
        answer = eval(expr, {"sol": sol, "lk": lk})  # noqa: S307 -- the course's own answer table
    except NameError:
        return None
    return getattr(lk.check, name)(answer).message


def _tags(name: str) -> dict:
    """{exercise tag: the checker of its question}, in the chapter's order."""
    out, pending = {}, None
    for c in _chapter(name)["cells"]:
        if c["cell_type"] != "code":
            continue
        pending = grading.exercise_tag(c) or pending
        check = next((grading.check_of(s) for s in ast.parse(_text(c)).body if grading.check_of(s)), None)
        if check and pending:
            out[pending], pending = check, None
    return out


def _assert_graded(tests: dict, name: str, roles: dict) -> None:
    """Each question scored as its answer deserves, with the check's verdict as its feedback."""
    tags = _tags(name)
    assert sorted(tests) == sorted(tags.values())
    for tag, check in tags.items():
        role, t = roles.get(tag, "blank"), tests[check]
        assert t["max_score"] == grading.POINTS[check], check
        if role == "reference":
            assert t["score"] == t["max_score"] and "All test cases passed" in t["output"], (check, t["output"])
            continue
        assert t["score"] == 0, (check, role, t["output"])
        assert "All test cases passed" not in t["output"], (check, role, t["output"])
        if role == "wrong":  # attempted, not passed: both cases fail, with the hint (issue 49: the public one too)
            assert re.search(r" - 1 result:\s+❌", t["output"]) and f"not yet [{check}]" in t["output"], t["output"]
            verdict = _verdict(tag, check)
            assert verdict is None or verdict in t["output"], (verdict, t["output"])
        else:  # raised or untouched: nothing attempted, already the public case says so
            assert re.search(r" - 1 result:\s+❌", t["output"]), t["output"]
            assert f"not attempted yet [{check}]" in t["output"], t["output"]


def test_otter_run_gives_the_reference_every_point(dists, tmp_path, no_leftover_processes):
    name = "00_start_here"
    dist, zip_path = dists[name]
    roles = dict.fromkeys(_tags(name), "reference")
    tests, _ = _otter_run(zip_path, _submission(dist, name, roles, tmp_path / "reference"))
    _assert_graded(tests, name, roles)
    assert sum(t["score"] for t in tests.values()) == sum(grading.POINTS[c] for c in _tags(name).values())


@pytest.mark.skipif(grading_scope() == "sample", reason="run in CI (CI=true) or with LABKIT_GRADE_ALL=1: a plain "
                    "`course.py test` leaves out chapter 03's otter run (its 12 minutes)")
def test_otter_run_scores_a_raising_cell_zero_and_still_grades_the_questions_after_it(
        dists, tmp_path, monkeypatch, no_leftover_processes):
    name = "03_gradient_accumulation"
    dist, zip_path = dists[name]
    first, *rest = _tags(name)
    roles = {first: "raise", **dict.fromkeys(rest, "wrong")}  # the first exercise's cell raises; then wrong answers
    tests, executed = _otter_run(zip_path, _submission(dist, name, roles, tmp_path / "raise"), monkeypatch)
    errors = [(o["ename"], o["evalue"], grading.exercise_tag(c)) for c in executed.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors == [("RuntimeError", "a bug in the learner's cell", first)], errors  # it raised, and only there
    _assert_graded(tests, name, roles)


def test_otter_run_scores_each_typical_wrong_answer_zero_with_its_hint(dists, tmp_path, no_leftover_processes):
    name = "00_start_here"
    dist, zip_path = dists[name]
    roles = dict.fromkeys(_tags(name), "wrong")
    _assert_graded(_otter_run(zip_path, _submission(dist, name, roles, tmp_path / "wrong"))[0], name, roles)


@pytest.mark.skipif(grading_scope() == "sample", reason="run in CI (CI=true) or with LABKIT_GRADE_ALL=1: a plain "
                    "`course.py test` grades a blank notebook and a measured file with nbgrader's sample chapter")
def test_otter_run_scores_the_untouched_notebook_zero_not_attempted(dists, tmp_path, no_leftover_processes):
    name = "00_start_here"
    dist, zip_path = dists[name]
    tests, _ = _otter_run(zip_path, _submission(dist, name, {}, tmp_path / "blank"))
    _assert_graded(tests, name, {})
    assert sum(t["score"] for t in tests.values()) == 0


@pytest.mark.skipif(grading_scope() == "sample", reason="run in CI (CI=true) or with LABKIT_GRADE_ALL=1: a plain "
                    "`course.py test` grades a blank notebook and a measured file with nbgrader's sample chapter")
def test_a_measured_chapter_export_zip_carries_the_measurements_and_otter_grades_it_full(
        tmp_path, no_leftover_processes):
    """Chapter 08 (the cheapest with a measured exercise): the learner runs the notebook (here: the reference),
    otter's export cell zips it with labkit-measurements.json, and ``otter run`` of that zip -- which runs the
    notebook again in grading mode, where the measured check judges the saved file (without it: 0, "no
    measurement saved") -- gives every point."""
    name = "08_memory_in_practice"
    assignments.build_otter(tmp_path, ["08"])
    zip_path = _assign(tmp_path / name / f"{name}.ipynb", tmp_path / name / "dist")
    learner = tmp_path / "learner"
    learner.mkdir()
    notebook = learner / f"{name}.ipynb"
    notebook.write_text((zip_path.parent / f"{name}.ipynb").read_text())
    done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                           str(notebook)], env=_env(), cwd=learner, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (export,) = learner.glob(f"{name}_*.zip")  # what the export cell wrote: the learner's submission
    with zipfile.ZipFile(export) as zf:
        assert {f"{name}.ipynb", "labkit-measurements.json"} <= set(zf.namelist())
    submitted = tmp_path / "submitted"
    submitted.mkdir()
    tests, _ = _otter_run(zip_path, Path(export.replace(submitted / export.name)))
    assert set(grading.MEASURED) & set(tests), "no measured exercise in this chapter"
    for check, t in tests.items():
        assert t["score"] == t["max_score"] == grading.POINTS[check], (check, t["output"])


@pytest.mark.skipif(grading_scope() == "sample", reason="run in CI (CI=true) or with LABKIT_GRADE_ALL=1: a plain "
                    "`course.py test` checks otter's public case in the wrong-answer grading above")
def test_grader_check_in_the_learners_notebook_shows_the_hint_and_never_all_passed_on_a_wrong_answer(
        dists, tmp_path, no_leftover_processes):
    """Issue 49: ``grader.check("x")`` said "All test cases passed!" right under the checker's own "not yet". The
    learner's notebook from ``otter assign``, every exercise answered wrong, run as the learner runs it."""
    name = "00_start_here"
    dist, _ = dists[name]
    path = _submission(dist, name, dict.fromkeys(_tags(name), "wrong"), tmp_path / "wrong")
    nb = nbformat.read(path, as_version=4)
    import nbclient

    nbclient.NotebookClient(nb, timeout=600, allow_errors=True, resources={"metadata": {"path": str(path.parent)}},
                            env=_env()).execute()
    shown = {}
    for c in nb.cells:
        found = re.match(r'grader\.check\("(\w+)"\)', _text(c)) if c.cell_type == "code" else None
        if found:
            shown[found.group(1)] = json.dumps([o.get("data", o.get("text", "")) for o in c.outputs],
                                               ensure_ascii=False)
    assert sorted(shown) == sorted(_tags(name).values())
    for check, text in shown.items():
        assert "All test cases passed" not in text and f"not yet [{check}]" in text, (check, text[:2000])
