"""Course-wide format of the notebooks (every ``notebooks/*.ipynb``): stored clean, opening with
learning goals, closing with interview answers that point at measurement cells which exist, at least
three automatic checks per chapter, and no hard-coded measurements."""
import json
import re
from pathlib import Path

import nbformat
import pytest

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
CHAPTERS = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name)]

# A number followed by a unit of something measured: such text must be generated from a run.
MEASURED = re.compile(r"\b\d[\d.,]*\s*(?:tokens/s|samples/s|ms/step|s/step|GiB|MiB|% MFU)")
# a measurement cell named in backticks, or in the title of a link to its section (the question bank's form:
# JupyterLab shows no cell tags, so a learner follows the link)
TAG_REF = re.compile(r'`(measure-[A-Za-z0-9_-]+)`|\]\(#(?:[^()\s]|\([^()\s]*\))+ "((?:measure-[A-Za-z0-9_-]+ ?)+)"\)')
GOALS = re.compile(r"will be able to|learning goals|you will learn", re.I)
SLEEP = re.compile(r"\bsleep\s*\(")
WILDCARD = re.compile(r"^\s*from\s+\S+\s+import\s+\*", re.M)
GUESS = re.compile(r"^\s*(my_guess\w*)\s*=\s*None\b", re.M)


def ids(paths):
    return [p.name for p in paths]


def load(path):
    return nbformat.read(str(path), as_version=4)


def cells(nb, kind):
    return [c for c in nb.cells if c.cell_type == kind]


def tags(nb):
    return {t for c in nb.cells for t in c.get("metadata", {}).get("tags", [])}


def details_blocks(text):
    return re.findall(r"<details>(.*?)</details>", text, re.S)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_valid_and_stored_without_outputs(path):
    raw = json.loads(path.read_text())  # nbformat.read fills in missing ids, so look at the file itself
    assert all("id" in c for c in raw["cells"]), f"{path.name}: a cell has no id (nbformat 4.5 needs one)"
    nb = load(path)
    nbformat.validate(nb)
    for c in cells(nb, "code"):
        assert c.outputs == [], f"{path.name}: a code cell is stored with outputs: {c.source[:60]!r}"
        assert c.execution_count is None, f"{path.name}: a code cell is stored with an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_no_sleep_and_no_wildcard_imports(path):
    for c in cells(load(path), "code"):
        assert not SLEEP.search(c.source), f"{path.name}: sleep() fakes timings: {c.source[:60]!r}"
        assert not WILDCARD.search(c.source), f"{path.name}: wildcard import in {c.source[:60]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_no_measured_numbers_typed_into_markdown(path):
    for c in cells(load(path), "markdown"):
        hit = MEASURED.search(c.source)
        assert not hit, (f"{path.name}: {hit.group(0)!r} looks like a measured number typed into markdown; "
                         "generate it from the run with lk.course.say(f'...')")


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_opens_with_learning_goals(path):
    first = load(path).cells[1]  # after the set-up cell (tests/test_hosting.py)
    assert first.cell_type == "markdown" and GOALS.search(first.source), \
        f"{path.name}: the first cell after the set-up must be markdown saying what the learner will be able to do"


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_imports_labkit_as_lk_at_the_top(path):
    first_code = cells(load(path), "code")[1].source  # the first after the set-up cell
    assert re.search(r"^import labkit as lk$", first_code, re.M), f"{path.name}: `import labkit as lk` at the top"


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_closes_with_interview_answers_pointing_at_measurements(path):
    nb = load(path)
    md_cells = cells(nb, "markdown")
    closing = [c for c in nb.cells[-2:] if c.cell_type == "markdown" and "<details>" in c.source]
    assert closing, f"{path.name}: the last cells must hold interview questions with <details> answers"
    blocks = [b for c in md_cells for b in details_blocks(c.source)]
    assert blocks
    have = tags(nb)
    for b in blocks:
        refs = [t for named, titled in TAG_REF.findall(b) for t in (named, *titled.split()) if t]
        assert refs, f"{path.name}: an interview answer points at no `measure-...` cell: {b[:80]!r}"
        missing = [r for r in refs if r not in have]
        assert not missing, f"{path.name}: answers point at cell tags that do not exist: {missing}"


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_tags_follow_the_convention(path):
    nn = path.name[:2]
    for t in tags(load(path)):
        if t.startswith(("measure-", "exercise-")):
            assert re.fullmatch(rf"(measure|exercise)-{nn}-[a-z0-9][a-z0-9-]*", t), \
                f"{path.name}: tag {t!r} should read measure-{nn}-topic or exercise-{nn}-name"


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_at_least_three_automatic_checks(path):
    source = "\n".join(c.source for c in cells(load(path), "code"))
    names = set(re.findall(r"lk\.check\.(\w+)\(", source))
    assert len(names) >= 3, f"{path.name}: {len(names)} lk.check exercises ({sorted(names)}), at least 3 needed"


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_every_prediction_is_compared_with_a_measurement(path):
    code_cells = [c.source for c in cells(load(path), "code")]
    for i, src in enumerate(code_cells):
        for name in GUESS.findall(src):
            later = "\n".join(code_cells[i + 1:])
            assert re.search(rf"compare_prediction\(\s*{name}\b", later) or re.search(
                rf"compare_prediction\([^\n]*\b{name}\b", later), \
                f"{path.name}: prediction {name} is never compared with a measurement"


