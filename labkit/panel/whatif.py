"""The lab panel's what-if part: after every run, the step time ``labkit.predict`` *predicts* for this
machine beside the one measured, and "on another GPU": pick a device of the catalogue and see the same
knobs there, predicted (bars from ``plots.whatif``).

Predictions are labelled "predicted" everywhere and never put in a measured column. A prediction is
cached per configuration and device: after the first, a run costs the panel a dictionary look-up.
``WhatIf`` is an object the panel (``labkit.panel.lab.Lab``) owns. Its interface: ``clear()`` when a
run starts, ``show_prediction(...)`` when one finished, ``show(device)`` for the GPU chart, ``text``
(the predicted line) and its widgets ``line`` and ``box``. It reads the runs and the baseline from
the panel's ``History`` and speaks through its ``Messages``.
"""
from __future__ import annotations

import html
import json
import re

import ipywidgets as widgets

from ..base import phrases
from ..base.numfmt import ms
from ..tools import plots
from .. import whatif as predict_mod
from ..tools import reference as reference_mod
from ..engine.config import Config, _choice
from ..base.runtime import ConfigError
from .history import History
from .parts import DRAW_LOCK, Messages, label

_CACHE: dict = {}  # (configuration, device) -> Prediction, or the ConfigError's words when none can be made
# The what-if part's sentences: the "## Predictions in the panel" section of notebooks/lab_messages.md.
WORDS = phrases.load_section("lab_messages.md", "Predictions in the panel", {
    "no-prediction": ("device", "why"), "not-in-catalogue": ("device",), "predicted": ("predicted",),
    "predicted-caveat": ("caveat", "predicted", "measured"), "predicted-busy": ("predicted", "measured", "who"),
    "predicted-error": ("predicted", "measured", "error"), "busy-other": ("cores",), "busy-machine": (),
    "gpu-note": (), "gpu-title": (), "predicting": ("run",), "cannot-show-gpu": ("error",),
    "effect": ("device", "ms", "tokens", "gib", "fits"), "fits": (), "does-not-fit": (),
    "effect-change": ("here", "threads", "there", "device")})
say = WORDS.say


def gpu_choices() -> list:
    """The catalogue's devices as (words, key) for the picker, in the catalogue's order."""
    return [(f"{d['name']} ({key})", key) for key, d in predict_mod.catalogue()["devices"].items()]


def this_device_key(caps):
    """The key ``predict`` uses for the machine the panel runs on: "this" (measured) on a CPU, the
    catalogue entry of the GPU torch names on a GPU ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
    "Tesla T4", ...); None when the catalogue has no such GPU."""
    if caps.kind == "cpu":
        return "this"
    words = set(re.split(r"[\s_-]+", caps.name.lower()))
    memory_gb = (getattr(caps, "memory_bytes", None) or 0) / 1e9
    if "a100" in words:  # the name says 40GB or 80GB; else the card's memory does
        big = "80gb" in words or (not {"40gb", "80gb"} & words and memory_gb > 60)
        return "a100-80gb" if big else "a100-40gb"
    if "h100" in words:  # "NVIDIA H100 80GB HBM3" is the SXM part; the PCIe card says PCIe (H100 NVL: not listed)
        return None if "nvl" in words else ("h100-pcie" if "pcie" in words else "h100-sxm")
    if "h200" in words:
        return "h200-nvl" if "nvl" in words else "h200-sxm"
    for token, key in (("t4", "t4"), ("l4", "l4"), ("4090", "rtx4090"), ("mi300x", "mi300x")):
        if token in words:
            return key
    return None


def cached_prediction(cfg: Config, device: str, retry: bool = False):
    """``predict(cfg, device)``, computed once per configuration and device (a run's length does not
    change its step). Returns the Prediction, or a sentence saying why none can be made. With
    ``retry``, a prediction kept with a caveat (its inputs measured under load) is made again: the
    panel asks for that after a run on a quiet machine, so a busy moment does not follow the learner
    for the rest of the kernel -- while a busy machine is not made to re-measure every run, in vain."""
    key = (json.dumps({**cfg.to_dict(), "steps": 0}, sort_keys=True, default=str), device)
    if key not in _CACHE or (retry and caveat_of(_CACHE[key])):
        try:
            _CACHE[key] = predict_mod.predict(cfg, device, progress=False)  # the panel's status says it
        except ConfigError as e:
            _CACHE[key] = say("no-prediction", device=device, why=e)
    return _CACHE[key]


def caveat_of(pred):
    """Why a prediction is not to be trusted (``Prediction.caveat``), or None when it is."""
    return getattr(pred, "caveat", None) if not isinstance(pred, str) else None


def is_cached(cfg: Config, device: str) -> bool:
    return (json.dumps({**cfg.to_dict(), "steps": 0}, sort_keys=True, default=str), device) in _CACHE


def predicted_line(pred, summary: dict, load: dict = None) -> str:
    """'predicted for this machine: 41 ms/step (measured 52, error -21%; ...)' -- the error is
    predicted / measured - 1 of the step time. A prediction with a caveat says so first and gives no
    error: an error against a number nobody should trust would read as the model's accuracy. Nor is
    one given when the *run* was measured under load (``load``, a LoadMeter reading, says busy): a
    170 ms prediction against 3,970 ms measured while others used 1.5 of 2 cores read "error -96%"."""
    if isinstance(pred, str):
        return pred
    measured = summary.get("step_time_s")
    caveat = caveat_of(pred)
    predicted = ms(pred.step_time_s)
    if caveat:
        return say("predicted-caveat", caveat=caveat.rstrip("."), predicted=predicted,
                   measured=ms(measured or 0))
    if not (isinstance(measured, (int, float)) and measured > 0):
        return say("predicted", predicted=predicted)
    if (load or {}).get("busy"):
        other = load.get("other_cores")
        who = say("busy-other", cores=plots.number(other, 2)) if other is not None else say("busy-machine")
        return say("predicted-busy", predicted=predicted, measured=ms(measured), who=who)
    return say("predicted-error", predicted=predicted, measured=ms(measured),
               error=f"{pred.step_time_s / measured - 1:+.0%}")


