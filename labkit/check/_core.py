"""What every checker shares: a result that prints nicely, 'not attempted' handling, a grade log."""
from __future__ import annotations

import csv
import datetime
import functools
import getpass
import traceback
from dataclasses import dataclass

_LOG: list = []


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
    """Raised inside a checker when the learner's answer is still the placeholder (None / ...)."""


def unanswered(answer) -> bool:
    return answer is None or answer is Ellipsis or answer == "" or answer == "TODO"


def checker(fn):
    """Wrap a checker so it never raises in a notebook: any error becomes a failing result + hint."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            if args and unanswered(args[0]):
                raise NotAttempted()
            passed, message = fn(*args, **kwargs)
            res = CheckResult(name, bool(passed), message)
        except NotAttempted:
            res = CheckResult(name, False, "write your answer in the cell above, then run this cell again",
                              attempted=False)
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
