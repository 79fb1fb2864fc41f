"""The lab panel: every knob, Run/Stop, live charts and a run history, in one notebook widget.

    import labkit as lk
    lab = lk.Lab(preset="precision")   # a chapter's knobs open, the others folded away
    lab                                # the last line of a cell shows the panel

Everything the panel does can be done from code too (that is how the notebooks are tested):
``lab.set(precision="bf16", accum=8)``, ``lab.run()`` (blocks, returns the Result),
``lab.history``, ``lab.compare(baseline=0)``, ``lab.save_history(path)``.

Why a background thread: while a cell runs, the kernel handles no widget clicks, so a Stop button
could never interrupt a blocking run. The Run button therefore trains on a thread of its own and
the stop event is checked at every micro-step. ``lab.run()`` trains on the calling thread instead.
"""
from __future__ import annotations

import dataclasses
import html
import json
import threading
import time

import ipywidgets as widgets

from . import plots
from . import reference as reference_mod
from . import runtime, train
from .config import PRECISIONS, PRESETS as MODEL_PRESETS, Config
from .rules import check as check_device
from .errors import ConfigError, NonFiniteError, OutOfMemory, RunError
from .device import capabilities, max_world_size, peak_flops, slowdown
from .compare import Comparison, compare_configs
from .measure import LoadMeter, count_flops
from .panel_parts import CKPT_MODES, DRAW_LOCK, KNOBS, Charts, Choice, describe, last_good, rate, table_html
from .panel_parts import unavailable  # noqa: F401 - part of the panel's API (tests, instructors)

_BUSY = "A run is already going in this kernel (one at a time): wait for it, or press Stop."

# Chapter presets: the knobs shown open, the charts shown, and the knob values to start from.
CHAPTERS = {
    "all": dict(knobs=None, charts=plots.CHARTS, values={}),
    "precision": dict(knobs=("precision", "loss_scaling", "model", "micro_batch", "steps"),
                      charts=("step_time", "memory", "throughput", "loss"), values={}),
    "accumulation": dict(knobs=("accum", "micro_batch", "ddp_sync", "steps"),
                         charts=("memory", "throughput", "allreduce", "loss"), values={"accum": 4}),
    "checkpointing": dict(knobs=("checkpointing", "micro_batch", "model", "memory_budget_gb", "steps"),
                          charts=("memory", "step_time", "utilization", "throughput"), values={}),
    "data": dict(knobs=("workers", "data_cost_ms", "pin_memory", "micro_batch", "steps"),
                 charts=("step_time", "throughput"), values={"data_cost_ms": 2.0}),
    "ddp": dict(knobs=("world_size", "ddp_sync", "accum", "steps"),
                charts=("allreduce", "step_time", "throughput", "loss"), values={"world_size": 2, "accum": 4}),
    "mfu": dict(knobs=("model", "precision", "micro_batch", "checkpointing", "steps"),
                charts=("utilization", "throughput", "step_time"), values={}),
    # chapter 09: trade memory for speed under a budget -- every single-GPU knob, the DDP ones folded
    "playbook": dict(knobs=("precision", "micro_batch", "accum", "checkpointing", "workers", "model", "steps"),
                     charts=("memory", "throughput", "utilization", "step_time"), values={}),
}
DEFAULT_STEPS = 50  # long enough that a CPU run shows a trend and redraws stay a small share of it



# ---- the panel -----------------------------------------------------------------------------------

