"""labkit's shape, checked from its source with ``ast`` (nothing is imported or run):

* **one import direction**: the graph of imports between labkit's modules -- module-level *and* inside
  functions, relative and absolute -- has no cycle. An import inside a function still ties two modules
  together; hiding it there only moves the cycle out of sight. And every import runs down the layers,
  which are the package's folders (``FOLDERS``; inside ``engine/`` the ranks of ``ENGINE``): a module
  imports from its own folder or from the ones before it.
* **small pieces**: no module longer than 500 lines, no function longer
  than 80 lines, no class longer than 300 lines.
* **imports at the top**: an import inside a function is allowed only where a heavy or optional
  dependency is deferred on purpose (matplotlib, ipywidgets, IPython, psutil, ...), and then the line
  says why with a ``# deferred: <why>`` comment, e.g.

      import psutil  # deferred: optional (the course extras); without it the figure is None

  The comment goes on the import's first line; ``<why>`` must not be empty.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "labkit"
# The layers are labkit's folders, leaves first (labkit/__init__.py's docstring says what each is for): a
# module's layer is its folder, and it imports only from its own folder or the ones before it. The package
# itself and the CLI (labkit/__init__.py, labkit/__main__.py) sit on top of them all.
FOLDERS = ("base", "engine", "tools", "whatif", "chapters", "panel", "check", "drills", "content", "instructor")
# instructor/ is the top layer: it may import anything, and nothing in labkit imports it but the CLI (lazily, in the
# commands that need it); tests and benchmarks do too. A learner's ``import labkit`` never loads it.
INSTRUCTOR_USERS = {"labkit.__main__"}
# Inside engine/ the order matters too (one run's data flow): a module imports only from its own rank or
# those before it. A new engine module must be listed here.
ENGINE = (("config",), ("gpus",), ("device",), ("precision", "rules"),
          ("checkpointing", "model", "data", "tracer", "measure"), ("step",), ("ddp", "warm", "launch"),
          ("train",))
TOP = len(FOLDERS) + 1
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
BIG_ON_PURPOSE = {}  # the question bank moved to notebooks/interview_questions.md (issue 47.3)
MAX_CLASS_LINES = 300
DEFERRED = "# deferred:"


def _modules() -> dict:
    """{dotted module name: path} for every module of the package (a package is its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def _targets(module: str, node) -> list:
    """The labkit modules an import statement in ``module`` loads (``from . import x`` loads the
    submodule x when there is one, else the package)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "labkit"]
    if node.level:
        here = module.split(".")
        if MODULES[module].name != "__init__.py":
            here = here[:-1]  # a module's own package
        base = here[:len(here) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    if prefix.split(".")[0] != "labkit":
        return []
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]


def import_graph() -> dict:
    """{module: set of labkit modules it imports anywhere in its source}."""
    graph = {name: set() for name in MODULES}
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(name, node):
                    while target not in MODULES and "." in target:  # labkit.x.y where y is a name
                        target = target.rsplit(".", 1)[0]
                    if target in MODULES and target != name:
                        graph[name].add(target)
    return graph


def find_cycle(graph: dict):
    """One cycle as a list of modules [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def layer_of(module: str) -> float:
    """The layer of ``labkit.<folder>.<module>``: the folder's place in FOLDERS (inside engine/, plus a
    fraction for the module's rank in ENGINE); the package and the CLI are on top."""
    parts = module.split(".")[1:]
    if not parts or parts[0] not in FOLDERS:
        return TOP
    layer = FOLDERS.index(parts[0]) + 1
    if parts[0] == "engine" and len(parts) > 1:
        rank = next((i for i, names in enumerate(ENGINE) if parts[1] in names), None)
        assert rank is not None, f"{module} is not in test_layers.ENGINE: give it its place in one run's data flow"
        layer += (rank + 1) / (len(ENGINE) + 1)
    return layer


def _definitions(kind):
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, kind):
                yield name, node, node.end_lineno - node.lineno + 1


def test_the_graph_sees_imports_inside_functions():
    """The checker itself: a function-level import is an edge (the old config -> device one was)."""
    tree = ast.parse("def f():\n    from . import device\n")
    node = tree.body[0].body[0]
    assert _targets("labkit.engine.config", node) == ["labkit.engine.device"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_run_down_the_layers():
    upward = [f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
              for src, targets in sorted(import_graph().items()) for dst in sorted(targets)
              if layer_of(dst) > layer_of(src)]
    assert not upward, "imports against the layers (see FOLDERS and ENGINE):\n" + "\n".join(upward)


def test_only_the_cli_imports_the_instructor_package():
    users = sorted(src for src, targets in import_graph().items() if not src.startswith("labkit.instructor")
                   and any(t == "labkit.instructor" or t.startswith("labkit.instructor.") for t in targets))
    assert set(users) <= INSTRUCTOR_USERS, f"only {sorted(INSTRUCTOR_USERS)} may import labkit.instructor: {users}"
    assert _targets("labkit.__main__", ast.parse("from .instructor import classgrade").body[0]) == \
        ["labkit.instructor.classgrade"]


def test_no_function_over_80_lines():
    long = [f"{m}.{n.name}: {lines} lines" for m, n, lines in _definitions((ast.FunctionDef, ast.AsyncFunctionDef))
            if lines > MAX_FUNCTION_LINES]
    assert not long, "split these: " + "; ".join(long)


def test_no_module_over_500_lines():
    long = [f"{m}: {len(path.read_text().splitlines())} lines" for m, path in MODULES.items()
            if m not in BIG_ON_PURPOSE and len(path.read_text().splitlines()) > MAX_MODULE_LINES]
    assert not long, "split these by concern: " + "; ".join(long)


def test_every_module_lives_in_a_layer_folder():
    """Nothing new lands flat in labkit/: only the package and the CLI sit beside the folders."""
    flat = [m for m in MODULES if m.count(".") == 1 and m.split(".")[1] not in FOLDERS + ("__main__",)]
    assert not flat, f"put these in one of {FOLDERS}: {flat}"


def test_no_class_over_300_lines():
    long = [f"{m}.{n.name}: {lines} lines" for m, n, lines in _definitions(ast.ClassDef) if lines > MAX_CLASS_LINES]
    assert not long, "split these: " + "; ".join(long)


def test_imports_inside_functions_say_why():
    bare = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for func in ast.walk(TREES[name]):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    line = lines[node.lineno - 1]
                    why = line.split(DEFERRED, 1)[1].strip() if DEFERRED in line else ""
                    if not why:
                        bare.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {line.strip()}")
    assert not bare, (f"move these imports to the module's top, or say why they wait ({DEFERRED} <why>):\n"
                      + "\n".join(sorted(set(bare))))


# ---- rooms: one per chapter (issue 48) ------------------------------------------------------------------
# A chapter's instruments live in its room, labkit/chapters/chNN_<topic> (a module or a folder). What two
# chapters share lives in a layer below (tools, engine, whatif), never in another chapter's room; besides the
# chapters' shared glue (GLUE: ``lk.course`` and the measurement file), nothing else sits in labkit/chapters.
NOTEBOOKS = PACKAGE.parent / "notebooks"
GLUE = ("labkit.chapters", "labkit.chapters.course", "labkit.chapters.measured")
# Inside labkit a room is imported by its own modules, by the checkers (a checker judges its chapter's exercise
# with the room's data and formulas) and by the instructor's tools; a notebook imports its own room only.
MAY_IMPORT_A_ROOM = ("labkit.check", "labkit.instructor")


def room_of(module: str):
    """'07' for labkit.chapters.ch07_kernels[.x], else None."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "chapters" and parts[2][:2] == "ch" and parts[2][2:4].isdigit():
        return parts[2][2:4]
    return None


def test_labkit_chapters_holds_rooms_and_the_shared_glue_only():
    stray = [m for m in MODULES if m.startswith("labkit.chapters") and m not in GLUE and room_of(m) is None]
    assert not stray, f"put each in its chapter's room (labkit/chapters/chNN_<topic>) or a layer below: {stray}"


def test_a_room_is_imported_only_by_itself_the_checkers_and_the_instructor():
    wrong = [f"{src} imports {dst}" for src, targets in sorted(import_graph().items()) for dst in sorted(targets)
             if room_of(dst) and room_of(src) != room_of(dst)
             and not src.startswith(MAY_IMPORT_A_ROOM)]
    assert not wrong, ("a room is its chapter's; move what another chapter or package needs down a layer:\n"
                       + "\n".join(wrong))


def notebook_rooms(path: Path) -> set:
    """The rooms a notebook's code cells import (``from labkit.chapters import ch05_loader``,
    ``labkit.chapters.ch05_loader.x``), as chapter numbers."""
    code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                     if c["cell_type"] == "code")
    rooms = set(re.findall(r"labkit\.chapters\.ch(\d\d)_", code))
    for names in re.findall(r"from labkit\.chapters import ([\w ,]+)", code):
        rooms.update(re.findall(r"\bch(\d\d)_", names))
    return rooms


def test_a_notebook_imports_its_own_room_only():
    wrong = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        own = path.name[:2] if path.name[:2].isdigit() else None
        other = sorted(r for r in notebook_rooms(path) if r != own)
        if other:
            wrong[path.name] = other
    assert not wrong, f"notebooks importing another chapter's room: {wrong}"


def test_the_room_checks_see_a_stray_import(tmp_path):
    nb = tmp_path / "03_x.ipynb"
    cell = {"cell_type": "code", "source": ["from labkit.chapters import ch04_checkpointing as c"]}
    nb.write_text(json.dumps({"cells": [cell]}))
    assert notebook_rooms(nb) == {"04"}
    assert room_of("labkit.chapters.ch10_parallel.layout") == "10" and room_of("labkit.chapters.course") is None


def unresolved(module: str, node) -> bool:
    """Whether a ``from ... import`` in ``module`` names a labkit module that does not exist."""
    return any(t not in MODULES for t in _targets(module, node))


def test_every_import_of_labkit_names_a_module_that_exists():
    """A relative import one dot short (``from ..tools`` in a room one folder deeper) is found here, not when a
    learner's cell first calls the function that holds it."""
    missing = [f"{MODULES[name].relative_to(PACKAGE.parent)}:{node.lineno}" for name, tree in TREES.items()
               for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and unresolved(name, node)]
    assert not missing, f"imports of labkit modules that do not exist: {missing}"
    short = ast.parse("def f():\n    from ..tools.plots import COLORS\n").body[0].body[0]
    assert unresolved("labkit.chapters.ch07_kernels.bench", short)
    assert not unresolved("labkit.chapters.ch07_kernels.bench", ast.parse("from ...tools.plots import COLORS").body[0])
