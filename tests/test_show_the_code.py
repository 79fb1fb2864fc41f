"""Every chapter shows the PyTorch it teaches (issue 27): the technique's calls in the code cells a learner
reads (or in the labkit function a cell shows with ``lk.course.show``, which renders its current source),
cells that read like the technique rather than like string formatting, and a cheat sheet kept in step."""
import ast
import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest

import labkit as lk
import labkit.chapters.course  # noqa: F401  (lk.course)
from labkit.content import pages
from labkit.instructor import cheatsheet
from labkit.instructor.hosting import SETUP_ID  # the generated set-up cell (tests/test_hosting.py)

CHAPTERS = {nb.name[:2]: nb for nb in pages.chapters()}


# What a learner reads in a chapter, and which of its lines build prose (the package needs neither: they
# are this test's instruments).
_EXERCISE_TAG = "exercise-"  # an exercise's cell (what the learner writes does not count as shown)


def is_exercise(cell) -> bool:
    return any(t.startswith(_EXERCISE_TAG) for t in pages.tags(cell)) or "# your code here" in pages.source(cell)


def visible_code(nb: Path) -> str:
    """Code cells a learner reads (not exercises), then the current source of every function they show."""
    out = []
    for c in pages.cells(nb):
        if c["cell_type"] != "code" or is_exercise(c):
            continue
        src = pages.source(c)
        out.append(src)
        out += [inspect.getsource(pages.resolve(n)) for n in pages.shown(src)]
    return "\n".join(out)

def code_lines(src: str) -> set:
    """Line numbers (1-based) holding code: not blank, not only a comment, not an IPython magic."""
    return {i + 1 for i, ln in enumerate(src.splitlines())
            if ln.strip() and not ln.strip().startswith(("#", "%", "!"))}

def formatting_lines(src: str) -> set:
    """Code lines that build prose: any line an f-string spans, a ``.format(``, ``.join(`` or ``%`` on a
    string, and a string joined to something with ``+`` (``say(note)`` of a prepared Note builds nothing)."""
    lines = set()
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return set()
    for t in toks:  # f-strings; "%"-formatting is the BinOp rule below
        if t.type == tokenize.STRING and "f" in re.match(r"[A-Za-z]*", t.string).group().lower():
            lines.update(range(t.start[0], t.end[0] + 1))
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return lines & code_lines(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)) and any(
                _is_text(side) for side in (node.left, node.right)):  # "words " + str(x): prose built by hand
            lines.update(range(node.lineno, node.end_lineno + 1))
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        on_literal = isinstance(getattr(node.func, "value", None), (ast.Constant, ast.JoinedStr))
        if on_literal and (name.endswith(".format") or name.endswith(".join")):  # "{} and {}".format, ", ".join
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines & code_lines(src)

def _is_text(node) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


