"""The Russian edition (issue #51): ``notebooks/ru/NN_name.ipynb`` built from the English chapter and its
translation, so the two cannot drift apart.

    python -m labkit.content.translate --check    # what is missing or stale, cell by cell; writes nothing
    python -m labkit.content.translate --update   # the catalogues follow the English: new entries, fuzzy ones
    python -m labkit.content.translate --build    # writes notebooks/ru/*.ipynb (refused while --check fails)

**The format: a gettext catalogue per chapter** (``notebooks/ru/NN_name.po``; the set-up cell, the same in every
chapter, in ``notebooks/ru/common.po``), read and written with Babel (which JupyterLab already installs). Each
entry's context (``msgctxt``) is the English cell's id; its ``msgid`` is the English it translates -- a
markdown cell's whole text, or one comment or verdict sentence of a code cell, keyed within the cell by the
English text itself. That is the hash the issue asks for, and more: the check compares the English stored
with the chapter's, so an edited cell makes its entry stale and the check names the cell, and ``--update``
marks the entry fuzzy and keeps the old English beside it (``#| msgid``), which every translator's tool
(Poedit, Lokalize, Weblate) shows as a diff. Plain YAML or JSON would give translators an editor and a hash
that can only say "changed"; .po gives them the tools made for this job. labkit's own sentences stay in the
markdown pages the code reads (``notebooks/ru/lab_messages.md``, ``labkit.base.phrases``), each entry with
the 8-digit hash of its English (``- key @hash: ...``).

**Code cells stay the English code.** Only comments and the sentences a learner reads are translated: the
keyword sentences of ``explain``, the text of ``say``, the ``what`` of ``compare_prediction``, the column
headings of ``table`` and the words of a column's ``lambda v: "yes" if v else "no"``, and what ``print`` is
given (``said_strings``). There, either branch of ``a if c else b`` and both sides of ``a + b`` are said; a
name stands for the string last assigned to it in the cell (``same=lost`` after ``lost = ("...")``); an
f-string's entries are its constant parts, each on its own, while its fields stay the code, in their order. A
translated string is rewrapped into implicitly joined literals (lines of at most 100 characters; an f-string
is written anew, a literal holding a field being an f-string), so the cell parses to the same tree apart from
string constants (tests/test_translate.py). A string without a letter (a rule of spaces, ``" = "``) is no
entry. The one line added is the language choice at the top of the set-up cell (``LANG_LINE``): it sets
``LABKIT_LANG`` before labkit is imported, because a few of labkit's words (the presets' and knobs' notes) are
read at import.

**Numbers keep the decimal point everywhere**, prose included: every figure a learner sees comes from code
(``lk.course.number``, tables, verdict sentences) and prints with a point; a comma in the prose around them
would put two notations for one figure on one page, and the point is what Russian ML engineers read in code,
papers and logs every day. Thousands: a narrow no-break space (``numfmt.grouped``), never a comma.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import textwrap
import tokenize
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

from ..base.runtime import ConfigError
from .pages import CELL_ID, heading_cells

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
LANG = "ru"
# every chapter and the bank's notebook: the check and the build cover these
CHAPTERS = ("00_start_here", "01_measure_first", "02_mixed_precision", "03_gradient_accumulation",
            "04_activation_checkpointing", "05_data_loader", "06_ddp_allreduce", "07_kernels_and_compile",
            "08_memory_in_practice", "09_fixed_gpus_playbook", "10_when_the_model_does_not_fit",
            "11_long_runs_and_failures", "12_composing_the_layout", "interview_questions")
SETUP_ID = "labkit-setup"  # the set-up cell, the same in every chapter: its entries live in common.po
LANG_LINE = 'os.environ["LABKIT_LANG"] = "ru"  # глава на русском: labkit тоже говорит по-русски'
WIDTH = 100
# the words a learner reads in a code cell: (function name, which argument) -> translated
SAID_BY = {"explain": "keywords", "say": 0, "compare_prediction": 2, "table": "headings", "print": "all"}
KEPT_PREFIX = re.compile(r"^(@title |noqa(: [\w, ]+)?\s*(- )?|type: ignore\S*\s*)")
WORD = re.compile(r"[^\W\d_]")  # a said string without a letter (a rule of spaces, " = ") is not an entry
# a markdown link to a section: [words](#Heading-anchor "tags"), or to another chapter's (NN_name.ipynb#...,
# ../NN_name.ipynb#... for an English one); a fragment may hold one level of brackets (".to()")
SECTION_LINK = re.compile(r'\]\((?P<notebook>(?:\.\./)?[\w.-]+\.ipynb)?#(?P<anchor>(?:[^()\s]|\([^()\s]*\))+)'
                          r'(?P<title> "[^"]*")?\)')


def ru_dir(root: Path | None = None) -> Path:
    return (root or NOTEBOOKS) / LANG


# ---- what a cell has to translate ------------------------------------------------------------------------

def _char_col(line: str, byte_col: int) -> int:
    return len(line.encode("utf-8")[:byte_col].decode("utf-8"))


def texts(node) -> list:
    """The English of a said string constant, or the constant parts of a said f-string (its fields are code)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if WORD.search(node.value) else []
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant) and WORD.search(v.value)]
    return []


