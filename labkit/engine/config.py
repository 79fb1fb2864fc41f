"""One configuration for every run (panel, CLI, notebooks, benchmarks).

A ``Config`` is a pure description: ``__post_init__`` checks what needs no device -- types, choices,
ranges, fields that must agree -- with one message naming the field, the value and what is allowed.
A Config made for an H100 can be built on a laptop; what *this* device refuses (bf16 on a T4, tf32
off CUDA, more ranks than cores) is decided when it runs (``rules.refusals``: ``lk.run`` asks before any
work, the panel greys options out).

Each field's metadata says what it means (``help``: the "Knobs" section of lab_messages.md), how the
panel names it (``label``) and which values it takes (``choices``); the CLI's flags and the panel's
tooltips are made from that.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import types
from dataclasses import dataclass, field
from typing import Literal, Optional, get_args

from ..base import phrases
from ..base.runtime import ConfigError
from ..base.schema import CONFIG_KEYS

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
LossScaling = Literal["auto", "on", "off"]
Checkpointing = Literal["none", "full", "selective", "attention"]
Optimizer = Literal["adamw", "sgd"]
Attention = Literal["auto", "math", "flash", "efficient"]
Device = Literal["auto", "cpu", "cuda", "mps"]
DdpSync = Literal["no_sync", "every_micro"]
CommHook = Literal["allreduce", "fp16_compress", "bf16_compress"]
OnNonfinite = Literal["stop", "skip", "continue"]

PRECISIONS = get_args(Precision)
LOSS_SCALING = get_args(LossScaling)
CHECKPOINTING = get_args(Checkpointing)
OPTIMIZERS = get_args(Optimizer)
ATTENTION = get_args(Attention)
DEVICES = get_args(Device)
DDP_SYNC = get_args(DdpSync)
COMM_HOOKS = get_args(CommHook)
ON_NONFINITE = get_args(OnNonfinite)


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the GPT: ``n_layer`` blocks of width ``d_model`` with ``n_head`` heads."""

    n_layer: int
    d_model: int
    n_head: int
    seq_len: int  # default context length for this preset
    note: str = ""


# Presets as data. Parameter counts are for the byte vocabulary (256 tokens), tied embeddings.
# (n_layer, d_model, n_head, seq_len) of each preset; its note: the "Model presets" section of lab_messages.md
_SHAPES = {"tiny": (2, 64, 4, 64), "small": (4, 256, 4, 128), "base": (12, 768, 12, 1024),
           "large": (24, 1024, 16, 1024)}
PRESET_WORDS = phrases.load_section("lab_messages.md", "Model presets", dict.fromkeys(_SHAPES, ()))
PRESETS = {name: ModelSpec(*shape, PRESET_WORDS.say(name)) for name, shape in _SHAPES.items()}
# what a check below says is allowed, in the learner's language: the "Setting errors" section of lab_messages.md
# (with the frame every ConfigError is said in); the code fills the figures and names
ERROR_WORDS = phrases.setting_errors({
    "did-you-mean": ("name",), "not-a-field": ("fields",), "not-a-dict": ("example",),
    "choose-one": ("options",), "integer-range": ("lo", "hi"), "integer-from": ("lo",),
    "number-range": ("lo_sign", "lo", "hi_sign", "hi"), "true-or-false": (), "finite-number": ("sign", "minimum"),
    "whole-number": ("minimum",), "head-divisor": ("d_model",), "corpus-path": (),
    "switch-default": ("default", "flag"), "none-from-cli": ()})
_say = ERROR_WORDS.say


def _hint(close: list) -> str:
    """The did-you-mean hint for the closest name found (with a space after it); empty without one."""
    return _say("did-you-mean", name=repr(close[0])) + " " if close else ""


def _knob(default, *, label: bool = False, choices: tuple = (), cli: Optional[str] = None):
    """A Config field: ``label`` (True where the panel has a control, named in ``LABEL_WORDS``),
    ``choices``, and ``cli``: how the command line reads it when the type alone does not say
    ("switch": a flag without a value; "off_float": a number, or none/off/0); help: _add_help."""
    meta = {"help": "", "label": label, "choices": tuple(choices)}
    if cli:
        meta["cli"] = cli
    return field(default=default, metadata=meta)


