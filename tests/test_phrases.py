"""Sentences a learner reads live in course pages (issue #47): notebooks/lab_messages.md holds the panel's,
the predictions', the GPU plans' and the command line's, one `##` section per module, each checked against the keys and
placeholders its module fills (labkit.base.phrases)."""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from labkit.base import phrases

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "notebooks" / "lab_messages.md"
# each section of the page and the module that says its sentences (module.WORDS)
OWNERS = {"Lab panel": "labkit.panel.lab", "Predictions in the panel": "labkit.panel.history:PREDICTION_WORDS",
          "Run history": "labkit.panel.history", "Panel parts": "labkit.panel.parts",
          "Predictions": "labkit.whatif.report", "Command line": "labkit.__main__", "GPU plans": "labkit.engine.gpus",
          "Devices": "labkit.engine.device"}
# the sections after the presets' and knobs': lk.course's own sentences, explain's default, labkit.hello()
LATER = {"Course helpers": "labkit.chapters.course", "Page": "labkit.base.page", "Hello": "labkit",
         "Checks": "labkit.check._core", "Checks: chapters 00 and 01": "labkit.check.basics",
         "Checks: chapter 02": "labkit.check.precision", "Checks: chapter 03": "labkit.check.basics:WORDS03",
         "Quiz": "labkit.content.quiz",
         "Comparisons": "labkit.tools.compare",
         "Chapter 03: one update's peak": "labkit.chapters.ch03_accumulation",
         "Chapter 05: loaders": "labkit.chapters.ch05_loader",
         "Checks: chapter 04": "labkit.check.scaling:WORDS04",
         "Checks: chapter 05": "labkit.check.scaling:WORDS05 labkit.check.profiling labkit.check.measurements",
         "Checks: chapter 06": "labkit.check.ddp", "Checks: chapter 07": "labkit.check.practice:WORDS07",
         "Checks: chapter 08": "labkit.check.practice:WORDS08",
         "Checks: chapter 01, the low-MFU fix": "labkit.check.profiling",
         "Checks: chapter 09": "labkit.check.capstone", "Checks: chapter 10": "labkit.check.parallel",
         "Checks: chapter 11": "labkit.check.capstone:WORDS11", "Checks: chapter 12": "labkit.check.compose",
         "Knob labels": "labkit.engine.config:LABEL_WORDS",
         "Panel labels": "labkit.panel.parts:LABELS labkit.panel.lab labkit.panel.knobs labkit.panel.history",
         "Charts": "labkit.tools.plots.figure labkit.tools.plots.live labkit.tools.plots.versus"}


def test_every_section_has_its_module_and_every_sentence_is_said():
    engine = ["Model presets", "Knobs", "Setting errors", "Device refusals"]  # engine.config's, engine.rules's
    assert phrases.sections("lab_messages.md") == list(OWNERS) + engine + list(LATER)
    from labkit.engine import config  # the knobs' help and the presets' notes: one item per field and preset
    assert config.fields_help()["micro_batch"]["help"] and config.PRESETS["tiny"].note
    # what config's checks allow, and the frame every ConfigError is said in (labkit.base.phrases)
    said = inspect.getsource(config) + inspect.getsource(phrases)
    assert config.ERROR_WORDS.where == PAGE.name
    assert [k for k in config.ERROR_WORDS.sentences if f'"{k}"' not in said] == []
    from labkit.engine import rules  # what a device allows instead of a setting it refuses
    code = inspect.getsource(rules)
    assert rules.WORDS.where == PAGE.name and [k for k in rules.WORDS.sentences if f'"{k}"' not in code] == []
    assert all(h["help"] and "{" not in h["help"] for h in config.fields_help().values())
    for heading, owner in {**OWNERS, **LATER}.items():
        # "module[:ATTRIBUTE] [another module ...]": the first holds the section's Phrases (WORDS unless named),
        # and a key may be said in any of them
        first, *others = owner.split()
        name, _, attr = first.partition(":")
        words = getattr(importlib.import_module(name), attr or "WORDS")
        code = "".join(inspect.getsource(importlib.import_module(m)) for m in [name] + others)
        assert words.where == PAGE.name
        unsaid = [k for k in words.sentences if not re.search(rf"""["']{re.escape(k)}["']""", code)]
        assert not unsaid, f"{heading}: sentences no code of {owner} says: {unsaid}"


