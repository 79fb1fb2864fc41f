"""Sentences a learner reads, kept in a markdown page of the course rather than in Python (issue #47).

A page (``notebooks/NAME.md``) lists its sentences as ``- key: template`` items under ``##``/``###``
headings; a template's ``{name}`` placeholders are filled by the code with figures it formatted. The code
declares each key and the placeholders it fills (``spec``); ``sentences`` checks the page against it: every
key once, no other, no placeholder the code does not fill, no format in a placeholder, plain text (the
widgets and the terminal show it as written). A malformed entry raises ``PageError`` naming the file and
line, the entry, the field, the value and what is allowed.

An installed labkit reads the copy its wheel carries (``labkit/coursefiles/notebooks/``, where setup.py puts
every ``notebooks/*.md``); a checkout reads its own file.

    WORDS = phrases.load_section("lab_messages.md", "Lab panel", {"oom": ("error",), ...})
    WORDS.say("oom", error=str(e))
"""
from __future__ import annotations

import hashlib
import os
import re
import string
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import numfmt, paths, runtime
from .runtime import ConfigError

PACKAGED = Path(__file__).resolve().parents[1] / "coursefiles" / "notebooks"  # where a wheel carries them
ITEM = re.compile(r"- (?P<key>[^:]+): (?P<value>.*)$")
NOT_PLAIN = ("`", "*", "<", "\\")  # what markdown would render otherwise: the text is shown as written


class PageError(ConfigError):
    """A malformed entry of a course page: names the file and line, the entry, the field, the value and what
    is allowed (a ConfigError: raised when the page is read, before anything uses it)."""

    KIND = ""  # what an entry is called in the message ("question" for the bank's)

    def __init__(self, where: str, entry, field_name: str, value, allowed: str):
        self.where, self.entry = where, entry
        who = f"{self.KIND + ' ' if self.KIND else ''}{entry!r}, " if entry else ""
        super().__init__(f"{where}: {who}{field_name}", value, allowed)


@dataclass(frozen=True)
class Phrases:
    """A page's sentences: {key: template}; ``say`` fills one, in the language the learner chose
    (``language()``) where the page's translation has it, else in English with a warning."""
    sentences: dict
    where: str = ""
    page: str = ""  # the page's name and ``##`` section, where a translation is looked up
    heading: str = ""
    spec: dict = field(default_factory=dict)

    def say(self, key: str, **values) -> str:
        """The sentence ``key`` with its placeholders filled from ``values`` (figures the caller formatted; in
        Russian their thousands are grouped the Russian way, ``numfmt.grouped``; English as is)."""
        return numfmt.grouped(self.template(key).format(**values))

    def template(self, key: str) -> str:
        english = self.sentences[key]
        lang = language()
        if lang == "en" or not self.page:
            return english
        entry = translation(self.page, self.heading, lang, self.spec).get(key)
        if entry is None or entry[0] != entry_hash(english):
            why = "not translated" if entry is None else "stale: its English changed since"
            _notice(f"{self.page} ## {self.heading}: {key!r} {why}; shown in English")
            return english
        return entry[1]


# ---- the learner's language (issue #51) -------------------------------------------------------------------

LANGUAGES = ("en", "ru")
_chosen: list = []  # the language chosen in this process (course.language), over LABKIT_LANG


def language() -> str:
    """The language labkit speaks to the learner: the one chosen in this process, else ``LABKIT_LANG``, else
    English."""
    if _chosen:
        return _chosen[-1]
    lang = os.environ.get("LABKIT_LANG", "").strip().lower()
    if lang and lang not in LANGUAGES:
        raise ConfigError("LABKIT_LANG", lang, "one of " + ", ".join(LANGUAGES) + " (unset: English)")
    return lang or "en"


numfmt._language = language  # figures are grouped in the language labkit speaks (numfmt.grouped)


def choose_language(lang: str) -> str:
    """Speak ``lang`` from now on, here and in the processes labkit starts (DDP ranks read LABKIT_LANG)."""
    if lang not in LANGUAGES:
        raise ConfigError("language", lang, "one of " + ", ".join(LANGUAGES))
    _chosen[:] = [lang]
    os.environ["LABKIT_LANG"] = lang
    return lang


def entry_hash(english: str) -> str:
    """The hash a translated entry stores of the English it translates: 8 hex digits of its sha256."""
    return hashlib.sha256(english.encode("utf-8")).hexdigest()[:8]


_said: set = set()
_translations: dict = {}


def _notice(text: str) -> None:
    """An English fallback is never silent: one warning per sentence and process."""
    if text not in _said:
        _said.add(text)
        warnings.warn(text, stacklevel=4)


