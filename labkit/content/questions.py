"""The interview question bank, read from its only source: ``notebooks/interview_questions.md``.

The page is the source (d2l's inversion): a teacher edits the markdown, and this module parses and checks it
for the self-quiz (``labkit.quiz``), the notebook ``interview_questions.ipynb`` and the drills' links. The
format is documented at the top of the page itself: one topic a ``##`` section (``<!-- topic: key -->``
under its heading), one question a ``###`` section (``<!-- id: ... -->`` under it), the answer in a
``<details>`` block ending with a "Measured in:" line of links to the chapter sections whose cells back it
(the link's title names the cells' tags) and an optional "Drill it:" line. A malformed entry raises
``BankError`` naming the line, the question, the field, the value and what is allowed.

An installed labkit reads the copy the wheel carries (``labkit/coursefiles/notebooks/``, where setup.py puts
every ``notebooks/*.md``); a checkout reads its own file.

    python -m labkit.content.questions --check          # parse, and check every link against the chapters
    python -m labkit.content.questions --topic precision  # print one topic's section
"""
from __future__ import annotations

import argparse
import html
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import ConfigError
from ..base.phrases import PageError
from . import coursefiles, pages

FILE = "interview_questions.md"

# Chapter number -> notebook file (a tag says its chapter: measure-02-... lives in chapter 02).
CHAPTER_NOTEBOOKS = {
    "00": "00_start_here.ipynb",
    "01": "01_measure_first.ipynb",
    "02": "02_mixed_precision.ipynb",
    "03": "03_gradient_accumulation.ipynb",
    "04": "04_activation_checkpointing.ipynb",
    "05": "05_data_loader.ipynb",
    "06": "06_ddp_allreduce.ipynb",
    "07": "07_kernels_and_compile.ipynb",
    "08": "08_memory_in_practice.ipynb",
    "09": "09_fixed_gpus_playbook.ipynb",
    "10": "10_when_the_model_does_not_fit.ipynb",
    "11": "11_long_runs_and_failures.ipynb",
    "12": "12_composing_the_layout.ipynb",
}

ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
TOPIC_KEY = re.compile(r"[a-z]+")
TAG = re.compile(r"measure-(\d\d)-[a-z0-9-]+")
# [NN · Heading](NN_name.ipynb#Anchor "measure-NN-a measure-NN-b")
LINK = re.compile(r'\[(?P<text>[^\]]+)\]\((?P<notebook>[^\s#"]+)#(?P<anchor>\S+) "(?P<tags>[^"]*)"\)')
DRILL = re.compile(r'`lk\.drills\.Drill\("(?P<id>[^"`]*)"\)`')
SUMMARY = "<details><summary>Answer</summary>"
MEASURED, DRILLS = "Measured in:", "Drill it:"


class BankError(PageError):
    """A malformed entry of the bank: names the file and line, the question, the field, the value and what is
    allowed (a ConfigError: raised before anything uses the bank)."""
    KIND = "question"

    @property
    def qid(self):
        return self.entry


@dataclass(frozen=True)
class Link:
    """One "Measured in" link: the chapter section whose cells (``tags``) back an answer."""
    chapter: str    # "02"
    notebook: str   # "02_mixed_precision.ipynb"
    heading: str    # the section's heading, as written in the notebook
    anchor: str     # JupyterLab's anchor for it
    tags: tuple     # the measuring cells in that section

    @property
    def href(self) -> str:
        return f"{self.notebook}#{self.anchor}"


@dataclass(frozen=True)
class Question:
    id: str
    topic: str
    question: str    # markdown, one line
    answer: str      # markdown; paragraphs separated by a blank line
    links: tuple     # Link, most direct first
    drills: tuple = ()  # lk.drills case ids that exercise this answer
    line: int = 0    # where its heading is in the source
    heading: str = ""  # the question as the page writes it (markdown escapes kept), for links to it

    @property
    def tags(self) -> tuple:
        """The measurement cells that back the answer, most direct first."""
        return tuple(t for link in self.links for t in link.tags)

    def notebook(self, tag: str) -> str:
        return CHAPTER_NOTEBOOKS[tag.split("-")[1]]

    def backed_by(self) -> list:
        """[(tag, notebook file)] for every measurement this answer points at."""
        return [(t, self.notebook(t)) for t in self.tags]


# ---- parsing ----------------------------------------------------------------------------------------------

