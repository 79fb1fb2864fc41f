"""Figures grouped as the learner's language writes them (issue #51 item 2): in Russian the thousands of a
formatted figure are separated by a narrow no-break space (U+202F) -- '4 180', not '4,180', which a Russian
reader takes for 4.18 -- and the decimal point stays; a comma after a word, in code or in backticks stays; the
English output is unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from labkit.base import page, phrases
from labkit.base.numfmt import SEP, grouped
from labkit.base.numfmt import number
from labkit.chapters import course
from labkit.tools.compare import Comparison, sentence

assert SEP == "\u202f"


@pytest.fixture(params=["en", "ru"])
def lang(request, monkeypatch):
    monkeypatch.setenv("LABKIT_LANG", request.param)
    monkeypatch.setattr(phrases, "_chosen", [])
    return request.param


def _said(capsys, fn, *args, **kw):
    """What a call said, outside a notebook (a terminal shows markdown without its code marks)."""
    capsys.readouterr()
    fn(*args, **kw)
    return capsys.readouterr().out.strip()


def test_a_table_cell_groups_its_thousands_in_the_learners_language(lang):
    rows = [dict(tok=4180.2, big=1234567.891, words="a, b, c")]
    cols = [("tok", "tokens/s", "{:,.0f}"), ("big", "bytes", "{:,.2f}"), ("words", "which", "{}"),
            ("tok", "fn", lambda v: f"{v:,.1f} ms")]
    body = page.table(rows, cols)._repr_markdown_().splitlines()[-1]
    g = {"en": ",", "ru": SEP}[lang]
    assert body == f"| 4{g}180 | 1{g}234{g}567.89 | a, b, c | 4{g}180.2 ms |"


def test_the_course_number_groups_and_keeps_the_point(lang):
    g = {"en": ",", "ru": SEP}[lang]
    assert number(1723.4) == f"1{g}720" and course.number(3_260_000) == f"3{g}260{g}000"
    assert number(0.01234) == "0.0123" and number(12.5) == "12.5"  # nothing to group: the same in both


def test_grouped_touches_only_grouped_figures_outside_code():
    text = "4,180 tokens/s; a, b, c; `1,000`; ``x = 2,048``; x1,000; 1,2345; 0.123,456; -12,345.5"
    assert grouped(text, "en") == text
    assert grouped(text, "ru") == (f"4{SEP}180 tokens/s; a, b, c; `1,000`; ``x = 2,048``; x1,000; 1,2345; "
                                   f"0.123,456; -12{SEP}345.5")
    fence = "```python\nn = 1,000\n```\n2,000"
    assert grouped(fence, "ru") == f"```python\nn = 1,000\n```\n2{SEP}000"


def test_say_groups_the_figures_of_a_sentence_and_leaves_words_and_code(lang, monkeypatch):
    shown = []
    monkeypatch.setattr(page, "_plain", lambda text: shown.append(text) or text)
    page.say("4,180 tokens/s, 1,120 GB for a, b, c; `131,072 bytes` in code")
    g = {"en": ",", "ru": SEP}[lang]
    assert shown == [f"4{g}180 tokens/s, 1{g}120 GB for a, b, c; `131,072 bytes` in code"]


def test_explain_fills_figures_grouped_and_whole_numbers_from_10000_in_full(lang, monkeypatch):
    shown = []
    monkeypatch.setattr(page, "_plain", lambda text: shown.append(text) or text)
    values = dict(n=131072, m=np.int64(131072), small=4096, f=4180.2, names="a, b, c")
    page.explain(True, values=values, yes="{n} {m} {small} {f} {names} `micro_batch={n}, x={f}`")
    g = {"en": ",", "ru": SEP}[lang]
    assert shown == [f"131{g}072 131{g}072 4096 4{g}180 a, b, c `micro_batch=131072, x=4,180`"]


def test_compare_prediction_groups_a_whole_count(lang, capsys):
    said = _said(capsys, course.compare_prediction, 131_000, 131_072, "bytes", tolerance=0)
    g = {"en": ",", "ru": SEP}[lang]
    assert f"131{g}072" in said and f"131{g}000" in said
    assert lang == "en" or "131,0" not in said


def test_a_comparisons_sentence_groups_its_labels_figures(lang):
    c = Comparison(metric="tokens_per_s", ratio=1.3, low=1.2, high=1.4, verdict="higher", better="b",
                   samples_a=[1.0] * 10, samples_b=[1.3] * 10, busy=False, sentence="",
                   label_a="vocabulary 32,000", label_b="vocabulary 50,304")
    text = sentence(c)
    g = {"en": ",", "ru": SEP}[lang]
    assert f"**vocabulary 32{g}000**" in text and f"**vocabulary 50{g}304**" in text
    assert "1.30" in text and "1.20–1.40" in text  # the decimal point stays
