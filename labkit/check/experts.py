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

from ..base.errors import ConfigError
from ..chapters.ch12_compose import moelayout as _ml
from ._core import AnswerError, NotAttempted, checker, describe

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
    raise AnswerError(f"your {key} is {describe(value)}; give a whole number")


def moe_layout_answer(answer) -> dict:
    """A learner's layout as {"dp", "tp", "pp", "ep", "zero_stage"}: from a dict with those keys
    ("zero" or "stage" stand for "zero_stage") or a tuple/list (dp, tp, pp, ep, zero_stage)."""
    if isinstance(answer, dict):
        keys = {str(k).strip().lower(): v for k, v in answer.items()}
        for alias in ("zero", "stage"):
            if alias in keys and "zero_stage" not in keys:
                keys["zero_stage"] = keys.pop(alias)
        if set(keys) != set(KEYS):
            raise AnswerError(f"your dict has keys {sorted(keys)}; give exactly dp, tp, pp, ep and "
                              "zero_stage, e.g. dict(dp=64, tp=1, pp=1, ep=64, zero_stage=3)")
        values = [keys[k] for k in KEYS]
    elif isinstance(answer, (tuple, list)):
        if len(answer) != 5:
            raise AnswerError(f"your answer is {describe(answer)}; give five numbers (dp, tp, "
                              "pp, ep, zero_stage), e.g. (64, 1, 1, 64, 3)")
        values = list(answer)
    else:
        raise AnswerError(f"your answer is {describe(answer)}; give (dp, tp, pp, ep, zero_stage) "
                          "as a tuple or a dict")
    out = {k: _whole(k, v) for k, v in zip(KEYS, values)}
    if any(out[k] < 1 for k in KEYS[:4]):
        raise AnswerError(f"your layout is {out}: dp, tp, pp and ep are each at least 1")
    if out["zero_stage"] not in (0, 1, 2, 3):
        raise AnswerError(f"your zero_stage is {out['zero_stage']}; a ZeRO stage is 0, 1, 2 or 3")
    return out


def _rules(sc: dict, s, a: dict):
    """The first rule the layout breaks, in words, or None."""
    dp, tp, pp, ep, zero = (a[k] for k in KEYS)
    n, node, b = sc["n_gpus"], sc.get("node_size", 8), sc.get("micro_batch", 1)
    gb = sc.get("global_batch") or 2 * n * b
    if dp * tp * pp != n:
        return (f"dp × tp × pp = {dp * tp * pp}, but the scenario has {n} GPUs: a layout uses "
                "every one (ep is not a fourth factor: EP regroups the dp × tp ranks of a stage).")
    if tp > node or node % tp:
        return (f"tp = {tp} does not fit in a node of {node} GPUs: TP's collectives in every "
                "layer need the node's own link. Keep tp within a node, a divisor of it.")
    if s.n_head % tp or s.n_kv_head % tp:
        return f"tp = {tp} does not divide the {s.n_kv_head} K/V heads: TP splits whole heads."
    if pp > s.n_layer:
        return f"pp = {pp} stages for {s.n_layer} layers: a stage needs at least one layer."
    if gb % (dp * b) or gb // (dp * b) < pp:
        return (f"{gb} sequences over dp = {dp} give {gb / (dp * b):g} micro-batches per DP rank "
                f"for {pp} stages: 1F1B needs a whole number of them, at least one per stage.")
    if (dp * tp) % ep:
        return (f"ep = {ep} does not divide dp × tp = {dp * tp}: the EP groups are carved out of "
                "the dp × tp ranks of a pipeline stage (expert TP 1), so ep must divide them.")
    if s.n_experts % ep:
        return (f"ep = {ep} does not divide the {s.n_experts} experts of a layer: each EP rank "
                "holds n_experts / ep whole experts.")
    if pp > 1 and zero > _ml.MAX_ZERO_WITH_PP:
        return (f"ZeRO-{zero} with pipeline parallelism (pp = {pp}): as in chapter 10, only ZeRO-0 "
                "or ZeRO-1 with PP (gradients sharded per micro-batch would need a ReduceScatter "
                "for every micro-batch each stage runs).")
    if zero and dp == 1 and ep == tp:
        return (f"ZeRO-{zero} has nothing to shard: with dp = 1 and ep = tp no state is replicated "
                "(edp = dp × tp / ep = 1). Answer zero_stage 0.")
    return None


def _too_big(r) -> str:
    parts = {"dense_state": r["dense_state"] + r["gather_bytes"], "expert_state": r["expert_state"],
             "activations": r["activations"]}
    big = max(parts, key=parts.get)
    gb = {k: v / 1e9 for k, v in parts.items()}
    head = (f"it does not fit: {r['bytes_per_gpu'] / 1e9:,.1f} GB per GPU (dense state "
            f"{gb['dense_state']:,.1f} + expert state {gb['expert_state']:,.1f} + activations "
            f"{gb['activations']:,.1f}) against {r['usable_bytes'] / 1e9:,.1f} GB usable. ")
    if big == "expert_state":
        return head + ("The experts' state overflows: each GPU holds 1/ep of the routed experts "
                       f"of {r['layers_per_stage']} layers. More EP or more PP shrinks it; ZeRO "
                       f"shards it only over the edp = {r['edp']} expert replicas.")
    if big == "dense_state":
        return head + ("The dense state overflows (attention, embeddings, router): more TP or "
                       "PP, or a ZeRO stage over dp.")
    return head + ("The activations overflow: more TP (sequence parallelism splits them) or fewer "
                   "micro-batches in flight (1F1B's stage 0 holds one per stage).")


def _too_slow(r, best, sc) -> str:
    k = max(_ml.PARTS, key=lambda p: r["parts"][p] - best["parts"][p])
    mine, theirs = r["parts"][k], best["parts"][k]
    ratio = r["step_s"] / best["step_s"]
    head = (f"it fits, but its predicted step is {r['step_s']:,.2f} s, {ratio:.2f}× the best "
            f"layout's {best['step_s']:,.2f} s (the exercise asks for at most {SLOW_FACTOR:g}×). ")
    node = sc.get("node_size", 8)
    if k == "ep_alltoall" and r["ep_crosses_nodes"]:
        return head + (f"Most of the difference is the EP all-to-alls ({mine:,.2f} s against "
                       f"{theirs:,.2f} s): an EP group of {r['ep']} spans nodes, so part of every "
                       "dispatch and combine crosses the inter-node link instead of the node's "
                       f"own. Keep ep within a node ({node} GPUs); shrink the expert state "
                       "with PP.")
    return head + (f"Most of the difference is {_ml.PART_NAMES[k]}: {mine:,.2f} s against "
                   f"{theirs:,.2f} s in the best layout.")


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
        return False, "this layout model has no row for that layout in the scenario."
    if not r["fits"]:
        return False, _too_big(r)
    best = _ml.best_layout(rows)
    if r["step_s"] > SLOW_FACTOR * best["step_s"]:
        return False, _too_slow(r, best, sc)
    ratio = r["step_s"] / best["step_s"]
    return True, (f"fits ({r['bytes_per_gpu'] / 1e9:,.1f} of {r['usable_bytes'] / 1e9:,.1f} GB per "
                  f"GPU: dense {r['dense_state'] / 1e9:,.1f}, experts "
                  f"{r['expert_state'] / 1e9:,.1f}, activations {r['activations'] / 1e9:,.1f}) and "
                  f"its predicted step, {r['step_s']:,.2f} s, is {ratio:.2f}× the best layout's "
                  f"({_ml.name(best)}, {best['step_s']:,.2f} s).")


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
    return bool(ok), f"{shown}: {reason}"
