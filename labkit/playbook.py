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

import itertools
import math
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from . import ddp as ddp_mod
from . import reference
from .config import PRESETS, Config
from .data import ByteWindows, corpus_path
from .errors import ConfigError, OutOfMemory, RunError
from .model import GPT
from .train import run

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


def state_bytes_per_gpu(n_params: float, n_gpus: int = 1, stage: int = 0, optimizer: str = "adam",
                        offload_optimizer: bool = False, offload_params: bool = False) -> dict:
    """Bytes of model state (weights, gradients, optimizer) on each GPU under ZeRO ``stage`` 0-3.

    Stage 0 is plain DDP: every GPU holds all of it. Stage 1 shards the optimizer states over the
    ``n_gpus`` data-parallel ranks, stage 2 the gradients too, stage 3 (FSDP's FULL_SHARD) the
    weights too. Offloading moves the optimizer states (and with ``offload_params`` the weights and
    gradients) to CPU memory; ``cpu`` says how much each rank then needs there. Activations and the
    one layer FSDP gathers at a time come on top.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r}: ZeRO stages are 0 (none), 1, 2, 3")
    if n_gpus < 1:
        raise ValueError(f"n_gpus={n_gpus!r}: at least 1")
    if optimizer not in OPTIMIZER_BYTES:
        raise ValueError(f"optimizer={optimizer!r}: choose one of {', '.join(OPTIMIZER_BYTES)}")
    N, G = float(n_params), n_gpus
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
    s, b, h, a = seq_len, micro_batch, d_model, n_head
    if checkpointing == "full":
        return float(n_layer * 2 * s * b * h)
    per_layer = s * b * h * (34 + (0 if flash else 5 * a * s / h))
    return float(n_layer * per_layer)


def remedies(n_params: float, n_gpus: int, gpu_bytes: float, activation_bytes: float = 0.0,
             optimizer: str = "adam") -> list:
    """One row per option, least intrusive first: bytes per GPU (states + activations) and whether
    it fits in ``gpu_bytes``. Offloading needs ``cpu`` bytes of host memory per rank."""
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


def remedy_chart(rows: list, gpu_bytes: float, title: str = "", ax=None):
    """Stacked bars of bytes per GPU for each option, the card's memory as a dashed line."""
    from . import plots  # deferred: matplotlib is optional; loaded only to draw

    fig, ax = (ax.figure, ax) if ax is not None else _figure(6.4, 3.0)
    names = [r["remedy"].replace("+", "+\n").replace("offload_", "offload ") for r in rows]
    bottom = [0.0] * len(rows)
    for key, words, color in (("params", "weights", plots.COLORS["param_bytes"]),
                              ("grads", "gradients", plots.COLORS["grad_bytes"]),
                              ("optimizer", "optimizer", plots.COLORS["optimizer_bytes"]),
                              ("activations", "activations", plots.COLORS["activation_bytes"])):
        vals = [r[key] / GB for r in rows]
        ax.bar(names, vals, bottom=bottom, color=color, label=words)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(gpu_bytes / GB, ls="--", color="#222222", lw=1)
    ax.text(len(rows) - 0.5, gpu_bytes / GB, f" GPU {gpu_bytes / GB:.0f} GB", va="bottom", ha="right", fontsize=7)
    ax.set_ylabel("GB per GPU", fontsize=8)
    ax.set_title(title or "Memory per GPU, by option", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper right")
    return fig


# ---- the grid ------------------------------------------------------------------------------------

def grid(precision=("fp32", "bf16"), micro_batch=(1, 2, 4, 8), checkpointing=("none", "full"), workers=(0,),
         effective_batch: int | None = None, accum=(1,)) -> list:
    """Grid points (dicts of Config knobs). With ``effective_batch`` (sequences per update) K is
    derived: accum = effective_batch // micro_batch, and micro-batches that do not divide it are
    left out -- every point then trains on the same batch, so only speed and memory differ."""
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


class _Progress:
    """An ipywidgets progress bar in a notebook, one printed line per point elsewhere."""

    def __init__(self, total: int, show: bool = True):
        self.total, self.n, self.bar, self.text = total, 0, None, None
        self.show = show
        if not show:
            return
        try:
            from IPython import get_ipython  # deferred: IPython exists only in a notebook

            if get_ipython() is None or not hasattr(get_ipython(), "kernel"):
                raise ImportError
            import ipywidgets as widgets  # deferred: optional (course extras); a plain line is printed without it
            from IPython.display import display  # deferred: IPython exists only in a notebook

            self.bar = widgets.IntProgress(min=0, max=total, description="grid")
            self.text = widgets.Label("")
            display(widgets.HBox([self.bar, self.text]))
        except ImportError:
            self.bar = None

    def step(self, what: str):
        self.n += 1
        if not self.show:
            return
        if self.bar is not None:
            self.bar.value = self.n
            self.text.value = f"{self.n}/{self.total} {what}"
        else:
            filled = int(20 * self.n / max(1, self.total))
            print(f"[{'#' * filled}{'.' * (20 - filled)}] {self.n}/{self.total} {what}", flush=True)


def grid_search(base: dict, points: list, progress: bool = True, on_point=None, repeats: int = 1,
                run_fn=None) -> list:
    """Run ``labkit.run`` once per point (base knobs + the point's), with a progress bar. Returns one
    row per point; a point the device refuses (ConfigError) or that runs out of memory is kept with
    its status ('refused', 'oom', 'error') so the table shows why it is missing from the chart.

    ``repeats`` > 1 runs the whole grid that many times, forwards then backwards and so on (a drift in
    the machine's load hits every point alike); each row then holds the **median** tokens/s, step time
    and MFU, and every run's tokens/s in ``tokens_per_s_runs``. A point refused once is not retried.
    ``run_fn`` replaces ``labkit.run`` (tests feed a fake)."""
    run_fn = run_fn or run
    repeats = max(1, int(repeats))
    bar = _Progress(len(points) * repeats, progress)
    summaries = {i: [] for i in range(len(points))}
    failed = {}
    for rep in range(repeats):
        order = list(range(len(points)))
        if rep % 2:
            order.reverse()
        for i in order:
            point = points[i]
            if i in failed:
                bar.step(failed[i]["label"] + f" ({failed[i]['status']})")
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
            bar.step(label(point) + ("" if status == "ok" else f" ({status})")
                     + (f" [pass {rep + 1}/{repeats}]" if repeats > 1 else ""))
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
    spreads = [(max(r["tokens_per_s_runs"]) - min(r["tokens_per_s_runs"])) / statistics.median(r["tokens_per_s_runs"])
               for r in measured(rows) if len(r.get("tokens_per_s_runs") or []) > 1]
    return statistics.median(spreads) if spreads else None


def within_scatter(rows: list, top: dict, scatter) -> list:
    """The measured rows whose tokens/s is within ``scatter`` (relative) of ``top``'s: points these runs
    cannot rank against it ([top] alone when there is no scatter estimate)."""
    if not scatter:
        return [top]
    return [r for r in measured(rows) if r["tokens_per_s"] >= top["tokens_per_s"] * (1 - scatter)]


def config_of(base: dict, point: dict):
    """The Config of a grid point (a row or a dict of knobs) on top of ``base``."""
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
    return [r for r in rows if r.get("status", "ok") == "ok" and r.get("memory_bytes") is not None
            and r.get("tokens_per_s")]


def pareto_front(rows: list, memory: str = "memory_bytes", speed: str = "tokens_per_s") -> list:
    """The rows no other row beats on both axes (less or equal memory AND more or equal speed, one of
    them strictly), sorted by memory. Every other configuration is a bad deal: something on the front
    is at least as fast and needs no more memory."""
    pts = [r for r in rows if r.get(memory) is not None and r.get(speed) is not None]
    pts.sort(key=lambda r: (r[memory], -r[speed]))
    front, best = [], -math.inf
    for r in pts:
        if r[speed] > best:
            front.append(r)
            best = r[speed]
    return front


def best_within(rows: list, budget_bytes: float, memory: str = "memory_bytes", speed: str = "tokens_per_s"):
    """The fastest measured row whose memory fits the budget (None when nothing fits)."""
    fits = [r for r in measured(rows) if r[memory] <= budget_bytes]
    return max(fits, key=lambda r: r[speed]) if fits else None


def table(rows: list, budget_bytes: float | None = None) -> str:
    """The grid as a markdown table, fastest first, with whether each row fits the budget."""
    unit, u = _unit(rows)
    lines = ["| configuration | tokens/s | memory (" + u + ") | fits |", "|---|---:|---:|:---:|"]
    for r in sorted(rows, key=lambda r: -(r.get("tokens_per_s") or -1)):
        if r.get("status", "ok") != "ok":
            lines.append(f"| {r['label']} | {r['status']} | | |")
            continue
        fit = "" if budget_bytes is None else ("yes" if r["memory_bytes"] <= budget_bytes else "no")
        lines.append(f"| {r['label']} | {r['tokens_per_s']:,.0f} | {r['memory_bytes'] / unit:,.1f} | {fit} |")
    return "\n".join(lines)


def _unit(rows):
    top = max([r.get("memory_bytes") or 0 for r in rows] or [0])
    return (2**30, "GiB") if top >= 2**30 else (2**20, "MiB")


def _figure(width, height, ncols=1):
    from .plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=90)
    axes = fig.subplots(1, ncols) if ncols > 1 else fig.add_subplot()
    return fig, axes


