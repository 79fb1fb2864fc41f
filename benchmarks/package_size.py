"""How big labkit is beside the notebooks it serves (issue #48's measures), counted from the files.

    python3 benchmarks/package_size.py                 # a table
    python3 benchmarks/package_size.py --json          # the same figures as JSON
    python3 benchmarks/package_size.py --root DIR      # another tree (e.g. `git archive REV | tar -x -C DIR`)

* labkit lines and modules (every .py file under labkit/, as `wc -l` counts), per top folder, and the
  lines by kind: code, docstrings, comment-only lines, blank;
* each chapter's own package lines: the modules under labkit/chapters that its notebook reaches through imports
  (followed inside labkit/chapters only; a folder it imports counts whole) and no other chapter's notebook reaches -- with rooms, the chapter's room;
  divided by the notebook's code lines (non-blank lines of code cells); the whole course's ratio is every labkit
  line over every notebook code line;
* test files named after a review round (hardening, errata, "third") and the number of test functions;
* with --import, what a learner's `import labkit` loads (in a fresh Python): the count of labkit modules and any
  `labkit.instructor` module among them.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = re.compile(r"^(\d\d)_.*\.ipynb$")
ROUND = re.compile(r"hardening|errata|third")


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _kinds(path: Path) -> dict:
    """One file's lines by kind: blank, docstring (a module's, class's or function's first string),
    comment (a line that is only a comment) and code (the rest)."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines()
    blank = {i for i, line in enumerate(lines, 1) if not line.strip()}
    doc = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                doc |= set(range(first.lineno, first.end_lineno + 1)) - blank
    comment = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(src).readline)
               if t.type == tokenize.COMMENT and lines[t.start[0] - 1].lstrip().startswith("#")} - blank - doc
    return {"code": len(lines) - len(blank) - len(doc) - len(comment), "docstring": len(doc),
            "comment": len(comment), "blank": len(blank)}


