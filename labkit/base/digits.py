"""Thousands grouped the way the learner's language writes them: English '3,260,000', Russian '3 260 000'
(a narrow no-break space, U+202F, the Russian typographic convention: a Russian reader takes '4,180' for
4.18). The decimal point stays a point in both (notebooks/ru/GLOSSARY.md, "Числа").

One pass over text that figures were formatted into (``grouped``): only a run of digits grouped by commas
in threes changes -- never a comma after a word ('a, b, c'), inside an identifier or a decimal part, or
anything inside a markdown code span or fence, where the text is code."""
from __future__ import annotations

import re

SEP = "\u202f"  # narrow no-break space: a group never wraps onto the next line
# a number grouped in threes: not glued to a word, a decimal part or another group before it, and
# not followed by a further digit or a comma-digit (then it is not one grouped number: '1,2345', '1,234,5')
_FIGURE = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?!\d|,\d)")
# the language labkit speaks now: labkit.base.phrases installs its language() here when it is imported (phrases
# imports this module, so this one cannot import it back)
_language = lambda: "en"  # noqa: E731
CODE = re.compile(r"(?<!\\)(`+).*?(?<!`)\1(?!`)", re.S)  # a code span or fence: ``x``, `x`, ```...```


def separator(lang: str | None = None) -> str:
    """The thousands separator of ``lang`` (default: the language labkit speaks now)."""
    return SEP if (lang or _language()) == "ru" else ","


def grouped(text: str, lang: str | None = None) -> str:
    """``text`` with each grouped figure's commas as ``lang``'s separator (default: the language labkit
    speaks now); English text comes back unchanged. Code spans keep what the code printed."""
    sep = separator(lang)
    if sep == "," or not isinstance(text, str) or "," not in text:
        return text
    parts, end = [], 0
    for code in CODE.finditer(text):
        parts += [_FIGURE.sub(lambda m: m.group().replace(",", sep), text[end:code.start()]), code.group()]
        end = code.end()
    parts.append(_FIGURE.sub(lambda m: m.group().replace(",", sep), text[end:]))
    return "".join(parts)
