"""Everything a device refuses, in one function: ``refusals(config, caps)``.

A ``Config`` is only a description -- one made for an H100 can be built, saved and loaded on a laptop.
Whether *this* device can run it is decided here, from its capabilities, and asked by everyone who
needs to know: ``lk.run`` before any work (``check``), the panel to grey options out
(``panel_parts.unavailable``), the CLI's sweep and ``compare_configs`` before their first run. Each
refusal is the ConfigError a run raises: the field, the value, and what this device allows instead.
"""
from __future__ import annotations

from ..base import compat
from ..base.numfmt import counted
from . import precision
from .device import Capabilities, capabilities, max_world_size
from ..base.errors import ConfigError
from ..base.runtime import under_torchrun


def refusals(config, caps: Capabilities) -> list:
    """Every reason ``caps`` cannot run ``config``, as ConfigErrors in a fixed order (empty: it can)."""
    out = []
    refused = precision.resolve(config, caps).refusal
    if refused is not None:
        out.append(refused)
    out += _parallel(config, caps)
    if config.comm_hook == "bf16_compress" and caps.ddp_backend != "nccl":
        out.append(ConfigError("comm_hook", config.comm_hook, "allreduce or fp16_compress on the gloo backend "
                               "(gloo cannot reduce bf16); bf16_compress needs NCCL on a GPU"))
    if config.attention == "efficient" and caps.kind != "cuda":
        out.append(ConfigError("attention", config.attention, f"auto, math or flash on {caps.kind} "
                               "(the memory-efficient kernel is CUDA-only)"))
    if config.attention == "flash" and caps.kind == "mps":
        out.append(ConfigError("attention", config.attention, "auto or math on MPS"))
    out += _memory(config, caps)
    if config.checkpointing == "selective" and not compat.has("selective checkpointing"):
        out.append(ConfigError("checkpointing", "selective", f"none or full here: {compat.message('selective checkpointing')}"))
    if config.scaling_on and not compat.has("GradScaler"):
        out.append(ConfigError("loss_scaling", config.loss_scaling, f"off here: {compat.message('GradScaler')}"))
    return out


def _parallel(config, caps: Capabilities) -> list:
    if caps.kind == "mps" and config.world_size != 1:
        return [ConfigError("world_size", config.world_size, "1 on MPS: PyTorch has no DDP backend for Apple GPUs")]
    limit = max_world_size(caps)
    if config.world_size > limit and not under_torchrun():  # torchrun's ranks may span several machines
        what = (f"{counted(caps.n_devices, 'GPU')} visible" if caps.kind == "cuda"
                else f"{counted(caps.cores, 'CPU core')}")
        return [ConfigError("world_size", config.world_size, f"at most {limit} on this machine ({what})")]
    return []


def _memory(config, caps: Capabilities) -> list:
    out = []
    if config.memory_budget_gb is not None:
        if caps.kind != "cuda":
            out.append(ConfigError("memory_budget_gb", config.memory_budget_gb,
                                   f"None on {caps.kind}: the budget uses CUDA's per-process memory fraction"))
        elif config.memory_budget_gb > caps.memory_bytes / 2**30:
            out.append(ConfigError("memory_budget_gb", config.memory_budget_gb,
                                   f"at most {caps.memory_bytes / 2**30:.1f} GiB ({caps.name})"))
    if config.pin_memory and caps.kind != "cuda":
        out.append(ConfigError("pin_memory", True, f"False on {caps.kind}: pinned memory speeds host-to-GPU "
                               "copies, there is no such copy here"))
    return out


def check(config, caps: Capabilities = None) -> Capabilities:
    """Raise the first refusal of ``config`` on ``caps`` (default: the device it asks for, which
    raises itself when that device is not here: device='cuda' on a laptop). Returns the capabilities."""
    caps = caps if caps is not None else capabilities(config.device)
    found = refusals(config, caps)
    if found:
        raise found[0]
    return caps
