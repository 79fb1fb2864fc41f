"""A seal on the code a check runs, so that the learner's code cannot talk a checker into passing; and the grade
log's parts that hold no checker.

Once per module, ``seal`` notes what a check relies on: every function and class of labkit (the checkers' own
also with what their closures hold, their tables of cases and tolerances), Python's builtins and ``math``, and
the torch entry points the checks' references call. ``changes`` lists what differs now; the checker decorator
asks before each check and again after the learner's code has run, and a check with any change fails
(``labkit.check.basics._rel = lambda a, b: 0``, a cleared table, a replaced ``torch.allclose``...). A module is
sealed the first time it is seen and never again, so a patch cannot be sealed in. What a seal cannot stop is
said in the instructor kit (notebooks/README.md).

The log's parts: the signed log itself (``_make_log``), a check's answer as plain JSON for a grader to judge
again (``_answer``), and a CSV cell a spreadsheet cannot read as a formula (``csv_cell``); ``_core`` builds the
log's functions on them and keeps the signer in their closures.
"""
from __future__ import annotations

import builtins
import copy
import hmac
import json
import math
import numbers
import secrets
import sys
import types

_EMPTY_CELL = object()
_UNCOMPARED = object()

# The checkers' state that changes as they run: the time limit (tests lower it; _core holds it to its
# ceiling), the notices said once, and the process-group class scaling makes on first use. The log and the
# shield count change in place: held to their identity only (_core reads the count itself).
_LIVE = frozenset({"TIME_LIMIT_S", "_SAID", "_TWIN"})
_IDENTITY_ONLY = frozenset({"_LOG", "_SHIELDED"})
_KEPT_DUNDERS = frozenset({"__all__", "__getattr__"})
# The torch entry points the checks' own references call: replacing one changes what "right" means. Not
# torch.manual_seed or torch.utils.checkpoint: torch itself rebinds those (torch._dynamo wraps them on import).
_TORCH = {
    "torch": ("allclose", "equal", "isclose", "cat", "randn", "randint", "rand", "where", "full", "zeros", "ones"),
    "torch.nn.functional": ("cross_entropy",),
    "torch.amp": ("GradScaler",),
    "torch.utils.flop_counter": ("FlopCounterMode",),
}
_METHOD_KINDS = (types.FunctionType, staticmethod, classmethod, property)


def _is_check_module(name: str) -> bool:
    return name == "labkit.check" or name.startswith("labkit.check.")


def _is_labkit(obj) -> bool:
    return str(getattr(obj, "__module__", "") or "").split(".")[0] == "labkit"


def from_notebook(obj) -> bool:
    """Whether a function was written in a notebook, a console or exec'd text, not in a file of a package."""
    code = getattr(obj, "__code__", None)
    if code is None:
        return False
    f = code.co_filename  # a notebook cell's file, a console's; exec'd text takes the notebook's __name__
    return "ipykernel_" in f or f.startswith("<ipython-input") or getattr(obj, "__module__", None) == "__main__"


def _cell(c):
    try:
        return c.cell_contents
    except ValueError:
        return _EMPTY_CELL


def _unhooked(value):
    """``value`` itself, or what torch wrapped: torch rebinds an optimizer class's ``step`` on its first use
    (a wrapper marked ``hooked``), which is no change."""
    try:
        while getattr(value, "hooked", False) is True and hasattr(value, "__wrapped__"):
            value = value.__wrapped__
    except Exception:  # noqa: BLE001 -- an object whose attributes cannot be read is compared as it is
        pass
    return value


def _parts(value, closure: bool, deep: bool):
    """What must stay the same about a value: (objects to compare by identity, values to compare by value)."""
    value = _unhooked(value)
    same, equal = [value], []
    if isinstance(value, types.FunctionType):
        same += [value.__code__, value.__defaults__]
        equal.append(value.__kwdefaults__)
        if closure and value.__closure__:
            same += [_cell(c) for c in value.__closure__]
    elif isinstance(value, (staticmethod, classmethod)):
        same += [value.__func__, getattr(value.__func__, "__code__", None)]
    elif isinstance(value, property):
        same += [value.fget, value.fset, value.fdel]
    elif deep and isinstance(value, (list, dict, set, tuple)):
        equal.append(value)
    return same, equal


def _copy(value):
    """A deep copy to compare with later, or _UNCOMPARED for a value that has none equal to it (a tuple of
    modules, a sentinel object): its identity is sealed already."""
    try:
        c = copy.deepcopy(value)
        return c if c == value else _UNCOMPARED
    except Exception:  # noqa: BLE001
        return _UNCOMPARED


