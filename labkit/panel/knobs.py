"""The lab panel's knobs (``Knobs``, owned by ``labkit.panel.lab.Lab``): one control per Config field the panel shows,
kept in step with a ``Config`` both ways (``config``, ``apply``), the options this device cannot serve greyed out.
The choices on the buttons are config.py's own (``config.choices(field)``), never typed again here. A learner's move
calls ``on_change(name, error)`` (``error``: the ConfigError the new knobs make, or None). ``changed()`` and the
``changes`` line name every field that differs from the panel's defaults (``mark_defaults``): a knob a chapter's
``lab.run(data_cost_ms=44)`` set stays set, and the panel says so rather than carry it silently.
"""
from __future__ import annotations

import dataclasses
import html

import ipywidgets as widgets

from ..engine.config import PRESETS as MODEL_PRESETS, Config, choices
from ..engine.device import max_world_size
from ..base.runtime import ConfigError
from .parts import EVERY_K, KNOB_WORDS, Choice, choice_buttons, ckpt_modes, label, unavailable
from ..engine.rules import check as check_device

# Controls that show a Config field's choices as toggle buttons (the choices: config.choices); with the pin_memory
# box, the controls that follow a Config field one to one (checkpointing and the memory budget are translated).
_CHOICES = ("precision", "loss_scaling", "ddp_sync", "optimizer", "model")
_PLAIN = _CHOICES + ("pin_memory",)
_SLIDERS = ("accum", "micro_batch", "workers", "data_cost_ms", "world_size", "steps")


