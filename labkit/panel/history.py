"""The lab panel's record of finished runs: ``History`` (the table of runs, the comparison with a baseline,
saving and loading, reference numbers from a real GPU) and ``WhatIf`` (after every run, the step time
``labkit.predict`` *predicts* for this machine beside the one measured, and "on another GPU": a device of the
catalogue picked, the same knobs there, predicted, as bars from ``plots.whatif``).

Both are objects the panel (``labkit.panel.lab.Lab``) owns; they speak through its ``Messages``, and ``WhatIf``
reads the runs and the baseline from ``History``. Predictions are labelled "predicted" everywhere and never put
in a measured column; one is cached per configuration and device: after the first, a run costs the panel a
dictionary look-up.
"""
from __future__ import annotations

import dataclasses
import html
import json
import re

import ipywidgets as widgets

from .. import whatif as predict_mod
from ..base import paths, phrases
from ..base.runtime import ConfigError
from ..base.numfmt import ms
from ..engine.config import Config, _choice
from ..engine.train import Result
from ..tools import plots
from ..tools import reference as reference_mod
from .parts import DRAW_LOCK, Messages, TableRows, describe, label

# The history's sentences: the "## Run history" section of notebooks/lab_messages.md.
WORDS = phrases.load_section("lab_messages.md", "Run history", {
    "reference-toggle": (), "reference-tip": (), "reference-none": (), "reference-none-yet": (),
    "saved": ("n", "path"), "loaded": ("n", "path"), "finish-two": (), "earlier-runs": ("n",),
    "reference-found": ("where",), "reference-missing": ("run",)})
say = WORDS.say


def _small(text: str) -> str:
    return f"<small>{html.escape(text)}</small>"


