"""The templates of the quiz and the instructor kit (labkit/content/pages.py, labkit/content/templates/): how a
section is read, and that every section the content and instructor modules ask for is there."""
import re
from pathlib import Path

from labkit.content import pages

CONTENT = Path(pages.__file__).parent
READERS = [CONTENT, CONTENT.parent / "instructor"]  # the modules that read the templates


def _template(tmp_path, monkeypatch, text: str) -> str:
    monkeypatch.setattr(pages, "TEMPLATES", tmp_path)
    (tmp_path / "t.md").write_text(text, encoding="utf-8")
    pages.sections.cache_clear()
    return "t.md"


def test_a_section_is_its_first_fence_exactly_or_its_text(tmp_path, monkeypatch):
    name = _template(tmp_path, monkeypatch, "# title\n\nintro\n\n## plain\n\n  one line  \n\n"
                     "## fenced\n\nwhat it is\n\n````python\n## not a heading\n```\nx = {a}\n```\n\n````\n\nafter\n\n"
                     "## list\n\n- 00 01: a: b\n- 02: c\n")
    try:
        assert pages.sections(name) == {"plain": "  one line  ", "fenced": "## not a heading\n```\nx = {a}\n```\n",
                                         "list": "- 00 01: a: b\n- 02: c"}
        assert pages.items(name, "list") == {"00 01": "a: b", "02": "c"}
    finally:
        pages.sections.cache_clear()


def test_every_section_a_content_module_asks_for_is_in_its_template():
    asked = set()
    for path in (p for folder in READERS for p in folder.glob("*.py")):
        src = path.read_text(encoding="utf-8")
        asked |= set(re.findall(r'pages\.(?:section|items)\("([\w.-]+)", "([\w-]+)"\)', src))
        for file in re.findall(r'pages\.section\("([\w.-]+)", key\)', src):  # a module's _text(key) helper
            asked |= {(file, k) for k in re.findall(r'_text\("([\w-]+)"', src)}
    assert len(asked) > 30
    missing = sorted((f, k) for f, k in asked if k not in pages.sections(f))
    assert not missing, missing