class Knobs:
    """The controls and the Config they describe, for one device (``caps``)."""

    def __init__(self, caps, base: Config, shown, on_change=None):
        self.caps = caps
        self.base = base           # the Config the knobs describe (and the fields without a control)
        self.disabled = {}         # {knob: {value: reason}} this device cannot serve
        self._on_change = on_change
        self._quiet = 0            # > 0 while code (not the learner) moves controls
        self.words = dict(KNOB_WORDS)  # knob -> (words, tooltip), in the language chosen as the panel is built
        self.controls = self._build_controls()
        rows = {k: self._row(k) for k in KNOB_WORDS}
        self.box = widgets.VBox([rows[k] for k in shown])
        folded = [rows[k] for k in KNOB_WORDS if k not in shown]
        self.more = widgets.Accordion([widgets.VBox(folded)] if folded else [], selected_index=None)
        if folded:
            self.more.set_title(0, label("more-knobs"))
        self.notes = widgets.HTML()
        self.changes = widgets.HTML()  # what differs from the defaults: nothing carries over unseen
        self.defaults = base

    def mark_defaults(self, cfg: Config = None):
        """The Config the panel counts as its defaults (the one it opened with); ``changes`` names what differs."""
        self.defaults = cfg or self.base
        self._show_changes()

    def changed(self) -> dict:
        """{field: (default, now)} for every Config field that differs from the defaults, controls or not."""
        now, was = dataclasses.asdict(self.base), dataclasses.asdict(self.defaults)
        return {k: (was[k], v) for k, v in now.items() if v != was[k]}

    def _show_changes(self):
        diff = self.changed()
        words = " &middot; ".join(f"<b>{html.escape(k)}</b> {html.escape(str(v))} "
                                  + html.escape(label("changed-default", value=d), quote=False)
                                  for k, (d, v) in diff.items())
        self.changes.value = ("<div class='labkit-changed' style='font-size:0.85em;line-height:1.4'>"
                              f"{html.escape(label('changed'), quote=False)} {words}</div>") if diff else ""

    def _build_controls(self) -> dict:
        c, caps = self.base, self.caps
        total_gib = (caps.memory_bytes or 0) / 2**30 if caps.kind == "cuda" else 0.0
        slider = dict(continuous_update=False, layout=widgets.Layout(width="300px"))
        controls = {name: Choice(choice_buttons(choices(name)), getattr(c, name),
                                 lambda v, name=name: self._moved(name)) for name in _CHOICES}
        controls.update(
            accum=widgets.IntSlider(min=1, max=64, **slider),
            micro_batch=widgets.IntSlider(min=1, max=64, **slider),
            checkpointing=Choice(ckpt_modes(), "none", lambda v: self._moved("checkpointing")),
            checkpoint_every=widgets.IntSlider(min=1, max=max(2, c.spec.n_layer), description="k", **slider),
            workers=widgets.IntSlider(min=0, max=max(4, caps.cores), **slider),
            pin_memory=widgets.Checkbox(indent=False),
            data_cost_ms=widgets.FloatSlider(min=0.0, max=20.0, step=0.5, **slider),
            world_size=widgets.IntSlider(min=1, max=max(1, max_world_size(caps)), **slider),
            memory_budget_gb=widgets.FloatSlider(min=0.0, max=max(total_gib, 1.0), step=0.5, **slider),
            steps=widgets.IntSlider(min=1, max=200, **slider),
        )
        for name, w in controls.items():
            if not isinstance(w, Choice):
                w.observe(lambda ch, name=name: self._moved(name), "value")
        return controls

    def _row(self, knob):
        words, tip = self.words[knob]
        text = widgets.HTML(f"<span title='{html.escape(tip)}'>{html.escape(words)}</span>",
                            layout=widgets.Layout(width="160px"))
        if knob == "checkpointing":
            parts = [self.controls["checkpointing"].box, self.controls["checkpoint_every"]]
        else:
            w = self.controls[knob]
            parts = [w.box if isinstance(w, Choice) else w]
        return widgets.HBox([text] + parts)

    def disable_unavailable(self):
        """Grey out what this device cannot serve and list the reasons under the knobs."""
        self.disabled = unavailable(self.caps, self.base)
        lines = []
        for knob, values in self.disabled.items():
            w = self.controls[knob]
            for value, why in values.items():
                if isinstance(w, Choice):
                    if value in w.options:
                        w.disable(value, why)
                    name = f"{self.words[knob][0]} {value}"
                elif knob in ("pin_memory", "memory_budget_gb") or value == "above 1":
                    w.disabled, w.tooltip = True, why
                    name = self.words[knob][0]
                else:  # e.g. world size above the device count: the slider stops there
                    above = str(value).startswith("above ")
                    name = f"{self.words[knob][0]} " + (label("above", n=value[6:]) if above else str(value))
                lines.append(f"<b>{html.escape(name)}</b>: {html.escape(why)}")
        if self.caps.kind == "cpu":  # allowed, but a learner should know before pressing Run
            for m in ("base", "large"):
                self.controls["model"].button(m).tooltip = label("model-slow-cpu")
        self.notes.value = ("<div class='labkit-unavailable' style='font-size:0.85em;color:#666;line-height:1.4'>"
                            + html.escape(label("not-available"), quote=False) + " " + " &middot; ".join(lines)
                            + "</div>") if lines else ""

    @property
    def config(self) -> Config:
        """The Config the knobs describe now (raises ConfigError when they make no valid run here)."""
        cfg = Config(**self._fields())
        check_device(cfg, self.caps)
        return cfg

    def _fields(self) -> dict:
        """Every Config field: the controls' values over the fields that have no control."""
        v = {k: w.value for k, w in self.controls.items()}
        mode = v.pop("checkpointing")
        v["checkpointing"] = "full" if mode == EVERY_K else mode
        v["memory_budget_gb"] = v["memory_budget_gb"] or None  # 0 on the slider = no budget
        return {**dataclasses.asdict(self.base), **v}

    def check(self, knobs: dict):
        """The Config the knobs would make with ``knobs`` (any Config fields) set; None when ``knobs``
        is empty. A name that is no field is a TypeError, a value this device refuses a ConfigError --
        both before any control moves."""
        fields = {f.name for f in dataclasses.fields(Config)}
        unknown = sorted(set(knobs) - fields)
        if unknown:
            raise TypeError(f"unknown knob(s) {', '.join(unknown)}; knobs are the Config fields: "
                            + ", ".join(sorted(fields)))
        if not knobs:
            return None
        cfg = Config(**{**self._fields(), **knobs})  # a bad value raises before any control moves
        check_device(cfg, self.caps)  # and so does one this device refuses
        return cfg

    def apply(self, cfg: Config):
        """Move every control to ``cfg`` (quietly: these are not the learner's moves)."""
        self.base = cfg
        self._quiet += 1
        try:
            c = self.controls
            c["checkpoint_every"].max = max(2, cfg.spec.n_layer)
            for name in _PLAIN:
                c[name].value = getattr(cfg, name)
            for name in _SLIDERS:
                _slide(c[name], getattr(cfg, name))
            _slide(c["memory_budget_gb"], cfg.memory_budget_gb or 0.0)
            k = cfg.checkpoint_every
            _slide(c["checkpoint_every"], k)
            c["checkpointing"].value = EVERY_K if cfg.checkpointing == "full" and k > 1 else cfg.checkpointing
            c["checkpoint_every"].disabled = c["checkpointing"].value != EVERY_K
        finally:
            self._quiet -= 1
        self._show_changes()

    def _moved(self, name):
        """A learner moved a control: keep dependent controls consistent, then check the result."""
        if self._quiet:
            return
        self._quiet += 1
        try:
            self._follow(name)
        finally:
            self._quiet -= 1
        error = None
        try:
            self.base = self.config
        except ConfigError as e:
            error = e
        self._show_changes()
        if self._on_change:
            self._on_change(name, error)

    def _follow(self, name):
        """The controls that depend on ``name``: k's range follows the model, k itself the mode."""
        c = self.controls
        if name == "model":
            c["checkpoint_every"].max = max(2, self.base.n_layer or MODEL_PRESETS[c["model"].value].n_layer)
        if name == "checkpointing":  # only "every k" shows k: every other mode runs with k = 1
            mode = c["checkpointing"].value
            if mode != EVERY_K:
                c["checkpoint_every"].value = 1
            elif c["checkpoint_every"].value < 2:
                c["checkpoint_every"].value = 2
            c["checkpoint_every"].disabled = mode != EVERY_K


def _slide(w, value):
    """Set a slider, widening its range first if code asks for a value beyond it."""
    if value > w.max:
        w.max = value
    if value < w.min:
        w.min = value
    w.value = value
