"""Compare two configurations the honest way: interleaved repeats, a ratio with its 95 % interval, and
a verdict that claims a direction only when the data show one.

    cmp = compare_configs(lk.Config(model="small"), lk.Config(model="small", checkpointing="full"),
                          metric="cpu_s_per_update", budget_s=30)
    print(cmp.sentence)     # generated from cmp.verdict / cmp.better -- never typed by hand

Why interleaved: on a shared machine the load drifts; A B A B ... lets a drift hit both arms alike.
Why a fixed thread count: with 2 threads on 2 busy cores one update took 1.1 s against 0.03 s with one;
a comparison that changed the threads along with the knob would measure the threads.
"""
from __future__ import annotations

import dataclasses
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .config import Config
from .errors import ConfigError
from .device import capabilities
from .measure import LoadMeter, machine_load
from .rules import check as check_device
from .train import run, threads_for

# metric -> (which way is better, words for a sentence)
METRICS = {
    "tokens_per_s": ("higher", "tokens per second"),
    "step_time_s": ("lower", "wall time per update"),
    "cpu_s_per_update": ("lower", "CPU-seconds per update"),
    "peak_mem_bytes": ("lower", "peak memory"),
}
# Deterministic quantities: the same in every repeat, compared exactly (no statistics needed).
EXACT_KEYS = ("allreduce_calls_per_update", "allreduce_bytes_per_update", "activation_bytes", "param_bytes",
              "grad_bytes", "optimizer_bytes", "model_flops_per_step", "hardware_flops_per_step")
METHOD = "percentile bootstrap of the ratio of medians (2000 resamples, each arm resampled on its own)"
EARLY_STOP_HALF_WIDTH = 0.03  # stop before the budget only when the interval is this narrow


@dataclass
class Comparison:
    """b against a (a is the baseline). ``ratio`` = median(b) / median(a) of ``metric``."""

    metric: str
    ratio: Optional[float]
    low: Optional[float]
    high: Optional[float]
    verdict: str                 # b's value relative to a's: "higher", "lower" or "same"
    better: Optional[str]        # "a", "b" or None
    samples_a: list
    samples_b: list
    busy: bool
    sentence: str
    threshold: float = 0.05
    min_repeats: int = 5
    method: str = METHOD
    label_a: str = "a"
    label_b: str = "b"
    threads: Optional[int] = None
    elapsed_s: float = 0.0
    load: dict = field(default_factory=dict)
    exact: dict = field(default_factory=dict)    # key -> (a's value, b's value)
    results_a: list = field(default_factory=list, repr=False)
    results_b: list = field(default_factory=list, repr=False)

    @property
    def decided(self) -> bool:
        """Whether enough repeats ran for a verdict (``min_repeats`` per arm); "same" can mean either
        "measured, no difference" (decided) or "too few runs to tell" (not decided)."""
        return self.ratio is not None and min(len(self.samples_a), len(self.samples_b)) >= self.min_repeats

    @property
    def spread(self) -> Optional[float]:
        """Half the interval's width, relative to the ratio (0.04 = ±4 %)."""
        if self.ratio is None or self.low is None:
            return None
        return (self.high - self.low) / 2 / self.ratio

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("results_a"), d.pop("results_b")
        return d

    def _repr_markdown_(self):
        return self.sentence


def ratio_interval(samples_a, samples_b, *, resamples: int = 2000, seed: int = 0):
    """(ratio of medians, low, high): a 95 % percentile-bootstrap interval; deterministic (seeded)."""
    ratio = statistics.median(samples_b) / statistics.median(samples_a)
    rng = random.Random(seed)
    na, nb = len(samples_a), len(samples_b)
    boot = sorted(statistics.median(rng.choices(samples_b, k=nb)) / statistics.median(rng.choices(samples_a, k=na))
                  for _ in range(resamples))
    return ratio, boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]