def _state(value, closure: bool, deep: bool):
    """The sealed state of a value: its identity parts (kept alive, so no other object can take their ids),
    their ids, and deep copies of the parts compared by value."""
    same, equal = _parts(value, closure, deep)
    return tuple(same), tuple(map(id, same)), [_copy(v) for v in equal]


def _same(value, closure: bool, deep: bool, then) -> bool:
    same, equal = _parts(value, closure, deep)
    return tuple(map(id, same)) == then[1] and all(c is _UNCOMPARED or c == v for v, c in zip(equal, then[2]))


def _make_seal():
    """(seal, changes): the sealed states live in this closure, out of reach of a module attribute."""
    sealed = {}   # shown name -> (namespace, key, closure?, deep?, state)
    names = {}    # shown name -> (namespace, its names then, only names that shadow this base)
    foreign = []  # notebook functions found inside labkit when it was first sealed
    done = set()  # what is sealed already: never sealed again
    modules = {}  # labkit's module names -> the module sealed

    def note(shown, space, key, value, closure, deep):
        if from_notebook(_unhooked(value)):
            foreign.append(shown)
        sealed[shown] = (space, key, closure, deep, _state(value, closure, deep))

    def seal_class(cls, shown):
        for key, value in list(vars(cls).items()):
            if isinstance(value, _METHOD_KINDS):
                note(f"{shown}.{key}", cls, key, value, False, False)

    def seal_module(name, mod):
        check = _is_check_module(name)
        modules[name] = mod  # sys.modules and its package must keep it: a test cell takes labkit from there
        for key, value in list(vars(mod).items()):
            if key in _LIVE or (key.startswith("__") and key not in _KEPT_DUNDERS):
                continue
            if check:
                note(f"{name}.{key}", mod, key, value, True, key not in _IDENTITY_ONLY)
            elif isinstance(value, (types.FunctionType, type)) and (_is_labkit(value) or from_notebook(value)):
                note(f"{name}.{key}", mod, key, value, False, False)
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                seal_class(value, f"{name}.{key}")
        if check:  # a name added there would shadow a checker (lk.check.flops_linear = ...)
            names[name] = (mod, frozenset(vars(mod)), None)

    def seal_outside():
        for mod in (builtins, math):
            for key, value in list(vars(mod).items()):
                if isinstance(value, (types.BuiltinFunctionType, type)) and not key.startswith("_"):
                    note(f"{mod.__name__}.{key}", mod, key, value, False, False)
        for name, keys in _TORCH.items():
            mod = sys.modules.get(name)
            for key in keys if mod is not None else ():
                if key in vars(mod):
                    value = vars(mod)[key]
                    note(f"{name}.{key}", mod, key, value, False, False)
                    if isinstance(value, type):
                        seal_class(value, f"{name}.{key}")
        torch = sys.modules.get("torch")
        if torch is not None:  # a method put on torch.Tensor shadows the C one every tensor op uses
            tensor = torch.Tensor
            names["torch.Tensor"] = (tensor, frozenset(vars(tensor)), tensor.__mro__[1])

    def seal():
        """Seal every labkit module not sealed yet (and, the first time, what lies outside labkit)."""
        if "outside" not in done:
            done.add("outside")
            seal_outside()
        for name, mod in list(sys.modules.items()):
            if mod is not None and (name == "labkit" or name.startswith("labkit.")) and name not in done:
                done.add(name)
                seal_module(name, mod)

    def changes() -> list:
        """The names of everything sealed that differs now (sealing the modules that appeared since first)."""
        seal()
        out = list(foreign)
        for shown, (space, key, closure, deep, then) in sealed.items():
            here = vars(space)
            if key not in here or not _same(here[key], closure, deep, then):
                out.append(shown)
        for name, mod in modules.items():  # where a test cell finds a module: sys.modules, and its package's attribute
            parent, _, child = name.rpartition(".")
            out += [f"sys.modules[{name!r}]"] * (sys.modules.get(name) is not mod) + [name] * (
                _is_check_module(name) and parent in modules and vars(modules[parent]).get(child, mod) is not mod)
        for shown, (space, then, base) in names.items():
            added = (n for n in set(vars(space)) - then if not n.startswith("__") or base is not None)
            out += [f"{shown}.{n}" for n in sorted(added) if base is None or hasattr(base, n)]
        return out

    return seal, changes


seal, changes = _make_seal()


_LOG: list = []
# taken now: code under check that replaces hmac.compare_digest or json.dumps changes nothing here (and is sealed)
_hmac_new, _digest_equal = hmac.new, hmac.compare_digest
_dumps = json.dumps


def _make_log():
    """(record, rows, reset), with the log's signing key and counters in their closure: every entry carries its
    number and an HMAC of its fields under a key made for this process, so an entry appended to ``_LOG`` by
    hand, edited, repeated or removed is found when the log is read."""
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