def _pareto_axes(ax, rows, budget_bytes, title, note=""):
    pts = measured(rows)
    if not pts:
        ax.text(0.5, 0.5, note or "no measurements", ha="center", va="center", wrap=True, fontsize=8,
                color="#555555", transform=ax.transAxes)
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    unit, u = _unit(pts)
    front = pareto_front(pts)
    colors = {"fp32": "#4c72b0", "tf32": "#8172b3", "fp16": "#dd8452", "bf16": "#c44e52"}
    for prec in sorted({r["precision"] for r in pts}):
        for ck, marker in (("none", "o"), ("full", "^"), ("selective", "s")):
            sel = [r for r in pts if r["precision"] == prec and r["checkpointing"] == ck]
            if sel:
                ax.scatter([r["memory_bytes"] / unit for r in sel], [r["tokens_per_s"] for r in sel], s=22,
                           marker=marker, color=colors.get(prec, "#555555"), alpha=0.85,
                           label=f"{prec}{', checkpointing' if ck != 'none' else ''}")
    ax.plot([r["memory_bytes"] / unit for r in front], [r["tokens_per_s"] for r in front], "-", lw=1,
            color="#222222", zorder=0, label="Pareto front")
    if budget_bytes:
        ax.axvline(budget_bytes / unit, ls="--", color="#c44e52", lw=1)
        ax.text(budget_bytes / unit, 0.02, " budget", color="#c44e52", fontsize=7, transform=ax.get_xaxis_transform())
        best = best_within(pts, budget_bytes)
        if best is not None:
            ax.scatter([best["memory_bytes"] / unit], [best["tokens_per_s"]], s=110, facecolors="none",
                       edgecolors="#222222", lw=1.2, label="best within budget")
    ax.set_xlabel(f"memory ({u}; {pts[0].get('memory_source') or 'measured'})", fontsize=8)
    ax.set_ylabel("tokens/s", fontsize=8)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="lower right")


