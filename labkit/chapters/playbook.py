"""Chapter 09's tools (the playbook): a measured grid search, its Pareto front, and the memory arithmetic of what to
do when a model still does not fit (ZeRO stages, offload, 8-bit Adam). Plus a small FSDP demo.

    from labkit import playbook as pb
    rows = pb.grid_search(dict(model="small", steps=3), pb.grid(precision=("fp32", "bf16"),
                          micro_batch=(2, 4, 8), checkpointing=("none", "full"), effective_batch=8))
    front = pb.pareto_front(rows)
    best = pb.best_within(rows, budget_bytes=80 * 2**20)

The arithmetic functions are pure (no torch, no device) and unit-tested. Every measurement goes
through ``labkit.run`` like everything else in the course.

Memory of a configuration: on a GPU the device's measured peak (``peak_mem_bytes``); on a CPU, which
cannot report a peak, the engine's measured breakdown -- parameter + gradient + optimizer-state +
activation bytes. ``memory_of`` says which one it used.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing as mp
import numbers
import os
import queue as queue_mod
import shutil
import statistics
import tempfile
import textwrap
import time

import torch
import torch.distributed as dist

from ..engine import ddp as ddp_mod
from ..tools import reference
from ..engine.config import PRESETS, Config, _bool, _choice  # the Config's own checks: one wording (and did-you-mean) for every refusal
from ..engine.data import ByteWindows, corpus_path
from ..base.errors import ConfigError, OutOfMemory, RunError
from ..engine.model import GPT
from ..base.numfmt import number
from ..base.progress import Progress
from ..engine.train import run

GB = 1e9  # datasheets quote decimal gigabytes ("80 GB"); the charts of measured bytes use MiB/GiB

# ---- bytes per parameter -----------------------------------------------------------------------
# Mixed-precision training (the ZeRO paper's accounting): 16-bit weights and gradients on the
# device, plus what the optimizer keeps in fp32 -- a master copy of the weights and its moments.
WEIGHT_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = {
    "adam": 12,       # fp32 master weights 4 + first moment 4 + second moment 4
    "adam8bit": 6,    # fp32 master weights 4 + 8-bit moments 1 + 1 (block scales are negligible)
    "sgd": 8,         # fp32 master weights 4 + momentum 4
}
REMEDIES = ("ddp", "zero1", "zero2", "zero3", "zero3+offload_optimizer", "zero3+offload_params")
REMEDY_WORDS = {
    "ddp": "plain DDP (every GPU holds everything)",
    "zero1": "ZeRO-1: shard the optimizer states",
    "zero2": "ZeRO-2: shard optimizer states and gradients",
    "zero3": "ZeRO-3 / FSDP: shard parameters too",
    "zero3+offload_optimizer": "ZeRO-3 + optimizer states in CPU memory",
    "zero3+offload_params": "ZeRO-3 + parameters and optimizer in CPU memory",
}


# ---- argument checks: every public function refuses impossible numbers before any work ----------------

def _number(name: str, value, *, minimum: float = 0.0, strict: bool = False, allowed: str = "") -> float:
    """``value`` as a float when it is a finite real number >= ``minimum`` (> with ``strict``); else a
    ConfigError naming the argument. A negative parameter count would otherwise give negative bytes."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > minimum if strict else value >= minimum):
        return float(value)
    raise ConfigError(name, value, allowed or f"a finite number {'>' if strict else '>='} {minimum:g}")