def verdict(samples_a, samples_b, metric: str = "tokens_per_s", *, threshold: float = 0.05,
            min_repeats: int = 5, busy: bool = False, label_a: str = "a", label_b: str = "b",
            load: Optional[dict] = None) -> Comparison:
    """The verdict from samples alone (the part of compare_configs that tests can feed directly).

    "same" unless the interval excludes 1 *and* the ratio differs from 1 by at least ``threshold``; and
    never a direction before ``min_repeats`` samples per arm."""
    _check_metric(metric)
    samples_a, samples_b = [float(x) for x in samples_a], [float(x) for x in samples_b]
    if not samples_a or not samples_b or min(samples_a) <= 0:
        ratio = low = high = None
    else:
        ratio, low, high = ratio_interval(samples_a, samples_b)
    enough = min(len(samples_a), len(samples_b)) >= min_repeats
    direction = "same"
    if enough and ratio is not None and (low > 1 or high < 1) and abs(ratio - 1) >= threshold:
        direction = "higher" if ratio > 1 else "lower"
    better = None
    if direction != "same":
        better = "b" if (direction == "higher") == (METRICS[metric][0] == "higher") else "a"
    cmp = Comparison(metric=metric, ratio=ratio, low=low, high=high, verdict=direction, better=better,
                     samples_a=samples_a, samples_b=samples_b, busy=busy, sentence="", threshold=threshold,
                     min_repeats=min_repeats, label_a=label_a, label_b=label_b, load=load or {})
    cmp.sentence = sentence(cmp)
    return cmp


def sentence(c: Comparison) -> str:
    """Plain English that follows from the verdict -- the only prose chapters print about an A/B."""
    words = METRICS[c.metric][1]
    n = f"{len(c.samples_a)} + {len(c.samples_b)} interleaved runs"
    if c.ratio is None:
        text = f"**{c.label_b}** vs **{c.label_a}**: nothing to compare ({words} was not measured)."
    elif min(len(c.samples_a), len(c.samples_b)) < c.min_repeats:
        text = (f"**{c.label_b}** vs **{c.label_a}**: only {n} fit in the time budget; at least {c.min_repeats} "
                f"of each are needed before claiming a direction, so **no verdict** (ratio so far "
                f"{c.ratio:.2f}, 95 % interval {c.low:.2f}–{c.high:.2f}).")
    elif c.verdict == "same":
        text = (f"**{c.label_b}** vs **{c.label_a}**: **no difference measurable on this machine right now** in "
                f"{words} (ratio {c.ratio:.2f}, 95 % interval {c.low:.2f}–{c.high:.2f}, ±{c.spread:.0%}; {n}).")
    else:
        more = "more" if c.verdict == "higher" else "less"
        winner = c.label_b if c.better == "b" else c.label_a
        text = (f"**{c.label_b}** gave **{abs(c.ratio - 1):.0%} {more}** {words} than **{c.label_a}** (ratio "
                f"{c.ratio:.2f}, 95 % interval {c.low:.2f}–{c.high:.2f}; {n}): **{winner}** is better here.")
    if c.busy:
        other = c.load.get("other_cores")
        what = f"other programs used {other:.1f} cores on average" if other is not None else "the load was high"
        text += f" ⚠ The machine was busy ({what}): measured under load, so the spread is wider."
    return text


def _check_metric(metric):
    if metric not in METRICS:
        raise ConfigError("metric", metric, "one of " + ", ".join(METRICS) + " (AllReduce counts, bytes and "
                          "FLOPs are exact: read them from Comparison.exact)")


def _value(result, metric):
    v = result.summary.get(metric)
    if v is None:
        raise ConfigError("metric", metric, f"a metric this device measures ({metric} is None on "
                          f"{result.summary.get('device')}); use tokens_per_s, step_time_s or cpu_s_per_update")
    return float(v)


def fixed_threads(a: Config, b: Config, busy: bool) -> Optional[int]:
    """One intra-op thread count for both arms on a CPU (None elsewhere): 1 on a busy machine, else the
    smaller of the two arms' own choices -- so the knob, not the thread count, is what differs."""
    kind = capabilities(a.device).kind
    if kind != "cpu":
        return None
    if a.threads is not None and a.threads == b.threads:
        return a.threads
    if busy:
        return 1
    return min(threads_for(c, kind, c.world_size) for c in (a, b))


