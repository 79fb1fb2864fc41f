"""Diagnose from measurements: a micro-batch sweep that shows low MFU without any data wait (chapter 01), and
the loader's and the model's time per batch read from a run's records (chapter 05).

Chapter 01 teaches "an MFU of 10-20 % usually means waiting" as a heuristic; ``mfu_sweep`` is its
counter-example: the same model (the same FLOPs per token), no data wait, and MFU still moves with the size of
the matmuls. The checkers in ``labkit.check.diagnose`` compare a learner's answer with the readings here.

    rows = mfu_sweep(lk.Config(model="tiny", threads=1), [1, 4, 16])
    plot_mfu_sweep(rows)
"""
from __future__ import annotations

import math
import statistics
import sys

# ---- runs in, summaries and records out -------------------------------------------------------------------
# Checkers and chapters accept a Result, a {"summary": ..., "records": ...} dict, a bare summary dict, or a list
# of those (repeats of one configuration): one reading for all of them.


def _summary(run) -> dict | None:
    if isinstance(run, dict):
        return run.get("summary") if ("summary" in run or "records" in run) else run
    s = getattr(run, "summary", None)
    return s if isinstance(s, dict) else None


def _records(run) -> list:
    if isinstance(run, dict):
        return list(run.get("records") or [])
    return list(getattr(run, "records", None) or [])


def as_runs(x) -> list:
    """A list of runs from one run or a list/tuple of them; [] when ``x`` holds no run."""
    if isinstance(x, (list, tuple)):
        return [r for r in x if _summary(r) is not None]
    return [x] if _summary(x) is not None else []


