"""Checkers for chapter 10 (when the model does not fit): a tensor-parallel GPT's AllReduce calls per
update, the pipeline bubble, the model-state bytes of a DP x TP x PP layout, and a layout that fits.

Every checker calls the learner's function on all of its cases first and only then works out the right
answers (``formulas``, the chapter's arithmetic), so no answer exists while the learner's code runs. A wrong
function is matched against the usual mistakes over every case, and the hint names the one it made.
"""
from __future__ import annotations

import importlib
import math
import numbers

from ..base.errors import ConfigError
from ..chapters.ch10_parallel import formulas
from ..chapters.ch10_parallel.formulas import GB, model_shape
from ..chapters.ch10_parallel.layout import MAX_ZERO_WITH_PP
from ._core import AnswerError, NotAttempted, checker, describe, number
from ._core import case_answers as _all_answers, diagnose as _diagnose, same as _same

try:  # the layout model (taught in chapter 10), imported now so that the seal taken at import covers it
    _layout = importlib.import_module("..chapters.ch10_parallel.layout", __package__)
except ModuleNotFoundError as e:  # a labkit without it: layout_fits says so, and fails
    if e.name != "labkit.chapters.ch10_parallel.layout":
        raise
    _layout = None

__all__ = ["tp_allreduces", "bubble", "layout_bytes", "layout_fits"]  # the checkers (check_layout: their helper)

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
        raise AnswerError(f"your answer is {describe(fn)}; pass your function itself ({name}), without calling it")
    return fn


# ---- exercise-10-tp-allreduces ---------------------------------------------------------------------------

def _per_block(qkv) -> int:
    c = formulas.tp_collectives_per_block(qkv)
    return c["forward"] + c["backward"]


def _pass(qkv, phase: str) -> int:
    return formulas.tp_collectives_per_block(qkv)[phase]


def _other(qkv: str) -> str:
    return "separate" if qkv == "per_head" else "per_head"


TP_MISTAKES = [
    (lambda n, m, q: _pass(q, "backward") * n * m, "you counted the backward pass only: the forward AllReduces "
     "too, once after each row-parallel layer (attention's proj, the MLP's out) to sum the ranks' partial "
     "outputs -- 2 per block."),
    (lambda n, m, q: 2 * n * m, "you counted the forward pass only: backward AllReduces the gradient of each "
     "column-parallel layer's input too."),
    (lambda n, m, q: (2 if q == "per_head" else 6) * n * m, "for the fused per-head qkv you counted one pass "
     "only: 2 AllReduces forward (after proj and out) and 2 backward (the inputs' gradients of qkv and fc)."),
    (lambda n, m, q: 4 * n * m, "you counted 4 per block whatever the qkv layout: the exercise's separate q, k "
     "and v layers each have their own f (CopyToTP, as TPBlockSeparateQKV), so each AllReduces its input's "
     "gradient in backward: 2 + 4. (One f before all three projections would keep it at 2 + 2.)"),
    (lambda n, m, q: (2 * _pass(q, "forward") + _pass(q, "backward")) * n * m, "you counted the forward "
     "AllReduces twice: that is activation recomputation, which re-runs each block's forward in backward, its 2 "
     "AllReduces included (6 per block fused, 8 separate). The exercise has no recomputation: 2 + 2 and 2 + 4."),
    (lambda n, m, q: _per_block(_other(q)) * n * m, "you swapped the layouts: the fused per-head qkv is ONE "
     "column-parallel layer (1 backward AllReduce), separate q, k, v are three."),
    (lambda n, m, q: (2 + (3 if q == "separate" else 2)) * n * m, "for separate q, k, v you counted 3 backward "
     "AllReduces: the MLP's first layer (fc) is column-parallel too, so 4."),
    (lambda n, m, q: _per_block(q) * n, "you left out the micro-batches: every micro-batch runs its own forward "
     "and backward through every block."),
    (lambda n, m, q: 4 * n, "you counted 4 per block whatever the qkv layout, and left out the micro-batches: "
     "separate q, k, v (each with its own f) make 2 + 4, and every micro-batch runs every block again."),
    (lambda n, m, q: _per_block(q) * m, "you counted one block: multiply by the number of layers."),
    (lambda n, m, q: _per_block(q) * (n + 1) * m, "you counted n_layer + 1 blocks: the embeddings and the head are "
     "replicated, with no tensor-parallel collective."),
    (lambda n, m, q: (_per_block(q) * n + 1) * m, "you added an AllReduce for the embeddings or the head: they are "
     "replicated here, with no tensor-parallel collective."),
    (lambda n, m, q: (_per_block(q) * n + 2) * m, "you added AllReduces for the embeddings and the head: they are "
     "replicated here, with no tensor-parallel collective."),
    (lambda n, m, q: 2 * _per_block(q) * n * m, "you counted two collectives per AllReduce: an AllGather plus a "
     "ReduceScatter is sequence parallelism's pattern; without it each is one AllReduce call."),
]


