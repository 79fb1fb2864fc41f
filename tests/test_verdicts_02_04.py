"""Chapters 02-04 draw their A/B conclusions from ``lk.compare_configs`` only: the prose about a
comparison is its generated ``sentence`` (or text chosen by its verdict), never a direction typed next
to a hand-made ratio of two one-shot timings. Reads the notebooks' JSON; trains nothing."""
import ast
import json
import re
from pathlib import Path

import pytest
from labkit.instructor.hosting import SETUP_ID  # the generated set-up cell (tests/test_hosting.py)

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = ["02_mixed_precision.ipynb", "03_gradient_accumulation.ipynb", "04_activation_checkpointing.ipynb"]
MAX_BUDGET_S = 150  # sum of a chapter's lk.course.budget(N) values, normal mode

# Measured timings: a ratio of two of them, or a comparison of one with a number, is a hand-made verdict.
TIMING_KEYS = ("tokens_per_s", "step_time_s", "cpu_s_per_update", "samples_per_s")
# Attributes of a Comparison whose direction only its verdict may state.
RATIO_ATTRS = re.compile(r"\.(ratio|low|high)\b")
DIRECTION = re.compile(r"\b(faster|slower|quicker|speed-?ups?|slow-?downs?|as fast as|cheaper|costlier|"
                       r"more expensive|less expensive)\b", re.I)
# Cells that measure an A/B (by tag) and what each must use.
MUST_COMPARE = {
    "02_mixed_precision.ipynb": {"measure-02-precision-runs": ("compare_configs(", "low_precision_fit(")},
    "03_gradient_accumulation.ipynb": {"measure-03-throughput": ("compare_configs(",)},
    "04_activation_checkpointing.ipynb": {"measure-04-full-overhead": ("compare_configs(", "cpu_s_per_update"),
                                          "measure-04-options-curve": ("compare_configs(", "errorbar(")},
}


def code_cells(name):
    nb = json.loads((NB_DIR / name).read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code" and c.get("id") != SETUP_ID]  # chapter cells


def source(cell) -> str:
    return "".join(cell["source"])


def parse(src: str) -> ast.AST:
    # IPython magics would not parse; the chapters have none, but strip them to be safe.
    return ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines()))


def is_compare_call(node) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "compare_configs")
        or (isinstance(node.func, ast.Name) and node.func.id == "compare_configs"))


def budget_literal(node):
    """N from ``lk.course.budget(N)`` (a literal number), else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "budget"
            and ast.unparse(node.func.value).endswith("course") and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, (int, float))):
        return node.args[0].value
    return None


# --- the rules, as functions of source text (so the self-test below can feed them bad code) ------------

def unsaid_comparisons(src: str) -> list:
    """compare_configs results whose sentence this cell never shows: said or printed (``.sentence``), passed
    to ``display`` (a Comparison renders its sentence), or the cell's last value."""
    tree, bad = parse(src), []
    assigned = set()
    last = tree.body[-1] if tree.body else None
    last = ast.unparse(last.value) if isinstance(last, ast.Expr) else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and is_compare_call(node.value):
            assigned.add(id(node.value))
            for target in node.targets:
                name = ast.unparse(target)
                shown = (re.search(rf"\b(say|print)\(\s*{re.escape(name)}\.sentence\b", src)
                         or re.search(rf"\bdisplay\(([^()]*,\s*)?{re.escape(name)}\s*[,)]", src) or last == name)
                if not shown:
                    bad.append(name)
    for node in ast.walk(tree):
        if is_compare_call(node) and id(node) not in assigned:
            bad.append("an unassigned lk.compare_configs(...) call")
    return bad


def bad_budgets(src: str) -> list:
    """compare_configs calls whose budget_s is not written as lk.course.budget(<literal>)."""
    return [ast.unparse(node)[:80] for node in ast.walk(parse(src)) if is_compare_call(node)
            and budget_literal(next((k.value for k in node.keywords if k.arg == "budget_s"), None)) is None]


