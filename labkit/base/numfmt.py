"""The one number format of everything a learner reads -- chapters, panel, charts, predictions: a few
significant digits, thousands separated, never e-notation ("1,720 ms", not "1.72e+03 ms"); in Russian the
groups are separated by a narrow no-break space ("1 720 ms": ``digits.grouped``), the decimal point stays."""
from __future__ import annotations

import math
import numbers

from .digits import grouped


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
