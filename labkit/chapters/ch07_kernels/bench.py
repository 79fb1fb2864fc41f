"""What chapter 07's sections share (argument checks, the interleaved timer, the GPU reference tables) and
its first sections: MFU against one knob, the matmul's shape and precision, the AdamW implementations."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...base.runtime import ConfigError
from ...base.numfmt import counted, number
from ...engine.config import Config, _choice, _int, _num  # its own checks
from ...engine.rules import check as config_check
from ...engine.device import LoadMeter, capabilities, intra_op_threads, torch_device
from ...engine.measure import median
from ...engine.model import GPT
from ...engine.precision import matmul_precision
from ...tools import timing
from ...tools.compare import verdict
from ...tools.memory import _config, _threads
from ...tools.sweep import sweep_rows
from .. import course
from ..course import bench_threads, reference_summaries

# ---- arguments: refused before any work, in Config's ConfigError style ------------------------------------

def _need_budget(budget_s, allow_none: bool = False, allow_zero: bool = False) -> None:
    if budget_s is None and allow_none:
        return
    _num("budget_s", budget_s, 0.0, 24 * 3600.0, lo_open=not allow_zero)  # NaN and inf are refused too


def _need_ints(name: str, values, lo: int, hi: int) -> list:
    """A non-empty list of distinct integers in [lo, hi] (a repeated value would merge two points into one)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError(name, values, f"a list of integers from {lo} to {hi}")
    values = list(values)
    if not values:
        raise ConfigError(name, values, f"at least one integer from {lo} to {hi}")
    for v in values:
        _int(name, v, lo, hi)
    if len(set(values)) != len(values):
        raise ConfigError(name, values, "each value once")
    return values


def interleaved(fns: dict, repeats: int = 10, warmup: int = 2, budget_s: float | None = None, device=None) -> dict:
    """Seconds per call of each function, A B C A B C ... (``tools.timing.interleaved``), each call timed with
    the device synchronised; ``warmup`` rounds dropped; with ``budget_s``, ends once 3 rounds are in and one
    more would overrun it. {name: [seconds, ...]}."""
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise ConfigError("fns", fns, "a non-empty dict {name: function taking no arguments}")
    _int("repeats", repeats, 1, 10**6)
    _int("warmup", warmup, 0, 10**6)
    _need_budget(budget_s, allow_none=True, allow_zero=True)  # 0: stop as soon as three rounds are in
    return timing.interleaved(fns, max_rounds=repeats, warmup_rounds=warmup, budget_s=budget_s, min_rounds=3,
                              timed_on=device or torch_device())


REFERENCE_SECTIONS = ("kernels", "precision", "best")  # the reference suite's sections chapter 07 reads


