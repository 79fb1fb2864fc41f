"""Convergence on a fixed budget of tokens (taught in chapter 09): tokens seen, a run's final loss, loss
curves against tokens (the fair axis when effective batches differ) and final loss against the learning
rate -- plus the two drawing helpers the chapter's charts share (``dress``, ``plain_log_ticks``).
"""
from __future__ import annotations

from ...base.errors import ConfigError
from ...base.numfmt import number
from .args import whole
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
