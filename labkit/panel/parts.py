"""Building blocks of the lab panel (``labkit.panel.lab.Lab``): which knob values a device cannot serve,
toggle buttons that grey out single options, the panel's status and message lines, the live chart area
with its redraw budget, and the words and table the panel shows about runs."""
from __future__ import annotations

import dataclasses
import html
from collections.abc import Mapping
import math
import threading
import time

import ipywidgets as widgets

from ..base import phrases
from ..base.numfmt import ms
from ..tools import compare, plots
from ..engine.config import CHECKPOINTING, HELP_WORDS, LABEL_WORDS, PRECISIONS, Config, choices
from ..engine.rules import refusals
from ..engine.device import max_world_size
from ..engine.measure import mfu_impossible

# The panel parts' sentences: the "## Panel parts" section of notebooks/lab_messages.md.
WORDS = phrases.load_section("lab_messages.md", "Panel parts", {
    "budget-zero": (), "no-ddp-mps": (), "no-good-update": (), "last-good": ("update", "loss", "norm"),
    "speed-jump-short": ("update", "before", "after"), "speed-jump": ("update", "ratio", "before", "after"),
    "mfu-wrong": ("note",), "no-runs": ()})
say = WORDS.say
# The panel's own words: buttons, titles, column headers, status words ("## Panel labels"), said when the panel
# is built or speaks, in the language chosen then.
LABELS = phrases.load_section("lab_messages.md", "Panel labels", {
    "chapter": ("preset",), "run": (), "stop": (), "all-charts-button": (), "more-knobs": (), "not-available": (),
    "changed": (), "changed-default": ("value",), "above": ("n",), "model-slow-cpu": (), "button-selective": (),
    "button-attention": (), "button-every_micro": (), "button-every_k": (), "every": ("k",), "idle": (),
    "running-start": ("run",), "stopping": (), "done": ("run",), "rate": ("tokens", "ms"),
    "against-baseline": ("threads", "baseline"), "compared-same": (), "compared-higher": (), "compared-lower": (), "cannot-set": ("error",),
    "precision-note": ("precision", "note"), "history-title": (), "baseline": (), "file": (), "save-history": (),
    "load-history": (), "head-run": (), "head-knobs": (), "head-device": (), "head-threads": (), "head-tokens": (),
    "head-ms": (), "head-activations": (), "head-peak": (), "head-mfu": (), "head-allreduce": (), "head-loss": (),
    "head-notes": (), "mfu-not-real": ()})
label = LABELS.say
DRAW_LOCK = threading.Lock()  # matplotlib is not thread-safe: the run thread and clicks both draw


# The panel's knobs, in its order. Their words and tooltips are the Config fields' own (config.py, the page).
PANEL_KNOBS = ("precision", "loss_scaling", "accum", "ddp_sync", "micro_batch", "checkpointing", "optimizer",
               "workers", "pin_memory", "data_cost_ms", "world_size", "model", "memory_budget_gb", "steps")
# What a control does beyond the field itself (a key of "## Panel parts").
_PANEL_ONLY = {"memory_budget_gb": "budget-zero"}


class _KnobWords(Mapping):
    """Knob -> (words on the panel, help for the tooltip), in the language chosen when it is read."""

    def __getitem__(self, k):
        if k not in PANEL_KNOBS:
            raise KeyError(k)
        extra = say(_PANEL_ONLY[k]) if k in _PANEL_ONLY else None
        return LABEL_WORDS.say(k), "; ".join(filter(None, (HELP_WORDS.say(k), extra)))

    def __iter__(self):
        return iter(PANEL_KNOBS)

    def __len__(self):
        return len(PANEL_KNOBS)


KNOB_WORDS = _KnobWords()
# Words on a button where a Config choice's own name says too little; every other button shows the choice
# (a key of "## Panel labels").
_BUTTON_WORDS = {"selective": "button-selective", "attention": "button-attention",
                 "every_micro": "button-every_micro", "every_k": "button-every_k"}
# "every k" is the panel's own mode: full checkpointing of every k-th block (k > 1), with the k slider.
EVERY_K = "every_k"


def choice_buttons(choices) -> list:
    """(words, value) per Config choice, for a ``Choice``: the choices come from config.py, never retyped."""
    return [(label(_BUTTON_WORDS[c]) if c in _BUTTON_WORDS else c, c) for c in choices]


