"""The lab panel: every knob, Run/Stop, live charts and a run history, in one notebook widget. ``Lab`` runs and
shows; it owns its parts as objects, each with its own state: its knobs (``knobs.Knobs``), its run history and
what-if predictions (``history.History``, ``history.WhatIf``), its status and message lines and its live charts
(``parts.Messages``, ``parts.Charts``).

    import labkit as lk
    lab = lk.Lab(preset="precision")   # a chapter's knobs open, the others folded away
    lab                                # the last line of a cell shows the panel

Everything the panel does can be done from code too (that is how the notebooks are tested): ``lab.set(precision=
"bf16", accum=8)``, ``lab.run()`` (blocks, returns the Result), ``lab.history``, ``lab.compare(baseline=0)``.

Why a background thread: while a cell runs, the kernel handles no widget clicks, so a Stop button could never
interrupt a blocking run. The Run button therefore trains on a thread of its own and the stop event is checked at
every micro-step; ``lab.run()`` trains on the calling thread. On Colab, which shows a widget's changes from a
background thread only when another cell runs, the Run button trains on the kernel's thread, the charts are
drawn when the run ends, and a line in the panel says so (``FOREGROUND_WORDS``).
"""
from __future__ import annotations

import html
import threading
import time

import ipywidgets as widgets

from ..tools import plots
from ..base import phrases, runtime
from ..base.frontend import display_widget, threads_draw_late
from ..engine import train
from ..tools.compare import Comparison, compare_configs
from ..engine.config import Config
from ..engine.device import capabilities, max_world_size, peak_flops, slowdown
from ..base.runtime import ConfigError, NonFiniteError, OutOfMemory, RunError
from ..engine.measure import LoadMeter, count_flops
from ..engine.warm import prestart, warm_server_pid, warm_start
from .history import History, WhatIf
from .knobs import Knobs
from .parts import KNOB_WORDS, Charts, Messages, describe, label, last_good, rate, speed_note
from ..tools.plots import number
from .parts import unavailable  # noqa: F401 - part of the panel's API (tests, instructors)

# The panel's sentences: the "## Lab panel" section of notebooks/lab_messages.md (key: the placeholders filled).
WORDS = phrases.load_section("lab_messages.md", "Lab panel", {
    "busy": (), "foreground": (), "all-charts": (), "knobs-conflict": ("error",), "cannot-run": ("error",),
    "running": ("run", "update", "steps", "ms"), "failed-ready": (), "comparing": ("run", "seconds"),
    "slow-format": ("precision", "factor", "kind", "seconds", "steps"), "stopped-status": ("n", "steps"),
    "stopped": ("n", "steps"), "skipped-scaler": (), "skipped-nonfinite": (), "skipped": ("skipped", "steps", "why"),
    "starting-ddp-cold": ("n",), "starting-ddp-warm": ("n",), "starting-ddp-first": ("n",),
    "starting-workers": ("n",), "longer": ("steps", "knob"), "oom": ("error",), "nonfinite": ("error", "last_good"),
    "failed": ("error",), "interrupted": (), "busy-other": ("cores",), "busy-load": (), "machine-busy": ("what",)})
say = WORDS.say
_BUSY = say("busy")
# Where widget changes from a background thread reach the page late (Colab: they show when another cell runs,
# colabtools issue 3373), the Run button trains on the kernel's own thread and the panel says so in this line.
FOREGROUND_WORDS = say("foreground")

