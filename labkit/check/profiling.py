"""Checkers for the measure and diagnose exercises of chapters 01 (``low_mfu_fix``: the change that raises a low
MFU, run) and 05 (``loader_reading``: load and compute time per batch read from records, and the workers that
follow): the answer is a measurement, judged against labkit's own reading of the same runs. A change that cannot
be the cause fails with the reason, whatever the learner's runs happened to show.
"""
from __future__ import annotations

import copy
import math
import statistics

from ..tools import timing
from ..base import phrases
from . import measurements
from ._core import AnswerError, NotAttempted, checker, describe, number
from ..tools.compare import Comparison
from ..engine.config import Config
from .scaling import WORDS05  # ## Checks: chapter 05 of lab_messages.md: loader_reading's sentences too

__all__ = ["low_mfu_fix", "loader_reading"]  # 01 measure first, 05 data loader

# low_mfu_fix's sentences, in the learner's language: notebooks/lab_messages.md, ## Checks: chapter 01, the low-MFU fix
WORDS = phrases.load_section("lab_messages.md", "Checks: chapter 01, the low-MFU fix", {
    "who-answer": (), "who-suspect": (), "who-run": (), "config-not-run": ("what",), "no-runs-kept": (),
    "answer-form": ("answer",), "suspect-too": (), "not-a-run": ("what", "value"),
    "not-completed": ("what", "field", "status"),
    "flops-changed": ("before", "after"), "flops-same": (), "flops-other": (), "its-shape": (),
    "tokens-instead": ("before", "after"), "longer": (), "shorter": (),
    "seq-len": ("what", "flops", "tokens", "longer"), "another-preset": (), "wider": (), "narrower": (),
    "deeper": (), "shallower": (), "other-heads": (), "other-seq-len": (), "other-shape": (), "and": (),
    "model-changed": ("what", "flops", "kinds"),
    "cause-attention": (), "cause-grad-clip": (), "cause-loss-scaling": (), "besides": ("right", "other"),
    "not-touch": ("changed",), "other-why": ("why", "accum", "micro_batch"), "mixed": ("right",),
    "kind-data": ("changed", "wait", "most"), "kind-precision": ("changed",), "kind-threads": ("before", "after"),
    "kind-recompute": ("changed",), "kind-optimizer": ("changed", "accum"), "kind-parallel": ("changed",),
    "first-config": ("changed",), "runs-say": ("before", "after"), "devices": ("before", "after"),
    "data-wait": ("wait",), "same-config": ("runs_say",), "accum-alone": ("micro_batch", "before", "after"),
    "tokens-changed": ("before", "after"), "keep-tokens": ("hint", "runs_say"),
    "smaller": ("before", "after", "runs_say"),
    "why-micro-batch": ("before", "after", "accum_before", "accum_after"), "why-compile": (),
    "no-rise": ("sentence",), "unclear": ("gain", "before", "after", "least")})


# ---- 01 -- why is MFU low when nothing waits? ----------------------------------------------------

# The least MFU gain a pair of single runs must show before it counts as measured: two identical runs on a busy
# 2-core machine differed by 47 % (design notes); the right change gives 2-4x here. A Comparison's own verdict,
# when it has one, replaces this threshold.
MIN_GAIN = 1.25
# A "no data wait" run may still spend a few per cent in next(loader): slicing the batch costs something.
MAX_WAIT = 0.25

_MODEL = ("model", "n_layer", "d_model", "n_head", "seq_len")
_DATA = ("workers", "pin_memory", "prefetch_factor", "data_cost_ms")
_RECOMPUTE = ("checkpointing", "checkpoint_every")
_PARALLEL = ("world_size", "ddp_sync", "bucket_cap_mb", "comm_hook")
_CONFIG_KEYS = ("model", "n_layer", "d_model", "n_head", "seq_len", "micro_batch", "accum", "precision",
                "loss_scaling", "checkpointing", "checkpoint_every", "optimizer", "grad_clip", "attention", "compile",
                "workers", "pin_memory", "prefetch_factor", "data_cost_ms", "world_size", "ddp_sync", "bucket_cap_mb",
                "comm_hook", "threads")