# Each chapter's technique calls, as a learner will write them at work: a regex over the chapter's visible
# code (code cells other than exercises, plus the source of each function shown with lk.course.show).
TECHNIQUES = {
    "01": {"torch.cuda.synchronize / device sync": r"synchronize\(",
           "FlopCounterMode": r"FlopCounterMode\(",
           "torch.profiler.profile": r"torch\.profiler\.profile\(|profiler\.profile\("},
    "02": {"torch.autocast": r"autocast\(",
           "GradScaler": r"GradScaler\(",
           "scaler.scale(loss)": r"scaler\.scale\("},
    "03": {"loss / K": r"loss\s*/\s*(K|accum|k_steps)\b",
           "backward()": r"\.backward\(\)",
           "no_sync on K - 1 micro-batches": r"no_sync\(\)",
           "one zero_grad(set_to_none=True)": r"zero_grad\(set_to_none=True\)"},
    "04": {"checkpoint(block, x, use_reentrant=False)": r"checkpoint\([^\n]{0,80}use_reentrant=False",
           "SAC policy": r"create_selective_checkpoint_contexts\(",
           "every k-th block": r"%\s*(every|k|self\.every|checkpoint_every)\b"},
    "05": {"DataLoader(...)": r"DataLoader\(",
           "num_workers=": r"num_workers=",
           "pin_memory=": r"pin_memory=",
           "persistent_workers=": r"persistent_workers=",
           "prefetch_factor=": r"prefetch_factor=",
           ".to(..., non_blocking=True)": r"non_blocking=",
           "worker seeding": r"worker_init_fn=|generator="},
    "06": {"init_process_group": r"init_process_group\(",
           "DistributedDataParallel(model, bucket_cap_mb=...)": r"(DistributedDataParallel|DDP)\([^\n]{0,120}bucket_cap_mb=",
           "register_comm_hook": r"register_comm_hook\(",
           "the torchrun line": r"torchrun --nproc[_-]per[_-]node"},
    "07": {"torch.compile(model)": r"torch\.compile\(",
           "AdamW(fused=True) / foreach": r"AdamW\([^\n]{0,120}(fused=True|foreach=)",
           "with sdpa_kernel(...)": r"with sdpa_kernel\(",
           "torch.profiler.profile": r"torch\.profiler\.profile\(|profiler\.profile\(",
           "key_averages()": r"key_averages\(\)",
           "the tf32 switch": r"fp32_precision\s*=|allow_tf32\s*=|set_float32_matmul_precision\("},
    "08": {"memory_stats()": r"memory_stats\(",
           "max_memory_allocated": r"max_memory_allocated\(",
           "reset_peak_memory_stats": r"reset_peak_memory_stats\("},
    "09": {"fully_shard": r"fully_shard\(",
           "MixedPrecisionPolicy": r"MixedPrecisionPolicy\("},
    "10": {"fully_shard(..., reshard_after_forward=...)": r"reshard_after_forward",
           "set_requires_gradient_sync": r"set_requires_gradient_sync\(",
           "parallelize_module with Colwise/RowwiseParallel": r"parallelize_module\(",
           "dist.all_reduce in f and g": r"dist\.all_reduce\(",
           "send / recv between stages": r"\bsend\(|isend\(",
           "torch.distributed.pipelining": r"pipelining"},
    "11": {"torch.save of every item": r"torch\.save\(",
           "torch.load(..., weights_only=True)": r"weights_only=True",
           "an atomic os.replace": r"os\.replace\(",
           "every generator's state": r"get_rng_state",
           "dcp.save / dcp.load": r"dcp\.save\(",
           "get_state_dict / set_state_dict": r"set_state_dict\(",
           "dcp.async_save": r"async_save\(",
           "the torchrun --max-restarts line": r"--max-restarts"},
    "12": {"init_device_mesh(..., mesh_dim_names=...)": r"init_device_mesh\(",
           "parallelize_module with SequenceParallel": r"SequenceParallel\(",
           "fully_shard on a mesh": r"fully_shard\([^\n]{0,120}mesh=",
           "all_to_all for the experts": r"all_to_all(_single)?\(",
           "an interleaved or zero-bubble schedule": r"ScheduleInterleaved1F1B|ScheduleInterleavedZeroBubble|"
                                                      r"ScheduleZBVZeroBubble"},
}
MAX_FORMATTING_SHARE = 0.10
MAX_CELL_LINES = 20
MAX_LINE_CHARS = 100
WIDTH_EXEMPT_IDS = {SETUP_ID}
GENERATED_IDS = {SETUP_ID}  # generated and folded: its own line limit, hosting.MAX_SETUP_LINES (tests/test_hosting.py)


def test_every_chapter_has_its_techniques_listed():
    assert set(TECHNIQUES) == set(CHAPTERS) - {"00"}