def ckpt_modes() -> tuple:
    """The checkpointing buttons: config.py's choices and the panel's own "every k", in the language chosen now."""
    return tuple(choice_buttons(choices("checkpointing") + (EVERY_K,)))


def __getattr__(name):
    """``CKPT_MODES``: the checkpointing buttons (``ckpt_modes()``), in the language chosen when it is read."""
    if name == "CKPT_MODES":
        return ckpt_modes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- which knob values this device cannot serve -------------------------------------------------

def unavailable(caps, base: Config = None) -> dict:
    """{knob: {value: reason}} for the values this device cannot run, with the engine's own reasons.

    Each value is tried on ``base`` (default: ``Config()``) through ``rules.refusals`` -- the rules
    ``lk.run`` applies -- so they can be checked for any device, e.g. a T4 from a laptop."""
    base = base if base is not None else Config()
    limit = max_world_size(caps)
    trials = [("precision", p, dict(precision=p)) for p in PRECISIONS]
    trials += [("checkpointing", m, dict(checkpointing=m)) for m in CHECKPOINTING]
    trials += [("pin_memory", True, dict(pin_memory=True)), ("memory_budget_gb", "any", dict(memory_budget_gb=0.5)),
               ("world_size", f"above {limit}", dict(world_size=limit + 1))]
    out = {k: {} for k in KNOB_WORDS}
    for knob, value, change in trials:
        trial = dataclasses.replace(base, **change)
        for refused in refusals(trial, caps):
            if refused.field == knob:
                out[knob][value] = refused.allowed
    if caps.kind == "mps":  # not a refusal: the engine runs it, but without DDP the knob changes nothing
        out["ddp_sync"]["every_micro"] = say("no-ddp-mps")
    return {k: v for k, v in out.items() if v}


# ---- a toggle group whose single options can be disabled --------------------------------------

class Choice:
    """Toggle buttons, one per option, that can grey out single options with a reason.

    (``ipywidgets.ToggleButtons`` can only disable the whole group.)"""

    def __init__(self, options, value, on_change=None):
        self.box = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
        self._buttons = {}
        for label, v in options:
            b = widgets.ToggleButton(description=label, value=(v == value),
                                     layout=widgets.Layout(width="auto", min_width="64px"))
            b.observe(lambda ch, v=v: self._clicked(v, ch["new"]), "value")
            self._buttons[v] = b
        self.box.children = list(self._buttons.values())
        self._value = value
        self._on_change = on_change
        self._busy = False

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        if v not in self._buttons:
            raise ValueError(f"{v!r} is not one of {list(self._buttons)}")
        self._value = v
        self._busy = True
        try:
            for key, b in self._buttons.items():
                b.value = key == v
        finally:
            self._busy = False

    @property
    def options(self):
        return list(self._buttons)

    def _clicked(self, v, pressed):
        if self._busy:
            return
        if not pressed:  # a pressed button cannot be un-pressed: one option is always chosen
            if v == self._value:
                self.value = v
            return
        old = self._value
        self.value = v
        if self._on_change and v != old:
            self._on_change(v)

    def disable(self, v, reason):
        b = self._buttons[v]
        b.disabled = True
        b.tooltip = reason

    def button(self, v):
        return self._buttons[v]


# ---- the status and message lines ----------------------------------------------------------------

class Messages:
    """The panel's status line (what it is doing, on which device) and its message under the buttons
    (errors in red, with the numbers that explain them). Every part of the panel speaks through one."""

    def __init__(self, caps):
        self.prefix = f"{caps.kind} &middot; {html.escape(caps.name)} &middot; "
        self.text = ""  # the last message, as plain text
        self.noted = None  # the last ``note``: dropped by ``drop_note`` while it is still the message
        self.status_line = widgets.HTML()
        self.message_line = widgets.HTML()

    def status(self, text):
        """Show ``text`` (HTML) after the device's name on the status line."""
        # a block with its own line-height: an ipywidgets HTML's 28 px lines spread a wrapped status apart
        self.status_line.value = f"<div class='labkit-status' style='line-height:1.45'>{self.prefix}{text}</div>"

    def say(self, text, kind="info"):
        """The message under the buttons; ``kind`` "error" shows it in red, "" clears it."""
        self.text = text
        bg, fg = {"error": ("#fdecea", "#b71c1c")}.get(kind, ("#eef5fb", "#0d47a1"))
        self.message_line.value = (f"<div class='labkit-message labkit-{kind}' style='background:{bg};color:{fg};"
                                   f"padding:4px 8px;border-radius:4px;line-height:1.45'>{html.escape(text)}</div>"
                                   ) if text else ""

    def note(self, text):
        """Say ``text`` as an "info" message that ``drop_note`` takes back once it no longer applies."""
        self.say(text, "info")
        self.noted = text

    def drop_note(self):
        """Clear the message if it is still the last ``note`` (e.g. the emulated format's, for other knobs)."""
        if self.text and self.text == self.noted:
            self.say("")

    def guard(self, action):
        """Run a button's ``action``; a file that cannot be read or written is a message, not a traceback."""
        try:
            action()
        except (OSError, ValueError) as e:
            self.say(f"{type(e).__name__}: {e}", "error")