def _arms(answer, suspect):
    """(runs before, runs after): from a Comparison (arm a = the suspect configuration, arm b = the fix), or
    from the learner's run(s) and the suspect run(s)."""
    for what, x in (("who-answer", answer), ("who-suspect", suspect)):
        if isinstance(x, Config):
            raise AnswerError(WORDS.say("config-not-run", what=WORDS.say(what)))
    if isinstance(answer, Comparison):
        if not answer.results_a or not answer.results_b:
            raise AnswerError(WORDS.say("no-runs-kept"))
        return list(answer.results_a), list(answer.results_b), answer
    after = timing.as_runs(answer)
    if not after:
        raise AnswerError(WORDS.say("answer-form", answer=describe(answer)))
    before = timing.as_runs(suspect)
    if not before:
        raise AnswerError(WORDS.say("suspect-too"))
    return before, after, None


def _config_of(runs, what) -> dict:
    s = timing.summary_of(runs[0])
    if "micro_batch" not in s or "model" not in s:
        raise AnswerError(WORDS.say("not-a-run", what=WORDS.say(what), value=describe(s)))
    return {k: s.get(k) for k in _CONFIG_KEYS if k in s}


def _flops_per_token(runs):
    s = timing.summary_of(runs[0])
    f, t = s.get("model_flops_per_step"), s.get("tokens_per_step")
    return f / t if f and t else None


def _measured(runs, key, what):
    v = timing.median_of(runs, key)
    if v is None:
        status = timing.summary_of(runs[0]).get("status")
        raise AnswerError(WORDS.say("not-completed", what=WORDS.say(what), field=key, status=repr(status)))
    return v


def _changed(a: dict, b: dict) -> dict:
    return {k: (a.get(k), b.get(k)) for k in _CONFIG_KEYS if a.get(k) != b.get(k)}


def _list(diff, keys):
    return ", ".join(f"{k} {diff[k][0]!r} → {diff[k][1]!r}" for k in keys if k in diff)


# The kinds of change that answer the exercise: bigger micro-batches at the same tokens per update, or compile.
_RIGHT_KIND = ("micro_batch", "accum", "compile")
# Why each setting that is neither right nor covered by a rule above does not answer it, said when it is the
# only change (a learner who changed nothing else must not read "you also changed").
_NOT_THE_CAUSE = {"attention": "cause-attention", "grad_clip": "cause-grad-clip", "loss_scaling": "cause-loss-scaling"}


def _model_words(diff, fpt_a, fpt_b, sa, sb) -> str:
    """Why a change of the model's shape is no answer, in words for the keys that changed (a longer sequence is
    not "a wider model")."""
    keys = [k for k in _MODEL if k in diff]
    flops = (WORDS.say("flops-changed", before=f"{fpt_a:,.0f}", after=f"{fpt_b:,.0f}")
             if fpt_a and fpt_b and abs(fpt_b / fpt_a - 1) > 1e-9
             else WORDS.say("flops-same") if fpt_a else WORDS.say("flops-other"))
    what = _list(diff, keys) or WORDS.say("its-shape")
    if keys == ["seq_len"]:
        a, b = diff["seq_len"]
        ta, tb = sa.get("tokens_per_step"), sb.get("tokens_per_step")
        longer = isinstance(a, int) and isinstance(b, int) and b > a
        tokens = (", " + WORDS.say("tokens-instead", after=f"{tb:,}", before=f"{ta:,}")
                  if ta and tb and ta != tb else "")
        return WORDS.say("seq-len", what=what, flops=flops, tokens=tokens,
                         longer=WORDS.say("longer" if longer else "shorter"))
    kinds = [WORDS.say("another-preset")] if "model" in diff else []
    if "model" not in diff:
        for k, up, down in (("d_model", "wider", "narrower"), ("n_layer", "deeper", "shallower")):
            if k in diff:
                kinds.append(WORDS.say(up if (diff[k][0] or 0) < (diff[k][1] or 0) else down))
        kinds += [WORDS.say(w) for k, w in (("n_head", "other-heads"), ("seq_len", "other-seq-len")) if k in diff]
    said = f" {WORDS.say('and')} ".join(kinds) or WORDS.say("other-shape")
    return WORDS.say("model-changed", what=what, flops=flops, kinds=said.capitalize())


