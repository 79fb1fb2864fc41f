"""Chapter 04's instruments: what autograd keeps for backward, op by op, and how held memory moves through
one step, in every checkpointing mode -- tables, figures and the figures its sentences quote. A trace
(``trace_step``, ``labkit.tools.memory``) is labkit's dispatch tracer (``engine.tracer``): every storage an op
creates is held until freed, so what is alive when forward ends is what backward needs -- what autograd
saved plus what a checkpoint policy kept. Parameters are not counted; autocast's weight copies are, apart.

    trace = ch04.trace_step(config); trace.kept(); trace.block_bytes()
    ch04.plot_timelines({"none": t1, "full": t2})"""
from __future__ import annotations

import statistics

from ..engine.model import GPT
# the tracer and the formula are the engine's; chapter 04 compares the formula with the trace
from ..engine.measure import block_bytes_formula  # noqa: F401
from ..engine.tracer import CATEGORIES, Trace, Tracer  # noqa: F401
from ..tools.memory import COLORS, describe, plot_timelines, trace_model, trace_step  # noqa: F401
from .course import UNDER_LOAD, reference_points


def size(b: float) -> str:
    """'1.50 MiB' -- bytes in the largest binary unit they fill (a table column's format)."""
    for unit, n in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= n:
            return f"{b / n:.2f} {unit}"
    return f"{int(b)} B"


def kept_rows(trace: Trace, module_prefix: str | None = None, limit: int | None = None) -> list:
    """What the forward pass keeps (optionally one module's rows only), one row per storage: ``n``, ``module``,
    ``op`` (with ``weight_copy`` for autocast's copies), ``shape``, ``dtype``, ``bytes``; the last row is the
    total (``module`` 'total', ``bytes`` the sum of every matching row)."""
    rows = [r for r in trace.kept(include_weight_copies=True)
            if module_prefix is None or r["module"] == module_prefix or r["module"].startswith(module_prefix + ".")]
    shown = [dict(n=i + 1, module=r["module"] or "(top)", op=r["op"], weight_copy=r["weight_copy"],
                  shape=list(r["shape"]), dtype=r["dtype"], bytes=r["bytes"])
             for i, r in enumerate(rows[:limit] if limit else rows)]
    return shown + [dict(n=None, module="total", op=None, weight_copy=False, shape=None, dtype=None,
                         bytes=sum(r["bytes"] for r in rows))]


# what the cost relative to none measures, per comparison metric (the chart's y axis)
_COST_WORDS = {"cpu_s_per_update": "CPU-s per update", "tokens_per_s": "time per update"}


# ---- chapter 04's results: rows and figures (the cells draw the tables and hold the words) --------------

def part_rows(trace: Trace) -> list:
    """What the forward pass keeps, by part of the model ('embedding', 'block 0', ..., 'head and loss'), and
    the whole (part 'all'): rows of ``part`` and ``bytes``."""
    return [*(dict(part=k, bytes=b) for k, b in trace.by_module().items()), dict(part="all", bytes=trace.kept_bytes())]


def counted_figures(cmp) -> dict:
    """A none-against-full comparison's counted figures (the same in every repeat): activation MiB of each
    arm, the per cent full keeps, and full's hardware FLOPs over the model's."""
    a_none, a_full = cmp.exact["activation_bytes"]
    hw, needed = cmp.exact["hardware_flops_per_step"][1], cmp.exact["model_flops_per_step"][1]
    return dict(none_mib=a_none / 2**20, full_mib=a_full / 2**20, kept_pct=100 * a_full / a_none,
                flops_ratio=hw / needed)


def peak_from(source: str) -> str:
    """Where the peak MFU divides by came from, as a key: 'datasheet', 'probe', or 'probe_loaded' (the probe ran
    while other programs used the cores: it reads low, so MFU and HFU read high)."""
    if not source.startswith("measured"):
        return "datasheet"
    return "probe_loaded" if UNDER_LOAD in source else "probe"


def utilization_rows(runs: dict) -> list:
    """MFU and HFU per option, medians over its repeats (``runs``: option -> results), with the number of runs,
    the peak's ``source`` and where it came from (``peak_from``)."""
    rows = []
    for mode, rs in runs.items():
        mfu, hfu = (statistics.median(r.summary[k] for r in rs) for k in ("mfu", "hfu"))
        source = str(rs[0].summary["peak_flops_source"])
        rows.append(dict(option=mode, mfu=mfu, hfu=hfu, ratio=hfu / mfu, runs=len(rs), source=source,
                         peak_from=peak_from(source)))
    return rows