class History:
    """Finished runs, their comparison and the reference overlay."""

    def __init__(self, messages: Messages, reference_dir=None):
        self.runs = []                   # every finished run, as labkit Results
        self.reference_dir = reference_dir
        self.rows = TableRows()
        self.compare_draws = 0           # how often the comparison was drawn (tests: one per change)
        self._messages = messages
        self._drawn = None               # what the comparison chart shows now: redrawn only when that changes
        self._quiet = 0                  # > 0 while code (not the learner) moves the baseline picker
        self.table = widgets.HTML()
        self.picker = widgets.Dropdown(description=label("baseline"), options=[],
                                       layout=widgets.Layout(width="320px"))
        self.picker.observe(lambda ch: None if self._quiet else self.refresh(), "value")
        self.compare_img = widgets.Image(format="png", layout=widgets.Layout(display="none", max_width="760px"))
        self.ratios = widgets.HTML()
        self.box = widgets.Accordion([widgets.VBox([self.table, self.picker, self.compare_img, self.ratios,
                                                    self._file_row(), *self._reference_widgets()])],
                                     selected_index=0)
        self.box.set_title(0, label("history-title"))

    def _file_row(self):
        self.path = widgets.Text(value="labkit_history.json", description=label("file"),
                                 layout=widgets.Layout(width="320px"))
        save = widgets.Button(description=label("save-history"))
        load = widgets.Button(description=label("load-history"))
        save.on_click(lambda _: self._messages.guard(lambda: self.save(self.path.value)))
        load.on_click(lambda _: self._messages.guard(lambda: self.load(self.path.value)))
        return widgets.HBox([self.path, save, load])

    def _reference_widgets(self) -> list:
        refs = reference_mod.load_all(self.reference_dir)
        self.ref_toggle = widgets.Checkbox(description=say("reference-toggle"), indent=False, disabled=not refs)
        self.ref_toggle.tooltip = say("reference-tip" if refs else "reference-none")
        self.ref_toggle.observe(lambda ch: self._refresh_reference(), "value")
        self.ref_img = widgets.Image(format="png", layout=widgets.Layout(display="none", max_width="760px"))
        self.ref_text = widgets.HTML("" if refs else _small(say("reference-none-yet")))
        return [self.ref_toggle, self.ref_text, self.ref_img]

    @property
    def baseline(self) -> int:
        """The index of the run picked as the baseline (0 before there is one)."""
        return self.picker.value if isinstance(self.picker.value, int) else 0

    def show_chart(self, png: bytes):
        """Show a chart made elsewhere (an A/B comparison) where the comparison chart goes."""
        self.compare_img.value = png
        self._drawn = None  # the history's comparison chart is no longer the one shown
        self.compare_img.layout.display = None

    def compare(self, baseline=None) -> list:
        """Compare every run with ``baseline`` (an index into ``history``; default: the one picked in
        the panel). Returns one sentence per run the comparison chart shows (the latest
        ``plots.COMPARE_LAST`` besides the baseline), e.g. 'bf16: 2.1× tokens/s, 0.52× activation
        memory (both at 2 CPU threads)', and shows the chart in the panel."""
        if baseline is not None:
            if not -len(self.runs) <= baseline < len(self.runs):
                raise IndexError(f"baseline={baseline}: the history has {len(self.runs)} run(s)")
            self.picker.value = baseline % len(self.runs)
        if not self.runs:
            return []
        base = self.baseline
        return plots.ratio_lines(self.runs, base, plots.shown_runs(len(self.runs), base))

    def save(self, path) -> str:
        """Write every finished run (config, summary, records) to a JSON file, atomically: on a full
        disk the old file stays whole and an OSError says in one line what failed."""
        data = {"schema": 1, "kind": "labkit-history",
                "runs": [{"config": r.config.to_dict(), "summary": r.summary, "records": r.records}
                         for r in self.runs]}
        # write_atomic, as write_json_atomic does, but with default=str: a corpus given as a
        # pathlib.Path is saved as its text. A temp file in the same folder, then a rename: a write
        # that fails half-way never truncates the good file (it did, with the disk full).
        paths.write_atomic(path, json.dumps(data, default=str))
        self._messages.say(say("saved", n=len(self.runs), path=path), "info")
        return str(path)

    def load(self, path, append=False) -> list:
        """Read runs saved by ``save`` (on this machine or another) into the history. A damaged
        file (cut short, not JSON, nested too deeply) is a ValueError in one line."""
        data = paths.read_json(path, what="history file")
        if not isinstance(data, dict) or data.get("kind") != "labkit-history" or not isinstance(data.get("runs"), list):
            raise ValueError(f"{path} is not a labkit history file (one written by Lab.save_history)")
        runs = [self._saved_run(path, i, r) for i, r in enumerate(data["runs"])]
        self.runs = (self.runs if append else []) + runs
        self.refresh()
        self._messages.say(say("loaded", n=len(runs), path=path), "info")
        return self.runs

    @staticmethod
    def _saved_run(path, i, run) -> Result:
        """One run of a history file, checked: a broken entry is one line naming the run and the field,
        never an AttributeError, nor a run that loads as an empty or made-up configuration."""
        def bad(what):
            return ValueError(f"{path}: run {i}: {what}")

        if not isinstance(run, dict):
            raise bad(f"{run!r} is not a saved run (a dict with config, summary and records)")
        for key, kind, allowed in (("config", dict, "a dict of Config fields"),
                                   ("summary", dict, "a dict (the run's summary)"),
                                   ("records", list, "a list of per-update records")):
            value = run.get(key, [] if key == "records" else None)
            if not isinstance(value, kind):
                raise bad(f"{key}={value!r} is not allowed: {allowed}, as Lab.save_history writes it")
        names = {f.name for f in dataclasses.fields(Config)}
        if not names & set(run["config"]):
            raise bad(f"config={run['config']!r} is not allowed: a dict of Config fields (it has none)")
        # A Config never asks the device, so a run this device refuses (tf32 on a laptop) or with a
        # corpus path of the machine that ran it loads as it was; a value no machine accepts
        # (model='nope', micro_batch=-1) is a broken file. Names a later labkit dropped are skipped.
        try:
            cfg = Config.from_dict({k: v for k, v in run["config"].items() if k in names})
        except ConfigError as e:
            raise bad(f"config {e}") from None
        except Exception as e:  # noqa: BLE001 -- a value of the wrong type can fail any check
            raise bad(f"config is not valid ({type(e).__name__}: {e})") from None
        return Result(cfg, run["summary"], run.get("records", []))

    def refresh(self):
        """The table, the baseline picker, the comparison and the reference overlay, after ``runs`` changed."""
        runs = self.runs
        self.table.value = self.rows.html(runs)  # every run in the table; rows built once each
        options = [(f"{i}: {plots.run_label(r.summary)}", i) for i, r in enumerate(runs)]
        if list(self.picker.options) != options:
            keep = self.picker.value if self.picker.value is not None and self.picker.value < len(runs) else 0
            self._quiet += 1
            try:
                self.picker.options = options
                self.picker.value = keep if options else None
            finally:
                self._quiet -= 1
        if len(runs) >= 2:  # one run compared with itself says nothing
            self._refresh_comparison(runs, self.baseline)
        else:
            self._drawn = None
            self.compare_img.layout.display = "none"
            self.ratios.value = _small(say("finish-two")) if runs else ""
        self._refresh_reference()

    def _refresh_comparison(self, runs, base):
        """The comparison chart and its sentences for the baseline and the latest runs (the chart of
        300 runs collapsed, and drawing it grew with the history): redrawn only when those change."""
        shown = plots.shown_runs(len(runs), base)
        now = [runs[i] for i in shown]
        if self._drawn and self._drawn[0] == base and len(self._drawn[1]) == len(now) \
                and all(a is b for a, b in zip(self._drawn[1], now)):  # the very same runs: nothing to redraw
            return
        with DRAW_LOCK:
            self.compare_img.value = plots.to_png(plots.compare(runs, base))
        self.compare_draws += 1
        self._drawn = (base, now)
        self.compare_img.layout.display = None
        lines = plots.ratio_lines(runs, base, shown)
        earlier = len(runs) - len(shown)
        if earlier:
            lines.append(say("earlier-runs", n=earlier))
        # its own line-height: an ipywidgets HTML's 28 px lines spread each wrapped ratio line apart
        self.ratios.value = "<div style='line-height:1.45'>" + "<br>".join(html.escape(s) for s in lines) + "</div>"

    def show_reference(self, on=True) -> list:
        self.ref_toggle.value = bool(on)
        return self.reference_matches() if on else []

    def reference_matches(self) -> list:
        if not self.runs:
            return []
        return reference_mod.match(self.runs[-1].summary, self.reference_dir)

    def _refresh_reference(self):
        if not self.ref_toggle.value or not self.runs:
            self.ref_img.layout.display = "none"
            return
        points = self.reference_matches()
        last = self.runs[-1]
        chart = plots.reference(last.summary, points)  # no chart without points: the line below says so
        if isinstance(chart, plots.NoChart):
            self.ref_img.layout.display = "none"
        else:
            with DRAW_LOCK:
                self.ref_img.value = plots.to_png(chart)
            self.ref_img.layout.display = None
        if points:
            where = "; ".join(reference_mod.label(p) for p in points)
            self.ref_text.value = _small(say("reference-found", where=where))
        else:
            self.ref_text.value = _small(say("reference-missing", run=describe(last.config)))


