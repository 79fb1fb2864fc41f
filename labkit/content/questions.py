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

**In Russian** (issue #51) the bank reads ``notebooks/ru/interview_questions.md`` too, when labkit speaks Russian
(``labkit.base.phrases.language()``): the same topics and questions, each under ``<!-- topic: key @hash -->`` or
``<!-- id: ... @hash -->``, the hash being ``phrases.entry_hash`` of the English it translates (a topic's title;
a question's text, a blank line and its answer), and no "Measured in"/"Drill it" lines: a question's links and
drills are the English entry's, each link naming the built Russian chapter's section that holds its first tagged
cell (``notebooks/ru/NN_name.ipynb``), or the English chapter (``../NN_name.ipynb``) where none is built. A
missing or stale entry (its hash differs) is shown in English with one warning; ``TOPICS``, ``by_topic`` and
``get`` speak the learner's language, ``QUESTIONS`` and ``link_for`` stay the English source.
"""
from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..base.errors import ConfigError
from ..base import phrases
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


ENGLISH_TOPICS, QUESTIONS = load()


# ---- the bank in the learner's language (issue #51) ----------------------------------------------------------

SUMMARIES = {"ru": "<details><summary>Ответ</summary>"}
ENTRY = re.compile(r"(?P<key>\S+) @(?P<hash>[0-9a-f]{8})")


def translation_path(lang: str) -> Path:
    """``notebooks/LANG/interview_questions.md`` beside the English page."""
    return source_path().parent / lang / FILE


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
        start = at + 2
        texts = [(n_, " ".join(b)) for n_, b in _blocks(lines[start:end], start + 1)]
        if not texts or texts[0][1] != summary:
            raise BankError(f"{where}:{start + 1}", qid, "answer", texts[0][1][:60] if texts else None,
                            f"the answer in a `{summary}` ... `</details>` block after the front matter")
        if texts[-1][1] != "</details>" or len(texts) < 3:
            raise BankError(f"{where}:{texts[-1][0]}", qid, "</details>", texts[-1][1][:60],
                            "at least one paragraph, then `</details>` on its own line, last in the section")
        stray = [(n_, t) for n_, t in texts[1:-1] if t.startswith((MEASURED, DRILLS))]
        if stray:
            raise BankError(f"{where}:{stray[0][0]}", qid, "paragraph", stray[0][1][:60],
                            "no links or drills: they come from the English entry")
        entries[qid] = (h, _unescape(heading), "\n\n".join(_unescape(t) for _, t in texts[1:-1]), heading, at + 1)
    return topics, entries


@dataclass(frozen=True)
class Edition:
    """The bank in one language: its topics' titles, its questions (the English where a translation is
    missing or stale) and what fell back: {("topic", key) or ("question", id): "missing" | "stale"}."""
    lang: str
    topics: dict
    questions: tuple
    left: dict


def _russian_link(link: Link, folder: Path, cache: dict) -> Link:
    """``link`` to the built translated chapter's section that holds its first tagged cell, else to the English
    chapter (``../NN_name.ipynb``)."""
    path = folder / link.notebook
    if path not in cache:
        cache[path] = pages.cells(path) if path.is_file() else None
    cells = cache[path]
    at = next((i for i, c in enumerate(cells or ()) if link.tags[0] in pages.tags(c)), None)
    heading = pages.heading_before(cells, at) if at is not None else ""
    if not heading:
        return replace(link, notebook="../" + link.notebook)
    return replace(link, heading=heading, anchor=pages.anchor(heading))


def translate_bank(lang: str, page: Path | None = None, english=None) -> Edition:
    """The bank in ``lang`` from its page (``page``: another copy) and the English (``english``: (topics,
    questions), else the page's); without the page, every entry is left in English."""
    topics_en, questions_en = english if english is not None else (ENGLISH_TOPICS, QUESTIONS)
    if lang == "en":
        return Edition("en", dict(topics_en), tuple(questions_en), {})
    page = Path(page) if page is not None else translation_path(lang)
    done_topics, done = parse_translation(page.read_text(encoding="utf-8"), lang, f"{lang}/{FILE}") \
        if page.is_file() else ({}, {})
    left, topics, out, cache = {}, {}, [], {}
    for key, title in topics_en.items():
        entry = done_topics.get(key)
        ok = entry is not None and entry[0] == phrases.entry_hash(title)
        topics[key] = entry[1] if ok else title
        if not ok:
            left[("topic", key)] = "missing" if entry is None else "stale"
    for q in questions_en:
        entry = done.get(q.id)
        links = tuple(_russian_link(link, page.parent, cache) for link in q.links)
        if entry is not None and entry[0] == question_hash(q):
            out.append(replace(q, question=entry[1], answer=entry[2], heading=entry[3], links=links))
            continue
        left[("question", q.id)] = "missing" if entry is None else "stale"
        out.append(replace(q, links=links))
    unknown = [k for k in done if k not in {q.id for q in questions_en}] + \
        [k for k in done_topics if k not in topics_en]
    if unknown:
        raise BankError(f"{lang}/{FILE}", unknown[0], "id", unknown[0], "an id or topic key of the English bank")
    return Edition(lang, topics, tuple(out), left)


_editions: dict = {}


def edition(lang: str | None = None) -> Edition:
    """The bank in ``lang`` (default: the language labkit speaks), read once per process and page version."""
    lang = lang or phrases.language()
    page = translation_path(lang)
    stamp = (lang, page.stat().st_mtime_ns if lang != "en" and page.is_file() else None)
    if stamp not in _editions:
        _editions[stamp] = translate_bank(lang)
    return _editions[stamp]


def _fallback(ed: Edition, kind: str, key: str) -> None:
    why = ed.left.get((kind, key))
    if why:
        what = "not translated" if why == "missing" else "stale: its English changed since"
        phrases._notice(f"{ed.lang}/{FILE}: {kind} {key!r} {what}; shown in English")


def untranslated(lang: str = "ru", page: Path | None = None, english=None) -> list:
    """[(kind, key, 'missing' | 'stale')] of the bank's entries the ``lang`` page lacks or has stale, in order."""
    return [(kind, key, why) for (kind, key), why in translate_bank(lang, page, english).left.items()]


class _Topics(Mapping):
    """{topic key: title}, the titles in the learner's language (an untranslated one in English, warned)."""

    def __getitem__(self, key):
        ed = edition()
        title = ed.topics[key]
        _fallback(ed, "topic", key)
        return title

    def __contains__(self, key):
        return key in ENGLISH_TOPICS

    def __iter__(self):
        return iter(ENGLISH_TOPICS)

    def __len__(self):
        return len(ENGLISH_TOPICS)

    def __repr__(self):
        return repr(dict(self.items()))


TOPICS = _Topics()


# ---- the bank, read -----------------------------------------------------------------------------------------

def by_topic(topic: str | None = None) -> list:
    if topic is not None and topic not in TOPICS:
        raise ValueError(f"topic={topic!r}: choose one of {', '.join(TOPICS)}")
    ed = edition()
    out = [q for q in ed.questions if topic is None or q.topic == topic]
    for q in out:
        _fallback(ed, "question", q.id)
    return out


def get(qid: str) -> Question:
    """The question ``qid`` in the learner's language (``QUESTIONS``: the English source)."""
    ed = edition()
    for q in ed.questions:
        if q.id == qid:
            _fallback(ed, "question", q.id)
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
    at = next(a for a, title in starts if title == ENGLISH_TOPICS[topic])
    end = next((a for a, _ in starts if a > at), len(lines))
    return "\n".join(lines[at:end]).rstrip() + "\n"


def check_links(notebooks: Path | None = None, questions=None) -> list:
    """Every "Measured in" link against the chapters: [(question id, tag, what is wrong)], empty when each
    heading is a section of its notebook and each tagged cell sits under that heading (``questions``: a
    translated edition's, its links relative to ``notebooks``, e.g. notebooks/ru)."""
    notebooks = Path(notebooks) if notebooks is not None else source_path().parent
    problems = []
    for q in (QUESTIONS if questions is None else questions):
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
        for lang in phrases.LANGUAGES[1:]:
            if not translation_path(lang).is_file():
                continue
            ed = translate_bank(lang)
            found = check_links(translation_path(lang).parent, ed.questions)
            for qid, tag, what in found:
                print(f"{lang}: {qid}: {what}")
            print(f"{translation_path(lang)}: {len(ed.questions) - sum(k == 'question' for k, _ in ed.left)} of "
                  f"{len(ed.questions)} questions translated, {len(found)} link problems")
            problems += found
        return 1 if problems else 0
    sys.stdout.write(to_markdown(args.topic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
