"""Checkers for chapter 12 (composing the layout): the activation collectives of tensor parallelism with and
without sequence parallelism, an expert's capacity in slots, the bubble of an interleaved pipeline, and a
DP x TP x PP x EP (x ZeRO) layout of a mixture-of-experts model that fits and is not much slower than the best.
The layout is judged by the chapter's own model (``labkit.chapters.ch12_compose.moelayout``): the rules first,
then memory (which part overflows), then the predicted step against the best layout's.
"""
from __future__ import annotations

import math
from fractions import Fraction

from ..base import phrases
from ..base.runtime import ConfigError
from ..chapters.ch12_compose import moelayout as _ml
from ._core import AnswerError, NotAttempted, a_function, case_miss, checker, describe, number, same, wrong_case
from .parallel import read_layout, unfilled

__all__ = ["sp_collectives", "expert_capacity", "interleaved_bubble", "moe_layout_fits"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter")

# the hints of chapter 12's checkers, in the learner's language:
# notebooks/lab_messages.md, ## Checks: chapter 12; the mistake tables below hold the keys of their hints
WORDS = phrases.load_section("lab_messages.md", "Checks: chapter 12", {
    "sp-whole": ("call", "kind", "got"), "sp-form": ("call", "value"), "sp-two-keys": ("call", "kind", "keys"),
    "sp-missing": ("call", "keys", "kinds", "missing"), "sp-extra": ("call", "got", "kind"), "sp-none": ("call",),
    **{k: () for k in ("sp-two", "sp-sp-forward", "sp-nosp-forward", "sp-still-ar", "sp-kept-ar", "sp-kept-bwd-ar",
                       "sp-nosp-extra", "sp-always-sp", "sp-only-ag", "sp-only-rs", "sp-ag-only", "sp-rs-only",
                       "sp-megatron-ag", "sp-recompute", "sp-recompute-nosp", "sp-double", "sp-one-block",
                       "sp-n-plus-1", "sp-right", "sp-other")},
    "sp-wrong": ("call", "got", "hint"),
    **{k: () for k in ("cap-floor", "cap-round", "cap-floor-plus-1", "cap-no-topk", "cap-div-topk", "cap-no-factor",
                       "cap-div-factor", "cap-all", "cap-ceil-early", "cap-ceil-before-factor", "cap-no-round",
                       "cap-times-e", "cap-right", "cap-whole", "cap-other")},
    "cap-wrong": ("tokens", "n_experts", "top_k", "factor", "got", "want", "hint"),
    **{k: () for k in ("ib-ch10", "ib-ch10-over-v", "ib-v-denominator", "ib-megatron", "ib-megatron-no-v",
                       "ib-v-idle", "ib-plus-p", "ib-p", "ib-busy", "ib-percent", "ib-zero", "ib-right", "ib-other")},
    "ib-wrong": ("p", "m", "v", "got", "want", "hint"),
    # exercise-12-moe-layout
    "moe-whole": ("field", "value"), "moe-dict-keys": ("keys",), "moe-five": ("value",), "moe-form": ("value",),
    "moe-at-least-1": ("layout",), "moe-stage": ("stage",), "moe-gpus": ("product", "n"), "moe-tp-node": ("tp", "node"),
    "moe-heads": ("tp", "heads"), "moe-pp-layers": ("pp", "layers"), "moe-micro": ("batch", "dp", "micro", "pp"),
    "moe-ep-divides": ("ep", "product"), "moe-ep-experts": ("ep", "experts"), "moe-zero-pp": ("zero", "pp"),
    "moe-zero-nothing": ("zero",), "moe-not-fit": ("total", "dense", "experts", "act", "usable"),
    "moe-experts-big": ("layers", "edp"), "moe-dense-big": (), "moe-act-big": (),
    "moe-slow": ("step", "ratio", "best", "factor"), "moe-alltoall": ("mine", "theirs", "ep", "node"),
    "moe-part": ("part", "mine", "theirs"), "moe-no-row": (),
    **{k: () for k in ("part-compute", "part-bubble", "part-tp_comm", "part-ep_alltoall", "part-pp_p2p",
                       "part-dp_comm", "part-optimizer")},  # the parts of a predicted step (moelayout.PART_NAMES)
    "moe-fits": ("total", "usable", "dense", "experts", "act", "step", "ratio", "best_name", "best"),
    "moe-layout": ("layout", "reason")})


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
        raise AnswerError(WORDS.say("sp-whole", call=fn_call, kind=name, got=f"{g:g}"))


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
        raise AnswerError(WORDS.say("sp-form", call=call, value=describe(value)))
    out, extra = {}, {}
    for k, v in value.items():
        kind = _ALIASES.get(_norm_key(k))
        g = number(v, "give each count as a number", f"{call}[{k!r}] is")
        if kind is None:
            extra[k] = g
        elif kind in out:
            raise AnswerError(WORDS.say("sp-two-keys", call=call, kind=kind, keys=sorted(map(str, value))))
        else:
            out[kind] = g
    missing = [k for k in KINDS if k not in out]
    if missing:
        raise AnswerError(WORDS.say("sp-missing", call=call, keys=sorted(map(str, value)), kinds=", ".join(KINDS),
                                    missing=", ".join(missing)))
    for k, g in extra.items():
        if g != 0:
            raise AnswerError(WORDS.say("sp-extra", call=call, got=f"{g:g}", kind=repr(k)))
    for k in KINDS:
        _whole(k, out[k], call)
    return out


def _sp_model(ar_no_sp, ag_sp, rs_sp, ar_sp=0, ag_no_sp=0, rs_no_sp=0):
    """A mistake's counts per layer: (all_reduce, all_gather, reduce_scatter) without and with SP."""
    def model(n, sp):
        a, g, r = (ar_sp, ag_sp, rs_sp) if sp else (ar_no_sp, ag_no_sp, rs_no_sp)
        return {"all_reduce": a * n, "all_gather": g * n, "reduce_scatter": r * n}
    return model


_RIGHT = _sp_model(4, 4, 4)
SP_MISTAKES = [
    (_sp_model(2, 2, 2), "sp-two"),
    (_sp_model(4, 2, 2), "sp-sp-forward"),
    (_sp_model(2, 4, 4), "sp-nosp-forward"),
    (_sp_model(4, 0, 0, ar_sp=4), "sp-still-ar"),
    (_sp_model(4, 4, 4, ar_sp=4), "sp-kept-ar"),
    (_sp_model(4, 2, 2, ar_sp=2), "sp-kept-bwd-ar"),
    (_sp_model(4, 4, 4, ag_no_sp=4, rs_no_sp=4), "sp-nosp-extra"),
    (_sp_model(0, 4, 4, ag_no_sp=4, rs_no_sp=4), "sp-always-sp"),
    (_sp_model(4, 8, 0), "sp-only-ag"),
    (_sp_model(4, 0, 8), "sp-only-rs"),
    (_sp_model(4, 4, 0), "sp-ag-only"),
    (_sp_model(4, 0, 4), "sp-rs-only"),
    (_sp_model(4, 6, 4), "sp-megatron-ag"),
    (_sp_model(6, 6, 6), "sp-recompute"),
    (_sp_model(6, 4, 4), "sp-recompute-nosp"),
    (_sp_model(8, 8, 8), "sp-double"),
    (lambda n, sp: _RIGHT(1, sp), "sp-one-block"),
    (lambda n, sp: _RIGHT(n + 1, sp), "sp-n-plus-1"),
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
            raise AnswerError(WORDS.say("sp-none", call=f"my_sp_collectives({n}, {sp})"))
        got.append(_counts(r, n, sp))
    miss = wrong_case(SP_CASES, got, [sp_counts(n, sp) for n, sp in SP_CASES], SP_MISTAKES, eq=_dict_same)
    if miss is None:
        return True, WORDS.say("sp-right")
    (n, sp), g, _, hint = miss
    return False, WORDS.say("sp-wrong", call=f"my_sp_collectives({n}, {sp})", got=_shown(g),
                            hint=WORDS.say(hint or "sp-other"))


# ---- exercise-12-capacity ------------------------------------------------------------------------------
# (tokens, n_experts, top_k, capacity_factor): capacity factors exact in binary and expert counts such that the
# right answer is the same whatever the order of the arithmetic; exact quotients (floor = ceil) and fractional
# ones below and above .5 (ceil != round), top_k 1 and more, a batch of one token.
CAPACITY_CASES = [(4096, 8, 2, 1.25), (1000, 64, 2, 1.25), (100, 6, 1, 1.0), (50, 16, 1, 1.5), (4096, 256, 8, 1.0),
                  (7, 8, 2, 1.0), (333, 16, 4, 0.75), (1, 8, 2, 1.25), (30, 4, 1, 2.0), (2048, 64, 6, 1.5),
                  (1000, 8, 2, 1.0)]


CAPACITY_MISTAKES = [
    (lambda t, e, k, c: math.floor(Fraction(c) * t * k / e), "cap-floor"),
    (lambda t, e, k, c: round(Fraction(c) * t * k / e), "cap-round"),
    (lambda t, e, k, c: math.floor(Fraction(c) * t * k / e) + 1, "cap-floor-plus-1"),
    (lambda t, e, k, c: math.ceil(Fraction(c) * t / e), "cap-no-topk"),
    (lambda t, e, k, c: math.ceil(Fraction(c) * t / (e * k)), "cap-div-topk"),
    (lambda t, e, k, c: math.ceil(Fraction(t * k, e)), "cap-no-factor"),
    (lambda t, e, k, c: math.ceil(t * k / (e * Fraction(c))), "cap-div-factor"),
    (lambda t, e, k, c: math.ceil(Fraction(c) * t * k), "cap-all"),
    (lambda t, e, k, c: math.ceil(Fraction(c) * t / e) * k, "cap-ceil-early"),
    (lambda t, e, k, c: math.ceil(Fraction(t * k, e)) * Fraction(c), "cap-ceil-before-factor"),
    (lambda t, e, k, c: Fraction(c) * t * k / e, "cap-no-round"),
    (lambda t, e, k, c: math.ceil(Fraction(c) * t * k / e) * e, "cap-times-e"),
]


@checker
def expert_capacity(fn):
    """``fn(tokens, n_experts, top_k, capacity_factor)`` -> slots per expert:
    ceil(capacity_factor · tokens · top_k / n_experts)."""
    a_function(fn, "your function (my_expert_capacity)")
    models = [(lambda *a, m=m: float(m(*a)), h) for m, h in CAPACITY_MISTAKES]
    miss = case_miss(fn, CAPACITY_CASES, "return the number of slots per expert", capacity_slots, models)
    if miss is None:
        return True, WORDS.say("cap-right")
    (t, e, k, c), g, want, hint = miss
    hint = hint or ("cap-other" if g.is_integer() else "cap-whole")
    return False, WORDS.say("cap-wrong", tokens=t, n_experts=e, top_k=k, factor=f"{c:g}", got=f"{g:g}", want=want,
                            hint=WORDS.say(hint))


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
    (lambda p, m, v: _r(p - 1, m + p - 1), "ib-ch10"),
    (lambda p, m, v: _r(p - 1, v * (m + p - 1)), "ib-ch10-over-v"),
    (lambda p, m, v: _r(p - 1, m + v * (p - 1)), "ib-v-denominator"),
    (lambda p, m, v: _r(p - 1, v * m), "ib-megatron"),
    (lambda p, m, v: _r(p - 1, m), "ib-megatron-no-v"),
    (lambda p, m, v: _r(v * (p - 1), v * m + p - 1), "ib-v-idle"),
    (lambda p, m, v: _r(p - 1, v * m + p), "ib-plus-p"),
    (lambda p, m, v: _r(p, v * m + p - 1), "ib-p"),
    (lambda p, m, v: _r(v * m, v * m + p - 1), "ib-busy"),
    (lambda p, m, v: 100 * _r(p - 1, v * m + p - 1), "ib-percent"),
    (lambda p, m, v: 0.0, "ib-zero"),
]


@checker
def interleaved_bubble(fn):
    """``fn(p, m, v)`` -> the idle share of an interleaved pipeline's step, (p − 1)/(v·m + p − 1): ``p`` stages of
    equal cost, ``m`` micro-batches (a multiple of p when v > 1), ``v`` model chunks per rank, messages free
    (v = 1: chapter 10's bubble)."""
    a_function(fn, "your function (my_interleaved_bubble)")
    miss = case_miss(fn, BUBBLE_CASES, "return the bubble as a fraction of the step, e.g. 0.25",
                     interleaved_bubble_share, BUBBLE_MISTAKES, 1e-6)
    if miss is None:
        return True, WORDS.say("ib-right")
    (p, m, v), g, want, hint = miss
    return False, WORDS.say("ib-wrong", p=p, m=m, v=v, got=f"{g:.4g}", want=f"{want:.4g}",
                            hint=WORDS.say(hint or "ib-other"))


# ---- exercise-12-moe-layout ---------------------------------------------------------------------------
KEYS = ("dp", "tp", "pp", "ep", "zero_stage")
# the exercise's scenario (moelayout.EXERCISE_SCENARIO): Qwen3-235B-A22B on 64 H100s, 8 to a node,
# full recomputation; a layout passes when it fits and its predicted step is within SLOW_FACTOR of
# the best
MOE_SCENARIO = dict(_ml.EXERCISE_SCENARIO)
SLOW_FACTOR = _ml.SLOW_FACTOR
SCENARIO_KEYS = ("model", "gpu", "n_gpus", "node_size", "interconnect", "global_batch", "seq_len",
                 "micro_batch", "checkpointing")


def moe_layout_answer(answer) -> dict:
    """A learner's layout as {"dp", "tp", "pp", "ep", "zero_stage"}: from a dict with those keys ("zero" or
    "stage" stand for "zero_stage") or a tuple/list (dp, tp, pp, ep, zero_stage)."""
    return read_layout(answer, KEYS, WORDS, ("moe-whole", "moe-dict-keys", "moe-five", "moe-form", "moe-at-least-1",
                                             "moe-stage"))


def _rules(sc: dict, s, a: dict):
    """The first rule the layout breaks, in words, or None."""
    dp, tp, pp, ep, zero = (a[k] for k in KEYS)
    n, node, b = sc["n_gpus"], sc.get("node_size", 8), sc.get("micro_batch", 1)
    gb = sc.get("global_batch") or 2 * n * b
    if dp * tp * pp != n:
        return WORDS.say("moe-gpus", product=dp * tp * pp, n=n)
    if tp > node or node % tp:
        return WORDS.say("moe-tp-node", tp=tp, node=node)
    if s.n_head % tp or s.n_kv_head % tp:
        return WORDS.say("moe-heads", tp=tp, heads=s.n_kv_head)
    if pp > s.n_layer:
        return WORDS.say("moe-pp-layers", pp=pp, layers=s.n_layer)
    if gb % (dp * b) or gb // (dp * b) < pp:
        return WORDS.say("moe-micro", batch=gb, dp=dp, micro=f"{gb / (dp * b):g}", pp=pp)
    if (dp * tp) % ep:
        return WORDS.say("moe-ep-divides", ep=ep, product=dp * tp)
    if s.n_experts % ep:
        return WORDS.say("moe-ep-experts", ep=ep, experts=s.n_experts)
    if pp > 1 and zero > _ml.MAX_ZERO_WITH_PP:
        return WORDS.say("moe-zero-pp", zero=zero, pp=pp)
    if zero and dp == 1 and ep == tp:
        return WORDS.say("moe-zero-nothing", zero=zero)
    return None


def _too_big(r) -> str:
    parts = {"dense_state": r["dense_state"] + r["gather_bytes"], "expert_state": r["expert_state"],
             "activations": r["activations"]}
    big = max(parts, key=parts.get)
    gb = {k: v / 1e9 for k, v in parts.items()}
    head = WORDS.say("moe-not-fit", total=f"{r['bytes_per_gpu'] / 1e9:,.1f}", dense=f"{gb['dense_state']:,.1f}",
                     experts=f"{gb['expert_state']:,.1f}", act=f"{gb['activations']:,.1f}",
                     usable=f"{r['usable_bytes'] / 1e9:,.1f}") + " "
    key = {"expert_state": "moe-experts-big", "dense_state": "moe-dense-big"}.get(big, "moe-act-big")
    return head + WORDS.say(key, layers=r["layers_per_stage"], edp=r["edp"])


def _too_slow(r, best, sc) -> str:
    k = max(_ml.PARTS, key=lambda p: r["parts"][p] - best["parts"][p])
    mine, theirs = r["parts"][k], best["parts"][k]
    ratio = r["step_s"] / best["step_s"]
    head = WORDS.say("moe-slow", step=f"{r['step_s']:,.2f}", ratio=f"{ratio:.2f}", best=f"{best['step_s']:,.2f}",
                     factor=f"{SLOW_FACTOR:g}") + " "
    node = sc.get("node_size", 8)
    if k == "ep_alltoall" and r["ep_crosses_nodes"]:
        return head + WORDS.say("moe-alltoall", mine=f"{mine:,.2f}", theirs=f"{theirs:,.2f}", ep=r["ep"], node=node)
    return head + WORDS.say("moe-part", part=WORDS.say(f"part-{k}"), mine=f"{mine:,.2f}", theirs=f"{theirs:,.2f}")


def check_moe_layout(scenario: dict, answer) -> tuple:
    """(ok, reason) for a learner's layout (a dict or a tuple (dp, tp, pp, ep, zero_stage)) in a stated scenario:
    the rules, then memory, then the predicted step within SLOW_FACTOR of the best."""
    if not isinstance(scenario, dict) or not {"model", "gpu", "n_gpus"} <= set(scenario):
        raise ConfigError("scenario", scenario, "a dict with model, gpu, n_gpus (node_size, ...)")
    sc = {k: v for k, v in scenario.items() if k in SCENARIO_KEYS}
    a = moe_layout_answer(answer)
    s = _ml.moe_shape(sc["model"])
    broken = _rules(sc, s, a)
    if broken:
        return False, broken
    ck = sc.pop("checkpointing", "none")
    rows = _ml.layouts(**sc, checkpointing=(ck,))
    r = _ml.find(rows, a["dp"], a["tp"], a["pp"], a["ep"], a["zero_stage"])
    if r is None:   # every rule above holds, so the layout model lists it: a guard, not a hint
        return False, WORDS.say("moe-no-row")
    if not r["fits"]:
        return False, _too_big(r)
    best = _ml.best_layout(rows)
    if r["step_s"] > SLOW_FACTOR * best["step_s"]:
        return False, _too_slow(r, best, sc)
    ratio = r["step_s"] / best["step_s"]
    return True, WORDS.say("moe-fits", total=f"{r['bytes_per_gpu'] / 1e9:,.1f}",
                           usable=f"{r['usable_bytes'] / 1e9:,.1f}", dense=f"{r['dense_state'] / 1e9:,.1f}", experts=f"{r['expert_state'] / 1e9:,.1f}",
                           act=f"{r['activations'] / 1e9:,.1f}", step=f"{r['step_s']:,.2f}", ratio=f"{ratio:.2f}",
                           best_name=_ml.name(best), best=f"{best['step_s']:,.2f}")


@checker
def moe_layout_fits(answer):
    """``answer``: (dp, tp, pp, ep, zero_stage) -- a tuple or a dict -- for ``MOE_SCENARIO``; passes when the layout
    obeys the rules, fits, and its predicted step is within ``SLOW_FACTOR`` of the best (``check_moe_layout``)."""
    if unfilled(answer):
        raise NotAttempted()
    lay = moe_layout_answer(answer)
    shown = ", ".join(f"{k}={v}" for k, v in lay.items())
    ok, reason = check_moe_layout(dict(MOE_SCENARIO), lay)
    return bool(ok), WORDS.say("moe-layout", layout=shown, reason=reason)