_CACHE: dict = {}  # (configuration, device) -> Prediction, or the ConfigError's words when none can be made
# The what-if part's sentences: the "## Predictions in the panel" section of notebooks/lab_messages.md.
PREDICTION_WORDS = phrases.load_section("lab_messages.md", "Predictions in the panel", {
    "no-prediction": ("device", "why"), "not-in-catalogue": ("device",), "predicted": ("predicted",),
    "predicted-caveat": ("caveat", "predicted", "measured"), "predicted-busy": ("predicted", "measured", "who"),
    "predicted-error": ("predicted", "measured", "error"), "busy-other": ("cores",), "busy-machine": (),
    "gpu-note": (), "gpu-title": (), "predicting": ("run",), "cannot-show-gpu": ("error",),
    "effect": ("device", "ms", "tokens", "gib", "fits"), "fits": (), "does-not-fit": (),
    "effect-change": ("here", "threads", "there", "device")})
say_pred = PREDICTION_WORDS.say


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
    key = _cache_key(cfg, device)
    if key not in _CACHE or (retry and caveat_of(_CACHE[key])):
        try:
            _CACHE[key] = predict_mod.predict(cfg, device, progress=False)  # the panel's status says it
        except ConfigError as e:
            _CACHE[key] = say_pred("no-prediction", device=device, why=e)
    return _CACHE[key]


