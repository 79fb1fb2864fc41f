"""Checkers for chapter 10 (when the model does not fit): a tensor-parallel GPT's AllReduce calls per
update, the pipeline bubble, the model-state bytes of a DP x TP x PP layout (the right answers from
``formulas``, the chapter's arithmetic), and a layout that fits (the chapter's layout model).
"""
from __future__ import annotations

import importlib
import math
import numbers

from ..base import phrases
from ..base.runtime import ConfigError
from ..chapters.ch10_parallel import formulas
from ..chapters.ch10_parallel.formulas import GB, model_shape
from ..chapters.ch10_parallel.layout import MAX_ZERO_WITH_PP
from ._core import AnswerError, NotAttempted, case_answers, case_miss, checker, describe, number, same, wrong_case

try:  # the layout model (taught in chapter 10), imported now so that the seal taken at import covers it
    _layout = importlib.import_module("..chapters.ch10_parallel.layout", __package__)
except ModuleNotFoundError as e:  # a labkit without it: layout_fits says so, and fails
    if e.name != "labkit.chapters.ch10_parallel.layout":
        raise
    _layout = None

__all__ = ["tp_allreduces", "bubble", "layout_bytes", "layout_fits"]  # the checkers (check_layout: their helper)

# the hints, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 10; the mistake tables
# below hold the keys of their hints
WORDS = phrases.load_section("lab_messages.md", "Checks: chapter 10", {
    "not-a-function": ("value", "name"),
    **{k: () for k in ("tp-backward-only", "tp-forward-only", "tp-fused-one-pass", "tp-four", "tp-recompute",
                       "tp-swapped", "tp-fc", "tp-no-micro", "tp-four-no-micro", "tp-one-block", "tp-n-plus-1",
                       "tp-one-extra", "tp-two-extra", "tp-twice", "tp-right", "tp-whole", "tp-bytes", "tp-other")},
    "tp-wrong": ("n_layer", "micro_batches", "qkv", "got", "hint"),
    **{k: () for k in ("b-megatron", "b-m-plus-p", "b-p-over", "b-m-minus-1", "b-one-over-m", "b-busy",
                       "b-percent", "b-zero", "b-right", "b-undefined", "b-other")},
    "b-wrong": ("p", "m", "got", "hint"), "b-divided": ("p", "m", "hint"),
    **{k: () for k in ("lb-stage0-dp", "lb-all", "lb-no-tp", "lb-no-pp", "lb-no-tp-pp", "lb-stage-high",
                       "lb-stage-low", "lb-fp32", "lb-opt8", "lb-every-gpu", "lb-all-16", "lb-gb", "lb-gib",
                       "lb-same-stage", "lb-opt-only", "lb-right", "lb-other")},
    "lb-wrong": ("billions", "dp", "tp", "pp", "stage", "want", "got", "hint"),
    "whole-number": ("field", "value"), "dict-keys": ("keys",), "four-numbers": ("value",), "layout-form": ("value",),
    "at-least-1": ("layout",), "stage-range": ("stage",), "no-such-stage": ("stage",),
    "gpus-more": ("dp", "tp", "pp", "product", "n"), "gpus-fewer": ("dp", "tp", "pp", "product", "n"),
    "tp-node": ("tp", "node"), "tp-straddles": ("tp", "node"), "tp-heads": ("tp", "heads"),
    "tp-kv-heads": ("tp", "heads"), "pp-layers": ("pp", "layers"), "dp-batch": ("product", "batch"),
    "too-few-micro": ("micro", "pp"), "zero-with-pp": ("zero", "pp"), "fits-rules": ("used", "usable", "step"),
    "not-fit": ("total", "state", "act", "usable"), "state-more": (), "state-higher": ("more",),
    "state-pp": ("words",), "state-fix": ("stage", "gb"), "state-big": ("words",), "rc-fit": ("gb",),
    "rc-no-fit": ("gb",), "act-words": ("rc",), "act-big": ("gb", "words"),
    "both-big": ("state", "state_words", "act", "act_words"), "uses-every-gpu": ("used", "n"), "no-layout-model": (),
    "layout-fits": ("layout", "reason"), "layout-not": ("layout", "reason")})

