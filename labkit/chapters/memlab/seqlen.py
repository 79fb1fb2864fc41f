"""Activation bytes against the sequence length, measured and by formula, and Megatron-style attention
recompute (taught in chapter 08).

    rows = memlab.seq_sweep(config, [64, 128, 256])           # activation bytes against T, measured
    memlab.activation_formula(L, d, n_head, T, B, "math")      # ... and by formula, part by part
"""
from __future__ import annotations

from ...engine.config import ATTENTION, Config, ConfigError, _choice, _int
from ...engine.device import capabilities, intra_op_threads, torch_device
from ...engine.measure import activation_bytes, count_flops
from ...engine.model import VOCAB
from ._common import _config, _items, _seq_lens, _threads


def activation_formula(n_layer: int, d_model: int, n_head: int, seq_len: int, batch: int, attention: str = "auto",
                       vocab: int = VOCAB, bytes_per_value: int = 4) -> dict:
    """Bytes the forward pass keeps for backward, part by part (fp32: 4 bytes a value).

    Per block and token, 16·d values (LayerNorm outputs, q/k/v, attention output, residuals, MLP
    up-projection and GELU output: labkit.memtrace's count) plus n_head (the fused kernel's log-sum-exp) plus
    4 (LayerNorm statistics). The math backend instead keeps the softmax probabilities, one T×T matrix per
    head, causal mask included: n_head·T values per token, less the log-sum-exp it does not need, so
    n_head·(T − 1) more than the fused kernel. Outside the blocks: the embedding sum and the final
    LayerNorm (2·d + 2) and the log-softmax of the logits (vocab)."""
    for name, v in (("n_layer", n_layer), ("d_model", d_model), ("n_head", n_head), ("seq_len", seq_len),
                    ("batch", batch), ("vocab", vocab)):
        _int(name, v, 1, 10**7)
    _int("bytes_per_value", bytes_per_value, 1, 8)
    _choice("attention", attention, ATTENTION)
    B, T, d, h, L = batch, seq_len, d_model, n_head, n_layer
    linear = L * B * T * (16 * d + h + 4) * bytes_per_value
    square = L * B * h * T * (T - 1) * bytes_per_value if attention == "math" else 0
    outside = B * T * (2 * d + 2 + vocab) * bytes_per_value
    return {"blocks_linear": linear, "attention_square": square, "outside": outside,
            "total": linear + square + outside}


def _sweep_args(base, seq_lens, batch, n_threads) -> tuple:
    """What both sweeps check before any work, and the device they measure on: (sequence lengths, device)."""
    _config(base, "base")
    lens = _seq_lens(seq_lens)
    _int("batch", batch, 1, 65536)
    _threads(n_threads)
    return lens, torch_device(capabilities(base.device).kind)


def seq_sweep(base: Config, seq_lens, attentions=("auto", "math"), batch: int = 2, n_threads: int | None = 1) -> list:
    """Activation bytes kept after one forward pass (the engine's own probe: live storages) at each sequence
    length and attention backend, beside the formula's parts. fp32 unless ``base`` says otherwise.

    ``batch`` >= 2 matches the formula exactly; with one sequence the math path's inputs have another
    layout, and it keeps scaled copies of q and k (2·d more values per token and block) as well."""
    lens, dev = _sweep_args(base, seq_lens, batch, n_threads)
    atts = _items("attentions", attentions, lambda n, v: _choice(n, v, ATTENTION))
    rows = []
    with intra_op_threads(n_threads):
        for T in lens:
            for att in atts:
                cfg = base.replace(seq_len=T, attention=att)
                measured, copies = activation_bytes(cfg, dev, batch=batch)
                s = cfg.spec
                f = activation_formula(s.n_layer, s.d_model, s.n_head, T, batch, att)
                rows.append({"seq_len": T, "attention": att, "batch": batch, "measured_bytes": measured,
                             "weight_copy_bytes": copies, **{f"formula_{k}": v for k, v in f.items()},
                             "ratio": measured / f["total"] if f["total"] else None})
    return rows


def attention_recompute_ready() -> tuple:
    """(ok, reason): whether the engine has Megatron-style attention recompute, checkpointing="attention"."""
    try:
        Config(model="tiny", checkpointing="attention")
    except ConfigError as e:
        return False, (f"this labkit does not have checkpointing='attention' yet ({e}); the cell below runs once "
                       "the engine gains it")
    return True, "checkpointing='attention' recomputes each block's attention core (the T×T part) in backward"


def attention_recompute(base: Config, seq_lens, batch: int = 2, n_threads: int | None = 1) -> list:
    """Under the math backend: activation bytes with and without checkpointing='attention', and the FLOPs
    the recompute adds (hardware over model FLOPs, counted), at each sequence length.

    ``core_flops_ratio`` is what rerunning the whole attention core would cost (4·T²·d per block and
    sequence: the scores and the product with V, counted like FlopCounterMode, non-causal). The count comes
    out lower: PyTorch's non-reentrant checkpoint stops recomputing once it has rebuilt the last tensor
    backward needs (softmax's output), so the product with V is never rerun."""
    lens, dev = _sweep_args(base, seq_lens, batch, n_threads)
    rows = []
    with intra_op_threads(n_threads):
        for T in lens:
            plain = base.replace(seq_len=T, attention="math", checkpointing="none")
            recomp = plain.replace(checkpointing="attention")
            a0, _ = activation_bytes(plain, dev, batch=batch)
            a1, _ = activation_bytes(recomp, dev, batch=batch)
            model_f = count_flops(plain.spec)
            hw_f = count_flops(recomp.spec, "attention", recomp.checkpoint_every)
            s = plain.spec
            core = s.n_layer * 4 * T * T * s.d_model  # the attention core's forward, one sequence
            rows.append({"seq_len": T, "bytes_none": a0, "bytes_attention": a1, "saved_frac": 1 - a1 / a0,
                         "flops_ratio": hw_f / model_f, "core_flops_ratio": 1 + core / model_f})
    return rows
