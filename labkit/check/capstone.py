"""Checkers for the chapters that plan a run: 09 (the playbook: the Pareto front, the budget challenge, ZeRO
memory arithmetic, which remedy a model that still does not fit needs) and 11 (a long run on a fixed number of
GPUs: what a checkpoint must hold for an exact resume, the Young/Daly interval, the work a failure costs, a resume
that is not exact).
"""
from __future__ import annotations

import difflib
import itertools
import math
import random

from ..base import phrases
from ..chapters import ch09_playbook as pb
from ..chapters.ch11_longrun import spikes as _interval
from ..chapters.ch11_longrun.state import ITEMS, RESUME_LOGS  # what a checkpoint can hold; the exercise's logs
from . import measurements
from ._core import (AnswerError, NotAttempted, a_function, case_answers, case_miss, checker, describe, number, returned,
                    wrong_case)
from .measurements import finite

__all__ = ["pareto_front", "budget_challenge", "zero_bytes_per_gpu", "smallest_fix",  # 09
           "resume_needs", "young_daly", "lost_work", "inexact_resume"]  # 11

# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 09
WORDS = phrases.load_section("lab_messages.md", "Checks: chapter 09", {
    "pf-not-function": (), "pf-form": ("value",), "pf-pair": ("value",), "pf-fastest-only": ("case",),
    "pf-neighbour": ("case", "extra"), "pf-reversed": ("case",), "pf-tied": ("case", "tied"),
    "pf-extra": ("points",), "pf-missing": ("points",), "pf-wrong": ("case", "want", "got", "notes"), "pf-right": (),
    "bc-grid": (), "bc-result": (), "bc-none-fits": (), "bc-not-grid": ("pick",), "bc-no-memory": (),
    "bc-over": ("mem", "over"), "bc-over-fastest": ("mem", "over"), "bc-slow": ("speed", "share", "target"),
    "bc-right": ("mem", "budget", "share"),
    "zb-not-function": (), "zb-wrong": ("billions", "gpus", "stage", "want", "got", "hint"), "zb-16": (),
    "zb-all": (), "zb-opt12": (), "zb-s1": (), "zb-s2": (), "zb-other": (), "zb-right": (),
    "fix-form": ("value", "remedies"), "fix-unknown": ("answer", "remedies"), "fix-right": ("remedy", "gb", "card"),
    "fix-no-fit": ("remedy", "gb", "states", "act", "card"), "fix-too-much": ("remedy", "gb")})

# The "when it still does not fit" scenario of exercise-09-which-fix (no hardware measured here:
# datasheet-sized cards and textbook byte counts).
FIX_SCENARIO = dict(n_params=13e9, n_gpus=8, gpu_bytes=80e9, activation_bytes=20e9)
CHALLENGE_FRACTION = 0.9  # the pick must reach this share of the best throughput that fits
# The chapter's memory budgets (notebooks/09's sizes cell): the largest budget_bytes the challenge takes. On a
# GPU the chapter may set less (a card with less usable memory), never more.
CHALLENGE_BUDGETS = {"cpu": 62 * 2**20, "gpu": 16 * 2**30}


def _front_set(points):
    rows = [{"memory_bytes": m, "tokens_per_s": s} for m, s in points]
    return {(r["memory_bytes"], r["tokens_per_s"]) for r in pb.pareto_front(rows)}


def _front_cases():
    """Hand-made cases that catch the usual bugs, then seeded random ones."""
    cases = [
        [(10, 100), (20, 300), (30, 200), (40, 500), (50, 450)],            # dips must be dropped
        [(10, 100), (20, 90), (30, 95), (40, 120)],                          # 95 beats 90 but not 100
        [(5, 50)],                                                           # one point
        [(30, 10), (10, 30), (20, 20)],                                      # nothing dominated
        [(10, 100), (10, 80), (20, 150)],                                    # same memory: keep the faster
    ]
    rng = random.Random(7)
    for _ in range(20):
        n = rng.randint(2, 12)
        mems = rng.sample(range(1, 200), n)
        cases.append([(m, rng.randint(1, 1000)) for m in mems])
    return cases


