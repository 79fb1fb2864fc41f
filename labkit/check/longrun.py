"""Checkers for chapter 11 (a long run on a fixed number of GPUs): what a checkpoint must hold for an exact
resume, the Young/Daly checkpoint interval, the work a failure costs, and a resume that is not exact.

The learner's function runs on every case before any right answer is worked out. A wrong answer is matched
against the usual mistakes, and the hint names the one it made.
"""
from __future__ import annotations

import difflib
import itertools
import math

from ..chapters.ch11_longrun import interval as _interval
from ..chapters.ch11_longrun.state import ITEMS, RESUME_LOGS  # what a checkpoint can hold; the exercise's logs
from ..base import phrases
from ._core import AnswerError, NotAttempted, a_function, case_answers, checker, describe, wrong_case

__all__ = ["resume_needs", "young_daly", "lost_work", "inexact_resume"]

# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 11
WORDS = phrases.load_section("lab_messages.md", "Checks: chapter 11", {
    "case": ("optimizer", "schedule", "precision", "dropout", "order"), "shuffled": (), "fixed-order": (),
    "need-adamw": (), "need-momentum": (), "need-sgd": (), "need-model": (), "need-loader": (),
    "need-loader-fixed": (), "need-scheduler": (), "need-scaler": (), "need-rng": (), "extra-optimizer": (),
    "extra-scheduler": (), "extra-scaler": ("precision",), "extra-scaler-bf16": ("precision",), "extra-rng": (),
    "function-returned": (), "answer-has": (), "items-form": ("where", "value"),
    "item-unknown": ("where", "value", "items"),
    "item-close": ("where", "value", "items", "close"), "returned-none": ("case",), "resume-right": (),
    "resume-everything": ("case",), "resume-lacks": ("case", "item", "hint"), "resume-has": ("case", "item", "hint"),
    "yd-no-2": (), "yd-no-root": (), "yd-cm": (), "yd-divides": (), "yd-half": (), "yd-minutes": (), "yd-hours": (),
    "yd-minus-save": (), "yd-half-mtbf": (), "yd-right": (), "yd-daly": (), "yd-wrong": ("save", "mtbf", "got", "hint"),
    "yd-other": (), "lost-no-restart": (), "lost-expected": (), "lost-from-start": (), "lost-next": (),
    "lost-interval": (), "lost-minutes": (), "lost-right": (),
    "lost-wrong": ("fail", "interval", "restart", "got", "hint"),
    "lost-other": (), "log-model": (), "log-loader": (), "log-rng": (), "log-scheduler": (), "log-optimizer": (),
    "log-scaler": (), "letters-form": ("value",), "letters-key": ("value", "logs"), "letters-open": ("logs",),
    "letters-open-many": ("logs",), "logs-right": (), "log-wrong": ("letter", "got", "wrong", "total", "hint")})


# ---- exercise-11-resume-needs ----------------------------------------------------------------------------
# A run's set-up: its optimizer, its learning-rate schedule, its precision, its dropout, whether its loader
# shuffles (the chapter's resumable sampler, which shuffles with a generator of its own, seeded per epoch).
OPTIMIZERS = ("adamw", "sgd-momentum", "sgd")
SCHEDULES = ("constant", "warmup-cosine")
PRECISIONS = ("fp32", "bf16", "fp16")
RESUME_CASES = [dict(optimizer=o, schedule=s, precision=p, dropout=d, shuffle=sh)
                for o, s, p, d, sh in itertools.product(OPTIMIZERS, SCHEDULES, PRECISIONS, (0.1, 0.0), (True, False))]


def needed(setup: dict) -> set:
    """The smallest set of ITEMS a checkpoint must hold for this set-up to resume bit for bit."""
    items = {"model", "loader"}  # the weights; where the data stream is (in a fixed order too)
    if setup["optimizer"] != "sgd" or setup["schedule"] != "constant":
        items.add("optimizer")  # moments or momentum buffers -- and the learning rate the schedule set
    if setup["schedule"] != "constant":
        items.add("scheduler")  # its step count: where in the warm-up and the decay the run is
    if setup["precision"] == "fp16":
        items.add("scaler")  # the loss scale it has grown or cut to, and its count towards the next growth
    if setup["dropout"] > 0:
        items.add("rng")  # the dropout masks come from the generator's state
    return items


def _case(setup: dict) -> str:
    order = WORDS.say("shuffled" if setup["shuffle"] else "fixed-order")
    return WORDS.say("case", optimizer=setup["optimizer"], schedule=setup["schedule"], precision=setup["precision"],
                     dropout=f"{setup['dropout']:g}", order=order)


