"""The graded build (issue 32), with the real tool: ``python -m labkit assignments --tool nbgrader OUT``.

Without a kernel: every checker has its points, and the instructor kit's table says the same; every chapter
builds, nbgrader's own metadata validator accepts every notebook, each exercise is one solution cell holding
its reference answer, starting at its placeholder (the given context above it: a locked cell), each check one test
cell, which imports labkit itself and writes nothing to stderr (nbgrader's 0) even when the learner's function
warns; ``grading.WRONG`` holds one typical wrong answer per exercise,
and each fails its checker -- attempted, not tampered with, with a hint -- wherever the check needs none of the
chapter's own state (``CHAPTER_STATE``: those are graded in the chapter, below).

With nbgrader itself, chapter by chapter (``grade_chapter``, in a temporary course folder): ``generate_assignment``
accepts the folder as written, and its release holds no solution and no hidden test (each test cell shows its
public half: "passed" in the learner's kernel and Validate, "attempted" while graded); one ``autograde`` call grades three submissions -- two mixed ones, in which every
exercise gets its reference answer (full points) and its typical wrong answer (0, the checker's hint as the
feedback line) in turn and one exercise cell raises before its answer is set (0, "not attempted", the others
still graded), and the untouched release (0, every test "not attempted") -- for SAMPLE's chapter, or every chapter
with ``LABKIT_GRADE_ALL=1``; CI's other chapters are graded once, one mixed submission (``fully_graded`` says what
proves the rest). Grading restores each test cell's
hidden half from the source. The measured exercises (``grading.MEASURED``) are graded from the learner's saved
labkit-measurements.json while grading: these submissions carry none, so their reference is not asserted at full
points here (their wrong answer, a raising cell or a blank must still score 0). ``grade_learners_run`` does the
learner's part for them: the reference run outside grading saves the file, and autograde then gives every test
of the chapter, measured ones included, its full points.

One chapter's full grading (three notebook runs in CI mode) took 40-230 s on 2 shared cores, so how many chapters
nbgrader grades depends on who runs the tests (conftest's ``grading_scope``): a plain ``python3 course.py test``
grades ``SAMPLE`` (one chapter, with exercises graded from the notebook and one from the measurement file), which
keeps the README's command within its 12 minutes on 2 cores; CI (the ``CI`` variable set, as ``.ci/run`` does) grades nine chapters; ``LABKIT_GRADE_ALL=1``
every chapter and the learner's-run tests. The chapters are split between this file (``GRADED_HERE``) and
tests/test_assignments_grade.py (``GRADED_THERE``); each chapter is a unit of work of its own for the two xdist
workers (tests/conftest.py's ``work_unit``).
``GRADE_ALL_ONLY`` -- chapter 10, whose layout-widget cell once stalled nbgrader's kernel client for its 600 s
cell timeout (one run in four, cause not found); chapter 03, which CI's hub leg grades with nbgrader across real
users (tests/test_hub.py); chapter 09, the slowest after 05 (200 s), left out to make room for that leg; chapter 12,
whose four-process demos make each of its runs as long as its nbval budget (up to 120 s) -- and the
learner's-run test of the measured chapters (chapter
08's runs in tests/test_measurements.py) run only with ``LABKIT_GRADE_ALL=1``, to keep CI's time.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import labkit.check
from conftest import grading_scope
from labkit import __main__ as cli
from labkit.content import pages
from labkit.instructor import assignments, grading

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = [p.stem for p in pages.chapters()]
# Graded in CI by this file and by tests/test_assignments_grade.py (GRADED_THERE); the rest only with
# LABKIT_GRADE_ALL=1, to keep CI's time; SAMPLE alone in a plain `course.py test` (see the module docstring).
GRADED_HERE = ["04_activation_checkpointing", "05_data_loader", "08_memory_in_practice"]
GRADED_THERE = ["00_start_here", "01_measure_first", "02_mixed_precision", "06_ddp_allreduce", "07_kernels_and_compile",
                "11_long_runs_and_failures"]
GRADE_ALL_ONLY = [c for c in CHAPTERS if c not in GRADED_HERE + GRADED_THERE]
SAMPLE = ["08_memory_in_practice"]  # exercises graded from the notebook and one graded from the measurement file


def chapter_params(chapters):
    """pytest parameters for ``chapters``: those outside ``grading_scope()``'s set are skipped, with the reason."""
    scope = grading_scope()

    def why(c):
        if c in GRADE_ALL_ONLY and scope != "all":
            return "graded with LABKIT_GRADE_ALL=1 only (CI's time)"
        if c not in SAMPLE and scope == "sample":
            return "graded in CI (CI=true) or with LABKIT_GRADE_ALL=1; a plain run grades " + ", ".join(SAMPLE)
        return None

    return [pytest.param(c, marks=pytest.mark.skipif(why(c) is not None, reason=why(c) or "")) for c in chapters]


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
    from traitlets.config.loader import PyFileConfigLoader  # the config as nbgrader reads it

    config = PyFileConfigLoader("nbgrader_config.py", path=str(out)).load_config()
    assert config.OverwriteCells.add_missing_cells is True and config.Execute.timeout == 600
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
        for c in graded:  # the test: the check, then the asserts; no trailing expression (nbgrader's score)
            tree = ast.parse(c.source)
            assert isinstance(tree.body[-1], ast.Assert) and c.metadata.nbgrader.locked
            public, hidden = c.source.split(assignments.HIDDEN_BEGIN)  # the learner's: "passed"; graded: hidden
            assert re.search(PUBLIC, public, re.M) and re.search(r"^assert (\w+)\.passed, \1$", hidden, re.M)
            assert hidden.rstrip().endswith(assignments.HIDDEN_END)
        for c in solutions:
            assert c.source.count(assignments.BEGIN) == 1 == c.source.count(assignments.END)
        unmarked = [c for c in cells if "nbgrader" not in c.metadata]
        assert all(re.search(r"^my_guess\w* = ", c.source, re.M) for c in unmarked), "only predictions unlocked"


