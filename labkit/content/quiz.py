"""A self-quiz over the interview question bank: write your answer, then reveal the worked one.

    import labkit as lk
    quiz = lk.quiz.Quiz(topic="precision")   # or Quiz() for every topic, Quiz(shuffle=True, seed=1)
    quiz                                      # the last line of a cell shows it

The questions come from ``labkit.questions``, which reads them from ``notebooks/interview_questions.md``.
Everything the buttons do can be done from code as well (that is how it is tested):
``quiz.write("my answer")``, ``quiz.reveal()``, ``quiz.mark(True)``, ``quiz.next()``, ``quiz.score()``.
"""
from __future__ import annotations

import html
import random

import ipywidgets as widgets

from ..base import phrases
from ..base.frontend import display_widget
from . import questions as bank
from . import pages
from .questions import to_html

_ALL = "all topics"
# the quiz's words in the learner's language (notebooks/lab_messages.md, "## Quiz"); the markup is
# templates/quiz.md's, which writes each English sentence of TEMPLATE_WORDS as the page does
WORDS = phrases.load_section("lab_messages.md", "Quiz", {
    "topic": (), "all-topics": (), "reveal": (), "had-it": (), "not-yet": (), "previous": (), "next": (),
    "write-first": (), "reveal-first": (), "placeholder": (), "header": ("number", "count"), "measured": (),
    "run-it": (), "link": ("chapter", "heading"), "drills": (), "score": ("revealed", "questions", "right")})
TEMPLATE_WORDS = {"write-first": ("write-first",), "reveal-first": ("reveal-first",), "placeholder": ("placeholder",),
                  "header": ("header",), "answer": ("measured", "run-it"), "link": ("link",), "drills": ("drills",),
                  "score": ("score",)}


class Quiz:
    """One question at a time: type an answer, Reveal (enabled once you have written something), then mark
    yourself. ``topic`` picks one topic of ``labkit.questions.TOPICS``; ``shuffle`` with ``seed`` mixes
    the order reproducibly."""

    _ipython_display_ = display_widget  # as its ipywidgets box, on ipywidgets 7 and 8 (base.frontend)

    def __init__(self, topic: str | None = None, shuffle: bool = False, seed: int = 0, questions=None):
        self._shuffle, self._seed = shuffle, seed
        self._given = list(questions) if questions is not None else None
        self.written = {}     # question id -> the learner's answer
        self.revealed = set()  # ids whose worked answer was shown
        self.marks = {}       # id -> True (had it) / False (not yet)
        self.index = 0
        self._build()
        self.set_topic(topic)

    # -- state ------------------------------------------------------------------------------------
    @property
    def question(self) -> bank.Question:
        return self.questions[self.index]

    def set_topic(self, topic: str | None):
        """Show one topic (None: all). Answers and marks of other questions are kept."""
        qs = self._given if self._given is not None else bank.by_topic(topic)
        if self._shuffle:
            qs = list(qs)
            random.Random(self._seed).shuffle(qs)
        if not qs:
            raise ValueError("no questions to ask")
        self.questions = qs
        self.index = 0
        self._quiet = True
        self._topic.value = topic or _ALL
        self._quiet = False
        self._show()

    def write(self, text: str) -> "Quiz":
        """Write an answer to the current question (what typing in the box does)."""
        self._box.value = text
        return self

    def reveal(self, force: bool = False) -> str:
        """Show the worked answer; needs a written answer first unless ``force``. Returns the answer."""
        q = self.question
        if not (self.written.get(q.id, "").strip() or force):
            self._note.value = _text("write-first")
            return ""
        self.revealed.add(q.id)
        self._show()
        return q.answer

    def mark(self, correct: bool) -> "Quiz":
        """Mark the current (revealed) question as one you had right, or not yet."""
        q = self.question
        if q.id not in self.revealed:
            self._note.value = _text("reveal-first")
            return self
        self.marks[q.id] = bool(correct)
        self._show()
        return self

    def go(self, index: int) -> "Quiz":
        self.index = max(0, min(len(self.questions) - 1, index))
        self._show()
        return self

    def next(self) -> "Quiz":
        return self.go(self.index + 1)

    def previous(self) -> "Quiz":
        return self.go(self.index - 1)

    def score(self) -> dict:
        """How far you are in the questions shown: answered, revealed, marked right."""
        ids = [q.id for q in self.questions]
        return {"questions": len(ids), "written": sum(bool(self.written.get(i, "").strip()) for i in ids),
                "revealed": sum(i in self.revealed for i in ids),
                "right": sum(self.marks.get(i) is True for i in ids),
                "not_yet": [i for i in ids if self.marks.get(i) is False]}

    # -- widgets ----------------------------------------------------------------------------------
    def _build(self):
        self._quiet = False
        # each topic by its title in the learner's language; the value stays the topic's key
        topics = [(WORDS.say("all-topics"), _ALL)] + [(title, k) for k, title in bank.TOPICS.items()]
        self._topic = widgets.Dropdown(options=topics, description=WORDS.say("topic"),
                                       layout=widgets.Layout(width="560px", max_width="100%"))
        self._topic.observe(lambda ch: None if self._quiet else self.set_topic(
            None if ch["new"] == _ALL else ch["new"]), names="value")
        self._header = widgets.HTML()
        self._question = widgets.HTML()
        # width auto: the column stretches it to its width less its margins (100% plus margins overflowed by
        # 4 px, which gave the whole quiz a horizontal scroll bar)
        self._box = widgets.Textarea(placeholder=_text("placeholder"),
                                     layout=widgets.Layout(width="auto", height="90px"))
        self._box.observe(self._on_type, names="value")
        self._reveal = widgets.Button(description=WORDS.say("reveal"), button_style="info", disabled=True)
        self._reveal.on_click(lambda _: self.reveal())
        self._right = widgets.Button(description=WORDS.say("had-it"), button_style="success")
        self._wrong = widgets.Button(description=WORDS.say("not-yet"), button_style="warning")
        self._right.on_click(lambda _: self.mark(True))
        self._wrong.on_click(lambda _: self.mark(False))
        self._prev = widgets.Button(description=WORDS.say("previous"))
        self._next = widgets.Button(description=WORDS.say("next"))
        self._prev.on_click(lambda _: self.previous())
        self._next.on_click(lambda _: self.next())
        self._answer = _HTMLArea()  # its links to the chapters open in JupyterLab, at their section
        self._note = widgets.HTML()
        self._score = widgets.HTML()
        self._marks = widgets.HBox([self._right, self._wrong])
        self.widget = widgets.VBox([
            widgets.HBox([self._topic, self._score]), self._header, self._question, self._box,
            widgets.HBox([self._reveal, self._note]), self._answer, self._marks,
            widgets.HBox([self._prev, self._next]),
        ], layout=widgets.Layout(max_width="900px"))
        self.widget.add_class("labkit-quiz")

    def _on_type(self, change):
        if self._quiet:
            return
        q = self.question
        self.written[q.id] = change["new"]
        self._reveal.disabled = q.id in self.revealed or not change["new"].strip()
        self._note.value = ""

    def _show(self):
        q = self.question
        self._quiet = True
        try:
            self._box.value = self.written.get(q.id, "")
        finally:
            self._quiet = False
        self._header.value = _text("header", number=self.index + 1, count=len(self.questions),
                                   topic=html.escape(bank.TOPICS[q.topic]))
        self._question.value = f"<p style='font-size:1.1em'>{to_html(q.question)}</p>"
        shown = q.id in self.revealed
        self._reveal.disabled = shown or not self.written.get(q.id, "").strip()
        self._note.value = ""
        if shown:
            self._answer.value = _text("answer", answer=to_html(q.answer), links=_section_links(q),
                                       drills=_drill_words(q))
        else:
            self._answer.value = ""
        self._marks.layout.display = "flex" if shown else "none"
        mark = self.marks.get(q.id)
        self._right.icon = "check" if mark is True else ""
        self._wrong.icon = "check" if mark is False else ""
        self._prev.disabled = self.index == 0
        self._next.disabled = self.index == len(self.questions) - 1
        s = self.score()
        self._score.value = _text("score", **s)

    def __repr__(self):
        s = self.score()
        return f"Quiz({s['questions']} questions, {s['revealed']} revealed, {s['right']} marked right)"


