"""One drill, start to end, as plain code the widget and the command line share: its rules (the draw, the
choices shuffled by the seed, the timer with an injectable clock, the score and the score card, the chapter
section the card links), an ``Attempt`` (run the case and, hidden, its healthy twin, take an answer against the
timer, score it, reveal), the card saved or recorded, and ``python -m labkit drill``.

    a = Attempt(seed=3, timer=180)
    a.run()                       # the case and its twin; the timer starts when the evidence is ready
    a.answer(a.causes[0], a.fixes[2])   # the score card's row (timed out when the time was up)
    a.reveal()                    # the learner's fix against the right one, measured
"""
from __future__ import annotations

import datetime
import json
import math
import random
import statistics
import sys
import time
from typing import Callable, Optional

import torch

from ..base.runtime import ConfigError
from ..base.numfmt import is_number
from ..base.paths import write_atomic
from ..check import _core
from ..engine.device import capabilities
from .bank import CASES, PAGE, Case, all_fixes, check_case, fix_key, where_taught
from .evidence import case_by_id, evidence_rows, reveal, run_case

DEFAULT_LIMIT_S = 180.0  # the timer: three minutes, an interviewer's patience for one diagnosis
SCHEMA = "labkit-drill-scorecard/1"
say = PAGE.say


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
        raise ConfigError("pool", pool, "a non-empty list of drills Cases (e.g. lk.drills.attempt.runnable())")
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


class Attempt:
    """One drill: ``case`` (an id or a Case; None: drawn from ``seed``), ``timer`` seconds (None: no limit),
    ``clock`` for the timer (tests inject one). ``causes`` and ``fixes`` are the choices, shuffled by the seed."""

    def __init__(self, case=None, seed: int = 0, timer: Optional[float] = DEFAULT_LIMIT_S,
                 clock: Callable[[], float] = time.monotonic):
        _check_seed(seed)  # first: the seed shuffles the choices even when the case is named
        if not callable(clock):
            raise ConfigError("clock", clock, "a function returning seconds (time.monotonic)")
        self.case = draw(seed, 1)[0] if case is None else case_by_id(case)
        self.seed = seed
        self.timer = Timer(timer, clock)
        self.causes, self.fixes = options(self.case, seed)
        self.evidence = self.twin = self.row = self.revealed = None
        self.run_s = None

    def cannot_show_here(self) -> str:
        """Why this machine cannot show the case's mistake (``Case.needs_gpu``: a case named by id may be one
        the draw leaves out here), "" when it can: said before the run, not discovered from its evidence."""
        return "" if self.case in runnable() else self.case.needs_gpu

    def run(self, progress: Optional[Callable[[int, int, str], None]] = None) -> dict:
        """Run the case, then (hidden) its healthy twin; start the timer. ``progress(done, total, words)``."""
        t0 = time.perf_counter()
        told = progress or (lambda done, total, words: None)
        told(0, 2, say("running-case"))
        self.evidence = run_case(self.case, "case")
        told(1, 2, say("running-twin"))
        self.twin = run_case(self.case, "twin")
        told(2, 2, say("ready"))
        self.run_s = time.perf_counter() - t0
        self.timer.start()
        return self.evidence

    def time_up(self) -> Optional[dict]:
        """When the time is up and no answer is in: lock the drill, scored as timed out. Returns the row."""
        if self.row is None and self.timer.expired():
            self.timer.stop()
            self.row = score(self.case, None, None, self.timer.elapsed(), self.timer.limit_s)
        return self.row

    def answer(self, cause: Optional[str], fix: Optional[str]) -> dict:
        """Lock in an answer (a cause of ``causes``, a fix of ``fixes``) and score it; a second answer changes
        nothing (the first row is returned)."""
        if self.evidence is None:
            raise ConfigError("answer", cause, "an answer after the drill ran: call run() first")
        if self.time_up() is not None or self.row is not None:
            return self.row
        if cause is not None and cause not in self.causes:
            raise ConfigError("cause", cause, "one of the drill's causes: " + "; ".join(self.causes))
        if fix is not None and fix not in self.fixes:
            raise ConfigError("fix", fix, "one of the drill's fixes: " + "; ".join(self.fixes))
        seconds = self.timer.stop()
        self.row = score(self.case, cause, fix, seconds, self.timer.limit_s)
        return self.row

    def reveal(self, progress=False) -> dict:
        """The learner's fix (none when timed out) against the right fix, measured (``drills.evidence.reveal``;
        ``progress``: True for a progress line, or a function told each run's progress)."""
        if self.row is None:
            raise ConfigError("reveal", None, "an answer first (answer(), or the time running out)")
        if self.revealed is None:
            self.revealed = reveal(self.case, self.row["answer_fix"], case_evidence=self.evidence, progress=progress)
            self.revealed["twin"] = self.twin
        return self.revealed


