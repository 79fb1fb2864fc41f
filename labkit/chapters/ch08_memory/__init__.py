"""Chapter 08's instruments -- memory in practice: activation bytes against the sequence length (measured
and by formula), attention recompute, the first two updates by hand (the step-2 peak); bytes per parameter
of three recipes and the CUDA caching allocator (``allocator``). On CUDA the allocator's numbers, on a CPU
labkit's dispatch tracer, storage by storage -- never estimated and shown as measured.

    rows = ch08.seq_sweep(config, [64, 128, 256]); steps = ch08.first_updates(config)"""
from __future__ import annotations

from ...base.paths import out_dir  # noqa: F401 -- ch08.out_dir(): where the allocator's snapshot goes
from ...engine.config import ATTENTION, Config, ConfigError, _choice, _int
from ...engine.device import capabilities, intra_op_threads, torch_device
from ...engine.measure import activation_bytes, count_flops
from ...engine.model import VOCAB
from ...tools.memory import (MIB, AllocatorPeak, _by_hand, _config, _forward_backward, _items, _rows,  # noqa: F401
                             _seq_lens, _size, _source, _step_peak, _threads, plot_timelines, trace_step)
from ..course import reference_summaries, table  # noqa: F401 -- ch08.reference_summaries, as the chapter calls it
from .allocator import (EXPECTED, PAGE_MIB, RECIPES, ROLE_COLORS, ROLE_WORDS, allocator_stats,  # noqa: F401
                        bpp_table, budget_beside_run, bytes_per_param, fragmentation_demo, fragmentation_demos,
                        fragmentation_patterns, fragmentation_table, fragmentation_verdicts, growth_pattern,
                        hole_pattern, plot_bytes_per_param, record_cuda_history, run_memory)

# ---- activation bytes against the sequence length -------------------------------------------------------

def activation_formula(n_layer: int, d_model: int, n_head: int, seq_len: int, batch: int, attention: str = "auto",
                       vocab: int = VOCAB, bytes_per_value: int = 4) -> dict:
    """Bytes the forward pass keeps for backward, part by part (fp32: 4 bytes a value).

    Per block and token, 16·d values (LayerNorm outputs, q/k/v, attention output, residuals, MLP
    up-projection and GELU output: chapter 04's trace) plus n_head (the fused kernel's log-sum-exp) plus
    4 (LayerNorm statistics). The math backend instead keeps the softmax probabilities, one T×T matrix per
    head, causal mask included: n_head·T values per token, less the log-sum-exp it does not need, so
    n_head·(T − 1) more than the fused kernel. Outside the blocks: the embedding sum and the final
    LayerNorm (2·d + 2) and the log-softmax of the logits (vocab)."""
    for name, v in (("n_layer", n_layer), ("d_model", d_model), ("n_head", n_head), ("seq_len", seq_len),
                    ("batch", batch), ("vocab", vocab)):
        _int(name, v, 1, 10**7)
    _int("bytes_per_value", bytes_per_value, 1, 8)
    _choice("attention", attention, ATTENTION)
    B, T, d, h, L = batch, seq_len, d_model, n_head, n_layer
    linear = L * B * T * (16 * d + h + 4) * bytes_per_value
    square = L * B * h * T * (T - 1) * bytes_per_value if attention == "math" else 0
    outside = B * T * (2 * d + 2 + vocab) * bytes_per_value
    return {"blocks_linear": linear, "attention_square": square, "outside": outside,
            "total": linear + square + outside}


def _sweep_args(base, seq_lens, batch, n_threads) -> tuple:
    """What both sweeps check before any work, and the device they measure on: (sequence lengths, device)."""
    _config(base, "base")
    lens = _seq_lens(seq_lens)
    _int("batch", batch, 1, 65536)
    _threads(n_threads)
    return lens, torch_device(capabilities(base.device).kind)