def _neighbour_bug(case):
    """The usual mistake: keep a point when it beats the point just before it, not every cheaper one."""
    pts = sorted(case, key=lambda p: (p[0], -p[1]))
    return {p for i, p in enumerate(pts) if i == 0 or p[1] > pts[i - 1][1]}


def _reversed_bug(case):
    """Memory maximised instead of minimised."""
    return {(-m, s) for m, s in _front_set([(-m, s) for m, s in case])}


def _plain(x):
    x = number(x, "return (memory, tokens_per_s) pairs of numbers", "your front holds")
    return int(x) if x.is_integer() else x


def _points(got) -> set:
    """What the learner's front function returned, as a set of plain (memory, tokens_per_s) pairs."""
    if got is None or got is Ellipsis:
        raise NotAttempted()  # the body is still `...`
    if isinstance(got, (str, bytes, dict)) or not hasattr(got, "__iter__"):
        raise AnswerError(WORDS.say("pf-form", value=describe(got)))
    out = set()
    for p in got:
        p = tuple(p) if hasattr(p, "__iter__") and not isinstance(p, (str, bytes)) else (p,)
        if len(p) != 2:
            raise AnswerError(WORDS.say("pf-pair", value=describe(p)))
        out.add((_plain(p[0]), _plain(p[1])))
    return out


@checker
def pareto_front(fn):
    """``fn(points)`` gets a list of (memory, tokens_per_s) tuples and returns the ones on the Pareto
    front (no other point has less-or-equal memory and more-or-equal speed), in any order."""
    if not callable(fn):
        return False, WORDS.say("pf-not-function")
    cases = _front_cases()
    answers = [_points(fn(list(case))) for case in cases]  # every front before labkit's exists
    for case, got_set in zip(cases, answers):
        want = _front_set(case)
        if got_set == want:
            continue
        if got_set == {max(case, key=lambda p: p[1])}:
            return False, WORDS.say("pf-fastest-only", case=case)
        if got_set == _neighbour_bug(case):
            return False, WORDS.say("pf-neighbour", case=case, extra=sorted(got_set - want))
        if got_set == _reversed_bug(case):
            return False, WORDS.say("pf-reversed", case=case)
        tied = {p for p in got_set - want if any(q[0] == p[0] and q[1] > p[1] for q in case)}
        if tied:
            return False, WORDS.say("pf-tied", case=case, tied=sorted(tied))
        extra, missing = got_set - want, want - got_set
        notes = (f" ({WORDS.say('pf-extra', points=sorted(extra))})" if extra else "") + (
            f" ({WORDS.say('pf-missing', points=sorted(missing))})" if missing else "")
        return False, WORDS.say("pf-wrong", case=case, want=sorted(want), got=sorted(got_set), notes=notes)
    return True, WORDS.say("pf-right")


def _summary_of(answer):
    if isinstance(answer, dict) and ("tokens_per_s" in answer or "summary" in answer):
        return answer.get("summary", answer)
    return getattr(answer, "summary", None)


def _same_point(row, knobs):
    return all(row.get(k) == knobs.get(k) for k in ("precision", "micro_batch", "accum", "checkpointing")
               if knobs.get(k) is not None)


@measurements.graded_from_file
@checker
def budget_challenge(pick, rows=None, budget_bytes=None):
    """``pick``: the Result (or summary) of your chosen configuration, measured, or a dict of its knobs when it
    is one of the grid's points. Passes when it fits ``budget_bytes`` (while graded, at most ``CHALLENGE_BUDGETS``)
    and reaches ``CHALLENGE_FRACTION`` of the fastest grid configuration that fits; for a grid point the better of
    its two measurements counts (a single short run scatters). The pick, the grid and the budget are saved."""
    return measurements.judged("budget_challenge", "09", pick,
                               lambda: _challenge_data(pick, rows, budget_bytes), _judge_challenge)


def _budget_cap(rows) -> int:
    """The largest budget the chapter sets for the device the grid ran on: a measured device peak means a GPU."""
    gpu = any(isinstance(r, dict) and r.get("memory_source") == "peak" for r in rows)
    return CHALLENGE_BUDGETS["gpu" if gpu else "cpu"]


