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
from ._core import AnswerError, NotAttempted, a_function, case_answers, checker, describe, diagnose, same

__all__ = ["resume_needs", "young_daly", "lost_work", "inexact_resume"]


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
    return (f"{setup['optimizer']}, {setup['schedule']} schedule, {setup['precision']}, dropout "
            f"{setup['dropout']:g}, {'shuffled' if setup['shuffle'] else 'in a fixed order'}")


def _optimizer_hint(optimizer: str) -> str:
    return {"adamw": "AdamW's moments (exp_avg, exp_avg_sq) and its step count: without them the first resumed "
                     "update is as large as the very first one.",
            "sgd-momentum": "the momentum buffers: without them the first resumed update has no momentum.",
            }.get(optimizer, "plain SGD keeps no per-parameter state, but the scheduler writes the current learning "
                             "rate into the optimizer's param_groups: without the optimizer's state_dict the first "
                             "resumed update runs at the schedule's starting learning rate.")


def _hint(item: str, missing: bool, setup: dict) -> str:
    if missing:
        return {
            "model": "the weights themselves: without them nothing is resumed.",
            "loader": ("the loader's position: a fresh loader starts at the first batch again, so the resumed run "
                       "trains on batches it has already seen" + (", in a fixed order too." if not setup["shuffle"]
                                                                  else ".")),
            "optimizer": _optimizer_hint(setup["optimizer"]),
            "scheduler": "the scheduler's step count: without it the warm-up starts again at the resume.",
            "scaler": ("GradScaler's scale and its growth tracker: a fresh scaler starts at 65,536 again, skips "
                       "updates the run would have made, and grows on another schedule."),
            "rng": ("the random generators' state: dropout draws its masks from it, so a fresh process draws "
                    "other masks (in every rank, on the CPU and the GPU)."),
        }[item]
    return {
        "optimizer": ("plain SGD with a constant learning rate keeps no state: its state_dict holds only the "
                      "hyperparameters your code sets again."),
        "scheduler": "a constant learning rate has no schedule to save.",
        "scaler": (f"{setup['precision']} needs no loss scaling" + (" (bf16 has fp32's exponent range)"
                                                                    if setup["precision"] == "bf16" else "")
                   + ": there is no GradScaler to save."),
        "rng": ("with dropout 0 nothing draws random numbers after start-up (the sampler shuffles with its own "
                "generator, which the loader's state holds): saving the generators is harmless but not needed."),
    }[item]


def item_set(value, where: str = "your function returned") -> set:
    """A learner's items as a set of ITEMS names: from a set, list, tuple or frozenset of names (any case)."""
    if isinstance(value, str) or not isinstance(value, (set, frozenset, list, tuple)):
        raise AnswerError(f"{where} {describe(value)}; return a set of item names, e.g. {{\"model\", \"loader\"}}")
    items = set()
    for v in value:
        name = v.strip().lower() if isinstance(v, str) else None
        if name not in ITEMS:
            close = difflib.get_close_matches(name or "", ITEMS, n=1)
            raise AnswerError(f"{where} {describe(v)} among its items; the items are {', '.join(ITEMS)}"
                              + (f" -- did you mean {close[0]!r}?" if close else ""))
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
            raise AnswerError(f"your function returned None for {_case(s)} (no return reached there?)")
        got.append(item_set(r))
    right = [needed(s) for s in RESUME_CASES]
    wrong = next(((s, g, r) for s, g, r in zip(RESUME_CASES, got, right) if g != r), None)
    if wrong is None:
        return True, ("right: the model and the loader's position always; the optimizer where it has state or a "
                      "schedule sets its learning rate; the scheduler with a schedule; the scaler with fp16; the "
                      "generators with dropout.")
    s, g, r = wrong
    if g == set(ITEMS):
        return False, (f"for {_case(s)} you save everything: safe, but the exercise asks for the smallest set. "
                       f"What here changes during training and is not rebuilt by your code?")
    missing, extra = [i for i in ITEMS if i in r - g], [i for i in ITEMS if i in g - r]
    item, is_missing = (missing[0], True) if missing else (extra[0], False)
    return False, (f"for {_case(s)} your set {'lacks' if is_missing else 'has'} {item!r}: "
                   + _hint(item, is_missing, s))


