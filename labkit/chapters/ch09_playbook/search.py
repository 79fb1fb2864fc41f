"""Chapter 09's measured grid search and its reading: one ``labkit.run`` per grid point (``tools.sweep``), one
row per point, the Pareto front of memory against throughput, the fastest point within a budget, how far
repeats scatter, the table and chart; and the same toggles **predicted** by ``lk.predict`` on catalogue GPUs.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from ...base.runtime import ConfigError, OutOfMemory, RunError
from ...base.numfmt import number
from ...engine.config import Config, _bool, _choice, real, whole  # the Config's own checks: one wording
from ...engine.measure import median
from ...engine.train import run
from ...tools import reference, sweep
from ..course import predicted_speedup, table
from ..measured import saved


def row_list(name: str, value) -> list:
    """Grid rows: a list (or tuple) of dicts."""
    if isinstance(value, (list, tuple)) and all(isinstance(r, dict) for r in value):
        return list(value)
    raise ConfigError(name, type(value).__name__ if not isinstance(value, (list, tuple)) else value,
                      "a list of grid rows (dicts), e.g. what grid_search returns")


def axis_values(name: str, values) -> tuple:
    """A grid axis: a non-empty tuple or list of values (a bare string would iterate by letter)."""
    if isinstance(values, (list, tuple)) and values:
        return tuple(values)
    raise ConfigError(name, values, "a non-empty tuple of values, e.g. (1, 2, 4)")


# ---- the grid ------------------------------------------------------------------------------------

def grid(precision=("fp32", "bf16"), micro_batch=(1, 2, 4, 8), checkpointing=("none", "full"), workers=(0,),
         effective_batch: int | None = None, accum=(1,)) -> list:
    """Grid points (dicts of Config knobs). With ``effective_batch`` (sequences per update) K is
    derived: accum = effective_batch // micro_batch, and micro-batches that do not divide it are
    left out -- every point then trains on the same batch, so only speed and memory differ."""
    knob_choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(Config)}
    for name, values in (("precision", precision), ("checkpointing", checkpointing)):
        for v in axis_values(name, values):
            _choice(name, v, knob_choices[name])
    for name, values, least in (("micro_batch", micro_batch, 1), ("workers", workers, 0), ("accum", accum, 1)):
        for v in axis_values(name, values):
            whole(name, v, least)
    if effective_batch is not None:
        whole("effective_batch", effective_batch)
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
    """'bf16 mb=4 K=2 ckpt w=2': a grid point's knobs in a few characters (the tables' and charts' names)."""
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


# what a point's failure is called in its row, first match first (OutOfMemory is a RunError)
FAILURES = ((ConfigError, "refused"), (OutOfMemory, "oom"), (RunError, "error"))


def grid_search(base: dict, points: list, progress: bool = True, on_point=None, repeats: int = 1,
                run_fn=None) -> list:
    """Run ``labkit.run`` once per point (base knobs + the point's), with a progress bar. Returns one
    row per point; a point the device refuses or that runs out of memory is kept with its status
    ('refused', 'oom', 'error') so the table shows why it is missing from the chart. ``repeats`` > 1 runs
    the grid that many times in alternating order (``tools.sweep.run_configs``); each row then holds the
    **median** tokens/s, step time and MFU, and every run's tokens/s in ``tokens_per_s_runs``.
    ``run_fn`` replaces ``labkit.run`` (tests feed a fake)."""
    if not isinstance(base, dict):
        raise ConfigError("base", base, "a dict of Config knobs shared by every point, e.g. dict(model='tiny')")
    points = row_list("points", points)
    repeats = whole("repeats", repeats)
    _bool("progress", progress)
    for name, fn in (("on_point", on_point), ("run_fn", run_fn)):
        if fn is not None and not callable(fn):
            raise ConfigError(name, fn, "a function, or None")
    configs = [Config(**{**base, **point}) for point in points]  # a bad knob is refused now, before any run
    runs, failed = sweep.run_configs(configs, run_fn or run, label="grid", notes=[label(p) for p in points],
                                     repeats=repeats, delay=1.0 if progress else math.inf, failures=FAILURES)
    return _grid_rows(points, runs, failed, on_point)