@checker
def tp_allreduces(fn):
    """``fn(n_layer, micro_batches, qkv)`` -> AllReduce calls per optimizer update (forward and backward)
    of a Megatron-style tensor-parallel GPT without sequence parallelism; ``qkv`` is "per_head" (the fused
    qkv weight permuted per head) or "separate" (q, k and v layers, each column-parallel with its own f, as
    ``TPBlockSeparateQKV``). Only the blocks make collectives: the embeddings and the head are replicated."""
    _function(fn, "my_tp_allreduces")
    got = _all_answers(fn, TP_CASES, "return a number of AllReduce calls")
    right = [_per_block(q) * n * m for n, m, q in TP_CASES]
    if all(_same(g, r) for g, r in zip(got, right)):
        return True, ("right: per block 2 forward + 2 backward (fused per-head qkv) or 2 + 4 (separate q, k, v, "
                      "each with its own f), "
                      "times layers, times micro-batches.")
    broken = next(((c, g) for c, g in zip(TP_CASES, got) if not g.is_integer()), None)
    (n, m, q), g = broken or next((c, g) for c, g, r in zip(TP_CASES, got, right) if not _same(g, r))
    where = f"my_tp_allreduces({n}, {m}, {q!r}) returned {g:g}: "
    if broken:
        return False, where + "a number of calls is a whole number."
    if all(mine >= 1000 * r for mine, r in zip(got, right)):
        return False, where + "that looks like bytes. Count the AllReduce calls, not what they move."
    hint = _diagnose(TP_CASES, got, right, TP_MISTAKES)
    return False, where + (hint or "not it. Per block: which layers' outputs are summed across ranks in forward, "
                           "and which layers' input gradients in backward? Then layers × micro-batches.")


# ---- exercise-10-bubble --------------------------------------------------------------------------------

_NO_VALUE = object()  # what a formula gives where it divides by zero (where the learner's code raised)


def _ratio(a, b):
    return _NO_VALUE if b == 0 else a / b


def _agrees(got, mistaken) -> bool:
    """Whether a learner's answer is the mistaken one: the same number (float32's rounding allowed), or a
    division by zero in both."""
    if got is _NO_VALUE or mistaken is _NO_VALUE:
        return got is mistaken
    return _same(got, mistaken, 1e-6)


