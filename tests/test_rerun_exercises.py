"""After Run All, every exercise still passes with its reference answer.

A learner runs a chapter top to bottom, then goes back to an exercise. If a later cell reassigned a name
the exercise reads (chapter 09's what-if cell once rebound ``rows``, ``base`` and ``table``), a right answer
fails there. So, for every chapter: run the notebook top to bottom in one fresh kernel (nbclient, CI mode,
from notebooks/ as nbval and JupyterLab do), then -- in that same kernel -- run each exercise cell again
with the learner's placeholder replaced by the reference solution (notebooks/solutions/), and require
every checker that cell calls to pass.

The notebook and its re-runs go to the kernel as one execution (the re-run cells are appended), so a
chapter costs one kernel start and one pass over its cells, plus the re-runs themselves.
``ANSWERS`` (labkit/instructor/grading.py: the graded builds read it too) says, for each exercise tag, which
placeholder takes which solution; a test without a kernel checks that it covers every exercise of every
chapter and that each placeholder is still in its cell.
"""
from __future__ import annotations

import ast
import collections
import datetime
import time
from pathlib import Path

import nbformat
import pytest

from labkit.instructor import grading
from labkit.instructor.grading import exercise_tag
from labkit.instructor.grading import is_check_call as _is_check_call  # the calls whose results the re-run records

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
SOLUTIONS = NB_DIR / "solutions"
# the English chapters and the Russian edition's (notebooks/ru/: the same code cells, so the same exercises)
CHAPTERS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb")) + sorted((NB_DIR / "ru").glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT_S = 600

# The table lives in labkit (the graded builds read it too): one source of truth.
ANSWERS = grading.ANSWERS

# Loads the solution modules into the kernel; a re-run check that does not pass raises, naming the exercise.
SETUP = f"""
import importlib.util as _rerun_ilu
import types as _rerun_types

def _rerun_module(name):
    spec = _rerun_ilu.spec_from_file_location("solutions_" + name, {str(SOLUTIONS)!r} + "/" + name + ".py")
    mod = _rerun_ilu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

sol = _rerun_types.SimpleNamespace(**{{n: _rerun_module(n) for n in
                                       {grading.FAMILIES!r}}})
_rerun_log = []

def _rerun_record(tag, result):
    _rerun_log.append(tag)
    if not getattr(result, "passed", False):
        raise AssertionError(f"{{tag}}: the reference answer fails after Run All -- "
                             f"{{getattr(result, 'name', '?')}}: {{getattr(result, 'message', result)}}")
    return result
"""


class _Record(ast.NodeTransformer):
    def __init__(self, tag):
        self.tag = tag

    def visit_Call(self, node):
        self.generic_visit(node)
        if not _is_check_call(node):
            return node
        return ast.Call(ast.Name("_rerun_record", ast.Load()), [ast.Constant(self.tag), node], [])


def _name_of(stmt):
    """The name a top-level statement defines as a placeholder (def, class, or `name = ...`), else None."""
    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
        return stmt.name
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def with_answers(source: str, tag: str) -> str:
    """The exercise cell with each placeholder replaced by its answer and each check's result recorded."""
    tree = ast.parse(source)
    answers = ANSWERS[tag]
    missing = sorted(set(answers) - {_name_of(s) for s in tree.body})
    assert not missing, f"{tag}: the cell no longer defines {missing}: update ANSWERS in this test"
    body = []
    for stmt in tree.body:
        name = _name_of(stmt)
        # the answer takes the placeholder's place: code before it (chapter 04's budget) still runs first
        body.append(ast.parse(f"{name} = {answers[name]}").body[0] if name in answers else stmt)
    tree.body = body
    return ast.unparse(ast.fix_missing_locations(_Record(tag).visit(tree)))


def _calls_a_check(source: str) -> bool:
    return any(_is_check_call(n) for n in ast.walk(ast.parse(source)))


