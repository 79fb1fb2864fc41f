"""The drills' words live in notebooks/interview_drills.md (issue #47): the page parses into every case's
words and every sentence the drills say; a malformed entry is refused naming its line, entry and field; an
installed labkit finds the copy its wheel carries."""
from __future__ import annotations

import re
import string
from pathlib import Path

import pytest

from labkit import drills
from labkit.base import phrases, release
from labkit.drills import bank

ROOT = Path(__file__).resolve().parent.parent
PAGE_FILE = ROOT / "notebooks" / bank.FILE
TEXT = PAGE_FILE.read_text(encoding="utf-8")
KINDS = {s["id"]: s.get("healthy", False) for s in bank.SPECS}


def parse(text):
    return bank.parse(text, "page.md", KINDS)


def refused(text, *parts):
    """The malformed page is refused, and the message names each of ``parts`` (line, entry, field...)."""
    with pytest.raises(bank.DrillsPageError) as info:
        parse(text)
    for p in parts:
        assert p in str(info.value), (p, str(info.value))
    return info.value


def test_the_page_holds_every_case_and_every_sentence():
    page = parse(TEXT)
    assert list(page.cases) == [s["id"] for s in bank.SPECS]
    assert set(page.sentences) == set(bank.SENTENCES)
    for c in drills.CASES:  # the catalogue's words are the page's, field for field
        words = page.cases[c.id]
        assert (c.cause, c.words, c.code_fix, c.fix_words, c.needs_gpu) == tuple(
            words[k] for k in ("cause", "words", "code_fix", "fix_words", "needs_gpu"))
        assert c.words and c.cause and bool(c.code_fix) == bool(c.mistake) and c.healthy == KINDS[c.id]
    assert {c.signal for c in drills.CASES} <= set(page.signals)
    for key, names in bank.SENTENCES.items():  # every template fills from its own placeholders
        out = page.say(key, **{n: f"<{n}>" for n in names})
        assert "{" not in out and out.strip() == out and out, key


def test_every_sentence_is_said_by_the_drills():
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "labkit" / "drills").glob("*.py"))
    code = re.sub(r"\nSENTENCES = \{.*?\n\}\n", "\n", code, flags=re.S)  # the keys' own list says none of them
    unused = [k for k in bank.SENTENCES if not re.search(rf"""["']{re.escape(k)}["']""", code)]
    assert not unused, f"sentences the page must hold but no drill says: {unused}"


def test_the_healthy_cases_share_one_cause():
    assert drills.HEALTHY in drills.CAUSES
    assert {c.cause for c in drills.CASES if c.healthy} == {drills.HEALTHY}
    assert not any(c.cause == drills.HEALTHY for c in drills.CASES if not KINDS[c.id])


def _line(needle: str) -> int:
    return next(i for i, ln in enumerate(TEXT.splitlines(), 1) if ln.startswith(needle))


def test_a_malformed_case_is_refused_naming_line_entry_and_field():
    at = _line("- cause: a slow data loader")
    refused(TEXT.replace("- cause: a slow data loader", "- reason: a slow data loader"),
            f"page.md:{at}", "'loader-no-workers'", "field", "reason", "cause, fix words")
    refused(TEXT.replace("- cause: a slow data loader with 0 workers\n", ""), "'loader-no-workers'", "fields")
    refused(TEXT.replace("### loader-no-workers", "### loader-no-worker"), "'loader-no-workers'", "section")
    refused(TEXT.replace("### loader-no-workers", "### Loader"), "case id", "'Loader'", "lowercase")
    refused(TEXT.replace("preparation is data wait", "preparation is\n\ndata wait"),
            "'loader-no-workers'", "explanation", "one paragraph")
    refused(TEXT.replace("preparation is data wait in", "preparation is `data wait` in"),
            "'loader-no-workers'", "explanation", "plain text", "'`'")
    refused(TEXT.replace("### bf16-with-scaler\n\n- cause: nothing wrong", "### bf16-with-scaler\n\n- cause: fine"),
            "cause", "one cause for every healthy case")
    first = TEXT.index("### loader-no-workers")
    section = TEXT[first:TEXT.index("\n### ", first + 1) + 1]
    refused(TEXT.replace(section, section + section), "'loader-no-workers'", "a case once")


def test_a_malformed_sentence_is_refused_naming_its_placeholder():
    refused(TEXT.replace("- row-data-wait: {share} of the step", "- row-data-wait: {frac} of the step"),
            f"page.md:{_line('- row-data-wait:')}", "'row-data-wait'", "placeholder", "{frac}", "share")
    refused(TEXT.replace("- row-data-wait: {share} of the step", "- row-data-wait: {share:.1%} of the step"),
            "placeholder", "the code formats the figures")
    refused(TEXT.replace("- row-data-wait: {share} of the step\n", ""), "'row-data-wait'", "sentence")
    refused(TEXT.replace("- row-data-wait: {share} of the step", "- row-data-waits: {share} of the step"),
            "'row-data-waits'", "one of the page's sentences")
    refused(TEXT.replace("- row-data-wait: {share} of the step", "- row-data-wait: {share of the step"),
            "'row-data-wait'", "balanced")
    refused(TEXT.replace("- row-data-wait: {share} of the step", "row-data-wait {share} of the step"),
            "line", "`- key: text` item")
    refused(TEXT.replace("## Signals", "## Signal"), "section")