def test_a_measured_test_cell_reads_no_notebook_name_while_graded(course, monkeypatch):
    """nbgrader does not put back a deleted locked cell: while graded, a measured check's test cell must not need
    the names those cells made (the check judges the saved file); outside grading it checks the live values.
    (The cell imports labkit itself: a stand-in module takes its place.)"""
    out, _ = course
    calls = []

    def fake_check(name):
        def check(*args, **kwargs):
            calls.append((name, args))
            return types.SimpleNamespace(attempted=True, passed=True)
        return check

    seen = set()
    for path in pages.chapters():
        for c in _nb(out, path.stem)["cells"]:
            grade_id = c["metadata"].get("nbgrader", {}).get("grade_id", "")
            name = grade_id.split("-", 2)[2] if grade_id.startswith("check-") else None
            if name not in grading.MEASURED:
                continue
            seen.add(name)
            for tool, live in (("nbgrader", False), (None, True)):
                check = types.SimpleNamespace(grading_tool=lambda tool=tool: tool, SAVED=labkit.check.SAVED,
                                              **{name: fake_check(name)})
                calls.clear()
                monkeypatch.setitem(sys.modules, "labkit", types.SimpleNamespace(check=check))
                # the stand-in is a change the real seal reports (issue 45): the cell reads a stand-in seal too
                monkeypatch.setitem(sys.modules, "labkit.check._guard", types.SimpleNamespace(changes=list))
                try:
                    exec(_text(c), {"display": print})  # no name of the notebook (display: IPython's builtin)
                except NameError:
                    assert live, f"{grade_id}: its test cell reads the notebook's names while graded"
                else:
                    assert calls == [(name, (labkit.check.SAVED,))] and not live, (grade_id, calls)
    assert seen == set(grading.MEASURED)


