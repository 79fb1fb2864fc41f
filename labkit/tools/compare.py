"""Compare two configurations the honest way: interleaved repeats, a ratio with its 95 % interval, and
a verdict that claims a direction only when the data show one.

    cmp = compare_configs(lk.Config(model="small"), lk.Config(model="small", checkpointing="full"),
                          metric="cpu_s_per_update", budget_s=30)
    print(cmp.sentence)     # generated from cmp.verdict / cmp.better -- never typed by hand

Why interleaved: on a shared machine the load drifts; A B A B ... lets a drift hit both arms alike.
Why a fixed thread count: on busy cores, two threads fighting other programs for them can be many times
slower than one (one 2-core machine's anecdote: 1.1 s against 0.03 s per update, not a figure to expect);
a comparison that changed the threads along with the knob would measure the threads.
"""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..base import phrases
from ..base.numfmt import counted
from . import ranks
from ..engine.config import Config, _int, _num
from ..base.runtime import ConfigError
from ..base.frontend import Progress
from ..engine.device import capabilities
from ..engine.measure import LoadMeter, machine_load
from ..engine.rules import check as check_device
from ..engine.train import run, threads_for

# metric -> (which way is better, its words in English; a sentence says WORDS' metric-<name> instead)
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
# below min_repeats runs per arm a bootstrap's "95 %" is narrower than 95 % (tools/ranks.py): the exact interval
EXACT_METHOD = "exact Mann-Whitney interval of the ratio (order statistics of all b/a ratios, >= 95 %)"
EARLY_STOP_HALF_WIDTH = 0.03  # stop before the budget only when the interval is this narrow
MAX_WARMUP_RUNS = 10          # discarded pairs: a few settle caches; more only spend the budget
JUMP_RATIO = 1.5              # a level shift in step time at least this large (either way) is a jump, not noise
JUMP_MIN_SEGMENT = 3          # updates on each side of a jump: one slow update is a spike, not a new level
JUMP_AGREE = 0.8              # share of each side's updates that must lie on its own side of the midpoint
# metrics whose words count things ("tokens", "CPU-seconds"): fewer of them, not less
COUNTED_METRICS = ("tokens_per_s", "cpu_s_per_update")
# the verdict's sentences: notebooks/lab_messages.md, "## Comparisons" (the code keeps the figures and the bold)
_AB, _FIG = ("label_a", "label_b"), ("ratio", "low", "high", "runs")
WORDS = phrases.load_section("lab_messages.md", "Comparisons", {
    "metric-tokens_per_s": (), "metric-step_time_s": (), "metric-cpu_s_per_update": (), "metric-peak_mem_bytes": (),
    "runs": ("a", "b"), "again": ("budget",), "no-verdict": (), "and": (), "no-difference": (), "more": (),
    "fewer": (), "less": (), "fell": ("ratio",), "rose": ("ratio",), "why-few": ("fewest",),
    "why-open": ("low", "high", "threshold"), "small": ("diff", "threshold"), "by": ("pct", "more"),
    "budget-out": _AB + ("no_verdict", "missing", "runs", "again"), "not-measured": _AB + ("words",),
    "undecided": _AB + ("no_verdict", "runs", "why", "words", "ratio", "again"),
    "below-threshold": _AB + _FIG + ("small", "label", "more", "words"),
    "straddles": _AB + _FIG + ("no_difference", "words", "spread"), "decided": _AB + _FIG + ("by", "words", "winner"),
    "jumps": ("jumps", "runs", "label", "sample", "change", "at"), "busy": ("what",), "busy-cores": ("cores",),
    "busy-high": (), "threads-one": (), "threads-many": ("n",)})


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
    jumps: list = field(default_factory=list)    # runs whose speed jumped mid-run: {"arm", "sample", **speed_jump}
    results_a: list = field(default_factory=list, repr=False)
    results_b: list = field(default_factory=list, repr=False)
    early: bool = False          # decided with fewer than min_repeats runs: the exact interval settled it

    @property
    def decided(self) -> bool:
        """Whether the runs allow a verdict: ``min_repeats`` per arm, or fewer where the exact interval
        settles it (``early``); "same" is then "measured, no difference", else "too few to tell"."""
        return self.ratio is not None and (self.early or
                                           min(len(self.samples_a), len(self.samples_b)) >= self.min_repeats)

    @property
    def resolved(self) -> bool:
        """Whether the 95 % interval excludes 1: a difference was measured, whatever its size."""
        return self.ratio is not None and self.low is not None and (self.low > 1 or self.high < 1)

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
        """The verdict's sentence -- and, where the comparison fixed the thread count, that both arms had it
        (the same knob with 1 or 2 threads gave a different ratio)."""
        threads = self.threads if isinstance(self.threads, int) and not isinstance(self.threads, bool) else None
        if not threads:
            return self.sentence
        said = WORDS.say("threads-one") if threads == 1 else WORDS.say("threads-many", n=threads)
        return self.sentence + " " + said


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
            load: Optional[dict] = None, jumps: Optional[list] = None) -> Comparison:
    """The verdict from samples alone (the part of compare_configs that tests can feed directly).

    With ``min_repeats`` samples per arm or more: the bootstrap interval; "same" unless it excludes
    1 *and* the ratio differs from 1 by at least ``threshold``. With fewer: the exact interval
    (``ranks.ratio_interval``, none below 4 runs per arm), and a verdict only where it ``settles``
    the question -- wholly beyond ``threshold`` of 1 (a direction) or wholly within it ("same");
    else none (``decided`` False). ``compare_configs`` looks after every pair, which gives chance
    more than one try; asking the interval to clear the whole band, not just 1, confines that extra
    risk to effects near the threshold (one look errs at most 2.5 % per side)."""
    _check_metric(metric)
    samples_a, samples_b = [float(x) for x in samples_a], [float(x) for x in samples_b]
    if not samples_a or not samples_b or min(samples_a) <= 0:
        ratio = low = high = None
    else:
        ratio, low, high = ratio_interval(samples_a, samples_b)
    enough = min(len(samples_a), len(samples_b)) >= min_repeats
    method, early = METHOD, False
    exact = None if enough or ratio is None else ranks.ratio_interval(samples_a, samples_b)
    if exact is not None:
        low, high = exact[:2]
        method, early = EXACT_METHOD, settles(low, high, threshold) is not None
    direction = "same"
    if early and settles(low, high, threshold) == "beyond":  # the interval's side, not the point estimate's
        direction = "higher" if low > 1 else "lower"
    elif enough and ratio is not None and (low > 1 or high < 1) and abs(ratio - 1) >= threshold:
        direction = "higher" if ratio > 1 else "lower"
    better = None
    if direction != "same":
        better = "b" if (direction == "higher") == (METRICS[metric][0] == "higher") else "a"
    cmp = Comparison(metric=metric, ratio=ratio, low=low, high=high, verdict=direction, better=better,
                     samples_a=samples_a, samples_b=samples_b, busy=busy, sentence="", threshold=threshold,
                     min_repeats=min_repeats, method=method, label_a=label_a, label_b=label_b, load=load or {},
                     jumps=list(jumps or []), early=early)
    cmp.sentence = sentence(cmp)
    return cmp