# exercise-10-layout-fits: the chapter's example (par.layout.EXAMPLE_SCENARIO: Llama 2 70B on 64 H100s of
# 80 GB, 8 to a node), judged by the chapter's layout model (mixed-precision Adam, bf16 activations, 1F1B).
LAYOUT_SCENARIO = {} if _layout is None else dict(_layout.EXAMPLE_SCENARIO)
if _layout is not None:  # the shape's numbers too, for an answer's arithmetic (and the tests' reference)
    _shape = _layout.model_shape(LAYOUT_SCENARIO["model"])
    LAYOUT_SCENARIO.update(n_params=_shape.n_params, n_layer=_shape.n_layer, d_model=_shape.d_model,
                           n_head=_shape.n_head, gpus_per_node=LAYOUT_SCENARIO["node_size"], gpu_bytes=80e9)
LAYOUT_KEYS = ("dp", "tp", "pp", "zero_stage")

# exercise-10-tp-allreduces: (n_layer, micro_batches, qkv); layers and micro-batches that cannot stand for
# each other (n_layer != micro_batches), so swapping them shows. "separate" first: there forward (2) and
# backward (4) differ, so a hint read off the first failing case can tell one pass from the other
TP_CASES = [(n, m, q) for n, m in ((2, 1), (12, 4), (80, 8), (1, 3), (24, 16)) for q in ("separate", "per_head")]
# exercise-10-bubble: (p, m), p = 1 (no pipeline) and m = 1 (no overlap at all) included, m < p too
BUBBLE_CASES = [(p, m) for p in (2, 4, 1, 3, 8) for m in (8, 1, 2, 4, 3, 16)]
# exercise-10-layout-bytes: (n_params, dp, tp, pp, zero_stage)
LAYOUT_CASES = [(n, dp, tp, pp, s) for n in (7e9, 70e9, 1.3e9)
                for dp, tp, pp in ((1, 1, 1), (8, 1, 1), (1, 8, 1), (1, 1, 4), (4, 2, 2), (8, 8, 2), (2, 4, 8))
                for s in (0, 1, 2, 3)]


def _function(fn, name):
    if not callable(fn):
        raise AnswerError(WORDS.say("not-a-function", value=describe(fn), name=name))
    return fn


# ---- exercise-10-tp-allreduces ---------------------------------------------------------------------------

def _per_block(qkv) -> int:
    c = formulas.tp_collectives_per_block(qkv)
    return c["forward"] + c["backward"]


def _pass(qkv, phase: str) -> int:
    return formulas.tp_collectives_per_block(qkv)[phase]


TP_MISTAKES = [
    (lambda n, m, q: _pass(q, "backward") * n * m, "tp-backward-only"),
    (lambda n, m, q: 2 * n * m, "tp-forward-only"),
    (lambda n, m, q: (2 if q == "per_head" else 6) * n * m, "tp-fused-one-pass"),
    (lambda n, m, q: 4 * n * m, "tp-four"),
    (lambda n, m, q: (2 * _pass(q, "forward") + _pass(q, "backward")) * n * m, "tp-recompute"),
    (lambda n, m, q: _per_block("separate" if q == "per_head" else "per_head") * n * m, "tp-swapped"),
    (lambda n, m, q: (2 + (3 if q == "separate" else 2)) * n * m, "tp-fc"),
    (lambda n, m, q: _per_block(q) * n, "tp-no-micro"),
    (lambda n, m, q: 4 * n, "tp-four-no-micro"),
    (lambda n, m, q: _per_block(q) * m, "tp-one-block"),
    (lambda n, m, q: _per_block(q) * (n + 1) * m, "tp-n-plus-1"),
    (lambda n, m, q: (_per_block(q) * n + 1) * m, "tp-one-extra"),
    (lambda n, m, q: (_per_block(q) * n + 2) * m, "tp-two-extra"),
    (lambda n, m, q: 2 * _per_block(q) * n * m, "tp-twice"),
]


