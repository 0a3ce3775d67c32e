"""Splitting the hidden axis into heads and folding heads into the batch (notebook 03).

``transpose_qkv`` turns (B, T, H*d) into (B*H, T, d) so that one batched matrix
multiply computes every head of every example at once. Row ``b*H + h`` of the
result is head ``h`` of example ``b`` (batch-major), which is why per-example
``valid_lens`` must be expanded with ``repeat_interleave`` and not ``repeat``.
"""

from __future__ import annotations

import torch

from . import _validate as validate


def transpose_qkv(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T, H*d) -> (B*H, T, d), batch-major: row b*H + h is head h of example b."""
    validate.split_heads(X, num_heads)
    batch, steps, hiddens = X.shape
    X = X.reshape(batch, steps, num_heads, hiddens // num_heads)  # (B, T, H, d)
    X = X.permute(0, 2, 1, 3)  # (B, H, T, d)
    return X.reshape(batch * num_heads, steps, hiddens // num_heads)  # (B*H, T, d)


def transpose_output(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B*H, T, d) -> (B, T, H*d): the inverse of ``transpose_qkv``."""
    validate.merge_heads(X, num_heads)
    folded, steps, head_size = X.shape
    X = X.reshape(folded // num_heads, num_heads, steps, head_size)  # (B, H, T, d)
    X = X.permute(0, 2, 1, 3)  # (B, T, H, d)
    return X.reshape(folded // num_heads, steps, num_heads * head_size)  # (B, T, H*d)