def _section(tmp_path, body: str):
    path = tmp_path / "page.md"
    path.write_text("# A page\n\nIts introduction, free text.\n\n## Words\n\n" + body, encoding="utf-8")
    return path


SPEC = {"hello": ("name",), "bye": ()}


def test_a_section_parses_and_fills_its_placeholders(tmp_path):
    words = phrases.load_section("page.md", "Words", SPEC, _section(
        tmp_path, "### a group\n\n- hello: Hello {name}, a long sentence\n  that goes on.\n- bye: Bye.\n"))
    assert words.say("hello", name="Ada") == "Hello Ada, a long sentence that goes on." and words.say("bye") == "Bye."


@pytest.mark.parametrize("body, parts", [
    ("- hello: Hello {who}.\n- bye: Bye.\n", ("page.md:7", "'hello'", "placeholder", "{who}", "name")),
    ("- hello: Hello {name:>5}.\n- bye: Bye.\n", ("'hello'", "placeholder", "formats the figures")),
    ("- hello: Hello {name}.\n", ("'bye'", "a `- bye: ...` item in ## Words")),
    ("- hello: Hello {name}.\n- bye: Bye.\n- bye: Bye again.\n", ("page.md:9", "'bye'", "each sentence once")),
    ("- hello: Hello {name}.\n- bye: Bye.\n- hi: Hi.\n", ("'hi'", "one of the page's sentences: hello, bye")),
    ("- hello: Hello `{name}`.\n- bye: Bye.\n", ("'hello'", "plain text", "'`'")),
    ("- hello: Hello {name}.\nbye: Bye.\n", ("page.md:8", "line", "`- key: text` item")),
    ("- hello: Hello {name.\n- bye: Bye.\n", ("'hello'", "balanced")),
])
def test_a_malformed_entry_is_refused_naming_line_key_and_field(tmp_path, body, parts):
    with pytest.raises(phrases.PageError) as info:
        phrases.load_section("page.md", "Words", SPEC, _section(tmp_path, body))
    for p in parts:
        assert p in str(info.value), (p, str(info.value))


def test_a_missing_section_is_refused(tmp_path):
    with pytest.raises(phrases.PageError, match="a `## Other` section"):
        phrases.load_section("page.md", "Other", SPEC, _section(tmp_path, "- hello: Hi {name}.\n- bye: Bye.\n"))


def test_the_pages_are_found_from_a_checkout_and_from_an_installed_package(tmp_path, monkeypatch):
    assert phrases.page_path("lab_messages.md") == PAGE
    packaged = tmp_path / "notebooks"
    packaged.mkdir()
    (packaged / "lab_messages.md").write_text(PAGE.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(phrases.paths, "checkout_root", lambda: None)
    monkeypatch.setattr(phrases, "PACKAGED", packaged)
    assert phrases.page_path("lab_messages.md") == packaged / "lab_messages.md"
    monkeypatch.setattr(phrases, "PACKAGED", tmp_path / "nowhere")
    monkeypatch.setattr(phrases, "BESIDE", tmp_path / "nowhere")  # not even the pages alone beside the package
    with pytest.raises(FileNotFoundError, match="lab_messages.md"):
        phrases.page_path("lab_messages.md")


def test_the_pages_alone_beside_the_package_are_found_as_labkit_grades_sandbox_shows_them(tmp_path, monkeypatch):
    """labkit grade's bubblewrap sandbox binds the package and these pages only (no pyproject.toml, no other
    notebook): labkit must still import there (CI's classgrade tests failed without it)."""
    beside = tmp_path / "notebooks"
    beside.mkdir()
    for name in phrases.PAGES:
        (beside / name).write_text((ROOT / "notebooks" / name).read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(phrases.paths, "checkout_root", lambda: None)
    monkeypatch.setattr(phrases, "PACKAGED", tmp_path / "nowhere")
    monkeypatch.setattr(phrases, "BESIDE", beside)
    assert all(phrases.page_path(name) == beside / name for name in phrases.PAGES)