@checker
def tp_allreduces(fn):
    """``fn(n_layer, micro_batches, qkv)`` -> AllReduce calls per optimizer update (forward and backward)
    of a Megatron-style tensor-parallel GPT without sequence parallelism; ``qkv`` is "per_head" (the fused
    qkv weight permuted per head) or "separate" (q, k and v layers, each column-parallel with its own f, as
    ``TPBlockSeparateQKV``). Only the blocks make collectives: the embeddings and the head are replicated."""
    _function(fn, "my_tp_allreduces")
    got = case_answers(fn, TP_CASES, "return a number of AllReduce calls")
    right = [_per_block(q) * n * m for n, m, q in TP_CASES]
    miss = wrong_case(TP_CASES, got, right, TP_MISTAKES)
    if miss is None:
        return True, WORDS.say("tp-right")
    broken = next(((c, g) for c, g in zip(TP_CASES, got) if not g.is_integer()), None)
    (n, m, q), g = broken or miss[:2]
    if broken:
        hint = "tp-whole"
    elif all(mine >= 1000 * r for mine, r in zip(got, right)):
        hint = "tp-bytes"
    else:
        hint = miss[3] or "tp-other"
    return False, WORDS.say("tp-wrong", n_layer=n, micro_batches=m, qkv=repr(q), got=f"{g:g}", hint=WORDS.say(hint))


# ---- exercise-10-bubble --------------------------------------------------------------------------------

_NO_VALUE = object()  # what a formula gives where it divides by zero (where the learner's code raised)


def _ratio(a, b):
    return _NO_VALUE if b == 0 else a / b


def _agrees(got, mistaken) -> bool:
    """Whether a learner's answer is the mistaken one: the same number (float32's rounding allowed), or a
    division by zero in both."""
    if got is _NO_VALUE or mistaken is _NO_VALUE:
        return got is mistaken
    return same(got, mistaken, 1e-6)


BUBBLE_MISTAKES = [
    (lambda p, m: _ratio(p - 1, m), "b-megatron"),
    (lambda p, m: _ratio(p - 1, m + p), "b-m-plus-p"),
    (lambda p, m: _ratio(p, m + p - 1), "b-p-over"),
    (lambda p, m: _ratio(p - 1, m - 1), "b-m-minus-1"),
    (lambda p, m: _ratio(1, m), "b-one-over-m"),
    (lambda p, m: _ratio(m, m + p - 1), "b-busy"),
    (lambda p, m: 100 * (p - 1) / (m + p - 1), "b-percent"),
    (lambda p, m: 0.0, "b-zero"),
]


@checker
def bubble(fn):
    """``fn(p, m)`` -> the pipeline bubble of GPipe or 1F1B with ``p`` stages and ``m`` micro-batches of
    equal cost, as the exercise defines it: idle time ÷ step time, (p − 1)/(m + p − 1)."""
    _function(fn, "my_bubble")
    raw = []
    for p, m in BUBBLE_CASES:  # every answer first; a division by zero is an answer too (a mistake's sign)
        try:
            raw.append(fn(p, m))
        except ZeroDivisionError:
            raw.append(_NO_VALUE)
    if all(r is None or r is Ellipsis for r in raw):
        raise NotAttempted()
    got = [r if r is _NO_VALUE else number(r, "return the bubble as a fraction of the step, e.g. 0.25",
                                           "your function returned") for r in raw]
    miss = wrong_case(BUBBLE_CASES, got, [formulas.bubble_fraction(p, m) for p, m in BUBBLE_CASES], BUBBLE_MISTAKES,
                      eq=_agrees)
    if miss is None:
        return True, WORDS.say("b-right")
    (p, m), g, _, hint = miss
    if g is _NO_VALUE:  # a division by zero is named by a mistake only when that mistake explains every case
        every = [h for model, h in BUBBLE_MISTAKES if all(_agrees(a, model(*c)) for c, a in zip(BUBBLE_CASES, got))]
        return False, WORDS.say("b-divided", p=p, m=m, hint=WORDS.say((every or ["b-undefined"])[0]))
    return False, WORDS.say("b-wrong", p=p, m=m, got=f"{g:.4g}", hint=WORDS.say(hint or "b-other"))


# ---- exercise-10-layout-bytes --------------------------------------------------------------------------

def _state(n, dp, tp, pp, s):
    return formulas.layout_state_bytes(n, dp=dp, tp=tp, pp=pp, zero_stage=s)["total"]


def _shards(n, g, s, w=2, gr=2, o=12):
    """Bytes per GPU of ``n`` parameters (w + gr + o bytes each), ZeRO stage ``s`` over ``g`` ranks."""
    return n * (w / (g if s >= 3 else 1) + gr / (g if s >= 2 else 1) + o / (g if s >= 1 else 1))


