"""Chapter 01's instruments: the peaks and how each 16-bit format runs here, data work sized from the
compute time and what it did to MFU, and a micro-batch sweep that shows low MFU without any data wait
(the counter-example to "an MFU of 10-20 % usually means waiting"). ``labkit.check.profiling`` judges a
learner's answers against readings from ``labkit.tools.timing``."""
from __future__ import annotations

from ..base.runtime import ConfigError
from ..base.page import Table
from ..engine.config import Config, _int, _num  # the Config's own checks: one wording for every refusal
from ..engine.measure import median
from ..tools.memory import _rows, _size
from ..tools.sweep import sweep_rows
from ..tools.timing import as_runs, median_of, quiet_profiler, summary_of, timed_records  # noqa: F401 (ch01.*)
from .course import bench_threads  # noqa: F401 -- ch01.bench_threads, as the chapter calls it


# ---- chapter 01: the peaks, and how each format runs here ---------------------------------------------

def peak_rows(table_rows, env: dict) -> list:
    """Rows of labkit's dense peak table ({device, fp32, tf32, fp16, bf16} in TFLOP/s), then this device's."""
    _env(env)
    rows = [dict(device=names[0], **peaks) for names, peaks, _ in table_rows]
    rows.append(dict(device=f"your device: {env['name']}",
                     **{p: v["flops"] / 1e12 for p, v in env["peak_flops"].items() if v.get("flops")}))
    return rows


# the flags that say a CPU has units for a 16-bit format (without them the format is converted in software)
_UNITS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def format_paths(env: dict) -> dict:
    """How each 16-bit format with a peak runs on this device, from its report: {format: key}, the key one of
    "datasheet" (a GPU's datasheet figure), "emulated" (a CPU whose flags name no units for it: converted to
    fp32 and back in software), "fast" (units listed and measured faster than fp32), or "slower" (units
    listed, yet the probe measured it slower). On a CPU the flags decide first: a probe under load can read
    fp32 so low that an emulated format looks "fast" beside it."""
    _env(env)
    peaks = {p: v for p, v in env["peak_flops"].items() if v.get("flops")}
    flags = set(env.get("cpu_flags") or [])
    out = {}
    for p in ("bf16", "fp16"):
        if p not in peaks:
            continue
        if not str(peaks[p].get("source", "")).startswith("measured"):
            out[p] = "datasheet"
        elif env.get("kind") == "cpu" and not flags & set(_UNITS[p]):
            out[p] = "emulated"
        else:
            out[p] = "fast" if p in env.get("fast_formats", ()) else "slower"
    return out


def _env(env):
    if not isinstance(env, dict) or not isinstance(env.get("peak_flops"), dict) or "name" not in env:
        raise ConfigError("env", type(env).__name__, "the report lk.env() returns")


# ---- chapters 01 and 07: MFU against the size of the matmuls ----------------------------------------------

def mfu_sweep(config, micro_batches, repeats: int = 3, run_fn=None, progress: bool = True) -> list:
    """Run ``config`` at each micro-batch, ``repeats`` rounds in alternating order (``tools.sweep.sweep_rows``,
    one row per micro-batch). Keep the thread count fixed in ``config``: a sweep that changed it too would
    measure the threads."""
    if not isinstance(config, Config):
        raise ConfigError("config", type(config).__name__, "an lk.Config")
    sizes = list(micro_batches) if isinstance(micro_batches, (list, tuple, range)) else None
    if not sizes or len(set(sizes)) != len(sizes):
        raise ConfigError("micro_batches", micro_batches, "a list of different micro-batch sizes, e.g. [1, 4, 16]")
    for mb in sizes:
        _int("micro_batch", mb, 1, 65536)
    _int("repeats", repeats, 1, 100)
    configs = {mb: config.replace(micro_batch=mb) for mb in sizes}
    return Table(sweep_rows(configs, "micro_batch", repeats=repeats, run_fn=run_fn, progress=progress,
                            threads=config.threads, steps=config.steps), SWEEP_COLUMNS)


def _mfu_range(row) -> tuple:
    return row["mfu_low"], row["mfu_high"]


def _pct_range(v) -> str:
    return "{:.2%}–{:.2%}".format(*v)


# how chapter 01 shows the sweep's rows: a markdown table (a Table is still the list of row dicts; named
# functions, not lambdas, so the rows still pickle)
SWEEP_COLUMNS = [("micro_batch", "micro-batch", "{}"), ("mfu", "MFU (median)", "{:.2%}"),
                 (_mfu_range, "lowest–highest run", _pct_range),
                 ("tokens_per_s", "tokens/s", "{:,.0f}"), ("flops_per_token", "FLOPs/token", "{:,.0f}"),
                 ("data_wait_frac", "data wait", "{:.1%}")]


