"""The question bank's markdown format (labkit.content.questions reads the page with it): the English page's
topics, questions, "Measured in" links and "Drill it" lines, and a translated page's entries (``notebooks/ru/``),
each under ``<!-- id: ... @hash -->``. A malformed entry raises ``BankError`` naming the line, the question, the
field, the value and what is allowed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..base import phrases
from ..base.phrases import PageError
from . import pages

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
    body = _answer(lines, start, end, qid, where, SUMMARY)
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


def _answer(lines, start: int, end: int, qid, where, summary: str, least: str = "") -> list:
    """[(line number, paragraph)] inside an answer's ``<details>`` block, which ``summary`` opens and a
    ``</details>`` line closes, last in the section (``least``: the paragraph it must hold, said when missing)."""
    texts = [(n, " ".join(b)) for n, b in _blocks(lines[start:end], start + 1)]
    if not texts or texts[0][1] != summary:
        raise BankError(f"{where}:{start + 1}", qid, "answer", texts[0][1][:60] if texts else None,
                        f"the answer in a `{summary}` ... `</details>` block after the front matter")
    if texts[-1][1] != "</details>" or (least and len(texts) < 3):
        raise BankError(f"{where}:{texts[-1][0]}", qid, "</details>", texts[-1][1][:60],
                        f"{least}`</details>` on its own line, last in the section")
    return texts[1:-1]


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


SUMMARIES = {"ru": "<details><summary>Ответ</summary>"}
ENTRY = re.compile(r"(?P<key>\S+) @(?P<hash>[0-9a-f]{8})")


def question_hash(q: Question) -> str:
    """The hash a translated question stores of the English it translates: its question, a blank line, its
    answer (``phrases.entry_hash``)."""
    return phrases.entry_hash(q.question + "\n\n" + q.answer)


def _keyed(fm: dict, key: str, where: str, at: int, qid):
    m = ENTRY.fullmatch(fm.get(key, ""))
    if m is None:
        raise BankError(f"{where}:{at}", qid, key, fm.get(key) or None,
                        f"`<!-- {key}: {'key' if key == 'topic' else 'question-id'} @hash -->` under the heading: "
                        "the hash is the 8 hex digits of phrases.entry_hash(the English it translates)")
    return m["key"], m["hash"]


def parse_translation(text: str, lang: str, where: str = FILE):
    """({topic key: (hash, title)}, {question id: (hash, question, answer, heading, line)}) of a translated
    page; a BankError names a malformed entry (file and line, question, field, value, what is allowed)."""
    lines, summary = text.splitlines(), SUMMARIES.get(lang, "<details><summary>")
    sections = _sections(text)
    topics, entries = {}, {}
    for n, (level, at, heading) in enumerate(sections):
        end = sections[n + 1][1] if n + 1 < len(sections) else len(lines)
        if level == 2:
            key, h = _keyed(_front_matter(lines, at + 1, where, None, ("topic",)), "topic", where, at + 2, None)
            topics[key] = (h, heading)
            continue
        qid, h = _keyed(_front_matter(lines, at + 1, where, None, ("id",)), "id", where, at + 2, heading[:50])
        if qid in entries:
            raise BankError(f"{where}:{at + 2}", qid, "id", qid, f"an id used once (line {entries[qid][4]} has it)")
        body = _answer(lines, at + 2, end, qid, where, summary, "at least one paragraph, then ")
        stray = [(n_, t) for n_, t in body if t.startswith((MEASURED, DRILLS))]
        if stray:
            raise BankError(f"{where}:{stray[0][0]}", qid, "paragraph", stray[0][1][:60],
                            "no links or drills: they come from the English entry")
        entries[qid] = (h, _unescape(heading), "\n\n".join(_unescape(t) for _, t in body), heading, at + 1)
    return topics, entries
