"""Words about runs that the charts and the panel share: a run's short label (the knobs that differ
from a baseline or from Config's defaults), ratios to a baseline and the sentences that say them.
Nothing here draws.
"""
from __future__ import annotations

from ...base.numfmt import number
from ...engine import checkpointing
from ...engine.config import defaults
from ...engine.measure import mfu_impossible
from .figure import _ok, say, summary_of, threads

# Knobs a run label may mention, in the order a learner thinks of them.
LABEL_KNOBS = ("model", "precision", "loss_scaling", "accum", "micro_batch", "checkpointing", "checkpoint_every",
         "optimizer", "workers", "pin_memory", "data_cost_ms", "world_size", "ddp_sync", "memory_budget_gb")
# What the comparison chart and the ratio sentences show: (summary key, words)
# No step time: runs with other accumulation, micro-batch or world size do different work per update, so
# their step times are not like for like; tokens/s is (its inverse is the time per token).
RATIO_METRICS = (("tokens_per_s", "tokens/s"), ("activation_bytes", "activation memory"),
           ("peak_mem_bytes", "peak memory"), ("mfu", "MFU"), ("allreduce_calls_per_update", "AllReduce calls/update"))
# (the words here are English; a learner reads the "ratio-KEY" item of the Charts section: ``metric_words``)


def metric_words(key: str) -> str:
    """A ratio metric's words in the learner's language ("tokens/s", "activation memory", ...)."""
    return say(_METRIC_WORDS[key])


_METRIC_WORDS = {"tokens_per_s": "ratio-tokens_per_s", "activation_bytes": "ratio-activation_bytes",
                 "peak_mem_bytes": "ratio-peak_mem_bytes", "mfu": "ratio-mfu",
                 "allreduce_calls_per_update": "ratio-allreduce_calls_per_update"}
# The comparison chart shows the baseline and at most this many later runs (the table lists them all):
# a chart of 300 runs is unreadable, and its legend squeezed the axes to nothing.
COMPARE_LAST = 6


def run_label(summary, baseline=None) -> str:
    """Short words for a run: the knobs that differ from ``baseline`` (or from Config's defaults). A
    ``"label"`` you put into a summary yourself wins."""
    if not summary:
        return "?"
    if summary.get("label"):
        return str(summary["label"])
    ref = baseline or _DEFAULTS
    parts = []
    for k in LABEL_KNOBS + (("steps",) if baseline else ()):  # against a baseline, a different length matters too
        v = summary.get(k)
        if k == "checkpoint_every" and not _every_k_matters(summary.get("checkpointing")):
            continue  # e.g. selective checkpointing wraps every block whatever k says
        if k in summary and v != ref.get(k):
            parts.append(str(v) if k in ("precision", "model") else f"{k}={v}")
    return " ".join(parts) or (say("run-baseline") if baseline is None else say("same-knobs"))


# Config's own defaults: what a run label leaves unsaid (a copy typed here had drifted before).
_DEFAULTS = defaults()


def _every_k_matters(mode) -> bool:
    """Whether ``checkpoint_every`` changes what checkpointing ``mode`` does, asked of the engine's own
    policies (full and attention wrap every k-th block): block 1 is wrapped with k = 1 but not with k = 2."""
    return any((wrap(mode, 1, 1) is None) != (wrap(mode, 2, 1) is None)
               for wrap in (checkpointing.wrap_fn, checkpointing.core_wrap_fn))


def ratios(results, baseline=0, only=None) -> list:
    """For every run (or the indices in ``only``): {"index", "label", metric: value / baseline's value,
    ...}; None where either is missing."""
    summaries = [summary_of(r) for r in results]
    base = summaries[baseline]
    out = []
    for i in (range(len(summaries)) if only is None else only):
        s = summaries[i]
        row = {"index": i, "label": run_label(s, base) if i != baseline else run_label(s)}
        for key, _ in RATIO_METRICS:
            a, b = s.get(key), base.get(key)
            row[key] = a / b if _ok(a) and _ok(b) and b else None
        if mfu_impossible(s.get("mfu")) or mfu_impossible(base.get("mfu")):
            row["mfu"] = None  # an MFU above 1 is not a measurement: no ratio of it either
            row["mfu_wrong"] = True
        out.append(row)
    return out


def cpu_threads(summary):
    """The intra-op threads a CPU run used; None on a GPU (there the CPU threads barely matter)."""
    s = summary_of(summary) or {}
    return s.get("intra_op_threads") if s.get("device") == "cpu" else None


def threads_words(summary, base) -> str:
    """' (both at 2 CPU threads)', or a warning when the thread count differs: a bf16 speed-up was 9.5x
    at one thread and 4.9x at two on the same CPU, so a speed-up means little without it."""
    a, b = cpu_threads(summary), cpu_threads(base)
    if a is None or b is None:
        return ""
    if a == b:
        return " " + say("both-threads", threads=threads(a, cpu=True))
    return " " + say("other-threads", threads=threads(a, cpu=True), baseline=b)


def flops_words(v) -> str:
    """A FLOP/s rate in words a learner reads: '0.43 GFLOP/s', '989 TFLOP/s'."""
    if not _ok(v) or not v:
        return say("unknown")
    return f"{number(v / 1e12)} TFLOP/s" if v >= 1e12 else f"{number(v / 1e9)} GFLOP/s"


def _mfu_words(s, base) -> str:
    """Why an MFU ratio can fall while tokens/s rises: each run's MFU is against its own format's peak."""
    if s.get("precision") == base.get("precision"):
        return ""
    return " " + say("mfu-own-peak", precision=s.get("precision"), flops=flops_words(s.get("peak_flops")),
                     base_precision=base.get("precision"), base_flops=flops_words(base.get("peak_flops")))


def ratio_lines(results, baseline=0, only=None) -> list:
    """One sentence per run (or per index in ``only``), e.g. 'bf16: 2.1× tokens/s, 0.52× activation
    memory, 0.28× MFU (MFU is measured against each format's own peak: ...) (both at 2 CPU threads)'."""
    summaries = [summary_of(r) for r in results]
    base = summaries[baseline]
    lines = []
    for row in ratios(results, baseline, only):
        if row["index"] == baseline:
            continue
        s = summaries[row["index"]]
        parts = [say("ratio", ratio=number(row[k], 2), what=metric_words(k))
                 + (_mfu_words(s, base) if k == "mfu" else "") for k, _ in RATIO_METRICS if row[k] is not None]
        if row.get("mfu_wrong"):
            parts.append(say("mfu-not-compared"))  # MFU_WRONG, in words
        lines.append(f"{row['label']}: " + (", ".join(parts) or say("nothing")) + threads_words(s, base))
    return lines


def shown_runs(n_runs: int, baseline=0, last=COMPARE_LAST) -> list:
    """Which runs a comparison chart shows: the baseline and the ``last`` latest others, in order."""
    later = [i for i in range(n_runs) if i != baseline][-last:] if last else []
    return sorted(set(later) | {baseline})
