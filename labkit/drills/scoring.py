"""A drill's rules, as plain functions the widget and the command line share: which case (seeded), the
multiple choice (causes and fixes, shuffled by the seed), the timer (its clock injectable), the score and
the score card.

A fix is a key: a knob change as ``"field=value"`` (several joined by ``", "``), a code-level mistake's
``code_fix`` words, or ``NO_FIX``. The menu is built from the catalogue, so every case's right fix is in it
and so are every other case's -- the distractors are real fixes of real mistakes.
"""
from __future__ import annotations

import datetime
import functools
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from ..base.runtime import ConfigError
from ..base.numfmt import is_number
from ..base.page import anchor
from ..base.phrases import notebooks_dir
from .bank import CASES, PAGE, Case

NO_FIX = PAGE.say("no-fix")  # the page's words ("nothing to fix"), in the learner's language as HEALTHY is
DEFAULT_LIMIT_S = 180.0  # the timer: three minutes, an interviewer's patience for one diagnosis
SCHEMA = "labkit-drill-scorecard/1"


def knob_label(fix: dict) -> str:
    """{"micro_batch": 8, "accum": 1} -> 'micro_batch=8, accum=1' (the knobs in the catalogue's order)."""
    return ", ".join(f"{k}={v}" for k, v in fix.items())


def check_case(case, field_name: str = "case") -> Case:
    """``case`` when it is a drills Case; else a ConfigError naming it (before any work)."""
    if not isinstance(case, Case):
        raise ConfigError(field_name, case, "a drills Case: lk.drills.case_by_id(id) gives one, "
                                            "lk.drills.CASES lists them")
    return case


def check_seconds(field_name: str, v, limit: bool = False):
    """Seconds as a finite number >= 0 (a time limit: > 0, or None for no limit); else a ConfigError."""
    if limit and v is None:
        return None
    if not is_number(v) or not math.isfinite(v) or v < 0 or (limit and v == 0):
        allowed = "seconds > 0 (finite), or None for no time limit" if limit else "seconds, a finite number >= 0"
        raise ConfigError(field_name, v, allowed)
    return float(v)


def _check_choice(field_name: str, v):
    if v is not None and not isinstance(v, str):
        raise ConfigError(field_name, v, "a string of the drill's choices, or None (no answer)")
    return v


# A score card row: each key and the type it holds (``score`` makes them; ``card`` and ``record`` read them).
ROW_TYPES = {"case": (str,), "cause_right": (bool,), "fix_right": (bool,), "seconds": (float, int),
             "timed_out": (bool,), "answer_cause": (str, type(None)), "answer_fix": (str, type(None)),
             "right_cause": (str,), "right_fix": (str,)}


def check_row(row, where: str = "rows[0]") -> dict:
    """A score card row as ``score`` makes it (an "index" key may come with it); else a ConfigError
    naming the row and the key."""
    if not isinstance(row, dict):
        raise ConfigError(where, row, "a score card row (a dict from lk.drills.score)")
    for key, types in ROW_TYPES.items():
        v = row.get(key, ...)
        bad = v is ... or not isinstance(v, types) or (bool not in types and isinstance(v, bool))
        if bad or (key == "seconds" and (not math.isfinite(v) or v < 0)):
            raise ConfigError(f"{where}[{key!r}]", None if v is ... else v,
                              "seconds, a finite number >= 0" if key == "seconds" else
                              f"{' or '.join('None' if t is type(None) else t.__name__ for t in types)} "
                              "(a row from lk.drills.score)")
    return row


def fix_key(case: Case) -> str:
    """The right fix of ``case``: its code change, its knob change, or NO_FIX for a healthy case."""
    check_case(case)
    if case.healthy:
        return NO_FIX
    return case.code_fix or case.fix_words or knob_label(case.fix)


def all_fixes() -> dict:
    """{fix key: the knob change it makes ({} for a code change or NO_FIX)}, in catalogue order."""
    out = {}
    for c in CASES:
        if not c.healthy:
            out.setdefault(fix_key(c), {} if c.code_fix else dict(c.fix))
    out[NO_FIX] = {}
    return out