# ---- exercise-11-young-daly ------------------------------------------------------------------------------
# (save_s, mtbf_s): seconds to write a checkpoint, the cluster's mean time between failures, in seconds
YOUNG_DALY_CASES = [(30.0, 3 * 3600.0), (120.0, 10 * 3600.0), (2.0, 600.0), (600.0, 24 * 3600.0), (45.0, 7200.0),
                    (8.0, 86400.0)]
YOUNG_DALY_MISTAKES = [
    (lambda c, m: math.sqrt(c * m), "that is √(C · M): the first-order optimum is √(2 · C · M) -- you left out the 2."),
    (lambda c, m: 2 * c * m, "that is 2 · C · M without the square root: its unit is seconds², not seconds."),
    (lambda c, m: c * m, "that is C · M: the optimum is the square root of 2 · C · M."),
    (lambda c, m: math.sqrt(2 * c / m), "that is √(2 · C / M): the failures' mean time multiplies, it does not divide."),
    (lambda c, m: math.sqrt(c * m / 2), "that is √(C · M / 2): the 2 multiplies."),
    (lambda c, m: math.sqrt(2 * c * m) / 60, "that is the interval in minutes: return it in seconds, as the inputs."),
    (lambda c, m: math.sqrt(2 * c * m) / 3600, "that is the interval in hours: return it in seconds, as the inputs."),
    (lambda c, m: math.sqrt(2 * c * m) - c, "you subtracted the save time: the Young/Daly interval is the work "
     "between two checkpoints, √(2 · C · M), without a correction."),
    (lambda c, m: m / 2, "that is half the MTBF: the optimum balances the save cost C/τ against the lost work "
     "τ/(2M), which gives τ = √(2 · C · M)."),
]


@checker
def young_daly(fn):
    """``fn(save_s, mtbf_s)`` -> the Young/Daly checkpoint interval in seconds, √(2 · save_s · mtbf_s)."""
    a_function(fn, "my_interval")
    got = case_answers(fn, YOUNG_DALY_CASES, "return the interval in seconds")
    right = [math.sqrt(2 * c * m) for c, m in YOUNG_DALY_CASES]
    if all(same(g, r, 1e-6) for g, r in zip(got, right)):
        return True, ("right: τ = √(2 · C · M). The save cost per second of work is C/τ, the expected lost work "
                      "τ/(2M); their sum is smallest where the two are equal.")
    if all(same(g, _interval.daly(c, m), 1e-6) for g, (c, m) in zip(got, YOUNG_DALY_CASES)):
        return True, ("right: that is Daly's higher-order estimate, a little below Young's first-order "
                      "τ = √(2 · C · M) where C is not small against M.")
    (c, m), g = next((case, g) for case, g, r in zip(YOUNG_DALY_CASES, got, right) if not same(g, r, 1e-6))
    hint = diagnose(YOUNG_DALY_CASES, got, right, YOUNG_DALY_MISTAKES, 1e-6)
    return False, (f"my_interval({c:g}, {m:g}) returned {g:.6g}: "
                   + (hint or "not it. The cost of saving per second of work is C/τ and the expected lost work per "
                      "second is τ/(2M): at which τ is their sum smallest?"))


# ---- exercise-11-lost-work --------------------------------------------------------------------------------
# (fail_at_s, interval_s, restart_s): a run checkpoints at interval_s, 2 · interval_s, ... (a save that takes no
# time); it dies fail_at_s after its start, never at the instant of a save; restarting and loading takes restart_s. The failure costs the work
# since the last checkpoint plus the restart.
LOST_CASES = [(5350.0, 1800.0, 120.0), (4000.0, 1800.0, 120.0), (1000.0, 1800.0, 60.0), (3650.0, 900.0, 30.0),
              (7300.0, 3600.0, 0.0), (200.0, 45.0, 10.0), (86000.0, 3000.0, 300.0)]


def lost_seconds(fail_at_s: float, interval_s: float, restart_s: float) -> float:
    return math.fmod(fail_at_s, interval_s) + restart_s