@dataclass
class Config:
    """Everything one training run needs. Defaults give a short fp32 run of the ``small`` model."""

    # --- model -----------------------------------------------------------------------------
    model: str = _knob("small", label=True, choices=tuple(PRESETS))
    n_layer: Optional[int] = _knob(None)
    d_model: Optional[int] = _knob(None)
    n_head: Optional[int] = _knob(None)
    dropout: float = _knob(0.0)
    # --- batch -----------------------------------------------------------------------------
    micro_batch: int = _knob(8, label=True)
    seq_len: Optional[int] = _knob(None)
    accum: int = _knob(1, label=True)
    # --- numerics --------------------------------------------------------------------------
    precision: Precision = _knob("fp32", label=True, choices=PRECISIONS)
    loss_scaling: LossScaling = _knob("auto", label=True, choices=LOSS_SCALING)
    init_scale: float = _knob(65536.0)
    growth_interval: int = _knob(2000)
    checkpointing: Checkpointing = _knob("none", label=True, choices=CHECKPOINTING)
    checkpoint_every: int = _knob(1)
    optimizer: Optimizer = _knob("adamw", label=True, choices=OPTIMIZERS)
    lr: float = _knob(3e-4)
    grad_clip: Optional[float] = _knob(1.0, cli="off_float")
    attention: Attention = _knob("auto", choices=ATTENTION)
    compile: bool = _knob(False, cli="switch")
    on_nonfinite: OnNonfinite = _knob("stop", choices=ON_NONFINITE)
    # --- data ------------------------------------------------------------------------------
    corpus: Optional[str] = _knob(None)
    workers: int = _knob(0, label=True)
    pin_memory: bool = _knob(False, label=True)
    prefetch_factor: int = _knob(2)
    data_cost_ms: float = _knob(0.0, label=True)
    # --- parallelism -----------------------------------------------------------------------
    world_size: int = _knob(1, label=True)
    ddp_sync: DdpSync = _knob("no_sync", label=True, choices=DDP_SYNC)
    bucket_cap_mb: float = _knob(25.0)
    comm_hook: CommHook = _knob("allreduce", choices=COMM_HOOKS)
    # --- run -------------------------------------------------------------------------------
    steps: int = _knob(10, label=True)
    warmup: int = _knob(1)
    seed: int = _knob(0)
    device: Device = _knob("auto", choices=DEVICES)
    memory_budget_gb: Optional[float] = _knob(None, label=True)
    threads: Optional[int] = _knob(None)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Every field check (no device is asked: see ``refusals``); raises ConfigError. A
        dataclass's fields can be changed after it was made, so ``run()`` calls this again before any work."""
        _check_fields(self)

    # --- derived values --------------------------------------------------------------------
    @property
    def spec(self) -> ModelSpec:
        """The preset's shape, with the shape fields this Config sets in its place."""
        base = PRESETS[self.model]
        return dataclasses.replace(base, **{k: getattr(self, k) or getattr(base, k)
                                            for k in ("n_layer", "d_model", "n_head", "seq_len")})

    @property
    def context(self) -> int:
        """Tokens per sequence as the run uses them: ``seq_len``, or the preset's when it is None."""
        return self.spec.seq_len

    @property
    def scaling_on(self) -> bool:
        """Whether a GradScaler is used: loss scaling keeps small fp16 gradients from flushing to 0."""
        return self.loss_scaling == "on" or (self.loss_scaling == "auto" and self.precision == "fp16")

    @property
    def tokens_per_update(self) -> int:
        return self.micro_batch * self.context * self.accum * self.world_size

    @classmethod
    def from_dict(cls, values: dict) -> "Config":
        """Like ``Config(**values)``, but an unknown name is a ConfigError that suggests the right one,
        and so is anything but a dict (None, a list, a str) in place of ``values``."""
        if not isinstance(values, dict):
            raise ConfigError("config", values, _say("not-a-dict", example="{'model': 'tiny', 'steps': 5}"))
        for name in values:
            _field(name, values[name])
        return cls(**values)

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed, validated again."""
        return type(self).from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _add_help():
    """Set each field's help (the CLI's help, the panel's tooltip; its label where it has none) into
    its metadata, where every reader (``fields_help``, the CLI's flags) finds it."""
    for f in dataclasses.fields(Config):
        said = HELP_WORDS.say(f.name)
        label = LABEL_WORDS.say(f.name) if f.metadata["label"] is True else f.metadata["label"] or said
        f.metadata = types.MappingProxyType({**f.metadata, "help": said, "label": label})


# The panel's words for the fields it has a control for, and each field's help: the "Knob labels"
# and "Knobs" sections of lab_messages.md (said again when the panel is built, in its language)
LABEL_WORDS = phrases.load_section("lab_messages.md", "Knob labels", {
    f.name: () for f in dataclasses.fields(Config) if f.metadata["label"] is True})
HELP_WORDS = phrases.load_section("lab_messages.md", "Knobs", {f.name: () for f in dataclasses.fields(Config)})
_add_help()


def fields_help() -> dict:
    """{field name: its metadata (help, label, choices, cli)}, in the dataclass's order."""
    return {f.name: dict(f.metadata) for f in dataclasses.fields(Config)}


def _field(name, value) -> dataclasses.Field:
    """The Config field called ``name``; an unknown one is a ConfigError that suggests a name."""
    known = {f.name: f for f in dataclasses.fields(Config)}
    if name not in known:
        hint = _hint(difflib.get_close_matches(str(name), list(known), n=1))
        raise ConfigError(str(name), value, hint + _say("not-a-field", fields=", ".join(known)))
    return known[name]


def choices(name: str) -> tuple:
    """The values Config field ``name`` takes, in its ``_knob``'s order (the panel's menus and the
    CLI's ``choices``); () for a field that takes a number, a flag or a path."""
    return _field(name, name).metadata["choices"]


def default(name: str):
    return _field(name, name).default


def defaults() -> dict:
    """{field name: default value} for every Config field, in the dataclass's order."""
    return {f.name: f.default for f in dataclasses.fields(Config)}


def config_echo(c: Config, world_size: Optional[int] = None) -> dict:
    """The configuration as a run used it (schema.ConfigEcho): the shape resolved from the preset,
    ``world_size`` the processes that ran (torchrun decides under torchrun; default: the Config's)."""
    spec = c.spec
    resolved = {**c.to_dict(), "seq_len": spec.seq_len, "n_layer": spec.n_layer, "d_model": spec.d_model,
                "n_head": spec.n_head, "world_size": world_size or c.world_size,
                "tokens_per_update": c.tokens_per_update, "tokens_per_step": c.tokens_per_update}
    return {k: resolved[k] for k in CONFIG_KEYS}


def _choice(name, value, options):
    if not isinstance(value, str) or value not in options:
        close = difflib.get_close_matches(value, options, n=1) if isinstance(value, str) else []
        hint = _hint(close)  # a typo such as 'attenton'
        raise ConfigError(name, value, hint + _say("choose-one", options=", ".join(options)))


def _int(name, value, lo, hi=None):
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or value < lo or (hi is not None and value > hi):
        rng = _say("integer-range", lo=lo, hi=hi) if hi is not None else _say("integer-from", lo=lo)
        raise ConfigError(name, value, rng)


def _num(name, value, lo, hi, *, lo_open=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > hi or (value <= lo if lo_open else value < lo):
        raise ConfigError(name, value, _say("number-range", lo_sign=">" if lo_open else ">=", lo=lo, hi_sign="<=",
                                           hi=hi))


def _bool(name, value):
    if not isinstance(value, bool):
        raise ConfigError(name, value, _say("true-or-false"))


def real(name: str, value, *, minimum: float = 0.0, strict: bool = False, allowed: str = "") -> float:
    """``value`` as a float when it is a finite real number >= ``minimum`` (> with ``strict``); else a
    ConfigError naming the argument (a negative parameter count, a NaN budget)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > minimum if strict else value >= minimum):
        return float(value)
    raise ConfigError(name, value, allowed or _say("finite-number", sign=">" if strict else ">=",
                                                  minimum=f"{minimum:g}"))


def whole(name: str, value, minimum: int = 1) -> int:
    """``value`` when it is a whole number >= ``minimum`` (True/False and 2.5 are refused)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum:
        return value
    raise ConfigError(name, value, _say("whole-number", minimum=minimum))


def _check_fields(c: Config) -> None:
    """Field-by-field checks; none needs a device. Order follows the dataclass."""
    _choice("model", c.model, tuple(PRESETS))
    for name in ("n_layer", "d_model", "n_head"):
        v = getattr(c, name)
        if v is not None:
            _int(name, v, 1, 4096 if name != "n_layer" else 256)
    _num("dropout", c.dropout, 0.0, 0.9)
    _int("micro_batch", c.micro_batch, 1, 65536)
    if c.seq_len is not None:
        _int("seq_len", c.seq_len, 2, 65536)
    _int("accum", c.accum, 1, 4096)
    _choice("precision", c.precision, PRECISIONS)
    _choice("loss_scaling", c.loss_scaling, LOSS_SCALING)
    _num("init_scale", c.init_scale, 2.0**-24, 2.0**64)  # below fp16's smallest subnormal it is useless
    _int("growth_interval", c.growth_interval, 1, 10**9)
    _choice("checkpointing", c.checkpointing, CHECKPOINTING)
    spec = c.spec
    _int("checkpoint_every", c.checkpoint_every, 1, max(1, spec.n_layer))
    if spec.d_model % spec.n_head:
        raise ConfigError("n_head", spec.n_head, _say("head-divisor", d_model=spec.d_model))
    _choice("optimizer", c.optimizer, OPTIMIZERS)
    _num("lr", c.lr, 0.0, 10.0, lo_open=True)
    if c.grad_clip is not None:
        _num("grad_clip", c.grad_clip, 0.0, 1e6)
    _choice("attention", c.attention, ATTENTION)
    _bool("compile", c.compile)
    _choice("on_nonfinite", c.on_nonfinite, ON_NONFINITE)
    if c.corpus is not None and not isinstance(c.corpus, (str, os.PathLike)):
        # whether the path exists is this machine's business: checked when the run starts (data.check_corpus)
        raise ConfigError("corpus", c.corpus, _say("corpus-path"))
    _int("workers", c.workers, 0, 64)
    _bool("pin_memory", c.pin_memory)
    _int("prefetch_factor", c.prefetch_factor, 1, 64)
    _num("data_cost_ms", c.data_cost_ms, 0.0, 10_000.0)
    _int("world_size", c.world_size, 1, 4096)
    _choice("ddp_sync", c.ddp_sync, DDP_SYNC)
    _num("bucket_cap_mb", c.bucket_cap_mb, 0.0, 100_000.0, lo_open=True)
    _choice("comm_hook", c.comm_hook, COMM_HOOKS)
    _int("steps", c.steps, 1, 10_000_000)
    _int("warmup", c.warmup, 0, 10_000_000)
    _int("seed", c.seed, 0, 2**63 - 1)
    _choice("device", c.device, DEVICES)
    if c.memory_budget_gb is not None:
        _num("memory_budget_gb", c.memory_budget_gb, 0.0, 100_000.0, lo_open=True)
    if c.threads is not None:
        _int("threads", c.threads, 1, 1024)


def cli_args(config: Config, leave_out=()) -> list:
    """The flags that make the CLI's parser (``__main__._add_config_args``) give back ``config``: one per field that differs
    from its default (``--model`` always, for the reader), each value exact (floats by repr) -- the inverse
    of ``config_from_args``, so a printed command runs the same configuration. Tokens, not yet quoted."""
    defaults = Config()
    out = ["--model", config.model]
    for f in dataclasses.fields(Config):
        v, flag = getattr(config, f.name), "--" + f.name.replace("_", "-")
        if f.name == "model" or f.name in leave_out or v == getattr(defaults, f.name):
            continue
        if isinstance(v, bool):
            if f.metadata.get("cli") == "switch" and not v:
                raise ConfigError(f.name, v, _say("switch-default", default=getattr(defaults, f.name),
                                                 flag=f"--{f.name}"))
            out += [flag] if v else ["--no-" + flag[2:]]
        elif v is None:
            if f.metadata.get("cli") != "off_float":
                raise ConfigError(f.name, v, _say("none-from-cli"))
            out += [flag, "none"]
        else:
            out += [flag, repr(v) if isinstance(v, float) else str(v)]
    return out