def seq_sweep(base: Config, seq_lens, attentions=("auto", "math"), batch: int = 2, n_threads: int | None = 1) -> list:
    """Activation bytes kept after one forward pass (the engine's own probe: live storages) at each sequence
    length and attention backend, beside the formula's parts. fp32 unless ``base`` says otherwise.

    ``batch`` >= 2 matches the formula exactly; with one sequence the math path's inputs have another
    layout, and it keeps scaled copies of q and k (2·d more values per token and block) as well."""
    lens, dev = _sweep_args(base, seq_lens, batch, n_threads)
    atts = _items("attentions", attentions, lambda n, v: _choice(n, v, ATTENTION))
    rows = []
    with intra_op_threads(n_threads):
        for T in lens:
            for att in atts:
                cfg = base.replace(seq_len=T, attention=att)
                measured, copies = activation_bytes(cfg, dev, batch=batch)
                s = cfg.spec
                f = activation_formula(s.n_layer, s.d_model, s.n_head, T, batch, att)
                rows.append({"seq_len": T, "attention": att, "batch": batch, "measured_bytes": measured,
                             "weight_copy_bytes": copies, **{f"formula_{k}": v for k, v in f.items()},
                             "ratio": measured / f["total"] if f["total"] else None})
    return rows


def attention_recompute_ready() -> tuple:
    """(ok, reason): whether the engine has Megatron-style attention recompute, checkpointing="attention"
    (reason: why not; "" when it has)."""
    try:
        Config(model="tiny", checkpointing="attention")
    except ConfigError as e:
        return False, (f"this labkit does not have checkpointing='attention' yet ({e}); the cell below runs once "
                       "the engine gains it")
    return True, ""


def attention_recompute(base: Config, seq_lens, batch: int = 2, n_threads: int | None = 1) -> list:
    """Under the math backend: activation bytes with and without checkpointing='attention', and the FLOPs
    the recompute adds (hardware over model FLOPs, counted), at each sequence length.

    ``core_flops_ratio`` is what rerunning the whole attention core would cost (4·T²·d per block and
    sequence: the scores and the product with V, counted like FlopCounterMode, non-causal). The count comes
    out lower: PyTorch's non-reentrant checkpoint stops recomputing once it has rebuilt the last tensor
    backward needs (softmax's output), so the product with V is never rerun."""
    lens, dev = _sweep_args(base, seq_lens, batch, n_threads)
    rows = []
    with intra_op_threads(n_threads):
        for T in lens:
            plain = base.replace(seq_len=T, attention="math", checkpointing="none")
            recomp = plain.replace(checkpointing="attention")
            a0, _ = activation_bytes(plain, dev, batch=batch)
            a1, _ = activation_bytes(recomp, dev, batch=batch)
            model_f = count_flops(plain.spec)
            hw_f = count_flops(recomp.spec, "attention", recomp.checkpoint_every)
            s = plain.spec
            core = s.n_layer * 4 * T * T * s.d_model  # the attention core's forward, one sequence
            rows.append({"seq_len": T, "bytes_none": a0, "bytes_attention": a1, "saved_frac": 1 - a1 / a0,
                         "flops_ratio": hw_f / model_f, "core_flops_ratio": 1 + core / model_f})
    return rows


# ---- what the chapter's cells draw from these measurements (rows and figures; the words are the chapter's) ----

def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB"


def seq_table(rows: list) -> list:
    """``seq_sweep``'s rows as a table: measured bytes beside the formula, and the formula's T×T part."""
    return table(_rows(rows, "seq_len"), [
        ("seq_len", "T", "{}"), ("attention", "attention", "{}"), ("measured_bytes", "measured", _mib),
        ("formula_total", "formula", _mib), ("ratio", "measured ÷ formula", "{:.3f}"),
        ("formula_attention_square", "of it T×T (formula)", _mib)])


def _longest(rows: list) -> tuple:
    """(math row, fused row) at the longest T of a sweep."""
    t_max = max(r["seq_len"] for r in rows)
    return tuple(next(r for r in rows if r["seq_len"] == t_max and r["attention"] == a) for a in ("math", "auto"))


def square_share(rows: list) -> float:
    """The share of the math backend's bytes at the longest T that the fused kernel does not keep: the T×T part."""
    m, f = _longest(_rows(rows, "seq_len"))
    return (m["measured_bytes"] - f["measured_bytes"]) / m["measured_bytes"]