# Chapter presets: the knobs shown open, the charts shown, and the knob values to start from.
CHAPTER_PRESETS = {
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
# Short enough to toggle and watch: the small model's update took about 2.3 s on a busy 2-core AVX2
# CPU, so 50 updates were 103-120 s; 8 are about 20-25 s there and still show a trend (the first is
# warm-up). The steps knob (in every chapter's knobs) asks for a longer run.
DEFAULT_STEPS = 8
# An A/B's verdict on the status line ("## Panel labels")
_COMPARED = {"same": "compared-same", "higher": "compared-higher", "lower": "compared-lower"}


# ---- the panel -----------------------------------------------------------------------------------

class Lab:
    """The lab panel. ``Lab(preset="precision", accum=4)`` opens a chapter's preset (all, precision,
    accumulation, checkpointing, data, ddp, mfu, playbook) with some knobs set -- any Config field
    works; ``device=`` picks the device (auto, cpu, cuda, mps); ``reference_dir=`` points at reference
    measurements (default: the repository's data/reference/). Show it by making it the last line
    of a cell."""
    _ipython_display_ = display_widget  # as its ipywidgets box, on ipywidgets 7 and 8 (base.frontend)

    def __init__(self, preset: str = "all", *, device: str = "auto", reference_dir=None, **knobs):
        if preset not in CHAPTER_PRESETS:
            raise ValueError(f"preset={preset!r}: choose one of {', '.join(CHAPTER_PRESETS)}")
        chapter = CHAPTER_PRESETS[preset]
        self.preset = preset
        self.caps = capabilities(device)
        self.last_timing = {}     # how long the last run and its charts took (see benchmarks/panel.py)
        self._stop = threading.Event()
        self._thread = None
        self._records = []
        self._last_data = None    # what the charts showed at the end of the last run
        values = dict(chapter["values"])
        if "world_size" in values:  # the DDP chapter asks for 2 processes; a single-GPU machine has 1
            values["world_size"] = min(values["world_size"], max_world_size(self.caps))
        base = Config(device=device, steps=DEFAULT_STEPS, **values)  # and the fields without a control
        self._messages = Messages(self.caps)
        self._knobs = Knobs(self.caps, base, chapter["knobs"] or tuple(KNOB_WORDS), on_change=self._knob_moved)
        self._history = History(self._messages, reference_dir)
        self._whatif = WhatIf(self.caps, self._history, self._messages)
        self._chapter_charts = chapter["charts"]
        self._build_run_row(chapter["charts"])
        k, m, self.foreground = self._knobs, self._messages, threads_draw_late()  # foreground: see start()
        self.widget = widgets.VBox([
            widgets.HTML("<b>labkit lab</b> &middot; " + html.escape(label("chapter", preset=preset))),
            k.box, k.more, k.notes, k.changes, widgets.HBox([self._run_button, self._stop_button, self._progress]),
            *([_foreground_line()] if self.foreground else []),
            m.status_line, m.message_line, self._whatif.line, self._all_charts, self._charts.box, self._whatif.box,
            self._history.box,
        ], layout=widgets.Layout(max_width="1150px"))
        self.widget.add_class("labkit-lab")
        k.apply(base)
        k.disable_unavailable()
        self.set(**knobs)._knobs.mark_defaults()  # the chapter's knobs: what a later set() or run() moves shows
        m.status(html.escape(label("idle")))
        self._history.refresh()
        _warm_up(self.caps, k.base)  # the knobs as set: their format's peak is the one the first run needs

    def _build_run_row(self, charts):
        self._run_button = widgets.Button(description=label("run"), button_style="success", icon="play")
        self._stop_button = widgets.Button(description=label("stop"), button_style="danger", icon="stop", disabled=True)
        self._run_button.on_click(lambda _: self.start())
        self._stop_button.on_click(lambda _: self.stop())
        self._progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="260px"))
        self._charts = Charts(charts)
        self._all_charts = widgets.ToggleButton(description=label("all-charts-button"), tooltip=say("all-charts"),
                                                value=tuple(charts) == plots.CHARTS)
        self._all_charts.observe(lambda ch: self._show_charts(), "value")

    # -- the knobs -----------------------------------------------------------------------------------
    @property
    def config(self) -> Config:
        """The Config the knobs describe now (raises ConfigError when they make no valid run here)."""
        return self._knobs.config

    def set(self, **knobs) -> Lab:
        """Set knobs (any Config field) as if the learner had moved the controls; returns the lab."""
        try:
            cfg = self._knobs.check(knobs)
        except ConfigError as e:
            self._messages.say(label("cannot-set", error=e), "error")
            raise
        if cfg is not None:
            self._knobs.apply(cfg)
            self._announce_slow_format(cfg)
            if cfg.world_size > 1:
                prestart()  # the DDP processes' server starts now, not when Run is pressed
        return self

    def _knob_moved(self, name, error):
        """The learner moved a control: say when the knobs make no run, or what the new format costs."""
        if error is not None:
            self._conflict = say("knobs-conflict", error=error)
            self._messages.say(self._conflict, "error")
            return
        if self.message and self.message == getattr(self, "_conflict", None):
            self._messages.say("")
        if name in ("precision", "model", "steps"):
            self._announce_slow_format(self._knobs.base)
        if name == "world_size" and self._knobs.base.world_size > 1:
            prestart()  # the DDP processes' server starts while the learner reaches for Run

    def _announce_slow_format(self, cfg: Config):
        """Before Run: say when bf16/fp16 is emulated here, and how long the run will take at least."""
        words = slow_format_note(self.caps, cfg)
        if words:
            self._messages.note(words)
        else:  # a note about other knobs goes
            self._messages.drop_note()

    # -- the history and the predictions (their parts do the work) ----------------------------------------
    @property
    def history(self) -> list:
        """Every finished run, as labkit Results."""
        return self._history.runs

    @history.setter
    def history(self, runs):
        self._history.runs = runs

    def compare(self, baseline=None) -> list:
        """One sentence per run against ``baseline`` (an index into ``history``; default: the one picked
        in the panel), e.g. 'bf16: 2.1× tokens/s, ...'; the panel shows the chart."""
        return self._history.compare(baseline)

    def save_history(self, path) -> str:
        """Write every finished run to a JSON file, atomically (see ``History.save``)."""
        return self._history.save(path)

    def load_history(self, path, append=False) -> list:
        """Read runs saved by ``save_history`` into the history (a damaged file is a ValueError)."""
        return self._history.load(path, append)

    def show_reference(self, on=True) -> list:
        """Show (or hide) reference numbers for the last run's configuration; returns the matches."""
        return self._history.show_reference(on)

    def show_whatif(self, device: str = None):
        """The last run measured here beside ``device``'s prediction (see ``WhatIf.show``)."""
        return self._whatif.show(device)

    @property
    def predicted_text(self) -> str:
        """The predicted line for this machine after the last run, as plain text."""
        return self._whatif.text

    @property
    def compare_draws(self) -> int:
        """How often the comparison chart was drawn (once per change, not once per refresh)."""
        return self._history.compare_draws

    @property
    def message(self) -> str:
        """The panel's last message, as plain text."""
        return self._messages.text

    # -- running -------------------------------------------------------------------------------
    def run(self, **knobs):
        """Set ``knobs`` (if any), train on this thread and return the Result. Errors show in the
        panel and are raised too (ConfigError, OutOfMemory, RunError)."""
        self.set(**knobs)
        with _claim(self._messages) as slot, slot.here():
            self._stop = threading.Event()
            return self._execute(self.config, time.perf_counter())

    def start(self):
        """What the Run button does: train on a background thread, so that Stop stays clickable (Colab: on
        this one, charts drawn at the end). Returns the thread (None: not started, the panel says why; or done)."""
        pressed = time.perf_counter()
        try:
            slot = _claim(self._messages)
        except RunError:
            return None
        try:
            cfg = self.config
        except ConfigError as e:
            slot.release()
            self._messages.say(say("cannot-run", error=e), "error")
            return None
        self._stop = threading.Event()
        if self.foreground:  # mid-run charts would not show: drawn at the end; returns None when done
            return self._background(slot, cfg, pressed, live=False)
        self._thread = threading.Thread(target=self._background, args=(slot, cfg, pressed), daemon=True,
                                        name="labkit-run")
        self._thread.start()
        return self._thread

    def _background(self, slot, cfg, pressed, live=True):
        with slot, slot.here():
            try:
                self._execute(cfg, pressed, live)
            except (Exception, KeyboardInterrupt):  # noqa: BLE001 -- shown in the panel; nowhere to raise to
                pass

    def stop(self):
        """End the current run at its next micro-step; its loader workers and DDP processes end too."""
        if runtime.busy():
            self._stop.set()
            self._messages.status(html.escape(label("stopping")) + "&hellip;")

    def wait(self, timeout=None) -> bool:
        """Wait for a run started with the Run button; True once none is going."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def running(self) -> bool:
        return runtime.busy()

    def _execute(self, cfg: Config, pressed: float, live: bool = True):
        """Train ``cfg`` with the panel live (``live``: charts redrawn mid-run too); the caller holds the slot."""
        self._begin(cfg, pressed, live)
        t0 = time.perf_counter()
        meter = LoadMeter()
        try:
            result = train.run(cfg, on_step=self._on_step, stop=self._stop)
        except (Exception, KeyboardInterrupt) as e:
            self._fail(_failure_words(e, self._records))
            raise
        finally:
            self._stop_button.disabled = True
        run_s = time.perf_counter() - t0
        mid_run_charts = self._charts.spent  # drawn between updates: inside run_s, but the panel's cost
        t_history = self._show_result(cfg, result, meter)
        now = time.perf_counter()
        total = now - pressed
        self.last_timing = {  # what benchmarks/panel.py reports
            "run_s": run_s, "total_s": total, "chart_s": self._charts.spent, "renders": self._charts.renders,
            "chart_overhead": self._charts.spent / total if total else None,  # live charts' share
            "first_chart_s": (self._charts.first_at - pressed) if self._charts.first_at else None,
            "history_s": now - t_history,  # history table and comparison chart, after the run
            "panel_s": total - run_s + mid_run_charts,  # everything the panel added to the training
        }
        return result

    def _begin(self, cfg: Config, pressed: float, live: bool = True):
        """The panel as a run of ``cfg`` starts: progress at 0, empty charts, what is starting."""
        self._records, self._cfg, self._last_status, self._live_charts = [], cfg, 0.0, live
        self._progress.max, self._progress.value, self._progress.bar_style = cfg.steps, 0, ""
        self._stop_button.disabled = False
        self._messages.say("")
        self._whatif.clear()
        self._charts.reset(pressed)
        self._charts.clear()
        self._messages.status(html.escape(label("running-start", run=describe(cfg))) + _starting_words(cfg))
        slow = slow_format_note(self.caps, cfg)
        if slow:
            self._messages.note(slow)

    def _show_result(self, cfg: Config, result, meter) -> float:
        """The finished (or stopped) run in the panel: history, final charts, status and message.
        Returns when the history part began (benchmarks/panel.py times it)."""
        done = result.summary.get("status") == "completed"
        if done:
            self.history.append(result)
        self._last_data = {"records": result.records, "summary": result.summary if done else None}
        self._charts.draw(self._last_data, final=True)
        t_history = time.perf_counter()
        load = meter.read() if done else {}
        if done:  # a stopped run is not added to the history, nor predicted
            self._history.refresh()  # the table, and the comparison chart once there are two runs
            # predicted, beside the measurement; cached per config (re-made after a quiet run if it had a caveat)
            self._whatif.show_prediction(cfg, result.summary, quiet=not load.get("busy"), load=load)
        self._progress.bar_style = "success" if done else "warning"
        status, message = _result_words(cfg, result, load)
        self._messages.status(status)
        if message:
            self._messages.say(message, "info")
        return t_history

    def _on_step(self, rec):
        """After every optimizer update: progress, and a chart redraw when the budget allows."""
        self._records.append(rec)
        now = time.perf_counter()
        cfg = self._cfg
        if now - self._last_status > 0.2 or rec["update"] == cfg.steps:
            self._last_status = now
            self._progress.value = rec["update"]
            self._messages.status(say("running", run=describe(cfg), update=rec["update"], steps=cfg.steps,
                                      ms=f"{1000 * rec['step_time_s']:.0f}"))
        last = rec["update"] == cfg.steps  # the final picture follows right after: skip this one
        if not last and self._live_charts and self._charts.due(now):
            self._charts.draw({"records": self._records})

    def _fail(self, text):
        self._progress.bar_style = "danger"
        self._messages.say(text, "error")
        self._messages.status(say("failed-ready"))

    def ab(self, metric: str = "tokens_per_s", budget_s: float = 30.0, **changes) -> Comparison:
        """The panel's knobs (a, the baseline) against the same with ``changes`` (b), run interleaved
        with repeats (``lk.compare_configs``); the panel shows every repeat and the verdict sentence."""
        a = self.config
        b = a.replace(**changes)
        with _claim(self._messages) as slot, slot.here():
            self._messages.status(say("comparing", run=describe(b), seconds=f"{budget_s:.0f}"))
            cmp = compare_configs(a, b, metric=metric, budget_s=budget_s, progress=False)
        self._history.show_chart(plots.to_png(plots.comparison(cmp)))
        self._messages.say(cmp.sentence.replace("**", ""), "info")
        self._messages.status(html.escape(label(_COMPARED[cmp.verdict])) + busy_words(cmp.load))
        return cmp

    # -- small helpers -----------------------------------------------------------------------------
    def _show_charts(self):
        self._charts.show(plots.CHARTS if self._all_charts.value else self._chapter_charts)
        if self._last_data and not self.running:  # draw the last run in the charts now shown
            self._charts.draw(self._last_data, final=True)

    def __repr__(self):
        return (f"Lab(preset={self.preset!r}, {len(self.history)} run(s) in history, "
                f"knobs: {describe(self._knobs.base)})")


# ---- module helpers ------------------------------------------------------------------------------

def _foreground_line():
    """The panel's line that says it trains in the foreground and draws at the end (Colab)."""
    return widgets.HTML(f"<small class='labkit-foreground'>{html.escape(FOREGROUND_WORDS)}</small>")