def _right_part(diff) -> list:
    """The settings of ``diff`` that are the right kind of change: bigger micro-batches (same tokens per update,
    checked before), or torch.compile turned on. [] when there is none."""
    mb, comp = diff.get("micro_batch"), diff.get("compile")
    grew = mb is not None and isinstance(mb[0], int) and isinstance(mb[1], int) and mb[1] > mb[0]
    keys = (["micro_batch", "accum"] if grew else []) + (["compile"] if comp and comp[1] else [])
    return [k for k in keys if k in diff]


def _other_words(diff, other, a) -> str:
    """A change that does not answer the exercise: "also" only when the right kind of change came with it."""
    right = _right_part(diff)
    if right:
        return WORDS.say("besides", right=_list(diff, right), other=_list(diff, other))
    why = "; ".join(f"{_list(diff, (k,))}: {WORDS.say(_NOT_THE_CAUSE[k])}" for k in other if k in _NOT_THE_CAUSE)
    rest = [k for k in other if k not in _NOT_THE_CAUSE]
    if rest:
        why = "; ".join(filter(None, (why, WORDS.say("not-touch", changed=_list(diff, rest)))))
    return WORDS.say("other-why", why=why, accum=a.get("accum"), micro_batch=a.get("micro_batch"))


def _mixed(diff) -> str:
    """A hint when the right kind of change came mixed with a wrong one: keep it, drop the other."""
    right = _right_part(diff)
    return " " + WORDS.say("mixed", right=_list(diff, right)) if right else ""


def _speed_verdict(cmp):
    """'b' / 'a' / 'same' when a comparison on a speed metric has decided, else None."""
    if cmp is None or not cmp.decided or cmp.metric not in ("tokens_per_s", "step_time_s", "cpu_s_per_update"):
        return None
    return cmp.better or "same"


def _wrong_kind(diff, a, sa, sb, wait_a) -> str | None:
    """Why the change cannot be what raises MFU here (whatever the runs showed), or None when it can be."""
    if any(k in diff for k in _DATA):
        return WORDS.say("kind-data", changed=_list(diff, _DATA), wait=f"{wait_a:.1%}", most=f"{1 / (1 - wait_a):.2f}")
    if "precision" in diff:
        return WORDS.say("kind-precision", changed=_list(diff, ("precision",)))
    if "threads" in diff or (sa.get("device") == "cpu" and sa.get("intra_op_threads") != sb.get("intra_op_threads")):
        ta, tb = sa.get("intra_op_threads"), sb.get("intra_op_threads")
        return WORDS.say("kind-threads", before=f"{ta}", after=f"{tb}")
    if any(k in diff for k in _RECOMPUTE):
        return WORDS.say("kind-recompute", changed=_list(diff, _RECOMPUTE))
    if "optimizer" in diff:
        return WORDS.say("kind-optimizer", changed=_list(diff, ("optimizer",)), accum=a.get("accum"))
    if any(k in diff for k in _PARALLEL):
        return WORDS.say("kind-parallel", changed=_list(diff, _PARALLEL))
    return None