def _failed_row(point: dict, status: str, error: Exception) -> dict:
    """A failed point's row: its status, and the first sentence of an OOM's advice (the table has no room)."""
    return row_from_summary(point, None, status, str(error).split(". ")[0] if status == "oom" else str(error))


def _grid_rows(points, summaries, failed, on_point):
    """One row per point: a failed point's own row, else the medians of its runs (``on_point`` sees each)."""
    rows = []
    for i, point in enumerate(points):
        if i in failed:
            row = _failed_row(point, *failed[i])
        else:
            ss = summaries[i]
            row = row_from_summary(point, ss[0])
            for k in ("tokens_per_s", "step_time_s", "mfu"):
                row[k] = median(x.get(k) for x in ss)  # None when no run reported it
            mems = [memory_of(x)[0] for x in ss if memory_of(x)[0] is not None]
            row["memory_bytes"] = max(mems) if mems else None  # a GPU's peak can differ a little: the larger
            row["tokens_per_s_runs"] = [x.get("tokens_per_s") for x in ss]
        rows.append(row)
        if on_point is not None:
            on_point(row)
    return rows


def config_of(base: dict, point: dict):
    """The Config of a grid point (a row or a dict of knobs) on top of ``base``."""
    for name, value in (("base", base), ("point", point)):
        if not isinstance(value, dict):
            raise ConfigError(name, value, "a dict of Config knobs")
    return Config(**{**base, **{k: point[k] for k in KNOB_KEYS if point.get(k) is not None}})


# ---- the GPU reference suite's grid, as rows of the same kind ----------------------------------------

def reference_rows(section: str = "grid", directory=None) -> list:
    """The GPU reference suite's grid points as grid rows ([] when none are shipped)."""
    return [{**row_from_summary(p["summary"], p["summary"]), "device": reference.label(p)}
            for p in reference.points(directory, section=section) if p.get("status") == "ok" and p.get("summary")]


@dataclasses.dataclass
class SavedRun:
    """A run as the learner's measurement file keeps it: its summary (no records, no model)."""
    summary: dict
    records: list = dataclasses.field(default_factory=list)


def saved_pick():
    """While a grader runs the notebook, the challenge pick's run that the learner's ``budget_challenge`` check
    saved (``labkit-measurements.json``), as a SavedRun: the pick is graded on the learner's own measurement,
    so the grader's CPU does not run it again. None otherwise (the chapter runs the pick)."""
    data = saved("budget_challenge")
    return SavedRun(dict(data["summary"])) if data and isinstance(data.get("summary"), dict) else None


# ---- reading it: the front, the budget, the scatter, the table and chart -------------------------

def measured(rows: list) -> list:
    """The rows that ran and have both a memory figure and a throughput (refused or failed ones left out)."""
    return [r for r in row_list("rows", rows) if r.get("status", "ok") == "ok" and r.get("memory_bytes") is not None
            and r.get("tokens_per_s")]


def pareto_front(rows: list, memory: str = "memory_bytes", speed: str = "tokens_per_s") -> list:
    """The rows no other row beats on both axes (less or equal memory AND more or equal speed, one of
    them strictly), sorted by memory. Every other configuration is a bad deal: something on the front
    is at least as fast and needs no more memory."""
    pts = [r for r in row_list("rows", rows) if r.get(memory) is not None and r.get(speed) is not None]
    pts.sort(key=lambda r: (r[memory], -r[speed]))
    front, best = [], -math.inf
    for r in pts:
        if r[speed] > best:
            front.append(r)
            best = r[speed]
    return front


def best_within(rows: list, budget_bytes: float, memory: str = "memory_bytes", speed: str = "tokens_per_s"):
    """The fastest measured row whose memory fits the budget (None when nothing fits)."""
    real("budget_bytes", budget_bytes, strict=True, allowed="a number of bytes > 0")
    fits = [r for r in measured(rows) if r[memory] <= budget_bytes]
    return max(fits, key=lambda r: r[speed]) if fits else None


def run_scatter(rows: list):
    """How much a point's tokens/s differed between the grid's repeats: the median over points of
    (max - min) / median of its runs. None with one run per point (nothing to tell the scatter from)."""
    rows = row_list("rows", rows)
    spreads = [(max(r["tokens_per_s_runs"]) - min(r["tokens_per_s_runs"])) / median(r["tokens_per_s_runs"])
               for r in measured(rows) if len(r.get("tokens_per_s_runs") or []) > 1]
    return median(spreads)  # None when no point ran twice