def plot_mfu_sweep(rows: list, width: float = 7.5, height: float = 2.7):
    """Two panels from ``mfu_sweep`` rows: MFU against the micro-batch (median, whiskers from the lowest to
    the highest run), and where each token's time went -- data wait, compute, optimizer step."""
    _rows(rows, "micro_batch")
    _size(width, height)
    from ..tools.plots import COLORS, new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    a1, a2 = fig.subplots(1, 2)
    mbs = [r["micro_batch"] for r in rows]
    mfu = [100 * r["mfu"] for r in rows]
    low = [100 * (r["mfu"] - r["mfu_low"]) for r in rows]
    high = [100 * (r["mfu_high"] - r["mfu"]) for r in rows]
    a1.errorbar(mbs, mfu, yerr=[low, high], fmt="o-", color=COLORS["mfu"], ecolor="#555555", capsize=3)
    a1.set_xscale("log", base=2)
    a1.set_xticks(mbs, [str(m) for m in mbs])
    a1.set_ylim(bottom=0)
    a1.set_xlabel("micro-batch (sequences per matmul)", fontsize=8)
    a1.set_ylabel("MFU %", fontsize=8)
    a1.set_title(f"MFU, median of {rows[0]['runs']} run(s)", fontsize=9)
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for key, words in (("data_wait", "data wait"), ("compute", "compute"), ("optimizer", "optimizer")):
        vals = [r[f"{key}_us_per_token"] for r in rows]
        a2.bar(x, vals, bottom=bottom, color=COLORS[f"{key}_s"], label=words)
        bottom = [b + v for b, v in zip(bottom, vals)]
    a2.set_xticks(x, [str(m) for m in mbs])
    a2.set_xlabel("micro-batch", fontsize=8)
    a2.set_ylabel("µs per token", fontsize=8)
    a2.set_title("time per token (medians)", fontsize=9)
    a2.legend(fontsize=7)
    for a in (a1, a2):
        a.tick_params(labelsize=7)
    return fig


def sweep_reading(rows: list, cmp) -> dict:
    """The figures chapter 01's sweep sentence quotes: MFU at the smallest and largest micro-batch (medians of
    ``cmp``'s runs: ``lk.compare_configs`` on tokens per second; with the same model and peak MFU is
    proportional to it), the FLOPs per token of every run (the same, or their range), the largest data-wait
    share, and each token's time split at both ends of the sweep (µs). The verdict is the comparison's own
    (``lk.course.explain(cmp, ...)``): a rise is claimed only where it measured one."""
    _rows(rows, "micro_batch")
    if not all(hasattr(cmp, k) for k in ("decided", "better", "resolved", "ratio")):
        raise ConfigError("cmp", type(cmp).__name__, "a comparison (what lk.compare_configs returns)")
    first, last = rows[0], rows[-1]
    flops = sorted({round(r["flops_per_token"]) for r in rows})
    mfu_a, mfu_b = median_of(cmp.results_a, "mfu"), median_of(cmp.results_b, "mfu")
    return dict(mb_first=first["micro_batch"], mb_last=last["micro_batch"], mfu_first=mfu_a, mfu_last=mfu_b,
                mfu_first_pct=None if mfu_a is None else 100 * mfu_a,  # as a sentence quotes them
                mfu_last_pct=None if mfu_b is None else 100 * mfu_b,
                flops_low=flops[0], flops_high=flops[-1], same_flops=len(flops) == 1,
                max_wait_pct=100 * max(r["data_wait_frac"] for r in rows), threshold=cmp.threshold,
                split=[dict(part=words, first_us=first[k], last_us=last[k]) for k, words in
                       (("compute_us_per_token", "compute"), ("optimizer_us_per_token", "optimizer step"),
                        ("data_wait_us_per_token", "data wait"))])


# ---- chapter 01: data work that makes the loop wait ---------------------------------------------------
# The chapter adds data work per sample (``data_cost_ms``) sized from the baseline's own compute time, then says
# what happened. Every sentence is chosen by the numbers: "the matmuls ran as fast as before" only when compute
# per update stayed within the measured spread; otherwise the sentence says compute itself changed.