@measurements.graded_from_file
@checker
def low_mfu_fix(answer, suspect=None):
    """``answer``: your run of the change that raises MFU (an ``lk.Result``, a list of repeats, or an
    ``lk.compare_configs(suspect_cfg, your_cfg)`` comparison); ``suspect``: the run of the exercise's
    configuration. The change must keep the model (its FLOPs per token) and the tokens per update, and the runs
    must show MFU rising. The runs judged are saved (``measurements``): a grader judges those."""
    return measurements.judged("low_mfu_fix", "01", answer, lambda: _mfu_data(answer, suspect), _judge_mfu)


def _mfu_data(answer, suspect) -> dict:
    """What low_mfu_fix judges: the runs' summaries, and a comparison's verdict when the answer is one."""
    before, after, cmp = _arms(answer, suspect)
    verdict = None if cmp is None else {"metric": cmp.metric, "decided": cmp.decided, "better": cmp.better,
                                        "sentence": cmp.sentence}
    return {"before": measurements.runs_data(before), "after": measurements.runs_data(after),
            "suspect": measurements.runs_data(suspect) if cmp is not None else [], "comparison": verdict}


def _judge_mfu(data):
    before, after, suspect, cmp = measurements.mfu_entry(data)
    a, b = _config_of(before, "who-suspect"), _config_of(after, "who-run")
    if cmp is not None and suspect:
        # compare_configs fixes one thread count for both arms: only the other settings must be the suspect's
        off = {k: v for k, v in _changed(_config_of(suspect, "who-suspect"), a).items() if k != "threads"}
        if off:
            return False, WORDS.say("first-config", changed=_list(off, off))
    mfu_a, mfu_b = _measured(before, "mfu", "who-suspect"), _measured(after, "mfu", "who-run")
    wait_a = timing.median_of(before, "data_wait_frac") or 0.0
    gain = mfu_b / mfu_a if mfu_a else float("inf")
    runs_say = WORDS.say("runs-say", before=f"{mfu_a:.2%}", after=f"{mfu_b:.2%}")
    sa, sb = timing.summary_of(before[0]), timing.summary_of(after[0])
    if sa.get("device") != sb.get("device"):
        return False, WORDS.say("devices", before=f"{sa.get('device')}", after=f"{sb.get('device')}")
    if wait_a > MAX_WAIT:
        return False, WORDS.say("data-wait", wait=f"{wait_a:.0%}")
    diff = _changed(a, b)
    if not diff:
        return False, WORDS.say("same-config", runs_say=runs_say)
    fpt_a, fpt_b = _flops_per_token(before), _flops_per_token(after)
    if any(k in diff for k in _MODEL) or (fpt_a and fpt_b and abs(fpt_b / fpt_a - 1) > 1e-9):
        return False, f"{_model_words(diff, fpt_a, fpt_b, sa, sb)} {runs_say}"
    if sa.get("tokens_per_step") != sb.get("tokens_per_step"):
        ta, tb = sa.get("tokens_per_step"), sb.get("tokens_per_step")
        if "micro_batch" not in diff:
            hint = WORDS.say("accum-alone", micro_batch=b.get("micro_batch"), after=f"{tb:,}", before=f"{ta:,}")
        else:
            hint = WORDS.say("tokens-changed", after=f"{tb:,}", before=f"{ta:,}")
        return False, WORDS.say("keep-tokens", hint=hint, runs_say=runs_say)
    wrong = _wrong_kind(diff, a, sa, sb, wait_a)
    if wrong:
        return False, f"{wrong} {runs_say}{_mixed(diff)}"
    other = [k for k in diff if k not in _RIGHT_KIND]
    if other:
        return False, f"{_other_words(diff, other, a)} {runs_say}"
    if "micro_batch" in diff and b["micro_batch"] < a["micro_batch"]:
        return False, WORDS.say("smaller", before=a["micro_batch"], after=b["micro_batch"], runs_say=runs_say)
    verdict = _speed_verdict(cmp)
    if verdict == "b" or (verdict is None and gain >= MIN_GAIN):
        if "micro_batch" in diff:
            why = WORDS.say("why-micro-batch", before=a["micro_batch"], after=b["micro_batch"],
                            accum_before=a["accum"], accum_after=b["accum"])
        else:
            why = WORDS.say("why-compile")
        return True, f"{runs_say} {why}"
    if verdict in ("a", "same"):
        return False, WORDS.say("no-rise", sentence=cmp.sentence)
    return False, WORDS.say("unclear", gain=f"{gain:.2f}", before=f"{mfu_a:.2%}", after=f"{mfu_b:.2%}",
                            least=f"{MIN_GAIN}")


