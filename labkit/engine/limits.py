"""What a run will need before it starts: the memory pre-flight's formulas, and the words of a refusal."""
from __future__ import annotations


def block_bytes_formula(d_model: int, n_head: int, seq_len: int, batch: int, bytes_per_value: int = 4) -> int:
    """Bytes one transformer block of this course's GPT keeps for backward, counted by hand.

    Per token, in values: LayerNorm 1 output (d) + q,k,v (3d) + attention output (d; a fused kernel returns
    it in the layout the projection reads, so no copy) + residual sum (d) + LayerNorm 2 output (d) + MLP
    up-projection (4d) + GELU output (4d) + block output (d) = 16·d; plus the attention kernel's log-sum-exp
    (one per head) and each LayerNorm's mean and 1/std (2 × 2). A fused kernel keeps no T×T score matrix.
    """
    per_token = 16 * d_model + n_head + 4
    return batch * seq_len * per_token * bytes_per_value