def median_of(runs, key):
    """The median of ``key`` over the runs' summaries (None where no run has it)."""
    vals = [_summary(r).get(key) for r in as_runs(runs)]
    vals = [float(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def timed_records(runs) -> list:
    """Every timed update of one or more runs, the warm-up updates left out -- as each run's summary does
    (``timed_updates`` of them, the last ones; with a Result, ``config.warmup`` says the same)."""
    out = []
    for r in as_runs(runs):
        recs = _records(r)
        n = _summary(r).get("timed_updates")
        if isinstance(n, int) and 0 < n <= len(recs):
            out += recs[len(recs) - n:]
        else:
            warm = getattr(getattr(r, "config", None), "warmup", 1)
            out += recs[warm:] or recs
    return out


# ---- chapter 01: MFU against the size of the matmuls ----------------------------------------------------

def mfu_sweep(config, micro_batches, repeats: int = 3, run_fn=None, progress: bool = True) -> list:
    """Run ``config`` at each micro-batch, ``repeats`` rounds, the order reversed every other round (a drift in
    the machine's load then hits every size alike). Keep the thread count fixed in ``config``: a sweep that
    changed it too would measure the threads. Returns one row per micro-batch -- medians over the rounds,
    MFU's lowest and highest run, the model FLOPs per token, and the step split into microseconds per token."""
    if run_fn is None:
        from .train import run as run_fn
    sizes = list(micro_batches)
    by_mb = {mb: [] for mb in sizes}
    for i in range(repeats):
        for mb in (sizes if i % 2 == 0 else sizes[::-1]):
            by_mb[mb].append(run_fn(config.replace(micro_batch=mb)).summary)
            if progress:
                done = sum(len(v) for v in by_mb.values())
                print(f"\rmicro-batch sweep: {done}/{repeats * len(sizes)} runs", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr, flush=True)
    return [_sweep_row(mb, ss) for mb, ss in by_mb.items()]


def _sweep_row(mb, summaries) -> dict:
    def med(key):
        return median_of(summaries, key)

    tokens = summaries[0]["tokens_per_step"]
    per_token = {f"{k[:-2]}_us_per_token": 1e6 * med(k) / tokens for k in ("data_wait_s", "compute_s", "optimizer_s")}
    mfus = [s["mfu"] for s in summaries if s.get("mfu") is not None]
    return dict(micro_batch=mb, runs=len(summaries), tokens_per_update=tokens, mfu=med("mfu"),
                mfu_low=min(mfus) if mfus else None, mfu_high=max(mfus) if mfus else None,
                tokens_per_s=med("tokens_per_s"), step_time_s=med("step_time_s"), data_wait_frac=med("data_wait_frac"),
                flops_per_token=summaries[0]["model_flops_per_step"] / tokens, **per_token)


def plot_mfu_sweep(rows: list, width: float = 7.5, height: float = 2.7):
    """Two panels from ``mfu_sweep`` rows: MFU against the micro-batch (median, whiskers from the lowest to
    the highest run), and where each token's time went -- data wait, compute, optimizer step."""
    from .plots import COLORS, new_figure

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


def sweep_words(rows: list, cmp) -> str:
    """The sweep's conclusion, chosen by the comparison between its smallest and largest micro-batch (``cmp``,
    from ``lk.compare_configs`` on tokens per second: with the same model and the same peak, MFU is
    proportional to it). A rise is claimed only when the comparison measured one."""
    first, last = rows[0], rows[-1]
    flops = sorted({round(r["flops_per_token"]) for r in rows})
    flops_words = (f"{flops[0]:,} model FLOPs per token in every run" if len(flops) == 1 else
                   f"model FLOPs per token {flops[0]:,}–{flops[-1]:,}")
    wait = max(r["data_wait_frac"] for r in rows)
    mfu_a, mfu_b = median_of(cmp.results_a, "mfu"), median_of(cmp.results_b, "mfu")
    sizes = f"micro-batch {first['micro_batch']} and {last['micro_batch']}"
    interval = (f"ratio {cmp.ratio:.2f}, 95 % interval {cmp.low:.2f}–{cmp.high:.2f}" if cmp.ratio is not None
                else "nothing measured")
    if not cmp.decided:
        text = (f"Between {sizes}: too few repeats fit the time budget for a verdict ({interval}), so this run "
                "cannot tell the change in MFU from noise. Run the cell again.")
    elif cmp.better == "b":
        text = (f"MFU rose from **{mfu_a:.1%}** at micro-batch {first['micro_batch']} to **{mfu_b:.1%}** at "
                f"micro-batch {last['micro_batch']} (medians of the comparison's runs; {interval}) — with "
                f"{flops_words} and data wait at most {wait:.1%} of an update. Waiting cannot explain that: the "
                "small micro-batches did the same work per token less efficiently.")
    elif cmp.better == "a":
        text = (f"MFU fell from {mfu_a:.1%} at micro-batch {first['micro_batch']} to {mfu_b:.1%} at "
                f"micro-batch {last['micro_batch']} ({interval}): not what larger matmuls usually do. Was the "
                "machine busy, or short of memory? Run the cell again.")
    else:
        text = (f"No measurable rise in MFU between {sizes} on this machine right now ({interval}; MFU "
                f"{mfu_a:.1%} and {mfu_b:.1%}): the noise is larger than the effect here. Run the cell again "
                "on a quieter machine.")
    split = ", ".join(f"{words} {first[k]:.1f} → {last[k]:.1f} µs" for k, words in
                      (("compute_us_per_token", "compute"), ("optimizer_us_per_token", "optimizer step"),
                       ("data_wait_us_per_token", "data wait")))
    return text + f" Time per token from micro-batch {first['micro_batch']} to {last['micro_batch']} (sweep medians): {split}."


# ---- chapter 05: the loader's and the model's time per batch, from records ------------------------------

def loader_reading(runs) -> dict:
    """labkit's own reading of runs with 0 loader workers: the loop loads every batch itself, so each
    update's ``data_wait_s`` is the time to load one batch, and the rest of the update (forward, backward,
    optimizer step: ``step_time_s - data_wait_s``) is the time workers have to prepare the next one.

    Returns medians over every timed update (``load_ms``, ``compute_ms``), the per-update spread
    (``load_range_ms``, ``compute_range_ms``: lowest and highest), ``updates``, and the workers that
    follow: ``workers`` = ⌈load / compute⌉ (no wait at all) and ``knee`` (the fewest that keep the
    wait under 5 %, loaderlab's ideal model)."""
    from .loaderlab import fewest_workers

    recs = [r for r in timed_records(runs) if r.get("data_wait_s") is not None and r.get("step_time_s")]
    if not recs:
        raise ValueError("no timed updates with data_wait_s and step_time_s in these runs")
    load = [1e3 * r["data_wait_s"] for r in recs]
    compute = [1e3 * (r["step_time_s"] - r["data_wait_s"]) for r in recs]
    lo, co = statistics.median(load), statistics.median(compute)
    return dict(load_ms=lo, compute_ms=co, load_range_ms=(min(load), max(load)),
                compute_range_ms=(min(compute), max(compute)), updates=len(recs),
                workers=workers_rule(lo, co), knee=fewest_workers(lo, 1, co))


def workers_rule(load_ms: float, compute_ms: float) -> int:
    """⌈load / compute⌉: workers that together deliver a batch at least as fast as the model uses one."""
    return 0 if load_ms <= 0 else math.ceil(load_ms / compute_ms - 1e-9)