def test_the_page_is_found_from_a_checkout_and_from_an_installed_package(tmp_path, monkeypatch):
    assert bank.source_path() == PAGE_FILE  # a checkout reads its own file
    assert any(PAGE_FILE in ROOT.glob(pattern) for pattern in release.COURSE_FILES)  # the wheel carries it
    packaged = tmp_path / "coursefiles" / "notebooks"
    packaged.mkdir(parents=True)
    (packaged / bank.FILE).write_text(TEXT, encoding="utf-8")
    monkeypatch.setattr(phrases.paths, "checkout_root", lambda: None)
    monkeypatch.setattr(phrases, "PACKAGED", packaged)
    assert bank.source_path() == packaged / bank.FILE
    assert bank.load(cases=KINDS).cases == parse(TEXT).cases
    monkeypatch.setattr(phrases, "PACKAGED", tmp_path / "nowhere")
    monkeypatch.setattr(phrases, "BESIDE", tmp_path / "nowhere")  # not even the pages alone beside the package
    with pytest.raises(FileNotFoundError, match=bank.FILE):
        bank.source_path()


def test_the_check_command_says_what_the_page_holds(capsys):
    from labkit.drills.__main__ import main
    assert main() == 0
    out = capsys.readouterr().out
    assert f"{len(drills.CASES)} cases" in out and f"{len(bank.SENTENCES)} sentences" in out


def test_placeholders_are_documented_names():
    for key, names in bank.SENTENCES.items():
        assert all(n.isidentifier() for n in names), key
        fields = [f for _, f, _, _ in string.Formatter().parse(bank.PAGE.sentences[key]) if f]
        assert set(fields) <= set(names), key


def test_the_drills_work_from_an_installed_wheel(labkit_wheel, tmp_path):
    """The wheel carries notebooks/*.md under labkit/coursefiles/ (setup.py): the drills read their page there."""
    import subprocess
    import sys
    import zipfile
    site = tmp_path / "site"
    zipfile.ZipFile(labkit_wheel).extractall(site)
    code = ("import labkit.drills as d, labkit.drills.bank as b; print(b.source_path()); "
            "print(len(d.CASES), d.case_by_id('loader-no-workers').cause == " + repr(drills.case_by_id(
                "loader-no-workers").cause) + ")")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == [str(site / "labkit" / "coursefiles" / "notebooks" / bank.FILE),
                                       str(len(drills.CASES)), "True"]


# ---- the page in Russian (issue #51): notebooks/ru/interview_drills.md -------------------------------------

RU_TEXT = (ROOT / "notebooks" / "ru" / bank.FILE).read_text(encoding="utf-8")


def test_the_russian_page_translates_every_case_signal_and_sentence_of_the_english():
    assert bank.untranslated("ru") == []
    english, (russian, left) = parse(TEXT), bank.translated(parse(TEXT), "ru", RU_TEXT)
    assert not left and list(russian.cases) == list(english.cases)
    for cid, case in russian.cases.items():  # the same fields filled, each in other words
        filled = [k for k in ("cause", "fix_words", "code_fix", "needs_gpu") if english.cases[cid][k]]
        assert [k for k in ("cause", "fix_words", "code_fix", "needs_gpu") if case[k]] == filled, cid
        assert all(case[k] != english.cases[cid][k] for k in filled + ["words"]), cid
    healthy = {russian.cases[s["id"]]["cause"] for s in bank.SPECS if s.get("healthy")}
    assert len(healthy) == 1 and healthy != {bank.HEALTHY}  # one shared cause, in Russian
    fills = {k: "X" for names in bank.SENTENCES.values() for k in names}
    assert all(russian.say(k, **fills) != english.say(k, **fills) for k in russian.sentences
               if k not in ("row-loss-scale", "row-mfu", "name-mfu", "name-allreduce"))
    # those are figures, a class name and names practitioners say in English only


def test_a_stale_or_missing_russian_entry_is_shown_in_english_and_named():
    edited = TEXT.replace("- cause: zero_grad inside the micro-batch loop", "- cause: zero_grad in the loop")
    english = parse(edited)
    cut = re.sub(r"^- wrote @\w+: .*\n", "", RU_TEXT, flags=re.M)
    russian, left = bank.translated(english, "ru", cut)
    assert ("Cases", "zero-grad-inside", "stale") in left and ("Sentences", "wrote", "missing") in left
    assert russian.cases["zero-grad-inside"]["cause"] == "zero_grad in the loop"  # the English it no longer matches
    assert russian.say("wrote", path="p") == "wrote p" and len(left) == 2


def test_a_russian_learner_gets_the_drills_in_russian(tmp_path):
    """LABKIT_LANG=ru (the Russian chapters' set-up cell) before labkit.drills is imported: the catalogue's causes
    and the drills' sentences are Russian, and nothing falls back with a warning."""
    import subprocess
    import sys
    code = ("import warnings; warnings.simplefilter('error')\n"
            "from labkit import drills\n"
            "c = next(c for c in drills.CASES if c.id == 'step2-oom')\n"
            "print(c.cause); print(drills.bank.PAGE.say('ready'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**__import__("os").environ, "LABKIT_LANG": "ru", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["состояние оптимизатора создаётся на обновлении 1 (нехватка памяти на "
                                       "обновлении 2)", "готово"]


def test_a_russian_page_with_a_bad_key_or_placeholder_is_refused():
    with pytest.raises(bank.DrillsPageError, match="key @hash"):
        bank.translated(parse(TEXT), "ru", RU_TEXT.replace("- ready @", "- ready "))
    bad = re.sub(r"^(- wrote @\w+: ).*$", r"\1записано в {file}", RU_TEXT, flags=re.M)
    with pytest.raises(bank.DrillsPageError, match="placeholder"):
        bank.translated(parse(TEXT), "ru", bad)