# ---- 05 — the loader's and the model's time per batch, read from records -------------------------

def _recs(loads_ms, computes_ms, opt_ms):
    """Records of a 0-worker run: each update loads its batch (data_wait_s), computes, steps the optimizer."""
    out = []
    for i, (ld, co) in enumerate(zip(loads_ms, computes_ms)):
        step = (ld + co + opt_ms) / 1e3
        out.append({"update": i + 2, "data_wait_s": ld / 1e3, "compute_s": co / 1e3, "optimizer_s": opt_ms / 1e3,
                    "step_time_s": step, "tokens": 512, "tokens_per_s": 512 / step, "samples_per_s": 4 / step})
    return out


# Records only: the right readings are worked out from them after the learner's function has returned.
# Symmetric per-update values, so the mean and the median agree. Load 130 against 60 ms: floor and round give
# 2, the right answer 3. Load 244 against 120: ⌈2.03⌉ = 3, and the 5 % knee is 2 (a wait of 2 ms in a 122 ms
# step): both pass. Load 30 against 120: 1 worker, not 0.
_CASES = [_recs([110, 130, 150], [45, 50, 55], 10), _recs([244, 244, 244], [100, 110, 120], 10),
          _recs([25, 30, 35], [95, 100, 105], 20)]


def _reading_of(recs):
    """(load ms, compute ms) per batch of test records: the medians of data_wait_s and of step_time_s − it."""
    load = statistics.median(1e3 * r["data_wait_s"] for r in recs)
    return load, statistics.median(1e3 * (r["step_time_s"] - r["data_wait_s"]) for r in recs)


def _triple(value, source):
    """(load ms, compute ms, workers) from a tuple/list of three or a dict with those keys."""
    if value is None or value is Ellipsis:
        raise NotAttempted()
    if isinstance(value, dict):
        keys = {k.lower(): v for k, v in value.items() if isinstance(k, str)}
        try:
            value = [next(v for k, v in keys.items() if k.startswith(p)) for p in ("load", "compute", "worker")]
        except StopIteration:
            raise AnswerError(WORDS05.say("reading-dict", source=_source(source), keys=f"{sorted(keys)}")) from None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 3:
        raise AnswerError(WORDS05.say("reading-three", source=_source(source), value=describe(value)))
    load = number(value[0], "give the load time in ms per batch", f"{source} a load time that is")
    compute = number(value[1], "give the compute time in ms per batch", f"{source} a compute time that is")
    workers = number(value[2], "give a whole number of workers", f"{source} a worker count that is")
    return load, compute, workers


def _source(source: str) -> str:
    """'your function returned' / 'your answer is', in the learner's language (number() keeps the English)."""
    return WORDS05.say("source-function" if source == "your function returned" else "source-answer")


def _allowed_workers(load, compute):
    return {timing.workers_rule(load, compute), timing.fewest_workers(load, 1, compute)} if compute > 0 else set()


def _workers_hint(load, compute, workers, allowed):
    if workers != int(workers):
        return WORDS05.say("workers-whole")
    w = int(workers)
    ratio = load / compute if compute else float("inf")
    if compute > 0 and load > 0 and w == math.floor(ratio) and w not in allowed:
        return WORDS05.say("workers-floor", load=f"{load:.0f}", compute=f"{compute:.0f}", workers=w,
                           every=f"{load / max(w, 1):.0f}")
    if load > 0 and w == math.ceil(compute / load - 1e-9):
        return WORDS05.say("workers-inverted")
    if w == 0:
        return WORDS05.say("workers-zero")
    if allowed and w > max(allowed):
        return WORDS05.say("workers-more", workers=w, most=max(allowed), compute=f"{compute:.0f}")
    return WORDS05.say("workers-how")


