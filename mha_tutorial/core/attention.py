r"""Scaled dot-product attention (notebooks 01 and 02 build this step by step).

.. math::
    \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d}}\right) V

``masked_softmax`` is the one place where masks are applied: ``valid_lens``
(d2l's padding lengths) and/or a bool ``mask`` (True = may attend). A query
that may attend to no key at all gets a row of zeros, never NaN.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from . import _validate as validate
from .masks import combine_masks


def _softmax_over_keys(scores: torch.Tensor, keep: torch.Tensor | None, inplace: bool = False) -> torch.Tensor:
    """Softmax over the last axis where ``keep`` is True; rows with no visible key become zeros.

    ``inplace`` lets the masking overwrite ``scores`` (for a scores tensor nobody else holds):
    one pass less over the largest tensor of attention.
    """
    if keep is None or scores.shape[-1] == 0:  # no mask, or no key at all: (..., Q, 0) weights, nothing to hide
        return F.softmax(scores, dim=-1)
    # The most negative finite number, not -inf: exp(min - max) underflows to 0
    # for masked keys, while a row that is *all* masked stays finite (uniform)
    # instead of turning into 0/0 = NaN.
    fill = scores.masked_fill_ if inplace else scores.masked_fill
    filled = fill(~keep, torch.finfo(scores.dtype).min)
    # A row whose largest score is the fill value has no usable key: none visible, or only visible scores of
    # -inf (an additive mask applied earlier), which would hand the hidden keys the row's weight. It gets zeros.
    unusable = filled.amax(dim=-1, keepdim=True) <= torch.finfo(scores.dtype).min  # (..., Q, 1), small
    weights = F.softmax(filled, dim=-1)
    if bool(unusable.any()):
        weights = weights.masked_fill(unusable, 0.0)
    return weights


def masked_softmax(scores: torch.Tensor, valid_lens=None, mask=None) -> torch.Tensor:
    """Softmax over the last axis of ``scores`` (..., Q, K), ignoring masked keys.

    Args:
        scores: floating tensor (B, Q, K) or (B, ..., Q, K).
        valid_lens: optional integer tensor (B,) or (B, Q) of visible key counts.
        mask: optional bool tensor broadcastable to ``scores``; True = may attend.

    Masked keys get weight exactly 0. A row with no visible key is all zeros
    (not NaN, not uniform) in float32, float16 and bfloat16, and its gradient
    is finite.

    Empty axes give empty results: with K = 0 every row has no visible key, so the
    weights are an empty (..., Q, 0) tensor; Q = 0 or B = 0 give (..., 0, K) or (0, ..., K).
    """
    valid_lens = validate.softmax_args(scores, valid_lens, mask)
    keep = combine_masks(valid_lens, mask, scores.shape[-1], scores.dim(), scores.device)  # ~(B, ..., Q, K)
    return _softmax_over_keys(scores, keep)


def scaled_dot_product_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    valid_lens=None,
    mask=None,
    dropout_p: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""softmax(Q K^T / sqrt(d)) V, returning ``(output, weights)``.

    Shapes: queries (B, Q, d), keys (B, K, d), values (B, K, v) -> output
    (B, Q, v) and weights (B, Q, K); or the same with a head axis, (B, H, T, d).
    ``valid_lens`` indexes the batch axis B; ``mask`` broadcasts to the weights.
    Dropout (when ``training`` and ``dropout_p > 0``) is applied to the weights
    used for the output; the returned weights are the ones before dropout.

    Empty axes: with no keys (K = 0) every query is fully masked, so, as for a row with no visible
    key, the output is zeros (B, [H,] Q, v) and the weights are empty (B, [H,] Q, 0); Q = 0 or
    B = 0 give empty outputs. A feature size d = 0 raises ``ValueError`` (the scores scale by 1/sqrt(d)).
    """
    valid_lens = validate.attention(queries, keys, values, valid_lens, mask, dropout_p)  # before any arithmetic
    keep = combine_masks(valid_lens, mask, keys.shape[-2], queries.dim(), queries.device)  # ~(B, [H,] Q, K)
    d = queries.shape[-1]
    # Scale the (B, Q, d) queries rather than the (B, Q, K) scores: same result, fewer multiplications.
    scores = (queries * (1.0 / math.sqrt(d))) @ keys.transpose(-2, -1)  # (B, [H,] Q, K)
    # The scores are ours alone, so masking may overwrite them in place instead of copying them.
    weights = _softmax_over_keys(scores, keep, inplace=True)  # (B, [H,] Q, K)
    dropped = F.dropout(weights, dropout_p) if training and dropout_p > 0 else weights
    return dropped @ values, weights  # (B, [H,] Q, v), (B, [H,] Q, K)


class DotProductAttention(nn.Module):
    """Scaled dot-product attention as a module, keeping ``.attention_weights`` (as in d2l)."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        validate.dropout(dropout)
        self.dropout = dropout
        self.attention_weights: torch.Tensor | None = None

    def forward(self, queries, keys, values, valid_lens=None, mask=None):
        output, self.attention_weights = scaled_dot_product_attention(
            queries, keys, values, valid_lens, mask, self.dropout, self.training
        )
        return output