# ---- live charts with a redraw budget ----------------------------------------------------------

class Charts:
    """One image per chart, redrawn on the training thread between updates -- never during one, so
    no measured step time includes drawing. The first chart comes at once and the final picture when
    the run ends; redraws in between are throttled to take at most ``budget`` of the time so far."""

    budget = 0.02    # share of the run's wall time that mid-run redraws may take
    min_gap_s = 0.5  # never more often than this

    def __init__(self, names):
        self.live = {n: plots.LiveChart(n) for n in plots.CHARTS}
        # Each chart's "no updates yet" picture, drawn once here: a new run starts from these at no cost.
        self.empty = {n: self.live[n].png({"records": []}) for n in plots.CHARTS}
        w, h = self.live[plots.CHARTS[0]].size_px
        self.images = {n: widgets.Image(value=self.empty[n], format="png",
                                        layout=widgets.Layout(width=f"{w}px", height=f"{h}px"))
                       for n in plots.CHARTS}
        self.box = widgets.HBox(list(self.images.values()), layout=widgets.Layout(flex_flow="row wrap"))
        self.box.add_class("labkit-charts")
        self.show(names)
        self.reset(time.perf_counter())

    def reset(self, t0):
        self.t0, self.spent, self.renders, self.last, self.cost = t0, 0.0, 0, 0.0, 0.0
        self.first_at = None

    def clear(self):
        for n in self.shown:
            self.images[n].value = self.empty[n]

    def due(self, now) -> bool:
        if self.renders == 0:
            return True
        return (now - self.last >= self.min_gap_s
                and self.spent + self.cost <= self.budget * (now - self.t0))

    def draw(self, data, final=False):
        t = time.perf_counter()
        records = plots.records_of(data)
        with DRAW_LOCK:
            for n in self.shown:
                if n == "memory" and not final and not any(r.get("peak_mem_bytes") for r in records):
                    continue  # without a device-peak counter the memory chart changes only at the end
                self.images[n].value = self.live[n].png(data)
        now = time.perf_counter()
        self.cost = now - t
        self.spent += self.cost
        self.renders += 1
        self.last = now
        if self.first_at is None and records:
            self.first_at = now

    def show(self, names):
        self.shown = [n for n in plots.CHARTS if n in names]
        for n, img in self.images.items():
            img.layout.display = None if n in self.shown else "none"


# ---- words and tables about runs -----------------------------------------------------------

def describe(cfg) -> str:
    parts = [cfg.model, cfg.precision]
    if cfg.accum > 1:
        parts.append(f"accum={cfg.accum}")
    if cfg.checkpointing != "none":
        every = " " + label("every", k=cfg.checkpoint_every) if cfg.checkpoint_every > 1 else ""
        parts.append(f"checkpointing={cfg.checkpointing}{every}")
    if cfg.workers:
        parts.append(f"workers={cfg.workers}")
    if cfg.world_size > 1:
        parts.append(f"world_size={cfg.world_size} ({cfg.ddp_sync})")
    parts.append(f"micro_batch={cfg.micro_batch}")
    return " ".join(parts)


def rate(s) -> str:
    threads = plots.cpu_threads(s)
    words = label("rate", tokens=plots.number(s.get("tokens_per_s") or 0),
                  ms=plots.number(1000 * (s.get("step_time_s") or 0)))
    return words + (f", {plots.threads(threads, cpu=True)}" if threads else "")


def last_good(records) -> str:
    """The numbers before things went wrong: the last update with a finite loss."""
    good = [r for r in records if not r.get("nonfinite")]
    if not good:
        return " " + say("no-good-update")
    r = good[-1]
    return " " + say("last-good", update=r["update"], loss=f"{r['loss']:.3f}", norm=plots.number(r["grad_norm"]))


