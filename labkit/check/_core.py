"""What every checker shares: a result that prints nicely, 'not attempted' handling, the learner's answer
read with a wrong type named as such (``number``, ``given``, ``returned``, ``near``, ``a_function``), a time
limit on the learner's code, a signed grade log, and the seal (``_guard``) that fails a check whose code,
limit or log the learner's code has changed."""
from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import getpass
import io
import itertools
import math
import numbers
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from . import _guard
from ._guard import _FIELDS, _LOG, _answer, _dumps, _make_log, csv_cell  # noqa: F401 -- _LOG: read by tests, drills
from ..base import phrases
from ..base.paths import write_atomic


# Seconds a check may run before the learner's code is stopped. Every checker finishes the reference
# solutions in a few seconds on 2 CPU cores, so only code that loops forever reaches this. Tests lower it;
# nothing may raise it above MAX_TIME_LIMIT_S or switch it off (a check then fails as tampered with).
TIME_LIMIT_S = 30.0
MAX_TIME_LIMIT_S = TIME_LIMIT_S

# What the time limit relies on, taken now: code under check that replaces signal.setitimer or time.monotonic
# changes nothing here (and these names are sealed; the log's own are in _guard).
_SIGALRM = getattr(signal, "SIGALRM", None)
_ITIMER_REAL = getattr(signal, "ITIMER_REAL", None)
_SIG_BLOCK = getattr(signal, "SIG_BLOCK", None)
_SIG_UNBLOCK = getattr(signal, "SIG_UNBLOCK", None)
_SIG_DFL = signal.SIG_DFL
_setitimer = getattr(signal, "setitimer", None)
_getitimer = getattr(signal, "getitimer", None)
_sigmask = getattr(signal, "pthread_sigmask", None)
_set_handler, _get_handler = signal.signal, signal.getsignal
_monotonic = time.monotonic


# what every check says around its own hint, in the learner's language: notebooks/lab_messages.md, ## Checks
WORDS = phrases.load_section("lab_messages.md", "Checks", {
    "pass": (), "not-attempted": (), "not-yet": (), "write-answer": (), "timeout": ("seconds", "loop"),
    "exit": ("call",), "raised": ("error", "line")})


@dataclass
class CheckResult:
    name: str
    passed: bool
    message: str
    attempted: bool = True
    tampered: bool = False  # the check found its own code, limit or log changed: it failed for that

    def __bool__(self):
        return self.passed

    def __repr__(self):
        mark = ("✓ " + WORDS.say("pass").upper() if self.passed else
                "… " + WORDS.say("not-attempted").lower() if not self.attempted else "✗ " + WORDS.say("not-yet").lower())
        return f"{mark} [{self.name}] {self.message}"

    def _repr_markdown_(self):
        mark = (f"✓ **{WORDS.say('pass')}**" if self.passed else f"… **{WORDS.say('not-attempted')}**"
                if not self.attempted else f"✗ **{WORDS.say('not-yet')}**")
        return f"{mark} — `{self.name}`: {self.message}"


class NotAttempted(Exception):
    """Raised inside a checker when the learner's answer is still the placeholder (None / ...) or the
    exercise's starting code; an optional message replaces the default 'write your answer' hint."""


class AnswerError(Exception):
    """The answer (or what the learner's function returned) has the wrong type or form. Its message is
    shown as it is: the fault is the value, not a crash in the learner's code."""


class TimeUp(BaseException):
    """The check's deadline passed. A BaseException, so a learner's `except Exception:` cannot swallow it."""


class Tampered(Exception):
    """The checker's own code, tables, time limit or log were changed in this kernel. Raised outside the
    learner's code (before the check, or after it returned), so no `except` of theirs can catch it."""

    def __init__(self, what: list, limit_only: bool = False):
        self.what, self.limit_only = list(what), limit_only
        shown = ", ".join(self.what[:4]) + (f" and {len(self.what) - 4} more" if len(self.what) > 4 else "")
        if limit_only:
            msg = (f"the check's time limit was changed while your code ran ({shown}): a check runs under its "
                   "own limit. Leave the signal module alone in an exercise, then run the check again.")
        else:
            msg = (f"labkit's checker was changed in this kernel ({shown}), so no check here can be trusted. "
                   "Restart the kernel (Kernel → Restart Kernel…), run the notebook again without changing "
                   "labkit, then run the check.")
        super().__init__(msg)


def unanswered(answer) -> bool:
    # `is` first: `answer == ""` on a tensor or an array compares element-wise, which is not a yes/no
    if answer is None or answer is Ellipsis:
        return True
    return isinstance(answer, str) and answer.strip() in ("", "TODO")


def _code_key(code):
    consts = tuple(_code_key(c) if hasattr(c, "co_code") else c for c in code.co_consts)
    return code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars


def unchanged(fn, start) -> bool:
    """Whether ``fn`` is still ``start``, the code an exercise hands out to be fixed: the same bytecode,
    names and constants, whatever the function is called and whatever its comments or line numbers."""
    code = getattr(fn, "__code__", None)
    return code is not None and _code_key(code) == _code_key(start.__code__)


def describe(value) -> str:
    """'a str ('208')': a learner's value by type and a short repr, for messages."""
    r = repr(value)
    r = r if len(r) <= 60 else r[:57] + "..."
    kind = type(value).__name__
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind} ({r})"


def number(value, want: str = "give a number", source: str = "your answer is") -> float:
    """A learner's number as a float; anything else (a str, a bool, nan...) is an AnswerError that says what came
    and what is wanted: 'your answer is a str ('208'); give a number in GB'."""
    if not isinstance(value, numbers.Real) and callable(getattr(value, "item", None)):
        with contextlib.suppress(Exception):  # a one-element tensor or array stands for its number
            value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AnswerError(f"{source} {describe(value)}; {want}")
    if not math.isfinite(value):
        raise AnswerError(f"{source} {value!r}; {want} (a finite one)")
    return float(value)


def given(value):
    """What a learner's function returned, unless its body is still ``...`` (it returned None): then the
    exercise is not attempted yet, which is no wrong answer."""
    if value is None or value is Ellipsis:
        raise NotAttempted()
    return value


def returned(value, want: str) -> float:
    """What the learner's function returned, as a number (``want``: 'return a number of bytes')."""
    return number(given(value), want, "your function returned")


def number_or_none(value):
    """What the learner's function returned, as a plain number; None stays None, so that a check can tell
    'not attempted' apart from a wrong number."""
    return None if value is None else number(value, "return a number", "your function returned")


def near(got, want, rel: float = 1e-6, abs_: float = 1e-12) -> bool:
    """Whether what the learner's function returned is ``want`` within the tolerances (None never is; a str or
    a list there is the answer's fault, said so)."""
    if got is None or want is None:
        return False
    return math.isclose(number_or_none(got), float(want), rel_tol=rel, abs_tol=abs_)


def a_function(fn, what: str = "a function"):
    """``fn`` itself when it can be called; a value where a function belongs is the answer's fault, said so."""
    if not callable(fn):
        raise AnswerError(f"your answer is {describe(fn)}; pass {what} itself (its name, without calling it)")
    return fn


def case_answers(fn, cases, asked: str) -> list:
    """The learner's numbers for every case, before any right one exists. All None (a body still ``...``)
    is not attempted; None for some cases only is a path that returns nothing, said so."""
    got = [fn(*case) for case in cases]
    if all(g is None or g is Ellipsis for g in got):
        raise NotAttempted()
    for case, g in zip(cases, got):
        if g is None:
            raise AnswerError(f"your function returned None for {case} (no return reached there?); {asked}")
    return [number(g, asked, "your function returned") for g in got]


def same(a: float, b, rel: float = 1e-9) -> bool:
    return b is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def wrong_case(cases, got, right, mistakes=(), rel: float = 1e-9, eq=None):
    """None when every answer is right; else (the first case answered wrong, the answer, the right one, the hint
    of the mistake that explains every case, else of the first that explains this one where it differs from the
    right answer, else None). ``mistakes``: (model, hint) pairs, a model mapping a case to the mistaken answer (or
    None where it has none); ``eq``: whether two answers agree (``same`` within ``rel`` unless given)."""
    eq = eq or functools.partial(same, rel=rel)
    i = next((i for i, (g, r) in enumerate(zip(got, right)) if not eq(g, r)), None)
    if i is None:
        return None
    g, r = got[i], right[i]
    every = (hint for model, hint in mistakes if all(eq(a, model(*c)) for c, a in zip(cases, got)))
    this = (hint for model, hint in mistakes if eq(g, model(*cases[i])) and not eq(r, model(*cases[i])))
    return cases[i], g, r, next(itertools.chain(every, this), None)


def case_miss(fn, cases, asked: str, right_of, mistakes=(), rel: float = 1e-9):
    """``wrong_case`` for the learner's numbers on every case (``case_answers``), the right ones worked out only
    then, each ``right_of(*case)``."""
    got = case_answers(fn, cases, asked)
    return wrong_case(cases, got, [right_of(*c) for c in cases], mistakes, rel)


def not_attempted_if_none(fn, *args) -> None:
    """A learner's function whose body is still ``...`` returns None: that is 'not attempted', not wrong."""
    if fn(*args) is None:
        raise NotAttempted()


def _no_limit_reason():
    if _setitimer is None or _SIGALRM is None:
        return "this system has no SIGALRM timer (Windows)"
    if threading.current_thread() is not threading.main_thread():
        return "the check runs off the main thread, where no signal can stop it"
    return None


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_SAID = set()