def _challenge_data(pick, rows, budget_bytes) -> dict:
    """What budget_challenge judges: the pick's summary (or its knobs), the grid's rows and the budget."""
    if not rows or budget_bytes is None:
        raise AnswerError(WORDS.say("bc-grid"))
    budget_bytes = number(budget_bytes, "give the chapter's budget in bytes", "budget_bytes is")
    pick = dict(pick) if isinstance(pick, dict) else pick  # plain data: none of the pick's code runs later
    summary = _summary_of(pick)
    if summary is None and not isinstance(pick, dict):
        raise AnswerError(WORDS.say("bc-result"))
    return {"pick": pick if isinstance(pick, dict) and summary is None else None,
            "summary": dict(summary) if isinstance(summary, dict) else None,
            "rows": [dict(r) for r in rows], "budget_bytes": budget_bytes}


def _challenge_shape(data) -> tuple:
    """(pick, summary, rows, budget) of an entry shaped as ``_challenge_data`` saves it; else SHAPE."""
    need = measurements.need
    data = measurements.fields(data, ("pick", "summary", "rows", "budget_bytes"))
    pick, summary, rows, budget = data["pick"], data["summary"], data["rows"], data["budget_bytes"]
    need(isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows), "rows: not a list of rows")
    need(all(finite(r.get("memory_bytes")) and finite(r.get("tokens_per_s")) for r in pb.measured(rows)),
         "rows: a measured row without finite memory_bytes and tokens_per_s")
    need(finite(budget) and budget > 0, "budget_bytes: not a budget")
    # practice may raise the budget (the chapter says so for sizes of your own); a grade is for the chapter's
    need(measurements.grading_tool() is None or budget <= _budget_cap(rows),
         "budget_bytes: more than the chapter's budget -- graded with the chapter's sizes and budget")
    need(pick is None or isinstance(pick, dict), "pick: not the knobs of a grid point")
    need(summary is None or isinstance(summary, dict), "summary: not a run's summary")
    need(pick is not None or summary is not None, "neither a pick nor a run's summary")
    return pick, summary, rows, budget


def _judge_challenge(data):
    pick, summary, rows, budget_bytes = _challenge_shape(data)
    fraction = CHALLENGE_FRACTION  # the checker's target, never the entry's
    best = pb.best_within(rows, budget_bytes)  # only now, with the pick in hand
    if best is None:
        return False, WORDS.say("bc-none-fits")
    if summary is None and isinstance(pick, dict):
        match = [r for r in pb.measured(rows) if _same_point(r, pick)]
        if not match:
            return False, WORDS.say("bc-not-grid", pick=pick)
        summary = match[0]
    mem = summary.get("memory_bytes")
    if mem is None:
        mem, _ = pb.memory_of(summary)
    if mem is None:
        return False, WORDS.say("bc-no-memory")
    speed = summary.get("tokens_per_s") or 0.0
    measurements.need(finite(mem) and finite(speed), "the pick's memory_bytes or tokens_per_s is not a number")
    grid_twin = [r for r in pb.measured(rows) if _same_point(r, summary)]
    if grid_twin:
        speed = max(speed, grid_twin[0]["tokens_per_s"])
    over = mem - budget_bytes
    if over > 0:
        fastest = max(pb.measured(rows), key=lambda r: r["tokens_per_s"])
        return False, WORDS.say("bc-over-fastest" if _same_point(fastest, summary) else "bc-over",
                                mem=f"{mem / 2**20:,.1f}", over=f"{over / 2**20:,.1f}")
    target = fraction * best["tokens_per_s"]
    if speed < target:
        # the best's label or speed would hand over the answer: its share and the way to it only
        return False, WORDS.say("bc-slow", speed=f"{speed:,.0f}", share=f"{speed / best['tokens_per_s']:.0%}",
                                target=f"{fraction:.0%}")
    return True, WORDS.say("bc-right", mem=f"{mem / 2**20:,.1f}", budget=f"{budget_bytes / 2**20:,.1f}",
                           share=f"{speed / best['tokens_per_s']:.0%}")