def budgets(src: str) -> list:
    return [n for node in ast.walk(parse(src)) if (n := budget_literal(node)) is not None]


def typed_directions(src: str) -> list:
    """f-strings that type a direction word next to a measured value."""
    hits = []
    for node in ast.walk(parse(src)):
        if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in node.values):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if m := DIRECTION.search(text):
                hits.append(f"{m.group(0)!r} in {ast.unparse(node)[:90]}")
    return hits


def timing_names(sources) -> set:
    """Names assigned from an expression that reads a measured timing -- ``x["tokens_per_s"]`` or
    ``median_of(runs, "step_time_s")`` -- and, one step further, names assigned from those."""
    direct, derived = set(), set()
    assigns = [node for src in sources for node in ast.walk(parse(src)) if isinstance(node, ast.Assign)]
    for node in assigns:
        if _reads_timing(node.value):
            direct |= _targets(node)
    for node in assigns:
        if _mentions(ast.unparse(node.value), direct):
            derived |= _targets(node)
    return direct | derived


def _reads_timing(value) -> bool:
    """A timing key as a subscript or as a positional argument (not ``metric=`` of compare_configs)."""
    for node in ast.walk(value):
        if is_compare_call(node):
            return False
        keys = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call):
            keys = node.args
        if any(isinstance(k, ast.Constant) and k.value in TIMING_KEYS for k in keys):
            return True
    return False


def _targets(node) -> set:
    return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _mentions(text: str, names: set) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", text) for n in names)


def _timing(text: str, names: set) -> bool:
    return any(k in text for k in TIMING_KEYS) or _mentions(text, names)