def _optimizer_hint(optimizer: str) -> str:
    return WORDS.say({"adamw": "need-adamw", "sgd-momentum": "need-momentum"}.get(optimizer, "need-sgd"))


def _hint(item: str, missing: bool, setup: dict) -> str:
    if missing:
        if item == "optimizer":
            return _optimizer_hint(setup["optimizer"])
        if item == "loader":
            return WORDS.say("need-loader" if setup["shuffle"] else "need-loader-fixed")
        return WORDS.say({"model": "need-model", "scheduler": "need-scheduler", "scaler": "need-scaler",
                          "rng": "need-rng"}[item])
    if item == "scaler":
        return WORDS.say("extra-scaler-bf16" if setup["precision"] == "bf16" else "extra-scaler",
                         precision=setup["precision"])
    return WORDS.say({"optimizer": "extra-optimizer", "scheduler": "extra-scheduler", "rng": "extra-rng"}[item])


def item_set(value, where: str = "function-returned") -> set:
    """A learner's items as a set of ITEMS names: from a set, list, tuple or frozenset of names (any case);
    ``where``: the key of the words that name the answer ("function-returned" or "answer-has")."""
    where = WORDS.say(where)
    if isinstance(value, str) or not isinstance(value, (set, frozenset, list, tuple)):
        raise AnswerError(WORDS.say("items-form", where=where, value=describe(value)))
    items = set()
    for v in value:
        name = v.strip().lower() if isinstance(v, str) else None
        if name not in ITEMS:
            close = difflib.get_close_matches(name or "", ITEMS, n=1)
            raise AnswerError(WORDS.say("item-close" if close else "item-unknown", where=where, value=describe(v),
                                        items=", ".join(ITEMS), close=repr(close[0]) if close else ""))
        items.add(name)
    return items


@checker
def resume_needs(fn):
    """``fn(setup)`` -> the smallest set of ``ITEMS`` a checkpoint must hold for the run described by ``setup``
    (keys optimizer, schedule, precision, dropout, shuffle) to resume bit for bit."""
    a_function(fn, "my_resume_needs")
    raw = [fn(dict(s)) for s in RESUME_CASES]
    if all(r is None or r is Ellipsis for r in raw):
        raise NotAttempted()
    got = []
    for s, r in zip(RESUME_CASES, raw):
        if r is None:
            raise AnswerError(WORDS.say("returned-none", case=_case(s)))
        got.append(item_set(r))
    right = [needed(s) for s in RESUME_CASES]
    wrong = next(((s, g, r) for s, g, r in zip(RESUME_CASES, got, right) if g != r), None)
    if wrong is None:
        return True, WORDS.say("resume-right")
    s, g, r = wrong
    if g == set(ITEMS):
        return False, WORDS.say("resume-everything", case=_case(s))
    missing, extra = [i for i in ITEMS if i in r - g], [i for i in ITEMS if i in g - r]
    item, is_missing = (missing[0], True) if missing else (extra[0], False)
    return False, WORDS.say("resume-lacks" if is_missing else "resume-has", case=_case(s), item=repr(item),
                            hint=_hint(item, is_missing, s))


# ---- exercise-11-young-daly ------------------------------------------------------------------------------
# (save_s, mtbf_s): seconds to write a checkpoint, the cluster's mean time between failures, in seconds
YOUNG_DALY_CASES = [(30.0, 3 * 3600.0), (120.0, 10 * 3600.0), (2.0, 600.0), (600.0, 24 * 3600.0), (45.0, 7200.0),
                    (8.0, 86400.0)]
YOUNG_DALY_MISTAKES = [  # (the mistaken answer, the key of its hint)
    (lambda c, m: math.sqrt(c * m), "yd-no-2"),
    (lambda c, m: 2 * c * m, "yd-no-root"),
    (lambda c, m: c * m, "yd-cm"),
    (lambda c, m: math.sqrt(2 * c / m), "yd-divides"),
    (lambda c, m: math.sqrt(c * m / 2), "yd-half"),
    (lambda c, m: math.sqrt(2 * c * m) / 60, "yd-minutes"),
    (lambda c, m: math.sqrt(2 * c * m) / 3600, "yd-hours"),
    (lambda c, m: math.sqrt(2 * c * m) - c, "yd-minus-save"),
    (lambda c, m: m / 2, "yd-half-mtbf"),
]


