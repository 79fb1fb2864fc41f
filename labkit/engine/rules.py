"""What a device refuses of a ``Config``, in one function: ``refusals(config, caps)``.

A Config is only a description (``config.py``); whether *this* device can run it is decided here, from its
capabilities, and asked by everyone who needs to know: ``lk.run`` before any work (``check``), the panel to
grey options out, the CLI's sweep and ``compare_configs`` before their first run. Each refusal is the
ConfigError a run raises: the field, the value, and what this device allows instead.
"""
from __future__ import annotations

from ..base import compat, phrases
from ..base.numfmt import counted
from ..base.runtime import ConfigError, under_torchrun
from . import precision
from .device import Capabilities, capabilities, max_world_size

# what this device allows instead: the "Device refusals" section of lab_messages.md
WORDS = phrases.load_section("lab_messages.md", "Device refusals", {
    "bf16-compress": (), "efficient-attention": ("kind",), "flash-on-mps": (), "selective-here": ("why",),
    "scaler-here": ("why",), "ddp-on-mps": (), "world-gpus": ("limit", "gpus", "n"),
    "world-cores": ("limit", "cores", "n"), "budget-not-cuda": ("kind",), "budget-at-most": ("gib", "name"),
    "pin-not-cuda": ("kind",)})
_refused = WORDS.say


def refusals(config, caps: Capabilities) -> list:
    """Every reason ``caps`` cannot run ``config``, as ConfigErrors in a fixed order (empty: it can)."""
    out = []
    refused = precision.resolve(config, caps).refusal
    if refused is not None:
        out.append(refused)
    out += _parallel(config, caps)
    if config.comm_hook == "bf16_compress" and caps.ddp_backend != "nccl":
        out.append(ConfigError("comm_hook", config.comm_hook, _refused("bf16-compress")))
    if config.attention == "efficient" and caps.kind != "cuda":
        said = _refused("efficient-attention", kind=caps.kind)
        out.append(ConfigError("attention", "efficient", said))
    if config.attention == "flash" and caps.kind == "mps":
        out.append(ConfigError("attention", config.attention, _refused("flash-on-mps")))
    out += _memory(config, caps)
    if config.checkpointing == "selective" and not compat.has("selective checkpointing"):
        why = compat.message("selective checkpointing")
        out.append(ConfigError("checkpointing", "selective", _refused("selective-here", why=why)))
    if config.scaling_on and not compat.has("GradScaler"):
        out.append(ConfigError("loss_scaling", config.loss_scaling,
                               _refused("scaler-here", why=compat.message("GradScaler"))))
    return out


def _parallel(config, caps: Capabilities) -> list:
    if caps.kind == "mps" and config.world_size != 1:
        return [ConfigError("world_size", config.world_size, _refused("ddp-on-mps"))]
    limit = max_world_size(caps)
    if config.world_size > limit and not under_torchrun():  # torchrun's ranks may span several machines
        gpus = caps.kind == "cuda"
        n = caps.n_devices if gpus else caps.cores
        said = (_refused("world-gpus", limit=limit, gpus=counted(n, "GPU"), n=n) if gpus
                else _refused("world-cores", limit=limit, cores=counted(n, "CPU core"), n=n))
        return [ConfigError("world_size", config.world_size, said)]
    return []


def _memory(config, caps: Capabilities) -> list:
    out = []
    budget, gib = config.memory_budget_gb, (caps.memory_bytes or 0) / 2**30
    if budget is not None and caps.kind != "cuda":
        said = _refused("budget-not-cuda", kind=caps.kind)
        out.append(ConfigError("memory_budget_gb", budget, said))
    elif budget is not None and budget > gib:
        said = _refused("budget-at-most", gib=f"{gib:.1f}", name=caps.name)
        out.append(ConfigError("memory_budget_gb", budget, said))
    if config.pin_memory and caps.kind != "cuda":
        out.append(ConfigError("pin_memory", True, _refused("pin-not-cuda", kind=caps.kind)))
    return out


def check(config, caps: Capabilities = None) -> Capabilities:
    """Raise the first refusal of ``config`` on ``caps`` (default: the device it asks for, which
    raises itself when that device is not here: device='cuda' on a laptop). Returns the capabilities."""
    caps = caps if caps is not None else capabilities(config.device)
    found = refusals(config, caps)
    if found:
        raise found[0]
    return caps
