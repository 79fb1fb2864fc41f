"""labkit: measure how mixed precision, gradient accumulation, activation checkpointing, data
loading and DDP change memory, speed and MFU -- live, on your own hardware.

    import labkit as lk
    result = lk.run(lk.Config(model="tiny", precision="bf16", accum=4))
    lk.predict(result.config, device="h100-sxm")   # the same step on an H100: predicted, never measured

Nothing heavy happens at import time; the widget panel (``lk.Lab``) loads only when asked for.
"""
import importlib

from .compare import Comparison, compare_configs
from .config import PRESETS, Config
from .device import env_report
from .errors import ConfigError, NonFiniteError, OutOfMemory, RunError, Stopped
from . import predict  # the module, callable: lk.predict(config, device=...) -- see predict._CallableModule
from .predict import Prediction
from .train import Result, run

__all__ = ["Config", "ConfigError", "PRESETS", "Result", "RunError", "OutOfMemory", "NonFiniteError", "Stopped", "run", "env", "Lab",
           "compare_configs", "Comparison", "predict", "Prediction"]
__version__ = "0.1.0"


def env(device: str = "auto", measure: bool = True, remeasure: bool = False) -> dict:
    """A report of this machine: device, capabilities, memory, peak FLOP/s per dtype and source, and
    the formats measured faster than fp32 (``fast_formats``). At most 3 s the first time, then cached."""
    return env_report(device, measure, remeasure)


def __getattr__(name):
    if name == "Lab":
        from .widgets import Lab  # deferred: ipywidgets is optional; the CLI runs without it

        return Lab
    if name in ("plots", "check", "reference", "course", "quiz", "playbook"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