@checker
def young_daly(fn):
    """``fn(save_s, mtbf_s)`` -> the Young/Daly checkpoint interval in seconds, √(2 · save_s · mtbf_s)."""
    a_function(fn, "my_interval")
    got = case_answers(fn, YOUNG_DALY_CASES, "return the interval in seconds")
    miss = wrong_case(YOUNG_DALY_CASES, got, [math.sqrt(2 * c * m) for c, m in YOUNG_DALY_CASES],
                      YOUNG_DALY_MISTAKES, 1e-6)
    if miss is None:
        return True, WORDS.say("yd-right")
    if wrong_case(YOUNG_DALY_CASES, got, [_interval.daly(c, m) for c, m in YOUNG_DALY_CASES], rel=1e-6) is None:
        return True, WORDS.say("yd-daly")
    (c, m), g, _, hint = miss
    return False, WORDS.say("yd-wrong", save=f"{c:g}", mtbf=f"{m:g}", got=f"{g:.6g}",
                            hint=WORDS.say(hint or "yd-other"))


# ---- exercise-11-lost-work --------------------------------------------------------------------------------
# (fail_at_s, interval_s, restart_s): a run checkpoints at interval_s, 2 · interval_s, ... (a save that takes no
# time); it dies fail_at_s after its start, never at the instant of a save; restarting and loading takes restart_s. The failure costs the work
# since the last checkpoint plus the restart.
LOST_CASES = [(5350.0, 1800.0, 120.0), (4000.0, 1800.0, 120.0), (1000.0, 1800.0, 60.0), (3650.0, 900.0, 30.0),
              (7300.0, 3600.0, 0.0), (200.0, 45.0, 10.0), (86000.0, 3000.0, 300.0)]


def lost_seconds(fail_at_s: float, interval_s: float, restart_s: float) -> float:
    return math.fmod(fail_at_s, interval_s) + restart_s


LOST_MISTAKES = [  # (the mistaken answer, the key of its hint)
    (lambda f, i, r: math.fmod(f, i), "lost-no-restart"),
    (lambda f, i, r: i / 2 + r, "lost-expected"),
    (lambda f, i, r: f + r, "lost-from-start"),
    (lambda f, i, r: (i - math.fmod(f, i)) + r, "lost-next"),
    (lambda f, i, r: i + r, "lost-interval"),
    (lambda f, i, r: (math.fmod(f, i) + r) / 60, "lost-minutes"),
]


@checker
def lost_work(fn):
    """``fn(fail_at_s, interval_s, restart_s)`` -> seconds the failure costs: the work since the last checkpoint
    (taken every ``interval_s`` from the start) plus the restart."""
    a_function(fn, "my_lost_work")
    got = case_answers(fn, LOST_CASES, "return the seconds lost")
    miss = wrong_case(LOST_CASES, got, [lost_seconds(*c) for c in LOST_CASES], LOST_MISTAKES, 1e-6)
    if miss is None:
        return True, WORDS.say("lost-right")
    (f, i, r), g, _, hint = miss
    return False, WORDS.say("lost-wrong", fail=f"{f:g}", interval=f"{i:g}", restart=f"{r:g}", got=f"{g:.6g}",
                            hint=WORDS.say(hint or "lost-other"))


# ---- exercise-11-inexact-resume --------------------------------------------------------------------------
RESUME_LOG_ANSWER = {"A": "loader", "B": "rng", "C": "scheduler", "D": "optimizer", "E": "scaler"}
_LOG_HINTS = {item: f"log-{item}" for item in ITEMS}  # what a resume without each item looks like: said
# of the item a learner named wrongly (the keys of their words)


def _letter_map(answer) -> dict:
    if not isinstance(answer, dict):
        raise AnswerError(WORDS.say("letters-form", value=describe(answer)))
    out = {}
    for k, v in answer.items():
        key = k.strip().upper() if isinstance(k, str) else k
        if key not in RESUME_LOGS:
            raise AnswerError(WORDS.say("letters-key", value=describe(k), logs=", ".join(RESUME_LOGS)))
        if v is None or v is Ellipsis:
            continue
        out[key] = next(iter(item_set([v], "answer-has")))
    return out


@checker
def inexact_resume(answer):
    """``answer``: {letter: item} -- for each log of ``RESUME_LOGS``, the item the checkpoint lacked."""
    got = _letter_map(answer)
    if not got:
        raise NotAttempted()
    missing = [k for k in RESUME_LOGS if k not in got]
    if missing:
        raise AnswerError(WORDS.say("letters-open" if len(missing) == 1 else "letters-open-many",
                                    logs=", ".join(missing)))
    wrong = [k for k in RESUME_LOGS if got[k] != RESUME_LOG_ANSWER[k]]
    if not wrong:
        return True, WORDS.say("logs-right")
    k = wrong[0]
    return False, WORDS.say("log-wrong", letter=k, got=repr(got[k]), wrong=len(wrong), total=len(RESUME_LOGS),
                            hint=WORDS.say(_LOG_HINTS[got[k]]))