def source_path() -> Path:
    """The bank's file: the checkout's notebooks/, else the copy an installed labkit carries."""
    return coursefiles.source_root() / "notebooks" / FILE


def _unescape(text: str) -> str:
    """Markdown's backslash escapes (``\\<module``) as the characters they stand for, outside code spans."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", p) for p in parts)


def _blocks(lines: list, first: int) -> list:
    """[(line number, [lines])] for each run of non-blank lines (a markdown paragraph)."""
    out, cur = [], None
    for i, ln in enumerate(lines):
        if ln.strip():
            if cur is None:
                cur = (first + i, [])
                out.append(cur)
            cur[1].append(ln.strip())
        else:
            cur = None
    return out


def _front_matter(lines: list, at: int, where: str, qid, allowed_keys: tuple) -> dict:
    """``<!-- key: value -->`` on the line after a heading (several keys: one a line, inside one comment)."""
    if at >= len(lines) or not lines[at].lstrip().startswith("<!--"):
        return {}  # the caller names what is missing
    end = at
    while "-->" not in lines[end]:
        end += 1
        if end == len(lines):
            raise BankError(f"{where}:{at + 1}", qid, "front matter", lines[at], "a comment closed by -->")
    body = "\n".join(lines[at:end + 1]).strip()
    if not body.endswith("-->"):
        raise BankError(f"{where}:{end + 1}", qid, "front matter", lines[end], "a comment ending in --> on its line")
    body = body[4:-3]
    fields = {}
    for item in filter(None, (s.strip() for s in body.splitlines())):
        key, sep, value = item.partition(":")
        if not sep or key.strip() not in allowed_keys:
            raise BankError(f"{where}:{at + 1}", qid, "front matter", item,
                            f"`key: value` with the key one of {allowed_keys}")
        fields[key.strip()] = value.strip()
    return fields


def _sections(text: str) -> list:
    """[(level, line index, heading text)] of the ## and ### headings outside comments and code fences."""
    out, in_comment, in_fence = [], False, False
    for i, ln in enumerate(text.splitlines()):
        if in_comment:
            in_comment = "-->" not in ln
            continue
        if ln.startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and ln.startswith("<!--") and "-->" not in ln:
            in_comment = True
        elif not in_fence and re.match(r"#{2,3} ", ln):
            out.append((len(ln.split(" ", 1)[0]), i, ln.split(" ", 1)[1].strip()))
    return out


def parse(text: str, where: str = FILE):
    """(topics {key: title}, [Question]) from the bank's markdown; raises BankError on a malformed entry."""
    lines = text.splitlines()
    sections = _sections(text)
    topics, questions, topic, seen = {}, [], None, {}
    for n, (level, at, heading) in enumerate(sections):
        end = sections[n + 1][1] if n + 1 < len(sections) else len(lines)
        if level == 2:
            topic = _front_matter(lines, at + 1, where, None, ("topic",)).get("topic", "")
            if not TOPIC_KEY.fullmatch(topic) or topic in topics:
                raise BankError(f"{where}:{at + 2}", None, "topic", topic or None,
                                "`<!-- topic: key -->` under the `## Topic` heading, the key in lowercase letters "
                                "and unique" + (f" ({topic!r} is taken)" if topic in topics else ""))
            if heading in topics.values():
                raise BankError(f"{where}:{at + 1}", None, "topic title", heading, "a title used once")
            topics[topic] = heading
            continue
        fm = _front_matter(lines, at + 1, where, None, ("id",))
        qid = fm.get("id", "")
        if not ID.fullmatch(qid):  # no id yet: the question is named by its words
            raise BankError(f"{where}:{at + 2}", heading[:50], "id", qid or None,
                            "`<!-- id: ... -->` under the `### question`: lowercase letters, digits and '-'")
        if qid in seen:
            raise BankError(f"{where}:{at + 2}", qid, "id", qid, f"an id used once (line {seen[qid]} has it)")
        if topic is None:
            raise BankError(f"{where}:{at + 1}", qid, "topic", None, "a question inside a `## Topic` section")
        seen[qid] = at + 1
        questions.append(_question(lines, at, end, heading, qid, topic, where))
    empty = [t for t in topics if not any(q.topic == t for q in questions)]
    if empty:
        raise BankError(where, None, "topic", empty[0], "a topic with at least one question")
    if not questions:
        raise BankError(where, None, "questions", 0, "at least one `### question` section")
    return topics, questions