def translated_sections(name: str, lang: str) -> dict:
    """{heading: {key: (hash of the English, template)}} of the page ``lang/name``, whose items read
    ``- key @hash: template``; {} with a warning where the page is not at hand (a wheel without it)."""
    try:
        path = page_path(f"{lang}/{name}")
        text = path.read_text(encoding="utf-8")
    except OSError:  # FileNotFoundError among them
        _notice(f"no {lang} copy of {name} is at hand: its sentences are shown in English")
        return {}
    out = {}
    for _, heading, rows in split(visible(text.splitlines()), "## "):
        entries = out.setdefault(heading, {})
        for n, key, value in items(rows, f"{path.name}:{heading}", heading):
            m = re.fullmatch(r"(?P<key>.+?) @(?P<hash>[0-9a-f]{8})", key)
            if m is None:
                raise PageError(f"{lang}/{name}:{n}", key, "key", key,
                                "`key @hash`: the 8 hex digits of phrases.entry_hash(the English sentence)")
            entries[m["key"]] = (m["hash"], value)
    return out


def translation(name: str, heading: str, lang: str, spec: dict) -> dict:
    """{key: (hash, template)} of one section of a translated page, checked against the module's ``spec``
    as the English is (a key the module declares, its placeholders only, plain text)."""
    cache = (name, heading, lang)
    if cache not in _translations:
        entries = translated_sections(name, lang).get(heading, {})
        where = f"{lang}/{name}"
        for key, (_, value) in entries.items():
            if spec and key not in spec:
                raise PageError(where, key, "sentence", key, "one of the section's sentences: " + ", ".join(spec))
        if spec:
            rows = [(0, f"- {k}: {v}") for k, (_, v) in entries.items()]
            sentences(rows, where, {k: spec[k] for k in entries}, heading)
        _translations[cache] = entries
    return _translations[cache]


def untranslated(name: str, lang: str) -> list:
    """[(heading, key, 'missing' or 'stale')] of the English page ``name`` against its ``lang`` copy."""
    english = Path(page_path(name)).read_text(encoding="utf-8")
    done = translated_sections(name, lang)
    out = []
    for _, heading, rows in split(visible(english.splitlines()), "## "):
        for _, key, value in items(rows, f"{name}:{heading}", heading):
            entry = done.get(heading, {}).get(key)
            if entry is None or entry[0] != entry_hash(value):
                out.append((heading, key, "missing" if entry is None else "stale"))
    return out


def notebooks_dir() -> Optional[Path]:
    """The folder of the course's notebooks and pages: the checkout's, else the installed package's; None
    without either."""
    checkout = paths.checkout_root()
    return next((f for f in (checkout and checkout / "notebooks", PACKAGED) if f and f.is_dir()), None)


PAGES = ("lab_messages.md", "interview_drills.md")  # the pages labkit's own code reads (labkit grade's sandbox binds them)
BESIDE = Path(__file__).resolve().parents[2] / "notebooks"  # a checkout's pages, also where only they are at hand


def page_path(name: str) -> Path:
    """``notebooks/name`` of the checkout, else of the installed package's copy, else the page alone beside the
    package (what ``labkit grade``'s sandbox shows of a checkout: the package and these pages, read-only)."""
    folder = notebooks_dir()
    if folder is None and (BESIDE / name).is_file():
        return BESIDE / name
    if folder is None:
        raise FileNotFoundError(f"the course page {name} is not at hand: install labkit from a wheel or a checkout "
                                "(pip install .), not from a copy of the labkit/ folder alone")
    return folder / name


# ---- parsing ----------------------------------------------------------------------------------------------

def visible(lines: list) -> list:
    """[(line number, line)] outside HTML comments, blank lines kept (they end paragraphs and items)."""
    out, in_comment = [], False
    for n, ln in enumerate(lines, 1):
        if in_comment:
            in_comment = "-->" not in ln
            continue
        if ln.lstrip().startswith("<!--"):
            in_comment = "-->" not in ln
            continue
        out.append((n, ln))
    return out


def split(rows: list, level: str) -> list:
    """[(line number, heading text, [(n, line)] under it)] of the headings ``level`` ("## " or "### ")."""
    out, head = [], None
    for n, ln in rows:
        if ln.startswith(level):
            head = (n, ln[len(level):].strip(), [])
            out.append(head)
        elif head is not None:
            head[2].append((n, ln))
    return out