def device_words() -> str:
    """'cpu (AMD EPYC ...)': the machine a score card was measured on."""
    caps = capabilities("auto")
    return f"{caps.kind} ({caps.name})"


def _not_json(v, where: str):
    """(where, value) of the first value in ``v`` that strict JSON cannot hold (NaN, inf, a non-string
    key, an object), or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return where, v
    if isinstance(v, dict):
        for k, x in v.items():
            found = _not_json(k, where) if not isinstance(k, str) else _not_json(x, f"{where}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(v, (list, tuple)):
        return next((f for i, x in enumerate(v) if (f := _not_json(x, f"{where}[{i}]"))), None)
    return None if v is None or isinstance(v, (str, int, float, bool)) else (where, v)


def _check_card(scorecard) -> dict:
    """A score card (``card``): a dict whose "drills" are score card rows."""
    drills = scorecard.get("drills") if isinstance(scorecard, dict) else None
    if not isinstance(drills, list):
        raise ConfigError("scorecard", type(scorecard).__name__ if not isinstance(scorecard, dict) else
                          "no 'drills' list", "a score card: a dict from lk.drills.card(rows)")
    for i, r in enumerate(drills):
        check_row(r, f"scorecard['drills'][{i}]")
    return scorecard


def save_card(path, scorecard: dict) -> str:
    """Write the score card (``card``) as strict JSON (no NaN), atomically; returns the path."""
    _check_card(scorecard)
    found = _not_json(scorecard, "scorecard")
    if found:
        raise ConfigError(found[0], found[1], "finite numbers, strings, booleans, None, lists and dicts (strict JSON)")
    return str(write_atomic(path, json.dumps(scorecard, indent=1, allow_nan=False) + "\n"))


def record(scorecard: dict) -> int:
    """Add each drill of the score card to the kernel's grade log, so ``lk.check.export_csv`` exports it
    (exercise "drill <case id>": passed when cause and fix were right). Returns the rows recorded."""
    _check_card(scorecard)  # every row before the first is recorded: no half-recorded card
    for i, r in enumerate(scorecard["drills"]):
        if not r["case"] or " " in r["case"]:
            raise ConfigError(f"scorecard['drills'][{i}]['case']", r["case"], "a drill case's id (no spaces)")
    for r in scorecard["drills"]:
        mark = {True: say("word-right"), False: say("word-wrong")}
        words = (say("log-timed-out", seconds=f"{r['seconds']:g}") if r["timed_out"] else
                 say("log-scored", cause=mark[r["cause_right"]], fix=mark[r["fix_right"]], seconds=f"{r['seconds']:g}"))
        _core.record_drill(r["case"], r["cause_right"] and r["fix_right"], not r["timed_out"], words)
    return len(scorecard["drills"])


# ``python -m labkit drill``: the drills as text. The evidence is printed, the causes and fixes numbered,
# the answer typed as "CAUSE,FIX" (numbers) -- or given up front with ``--answer`` (once per drill), which is
# how tests and scripts run it -- then the score and the reveal. ``--out`` writes the score card as JSON.
GAUNTLET_N = 10


def parse_answer(text: str, n_causes: int, n_fixes: int) -> tuple:
    """'3,5' (or '3 5') -> (3, 5), each within its list; anything else is a ConfigError naming the answer."""
    parts = text.replace(",", " ").split()
    ok = len(parts) == 2 and all(p.isdigit() for p in parts)
    c, f = (int(parts[0]), int(parts[1])) if ok else (0, 0)
    if not (ok and 1 <= c <= n_causes and 1 <= f <= n_fixes):
        raise ConfigError("answer", text, f"CAUSE,FIX: a cause number 1-{n_causes} and a fix number 1-{n_fixes}, "
                                          "e.g. 3,5")
    return c, f


def check_args(case: Optional[str], seed, timer, gauntlet: bool, n, answers: list) -> None:
    """Every flag, before any run: one line naming the field, the value and what is allowed."""
    if case is not None:
        case_by_id(case)
        if gauntlet:
            raise ConfigError("case", case, "no --case with --gauntlet (the seed draws the gauntlet's cases)")
    _check_seed(seed)
    if isinstance(timer, bool) or not isinstance(timer, (int, float)) or not 0 <= timer <= 86_400:
        raise ConfigError("timer", timer, "seconds from 0 (no time limit) to 86400")
    _check_n(n)
    n_causes, n_fixes = len(dict.fromkeys(c.cause for c in CASES)), len(all_fixes())
    for a in answers:
        parse_answer(a, n_causes, n_fixes)
    if answers and len(answers) != (n if gauntlet else 1):
        raise ConfigError("answer", ";".join(answers), f"one --answer per drill ({n if gauntlet else 1})")


def play(attempt: Attempt, title: str, answer: Optional[str], out: Callable[[str], None],
         read: Callable[[str], str]) -> dict:
    """One drill in text; returns its score card row."""
    limit = attempt.timer.limit_s
    out(f"\n== {title} · {say('limit-none') if limit is None else say('limit-seconds', seconds=f'{limit:g}')}")
    if attempt.cannot_show_here():
        out("   " + say("needs-gpu", why=attempt.cannot_show_here()))
    ev = attempt.run(lambda done, total, words: print(f"  [{done}/{total}] {words}", file=sys.stderr, flush=True))
    w = max(len(k) for k, _ in evidence_rows(ev))
    for k, v in evidence_rows(ev):
        out(f"  {k:<{w}}  {v}")
    for question, choices in (("what-is-wrong", attempt.causes), ("what-to-change", attempt.fixes)):
        out(say(question))
        for i, c in enumerate(choices, 1):
            out(f"  {i:>2}. {c}")
    if answer is None:
        try:
            answer = read(say("answer-prompt") + " ")
        except EOFError:
            answer = ""
    try:
        c, f = parse_answer(answer, len(attempt.causes), len(attempt.fixes))
        row = attempt.answer(attempt.causes[c - 1], attempt.fixes[f - 1])
    except ConfigError:
        out("  " + say("answer-unread", answer=repr(answer)))
        attempt.timer.stop()
        row = attempt.answer(None, None)
    out(row_words(row, plain=True))
    # a speed reveal takes 20-45 s: a progress line
    out(say("reveal-line", sentence=attempt.reveal(progress=True)["sentence"]))
    return row


def missed_lines(scorecard: dict) -> list:
    """The card's missed drills as text: the learner's answer beside the right one, and the chapter section
    that teaches each (its heading, and the notebook#anchor a JupyterLab link opens)."""
    if not scorecard.get("missed"):
        return []
    lines = [say("missed-title")]
    for m in scorecard["missed"]:
        yours = say("missed-no-answer") if m["timed_out"] else f"{m['answer_cause']} / {m['answer_fix']}"
        where = f'"{m["heading"]}" ({m["href"]})' if m["heading"] else m["notebook"] or say("missed-no-notebook")
        lines += [f"  {m['index']:>2}. {m['case']}", f"      {say('missed-yours')}: {yours}",
                  f"      {say('missed-right')}: {m['right_cause']} / {m['right_fix']}",
                  f"      {say('missed-where')}: {say('missed-chapter', chapter=m['chapter'])}, {where}"]
    return lines


def main(case=None, seed: int = 0, timer: float = 180.0, gauntlet: bool = False, n: int = GAUNTLET_N,
         answers=(), out_path=None, out: Callable[[str], None] = print, read: Callable[[str], str] = input) -> dict:
    """The drill (or the gauntlet) in a terminal; returns the score card (written to ``out_path`` if given).
    Ctrl-C ends it early: the card of the drills answered so far is still returned and written, marked
    ``"stopped": true``."""
    answers = list(answers or [])
    check_args(case, seed, timer, gauntlet, n, answers)
    limit = None if timer == 0 else float(timer)
    cases = gauntlet_draw(seed, n) if gauntlet else [case_by_id(case) if case else draw(seed, 1)[0]]
    rows, stopped = [], False
    try:
        for i, c in enumerate(cases):
            title = (say("gauntlet-drill", i=i + 1, n=len(cases), seed=seed) if gauntlet else
                     say("single-drill", seed=seed))
            rows.append(play(Attempt(c, seed, limit), title, answers[i] if answers else None, out, read))
    except KeyboardInterrupt:  # Ctrl-C: the drills answered so far keep their card (the one under way is dropped)
        stopped = True
    scorecard = card(rows, seed=seed, limit_s=limit, device=device_words(), stopped=stopped)
    if stopped:
        out("\n" + say("stopped-early", answered=len(rows), drills=len(cases)))
    out(f"\n{say('card-final')}: {card_words(scorecard)}")
    for line in missed_lines(scorecard):
        out(line)
    if out_path:
        out(say("wrote", path=save_card(out_path, scorecard)))
    return scorecard
