"""The shapes of well-known decoder-only transformers and their arithmetic (taught in chapter 10): parameter
counts computed from each shape (never typed), and training FLOPs per token. Used by ``layout``, ``fp8`` and
``context``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...base.paths import read_json
from ...engine.config import PRESETS, _choice
from ...engine.model import VOCAB

__all__ = ["Shape", "MODELS", "n_params_of", "flops_per_token", "model_shape"]


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape. ``ffn``: the MLP's hidden width (default 4 x d); ``gated``: a SwiGLU
    MLP (3 weight matrices instead of 2); ``n_kv_head``: grouped-query attention's K/V heads (default: all)."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    seq_len: int
    vocab: int = VOCAB
    ffn: int = 0
    n_kv_head: int = 0
    gated: bool = False
    tied: bool = True
    learned_pos: bool = True
    bias: bool = True
    source: str = ""

    @property
    def d_ff(self) -> int:
        return self.ffn or 4 * self.d_model

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def d_kv(self) -> int:
        """Width of K (or V): kv heads x head dim."""
        return self.kv_heads * (self.d_model // self.n_head)

    @property
    def n_params(self) -> int:
        return n_params_of(self)


def _preset(key: str) -> Shape:
    s = PRESETS[key]
    # labkit's own GPT: fused qkv, a GELU MLP of 4 d, the byte embedding tied to the output
    return Shape(f"labkit {key}", s.n_layer, s.d_model, s.n_head, s.seq_len, source="labkit.engine.config.PRESETS")


SHAPES_FILE = Path(__file__).resolve().parent / "shapes.json"  # shipped as package data

# Published shapes, each with its source, read from shapes.json (the parameter count is computed from them by
# n_params_of, never typed), then labkit's presets:
MODELS = {**{key: Shape(**fields) for key, fields in read_json(SHAPES_FILE, what="model shapes")["shapes"].items()},
          **{key: _preset(key) for key in PRESETS}}


def n_params_of(shape: Shape) -> int:
    """Parameters from the shape: per block, attention (q and the output d x d each, k and v d x d_kv each) plus
    the MLP (2 or, gated, 3 matrices of d x d_ff), with biases and the two norms' weights; then the token
    embedding (a second copy for an untied output head), learned positions and the final norm."""
    d, f, kv = shape.d_model, shape.d_ff, shape.d_kv
    attn = 2 * d * d + 2 * d * kv + ((d + 2 * kv) + d if shape.bias else 0)
    mlp = (3 if shape.gated else 2) * d * f + ((f + d) if shape.bias and not shape.gated else 0)
    norms = 2 * (2 * d if shape.bias else d)
    per_block = attn + mlp + norms
    embed = shape.vocab * d * (1 if shape.tied else 2) + (shape.seq_len * d if shape.learned_pos else 0)
    return shape.n_layer * per_block + embed + (2 * d if shape.bias else d)


def _matmul_params(shape: Shape) -> int:
    """The weights a token multiplies by: every block's matrices plus the output head (embedding lookups and
    positions cost no FLOPs)."""
    d, f, kv = shape.d_model, shape.d_ff, shape.d_kv
    return shape.n_layer * (2 * d * d + 2 * d * kv + (3 if shape.gated else 2) * d * f) + shape.vocab * d


def flops_per_token(shape: Shape, seq_len: int | None = None) -> dict:
    """Training FLOPs per token (forward + backward = 3 x forward): matmuls 6 x matmul-parameters, attention
    (Q K^T and the weighted sum of V, non-causal as the course's MFU counts it) 12 x layers x T x d."""
    T = seq_len or shape.seq_len
    mm, attn = 6 * _matmul_params(shape), 12 * shape.n_layer * T * shape.d_model
    return {"matmul": float(mm), "attention": float(attn), "total": float(mm + attn)}


def model_shape(model) -> Shape:
    """A Shape from a key of MODELS (did-you-mean on a typo) or a Shape."""
    if isinstance(model, Shape):
        return model
    _choice("model", model, tuple(MODELS))
    return MODELS[model]
