"""The lab panel's knobs (part of ``labkit.widgets.Lab``): one control per Config field the panel shows,
kept in step with a ``Config`` both ways, with the options this device cannot serve greyed out.

``Knobs`` is mixed into ``Lab``; it uses the panel's ``caps``, ``_base`` (the Config the knobs
describe), ``_say`` and ``_announce_slow_format``, which ``Lab`` provides.
"""
from __future__ import annotations

import dataclasses
import html

import ipywidgets as widgets

from ..engine.config import PRECISIONS, PRESETS as MODEL_PRESETS, Config
from ..engine.device import max_world_size
from ..base.errors import ConfigError
from .parts import CKPT_MODES, KNOBS, Choice, unavailable
from ..engine.rules import check as check_device


class Knobs:
    """The controls and the Config they describe (mixed into Lab)."""

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
        self._notes.value = ("<div class='labkit-unavailable' style='font-size:0.85em;color:#666;line-height:1.4'>"
                             "Not available on this device: " + " &middot; ".join(lines) + "</div>") if lines else ""

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

    def set(self, **knobs) -> Knobs:
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


def _slide(w, value):
    """Set a slider, widening its range first if code asks for a value beyond it."""
    if value > w.max:
        w.max = value
    if value < w.min:
        w.min = value
    w.value = value
