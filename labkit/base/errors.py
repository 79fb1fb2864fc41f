"""Every error labkit raises on purpose, in one leaf module that imports nothing: the engine, the panel,
the CLI and the checkers all name the same classes, and none of them has to import another to do so.

    ConfigError     a setting that cannot run (names the field, the value and what is allowed)
    RunError        a run that failed while it ran (a dead worker or rank, a second run at once)
    OutOfMemory     ... because it needed more memory than it had (memory is freed before it is raised)
    NonFiniteError  ... because inf/NaN appeared and on_nonfinite="stop"
    Stopped         a stop was asked for (Stop button, Ctrl-C); the engine turns it into status "stopped"
    TorchTooOld     a torch API the course uses is not in the installed torch (base/compat.py says which)
"""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run. The message names the field, the value and what is allowed."""

    def __init__(self, field_name: str, value, allowed: str):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field_name}={value!r} is not allowed: {allowed}")


class RunError(RuntimeError):
    """A run failed; the message says where and why."""


class OutOfMemory(RunError):
    """The run needed more device memory than it had. Memory has been freed; the next run can go."""


class NonFiniteError(RunError):
    """inf/NaN appeared in the loss or gradients and the run was configured to stop."""


class Stopped(Exception):
    """A stop was requested (Stop button, Ctrl-C)."""


class TorchTooOld(RuntimeError):
    """The installed torch lacks an API the course uses; the message names it, the torch it needs, the one
    installed, and what to do (labkit.base.compat builds it)."""