def _count(name: str, value, minimum: int = 1) -> int:
    """``value`` when it is a whole number >= ``minimum`` (True/False and 2.5 are refused)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum:
        return value
    raise ConfigError(name, value, f"a whole number >= {minimum}")


def _rows(name: str, value) -> list:
    """Grid rows: a list (or tuple) of dicts."""
    if isinstance(value, (list, tuple)) and all(isinstance(r, dict) for r in value):
        return list(value)
    raise ConfigError(name, type(value).__name__ if not isinstance(value, (list, tuple)) else value,
                      "a list of grid rows (dicts), e.g. what grid_search returns")


def state_bytes_per_gpu(n_params: float, n_gpus: int = 1, stage: int = 0, optimizer: str = "adam",
                        offload_optimizer: bool = False, offload_params: bool = False) -> dict:
    """Bytes of model state (weights, gradients, optimizer) on each GPU under ZeRO ``stage`` 0-3.

    Stage 0 is plain DDP: every GPU holds all of it. Stage 1 shards the optimizer states over the
    ``n_gpus`` data-parallel ranks, stage 2 the gradients too, stage 3 (FSDP's FULL_SHARD) the
    weights too. Offloading moves the optimizer states (and with ``offload_params`` the weights and
    gradients) to CPU memory; ``cpu`` says how much each rank then needs there. Activations and the
    one layer FSDP gathers at a time come on top.
    """
    N = _number("n_params", n_params, strict=True)
    G = _count("n_gpus", n_gpus)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError("stage", stage, "a ZeRO stage: 0 (none), 1, 2 or 3")
    _choice("optimizer", optimizer, OPTIMIZER_BYTES)
    _bool("offload_optimizer", offload_optimizer)
    _bool("offload_params", offload_params)
    params = WEIGHT_BYTES * N / (G if stage >= 3 else 1)
    grads = GRAD_BYTES * N / (G if stage >= 2 else 1)
    optim = OPTIMIZER_BYTES[optimizer] * N / (G if stage >= 1 else 1)
    cpu = 0.0
    if offload_optimizer or offload_params:
        cpu += optim
        optim = 0.0
    if offload_params:
        cpu += params + grads
        params = grads = 0.0
    return {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim, "cpu": cpu}


def zero_bytes_per_gpu(n_params: float, n_gpus: int, stage: int) -> float:
    """Model-state bytes per GPU for mixed-precision Adam under ZeRO ``stage`` (16 bytes/param at 0)."""
    return state_bytes_per_gpu(n_params, n_gpus, stage)["total"]


def activation_bytes_estimate(n_layer: int, d_model: int, n_head: int, seq_len: int, micro_batch: int,
                              checkpointing: str = "none", flash: bool = True) -> float:
    """Activation bytes of a 16-bit transformer, from Korthikanti et al. 2022 (Reducing Activation
    Recomputation in Large Transformer Models): per layer s·b·h·(34 + 5·a·s/h) bytes without
    recomputation; the 5·a·s/h term (the s×s attention scores) is gone with a fused (flash) kernel;
    with full checkpointing only each layer's input (2·s·b·h bytes) is kept."""
    s, b, h, a = (_count(k, v) for k, v in (("seq_len", seq_len), ("micro_batch", micro_batch),
                                               ("d_model", d_model), ("n_head", n_head)))
    _count("n_layer", n_layer)
    _choice("checkpointing", checkpointing, ("none", "full"))
    _bool("flash", flash)
    if checkpointing == "full":
        return float(n_layer * 2 * s * b * h)
    per_layer = s * b * h * (34 + (0 if flash else 5 * a * s / h))
    return float(n_layer * per_layer)


def remedies(n_params: float, n_gpus: int, gpu_bytes: float, activation_bytes: float = 0.0,
             optimizer: str = "adam") -> list:
    """One row per option, least intrusive first: bytes per GPU (states + activations) and whether
    it fits in ``gpu_bytes``. Offloading needs ``cpu`` bytes of host memory per rank."""
    _number("gpu_bytes", gpu_bytes, strict=True)
    _number("activation_bytes", activation_bytes)
    rows = []
    for name in REMEDIES:
        stage = {"ddp": 0, "zero1": 1, "zero2": 2}.get(name, 3)
        st = state_bytes_per_gpu(n_params, n_gpus, stage, optimizer,
                                 offload_optimizer="offload" in name, offload_params=name.endswith("params"))
        total = st["total"] + activation_bytes
        rows.append({"remedy": name, "words": REMEDY_WORDS[name], **st, "activations": activation_bytes,
                     "per_gpu": total, "fits": total <= gpu_bytes})
    return rows


def smallest_fix(n_params: float, n_gpus: int, gpu_bytes: float, activation_bytes: float = 0.0,
                 optimizer: str = "adam"):
    """The least intrusive option that fits (None when even full offload does not)."""
    for row in remedies(n_params, n_gpus, gpu_bytes, activation_bytes, optimizer):
        if row["fits"]:
            return row["remedy"]
    return None


def _tick_words(remedy: str) -> str:
    """'zero3+offload_optimizer' -> 'zero3 +\noffload\noptimizer': at ~10 characters a line each option's
    label stays inside its own bar's width at the chart's 6.4 in, apart from its neighbours'."""
    return "\n".join(textwrap.wrap(remedy.replace("+", " + ").replace("_", " "), 10))


def remedy_chart(rows: list, gpu_bytes: float, title: str = "", ax=None):
    """Stacked bars of bytes per GPU for each option, the card's memory as a dashed line."""
    from ..tools import plots  # deferred: matplotlib is optional; loaded only to draw

    if not _rows("rows", rows):
        raise ConfigError("rows", rows, "at least one option, e.g. remedies(...)")
    _number("gpu_bytes", gpu_bytes, strict=True)
    fig, ax = (ax.figure, ax) if ax is not None else _figure(6.4, 3.0)
    names = [_tick_words(r["remedy"]) for r in rows]
    bottom = [0.0] * len(rows)
    for key, words, color in (("params", "weights", plots.COLORS["param_bytes"]),
                              ("grads", "gradients", plots.COLORS["grad_bytes"]),
                              ("optimizer", "optimizer", plots.COLORS["optimizer_bytes"]),
                              ("activations", "activations", plots.COLORS["activation_bytes"])):
        vals = [r[key] / GB for r in rows]
        ax.bar(names, vals, bottom=bottom, color=color, label=words)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(gpu_bytes / GB, ls="--", color="#222222", lw=1)
    ax.text(len(rows) - 0.5, gpu_bytes / GB, f" GPU {gpu_bytes / GB:.0f} GB", va="bottom", ha="right",
            fontsize=plots.FONT)
    ax.set_ylabel("GB per GPU", fontsize=plots.FONT)
    ax.set_title(title or "Memory per GPU, by option", fontsize=plots.TITLE)
    ax.tick_params(labelsize=plots.FONT)
    ax.legend(fontsize=plots.FONT, loc="upper right")
    return fig


# ---- the grid ------------------------------------------------------------------------------------

def grid(precision=("fp32", "bf16"), micro_batch=(1, 2, 4, 8), checkpointing=("none", "full"), workers=(0,),
         effective_batch: int | None = None, accum=(1,)) -> list:
    """Grid points (dicts of Config knobs). With ``effective_batch`` (sequences per update) K is
    derived: accum = effective_batch // micro_batch, and micro-batches that do not divide it are
    left out -- every point then trains on the same batch, so only speed and memory differ."""
    knob_choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(Config)}
    for name, values in (("precision", precision), ("checkpointing", checkpointing)):
        for v in _values(name, values):
            _choice(name, v, knob_choices[name])
    for name, values, least in (("micro_batch", micro_batch, 1), ("workers", workers, 0), ("accum", accum, 1)):
        for v in _values(name, values):
            _count(name, v, least)
    if effective_batch is not None:
        _count("effective_batch", effective_batch)
    points = []
    for prec, mb, ck, w in itertools.product(precision, micro_batch, checkpointing, workers):
        if effective_batch is not None:
            if mb > effective_batch or effective_batch % mb:
                continue
            ks = (effective_batch // mb,)
        else:
            ks = accum
        for k in ks:
            points.append(dict(precision=prec, micro_batch=mb, accum=k, checkpointing=ck, workers=w))
    return points


def _values(name: str, values) -> tuple:
    """A grid axis: a non-empty tuple or list of values (a bare string would iterate by letter)."""
    if isinstance(values, (list, tuple)) and values:
        return tuple(values)
    raise ConfigError(name, values, "a non-empty tuple of values, e.g. (1, 2, 4)")


def memory_of(summary: dict) -> tuple:
    """(bytes, source): the measured device peak where there is one (CUDA), else the engine's
    breakdown param + grad + optimizer + activation bytes (a CPU cannot report its peak)."""
    peak = summary.get("peak_mem_bytes")
    if peak:
        return float(peak), "peak"
    parts = [summary.get(k) for k in ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes")]
    if any(p is None for p in parts):
        return None, None
    return float(sum(parts)), "breakdown"


def label(point: dict) -> str:
    ck = point.get("checkpointing", "none")
    w = point.get("workers", 0)
    return (f"{point.get('precision')} mb={point.get('micro_batch')} K={point.get('accum', 1)}"
            + (" ckpt" if ck == "full" else f" {ck}" if ck != "none" else "") + (f" w={w}" if w else ""))


KNOB_KEYS = ("precision", "micro_batch", "accum", "checkpointing", "workers")


def row_from_summary(point: dict, summary: dict, status: str = "ok", error: str = "") -> dict:
    """One grid row: the point's knobs, its throughput and memory, where the memory came from."""
    mem, source = memory_of(summary) if summary else (None, None)
    row = {k: point.get(k) for k in KNOB_KEYS}
    row.update(label=label(point), status=status, error=error, tokens_per_s=None, step_time_s=None,
               memory_bytes=mem, memory_source=source, mfu=None, final_loss=None)
    if summary:
        for k in ("tokens_per_s", "step_time_s", "mfu", "final_loss", "param_bytes", "grad_bytes",
                  "optimizer_bytes", "activation_bytes", "peak_mem_bytes"):
            row[k] = summary.get(k)
    return row


def grid_search(base: dict, points: list, progress: bool = True, on_point=None, repeats: int = 1,
                run_fn=None) -> list:
    """Run ``labkit.run`` once per point (base knobs + the point's), with a progress bar. Returns one
    row per point; a point the device refuses (ConfigError) or that runs out of memory is kept with
    its status ('refused', 'oom', 'error') so the table shows why it is missing from the chart.

    ``repeats`` > 1 runs the whole grid that many times, forwards then backwards and so on (a drift in
    the machine's load hits every point alike); each row then holds the **median** tokens/s, step time
    and MFU, and every run's tokens/s in ``tokens_per_s_runs``. A point refused once is not retried.
    ``run_fn`` replaces ``labkit.run`` (tests feed a fake)."""
    if not isinstance(base, dict):
        raise ConfigError("base", base, "a dict of Config knobs shared by every point, e.g. dict(model='tiny')")
    points = _rows("points", points)
    repeats = _count("repeats", repeats)
    _bool("progress", progress)
    for name, fn in (("on_point", on_point), ("run_fn", run_fn)):
        if fn is not None and not callable(fn):
            raise ConfigError(name, fn, "a function, or None")
    for point in points:  # a bad knob is refused now, not after the points before it ran
        Config(**{**base, **point})
    with Progress(len(points) * repeats, "grid", delay=1.0 if progress else math.inf) as bar:
        summaries, failed = _grid_runs(base, points, repeats, run_fn or run, bar)
    return _grid_rows(points, summaries, failed, on_point)


def _grid_runs(base, points, repeats, run_fn, bar):
    """Every point ``repeats`` times, forwards then backwards: {index: [summaries]}, {index: failed row}."""
    summaries = {i: [] for i in range(len(points))}
    failed = {}
    done = 0
    for rep in range(repeats):
        order = list(range(len(points)))
        if rep % 2:
            order.reverse()
        for i in order:
            point = points[i]
            done += 1
            if i in failed:
                bar.update(done, failed[i]["label"] + f" ({failed[i]['status']})")
                continue
            try:
                summaries[i].append(run_fn(Config(**{**base, **point})).summary)
            except ConfigError as e:
                failed[i] = row_from_summary(point, None, "refused", str(e))
            except OutOfMemory as e:
                failed[i] = row_from_summary(point, None, "oom", str(e).split(". ")[0])
            except RunError as e:
                failed[i] = row_from_summary(point, None, "error", str(e))
            status = failed[i]["status"] if i in failed else "ok"
            bar.update(done, label(point) + ("" if status == "ok" else f" ({status})")
                       + (f" [pass {rep + 1}/{repeats}]" if repeats > 1 else ""))
    return summaries, failed


def _grid_rows(points, summaries, failed, on_point):
    """One row per point: a failed point's own row, else the medians of its runs."""
    rows = []
    for i, point in enumerate(points):
        if i in failed:
            row = failed[i]
        else:
            ss = summaries[i]
            row = row_from_summary(point, ss[0])
            for k in ("tokens_per_s", "step_time_s", "mfu"):
                vals = [x.get(k) for x in ss if x.get(k) is not None]
                row[k] = statistics.median(vals) if vals else None
            mems = [memory_of(x)[0] for x in ss if memory_of(x)[0] is not None]
            row["memory_bytes"] = max(mems) if mems else None  # a GPU's peak can differ a little: the larger
            row["tokens_per_s_runs"] = [x.get("tokens_per_s") for x in ss]
        rows.append(row)
        if on_point is not None:
            on_point(row)
    return rows


def run_scatter(rows: list):
    """How much a point's tokens/s differed between the grid's repeats: the median over points of
    (max - min) / median of its runs. None with one run per point (nothing to tell the scatter from)."""
    rows = _rows("rows", rows)
    spreads = [(max(r["tokens_per_s_runs"]) - min(r["tokens_per_s_runs"])) / statistics.median(r["tokens_per_s_runs"])
               for r in measured(rows) if len(r.get("tokens_per_s_runs") or []) > 1]
    return statistics.median(spreads) if spreads else None


def within_scatter(rows: list, top: dict, scatter) -> list:
    """The measured rows whose tokens/s is within ``scatter`` (relative) of ``top``'s: points these runs
    cannot rank against it ([top] alone when there is no scatter estimate)."""
    rows = _rows("rows", rows)
    if not isinstance(top, dict):
        raise ConfigError("top", top, "one grid row (a dict), e.g. best_within(rows, budget)")
    if scatter is not None:
        _number("scatter", scatter, allowed="a relative spread >= 0 (run_scatter's), or None")
    if not scatter:
        return [top]
    return [r for r in measured(rows) if r["tokens_per_s"] >= top["tokens_per_s"] * (1 - scatter)]


def config_of(base: dict, point: dict):
    """The Config of a grid point (a row or a dict of knobs) on top of ``base``."""
    for name, value in (("base", base), ("point", point)):
        if not isinstance(value, dict):
            raise ConfigError(name, value, "a dict of Config knobs")
    return Config(**{**base, **{k: point[k] for k in KNOB_KEYS if point.get(k) is not None}})


# ---- verdicts: what the chapter may conclude from a repeated, interleaved comparison -------------------

def search_verdict(cmp, *, pick_fits: bool = True, baseline_fits: bool = False) -> str:
    """The prose after ``compare_configs(baseline, pick)``, the pick being the grid's fastest point within the
    budget: a gain is claimed only when the pick (arm b) is measurably faster. When the baseline does not fit,
    the search bought memory for certain, and the question is what fitting cost in speed."""
    memory = ("" if baseline_fits or not pick_fits else
              " What the search bought for certain is memory: the pick fits the budget, the baseline does not.")
    if not cmp.decided:
        return ("Too few repeats fit in the time budget to tell the pick from the baseline: the speed-up stays "
                "unconfirmed." + memory)
    if cmp.better == "b":
        return (f"**The search paid off**: {cmp.label_b} is measurably faster than the baseline"
                + (" and fits the budget." if pick_fits else "."))
    if cmp.better == "a":
        if baseline_fits:
            return ("Measured again, the pick is **slower** than the baseline: its place above the baseline in the "
                    "grid came from the scatter of short runs.")
        return ("The pick is **slower** than the baseline: here fitting the budget costs throughput (smaller "
                "micro-batches or recomputation)." + memory)
    if baseline_fits:
        return ("**No measurable difference** in speed between the pick and the baseline on this machine right "
                "now: the grid cannot single out a faster configuration here.")
    return ("**No measurable difference** in speed between the pick and the baseline on this machine right now: "
            "fitting the budget cost no throughput that these runs can resolve." + memory)


def measured(rows: list) -> list:
    """The rows that ran and have both a memory figure and a throughput (refused or failed ones left out)."""
    return [r for r in _rows("rows", rows) if r.get("status", "ok") == "ok" and r.get("memory_bytes") is not None
            and r.get("tokens_per_s")]


def pareto_front(rows: list, memory: str = "memory_bytes", speed: str = "tokens_per_s") -> list:
    """The rows no other row beats on both axes (less or equal memory AND more or equal speed, one of
    them strictly), sorted by memory. Every other configuration is a bad deal: something on the front
    is at least as fast and needs no more memory."""
    pts = [r for r in _rows("rows", rows) if r.get(memory) is not None and r.get(speed) is not None]
    pts.sort(key=lambda r: (r[memory], -r[speed]))
    front, best = [], -math.inf
    for r in pts:
        if r[speed] > best:
            front.append(r)
            best = r[speed]
    return front


def best_within(rows: list, budget_bytes: float, memory: str = "memory_bytes", speed: str = "tokens_per_s"):
    """The fastest measured row whose memory fits the budget (None when nothing fits)."""
    _number("budget_bytes", budget_bytes, strict=True, allowed="a number of bytes > 0")
    fits = [r for r in measured(rows) if r[memory] <= budget_bytes]
    return max(fits, key=lambda r: r[speed]) if fits else None


def table(rows: list, budget_bytes: float | None = None) -> str:
    """The grid as a markdown table, fastest first, with whether each row fits the budget."""
    rows = _rows("rows", rows)
    if budget_bytes is not None:
        _number("budget_bytes", budget_bytes, strict=True, allowed="a number of bytes > 0, or None")
    unit, u = _unit(rows)
    lines = ["| configuration | tokens/s | memory (" + u + ") | fits |", "|---|---:|---:|:---:|"]
    for r in sorted(rows, key=lambda r: -(r.get("tokens_per_s") or -1)):
        if r.get("status", "ok") != "ok":
            lines.append(f"| {r['label']} | {r['status']} | | |")
            continue
        fit = "" if budget_bytes is None else ("yes" if r["memory_bytes"] <= budget_bytes else "no")
        lines.append(f"| {r['label']} | {r['tokens_per_s']:,.0f} | {r['memory_bytes'] / unit:,.1f} | {fit} |")
    return "\n".join(lines)


def fixed_digits(v, digits: int = 3) -> str:
    """``number(v, digits)`` with its trailing zeros kept ('1.70', not '1.7'): a column reads alike."""
    return number(v, digits, trailing_zeros=True)


def _unit(rows):
    top = max([r.get("memory_bytes") or 0 for r in rows] or [0])
    return (2**30, "GiB") if top >= 2**30 else (2**20, "MiB")


def _figure(width, height, ncols=1):
    from ..tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height)
    axes = fig.subplots(1, ncols) if ncols > 1 else fig.add_subplot()
    return fig, axes


def _pareto_axes(ax, rows, budget_bytes, title, mark_best=True):
    """One grid's dots (colour: precision, marker: checkpointing, text: micro-batch), its front, the budget."""
    from ..tools.plots import FONT, TITLE  # deferred: matplotlib is optional; loaded only to draw

    pts = measured(rows)
    unit, u = _unit(pts)
    front = pareto_front(pts)
    colors = {"fp32": "#4c72b0", "tf32": "#8172b3", "fp16": "#dd8452", "bf16": "#c44e52"}
    for prec in sorted({r["precision"] for r in pts}):
        for ck, marker in (("none", "o"), ("full", "^"), ("selective", "s"), ("attention", "D")):
            sel = [r for r in pts if r["precision"] == prec and r["checkpointing"] == ck]
            if sel:
                ax.scatter([r["memory_bytes"] / unit for r in sel], [r["tokens_per_s"] for r in sel], s=30,
                           marker=marker, color=colors.get(prec, "#555555"), alpha=0.85,
                           label=f"{prec}{'' if ck == 'none' else ', checkpointing ' + ck}")
    for r in pts:  # the micro-batch beside each dot: with it the chart alone says which configuration a dot is
        below = r["checkpointing"] != "none"  # the front runs up through these dots: a label above sits on it
        ax.annotate(f"mb={r['micro_batch']}", (r["memory_bytes"] / unit, r["tokens_per_s"]), fontsize=FONT,
                    xytext=(5, -6) if below else (4, 3), textcoords="offset points", color="#333333",
                    va="top" if below else "baseline")
    ax.plot([r["memory_bytes"] / unit for r in front], [r["tokens_per_s"] for r in front], "-", lw=1,
            color="#222222", zorder=0, label="Pareto front")
    if budget_bytes:
        ax.axvline(budget_bytes / unit, ls="--", color="#c44e52", lw=1)
        ax.text(budget_bytes / unit, 0.98, " budget", color="#c44e52", fontsize=FONT, va="top",
                transform=ax.get_xaxis_transform())
        best = best_within(pts, budget_bytes) if mark_best else None
        if best is not None:
            ax.scatter([best["memory_bytes"] / unit], [best["tokens_per_s"]], s=130, facecolors="none",
                       edgecolors="#222222", lw=1.2, label="best within budget")
    ax.set_xlabel(f"memory ({u}; {pts[0].get('memory_source') or 'measured'})", fontsize=FONT)
    ax.set_ylabel("tokens/s", fontsize=FONT)
    ax.set_ylim(bottom=0, top=max(r["tokens_per_s"] for r in pts) * 1.15)  # room above the top dot's label
    ax.set_title(title, fontsize=TITLE)
    ax.tick_params(labelsize=FONT)
    ax.margins(x=0.12)  # room for the micro-batch label of the right-most dot


def pareto_chart(rows: list, budget_bytes: float | None, reference_rows: list | None = None,
                 reference_budget_bytes: float | None = None, device_name: str = "this device",
                 mark_best: bool = True):
    """Memory against throughput, the budget as a dashed line, the Pareto front joined -- for the
    learner's runs and, beside them, the GPU reference grid when one is shipped (one panel when not).
    ``mark_best=False`` leaves the best point within the budget unmarked (a chapter asks for it first)."""
    rows = _rows("rows", rows)
    if not measured(rows):
        raise ConfigError("rows", f"{len(rows)} rows, none measured", "at least one grid row that ran")
    for name, b in (("budget_bytes", budget_bytes), ("reference_budget_bytes", reference_budget_bytes)):
        if b is not None:
            _number(name, b, strict=True, allowed="a number of bytes > 0, or None")
    _bool("mark_best", mark_best)
    from ..tools.plots import FONT  # deferred: matplotlib is optional; loaded only to draw

    ref = measured(_rows("reference_rows", reference_rows or []))
    fig, axes = _figure(7.6, 3.8) if not ref else _figure(9.4, 4.2, ncols=2)
    axes = [axes] if not ref else list(axes)
    _pareto_axes(axes[0], rows, budget_bytes, f"Your grid: {device_name}", mark_best)
    if ref:
        _pareto_axes(axes[1], ref, reference_budget_bytes, f"GPU reference: {ref[0].get('device', '')}", mark_best)
    entries = {}  # one legend for the figure, outside the axes: it hides no dot
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(text, handle)
    fig.legend(list(entries.values()), list(entries), fontsize=FONT,
               loc="outside right upper" if not ref else "outside lower center", ncols=1 if not ref else 3)
    return fig


def reference_rows(section: str = "grid", directory=None) -> list:
    """The GPU reference suite's grid points as grid rows ([] when none are shipped)."""
    rows = []
    for p in reference.points(directory, section=section):
        s = p.get("summary") or {}
        if p.get("status") != "ok" or not s:
            continue
        row = row_from_summary(s, s)
        row["device"] = reference.label(p)
        rows.append(row)
    return rows


# ---- convergence ------------------------------------------------------------------------------------

def _result(name: str, result):
    """A Result with per-update records (what ``labkit.run`` returns), or a ConfigError."""
    if getattr(result, "config", None) is None or not getattr(result, "records", None):
        raise ConfigError(name, type(result).__name__, "a labkit Result with per-update records (lk.run's)")
    return result


def tokens_seen(result) -> list:
    """Cumulative training tokens after each update of a run."""
    per = _result("result", result).config.tokens_per_update
    return [per * r["update"] for r in result.records]


def final_loss(result, last: int = 3) -> float:
    """Mean loss of the last ``last`` updates: one update's loss is noisy, the trend is not."""
    tail = [r["loss"] for r in _result("result", result).records[-_count("last", last):]]
    return sum(tail) / len(tail)


def _dress(ax, xlabel: str, ylabel: str, title: str, legend: str = "best"):
    """Axis labels, title, ticks and legend at the course's text sizes; returns the figure."""
    from ..tools.plots import FONT, TITLE  # deferred: matplotlib is optional; loaded only to draw

    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.set_title(title, fontsize=TITLE)
    ax.tick_params(labelsize=FONT, which="both")
    ax.legend(fontsize=FONT, loc=legend)
    return ax.figure


def loss_chart(results: list, labels: list, title: str = "Loss against tokens seen", ax=None):
    """Loss curves against tokens (not updates): the fair axis when effective batches differ."""
    if not isinstance(results, (list, tuple)) or not results:
        raise ConfigError("results", results, "a non-empty list of Results")
    if not isinstance(labels, (list, tuple)) or len(labels) != len(results):
        raise ConfigError("labels", labels, f"one label per result ({len(results)})")
    fig, ax = (ax.figure, ax) if ax is not None else _figure(6.4, 3.2)
    for res, lab in zip(results, labels):
        ax.plot(tokens_seen(res), [r["loss"] for r in res.records], marker="o", ms=2, lw=1, label=lab)
    return _dress(ax, "tokens seen", "training loss", title)


def lr_chart(final_losses: dict, title: str = "Final loss against learning rate", ax=None):
    """``final_losses``: {effective batch: {lr: final loss}} -> one line per effective batch."""
    if not isinstance(final_losses, dict) or not final_losses or \
            not all(isinstance(v, dict) and v for v in final_losses.values()):
        raise ConfigError("final_losses", final_losses, "{effective batch: {learning rate: loss}}, not empty")
    fig, ax = (ax.figure, ax) if ax is not None else _figure(6.4, 3.2)
    for batch, by_lr in sorted(final_losses.items()):
        lrs = sorted(by_lr)
        ax.plot(lrs, [by_lr[lr] for lr in lrs], marker="o", ms=3, label=f"effective batch {batch}")
    ax.set_xscale("log")
    used = sorted({lr for by_lr in final_losses.values() for lr in by_lr})
    _plain_log_ticks(ax.xaxis, used)  # a tick at each learning rate tried, not only at 10⁻³ and 10⁻²
    return _dress(ax, "learning rate", "loss after the same tokens", title)


def _plain_log_ticks(axis, at=None):
    """Plain tick labels on a log axis ('0.003', '6', '1,000'), never 3×10⁰ or 10⁻³: through ``number``,
    major ticks at ``at`` when given, and no labels on the minor ticks (matplotlib's own are mathtext)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # deferred: matplotlib loads only when a chart is drawn

    if at is not None:
        axis.set_major_locator(FixedLocator(list(at)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: number(v, 3)))
    axis.set_minor_formatter(NullFormatter())


# ---- the critical batch size (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training") -----
#
# To reach one loss, a run with batch B needs S updates and E = B·S examples. The empirical model:
#     S = S_min · (1 + B_crit / B),   E = E_min · (1 + B / B_crit),   B_crit = E_min / S_min,
# which is (S/S_min - 1)(E/E_min - 1) = 1. Well below B_crit, k times the batch divides the updates by about
# k for about the same data; well above it, k times the batch costs about k times the data for about the
# same updates; at B = B_crit a run needs twice the minimum of both. Both regimes are asymptotes: no batch
# size is free of either cost.

def monotone_fit(values) -> list:
    """The non-increasing sequence closest to ``values`` in least squares (pool adjacent violators): a loss
    curve without its update-to-update noise, and without the lag a moving average would add."""
    blocks = []  # [sum, count] of each run of values pooled into one level
    for v in values:
        blocks.append([_number("loss", v, minimum=-math.inf), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n
    return [total / n for total, n in blocks for _ in range(n)]


def steps_to_target(losses, target: float):
    """Updates a run needed to reach ``target``: ``losses[i]`` is the loss after i updates (a run's records
    in order: each update's forward pass sees the weights of the updates before it). The first crossing of
    the monotone fit, interpolated between updates; None when the run never got there."""
    if not isinstance(losses, (list, tuple)) or not losses:
        raise ConfigError("losses", losses, "a non-empty list of per-update losses")
    target = _number("target", target, minimum=-math.inf)
    fit = monotone_fit(losses)
    if fit[0] <= target:
        return 0.0
    for i in range(1, len(fit)):
        if fit[i] <= target:  # fit[i - 1] > target >= fit[i]: the crossing lies between the two updates
            return i - 1 + (fit[i - 1] - target) / (fit[i - 1] - fit[i])
    return None


def critical_batch_fit(steps, examples) -> dict:
    """Fit S_min and E_min of (S/S_min - 1)(E/E_min - 1) = 1 to the updates ``steps[i]`` and examples
    ``examples[i]`` (sequences, or tokens) that batch size i needed to reach one target loss; its batch is
    examples / steps. B_crit = E_min / S_min, in the units of ``examples`` per update.

    The model is linear in the two unknowns (S = S_min + E_min / B), fitted in relative error, which weighs
    every batch alike and is the same in S as in E (E = B·S). When the best fit needs S_min <= 0 (updates
    fell like 1/B over the whole range: every batch measured is well below B_crit) ``b_crit`` is inf; when
    it needs E_min <= 0 (updates did not fall at all) it is 0. Needs at least three different batch sizes:
    two would fit the two unknowns exactly and test nothing."""
    if not isinstance(steps, (list, tuple)) or not isinstance(examples, (list, tuple)) or len(steps) != len(examples):
        raise ConfigError("examples", examples, "a list as long as steps: one (steps, examples) pair per batch size")
    S = [_number("steps", v, strict=True) for v in steps]
    E = [_number("examples", v, strict=True) for v in examples]
    B = [e / s for s, e in zip(S, E)]
    distinct = sorted({round(b, 9) for b in B})
    if len(distinct) < 3:
        raise ConfigError("batch sizes", distinct, "at least three different batch sizes (examples / steps): two "
                          "points fit S_min and E_min exactly, so they could not show the model is wrong")
    a = [1 / s for s in S]                      # minimise sum((a_i·S_min + b_i·E_min - 1)^2): relative error
    b = [1 / (bb * s) for bb, s in zip(B, S)]
    saa, sbb, sab = sum(x * x for x in a), sum(y * y for y in b), sum(x * y for x, y in zip(a, b))
    sa, sb = sum(a), sum(b)
    det = saa * sbb - sab * sab
    s_min, e_min = (sa * sbb - sb * sab) / det, (sb * saa - sa * sab) / det
    if s_min <= 0:  # the constrained optimum lies on an edge: refit the other unknown alone
        s_min, e_min = 0.0, sb / sbb
    elif e_min <= 0:
        s_min, e_min = sa / saa, 0.0
    predicted = [s_min + e_min / bb for bb in B]
    return {"s_min": s_min, "e_min": e_min, "b_crit": math.inf if s_min == 0 else e_min / s_min,
            "batches": B, "steps": S, "examples": E, "predicted_steps": predicted,
            "rms_error": math.sqrt(sum(((p - s) / s) ** 2 for p, s in zip(predicted, S)) / len(S))}


def _curves(curves) -> dict:
    """{(batch, lr): [losses]} checked: positive whole batches, at least three of them."""
    if not isinstance(curves, dict) or not curves:
        raise ConfigError("curves", curves, "{(batch, lr): [loss after each update]}, e.g. from a batch × lr sweep")
    for key, losses in curves.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ConfigError("curves", key, "keys (batch, learning rate)")
        _count("batch", key[0])
        if not isinstance(losses, (list, tuple)) or not losses:
            raise ConfigError("curves", key, "a non-empty list of losses for every (batch, lr)")
    batches = sorted({k[0] for k in curves})
    if len(batches) < 3:
        raise ConfigError("batch sizes", batches, "at least three different batch sizes to fit S_min and E_min")
    return curves


def loss_targets(curves: dict, fractions=(0.05, 0.15, 0.3)) -> list:
    """Target losses every batch size reaches: the highest of the batches' best fitted final losses (the level
    the slowest batch just reaches), raised by each of ``fractions`` of the way back to the starting loss --
    lowest (latest in training) first. Above that level no crossing sits on the last update of a run."""
    curves = _curves(curves)
    if not isinstance(fractions, (list, tuple)) or not fractions or \
            not all(isinstance(f, (int, float)) and 0 < f < 1 for f in fractions):
        raise ConfigError("fractions", fractions, "numbers between 0 and 1, e.g. (0.05, 0.15, 0.3)")
    fits = {k: monotone_fit(v) for k, v in curves.items()}
    reached = max(min(fits[k][-1] for k in fits if k[0] == b) for b in {k[0] for k in fits})
    start = statistics.median(f[0] for f in fits.values())
    return [reached + f * (start - reached) for f in sorted(fractions)]


def _needs(curves: dict, target: float) -> dict:
    """{batch: (updates to target, its best lr)}: each batch at the learning rate that got there first."""
    out = {}
    for (batch, lr), losses in curves.items():
        n = steps_to_target(losses, target)
        if n is not None and n > 0 and (batch not in out or n < out[batch][0]):
            out[batch] = (n, lr)
    return out


def run_noise(losses) -> list:
    """A run's update-to-update noise, as residuals to draw from: third differences
    (y[i+3] - 3·y[i+2] + 3·y[i+1] - y[i]) / sqrt(20), centred. Independent noise of spread sigma gives them
    spread sigma (1 + 9 + 9 + 1 = 20), while a smooth curve's trend and curvature cancel: first differences
    leave a steep early loss curve's fall in the "noise" (several times too much on 24 updates), second
    differences its curvature. Residuals about the monotone fit would understate it (the fit follows the
    noise part of the way). Shorter runs fall back to the highest order they allow."""
    v = [_number("loss", x, minimum=-math.inf) for x in losses]
    for weights in ((-1, 3, -3, 1), (1, -2, 1), (-1, 1)):  # binomial differences, highest order first
        n = len(weights)
        if len(v) > n:  # at least two differences, so centring leaves something
            scale = math.sqrt(sum(w * w for w in weights))
            diffs = [sum(w * x for w, x in zip(weights, v[i:i + n])) / scale for i in range(len(v) - n + 1)]
            mean = sum(diffs) / len(diffs)  # what is left of the trend, removed
            return [d - mean for d in diffs]
    return [0.0]


def _bootstrap(curves: dict, target: float, resamples: int, seed: int) -> tuple:
    """B_crit refitted on copies of the runs: each run's monotone fit plus noise drawn from its own
    ``run_noise``. Returns (sorted B_crit values, copies that lost a batch and were dropped)."""
    import random  # deferred: only the bootstrap draws

    rng = random.Random(seed)
    parts = {k: (monotone_fit(v), run_noise(v)) for k, v in curves.items()}
    values, dropped = [], 0
    batches = {k[0] for k in curves}
    for _ in range(resamples):
        fake = {k: [f + rng.choice(res) for f in fit] for k, (fit, res) in parts.items()}
        need = _needs(fake, target)
        if set(need) != batches:
            dropped += 1
            continue
        values.append(critical_batch_fit([need[b][0] for b in sorted(need)],
                                         [b * need[b][0] for b in sorted(need)])["b_crit"])
    return sorted(values), dropped


def critical_batch_estimate(curves: dict, target: float, resamples: int = 200, seed: int = 0) -> dict:
    """B_crit at one ``target`` loss from a sweep: ``curves`` {(batch, lr): [loss after 0, 1, 2 ... updates]}.
    Each batch counts the updates of its best learning rate (the one that reached the target first) and
    batch × updates examples; critical_batch_fit does the rest. Its uncertainty: the whole estimate repeated
    on ``resamples`` bootstrap copies of the runs' noise gives a 95 % interval (``interval``, None with
    ``resamples=0``). ``ok`` is False, with ``reason``, when a batch never reached the target."""
    curves = _curves(curves)
    target = _number("target", target, minimum=-math.inf)
    resamples = _count("resamples", resamples, 0)
    _count("seed", seed, 0)
    need = _needs(curves, target)
    batches = sorted({k[0] for k in curves})
    missing = [b for b in batches if b not in need]
    base = {"target": target, "batches": batches, "per_batch": need, "interval": None, "dropped": 0}
    if missing:
        return {**base, "ok": False, "reason": "batch " + ", ".join(map(str, missing)) + " never reached the target"}
    fit = critical_batch_fit([need[b][0] for b in batches], [b * need[b][0] for b in batches])
    out = {**fit, **base, "ok": True, "reason": ""}  # base's batches: the whole numbers the sweep ran
    if resamples:
        values, out["dropped"] = _bootstrap(curves, target, resamples, seed)
        if len(values) >= 20:  # fewer kept copies than that make a 95 % interval meaningless
            last = len(values) - 1
            out["interval"] = (values[int(0.025 * last)], values[math.ceil(0.975 * last)])
    return out


def _span(v) -> str:
    """A B_crit value in words: 'above every batch' for inf, a plain number otherwise."""
    from ..tools.plots import number  # deferred: the one number format of the course (no e-notation)

    return "∞" if v == math.inf else number(v, 2)


def critical_batch_spread(interval) -> str:
    """How wide a bootstrap ``interval`` (lo, hi) of B_crit is, in words: the factor it spans when both ends
    are finite and positive, else which end these runs leave open (a factor of infinity says nothing)."""
    if interval is None:
        return "too few bootstrap copies reached every target to give an interval."
    if not (isinstance(interval, (list, tuple)) and len(interval) == 2):
        raise ConfigError("interval", interval, "(lo, hi) from critical_batch_estimate, or None")
    lo, hi = (_number("interval", v) if v != math.inf else v for v in interval)
    if 0 < lo and hi < math.inf:
        return f"the interval at the lowest target spans a factor of {hi / lo:.1f}."
    if lo == math.inf or hi == 0:  # every copy fell on one edge of the fit
        side = "beyond the largest batch" if lo == math.inf else "below the smallest batch"
        return f"at the lowest target every bootstrap copy put B_crit {side}: these runs only bound it."
    if lo > 0:  # hi is infinite
        return (f"at the lowest target the interval has no upper end: these runs bound B_crit from below only "
                f"(B_crit above about {_span(lo)} sequences per update).")
    if hi < math.inf:  # lo is 0
        return (f"at the lowest target the interval reaches 0: these runs bound B_crit from above only "
                f"(B_crit below about {_span(hi)} sequences per update).")
    return "at the lowest target the interval reaches from 0 to infinity: these runs do not bound B_crit at all."


def _batch_list(bs) -> str:
    """'batch 4' / 'batches 4 and 16' / 'batches 4, 16 and 64'."""
    words = [str(b) for b in bs]
    return "batch " + words[0] if len(words) == 1 else "batches " + ", ".join(words[:-1]) + " and " + words[-1]


def critical_batch_words(est: dict, seq_len: int | None = None) -> str:
    """What one estimate says, in markdown: B_crit with its interval, what each k-fold larger batch bought
    (measured: the updates it saved, the data it cost), and where each batch lies against the interval.
    A side of B_crit is named only from the fit over every batch, and only outside the interval."""
    from ..tools.plots import number  # deferred: the one number format of the course (no e-notation)

    if not isinstance(est, dict) or "ok" not in est:
        raise ConfigError("est", est, "what critical_batch_estimate returns")
    if not est["ok"]:
        return f"No estimate at loss {est['target']:.3f}: {est['reason']} (the runs are too short for it)."
    bs, need = est["batches"], est["per_batch"]
    pairs = []
    for b1, b2 in zip(bs, bs[1:]):
        s1, s2 = need[b1][0], need[b2][0]
        pairs.append(f"batch {b1} → {b2} (×{number(b2 / b1)}): ÷{number(s1 / s2)} the updates, "
                     f"×{number(b2 * s2 / (b1 * s1))} the data")
    text = (f"To reach loss {est['target']:.3f}: " + "; ".join(pairs) + " (measured; the two factors multiply to "
            "the batch's factor). ")
    bc, iv = est["b_crit"], est["interval"]
    tokens = f" (about {number(bc * seq_len)} tokens)" if seq_len and math.isfinite(bc) and bc > 0 else ""
    if bc == math.inf:
        text += (f"The fit needs S_min = 0: the updates fell in proportion to the batch over the whole range, so "
                 f"B_crit lies beyond the largest batch measured ({bs[-1]}) and these runs only bound it.")
    elif bc == 0:
        text += ("The fit needs E_min = 0: the updates did not fall with the batch, so B_crit lies below the "
                 f"smallest batch measured ({bs[0]}) and these runs only bound it.")
    else:
        text += f"Fitted: S_min ≈ {number(est['s_min'])} updates, E_min ≈ {number(est['e_min'])} sequences, " \
                f"**B_crit = E_min / S_min ≈ {number(bc, 2)} sequences per update**{tokens}; the fitted curve " \
                f"misses the measured updates by {est['rms_error']:.0%} (rms)"
        if iv is None:
            text += " (no interval: too few bootstrap copies kept)."
        else:
            text += f", 95 % bootstrap interval {_span(iv[0])} to {_span(iv[1])}."
            below = [b for b in bs if b < iv[0]]
            above = [b for b in bs if b > iv[1]]
            inside = [b for b in bs if iv[0] <= b <= iv[1]]
            where = ([f"{_batch_list(below)} below the whole interval"] if below else []) + \
                    ([f"{_batch_list(inside)} inside it (these runs cannot tell which side)"] if inside else []) + \
                    ([f"{_batch_list(above)} above it"] if above else [])
            text += " Against it: " + "; ".join(where) + "."
    return text


def critical_batch_table(estimates: list) -> str:
    """Markdown: per target loss, the updates each batch needed, B_crit and its 95 % bootstrap interval."""
    from ..tools.plots import number  # deferred: the one number format of the course (no e-notation)

    if not isinstance(estimates, (list, tuple)) or not estimates or \
            not all(isinstance(e, dict) and "ok" in e for e in estimates):
        raise ConfigError("estimates", estimates, "a list of critical_batch_estimate results")
    batches = estimates[0]["batches"]
    lines = ["| target loss | updates needed, batch " + " / ".join(map(str, batches)) + " | B_crit (sequences) "
             "| 95 % bootstrap interval |", "|---:|---:|---:|---:|"]
    for e in estimates:
        need = " / ".join(number(e["per_batch"][b][0]) if b in e["per_batch"] else "never" for b in batches)
        crit = _span(e["b_crit"]) if e["ok"] else "–"
        iv = f"{_span(e['interval'][0])} to {_span(e['interval'][1])}" if e.get("interval") else "–"
        lines.append(f"| {e['target']:.3f} | {need} | {crit} | {iv} |")
    return "\n".join(lines)


def critical_batch_chart(estimates: list, title: str = "Updates against data to reach one loss"):
    """McCandlish et al.'s picture: for each target loss the (updates, sequences) each batch needed, measured,
    and the fitted curve S = S_min + E_min/B, E = E_min + S_min·B with its two asymptotes (dashed) and the
    point B = B_crit, where both are twice their minimum."""
    from .kernels import log_ticks  # deferred: only this chart needs chapter 07's tick rule (kernels pulls in the profiler)
    from ..tools.plots import FONT  # deferred: matplotlib is optional; loaded only to draw

    good = [e for e in (estimates or []) if isinstance(e, dict) and e.get("ok")]
    if not good:
        raise ConfigError("estimates", estimates, "a list of critical_batch_estimate results, one at least ok")
    fig, ax = _figure(8.4, 3.8)
    colors = ("#4c72b0", "#dd8452", "#55a868", "#8172b3")
    for e, color in zip(good, colors):
        S, E = e["steps"], e["examples"]
        ax.scatter(S, E, color=color, s=30, zorder=3, label=f"loss {e['target']:.2f}: measured")
        for b, x, y in zip(e["batches"], S, E):
            ax.annotate(f"B={b}", (x, y), xytext=(4, 3), textcoords="offset points", fontsize=FONT, color=color)
        if 0 < e["b_crit"] < math.inf:
            lo, hi = math.log(min(e["batches"]) / 4), math.log(max(e["batches"]) * 4)
            bs = [math.exp(lo + (hi - lo) * i / 60) for i in range(61)]
            ax.plot([e["s_min"] + e["e_min"] / b for b in bs], [e["e_min"] + e["s_min"] * b for b in bs], "-",
                    lw=1, color=color, label=f"fit: B_crit ≈ {_span(e['b_crit'])}")
            ax.axvline(e["s_min"], ls=":", lw=0.8, color=color)
            ax.axhline(e["e_min"], ls=":", lw=0.8, color=color)
            ax.scatter([2 * e["s_min"]], [2 * e["e_min"]], marker="x", color=color, s=40, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # a span of under a decade got only minor ticks, labelled 3×10⁰
        _plain_log_ticks(axis, log_ticks(*axis.get_view_interval()))
    _dress(ax, "updates to reach the loss (S; dotted: S_min)", "sequences to reach it (E; dotted: E_min)",
           title + " (× : B = B_crit)")
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: it hides no point
    return fig


# ---- a small FSDP demonstration (gloo on a CPU, NCCL on GPUs) ----------------------------------------

def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _fsdp_child(rank: int, world_size: int, store_path: str, spec, micro_batch: int, steps: int, seed: int, out_q):
    """A spawned FSDP rank: shard a GPT with ``fully_shard`` and train on its slice of each batch."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        from torch.distributed.fsdp import fully_shard  # deferred: 0.4 s to import; only the demo's ranks use it

        # the engine's way: a FileStore (no listening port) and gloo on the loopback interface only
        ddp_mod.init_group("cpu", rank, world_size, dist.FileStore(store_path, world_size))
        torch.manual_seed(seed)
        model = GPT(spec)
        full_params = _local_bytes(model.parameters())
        for block in model.blocks:
            fully_shard(block)  # each block's weights become a shard; gathered only while it runs
        fully_shard(model)      # the rest (embeddings, final norm) as one more unit
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        losses, grads = [], 0
        for step, (x, y) in enumerate(_demo_batches(spec, micro_batch * world_size, steps, seed)):
            mine = slice(rank * micro_batch, (rank + 1) * micro_batch)
            loss = model(x[mine], y[mine])
            loss.backward()  # FSDP reduce-scatters: each rank keeps the averaged gradient of its shard
            grads = _local_bytes(p.grad for p in model.parameters())
            opt.step()
            opt.zero_grad(set_to_none=True)
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            losses.append(float(avg) / world_size)
        opt_bytes = sum(_local_bytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
                        for st in opt.state.values())
        out_q.put(("done", rank, dict(param_bytes=_local_bytes(model.parameters()), grad_bytes=grads,
                                      optimizer_bytes=opt_bytes, full_param_bytes=full_params, losses=losses)))
    except BaseException as e:  # noqa: BLE001 -- reported to the parent
        out_q.put(("error", rank, f"{type(e).__name__}: {e}"))
    finally:
        try:
            if dist.is_initialized():
                ddp_mod.destroy_group()
        finally:
            out_q.put(("exit", rank, None))


