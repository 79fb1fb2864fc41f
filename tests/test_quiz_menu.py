"""The quiz's topic menu: each topic by its title in the learner's language, its value the topic's key (what
``Quiz(topic=...)`` and ``set_topic`` take)."""
from __future__ import annotations

import re

import labkit.content.questions as bank
from labkit.base import phrases
from labkit.content import quiz as qz


def _menu(quiz) -> list:
    return list(quiz._topic.options)


def test_the_menu_shows_each_topics_title_and_keeps_its_key_as_the_value():
    quiz = qz.Quiz()
    menu = _menu(quiz)
    assert menu[0][1] == qz._ALL and [v for _, v in menu[1:]] == list(bank.TOPICS)
    assert [t for t, _ in menu[1:]] == [bank.ENGLISH_TOPICS[k] for k in bank.TOPICS]
    assert all(t != k for t, k in menu[1:])  # a title, not the key
    quiz._topic.value = "precision"  # picking a title picks its key's questions
    assert {q.topic for q in quiz.questions} == {"precision"}


def test_a_russian_learner_sees_the_topics_titles_in_russian(monkeypatch):
    monkeypatch.setattr(phrases, "_chosen", ["ru"])
    monkeypatch.setattr(phrases, "_said", set())
    monkeypatch.setattr(bank, "_editions", {})
    quiz = qz.Quiz(topic="ddp")
    menu = _menu(quiz)
    assert [v for _, v in menu[1:]] == list(bank.TOPICS) and quiz._topic.value == "ddp"
    for title, key in menu[1:]:
        assert title == bank.TOPICS[key] and title != bank.ENGLISH_TOPICS[key], key
        assert re.search("[а-яё]", title) and not re.search(r"[A-Za-z]+(?: [A-Za-z]+){2,}", title), title