def compare_configs(a: Config, b: Config, *, metric: str = "tokens_per_s", budget_s: float = 60.0,
                    min_repeats: int = 5, threshold: float = 0.05, max_repeats: int = 50, warmup_runs: int = 1,
                    label_a: Optional[str] = None, label_b: Optional[str] = None, progress: bool = True,
                    run_fn: Callable = run) -> Comparison:
    """Run ``a`` (the baseline) and ``b`` interleaved -- A B A B ... -- and compare ``metric``.

    Each run is a whole ``lk.run`` whose summary already leaves out its warm-up updates; the first
    ``warmup_runs`` pair is discarded too (cold caches, first-touch memory). Stops at ``budget_s`` --
    it never starts a pair that would overrun it, once two repeats per arm are in -- or earlier only
    when ``min_repeats`` are in and the interval's half-width is below 3 %. A budget too short for
    ``min_repeats`` gives no direction (``decided`` is False, the sentence says so). On a CPU both
    arms run with one fixed thread count."""
    _check_metric(metric)
    for name, c in (("a", a), ("b", b)):
        if not isinstance(c, Config):
            raise ConfigError(name, c, "a labkit.Config")
        check_device(c)  # what this device refuses fails now, not after the first arm's runs
    label_a = label_a or _diff_label(a, b) or "a"
    label_b = label_b or _diff_label(b, a) or "b"
    before = machine_load()
    threads = fixed_threads(a, b, before["busy"])
    if threads is not None:
        a, b = a.replace(threads=threads), b.replace(threads=threads)
    meter = LoadMeter()
    t_start = time.perf_counter()
    samples = {"a": [], "b": []}
    results = {"a": [], "b": []}
    pair_times = []
    pair = 0
    while True:
        t_pair = time.perf_counter()
        for arm, cfg in (("a", a), ("b", b)):
            res = run_fn(cfg)
            if pair >= warmup_runs:
                results[arm].append(res)
                samples[arm].append(_value(res, metric))
        pair += 1
        pair_times.append(time.perf_counter() - t_pair)
        elapsed = time.perf_counter() - t_start
        n = len(samples["a"])
        if progress:
            _progress(n, elapsed, budget_s, label_a, label_b)
        if n >= max_repeats:
            break
        if n >= min_repeats:
            r, lo, hi = ratio_interval(samples["a"], samples["b"])
            if (hi - lo) / 2 / r < EARLY_STOP_HALF_WIDTH:
                break
        if n >= 2 and elapsed + statistics.median(pair_times) > budget_s:
            break
    load = meter.read()
    spread_busy = any(_rel_iqr(s) > 0.25 for s in samples.values() if len(s) >= 4)
    load["before"] = before
    load["repeats_scattered"] = spread_busy
    busy = bool(before["busy"] or load["busy"] or spread_busy)
    cmp = verdict(samples["a"], samples["b"], metric, threshold=threshold, min_repeats=min_repeats, busy=busy,
                  label_a=label_a, label_b=label_b, load=load)
    cmp.threads, cmp.elapsed_s = threads, time.perf_counter() - t_start
    cmp.results_a, cmp.results_b = results["a"], results["b"]
    cmp.exact = {k: (results["a"][0].summary.get(k), results["b"][0].summary.get(k))
                 for k in EXACT_KEYS if results["a"] and results["a"][0].summary.get(k) is not None}
    if progress:
        print(file=sys.stderr, flush=True)
    return cmp


def _rel_iqr(xs) -> float:
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def _diff_label(c: Config, other: Config) -> str:
    """'checkpointing=full' -- the fields where c differs from other, as a label."""
    d, o = c.to_dict(), other.to_dict()
    return ", ".join(f"{k}={d[k]}" for k in d if d[k] != o[k] and k != "threads")


def _progress(n, elapsed, budget, label_a, label_b):
    print(f"\r[compare] {label_a} vs {label_b}: {n} interleaved pair(s) in {elapsed:.0f} s "
          f"(budget {budget:.0f} s)", end="", file=sys.stderr, flush=True)
