"""The interview question bank, read from its only source: ``notebooks/interview_questions.md`` (its format is
documented at its top; ``bankformat`` parses it), for the self-quiz (``labkit.quiz``), the notebook
``interview_questions.ipynb`` and the drills' links. An installed labkit reads the copy the wheel carries.

    python -m labkit.content.questions --check          # parse, and check every link against the chapters
    python -m labkit.content.questions --topic precision  # print one topic's section

In Russian (issue #51) it reads ``notebooks/ru/interview_questions.md`` too (format at its top): a missing or stale
entry is shown in English with one warning; ``TOPICS``, ``by_topic`` and ``get`` speak the learner's language,
``QUESTIONS`` and ``link_for`` stay the English source. The quiz's links, in either language, name the cell holding
the heading (``NN_name.ipynb#cell-id=...``): JupyterLab scrolls a notebook a link opens to a cell id, never to a
heading's anchor.
"""
from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..base import phrases
from . import pages
from .bankformat import (CHAPTER_NOTEBOOKS, DRILLS, FILE, ID, LINK, MEASURED, SUMMARIES, SUMMARY, TAG,  # noqa: F401
                         BankError, Link, Question, _sections, check_drills, parse, parse_translation,
                         question_hash)


def source_path() -> Path:
    """The bank's file: the checkout's notebooks/, else the copy an installed labkit carries."""
    return pages.source_root() / "notebooks" / FILE


def translation_path(lang: str) -> Path:
    """``notebooks/LANG/interview_questions.md`` beside the English page."""
    return source_path().parent / lang / FILE


def load(path=None):
    """(topics, questions) parsed from the bank's file."""
    path = Path(path) if path is not None else source_path()
    return parse(path.read_text(encoding="utf-8"), path.name)


ENGLISH_TOPICS, QUESTIONS = load()


@dataclass(frozen=True)
class Edition:
    """The bank in one language: its topics' titles, its questions (the English where a translation is
    missing or stale) and what fell back: {("topic", key) or ("question", id): "missing" | "stale"}."""
    lang: str
    topics: dict
    questions: tuple
    left: dict


def _cells(path: Path, cache: dict):
    if path not in cache:
        cache[path] = pages.cells(path) if path.is_file() else None
    return cache[path]


def _tagged(cells, link: Link):
    return next((i for i, c in enumerate(cells or ()) if link.tags[0] in pages.tags(c)), None)


def _russian_link(link: Link, folder: Path, cache: dict) -> Link:
    """``link`` to the built translated chapter's section that holds its first tagged cell, else to the English
    chapter (``../NN_name.ipynb``)."""
    cells = _cells(folder / link.notebook, cache)
    at = _tagged(cells, link)
    heading = pages.heading_before(cells, at) if at is not None else ""
    if not heading:
        return _at_cell(replace(link, notebook="../" + link.notebook), folder, cache)
    return replace(link, heading=heading, anchor=pages.CELL_ID + pages.heading_cell(cells, at)["id"])


def _at_cell(link: Link, folder: Path, cache: dict) -> Link:
    """``link`` (an English chapter's) at the cell holding its heading (``pages.CELL_ID``)."""
    cells = _cells(folder / link.notebook, cache)
    at = _tagged(cells, link)
    return link if at is None else replace(link, anchor=pages.CELL_ID + pages.heading_cell(cells, at)["id"])


def translate_bank(lang: str, page: Path | None = None, english=None) -> Edition:
    """The bank in ``lang`` from its page (``page``: another copy) and the English (``english``: (topics,
    questions), else the page's); without the page, every entry is left in English."""
    topics_en, questions_en = english if english is not None else (ENGLISH_TOPICS, QUESTIONS)
    if lang == "en":  # the quiz's links: each at its heading's cell
        cache = {}
        return Edition("en", dict(topics_en), tuple(replace(q, links=tuple(
            _at_cell(link, source_path().parent, cache) for link in q.links)) for q in questions_en), {})
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


def _headings(cell) -> list:
    return [ln.lstrip("#").strip() for ln in pages.source(cell).splitlines() if ln.startswith("#")]


def check_links(notebooks: Path | None = None, questions=None) -> list:
    """Every "Measured in" link against the chapters: [(question id, tag, what is wrong)], empty when each
    heading is a section of its notebook and each tagged cell sits under that heading (``questions``: a
    translated edition's, its links relative to ``notebooks``, e.g. notebooks/ru)."""
    notebooks = Path(notebooks) if notebooks is not None else source_path().parent
    problems = []
    for q in (QUESTIONS if questions is None else questions):
        for link in q.links:
            cells = pages.cells(notebooks / link.notebook)
            headings = {h for c in cells if c["cell_type"] == "markdown" for h in _headings(c)}
            if link.heading not in headings:
                problems.append((q.id, "", f"no heading {link.heading!r} in {link.notebook}"))
            if link.anchor.startswith(pages.CELL_ID):
                held = next((c for c in cells if c.get("id") == link.anchor[len(pages.CELL_ID):]), None)
                if held is None or held["cell_type"] != "markdown" or link.heading not in _headings(held):
                    problems.append((q.id, "", f"#{link.anchor} in {link.notebook} is no markdown cell holding "
                                               f"the heading {link.heading!r}"))
            elif link.anchor != pages.anchor(link.heading):
                problems.append((q.id, "", f"#{link.anchor} is not the anchor of {link.heading!r}"))
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
        problems = check_links() + check_links(None, translate_bank("en").questions)  # the source; the quiz's
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
