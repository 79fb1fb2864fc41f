"""Which sentences a learner could read at one revision are gone at another (issue #47's "nothing is lost").

    python3 benchmarks/lost_sentences.py --base 47ac913            # head: the working tree
    python3 benchmarks/lost_sentences.py --base 47ac913 --head main --json

A static inventory, no chapter is run: every sentence a learner could read, collected from the files of a
revision (``git ls-tree`` / ``git cat-file``, no checkout):

* the notebooks (``notebooks/**/*.ipynb``): markdown cells, and the string literals of code cells (parsed with
  ``ast``; ``%`` and ``!`` lines skipped; an f-string by its literal parts);
* every ``.md`` file under ``notebooks/`` or ``labkit/`` (the pages, labkit's templates);
* labkit's Python (``labkit/**/*.py``): the non-docstring string literals of 4 words or more (the prose strings
  ``benchmarks/course_size.py`` counts).

The texts are split into sentences and normalised (lower case, one space, no markdown emphasis, links or
backticks, ``{placeholder}`` and f-string holes as one token). A base sentence of 5 words or more is *kept* when
its normalised text is a head sentence, or part of one; else *reworded* when a head sentence is close
(``difflib`` ratio >= 0.8; the candidates are the head sentences sharing one of its rarest words); else *gone*,
listed with where it was (file and line, or a notebook's cell id) and, for a reviewer, where most of its
content words stand together at head (a rewrite, a table's headings -- or chance: read it).
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course_size import _docstrings, _words  # noqa: E402  (benchmarks/ is no package)

ROOT = Path(__file__).resolve().parents[1]
HOLE = "{}"
MIN_WORDS = 5
RATIO = 0.8
RARE = 3  # a base sentence's rarest words that choose the fuzzy candidates


# ---------------------------------------------------------------- files of a revision (or the working tree)

def _git(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], input=data, capture_output=True, check=True).stdout


def _wanted(path: str) -> bool:
    if path.startswith("notebooks/") and path.endswith((".ipynb", ".md")):
        return True
    return path.startswith("labkit/") and path.endswith((".md", ".py"))


def read_files(repo: Path, rev: str | None) -> dict:
    """{path: text} of the files the inventory reads, at ``rev`` (None: the working tree)."""
    if rev is None:
        names = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").decode().split("\0")
        out = {}
        for name in filter(_wanted, names):
            p = repo / name
            if p.is_file():
                out[name] = p.read_text(encoding="utf-8", errors="replace")
        return out
    names = [n for n in _git(repo, "ls-tree", "-r", "-z", "--name-only", rev).decode().split("\0") if _wanted(n)]
    raw = _git(repo, "cat-file", "--batch", data="".join(f"{rev}:{n}\n" for n in names).encode())
    out, pos = {}, 0
    for name in names:
        end = raw.index(b"\n", pos)
        size = int(raw[pos:end].split()[2])
        out[name] = raw[end + 1:end + 1 + size].decode("utf-8", errors="replace")
        pos = end + 2 + size
    return out


# ---------------------------------------------------------------- texts -> (text, where)

def _literal(node) -> str:
    """A str constant's text, or an f-string's literal parts with a hole for each expression."""
    if isinstance(node, ast.Constant):
        return node.value
    return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)


def python_strings(source: str, min_words: int = 0, docstrings: bool = True):
    """(text, line) of the string literals of ``source`` (f-strings whole, by their literal parts)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    docs = set() if docstrings else _docstrings(tree)
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in ast.walk(n) if v is not n}
    out = []
    for node in ast.walk(tree):
        if id(node) in docs or id(node) in inner:
            continue
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(node, ast.JoinedStr):
            if _words(node) >= max(min_words, 1):
                out.append((_literal(node), node.lineno))
    return out


_COMMENT = re.compile(r"<!--.*?-->", re.S)