def _compare_reading(got, want_ms, spread):
    """Whether a learner's ms value matches labkit's median within the measurement's tolerance: half the range
    of the per-update values (any mean or median of them lies that close), at least 5 %."""
    tol = max(0.05 * want_ms, (spread[1] - spread[0]) / 2)
    return abs(got - want_ms) <= tol, tol


@measurements.graded_from_file
@checker
def loader_reading(answer, runs=None):
    """``answer``: a function ``f(records) -> (load_ms, compute_ms, workers)`` read from the per-update records of
    runs with 0 loader workers (or those three numbers themselves); ``runs``: the run(s) read. Load = the time
    to load one batch (with 0 workers, the update's data wait); compute = the rest of the update (forward,
    backward, optimizer step); workers = how many keep the model from waiting. With runs, the records read
    and your readings are saved (``measurements``): a grader judges those."""
    if callable(answer) and runs is None:  # the test records only: nothing measured, nothing saved
        return _synthetic_verdict(_synthetic_answers(answer)) or (True, WORDS05.say("reading-test-right"))
    if runs is None and answer is not measurements.SAVED:
        raise AnswerError(WORDS05.say("reading-runs"))
    return measurements.judged("loader_reading", "05", answer, lambda: _reading_data(answer, runs), _judge_reading)


def _synthetic_answers(fn) -> list:
    return [_triple(fn(copy.deepcopy(recs)), "your function returned") for recs in _CASES]


def _synthetic_verdict(answers):
    """(False, hint) for the first test records the learner's readings get wrong, else None."""
    for recs, got in zip(_CASES, answers):  # labkit's reading only now, with every answer in hand
        msg = _synthetic_mistake(tuple(got), recs, *_reading_of(recs))
        if msg:
            return False, WORDS05.say("reading-test-wrong", loads=f"{[round(1e3 * r['data_wait_s']) for r in recs]}",
                                      hint=msg)
    return None


def _reading_data(answer, runs) -> dict:
    """What loader_reading judges: the learner's readings (of the test records too) and the runs, records and all."""
    rs = timing.as_runs(runs)
    if not rs:
        raise AnswerError(WORDS05.say("reading-no-runs", runs=describe(runs)))
    busy = [timing.summary_of(r).get("workers") for r in rs if timing.summary_of(r).get("workers")]
    if busy:
        raise AnswerError(WORDS05.say("reading-workers"))
    synthetic = _synthetic_answers(answer) if callable(answer) else None
    got = None
    if synthetic is None or _synthetic_verdict(synthetic) is None:  # the runs: once the test records pass
        recs = timing.timed_records(rs)
        got = _triple(answer(copy.deepcopy(recs)) if callable(answer) else answer,
                      "your function returned" if callable(answer) else "your answer is")
    return {"synthetic": synthetic, "answer": got, "runs": measurements.runs_data(rs, records=True)}


def _judge_reading(data):
    synthetic, answer, runs = measurements.reading_entry(data, len(_CASES), _synthetic_verdict)
    if synthetic is not None:
        wrong = _synthetic_verdict(synthetic)
        if wrong:
            return wrong
    return _real_reading(tuple(answer), runs)