def seq_summary(base: Config, rows: list) -> dict:
    """The sweep's figures at its longest T: ``ratio`` (math ÷ fused bytes), ``share_pct`` (the T×T part, in %),
    ``worst_pct`` (the formula's largest miss over every row, in %) and ``crossover`` (the T at which, per block,
    the T² part overtakes the linear part: n_head·(T − 1) = 16·d + 4), with the model's width and head count."""
    _config(base, "base")
    m, f = _longest(_rows(rows, "seq_len"))
    spec = base.spec
    return {"model": base.model, "d": spec.d_model, "heads": spec.n_head, "t_max": m["seq_len"],
            "ratio": m["measured_bytes"] / f["measured_bytes"], "share_pct": 100 * square_share(rows),
            "worst_pct": 100 * max(abs(r["ratio"] - 1) for r in rows),
            "crossover": round((16 * spec.d_model + 4) / spec.n_head + 1)}


def reference_rows(refs: dict) -> list:
    """GPU reference runs ({id: summary}) as table rows: micro-batch, activations and peak in GiB, tokens/s."""
    if not isinstance(refs, dict):
        raise ConfigError("refs", type(refs).__name__, "{id: summary} from ch08.reference_summaries")
    rows = [{"id": k, **v} for k, v in sorted(refs.items(), key=lambda kv: (kv[1].get("seq_len", 0), kv[0]))]
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    return table(rows, [("id", "GPU reference run", "{}"), ("micro_batch", "micro-batch", "{}"),
                        ("activation_bytes", "activations", gib), ("peak_mem_bytes", "peak", gib),
                        ("tokens_per_s", "tokens/s", "{:,.0f}")])


def recompute_table(rec: list) -> list:
    """``attention_recompute``'s rows as a table: bytes with and without, the share saved, the FLOPs ratio."""
    return table(_rows(rec, "bytes_none"), [
        ("seq_len", "T", "{}"), ("bytes_none", "activations, math", _mib),
        ("bytes_attention", "with attention recompute", _mib), ("saved_frac", "saved", "{:.0%}"),
        ("flops_ratio", "hardware ÷ model FLOPs", "{:.3f}")])


def recompute_summary(rec: list) -> dict:
    """The trade at the shortest and longest T (saved %, extra FLOPs %) and, at the longest, what rerunning the
    whole core would add (``core_pct``) against what was counted (``counted_pct``) and their ratio."""
    lo, hi = _rows(rec, "bytes_none")[0], rec[-1]
    core, counted = hi["core_flops_ratio"] - 1, hi["flops_ratio"] - 1
    return {"t_lo": lo["seq_len"], "saved_lo": 100 * lo["saved_frac"], "flops_lo": 100 * (lo["flops_ratio"] - 1),
            "t_hi": hi["seq_len"], "saved_hi": 100 * hi["saved_frac"], "flops_hi": 100 * counted,
            "core_pct": 100 * core, "of_core": counted / core if core else 0.0}


def plot_seq_sweep(rows, width: float = 6.0, height: float = 3.0):
    """Measured activation bytes against T (dots) and the formula (lines), one colour per backend, on linear
    axes so that the math backend's T² term shows as a bend."""
    rows = _rows(rows, "measured_bytes")
    _size(width, height)
    from ...tools.plots import FONT as font, new_figure  # deferred: matplotlib is heavy; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    colors = {"auto": "#4c72b0", "math": "#c44e52", "flash": "#4c72b0"}
    for att in dict.fromkeys(r["attention"] for r in rows):
        pts = [r for r in rows if r["attention"] == att]
        xs = [r["seq_len"] for r in pts]
        ax.plot(xs, [r["measured_bytes"] / MIB for r in pts], "o", color=colors.get(att, "#555555"),
                label=f"{att}: measured")
        ax.plot(xs, [r["formula_total"] / MIB for r in pts], "-", color=colors.get(att, "#555555"), lw=1,
                label=f"{att}: formula")
    lens = sorted({r["seq_len"] for r in rows})
    ax.set_xticks(lens, [str(t) for t in lens])  # linear axes: a straight line is linear in T, a bend is T²
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("sequence length T", fontsize=font)
    ax.set_ylabel("activation MiB kept for backward", fontsize=font)
    ax.tick_params(labelsize=font)
    ax.legend(fontsize=font)
    return fig


