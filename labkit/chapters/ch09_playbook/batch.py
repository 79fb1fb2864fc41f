"""Chapter 09's convergence on a fixed budget of tokens and the critical batch size: tokens seen, a run's
final loss, loss curves against tokens (the fair axis when effective batches differ), final loss against the
learning rate; and, after McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"), from a
batch x learning-rate sweep the updates each batch needed to reach a target loss, the fitted S_min, E_min
and B_crit with a bootstrap interval, and what the fit may be read as (a verdict key the chapter words).

    targets = pb.loss_targets(curves)                       # curves: {(batch, lr): [loss after each update]}
    est = pb.critical_batch_estimate(curves, targets[0])
    est["verdict"], pb.batch_rows(est)                   # what it may say; each batch's trade
"""
from __future__ import annotations

import math

from ...base.runtime import ConfigError
from ...base.numfmt import number  # the one number format of the course (no e-notation)
from ...engine.config import real, whole
from ...engine.measure import median
from ..course import table  # rows that show themselves as a markdown table


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
    tail = [r["loss"] for r in _result("result", result).records[-whole("last", last):]]
    return sum(tail) / len(tail)


def convergence_rows(conv: dict, batches, lrs) -> list:
    """Final loss (``final_loss``) per effective batch (rows) and learning rate (columns) of a batch × lr sweep
    ``conv`` {(batch, lr): result}, with each batch's number of updates; every run saw the same sequences."""
    if not isinstance(conv, dict) or not all((b, lr) in conv for b in batches for lr in lrs):
        raise ConfigError("conv", type(conv).__name__, "{(batch, lr): result} for every batch and lr given")
    rows = [{"batch": b, "updates": conv[b, lrs[0]].config.steps,
             **{f"lr {lr:g}": final_loss(conv[b, lr]) for lr in lrs}} for b in batches]
    return table(rows, [("batch", "effective batch", "{}"), ("updates", "updates", "{}")]
                 + [(f"lr {lr:g}", f"lr {lr:g}", "{:.3f}") for lr in lrs])


def dress(ax, xlabel: str, ylabel: str, title: str, legend: str = "best"):
    """Axis labels, title, ticks and legend at the course's text sizes; returns the figure."""
    from ...tools.plots import FONT, TITLE  # deferred: matplotlib is optional; loaded only to draw

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
    if ax is None:
        from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

        ax = new_figure(6.4, 3.2).add_subplot()
    for res, lab in zip(results, labels):
        ax.plot(tokens_seen(res), [r["loss"] for r in res.records], marker="o", ms=2, lw=1, label=lab)
    return dress(ax, "tokens seen", "training loss", title)


def lr_chart(final_losses: dict, title: str = "Final loss against learning rate", ax=None):
    """``final_losses``: {effective batch: {lr: final loss}} -> one line per effective batch."""
    if not isinstance(final_losses, dict) or not final_losses or \
            not all(isinstance(v, dict) and v for v in final_losses.values()):
        raise ConfigError("final_losses", final_losses, "{effective batch: {learning rate: loss}}, not empty")
    if ax is None:
        from ...tools.plots import new_figure  # deferred: matplotlib is optional; loaded only to draw

        ax = new_figure(6.4, 3.2).add_subplot()
    for batch, by_lr in sorted(final_losses.items()):
        lrs = sorted(by_lr)
        ax.plot(lrs, [by_lr[lr] for lr in lrs], marker="o", ms=3, label=f"effective batch {batch}")
    ax.set_xscale("log")
    used = sorted({lr for by_lr in final_losses.values() for lr in by_lr})
    plain_log_ticks(ax.xaxis, used)  # a tick at each learning rate tried, not only at 10⁻³ and 10⁻²
    return dress(ax, "learning rate", "loss after the same tokens", title)


def plain_log_ticks(axis, at=None):
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


def fit_verdict(est: dict) -> str:
    """What one estimate may be read as (the chapter words each): "unreached" (a batch never reached the
    target), "not_falling" (a larger batch needed *more* updates: the model has S fall as B grows, so no fit
    describes these runs), "beyond" / "below" (B_crit outside the batches measured: an extrapolation, a bound
    only) or "fitted" (within them)."""
    if not isinstance(est, dict) or "ok" not in est:
        raise ConfigError("est", est, "what critical_batch_estimate returns")
    if not est["ok"]:
        return "unreached"
    need = [est["per_batch"][b][0] for b in est["batches"]]
    if any(later > earlier for earlier, later in zip(need, need[1:])):
        return "not_falling"
    if est["b_crit"] > max(est["batches"]):
        return "beyond"
    return "below" if est["b_crit"] < min(est["batches"]) else "fitted"


def critical_batch_estimate(curves: dict, target: float, resamples: int = 200, seed: int = 0) -> dict:
    """B_crit at one ``target`` loss from a sweep: ``curves`` {(batch, lr): [loss after 0, 1, 2 ... updates]}.
    Each batch counts the updates of its best learning rate (the one that reached the target first) and
    batch × updates examples; critical_batch_fit does the rest. Its uncertainty: the whole estimate repeated
    on ``resamples`` bootstrap copies of the runs' noise gives a 95 % interval (``interval``, None with
    ``resamples=0``). ``ok`` is False, with ``missing`` (those batches), when a batch never reached the target;
    ``verdict`` is ``fit_verdict``'s."""
    curves = _curves(curves)
    target = real("target", target, minimum=-math.inf)
    resamples = whole("resamples", resamples, 0)
    whole("seed", seed, 0)
    need = _needs(curves, target)
    batches = sorted({k[0] for k in curves})
    missing = [b for b in batches if b not in need]
    base = {"target": target, "batches": batches, "per_batch": need, "interval": None, "dropped": 0}
    if missing:
        return {**base, "ok": False, "verdict": "unreached", "missing": missing}  # batches that never reached it
    fit = critical_batch_fit([need[b][0] for b in batches], [b * need[b][0] for b in batches])
    out = {**fit, **base, "ok": True, "missing": []}  # base's batches: the whole numbers the sweep ran
    out["verdict"] = fit_verdict(out)
    if resamples:
        values, out["dropped"] = _bootstrap(curves, target, resamples, seed)
        if len(values) >= 20:  # fewer kept copies than that make a 95 % interval meaningless
            last = len(values) - 1
            out["interval"] = (values[int(0.025 * last)], values[math.ceil(0.975 * last)])
    return out


