"""Everything a device refuses, in one function: ``refusals(config, caps)``.

A ``Config`` is only a description -- one made for an H100 can be built, saved and loaded on a laptop.
Whether *this* device can run it is decided here, from its capabilities, and asked by everyone who
needs to know: ``lk.run`` before any work (``check``), the panel to grey options out
(``panel_parts.unavailable``), the CLI's sweep and ``compare_configs`` before their first run. Each
refusal is the ConfigError a run raises: the field, the value, and what this device allows instead.
"""
from __future__ import annotations

from ..base import compat, phrases
from ..base.numfmt import counted
from . import precision
from .device import Capabilities, capabilities, max_world_size
from ..base.runtime import ConfigError, under_torchrun

# what this device allows instead, in the learner's language: "Device refusals" in lab_messages.md
WORDS = phrases.load_section("lab_messages.md", "Device refusals", {
    "bf16-compress": (), "efficient-attention": ("kind",), "flash-on-mps": (), "selective-here": ("why",),
    "scaler-here": ("why",), "ddp-on-mps": (), "world-gpus": ("limit", "gpus", "n"),
    "world-cores": ("limit", "cores", "n"), "budget-not-cuda": ("kind",), "budget-at-most": ("gib", "name"),
    "pin-not-cuda": ("kind",)})


def refusals(config, caps: Capabilities) -> list:
    """Every reason ``caps`` cannot run ``config``, as ConfigErrors in a fixed order (empty: it can)."""
    out = []
    refused = precision.resolve(config, caps).refusal
    if refused is not None:
        out.append(refused)
    out += _parallel(config, caps)
    if config.comm_hook == "bf16_compress" and caps.ddp_backend != "nccl":
        out.append(ConfigError("comm_hook", config.comm_hook, WORDS.say("bf16-compress")))
    if config.attention == "efficient" and caps.kind != "cuda":
        out.append(ConfigError("attention", config.attention, WORDS.say("efficient-attention", kind=caps.kind)))
    if config.attention == "flash" and caps.kind == "mps":
        out.append(ConfigError("attention", config.attention, WORDS.say("flash-on-mps")))
    out += _memory(config, caps)
    if config.checkpointing == "selective" and not compat.has("selective checkpointing"):
        why = compat.message("selective checkpointing")
        out.append(ConfigError("checkpointing", "selective", WORDS.say("selective-here", why=why)))
    if config.scaling_on and not compat.has("GradScaler"):
        out.append(ConfigError("loss_scaling", config.loss_scaling,
                               WORDS.say("scaler-here", why=compat.message("GradScaler"))))
    return out


def _parallel(config, caps: Capabilities) -> list:
    if caps.kind == "mps" and config.world_size != 1:
        return [ConfigError("world_size", config.world_size, WORDS.say("ddp-on-mps"))]
    limit = max_world_size(caps)
    if config.world_size > limit and not under_torchrun():  # torchrun's ranks may span several machines
        said = (WORDS.say("world-gpus", limit=limit, gpus=counted(caps.n_devices, "GPU"), n=caps.n_devices)
                if caps.kind == "cuda" else
                WORDS.say("world-cores", limit=limit, cores=counted(caps.cores, "CPU core"), n=caps.cores))
        return [ConfigError("world_size", config.world_size, said)]
    return []


def _memory(config, caps: Capabilities) -> list:
    out = []
    if config.memory_budget_gb is not None:
        if caps.kind != "cuda":
            out.append(ConfigError("memory_budget_gb", config.memory_budget_gb,
                                   WORDS.say("budget-not-cuda", kind=caps.kind)))
        elif config.memory_budget_gb > caps.memory_bytes / 2**30:
            out.append(ConfigError("memory_budget_gb", config.memory_budget_gb,
                                   WORDS.say("budget-at-most", gib=f"{caps.memory_bytes / 2**30:.1f}",
                                             name=caps.name)))
    if config.pin_memory and caps.kind != "cuda":
        out.append(ConfigError("pin_memory", True, WORDS.say("pin-not-cuda", kind=caps.kind)))
    return out


def check(config, caps: Capabilities = None) -> Capabilities:
    """Raise the first refusal of ``config`` on ``caps`` (default: the device it asks for, which
    raises itself when that device is not here: device='cuda' on a laptop). Returns the capabilities."""
    caps = caps if caps is not None else capabilities(config.device)
    found = refusals(config, caps)
    if found:
        raise found[0]
    return caps