LAYOUT_MISTAKES = [
    (lambda n, dp, tp, pp, s: 16 * n / (dp * tp * pp) if s == 0 else _state(n, dp, tp, pp, s),
     "lb-stage0-dp"),
    (lambda n, dp, tp, pp, s: 16 * n / (dp * tp * pp), "lb-all"),
    (lambda n, dp, tp, pp, s: _state(n * tp, dp, tp, pp, s), "lb-no-tp"),
    (lambda n, dp, tp, pp, s: _state(n * pp, dp, tp, pp, s), "lb-no-pp"),
    (lambda n, dp, tp, pp, s: _state(n * tp * pp, dp, tp, pp, s), "lb-no-tp-pp"),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, min(s + 1, 3)), "lb-stage-high"),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, max(s - 1, 0)), "lb-stage-low"),
    (lambda n, dp, tp, pp, s: _shards(n / (tp * pp), dp, s, 4, 4, 8), "lb-fp32"),
    (lambda n, dp, tp, pp, s: _shards(n / (tp * pp), dp, s, 2, 2, 8), "lb-opt8"),
    (lambda n, dp, tp, pp, s: _state(n, dp * tp * pp, tp, pp, s), "lb-every-gpu"),
    (lambda n, dp, tp, pp, s: 16 * n, "lb-all-16"),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, s) / 1e9, "lb-gb"),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, s) / 2**30, "lb-gib"),
    (lambda n, dp, tp, pp, s: _state(n, 1, tp, pp, 0), "lb-same-stage"),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, min(s, 1)), "lb-opt-only"),
]


@checker
def layout_bytes(fn):
    """``fn(n_params, dp, tp, pp, zero_stage)`` -> model-state bytes per GPU with mixed-precision Adam
    (2 + 2 + 12 bytes per parameter): TP and PP split the parameters (N / (tp·pp) per GPU), then ZeRO stage
    ``zero_stage`` shards the optimizer state (≥ 1), the gradients (≥ 2) and the weights (3) over ``dp``."""
    _function(fn, "my_layout_bytes")
    miss = case_miss(fn, LAYOUT_CASES, "return a number of bytes", _state, LAYOUT_MISTAKES, 1e-6)
    if miss is None:
        return True, WORDS.say("lb-right")
    (n, dp, tp, pp, s), g, r, hint = miss
    return False, WORDS.say("lb-wrong", billions=f"{n / 1e9:g}", dp=dp, tp=tp, pp=pp, stage=s, want=f"{r / 1e9:,.2f}",
                            got=f"{g / 1e9:,.4g}", hint=WORDS.say(hint or "lb-other"))


# ---- exercise-10-layout-fits ---------------------------------------------------------------------------

def _whole(words, say: str, key, value) -> int:
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and float(value).is_integer():
        return int(value)
    raise AnswerError(words.say(say, field=key, value=describe(value)))


def read_layout(answer, keys, words, say: tuple) -> dict:
    """A learner's layout as {key: int} over ``keys`` (the last "zero_stage", which "zero" or "stage" stand for)
    from a dict or a tuple/list. ``say``: the keys of ``words`` for each way the answer can be wrong, in order."""
    whole, other_keys, count, form, least, stage = say
    if isinstance(answer, dict):
        keyed = {str(k).strip().lower(): v for k, v in answer.items()}
        for alias in ("zero", "stage"):
            if alias in keyed and "zero_stage" not in keyed:
                keyed["zero_stage"] = keyed.pop(alias)
        if set(keyed) != set(keys):
            raise AnswerError(words.say(other_keys, keys=sorted(keyed)))
        values = [keyed[k] for k in keys]
    elif isinstance(answer, (tuple, list)):
        if len(answer) != len(keys):
            raise AnswerError(words.say(count, value=describe(answer)))
        values = list(answer)
    else:
        raise AnswerError(words.say(form, value=describe(answer)))
    out = {k: _whole(words, whole, k, v) for k, v in zip(keys, values)}
    if any(out[k] < 1 for k in keys[:-1]):
        raise AnswerError(words.say(least, layout=out))
    if out["zero_stage"] not in (0, 1, 2, 3):
        raise AnswerError(words.say(stage, stage=out["zero_stage"]))
    return out


