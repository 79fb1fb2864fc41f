"""One validated configuration for every run: the panel, the CLI, the notebooks and the benchmarks.

Every field is documented below. Bad values fail in ``__post_init__`` -- before any model, data or
process exists -- with one message that names the field, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

from .errors import ConfigError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
LOSS_SCALING = ("auto", "on", "off")
CHECKPOINTING = ("none", "full", "selective", "attention")
OPTIMIZERS = ("adamw", "sgd")
ATTENTION = ("auto", "math", "flash", "efficient")
DEVICES = ("auto", "cpu", "cuda", "mps")
DDP_SYNC = ("no_sync", "every_micro")
COMM_HOOKS = ("allreduce", "fp16_compress", "bf16_compress")
ON_NONFINITE = ("stop", "skip", "continue")


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the GPT: ``n_layer`` blocks of width ``d_model`` with ``n_head`` heads."""

    n_layer: int
    d_model: int
    n_head: int
    seq_len: int  # default context length for this preset
    note: str = ""


# Presets as data. Parameter counts are for the byte vocabulary (256 tokens), tied embeddings.
PRESETS = {
    "tiny": ModelSpec(2, 64, 4, 64, "CI size: a step takes a few milliseconds on a CPU"),
    "small": ModelSpec(4, 256, 4, 128, "CPU interactive: about 3.3 M parameters"),
    "base": ModelSpec(12, 768, 12, 1024, "GPT-2 small's shape; with a 256-byte vocabulary about "
                      "86 M parameters instead of GPT-2's 124 M (its 50k-token embedding is gone)"),
    "large": ModelSpec(24, 1024, 16, 1024, "GPT-2 medium's shape: about 304 M parameters"),
}