class Lab:
    """The lab panel. ``Lab(preset="precision", accum=4)`` opens a chapter's preset (all, precision,
    accumulation, checkpointing, data, ddp, mfu) with some knobs set -- any Config field works;
    ``device=`` picks the device (auto, cpu, cuda, mps); ``reference_dir=`` points at reference
    measurements (default: the repository's data/reference/). Show it by making it the last line
    of a cell."""

    def __init__(self, preset: str = "all", *, device: str = "auto", reference_dir=None, **knobs):
        if preset not in CHAPTERS:
            raise ValueError(f"preset={preset!r}: choose one of {', '.join(CHAPTERS)}")
        chapter = CHAPTERS[preset]
        self.preset = preset
        self.caps = capabilities(device)
        self.history = []         # every finished run, as labkit Results
        self.message = ""         # the panel's last message, as plain text
        self.last_timing = {}     # how long the last run and its charts took (see benchmarks/panel.py)
        self._reference_dir = reference_dir
        self._stop = threading.Event()
        self._thread = None
        self._records = []
        self._last_data = None    # what the charts showed at the end of the last run
        self._quiet = 0           # > 0 while code (not the learner) moves controls
        values = dict(chapter["values"])
        if "world_size" in values:  # the DDP chapter asks for 2 processes; a single-GPU machine has 1
            values["world_size"] = min(values["world_size"], max_world_size(self.caps))
        self._base = Config(device=device, steps=DEFAULT_STEPS, **values)  # and the fields without a control
        self._chapter_charts = chapter["charts"]
        self._build_controls(chapter["knobs"] or tuple(KNOBS))
        self._build_run_row(chapter["charts"])
        self._build_history()
        self.widget = widgets.VBox([
            widgets.HTML(f"<b>labkit lab</b> &middot; chapter: {html.escape(preset)}"),
            self._knob_box, self._more, self._notes,
            widgets.HBox([self._run_button, self._stop_button, self._progress]),
            self._status, self._message, self._all_charts, self._charts.box, self._history_box,
        ], layout=widgets.Layout(max_width="1150px"))
        self.widget.add_class("labkit-lab")
        self._apply(self._base)
        self._disable_unavailable()
        self.set(**knobs)
        self._say_status(self._status_prefix() + "idle")
        self._refresh_history()
        _warm_up(self.caps, self._base)

    # -- building the widgets ------------------------------------------------------------------
    def _build_controls(self, shown):
        c, caps, on = self._base, self.caps, self._on_control
        total_gib = (caps.memory_bytes or 0) / 2**30 if caps.kind == "cuda" else 0.0
        slider = dict(continuous_update=False, layout=widgets.Layout(width="300px"))
        self._controls = {
            "precision": Choice([(p, p) for p in PRECISIONS], c.precision, lambda v: on("precision")),
            "loss_scaling": Choice([(s, s) for s in ("auto", "on", "off")], c.loss_scaling,
                                   lambda v: on("loss_scaling")),
            "accum": widgets.IntSlider(min=1, max=64, **slider),
            "ddp_sync": Choice([("no_sync", "no_sync"), ("every micro-batch", "every_micro")], c.ddp_sync,
                               lambda v: on("ddp_sync")),
            "micro_batch": widgets.IntSlider(min=1, max=64, **slider),
            "checkpointing": Choice(CKPT_MODES, "none", lambda v: on("checkpointing")),
            "checkpoint_every": widgets.IntSlider(min=1, max=max(2, c.spec.n_layer), description="k", **slider),
            "optimizer": Choice([("adamw", "adamw"), ("sgd", "sgd")], c.optimizer, lambda v: on("optimizer")),
            "workers": widgets.IntSlider(min=0, max=max(4, caps.cores), **slider),
            "pin_memory": widgets.Checkbox(indent=False),
            "data_cost_ms": widgets.FloatSlider(min=0.0, max=20.0, step=0.5, **slider),
            "world_size": widgets.IntSlider(min=1, max=max(1, max_world_size(caps)), **slider),
            "model": Choice([(m, m) for m in MODEL_PRESETS], c.model, lambda v: on("model")),
            "memory_budget_gb": widgets.FloatSlider(min=0.0, max=max(total_gib, 1.0), step=0.5, **slider),
            "steps": widgets.IntSlider(min=1, max=200, **slider),
        }
        for name, w in self._controls.items():
            if not isinstance(w, Choice):
                w.observe(lambda ch, name=name: on(name), "value")
        rows = {k: self._row(k) for k in KNOBS}
        self._knob_box = widgets.VBox([rows[k] for k in shown])
        folded = [rows[k] for k in KNOBS if k not in shown]
        self._more = widgets.Accordion([widgets.VBox(folded)] if folded else [], selected_index=None)
        if folded:
            self._more.set_title(0, "More knobs")
        self._notes = widgets.HTML()

    def _row(self, knob):
        words, tip = KNOBS[knob]
        label = widgets.HTML(f"<span title='{html.escape(tip)}'>{html.escape(words)}</span>",
                             layout=widgets.Layout(width="160px"))
        if knob == "checkpointing":
            parts = [self._controls["checkpointing"].box, self._controls["checkpoint_every"]]
        else:
            w = self._controls[knob]
            parts = [w.box if isinstance(w, Choice) else w]
        return widgets.HBox([label] + parts)

    def _build_run_row(self, charts):
        self._run_button = widgets.Button(description="Run", button_style="success", icon="play")
        self._stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self._run_button.on_click(lambda _: self.start())
        self._stop_button.on_click(lambda _: self.stop())
        self._progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="260px"))
        self._status = widgets.HTML()
        self._message = widgets.HTML()
        self._charts = Charts(charts)
        self._all_charts = widgets.ToggleButton(description="all charts", value=tuple(charts) == plots.CHARTS,
                                                tooltip="show every chart, not only this chapter's")
        self._all_charts.observe(lambda ch: self._show_charts(), "value")

    def _build_history(self):
        self._table = widgets.HTML()
        self._baseline = widgets.Dropdown(description="baseline", options=[], layout=widgets.Layout(width="320px"))
        self._baseline.observe(lambda ch: None if self._quiet else self._refresh_history(), "value")
        self._compare_img = widgets.Image(format="png", layout=widgets.Layout(display="none", max_width="760px"))
        self._ratios = widgets.HTML()
        self._path = widgets.Text(value="labkit_history.json", description="file",
                                  layout=widgets.Layout(width="320px"))
        save, load = widgets.Button(description="Save history"), widgets.Button(description="Load history")
        save.on_click(lambda _: self._guard(lambda: self.save_history(self._path.value)))
        load.on_click(lambda _: self._guard(lambda: self.load_history(self._path.value)))
        refs = reference_mod.load_all(self._reference_dir)
        self._ref_toggle = widgets.Checkbox(description="show reference numbers from a real GPU", indent=False,
                                            disabled=not refs)
        self._ref_toggle.tooltip = ("measurements in data/reference/" if refs else
                                    "no reference measurements in data/reference/ yet")
        self._ref_toggle.observe(lambda ch: self._refresh_reference(), "value")
        self._ref_img = widgets.Image(format="png", layout=widgets.Layout(display="none", max_width="760px"))
        self._ref_text = widgets.HTML("" if refs else "<small>No reference measurements in data/reference/ "
                                      "yet.</small>")
        box = widgets.VBox([self._table, self._baseline, self._compare_img, self._ratios,
                            widgets.HBox([self._path, save, load]), self._ref_toggle, self._ref_text, self._ref_img])
        self._history_box = widgets.Accordion([box], selected_index=0)
        self._history_box.set_title(0, "Run history")

    def _disable_unavailable(self):
        """Grey out what this device cannot serve and list the reasons under the knobs."""
        self.disabled = unavailable(self.caps, self._base)  # {knob: {value: reason}}
        lines = []
        for knob, values in self.disabled.items():
            w = self._controls[knob]
            for value, why in values.items():
                if isinstance(w, Choice):
                    if value in w.options:
                        w.disable(value, why)
                    name = f"{KNOBS[knob][0]} {value}"
                elif knob in ("pin_memory", "memory_budget_gb") or value == "above 1":
                    w.disabled, w.tooltip = True, why
                    name = KNOBS[knob][0]
                else:  # e.g. world size above the device count: the slider stops there
                    name = f"{KNOBS[knob][0]} {value}"
                lines.append(f"<b>{html.escape(name)}</b>: {html.escape(why)}")
        if self.caps.kind == "cpu":  # allowed, but a learner should know before pressing Run
            for m in ("base", "large"):
                self._controls["model"].button(m).tooltip = "runs on a CPU, but takes minutes per update"
        self._notes.value = ("<div class='labkit-unavailable' style='font-size:0.85em;color:#666'>"
                             "Not available on this device: " + " &middot; ".join(lines) + "</div>") if lines else ""

    # -- controls <-> Config -------------------------------------------------------------------
    @property
    def config(self) -> Config:
        """The Config the knobs describe now (raises ConfigError when they make no valid run here)."""
        cfg = Config(**self._fields())
        check_device(cfg, self.caps)
        return cfg

    def _fields(self) -> dict:
        """Every Config field: the controls' values over the fields that have no control."""
        v = {k: w.value for k, w in self._controls.items()}
        mode = v.pop("checkpointing")
        v["checkpointing"] = "full" if mode == "every_k" else mode
        v["memory_budget_gb"] = v["memory_budget_gb"] or None  # 0 on the slider = no budget
        return {**dataclasses.asdict(self._base), **v}

    def set(self, **knobs) -> "Lab":
        """Set knobs (any Config field) as if the learner had moved the controls; returns the lab."""
        fields = {f.name for f in dataclasses.fields(Config)}
        unknown = sorted(set(knobs) - fields)
        if unknown:
            raise TypeError(f"unknown knob(s) {', '.join(unknown)}; knobs are the Config fields: "
                            + ", ".join(sorted(fields)))
        if not knobs:
            return self
        try:
            cfg = Config(**{**self._fields(), **knobs})  # a bad value raises before any control moves
            check_device(cfg, self.caps)  # and so does one this device refuses
        except ConfigError as e:
            self._say(f"Cannot set that: {e}", "error")
            raise
        self._apply(cfg)
        self._announce_slow_format(cfg)
        return self

    def _apply(self, cfg: Config):
        """Move every control to ``cfg`` (quietly: these are not the learner's moves)."""
        self._base = cfg
        self._quiet += 1
        try:
            c = self._controls
            c["checkpoint_every"].max = max(2, cfg.spec.n_layer)
            for name in ("precision", "loss_scaling", "ddp_sync", "optimizer", "model", "pin_memory"):
                c[name].value = getattr(cfg, name)
            for name in ("accum", "micro_batch", "workers", "data_cost_ms", "world_size", "steps"):
                _slide(c[name], getattr(cfg, name))
            _slide(c["memory_budget_gb"], cfg.memory_budget_gb or 0.0)
            k = cfg.checkpoint_every
            _slide(c["checkpoint_every"], k)
            c["checkpointing"].value = "every_k" if cfg.checkpointing == "full" and k > 1 else cfg.checkpointing
            c["checkpoint_every"].disabled = c["checkpointing"].value != "every_k"
        finally:
            self._quiet -= 1

    def _on_control(self, name):
        """A learner moved a control: keep dependent controls consistent, then check the result."""
        if self._quiet:
            return
        c = self._controls
        self._quiet += 1
        try:
            if name == "model":
                c["checkpoint_every"].max = max(2, self._base.n_layer or MODEL_PRESETS[c["model"].value].n_layer)
            if name == "checkpointing":  # only "every k" shows k: every other mode runs with k = 1
                mode = c["checkpointing"].value
                if mode != "every_k":
                    c["checkpoint_every"].value = 1
                elif mode == "every_k" and c["checkpoint_every"].value < 2:
                    c["checkpoint_every"].value = 2
                c["checkpoint_every"].disabled = mode != "every_k"
        finally:
            self._quiet -= 1
        try:
            self._base = self.config
            if self.message.startswith("Cannot use these knobs"):
                self._say("")
            if name in ("precision", "model", "steps"):
                self._announce_slow_format(self._base)
        except ConfigError as e:
            self._say(f"Cannot use these knobs together: {e}", "error")

    def _announce_slow_format(self, cfg: Config):
        """Before Run: say when bf16/fp16 is emulated here, and how long the run will take at least."""
        words = slow_format_note(self.caps, cfg)
        if words:
            self._say(words, "info")
        elif self.message.startswith(("bf16 runs about", "fp16 runs about")):
            self._say("")

    # -- running -------------------------------------------------------------------------------
    def run(self, **knobs):
        """Set ``knobs`` (if any), train on this thread and return the Result. Errors show in the
        panel and are raised too (ConfigError, OutOfMemory, RunError)."""
        self.set(**knobs)
        with self._claim() as slot, slot.here():
            self._stop = threading.Event()
            return self._execute(self.config, time.perf_counter())

    def _claim(self) -> runtime.Claim:
        """The kernel's one-run slot (runtime), or the panel says why not and raises RunError."""
        try:
            return runtime.claim(_BUSY)
        except RunError:
            self._say(_BUSY, "error")
            raise

    def start(self):
        """What the Run button does: train on a background thread, so that Stop stays clickable.
        Returns the thread (None when the run could not start; the panel says why)."""
        pressed = time.perf_counter()
        try:
            slot = self._claim()
        except RunError:
            return None
        try:
            cfg = self.config
        except ConfigError as e:
            slot.release()
            self._say(f"Cannot run these knobs: {e}", "error")
            return None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._background, args=(slot, cfg, pressed), daemon=True,
                                        name="labkit-run")
        self._thread.start()
        return self._thread

    def _background(self, slot, cfg, pressed):
        with slot, slot.here():
            try:
                self._execute(cfg, pressed)
            except Exception:  # noqa: BLE001 -- already shown in the panel; a thread has nowhere to raise to
                pass

    def stop(self):
        """End the current run at its next micro-step; its loader workers and DDP processes end too."""
        if runtime.busy():
            self._stop.set()
            self._say_status(self._status_prefix() + "stopping&hellip;")

    def wait(self, timeout=None) -> bool:
        """Wait for a run started with the Run button; True once none is going."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def running(self) -> bool:
        return runtime.busy()

    def _execute(self, cfg: Config, pressed: float):
        """Train ``cfg`` with the panel live; the caller holds the one-run slot (runtime)."""
        self._records, self._cfg, self._last_status = [], cfg, 0.0
        self._progress.max, self._progress.value, self._progress.bar_style = cfg.steps, 0, ""
        self._stop_button.disabled = False
        self._say("")
        self._charts.reset(pressed)
        self._charts.clear()
        what = describe(cfg)
        extra = ""
        if cfg.world_size > 1:
            extra = (f" &middot; starting {cfg.world_size} DDP processes (each imports PyTorch: several "
                     "seconds before the first update)")
        elif cfg.workers:
            extra = f" &middot; starting {cfg.workers} loader worker(s)"
        self._say_status(self._status_prefix() + f"running {what}{extra}")
        slow = slow_format_note(self.caps, cfg)
        if slow:
            self._say(slow, "info")
        t0 = time.perf_counter()
        meter = LoadMeter()
        try:
            result = train.run(cfg, on_step=self._on_step, stop=self._stop)
        except ConfigError as e:
            self._fail(f"Cannot run these knobs: {e}")
            raise
        except OutOfMemory as e:
            self._fail(f"Out of memory: {e} The memory has been freed: change a knob and run again.")
            raise
        except NonFiniteError as e:
            self._fail(f"The run was stopped at an inf/NaN: {e}{last_good(self._records)}")
            raise
        except RunError as e:
            self._fail(f"The run failed: {e}")
            raise
        except KeyboardInterrupt:
            self._fail("Interrupted. The panel is ready for the next run.")
            raise
        except Exception as e:
            self._fail(f"The run failed: {type(e).__name__}: {e}")
            raise
        finally:
            self._stop_button.disabled = True
        run_s = time.perf_counter() - t0
        done = result.summary.get("status") == "completed"
        if done:
            self.history.append(result)
        self._last_data = {"records": result.records, "summary": result.summary if done else None}
        self._charts.draw(self._last_data, final=True)
        t_history = time.perf_counter()
        if done:
            self._refresh_history()  # the table, and the comparison chart once there are two runs
            self._progress.bar_style = "success"
            self._say_status(self._status_prefix() + f"done: {what} &middot; {rate(result.summary)}"
                             + busy_words(meter.read()))
            skipped = result.summary.get("skipped_steps") or 0
            if skipped:
                why = ("the GradScaler found inf/NaN gradients and lowered its scale" if cfg.scaling_on else
                       "their gradients held inf/NaN (on_nonfinite='skip')")
                self._say(f"{skipped} of {cfg.steps} updates were skipped: {why}. The loss chart marks them.")
            elif result.summary.get("precision_note"):  # e.g. fp16 on a CPU: say why it may be slow
                self._say(f"{cfg.precision} here: {result.summary['precision_note']}.", "info")
        else:
            n = len(result.records)
            self._progress.bar_style = "warning"
            self._say_status(self._status_prefix() + f"stopped after {n} of {cfg.steps} updates")
            self._say(f"Stopped after {n} of {cfg.steps} updates; a stopped run is not added to the history. "
                      "The panel is ready for the next run.", "info")
        now = time.perf_counter()
        total = now - pressed
        self.last_timing = {  # what benchmarks/panel.py reports
            "run_s": run_s, "total_s": total, "chart_s": self._charts.spent, "renders": self._charts.renders,
            "chart_overhead": self._charts.spent / total if total else None,  # live charts' share
            "first_chart_s": (self._charts.first_at - pressed) if self._charts.first_at else None,
            "history_s": now - t_history,  # history table and comparison chart, after the run
        }
        return result

    def _on_step(self, rec):
        """After every optimizer update: progress, and a chart redraw when the budget allows."""
        self._records.append(rec)
        now = time.perf_counter()
        cfg = self._cfg
        if now - self._last_status > 0.2 or rec["update"] == cfg.steps:
            self._last_status = now
            self._progress.value = rec["update"]
            self._say_status(self._status_prefix() + f"running {describe(cfg)} &middot; update {rec['update']}"
                             f"/{cfg.steps} &middot; {1000 * rec['step_time_s']:.0f} ms/update")
        last = rec["update"] == cfg.steps  # the final picture follows right after: skip this one
        if not last and self._charts.due(now):
            self._charts.draw({"records": self._records})

    def _fail(self, text):
        self._progress.bar_style = "danger"
        self._say(text, "error")
        self._say_status(self._status_prefix() + "failed &middot; ready for the next run")

    # -- history and comparison ------------------------------------------------------------------
    def compare(self, baseline=None) -> list:
        """Compare every run with ``baseline`` (an index into ``history``; default: the one picked in
        the panel). Returns one sentence per run, e.g. 'bf16: 2.1× tokens/s, 0.52× activation memory',
        and shows the comparison chart in the panel."""
        if baseline is not None:
            if not -len(self.history) <= baseline < len(self.history):
                raise IndexError(f"baseline={baseline}: the history has {len(self.history)} run(s)")
            self._baseline.value = baseline % len(self.history)
        if not self.history:
            return []
        return plots.ratio_lines(self.history, self._baseline.value or 0)

    def ab(self, metric: str = "tokens_per_s", budget_s: float = 30.0, **changes) -> Comparison:
        """The panel's knobs (a, the baseline) against the same with ``changes`` (b), run interleaved
        with repeats (``lk.compare_configs``); the panel shows every repeat and the verdict sentence."""
        a = self.config
        b = a.replace(**changes)
        with self._claim() as slot, slot.here():
            self._say_status(self._status_prefix() + f"comparing {describe(b)} with the knobs as set, "
                             f"interleaved, for up to {budget_s:.0f} s&hellip;")
            cmp = compare_configs(a, b, metric=metric, budget_s=budget_s, progress=False)
        self._compare_img.value = plots.to_png(plots.comparison(cmp))
        self._compare_img.layout.display = None
        self._say(cmp.sentence.replace("**", ""), "info")
        self._say_status(self._status_prefix() + f"compared: {cmp.verdict}" + busy_words(cmp.load))
        return cmp

    def save_history(self, path) -> str:
        """Write every finished run (config, summary, records) to a JSON file."""
        data = {"schema": 1, "kind": "labkit-history",
                "runs": [{"config": r.config.to_dict(), "summary": r.summary, "records": r.records}
                         for r in self.history]}
        with open(path, "w") as f:
            json.dump(data, f, default=str)
        self._say(f"Saved {len(self.history)} run(s) to {path}.", "info")
        return str(path)

    def load_history(self, path, append=False) -> list:
        """Read runs saved by ``save_history`` (on this machine or another) into the history."""
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("kind") != "labkit-history" or not isinstance(data.get("runs"), list):
            raise ValueError(f"{path} is not a labkit history file (one written by Lab.save_history)")
        runs = [self._saved_run(path, i, r) for i, r in enumerate(data["runs"])]
        self.history = (self.history if append else []) + runs
        self._refresh_history()
        self._say(f"Loaded {len(runs)} run(s) from {path}.", "info")
        return self.history

    @staticmethod
    def _saved_run(path, i, run) -> train.Result:
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
        return train.Result(cfg, run["summary"], run.get("records", []))

    def _refresh_history(self):
        runs = self.history
        self._table.value = table_html(runs)
        options = [(f"{i}: {plots.run_label(r.summary)}", i) for i, r in enumerate(runs)]
        if list(self._baseline.options) != options:
            keep = self._baseline.value if self._baseline.value is not None and self._baseline.value < len(runs) else 0
            self._quiet += 1
            try:
                self._baseline.options = options
                self._baseline.value = keep if options else None
            finally:
                self._quiet -= 1
        base = self._baseline.value or 0
        if len(runs) >= 2:  # one run compared with itself says nothing
            with DRAW_LOCK:
                self._compare_img.value = plots.to_png(plots.compare(runs, base))
            self._compare_img.layout.display = None
            self._ratios.value = "<br>".join(html.escape(s) for s in plots.ratio_lines(runs, base))
        else:
            self._compare_img.layout.display = "none"
            self._ratios.value = "<small>Finish two runs to compare them.</small>" if runs else ""
        self._refresh_reference()

    def show_reference(self, on=True) -> list:
        """Show (or hide) reference numbers for the last run's configuration; returns the matches."""
        self._ref_toggle.value = bool(on)
        return self._reference_matches() if on else []

    def _reference_matches(self) -> list:
        if not self.history:
            return []
        return reference_mod.match(self.history[-1].summary, self._reference_dir)

    def _refresh_reference(self):
        if not self._ref_toggle.value or not self.history:
            self._ref_img.layout.display = "none"
            return
        points = self._reference_matches()
        last = self.history[-1]
        chart = plots.reference(last.summary, points)  # no chart without points: the line below says so
        if isinstance(chart, plots.NoChart):
            self._ref_img.layout.display = "none"
        else:
            with DRAW_LOCK:
                self._ref_img.value = plots.to_png(chart)
            self._ref_img.layout.display = None
        if points:
            self._ref_text.value = "<small>The same configuration measured on: " + "; ".join(
                html.escape(reference_mod.label(p)) for p in points) + "</small>"
        else:
            self._ref_text.value = ("<small>No reference measurement has this configuration "
                                    f"({html.escape(describe(last.config))}).</small>")

    # -- small helpers -----------------------------------------------------------------------------
    def _show_charts(self):
        self._charts.show(plots.CHARTS if self._all_charts.value else self._chapter_charts)
        if self._last_data and not self.running:  # draw the last run in the charts now shown
            self._charts.draw(self._last_data, final=True)

    def _status_prefix(self) -> str:
        return f"{self.caps.kind} &middot; {html.escape(self.caps.name)} &middot; "

    def _say_status(self, text):
        self._status.value = f"<span class='labkit-status'>{text}</span>"

    def _say(self, text, kind="info"):
        """The message under the buttons (errors in red, with the numbers that explain them)."""
        self.message = text
        bg, fg = {"error": ("#fdecea", "#b71c1c")}.get(kind, ("#eef5fb", "#0d47a1"))
        self._message.value = (f"<div class='labkit-message labkit-{kind}' style='background:{bg};color:{fg};"
                               f"padding:4px 8px;border-radius:4px'>{html.escape(text)}</div>") if text else ""

    def _guard(self, action):
        try:
            action()
        except (OSError, ValueError) as e:
            self._say(f"{type(e).__name__}: {e}", "error")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self):
        return f"Lab(preset={self.preset!r}, {len(self.history)} run(s) in history, knobs: {describe(self._base)})"


