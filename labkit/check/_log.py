"""The grade log's parts that hold no checker: the signed log itself (``_make_log``), a check's answer as plain
JSON data for a grader to judge again (``_answer``), and a CSV cell a spreadsheet cannot read as a formula
(``csv_cell``). ``_core`` builds the log's functions on them and keeps the signer in their closures."""
from __future__ import annotations

import hmac
import json
import math
import numbers
import secrets

_LOG: list = []
# taken now: code under check that replaces hmac.compare_digest or json.dumps changes nothing here (and is sealed)
_hmac_new, _digest_equal = hmac.new, hmac.compare_digest
_dumps = json.dumps


def _make_log():
    """(record, rows, reset): the grade log's signing key and counters live in this closure. Every entry
    carries its number and an HMAC of its fields under a key made for this process, so an entry appended
    to ``_LOG`` by hand, edited, repeated or removed is found when the log is read. None of the three is a
    module attribute (``_log_api`` keeps them in its functions' closures): what a learner's code can reach
    there, and what it cannot be kept from, is said in the instructor kit."""
    key = secrets.token_bytes(32)
    log = _LOG  # the list itself: rebinding the module's name changes nothing here (and is sealed)
    count = {"next": 0, "first": 0}

    def sign(entry) -> str:
        body = {k: v for k, v in entry.items() if k != "sig"}
        return _hmac_new(key, _dumps(body, sort_keys=True, default=str).encode(), "sha256").hexdigest()

    def record(entry):
        entry = dict(entry, seq=count["next"])
        count["next"] += 1
        entry["sig"] = sign(entry)
        log.append(entry)

    def genuine(entry, after) -> bool:
        """Signed here, unchanged since, and numbered after the last genuine one (a repeat is not)."""
        return (isinstance(entry, dict) and isinstance(entry.get("sig"), str) and isinstance(entry.get("seq"), int)
                and entry["seq"] > after and _digest_equal(entry["sig"], sign(entry)))

    def rows(answers: bool = False) -> list:
        """The log as rows for a reader: a genuine entry as it was recorded, anything else flagged, and a
        last row for entries removed. ``answers``: each row also carries the check's answer as plain JSON
        (``answer``: None where it was not plain data), for a grader that judges it again."""
        fields = _FIELDS[1:] + ["answer"] * answers
        extra = {"answer": None} if answers else {}
        out, last, seen = [], count["first"] - 1, set()
        for entry in list(log):
            claimed = entry if isinstance(entry, dict) else {}
            if isinstance(claimed.get("seq"), int):  # an entry that claims a number accounts for it (flagged below)
                seen.add(claimed["seq"])
            if genuine(entry, last):
                last = entry["seq"]
                out.append({k: entry.get(k) for k in fields})
                continue
            out.append({"exercise": claimed.get("exercise", "?"), "passed": False,
                        "attempted": claimed.get("attempted", False), "timestamp": claimed.get("timestamp", ""),
                        "note": "not recorded by a check: the log was edited in the kernel", **extra})
        missing = len(set(range(count["first"], count["next"])) - seen)
        if missing:
            out.append({"exercise": "?", "passed": False, "attempted": False, "timestamp": "",
                        "note": f"{missing} check(s) missing: the log was edited in the kernel", **extra})
        return out

    def reset():
        log.clear()
        count["first"] = count["next"]

    return record, rows, reset


_FIELDS = ["learner", "exercise", "passed", "attempted", "timestamp", "note"]
_PLAIN_DEPTH = 4  # nesting of an answer kept for the grader (lists of lists of numbers at most)


def _plain(value, depth: int = 0):
    """``value`` as plain JSON data (numbers, strings, booleans, None, lists and string-keyed dicts of them), or
    raise TypeError: what a grader can judge again in its own process. A one-element tensor or array is its
    number; a function, an object, nan is not plain."""
    if depth > _PLAIN_DEPTH:
        raise TypeError("nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise TypeError("not finite")
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    if callable(getattr(value, "item", None)) and getattr(value, "ndim", None) == 0:
        return _plain(value.item(), depth)
    raise TypeError(type(value).__name__)


def _answer(args, kwargs):
    """The check's arguments as JSON text when they are plain data, else None."""
    try:
        return _dumps({"args": _plain(list(args)), "kwargs": _plain(dict(kwargs))}, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return None


# Cells a spreadsheet would read as a formula (OWASP's CSV injection list): written with a ' before them.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """``value`` for a CSV cell: a string starting with ``= + - @``, a tab or a carriage return gets a ``'``
    before it (a spreadsheet then shows it as text); anything else is kept as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value