def said_strings(source: str) -> list:
    """[(node, (line, col), (end line, end col), in brackets)] of the strings a learner reads (SAID_BY; ``texts``),
    in order; lines 1-based, columns in characters. Either branch of ``a if c else b`` is said, and so is the string last
    assigned to a name in the cell when the name is said (``same=lost``, ``lost = ("Layer norms ...")``)."""
    lines, tree = source.splitlines(), ast.parse(source)
    assigned = {t.id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
    found = {}

    def add(node, follow=True):
        if isinstance(node, ast.IfExp):
            add(node.body, follow), add(node.orelse, follow)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "... at T = " + str(T)
            add(node.left, follow), add(node.right, follow)
        elif isinstance(node, ast.Name) and follow and node.id in assigned:
            add(assigned[node.id], follow=False)
        elif texts(node):
            start = (node.lineno, _char_col(lines[node.lineno - 1], node.col_offset))
            before = "\n".join(lines[:start[0] - 1] + [lines[start[0] - 1][:start[1]]]).rstrip()
            found[id(node)] = (node, start, (node.end_lineno, _char_col(lines[node.end_lineno - 1],
                                                                         node.end_col_offset)),
                               follow or before.endswith("("))  # in brackets: it may go on over lines

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        which = SAID_BY.get(name)
        if which == "keywords":
            for kw in node.keywords:
                if kw.arg not in (None, "values"):
                    add(kw.value)
        elif which == "all":
            for arg in node.args:
                add(arg)
        elif which == "headings" and len(node.args) > 1 and isinstance(node.args[1], (ast.List, ast.Tuple)):
            for col in node.args[1].elts:
                if isinstance(col, ast.Tuple) and len(col.elts) == 3:
                    add(col.elts[1])
                    if isinstance(col.elts[2], ast.Lambda):  # a cell's words: lambda v: "yes" if v else "no"
                        add(col.elts[2].body)
        elif isinstance(which, int) and len(node.args) > which:
            add(node.args[which])
    return sorted(found.values(), key=lambda f: f[1])


def comments(source: str) -> list:
    """[(english, (line, col), (end line, end col), block)]: a run of whole-line comments at one column is one
    entry (block, rewrapped when translated); a comment after code is one entry on its line."""
    lines = source.splitlines()
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        (ln, col), text = tok.start, tok.string[1:].strip()
        kept = KEPT_PREFIX.match(text)
        whole = not lines[ln - 1][:col].strip()
        prev = out[-1] if out else None
        if (whole and not kept and prev and prev[3] and prev[2][0] == ln - 1 and prev[1][1] == col
                and not KEPT_PREFIX.match(lines[prev[1][0] - 1][col + 1:].strip())):
            out[-1] = (prev[0] + " " + text, prev[1], (ln, len(lines[ln - 1])), True)
        else:
            out.append((text, (ln, col), (ln, len(lines[ln - 1])), whole))
    return out


def parts(cell: dict) -> list:
    """The English texts of a cell, in order: the markdown's whole text, or a code cell's comments and sentences
    (a comment's kept prefix, such as ``@title`` or ``noqa: F401``, left out)."""
    source = "".join(cell["source"])
    if cell["cell_type"] == "markdown":
        return [source] if source.strip() else []
    if cell["cell_type"] != "code":
        return []
    notes = [t[len(KEPT_PREFIX.match(t)[0]):] if KEPT_PREFIX.match(t) else t for t, *_ in comments(source)]
    said = [t for node, *_ in said_strings(source) for t in texts(node)]
    return [t for t in notes + said if t.strip()]


# ---- catalogues --------------------------------------------------------------------------------------------

def catalogue_path(stem: str, root: Path | None = None) -> Path:
    return ru_dir(root) / f"{stem}.po"


def load(stem: str, root: Path | None = None) -> Catalog:
    path = catalogue_path(stem, root)
    if not path.is_file():
        return Catalog(locale=LANG)
    with path.open("rb") as f:
        return read_po(f, locale=LANG)


def save(catalog: Catalog, stem: str, root: Path | None = None) -> None:
    buf = io.BytesIO()
    write_po(buf, catalog, width=0, omit_header=True, include_previous=True, sort_output=False)
    catalogue_path(stem, root).write_bytes(buf.getvalue())


def english(stem: str, root: Path | None = None) -> dict:
    return json.loads(((root or NOTEBOOKS) / f"{stem}.ipynb").read_text(encoding="utf-8"))


def entries(nb: dict) -> list:
    """[(catalogue stem or 'common', cell id, english)] the chapter needs, in order."""
    return [("common" if c.get("id") == SETUP_ID else None, c["id"], text) for c in nb["cells"] for text in parts(c)]


def _lookup(cats: dict, stem: str, where, cid: str, text: str):
    msg = cats[where or stem].get(text, context=cid)
    return msg.string if msg is not None and msg.string and not msg.fuzzy else None


def problems(stem: str, root: Path | None = None) -> list:
    """["cell id: missing|stale|fuzzy ..."] for the chapter ``stem``; [] when every text has its translation."""
    nb = english(stem, root)
    cats = {stem: load(stem, root), "common": load("common", root)}
    wanted = entries(nb)
    out, needed = [], {(where or stem, cid, text) for where, cid, text in wanted}
    for where, cid, text in wanted:
        if _lookup(cats, stem, where, cid, text) is not None:
            continue
        msg = cats[where or stem].get(text, context=cid)
        orphan = any(m.context == cid and (where or stem, cid, m.id) not in needed
                     for m in cats[where or stem] if m.id)
        why = "fuzzy (check it, then clear the flag)" if msg is not None and msg.fuzzy and msg.string else \
            "stale: its English changed since it was translated" if orphan else "missing"
        out.append(f"{stem} cell {cid}: {why}: {text[:50]!r}")
    if not out:
        cells = build_cells(nb, cats, stem)
        out = [f"{stem} cell {c['id']}: translated line {i} is {len(ln)} characters (at most {WIDTH})"
               for c in cells for i, ln in enumerate(c["source"], 1)
               if c["cell_type"] == "code" and c["id"] != SETUP_ID and len(ln.rstrip("\n")) > WIDTH]
        out += link_cells(cells, stem, root)[1]
    return out


def update(stem: str, root: Path | None = None) -> None:
    """The catalogues follow the English: an entry for every text, the translations kept; an entry whose cell
    changed gets the old translation, flagged fuzzy, with the old English beside it (``#| msgid``)."""
    nb = english(stem, root)
    for which in (stem, "common"):
        old = load(which, root)
        new = Catalog(locale=LANG)
        for where, cid, text in entries(nb):
            if (where or stem) != which:
                continue
            msg = old.get(text, context=cid)
            if msg is not None:
                new.add(text, msg.string, context=cid, flags=msg.flags, previous_id=msg.previous_id)
                continue
            gone = [m for m in old if m.context == cid and m.id and m.string
                    and not any(e[1] == cid and e[2] == m.id for e in entries(nb))]
            if len(gone) == 1 or (gone and nb_kind(nb, cid) == "markdown"):
                new.add(text, gone[0].string, context=cid, flags=("fuzzy",), previous_id=gone[0].id)
            else:
                new.add(text, "", context=cid)
        save(new, which, root)  # common.po: the set-up cell, the same in every chapter


def nb_kind(nb: dict, cid: str) -> str:
    return next(c["cell_type"] for c in nb["cells"] if c["id"] == cid)


# ---- building ------------------------------------------------------------------------------------------------

def literal(text, first: int, indent: int, tail: int, one_line: bool = False) -> str:
    """``text`` as implicitly joined string literals: the first at column ``first``, the next ones under it
    at ``indent``, each line leaving room for ``tail`` characters after the last (``one_line``: one literal,
    where no bracket lets it go on). ``text``: a string, or an f-string's [(text, is a field)]: a field stays
    whole, and a literal that holds one is an f-string."""
    fstring = not isinstance(text, str)
    atoms = [a for t, field in (text if fstring else [(text, False)])
             for a in ([(t, True)] if field else [(w, False) for w in re.split(r"(?<= )", t)])]
    room = 10 ** 9 if one_line else max(30, WIDTH - indent - 2 - fstring)  # the quotes, the f
    pieces, cur = [], []
    for i, (w, field) in enumerate(atoms):
        last = i == len(atoms) - 1  # the last piece leaves room for what follows it on its line
        if cur and sum(len(a) for a, _ in cur) + len(w) > (max(30, room - tail) if last else room):
            pieces.append(cur)
            cur = []
        cur.append((w, field))
    pieces.append(cur)
    quoted = []
    for i, piece in enumerate(pieces):
        has_field = any(field for _, field in piece)
        q = "'" if any('"' in a for a, field in piece if field) else '"'
        body = "".join(a if field else _escape(a, q, braces=has_field) for a, field in piece)
        f = "f" if has_field or (fstring and i == 0 and not any(field for _, field in atoms)) else ""
        quoted.append(f + q + body + q)
    return ("\n" + " " * indent).join(quoted)


def _escape(text: str, quote: str, braces: bool) -> str:
    text = text.replace("\\", "\\\\").replace(quote, "\\" + quote).replace("\n", "\\n")
    return text.replace("{", "{{").replace("}", "}}") if braces else text


def _field(source: str, node: ast.FormattedValue) -> str:
    """An f-string's field as the cell writes it: ``{expression!conversion:spec}``."""
    spec = "" if node.format_spec is None else ":" + "".join(
        v.value if isinstance(v, ast.Constant) else _field(source, v) for v in node.format_spec.values)
    conversion = "" if node.conversion == -1 else "!" + chr(node.conversion)
    return "{" + ast.get_source_segment(source, node.value) + conversion + spec + "}"


def translate_code(source: str, tr, wrap: bool = True) -> str:
    """``source`` with its comments and sentences replaced by ``tr(english)``; the code itself untouched (an
    f-string is written anew: its translated constant parts around its fields, as the cell wrote them).
    ``wrap=False``: a sentence stays on its line (the set-up cell, whose long lines are one statement each)."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))

    def at(pos):
        return offsets[pos[0] - 1] + pos[1]

    edits = []
    for node, start, end, bracketed in said_strings(source):
        tail = len(lines[end[0] - 1].rstrip("\n")) - end[1]
        if isinstance(node, ast.JoinedStr):
            text = [(_field(source, v), True) if isinstance(v, ast.FormattedValue) else
                    (tr(v.value) if WORD.search(v.value) else v.value, False) for v in node.values]
        else:
            text = tr(node.value)
        edits.append((at(start), at(end), literal(text, start[1], start[1], tail, one_line=not (wrap and bracketed))))
    spans = [(a, b) for a, b, _ in edits]
    for text, start, end, block in comments(source):
        if any(a <= at(start) < b for a, b in spans):
            raise ConfigError("a comment", text[:50], "a line of its own or after the code, not inside a string "
                              "a learner reads (the translated string is written anew)")
        kept = KEPT_PREFIX.match(text)
        prefix, body = (kept[0], text[len(kept[0]):]) if kept else ("", text)
        if not body.strip():
            continue
        ru = tr(body)
        if block and not kept:
            width = max(WIDTH, *(len(ln.rstrip("\n")) for ln in lines[start[0] - 1:end[0]])) - start[1] - 2
            wrapped = textwrap.wrap(ru, width, break_long_words=False, break_on_hyphens=False)
            new = ("\n" + " " * start[1]).join("# " + w for w in wrapped)
        else:
            new = "# " + prefix + ru
        edits.append((at(start), at(end), new))
    for a, b, new in sorted(edits, reverse=True):
        source = source[:a] + new + source[b:]
    return source


def build_cells(nb: dict, cats: dict, stem: str) -> list:
    out = []
    for c in nb["cells"]:
        c = dict(c)
        where = "common" if c.get("id") == SETUP_ID else None

        def tr(text, cid=c["id"], where=where):
            got = _lookup(cats, stem, where, cid, text)
            if got is None:
                raise ConfigError(f"{stem} cell {cid}", text[:50], "a translation: run --check, then translate")
            return got

        src = "".join(c["source"])
        if c["cell_type"] == "markdown" and src.strip():
            src = tr(src)
        elif c["cell_type"] == "code":
            src = translate_code(src, tr, wrap=c.get("id") != SETUP_ID)
            if c.get("id") == SETUP_ID:
                src = add_language_line(src)
        c["source"] = src.splitlines(keepends=True)
        out.append(c)
    return out


def _target_cells(notebook: str, stem: str, cells: list, root: Path | None, cache: dict):
    """The cells a link's notebook part names: '' this chapter's (built), 'NN_name.ipynb' that Russian
    chapter's as the build writes it, '../NN_name.ipynb' the English chapter's; None where there is none."""
    if not notebook:
        return cells
    if notebook not in cache:
        name = notebook.removeprefix("../").removesuffix(".ipynb")
        path = (root or NOTEBOOKS) / f"{name}.ipynb"
        if notebook.startswith("../"):
            cache[notebook] = english(name, root)["cells"] if path.is_file() else None
        elif name == stem:
            cache[notebook] = cells
        else:  # another Russian chapter, as the build writes it (none until it is all translated)
            try:
                cats = {name: load(name, root), "common": load("common", root)}
                cache[notebook] = build_cells(english(name, root), cats, name) \
                    if name in CHAPTERS and path.is_file() else None
            except ConfigError:
                cache[notebook] = None
    return cache[notebook]


def link_cells(cells: list, stem: str, root: Path | None = None) -> tuple:
    """(cells, problems): each markdown link to a section (of this chapter, another Russian one or an
    English one) pointed at the markdown cell holding its heading, ``#cell-id=<id>``, its words and title
    kept: JupyterLab 4 scrolls to a cell id, but not to a Cyrillic heading's anchor (jupyterlab#12402) nor
    to any heading of a notebook a link opens. The catalogues keep the readable anchors; only the build
    rewrites them."""
    cache, problems, out = {}, [], []
    for c in cells:
        if c["cell_type"] != "markdown":
            out.append(c)
            continue

        def point(m, cid=c["id"]):
            notebook, frag = m["notebook"] or "", m["anchor"]
            if frag.startswith(CELL_ID):
                return m.group(0)
            target = _target_cells(notebook, stem, cells, root, cache)
            found = heading_cells(target).get(frag) if target is not None else None
            if found is None:
                problems.append(f"{stem} cell {cid}: a link to {notebook}#{frag}, which no heading of "
                                f"{notebook or 'this chapter'} has")
                return m.group(0)
            return f"]({notebook}#{CELL_ID}{found}{m['title'] or ''})"

        src = SECTION_LINK.sub(point, "".join(c["source"]))
        out.append({**c, "source": src.splitlines(keepends=True)})
    return out, problems


def add_language_line(source: str) -> str:
    """The set-up cell with ``LANG_LINE`` after its first top-level import of ``os``."""
    tree = ast.parse(source)
    node = next((n for n in tree.body if isinstance(n, ast.Import) and any(a.name == "os" for a in n.names)), None)
    if node is None:
        raise ConfigError("the set-up cell", "no `import os`", "a top-level `import ... os ...` to follow")
    lines = source.splitlines(keepends=True)
    return "".join(lines[:node.end_lineno] + [LANG_LINE + "\n"] + lines[node.end_lineno:])


def build(stem: str, root: Path | None = None) -> Path:
    """Writes ``notebooks/ru/stem.ipynb``; refused (ConfigError) while the check finds problems."""
    found = problems(stem, root)
    if found:
        raise ConfigError(f"the {LANG} edition of {stem}", found[0], "every cell translated and up to date "
                          f"({len(found)} problem(s): python -m labkit.content.translate --check)")
    nb = english(stem, root)
    cats = {stem: load(stem, root), "common": load("common", root)}
    nb = {**nb, "cells": link_cells(build_cells(nb, cats, stem), stem, root)[0],
          "metadata": {**nb["metadata"], "labkit_translation": {
              "language": LANG, "from": f"../{stem}.ipynb",
              "built_by": "python -m labkit.content.translate --build"}}}
    path = ru_dir(root) / f"{stem}.ipynb"
    with path.open("w", encoding="utf-8") as f:
        json.dump(nb, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.content.translate", description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="list what is missing or stale; write nothing")
    mode.add_argument("--update", action="store_true", help="bring the catalogues in line with the English")
    mode.add_argument("--build", action="store_true", help="write notebooks/ru/*.ipynb")
    args = ap.parse_args(argv)
    from ..base import phrases  # deferred: only the check lists labkit's own sentences
    bad = 0
    for stem in CHAPTERS:
        if args.update:
            update(stem)
            continue
        found = problems(stem)
        bad += len(found)
        for line in found:
            print(line)
        if args.build and not found:
            print("wrote", build(stem).relative_to(NOTEBOOKS.parent))
    if not args.update:
        left = phrases.untranslated("lab_messages.md", LANG)
        print(f"lab_messages.md: {len(left)} sentence(s) not in {LANG} yet (English shown, with a warning):",
              ", ".join(f"{h}/{k} ({why})" for h, k, why in left) or "none")
        from . import questions  # deferred: reading the bank parses its page, which only the check needs
        left = questions.untranslated(LANG)
        for kind, key, why in left:
            print(f"{questions.FILE} {kind} {key}: {why}")
        print(f"{questions.FILE}: {len(left)} entr(y/ies) not in {LANG} yet (English shown, with a warning)")
        from ..drills import bank as drills  # deferred: only the check reads the drills' page
        left = drills.untranslated(LANG)
        for section, key, why in left:
            print(f"{drills.FILE} {section} {key}: {why}")
        print(f"{drills.FILE}: {len(left)} entr(y/ies) not in {LANG} yet (English shown, with a warning)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