def settles(low, high, threshold: float):
    """'beyond' when an interval lies wholly outside ``threshold`` of 1 (the direction and its size are
    both established), 'within' when wholly inside it (any difference is below the threshold), else None."""
    if low is None or high is None:
        return None
    if low >= 1 + threshold or high <= 1 - threshold:
        return "beyond"
    if 1 - threshold < low and high < 1 + threshold:
        return "within"
    return None


def _bold(text: str) -> str:
    return f"**{text}**"


def sentence(c: Comparison) -> str:
    """Plain words that follow from the verdict -- the only prose chapters print about an A/B -- in the
    learner's language (``WORDS``; each sentence takes the placeholders it names from ``say``)."""
    say = dict(label_a=_bold(c.label_a), label_b=_bold(c.label_b), label=c.label_b,
               words=WORDS.say(f"metric-{c.metric}"), runs=WORDS.say("runs", a=len(c.samples_a), b=len(c.samples_b)),
               again=WORDS.say("again", budget="`budget_s`"), no_verdict=_bold(WORDS.say("no-verdict")))
    if c.ratio is not None:
        say.update(ratio=f"{c.ratio:.2f}", low=f"{c.low:.2f}", high=f"{c.high:.2f}")
    if not c.samples_a or not c.samples_b:  # e.g. a loop comparison whose budget ended before this case ran
        missing = [_bold(label) for label, xs in ((c.label_a, c.samples_a), (c.label_b, c.samples_b)) if not xs]
        text = WORDS.say("budget-out", **say, missing=f" {WORDS.say('and')} ".join(missing))
    elif c.ratio is None:
        text = WORDS.say("not-measured", **say)
    elif not c.decided:
        fewest = ranks.fewest_runs()
        why = WORDS.say("why-few", fewest=fewest) if min(len(c.samples_a), len(c.samples_b)) < fewest else \
            WORDS.say("why-open", **say, threshold=_pct(c.threshold))
        text = WORDS.say("undecided", **say, why=why)
    elif c.verdict == "same" and c.resolved:  # measured, but smaller than what the course calls an effect
        small = _bold(WORDS.say("small", diff=_pct(abs(c.ratio - 1)), threshold=_pct(c.threshold)))
        text = WORDS.say("below-threshold", **say, small=small, more=WORDS.say(_more(c, c.ratio > 1)))
    elif c.verdict == "same":  # the interval straddles 1
        text = WORDS.say("straddles", **say, no_difference=_bold(WORDS.say("no-difference")),
                         spread=f"{c.spread:.0%}")
    else:
        by = _bold(WORDS.say("by", pct=f"{abs(c.ratio - 1):.0%}", more=WORDS.say(_more(c, c.verdict == "higher"))))
        text = WORDS.say("decided", **say, by=by, winner=_bold(c.label_b if c.better == "b" else c.label_a))
    if c.jumps:
        text += " " + _jump_words(c)
    if c.busy:
        other = c.load.get("other_cores")
        what = WORDS.say("busy-cores", cores=f"{other:.1f}") if other is not None else WORDS.say("busy-high")
        text += " " + WORDS.say("busy", what=what)
    return text  # every piece came through WORDS.say, which groups a label's figures ('vocabulary 32,000')