def test_an_exercises_context_is_a_locked_cell_and_its_solution_cell_starts_at_the_placeholder(course):
    """The statements above an exercise's first placeholder (chapter 08's ``n_params = fu["n_params"]``) are given,
    not the learner's: a locked cell of their own, which grading puts back; the solution cell starts at the
    placeholder. Together the two cells hold the chapter's code as it was (the solution region aside)."""
    out, _ = course
    contexts = {}
    for path in pages.chapters():
        original = {c["id"]: _text(c) for c in json.loads(path.read_text())["cells"]}
        cells = _nb(out, path.stem)["cells"]
        for i, c in enumerate(cells):
            if not _nbg(c).get("solution"):
                continue
            tag, text = _nbg(c)["grade_id"], _text(c)
            first = ast.parse(text).body[0]
            assert grading.binds(first) & set(grading.ANSWERS[tag]), f"{tag} starts with {ast.unparse(first)}"
            context = cells[i - 1] if _nbg(cells[i - 1]).get("grade_id") == f"cell-{c['id']}-context" else None
            if context:
                assert _nbg(context)["locked"] and not _nbg(context)["solution"], tag
                contexts[tag] = _text(context)
            start, end = text.index(assignments.BEGIN), text.index(assignments.END) + len(assignments.END)
            given = (contexts.get(tag, "") + "\n" + text[:start] + text[end:]).split()
            assert original[c["id"]].split()[:len(given)] == given, tag
    assert contexts["exercise-08-step2"] == 'n_params = fu["n_params"]'
    assert contexts["exercise-06-predict-calls"].startswith('n_buckets = s["n_buckets"]')
    assert contexts["exercise-04-budget-pick"].startswith("budget = 0.6 * ")


def test_a_deleted_test_cell_has_a_solution_or_test_cell_before_it_to_be_put_back_after(course):
    """nbgrader (OverwriteCells.add_missing_grade_cells) puts a deleted test cell back after the cell before it in
    the source, and fails the whole submission (KeyError) when that cell is neither a solution nor a test cell.
    Every test cell has one but chapter 09's budget challenge, whose check follows a locked cell (the chapter's run
    of the learner's pick): known, and named here so that no other one comes unnoticed."""
    out, _ = course
    after_locked = set()
    for path in pages.chapters():
        cells = _nb(out, path.stem)["cells"]
        for before, c in zip(cells, cells[1:]):
            if _nbg(c).get("grade") and not (_nbg(before).get("grade") or _nbg(before).get("solution")):
                after_locked.add(_nbg(c)["grade_id"])
    assert after_locked == {"check-09-budget_challenge"}


def test_cis_one_submission_grades_a_reference_and_a_wrong_answer_judged_in_each_chapter(course):
    """Where a chapter is graded once (``fully_graded``), that run still grades a reference and a wrong answer judged
    in the chapter (not from a measurement file), and in most chapters a raising cell; every exercise whose check
    reads the chapter's state takes its wrong answer."""
    out, _ = course
    raising = 0
    for path in pages.chapters():
        tests = _tests_of(_nb(out, path.stem))
        measured = {t for t, g in tests.items() if g.split("-", 2)[2] in grading.MEASURED}
        (plan,) = one_submission(list(tests), measured).values()
        assert sorted(plan) == sorted(tests), path.stem
        assert list(plan.values()).count("raises") <= 1, path.stem
        raising += list(plan.values()).count("raises")
        assert any(r == "reference" and t not in measured for t, r in plan.items()), (path.stem, plan)
        assert any(r == "wrong" and t not in measured for t, r in plan.items()), (path.stem, plan)
        assert all(plan[t] == "wrong" for t in CHAPTER_STATE & set(plan)), (path.stem, plan)
    assert raising >= len(GRADED_HERE + GRADED_THERE) // 2  # most chapters grade a raising cell too


STAND_IN_LABKIT = """
import sys, types, warnings

class _Check:
    SAVED = "saved"

    def grading_tool(self):
        return "nbgrader"

    def __getattr__(self, name):
        def check(*args, **kwargs):
            warnings.warn(f"{name}: a warning from the learner's function")
            print(f"{name}: a line written to stderr", file=sys.stderr)
            return types.SimpleNamespace(attempted=True, passed=True)
        return check

check = _Check()
"""