def runnable(gpu: Optional[bool] = None) -> list:
    """The cases this machine can show: all of them with a GPU, else those a CPU can (``needs_gpu`` empty)."""
    if gpu is None:
        gpu = torch.cuda.is_available()
    return [c for c in CASES if gpu or not c.needs_gpu]


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0 (the same seed gives the same drills in the same order)")
    return seed


def _check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100:
        raise ConfigError("n", n, "an integer from 1 to 100 (drills in the gauntlet)")
    return n


def _check_pool(pool) -> list:
    """A pool to draw from: a non-empty list of Cases (an empty one would never fill the gauntlet)."""
    cases = [] if isinstance(pool, (str, bytes, dict)) or not hasattr(pool, "__iter__") else list(pool)
    if not cases:
        raise ConfigError("pool", pool, "a non-empty list of drills Cases (e.g. lk.drills.scoring.runnable())")
    for i, c in enumerate(cases):
        check_case(c, f"pool[{i}]")
    return cases


def draw(seed: int = 0, n: int = 1, pool: Optional[list] = None, exclude=()) -> list:
    """``n`` cases for a gauntlet seeded ``seed``: the same seed gives the same cases in the same order on
    every machine -- the default pool is the cases a CPU can show, so a class with and without GPUs gets one
    gauntlet (pass ``pool=runnable()`` for the GPU cases too). Without repeats while the pool lasts;
    reshuffled after. ``exclude``: cases (or ids) left out of the pool (``gauntlet_draw``)."""
    _check_seed(seed)
    _check_n(n)
    pool = list(runnable(gpu=False) if pool is None else _check_pool(pool))
    left = {c if isinstance(c, str) else check_case(c, "exclude").id for c in exclude}
    pool = [c for c in pool if c.id not in left]
    if not pool:
        raise ConfigError("exclude", sorted(left), "cases that leave at least one of the pool to draw")
    rng, out = random.Random(f"labkit-drills:{seed}"), []
    while len(out) < n:
        out += rng.sample(pool, len(pool))
    return out[:n]


def gauntlet_draw(seed: int = 0, n: int = 10, pool: Optional[list] = None) -> list:
    """The gauntlet of ``seed``: ``n`` cases drawn as ``draw`` does, never the case the single drill of the
    same seed shows (``draw(seed, 1)``): the notebook shows that drill right above its gauntlet, and the
    gauntlet would open on the drill just answered, its losses and all."""
    return draw(seed, n, pool, exclude=draw(seed, 1, pool))


def options(case: Case, seed: int = 0) -> tuple:
    """(causes, fixes): every cause of the catalogue and every fix key, each list shuffled by the seed and
    the case (so two drills of one gauntlet do not share an order)."""
    check_case(case)
    _check_seed(seed)
    causes = list(dict.fromkeys(c.cause for c in CASES))
    fixes = list(all_fixes())
    rng = random.Random(f"labkit-drills:{seed}:{case.id}")
    rng.shuffle(causes)
    rng.shuffle(fixes)
    return causes, fixes


class Timer:
    """A countdown of ``limit_s`` seconds (None: no limit, for self-study) from ``start()``. ``clock`` is
    what tells the time (tests give a fake one; a drill uses ``time.monotonic``)."""

    def __init__(self, limit_s: Optional[float] = DEFAULT_LIMIT_S, clock: Callable[[], float] = time.monotonic):
        if limit_s is not None and (isinstance(limit_s, bool) or not isinstance(limit_s, (int, float))
                                    or not 0 < limit_s <= 86_400):
            raise ConfigError("timer", limit_s, "seconds from 1 to 86400, or None (no time limit)")
        self.limit_s, self.clock, self.started, self.stopped = limit_s, clock, None, None

    def start(self) -> "Timer":
        self.started, self.stopped = self.clock(), None
        return self

    def stop(self) -> float:
        """Stop the clock (the answer is in); returns the seconds taken."""
        if self.stopped is None:
            self.stopped = self.clock()
        return self.elapsed()

    def elapsed(self) -> float:
        if self.started is None:
            return 0.0
        return (self.stopped if self.stopped is not None else self.clock()) - self.started

    def left(self) -> Optional[float]:
        return None if self.limit_s is None else max(0.0, self.limit_s - self.elapsed())

    def expired(self) -> bool:
        return self.limit_s is not None and self.started is not None and self.elapsed() >= self.limit_s