def pareto_chart(rows: list, budget_bytes: float | None, reference_rows: list | None = None,
                 reference_budget_bytes: float | None = None, device_name: str = "this device"):
    """Memory against throughput, the budget as a dashed line, the Pareto front joined -- for the
    learner's runs and, beside them, the GPU reference grid (or a note that none is shipped)."""
    fig, (a, b) = _figure(10.0, 3.6, ncols=2)
    _pareto_axes(a, rows, budget_bytes, f"Your grid: {device_name}")
    ref_title = "GPU reference"
    if reference_rows:
        ref_title += f": {reference_rows[0].get('device', '')}"
    _pareto_axes(b, reference_rows or [], reference_budget_bytes, ref_title,
                 note="No GPU reference grid shipped in data/reference/ yet:\nonly your own measurements exist.")
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

def tokens_seen(result) -> list:
    """Cumulative training tokens after each update of a run."""
    per = result.config.tokens_per_update
    return [per * r["update"] for r in result.records]


def final_loss(result, last: int = 3) -> float:
    """Mean loss of the last ``last`` updates: one update's loss is noisy, the trend is not."""
    tail = [r["loss"] for r in result.records[-last:]]
    return sum(tail) / len(tail)


def loss_chart(results: list, labels: list, title: str = "Loss against tokens seen", ax=None):
    """Loss curves against tokens (not updates): the fair axis when effective batches differ."""
    fig, ax = (ax.figure, ax) if ax is not None else _figure(5.0, 3.0)
    for res, lab in zip(results, labels):
        ax.plot(tokens_seen(res), [r["loss"] for r in res.records], marker="o", ms=2, lw=1, label=lab)
    ax.set_xlabel("tokens seen", fontsize=8)
    ax.set_ylabel("training loss", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    return fig


def lr_chart(final_losses: dict, title: str = "Final loss against learning rate", ax=None):
    """``final_losses``: {effective batch: {lr: final loss}} -> one line per effective batch."""
    fig, ax = (ax.figure, ax) if ax is not None else _figure(5.0, 3.0)
    for batch, by_lr in sorted(final_losses.items()):
        lrs = sorted(by_lr)
        ax.plot(lrs, [by_lr[lr] for lr in lrs], marker="o", ms=3, label=f"effective batch {batch}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate", fontsize=8)
    ax.set_ylabel("loss after the same tokens", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
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