RUN_TEST_CELLS = """
import json, pathlib, sys, warnings
sys.path.insert(0, sys.argv[1])
sources = json.loads(pathlib.Path(sys.argv[2]).read_text())
warnings.simplefilter("always")

class Names(dict):  # the notebook's names: any the cell reads is there (display: IPython's builtin in a kernel)
    def __missing__(self, name):
        return print if name == "display" else 0

for source in sources:
    exec(source, {"lk": None}, Names())  # the learner bound lk to something else
import labkit
print("stand-in:", labkit.__file__)
"""


def test_a_test_cell_uses_the_real_labkit_and_writes_nothing_to_stderr(course, tmp_path):
    """nbgrader scores 0 a test cell that wrote to stderr: each test cell imports labkit itself (the learner may
    have rebound ``lk``) and sends the check's stderr -- a warning raised in the learner's function among it -- to
    stdout. Every test cell of every chapter, run by a bare Python with a stand-in labkit whose checks warn."""
    out, _ = course
    (tmp_path / "labkit").mkdir()
    (tmp_path / "labkit" / "__init__.py").write_text(STAND_IN_LABKIT)
    sources = [_text(c) for p in pages.chapters() for c in _nb(out, p.stem)["cells"] if _nbg(c).get("grade")]
    (tmp_path / "cells.json").write_text(json.dumps(sources))
    (tmp_path / "run.py").write_text(RUN_TEST_CELLS)
    done = subprocess.run([sys.executable, "-S", str(tmp_path / "run.py"), str(tmp_path), str(tmp_path / "cells.json")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert f"stand-in: {tmp_path / 'labkit' / '__init__.py'}" in done.stdout
    assert done.stdout.count("UserWarning: ") == len(sources) >= 40, done.stdout[-2000:]
    assert done.stdout.count("a line written to stderr") == len(sources)


def test_each_reference_answer_is_code_that_defines_its_placeholders():
    for tag, placeholders in grading.ANSWERS.items():
        code = grading.solution_code(tag)
        tree = ast.parse(code)
        defined = {n for s in tree.body for n in grading.binds(s)}
        assert set(placeholders) <= defined, tag
        assert "sol." not in code, tag


def test_the_command_line_builds_and_says_what_is_not_built(tmp_path, capsys):
    assert cli.main(["assignments", "--tool", "nbgrader", "--chapters", "11", str(tmp_path)]) == 0
    assert "11_long_runs_and_failures: 4 exercises, 4 autograded tests, 7 points" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nbgrader_config.py", "source"]
    assert cli.main(["assignments", "--tool", "nbgrader", "--chapters", "3", str(tmp_path / "b")]) == 2
    assert "chapters=['3']" in capsys.readouterr().err and not (tmp_path / "b").exists()


# ---- the typical wrong answers, without a kernel -----------------------------------------------------------

# Exercises whose check reads the chapter's own state (its runs, its tables): their wrong answers are graded by
# the nbgrader tests below, which run the chapter. The names a check call reads that a stand-in can give:
CHAPTER_STATE = {"exercise-01-low-mfu", "exercise-04-predict-overhead", "exercise-04-budget-pick",
                 "exercise-05-loader-reading", "exercise-07-read-profile", "exercise-09-budget"}
STAND_INS = {"n_params": 1_000_000, "n_buckets": 3}  # chapter 08's model size, chapter 06's bucket count


def _exercise_cells() -> dict:
    """{exercise tag: (chapter, the cell's source)} for every chapter."""
    out = {}
    for path in pages.chapters():
        for cell in json.loads(path.read_text())["cells"]:
            tag = grading.exercise_tag(cell)
            if tag:
                out[tag] = (path.stem, _text(cell))
    return out


def _solution_modules():
    import importlib.util
    import types

    def load(name):
        spec = importlib.util.spec_from_file_location(f"solutions_{name}", grading.solutions_dir() / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return types.SimpleNamespace(**{n: load(n) for n in grading.FAMILIES})


def test_every_exercise_has_one_typical_wrong_answer_and_it_fails_its_check_with_a_hint(tmp_path, monkeypatch):
    import labkit as lk

    monkeypatch.chdir(tmp_path)  # a measured check saves what it judged in the working folder

    cells = _exercise_cells()
    assert sorted(grading.WRONG) == sorted(grading.ANSWERS) == sorted(cells)
    sol, graded = _solution_modules(), []
    for tag, wrong in grading.WRONG.items():
        assert sorted(wrong) == sorted(grading.ANSWERS[tag]), f"{tag}: WRONG fills other placeholders than ANSWERS"
        code = grading.solution_code(tag, table=grading.WRONG)  # what a test's submission puts in the cell
        assert set(wrong) <= {n for s in ast.parse(code).body for n in grading.binds(s)}, tag
        calls = [n for n in ast.walk(ast.parse(cells[tag][1])) if grading.is_check_call(n)]
        if tag in CHAPTER_STATE or not calls:
            continue
        ns = {"lk": lk, "sol": sol, **STAND_INS}
        for name, expr in wrong.items():
            ns[name] = eval(expr, ns)  # noqa: S307 -- the project's own table of answers
        result = eval(compile(ast.Expression(calls[0]), tag, "eval"), ns)  # noqa: S307 -- the chapter's check call
        assert result.attempted and not result.tampered, (tag, result)
        assert not result.passed, f"{tag}: the typical wrong answer passes its check: {result}"
        assert result.message.strip(), tag
        graded.append(tag)
    assert sorted(set(grading.WRONG) - set(graded)) == sorted(CHAPTER_STATE)


# ---- with nbgrader itself --------------------------------------------------------------------------------

# a test cell's public half: a pass in the learner's kernel and in Validate, an attempt while graded (issue 49)
PUBLIC = r"^assert (\w+)\.passed if lk\.check\.grading_tool\(\) is None else \1\.attempted, \1$"
RAISES = 'raise RuntimeError("the learner\'s cell fails before its answer is set")'
NO_FILE = "no measurement saved"  # a measured check's verdict while grading a submission without the file


def _env_nbgrader() -> dict:
    """CI-mode chapters, this checkout's labkit in the kernel, the environment's bin/ first on PATH."""
    return {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT),
            "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}


def _nbgrader(course_dir: Path, *args, timeout=900):
    """`nbgrader <args>` in the course folder: CI-mode chapters, this checkout's labkit in the kernel, and the
    environment's bin/ on PATH (nbgrader runs `alembic` for its gradebook)."""
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course_dir, env=_env_nbgrader(),
                          capture_output=True, text=True, timeout=timeout)
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


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _tests_of(nb) -> dict:
    """{exercise tag: grade_id of its test}: each solution cell's test is the next test cell after it (chapter
    09's budget challenge checks the exercise's pick a cell later)."""
    out, tag = {}, None
    for c in nb["cells"]:
        if _nbg(c).get("solution"):
            tag = _nbg(c)["grade_id"]
        elif _nbg(c).get("grade") and tag:
            out[tag], tag = _nbg(c)["grade_id"], None
    return out


def roles(tags: list, avoid: set) -> dict:
    """Two mixed submissions, {student: {tag: "reference" | "wrong" | "raises"}}: the exercises take the
    reference and the wrong answer in turn, so that over the two each gets both -- but for the one whose cell
    raises in the second instead of taking its wrong answer: the last exercise not in ``avoid``, the measured
    ones (judged from the saved file while grading, whatever the cell did) and those whose check reads the
    chapter's state (their wrong answers are graded only here). Its wrong answer is graded without a kernel."""
    raising = [t for t in tags if t not in avoid][-1]
    start = tags.index(raising) % 2  # the raising one takes its reference in the first
    first = {t: ("reference", "wrong")[(i - start) % 2] for i, t in enumerate(tags)}
    second = {t: {"reference": "wrong", "wrong": "reference"}[r] for t, r in first.items()}
    second[raising] = "raises"
    return {"mixed-a": first, "mixed-b": second}


def _submission(source: dict, release: dict, plan: dict) -> dict:
    """The release with each planned exercise filled in as a learner would: the source cell's solution region
    replaced by the answer's code (or by a failing line), every other cell as released."""
    regions = {_nbg(c)["grade_id"]: _text(c) for c in source["cells"] if _nbg(c).get("solution")}
    cells = []
    for c in release["cells"]:
        tag = _nbg(c).get("grade_id") if _nbg(c).get("solution") else None
        if tag in plan:
            code = {"reference": lambda: grading.solution_code(tag),
                    "wrong": lambda: grading.solution_code(tag, table=grading.WRONG),
                    "raises": lambda: RAISES}[plan[tag]]()
            text = regions[tag]
            start, end = text.index(assignments.BEGIN), text.index(assignments.END) + len(assignments.END)
            c = {**c, "source": text[:start] + code + text[end:]}
        cells.append(c)
    return {**release, "cells": cells}


def _errors(nb) -> dict:
    """{grade_id: the error's message} of the cells that failed when graded."""
    return {_nbg(c).get("grade_id"): o["evalue"] for c in nb["cells"] for o in c.get("outputs", [])
            if o["output_type"] == "error"}


def fully_graded(chapter: str) -> bool:
    """Whether ``grade_chapter`` grades ``roles``' two mixed submissions and the untouched release (three runs of
    the chapter): for SAMPLE's chapter, and for every chapter with LABKIT_GRADE_ALL=1. CI's other chapters get one
    run, ``one_submission`` -- what the other two would prove of them is proved by tests that run the same code:
    each exercise's reference passes its check in the chapter's own state (nbval's run of the chapter with every
    exercise re-run, tests/test_rerun_exercises.py); each typical wrong answer fails its check with a hint
    (``test_every_exercise_has_one_typical_wrong_answer...``, without a kernel; the exercises whose check needs the
    chapter's state, CHAPTER_STATE, take their wrong answer in the one submission); every checker calls None and
    ``...`` not attempted (each family's placeholder test in tests/test_check_*.py); and the grading itself -- a
    reference at full points and a wrong answer at 0 with the checker's hint as its feedback -- runs in the one
    submission, with, in most chapters, a raising cell graded "not attempted" (as an untouched exercise is) while the
    cells after it are graded; SAMPLE's chapter grades all three submissions."""
    return chapter in SAMPLE or grading_scope() == "all"


def one_submission(tags: list, measured: set) -> dict:
    """One mixed submission, {"mixed": {tag: "reference" | "wrong" | "raises"}}: the exercises neither measured nor
    in CHAPTER_STATE take the reference and the wrong answer in turn, the reference first, but the last of them
    raises (as in ``roles``) when that leaves a reference and a wrong answer judged in the chapter; the others take
    their wrong answer (CHAPTER_STATE's are graded only here; a measured one scores 0 here whatever it answers:
    these submissions carry no measurement file)."""
    free = [t for t in tags if t not in measured | CHAPTER_STATE]
    judged_wrong = any(t in CHAPTER_STATE and t not in measured for t in tags)
    raising = free.pop() if len(free) > (1 if judged_wrong else 2) else None
    plan = dict.fromkeys(tags, "wrong")
    plan.update({t: ("reference", "wrong")[i % 2] for i, t in enumerate(free)})
    if raising:
        plan[raising] = "raises"
    return {"mixed": plan}


# What a checker's verdict says, as nbgrader's feedback shows it, in each edition (labkit.check._core: "✗ " and
# its not-yet words; "… " and its not-attempted words; lab_messages.md's ## Checks and their Russian copy)
VERDICT = {"en": {"not-yet": "✗ not yet", "not-attempted": "not attempted"},
           "ru": {"not-yet": "✗ пока нет", "not-attempted": "ещё не начато"}}


def grade_chapter(tmp_path: Path, chapter: str, lang: str = "en") -> dict:
    """Build one chapter (of ``lang``'s edition), generate its release, and autograde (in one call) two mixed
    submissions and the untouched release (``fully_graded``), or one mixed submission; assert what each case must
    score. Returns {student: {grade_id: score}} and seconds."""
    from nbgrader.api import Gradebook

    said = VERDICT[lang]
    assignments.build_nbgrader(tmp_path, [chapter[:2]], lang=lang)
    source = _nb(tmp_path, chapter)
    _nbgrader(tmp_path, "generate_assignment", chapter, "--force")
    release = _nb(tmp_path, chapter, "release")

    # the release: no solution, no hidden test; each test cell shows its public half
    text = "\n".join(_text(c) for c in release["cells"])
    assert assignments.BEGIN not in text and "from notebooks/solutions/" not in text
    assert assignments.HIDDEN_BEGIN not in text and not re.search(r"^assert (\w+)\.passed, \1$", text, re.M)
    plain = next(p for p in pages.chapters(lang) if p.stem == chapter)
    chapter_text = "\n".join(_text(c) for c in json.loads(plain.read_text())["cells"])
    released = {ln.strip() for ln in text.splitlines()}  # whole lines: a test cell's "import contextlib, sys" is none
    leaked = [ln for ln in _solution_lines(source) if ln in released and ln not in chapter_text]
    assert not leaked, f"reference-solution lines in the release: {leaked}"
    tests = _tests_of(source)
    points = {_nbg(c)["grade_id"]: _nbg(c)["points"] for c in source["cells"] if _nbg(c).get("grade")}
    assert sorted(tests.values()) == sorted(points) and len(tests) >= 3
    for c in release["cells"]:
        if _nbg(c).get("grade"):
            assert re.search(PUBLIC, _text(c), re.M), _text(c)

    measured = {t for t, g in tests.items() if g.split("-", 2)[2] in grading.MEASURED}
    avoid = measured | CHAPTER_STATE
    plans = {**roles(list(tests), avoid), "blank": {}} if fully_graded(chapter) else one_submission(list(tests), measured)
    for student, plan in plans.items():
        dest = tmp_path / "submitted" / student / chapter
        dest.mkdir(parents=True)
        (dest / f"{chapter}.ipynb").write_text(json.dumps(_submission(source, release, plan), indent=1))
    t0 = time.perf_counter()
    _nbgrader(tmp_path, "autograde", chapter, "--force")
    seconds = time.perf_counter() - t0
    print(f"\nnbgrader autograde, {chapter}, {len(plans)} submissions: {seconds:.0f} s", flush=True)

    scores = {}
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        for student in plans:
            nb = gb.find_submission_notebook(chapter, chapter, student)
            scores[student] = {g.name: g.score for g in nb.grades}
            assert nb.max_score == sum(points.values())
    for student, plan in plans.items():
        graded = json.loads((tmp_path / "autograded" / student / chapter / f"{chapter}.ipynb").read_text())
        for c in graded["cells"]:  # grading ran both halves: the test cells came back from the source
            if _nbg(c).get("grade"):
                assert assignments.HIDDEN_BEGIN in _text(c), (student, _nbg(c)["grade_id"])
        errors, got = _errors(graded), scores[student]
        for tag, test in tests.items():
            role, where = plan.get(tag, "blank"), (student, tag, got[test], errors.get(test))
            if role == "reference":
                if tag not in measured:  # graded from the learner's own measurements: see the module docstring
                    assert got[test] == points[test] and test not in errors, where
            elif role == "wrong":
                assert got[test] == 0 and test in errors, where
                if tag not in measured:
                    assert said["not-yet"] in errors[test], where  # attempted, failed: the checker's hint is the feedback
            elif tag in measured:  # judged from the saved file, which this submission lacks
                assert got[test] == 0 and (said["not-attempted"] in errors[test] or NO_FILE in errors[test]), where
            else:  # a cell that raised, or an exercise never touched
                assert got[test] == 0 and said["not-attempted"] in errors.get(test, ""), where
                if role == "raises":
                    assert errors.get(tag, "").startswith("the learner's cell fails"), where
    return {"scores": scores, "seconds": seconds}


@pytest.mark.parametrize("chapter", chapter_params(GRADED_HERE + GRADE_ALL_ONLY[::2]))
def test_nbgrader_grades_the_reference_full_wrong_and_failing_answers_zero_and_a_blank_not_attempted(tmp_path, chapter):
    grade_chapter(tmp_path, chapter)


@pytest.mark.skipif(grading_scope() == "sample", reason="graded in CI (CI=true) or with LABKIT_GRADE_ALL=1")
def test_nbgrader_grades_the_russian_edition_as_the_english_with_the_checkers_russian_feedback(tmp_path):
    """`labkit assignments --lang ru`: the Russian chapter 03 (notebooks/ru/) graded by the real nbgrader, the same
    points and verdicts, the feedback in Russian (the set-up cell, locked, picks Russian before labkit loads)."""
    result = grade_chapter(tmp_path, "03_gradient_accumulation", lang="ru")
    source = _nb(tmp_path, "03_gradient_accumulation")
    assert 'os.environ["LABKIT_LANG"] = "ru"' in "\n".join(_text(c) for c in source["cells"])
    assert any(score for scores in result["scores"].values() for score in scores.values())


# ---- the measured exercises, graded from the learner's saved measurements ----------------------------------

MEASURED_CHAPTERS = [p.stem for p in pages.chapters()
                     if any(f"lk.check.{name}(" in p.read_text() for name in grading.MEASURED)]


def grade_learners_run(tmp_path: Path, chapter: str) -> dict:
    """The learner's run, then grading: the release filled with every reference answer is run top to bottom
    outside grading (as the learner does; the measured checks save labkit-measurements.json beside it), and
    autograde grades it with that file -- every test at full points, the measured ones judged from the file."""
    import nbclient
    import nbformat
    from labkit.chapters import measured

    assignments.build_nbgrader(tmp_path, [chapter[:2]])
    source = _nb(tmp_path, chapter)
    _nbgrader(tmp_path, "generate_assignment", chapter, "--force")
    release = _nb(tmp_path, chapter, "release")
    tests = _tests_of(source)
    points = {_nbg(c)["grade_id"]: _nbg(c)["points"] for c in source["cells"] if _nbg(c).get("grade")}
    dest = tmp_path / "submitted" / "learner" / chapter
    dest.mkdir(parents=True)
    nb = nbformat.reads(json.dumps(_submission(source, release, {t: "reference" for t in tests})), as_version=4)
    env_before = os.environ.pop("NBGRADER_EXECUTION", None)
    try:
        nbclient.NotebookClient(nb, timeout=600, allow_errors=True,
                                resources={"metadata": {"path": str(dest)}}).execute()
    finally:
        if env_before is not None:
            os.environ["NBGRADER_EXECUTION"] = env_before
    nbformat.write(nb, dest / f"{chapter}.ipynb")
    saved = measured.read(dest)
    want = {g.split("-", 2)[2] for g in tests.values()} & set(grading.MEASURED)
    assert want and want <= set(saved), f"the learner's run saved {sorted(saved)}, not {sorted(want)}"

    t0 = time.perf_counter()
    _nbgrader(tmp_path, "autograde", chapter, "--force")
    seconds = time.perf_counter() - t0
    print(f"\nnbgrader autograde, {chapter}, the learner's run with its {measured.FILE}: {seconds:.0f} s", flush=True)
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        got = {g.name: g.score for g in gb.find_submission_notebook(chapter, chapter, "learner").grades}
    graded = json.loads((tmp_path / "autograded" / "learner" / chapter / f"{chapter}.ipynb").read_text())
    assert got == points, (got, _errors(graded))
    return {"scores": got, "seconds": seconds}


@pytest.mark.skipif(os.environ.get("LABKIT_GRADE_ALL") != "1", reason="graded with LABKIT_GRADE_ALL=1 only (CI's time)")
@pytest.mark.parametrize("chapter", MEASURED_CHAPTERS)
def test_nbgrader_grades_the_measured_exercises_from_the_learners_saved_file(tmp_path, chapter):
    grade_learners_run(tmp_path, chapter)