def _question(lines, at, end, heading, qid, topic, where) -> Question:
    start = at + 2
    while "-->" not in lines[start - 1]:  # past a multi-line front matter
        start += 1
    blocks = _blocks(lines[start:end], start + 1)
    texts = [" ".join(b) for _, b in blocks]
    if not texts or texts[0] != SUMMARY:
        raise BankError(f"{where}:{start + 1}", qid, "answer", texts[0][:60] if texts else None,
                        f"the answer in a `{SUMMARY}` ... `</details>` block after the front matter")
    if texts[-1] != "</details>":
        raise BankError(f"{where}:{blocks[-1][0]}", qid, "</details>", texts[-1][:60],
                        "`</details>` on its own line, last in the section")
    body = list(zip([b[0] for b in blocks], texts))[1:-1]
    drills = ()
    if body and body[-1][1].startswith(DRILLS):
        drills = _drills(body.pop(), qid, where)
    if not body or not body[-1][1].startswith(MEASURED):
        raise BankError(f"{where}:{at + 1}", qid, "Measured in", None,
                        f"a `{MEASURED} [NN · Heading](NN_name.ipynb#Anchor \"measure-NN-what\")` paragraph "
                        "after the answer")
    links = _links(body.pop(), qid, where)
    if not body:
        raise BankError(f"{where}:{at + 1}", qid, "answer", None, "at least one paragraph before `Measured in:`")
    stray = [(n, t) for n, t in body if t.startswith((MEASURED, DRILLS))]
    if stray:
        raise BankError(f"{where}:{stray[0][0]}", qid, "paragraph", stray[0][1][:60],
                        f"one `{MEASURED}` then at most one `{DRILLS}`, after the answer")
    return Question(qid, topic, _unescape(heading), "\n\n".join(_unescape(t) for _, t in body), links, drills, at + 1,
                    heading)


def _links(block, qid, where) -> tuple:
    line, text = block
    rest, links, seen = text[len(MEASURED):].strip(), [], set()
    for m in LINK.finditer(rest):
        links.append(_link(m, qid, f"{where}:{line}", seen))
    if not links or "; ".join(m.group(0) for m in LINK.finditer(rest)) != rest:
        raise BankError(f"{where}:{line}", qid, "Measured in", rest[:80],
                        "links `[NN · Heading](NN_name.ipynb#Anchor \"measure-NN-what\")` separated by '; '")
    return tuple(links)


def _link(m, qid, where, seen) -> Link:
    chapter, dot, heading = m["text"].partition(" · ")
    if not dot or not re.fullmatch(r"\d\d", chapter):
        raise BankError(where, qid, "Measured in", m["text"], "link text 'NN · Heading' (the chapter's number)")
    if chapter not in CHAPTER_NOTEBOOKS:
        raise BankError(where, qid, "chapter", chapter, f"one of {', '.join(CHAPTER_NOTEBOOKS)}")
    notebook = CHAPTER_NOTEBOOKS[chapter]
    if m["notebook"] != notebook:
        raise BankError(where, qid, "notebook", m["notebook"], f"{notebook} (chapter {chapter}'s notebook)")
    if m["anchor"] != pages.anchor(heading):
        raise BankError(where, qid, "anchor", m["anchor"], f"{pages.anchor(heading)} (the heading's, spaces as '-')")
    tags = tuple(m["tags"].split())
    for tag in tags or ("",):
        found = TAG.fullmatch(tag)
        if not found or found.group(1) != chapter:
            raise BankError(where, qid, "tag", tag, f"measure-{chapter}-what (a cell tag of chapter {chapter})")
        if tag in seen:
            raise BankError(where, qid, "tag", tag, "each cell once in an answer's links")
        seen.add(tag)
    return Link(chapter, notebook, heading, m["anchor"], tags)


def _drills(block, qid, where) -> tuple:
    line, text = block
    rest = text[len(DRILLS):].strip()
    ids = tuple(m["id"] for m in DRILL.finditer(rest))
    if not ids or ", ".join(f'`lk.drills.Drill("{i}")`' for i in ids) != rest or len(set(ids)) != len(ids):
        raise BankError(f"{where}:{line}", qid, "Drill it", rest[:80],
                        '`lk.drills.Drill("case-id")` items separated by \', \', each once')
    return ids