def rerun_sources(nb) -> list:
    """[(tag, source)] for each exercise, in order. An exercise cell that only sets a placeholder (chapter 09's
    budget pick) is re-run with the code cells after it up to the first one that checks it."""
    out = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        tag = exercise_tag(cell)
        if tag is None:
            continue
        parts = [with_answers(cell.source, tag)]
        j = i
        while not _calls_a_check(code[j].source) and j + 1 < len(code):
            j += 1
            parts.append(ast.unparse(_Record(tag).visit(ast.parse(code[j].source))))
        parts.append(f"assert {tag!r} in _rerun_log, {tag + ': no check ran when the exercise was re-run'!r}")
        out.append((tag, "\n".join(parts)))
    return out


# ---- without a kernel: the table covers every exercise --------------------------------------------------


def test_every_exercise_of_every_chapter_has_an_answer():
    tags = [exercise_tag(c) for p in CHAPTERS for c in nbformat.read(p, as_version=4).cells]
    tags = [t for t in tags if t]
    assert len(tags) >= 30
    assert sorted(set(tags) - set(ANSWERS)) == [], "an exercise without an answer here: add it to ANSWERS"
    assert sorted(set(ANSWERS) - set(tags)) == [], "ANSWERS names an exercise that no chapter has"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_each_rerun_replaces_the_placeholders_and_records_a_check(path):
    for tag, source in rerun_sources(nbformat.read(path, as_version=4)):
        assert "_rerun_record(" in source, f"{tag}: no lk.check call in the cell or after it"
        tree = ast.parse(source)
        for name, answer in ANSWERS[tag].items():
            assert f"{name} = {ast.unparse(ast.parse(answer))}" in source
            assert not any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name for n in tree.body)


def test_the_rewrite_keeps_the_check_and_replaces_a_def():
    src = "def f(x):\n    ...  # your code here\n\n\nr = lk.check.flops_linear(f)\nr"
    ANSWERS["exercise-99-demo"] = {"f": "sol.basics.linear_flops"}
    try:
        out = with_answers(src, "exercise-99-demo")
    finally:
        del ANSWERS["exercise-99-demo"]
    assert out.splitlines() == ["f = sol.basics.linear_flops",
                                "r = _rerun_record('exercise-99-demo', lk.check.flops_linear(f))", "r"]


# ---- with a kernel: Run All, then every exercise again ----------------------------------------------------
# Two ways, one result. When this session also runs the chapters under nbval (`python3 course.py test`, CI) and
# tests/conftest.py imports `pytest_collection_modifyitems` from here, the re-runs are appended to nbval's own
# run of each chapter: no chapter runs twice. Otherwise (this file alone) each chapter runs once here, in nbclient.


def rerun_cells(nb) -> list:
    """[(name, code cell)]: the set-up, then one cell per exercise, to run after the chapter's last cell."""
    cells = [("rerun set-up", nbformat.v4.new_code_cell(SETUP))]
    return cells + [(f"rerun {tag}", nbformat.v4.new_code_cell(src)) for tag, src in rerun_sources(nb)]


def pytest_collection_modifyitems(session, config, items):
    """Append the re-run cells to nbval's run of each chapter (same kernel, after its last cell)."""
    chapters = {str(p) for p in CHAPTERS}
    last = {}
    for i, item in enumerate(items):
        parent = getattr(item, "parent", None)
        if type(item).__name__ == "IPyNbCell" and str(getattr(parent, "path", "")) in chapters:
            last[parent] = i
    for parent, i in sorted(last.items(), key=lambda kv: -kv[1]):  # from the end: earlier indices stay valid
        nb = nbformat.read(str(parent.path), as_version=4)
        n = sum(1 for c in nb.cells if c.cell_type == "code")
        extra = [type(items[i]).from_parent(parent, name=name, cell_num=n + k, cell=cell,
                                            options=collections.defaultdict(bool, check=False))
                 for k, (name, cell) in enumerate(rerun_cells(nb))]
        items[i + 1:i + 1] = extra
    config.stash[IN_NBVAL] = {str(p.path) for p in last}


