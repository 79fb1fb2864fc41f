"""What the notebook's front end does with labkit's widget objects, on every front end the course meets.

* ``display_widget``: an object the course shows as a widget (``Lab``, ``Quiz``, ``Drill``, ``Gauntlet``)
  keeps its ipywidgets box in ``self.widget`` and displays as that box, with
  ``_ipython_display_ = display_widget`` in its class. ipywidgets 8 displays a widget through
  ``_repr_mimebundle_``; 7 (Colab's 7.7.1) has no such method and displays through ``_ipython_display_``.
  Handing the box to ``display()`` lets the installed version publish its own bundle -- the
  ``application/vnd.jupyter.widget-view+json`` one -- exactly as if the box were a cell's last line.
* ``threads_draw_late()``: whether this front end shows a widget's changes made from a background thread
  only later (Colab: colabtools issue 3373, open -- they appear when another cell runs), so a button that
  works on a thread of its own must work on the kernel's thread there instead.
"""
from __future__ import annotations

from . import paths


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
    """Whether widget changes made from a background thread reach this front end late (see the module's
    docstring): True on Colab."""
    return on_colab()


__all__ = ["display_widget", "on_colab", "threads_draw_late"]