def options_rows(repeats: dict) -> list:
    """One row per checkpointing option (``repeats``: option -> its runs): counted activation bytes and FLOPs,
    and the median step time of the repeats -- what chapter 04's options table shows and the budget exercise
    reads."""
    rows = []
    for name, rs in repeats.items():
        s = rs[0].summary
        rows.append(dict(name=name, activation_bytes=s["activation_bytes"],
                         step_time_s=statistics.median(r.summary["step_time_s"] for r in rs),
                         hardware_flops=s["hardware_flops_per_step"],
                         flops_ratio=s["hardware_flops_per_step"] / s["model_flops_per_step"]))
    return rows


def relative_cost(cmp, metric: str) -> tuple:
    """(cost, low, high) of an option relative to none from its comparison with none, the 95 % interval
    included: CPU-seconds per update ÷ none's, or time per update (1 / throughput) ÷ none's. None's own
    (``cmp`` None) is 1 by definition."""
    if cmp is None:
        return 1.0, 1.0, 1.0
    if metric == "cpu_s_per_update":
        return cmp.ratio, cmp.low, cmp.high
    return 1 / cmp.ratio, 1 / cmp.high, 1 / cmp.low


def options_axes(rows: list, cmps: dict, metric: str):
    """The memory-against-time axes for ``rows`` (options_rows), labelled, scaled and with each option's
    name at its point; the chapter draws the points with their intervals itself."""
    from ..tools.plots import FONT, TITLE, new_figure  # deferred: matplotlib is optional; loaded only to draw

    ax = new_figure(5.5, 3.0).add_subplot(1, 1, 1)
    ax.set_prop_cycle(color=[COLORS["forward"]])  # one colour: the names tell the options apart
    costs = {r["name"]: relative_cost(cmps.get(r["name"]), metric) for r in rows}
    for r in rows:
        ax.annotate(r["name"], (r["activation_bytes"] / 2**20, costs[r["name"]][0]), fontsize=FONT, xytext=(4, 4),
                    textcoords="offset points")
    ax.axhline(1.0, color="#999999", lw=0.8, ls=":")
    ax.set_xlabel("activation memory (MiB, counted)", fontsize=FONT)
    ax.set_ylabel(f"{_COST_WORDS[metric]} ÷ none's", fontsize=FONT)
    ax.set_title("Memory against time: lower left is better (bars: 95 % intervals)", fontsize=TITLE)
    ax.set_xlim(0, max(r["activation_bytes"] for r in rows) / 2**20 * 1.2)
    ax.set_ylim(0, max(hi for _, _, hi in costs.values()) * 1.2)
    return ax


def _references(sections: tuple, row, keep=lambda p: True) -> list:
    """The sections' GPU reference points as rows (``row(point)``) -- [] when none are shipped: the chapter's
    first cell has said so once for every section."""
    return [row(p) for s in sections for p in reference_points(s) if keep(p)]


def oom_reading(outcome: dict) -> dict:
    """What the out-of-memory cell did (``outcome``: mode -> 'fits' or 'out of memory'; {} where skipped):
    ``verdict`` 'skipped', 'all_fit', 'recovered' (a later run fitted the same budget, named ``after``) or
    'none_after'; ``failed`` the first mode that ran out of memory, ``fit`` the modes that fitted."""
    failed = [m for m, o in outcome.items() if o != "fits"]
    fit = [m for m, o in outcome.items() if o == "fits"]
    if not outcome or not failed:
        return dict(verdict="all_fit" if outcome else "skipped", failed=None, after=None, fit=", ".join(fit))
    after = [m for m in fit if list(outcome).index(m) > list(outcome).index(failed[0])]
    return dict(verdict="recovered" if after else "none_after", failed=failed[0], after=after[0] if after else None,
                fit=", ".join(fit))


def checkpointing_references() -> list:
    """The shipped GPU reference runs of checkpointing (bf16, not compiled), one row each: ``label``,
    ``step_ms`` per update, ``activation_gib``, ``hfu_over_mfu``."""
    def row(p):
        s = p["summary"]
        return dict(label=p.get("label"), step_ms=1e3 * s["step_time_s"], activation_gib=s["activation_bytes"] / 2**30,
                    hfu_over_mfu=s["hfu"] / s["mfu"])

    def keep(p):
        s = p.get("summary") or {}
        return p.get("status") == "ok" and s.get("precision") == "bf16" and not s.get("compile")
    return _references(("checkpointing", "precision"), row, keep)


