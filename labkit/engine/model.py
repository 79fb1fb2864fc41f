"""A GPT-style decoder small enough to read in one go: pre-LayerNorm blocks, causal SDPA, GELU MLP."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import checkpointing
from .config import ModelSpec

VOCAB = 256  # bytes: no tokenizer to download


class AttentionCore(nn.Module):
    """The T×T part of attention, from q, k, v to the output: scores q·kᵀ, causal mask, softmax, dropout, ×v.
    No weights. A module of its own so that ``checkpointing="attention"`` can recompute exactly this part, and
    so that forward hooks (memtrace) see it being recomputed."""

    def __init__(self, dropout: float):
        super().__init__()
        self.dropout = dropout

    def forward(self, q, k, v):
        p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # causal mask


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d)
        self.core = AttentionCore(dropout)
        self.proj = nn.Linear(d, d)
        self.core_wrap = None  # set by GPT.set_checkpointing: f(core, q, k, v) that recomputes the core

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.core(q, k, v) if self.core_wrap is None else self.core_wrap(self.core, q, k, v)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, n_head, dropout)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))  # pre-LayerNorm: normalise the branch input only
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float = 0.0, checkpointing_mode: str = "none",
                 checkpoint_every: int = 1):
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.wte = nn.Embedding(VOCAB, d)
        self.wpe = nn.Embedding(spec.seq_len, d)
        self.blocks = nn.ModuleList(Block(d, spec.n_head, dropout) for _ in range(spec.n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied input/output embedding
        self.set_checkpointing(checkpointing_mode, checkpoint_every)
        self._init_weights()

    def set_checkpointing(self, mode: str, every: int = 1):
        self._wrappers = [checkpointing.wrap_fn(mode, every, i) for i in range(len(self.blocks))]
        for i, block in enumerate(self.blocks):  # "attention" mode wraps the attention core, not the block
            block.attn.core_wrap = checkpointing.core_wrap_fn(mode, every, i)

    def _init_weights(self):
        # GPT-2 initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2L) so the
        # residual stream does not grow with depth. PyTorch's default init gives an initial loss far
        # above ln(256) with tied embeddings.
        if self.wte.weight.is_meta:
            return  # a shape-only copy (FLOP counting): no values to initialise
        std_res = 0.02 / math.sqrt(2 * self.spec.n_layer)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, std_res if name.endswith(("attn.proj.weight", "out.weight")) else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block, wrap in zip(self.blocks, self._wrappers):
            x = wrap(block, x) if wrap is not None else block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    def matmul_params(self) -> int:
        """N for the 6·N FLOPs rule: weights of every matmul, LM head included (tied or not)."""
        n = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return n


class GPTStage(nn.Module):
    """Blocks ``blocks`` of ``gpt``, one pipeline stage (chapters 10 and 12): the first stage also embeds
    tokens, the last applies ln_f and the head (its own copy of the tied embedding). Logits on the last
    stage, the residual stream elsewhere."""

    def __init__(self, gpt: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last, self.block_ids = first, last, list(blocks)
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in blocks)
        if first:
            self.wte, self.wpe = gpt.wte, gpt.wpe
        if last:
            self.ln_f = gpt.ln_f
            self.head = nn.Linear(gpt.spec.d_model, VOCAB, bias=False)
            self.head.weight = nn.Parameter(gpt.wte.weight.detach().clone())  # the tied matrix, a copy

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x

    def global_names(self) -> dict:
        """This stage's parameter names -> the full GPT's (the head's copy maps to the tied wte.weight)."""
        out = {}
        for name, _ in self.named_parameters():
            if name.startswith("blocks."):
                j, rest = name.split(".", 2)[1:]
                out[name] = f"blocks.{self.block_ids[int(j)]}.{rest}"
            else:
                out[name] = "wte.weight" if name == "head.weight" else name
        return out


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once
