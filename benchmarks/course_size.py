"""How much of the course lives in the package rather than the notebooks (issues #47 and #48's measures).

    python3 benchmarks/course_size.py            # a table
    python3 benchmarks/course_size.py --json     # the same figures as JSON

* prose-string lines: lines of labkit/ that hold part of a string literal of 4 words or more which is not a
  docstring (an f-string counts by its literal parts) -- in all of labkit, labkit/chapters, labkit/content and labkit/instructor;
  and the same without what issue #47 lets stay in Python ("taught_prose_lines"): error messages (a `raise`
  statement, or a call of a class whose name ends in Error) and the checkers' hints (labkit/check/);
* labkit lines and modules; `notes` modules (a file named *notes*.py);
* note-builder calls in the notebooks: calls, in code cells, of a function whose name ends in `note`, `notes`
  or `words` (the naming the note builders use), `lk.course.explain` not among them;
* English words in the notebooks' markdown.
Counted from the files, no import of labkit: it runs anywhere, before and after a change.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILDER = re.compile(r"(note|notes|words)$")


def _docstrings(tree) -> set:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def _words(node) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return len(node.value.split())
    if isinstance(node, ast.JoinedStr):
        return sum(len(v.value.split()) for v in node.values if isinstance(v, ast.Constant))
    return 0


def prose_lines(path: Path) -> set:
    """Line numbers of ``path`` holding part of a non-docstring string literal of >= 4 words."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs, lines, inner = _docstrings(tree), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inner.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if id(node) in docs or id(node) in inner:
            continue
        if _words(node) >= 4:
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def error_lines(path: Path) -> set:
    """Line numbers of ``path`` inside a ``raise`` statement or a call of a class named ``...Error``."""
    lines = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) or (isinstance(node, ast.Call) and _called_name(node).endswith("Error")):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def taught_prose_lines(path: Path) -> set:
    """``prose_lines`` less error messages (a module of labkit/check/ is left out by ``package``: hints)."""
    return prose_lines(path) - error_lines(path)


def package(folder: Path) -> dict:
    files = sorted(folder.rglob("*.py"))
    total = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)
    prose = sum(len(prose_lines(f)) for f in files)
    taught = sum(len(taught_prose_lines(f)) for f in files if folder / "check" not in f.parents)
    return {"modules": len(files), "lines": total, "prose_lines": prose,
            "prose_share": round(prose / total, 4) if total else 0.0, "taught_prose_lines": taught}


def _called_name(node) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def notebooks(folder: Path) -> dict:
    calls, words, per = 0, 0, {}
    for nb_path in sorted(folder.glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        n = 0
        for cell in nb["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                words += len(src.split())
                continue
            try:
                tree = ast.parse("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!"))))
            except SyntaxError:
                continue
            n += sum(1 for c in ast.walk(tree) if isinstance(c, ast.Call) and BUILDER.search(_called_name(c))
                     and _called_name(c) != "explain")
        per[nb_path.stem[:2]] = n
        calls += n
    return {"note_builder_calls": calls, "per_notebook": per, "markdown_words": words}


def measure(root: Path = ROOT) -> dict:
    lab = root / "labkit"
    return {"labkit": package(lab), "chapters": package(lab / "chapters"), "content": package(lab / "content"),
            "instructor": package(lab / "instructor"),
            "notes_modules": sorted(str(p.relative_to(root)) for p in lab.rglob("*notes*.py")),
            "notebooks": notebooks(root / "notebooks")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--root", type=Path, default=ROOT, help="a checkout (default: this one)")
    args = ap.parse_args(argv)
    m = measure(args.root)
    if args.json:
        print(json.dumps(m, indent=1))
        return
    for k in ("labkit", "chapters", "content", "instructor"):
        d = m[k]
        print(f"{k:>9}: {d['lines']:>6} lines, {d['modules']:>3} modules, prose-string lines {d['prose_lines']:>5} "
              f"({100 * d['prose_share']:.1f} %); without error messages and hints {d['taught_prose_lines']:>5}")
    print(f"notes modules: {len(m['notes_modules'])}")
    nb = m["notebooks"]
    print(f"note-builder calls in notebooks: {nb['note_builder_calls']} {nb['per_notebook']}")
    print(f"markdown words in notebooks: {nb['markdown_words']}")


if __name__ == "__main__":
    main()
