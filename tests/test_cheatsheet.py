"""The cheat sheet reads the question bank: under each chapter, the interview questions it measures most
directly, each linked to its section of notebooks/interview_questions.md (the "the code" cells are tested in
tests/test_show_the_code.py)."""
import re

from labkit.content import pages, questions

from labkit.instructor import cheatsheet


def test_every_bank_question_is_listed_once_under_the_chapter_that_measures_it():
    text = cheatsheet.build()
    chapters = re.split(r"^## ", text, flags=re.M)[1:]
    listed = {}
    for section, nb in zip(chapters, [nb for nb in pages.chapters() if cheatsheet.entries(nb)
                                      or cheatsheet.bank_questions(nb)]):
        assert section.startswith(cheatsheet.title(nb))
        for q in questions.QUESTIONS:
            link = f"]({questions.FILE}#{pages.anchor(q.question)})"
            if link in section:
                listed.setdefault(q.id, []).append(nb.name)
    assert sorted(listed) == sorted(q.id for q in questions.QUESTIONS)
    assert all(listed[q.id] == [q.links[0].notebook] for q in questions.QUESTIONS)


def test_each_link_is_the_anchor_jupyterlab_gives_the_question_heading():
    page = (pages.NOTEBOOKS / questions.FILE).read_text()
    headings = re.findall(r"^### (.+)$", page, re.M)
    q = questions.get("spawn-main")  # a heading with a markdown escape: the link keeps it, the anchor reads '<'
    assert q.heading in headings and f"[{q.heading}]" in cheatsheet.build()
    assert "<module" in pages.anchor(q.question)