def slow_format_note(caps, cfg: Config):
    """'bf16 runs about 50x slower than fp32 here ...' with a predicted lower bound on the run's time,
    or None when the format is not emulated on this device."""
    factor = slowdown(caps, cfg.precision)
    if factor is None or factor < 2:
        return None
    peak, _ = peak_flops(caps, cfg.precision, train.threads_for(cfg, caps.kind, cfg.world_size))
    flops = count_flops(cfg.spec) * cfg.micro_batch * cfg.accum * cfg.world_size
    predicted = cfg.steps * flops / (peak * cfg.world_size)
    return say("slow-format", precision=cfg.precision, factor=f"{factor:.0f}", kind=caps.kind,
               seconds=number(predicted, 2), steps=cfg.steps)


def _claim(messages: Messages) -> runtime.Claim:
    """The kernel's one-run slot (runtime), or the panel says why not and raises RunError."""
    try:
        return runtime.claim(_BUSY)
    except RunError:
        messages.say(_BUSY, "error")
        raise


def _result_words(cfg: Config, result, load: dict) -> tuple:
    """The status line after a run ended, and its message (None: the message shown stays)."""
    if result.summary.get("status") != "completed":
        n = len(result.records)
        return say("stopped-status", n=n, steps=cfg.steps), say("stopped", n=n, steps=cfg.steps)
    jump = speed_note(result)  # also in the history table's notes
    status = (html.escape(label("done", run=describe(cfg))) + f" &middot; {rate(result.summary)}"
              + busy_words(load)
              + (f" &middot; {html.escape(jump)}" if jump else "") + _longer_words(cfg))
    skipped = result.summary.get("skipped_steps") or 0
    if skipped:
        why = say("skipped-scaler" if cfg.scaling_on else "skipped-nonfinite")
        return status, say("skipped", skipped=skipped, steps=cfg.steps, why=why)
    if result.summary.get("precision_note"):  # e.g. fp16 on a CPU: say why it may be slow
        return status, label("precision-note", precision=cfg.precision, note=result.summary["precision_note"])
    return status, None


