"""What a chapter's cell puts on the page from a measurement: the sentence the measured outcome calls for
(``explain``, its variants written in the cell), rows as a markdown table (``table``), generated markdown
(``say``). The notebooks reach them as ``lk.course.explain``, ``lk.course.table`` and ``lk.course.say``.
"""
from __future__ import annotations

import numbers
import re

from . import phrases
from .numfmt import SEP, grouped, is_number, number, outside_code
from .runtime import ConfigError
from .frontend import in_notebook


def say(text: str):
    """Show generated markdown (text that quotes measured numbers must come from here, not be typed)."""
    if not isinstance(text, str):
        raise ConfigError("text", text, "a string of markdown")
    text = grouped(text)  # figures grouped as the learner's language writes them (code spans kept)
    if not in_notebook():  # plain Python or a terminal: the words without their markup
        print(_plain(text))
        return
    from IPython.display import Markdown, display  # deferred: IPython exists only in a notebook
    display(Markdown(text))


def _plain(markdown: str) -> str:
    """Markdown's emphasis and code marks taken out, for a terminal (escaped characters keep their meaning)."""
    return re.sub(r"\\([*_`|\[\]])", r"\1", re.sub(r"(?<!\\)[*`]", "", markdown))


def anchor(heading: str) -> str:
    """JupyterLab's id for a markdown heading: its rendered text (no link, code or emphasis marks), spaces as
    hyphens -- what a link to a chapter's section (``NN_name.ipynb#Heading-anchor``) needs."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's words
    return re.sub(r"[`*]", "", text).strip().replace(" ", "-")


def md_escape(text: str) -> str:
    """``text`` shown as written inside markdown: a datasheet's 'BF16 1,979* TFLOP/s' must not turn italic."""
    return re.sub(r"([\\`*_|\[\]<>])", r"\\\1", str(text))


class Table(list):
    """A list of row dicts that shows itself as a markdown table: ``columns`` is [(key, heading, format)],
    the key a row's key or a function of the row, the format a ``str.format`` pattern for one value
    (``"{:.0f} ms"``) or a function. Still a list: code that reads rows (checkers, plots) sees the same dicts."""

    def __init__(self, rows, columns):
        super().__init__(rows)
        if not columns or not all(isinstance(c, tuple) and len(c) == 3 for c in columns):
            raise ConfigError("columns", columns, "a list of (key, heading, format) tuples")
        self.columns = list(columns)

    def _repr_markdown_(self) -> str:
        head = "| " + " | ".join(_heading(h) for _, h, _ in self.columns) + " |"
        rule = "|" + "".join("---|" if f == "{}" else "---:|" for _, _, f in self.columns)  # words left, figures right
        body = ["| " + " | ".join(_cell(k(r) if callable(k) else r.get(k), f) for k, _, f in self.columns) + " |"
                for r in self]
        return "\n".join([head, rule, *body])


def _heading(text) -> str:
    """A column heading shown as written, like a cell ('max |grad diff|' must not split the column), except
    its `code spans`, which stay code: inside one only a pipe needs its backslash (a table's own rule)."""
    parts = re.split(r"(`[^`]*`)", str(text))
    return "".join(p.replace("|", "\\|") if p.startswith("`") and p.endswith("`") and len(p) > 1
                   else md_escape(p) for p in parts)


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, tuple) and None in value):
        return "–"
    return md_escape(grouped(fmt(value) if callable(fmt) else fmt.format(value)))  # '4 180' in Russian


WORDS = phrases.load_section("lab_messages.md", "Page", {"few": ("budget",)})  # the default sentences


def outcome(measured) -> str:
    """The name of what a measurement came out as, the key ``explain`` chooses a sentence by: a comparison
    from ``lk.compare_configs`` gives 'faster'/'slower'/'same' ('few' when too few repeats ran); a verdict
    an instrument returned (a string such as 'agree' or 'too_far') is its own name; True/False are 'yes'/'no'."""
    if all(hasattr(measured, k) for k in ("decided", "better", "ratio")):
        if not measured.decided:
            return "few"
        return {"b": "faster", "a": "slower", None: "same"}[measured.better]
    if isinstance(measured, bool):
        return "yes" if measured else "no"
    if isinstance(measured, str) and measured.isidentifier():
        return measured
    raise ConfigError("measured", measured, "a comparison from lk.compare_configs, a verdict name an instrument "
                      "returned (e.g. 'agree'), or True/False")


