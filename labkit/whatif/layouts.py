"""What a layout chooser needs from the what-if model, shared by chapter 10 (DP x TP x PP) and chapter 12
(with expert parallelism): a GPU's catalogue figures in SI units and the pipeline bubble. Pure arithmetic.

    gpu_spec("h100-sxm")["usable"]           # bytes a layout may fill on one GPU
    bubble_fraction(4, 8)                    # 3/11: the idle share of a GPipe/1F1B step, p=4, m=8
"""
from __future__ import annotations

import difflib

from ..base.errors import ConfigError
from ..engine.config import _choice, whole
from ..engine.gpus import value as _value
from .devices import DEFAULTS, catalogue
from .roofline import Link

GB = 1e9

# the bubble's two definitions (chapter 10's markdown words them): "step", idle time over the whole step,
# (p - 1) / (m + p - 1); "ideal", idle time over the bubble-free time, Megatron-LM's paper's, (p - 1) / m
BUBBLE_DEFINITIONS = ("step", "ideal")


def bubble_fraction(p: int, m: int, relative_to: str = "step") -> float:
    """The pipeline bubble of GPipe or 1F1B with ``p`` stages and ``m`` micro-batches of equal cost:
    "step", (p - 1)/(m + p - 1), what a stage's timestamps measure; "ideal", (p - 1)/m (Megatron-LM)."""
    p, m = whole("p", p), whole("m", m)
    _choice("relative_to", relative_to, BUBBLE_DEFINITIONS)
    return (p - 1) / (m + p - 1) if relative_to == "step" else (p - 1) / m


def gpu_spec(gpu: str) -> dict:
    """The catalogue's figures of one GPU in SI units, with the what-if model's achievable fractions."""
    devs = catalogue()["devices"]
    if not isinstance(gpu, str) or gpu not in devs:
        close = difflib.get_close_matches(gpu, list(devs), n=1) if isinstance(gpu, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError("gpu", gpu, hint + "a GPU of the what-if catalogue: " + ", ".join(devs))
    d = devs[gpu]
    peaks = {p: (_value(e) or 0.0) * 1e12 for p, e in d["peak_tflops"].items()}
    fp8 = _value(d.get("fp8_peak_tflops") or {})
    return {"key": gpu, "name": d["name"], "peak": peaks, "fp8_peak": fp8 * 1e12 if fp8 else None,
            "memory": _value(d["memory_gb"]) * GB, "usable": _value(d["memory_gb"]) * GB * DEFAULTS[
                "usable_memory_fraction"], "bandwidth": _value(d["memory_bandwidth_gbps"]) * 1e9,
            "link": Link(f"{d['name']} in-node link", _value(d["interconnect_gbps"]) * 1e9,
                         DEFAULTS["link_latency_s"]), "fractions": dict(DEFAULTS[d["vendor"]])}