@pytest.mark.parametrize("chapter", sorted(TECHNIQUES))
def test_a_chapter_shows_every_technique_it_teaches(chapter):
    code = visible_code(CHAPTERS[chapter])
    missing = [what for what, rx in TECHNIQUES[chapter].items() if not re.search(rx, code)]
    assert not missing, f"{CHAPTERS[chapter].name} shows no {missing} in a code cell"


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_cells_read_like_the_technique_not_like_formatting(chapter):
    code = fmt = 0
    for c in pages.cells(CHAPTERS[chapter]):
        if c["cell_type"] == "code":
            src = pages.source(c)
            code += len(code_lines(src))
            fmt += len(formatting_lines(src))
    share = fmt / max(code, 1)
    assert share <= MAX_FORMATTING_SHARE, f"{CHAPTERS[chapter].name}: {fmt} of {code} code lines format strings"


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_no_code_cell_is_over_twenty_lines(chapter):
    long = [(i, len(pages.source(c).splitlines())) for i, c in enumerate(pages.cells(CHAPTERS[chapter]))
            if c["cell_type"] == "code" and c.get("id") not in GENERATED_IDS
            and len(pages.source(c).splitlines()) > MAX_CELL_LINES]
    assert not long, f"{CHAPTERS[chapter].name}: cells (index, lines) over {MAX_CELL_LINES} lines: {long}"


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_no_code_line_wider_than_100_characters(chapter):
    # JupyterLab at 1280 px shows about 108 characters of a code line; longer ones are cut at the edge
    # (the set-up cell is generated and folded: exempt)
    wide = [(c.get("id"), n + 1, len(line)) for c in pages.cells(CHAPTERS[chapter])
            if c["cell_type"] == "code" and c.get("id") not in WIDTH_EXEMPT_IDS
            for n, line in enumerate(pages.source(c).splitlines()) if len(line) > MAX_LINE_CHARS]
    assert not wide, f"{CHAPTERS[chapter].name}: code lines (cell id, line, chars) over {MAX_LINE_CHARS}: {wide}"


@pytest.mark.parametrize("chapter", sorted(TECHNIQUES))
def test_every_chapter_has_a_the_code_cell(chapter):
    tagged = [t for c in pages.cells(CHAPTERS[chapter]) for t in pages.tags(c) if t.startswith(f"code-{chapter}-")]
    assert tagged, f"{CHAPTERS[chapter].name} has no cell tagged code-{chapter}-<what>"


def _shown_everywhere():
    return sorted({(nb.name, name) for nb in CHAPTERS.values() for c in pages.cells(nb)
                   if c["cell_type"] == "code" for name in pages.shown(pages.source(c))})


@pytest.mark.parametrize("notebook,name", _shown_everywhere())
def test_a_shown_function_renders_its_current_source_and_says_where_it_is_taught(notebook, name):
    obj = pages.resolve(name)
    md = lk.course.show(obj)._repr_markdown_()
    assert inspect.getsource(obj).rstrip() in md and obj.__qualname__ in md
    assert f"Shown in {notebook[:-6]}" in (obj.__doc__ or ""), f"{name}'s docstring does not say it is taught in {notebook}"


@pytest.mark.parametrize("notebook,name", _shown_everywhere()[:3])
def test_a_shown_function_in_jupyterlab_never_wraps_inside_a_word(notebook, name):
    """JupyterLab prefers the HTML: the whole source, highlighted, in a block that scrolls instead of wrapping."""
    import html
    import re

    obj = pages.resolve(name)
    page = lk.course.show(obj)._repr_html_()
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert inspect.getsource(obj).rstrip() in text and "white-space:pre;" in page and "overflow-x:auto" in page


