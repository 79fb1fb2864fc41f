"""``lk.predict(config, device=...)``: one training step of a configuration on another device, predicted.

The entry point of the what-if model: it checks every argument before any work, resolves the device
(the catalogue's datasheet figures, or this machine measured), traces the step (``trace``), charges it
on the roofline (``roofline``) and reports it (``report``). A plain function: ``labkit.whatif`` is the
module with the rest (``catalogue()``, ``trace_step``, ``error_rows``, ...).
"""
from __future__ import annotations

import difflib
import math
from typing import Optional

from ..base.frontend import Progress
from ..engine.config import Config, ConfigError, _choice, _int, _num
from .devices import _catalogue_device, device_names
from .ops import op_keys, this_op_times
from .probes import _entry, _probe_key, _threads, shape_keys, this_device, this_shape_rates
from .report import Prediction, _prediction
from .roofline import _step_groups
from .trace import trace_step

__all__ = ["predict", "PREDICT_OPTIONS", "MAX_OVERHEAD_S"]

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
    """Predict one optimizer update of ``config`` on ``device`` (a key of ``devices.json`` or "this").

    ``precision`` and ``world_size`` override the config's (a Config describes any machine: one with
    tf32 or 8 processes builds on a 2-core CPU and can be predicted on a GPU, only ``lk.run`` refuses
    it). ``world_size`` devices of this kind train data-parallel over the catalogue's interconnect
    (ring AllReduce). The fractions (> 0, <= 1) and the overheads (seconds, 0 to MAX_OVERHEAD_S)
    override the defaults documented in ``DEFAULTS``. Every argument is checked before any work; the
    cost does not grow with the model's depth (see ``trace_step``), and on "this" the first prediction
    measures the machine (a few seconds at most, with a progress line; ``progress=False`` for a caller
    that says it is predicting in its own words, as the panel does).

    Options (keyword only): ``precision``, ``world_size``, ``matmul_fraction``, ``attention_fraction``,
    ``bandwidth_fraction``, ``op_overhead_s``, ``update_overhead_s`` (the overhead term: seconds per op
    and per update), ``link_latency_s``, ``progress``; any other name is a
    ConfigError that names the closest option."""
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
            keys = shape_keys(trace)
            dev["shape_rates"] = this_shape_rates(keys, _threads(config), dev["peak_flops"].get(precision)
                                                  or dev["peak_flops"]["fp32"])
            if set(_entry(_probe_key(_threads(config))).get("loaded_shapes") or ()) & set(keys):
                dev["under_load"]["matmul shape timings"] = _entry(_probe_key(_threads(config))).get(
                    "shapes_other_cores")
            calls = op_keys(trace)
            dev["op_times"] = this_op_times(calls, _threads(config))
            if set(_entry(_probe_key(_threads(config))).get("loaded_ops") or ()) & set(calls):
                dev["under_load"]["element-wise op timings"] = _entry(_probe_key(_threads(config))).get(
                    "ops_other_cores")
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