def _more(c: Comparison, higher: bool) -> str:
    """'more', or the key of the comparative that fits the metric's words: 'fewer' tokens, 'less' wall time."""
    return "more" if higher else "fewer" if c.metric in COUNTED_METRICS else "less"


def _pct(x: float) -> str:
    """A share as a percentage: '3' for 0.031, '0.4' below 1 % (never '0' for a measured difference)."""
    p = 100 * x
    return f"{p:.1f}".rstrip("0").rstrip(".") if p < 1 else f"{p:.0f}"


def _jump_words(c: Comparison) -> str:
    j = max(c.jumps, key=lambda j: abs(math.log(j["ratio"])))
    label = c.label_a if j["arm"] == "a" else c.label_b
    change = WORDS.say("fell", ratio=f"{1 / j['ratio']:.1f}") if j["ratio"] < 1 else \
        WORDS.say("rose", ratio=f"{j['ratio']:.1f}")
    return WORDS.say("jumps", jumps=len(c.jumps), runs=len(c.samples_a) + len(c.samples_b), label=label,
                     sample=j["sample"] + 1, change=change, at=j["at"] + 1)


def speed_jump(values) -> Optional[dict]:
    """A level shift in one run's per-update step times (other programs' load eased mid-run), or
    None: {"at": the first update at the new level, "before_s", "after_s": medians, "ratio":
    after/before}. The split fits two flat levels best (least absolute deviation in log time); it is
    a jump only when the levels differ by JUMP_RATIO or more and JUMP_AGREE of each side lies on its
    side of the midpoint (a spike or a noisy level run is not)."""
    xs = _positive_times(values)
    n = len(xs)
    if n < 2 * JUMP_MIN_SEGMENT:
        return None
    logs = [math.log(x) for x in xs]

    def cost(seg):
        m = statistics.median(seg)
        return sum(abs(v - m) for v in seg)

    at = min(range(JUMP_MIN_SEGMENT, n - JUMP_MIN_SEGMENT + 1), key=lambda k: cost(logs[:k]) + cost(logs[k:]))
    before, after = statistics.median(xs[:at]), statistics.median(xs[at:])
    ratio = after / before
    if max(ratio, 1 / ratio) < JUMP_RATIO:
        return None
    mid = math.sqrt(before * after)  # the geometric midpoint: a 10x fall and a 10x rise are judged alike
    below_first = before < after
    agree_b = sum((x < mid) == below_first for x in xs[:at]) / at
    agree_a = sum((x > mid) == below_first for x in xs[at:]) / (n - at)
    if min(agree_b, agree_a) < JUMP_AGREE:
        return None
    return {"at": at, "before_s": before, "after_s": after, "ratio": ratio}


def _positive_times(values) -> list:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError("values", values, "a list of step times in seconds")
    xs = list(values)
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise ConfigError("values", x, "step times in seconds: finite numbers > 0")
    return [float(x) for x in xs]


def run_jump(result) -> Optional[dict]:
    """speed_jump over a Result's timed updates (its warm-up left out, as its summary leaves it out); its
    "at" counts from the run's first record."""
    records = getattr(result, "records", None) or []
    warmup = getattr(getattr(result, "config", None), "warmup", 0) or 0
    times = [r.get("step_time_s") for r in records[warmup:]]
    if not times or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0)
                        for t in times):
        return None  # not measured per update (a fake runner, a stopped run): nothing to judge
    jump = speed_jump(times)
    if jump is not None:
        jump["at"] += warmup  # an index into result.records: the sentence names the run's own update number
    return jump


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