def _synthetic_mistake(got, recs, load, compute):
    """A hint when the learner's (load, compute, workers) for test records is wrong, else None."""
    g_load, g_comp, g_w = got
    if abs(g_load - load) > 1e-6 * load + 1e-9:
        steps = [1e3 * r["step_time_s"] for r in recs]
        if max(abs(g_load - 1e-3 * load), abs(g_comp - 1e-3 * compute)) < 1e-6 * load:
            return WORDS05.say("test-seconds")
        if abs(g_load - sorted(steps)[1]) < 1e-6 * load or abs(g_load - sum(steps) / len(steps)) < 1e-6 * load:
            return WORDS05.say("test-whole")
        if abs(g_load - sum(1e3 * r["data_wait_s"] for r in recs)) < 1e-6 * load:
            return WORDS05.say("test-total")
        tail = [1e3 * r["data_wait_s"] for r in recs[1:]]
        if abs(g_load - sum(tail) / len(tail)) < 1e-6 * load:
            return WORDS05.say("test-warmup")
        return WORDS05.say("test-load", load=f"{load:g}", got=f"{g_load:g}")
    if abs(g_comp - compute) > 1e-6 * compute:
        comp_only = sorted(1e3 * r["compute_s"] for r in recs)[1]
        if abs(g_comp - comp_only) < 1e-6 * compute:
            return WORDS05.say("test-compute-only")
        if abs(g_comp - sorted(1e3 * r["step_time_s"] for r in recs)[1]) < 1e-6 * compute:
            return WORDS05.say("test-with-wait")
        return WORDS05.say("test-compute", compute=f"{compute:g}", got=f"{g_comp:g}")
    allowed = _allowed_workers(load, compute)
    if g_w not in allowed:
        return WORDS05.say("test-workers", workers=f"{g_w:g}", load=f"{load:g}", compute=f"{compute:g}",
                           hint=_workers_hint(load, compute, g_w, allowed))
    return None


def _real_reading(got, rs):
    ref = timing.loader_reading(rs)  # labkit's reading only now, with the learner's in hand
    g_load, g_comp, g_w = got
    ok_load, tol_load = _compare_reading(g_load, ref["load_ms"], ref["load_range_ms"])
    ok_comp, tol_comp = _compare_reading(g_comp, ref["compute_ms"], ref["compute_range_ms"])
    theirs = WORDS05.say("runs-theirs", load=f"{ref['load_ms']:.1f}", compute=f"{ref['compute_ms']:.1f}",
                         updates=ref["updates"], low=f"{ref['load_range_ms'][0]:.1f}",
                         high=f"{ref['load_range_ms'][1]:.1f}")
    if not ok_load:
        mb = timing.summary_of(rs[0]).get("micro_batch") or 1
        key = ("runs-seconds" if abs(g_load * 1e3 - ref["load_ms"]) <= tol_load
               else "runs-per-sample" if mb > 1 and abs(g_load * mb - ref["load_ms"]) <= tol_load else "runs-load-hint")
        return False, WORDS05.say("runs-load", got=f"{g_load:.4g}", tol=f"{tol_load:.1f}", theirs=theirs,
                                  hint=WORDS05.say(key, micro_batch=mb))
    if not ok_comp:
        steps = timing.median_of(rs, "step_time_s")
        key = ("runs-whole" if steps and abs(g_comp - 1e3 * steps) <= tol_comp
               else "runs-seconds" if abs(g_comp * 1e3 - ref["compute_ms"]) <= tol_comp else "runs-compute-hint")
        return False, WORDS05.say("runs-compute", got=f"{g_comp:.4g}", tol=f"{tol_comp:.1f}", theirs=theirs,
                                  hint=WORDS05.say(key))
    allowed = _allowed_workers(g_load, g_comp) | {ref["workers"], ref["knee"]}
    if g_w not in allowed:
        return False, WORDS05.say("runs-workers", load=f"{g_load:.1f}", compute=f"{g_comp:.1f}", workers=f"{g_w:g}",
                                  hint=_workers_hint(g_load, g_comp, g_w, _allowed_workers(g_load, g_comp)))
    return True, WORDS05.say("runs-right", load=f"{g_load:.1f}", compute=f"{g_comp:.1f}", workers=int(g_w),
                             theirs=theirs, want=ref["workers"], knee=ref["knee"])
