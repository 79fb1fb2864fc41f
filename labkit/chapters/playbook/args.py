"""The playbook's argument checks (taught in chapter 09): every public function of the playbook refuses an
impossible number -- a negative parameter count, a NaN budget, a grid axis given as a bare string -- with a
ConfigError naming the argument, before any work. Choices and switches use the Config's own checks
(``engine.config._choice`` and ``_bool``): one wording, with its did-you-mean, for every refusal.
"""
from __future__ import annotations

import math
import numbers

from ...base.errors import ConfigError


def real(name: str, value, *, minimum: float = 0.0, strict: bool = False, allowed: str = "") -> float:
    """``value`` as a float when it is a finite real number >= ``minimum`` (> with ``strict``); else a
    ConfigError naming the argument. A negative parameter count would otherwise give negative bytes."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > minimum if strict else value >= minimum):
        return float(value)
    raise ConfigError(name, value, allowed or f"a finite number {'>' if strict else '>='} {minimum:g}")


def whole(name: str, value, minimum: int = 1) -> int:
    """``value`` when it is a whole number >= ``minimum`` (True/False and 2.5 are refused)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum:
        return value
    raise ConfigError(name, value, f"a whole number >= {minimum}")


def row_list(name: str, value) -> list:
    """Grid rows: a list (or tuple) of dicts."""
    if isinstance(value, (list, tuple)) and all(isinstance(r, dict) for r in value):
        return list(value)
    raise ConfigError(name, type(value).__name__ if not isinstance(value, (list, tuple)) else value,
                      "a list of grid rows (dicts), e.g. what grid_search returns")


def axis_values(name: str, values) -> tuple:
    """A grid axis: a non-empty tuple or list of values (a bare string would iterate by letter)."""
    if isinstance(values, (list, tuple)) and values:
        return tuple(values)
    raise ConfigError(name, values, "a non-empty tuple of values, e.g. (1, 2, 4)")