_SHIELDED = [0]  # > 0 while labkit sets up or tears down shared state the time limit must not cut


@contextlib.contextmanager
def shielded():
    """Hold the time limit off while labkit sets up or tears down what outlives a check (a process
    group, a lock): cut half-way, it would break every later check in the kernel. The timer repeats,
    so the limit strikes right after."""
    _SHIELDED[0] += 1
    try:
        yield
    finally:
        _SHIELDED[0] -= 1


def _alarm_blocked() -> bool:
    return _sigmask is not None and _SIGALRM in _sigmask(_SIG_BLOCK, [])


def _timer_changed(handler, seconds: float, interval: float, start: float):
    """What the learner's code changed about the check's time limit while it ran, or None: the alarm's
    handler replaced, the alarm blocked, the interval timer stopped, slowed or set later, or labkit's
    shield (which holds the limit off) left raised."""
    if _get_handler(_SIGALRM) is not handler:
        return "the SIGALRM handler (signal.signal)"
    if _alarm_blocked():
        return "SIGALRM blocked (signal.pthread_sigmask)"
    if _SHIELDED[0]:
        return "labkit's time-limit shield (_core._SHIELDED)"
    delay, every = _getitimer(_ITIMER_REAL)
    left = seconds - (_monotonic() - start)
    # not yet fired: about `left` to go; fired (the limit held off in an import): at most one interval
    if delay <= 0 or abs(every - interval) > 1e-3 or delay > max(left, interval) + 0.05:
        return "the interval timer (signal.setitimer or signal.alarm)"
    return None


@contextlib.contextmanager
def deadline(seconds):
    """Raise TimeUp in the main thread after ``seconds`` (a SIGALRM timer): the learner's function is
    defined in the notebook, so it cannot be pickled to a process we could kill, and a thread cannot be
    stopped. Where no timer can be used, say so once and run without a limit. Any previous SIGALRM
    handler and timer are put back afterwards. Code inside that stops, blocks or replaces the timer is
    found afterwards (Tampered), and a block that outlasted ``seconds`` anyway ends in TimeUp."""
    why = None if seconds else "the time limit is switched off"
    why = why or _no_limit_reason()
    if why:
        if why not in _SAID:
            _SAID.add(why)
            print(f"labkit.check: no time limit on your code here ({why}); if a check never finishes, "
                  "interrupt the kernel.", file=sys.stderr)
        yield
        return
    armed = [True]

    def on_alarm(signum, frame):
        # never inside an import: a module cut off half-way stays broken in sys.modules for the whole
        # kernel. The timer repeats, so the next tick comes once the import is done.
        if armed[0] and not _importing(frame) and not _SHIELDED[0]:
            raise TimeUp(seconds)

    interval = min(1.0, seconds)  # repeats: code that swallows the first TimeUp with a bare `except:` gets another
    start = _monotonic()
    old_handler = _set_handler(_SIGALRM, on_alarm)
    old_delay, old_interval = _setitimer(_ITIMER_REAL, seconds, interval)
    try:
        yield
    finally:
        armed[0] = False
        changed = _timer_changed(on_alarm, seconds, interval, start)  # before it is stopped here
        _setitimer(_ITIMER_REAL, 0)
        if changed:  # put back what the learner's code changed: ours, disarmed, takes an alarm still pending
            _SHIELDED[0] = 0
            _set_handler(_SIGALRM, on_alarm)
            if _sigmask is not None:
                _sigmask(_SIG_UNBLOCK, [_SIGALRM])
        _set_handler(_SIGALRM, old_handler if old_handler is not None else _SIG_DFL)
        if old_delay:  # someone else's timer was running: re-arm it with what it had left
            left = old_delay - (_monotonic() - start)
            _setitimer(_ITIMER_REAL, max(left, 1e-6), old_interval)
        if changed:
            raise Tampered([changed], limit_only=True)
    if _monotonic() - start > seconds:  # the limit was held off (an import, labkit's set-up) past its end
        raise TimeUp(seconds)


def _limit() -> float:
    """TIME_LIMIT_S, refused when something switched it off or raised it past its ceiling."""
    limit = TIME_LIMIT_S
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not 0 < limit <= MAX_TIME_LIMIT_S:
        raise Tampered([f"labkit.check._core.TIME_LIMIT_S = {limit!r}"])
    if _SHIELDED[0]:  # no labkit set-up is open between checks: something holds the limit off for good
        raise Tampered(["labkit.check._core._SHIELDED"])
    if _setitimer is not None and threading.current_thread() is threading.main_thread() and _alarm_blocked():
        raise Tampered(["SIGALRM blocked (signal.pthread_sigmask)"])
    return float(limit)