@checker
def zero_bytes_per_gpu(fn):
    """``fn(n_params, n_gpus, stage)`` -> bytes of model state per GPU for mixed-precision Adam
    (16-bit weights 2 B + 16-bit gradients 2 B + fp32 master, m, v 12 B per parameter) under ZeRO
    stage 0 (plain DDP), 1, 2 or 3."""
    if not callable(fn):
        return False, WORDS.say("zb-not-function")
    cases = [(n, g, s) for n in (1e9, 7e9, 70e9) for g in (1, 8, 64) for s in (0, 1, 2, 3)]
    answers = [returned(fn(n, g, s), "return a number of bytes") for n, g, s in cases]  # every answer before any right one is worked out
    for (n, g, s), got in zip(cases, answers):
        want = pb.zero_bytes_per_gpu(n, g, s)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        mistakes = (("zb-16", s == 0, 8 * n), ("zb-all", s < 3, 16 * n / g), ("zb-opt12", s == 1, 4 * n + 8 * n / g),
                    ("zb-s1", s == 1, 2 * n + 14 * n / g), ("zb-s2", s == 2, 4 * n + 12 * n / g))
        hint = next((h for h, when, x in mistakes if when and math.isclose(got, x, rel_tol=1e-6)), "zb-other")
        return False, WORDS.say("zb-wrong", billions=f"{n / 1e9:g}", gpus=g, stage=s, want=f"{want / 1e9:,.2f}",
                                got=f"{float(got) / 1e9:,.2f}", hint=WORDS.say(hint))
    return True, WORDS.say("zb-right")


@checker
def smallest_fix(answer):
    """The least intrusive option that fits FIX_SCENARIO: one of 'ddp', 'zero1', 'zero2', 'zero3',
    'zero3+offload_optimizer', 'zero3+offload_params'."""
    aliases = {"fsdp": "zero3", "zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3", "zero 1": "zero1",
               "zero 2": "zero2", "zero 3": "zero3", "offload": "zero3+offload_optimizer"}
    if not isinstance(answer, str):
        return False, WORDS.say("fix-form", value=describe(answer), remedies=", ".join(pb.REMEDIES))
    answer = str(answer)  # a plain str: none of the answer's code runs later
    a = aliases.get(answer.strip().lower(), answer.strip().lower())
    if a not in pb.REMEDIES:
        return False, WORDS.say("fix-unknown", answer=repr(answer), remedies=", ".join(pb.REMEDIES))
    rows = {r["remedy"]: r for r in pb.remedies(**FIX_SCENARIO)}
    want = pb.smallest_fix(**FIX_SCENARIO)
    card = FIX_SCENARIO["gpu_bytes"] / 1e9
    mine = rows[a]
    if a == want:
        return True, WORDS.say("fix-right", remedy=a, gb=f"{mine['per_gpu'] / 1e9:,.1f}", card=f"{card:.0f}")
    if not mine["fits"]:
        return False, WORDS.say("fix-no-fit", remedy=a, gb=f"{mine['per_gpu'] / 1e9:,.1f}",
                                states=f"{mine['total'] / 1e9:,.1f}", act=f"{mine['activations'] / 1e9:,.1f}",
                                card=f"{card:.0f}")
    return False, WORDS.say("fix-too-much", remedy=a, gb=f"{mine['per_gpu'] / 1e9:,.1f}")


# ---- 11 -- a long run -----------------------------------------------------------------------------

# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 11
WORDS11 = phrases.load_section("lab_messages.md", "Checks: chapter 11", {
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
    order = WORDS11.say("shuffled" if setup["shuffle"] else "fixed-order")
    return WORDS11.say("case", optimizer=setup["optimizer"], schedule=setup["schedule"], precision=setup["precision"],
                       dropout=f"{setup['dropout']:g}", order=order)


def _optimizer_hint(optimizer: str) -> str:
    return WORDS11.say({"adamw": "need-adamw", "sgd-momentum": "need-momentum"}.get(optimizer, "need-sgd"))


def _hint(item: str, missing: bool, setup: dict) -> str:
    if missing:
        if item == "optimizer":
            return _optimizer_hint(setup["optimizer"])
        if item == "loader":
            return WORDS11.say("need-loader" if setup["shuffle"] else "need-loader-fixed")
        return WORDS11.say({"model": "need-model", "scheduler": "need-scheduler", "scaler": "need-scaler",
                          "rng": "need-rng"}[item])
    if item == "scaler":
        return WORDS11.say("extra-scaler-bf16" if setup["precision"] == "bf16" else "extra-scaler",
                           precision=setup["precision"])
    return WORDS11.say({"optimizer": "extra-optimizer", "scheduler": "extra-scheduler", "rng": "extra-rng"}[item])


def item_set(value, where: str = "function-returned") -> set:
    """A learner's items as a set of ITEMS names: from a set, list, tuple or frozenset of names (any case);
    ``where``: the key of the words that name the answer ("function-returned" or "answer-has")."""
    where = WORDS11.say(where)
    if isinstance(value, str) or not isinstance(value, (set, frozenset, list, tuple)):
        raise AnswerError(WORDS11.say("items-form", where=where, value=describe(value)))
    items = set()
    for v in value:
        name = v.strip().lower() if isinstance(v, str) else None
        if name not in ITEMS:
            close = difflib.get_close_matches(name or "", ITEMS, n=1)
            raise AnswerError(WORDS11.say("item-close" if close else "item-unknown", where=where, value=describe(v),
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
            raise AnswerError(WORDS11.say("returned-none", case=_case(s)))
        got.append(item_set(r))
    right = [needed(s) for s in RESUME_CASES]
    wrong = next(((s, g, r) for s, g, r in zip(RESUME_CASES, got, right) if g != r), None)
    if wrong is None:
        return True, WORDS11.say("resume-right")
    s, g, r = wrong
    if g == set(ITEMS):
        return False, WORDS11.say("resume-everything", case=_case(s))
    missing, extra = [i for i in ITEMS if i in r - g], [i for i in ITEMS if i in g - r]
    item, is_missing = (missing[0], True) if missing else (extra[0], False)
    return False, WORDS11.say("resume-lacks" if is_missing else "resume-has", case=_case(s), item=repr(item),
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
        return True, WORDS11.say("yd-right")
    if wrong_case(YOUNG_DALY_CASES, got, [_interval.daly(c, m) for c, m in YOUNG_DALY_CASES], rel=1e-6) is None:
        return True, WORDS11.say("yd-daly")
    (c, m), g, _, hint = miss
    return False, WORDS11.say("yd-wrong", save=f"{c:g}", mtbf=f"{m:g}", got=f"{g:.6g}",
                              hint=WORDS11.say(hint or "yd-other"))


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
    miss = case_miss(fn, LOST_CASES, "return the seconds lost", lost_seconds, LOST_MISTAKES, 1e-6)
    if miss is None:
        return True, WORDS11.say("lost-right")
    (f, i, r), g, _, hint = miss
    return False, WORDS11.say("lost-wrong", fail=f"{f:g}", interval=f"{i:g}", restart=f"{r:g}", got=f"{g:.6g}",
                              hint=WORDS11.say(hint or "lost-other"))


# ---- exercise-11-inexact-resume --------------------------------------------------------------------------
RESUME_LOG_ANSWER = {"A": "loader", "B": "rng", "C": "scheduler", "D": "optimizer", "E": "scaler"}
_LOG_HINTS = {item: f"log-{item}" for item in ITEMS}  # what a resume without each item looks like: said
# of the item a learner named wrongly (the keys of their words)


def _letter_map(answer) -> dict:
    if not isinstance(answer, dict):
        raise AnswerError(WORDS11.say("letters-form", value=describe(answer)))
    out = {}
    for k, v in answer.items():
        key = k.strip().upper() if isinstance(k, str) else k
        if key not in RESUME_LOGS:
            raise AnswerError(WORDS11.say("letters-key", value=describe(k), logs=", ".join(RESUME_LOGS)))
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
        raise AnswerError(WORDS11.say("letters-open" if len(missing) == 1 else "letters-open-many",
                                      logs=", ".join(missing)))
    wrong = [k for k in RESUME_LOGS if got[k] != RESUME_LOG_ANSWER[k]]
    if not wrong:
        return True, WORDS11.say("logs-right")
    k = wrong[0]
    return False, WORDS11.say("log-wrong", letter=k, got=repr(got[k]), wrong=len(wrong), total=len(RESUME_LOGS),
                              hint=WORDS11.say(_LOG_HINTS[got[k]]))
