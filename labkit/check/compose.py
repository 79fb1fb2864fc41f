"""Checkers for chapter 12 (composing the layout): the activation collectives of tensor parallelism with and
without sequence parallelism, an expert's capacity in slots, and the bubble of an interleaved pipeline.

Every checker calls the learner's function on all of its cases first and only then works out the right answers
(the reference formulas below, the chapter's own), so no answer exists while the learner's code runs. A wrong
function is matched against the usual mistakes over every case, and the hint names the one it made.
"""
from __future__ import annotations

import math
from fractions import Fraction

from ._core import AnswerError, NotAttempted, a_function, case_answers, checker, describe, diagnose, number, same

__all__ = ["sp_collectives", "expert_capacity", "interleaved_bubble"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter")


# ---- the reference formulas (CH12's; the room's instruments count with the same) --------------------------

def sp_counts(n_layer: int, sequence_parallel: bool) -> dict:
    """Activation collectives of one forward + backward of ``n_layer`` Megatron-TP blocks, one micro-batch, no
    recomputation. Each block has two TP regions (attention, MLP). Without SP each makes one AllReduce forward
    (after the row-parallel layer) and one backward (the column-parallel layer's input gradient): 4 a block.
    With SP the forward's AllReduce becomes a ReduceScatter after the row-parallel layer and an AllGather
    before the column-parallel one (2 + 2 a block); backward mirrors them (an AllGather's backward is a
    ReduceScatter and vice versa): 4 + 4 a block."""
    if sequence_parallel:
        return {"all_reduce": 0, "all_gather": 4 * n_layer, "reduce_scatter": 4 * n_layer}
    return {"all_reduce": 4 * n_layer, "all_gather": 0, "reduce_scatter": 0}


def capacity_slots(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(capacity_factor · tokens · top_k / n_experts), in exact arithmetic."""
    return math.ceil(Fraction(capacity_factor) * tokens * top_k / n_experts)


def interleaved_bubble_share(p: int, m: int, v: int) -> float:
    """The idle share of an interleaved step: (p − 1) / (v·m + p − 1), in slots of one model chunk (for v > 1,
    m a multiple of p: the schedule runs rounds of p micro-batches)."""
    return (p - 1) / (v * m + p - 1)


def _whole(name, g, fn_call) -> None:
    if not float(g).is_integer() or g < 0:
        raise AnswerError(f"{fn_call} gave {name} = {g:g}: a number of calls is a whole number, 0 or more")


# ---- exercise-12-sp-collectives ------------------------------------------------------------------------
# (n_layer, sequence_parallel): layer counts that cannot stand for the 4 (or 2) per block, and 1 layer
SP_LAYERS = (2, 12, 1, 80, 3)
SP_CASES = [(n, sp) for n in SP_LAYERS for sp in (False, True)]


def _norm_key(k) -> str:
    return k.strip().lower().replace("-", "").replace("_", "").replace(" ", "") if isinstance(k, str) else k


_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}


def _counts(value, n_layer, sp) -> dict:
    """The learner's dict as {kind: float} over KINDS; other keys must be 0 (an "all_to_all": 0 is no mistake)."""
    call = f"my_sp_collectives({n_layer}, {sp})"
    if not isinstance(value, dict):
        raise AnswerError(f"{call} returned {describe(value)}; return a dict with the keys \"all_reduce\", "
                          "\"all_gather\" and \"reduce_scatter\", e.g. {\"all_reduce\": 8, \"all_gather\": 0, "
                          "\"reduce_scatter\": 0}")
    out, extra = {}, {}
    for k, v in value.items():
        kind = _ALIASES.get(_norm_key(k))
        g = number(v, "give each count as a number", f"{call}[{k!r}] is")
        if kind is None:
            extra[k] = g
        elif kind in out:
            raise AnswerError(f"{call} returned two keys for {kind} ({sorted(map(str, value))}): one each")
        else:
            out[kind] = g
    missing = [k for k in KINDS if k not in out]
    if missing:
        raise AnswerError(f"{call} returned the keys {sorted(map(str, value))}; give all three, "
                          f"{', '.join(KINDS)}, with 0 where there are none ({', '.join(missing)} missing)")
    for k, g in extra.items():
        if g != 0:
            raise AnswerError(f"{call} counted {g:g} of {k!r}: Megatron-style TP (with or without sequence "
                              "parallelism) issues only AllReduce, AllGather and ReduceScatter here; "
                              "count those three")
    for k in KINDS:
        _whole(k, out[k], call)
    return out


def _sp_model(ar_no_sp, ag_sp, rs_sp, ar_sp=0, ag_no_sp=0, rs_no_sp=0):
    """A mistake's counts per layer: (all_reduce, all_gather, reduce_scatter) without and with SP."""
    def model(n, sp):
        a, g, r = (ar_sp, ag_sp, rs_sp) if sp else (ar_no_sp, ag_no_sp, rs_no_sp)
        return {"all_reduce": a * n, "all_gather": g * n, "reduce_scatter": r * n}
    return model


def _per_block(model):
    return lambda n, sp: model(1, sp)


_RIGHT = _sp_model(4, 4, 4)
SP_MISTAKES = [
    (_sp_model(2, 2, 2), "you counted 2 a block: that is one pass (the forward only), or one of the two TP "
     "regions (attention only, or the MLP only). Each of attention and the MLP makes one collective forward "
     "and one backward without SP (4 AllReduces a block), and 2 + 2 forward and 2 + 2 backward with SP."),
    (_sp_model(4, 2, 2), "with sequence parallelism you counted the forward only (or one pass's 2 + 2): "
     "autograd runs the mirror of each one in backward -- an AllGather's backward is a ReduceScatter and a "
     "ReduceScatter's an AllGather -- so 4 AllGathers and 4 ReduceScatters a block."),
    (_sp_model(2, 4, 4), "without sequence parallelism you counted the forward only: the backward AllReduces "
     "the input gradient of each column-parallel layer (qkv, fc) too, 2 + 2 a block."),
    (_sp_model(4, 0, 0, ar_sp=4), "with sequence parallelism you still counted AllReduces: SP replaces each one "
     "by a ReduceScatter (after the row-parallel layer) and an AllGather (before the column-parallel one), "
     "so no AllReduce is left in the blocks."),
    (_sp_model(4, 4, 4, ar_sp=4), "with sequence parallelism you kept the AllReduces and added the AllGathers and "
     "ReduceScatters: SP replaces each AllReduce (AllReduce = ReduceScatter + AllGather), it does not add to it."),
    (_sp_model(4, 2, 2, ar_sp=2), "with sequence parallelism you kept the backward's AllReduces: the backward "
     "mirrors SP's forward too (AllGather ↔ ReduceScatter), so no AllReduce is left."),
    (_sp_model(4, 4, 4, ag_no_sp=4, rs_no_sp=4), "without sequence parallelism you counted SP's AllGathers and "
     "ReduceScatters too: plain TP has only the AllReduces, 4 a block."),
    (_sp_model(0, 4, 4, ag_no_sp=4, rs_no_sp=4), "you gave SP's counts whatever sequence_parallel is: without it "
     "each TP region makes one AllReduce forward and one backward (4 a block), and no AllGather or ReduceScatter."),
    (_sp_model(4, 8, 0), "with sequence parallelism you counted only AllGathers: the forward ReduceScatters after "
     "each row-parallel layer (2 a block), and the backward of each AllGather is a ReduceScatter."),
    (_sp_model(4, 0, 8), "with sequence parallelism you counted only ReduceScatters: the forward AllGathers "
     "before each column-parallel layer (2 a block), and the backward of each ReduceScatter is an AllGather."),
    (_sp_model(4, 4, 0), "with sequence parallelism you counted the AllGathers only: as many ReduceScatters come "
     "with them (after each row-parallel layer forward, and as each AllGather's backward)."),
    (_sp_model(4, 0, 4), "with sequence parallelism you counted the ReduceScatters only: as many AllGathers come "
     "with them (before each column-parallel layer forward, and as each ReduceScatter's backward)."),
    (_sp_model(4, 6, 4), "with sequence parallelism you counted Megatron's extra AllGather in backward (the "
     "sequence-sharded input gathered again for the weight gradient, to save memory): the exercise keeps the "
     "gathered input, as autograd does with torch's SequenceParallel: 4 AllGathers a block."),
    (_sp_model(6, 6, 6), "you counted the forward twice: that is activation recomputation, which re-runs each "
     "block's forward in backward with its collectives. The exercise has none: 4 a block (4 + 4 with SP)."),
    (_sp_model(6, 4, 4), "without sequence parallelism you counted the forward twice (recomputation): the "
     "exercise has none, 2 AllReduces forward and 2 backward a block."),
    (_sp_model(8, 8, 8), "you counted twice as many: each TP region (attention, MLP) makes one collective in each "
     "pass without SP, 4 a block; 2 + 2 each pass with SP, 4 + 4 a block."),
    (_per_block(_RIGHT), "those are the counts of ONE block: multiply by n_layer."),
    (lambda n, sp: _RIGHT(n + 1, sp), "you counted n_layer + 1 blocks: the embeddings and the head make no TP "
     "activation collective in this exercise."),
]


def _blank(r) -> bool:
    if isinstance(r, dict) and r:
        return all(v is None or v is Ellipsis for v in r.values())
    return r is None or r is Ellipsis


def _dict_same(a: dict, b: dict) -> bool:
    return all(same(a[k], b[k]) for k in KINDS)


def _shown(d: dict) -> str:
    return "{" + ", ".join(f"{k!r}: {d[k]:g}" for k in KINDS) + "}"


@checker
def sp_collectives(fn):
    """``fn(n_layer, sequence_parallel)`` -> {"all_reduce", "all_gather", "reduce_scatter": calls}: the activation
    collectives of one forward + backward of ``n_layer`` Megatron-TP blocks, one micro-batch, no recomputation.
    Without SP {4L, 0, 0}; with SP {0, 4L, 4L}. Other keys may be there with 0."""
    a_function(fn, "your function (my_sp_collectives)")
    raw = [fn(n, sp) for n, sp in SP_CASES]
    if all(_blank(r) for r in raw):  # the body still `...`, or the dict of the cell's comment, still blank
        raise NotAttempted()
    got = []
    for (n, sp), r in zip(SP_CASES, raw):
        if r is None:
            raise AnswerError(f"my_sp_collectives({n}, {sp}) returned None (no return reached there?); return a "
                              "dict of counts")
        got.append(_counts(r, n, sp))
    right = [sp_counts(n, sp) for n, sp in SP_CASES]
    first = next((i for i, (g, r) in enumerate(zip(got, right)) if not _dict_same(g, r)), None)
    if first is None:
        return True, ("right: without SP each of attention and the MLP AllReduces once forward and once backward "
                      "(4 a block); with SP each AllReduce is a ReduceScatter + AllGather in each pass (4 + 4 a "
                      "block): the same bytes on a ring, and the activations between the regions stay sharded.")
    (n, sp), g = SP_CASES[first], got[first]
    where = f"my_sp_collectives({n}, {sp}) returned {_shown(g)}: "
    for model, hint in SP_MISTAKES:  # the mistake that explains every case
        if all(_dict_same(g_, model(*c)) for c, g_ in zip(SP_CASES, got)):
            return False, where + hint
    for model, hint in SP_MISTAKES:  # else the one that explains this case, where it differs from the right one
        w = model(n, sp)
        if _dict_same(g, w) and not _dict_same(right[first], w):
            return False, where + hint
    return False, where + ("not it. Per block there are two TP regions (attention, the MLP): which collective "
                           "does each make forward, and which in backward? Then times n_layer.")


# ---- exercise-12-capacity ------------------------------------------------------------------------------
# (tokens, n_experts, top_k, capacity_factor): capacity factors exact in binary and expert counts such that the
# right answer is the same whatever the order of the arithmetic; exact quotients (floor = ceil) and fractional
# ones below and above .5 (ceil != round), top_k 1 and more, a batch of one token.
CAPACITY_CASES = [(4096, 8, 2, 1.25), (1000, 64, 2, 1.25), (100, 6, 1, 1.0), (50, 16, 1, 1.5), (4096, 256, 8, 1.0),
                  (7, 8, 2, 1.0), (333, 16, 4, 0.75), (1, 8, 2, 1.25), (30, 4, 1, 2.0), (2048, 64, 6, 1.5),
                  (1000, 8, 2, 1.0)]


def _ceil(x) -> int:
    return math.ceil(x)


CAPACITY_MISTAKES = [
    (lambda t, e, k, c: math.floor(Fraction(c) * t * k / e), "you rounded down (floor, int() or //): a fraction of "
     "a slot still needs a whole slot, or the expert drops a token it should take. Round up: math.ceil."),
    (lambda t, e, k, c: round(Fraction(c) * t * k / e), "you rounded to the nearest: a fraction of a slot still "
     "needs a whole slot. Round up: math.ceil."),
    (lambda t, e, k, c: math.floor(Fraction(c) * t * k / e) + 1, "you added 1 to the rounded-down value: that is "
     "one too many where the slots come out whole. Round up: math.ceil."),
    (lambda t, e, k, c: _ceil(Fraction(c) * t / e), "you left out top_k: each token goes to top_k experts, so "
     "tokens · top_k assignments are shared among the experts, not tokens."),
    (lambda t, e, k, c: _ceil(Fraction(c) * t / (e * k)), "you divided by top_k: each token takes a slot in each of "
     "its top_k experts, so top_k multiplies the assignments."),
    (lambda t, e, k, c: _ceil(Fraction(t * k, e)), "you left out the capacity factor: it is the head-room above "
     "an even share (1.25 = 25 % more slots than tokens · top_k / n_experts)."),
    (lambda t, e, k, c: _ceil(t * k / (e * Fraction(c))), "you divided by the capacity factor: it multiplies the "
     "even share (head-room above it)."),
    (lambda t, e, k, c: _ceil(Fraction(c) * t * k), "that is the slots of all the experts together: divide by "
     "n_experts for one expert's."),
    (lambda t, e, k, c: _ceil(Fraction(c) * t / e) * k, "you rounded up before multiplying by top_k: round once, "
     "at the end, ceil(capacity_factor · tokens · top_k / n_experts)."),
    (lambda t, e, k, c: _ceil(Fraction(t * k, e)) * Fraction(c), "you rounded up before the capacity factor: "
     "round once, at the end."),
    (lambda t, e, k, c: Fraction(c) * t * k / e, "you did not round: the capacity is a number of slots, a whole "
     "number: round up (math.ceil)."),
    (lambda t, e, k, c: _ceil(Fraction(c) * t * k / e) * e, "that is the slots of all the experts together "
     "(capacity × n_experts): give one expert's."),
]


@checker
def expert_capacity(fn):
    """``fn(tokens, n_experts, top_k, capacity_factor)`` -> slots per expert:
    ceil(capacity_factor · tokens · top_k / n_experts)."""
    a_function(fn, "your function (my_expert_capacity)")
    got = case_answers(fn, CAPACITY_CASES, "return the number of slots per expert")
    right = [capacity_slots(*c) for c in CAPACITY_CASES]
    if all(same(g, r) for g, r in zip(got, right)):
        return True, ("right: tokens · top_k assignments shared evenly among the experts, times the head-room, "
                      "rounded up to whole slots. A token routed to a full expert is dropped (it skips the MLP "
                      "through the residual).")
    i = next(i for i, (g, r) in enumerate(zip(got, right)) if not same(g, r))
    (t, e, k, c), g = CAPACITY_CASES[i], got[i]
    where = f"my_expert_capacity({t}, {e}, {k}, {c:g}) returned {g:g}, expected {right[i]}: "
    models = [(lambda *a, m=m: float(m(*a)), h) for m, h in CAPACITY_MISTAKES]
    hint = diagnose(CAPACITY_CASES, got, right, models)
    if hint is None and not g.is_integer():
        hint = "a number of slots is a whole number: round up (math.ceil)."
    return False, where + (hint or "not it. How many token-to-expert assignments are there, what is one expert's "
                           "even share of them, and how much head-room does the capacity factor add?")


# ---- exercise-12-interleaved-bubble --------------------------------------------------------------------
# (p, m, v): one stage (no bubble), v = 1 (chapter 10's bubble, any m: m = 1, m < p, m much larger than p), and
# v > 1 only where m is a multiple of p: with fewer micro-batches than ranks one micro-batch's trip through the
# v·p chunks outlasts (v·m + p − 1) slots (p = 4, m = 1, v = 2 idles 3/4 of the step, not 3/5), so the
# formula, and a learner who reasons it out, part there
BUBBLE_CASES = [(p, m, v) for p in (4, 2, 1, 8, 3) for m in (8, 1, 4, 16, 3) for v in (2, 1, 4, 3)
                if v == 1 or m % p == 0]


def _r(a, b):
    return a / b if b else float("nan")


BUBBLE_MISTAKES = [
    (lambda p, m, v: _r(p - 1, m + p - 1), "that is chapter 10's bubble, (p − 1)/(m + p − 1): you left out v. "
     "With v chunks per rank the step is v·m chunk slots of work, and the fill and drain still take p − 1 of "
     "them (each one a chunk, 1/v of a stage)."),
    (lambda p, m, v: _r(p - 1, v * (m + p - 1)), "that is chapter 10's bubble divided by v, (p − 1)/(v·(m + p − 1)): "
     "v multiplied the p − 1 in the denominator too. The idle time shrinks v-fold, the work does not: in chunk "
     "slots the step is v·m + p − 1."),
    (lambda p, m, v: _r(p - 1, m + v * (p - 1)), "v multiplied the p − 1 in the denominator: more chunks make the "
     "fill and drain SHORTER (a chunk is 1/v of a stage), not longer. In chunk slots the work is v·m and the "
     "bubble p − 1."),
    (lambda p, m, v: _r(p - 1, v * m), "that is (p − 1)/(v·m), Megatron-LM's bubble relative to the ideal "
     "(bubble-free) time. The exercise asks for the idle share of the whole step: idle ÷ (work + idle)."),
    (lambda p, m, v: _r(p - 1, m), "that is (p − 1)/m: Megatron-LM's ideal-relative bubble, and without v. The "
     "exercise asks for idle ÷ step, with v chunks per rank."),
    (lambda p, m, v: _r(v * (p - 1), v * m + p - 1), "v multiplied the idle time: interleaving divides it (each "
     "fill and drain slot is one chunk, 1/v of a stage)."),
    (lambda p, m, v: _r(p - 1, v * m + p), "the step lasts v·m + p − 1 chunk slots, not v·m + p."),
    (lambda p, m, v: _r(p, v * m + p - 1), "each stage waits p − 1 chunk slots (the fill and the drain), not p; with "
     "one stage there is no bubble."),
    (lambda p, m, v: _r(v * m, v * m + p - 1), "that is the BUSY share of the step: the bubble is the idle share."),
    (lambda p, m, v: 100 * _r(p - 1, v * m + p - 1), "that is a percentage: return the share as a fraction "
     "(0.25, not 25)."),
    (lambda p, m, v: 0.0, "you returned 0 where there is a bubble (integer division // rounds the share down to 0?)."),
]


@checker
def interleaved_bubble(fn):
    """``fn(p, m, v)`` -> the idle share of an interleaved pipeline's step, (p − 1)/(v·m + p − 1): ``p`` stages of
    equal cost, ``m`` micro-batches (a multiple of p when v > 1), ``v`` model chunks per rank, messages free
    (v = 1: chapter 10's bubble)."""
    a_function(fn, "your function (my_interleaved_bubble)")
    got = case_answers(fn, BUBBLE_CASES, "return the bubble as a fraction of the step, e.g. 0.25")
    right = [interleaved_bubble_share(*c) for c in BUBBLE_CASES]
    if all(same(g, r, 1e-6) for g, r in zip(got, right)):
        return True, ("right: in slots of one chunk (1/v of a stage) each rank works v·m of them and idles p − 1 "
                      "(the fill and the drain), so interleaving divides the bubble's time by v.")
    i = next(i for i, (g, r) in enumerate(zip(got, right)) if not same(g, r, 1e-6))
    (p, m, v), g = BUBBLE_CASES[i], got[i]
    where = f"my_interleaved_bubble({p}, {m}, {v}) returned {g:.4g}, expected {right[i]:.4g}: "
    hint = diagnose(BUBBLE_CASES, got, right, BUBBLE_MISTAKES, 1e-6)
    return False, where + (hint or "not it. Count in chunk slots (1/v of a stage): how many does a rank work, and "
                           "how many does it wait for the fill and the drain?")
