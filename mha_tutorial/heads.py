"""Splitting the hidden axis into heads and folding heads into the batch (notebook 03).

``transpose_qkv`` turns (B, T, H*d) into (B*H, T, d) so that one batched matrix
multiply computes every head of every example at once. Row ``b*H + h`` of the
result is head ``h`` of example ``b`` (batch-major), which is why per-example
``valid_lens`` must be expanded with ``repeat_interleave`` and not ``repeat``.
"""

from __future__ import annotations

import torch


def _check(X, num_heads: int, name: str) -> None:
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} expects a tensor, got {type(X).__name__}")
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if X.dim() != 3:
        raise ValueError(f"{name} expects a 3-D tensor, got shape {tuple(X.shape)}")


def transpose_qkv(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T, H*d) -> (B*H, T, d), batch-major: row b*H + h is head h of example b."""
    _check(X, num_heads, "transpose_qkv")
    batch, steps, hiddens = X.shape
    if hiddens % num_heads:
        raise ValueError(
            f"the last size of X (shape {tuple(X.shape)}) is {hiddens}, not divisible by num_heads={num_heads}"
        )
    X = X.reshape(batch, steps, num_heads, hiddens // num_heads)  # (B, T, H, d)
    X = X.permute(0, 2, 1, 3)  # (B, H, T, d)
    return X.reshape(batch * num_heads, steps, hiddens // num_heads)  # (B*H, T, d)


def transpose_output(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B*H, T, d) -> (B, T, H*d): the inverse of ``transpose_qkv``."""
    _check(X, num_heads, "transpose_output")
    folded, steps, head_size = X.shape
    if folded % num_heads:
        raise ValueError(
            f"the first size of X (shape {tuple(X.shape)}) is {folded}, not divisible by num_heads={num_heads}"
        )
    X = X.reshape(folded // num_heads, num_heads, steps, head_size)  # (B, H, T, d)
    X = X.permute(0, 2, 1, 3)  # (B, T, H, d)
    return X.reshape(folded // num_heads, steps, num_heads * head_size)  # (B, T, H*d)