def check_drills(questions, cases, where: str = FILE) -> None:
    """Each "Drill it" id against the drills' ``cases`` (``labkit.drills.bank.CASES``, passed in: the bank does
    not import the drills; tests/test_questions.py checks the page): a BankError for an unknown id or a drill
    whose teaching cell the answer's links do not name."""
    by_id = {c.id: c for c in cases}
    for q in questions:
        for i in q.drills:
            if i not in by_id:
                raise BankError(f"{where}:{q.line}", q.id, "drill", i, f"one of lk.drills' cases: {', '.join(by_id)}")
            if by_id[i].teaches not in q.tags:
                raise BankError(f"{where}:{q.line}", q.id, "drill", i,
                                f"a drill whose teaching cell ({by_id[i].teaches}) the answer's links name")


def load(path=None):
    """(topics, questions) parsed from the bank's file."""
    path = Path(path) if path is not None else source_path()
    return parse(path.read_text(encoding="utf-8"), path.name)


TOPICS, QUESTIONS = load()


# ---- the bank, read -----------------------------------------------------------------------------------------

def by_topic(topic: str | None = None) -> list:
    if topic is not None and topic not in TOPICS:
        raise ValueError(f"topic={topic!r}: choose one of {', '.join(TOPICS)}")
    return [q for q in QUESTIONS if topic is None or q.topic == topic]


def get(qid: str) -> Question:
    for q in QUESTIONS:
        if q.id == qid:
            return q
    raise KeyError(f"no question {qid!r}")


def drills_for(q: Question) -> list:
    """The drills (``lk.drills`` case ids) that exercise this answer, as its "Drill it" line names them."""
    return list(q.drills)


def link_for(tag: str) -> Link:
    """The chapter section a measurement cell lives in, as the bank links it (for the drills' links)."""
    for q in QUESTIONS:
        for link in q.links:
            if tag in link.tags:
                return link
    raise KeyError(f"no answer links the cell {tag!r}")


def to_html(text: str) -> str:
    """The little markdown the bank uses (`code`, **bold**, *italic*, [links](x)) as safe inline HTML."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"<i>\1</i>", out)
    out = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2" target="_blank">\1</a>', out)
    return out.replace("\n\n", "<br><br>")


def to_markdown(topic: str | None = None) -> str:
    """The bank's page as it is written; with ``topic``, that topic's section only."""
    text = source_path().read_text(encoding="utf-8")
    if topic is None:
        return text
    by_topic(topic)  # a ValueError naming the topics for an unknown one
    lines = text.splitlines()
    starts = [(at, title) for level, at, title in _sections(text) if level == 2]
    at = next(a for a, title in starts if title == TOPICS[topic])
    end = next((a for a, _ in starts if a > at), len(lines))
    return "\n".join(lines[at:end]).rstrip() + "\n"


def check_links(notebooks: Path | None = None) -> list:
    """Every "Measured in" link against the chapters: [(question id, tag, what is wrong)], empty when each
    heading is a section of its notebook and each tagged cell sits under that heading."""
    notebooks = Path(notebooks) if notebooks is not None else source_path().parent
    problems = []
    for q in QUESTIONS:
        for link in q.links:
            cells = pages.cells(notebooks / link.notebook)
            headings = {ln.lstrip("#").strip() for c in cells if c["cell_type"] == "markdown"
                        for ln in pages.source(c).splitlines() if ln.startswith("#")}
            if link.heading not in headings:
                problems.append((q.id, "", f"no heading {link.heading!r} in {link.notebook}"))
            for tag in link.tags:
                at = [i for i, c in enumerate(cells) if tag in pages.tags(c)]
                if not at:
                    problems.append((q.id, tag, f"no cell tagged {tag} in {link.notebook}"))
                elif pages.heading_before(cells, at[0]) != link.heading:
                    problems.append((q.id, tag, f"{tag} sits under {pages.heading_before(cells, at[0])!r}, "
                                                f"not {link.heading!r}"))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The labkit interview question bank (notebooks/interview_questions.md).")
    ap.add_argument("--check", action="store_true", help="check every link against the chapters' notebooks")
    ap.add_argument("--topic", choices=list(TOPICS), help="print one topic's section")
    args = ap.parse_args(argv)
    if args.check:
        problems = check_links()
        for qid, tag, what in problems:
            print(f"{qid}: {what}")
        print(f"{source_path()}: {len(QUESTIONS)} questions in {len(TOPICS)} topics, "
              f"{sum(len(q.links) for q in QUESTIONS)} links, {len(problems)} problems")
        return 1 if problems else 0
    sys.stdout.write(to_markdown(args.topic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
