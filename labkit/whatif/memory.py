"""Bytes of a training step that no trace measures: the model state per GPU under ZeRO's stages and offload,
and a transformer's activations -- datasheet-sized arithmetic (no torch, no device) that chapters 09 and
10 both build on.
"""
from __future__ import annotations

from ..base.runtime import ConfigError
from ..engine.config import _bool, _choice, real, whole

__all__ = ["WEIGHT_BYTES", "GRAD_BYTES", "OPTIMIZER_BYTES", "state_bytes_per_gpu", "activation_bytes_estimate"]

# ---- bytes per parameter -----------------------------------------------------------------------
# Mixed-precision training (the ZeRO paper's accounting): 16-bit weights and gradients on the
# device, plus what the optimizer keeps in fp32 -- a master copy of the weights and its moments.
WEIGHT_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = {
    "adam": 12,       # fp32 master weights 4 + first moment 4 + second moment 4
    "adam8bit": 6,    # fp32 master weights 4 + 8-bit moments 1 + 1 (block scales are negligible)
    "sgd": 8,         # fp32 master weights 4 + momentum 4
}


def state_bytes_per_gpu(n_params: float, n_gpus: int = 1, stage: int = 0, optimizer: str = "adam",
                        offload_optimizer: bool = False, offload_params: bool = False) -> dict:
    """Bytes of model state (weights, gradients, optimizer) on each GPU under ZeRO ``stage`` 0-3.

    Stage 0 is plain DDP: every GPU holds all of it. Stage 1 shards the optimizer states over the
    ``n_gpus`` data-parallel ranks, stage 2 the gradients too, stage 3 (FSDP's FULL_SHARD) the
    weights too. Offloading moves the optimizer states (and with ``offload_params`` the weights and
    gradients) to CPU memory; ``cpu`` says how much each rank then needs there. Activations and the
    one layer FSDP gathers at a time come on top.
    """
    N = real("n_params", n_params, strict=True)
    G = whole("n_gpus", n_gpus)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError("stage", stage, "a ZeRO stage: 0 (none), 1, 2 or 3")
    _choice("optimizer", optimizer, OPTIMIZER_BYTES)
    _bool("offload_optimizer", offload_optimizer)
    _bool("offload_params", offload_params)
    params = WEIGHT_BYTES * N / (G if stage >= 3 else 1)
    grads = GRAD_BYTES * N / (G if stage >= 2 else 1)
    optim = OPTIMIZER_BYTES[optimizer] * N / (G if stage >= 1 else 1)
    cpu = 0.0
    if offload_optimizer or offload_params:
        cpu += optim
        optim = 0.0
    if offload_params:
        cpu += params + grads
        params = grads = 0.0
    return {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim, "cpu": cpu}


def activation_bytes_estimate(n_layer: int, d_model: int, n_head: int, seq_len: int, micro_batch: int,
                              checkpointing: str = "none", flash: bool = True) -> float:
    """Activation bytes of a 16-bit transformer, from Korthikanti et al. 2022 (Reducing Activation
    Recomputation in Large Transformer Models): per layer s·b·h·(34 + 5·a·s/h) bytes without
    recomputation; the 5·a·s/h term (the s×s attention scores) is gone with a fused (flash) kernel;
    with full checkpointing only each layer's input (2·s·b·h bytes) is kept."""
    s, b, h, a = (whole(k, v) for k, v in (("seq_len", seq_len), ("micro_batch", micro_batch),
                                               ("d_model", d_model), ("n_head", n_head)))
    whole("n_layer", n_layer)
    _choice("checkpointing", checkpointing, ("none", "full"))
    _bool("flash", flash)
    if checkpointing == "full":
        return float(n_layer * 2 * s * b * h)
    per_layer = s * b * h * (34 + (0 if flash else 5 * a * s / h))
    return float(n_layer * per_layer)