def test_show_renders_what_the_file_holds_now(tmp_path, monkeypatch):
    """Not a copy taken at import: the source is read when the cell runs."""
    import importlib
    import sys

    (tmp_path / "shown_mod.py").write_text("def f():\n    return 1  # first\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("shown_mod")
    assert "# first" in lk.course.show(mod.f)._repr_markdown_()
    (tmp_path / "shown_mod.py").write_text("def f():\n    return 2  # second\n")
    importlib.reload(mod)
    assert "# second" in lk.course.show(mod.f)._repr_markdown_()
    sys.modules.pop("shown_mod", None)


@pytest.mark.parametrize("bad", [None, 3, "micro_steps", lk])
def test_show_refuses_what_has_no_source(bad):
    with pytest.raises(lk.ConfigError, match="show"):
        lk.course.show(bad)
    with pytest.raises(lk.ConfigError, match="show"):
        lk.course.show()


class _Cmp:
    def __init__(self, better, decided=True, ratio=1.25):
        self.better, self.decided, self.ratio, self.low, self.high = better, decided, ratio, 1.1, 1.4
        self.label_a, self.label_b = "none", "full"


@pytest.mark.parametrize("better,decided,expected", [
    ("b", True, "B won"), ("a", True, "A won"), (None, True, "tie"), ("b", False, "too few"), (None, False, "too few")])
def test_explain_picks_the_sentence_the_verdict_calls_for(better, decided, expected, capsys):
    lk.course.explain(_Cmp(better, decided), faster="B won", slower="A won", same="tie", few="too few")
    assert capsys.readouterr().out.strip() == expected


def test_explain_fills_the_figures_and_accepts_better_worse(capsys):
    lk.course.explain(_Cmp("b"), better="{b} beat {a}: {ratio} ({low}-{high})", worse="no")
    assert capsys.readouterr().out.strip() == "full beat none: 1.25× (1.1-1.4)"


def test_explain_says_which_sentence_is_missing():
    with pytest.raises(lk.ConfigError, match="same"):
        lk.course.explain(_Cmp(None), faster="x", slower="y")
    with pytest.raises(lk.ConfigError, match="measured"):
        lk.course.explain(object(), faster="x")
    with pytest.raises(lk.ConfigError, match="faster"):
        lk.course.explain(_Cmp("b"), faster=3)


def test_explain_chooses_among_any_verdict_an_instrument_returns(capsys):
    said = lk.course.explain("too_far", values={"ratio": 0.57}, agree="agree at {ratio}",
                             too_far="apart: {ratio}")
    assert said == "too_far" and capsys.readouterr().out.strip() == "apart: 0.57"
    assert lk.course.explain(False, yes="kept", no="lost") == "no"
    assert capsys.readouterr().out.strip() == "lost"
    assert lk.course.explain(_Cmp("a"), better="b", worse="a won") == "worse"  # the side, in the cell's words


def test_explain_refuses_a_verdict_without_its_sentence_or_figure():
    with pytest.raises(lk.ConfigError, match="too_far"):
        lk.course.explain("too_far", agree="x")
    with pytest.raises(lk.ConfigError, match="ratio"):
        lk.course.explain("agree", agree="at {ratio}")
    with pytest.raises(lk.ConfigError, match="measured"):
        lk.course.explain("not a name", agree="x")
    with pytest.raises(lk.ConfigError, match="values"):
        lk.course.explain("agree", values=[1], agree="x")


def test_table_draws_rows_the_cell_measured():
    t = lk.course.table([{"k": 4, "ms": 12.5}], [("k", "K", "{}"), ("ms", "time", "{:.1f} ms")])
    assert t._repr_markdown_().splitlines()[-1] == "| 4 | 12.5 ms |"


@pytest.mark.parametrize("src,fmt", [
    ('x = 1\nprint(f"a {x}")\n', {2}),
    ('lk.course.say(\n    "plain words here"\n    + str(3))\n', {2, 3}),
    ('lk.course.say(cmp.sentence)\nlk.course.say("Skipped here: no GPU.")\n', set()),
    ('"{} and {}".format(a, b)\n', {1}),
    ('"%d items" % n\n', {1}),
    ('label = "micro-batch " + str(b)\n', {1}),
    ('words = ", ".join(names)\n', {1}),
    ('n = a + b\nx = [1] + [2]\n', set()),
    ('# f"not code"\nloss = loss / K\n', set()),
    ('cmp = lk.compare_configs(a, b, label_a="none")\n', set()),
])
def test_the_formatting_count_sees_every_kind_of_string_building(src, fmt):
    assert formatting_lines(src) == fmt


def test_the_cheat_sheet_is_generated_from_the_chapters():
    assert cheatsheet.PATH.exists(), "run `python -m labkit.instructor.cheatsheet --write`"
    assert cheatsheet.PATH.read_text() == cheatsheet.build(), \
        "notebooks/cheatsheet.md is stale: run `python -m labkit.instructor.cheatsheet --write`"


def test_the_cheat_sheet_holds_every_the_code_cell_with_a_link():
    text = cheatsheet.build()
    for nb in CHAPTERS.values():
        for heading, tag, code in cheatsheet.entries(nb):
            assert f"(`{tag}`)" in text and f"]({nb.name}#" in text
            assert code in text