def fixed_threads(a: Config, b: Config, busy: bool, caps=None) -> Optional[int]:
    """One intra-op thread count for both arms on a CPU (None elsewhere): 1 on a busy machine, else the
    smaller of the two arms' own choices -- so the knob, not the thread count, is what differs.
    ``caps``: ``a``'s device capabilities, when the caller has them already."""
    kind = (caps if caps is not None else capabilities(a.device)).kind
    if kind != "cpu":
        return None
    if a.threads is not None and a.threads == b.threads:
        return a.threads
    if busy:
        return 1
    return min(threads_for(c, kind, c.world_size) for c in (a, b))


def _check_arguments(a, b, metric, budget_s, min_repeats, threshold, max_repeats, warmup_runs, label_a, label_b,
                     progress, run_fn) -> None:
    """Every argument, before the first run: a NaN budget or min_repeats=0 used to fail (or mislead)
    only after several runs."""
    _check_metric(metric)
    for name, c in (("a", a), ("b", b)):
        if not isinstance(c, Config):
            raise ConfigError(name, c, "a labkit.Config")
    _num("budget_s", budget_s, 0.0, 86_400.0, lo_open=True)
    _int("min_repeats", min_repeats, 2, 10_000)  # one sample per arm has no spread: no interval, no verdict
    _int("max_repeats", max_repeats, 2, 10_000)
    if max_repeats < min_repeats:
        raise ConfigError("max_repeats", max_repeats, f"at least min_repeats={min_repeats}")
    _int("warmup_runs", warmup_runs, 0, MAX_WARMUP_RUNS)
    _num("threshold", threshold, 0.0, 1.0)
    for name, label in (("label_a", label_a), ("label_b", label_b)):
        if label is not None and not isinstance(label, str):
            raise ConfigError(name, label, "a string, or None for the differing fields")
    if not isinstance(progress, bool):
        raise ConfigError("progress", progress, "True or False")
    if not callable(run_fn):
        raise ConfigError("run_fn", run_fn, "a function that runs a Config and returns a Result")


def compare_configs(a: Config, b: Config, *, metric: str = "tokens_per_s", budget_s: float = 60.0,
                    min_repeats: int = 5, threshold: float = 0.05, max_repeats: int = 50, warmup_runs: int = 1,
                    label_a: Optional[str] = None, label_b: Optional[str] = None, progress: bool = True,
                    run_fn: Callable = run) -> Comparison:
    """Run ``a`` (the baseline) and ``b`` interleaved -- A B A B ... -- and compare ``metric``.

    The first ``warmup_runs`` pairs are discarded (cold caches, first-touch memory) while a kept
    pair still fits after them. Stops at ``budget_s`` (``_interleave``) or earlier: once the exact
    interval settles the verdict (``verdict``), or once ``min_repeats`` are in and the bootstrap
    interval's half-width is below 3 %; a budget too short for either gives no direction
    (``decided`` False). On a CPU both arms run with one fixed thread count; a run whose speed
    jumped is in ``jumps``."""
    _check_arguments(a, b, metric, budget_s, min_repeats, threshold, max_repeats, warmup_runs, label_a, label_b,
                     progress, run_fn)
    # what this device refuses fails now, not after the first arm's runs; the capabilities are asked once
    caps = check_device(a)
    check_device(b, caps if b.device == a.device else None)
    label_a = label_a or _diff_label(a, b) or "a"
    label_b = label_b or _diff_label(b, a) or "b"
    before = machine_load()
    threads = fixed_threads(a, b, before["busy"], caps)
    if threads is not None:
        a, b = a.replace(threads=threads), b.replace(threads=threads)
    meter = LoadMeter()
    t_start = time.perf_counter()
    # the budget is what ends a comparison, so the bar counts its seconds; no arm labels on it: with them
    # the line ran past ~80 characters and a notebook wrapped it mid-word (the cell names the arms anyway)
    with Progress(math.ceil(budget_s), "compare", delay=1.0 if progress else math.inf) as bar:
        results = _interleave(a, b, run_fn, metric, budget_s, (min_repeats, max_repeats, threshold), warmup_runs,
                              bar)
    samples = {arm: [_value(r, metric) for r in rs] for arm, rs in results.items()}
    load = meter.read()
    spread_busy = any(_rel_iqr(s) > 0.25 for s in samples.values() if len(s) >= 4)
    load["before"] = before
    load["repeats_scattered"] = spread_busy
    busy = bool(before["busy"] or load["busy"] or spread_busy)
    jumps = [{"arm": arm, "sample": i, **j} for arm, rs in results.items() for i, r in enumerate(rs)
             if (j := run_jump(r)) is not None]
    cmp = verdict(samples["a"], samples["b"], metric, threshold=threshold, min_repeats=min_repeats, busy=busy,
                  label_a=label_a, label_b=label_b, load=load, jumps=jumps)
    cmp.threads, cmp.elapsed_s = threads, time.perf_counter() - t_start
    cmp.results_a, cmp.results_b = results["a"], results["b"]
    cmp.exact = {k: (results["a"][0].summary.get(k), results["b"][0].summary.get(k))
                 for k in EXACT_KEYS if results["a"] and results["a"][0].summary.get(k) is not None}
    return cmp