def plain(where: str, entry, name: str, text: str) -> str:
    """``text`` when it is non-empty plain text; else a PageError."""
    if not text:
        raise PageError(where, entry, name, text, "a text after the colon, not empty")
    bad = next((ch for ch in NOT_PLAIN if ch in text), None)
    if bad:
        raise PageError(where, entry, name, text[:60], f"plain text, shown as written: no {bad!r} (markdown "
                                                       f"would render it; labkit shows it raw)")
    return text


def items(rows: list, where: str, entry) -> list:
    """[(line number, key, value)] of ``- key: value`` items; a line indented under an item continues it;
    ``###`` headings group items and are skipped."""
    out = []
    for n, ln in rows:
        if not ln.strip() or ln.startswith("### "):
            continue
        m = ITEM.match(ln)
        if m:
            out.append([n, m["key"].strip(), m["value"].strip()])
        elif ln.startswith((" ", "\t")) and out:
            out[-1][2] += " " + ln.strip()
        else:
            raise PageError(f"{where}:{n}", entry, "line", ln.strip()[:60],
                            "a `- key: text` item (a longer text goes on indented lines under it)")
    return [tuple(i) for i in out]


def sentences(rows: list, where: str, spec: dict, section: str = "Sentences") -> dict:
    """{key: template} of the ``- key: template`` items in ``rows``, checked against ``spec`` {key: the
    placeholders the code fills}."""
    out = {}
    for n, key, value in items(rows, where, section):
        if key not in spec:
            raise PageError(f"{where}:{n}", key, "sentence", key, "one of the page's sentences: " + ", ".join(spec))
        if key in out:
            raise PageError(f"{where}:{n}", key, "sentence", key, "each sentence once")
        plain(f"{where}:{n}", key, "sentence", value)
        try:
            names = [(f, fmt, conv) for _, f, fmt, conv in string.Formatter().parse(value) if f is not None]
        except ValueError as e:
            raise PageError(f"{where}:{n}", key, "sentence", value[:60], f"balanced {{name}} placeholders ({e})")
        for name, fmt, conv in names:
            if name not in spec[key] or fmt or conv:
                raise PageError(f"{where}:{n}", key, "placeholder", "{" + name + (f":{fmt}" if fmt else "") + "}",
                                "{name} with name one of: " + (", ".join(spec[key]) or "none for this sentence")
                                + " (the code formats the figures)")
        out[key] = value
    missing = [k for k in spec if k not in out]
    if missing:
        raise PageError(where, missing[0], "sentence", None, f"a `- {missing[0]}: ...` item in ## {section}")
    return out


def load_section(name: str, heading: str, spec: dict, path=None) -> Phrases:
    """The sentences of the ``## heading`` section of the course page ``name`` (``path``: another copy of
    it): a page several modules share, each checking its own section against its ``spec``."""
    path = Path(path) if path is not None else page_path(name)
    parts = {h: rows for _, h, rows in split(visible(path.read_text(encoding="utf-8").splitlines()), "## ")}
    if heading not in parts:
        raise PageError(path.name, None, "section", heading, f"a `## {heading}` section (its sentences)")
    return Phrases(sentences(parts[heading], path.name, spec, heading), path.name, name, heading, dict(spec))


def sections(name: str, path=None) -> list:
    """The ``##`` headings of the course page ``name``, in order."""
    path = Path(path) if path is not None else page_path(name)
    return [h for _, h, _ in split(visible(path.read_text(encoding="utf-8").splitlines()), "## ")]


# ---- setting errors in the learner's language (issue #51) ---------------------------------------------------

ERRORS_PAGE, ERRORS_HEADING = "lab_messages.md", "Setting errors"
FRAME = {"not-allowed": ("field", "value", "allowed")}  # every ConfigError's message: its field, value, allowed
_error_words: list = []


def setting_errors(spec: dict) -> Phrases:
    """The ``## Setting errors`` section of lab_messages.md: the frame every ConfigError is said in
    (``not-allowed``) and the ``allowed`` texts of the module that owns it (labkit.engine.config, ``spec``).
    From then on a ConfigError reaches the learner in the language chosen (``language()``)."""
    words = load_section(ERRORS_PAGE, ERRORS_HEADING, {**FRAME, **spec})
    _error_words[:] = [words]
    return words


def _frame(field_name: str, value, allowed: str) -> Optional[str]:
    """A ConfigError's message in the learner's language; None (runtime.py's English) in English or before
    the section was read."""
    try:
        lang = language()
    except ConfigError:  # a wrong LABKIT_LANG: this error keeps its own words, in English (language() says why)
        return None
    if not _error_words or lang == "en":
        return None
    return _error_words[0].say("not-allowed", field=field_name, value=repr(value), allowed=allowed)


runtime.install_formatter(_frame)
