"""Chapter 03's instruments: one update's peak against the accumulation steps K, trained by hand (the
first-updates machinery chapter 08 shares, ``labkit.tools.memory``), which case its numbers are in, and its figure.

    peak = ch03.update_peak(config.replace(accum=4))   # one update's peak, K micro-batches
    by_k, by_mb = ch03.accumulation_peaks(config)      # the effective batch grown two ways
    ch03.accumulation_reading(by_k)                    # which case holds: chapter 03 words it
"""
from __future__ import annotations

from ..base import phrases
from ..engine.config import Config, ConfigError, _int
from ..engine.device import intra_op_threads
from ..tools.memory import MIB, _by_hand, _config, _forward_backward, _items, _size, _source, _step_peak, _threads

# the chart's and the progress line's words: notebooks/lab_messages.md, "## Chapter 03: one update's peak"
WORDS = phrases.load_section("lab_messages.md", "Chapter 03: one update's peak", {
    "progress": (), "raise-k": (), "raise-mb": (), "k-line": ("k",), "x-label": (), "y-label": (),
    "title": ("source",), "source-cuda": (), "source-tracer": ()})


def update_peak(config: Config, updates: int = 2, n_threads: int | None = 1) -> dict:
    """The peak bytes of one update of ``config`` (K = ``config.accum`` micro-batches, loss / K, one step,
    ``zero_grad(set_to_none=True)``), trained by hand; the last of ``updates`` is reported (AdamW's state
    exists from the second). Why K matters: micro-batch 1's forward runs with no ``.grad`` alive, 2..K with
    every gradient alive -- so from K = 1 to 2 the peak can rise by up to the gradients' bytes, then not at all."""
    _config(config)
    _int("updates", updates, 1, 100)
    _threads(n_threads)
    K = config.accum
    with intra_op_threads(n_threads):
        kind, dev, model, opt, batches, c = _by_hand(config)
        for _ in range(updates):
            micro = []
            for _k in range(K):
                x, y = (t.to(dev) for t in next(batches))
                held = c.held()  # the gradients of micro-batches 1..k-1 are alive from k = 2 on
                micro.append(held + _forward_backward(model, x, y, kind, config.precision, dev, scale=1 / K)[1])
            grads = c.grads()
            step = c.held() + _step_peak(opt, model, dev)
            opt.zero_grad(set_to_none=True)
    out = {"accum": K, "micro_batch": config.micro_batch, "peak": max(micro + [step]), "micro_peaks": micro,
           "step_peak": step, "phase": "optimizer step" if step > max(micro) else "forward and backward",
           "grads": grads, "weights": c.weights(), "optimizer": c.optimizer(), "device": kind, "source": _source(kind)}
    del model, opt, c
    return out


def accumulation_peaks(base: Config, factors=(1, 2, 4), n_threads: int | None = 1) -> tuple:
    """(by_k, by_mb): ``update_peak`` at K = each factor (``base``'s micro-batch, K = 1 in ``base``) and at
    each factor × the micro-batch (K = 1), keyed by factor -- the effective batch grown two ways -- with a
    progress line."""
    from ..base.frontend import Progress  # deferred: a notebook-only display

    _config(base, "base")
    fs = _items("factors", factors, lambda n, v: _int(n, v, 1, 64))
    if 1 not in fs:
        raise ConfigError("factors", factors, "a list that holds 1 (the baseline), e.g. [1, 2, 4]")
    _threads(n_threads)
    one = base.replace(accum=1)
    by_k, by_mb = {}, {}
    with Progress(total=2 * len(fs) - 1, label=WORDS.say("progress")) as bar:
        for f in fs:
            by_k[f] = update_peak(one.replace(accum=f), n_threads=n_threads)
            bar.update(len(by_k), note=f"K = {f}")
        for f in fs:
            by_mb[f] = by_k[1] if f == 1 else update_peak(one.replace(micro_batch=f * base.micro_batch),
                                                            n_threads=n_threads)
            bar.update(len(by_k) + len(by_mb) - 1, note=f"micro-batch {f * base.micro_batch}")
    return by_k, by_mb