def _pairs_note(kept: int, warmup: int) -> str:
    """'1 pair kept, 1 warm-up' / '2 pairs kept, 1 warm-up': the progress line's note."""
    return f"{counted(kept, 'pair')} kept, {warmup} warm-up"


def _interleave(a, b, run_fn, metric, budget_s, limits, warmup_runs, bar) -> dict:
    """A B A B ...: {"a": [kept Result, ...], "b": [...]}; ``limits``: (min_repeats, max_repeats,
    threshold). A run starts only if its predicted time (its arm's median run, else the slowest so
    far) still fits the budget, a pair only if both runs do; a warm-up pair is kept instead where no
    kept pair would fit after it. The very first run and each arm's first kept run start whatever
    the prediction: a budget shorter than one pair is overrun by at most a run per arm."""
    min_repeats, max_repeats, threshold = limits
    results, took = {"a": [], "b": []}, {"a": [], "b": []}
    pair, t_start = 0, time.perf_counter()

    def guess(arm):
        return statistics.median(took[arm]) if took[arm] else max(took["a"] + took["b"], default=0.0)

    def fits(seconds):
        return time.perf_counter() - t_start + seconds <= budget_s

    def keep(arm, res):
        _value(res, metric)  # a metric this device does not measure fails at the first kept run
        results[arm].append(res)

    while True:
        if 0 < pair < warmup_runs and not fits(2 * (guess("a") + guess("b"))):
            warmup_runs = pair  # no kept pair would fit after one more warm-up: 50 in 1 s meant 104 runs
        warm = pair < warmup_runs
        if not warm and results["a"] and not fits(guess("a") + guess("b")):
            break
        ran = {}
        for arm, cfg in (("a", a), ("b", b)):
            if arm == "b" and not warm and results["b"] and not fits(guess("b")):
                break  # a ran longer than predicted: b would overrun
            t_run = time.perf_counter()
            ran[arm] = run_fn(cfg)
            took[arm].append(time.perf_counter() - t_run)
            if warm and not fits(guess("a") + guess("b") + (guess("b") if arm == "a" else 0.0)):
                warmup_runs, warm = pair, False  # no kept pair fits after this warm-up pair: keep its runs
                if arm == "b":
                    keep("a", ran["a"])
            if not warm:
                keep(arm, ran[arm])
        else:
            pair += 1
            elapsed = time.perf_counter() - t_start
            n = len(results["a"])
            bar.update(min(math.ceil(elapsed), bar.total), _pairs_note(n, pair - n))
            if n >= max_repeats:
                return results
            if warm:
                continue
            samples = [[_value(x, metric) for x in results[arm]] for arm in ("a", "b")]
            exact = ranks.ratio_interval(*samples) if n >= ranks.fewest_runs() else None
            if exact is not None and settles(exact[0], exact[1], threshold):
                bar.update(bar.done, f"done: {counted(n, 'pair')}, interval settled")
                return results
            if n >= min_repeats:
                r, lo, hi = ratio_interval(*samples)
                if (hi - lo) / 2 / r < EARLY_STOP_HALF_WIDTH:
                    # the bar's last state says why it ends short of its total (else "15/19" looks unfinished);
                    # short, like every progress line (tests/test_compare.py: at most 80 characters)
                    bar.update(bar.done, f"done: {counted(n, 'pair')}, interval narrow")
                    return results
            continue
        break  # the budget ended mid-pair
    bar.update(bar.done, f"done: {counted(len(results['a']), 'pair')}, budget spent")
    return results


def _rel_iqr(xs) -> float:
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def _diff_label(c: Config, other: Config) -> str:
    """'checkpointing=full' -- the fields where c differs from other, as a label."""
    d, o = c.to_dict(), other.to_dict()
    return ", ".join(f"{k}={d[k]}" for k in d if d[k] != o[k] and k != "threads")
