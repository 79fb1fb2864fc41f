"""What labkit shows through the front end it runs in: a notebook, Colab, JupyterLab, a terminal.

* ``display_widget``: an object the course shows as a widget (``Lab``, ``Quiz``, ``Drill``,
  ``Gauntlet``) keeps its ipywidgets box in ``self.widget`` and has ``_ipython_display_ =
  display_widget`` in its class. ipywidgets 8 displays a widget through ``_repr_mimebundle_``; 7
  (Colab's 7.7.1) has no such method: handing the box to ``display()`` lets the installed version
  publish its own bundle (``application/vnd.jupyter.widget-view+json``), as a cell's last line would.
* ``threads_draw_late()``: Colab shows a widget's changes made from a background thread only when
  another cell runs (colabtools issue 3373, open), so a button that works on a thread of its own
  works on the kernel's thread there instead.
* ``Progress``: one line for anything that takes more than a second or so, kept up to date in place:
  in a notebook as a display handle on stdout (never stderr, which a notebook paints as an error box),
  elsewhere with ``\\r`` on stderr (stdout stays clean for a CLI's JSON).
"""
from __future__ import annotations

import math
import sys
import time

from . import paths
from .runtime import ConfigError

WIDTH = 24  # characters of the bar itself: the line stays well inside a notebook's ~100 columns
MIN_INTERVAL_S = 0.2  # redraw at most this often; the last state is always drawn on exit


def display_widget(obj, **kwargs) -> None:
    """Display ``obj.widget`` (an ipywidgets box) as ``obj``, on ipywidgets 7 and 8 alike: a class's
    ``_ipython_display_``, which IPython calls both for ``display(obj)`` and for ``obj`` as a cell's last line."""
    from IPython.display import display  # deferred: IPython exists only in a notebook or IPython
    display(obj.widget)


def on_colab() -> bool:
    """Whether this kernel runs in Google Colab (``paths.hosted_platform``: the set-up cell's test, Kaggle first,
    whose image is built from Colab's)."""
    return paths.hosted_platform() == "colab"


def threads_draw_late() -> bool:
    """Whether widget changes made from a background thread reach this front end late: on Colab."""
    return on_colab()


def in_notebook() -> bool:
    """True inside a Jupyter kernel (a display handle updates in place there; a terminal IPython has none)."""
    ipython = sys.modules.get("IPython")  # never import IPython just to ask: a CLI must not load it
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class _Line:
    """A display object whose text is the bar; plain text, so the notebook shows it as ordinary output."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Progress:
    """``with Progress(total, label) as bar: ... bar.update(done, note="")``: nothing shows for the first
    ``delay`` seconds (``math.inf``: never, for a caller's ``progress=False``); leaving the block closes
    the line, also when the work inside raised."""

    def __init__(self, total: int, label: str, *, delay: float = 1.0):
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise ConfigError("total", total, "a whole number of steps, 0 or more")
        if not isinstance(label, str):
            raise ConfigError("label", label, "a string naming the work")
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or math.isnan(delay) or delay < 0:
            raise ConfigError("delay", delay, "seconds, 0 or more (math.inf: never shown)")
        self.total, self.label, self.delay = total, label, float(delay)
        self.done, self.note = 0, ""
        self._t0 = None
        self._drawn_at = None  # when the line was last drawn; None: never shown
        self._handle = None
        self._notebook = False
        self._width = 0  # the longest line drawn on stderr so far

    def __enter__(self) -> "Progress":
        self._t0 = time.monotonic()
        self._notebook = in_notebook()
        return self

    def __exit__(self, *exc) -> bool:
        if self._drawn_at is not None:  # never shown (a fast job): nothing to close
            self._draw()
            if not self._notebook:
                print(file=sys.stderr, flush=True)  # end the \r line, so what follows starts on its own
        return False

    def update(self, done: int, note: str = "") -> None:
        """Record that ``done`` of ``total`` steps are finished (clamped to 0..total) and redraw if due."""
        if self._t0 is None:
            raise RuntimeError("Progress.update() called outside its `with` block")
        self.done = min(max(int(done), 0), self.total)
        self.note = str(note)
        now = time.monotonic()
        if now - self._t0 < self.delay:
            return  # the first second stays silent
        if self._drawn_at is None or now - self._drawn_at >= MIN_INTERVAL_S or self.done == self.total:
            self._draw()

    def text(self) -> str:
        """'micro-batch sweep [##########..............] 4/9 · 12 s · micro-batch 8'"""
        filled = WIDTH if self.total == 0 else WIDTH * self.done // self.total
        elapsed = time.monotonic() - self._t0 if self._t0 is not None else 0.0
        line = f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} · {elapsed:.0f} s"
        return line + (f" · {self.note}" if self.note else "")

    def _draw(self) -> None:
        self._drawn_at = time.monotonic()
        text = self.text()
        if not self._notebook:
            # pad with spaces: a shorter line must cover the longer one it overwrites
            print("\r" + text.ljust(self._width), end="", file=sys.stderr, flush=True)
            self._width = max(self._width, len(text))
            return
        from IPython.display import display  # deferred: IPython exists only in a notebook
        if self._handle is None:
            self._handle = display(_Line(text), display_id=True)
        else:
            self._handle.update(_Line(text))