# ---- the first two updates, by hand: where AdamW's state appears (the step-2 peak) --------------------

def first_updates(config: Config, updates: int = 2, n_threads: int | None = 1) -> dict:
    """Train ``updates`` updates of ``config`` by hand and record, after each phase, the bytes of the
    weights, gradients, optimizer state and activations, and each update's peak.

    The optimizer's state is created inside the first ``step()``: the second update's forward and
    backward run with it already in memory, so its peak is higher by that much. CUDA: the allocator's
    numbers; CPU: counted storage by storage."""
    _config(config)
    _int("updates", updates, 1, 100)
    _threads(n_threads)
    moments, peaks, where = [], {}, {}
    with intra_op_threads(n_threads):
        kind, dev, model, opt, batches, c = _by_hand(config)

        def moment(label, activations=0):
            moments.append({"moment": label, "weights": c.weights(), "grads": c.grads(), "optimizer": c.optimizer(),
                            "activations": activations, "allocated": c.allocated()})

        moment("model built")
        for u in range(1, updates + 1):
            x, y = (t.to(dev) for t in next(batches))
            start = {"weights": c.weights(), "grads": c.grads(), "optimizer": c.optimizer()}  # forward starts with
            acts, fb_peak = _forward_backward(model, x, y, kind, config.precision, dev)
            moments.append({"moment": f"update {u}: forward done", **start, "activations": acts, "allocated": None})
            moment(f"update {u}: backward done")
            held = c.held()  # what the optimizer step starts with
            opt_peak = _step_peak(opt, model, dev)
            moment(f"update {u}: optimizer step done")
            opt.zero_grad(set_to_none=True)  # once per update, as the engine does
            moments[-1]["grads"] = c.grads()
            # the update's peak is in its forward/backward or in its optimizer step: say which
            fb, step = sum(start.values()) + fb_peak, held + opt_peak
            peaks[f"update {u}"] = max(fb, step)
            where[f"update {u}"] = {"forward and backward": fb, "optimizer step": step}
    n = sum(p.numel() for p in model.parameters())
    del model, opt
    return {"moments": moments, "peaks": peaks, "peak_phases": where, "n_params": n, "device": kind,
            "source": _source(kind)}


def _first_updates_result(result, need: int = 2) -> dict:
    peaks = result.get("peaks") if isinstance(result, dict) else None
    if not isinstance(peaks, dict) or any(f"update {u}" not in peaks for u in range(1, need + 1)):
        raise ConfigError("result", type(result).__name__, f"the dict ch08.first_updates returned, with at least "
                                                           f"{need} updates")
    return result


def update_peaks(result: dict) -> tuple:
    """(peak of update 1, peak of update 2, the difference) from ``first_updates``."""
    _first_updates_result(result)
    p1, p2 = result["peaks"]["update 1"], result["peaks"]["update 2"]
    return p1, p2, p2 - p1


def peak_phase(result: dict, update: int) -> str:
    """Where update ``update``'s peak was: 'forward and backward' or 'optimizer step'."""
    _first_updates_result(result, need=1)
    _int("update", update, 1, len(result["peaks"]))
    parts = result["peak_phases"][f"update {update}"]
    return max(parts, key=parts.get)


# ---- what the chapter's cells draw from first_updates (rows and figures; the words are the chapter's) ------

def _mib1(b) -> str:
    return f"{b / 2**20:.1f} MiB"


def peaks_table(result: dict) -> list:
    """Each update's peak and where it was (forward and backward, or the optimizer step), as a table --
    without the roles' bytes, so it can stand above an exercise that asks for AdamW's state."""
    _first_updates_result(result, need=1)
    rows = [{"update": u, "peak": p, "where": peak_phase(result, int(u.split()[-1]))}
            for u, p in result["peaks"].items()]
    return table(rows, [("update", "update", "{}"), ("peak", "peak", _mib1), ("where", "the peak was in its", "{}")])