def caveat_of(pred):
    """Why a prediction is not to be trusted (``Prediction.caveat``), or None when it is."""
    return getattr(pred, "caveat", None) if not isinstance(pred, str) else None


def is_cached(cfg: Config, device: str) -> bool:
    return _cache_key(cfg, device) in _CACHE


def _cache_key(cfg: Config, device: str) -> tuple:
    return json.dumps({**cfg.to_dict(), "steps": 0}, sort_keys=True, default=str), device


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
        return say_pred("predicted-caveat", caveat=caveat.rstrip("."), predicted=predicted,
                        measured=ms(measured or 0))
    if not (isinstance(measured, (int, float)) and measured > 0):
        return say_pred("predicted", predicted=predicted)
    if (load or {}).get("busy"):
        other = load.get("other_cores")
        who = say_pred("busy-other", cores=plots.number(other, 2)) if other is not None else \
            say_pred("busy-machine")
        return say_pred("predicted-busy", predicted=predicted, measured=ms(measured), who=who)
    return say_pred("predicted-error", predicted=predicted, measured=ms(measured),
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
        self.note = widgets.HTML(_small(say_pred("gpu-note")))
        self.box = widgets.Accordion([widgets.VBox([self.gpu, self.note, self.img])], selected_index=None)
        self.box.set_title(0, say_pred("gpu-title"))

    def clear(self):
        """A new run starts: a predicted line about the previous one would mislead."""
        self.line.value, self.text = "", ""

    def show_prediction(self, cfg: Config, summary: dict, quiet: bool = True, load: dict = None):
        """After a finished run: the predicted line for this machine, then the GPU chart. ``quiet``:
        nothing else loaded the machine during the run, so a prediction with a caveat is made again;
        ``load``: the run's LoadMeter reading (a busy run's measurement gets no error beside it)."""
        here = this_device_key(self.caps)
        if here is None:
            text = say_pred("not-in-catalogue", device=self.caps.name)
        else:
            if not is_cached(cfg, here) or (quiet and caveat_of(cached_prediction(cfg, here))):
                run = plots.run_label(cfg.to_dict())
                self._messages.status(html.escape(say_pred("predicting", run=run)))
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
                self._messages.say(say_pred("cannot-show-gpu", error=e), "error")
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
        self.note.value = _small(_effect_words(runs, preds))
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
    words = say_pred("effect", device=p_last.device_name, ms=ms(p_last.step_time_s),
                     tokens=plots.number(p_last.tokens_per_s), gib=f"{p_last.memory_bytes / 2**30:.2f}",
                     fits=say_pred("fits" if p_last.fits else "does-not-fit"))
    measured = [r.summary.get("tokens_per_s") for r in runs]
    if len(runs) == 2 and all(isinstance(m, (int, float)) and m > 0 for m in measured):
        # tokens/s, not the step time: with other accumulation or micro-batch an update holds other work
        here = measured[1] / measured[0]
        there = p_last.tokens_per_s / preds[0].tokens_per_s
        words += " " + say_pred("effect-change", here=plots.number(here, 2), threads=_threads_here(runs),
                                there=plots.number(there, 2), device=p_last.device_name)
    return words


def _threads_here(runs) -> str:
    """', 2 CPU threads' (or ', 1 CPU thread against 2') for the measured side of a speed-up."""
    a, b = (plots.cpu_threads(r.summary) for r in runs)
    if a is None or b is None:
        return ""
    words = plots.threads(b, cpu=True)
    return ", " + (label("against-baseline", threads=words, baseline=a) if a != b else words)