def mib(b):
    return f"{b / 2**20:,.1f}" if isinstance(b, (int, float)) and math.isfinite(b) else "–"


def speed_note(result, short: bool = False) -> str:
    """'⚠ speed changed mid-run ...' when a run's step time jumped to another level part-way (other
    programs' load eased or grew: one run's step time fell 10x at update 15), else ''. Its median mixes
    two machines' worth of speed, so the table says so beside it -- ``short``ly: the whole sentence in
    a table cell stood 11 lines tall (the status line under the buttons has it in full)."""
    warm = getattr(result.config, "warmup", 1)  # the warm-up update is slow for other reasons
    timed = [(r.get("update"), r.get("step_time_s")) for r in result.records[warm:]]
    timed = [(u, t) for u, t in timed if isinstance(t, (int, float)) and math.isfinite(t) and t > 0]
    jump = compare.speed_jump([t for _, t in timed])
    if not jump:
        return ""
    figures = dict(update=timed[jump["at"]][0], before=ms(jump["before_s"]),
                   after=ms(jump["after_s"]), ratio=plots.number(jump["ratio"], 2))
    return say("speed-jump-short" if short else "speed-jump", **figures)


# The history table's columns: the "head-..." items of "## Panel labels".
HEAD = ("head-run", "head-knobs", "head-device", "head-threads", "head-tokens", "head-ms", "head-activations",
        "head-peak", "head-mfu", "head-allreduce", "head-loss", "head-notes")


def head() -> list:
    """The history table's column headers, in the language chosen now."""
    return [label(h) for h in HEAD]


_CELL = "padding:2px 12px 2px 0;vertical-align:top;border-bottom:1px solid #e0e0e0"
_NOTES = ";min-width:12em"  # the notes column: squeezed by the numbers' columns it stood a word a line


def row_cells(result) -> tuple:
    """One finished run's cells in the history table (every column but the run's number)."""
    s = result.summary
    mfu, ar, loss = s.get("mfu"), s.get("allreduce_calls_per_update"), s.get("final_loss")
    notes = [speed_note(result, short=True)] + ([say("mfu-wrong", note=s["mfu_note"].split(":")[0])]
                                                if s.get("mfu_note") else [])
    return (plots.run_label(s), s.get("device", "?"), str(s.get("intra_op_threads", "–")),
            plots.number(s.get("tokens_per_s") or 0),
            "{} ({} / {} / {})".format(*(ms(s.get(k)) for k in ("step_time_s", "data_wait_s",
                                                                "compute_s", "optimizer_s"))),
            mib(s.get("activation_bytes")), mib(s.get("peak_mem_bytes")),
            label("mfu-not-real") if mfu_impossible(mfu) else
            f"{100 * mfu:.2f}" if isinstance(mfu, (int, float)) else "–",
            plots.number(ar) if isinstance(ar, (int, float)) else "–",
            f"{loss:.3f}" if isinstance(loss, (int, float)) else "–", "; ".join(filter(None, notes)))


def _row_html(cells) -> str:
    return "".join(f"<td style='{_CELL}{_NOTES if i == len(cells) - 1 else ''}'>{html.escape(c)}</td>"
                   for i, c in enumerate(cells)) + "</tr>"


class TableRows:
    """The history table, each run's row built once: a finished run never changes, and rebuilding
    every row after each run made ``lab.run`` slower the longer the history grew. ``built`` counts
    the rows built (tests check that a run builds one)."""

    def __init__(self):
        self._rows = {}  # id(result) -> (result, its row's HTML without the run number)
        self.built = 0

    def html(self, runs) -> str:
        if not runs:
            return f"<small>{html.escape(say('no-runs'))}</small>"
        keep, body = {}, []
        for i, r in enumerate(runs):
            hit = self._rows.get(id(r))
            if hit is None or hit[0] is not r:  # the result itself is kept: an id can be reused
                hit = (r, _row_html(row_cells(r)))
                self.built += 1
            keep[id(r)] = hit
            body.append(f"<tr><td style='{_CELL}'>{i}</td>{hit[1]}")
        self._rows = keep
        # line-height: an ipywidgets HTML inherits 28 px lines, so a wrapped header stood five lines tall
        return ("<table class='labkit-history' style='border-collapse:collapse;font-size:0.85em;line-height:1.3'>"
                "<thead><tr>"
                + "".join(f"<th style='text-align:left;{_CELL};border-bottom:1px solid #999'>{html.escape(h)}</th>"
                          for h in head())
                + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")