def texts(path: str, text: str):
    """(text, where) a learner could read in one file (markdown without its HTML comments, never rendered)."""
    if path.endswith(".ipynb"):
        try:
            cells = json.loads(text)["cells"]
        except (ValueError, KeyError):
            return []
        out = []
        for i, cell in enumerate(cells):
            src = "".join(cell.get("source", []))
            where = f"cell {cell.get('id', '#' + str(i))}"
            if cell.get("cell_type") == "markdown":
                out.append((_COMMENT.sub("", src), where))
            elif cell.get("cell_type") == "code":
                code = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))
                out += [(s, where) for s, _ in python_strings(code)]
        return out
    if path.endswith(".py"):
        return [(s, f"line {n}") for s, n in python_strings(text, min_words=4, docstrings=False)]
    return [(_COMMENT.sub("", text), "")]


# ---------------------------------------------------------------- sentences

_BREAK = re.compile(r"^\s*(#{1,6}\s|[-*+]\s|\d+[.)]\s|>|\||```|~~~|<)")
_SPLIT = re.compile(r"(?<=[.!?])[\"')\]*_`]*\s+(?=[\"'(\[*_`]*[A-Z0-9])")


def sentences(text: str):
    """The sentences of a markdown or string text: blocks (blank lines, headings, list items, table rows,
    fences) joined into lines, then split after ., ! or ? before a capital or a digit."""
    blocks, cur = [], []
    for line in text.splitlines():
        if not line.strip() or _BREAK.match(line):
            if cur:
                blocks.append(" ".join(cur))
            cur = [line] if line.strip() else []
            continue
        cur.append(line)
    if cur:
        blocks.append(" ".join(cur))
    for block in blocks:
        if block.lstrip().startswith("|"):
            yield from (c for c in block.split("|") if c.strip())
            continue
        yield from _SPLIT.split(block)


_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_PLACEHOLDER = re.compile(r"\{[^{}\s]*\}")
_EMPHASIS = re.compile(r"(\*\*|__|\*|`|(?<!\w)_|_(?!\w)|~~)")
_TAG = re.compile(r"</?[a-zA-Z][^>]*>")
_HEAD = re.compile(r"^(#{1,6}\s|[-*+]\s|\d+[.)]\s|>\s?)+")


def normalise(sentence: str) -> str:
    s = _LINK.sub(r"\1", sentence.strip())
    s = _HEAD.sub("", s)
    s = _TAG.sub(" ", s)
    s = _PLACEHOLDER.sub(" § ", s)
    s = _EMPHASIS.sub("", s)
    s = re.sub(r"\s+", " ", s.lower()).strip()
    return s.strip(" \"'")


def ordered(files: dict) -> list:
    """(normalised sentence, where) of every sentence of ``files``, in reading order."""
    out = []
    for path, text in files.items():
        for chunk, where in texts(path, text):
            out += [(n, f"{path} {where}".strip()) for n in map(normalise, sentences(chunk)) if n]
    return out


def inventory(files: dict) -> dict:
    """{normalised sentence: [where, ...]}, every sentence (the word floor is applied by ``compare``)."""
    inv = defaultdict(list)
    for norm, where in ordered(files):
        inv[norm].append(where)
    return dict(inv)


def _word_count(norm: str) -> int:
    return sum(1 for w in norm.split() if re.search(r"[a-z]", w))


# ---------------------------------------------------------------- comparison

_STOP = frozenset("that this with from than they their there were what when which while each only more into have "
                  "here does both them then your after before about other these those every same until where "
                  "under over also once just like such".split())


def _content(s: str) -> set:
    return {w for w in re.findall(r"[a-z][a-z0-9_]{3,}", s) if w not in _STOP}


