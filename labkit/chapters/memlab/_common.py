"""What every memlab tool shares (taught in chapter 08): its arguments refused before any work (ConfigError:
field, value, what is allowed) and the MiB it reports in."""
from __future__ import annotations

from ...engine.config import Config, ConfigError, _int, _num

MIB = 2**20


def _config(value, name: str = "config") -> Config:
    if not isinstance(value, Config):
        raise ConfigError(name, value, "a labkit.Config, e.g. lk.Config(model='tiny')")
    return value


def _threads(n) -> None:
    if n is not None:
        _int("n_threads", n, 1, 1024)


def _items(name: str, values, check) -> list:
    """``values`` as a non-empty list, each item passed through ``check(f"{name}[i]", item)``."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise ConfigError(name, values, "a non-empty list, e.g. [64, 128]")
    out = list(values)
    if not out:
        raise ConfigError(name, values, "a non-empty list, e.g. [64, 128]")
    for i, v in enumerate(out):
        check(f"{name}[{i}]", v)
    return out


def _seq_lens(seq_lens) -> list:
    return _items("seq_lens", seq_lens, lambda n, v: _int(n, v, 2, 65536))  # Config's own seq_len range


def _rows(rows, need: str) -> list:
    """A non-empty list of the dicts a memlab tool returned (``need``: a key every row has)."""
    out = list(rows) if isinstance(rows, (list, tuple)) else None
    if not out or not all(isinstance(r, dict) and need in r for r in out):
        raise ConfigError("rows", type(rows).__name__, f"the non-empty list of rows a memlab tool returned "
                                                        f"(dicts with {need!r})")
    return out


def _size(width, height) -> None:
    _num("width", width, 1.0, 30.0)
    _num("height", height, 1.0, 30.0)