class _HTMLArea(widgets.Output):
    """An output area showing one piece of HTML (``value``, as an HTML widget's). JupyterLab opens a link in
    an output area in the app -- ``NN_name.ipynb#cell-id=...`` then scrolls to that cell -- while a link in an
    HTML widget loads the whole page anew at the chapter (``target=_blank``: in another browser tab), and the
    fragment is lost either way."""
    _html = ""

    @property
    def value(self) -> str:
        return self._html

    @value.setter
    def value(self, text: str) -> None:
        self._html = text
        self.outputs = ({"output_type": "display_data", "metadata": {},
                         "data": {"text/html": text, "text/plain": "the answer"}},) if text else ()


def _text(key: str, **values) -> str:
    """The quiz's HTML piece ``key`` (templates/quiz.md), its words in the learner's language (lab_messages.md)."""
    piece = pages.section("quiz.md", key)
    if phrases.language() != "en":
        for word in TEMPLATE_WORDS[key]:
            piece = piece.replace(WORDS.sentences[word], WORDS.template(word))
    return piece.format(**values)


def _section_links(q) -> str:
    """Links to the chapter sections that measure the answer (JupyterLab shows headings, not cell tags)."""
    return "; ".join(_text("link", href=html.escape(link.href), chapter=link.chapter, heading=to_html(link.heading))
                     for link in q.links)


def _drill_words(q) -> str:
    """' Drill it: lk.drills.Drill("...")' for the drills that exercise this answer (the bank derives them)."""
    ids = bank.drills_for(q)
    calls = ", ".join(f"<code>lk.drills.Drill(\"{html.escape(i)}\")</code>" for i in ids)
    return _text("drills", calls=calls) if ids else ""


def quiz(topic: str | None = None, shuffle: bool = False, seed: int = 0) -> Quiz:
    """``lk.quiz.quiz("ddp")``: a Quiz over one topic (or all)."""
    return Quiz(topic=topic, shuffle=shuffle, seed=seed)