def accumulation_reading(by_k: dict) -> dict:
    """Which case chapter 03's peaks ({K: update_peak(...)}, K = 1 and 2 at least) are in: ``head`` 'rose'
    or 'fell' by ``rise_mib``; ``why`` from where each peak was: 'step_both', 'step_then_pass',
    'step_then_level', 'pass_then_step', 'pass_full', 'pass_partial' or 'pass_none'; ``later`` (K > 2):
    'none', 'unchanged', 'flat' or 'moved'."""
    if not isinstance(by_k, dict) or not {1, 2} <= set(by_k) or not all(
            isinstance(v, dict) and {"peak", "phase"} <= set(v) for v in by_k.values()):
        raise ConfigError("by_k", type(by_k).__name__, "{K: ch03.update_peak(...)} with K = 1 and 2 at least")
    p1, p2, grads = by_k[1]["peak"], by_k[2]["peak"], by_k[1]["grads"]
    rise, tol = p2 - p1, max(0.01 * p2, 64 * 2**10)  # below 1 % (or 64 KiB): no change worth a word
    out = dict(head="rose" if rise >= 0 else "fell", rise_mib=abs(rise) / MIB, share_pct=100 * abs(rise) / grads,
               grads_mib=grads / MIB, above_mib=rise / MIB, source=by_k[1].get("source"),
               why=_why(by_k[1]["phase"], by_k[2]["phase"], rise, grads, tol))
    later = {k: v["peak"] - p2 for k, v in sorted(by_k.items()) if k > 2}
    if not later:
        return {**out, "later": "none"}
    k, d = max(later.items(), key=lambda kv: abs(kv[1]))
    key = "unchanged" if d == 0 else "flat" if abs(d) <= tol else "moved"
    return {**out, "later": key, "k": k, "k_max": max(later), "flat_mib": abs(d) / MIB, "moved_mib": d / MIB}


def _why(phase1: str, phase2: str, rise: float, grads: float, tol: float) -> str:
    """Why the peak moved as it did from K = 1 to K = 2, from where each peak was (``accumulation_reading``)."""
    step = "optimizer step"
    if phase1 == step:
        return "step_both" if phase2 == step else "step_then_level" if abs(rise) <= tol else "step_then_pass"
    if phase2 == step:  # K = 1 peaked in forward and backward, K = 2 in its step
        return "pass_then_step"
    return "pass_full" if rise >= 0.5 * grads else "pass_partial" if rise > tol else "pass_none"


def plot_update_peaks(by_k: dict, by_mb: dict, width: float = 6.5, height: float = 3.2):
    """Chapter 03: one update's peak (update_peak) against the effective batch, grown two ways -- more
    accumulation steps K, or a larger micro-batch -- with the gradients' bytes marked above K = 1."""
    for name, d in (("by_k", by_k), ("by_mb", by_mb)):
        if not isinstance(d, dict) or not d or not all(isinstance(v, dict) and "peak" in v for v in d.values()):
            raise ConfigError(name, type(d).__name__, "{factor: ch03.update_peak(...)}, one entry or more")
    _size(width, height)
    from ..tools.plots import FONT as font, TITLE as title, new_figure  # deferred: matplotlib is heavy; loaded to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    for d, words, marker in ((by_k, WORDS.say("raise-k"), "o-"), (by_mb, WORDS.say("raise-mb"), "s--")):
        eff = [v["accum"] * v["micro_batch"] for v in d.values()]
        ax.plot(eff, [v["peak"] / MIB for v in d.values()], marker, label=words)
    one = min(by_k.values(), key=lambda v: v["accum"])
    ax.axhline((one["peak"] + one["grads"]) / MIB, color="#555555", lw=1, ls=":",
               label=WORDS.say("k-line", k=one["accum"]))
    ax.set_xticks(sorted({v["accum"] * v["micro_batch"] for d in (by_k, by_mb) for v in d.values()}))
    ax.set_xlabel(WORDS.say("x-label"), fontsize=font)
    ax.set_ylabel(WORDS.say("y-label"), fontsize=font)
    ax.set_ylim(bottom=0)
    ax.tick_params(labelsize=font)
    ax.legend(fontsize=font, loc="lower right")
    source = WORDS.say("source-cuda" if one["device"] == "cuda" else "source-tracer")
    ax.set_title(WORDS.say("title", source=source), fontsize=title)
    return fig