BUBBLE_MISTAKES = [
    (lambda p, m: _ratio(p - 1, m), "that is (p − 1)/m, Megatron-LM's bubble relative to the ideal (bubble-free) "
     "time. The exercise asks for the idle share of the whole step: idle time ÷ step time."),
    (lambda p, m: _ratio(p - 1, m + p), "that is (p − 1)/(m + p): a step of m micro-batches through p stages lasts "
     "m + p − 1 slots, not m + p."),
    (lambda p, m: _ratio(p, m + p - 1), "that is p/(m + p − 1): each stage waits p − 1 slots (the fill and the "
     "drain), not p; with one stage there is no bubble at all."),
    (lambda p, m: _ratio(p - 1, m - 1), "that is (p − 1)/(m − 1), which divides by zero at m = 1: the step lasts "
     "m + p − 1 slots."),
    (lambda p, m: _ratio(1, m), "that is 1/m: the bubble grows with the number of stages p."),
    (lambda p, m: _ratio(m, m + p - 1), "that is the BUSY share of the step: the bubble is what is left, "
     "the idle share."),
    (lambda p, m: 100 * (p - 1) / (m + p - 1), "that is a percentage: return the share as a fraction (0.25, not 25)."),
    (lambda p, m: 0.0, "you returned 0 where there is a bubble (integer division // rounds the share down to 0?)."),
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
    right = [formulas.bubble_fraction(p, m) for p, m in BUBBLE_CASES]
    first = next((i for i, (g, r) in enumerate(zip(got, right)) if not _agrees(g, r)), None)
    if first is None:
        return True, ("right: the step lasts m + p − 1 slots and each stage idles p − 1 of them; more "
                      "micro-batches per step shrink the bubble.")
    (p, m), g = BUBBLE_CASES[first], got[first]
    where = f"my_bubble({p}, {m}) " + ("divided by zero: " if g is _NO_VALUE else f"returned {g:.4g}: ")
    for model, hint in BUBBLE_MISTAKES:  # the mistake that explains every case, divisions by zero included
        if all(_agrees(g_, model(*c)) for c, g_ in zip(BUBBLE_CASES, got)):
            return False, where + hint
    for model, hint in BUBBLE_MISTAKES:  # else the one that explains this case, where it differs from the right one
        w = model(p, m)
        if g is not _NO_VALUE and _agrees(g, w) and not _agrees(right[first], w):
            return False, where + hint
    if g is _NO_VALUE:
        return False, where + "the bubble is defined for every p ≥ 1 and m ≥ 1: what is the step's length in slots?"
    return False, where + ("not it. Draw the schedule: how many slots does the step last, and in how many of them "
                           "is a stage idle?")


# ---- exercise-10-layout-bytes --------------------------------------------------------------------------

def _state(n, dp, tp, pp, s):
    return formulas.layout_state_bytes(n, dp=dp, tp=tp, pp=pp, zero_stage=s)["total"]


def _shards(n, g, s, w=2, gr=2, o=12):
    """Bytes per GPU of ``n`` parameters (w + gr + o bytes each), ZeRO stage ``s`` over ``g`` ranks."""
    return n * (w / (g if s >= 3 else 1) + gr / (g if s >= 2 else 1) + o / (g if s >= 1 else 1))


LAYOUT_MISTAKES = [
    (lambda n, dp, tp, pp, s: 16 * n / (dp * tp * pp) if s == 0 else _state(n, dp, tp, pp, s),
     "at stage 0 you divided by dp: without ZeRO every data-parallel rank holds a full copy of its TP × PP slice."),
    (lambda n, dp, tp, pp, s: 16 * n / (dp * tp * pp), "you divided everything by dp × tp × pp: ZeRO shards over dp "
     "only what its stage says (1: optimizer, 2: + gradients, 3: + weights)."),
    (lambda n, dp, tp, pp, s: _state(n * tp, dp, tp, pp, s), "you left out tp: tensor parallelism splits every "
     "block's weights across the tp GPUs."),
    (lambda n, dp, tp, pp, s: _state(n * pp, dp, tp, pp, s), "you left out pp: each pipeline stage holds only its "
     "own layers."),
    (lambda n, dp, tp, pp, s: _state(n * tp * pp, dp, tp, pp, s), "you left out tp and pp: they split the "
     "parameters first (N / (tp × pp) per GPU), then ZeRO shards that slice over dp."),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, min(s + 1, 3)), "your stages are one too high: stage 1 shards "
     "only the optimizer state, stage 2 the gradients too, stage 3 the weights too."),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, max(s - 1, 0)), "your stages are one too low: stage 1 already "
     "shards the optimizer state, stage 2 the gradients too, stage 3 the weights too."),
    (lambda n, dp, tp, pp, s: _shards(n / (tp * pp), dp, s, 4, 4, 8), "you counted fp32 weights and gradients "
     "(4 + 4 + 8): mixed-precision Adam keeps 16-bit weights and gradients (2 + 2) and 12 bytes of fp32 optimizer "
     "state (master weights, m, v)."),
    (lambda n, dp, tp, pp, s: _shards(n / (tp * pp), dp, s, 2, 2, 8), "you counted 8 bytes of optimizer state: the "
     "fp32 master weights are optimizer state too (4 + 4 + 4 = 12)."),
    (lambda n, dp, tp, pp, s: _state(n, dp * tp * pp, tp, pp, s), "you sharded over every GPU: ZeRO shards over the "
     "data-parallel group only (the dp GPUs that hold the same slice)."),
    (lambda n, dp, tp, pp, s: 16 * n, "you gave every GPU all 16 bytes of every parameter: TP and PP split the "
     "parameters, and ZeRO shards what its stage says over dp."),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, s) / 1e9, "that is in GB: return bytes."),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, s) / 2**30, "that is in GiB: return bytes."),
    (lambda n, dp, tp, pp, s: _state(n, 1, tp, pp, 0), "you gave the same bytes at every ZeRO stage: stage 1 shards "
     "the optimizer state over dp, stage 2 the gradients too, stage 3 the weights too."),
    (lambda n, dp, tp, pp, s: _state(n, dp, tp, pp, min(s, 1)), "you sharded only the optimizer state at every "
     "stage: stage 2 shards the gradients too, stage 3 the weights too."),
]


