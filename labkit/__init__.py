"""labkit: measure how mixed precision, gradient accumulation, activation checkpointing, data
loading and DDP change memory, speed and MFU -- live, on your own hardware.

    import labkit as lk
    result = lk.run(lk.Config(model="tiny", precision="bf16", accum=4))

Nothing heavy happens at import time; the widget panel (``lk.Lab``) loads only when asked for.
"""
from .config import PRESETS, Config
from .errors import ConfigError, NonFiniteError, OutOfMemory, RunError, Stopped
from .train import Result, run
from .compare import Comparison, compare_configs

__all__ = ["Config", "ConfigError", "PRESETS", "Result", "RunError", "OutOfMemory", "NonFiniteError", "Stopped", "run", "env", "Lab",
           "compare_configs", "Comparison"]
__version__ = "0.1.0"


def env(device: str = "auto", measure: bool = True, remeasure: bool = False) -> dict:
    """A report of this machine: device, capabilities, memory, peak FLOP/s per dtype and source, and
    the formats measured faster than fp32 (``fast_formats``). At most 3 s the first time, then cached."""
    from .device import env_report

    return env_report(device, measure, remeasure)


def __getattr__(name):
    if name == "Lab":  # imported lazily: the CLI must run where ipywidgets is not installed
        from .widgets import Lab

        return Lab
    if name in ("plots", "check", "reference", "course", "quiz", "playbook"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