def within_scatter(rows: list, top: dict, scatter) -> list:
    """The measured rows whose tokens/s is within ``scatter`` (relative) of ``top``'s: points these runs
    cannot rank against it ([top] alone when there is no scatter estimate)."""
    rows = row_list("rows", rows)
    if not isinstance(top, dict):
        raise ConfigError("top", top, "one grid row (a dict), e.g. best_within(rows, budget)")
    if scatter is not None:
        real("scatter", scatter, allowed="a relative spread >= 0 (run_scatter's), or None")
    if not scatter:
        return [top]
    return [r for r in measured(rows) if r["tokens_per_s"] >= top["tokens_per_s"] * (1 - scatter)]


# ---- the grid as a table ---------------------------------------------------------------------------

def table_rows(rows: list, budget_bytes: float | None = None) -> tuple:
    """(rows, unit): the grid fastest first, each row's ``label``, ``tokens_per_s``, ``memory`` in ``unit``
    ('MiB' or 'GiB', the larger the grid needs), ``fits`` the budget (None without one) -- or, for a point that
    did not run, its ``status`` (the figures None)."""
    rows = row_list("rows", rows)
    if budget_bytes is not None:
        real("budget_bytes", budget_bytes, strict=True, allowed="a number of bytes > 0, or None")
    unit, u = _unit(rows)
    out = []
    for r in sorted(rows, key=lambda r: -(r.get("tokens_per_s") or -1)):
        if r.get("status", "ok") != "ok":
            out.append({"label": r["label"], "status": r["status"], "tokens_per_s": None, "memory": None,
                        "fits": None})
            continue
        out.append({"label": r["label"], "status": None, "tokens_per_s": r["tokens_per_s"],
                    "memory": r["memory_bytes"] / unit,
                    "fits": None if budget_bytes is None else r["memory_bytes"] <= budget_bytes})
    return out, u


def fixed_digits(v, digits: int = 3) -> str:
    """``number(v, digits)`` with its trailing zeros kept ('1.70', not '1.7'): a column reads alike."""
    return number(v, digits, trailing_zeros=True)


def _unit(rows):
    top = max([r.get("memory_bytes") or 0 for r in rows] or [0])
    return (2**30, "GiB") if top >= 2**30 else (2**20, "MiB")


# ---- the chart ---------------------------------------------------------------------------------------

def _pareto_axes(ax, rows, budget_bytes, title, mark_best=True):
    """One grid's dots (colour: precision, marker: checkpointing, text: micro-batch), its front, the budget."""
    from ...tools.plots import FONT, TITLE  # deferred: matplotlib is optional; loaded only to draw

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
    labels = []
    for r in pts:  # the micro-batch beside each dot: with it the chart alone says which configuration a dot is
        below = r["checkpointing"] != "none"  # the front runs up through these dots: a label above sits on it
        labels.append(ax.annotate(f"mb={r['micro_batch']}", (r["memory_bytes"] / unit, r["tokens_per_s"]),
                                  fontsize=FONT, xytext=(5, -6) if below else (4, 3), textcoords="offset points",
                                  color="#333333", va="top" if below else "baseline"))
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
    _untangle(ax, labels)


def _untangle(ax, labels):
    """Two dots close together had their labels printed over each other ('mb=4mb=8'). Placed right to left, a
    label that runs into one already placed moves to the left of its dot, else to its other side vertically."""
    renderer = ax.figure.canvas.get_renderer()
    placed = []
    for t in sorted(labels, key=lambda t: -t.xy[0]):
        (dx, dy), va = t.xyann, t.get_va()
        flip = {"top": "baseline", "baseline": "top"}[va]
        for x, y, ha, v in ((dx, dy, "left", va), (-dx, dy, "right", va), (dx, -dy, "left", flip),
                            (-dx, -dy, "right", flip)):
            t.set_position((x, y))
            t.set_ha(ha)
            t.set_va(v)
            if not any(t.get_window_extent(renderer).overlaps(b) for b in placed):
                break
        else:  # nowhere free: where it was
            t.set_position((dx, dy))
            t.set_ha("left")
            t.set_va(va)
        placed.append(t.get_window_extent(renderer))