def _starting_words(cfg: Config) -> str:
    """What a run starts besides training, and why the first update may take a while."""
    if cfg.world_size > 1:
        key = "starting-ddp-cold" if not warm_start() else "starting-ddp-warm" if warm_server_pid() else \
            "starting-ddp-first"
        return " &middot; " + say(key, n=cfg.world_size)
    if cfg.workers:
        return " &middot; " + say("starting-workers", n=cfg.workers)
    return ""


def _longer_words(cfg: Config) -> str:
    """After a short run: where to ask for a longer one (the default is short, so toggling is quick)."""
    if cfg.steps > DEFAULT_STEPS:
        return ""
    steps = html.escape(KNOB_WORDS["steps"][0])
    return " &middot; " + say("longer", steps=cfg.steps, knob=f"<i>{steps}</i>")


def _failure_words(e: BaseException, records: list) -> str:
    """The panel's message for a run that raised ``e`` (the errors a learner can act on, in words)."""
    if isinstance(e, ConfigError):
        return say("cannot-run", error=e)
    if isinstance(e, OutOfMemory):
        return say("oom", error=e)
    if isinstance(e, NonFiniteError):
        return say("nonfinite", error=e, last_good=last_good(records))
    if isinstance(e, RunError):
        return say("failed", error=e)
    if isinstance(e, KeyboardInterrupt):
        return say("interrupted")
    return say("failed", error=f"{type(e).__name__}: {e}")


def busy_words(load: dict) -> str:
    """' · ⚠ machine busy ...' for the status line when others loaded the machine during the run."""
    if not load.get("busy"):
        return ""
    other = load.get("other_cores")
    what = say("busy-other", cores=f"{other:.1f}") if other is not None else say("busy-load")
    return " &middot; " + say("machine-busy", what=what)


def _warm_up(caps, cfg):
    """Do the one-time work of a kernel's first run now, while the learner reads the panel, so the
    first chart comes quickly after Run: a CPU has no datasheet peak, so its peak FLOP/s is read from
    the cache or probed (at most a second), and counting FLOPs first loads PyTorch's compiler stack (1-2 s)."""
    peak_flops(caps, cfg.precision, train.threads_for(cfg, caps.kind, cfg.world_size))
    count_flops(cfg.spec)