def unfilled(answer) -> bool:
    """A layout still (partly) the placeholder: a None or ``...`` in the tuple or the dict."""
    values = answer.values() if isinstance(answer, dict) else answer if isinstance(answer, (tuple, list)) else ()
    return any(v is None or v is Ellipsis for v in values)


def layout_answer(answer) -> dict:
    """A learner's layout as ``{"dp": int, "tp": int, "pp": int, "zero_stage": int}``."""
    return read_layout(answer, LAYOUT_KEYS, WORDS, ("whole-number", "dict-keys", "four-numbers", "layout-form",
                                                    "at-least-1", "stage-range"))


# ---- exercise-10-layout-fits: (ok, reason) for a layout in a stated scenario, from the layout model ---------

def _answer(answer) -> dict:
    if isinstance(answer, (tuple, list)) and len(answer) in (3, 4):
        answer = dict(zip(("dp", "tp", "pp", "zero_stage"), answer))
    if not isinstance(answer, dict) or not {"dp", "tp", "pp"} <= set(answer):
        raise ConfigError("answer", answer, "a dict with dp, tp, pp (and zero_stage), or a tuple (dp, tp, pp[, zero])")
    out = {k: answer.get(k, 0 if k == "zero_stage" else None) for k in ("dp", "tp", "pp", "zero_stage")}
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "zero_stage" else 1):
            raise ConfigError(k, v, "a whole number >= 1" if k != "zero_stage" else "a ZeRO stage: 0, 1, 2 or 3")
    return out


SCENARIO_KEYS = ("model", "gpu", "n_gpus", "node_size", "interconnect", "global_batch", "seq_len", "micro_batch",
                 "precision", "checkpointing", "even_stages")