def hand_made_verdicts(src: str, names: set) -> list:
    """A ratio of two measured timings, or a measured timing (or a Comparison's ratio) against a number."""
    hits = []
    for node in ast.walk(parse(src)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = ast.unparse(node.left), ast.unparse(node.right)
            if _timing(left, names) and _timing(right, names):
                hits.append(f"ratio of two timings: {ast.unparse(node)[:90]}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            numbers = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, (int, float))
                       and not isinstance(s.value, bool)]
            measured = [s for s in sides if _timing(ast.unparse(s), names) or RATIO_ATTRS.search(ast.unparse(s))]
            if numbers and measured:
                hits.append(f"measured value against a number: {ast.unparse(node)[:90]}")
    return hits


# --- the chapters --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CHAPTERS)
def test_every_comparison_says_its_sentence(name):
    cells = [source(c) for c in code_cells(name)]
    calls = [s for s in cells if "compare_configs(" in s]
    assert calls, f"{name}: no lk.compare_configs call -- its A/B conclusions must come from one"
    for s in calls:
        missing = unsaid_comparisons(s)
        assert not missing, f"{name}: a cell compares but never says {missing}.sentence: {s[:80]!r}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_budgets_are_literal_small_and_announced(name):
    cells = [source(c) for c in code_cells(name)]
    for s in cells:
        assert not bad_budgets(s), f"{name}: write budget_s=lk.course.budget(N) with a literal N: {bad_budgets(s)}"
    total = sum(n for s in cells for n in budgets(s))
    assert 0 < total <= MAX_BUDGET_S, f"{name}: comparisons budgeted {total} s in all, at most {MAX_BUDGET_S}"
    first = cells[0]
    announced = re.search(r"sum\(map\(lk\.course\.budget,\s*\(([\d\s,.]+)\)\)\)", first)
    shown = re.search(r"\b(say|table)\(", first)  # said, or a column of the chapter's opening table
    assert announced and shown, f"{name}: the first code cell must say how long the comparisons take"
    assert sum(float(x) for x in announced.group(1).split(",") if x.strip()) >= total, \
        f"{name}: the announced comparison time is below the budgets' sum ({total} s)"


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_direction_typed_next_to_a_number(name):
    for c in code_cells(name):
        hits = typed_directions(source(c))
        assert not hits, f"{name}: a direction is typed, not taken from a verdict: {hits}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_hand_made_ratio_of_timings(name):
    cells = [source(c) for c in code_cells(name)]
    names = timing_names(cells)
    for s in cells:
        hits = hand_made_verdicts(s, names)
        assert not hits, f"{name}: compare with lk.compare_configs instead of by hand: {hits}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_measurement_cells_compare(name):
    by_tag = {t: source(c) for c in code_cells(name) for t in c.get("metadata", {}).get("tags", [])}
    for tag, needles in MUST_COMPARE[name].items():
        assert tag in by_tag, f"{name}: the cell tagged {tag} is gone (other files point at it)"
        for needle in needles:
            assert needle in by_tag[tag], f"{name}: the cell tagged {tag} should use {needle}"


def test_fast_formats_come_from_measurement():
    src = "\n".join(source(c) for c in code_cells("02_mixed_precision.ipynb"))
    assert not re.search(r"env\[\s*['\"](bf16|fp16)['\"]\s*\]", src), \
        "chapter 02: env['bf16'] / env['fp16'] say a format is supported, not fast: use env['fast_formats']"
    assert "fast_formats" in src


# --- the rules catch what the chapters used to do -------------------------------------------------------

OLD_02 = '''
speed = {p: r.summary["tokens_per_s"] / fp32["tokens_per_s"] for p, r in runs.items()}
r = speed.get(low)
verdict = (f"{low} ran **{r:.2f}x as fast as fp32**" if r > 1.1 else
           f"{low} ran **slower than fp32** ({r:.2f}x)" if r < 0.9 else f"{low} ran at about fp32's speed")
'''
OLD_03 = '''
k1, k4, m4 = (r.summary["tokens_per_s"] for r in (by_k[1], by_k[4], by_mb[4]))
lk.course.say(f"Throughput relative to the baseline: K = 4 **{k4 / k1:.2f}x**, micro-batch x4 **{m4 / k1:.2f}x**.")
'''
OLD_04 = '''
t_none, t_full = median_of(runs["none"], "step_time_s"), median_of(runs["full"], "step_time_s")
lk.course.say(f"step time {1e3 * t_none:.0f} -> {1e3 * t_full:.0f} ms: **{t_full / t_none - 1:+.0%}**")
'''


@pytest.mark.parametrize("old", [OLD_02, OLD_03, OLD_04], ids=["02", "03", "04"])
def test_the_rules_catch_hand_written_verdicts(old):
    assert hand_made_verdicts(old, timing_names([old]))


def test_the_rules_catch_typed_directions_and_unsaid_sentences():
    assert typed_directions(OLD_02)
    assert typed_directions('x = f"bf16 was {r:.1f}x faster"')
    assert not typed_directions('x = {"b": "bf16 was faster"}[cmp.better]')
    assert hand_made_verdicts("if cmp.ratio > 1.05:\n    pass", set())
    assert unsaid_comparisons("cmp = lk.compare_configs(a, b, budget_s=lk.course.budget(10))")
    assert not unsaid_comparisons("cmp = lk.compare_configs(a, b, budget_s=lk.course.budget(10))\n"
                                  "lk.course.say(cmp.sentence)")
    assert not unsaid_comparisons("cmp = lk.compare_configs(a, b, budget_s=lk.course.budget(10))\ndisplay(cmp)")
    assert not unsaid_comparisons("cmp = lk.compare_configs(a, b, budget_s=lk.course.budget(10))\ncmp")
    assert unsaid_comparisons("cmp = lk.compare_configs(a, b, budget_s=lk.course.budget(10))\ndisplay(cmp2)")
    assert unsaid_comparisons("cmp = lk.compare_configs(a, b, budget_s=lk.course.budget(10))\ncmp\nx = 1")
    assert bad_budgets("cmp = lk.compare_configs(a, b, budget_s=30)")
    assert not bad_budgets("cmp = lk.compare_configs(a, b, budget_s=lk.course.budget(30))")