@dataclass
class Config:
    """Everything one training run needs. Defaults give a short fp32 run of the ``small`` model."""

    # --- model -----------------------------------------------------------------------------
    model: str = "small"                 # preset name: tiny, small, base, large
    n_layer: Optional[int] = None        # override the preset's depth
    d_model: Optional[int] = None        # override the preset's width
    n_head: Optional[int] = None         # override the preset's head count
    dropout: float = 0.0                 # off by default: it would make runs non-deterministic
    # --- batch -----------------------------------------------------------------------------
    micro_batch: int = 8                 # sequences per forward/backward on one process
    seq_len: Optional[int] = None        # tokens per sequence; None = the preset's
    accum: int = 1                       # K micro-batches per optimizer update
    # --- numerics --------------------------------------------------------------------------
    precision: str = "fp32"              # fp32, tf32 (CUDA matmuls), fp16 / bf16 (autocast)
    loss_scaling: str = "auto"           # GradScaler: auto = on for fp16 only
    init_scale: float = 65536.0          # GradScaler's first loss scale (2**16); halves at every inf/NaN
    growth_interval: int = 2000          # clean updates before the GradScaler doubles its scale again
    # none; full (whole blocks); selective (PyTorch SAC policy: save matmuls, recompute element-wise ops);
    # attention (Megatron-style selective recomputation: recompute only the attention core, the T×T part)
    checkpointing: str = "none"
    checkpoint_every: int = 1            # with full or attention: every k-th block (0, k, 2k, ...); selective: all
    optimizer: str = "adamw"
    lr: float = 3e-4
    grad_clip: Optional[float] = 1.0     # max global grad norm; None or 0 = no clipping
    attention: str = "auto"              # scaled_dot_product_attention backend
    compile: bool = False                # torch.compile the model
    on_nonfinite: str = "stop"           # inf/NaN gradients without a GradScaler: stop, skip the update, continue
    # --- data ------------------------------------------------------------------------------
    corpus: Optional[str] = None         # text file or folder; None = this Python's stdlib source
    workers: int = 0                     # DataLoader worker processes
    pin_memory: bool = False             # page-locked host memory for faster host->GPU copies
    prefetch_factor: int = 2             # batches each worker prepares ahead (workers > 0)
    data_cost_ms: float = 0.0            # real CPU work per sample, to make the loader the bottleneck
    # --- parallelism -----------------------------------------------------------------------
    world_size: int = 1                  # data-parallel processes (DDP)
    ddp_sync: str = "no_sync"            # no_sync: AllReduce once per update; every_micro: K times
    bucket_cap_mb: float = 25.0          # DDP gradient bucket size
    comm_hook: str = "allreduce"         # allreduce, fp16_compress, bf16_compress (NCCL only)
    # --- run -------------------------------------------------------------------------------
    steps: int = 10                      # optimizer updates
    warmup: int = 1                      # first updates left out of the timing summary
    seed: int = 0
    device: str = "auto"                 # auto picks CUDA, then MPS, then CPU
    memory_budget_gb: Optional[float] = None  # CUDA: cap this process's memory (emulate a smaller card)
    threads: Optional[int] = None        # CPU intra-op threads per process; None = cores / processes - workers

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Every field check and this device's rules; raises ConfigError. A dataclass's fields can be
        changed after it was made, so ``run()`` calls this again before any work."""
        _check_fields(self)
        from . import device as _device  # local: validation needs the device only here

        _device.check_config(self)

    # --- derived values --------------------------------------------------------------------
    @property
    def spec(self) -> ModelSpec:
        base = PRESETS[self.model]
        return ModelSpec(
            n_layer=self.n_layer or base.n_layer,
            d_model=self.d_model or base.d_model,
            n_head=self.n_head or base.n_head,
            seq_len=self.seq_len or base.seq_len,
            note=base.note,
        )

    @property
    def context(self) -> int:
        return self.seq_len or PRESETS[self.model].seq_len

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
        import difflib

        if not isinstance(values, dict):
            raise ConfigError("config", values, "a dict of Config fields, e.g. {'model': 'tiny', 'steps': 5}")
        known = [f.name for f in dataclasses.fields(cls)]
        for name in values:
            if name not in known:
                close = difflib.get_close_matches(str(name), known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(str(name), values[name], f"{hint}not a Config field; fields are: " + ", ".join(known))
        return cls(**values)

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed, validated again."""
        return type(self).from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _choice(name, value, options):
    if not isinstance(value, str) or value not in options:
        import difflib

        close = difflib.get_close_matches(value, options, n=1) if isinstance(value, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""  # a typo such as 'attenton'
        raise ConfigError(name, value, hint + "choose one of " + ", ".join(options))


def _int(name, value, lo, hi=None):
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        rng = f"an integer from {lo} to {hi}" if hi is not None else f"an integer >= {lo}"
        raise ConfigError(name, value, rng)


def _num(name, value, lo, hi, *, lo_open=False):
    import math

    ok = _is_num(value) and math.isfinite(value) and value <= hi and (value > lo if lo_open else value >= lo)
    if not ok:
        raise ConfigError(name, value, f"a number {'>' if lo_open else '>='} {lo} and <= {hi}")


def _bool(name, value):
    if not isinstance(value, bool):
        raise ConfigError(name, value, "True or False")


def _check_fields(c: Config) -> None:
    """Field-by-field checks that need no device. Order follows the dataclass."""
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
        raise ConfigError("n_head", spec.n_head, f"a divisor of d_model={spec.d_model}")
    _choice("optimizer", c.optimizer, OPTIMIZERS)
    _num("lr", c.lr, 0.0, 10.0, lo_open=True)
    if c.grad_clip is not None:
        _num("grad_clip", c.grad_clip, 0.0, 1e6)
    _choice("attention", c.attention, ATTENTION)
    _bool("compile", c.compile)
    _choice("on_nonfinite", c.on_nonfinite, ON_NONFINITE)
    if c.corpus is not None:
        if not isinstance(c.corpus, (str, os.PathLike)):
            raise ConfigError("corpus", c.corpus, "a path to a text file or folder, or None")
        if not os.path.exists(c.corpus):
            raise ConfigError("corpus", c.corpus, "an existing text file or folder (this path does not exist)")
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
