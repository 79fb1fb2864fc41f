"""Building blocks of the lab panel (labkit.widgets.Lab): which knob values a device cannot serve,
toggle buttons that grey out single options, the live chart area with its redraw budget, and the
words and table the panel shows about runs. The panel itself lives in widgets.py."""
from __future__ import annotations

import html
import math
import threading
import time

import ipywidgets as widgets

from . import plots
from .config import CHECKPOINTING, PRECISIONS, Config, ConfigError
from .device import max_world_size

DRAW_LOCK = threading.Lock()  # matplotlib is not thread-safe: the run thread and clicks both draw


# Knob -> (words on the panel, help for the tooltip). The order is the panel's order.
KNOBS = {
    "precision": ("precision", "number format of the matmuls: fp32, tf32 (CUDA tensor cores), or fp16/bf16 autocast"),
    "loss_scaling": ("loss scaling", "multiply the loss so small fp16 gradients do not flush to zero "
                     "(auto: on for fp16 only)"),
    "accum": ("accumulation steps", "K micro-batches add their gradients before one optimizer update"),
    "ddp_sync": ("DDP sync", "no_sync: one AllReduce per update; every micro-batch: K of them"),
    "micro_batch": ("micro-batch", "sequences per forward/backward pass"),
    "checkpointing": ("checkpointing", "recompute activations in the backward pass instead of keeping them: full = "
                      "whole blocks; selective = PyTorch SAC policy (save matmuls); attention core = Megatron-style "
                      "selective recomputation (only the T×T attention part)"),
    "optimizer": ("optimizer", "AdamW keeps two extra numbers per parameter, SGD with momentum one"),
    "workers": ("loader workers", "DataLoader processes preparing batches while the model trains"),
    "pin_memory": ("pin memory", "page-locked host memory for faster host-to-GPU copies"),
    "data_cost_ms": ("data cost (ms/sample)", "real CPU work per sample, to make data loading the bottleneck"),
    "world_size": ("world size", "data-parallel processes (DDP), one per GPU (or CPU core)"),
    "model": ("model", "GPT size preset"),
    "memory_budget_gb": ("memory budget (GiB)", "emulate a smaller GPU: 0 = the whole card"),
    "steps": ("steps", "optimizer updates in one run"),
}
CKPT_MODES = (("none", "none"), ("full", "full"), ("selective (SAC)", "selective"), ("attention core", "attention"),
              ("every k", "every_k"))


# ---- which knob values this device cannot serve -------------------------------------------------

def unavailable(caps, base: Config = None) -> dict:
    """{knob: {value: reason}} for the values this device cannot run, in words for a learner.

    Rules come from the device's capabilities first (so they can be checked for any device, e.g. a
    T4 from a laptop); then, when ``base`` is given, every remaining choice is tried on a real
    Config, so whatever else the engine refuses is greyed out with the engine's own reason."""
    out = {k: {} for k in KNOBS}
    where = f"{caps.name} ({caps.kind})"
    if caps.kind != "cuda":
        out["precision"]["tf32"] = f"tf32 is a CUDA tensor-core mode; {where} has none"
        out["pin_memory"][True] = f"pinned memory speeds host-to-GPU copies; on {caps.kind} there is no such copy"
        out["memory_budget_gb"]["any"] = f"the budget caps CUDA memory; there is no GPU here ({caps.kind})"
    elif not caps.tf32:
        out["precision"]["tf32"] = (f"{caps.name} has compute capability {caps.compute_capability}; "
                                    "tf32 tensor cores need 8.0 or newer")
    if not caps.bf16:
        out["precision"]["bf16"] = (f"{caps.name} has compute capability {caps.compute_capability}; fast bf16 "
                                    "needs 8.0 or newer (use fp16 with loss scaling)"
                                    if caps.kind == "cuda" else f"this PyTorch build has no bf16 on {where}")
    if not caps.fp16:
        out["precision"]["fp16"] = f"this PyTorch build has no fp16 on {where}"
    limit = max_world_size(caps)
    if caps.kind == "mps":
        out["world_size"]["above 1"] = "PyTorch has no DDP backend for Apple GPUs"
        out["ddp_sync"]["every_micro"] = "no DDP on MPS: nothing is all-reduced"
    else:
        what = f"{caps.n_devices} GPU(s)" if caps.kind == "cuda" else f"{caps.cores} CPU core(s)"
        out["world_size"][f"above {limit}"] = f"one process per device: this machine has {what}"
    if base is not None:
        trials = [("precision", p, dict(precision=p)) for p in PRECISIONS]
        trials += [("checkpointing", m, dict(checkpointing=m)) for m in CHECKPOINTING]
        trials += [("pin_memory", True, dict(pin_memory=True))]
        for knob, value, change in trials:
            if value in out[knob]:
                continue
            try:
                base.replace(**change)
            except ConfigError as e:
                out[knob][value] = e.allowed
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
        every = f" every {cfg.checkpoint_every}" if cfg.checkpoint_every > 1 else ""
        parts.append(f"checkpointing={cfg.checkpointing}{every}")
    if cfg.workers:
        parts.append(f"workers={cfg.workers}")
    if cfg.world_size > 1:
        parts.append(f"world_size={cfg.world_size} ({cfg.ddp_sync})")
    parts.append(f"micro_batch={cfg.micro_batch}")
    return " ".join(parts)


def rate(s) -> str:
    return f"{s.get('tokens_per_s') or 0:,.0f} tokens/s, {1000 * (s.get('step_time_s') or 0):.0f} ms/update"


def last_good(records) -> str:
    """The numbers before things went wrong: the last update with a finite loss."""
    good = [r for r in records if not r.get("nonfinite")]
    if not good:
        return " No update finished with a finite loss."
    r = good[-1]
    return f" The last good update was {r['update']}: loss {r['loss']:.3f}, gradient norm {r['grad_norm']:.3g}."


def ms(summary, key):
    v = summary.get(key)
    return f"{1000 * v:.0f}" if isinstance(v, (int, float)) else "–"


def mib(b):
    return f"{b / 2**20:,.1f}" if isinstance(b, (int, float)) and math.isfinite(b) else "–"


def table_html(runs) -> str:
    if not runs:
        return "<small>No finished runs yet: press Run.</small>"
    head = ("run", "knobs", "device", "tokens/s", "ms/update (data / compute / opt)", "activations MiB",
            "peak MiB", "MFU %", "AllReduce/update", "final loss")
    rows = []
    for i, r in enumerate(runs):
        s = r.summary
        mfu = s.get("mfu")
        ar = s.get("allreduce_calls_per_update")
        loss = s.get("final_loss")
        cells = (str(i), plots.run_label(s), s.get("device", "?"), f"{s.get('tokens_per_s') or 0:,.0f}",
                 f"{ms(s, 'step_time_s')} ({ms(s, 'data_wait_s')} / {ms(s, 'compute_s')} / "
                 f"{ms(s, 'optimizer_s')})",
                 mib(s.get("activation_bytes")), mib(s.get("peak_mem_bytes")),
                 (f"{100 * mfu:.2f}" + (" ⚠ above the measured peak" if s.get("mfu_note") else ""))
                 if isinstance(mfu, (int, float)) else "–",
                 f"{ar:g}" if isinstance(ar, (int, float)) else "–",
                 f"{loss:.3f}" if isinstance(loss, (int, float)) else "–")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    style = "border-collapse:collapse;font-size:0.85em"
    return (f"<table class='labkit-history' style='{style}'><thead><tr>"
            + "".join(f"<th style='text-align:left;padding:0 8px 0 0'>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