def moments_table(result: dict) -> list:
    """The bytes of each role (weights, gradients, AdamW's state, activations) after each phase, as a table."""
    _first_updates_result(result, need=1)
    return table(result["moments"], [("moment", "moment", "{}"), ("weights", "weights", _mib1),
                                     ("grads", "gradients", _mib1), ("optimizer", "AdamW state", _mib1),
                                     ("activations", "activations", _mib1)])


def step2_figures(result: dict) -> dict:
    """The step-2 story's figures (MiB, and the difference as a share of AdamW's state), the state in bytes and
    per parameter, and its ``verdict`` from where each peak was: "both_in_backward", "step_then_backward"
    (update 1's in its optimizer step, update 2's in forward and backward) or "step_sets_peak"."""
    mib = 2**20
    p1, p2, extra = update_peaks(result)
    state = result["moments"][-1]["optimizer"]
    w1, w2 = peak_phase(result, 1), peak_phase(result, 2)
    verdict = ("both_in_backward" if w1 == w2 == "forward and backward" else
               "step_then_backward" if (w1, w2) == ("optimizer step", "forward and backward") else "step_sets_peak")
    below = p1 - result["peak_phases"]["update 1"]["forward and backward"]
    return {"verdict": verdict, "p1": p1 / mib, "p2": p2 / mib, "extra": extra / mib, "state": state / mib,
            "share_pct": 100 * extra / state if state else 0.0, "below": below / mib,
            "grads": max(m["grads"] for m in result["moments"]) / mib, "state_bytes": state,
            "n_params": result["n_params"], "per_param": state / result["n_params"], "device": result["device"]}


def step2_reference_rows(refs: dict) -> list:
    """The GPU reference runs of the step-2 section ({id: summary}) as table rows: each update's peak, from the
    allocator."""
    if not isinstance(refs, dict):
        raise ConfigError("refs", type(refs).__name__, "{id: summary} from ch08.reference_summaries")
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    rows = [{"gpu": r["device_name"], "model": r["config"]["model"], "params": r["n_params"] / 1e6,
             "p1": r["peaks"]["update 1"], "p2": r["peaks"]["update 2"],
             "extra": r["peaks"]["update 2"] - r["peaks"]["update 1"]} for r in refs.values()]
    return table(rows, [("gpu", "GPU reference", "{}"), ("model", "model (fp32)", "{}"),
                        ("params", "parameters", "{:.0f} M"), ("p1", "peak, update 1", gib),
                        ("p2", "peak, update 2", gib), ("extra", "difference", gib)])


def plot_first_updates(result: dict, width: float = 9.0, height: float = 3.4):
    """Stacked bytes by role after each phase of the first updates, with each update's peak as a line."""
    _first_updates_result(result, need=1)
    _size(width, height)
    from ...tools.plots import FONT as font, TITLE as title, new_figure  # deferred: matplotlib is heavy; loaded to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    ms = result["moments"]
    bottom = [0.0] * len(ms)
    for role in ("weights", "optimizer", "grads", "activations"):
        vals = [m[role] / MIB for m in ms]
        ax.bar(range(len(ms)), vals, bottom=bottom, color=ROLE_COLORS[role], label=ROLE_WORDS[role])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for name, peak in result["peaks"].items():
        idx = [j for j, m in enumerate(ms) if m["moment"].startswith(name + ":")]
        if idx:
            ax.hlines(peak / MIB, idx[0] - 0.4, idx[-1] + 0.4, colors="#222222", linestyles="--", lw=1)
            ax.text(idx[0] - 0.4, peak / MIB, f" peak of {name}", fontsize=font, va="bottom")
    # two lines a tick ("update 1" / "forward done"): the labels stay apart at the chart's width
    ax.set_xticks(range(len(ms)), [m["moment"].replace(": ", "\n").replace("optimizer step", "step")
                                   for m in ms], fontsize=font)
    ax.set_ylabel("MiB", fontsize=font)
    ax.tick_params(axis="y", labelsize=font)
    ax.set_ylim(0, max(result["peaks"].values()) / MIB * 1.25)
    ax.legend(fontsize=font, loc="upper left", ncols=4)
    ax.set_title(f"held bytes by role ({result['source']})", fontsize=title)
    return fig
