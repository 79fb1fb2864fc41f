"""labkit's shape, checked from its source with ``ast`` (nothing is imported or run):

* **one import direction**: the graph of imports between labkit's modules -- module-level *and* inside
  functions, relative and absolute -- has no cycle. An import inside a function still ties two modules
  together; hiding it there only moves the cycle out of sight. And every import runs down the layers
  below (``LAYERS``): a module imports from its own layer or from the ones above it in the list.
* **small pieces**: no function longer than 80 lines, no class longer than 300 lines.
* **imports at the top**: an import inside a function is allowed only where a heavy or optional
  dependency is deferred on purpose (matplotlib, ipywidgets, IPython, psutil, ...), and then the line
  says why with a ``# deferred: <why>`` comment, e.g.

      import psutil  # deferred: optional (the course extras); without it the figure is None

  The comment goes on the import's first line; ``<why>`` must not be empty.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "labkit"
# The layers, leaves first (the README's "Layout" says what each is for). A module not listed counts as
# a chapter tool (layer 8): an engine module that needs a lower layer must be listed here.
LAYERS = {
    1: ("errors", "runtime", "paths", "progress", "numfmt", "schema", "reference", "plots", "questions"),
    2: ("config",),
    3: ("device",),
    4: ("precision", "rules"),
    5: ("checkpointing", "model", "data", "tracer", "measure", "memtrace"),
    6: ("ddp",),
    7: ("train",),
    8: ("compare", "course", "loaderlab", "netmodel", "playbook", "quiz"),
    9: ("panel_parts", "panel_knobs", "panel_history", "panel_whatif", "widgets", "__main__", ""),
    10: ("check",),
}
CHAPTER_TOOLS = 8
MAX_FUNCTION_LINES = 80
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


def layer_of(module: str) -> int:
    """The layer of ``labkit.x`` (``labkit`` itself is the package's __init__; ``labkit.check.*`` the checkers)."""
    parts = module.split(".")[1:]
    name = parts[0] if parts else ""
    for layer, names in LAYERS.items():
        if name in names:
            return layer
    return CHAPTER_TOOLS


def _definitions(kind):
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, kind):
                yield name, node, node.end_lineno - node.lineno + 1


def test_the_graph_sees_imports_inside_functions():
    """The checker itself: a function-level import is an edge (the old config -> device one was)."""
    tree = ast.parse("def f():\n    from . import device\n")
    node = tree.body[0].body[0]
    assert _targets("labkit.config", node) == ["labkit.device"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_run_down_the_layers():
    upward = [f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
              for src, targets in sorted(import_graph().items()) for dst in sorted(targets)
              if layer_of(dst) > layer_of(src)]
    assert not upward, "imports against the layers (see LAYERS):\n" + "\n".join(upward)


def test_no_function_over_80_lines():
    long = [f"{m}.{n.name}: {lines} lines" for m, n, lines in _definitions((ast.FunctionDef, ast.AsyncFunctionDef))
            if lines > MAX_FUNCTION_LINES]
    assert not long, "split these: " + "; ".join(long)


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