LOST_MISTAKES = [
    (lambda f, i, r: math.fmod(f, i), "you left out the restart: the new processes' start and the checkpoint's "
     "load are time the run does not train."),
    (lambda f, i, r: i / 2 + r, "that is the EXPECTED loss of a failure at a random time (half an interval plus "
     "the restart): this failure happened at a known time."),
    (lambda f, i, r: f + r, "you counted from the run's start: the run resumes from its last checkpoint, not "
     "from the beginning."),
    (lambda f, i, r: (i - math.fmod(f, i)) + r, "that is the time to the NEXT checkpoint: what is lost is the "
     "work since the last one."),
    (lambda f, i, r: i + r, "that is a whole interval: only the work since the last checkpoint is lost."),
    (lambda f, i, r: (math.fmod(f, i) + r) / 60, "that is in minutes: return seconds, as the inputs."),
]


@checker
def lost_work(fn):
    """``fn(fail_at_s, interval_s, restart_s)`` -> seconds the failure costs: the work since the last checkpoint
    (taken every ``interval_s`` from the start) plus the restart."""
    a_function(fn, "my_lost_work")
    got = case_answers(fn, LOST_CASES, "return the seconds lost")
    right = [lost_seconds(*c) for c in LOST_CASES]
    if all(same(g, r, 1e-6) for g, r in zip(got, right)):
        return True, ("right: the time since the last checkpoint (fail_at mod interval) is redone, and the restart "
                      "comes on top. On average that is half an interval plus the restart -- the Young/Daly "
                      "model's lost-work term.")
    (f, i, r), g = next((case, g) for case, g, w in zip(LOST_CASES, got, right) if not same(g, w, 1e-6))
    hint = diagnose(LOST_CASES, got, right, LOST_MISTAKES, 1e-6)
    return False, (f"my_lost_work({f:g}, {i:g}, {r:g}) returned {g:.6g}: "
                   + (hint or "not it. When was the last checkpoint before the failure? What is redone, and what "
                      "comes on top?"))


# ---- exercise-11-inexact-resume --------------------------------------------------------------------------
RESUME_LOG_ANSWER = {"A": "loader", "B": "rng", "C": "scheduler", "D": "optimizer", "E": "scaler"}
_LOG_HINTS = {  # what a resume without each item looks like: said of the item a learner named wrongly
    "model": "without the model nothing is resumed: the first loss after the resume would be the untrained one's.",
    "loader": "without the loader's position the data stream starts again: a batch repeats an early one.",
    "rng": ("without the generators' state the same batch, at the same learning rate, gets another loss from the "
            "first update on: dropout draws other masks."),
    "scheduler": ("without the scheduler the first update still has the right learning rate (the optimizer's "
                  "state_dict holds the rate last set); from the second, the schedule starts over."),
    "optimizer": ("without Adam's moments the first update is sign-like: every weight moves by about the learning "
                  "rate."),
    "scaler": "without the GradScaler's state the loss scale is back at its starting value, 65,536.",
}


def _letter_map(answer) -> dict:
    if not isinstance(answer, dict):
        raise AnswerError(f"your answer is {describe(answer)}; give a dict from each log's letter to the missing "
                          "item, e.g. {\"A\": \"loader\", ...}")
    out = {}
    for k, v in answer.items():
        key = k.strip().upper() if isinstance(k, str) else k
        if key not in RESUME_LOGS:
            raise AnswerError(f"your answer has the key {describe(k)}; the logs are {', '.join(RESUME_LOGS)}")
        if v is None or v is Ellipsis:
            continue
        out[key] = next(iter(item_set([v], "your answer has")))
    return out


@checker
def inexact_resume(answer):
    """``answer``: {letter: item} -- for each log of ``RESUME_LOGS``, the item the checkpoint lacked."""
    got = _letter_map(answer)
    if not got:
        raise NotAttempted()
    missing = [k for k in RESUME_LOGS if k not in got]
    if missing:
        raise AnswerError(f"name an item for every log: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                          "still open")
    wrong = [k for k in RESUME_LOGS if got[k] != RESUME_LOG_ANSWER[k]]
    if not wrong:
        return True, ("right: a repeated batch is the loader; another loss on the same batch is the generators; a "
                      "warm-up learning rate is the scheduler; Adam's sign-like first step is the optimizer; a scale "
                      "of 65,536 is the scaler.")
    k = wrong[0]
    return False, (f"log {k} is not {got[k]!r} ({len(wrong)} of {len(RESUME_LOGS)} not yet): {_LOG_HINTS[got[k]]} "
                   "Does log " + k + " show that? Look at whether the first update after the resume already differs.")