@checker
def layout_bytes(fn):
    """``fn(n_params, dp, tp, pp, zero_stage)`` -> model-state bytes per GPU with mixed-precision Adam
    (2 + 2 + 12 bytes per parameter): TP and PP split the parameters (N / (tp·pp) per GPU), then ZeRO stage
    ``zero_stage`` shards the optimizer state (≥ 1), the gradients (≥ 2) and the weights (3) over ``dp``."""
    _function(fn, "my_layout_bytes")
    got = _all_answers(fn, LAYOUT_CASES, "return a number of bytes")
    right = [_state(*c) for c in LAYOUT_CASES]
    if all(_same(g, r, 1e-6) for g, r in zip(got, right)):
        return True, "right for every layout and stage: N/(tp·pp) parameters per GPU, then ZeRO over dp."
    (n, dp, tp, pp, s), g, r = next((c, g, r) for c, g, r in zip(LAYOUT_CASES, got, right) if not _same(g, r, 1e-6))
    where = (f"for {n / 1e9:g} B parameters, dp={dp}, tp={tp}, pp={pp}, stage {s}: expected {r / 1e9:,.2f} GB, "
             f"got {g / 1e9:,.4g} GB: ")
    hint = _diagnose(LAYOUT_CASES, got, right, LAYOUT_MISTAKES, 1e-6)
    return False, where + (hint or "not it. Hint: split the parameters by tp × pp first; then which of weights, "
                           "gradients and optimizer state does each ZeRO stage shard over dp?")


# ---- exercise-10-layout-fits ---------------------------------------------------------------------------

def _whole_number(key, value) -> int:
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and float(value).is_integer():
        return int(value)
    raise AnswerError(f"your {key} is {describe(value)}; give a whole number")