class WhatIf:
    """The predicted line after each run and the "on another GPU" chart."""

    def __init__(self, caps, history: History, messages: Messages):
        self.caps = caps
        self.text = ""  # the predicted line, as plain text
        self.fig = None  # the GPU chart shown now (None before the first run)
        self._history, self._messages = history, messages
        self._quiet = 0  # > 0 while code (not the learner) moves the GPU picker
        self.line = widgets.HTML()
        self.gpu = widgets.Dropdown(description="GPU", options=gpu_choices(), value="h100-sxm",
                                    layout=widgets.Layout(width="360px"))
        self.gpu.observe(lambda ch: None if self._quiet else self.show(), "value")
        self.img = widgets.Image(format="png", layout=widgets.Layout(display="none", max_width="760px"))
        self.note = widgets.HTML(f"<small>{html.escape(say('gpu-note'))}</small>")
        self.box = widgets.Accordion([widgets.VBox([self.gpu, self.note, self.img])], selected_index=None)
        self.box.set_title(0, say("gpu-title"))

    def clear(self):
        """A new run starts: a predicted line about the previous one would mislead."""
        self.line.value, self.text = "", ""

    def show_prediction(self, cfg: Config, summary: dict, quiet: bool = True, load: dict = None):
        """After a finished run: the predicted line for this machine, then the GPU chart. ``quiet``:
        nothing else loaded the machine during the run, so a prediction with a caveat is made again;
        ``load``: the run's LoadMeter reading (a busy run's measurement gets no error beside it)."""
        here = this_device_key(self.caps)
        if here is None:
            text = say("not-in-catalogue", device=self.caps.name)
        else:
            if not is_cached(cfg, here) or (quiet and caveat_of(cached_prediction(cfg, here))):
                self._messages.status(html.escape(say("predicting", run=plots.run_label(cfg.to_dict()))))
            text = predicted_line(cached_prediction(cfg, here, retry=quiet), summary, load)
        self.text = text
        self.line.value = (f"<div class='labkit-predicted' style='font-size:0.85em;line-height:1.45'>"
                           f"<i>{html.escape(text)}</i></div>")
        self.show()

    def show(self, device: str = None):
        """The current run (and the baseline run, when it has other knobs) measured here beside the
        picked GPU's prediction. Returns the figure (None before the first run). A device the
        catalogue lacks is a ConfigError listing the GPUs it has, before the picker moves."""
        if device is not None:
            try:
                _choice("device", device, [key for _, key in self.gpu.options])
            except ConfigError as e:
                self._messages.say(say("cannot-show-gpu", error=e), "error")
                raise
        if device is not None and device != self.gpu.value:
            self._quiet += 1  # code moves the picker: draw once, below, not from its observer too
            try:
                self.gpu.value = device
            finally:
                self._quiet -= 1
        runs = self._runs()
        if not runs:
            self.fig = None
            return None
        preds = [cached_prediction(r.config, self.gpu.value) for r in runs]
        refs = [reference_mod.match(r.summary, self._history.reference_dir) for r in runs]
        with DRAW_LOCK:
            fig = plots.whatif(runs, [p if not isinstance(p, str) else None for p in preds], refs)
            self.img.value = plots.to_png(fig)
        self.img.layout.display = None
        self.note.value = "<small>" + html.escape(_effect_words(runs, preds)) + "</small>"
        self.fig = fig
        return fig

    def _runs(self) -> list:
        """The last finished run, and before it the panel's baseline run if its knobs differ."""
        runs = self._history.runs
        if not runs:
            return []
        last, base = runs[-1], runs[self._history.baseline % len(runs)]
        return [base, last] if base is not last and base.config != last.config else [last]


def _effect_words(runs, preds) -> str:
    """One sentence from the numbers: what the change from the baseline does here (measured) and on
    the GPU (predicted) -- or the predicted step alone for a single run."""
    bad = [p for p in preds if isinstance(p, str)]
    if bad:
        return bad[0]
    last, p_last = runs[-1], preds[-1]
    words = say("effect", device=p_last.device_name, ms=ms(p_last.step_time_s),
                tokens=plots.number(p_last.tokens_per_s), gib=f"{p_last.memory_bytes / 2**30:.2f}",
                fits=say("fits" if p_last.fits else "does-not-fit"))
    measured = [r.summary.get("tokens_per_s") for r in runs]
    if len(runs) == 2 and all(isinstance(m, (int, float)) and m > 0 for m in measured):
        # tokens/s, not the step time: with other accumulation or micro-batch an update holds other work
        here = measured[1] / measured[0]
        there = p_last.tokens_per_s / preds[0].tokens_per_s
        words += " " + say("effect-change", here=plots.number(here, 2), threads=_threads_here(runs),
                           there=plots.number(there, 2), device=p_last.device_name)
    return words


def _threads_here(runs) -> str:
    """', 2 CPU threads' (or ', 1 CPU thread against 2') for the measured side of a speed-up."""
    a, b = (plots.cpu_threads(r.summary) for r in runs)
    if a is None or b is None:
        return ""
    words = plots.threads(b, cpu=True)
    return ", " + (label("against-baseline", threads=words, baseline=a) if a != b else words)
