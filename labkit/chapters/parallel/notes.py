"""Kept only for chapter 11 (``labkit/chapters/longrun/notes.py`` imports ``backend`` and ``why_gloo`` from
here); chapter 10 reads them from ``processes``, where they live. Delete once chapter 11 imports them from
``labkit.chapters.parallel.processes``."""
from __future__ import annotations

from .processes import backend, why_gloo  # noqa: F401

__all__ = ["backend", "why_gloo"]