def layout_answer(answer) -> dict:
    """A learner's layout as ``{"dp": int, "tp": int, "pp": int, "zero_stage": int}``: from a dict with those
    keys ("zero" or "stage" stand for "zero_stage") or a tuple/list (dp, tp, pp, zero_stage)."""
    if isinstance(answer, dict):
        keys = {str(k).strip().lower(): v for k, v in answer.items()}
        for alias in ("zero", "stage"):
            if alias in keys and "zero_stage" not in keys:
                keys["zero_stage"] = keys.pop(alias)
        missing = [k for k in LAYOUT_KEYS if k not in keys]
        extra = sorted(set(keys) - set(LAYOUT_KEYS))
        if missing or extra:
            raise AnswerError(f"your dict has keys {sorted(keys)}; give exactly dp, tp, pp and zero_stage, e.g. "
                              "dict(dp=8, tp=4, pp=2, zero_stage=1)")
        values = [keys[k] for k in LAYOUT_KEYS]
    elif isinstance(answer, (tuple, list)):
        if len(answer) != 4:
            raise AnswerError(f"your answer is {describe(answer)}; give four numbers (dp, tp, pp, zero_stage), "
                              "e.g. (8, 4, 2, 1)")
        values = list(answer)
    else:
        raise AnswerError(f"your answer is {describe(answer)}; give (dp, tp, pp, zero_stage) as a tuple or a dict")
    out = {k: _whole_number(k, v) for k, v in zip(LAYOUT_KEYS, values)}
    if any(out[k] < 1 for k in ("dp", "tp", "pp")):
        raise AnswerError(f"your layout is {out}: dp, tp and pp are each at least 1")
    if out["zero_stage"] not in (0, 1, 2, 3):
        raise AnswerError(f"your zero_stage is {out['zero_stage']}; a ZeRO stage is 0 (none), 1, 2 or 3")
    return out


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
    """(ok, reason) for a learner's layout (dict, or tuple (dp, tp, pp[, zero_stage])) in a stated scenario: it
    must use all the GPUs, keep TP inside a node and on whole heads (and whole K/V heads), split the layers evenly,
    split the global batch into at least pp micro-batches per DP rank, use ZeRO 0 or 1 with PP (what FSDP + PP
    holds within a step, and DeepSpeed's and Megatron's rule), and fit in memory
    (with the scenario's ``checkpointing``, "none" unless it says). The reason names what is wrong in plain words;
    for a layout that does not fit, what is too big (model state or activations) and what would help."""
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
        return False, f"ZeRO stage {zero} does not exist: 0 (none), 1, 2 or 3."
    if dp * tp * pp != n:
        more = "more" if dp * tp * pp > n else "fewer"
        return False, (f"dp × tp × pp = {dp} × {tp} × {pp} = {dp * tp * pp} GPUs, {more} than the {n} you have: "
                       "the three must multiply to the GPU count.")
    if tp > node:
        return False, (f"tp = {tp} is larger than a node ({node} GPUs): TP's 4 AllReduces per block would cross "
                       "the slow link between nodes. Keep tp within a node.")
    if node % tp:
        return False, f"tp = {tp} does not divide the node size {node}: a TP group would straddle two nodes."
    if shape.n_head % tp:
        return False, f"tp = {tp} does not divide the {shape.n_head} attention heads: TP splits whole heads."
    if shape.kv_heads % tp:
        return False, (f"tp = {tp} does not divide the {shape.kv_heads} K/V heads (grouped-query attention): each TP "
                       "rank needs whole K/V heads.")
    if shape.n_layer % pp and sc.get("even_stages", True):
        return False, f"pp = {pp} does not divide the {shape.n_layer} layers: the stages would be uneven."
    if gb % (dp * b):
        return False, f"dp × micro-batch = {dp * b} does not divide the global batch of {gb} sequences."
    if gb // (dp * b) < pp:
        return False, (f"{gb // (dp * b)} micro-batches per DP rank for {pp} stages: 1F1B needs at least as many "
                       "micro-batches as stages (m ≥ p), or the pipeline never fills.")
    if pp > 1 and zero > MAX_ZERO_WITH_PP:
        return False, (f"ZeRO-{zero} with pipeline parallelism (pp = {pp}): this tool takes ZeRO-0 or ZeRO-1 with "
                       "PP. Gradients sharded per micro-batch would need a ReduceScatter for every micro-batch each "
                       "stage runs: DeepSpeed's pipeline engine refuses ZeRO-2/3, and Megatron's distributed "
                       "optimizer is ZeRO-1 with a full-size gradient buffer. PyTorch's FSDP does run with PP "
                       "(torch.distributed.pipelining, torchtitan's reshard_after_forward = not pp_enabled), but "
                       "keeps each stage's weights and gradients whole until one ReduceScatter at the step's end: "
                       "ZeRO-1's bytes and traffic, so answer zero_stage 1 for it.")
    kw = dict(node_size=node, interconnect=sc.get("interconnect", "infiniband"), global_batch=gb,
              seq_len=sc.get("seq_len"), micro_batch=b, precision=sc.get("precision", "bf16"),
              even_stages=sc.get("even_stages", True))
    ck = sc.get("checkpointing", "none")
    rows = _layout.layouts(sc["model"], sc["gpu"], n, zero_stages=(zero,), checkpointing=ck, **kw)
    row = _find(rows, dp, tp, pp)
    if not row["fits"]:
        return False, _too_big(sc, row, kw, ck)
    return True, (f"fits ({row['bytes_per_gpu'] / GB:,.1f} of {row['usable_bytes'] / GB:,.1f} GB per GPU) and obeys "
                  f"every rule; predicted step {row['step_s']:,.2f} s.")


def _find(rows, dp, tp, pp):
    return next(r for r in rows if (r["dp"], r["tp"], r["pp"]) == (dp, tp, pp))