# Compute per update is "unchanged" within this relative band at least (two identical `small` runs on a busy
# 2-core machine differed far more than this; a tighter band would call noise a change).
SAME_COMPUTE = 0.15
# Above this update-to-update scatter a run cannot say whether compute changed at all.
TOO_NOISY = 0.30


def data_costs(compute_s: float, samples_per_update: int, fractions=(0.5, 2.0), updates: int = 6,
               budget_s: float = 30.0) -> list:
    """The data work per sample that makes loading take ``fraction`` x the measured compute per update
    (``compute_s``, e.g. a baseline's median), one dict per fraction: ``cost_ms`` (per sample, two significant
    digits), ``ratio`` (the data-to-compute ratio actually set: cost x samples / compute), ``wanted`` and
    ``capped``. Costs are capped only for time: a run of ``updates`` updates may spend at most ``budget_s``
    seconds on data work; then every cost shrinks by the same factor, so the levels stay apart."""
    _num("compute_s", compute_s, 0.0, 3600.0, lo_open=True)  # the measured compute time per update, seconds
    _int("samples_per_update", samples_per_update, 1)
    if not isinstance(fractions, (list, tuple)) or not fractions:
        raise ConfigError("fractions", fractions, "a non-empty list of data-to-compute ratios, e.g. (0.5, 2.0)")
    for f in fractions:
        _num("fraction", f, 0.0, 1000.0, lo_open=True)
    _int("updates", updates, 1, 100_000)
    _num("budget_s", budget_s, 0.0, 86_400.0, lo_open=True)
    per_sample_ms = 1e3 * compute_s / samples_per_update
    cap_ms = 1e3 * budget_s / (updates * samples_per_update)
    scale = min(1.0, cap_ms / (max(fractions) * per_sample_ms))
    out = []
    for f in fractions:
        cost = max(0.01, float(f"{f * scale * per_sample_ms:.2g}"))  # two digits: a number a learner can retype
        out.append(dict(wanted=f, cost_ms=cost, capped=scale < 1, ratio=cost / per_sample_ms))
    return out


def compute_change(base, other, floor: float = SAME_COMPUTE) -> dict:
    """Did compute per update change between two runs of one model? Medians of the timed updates' ``compute_s``,
    their ratio (other / base), and the spread it is judged against: half the range of either run's per-update
    values, relative to its median, at least ``floor``. ``verdict``: "same" (within the spread), "slower",
    "faster", or "unclear" (within a spread wider than TOO_NOISY: too noisy to tell)."""
    def per_update(runs):
        vals = [r["compute_s"] for r in timed_records(runs) if isinstance(r.get("compute_s"), (int, float))]
        if not vals:  # a bare summary: its median only
            vals = [median_of(runs, "compute_s")] if median_of(runs, "compute_s") is not None else []
        if not vals:
            raise ValueError("no compute_s in these runs: pass completed runs (lk.Result or their summaries)")
        return vals

    b, o = per_update(base), per_update(other)
    mb, mo = median(b), median(o)
    spread = max(floor, *((max(v) - min(v)) / (2 * m) for v, m in ((b, mb), (o, mo)) if m > 0))
    ratio = mo / mb if mb > 0 else float("inf")
    if abs(ratio - 1) <= spread:
        verdict = "same" if spread <= TOO_NOISY else "unclear"
    else:
        verdict = "slower" if ratio > 1 else "faster"
    return dict(base_ms=1e3 * mb, other_ms=1e3 * mo, ratio=ratio, spread=spread, verdict=verdict,
                base_updates=len(b), other_updates=len(o))