def plain(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` significant digits, no e-notation (0.00012): the course's one number format."""
    return number(x, digits)


def _pct(row: dict, key: str) -> float:
    """A row's MFU figure in percent (its median where the lowest/highest run is missing)."""
    v = row.get(key)
    return 100 * (v if v is not None else (row.get("mfu") or 0.0))


# ---- the GPU reference points of each section, as a table ---------------------------------------------------

def _mfu_rows() -> list:
    ref = reference_summaries("kernels/mfu-B1", "kernels/mfu-B4", "precision/bf16", "best/bf16-Bbig")
    return [{"point": f"{r['model']} bf16", "micro_batch": r["micro_batch"], "mfu": r["mfu"],
             "tokens_per_s": r["tokens_per_s"]} for r in sorted(ref.values(), key=lambda r: r["micro_batch"])]


def _compile_rows() -> list:
    out = []
    for p in course.reference_points("precision") + course.reference_points("best"):
        if p.get("id") in ("best/bf16-Bbig", "precision/bf16-compile") and p.get("status") == "ok":  # eager, compiled
            ps, recs = p["summary"], p.get("records") or []
            out.append({"point": p["id"], "compile": ps["compile"], "tokens_per_s": ps["tokens_per_s"], "mfu": ps["mfu"],
                        "first_s": recs[0]["step_time_s"] if ps.get("compile") and recs else None})
    return out


def _optimizer_rows() -> list:
    return [{"device": r["device_name"], "params_m": r["n_params"] / 1e6, "default": r["default"], "impl": impl,
             "ms": 1e3 * s} for r in reference_summaries("kernels/optimizer").values() for impl, s in r["median_s"].items()]


def _tf32_rows() -> list:
    out = [{"point": pid, "tokens_per_s": ps["tokens_per_s"], "mfu": ps["mfu"], "final_loss": ps["final_loss"]}
           for pid, ps in reference_summaries("precision/fp32", "precision/tf32").items()]
    out += [{"point": f"matmul {name}", "tflops": ps[name]["tflops"], "rel_error": ps[name]["rel_error"]}
            for ps in reference_summaries("kernels/tf32").values() for name in ("fp32", "tf32", "bf16")]
    return out


def _attention_rows() -> list:
    return [{"device": r["device_name"], "T": row["seq_len"], "backend": row["backend"], "ms": 1e3 * row["time_s"],
             "peak_mib": row["peak_bytes"] / 2**20}
            for r in reference_summaries("kernels/attention").values() for row in r["rows"] if "error" not in row]


_PCT, _TOKENS = (lambda v: f"{100 * v:.1f} %"), "{:,.0f}"
_TOPICS = {
    "mfu": (_mfu_rows, [("point", "GPU reference", "{}"), ("micro_batch", "micro-batch", "{}"), ("mfu", "MFU", _PCT),
                        ("tokens_per_s", "tokens/s", _TOKENS)]),
    "compile": (_compile_rows, [("point", "GPU reference", "{}"), ("compile", "compile", "{}"),
                                ("tokens_per_s", "tokens/s", _TOKENS), ("mfu", "MFU", _PCT),
                                ("first_s", "first update (with its compile), s", "{:.1f}")]),
    "optimizer": (_optimizer_rows, [("device", "GPU reference", "{}"), ("params_m", "M parameters", "{:.0f}"),
                                    ("default", "torch's default", "{}"), ("impl", "AdamW", "{}"), ("ms", "ms per step", "{:.2f}")]),
    "tf32": (_tf32_rows, [("point", "GPU reference", "{}"), ("tokens_per_s", "tokens/s", _TOKENS), ("mfu", "MFU", _PCT),
                          ("final_loss", "final loss", "{:.3f}"), ("tflops", "TFLOP/s", "{:.0f}"),
                          ("rel_error", "relative error", plain)]),
    "attention": (_attention_rows, [("device", "GPU reference", "{}"), ("T", "T", "{}"), ("backend", "backend", "{}"),
                                    ("ms", "ms", "{:.2f}"), ("peak_mib", "peak MiB", "{:.1f}")]),
}


def reference_rows(topic: str) -> list:
    """The rows of one section's GPU reference points ([] when none are shipped)."""
    if topic not in _TOPICS:
        raise ConfigError("topic", topic, f"one of {', '.join(_TOPICS)}")
    return _TOPICS[topic][0]()


def reference_table(topic: str):
    """One section's GPU reference points as a table, or None when none are shipped."""
    rows = reference_rows(topic)
    return course.table(rows, _TOPICS[topic][1]) if rows else None


# ---- MFU against one knob --------------------------------------------------------------------------------

def _sweep_configs(base, field_name: str, values, steps: int, repeats: int, n_threads) -> dict:
    """Every value's Config, built (and so validated) before the first run: {value: Config}."""
    _config(base, "base")
    fields = tuple(f for f in base.to_dict() if f not in ("steps", "threads"))  # those two the sweep sets itself
    _choice("field_name", field_name, fields)
    _int("steps", steps, 1, 10**6)
    _int("repeats", repeats, 1, 1000)
    _threads(n_threads)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError("values", values, f"a list of {field_name} values")
    values = list(values)
    if not values or len(set(map(repr, values))) != len(values):
        raise ConfigError("values", values, f"one or more {field_name} values, each once")
    return {v: base.replace(**{field_name: v, "steps": steps, "threads": n_threads}) for v in values}


def mfu_sweep(base: Config, field_name: str, values, steps: int = 4, n_threads: int | None = None,
              run_fn=None, repeats: int = 1, progress: bool = False) -> list:
    """Short runs at each value of ``field_name`` (micro_batch, d_model, ...), all else equal, ``repeats``
    rounds in alternating order (``tools.sweep.sweep_rows``, one row per value). On a CPU every run uses one
    thread count, so the knob is the only thing that moves."""
    kind = capabilities(base.device).kind if isinstance(base, Config) else None
    if kind == "cpu" and n_threads is None:
        n_threads = base.threads or bench_threads(kind)
    configs = _sweep_configs(base, field_name, values, steps, repeats, n_threads if kind == "cpu" else None)
    return sweep_rows(configs, field_name, repeats=repeats, run_fn=run_fn, progress=progress, threads=n_threads,
                      steps=steps)


def _rows_at(rows: list, value):
    return next((r for r in rows if r["value"] == value), None)


def sweep_split(rows: list) -> dict:
    """What a sweep's per-token split says from its smallest to its largest value: compute and optimizer µs
    per token at both ends, the optimizer's share, and where the saved time came from. ``verdict``: 'both',
    'optimizer_only' (compute per token did not fall), 'no_saving' or 'no_split' (a figure is missing)."""
    if not isinstance(rows, list) or not rows:
        raise ConfigError("rows", rows, "the rows of ch07.mfu_sweep")
    first, last = rows[0], rows[-1]
    c0, c1 = first.get("compute_us_per_token"), last.get("compute_us_per_token")
    o0, o1 = first.get("optimizer_us_per_token"), last.get("optimizer_us_per_token")
    pct = (lambda f: None if f is None else 100 * f)
    out = {"field": first["field"].replace("_", "-"), "low": first["value"], "high": last["value"],
           "compute_low": c0, "compute_high": c1, "optimizer_low": o0, "optimizer_high": o1,
           "opt_share_low_pct": pct(first.get("optimizer_frac")), "opt_share_high_pct": pct(last.get("optimizer_frac")),
           "saved_us": None, "from_compute_pct": None, "from_optimizer_pct": None}
    if None in (c0, c1, o0, o1):
        return {**out, "verdict": "no_split"}
    saved_c, saved_o = c0 - c1, o0 - o1
    saved = saved_c + saved_o
    out["saved_us"] = saved
    if saved <= 0:
        return {**out, "verdict": "no_saving"}
    out.update(from_compute_pct=100 * saved_c / saved, from_optimizer_pct=100 * saved_o / saved)
    return {**out, "verdict": "both" if saved_c > 0 else "optimizer_only"}


def busy(other_cores) -> bool | None:
    """Whether ``other_cores`` is busy (``LoadMeter.BUSY_CORES`` or more: the course's one threshold); None unread."""
    return None if other_cores is None else other_cores >= LoadMeter.BUSY_CORES


def same_config(summary: dict, load: dict | None, rows: list, value) -> dict | None:
    """The baseline run against the sweep's point at ``value``: both MFUs, the point's range, threads and load,
    and ``rows`` for a table. ``verdict``: 'within' (in the range), else by the load: 'no_load', 'load_changed'
    (one busy, one not), 'both_busy', 'quiet_below' (first-call costs) or 'quiet_above'. None when the sweep
    lacks the value or an MFU is missing."""
    row = _rows_at(rows, value)
    if row is None or summary.get("mfu") is None or row.get("mfu") is None:
        return None
    b, lo, hi = 100 * summary["mfu"], _pct(row, "mfu_low"), _pct(row, "mfu_high")
    lb, ls = (load or {}).get("other_cores"), row.get("other_cores")
    f = row["field"].replace("_", "-")
    out = {"field": f, "value": value, "baseline_mfu": b, "sweep_mfu": 100 * row["mfu"], "sweep_low": lo,
           "sweep_high": hi, "baseline_cores": lb, "sweep_cores": ls, "busy_cores": LoadMeter.BUSY_CORES,
           "same_threads": summary.get("intra_op_threads") == row.get("threads"),
           "rows": [{"measurement": "baseline run", "mfu": summary["mfu"], "low": None, "high": None, "runs": 1,
                     "updates": summary.get("timed_updates"), "threads": summary.get("intra_op_threads"),
                     "other_cores": lb, "busy": busy(lb)},
                    {"measurement": f"sweep, {f} {value}", "mfu": row["mfu"], "low": lo / 100, "high": hi / 100,
                     "runs": row.get("runs", 1), "updates": row.get("steps"), "threads": row.get("threads"),
                     "other_cores": ls, "busy": busy(ls)}]}
    if lo <= b <= hi:
        verdict = "within"
    elif lb is None or ls is None:
        verdict = "no_load"
    elif busy(lb) != busy(ls):
        verdict = "load_changed"
    elif busy(lb):
        verdict = "both_busy"
    else:
        verdict = "quiet_below" if b < lo else "quiet_above"
    return {**out, "verdict": verdict}


# Font sizes in points. Figures are drawn at 80 dpi and shown at their own width (720 px for 9 inches, inside
# JupyterLab's ~800-900 px output), so 9.5 pt is about 10.5 px on screen: the course's smallest readable text.
FS_SMALL, FS_LABEL, FS_TITLE = 9.5, 10, 11
DPI = 80


def _log_y(ax, values) -> None:
    """A log y axis with plain-number ticks (not only 10⁰ and 10¹)."""
    vals = [v for v in values if v and v > 0]
    ax.set_yscale("log")
    if not vals:
        return
    lo, hi = min(vals) / 1.25, max(vals) * 1.25  # a margin, so the end points do not sit on the frame
    ax.set_ylim(lo, hi)
    from ...tools.plots import log_ticks  # deferred: matplotlib is optional; loaded only to draw

    ticks = log_ticks(lo, hi)
    if len(ticks) < 2:  # a range narrower than 1-2-3: label its two ends (two significant digits)
        ticks = [float(f"{v:.2g}") for v in (lo * 1.1, hi / 1.1)]
    ax.set_yticks(ticks, [number(t, 6) for t in ticks])
    ax.yaxis.set_minor_formatter(_null_formatter())


def plot_sweeps(sweeps: dict, width: float = 9.0, height: float = 4.6):
    """One column per sweep ({title: mfu_sweep rows}): MFU with whiskers (lowest to highest run) and FLOPs
    per token against the knob; below, each token's time split into compute, optimizer and data wait."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=DPI)  # labkit's one figure maker, at this chapter's 80 dpi
    axes = fig.subplots(2, len(sweeps), squeeze=False)
    parts = (("compute", "compute", "#4c72b0"), ("optimizer", "optimizer", "#dd8452"),
             ("data_wait", "data wait", "#c44e52"))
    for col, (title, rows) in enumerate(sweeps.items()):
        ax, bx = axes[0][col], axes[1][col]
        xs = [r["value"] for r in rows]
        mfu = [_pct(r, "mfu") for r in rows]
        low = [m - _pct(r, "mfu_low") for m, r in zip(mfu, rows)]    # single runs: no whisker
        high = [_pct(r, "mfu_high") - m for m, r in zip(mfu, rows)]
        ax.errorbar(xs, mfu, yerr=[low, high], fmt="o-", color="#4c72b0", ecolor="#555555", capsize=3, label="MFU")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylabel("MFU (%)", fontsize=FS_LABEL, color="#4c72b0")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot(xs, [r["flops_per_token"] / 1e6 for r in rows], "s--", color="#999999", label="FLOPs per token")
        ax2.set_ylabel("model MFLOP per token", fontsize=FS_LABEL, color="#777777")
        ax2.set_ylim(bottom=0)
        runs = rows[0].get("runs", 1) if rows else 1
        ax.set_title(f"{title} (median of {counted(runs, 'run')})", fontsize=FS_TITLE)
        ax2.tick_params(labelsize=FS_SMALL)
        pos = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        for key, words, color in parts:
            vals = [r.get(f"{key}_us_per_token") or 0.0 for r in rows]
            bx.bar(pos, vals, bottom=bottom, color=color, label=words)
            bottom = [b + v for b, v in zip(bottom, vals)]
        bx.set_xticks(pos, [str(x) for x in xs])
        bx.set_xlabel(rows[0]["field"] if rows else "", fontsize=FS_LABEL)
        bx.set_ylabel("µs per token", fontsize=FS_LABEL)
        for a in (ax, bx):
            a.tick_params(labelsize=FS_SMALL)
    # one legend under the figure, not inside a panel: inside, it covers the tallest bar (micro-batch 1's)
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=FS_SMALL, loc="outside lower center", ncols=len(parts),
               title="each token's time (medians)", title_fontsize=FS_SMALL)
    return fig


def _null_formatter():
    from matplotlib.ticker import NullFormatter  # deferred: matplotlib is optional; loaded only to draw

    return NullFormatter()


# ---- the matmul's shape and precision --------------------------------------------------------------------


def head_step(vocab: int, tokens: int, d_model: int, device=None, dtype=torch.float32, seed: int = 0):
    """One training step of an LM head alone (logits = x·Wᵀ, cross-entropy, backward): the vocabulary is
    the matmul's N and the softmax's width."""
    _int("vocab", vocab, 2, 10**7)
    _int("tokens", tokens, 1, 10**7)
    _int("d_model", d_model, 1, 65536)
    dev = device or torch_device()
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, d_model, generator=g) * 0.02).to(dev, dtype).requires_grad_()
    w = (torch.randn(vocab, d_model, generator=g) * 0.02).to(dev, dtype).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g).to(dev)

    def step():
        loss = F.cross_entropy((x @ w.t()).float(), y)
        loss.backward()
        x.grad = w.grad = None

    return step


def compare_head_shapes(vocab_a: int, vocab_b: int, tokens: int, d_model: int, repeats: int = 15,
                        budget_s: float = 10.0, dtype=torch.float32, n_threads: int | None = None):
    """Interleaved head steps at two vocabulary sizes and the course's verdict on their times."""
    for name, v in (("vocab_a", vocab_a), ("vocab_b", vocab_b)):
        _int(name, v, 2, 10**7)
    _int("tokens", tokens, 1, 10**7)
    _int("d_model", d_model, 1, 65536)
    _int("repeats", repeats, 1, 10**6)
    _need_budget(budget_s)
    _threads(n_threads)
    dev = torch_device()
    with intra_op_threads(n_threads if n_threads is not None else bench_threads(dev.type)):
        fns = {"a": head_step(vocab_a, tokens, d_model, dev, dtype),
               "b": head_step(vocab_b, tokens, d_model, dev, dtype)}
        t = interleaved(fns, repeats=repeats, warmup=2, budget_s=budget_s, device=dev)
    return verdict(t["a"], t["b"], "step_time_s", label_a=f"vocabulary {vocab_a:,}", label_b=f"vocabulary {vocab_b:,}")


def padding_verdict(cmp, extra_flops_pct: float = 0.09) -> dict:
    """The padded-vocabulary comparison ``cmp`` (a = unpadded, b = padded) as a verdict that agrees with its
    sentence (resolved when the interval excludes 1, even below the threshold): 'few', 'padded_faster',
    'unpadded_faster', 'small_gain', 'small_cost', 'scattered' or 'within' (``bound_pct`` bounds the cost)."""
    out = {"extra_flops_pct": extra_flops_pct, "pct": None, "threshold_pct": 100 * cmp.threshold,
           "spread_pct": 100 * (cmp.spread or 0.0), "low": cmp.low, "high": cmp.high, "bound_pct": None}
    if cmp.ratio is None or not cmp.decided:
        return {**out, "verdict": "few"}
    out["pct"] = 100 * abs(cmp.ratio - 1)
    if cmp.better in ("a", "b"):
        return {**out, "verdict": "padded_faster" if cmp.better == "b" else "unpadded_faster"}
    if cmp.low > 1 or cmp.high < 1:  # resolved, but below the threshold the course counts as an effect
        return {**out, "verdict": "small_gain" if cmp.ratio < 1 else "small_cost"}
    if (cmp.spread or 0.0) > cmp.threshold:
        return {**out, "verdict": "scattered"}
    return {**out, "bound_pct": 100 * max(1 - cmp.low, cmp.high - 1), "verdict": "within"}


def tf32_refusal() -> str | None:
    """The engine's refusal of ``precision="tf32"`` here (what ``lk.run`` would say), or None."""
    try:
        config_check(Config(precision="tf32"))
    except ConfigError as e:
        return str(e)
    return None


def tf32_matmul(n: int = 4096, reps: int = 10) -> dict:
    """CUDA: an n×n matmul's TFLOP/s in fp32 (TF32 off), TF32 and bf16, and each one's relative error
    against fp64. Raises RuntimeError elsewhere (TF32 is a tensor-core mode)."""
    _int("n", n, 1, 1 << 16)
    _int("reps", reps, 1, 10**6)
    kind = capabilities("auto").kind
    if kind != "cuda":
        raise RuntimeError(f"TF32 needs NVIDIA tensor cores (Ampere or newer); this device is {kind}")
    dev = torch_device(kind)
    g = torch.Generator().manual_seed(0)
    a64, b64 = (torch.randn(n, n, generator=g, dtype=torch.float64) for _ in range(2))
    ref = (a64 @ b64).to(dev)
    a, b = a64.float().to(dev), b64.float().to(dev)
    out = {}
    for name, prec in (("fp32", "fp32"), ("tf32", "tf32"), ("bf16", "fp32")):
        x, y = (a.bfloat16(), b.bfloat16()) if name == "bf16" else (a, b)
        with matmul_precision(kind, prec):
            c = x @ y
            t = interleaved({name: lambda: x @ y}, repeats=reps, warmup=2, device=dev)[name]
        err = float((c.double() - ref).norm() / ref.norm())
        out[name] = {"tflops": 2 * n**3 / median(t) / 1e12, "rel_error": err, "seconds": median(t)}
    return {"n": n, **out}


# ---- fused, foreach and for-loop AdamW -------------------------------------------------------------------

ADAMW_IMPLS = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}


def fused_supported(kind: str | None = None) -> tuple:
    """(ok, error): whether ``AdamW(fused=True)`` steps on this device; ``error`` is torch's refusal."""
    kind = kind or capabilities("auto").kind
    dev = torch_device(kind)
    p = torch.nn.Parameter(torch.zeros(4, device=dev))
    p.grad = torch.ones(4, device=dev)
    try:
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
    except (RuntimeError, ValueError, NotImplementedError) as e:
        return False, str(e)[:160]
    return True, None


def default_adamw(params) -> str:
    """The implementation ``torch.optim.AdamW(params)`` picks by itself (torch's rule, asked, not assumed)."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach  # deferred: a private torch API, read only where it exists

        fused, foreach = _default_to_fused_or_foreach(list(params), False, False)
    except Exception:  # noqa: BLE001 -- a private helper: fall back to the documented rule
        foreach, fused = all(p.is_cuda for p in params), False
    return "fused" if fused else "foreach" if foreach else "for-loop"


def adamw_impls(kind: str | None = None) -> list:
    """The AdamW implementations to compare here: fused only where it is supported."""
    return ["for-loop", "foreach"] + (["fused"] if fused_supported(kind)[0] else [])


def optimizer_steps(config: Config, impls=None, repeats: int = 10, budget_s: float = 10.0,
                    n_threads: int | None = None) -> dict:
    """Seconds per AdamW ``step()`` over ``config``'s weights for each implementation, interleaved; each
    has its own copy of the weights and the same random gradients. {"times", "default", "n_params"}."""
    _config(config)
    for impl in impls or ():
        _choice("impls", impl, tuple(ADAMW_IMPLS))
    _int("repeats", repeats, 1, 10**6)
    _need_budget(budget_s)
    _threads(n_threads)
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    impls = list(impls or adamw_impls(kind))
    opts = {}
    with intra_op_threads(n_threads if n_threads is not None else (config.threads or bench_threads(kind))):
        for impl in impls:
            torch.manual_seed(config.seed)
            model = GPT(config.spec).to(dev)
            g = torch.Generator().manual_seed(1)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g).to(dev)
            opts[impl] = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01, **ADAMW_IMPLS[impl])
        default = default_adamw(list(next(iter(opts.values())).param_groups[0]["params"]))
        times = interleaved({k: o.step for k, o in opts.items()}, repeats=repeats, warmup=1, budget_s=budget_s,
                            device=dev)
    n = sum(p.numel() for p in next(iter(opts.values())).param_groups[0]["params"])
    return {"times": times, "default": default, "n_params": n}


def plot_optimizers(times: dict, width: float = 5.0, height: float = 2.4):
    """Every repeat of each AdamW implementation's step (ms), with its median."""
    from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

    fig = new_figure(width, height, dpi=DPI)  # labkit's one figure maker, at this chapter's 80 dpi
    ax = fig.add_subplot()
    for i, (impl, ts) in enumerate(times.items()):
        ax.plot([1e3 * t for t in ts], [i] * len(ts), "o", alpha=0.5, color="#4c72b0")
        ax.plot([1e3 * median(ts)], [i], "|", markersize=18, color="#222222")
    ax.set_yticks(range(len(times)), list(times), fontsize=FS_LABEL)
    ax.set_xlabel("ms per optimizer.step() (dots: repeats, bar: median)", fontsize=FS_LABEL)
    ax.set_xlim(left=0)
    ax.invert_yaxis()
    return fig
