"""``lk.predict(config, device=...)``: one training step of a configuration on another device,
predicted, and its report: ``Prediction`` (every figure labelled predicted, with the assumptions
behind it and a caveat when an input was measured under load), and the predicted-against-measured
rows and sentence of chapter 09's what-if cell. ``predict`` checks every argument before any work,
resolves the device (the catalogue's datasheet figures, or this machine measured), traces the step
(``trace``) and charges it on the roofline (``roofline``).
"""
from __future__ import annotations

import difflib
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..base import phrases
from ..base.numfmt import counted
from ..base.frontend import Progress
from ..engine import device as _device
from ..engine.config import Config, ConfigError, _choice, _int, _num
from ..engine.measure import MFU_WRONG, mfu_impossible
from .devices import DDP_TRAFFIC_PER_GRAD_BYTE, DEFAULTS, _catalogue_device, device_names, op_keys
from .probes import (_entry, _probe_key, _threads, shape_keys, this_device, this_op_times,
                     this_shape_rates)
from .roofline import _memory, _model_flops, _step_groups
from .trace import _spec_for, trace_step

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

__all__ = ["predict", "PREDICT_OPTIONS", "MAX_OVERHEAD_S", "Prediction", "error_rows",
           "error_sentence"]


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


# ---- lk.predict ----------------------------------------------------------------------------------

PREDICT_OPTIONS = ("precision", "world_size", "matmul_fraction", "attention_fraction", "bandwidth_fraction",
                   "op_overhead_s", "update_overhead_s", "link_latency_s")
_ACCEPTED = PREDICT_OPTIONS + ("progress",)  # progress: whether to show a progress line, not a model input
MAX_OVERHEAD_S = 1.0  # per op, per update or per ring step: a second is already far beyond any real machine


def _check_arguments(config, device, precision, world_size, fractions: dict, seconds: dict) -> None:
    """Every argument of ``predict``, before any work (ConfigError: the field, the value, what is allowed)."""
    if not isinstance(config, Config):
        raise TypeError(f"predict() needs a labkit.Config, got {type(config).__name__}: build one with "
                        "lk.Config(model=..., ...)")
    _choice("device", device, tuple(device_names()))
    if precision is not None:
        _choice("precision", precision, ("fp32", "tf32", "fp16", "bf16"))
    if precision == "tf32" and device == "this":
        raise ConfigError("precision", "tf32", "fp32, fp16 or bf16 on this CPU (tf32 is a CUDA tensor-core mode)")
    if world_size is not None:
        _int("world_size", world_size, 1, 4096)  # Config's own range
    for name, v in fractions.items():
        if v is not None:
            _num(name, v, 0, 1, lo_open=True)
    for name, v in seconds.items():
        if v is not None:
            _num(name, v, 0, MAX_OVERHEAD_S)


def predict(config: Config, device: str = "h100-sxm", **options) -> Prediction:
    """Predict one optimizer update of ``config`` on ``device`` (a key of ``devices.json`` or
    "this").

    Options (keyword only, ``PREDICT_OPTIONS`` and ``progress``; any other name is a ConfigError
    naming the closest): ``precision`` and ``world_size`` override the config's (``world_size``
    devices train data-parallel over the catalogue's interconnect); the fractions (> 0, <= 1) and
    the overheads (seconds per op, per update, per ring step: 0 to MAX_OVERHEAD_S) override
    ``DEFAULTS``. Every argument is checked before any work; on "this" the first prediction measures
    the machine (a few seconds, with a progress line unless ``progress=False``)."""
    for name in options:
        if name not in _ACCEPTED:  # a typo such as matmul_fracton: say so, with the options
            close = difflib.get_close_matches(name, _ACCEPTED, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(name, options[name], f"{hint}not an option of lk.predict; options are: "
                              + ", ".join(_ACCEPTED))
    return _predict(config, device, **options)


def _predict(config: Config, device: str = "h100-sxm", *, precision: Optional[str] = None,
            world_size: Optional[int] = None, matmul_fraction: Optional[float] = None,
            attention_fraction: Optional[float] = None, bandwidth_fraction: Optional[float] = None,
            op_overhead_s: Optional[float] = None, update_overhead_s: Optional[float] = None,
            link_latency_s: Optional[float] = None, progress: bool = True) -> Prediction:
    """``predict`` once its option names are known good (each value is checked here, before any work)."""
    fractions = {"matmul_fraction": matmul_fraction, "attention_fraction": attention_fraction,
                 "bandwidth_fraction": bandwidth_fraction}
    _check_arguments(config, device, precision, world_size,
                     fractions, {"op_overhead_s": op_overhead_s, "update_overhead_s": update_overhead_s,
                                 "link_latency_s": link_latency_s})
    precision = precision or config.precision
    if world_size is not None:
        config = config.replace(world_size=world_size)  # a Config is pure: 8 processes build on a laptop too
    if not isinstance(progress, bool):
        raise ConfigError("progress", progress, "True or False")
    with Progress(3, f"predicting on {device}", delay=1.0 if progress else math.inf) as bar:
        dev = _resolve_device(device, config, precision)
        bar.update(1, "tracing the step")
        trace = trace_step(config, precision=precision, foreach=device != "this")
        if device == "this":
            bar.update(2, "timing the step's matmul shapes and element-wise ops")
            threads, keys, calls = _threads(config), shape_keys(trace), op_keys(trace)
            peak = dev["peak_flops"].get(precision) or dev["peak_flops"]["fp32"]
            dev["shape_rates"] = this_shape_rates(keys, threads, peak)
            dev["op_times"] = this_op_times(calls, threads)
            entry = _entry(_probe_key(threads))
            for loaded, timed, what in (("shapes", keys, "matmul shape timings"),
                                        ("ops", calls, "element-wise op timings")):
                if set(entry.get(f"loaded_{loaded}") or ()) & set(timed):
                    dev["under_load"][what] = entry.get(f"{loaded}_other_cores")
        bar.update(3)
    fr = {**dev["fractions"], **{k: float(v) for k, v in fractions.items() if v is not None}}
    overhead = dev["op_overhead_s"] if op_overhead_s is None else float(op_overhead_s)
    per_update = dev["update_overhead_s"] if update_overhead_s is None else float(update_overhead_s)
    latency = dev["link_latency_s"] if link_latency_s is None else float(link_latency_s)
    groups = _step_groups(config, trace, dev, precision, fr, overhead, latency, per_update)
    return _prediction(config, device, dev, precision, trace, groups, fr, (overhead, per_update), latency)


def _resolve_device(device: str, config: Config, precision: str) -> dict:
    if device == "this":
        return this_device(_threads(config), precision)
    spec = _catalogue_device(device)
    if spec["peak_flops"].get(precision) is None:
        have = [p for p, v in spec["peak_flops"].items() if v is not None]
        raise ConfigError("precision", precision, f"one of {', '.join(have)} on {device}: {spec['name']} has no "
                          f"{precision} hardware unit (labkit refuses it there)")
    return spec


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
    median = statistics.median(abs(r["error"]) for r in errs)
    worst = max(errs, key=lambda r: abs(r["error"]))
    slow = sum(r["error"] > 0 for r in errs)
    lean = (say("lean-slow") if slow == len(errs) else say("lean-fast") if slow == 0 else
            say("lean-mixed", slow=slow, n=len(errs)))
    return say("error-summary", device=device_words, median=f"{median:.0%}", n=len(errs), worst=worst["label"],
               error=f"{worst['error']:+.0%}", lean=lean)