def hints(gone: list, seq: list) -> None:
    """For a reviewer: where most of a gone sentence's content words stand together at head (three
    consecutive sentences of one file), with the share found -- a rewrite, a table's headings, or chance."""
    toks = [_content(n) for n, _ in seq]
    pos = defaultdict(list)
    for i, ws in enumerate(toks):
        for w in ws:
            pos[w].append(i)
    for g in gone:
        words, best, at = _content(g["sentence"]), 0.0, ""
        for w in sorted((w for w in words if w in pos), key=lambda w: len(pos[w]))[:RARE + 1]:
            for i in pos[w][:400]:
                for lo in range(max(i - 2, 0), i + 1):
                    if seq[lo][1].split(" ")[0] != seq[i][1].split(" ")[0]:
                        continue
                    share = len(words & set().union(*toks[lo:lo + 3])) / len(words)
                    if share > best:
                        best, at = share, seq[lo][1]
        g["words_found"], g["words_at"] = round(best, 2), at


def compare(repo: Path, base: str, head: str | None = None) -> dict:
    before = inventory(read_files(repo, base))
    seq = ordered(read_files(repo, head))
    after = defaultdict(list)
    for norm, where in seq:
        after[norm].append(where)
    base_sents = {s: w for s, w in before.items() if _word_count(s) >= MIN_WORDS}
    head_sents = list(after)
    corpus = "\n".join(head_sents)
    kept, missing = [], []
    for s in base_sents:
        (kept if s in after or s in corpus else missing).append(s)
    tokens = [set(re.findall(r"[a-z][a-z0-9_']+", s)) for s in head_sents]
    df, index = defaultdict(int), defaultdict(list)
    for i, ws in enumerate(tokens):
        for w in ws:
            df[w] += 1
            index[w].append(i)
    reworded, gone = [], []
    for s in missing:
        words = sorted(set(re.findall(r"[a-z][a-z0-9_']+", s)) & df.keys(), key=lambda w: (df[w], w))
        cands = {i for w in words[:RARE] for i in index[w]}
        best, best_i = 0.0, None
        for i in cands:
            m = difflib.SequenceMatcher(None, s, head_sents[i], autojunk=False)
            if m.real_quick_ratio() >= RATIO and m.quick_ratio() >= RATIO:
                r = m.ratio()
                if r > best:
                    best, best_i = r, i
        if best >= RATIO:
            reworded.append({"sentence": s, "now": head_sents[best_i], "ratio": round(best, 3),
                             "where": base_sents[s], "now_where": after[head_sents[best_i]]})
        else:
            gone.append({"sentence": s, "where": base_sents[s]})
    hints(gone, seq)
    gone.sort(key=lambda g: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", g["where"][0])])
    return {"base": base, "head": head or "working tree",
            "summary": {"at_base": len(base_sents),
                        "at_head": sum(1 for s in after if _word_count(s) >= MIN_WORDS),
                        "kept": len(kept), "reworded": len(reworded), "gone": len(gone)},
            "reworded": reworded, "gone": gone}


def report(result: dict) -> str:
    s = result["summary"]
    lines = [f"Sentences of >= {MIN_WORDS} words, {result['base']} -> {result['head']}", "",
             "| at base | at head | kept exactly | reworded (fuzzy) | gone |",
             "|---:|---:|---:|---:|---:|",
             f"| {s['at_base']} | {s['at_head']} | {s['kept']} | {s['reworded']} | {s['gone']} |", "",
             "Gone (no head sentence within ratio %.1f):" % RATIO]
    last = None
    for g in result["gone"]:
        place = g["where"][0].split(" ", 1)
        if place[0] != last:
            lines.append(f"\n{place[0]}")
            last = place[0]
        more = f" (+{len(g['where']) - 1} more)" if len(g["where"]) > 1 else ""
        lines.append(f"  [{place[1] if len(place) > 1 else ''}{more}] {g['sentence']}")
        if g.get("words_at"):
            lines.append(f"      ~ {g['words_found']:.0%} of its words together at {g['words_at']}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the revision before")
    ap.add_argument("--head", default=None, help="the revision after (default: the working tree)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="a git checkout (default: this one)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    result = compare(a.repo, a.base, a.head)
    print(json.dumps(result, indent=1, ensure_ascii=False) if a.json else report(result))


if __name__ == "__main__":
    main()
