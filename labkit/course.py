"""Small helpers the chapter notebooks share: sizes per device, smoke mode, generated prose,
predictions, and GPU reference numbers beside the learner's own.

Nothing here trains: experiments go through ``labkit.run`` like everything else.
"""
from __future__ import annotations

import os

from . import reference
from .device import capabilities, slowdown


def smoke() -> bool:
    """True under CI (env ``CI`` set): chapters shrink step counts, never skip content."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def steps(n: int, minimum: int = 2) -> int:
    """``n`` optimizer updates normally, about a third of them (at least ``minimum``) in smoke mode."""
    return max(minimum, n // 3) if smoke() else n


def budget(seconds: float) -> float:
    """A comparison's time budget: ``seconds`` normally, a quarter (at least 6 s) in CI mode. Chapters
    write their budgets as ``lk.course.budget(N)`` so a test can add them up per chapter."""
    return max(6.0, seconds / 4) if smoke() else float(seconds)


def emulated(precision: str) -> float | None:
    """How many times slower than fp32 ``precision`` runs here when it is emulated in software (at least
    2x slower, e.g. bf16 on a CPU without bf16 units); None when it is not."""
    s = slowdown(capabilities("auto"), precision)
    return s if s is not None and s >= 2 else None


def low_precision(precision: str, knobs: dict, smaller: dict) -> tuple:
    """(knobs, note): where ``precision`` is emulated, shrink the run with ``smaller`` so the chapter's
    time holds, and say so -- the learner sees why the model changed."""
    s = emulated(precision)
    if s is None:
        return dict(knobs), ""
    note = (f"{precision} matmuls run about {s:.0f}x slower than fp32 on this {device_kind()} (no {precision} "
            f"units: converted in software), so this comparison uses a smaller run: "
            + ", ".join(f"{k}={v}" for k, v in smaller.items()) + ".")
    return {**knobs, **smaller}, note


def device_kind() -> str:
    return capabilities("auto").kind


def sizes(cpu: dict, gpu: dict) -> dict:
    """Pick the chapter's knobs for this device: learners with a GPU get GPU-sized runs automatically."""
    return dict(gpu if device_kind() == "cuda" else cpu)


def say(text: str):
    """Show generated markdown (text that quotes measured numbers must come from here, not be typed)."""
    try:
        from IPython.display import Markdown, display  # deferred: IPython exists only in a notebook
    except ImportError:  # plain Python: just print
        print(text)
        return
    display(Markdown(text))


def ratio(a, b) -> str:
    """'2.10×' -- or 'n/a' when a number is missing."""
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}×"


def compare_prediction(prediction, measured, what: str, unit: str = "", tolerance: float = 0.25):
    """Say how a learner's prediction compares with the measurement (within ``tolerance``, relative)."""
    if prediction is None or prediction is Ellipsis:
        say(f"**{what}:** measured **{measured:.3g}{unit}**. (Write a prediction in the cell above next time "
            "-- guessing first is how intuition gets built.)")
        return None
    close = measured != 0 and abs(prediction - measured) / abs(measured) <= tolerance
    verdict = "close — well predicted." if close else "off by more than " + f"{tolerance:.0%}: worth a look at why."
    say(f"**{what}:** you predicted **{prediction:.3g}{unit}**, measured **{measured:.3g}{unit}** — {verdict}")
    return close


def reference_points(section: str | None = None) -> list:
    """GPU reference measurements (possibly none) for one section of the suite."""
    return reference.points(section=section)


def reference_note(section: str | None = None) -> str:
    """One line saying which reference GPU numbers exist -- or that none are shipped yet."""
    pts = [p for p in reference_points(section) if p.get("status") == "ok"]
    if not pts:
        return ("*No GPU reference measurements are shipped in `data/reference/` yet: the numbers below are "
                "your device's only.*")
    return f"*Reference measurements: {reference.label(pts[0])} ({len(pts)} points in this section).*"
