"""What every checker shares: a result that prints nicely, 'not attempted' handling, answers of the wrong
type named as such, a time limit on the learner's code, a grade log."""
from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import getpass
import math
import numbers
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

_LOG: list = []

# Seconds a check may run before the learner's code is stopped. Every checker finishes the reference
# solutions in a few seconds on 2 CPU cores, so only code that loops forever reaches this. Tests lower it.
TIME_LIMIT_S = 30.0


@dataclass
class CheckResult:
    name: str
    passed: bool
    message: str
    attempted: bool = True

    def __bool__(self):
        return self.passed

    def __repr__(self):
        mark = "✅ PASS" if self.passed else ("… not attempted yet" if not self.attempted else "❌ not yet")
        return f"{mark} [{self.name}] {self.message}"

    def _repr_markdown_(self):
        mark = "✅ **Pass**" if self.passed else ("⏳ **Not attempted yet**" if not self.attempted else "❌ **Not yet**")
        return f"{mark} — `{self.name}`: {self.message}"


class NotAttempted(Exception):
    """Raised inside a checker when the learner's answer is still the placeholder (None / ...) or the
    exercise's starting code; an optional message replaces the default 'write your answer' hint."""


class AnswerError(Exception):
    """The answer (or what the learner's function returned) has the wrong type or form. Its message is
    shown as it is: the fault is the value, not a crash in the learner's code."""


class TimeUp(BaseException):
    """The check's deadline passed. A BaseException, so a learner's `except Exception:` cannot swallow it."""


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
    """A learner's number as a float. Anything else -- a str, a bool, a list, nan -- is an AnswerError that
    says what came (``source`` + the value) and what is wanted (``want``), e.g. 'your answer is a str
    ('208'); give a number in GB'."""
    if not isinstance(value, numbers.Real) and callable(getattr(value, "item", None)):
        with contextlib.suppress(Exception):  # a one-element tensor or array stands for its number
            value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AnswerError(f"{source} {describe(value)}; {want}")
    if not math.isfinite(value):
        raise AnswerError(f"{source} {value!r}; {want} (a finite one)")
    return float(value)


def _no_limit_reason():
    if not hasattr(signal, "setitimer") or not hasattr(signal, "SIGALRM"):
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


@contextlib.contextmanager
def deadline(seconds):
    """Raise TimeUp in the main thread after ``seconds`` (a SIGALRM timer): the learner's function is
    defined in the notebook, so it cannot be pickled to a process we could kill, and a thread cannot be
    stopped. Where no timer can be used, say so once and run without a limit. Any previous SIGALRM
    handler and timer are put back afterwards."""
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

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    # repeats every second: code that swallows the first TimeUp with a bare `except:` gets another
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds, min(1.0, seconds))
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
        if old_delay:  # someone else's timer was running: re-arm it with what it had left
            left = old_delay - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), old_interval)


def checker(fn):
    """Wrap a checker so it never raises in a notebook: any error becomes a failing result + hint. The
    check runs under a deadline of TIME_LIMIT_S (see ``deadline``); Ctrl-C still stops it."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            if args and unanswered(args[0]):
                raise NotAttempted()
            limit = TIME_LIMIT_S
            try:
                with deadline(limit):
                    passed, message = fn(*args, **kwargs)
            except TimeUp:
                raise AnswerError(f"your code did not finish in {limit:g} s: look for a loop that never ends "
                                  "(a `while` whose condition never turns false), then run the check again.") from None
            except SystemExit as e:  # exit() in the learner's code must not end the check (or the kernel)
                raise AnswerError(f"your code called exit() or sys.exit({'' if e.code is None else repr(e.code)}): "
                                  "the check runs your code in this notebook, so return a value instead.") from None
            res = CheckResult(name, bool(passed), message)
        except NotAttempted as e:
            res = CheckResult(name, False, str(e) or "write your answer in the cell above, then run this cell again",
                              attempted=False)
        except AnswerError as e:
            res = CheckResult(name, False, str(e))
        except Exception as e:  # noqa: BLE001 -- a learner's code may fail in any way
            last = traceback.extract_tb(e.__traceback__)[-1]
            res = CheckResult(name, False, f"your code raised {type(e).__name__}: {e} (line {last.lineno}). "
                              "Fix it and run the check again.")
        _LOG.append({"exercise": name, "passed": res.passed, "attempted": res.attempted,
                     "timestamp": datetime.datetime.now().isoformat(timespec="seconds")})
        return res

    wrapped.is_checker = True
    return wrapped


def history() -> list:
    return list(_LOG)


def reset_history():
    _LOG.clear()


def export_csv(path, learner: str | None = None) -> str:
    """One CSV per learner: learner, exercise, passed, attempted, timestamp (every check run)."""
    learner = learner or getpass.getuser()
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["learner", "exercise", "passed", "attempted", "timestamp"])
        w.writeheader()
        for row in _LOG:
            w.writerow({"learner": learner, **row})
    return str(path)