def _too_big(sc, row, kw, ck) -> str:
    """Why a layout does not fit, naming what is too big -- model state or activations -- and what would help."""
    dp, tp, pp, zero = row["dp"], row["tp"], row["pp"], row["zero_stage"]
    usable, act = row["usable_bytes"], row["activation_bytes"]
    state = row["state_bytes"] + row["zero3_gather_bytes"]
    head = (f"it does not fit: {row['bytes_per_gpu'] / GB:,.1f} GB per GPU ({state / GB:,.1f} model state + "
            f"{act / GB:,.1f} activations) against {usable / GB:,.1f} GB usable. ")
    top = 0 if dp == 1 else (3 if pp == 1 else MAX_ZERO_WITH_PP)
    higher = [_find(_layout.layouts(sc["model"], sc["gpu"], sc["n_gpus"], zero_stages=(z,), checkpointing=ck,
                                    **kw), dp, tp, pp) for z in range(zero + 1, top + 1)]
    least_state = higher[-1]["state_bytes"] + higher[-1]["zero3_gather_bytes"] if higher else state
    fix = next((r for r in higher if r["fits"]), None)
    state_words = "more TP or PP (each GPU then holds fewer parameters)"
    if higher:
        state_words = f"a higher ZeRO stage, or {state_words}"
    if pp > 1 and dp > 1:
        state_words += ("; with PP this tool stops at ZeRO-1 (DeepSpeed's and Megatron's rule; PyTorch's FSDP + PP "
                        "holds ZeRO-1's bytes within a step)")
    if act + least_state <= usable:  # sharding the state is enough
        if fix:
            return head + (f"What is too big is the model state: ZeRO-{fix['zero_stage']} on this split needs "
                           f"{fix['bytes_per_gpu'] / GB:,.1f} GB and fits (more TP or PP would also help).")
        return head + f"What is too big is the model state: {state_words}."
    again = None if ck == "full" else _find(_layout.layouts(sc["model"], sc["gpu"], sc["n_gpus"], zero_stages=(zero,),
                                                            checkpointing="full", **kw), dp, tp, pp)
    rc = ("" if again is None else f" (here {again['activation_bytes'] / GB:,.1f} GB: it would "
          f"{'fit' if again['fits'] else 'still not fit'})")
    act_words = (f"more TP (with sequence parallelism every activation splits over tp), or activation "
                 f"recomputation, which keeps only each layer's input{rc}. No ZeRO stage shards activations, and "
                 "more PP does not shrink them: under 1F1B stage 0 holds L layers' worth of one micro-batch whatever "
                 "pp is")
    if act >= state:
        return head + f"What is too big is the activations ({act / GB:,.1f} GB): {act_words}."
    return head + (f"Both are too big. The model state ({state / GB:,.1f} GB): {state_words}. The activations "
                   f"({act / GB:,.1f} GB): {act_words}.")


@checker
def layout_fits(answer):
    """``answer``: (dp, tp, pp, zero_stage) -- a tuple or a dict -- for ``LAYOUT_SCENARIO``; passes when the
    layout uses every GPU and the chapter's layout model (``check_layout`` below) says it fits."""
    if isinstance(answer, (tuple, list)) and any(a is None or a is Ellipsis for a in answer):
        raise NotAttempted()  # (None, None, None, None): the placeholder, half filled in
    if isinstance(answer, dict) and any(v is None or v is Ellipsis for v in answer.values()):
        raise NotAttempted()
    lay = layout_answer(answer)
    sc = LAYOUT_SCENARIO
    used = lay["dp"] * lay["tp"] * lay["pp"]
    if used != sc["n_gpus"]:
        return False, (f"dp × tp × pp = {used}, but the scenario has {sc['n_gpus']} GPUs: a layout uses every one "
                       "(each GPU is one rank of each of the three groups).")
    if _layout is None:
        return False, ("this labkit has no layout model yet (labkit.chapters.ch10_parallel.layout): "
                       "update labkit, then run the check again.")
    try:
        ok, reason = check_layout(dict(sc), dict(lay))
    except ConfigError as e:  # the layout model refuses it (a TP degree that does not divide the heads...)
        return False, f"{_shown(lay)}: {e}"
    ok, reason = bool(ok), str(reason)
    return (True, f"{_shown(lay)} fits: {reason}") if ok else (False, f"{_shown(lay)}: {reason}")


def _shown(lay: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in lay.items())