def budget_references() -> list:
    """The shipped GPU reference runs under a memory budget, one row each: ``label``, ``status``, ``peak_gib``
    (None where the run recorded no peak)."""
    def row(p):
        s = p.get("summary") or {}
        peak = s["peak_mem_bytes"] / 2**30 if s.get("peak_mem_bytes") else None
        return dict(label=p.get("label") or p["id"], status=p["status"], peak_gib=peak)
    return _references(("memory_budget",), row)


def oom_budget(config, micro_batch: int, device) -> tuple:
    """(budget in GiB, its figures): room for ``config``'s training state and half the activations of
    ``micro_batch`` sequences without checkpointing, plus 0.5 GiB for the CUDA context's own use."""
    from ..engine.measure import activation_bytes  # deferred: the probe is needed on a GPU only

    per_sample, _ = activation_bytes(config, device, batch=1)
    n_params = sum(p.numel() for p in GPT(config.spec).parameters())
    static = 16 * n_params  # fp32 weights, gradients and AdamW's two moments
    budget_gb = (static + 0.5 * micro_batch * per_sample) / 2**30 + 0.5
    return budget_gb, dict(micro_batch=micro_batch, activations_gib=micro_batch * per_sample / 2**30,
                           state_gib=static / 2**30, budget_gib=budget_gb)


def plot_attention_sweep(kept: dict, seq_lens: list, modes: dict, backends: dict):
    """One panel per attention backend: the activation bytes each checkpointing mode keeps (``kept``:
    (backend, mode, T) -> bytes) against the sequence length."""
    from ..tools.plots import FONT, TITLE, new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(9.0, 3.2)
    for ax, (backend, title) in zip(fig.subplots(1, 2, sharey=True), backends.items()):
        for (mode, label), style in zip(modes.items(), ("o-", "x--", "s-.", "^:")):  # none stays visible under others
            ax.plot(seq_lens, [kept[backend, mode, T] / 2**20 for T in seq_lens], style, label=label, lw=1.5, ms=5)
        ax.set_xticks(seq_lens)  # a linear axis: what grows with T is straight, what grows with T² bends upwards
        ax.set_xlabel("sequence length T", fontsize=FONT)
        ax.set_title(title, fontsize=TITLE)
    fig.axes[0].set_ylabel("activation memory (MiB, counted)", fontsize=FONT)
    fig.axes[0].legend(fontsize=FONT - 1)
    return fig


def attention_sweep_figures(kept: dict, seq_lens: list, recompute: dict) -> dict:
    """What the sweep's counts show, for chapter 04's words: the per cent of none's bytes that attention
    recomputation and the SAC policy keep under each backend at the shortest (``lo``) and the longest (``hi``)
    sequence (``math_attention_lo`` ...), the per cent only the math backend keeps (``tt_share_pct``), what
    attention recomputation drops from the fused kernel (``dropped_kib``), the recompute each costs in per cent
    of the FLOPs (``recompute``: mode -> extra hardware FLOPs, counted), and which keeps less under the math
    backend (``less``: 'sac', 'attention' or 'split'; ``sac_at`` and ``attention_at``: the T of each)."""
    lo, hi = seq_lens[0], seq_lens[-1]

    def keep(backend, mode, T):  # the share of none's activation bytes that ``mode`` keeps
        return kept[backend, mode, T] / kept[backend, "none", T]

    sac = [T for T in seq_lens if kept["math", "selective", T] < kept["math", "attention", T]]
    attn = [T for T in seq_lens if T not in sac]
    modes = (("math", "attention"), ("math", "selective"), ("auto", "attention"))
    pct = {f"{b}_{m}_{end}": 100 * keep(b, m, T) for b, m in modes for end, T in (("lo", lo), ("hi", hi))}
    return dict(lo=lo, hi=hi, **pct, tt_share_pct=100 * (1 - kept["auto", "none", hi] / kept["math", "none", hi]),
                dropped_kib=(kept["auto", "none", hi] - kept["auto", "attention", hi]) / 2**10,
                recompute_attention_pct=100 * recompute["attention"], recompute_full_pct=100 * recompute["full"],
                less="split" if sac and attn else "sac" if sac else "attention",
                sac_at=", ".join(map(str, sac)), attention_at=", ".join(map(str, attn)))
