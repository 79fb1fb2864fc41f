"""The critical batch size (taught in chapter 09), after McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training": from a batch x learning-rate sweep, the updates each batch needed to reach a target
loss, the fitted S_min, E_min and B_crit with a bootstrap interval, and what the fit may say -- in words, as a
table and as a chart.

    targets = pb.loss_targets(curves)                       # curves: {(batch, lr): [loss after each update]}
    est = pb.critical_batch_estimate(curves, targets[0])
    pb.critical_batch_words(est, seq_len=64)
"""
from __future__ import annotations

import math

from ...base.errors import ConfigError
from ...base.numfmt import number  # the one number format of the course (no e-notation)
from ...engine.measure import median
from ..course import Note  # markdown that renders as a cell's value or through display()
from .args import real, whole
from .convergence import dress, plain_log_ticks


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
        blocks.append([real("loss", v, minimum=-math.inf), 1])
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
    target = real("target", target, minimum=-math.inf)
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
    S = [real("steps", v, strict=True) for v in steps]
    E = [real("examples", v, strict=True) for v in examples]
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
        whole("batch", key[0])
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
    start = median(f[0] for f in fits.values())
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
    v = [real("loss", x, minimum=-math.inf) for x in losses]
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
    target = real("target", target, minimum=-math.inf)
    resamples = whole("resamples", resamples, 0)
    whole("seed", seed, 0)
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
    return "∞" if v == math.inf else number(v, 2)


def critical_batch_spread(interval) -> str:
    """How wide a bootstrap ``interval`` (lo, hi) of B_crit is, in words: the factor it spans when both ends
    are finite and positive, else which end these runs leave open (a factor of infinity says nothing)."""
    if interval is None:
        return "too few bootstrap copies reached every target to give an interval."
    if not (isinstance(interval, (list, tuple)) and len(interval) == 2):
        raise ConfigError("interval", interval, "(lo, hi) from critical_batch_estimate, or None")
    lo, hi = (real("interval", v) if v != math.inf else v for v in interval)
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


def critical_batch_words(est: dict, seq_len: int | None = None) -> Note:
    """What one estimate says, in markdown: B_crit with its interval, what each k-fold larger batch bought
    (measured: the updates it saved, the data it cost), and where each batch lies against the interval.
    A side of B_crit is named only from the fit over every batch, and only outside the interval."""
    if not isinstance(est, dict) or "ok" not in est:
        raise ConfigError("est", est, "what critical_batch_estimate returns")
    if not est["ok"]:
        return Note(f"No estimate at loss {est['target']:.3f}: {est['reason']} (the runs are too short for it).")
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
            # in plain words: a side of B_crit is named only for a batch outside the whole interval
            def are(bs, one, many):
                return one if len(bs) == 1 else many
            where = ([f"{_batch_list(below)} {are(below, 'is', 'are')} below B_crit (smaller than the whole "
                      "interval)"] if below else []) + \
                    ([f"{_batch_list(inside)} {are(inside, 'lies', 'lie')} inside the interval, so these runs "
                      f"cannot tell whether {are(inside, 'it is', 'they are')} below or above B_crit"]
                     if inside else []) + \
                    ([f"{_batch_list(above)} {are(above, 'is', 'are')} above B_crit (larger than the whole "
                      "interval)"] if above else [])
            text += " So " + "; ".join(where) + "."
    return Note(text)


def critical_batch_table(estimates: list) -> Note:
    """Markdown: per target loss, the updates each batch needed, B_crit and its 95 % bootstrap interval."""
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
    return Note("\n".join(lines))


def critical_batch_chart(estimates: list, title: str = "Updates against data to reach one loss"):
    """McCandlish et al.'s picture: for each target loss the (updates, sequences) each batch needed, measured,
    and the fitted curve S = S_min + E_min/B, E = E_min + S_min·B with its two asymptotes (dashed) and the
    point B = B_crit, where both are twice their minimum."""
    from ...tools.plots import FONT, log_ticks, new_figure  # deferred: matplotlib is optional; loaded only to draw

    good = [e for e in (estimates or []) if isinstance(e, dict) and e.get("ok")]
    if not good:
        raise ConfigError("estimates", estimates, "a list of critical_batch_estimate results, one at least ok")
    fig = new_figure(8.4, 3.8)
    ax = fig.add_subplot()
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
        plain_log_ticks(axis, log_ticks(*axis.get_view_interval()))
    dress(ax, "updates to reach the loss (S; dotted: S_min)", "sequences to reach it (E; dotted: E_min)",
           title + " (× : B = B_crit)")
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: it hides no point
    return fig