def test_course_has_chapters():
    assert CHAPTERS, "no chapter notebooks (notebooks/NN_*.ipynb) found"


# Markdown a chapter generates (a comparison's sentence, lk.course's notes) is shown with lk.course.say or as a
# cell's value; print() would show its ** and backticks raw.
PRINTED_MARKDOWN = re.compile(r"\bprint\(\s*[\w.\[\]\"']*\.sentence\b")


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_generated_markdown_is_rendered_not_printed(path):
    for c in cells(load(path), "code"):
        assert not PRINTED_MARKDOWN.search(c.source), \
            f"{path.name}: a comparison's sentence is printed raw; use lk.course.say(...): {c.source[:60]!r}"


def test_menus_are_named_as_jupyterlab_4_names_them():
    readme = (NB_DIR.parent / "README.md").read_text() + (NB_DIR / "README.md").read_text()
    for text in [readme] + [json.dumps(json.loads(p.read_text())["cells"]) for p in NOTEBOOKS]:
        assert "Restart & Run All" not in text, "JupyterLab 4's menu reads Kernel → Restart Kernel and Run All Cells…"


# A chart built on a plain matplotlib Figure (labkit.tools.plots) is shown only as a cell's value or through
# display(): called inside an if/else or a loop it is built and thrown away (chapter 09's two closing charts).
# Charts drawn on pyplot's figures are shown by the inline backend wherever they are called.
LABKIT_DIR = NB_DIR.parent / "labkit"


def _draws_on_pyplot(name: str) -> bool:
    for p in LABKIT_DIR.rglob("*.py"):
        m = re.search(rf"^def {name}\(.*?(?=^def |\Z)", p.read_text(), re.M | re.S)
        if m:
            return "plt.subplots(" in m.group(0) or "plt.figure(" in m.group(0)
    return True  # not labkit's: the chapter's own pyplot code


def _nested_bare_chart_calls(source: str) -> list:
    import ast
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics: not ours to check
        return []
    found = []
    for top in tree.body:
        if isinstance(top, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            for node in ast.walk(top):
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                    f = node.value.func
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                    if name.endswith("_chart") and not _draws_on_pyplot(name):
                        found.append(name)
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_charts_inside_blocks_are_displayed(path):
    for c in cells(load(path), "code"):
        lost = _nested_bare_chart_calls(c.source)
        assert not lost, f"{path.name}: {lost} drawn inside a block is never shown; wrap it in display(...)"


def test_the_chart_check_finds_a_thrown_away_chart():
    src = "if x:\n    pass\nelse:\n    pb.pareto_chart(rows, budget)\n"
    assert _nested_bare_chart_calls(src) == ["pareto_chart"]
    assert _nested_bare_chart_calls(src.replace("pb.pareto_chart(rows, budget)", "display(pb.pareto_chart(rows, budget))")) == []


# A widget object a later cell reads (a score, a card) keeps its name for the whole notebook: rebinding the name
# to another kind of object breaks that cell when the learner re-runs it after Run All (the interview notebook's
# "score so far" read a Quiz named `drill`, which a later cell rebound to a Drill).
WIDGET_MAKERS = ("Quiz", "Drill", "Gauntlet", "Lab")


def _widget_bindings(nb) -> dict:
    import ast
    kinds = {}
    for c in cells(nb, "code"):
        try:
            tree = ast.parse(c.source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                f = node.value.func
                maker = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        kinds.setdefault(t.id, set()).add(maker if maker in WIDGET_MAKERS else "other")
    return {name: k for name, k in kinds.items() if len(k) > 1 and k & set(WIDGET_MAKERS)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_a_widget_name_is_not_rebound_to_another_kind(path):
    assert not _widget_bindings(load(path)), f"{path.name}: {_widget_bindings(load(path))}"


def test_the_rebinding_check_finds_the_old_interview_notebook():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('drill = lk.quiz.Quiz(topic="memory")'),
                                         nbformat.v4.new_code_cell("drill = lk.drills.Drill(seed=0)")])
    assert _widget_bindings(nb) == {"drill": {"Quiz", "Drill"}}
