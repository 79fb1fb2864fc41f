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
from ._common import _config, _items, _rows, _seq_lens, _threads
from ..course import table  # rows that show themselves as a markdown table


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
    """(ok, reason): whether the engine has Megatron-style attention recompute, checkpointing="attention"
    (reason: why not; "" when it has)."""
    try:
        Config(model="tiny", checkpointing="attention")
    except ConfigError as e:
        return False, (f"this labkit does not have checkpointing='attention' yet ({e}); the cell below runs once "
                       "the engine gains it")
    return True, ""


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


# ---- what the chapter's cells draw from these measurements (rows and figures; the words are the chapter's) ----

def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB"


def seq_table(rows: list) -> list:
    """``seq_sweep``'s rows as a table: measured bytes beside the formula, and the formula's T×T part."""
    return table(_rows(rows, "seq_len"), [
        ("seq_len", "T", "{}"), ("attention", "attention", "{}"), ("measured_bytes", "measured", _mib),
        ("formula_total", "formula", _mib), ("ratio", "measured ÷ formula", "{:.3f}"),
        ("formula_attention_square", "of it T×T (formula)", _mib)])


def _longest(rows: list) -> tuple:
    """(math row, fused row) at the longest T of a sweep."""
    t_max = max(r["seq_len"] for r in rows)
    return tuple(next(r for r in rows if r["seq_len"] == t_max and r["attention"] == a) for a in ("math", "auto"))


def square_share(rows: list) -> float:
    """The share of the math backend's bytes at the longest T that the fused kernel does not keep: the T×T part."""
    m, f = _longest(_rows(rows, "seq_len"))
    return (m["measured_bytes"] - f["measured_bytes"]) / m["measured_bytes"]


def seq_summary(base: Config, rows: list) -> dict:
    """The sweep's figures at its longest T: ``ratio`` (math ÷ fused bytes), ``share_pct`` (the T×T part, in %),
    ``worst_pct`` (the formula's largest miss over every row, in %) and ``crossover`` (the T at which, per block,
    the T² part overtakes the linear part: n_head·(T − 1) = 16·d + 4), with the model's width and head count."""
    _config(base, "base")
    m, f = _longest(_rows(rows, "seq_len"))
    spec = base.spec
    return {"model": base.model, "d": spec.d_model, "heads": spec.n_head, "t_max": m["seq_len"],
            "ratio": m["measured_bytes"] / f["measured_bytes"], "share_pct": 100 * square_share(rows),
            "worst_pct": 100 * max(abs(r["ratio"] - 1) for r in rows),
            "crossover": round((16 * spec.d_model + 4) / spec.n_head + 1)}


def reference_rows(refs: dict) -> list:
    """GPU reference runs ({id: summary}) as table rows: micro-batch, activations and peak in GiB, tokens/s."""
    if not isinstance(refs, dict):
        raise ConfigError("refs", type(refs).__name__, "{id: summary} from kernels.reference_summaries")
    rows = [{"id": k, **v} for k, v in sorted(refs.items(), key=lambda kv: (kv[1].get("seq_len", 0), kv[0]))]
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    return table(rows, [("id", "GPU reference run", "{}"), ("micro_batch", "micro-batch", "{}"),
                        ("activation_bytes", "activations", gib), ("peak_mem_bytes", "peak", gib),
                        ("tokens_per_s", "tokens/s", "{:,.0f}")])


def recompute_table(rec: list) -> list:
    """``attention_recompute``'s rows as a table: bytes with and without, the share saved, the FLOPs ratio."""
    return table(_rows(rec, "bytes_none"), [
        ("seq_len", "T", "{}"), ("bytes_none", "activations, math", _mib),
        ("bytes_attention", "with attention recompute", _mib), ("saved_frac", "saved", "{:.0%}"),
        ("flops_ratio", "hardware ÷ model FLOPs", "{:.3f}")])


def recompute_summary(rec: list) -> dict:
    """The trade at the shortest and longest T (saved %, extra FLOPs %) and, at the longest, what rerunning the
    whole core would add (``core_pct``) against what was counted (``counted_pct``) and their ratio."""
    lo, hi = _rows(rec, "bytes_none")[0], rec[-1]
    core, counted = hi["core_flops_ratio"] - 1, hi["flops_ratio"] - 1
    return {"t_lo": lo["seq_len"], "saved_lo": 100 * lo["saved_frac"], "flops_lo": 100 * (lo["flops_ratio"] - 1),
            "t_hi": hi["seq_len"], "saved_hi": 100 * hi["saved_frac"], "flops_hi": 100 * counted,
            "core_pct": 100 * core, "of_core": counted / core if core else 0.0}