def data_cost_reading(base, heavy, ratio_set: float) -> dict:
    """What the data-cost run did against the baseline, as figures and verdicts for chapter 01's sentences:
    ``metric`` ("mfu", or "tokens_per_s" without a peak: the same model and FLOPs, so either is proportional to
    1 / update time), its value in both runs and their ratio, ``wait_frac`` (share of time waiting for data),
    ``wait_only`` (what the baseline's update plus this wait alone would give), ``got`` (the wait measured, as a
    multiple of the baseline's compute) and ``drifted`` (it missed ``ratio_set`` by more than 25 %: the data work
    is hashing rounds calibrated once per process, and their time moves with the load), and ``compute``
    (``compute_change``: its verdict same / slower / faster / unclear, ratio and spread)."""
    _num("ratio_set", ratio_set, 0.0, 1000.0, lo_open=True)
    for name, r in (("base", base), ("heavy", heavy)):
        if not as_runs(r):
            raise ConfigError(name, type(r).__name__, "a finished run (lk.Result) or a list of them")
    sb, sh = summary_of(as_runs(base)[0]), summary_of(as_runs(heavy)[0])
    cc = compute_change(base, heavy)
    metric = "mfu" if sb.get("mfu") and sh.get("mfu") else "tokens_per_s"
    vb, vh = sb[metric], sh[metric]
    step_b, wait_b = sb["step_time_s"], sb.get("data_wait_s") or 0.0
    got = (sh["data_wait_s"] - wait_b) / (cc["base_ms"] / 1e3)
    shown = 100.0 if metric == "mfu" else 1.0  # a sentence quotes MFU in per cent, throughput as it is
    wait_only = vb * step_b / (step_b - wait_b + sh["data_wait_s"])
    return dict(metric=metric, base=vb, heavy=vh, change=vh / vb, fell=vh < vb, unit="% MFU" if shown > 1 else
                " tokens/s", wait_only_shown=shown * wait_only, spread_pct=100 * cc["spread"],
                wait_frac=sh.get("data_wait_frac") or 0.0, wait_ms=1e3 * sh["data_wait_s"],
                wait_only=wait_only, got=got, ratio_set=ratio_set,
                drifted=abs(got / ratio_set - 1) > 0.25, compute=cc["verdict"], compute_ms=cc["other_ms"],
                base_compute_ms=cc["base_ms"], compute_ratio=cc["ratio"], spread=cc["spread"],
                workers=sh.get("workers") or 0)


DATA_COST_COLUMNS = [("label", "run", "{}"), ("data_wait_ms", "data wait", "{:.0f} ms"),
                     ("wait_per_compute", "÷ own compute", "{:.2f}×"), ("compute_ms", "compute", "{:.0f} ms"),
                     ("compute_vs_baseline", "÷ baseline", "{:.2f}×"), ("mfu", "MFU", "{:.1%}")]


def data_cost_rows(runs: dict, baseline: str = "baseline") -> list:
    """One row per run of ``runs`` ({label: run}): medians per update of data wait, compute and optimizer (ms),
    the data wait as a multiple of the run's own compute, compute as a multiple of the baseline's, and MFU --
    a ``Table``, so a cell shows the rows with ``display(rows)``."""
    if not isinstance(runs, dict) or baseline not in runs:
        labels = ", ".join(map(repr, runs)) if isinstance(runs, dict) else "none: pass a dict {label: run}"
        raise ConfigError("baseline", baseline, f"one of the runs' labels: {labels}")
    base_ms = 1e3 * median_of(runs[baseline], "compute_s")
    rows = []
    for label, run in runs.items():
        s = summary_of(as_runs(run)[0])
        wait, comp = 1e3 * s["data_wait_s"], 1e3 * s["compute_s"]
        rows.append(dict(label=label, data_cost_ms=s.get("data_cost_ms") or 0.0, data_wait_ms=wait, compute_ms=comp,
                         optimizer_ms=1e3 * s["optimizer_s"], wait_per_compute=wait / comp if comp else None,
                         compute_vs_baseline=comp / base_ms if base_ms else None, mfu=s.get("mfu"),
                         data_wait_frac=s.get("data_wait_frac"), threads=s.get("intra_op_threads")))
    return Table(rows, DATA_COST_COLUMNS)


def plot_data_cost(rows: list, width: float = 6.0, height: float = 3.0):
    """The step-time breakdown of each ``data_cost_rows`` row as stacked bars (ms per update), MFU on a second
    axis: waiting shows as the orange part, a change in compute as the blue one."""
    _rows(rows, "label")
    _size(width, height)
    from ..tools.plots import COLORS, new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    labels = [r["label"] for r in rows]
    bottom = [0.0] * len(rows)
    for key, words in (("data_wait", "data wait"), ("compute", "compute"), ("optimizer", "optimizer")):
        vals = [r[f"{key}_ms"] for r in rows]
        ax.bar(labels, vals, bottom=bottom, color=COLORS[f"{key}_s"], label=words)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("ms per update (median)", fontsize=8)
    ax.legend(loc="upper left", fontsize=7)
    if all(r["mfu"] is not None for r in rows):
        ax2 = ax.twinx()
        ax2.plot(labels, [100 * r["mfu"] for r in rows], "ko-", label="MFU")
        ax2.set_ylabel("MFU % (line)", fontsize=8)
        ax2.set_ylim(bottom=0)
        ax2.tick_params(labelsize=7)
    ax.tick_params(labelsize=7)
    ax.set_title("data cost: the step-time breakdown and MFU", fontsize=9)
    return fig