def pareto_chart(rows: list, budget_bytes: float | None, reference_rows: list | None = None,
                 reference_budget_bytes: float | None = None, device_name: str = "this device",
                 mark_best: bool = True):
    """Memory against throughput, the budget as a dashed line, the Pareto front joined -- for the
    learner's runs and, beside them, the GPU reference grid when one is shipped (one panel when not).
    ``mark_best=False`` leaves the best point within the budget unmarked (a chapter asks for it first)."""
    rows = row_list("rows", rows)
    if not measured(rows):
        raise ConfigError("rows", f"{len(rows)} rows, none measured", "at least one grid row that ran")
    for name, b in (("budget_bytes", budget_bytes), ("reference_budget_bytes", reference_budget_bytes)):
        if b is not None:
            real(name, b, strict=True, allowed="a number of bytes > 0, or None")
    _bool("mark_best", mark_best)
    from ...tools.plots import FONT, new_figure  # deferred: matplotlib is optional; loaded only to draw

    ref = measured(row_list("reference_rows", reference_rows or []))
    fig = new_figure(7.6, 3.8) if not ref else new_figure(9.4, 4.2)
    axes = [fig.add_subplot()] if not ref else list(fig.subplots(1, 2))
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


# ---- predicted on catalogue GPUs -----------------------------------------------------------------

def faster(base, new, than: str) -> str:
    """How a predicted time ``new`` compares with ``base``, "3.2× faster than {than}" / "1.4× slower than
    {than}" (predictions only); a ratio that rounds to 1 reads "about as fast as {than}", not "1× faster"."""
    words = predicted_speedup(base, new)
    return f"about as fast as {than}" if words.startswith("1× ") else f"{words} than {than}"


def _predict(config, device):
    from ...whatif import predict  # deferred: the what-if model loads its catalogue and probes on first use
    return predict(config, device=device)


def predicted_ms(cfgs: dict, gpus) -> dict:
    """{configuration: {gpu: predicted ms per update, or None where the GPU refuses its precision}}."""
    out = {}
    for name, c in cfgs.items():
        out[name] = {}
        for g in gpus:
            try:
                out[name][g] = _predict(c, g).step_time_s * 1000
            except ConfigError:  # e.g. bf16 on a T4: no bf16 unit, the prediction refuses rather than guesses
                out[name][g] = None
    return out


def predicted_table(ms: dict, cfgs: dict) -> list:
    """The predicted ms per update (configurations down, GPUs across) as table rows; a GPU without a unit for
    a configuration's precision refused to predict it, and the cell says so rather than leave a blank."""
    if not isinstance(ms, dict) or not ms or not all(name in cfgs for name in ms):
        raise ConfigError("ms", ms, "what predicted_ms returned, for configurations named in cfgs")
    gpus = list(next(iter(ms.values())))
    rows = [{"configuration": name, **{g: (fixed_digits(v) if v is not None else
                                           f"refused (no {cfgs[name].precision} unit)") for g, v in ms[name].items()}}
            for name in ms]
    return table(rows, [("configuration", "configuration", "{}")]
                 + [(g, f"{g}: predicted ms/update", "{}") for g in gpus])


def launch_bound(tiny_cfgs: dict, device: str = "h100-sxm") -> dict:
    """Why a tiny model tells GPUs apart so little, **predicted** on ``device``: the share of the fp32 step that
    is per-operation overhead (``share``), the operations bf16 adds (``extra_ops``: the casts, as CPU autocast
    inserts them -- the trace every prediction uses), and both predicted step times in seconds."""
    if not isinstance(tiny_cfgs, dict) or not {"fp32", "bf16"} <= set(tiny_cfgs):
        raise ConfigError("tiny_cfgs", tiny_cfgs, "{'fp32': Config, 'bf16': Config, ...}")
    p32, p16 = (_predict(tiny_cfgs[p], device) for p in ("fp32", "bf16"))
    return {"share": sum(g.overhead_s for g in p32.groups.values()) / p32.step_time_s,
            "extra_ops": sum(g.n_ops for g in p16.groups.values()) - sum(g.n_ops for g in p32.groups.values()),
            "fp32_s": p32.step_time_s, "bf16_s": p16.step_time_s}