# ---- module helpers ------------------------------------------------------------------------------

def slow_format_note(caps, cfg: Config):
    """'bf16 runs about 50x slower than fp32 here ...' with a predicted lower bound on the run's time,
    or None when the format is not emulated on this device."""
    factor = slowdown(caps, cfg.precision)
    if factor is None or factor < 2:
        return None
    peak, _ = peak_flops(caps, cfg.precision, train.threads_for(cfg, caps.kind, cfg.world_size))
    flops = count_flops(cfg.spec) * cfg.micro_batch * cfg.accum * cfg.world_size
    predicted = cfg.steps * flops / (peak * cfg.world_size)
    return (f"{cfg.precision} runs about {factor:.0f}x slower than fp32 here: this {caps.kind} has no "
            f"{cfg.precision} units, so it is converted in software. Predicted: at least {predicted:.2g} s for "
            f"{cfg.steps} updates (the model's FLOPs at this device's measured {cfg.precision} matmul speed).")


def busy_words(load: dict) -> str:
    """' · ⚠ machine busy ...' for the status line when others loaded the machine during the run."""
    if not load.get("busy"):
        return ""
    other = load.get("other_cores")
    what = f"other programs used {other:.1f} cores" if other is not None else "the load average was high"
    return f" &middot; ⚠ machine busy during the run ({what}): timings are noisy, compare with repeats"


def _warm_up(caps, cfg):
    """Do the one-time work of a kernel's first run now, while the learner reads the panel, so the
    first chart comes quickly after Run: a CPU has no datasheet peak, so its peak FLOP/s is read from
    the cache or probed (at most a second), and counting FLOPs first loads PyTorch's compiler stack (1-2 s)."""
    peak_flops(caps, cfg.precision, train.threads_for(cfg, caps.kind, cfg.world_size))
    count_flops(cfg.spec)


def _slide(w, value):
    """Set a slider, widening its range first if code asks for a value beyond it."""
    if value > w.max:
        w.max = value
    if value < w.min:
        w.min = value
    w.value = value
