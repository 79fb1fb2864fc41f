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

# The words around a ConfigError's field, value and allowed text in the learner's language: labkit.base.phrases
# installs its formatter here when it is imported (this module imports nothing). A formatter returns the
# message, or None for the English below; a ConfigError raised while one runs is said in English.
_formatter: list = []
_busy: list = []


def install_formatter(formatter) -> None:
    """Frame every ConfigError message from now on with ``formatter(field, value, allowed)`` (None: English)."""
    _formatter[:] = [formatter]


def _message(field_name: str, value, allowed: str) -> str:
    if _formatter and not _busy:
        _busy.append(True)
        try:
            said = _formatter[0](field_name, value, allowed)
        finally:
            _busy.pop()
        if said is not None:
            return said
    return f"{field_name}={value!r} is not allowed: {allowed}"


class ConfigError(ValueError):
    """A configuration that cannot run. The message names the field, the value and what is allowed (in the
    learner's language where labkit.base.phrases has it)."""

    def __init__(self, field_name: str, value, allowed: str):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(_message(field_name, value, allowed))


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