def _span(v) -> str:
    return "∞" if v == math.inf else number(v, 2)


def interval_shape(interval) -> dict:
    """What a bootstrap ``interval`` (lo, hi) of B_crit can say -- a chapter words it: ``shape`` is "factor"
    (both ends finite and positive: ``factor`` = hi / lo), "open_above" (no upper end: bounded from below by
    ``lo``), "open_below" (reaches 0: bounded from above by ``hi``), "unbounded" (0 to infinity), "all_beyond" /
    "all_below" (every copy on one edge of the fit), or "none" (too few copies kept for an interval). A factor
    of infinity would say nothing, so it is never given."""
    if interval is None:
        return {"shape": "none", "lo": None, "hi": None, "factor": None}
    if not (isinstance(interval, (list, tuple)) and len(interval) == 2):
        raise ConfigError("interval", interval, "(lo, hi) from critical_batch_estimate, or None")
    lo, hi = (real("interval", v) if v != math.inf else v for v in interval)
    out = {"lo": lo, "hi": hi, "factor": None}
    if 0 < lo and hi < math.inf:
        return {**out, "shape": "factor", "factor": hi / lo}
    if lo == math.inf or hi == 0:  # every copy fell on one edge of the fit
        return {**out, "shape": "all_beyond" if lo == math.inf else "all_below"}
    if lo > 0:
        return {**out, "shape": "open_above"}
    return {**out, "shape": "open_below" if hi < math.inf else "unbounded"}


def grows_as_loss_falls(estimates: list) -> bool:
    """True only when the fitted estimates (lowest target first) are larger at the lower loss, each below the
    one before, with the first's and last's intervals apart: the one case in which the runs show B_crit grow."""
    fitted = [e for e in estimates if isinstance(e, dict) and e.get("verdict") == "fitted" and e.get("interval")]
    return (len(fitted) >= 2 and all(a["b_crit"] > b["b_crit"] for a, b in zip(fitted, fitted[1:]))
            and fitted[0]["interval"][0] > fitted[-1]["interval"][1])


def _side(b, iv):
    if iv is None:
        return None
    return "below" if b < iv[0] else "above" if b > iv[1] else "inside"


def batch_rows(est: dict) -> list:
    """One row per batch of an estimate: its best learning rate, the updates and sequences it needed, what it
    bought against the batch before it (``fewer_updates``: ÷ the updates; ``more_data``: × the sequences; the
    two multiply to the batch's factor) and where it lies against B_crit's interval (``side``: "below",
    "inside" or "above" -- a side is named only outside the whole interval, and only for a fitted B_crit)."""
    if not isinstance(est, dict) or "ok" not in est:
        raise ConfigError("est", est, "what critical_batch_estimate returns")
    rows, prev = [], None
    fitted = est.get("verdict", fit_verdict(est)) == "fitted"
    for b in est["batches"]:
        if b not in est["per_batch"]:
            rows.append({"batch": b, "lr": None, "updates": None, "sequences": None, "fewer_updates": None,
                         "more_data": None, "side": None})
            prev = None
            continue
        n, lr = est["per_batch"][b]
        row = {"batch": b, "lr": lr, "updates": n, "sequences": b * n, "fewer_updates": None, "more_data": None,
               "side": _side(b, est.get("interval")) if fitted else None}
        if prev is not None:
            row["fewer_updates"], row["more_data"] = prev["updates"] / n, b * n / prev["sequences"]
        rows.append(row)
        prev = row
    return rows


def _shown(est: dict, verdict: str, batches: list):
    """B_crit as the table shows it: a number only where it was fitted within the batches, else a bound or why not."""
    if verdict == "fitted":
        return _span(est["b_crit"])
    if verdict in ("beyond", "below"):
        return f"beyond {max(batches)}" if verdict == "beyond" else f"below {min(batches)}"
    return "not meaningful" if verdict == "not_falling" else None


def critical_batch_rows(estimates: list) -> list:
    """Per target loss (rows): the updates each batch needed, B_crit and its 95 % bootstrap interval, as
    ``_shown`` gives it (a bound outside the batches measured, "not meaningful" for "not_falling"), and the
    row's ``verdict``."""
    if not isinstance(estimates, (list, tuple)) or not estimates or \
            not all(isinstance(e, dict) and "ok" in e for e in estimates):
        raise ConfigError("estimates", estimates, "a list of critical_batch_estimate results")
    batches = estimates[0]["batches"]
    rows = []
    for e in estimates:
        verdict = e.get("verdict", fit_verdict(e))
        meaningful = verdict in ("fitted", "beyond", "below")
        rows.append({"target": e["target"], "verdict": verdict,
                     "updates": " / ".join(number(e["per_batch"][b][0]) if b in e["per_batch"] else "never"
                                           for b in batches),
                     "b_crit": _shown(e, verdict, batches),
                     "interval": (f"{_span(e['interval'][0])} to {_span(e['interval'][1])}"
                                  if meaningful and e.get("interval") else None)})
    return rows


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
        if e.get("verdict", fit_verdict(e)) == "fitted":  # a curve only where the fit means something
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
