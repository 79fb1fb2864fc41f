"""What to do when a model still does not fit (taught in chapter 09): the memory arithmetic of ZeRO's stages,
offloading and 8-bit Adam, the options one by one with whether each fits a card, and their chart.

    pb.remedies(13e9, n_gpus=8, gpu_bytes=80e9, activation_bytes=20e9)   # one row per option
    pb.smallest_fix(13e9, 8, 80e9, 20e9)                                 # 'zero2': the least intrusive fit

The arithmetic is pure (no torch, no device): datasheet-sized cards and textbook byte counts.
"""
from __future__ import annotations

import textwrap

from ...base.errors import ConfigError
from ...engine.config import _bool, _choice  # the Config's own checks: one wording (and did-you-mean) for every refusal
from .args import real, row_list, whole
from ..course import table  # rows that show themselves as a markdown table

GB = 1e9  # datasheets quote decimal gigabytes ("80 GB"); the charts of measured bytes use MiB/GiB

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
# the remedies, least intrusive first (chapter 09's markdown table says what each keeps and costs)
REMEDIES = ("ddp", "zero1", "zero2", "zero3", "zero3+offload_optimizer", "zero3+offload_params")


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


def zero_bytes_per_gpu(n_params: float, n_gpus: int, stage: int) -> float:
    """Model-state bytes per GPU for mixed-precision Adam under ZeRO ``stage`` (16 bytes/param at 0)."""
    return state_bytes_per_gpu(n_params, n_gpus, stage)["total"]


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


def remedies(n_params: float, n_gpus: int, gpu_bytes: float, activation_bytes: float = 0.0,
             optimizer: str = "adam") -> list:
    """One row per option, least intrusive first: bytes per GPU (states + activations) and whether
    it fits in ``gpu_bytes``. Offloading needs ``cpu`` bytes of host memory per rank."""
    real("gpu_bytes", gpu_bytes, strict=True)
    real("activation_bytes", activation_bytes)
    rows = []
    for name in REMEDIES:
        stage = {"ddp": 0, "zero1": 1, "zero2": 2}.get(name, 3)
        st = state_bytes_per_gpu(n_params, n_gpus, stage, optimizer,
                                 offload_optimizer="offload" in name, offload_params=name.endswith("params"))
        total = st["total"] + activation_bytes
        rows.append({"remedy": name, **st, "activations": activation_bytes,
                     "per_gpu": total, "fits": total <= gpu_bytes})
    return rows


def remedies_rows(models: dict, n_gpus: int, gpu_bytes: float) -> list:
    """Model state only (no activations), bytes per GPU: one row per model (``models``: {name: parameters}),
    one column per remedy and 8-bit Adam with ZeRO-2. Full offload leaves no model state on the GPU: its 0 is
    shown as "≈0 (CPU memory)" rather than a bare 0.0 that would read as a broken cell."""
    if not isinstance(models, dict) or not models:
        raise ConfigError("models", models, "{name: number of parameters}, e.g. {'7 B': 7e9}")
    rows = []
    for name, n in models.items():
        row = {"model": name, **{r["remedy"]: r["total"] for r in remedies(n, n_gpus, gpu_bytes)}}
        row["adam8bit+zero2"] = state_bytes_per_gpu(n, n_gpus, stage=2, optimizer="adam8bit")["total"]
        rows.append(row)
    heads = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
             "zero3+offload_optimizer": "+ offload optimizer", "zero3+offload_params": "+ offload params",
             "adam8bit+zero2": "8-bit Adam + ZeRO-2"}
    return table(rows, [("model", "model", "{}")] + [(k, h + " (GB)", _gb) for k, h in heads.items()])


def _gb(b: float) -> str:
    return f"{b / GB:,.1f}" if b else "≈0 (CPU memory)"


def smallest_fix(n_params: float, n_gpus: int, gpu_bytes: float, activation_bytes: float = 0.0,
                 optimizer: str = "adam"):
    """The least intrusive option that fits (None when even full offload does not)."""
    for row in remedies(n_params, n_gpus, gpu_bytes, activation_bytes, optimizer):
        if row["fits"]:
            return row["remedy"]
    return None


def _tick_words(remedy: str) -> str:
    """'zero3+offload_optimizer' -> 'zero3 +\noffload\noptimizer': at ~10 characters a line each option's
    label stays inside its own bar's width at the chart's 6.4 in, apart from its neighbours'."""
    return "\n".join(textwrap.wrap(remedy.replace("+", " + ").replace("_", " "), 10))


def remedy_chart(rows: list, gpu_bytes: float, title: str = "", ax=None):
    """Stacked bars of bytes per GPU for each option, the card's memory as a dashed line."""
    from ...tools import plots  # deferred: matplotlib is optional; loaded only to draw

    if not row_list("rows", rows):
        raise ConfigError("rows", rows, "at least one option, e.g. remedies(...)")
    real("gpu_bytes", gpu_bytes, strict=True)
    if ax is None:
        ax = plots.new_figure(6.4, 3.0).add_subplot()
    fig = ax.figure
    names = [_tick_words(r["remedy"]) for r in rows]
    bottom = [0.0] * len(rows)
    for key, words, color in (("params", "weights", plots.COLORS["param_bytes"]),
                              ("grads", "gradients", plots.COLORS["grad_bytes"]),
                              ("optimizer", "optimizer", plots.COLORS["optimizer_bytes"]),
                              ("activations", "activations", plots.COLORS["activation_bytes"])):
        vals = [r[key] / GB for r in rows]
        ax.bar(names, vals, bottom=bottom, color=color, label=words)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(gpu_bytes / GB, ls="--", color="#222222", lw=1)
    ax.text(len(rows) - 0.5, gpu_bytes / GB, f" GPU {gpu_bytes / GB:.0f} GB", va="bottom", ha="right",
            fontsize=plots.FONT)
    ax.set_ylabel("GB per GPU", fontsize=plots.FONT)
    ax.set_title(title or "Memory per GPU, by option", fontsize=plots.TITLE)
    ax.tick_params(labelsize=plots.FONT)
    ax.legend(fontsize=plots.FONT, loc="upper right")
    return fig
