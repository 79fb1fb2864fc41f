"""The one number format of everything a learner reads -- chapters, panel, charts, predictions: a few
significant digits, thousands separated, never e-notation ("1,720 ms", not "1.72e+03 ms").

Thousands are grouped the way the learner's language writes them (``grouped``): English '3,260,000',
Russian '3 260 000' (a narrow no-break space, U+202F: a Russian reader takes '4,180' for 4.18);
the decimal point stays a point in both (notebooks/ru/GLOSSARY.md, "Числа"). Only a run of digits
grouped by commas in threes changes -- never a comma after a word ('a, b, c'), inside an identifier
or a decimal part, or anything inside a markdown code span or fence, where the text is code."""
from __future__ import annotations

import math
import numbers
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
    return outside_code(text, lambda part: _FIGURE.sub(lambda m: m.group().replace(",", sep), part))


def outside_code(text: str, prose, code=str) -> str:
    """``text`` with ``prose`` applied to its parts outside markdown code spans and fences, ``code`` to those."""
    parts, end = [], 0
    for span in CODE.finditer(text):
        parts += [prose(text[end:span.start()]), code(span.group())]
        end = span.end()
    return "".join(parts + [prose(text[end:])])


def is_number(x) -> bool:
    """A real number, numpy's scalars included; a bool is not one."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def number(v, digits: int = 3, missing: str = "–", trailing_zeros: bool = False) -> str:
    """``v`` to ``digits`` significant digits: 1723.4 -> '1,720', 0.01234 -> '0.0123', 2.0 -> '2';
    ``missing`` for None, NaN, inf or anything that is not a number. ``trailing_zeros`` keeps them
    ('1.70', not '1.7'), so a table column reads alike: 1.70 | 1.61 | 42.7 | 111."""
    if not is_number(v) or not math.isfinite(v):
        return missing
    if v == 0:
        return "0"
    decimals = digits - 1 - math.floor(math.log10(abs(v)))
    text = f"{round(v, decimals):,.{max(decimals, 0)}f}"  # digits past the significant ones are noise
    if not (trailing_zeros or "." not in text):
        text = text.rstrip("0").rstrip(".")
    return grouped(text)


def ms(seconds, missing: str = "–") -> str:
    """Seconds as milliseconds in this format: 0.01723 -> '17.2'; ``missing`` when not a number."""
    return number(1000 * seconds, missing=missing) if is_number(seconds) else missing


def counted(n, word: str) -> str:
    """'1 thread', '2 threads', '2 CPU threads': a count with its word, never 'thread(s)'."""
    return f"{n} {word}" + ("" if n == 1 else "s")