def score(case: Case, cause: Optional[str], fix: Optional[str], seconds: float,
          limit_s: Optional[float] = DEFAULT_LIMIT_S) -> dict:
    """One drill's row of the score card. An answer after ``limit_s`` (or none at all) is timed out: it
    scores nothing, whatever it says. ``limit_s`` None: no time limit."""
    check_case(case)
    cause, fix = _check_choice("cause", cause), _check_choice("fix", fix)
    seconds, limit_s = check_seconds("seconds", seconds), check_seconds("limit_s", limit_s, limit=True)
    timed_out = cause is None or (limit_s is not None and seconds >= limit_s)
    right_fix = fix_key(case)
    return {"case": case.id, "cause_right": not timed_out and cause == case.cause,
            "fix_right": not timed_out and fix == right_fix, "seconds": round(float(seconds), 1),
            "timed_out": bool(timed_out), "answer_cause": cause, "answer_fix": fix,
            "right_cause": case.cause, "right_fix": right_fix}


def card(rows: list, seed: Optional[int] = None, limit_s: Optional[float] = None, device: str = "",
         stopped: bool = False) -> dict:
    """The score card of a gauntlet (or one drill), as saved in JSON (``stopped``: ended early by Ctrl-C
    or Stop, the rows are the drills answered before)::

        {"schema": "labkit-drill-scorecard/1", "seed": int | null, "timer_s": float | null,
         "device": str, "finished": ISO time, "stopped": bool,
         "drills": [{"index": 1, "case": id, "cause_right": bool, "fix_right": bool, "seconds": float,
                     "timed_out": bool, "answer_cause": str | null, "answer_fix": str | null,
                     "right_cause": str, "right_fix": str}, ...],
         "totals": {"drills": int, "causes_right": int, "fixes_right": int, "both_right": int,
                    "timed_out": int, "seconds": float, "median_seconds": float | null},
         "missed": [{"index", "case", "timed_out", "answer_cause", "answer_fix", "right_cause", "right_fix",
                     "chapter": "06", "notebook": "06_....ipynb", "heading": str, "href": "06_....ipynb#anchor"},
                    ...]}

    ``missed`` lists the drills not answered right in both cause and fix, each with the section of the course
    that teaches it (``where_taught``)."""
    if isinstance(rows, (str, bytes, dict)) or not hasattr(rows, "__iter__"):
        raise ConfigError("rows", rows, "a list of score card rows (from lk.drills.score)")
    rows = [check_row(r, f"rows[{i}]") for i, r in enumerate(rows)]
    if seed is not None:
        _check_seed(seed)
    limit_s = check_seconds("limit_s", limit_s, limit=True)
    if not isinstance(device, str):
        raise ConfigError("device", device, "the machine in words (a string)")
    drills = [{"index": i + 1, **r} for i, r in enumerate(rows)]
    secs = [r["seconds"] for r in rows if not r["timed_out"]]
    totals = {"drills": len(rows), "causes_right": sum(r["cause_right"] for r in rows),
              "fixes_right": sum(r["fix_right"] for r in rows),
              "both_right": sum(r["cause_right"] and r["fix_right"] for r in rows),
              "timed_out": sum(r["timed_out"] for r in rows), "seconds": round(sum(r["seconds"] for r in rows), 1),
              "median_seconds": round(statistics.median(secs), 1) if secs else None}
    return {"schema": SCHEMA, "seed": seed, "timer_s": limit_s, "device": device,
            "finished": datetime.datetime.now().isoformat(timespec="seconds"), "stopped": bool(stopped),
            "drills": drills, "totals": totals, "missed": [_missed(d) for d in drills
                                                            if not (d["cause_right"] and d["fix_right"])]}


