"""Checker for chapter 12 (composing the layout): a DP x TP x PP x EP (x ZeRO) layout of a
mixture-of-experts model that fits and is not much slower than the best one
(exercise-12-moe-layout).

The layout is judged by the chapter's own model (``labkit.chapters.ch12_compose.moelayout``): the
rules first (every GPU used, TP in a node and on whole heads, EP carved out of dp x tp and on whole
experts, enough micro-batches, ZeRO 0/1 with PP), then memory (which part overflows), then the
predicted step against the best layout's. The hint names the first thing wrong.
"""
from __future__ import annotations

import math
import numbers

from ..base.runtime import ConfigError
from ..chapters.ch12_compose import moelayout as _ml
from ._core import AnswerError, NotAttempted, checker, describe
from .compose import WORDS  # chapter 12's hints (## Checks: chapter 12 of lab_messages.md), the moe- ones here

__all__ = ["moe_layout_fits"]

KEYS = ("dp", "tp", "pp", "ep", "zero_stage")
# the exercise's scenario (moelayout.EXERCISE_SCENARIO): Qwen3-235B-A22B on 64 H100s, 8 to a node,
# full recomputation; a layout passes when it fits and its predicted step is within SLOW_FACTOR of
# the best
MOE_SCENARIO = dict(_ml.EXERCISE_SCENARIO)
SLOW_FACTOR = _ml.SLOW_FACTOR
SCENARIO_KEYS = ("model", "gpu", "n_gpus", "node_size", "interconnect", "global_batch", "seq_len",
                 "micro_batch", "checkpointing")


def _whole(key, value) -> int:
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and float(value).is_integer():
        return int(value)
    raise AnswerError(WORDS.say("moe-whole", field=key, value=describe(value)))


def moe_layout_answer(answer) -> dict:
    """A learner's layout as {"dp", "tp", "pp", "ep", "zero_stage"}: from a dict with those keys
    ("zero" or "stage" stand for "zero_stage") or a tuple/list (dp, tp, pp, ep, zero_stage)."""
    if isinstance(answer, dict):
        keys = {str(k).strip().lower(): v for k, v in answer.items()}
        for alias in ("zero", "stage"):
            if alias in keys and "zero_stage" not in keys:
                keys["zero_stage"] = keys.pop(alias)
        if set(keys) != set(KEYS):
            raise AnswerError(WORDS.say("moe-dict-keys", keys=sorted(keys)))
        values = [keys[k] for k in KEYS]
    elif isinstance(answer, (tuple, list)):
        if len(answer) != 5:
            raise AnswerError(WORDS.say("moe-five", value=describe(answer)))
        values = list(answer)
    else:
        raise AnswerError(WORDS.say("moe-form", value=describe(answer)))
    out = {k: _whole(k, v) for k, v in zip(KEYS, values)}
    if any(out[k] < 1 for k in KEYS[:4]):
        raise AnswerError(WORDS.say("moe-at-least-1", layout=out))
    if out["zero_stage"] not in (0, 1, 2, 3):
        raise AnswerError(WORDS.say("moe-stage", stage=out["zero_stage"]))
    return out


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
    if big == "expert_state":
        return head + WORDS.say("moe-experts-big", layers=r["layers_per_stage"], edp=r["edp"])
    if big == "dense_state":
        return head + WORDS.say("moe-dense-big")
    return head + WORDS.say("moe-act-big")


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
    """(ok, reason) for a learner's layout (a dict or a tuple (dp, tp, pp, ep, zero_stage)) in a
    stated scenario: the rules, then memory, then the predicted step within SLOW_FACTOR of the
    best."""
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
    """``answer``: (dp, tp, pp, ep, zero_stage) -- a tuple or a dict -- for ``MOE_SCENARIO``; passes
    when the layout obeys the rules, fits, and its predicted step is within ``SLOW_FACTOR`` of the
    best layout's (the chapter's layout model, ``moelayout.layouts``)."""
    if isinstance(answer, (tuple, list)) and any(v is None or v is Ellipsis for v in answer):
        raise NotAttempted()
    if isinstance(answer, dict) and any(v is None or v is Ellipsis for v in answer.values()):
        raise NotAttempted()
    lay = moe_layout_answer(answer)
    shown = ", ".join(f"{k}={v}" for k, v in lay.items())
    ok, reason = check_moe_layout(dict(MOE_SCENARIO), lay)
    return bool(ok), WORDS.say("moe-layout", layout=shown, reason=reason)