def check_layout(scenario: dict, answer) -> tuple:
    """(ok, reason) for a learner's layout (dict, or tuple (dp, tp, pp[, zero_stage])) in a stated scenario: the
    rules below first (ZeRO 0 or 1 with PP: what FSDP + PP holds within a step, DeepSpeed's and Megatron's rule),
    then memory (with the scenario's ``checkpointing``, "none" unless it says): for a layout that does not fit,
    the reason names what is too big (model state or activations) and what would help."""
    if not isinstance(scenario, dict) or not {"model", "gpu", "n_gpus"} <= set(scenario):
        raise ConfigError("scenario", scenario, "a dict with model, gpu, n_gpus (and node_size, interconnect, ...)")
    sc = {k: v for k, v in scenario.items() if k in SCENARIO_KEYS}
    a = _answer(answer)
    dp, tp, pp, zero = a["dp"], a["tp"], a["pp"], a["zero_stage"]
    shape = model_shape(sc["model"])
    n, node = sc["n_gpus"], sc.get("node_size", 8)
    b = sc.get("micro_batch", 1)
    gb = sc.get("global_batch") or 2 * n * b
    if zero not in (0, 1, 2, 3):
        return False, WORDS.say("no-such-stage", stage=zero)
    if dp * tp * pp != n:
        return False, WORDS.say("gpus-more" if dp * tp * pp > n else "gpus-fewer", dp=dp, tp=tp, pp=pp,
                                product=dp * tp * pp, n=n)
    if tp > node:
        return False, WORDS.say("tp-node", tp=tp, node=node)
    if node % tp:
        return False, WORDS.say("tp-straddles", tp=tp, node=node)
    if shape.n_head % tp:
        return False, WORDS.say("tp-heads", tp=tp, heads=shape.n_head)
    if shape.kv_heads % tp:
        return False, WORDS.say("tp-kv-heads", tp=tp, heads=shape.kv_heads)
    if shape.n_layer % pp and sc.get("even_stages", True):
        return False, WORDS.say("pp-layers", pp=pp, layers=shape.n_layer)
    if gb % (dp * b):
        return False, WORDS.say("dp-batch", product=dp * b, batch=gb)
    if gb // (dp * b) < pp:
        return False, WORDS.say("too-few-micro", micro=gb // (dp * b), pp=pp)
    if pp > 1 and zero > MAX_ZERO_WITH_PP:
        return False, WORDS.say("zero-with-pp", zero=zero, pp=pp)
    kw = dict(node_size=node, interconnect=sc.get("interconnect", "infiniband"), global_batch=gb,
              seq_len=sc.get("seq_len"), micro_batch=b, precision=sc.get("precision", "bf16"),
              even_stages=sc.get("even_stages", True))
    ck = sc.get("checkpointing", "none")
    rows = _layout.layouts(sc["model"], sc["gpu"], n, zero_stages=(zero,), checkpointing=ck, **kw)
    row = _find(rows, dp, tp, pp)
    if not row["fits"]:
        return False, _too_big(sc, row, kw, ck)
    return True, WORDS.say("fits-rules", used=f"{row['bytes_per_gpu'] / GB:,.1f}",
                           usable=f"{row['usable_bytes'] / GB:,.1f}", step=f"{row['step_s']:,.2f}")


def _find(rows, dp, tp, pp):
    return next(r for r in rows if (r["dp"], r["tp"], r["pp"]) == (dp, tp, pp))


def _too_big(sc, row, kw, ck) -> str:
    """Why a layout does not fit, naming what is too big -- model state or activations -- and what would help."""
    dp, tp, pp, zero = row["dp"], row["tp"], row["pp"], row["zero_stage"]
    usable, act = row["usable_bytes"], row["activation_bytes"]
    state = row["state_bytes"] + row["zero3_gather_bytes"]
    head = WORDS.say("not-fit", total=f"{row['bytes_per_gpu'] / GB:,.1f}", state=f"{state / GB:,.1f}",
                     act=f"{act / GB:,.1f}", usable=f"{usable / GB:,.1f}") + " "
    top = 0 if dp == 1 else (3 if pp == 1 else MAX_ZERO_WITH_PP)
    higher = [_find(_layout.layouts(sc["model"], sc["gpu"], sc["n_gpus"], zero_stages=(z,), checkpointing=ck,
                                    **kw), dp, tp, pp) for z in range(zero + 1, top + 1)]
    least_state = higher[-1]["state_bytes"] + higher[-1]["zero3_gather_bytes"] if higher else state
    fix = next((r for r in higher if r["fits"]), None)
    state_words = WORDS.say("state-more")
    if higher:
        state_words = WORDS.say("state-higher", more=state_words)
    if pp > 1 and dp > 1:
        state_words = WORDS.say("state-pp", words=state_words)
    if act + least_state <= usable:  # sharding the state is enough
        if fix:
            return head + WORDS.say("state-fix", stage=fix["zero_stage"], gb=f"{fix['bytes_per_gpu'] / GB:,.1f}")
        return head + WORDS.say("state-big", words=state_words)
    again = None if ck == "full" else _find(_layout.layouts(sc["model"], sc["gpu"], sc["n_gpus"], zero_stages=(zero,),
                                                            checkpointing="full", **kw), dp, tp, pp)
    rc = ("" if again is None else " (" + WORDS.say("rc-fit" if again["fits"] else "rc-no-fit",
                                                   gb=f"{again['activation_bytes'] / GB:,.1f}") + ")")
    act_words = WORDS.say("act-words", rc=rc)
    if act >= state:
        return head + WORDS.say("act-big", gb=f"{act / GB:,.1f}", words=act_words)
    return head + WORDS.say("both-big", state=f"{state / GB:,.1f}", state_words=state_words, act=f"{act / GB:,.1f}",
                            act_words=act_words)


@checker
def layout_fits(answer):
    """``answer``: (dp, tp, pp, zero_stage) -- a tuple or a dict -- for ``LAYOUT_SCENARIO``; passes when the
    layout uses every GPU and the chapter's layout model (``check_layout`` below) says it fits."""
    if unfilled(answer):
        raise NotAttempted()  # (None, None, None, None): the placeholder, half filled in
    lay = layout_answer(answer)
    sc = LAYOUT_SCENARIO
    used = lay["dp"] * lay["tp"] * lay["pp"]
    if used != sc["n_gpus"]:
        return False, WORDS.say("uses-every-gpu", used=used, n=sc["n_gpus"])
    if _layout is None:
        return False, WORDS.say("no-layout-model")
    try:
        ok, reason = check_layout(dict(sc), dict(lay))
    except ConfigError as e:  # the layout model refuses it (a TP degree that does not divide the heads...)
        return False, WORDS.say("layout-not", layout=_shown(lay), reason=e)
    return bool(ok), WORDS.say("layout-fits" if ok else "layout-not", layout=_shown(lay), reason=str(reason))


def _shown(lay: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in lay.items())
