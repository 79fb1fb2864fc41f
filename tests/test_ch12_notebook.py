"""Chapter 12's notebook as a learner re-runs it: no cell reads a name that another section's cell binds
(a re-run out of order, e.g. an exercise after Run All, must not break a measurement cell above it)."""
import ast
import builtins
import json
from pathlib import Path

NB = Path(__file__).resolve().parent.parent / "notebooks" / "12_composing_the_layout.ipynb"


def _names(tree):
    """(names the cell binds at top level, names it reads that it did not bind itself)."""
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    scoped = set()  # names bound inside a function, lambda or comprehension are the cell's own too
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            scoped.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
    return bound, read - bound - scoped - set(dir(builtins))


def _cells():
    section, out = "preamble", []
    for c in json.loads(NB.read_text())["cells"]:
        text = "".join(c["source"])
        if c["cell_type"] == "markdown" and text.startswith("## "):
            section = text.split("\n", 1)[0]
        elif c["cell_type"] == "code" and "setup" not in c["metadata"].get("tags", []):
            out.append((section, c["id"], *_names(ast.parse(text))))
    return out


def test_no_cell_reads_a_name_another_section_binds():
    cells = _cells()
    binders = {}
    for section, _, bound, _ in cells:
        for name in bound:
            binders.setdefault(name, set()).add(section)
    shared = {n: s for n, s in binders.items() if len(s) > 1}
    clashes = [(cid, name, sorted(binders[name])) for section, cid, _, read in cells
               for name in read if name in shared]
    assert not clashes, clashes
    preamble = {n for s, _, bound, _ in cells if s == "preamble" for n in bound}
    rebound = {n: sorted(s - {"preamble"}) for n, s in binders.items() if n in preamble and s - {"preamble"}}
    assert not rebound, rebound  # lk, size, ws, env, the room's modules: never rebound by a section