def _outcome(name, fn, args, kwargs):
    """Run one check: (its result, what it found tampered with or []). Never raises, but for Ctrl-C."""
    try:
        if args and unanswered(args[0]):
            raise NotAttempted()
        limit = _limit()
        try:
            with deadline(limit):
                passed, message = fn(*args, **kwargs)
        except TimeUp:
            raise AnswerError(WORDS.say("timeout", seconds=f"{limit:g}", loop="`while`")) from None
        except SystemExit as e:  # exit() in the learner's code must not end the check (or the kernel)
            call = f"exit() or sys.exit({'' if e.code is None else repr(e.code)})"
            raise AnswerError(WORDS.say("exit", call=call)) from None
        return CheckResult(name, bool(passed), message), []
    except Tampered as e:
        return CheckResult(name, False, str(e), tampered=True), e.what
    except NotAttempted as e:
        return CheckResult(name, False, str(e) or WORDS.say("write-answer"), attempted=False), []
    except AnswerError as e:
        return CheckResult(name, False, str(e)), []
    except Exception as e:  # noqa: BLE001 -- a learner's code may fail in any way
        last = traceback.extract_tb(e.__traceback__)[-1]
        return CheckResult(name, False, WORDS.say("raised", error=f"{type(e).__name__}: {e}", line=last.lineno)), []


def _tampered(name, what) -> CheckResult:
    return CheckResult(name, False, str(Tampered(what)), tampered=True)


DRILL_PREFIX = "drill "


def _log_api():
    """The functions that write and read the grade log, with its signer in their closures (not in the module)."""
    record, rows, reset = _make_log()

    def checker(fn):
        """Wrap a checker so it never raises in a notebook (any error becomes a failing result + hint), under a
        deadline of TIME_LIMIT_S, with the seal read before the check and again after the learner's code has run.
        The answer, when it is plain data, is kept in the signed log for a grader to judge again."""
        name = fn.__name__
        # bound now, in this closure: rebinding _core's names later changes nothing a check calls
        changes, outcome, tampered, answer = _guard.changes, _outcome, _tampered, _answer

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            given_answer = answer(args, kwargs)  # before the check: the learner's code may change a list it got
            what = changes()
            if what:  # changed before the check: the learner's code is not run at all
                res = tampered(name, what)
            else:
                res, what = outcome(name, fn, args, kwargs)
                what = changes() or what  # what the learner's code changed while it ran
                if what and not res.tampered:
                    res = tampered(name, what)
            record({"exercise": name, "passed": res.passed, "attempted": res.attempted,
                    "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
                    "note": f"tampered with: {', '.join(what[:4])}" if what else "", "answer": given_answer})
            return res

        wrapped.is_checker = True
        return wrapped

    def record_drill(case_id: str, passed: bool, attempted: bool, note: str) -> None:
        """A drill's row in the grade log (``lk.drills``' score card), signed like a check's, so ``export_csv``
        writes it beside them. Its exercise reads "drill <case id>": no checker has a space in its name, so a
        drill's row can never stand in for a check's."""
        if not isinstance(case_id, str) or not case_id or " " in case_id:
            raise ValueError(f"case_id={case_id!r}: a drill case's id (no spaces)")
        record({"exercise": DRILL_PREFIX + case_id, "passed": bool(passed), "attempted": bool(attempted),
                "timestamp": datetime.datetime.now().isoformat(timespec="seconds"), "note": str(note)[:200],
                "answer": None})

    def history() -> list:
        """Every check run in this kernel, oldest first (exercise, passed, attempted, timestamp, note); an entry
        that no check recorded is shown as failed, with a note."""
        return rows()

    def reset_history():
        reset()

    def export_csv(path, learner: str | None = None) -> str:
        """One CSV per learner: learner, exercise, passed, attempted, timestamp, note (every check run). A row no
        check recorded, or checks removed, are written as failed, with a note; a cell a spreadsheet would read as a
        formula gets a ``'`` before it (``csv_cell``). Written atomically."""
        learner = learner or getpass.getuser()
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=_FIELDS, lineterminator="\n")
        w.writeheader()
        for row in rows():
            w.writerow({k: csv_cell(v) for k, v in {"learner": learner, **row}.items()})
        return str(write_atomic(path, buf.getvalue()))

    def export_for_grader(path, learner: str | None = None) -> str:
        """The log as JSON for ``labkit grade``: the rows of ``export_csv`` with each check's plain answer
        (``answer``), which the grader judges again in its own process."""
        doc = {"learner": learner or getpass.getuser(), "rows": rows(answers=True)}
        return str(write_atomic(path, _dumps(doc, default=str) + "\n"))

    return checker, record_drill, history, reset_history, export_csv, export_for_grader


checker, record_drill, history, reset_history, export_csv, export_for_grader = _log_api()


def seal():
    """Seal labkit as it is now (idempotent; the package calls it once every checker is imported)."""
    _guard.seal()