def _module_file(root: Path, dotted: str) -> Path | None:
    """The file of ``labkit.x.y`` under ``root``: a module or a package's __init__."""
    base = root.joinpath(*dotted.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _name_of(root: Path, f: Path) -> str:
    parts = list(f.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root: Path, f: Path) -> set:
    """The labkit modules ``f`` imports (absolute or relative), as dotted names that have a file."""
    here = _name_of(root, f)
    package = here if f.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        bases = []
        if isinstance(node, ast.Import):
            bases = [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(up + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            bases = [(mod, tuple(a.name for a in node.names))]
        for mod, names in bases:
            if not mod.startswith("labkit"):
                continue
            for name in (mod, *(f"{mod}.{n}" for n in names)):
                if _module_file(root, name):
                    found.add(name)
    return found


def _notebook_code(nb_path: Path) -> list:
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _notebook_imports(root: Path, code: list) -> set:
    """Modules under labkit.chapters a notebook names: imports, and ``lk.<name>.`` where labkit/chapters/<name> is."""
    found = set()
    for src in code:
        for m in re.finditer(r"from (labkit[\w.]*) import ([\w ,]+)|import (labkit[\w.]*)", src):
            mod = m.group(1) or m.group(3)
            names = [n.split(" as ")[0].strip() for n in (m.group(2) or "").split(",") if n.strip()]
            for name in (mod, *(f"{mod}.{n}" for n in names)):
                if name.startswith("labkit.chapters") and _module_file(root, name):
                    found.add(name)
        for m in re.finditer(r"\blk\.(\w+)\.", src):
            if _module_file(root, f"labkit.chapters.{m.group(1)}"):
                found.add(f"labkit.chapters.{m.group(1)}")
    return found


def _reach(root: Path, start: set) -> set:
    """Every labkit.chapters module reachable from ``start``, following imports inside labkit.chapters."""
    seen, todo = set(), list(start)
    while todo:
        name = todo.pop()
        if name in seen or not name.startswith("labkit.chapters"):
            continue
        seen.add(name)
        f = _module_file(root, name)
        todo.extend(_imports(root, f))
        if f.name == "__init__.py" and name != "labkit.chapters":  # a chapter's folder is reached whole: its
            todo.extend(_name_of(root, g) for g in f.parent.rglob("*.py"))  # modules are used as `alias.module.x`
    seen.discard("labkit.chapters")
    return seen


def _test_functions(tests: Path) -> int:
    n = 0
    for f in tests.rglob("test_*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                n += 1
    return n


def learner_import(root: Path, python: str = sys.executable) -> dict:
    """What ``import labkit`` and a learner's first names load, in a fresh Python run in ``root``."""
    code = ("import json, sys, labkit as lk\n"
            "for name in ('course', 'check', 'quiz', 'drills', 'plots'):\n    getattr(lk, name)\n"
            "mods = sorted(m for m in sys.modules if m.startswith('labkit'))\n"
            "print(json.dumps(mods))")
    out = subprocess.run([python, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1:]}
    mods = json.loads(out.stdout.strip().splitlines()[-1])
    return {"modules": len(mods), "instructor": [m for m in mods if m.startswith("labkit.instructor")]}


def measure(root: Path = ROOT, with_import: bool = False) -> dict:
    pkg = root / "labkit"
    files = sorted(pkg.rglob("*.py"))
    folders, kinds = {}, {"code": 0, "docstring": 0, "comment": 0, "blank": 0}
    for f in files:
        for kind, n in _kinds(f).items():
            kinds[kind] += n
        top = f.relative_to(pkg).parts[0] if len(f.relative_to(pkg).parts) > 1 else "(top)"
        d = folders.setdefault(top, {"lines": 0, "modules": 0})
        d["lines"] += _lines(f)
        d["modules"] += 1
    total = sum(d["lines"] for d in folders.values())
    reached, code_lines = {}, {}
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        m = CHAPTER.match(nb.name)
        if not m:
            continue
        code = _notebook_code(nb)
        code_lines[m.group(1)] = sum(1 for src in code for line in src.splitlines() if line.strip())
        reached[m.group(1)] = _reach(root, _notebook_imports(root, code))
    chapters = {}
    for ch, mods in reached.items():
        own = sorted(x for x in mods if sum(x in other for other in reached.values()) == 1)
        lines = sum(_lines(_module_file(root, x)) for x in own)
        chapters[ch] = {"own_modules": own, "own_lines": lines, "code_lines": code_lines[ch],
                        "ratio": round(lines / max(code_lines[ch], 1), 1)}
    all_code = sum(code_lines.values())
    tests = root / "tests"
    result = {
        "labkit_lines": total, "labkit_modules": len(files), "folders": folders, "labkit_kinds": kinds,
        "notebook_code_lines": all_code, "course_ratio": round(total / max(all_code, 1), 1),
        "chapters": chapters, "worst_chapter_ratio": max((c["ratio"] for c in chapters.values()), default=0.0),
        "round_named_test_files": sorted(f.name for f in tests.glob("test_*.py") if ROUND.search(f.name)),
        "test_functions": _test_functions(tests),
    }
    if with_import:
        result["learner_import"] = learner_import(root)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--import", dest="with_import", action="store_true", help="also run a learner's import")
    args = ap.parse_args(argv)
    m = measure(args.root.resolve(), args.with_import)
    if args.json:
        print(json.dumps(m, indent=1))
        return 0
    print(f"labkit: {m['labkit_lines']:,} lines in {m['labkit_modules']} modules; notebooks' code "
          f"{m['notebook_code_lines']:,} lines; {m['course_ratio']} package lines per notebook code line")
    print("  of which " + ", ".join(f"{k} {n:,}" for k, n in m["labkit_kinds"].items()))
    for top, d in sorted(m["folders"].items(), key=lambda kv: -kv[1]["lines"]):
        print(f"  {top:<12} {d['lines']:>6,} lines {d['modules']:>4} modules")
    for ch, c in m["chapters"].items():
        print(f"  chapter {ch}: {c['own_lines']:>5,} own lines / {c['code_lines']:>4} code lines = {c['ratio']:>4}x"
              f"  ({len(c['own_modules'])} modules)")
    print(f"worst chapter: {m['worst_chapter_ratio']}x; test functions: {m['test_functions']:,}; "
          f"test files named by round: {len(m['round_named_test_files'])}")
    if "learner_import" in m:
        print(f"learner import: {m['learner_import']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
