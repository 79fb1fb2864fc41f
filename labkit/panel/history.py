"""The lab panel's run history: the table of finished runs, the comparison with a baseline, saving
and loading histories, and reference numbers from a real GPU.

``History`` is an object the panel (``labkit.panel.lab.Lab``) owns. Its interface: ``runs`` (every
finished run, as Results), ``baseline`` (the index picked as the baseline), ``reference_dir``,
``refresh()`` after ``runs`` changed, ``compare``, ``save``, ``load``, ``show_reference``,
``show_chart(png)`` for a chart made elsewhere (an A/B), and its widget ``box``. It speaks through the
panel's ``Messages``.
"""
from __future__ import annotations

import dataclasses
import html
import json

import ipywidgets as widgets

from ..base import paths, phrases
from ..tools import plots
from ..tools import reference as reference_mod
from ..engine.config import Config
from ..base.runtime import ConfigError
from .parts import DRAW_LOCK, Messages, TableRows, describe, label
from ..engine.train import Result

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