MISSED_KEYS = ("index", "case", "timed_out", "answer_cause", "answer_fix", "right_cause", "right_fix")


def _missed(row: dict) -> dict:
    """A missed drill of the card: the learner's answer beside the right one, and where the course teaches it."""
    case = next((c for c in CASES if c.id == row["case"]), None)
    if case is None:
        raise ConfigError(f"rows[{row['index'] - 1}]['case']", row["case"], "a drill case's id (lk.drills.CASES)")
    taught = where_taught(case)
    return {**{k: row[k] for k in MISSED_KEYS}, **{k: taught[k] for k in ("chapter", "notebook", "heading", "href")}}


def row_words(row, plain: bool = False) -> str:
    """A score card row as the drill says it: the page's time-up or scored sentence, marked ✔/✘ in the
    widget, in words (``plain``) in a terminal, whose encoding may not have the marks."""
    if row["timed_out"]:
        return PAGE.say("time-up", seconds=f"{row['seconds']:g}", cause=row["right_cause"], fix=row["right_fix"])
    right, wrong = ("word-right", "word-wrong") if plain else ("mark-right", "mark-wrong")
    mark = {True: PAGE.say(right), False: PAGE.say(wrong)}
    return PAGE.say("scored", cause_mark=mark[row["cause_right"]], fix_mark=mark[row["fix_right"]],
                    cause=row["right_cause"], fix=row["right_fix"], seconds=f"{row['seconds']:g}")


def card_words(c: dict) -> str:
    """'7 of 10 causes right, 5 fixes right, 1 timed out; median 74 s an answer' -- the card in a line."""
    t = c["totals"]
    words = PAGE.say("card", causes=t["causes_right"], drills=t["drills"], fixes=t["fixes_right"], both=t["both_right"],
                     timed_out=t["timed_out"])
    if t["median_seconds"] is not None:
        words += "; " + PAGE.say("card-median", seconds=f"{t['median_seconds']:g}")
    return words + (" " + PAGE.say("card-stopped") if c.get("stopped") else "")


# Where the course teaches a drill: the chapter notebook and the section heading above the cell a case
# names in ``teaches`` -- what the score card links to, since JupyterLab shows a chapter's headings and never
# its cell tags. Read from the course's own notebooks, so a renamed heading is followed, not remembered.
@functools.lru_cache(maxsize=None)
def _sections(folder: Path, chapter: str) -> tuple:
    """(notebook file name, {tag: the heading above it}) of chapter ``chapter`` ("06") in ``folder``."""
    found = sorted(folder.glob(f"{chapter}_*.ipynb"))
    if not found:
        return "", {}
    heading, under = "", {}
    for cell in json.loads(found[0].read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            lines = [ln for ln in "".join(cell["source"]).splitlines() if ln.startswith("#")]
            heading = lines[-1].lstrip("#").strip() if lines else heading
        for tag in cell.get("metadata", {}).get("tags", []):
            under[tag] = heading
    return found[0].name, under


def where_taught(case: Case) -> dict:
    """{"tag", "chapter", "notebook", "heading", "href"} for ``case``: ``href`` is the notebook and the
    heading's anchor, relative (the chapters sit beside the interview notebook in a checkout's notebooks/
    and in a folder ``labkit course`` made). Without the notebooks at hand: the chapter alone, "" for the
    rest."""
    chapter = case.teaches.split("-")[1]
    folder = notebooks_dir()
    notebook, under = _sections(folder, chapter) if folder is not None else ("", {})
    heading = under.get(case.teaches, "")
    href = f"{notebook}#{anchor(heading)}" if notebook and heading else notebook
    return {"tag": case.teaches, "chapter": chapter, "notebook": notebook, "heading": heading, "href": href}


__all__ = ["NO_FIX", "DEFAULT_LIMIT_S", "SCHEMA", "check_case", "check_row", "check_seconds", "fix_key", "all_fixes",
           "runnable", "draw", "gauntlet_draw", "options", "Timer",
           "score", "card", "card_words", "row_words", "knob_label", "where_taught"]