def _demo_batches(spec, batch: int, steps: int, seed: int):
    """The same global batches on every rank (each takes its slice), from the course corpus."""
    ds = ByteWindows(corpus_path(None), spec.seq_len)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(ds), (batch,), generator=g).tolist()
        xs, ys = zip(*(ds[i] for i in idx))
        yield torch.stack(xs), torch.stack(ys)


def single_process_losses(spec, batch: int, steps: int, seed: int = 0) -> list:
    """The same training as the FSDP demo, in one process on the whole batch: the losses to match."""
    if spec not in PRESETS.values() and not hasattr(spec, "n_layer"):
        raise ConfigError("spec", spec, "a model shape such as lk.PRESETS['tiny']")
    _count("batch", batch)
    _count("steps", steps)
    _count("seed", seed, 0)
    torch.manual_seed(seed)
    model = GPT(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    losses = []
    for x, y in _demo_batches(spec, batch, steps, seed):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def fsdp_demo(model: str = "tiny", world_size: int = 2, micro_batch: int = 4, steps: int = 3, seed: int = 0,
              timeout_s: float = 120.0) -> dict:
    """Train a GPT under FSDP (``torch.distributed.fsdp.fully_shard``) on ``world_size`` CPU processes
    (gloo) and report what each rank holds against a full replica, and the losses beside one
    process training on the whole batch. Nothing outlives the call."""
    _choice("model", model, PRESETS)
    if _count("world_size", world_size, 2) > 8:  # one rank shards nothing; each rank is a spawned process
        raise ConfigError("world_size", world_size, "2 to 8 processes for this demo")
    _count("micro_batch", micro_batch)
    _count("steps", steps)
    _count("seed", seed, 0)
    _number("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    spec = PRESETS[model]
    ctx = mp.get_context("spawn")
    store_dir = tempfile.mkdtemp(prefix="labkit-fsdp-")  # private (0700): the ranks meet in a file
    out_q = ctx.Queue()
    procs = [ctx.Process(target=_fsdp_child, args=(r, world_size, os.path.join(store_dir, "store"), spec,
                                                   micro_batch, steps, seed, out_q), daemon=True)
             for r in range(world_size)]
    ranks, errors, exited = {}, [], set()
    t0 = time.monotonic()
    try:
        for p in procs:
            p.start()
        while len(exited) < world_size and time.monotonic() - t0 < timeout_s:
            try:
                tag, rank, payload = out_q.get(timeout=0.2)
            except queue_mod.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    errors.append("a rank died: " + ", ".join(str(p.exitcode) for p in procs))
                    break
                continue
            if tag == "done":
                ranks[rank] = payload
            elif tag == "error":
                errors.append(f"rank {rank}: {payload}")
            else:
                exited.add(rank)
        if len(exited) < world_size and not errors:
            errors.append(f"timed out after {timeout_s:.0f} s")
    finally:
        for p in procs:
            if p.pid is not None:
                p.join(timeout=5)
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.terminate()
                p.join(timeout=5)
        out_q.close()
        out_q.join_thread()
        shutil.rmtree(store_dir, ignore_errors=True)
    if errors or len(ranks) < world_size:
        return {"ok": False, "error": "; ".join(errors) or "a rank sent no result", "ranks": ranks}
    full = ranks[0]["full_param_bytes"]
    return {"ok": True, "world_size": world_size, "model": model, "ranks": [ranks[r] for r in range(world_size)],
            "replica": {"param_bytes": full, "grad_bytes": full, "optimizer_bytes": 2 * full},
            "losses": ranks[0]["losses"], "seconds": time.monotonic() - t0}