IN_NBVAL = pytest.StashKey[set]()


def _errors(cells) -> list:
    """'cell N (what): Error: message' for each error output in ``cells`` (raises-exception cells aside)."""
    out = []
    for i, c in cells:
        if c.cell_type != "code" or "raises-exception" in c.get("metadata", {}).get("tags", []):
            continue
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                label = ",".join(c.get("metadata", {}).get("tags", [])) or c.source.splitlines()[0][:40]
                out.append(f"cell {i} ({label}): {o['ename']}: {o['evalue'][:400]}")
    return out


def run_with_reruns(nb, name: str) -> tuple:
    """Run ``nb`` top to bottom in a fresh kernel (CI mode, from notebooks/), then its re-runs; returns the
    errors of the chapter's own cells and those of the re-runs."""
    from nbclient import NotebookClient

    n_chapter = len(nb.cells)
    for label, cell in rerun_cells(nb):
        cell.metadata["tags"] = [label.replace(" ", "-")]
        nb.cells.append(cell)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            record_timing=True, resources={"metadata": {"path": str(NB_DIR)}})
    t0 = time.perf_counter()
    client.execute()
    _say_time(name, nb, n_chapter, time.perf_counter() - t0)
    cells = list(enumerate(nb.cells))
    return _errors(cells[:n_chapter]), _errors(cells[n_chapter:])


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_exercises_pass_again_after_run_all(path, monkeypatch, request):
    if str(path) in request.config.stash.get(IN_NBVAL, set()):
        pytest.skip("re-run inside nbval's run of this chapter in this session (no second run of the chapter)")
    monkeypatch.setenv("CI", "true")  # the kernel inherits it: the chapter's short CI mode
    chapter_errors, rerun_errors = run_with_reruns(nbformat.read(path, as_version=4), path.name)
    assert not chapter_errors, "the chapter itself failed (nbval reports it too):\n" + "\n".join(chapter_errors)
    assert not rerun_errors, "an exercise fails when re-run after Run All:\n" + "\n".join(rerun_errors)


def test_a_later_cell_that_rebinds_an_exercises_input_is_caught():
    """The fault this file exists for, in three cells: the last one rebinds the budget the exercise reads."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import labkit as lk\n"
                                          "table = [dict(name='none', activation_bytes=100, hardware_flops=10),\n"
                                          "         dict(name='full', activation_bytes=10, hardware_flops=12)]\n"
                                          "budget = 60"),
                nbformat.v4.new_code_cell("my_pick = None\nlk.check.checkpoint_budget(my_pick, table, budget)",
                                          metadata={"tags": ["exercise-04-budget-pick"]}),
                nbformat.v4.new_code_cell("budget = 1  # a later cell reuses the name")]
    chapter_errors, rerun_errors = run_with_reruns(nb, "three-cell notebook")
    assert chapter_errors == []
    assert len(rerun_errors) == 1 and "exercise-04-budget-pick: the reference answer fails" in rerun_errors[0]
    # the checker's own words travel with the failure (the reference answer finds no option under budget 1,
    # so the checker reports it unanswered)
    assert "checkpoint_budget: write your answer" in rerun_errors[0]


def _say_time(name, nb, n_chapter, wall_s):
    """Print the chapter's and the re-runs' share of the time (seen with -s)."""
    def seconds(cells):
        total = 0.0
        for c in cells:
            ex = c.get("metadata", {}).get("execution", {})
            a, b = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
            if a and b:
                total += _ts(b) - _ts(a)
        return total

    print(f"\n{name}: {wall_s:.1f} s wall; chapter cells {seconds(nb.cells[:n_chapter]):.1f} s, "
          f"re-runs {seconds(nb.cells[n_chapter:]):.1f} s", flush=True)


def _ts(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
