"""The report of a prediction: ``Prediction`` (every figure labelled predicted, with the assumptions behind
it and a caveat when an input was measured under load), and the predicted-against-measured rows and
sentence of chapter 09's what-if cell.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..base import phrases
from ..base.numfmt import counted
from ..engine import device as _device
from ..engine.measure import MFU_WRONG, mfu_impossible
from .devices import DDP_TRAFFIC_PER_GRAD_BYTE, DEFAULTS
from .roofline import _memory, _model_flops
from .trace import _spec_for

# The predictions' sentences: the "## Predictions" section of notebooks/lab_messages.md.
WORDS = phrases.load_section("lab_messages.md", "Predictions", {
    "predicted": (), "table-title": ("device", "precision", "ms", "tokens", "mfu", "gib", "fits"), "fits": (),
    "does-not-fit": (), "table-columns": (), "overhead-group": (),
    "overhead-term": ("ms", "share", "per_update", "per_op"),
    "roofline": (), "overhead-measured": (), "overhead-assumed": (), "overlap": (), "attention-flops": (),
    "op-trace-cpu": (), "op-trace-gpu": (), "ddp": ("world", "traffic"), "emulated": ("precision", "device"),
    "caveat-others": ("cores", "total", "threads"), "caveat-repeats": (), "caveat-one": ("what", "load"),
    "caveat-many": ("what", "load"), "error-none": ("device",), "lean-slow": (), "lean-fast": (),
    "lean-mixed": ("slow", "n"), "error-summary": ("device", "median", "n", "worst", "error", "lean")})
say = WORDS.say

__all__ = ["Prediction", "error_rows", "error_sentence"]


@dataclass
class Prediction:
    """A *predicted* training step of one configuration on one device. Nothing here was measured on
    that device; ``assumptions`` lists every fraction and overhead used. ``caveat``: None when the
    inputs can be trusted; otherwise one line saying why not (on "this": a figure measured while other
    programs held the cores its probe needed) -- show it beside the prediction."""

    device: str
    device_name: str
    precision: str
    step_time_s: float
    tokens_per_s: float
    mfu: Optional[float]
    memory_bytes: float
    fits: bool
    groups: dict
    assumptions: dict
    memory: dict = field(default_factory=dict)
    model_flops_per_step: float = 0.0
    tokens_per_step: int = 0
    label: str = "predicted"
    caveat: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def overhead_s(self) -> float:
        """The overhead term of this prediction: the fixed cost per update (the "overhead" group) plus every
        group's per-op dispatch cost (Python, autograd, the optimizer's loop, kernel launches)."""
        return sum(g.overhead_s for g in self.groups.values())

    def table(self) -> str:
        """A markdown table, every time labelled predicted (numbers in plain digits, never e-notation)."""
        mfu = (f", {MFU_WRONG} ({self.mfu:.0%} of {self.device_name}'s)" if mfu_impossible(self.mfu) else
               f", MFU {self.mfu:.0%}" if self.mfu is not None else "")
        lines = [f"**{say('predicted')}** " + say("table-title", device=self.device_name, precision=self.precision,
                            ms=f"{self.step_time_s * 1000:,.1f}", tokens=f"{self.tokens_per_s:,.0f}", mfu=mfu,
                            gib=f"{self.memory_bytes / 2**30:,.2f}", fits=say("fits" if self.fits else "does-not-fit"))]
        if self.caveat:
            lines.append(f"*Caveat: {self.caveat}*")
        columns = say("table-columns").split(", ")
        lines += ["", "| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 2) + "---|"]
        for name, g in self.groups.items():
            label = say("overhead-group") if name == "overhead" else name
            lines.append(f"| {label} | {g.flops / 1e9:,.2f} | {g.bytes / 1e6:,.1f} | {g.n_ops:,} | "
                         f"{g.time_s * 1000:,.2f} | {g.overhead_s * 1000:,.2f} | {g.bound} |")
        lines.append("\n" + say("overhead-term", ms=f"{self.overhead_s * 1000:,.2f}",
                                 share=f"{self.overhead_s / self.step_time_s:.0%}",
                                 per_update=f"{self.assumptions['update_overhead_s'] * 1e3:,.2f}",
                                 per_op=f"{self.assumptions['op_overhead_s'] * 1e6:,.1f}"))
        return "\n".join(lines)

    def __repr__(self):
        return (f"Prediction(predicted on {self.device}: {self.step_time_s * 1000:,.1f} ms/step, "
                f"{self.tokens_per_s:,.0f} tokens/s, fits={self.fits}" + (", with a caveat" if self.caveat else "")
                + ")")


def _prediction(config, device, dev, precision, trace, groups, fr, overheads, latency) -> Prediction:
    """The Prediction of traced, costed groups; ``overheads``: (seconds per op, seconds per update)."""
    K, W = config.accum, config.world_size
    step = sum(g.time_s for g in groups.values())
    model_flops = _model_flops(_spec_for(config)) * config.micro_batch * K * W
    peak = dev["peak_flops"].get(precision) or dev["peak_flops"]["fp32"]
    tokens = config.tokens_per_update
    memory = _memory(config, trace, dev)
    total_mem = sum(memory.values())
    usable = dev["memory_bytes"] * (1.0 if dev["measured"] else DEFAULTS["usable_memory_fraction"])
    emulated = precision in ("bf16", "fp16") and not dev["hardware_units"].get(precision, False)
    assumptions = _assumptions(dev, device, precision, fr, overheads, latency, W, emulated)
    return Prediction(device=device, device_name=dev["name"], precision=precision, step_time_s=step,
                      tokens_per_s=tokens / step if step else math.inf,
                      mfu=model_flops / step / (peak * W) if step and peak else None,
                      memory_bytes=total_mem, fits=total_mem <= usable, groups=groups,
                      assumptions=assumptions, memory=memory, model_flops_per_step=model_flops,
                      tokens_per_step=tokens, caveat=_caveat(dev))


def _assumptions(dev: dict, device: str, precision: str, fr: dict, overheads: tuple, latency: float, W: int,
                 emulated: bool) -> dict:
    """Everything a prediction assumed, for the learner to read beside it."""
    assumptions = {
        **fr, "op_overhead_s": overheads[0], "update_overhead_s": overheads[1], "link_latency_s": latency,
        "sample_overhead_s": dev["sample_overhead_s"],
        "peak_flops": {p: v for p, v in dev["peak_flops"].items() if v}, "bandwidth_bytes_per_s": dev["bandwidth"],
        "link_bandwidth_bytes_per_s": dev["link_bandwidth"],
        "usable_memory_fraction": 1.0 if dev["measured"] else DEFAULTS["usable_memory_fraction"],
        "measured_device": dev["measured"], "sources": dev["sources"],
        "measured_shapes": len(dev.get("shape_rates") or {}),
        "measured_ops": len(dev.get("op_times") or {}),
        "emulated_format": emulated,
        "roofline": say("roofline"),
        "overhead_term": say("overhead-measured" if dev["measured"] else "overhead-assumed"),
        "overlap": say("overlap"),
        "measured_under_load": sorted(dev.get("under_load") or {}),
        "attention_flops": say("attention-flops"),
        "op_trace": say("op-trace-cpu" if device == "this" else "op-trace-gpu"),
        "ddp": say("ddp", world=W, traffic=DDP_TRAFFIC_PER_GRAD_BYTE),
    }
    if emulated:
        assumptions["note"] = say("emulated", precision=precision, device=dev["name"])
    return assumptions


def _caveat(dev: dict) -> Optional[str]:
    """One line when an input of the prediction was measured under load (see this_device), else None."""
    loaded = dev.get("under_load") or {}
    if not loaded:
        return None
    names = list(loaded)
    what = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    others = [v for v in loaded.values() if isinstance(v, (int, float))]
    n = dev.get("threads", 1)
    load = (say("caveat-others", cores=f"{max(others):.1f}", total=_device.cores(), threads=counted(n, "thread"))
            if others else say("caveat-repeats"))
    return say("caveat-many" if len(names) > 1 else "caveat-one", what=what, load=load)


# ---- predicted against measured (chapter 09's what-if cell) -------------------------------------------

def error_rows(labels, measured_s, predicted_s) -> list:
    """One row per configuration: its label, measured and predicted step time (s) and the error
    ``predicted / measured - 1`` (positive: the model predicts slower than measured)."""
    rows = []
    for label, m, p in zip(labels, measured_s, predicted_s):
        ok = isinstance(m, (int, float)) and m > 0 and isinstance(p, (int, float))
        rows.append({"label": str(label), "measured_s": m, "predicted_s": p, "error": p / m - 1 if ok else None})
    return rows


def error_sentence(rows, device_words: str = "this machine") -> str:
    """The chapter's sentence about the rows, from their numbers: median and worst |error|, and which
    way the model leans."""
    errs = [r for r in rows if r["error"] is not None]
    if not errs:
        return say("error-none", device=device_words)
    sizes = sorted(abs(r["error"]) for r in errs)
    mid = len(sizes) // 2
    median = sizes[mid] if len(sizes) % 2 else (sizes[mid - 1] + sizes[mid]) / 2
    worst = max(errs, key=lambda r: abs(r["error"]))
    slow = sum(r["error"] > 0 for r in errs)
    lean = (say("lean-slow") if slow == len(errs) else say("lean-fast") if slow == 0 else
            say("lean-mixed", slow=slow, n=len(errs)))
    return say("error-summary", device=device_words, median=f"{median:.0%}", n=len(errs), worst=worst["label"],
               error=f"{worst['error']:+.0%}", lean=lean)