def _fill(measured, given: dict | None) -> dict:
    fill = {}
    if all(hasattr(measured, k) for k in ("decided", "better", "ratio")):
        fill = {"ratio": f"{number(measured.ratio, 3, 'n/a')}×", "low": number(measured.low, 3, "n/a"),
                "high": number(measured.high, 3, "n/a"),
                "a": getattr(measured, "label_a", "a"), "b": getattr(measured, "label_b", "b")}
    if given is not None and not isinstance(given, dict):
        raise ConfigError("values", given, "a dict of the figures a sentence quotes, e.g. values=r.figures")
    fill.update({k: (number(v) if is_number(v) and not isinstance(v, numbers.Integral) else v)
                 for k, v in (given or {}).items()})
    return fill


def _filled(text: str, fill: dict) -> str:
    """``text`` with its ``{name}``s filled: a whole number of 10,000 or more grouped in threes in the prose
    (131,072: seven digits in a row are hard to read), every digit as the code printed it inside a code span."""
    def filled_with(how):
        return lambda part: re.sub(r"{(\w+)}", lambda m: how(fill[m.group(1)]), part)
    return outside_code(text, filled_with(_whole), filled_with(_code))


def _code(v) -> str:
    """A value inside a code span as code prints it: a whole number without separators, a figure's groups
    with the comma whatever the language (the code span is code, not prose)."""
    return str(v).replace(SEP, ",")


def _whole(v) -> str:
    """A whole number (numpy's too) in full, grouped from 10,000; anything else as ``str``."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return f"{int(v):,}" if abs(v) >= 10_000 else str(int(v))
    return str(v)


def explain(measured, *, values: dict | None = None, few=None, **sentences) -> Chosen:
    """Say the sentence the measured outcome calls for; the words stay in the chapter, which of them is shown
    follows the measurement. ``measured`` is a comparison (sentences ``faster``/``better`` when b beat a,
    ``slower``/``worse`` when a beat b, ``same`` when its interval could not tell them apart, ``few`` when too
    few repeats ran), a verdict name an instrument returned (one sentence per name it can return), or a bool
    (``yes``/``no``). ``{name}`` in a sentence is filled from ``values`` (floats in the course's number
    format; whole numbers in full, grouped in threes from 10,000 on outside code spans) and, for a
    comparison, ``{ratio}``, ``{low}``, ``{high}``, ``{a}``, ``{b}``. Returns the outcome's name, so a cell
    (or a test) can read which sentence was chosen."""
    for k, v in sentences.items():
        if v is not None and not isinstance(v, str):
            raise ConfigError(k, v, "a sentence (a string)")
    key = outcome(measured)
    words = {**sentences, "few": WORDS.say("few", budget="`budget_s`") if few is None else few}
    if key in ("faster", "slower"):  # better/worse are the same sides, worded for a quality rather than a speed
        side = {"faster": "better", "slower": "worse"}[key]
        if words.get(key) is None and words.get(side) is not None:
            key = side
    text = words.get(key)
    if text is None:
        given = sorted(k for k, v in sentences.items() if v is not None)
        raise ConfigError(key, None, f"a sentence for this outcome: the measurement came out '{key}' "
                          f"and the cell gave sentences for {given}")
    fill = _fill(measured, values)
    missing = [name for name in re.findall(r"{(\w+)}", text) if name not in fill]
    if missing:
        raise ConfigError("values", sorted(fill), f"the figures the '{key}' sentence quotes: {missing}")
    say(_filled(text, fill))
    return Chosen(key)


class Chosen(str):
    """The name of the outcome ``explain`` chose: a string to code and tests, nothing on the page (the cell's
    sentence is the output; the key under it would be noise)."""

    def _ipython_display_(self):
        pass


table = Table  # lk.course.table(rows, columns): the cell that measured the rows draws them
