r"""FlashAttention from scratch: exact attention in blocks of keys, never the (Q, K) weights.

Forward (the online softmax; Milakov & Gimelshein 2018, Dao et al. 2022). Walk over the keys in blocks; each
query keeps three running quantities, over the keys seen so far:

.. math::
    m = \max_j s_j, \qquad \ell = \sum_j e^{s_j - m}, \qquad a = \sum_j e^{s_j - m}\, v_j .

When a block raises the maximum from m to m', the old sums are rescaled by e^{m - m'} and the block's terms added.
After the last block the output is a / ℓ, and the log-sum-exp L = m + log ℓ is kept for the backward pass.

Backward by recomputation (Dao et al. 2022, section 3.1): with L saved, each block's weights come back as
P = exp(S − L), so nothing of size (Q, K) is stored. With D = rowsum(dO ⊙ O):

.. math::
    dV = P^\top dO, \quad dP = dO\, V^\top, \quad dS = P \odot (dP - D), \quad
    dQ = \tfrac{1}{\sqrt d}\, dS\, K, \quad dK = \tfrac{1}{\sqrt d}\, dS^\top Q .

Masks are the package's: ``valid_lens`` (B,) or (B, Q) counts the visible keys (d2l's padding), and ``is_causal``
aligns the causal diagonal bottom-right as ``masks.causal_mask`` does (query i of Q sees keys j <= i + K - Q, what a
KV cache needs). A query with no visible key gets a zero output, L = -inf and zero gradients, never NaN.

Loop order: keys outside, queries inside (the first FlashAttention's order), so that a causal block of keys only
visits the queries that can see it: about half the work when Q = K. The running m, ℓ, a of every query live in
memory of size O(Q d); the largest temporary is one (B, H, block_q, block_k) tile of scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core import _validate as validate


@dataclass(frozen=True)
class Tiling:
    """What the tiled passes need besides q, k, v: the masks, the tile sizes and the scale."""

    valid_lens: torch.Tensor | None = None  # (B,) or (B, Q): visible keys per row
    is_causal: bool = False  # bottom-right causal diagonal
    block_q: int | None = None  # queries per tile; None = all at once
    block_k: int = 128  # keys per tile
    scale: float | None = None  # None = 1/sqrt(d)


def _tile_keep(q0, q1, k0, k1, offset, tiling, device):
    """Bool keep-mask of one tile: queries q0..q1-1, keys k0..k1-1; shape (B or 1, 1, q1 - q0, k1 - k0) or None.

    ``offset`` = K - Q: query i sees keys j <= i + offset when causal.
    """
    keep, valid_lens = None, tiling.valid_lens
    cols = torch.arange(k0, k1, device=device)  # (bk,)
    if tiling.is_causal:
        rows = torch.arange(q0, q1, device=device)  # (bq,)
        keep = (cols <= rows[:, None] + offset)[None, None]  # (1, 1, bq, bk)
    if valid_lens is not None:
        lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens[:, q0:q1]  # (B, 1 or bq)
        pad = (cols < lens[..., None])[:, None]  # (B, 1, 1 or bq, bk)
        keep = pad if keep is None else keep & pad
    return keep


def _tiles(Q, K, tiling):
    """The tiles to visit, keys outside: (q0, q1, k0, k1), skipping queries that cannot see key block k0.."""
    block_q = tiling.block_q or max(Q, 1)
    for k0 in range(0, K, tiling.block_k):
        first = max(0, k0 - (K - Q)) if tiling.is_causal else 0  # causal: query i sees k0 once i + K - Q >= k0
        for q0 in range(first, Q, block_q):
            yield q0, min(q0 + block_q, Q), k0, min(k0 + tiling.block_k, K)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype: float32 for 16-bit inputs (as the kernels do), float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _scores(q, k, keep, scale):
    """One tile of scaled scores in the accumulation dtype, with hidden keys at -inf: (B, H, bq, bk)."""
    scores = (q @ k.transpose(-2, -1)).to(_acc(q.dtype)) * scale  # (B, H, bq, bk)
    return scores if keep is None else scores.masked_fill(~keep, -math.inf)


def flash_forward(q, k, v, tiling: Tiling = Tiling()):
    """Tiled forward pass: (output (B, H, Q, dv) in q's dtype, lse (B, H, Q) in the accumulation dtype).

    Inputs are 4-D (B, H, T, d) and unchecked; ``flash_attention`` checks them and adds gradients.
    """
    (*_, Q, d), K = q.shape, k.shape[-2]
    scale = tiling.scale or 1.0 / math.sqrt(d)
    acc = dict(dtype=_acc(q.dtype), device=q.device)
    m = torch.full((*q.shape[:-1], 1), -math.inf, **acc)  # (B, H, Q, 1): largest score so far
    ell = torch.zeros_like(m)  # (B, H, Q, 1): sum of exp(score - m)
    a = torch.zeros((*q.shape[:-1], v.shape[-1]), **acc)  # (B, H, Q, dv): sum of exp(score - m) v
    for q0, q1, k0, k1 in _tiles(Q, K, tiling):
        keep = _tile_keep(q0, q1, k0, k1, K - Q, tiling, q.device)
        s = _scores(q[..., q0:q1, :], k[..., k0:k1, :], keep, scale)  # (B, H, bq, bk)
        m_old = m[..., q0:q1, :]  # (B, H, bq, 1)
        m_new = torch.maximum(m_old, s.amax(-1, keepdim=True))  # (B, H, bq, 1)
        m_safe = m_new.masked_fill(m_new == -math.inf, 0.0)  # a row with no visible key yet: avoid -inf - -inf
        p = torch.exp(s - m_safe)  # (B, H, bq, bk): hidden keys give exp(-inf) = 0
        rescale = torch.exp(m_old - m_safe)  # (B, H, bq, 1): e^(m - m'), 0 while m = -inf
        pv = (p.to(v.dtype) @ v[..., k0:k1, :]).to(a.dtype)  # (B, H, bq, dv); P in v's dtype, as kernels do
        ell[..., q0:q1, :] = ell[..., q0:q1, :] * rescale + p.sum(-1, keepdim=True)
        a[..., q0:q1, :] = a[..., q0:q1, :] * rescale + pv
        m[..., q0:q1, :] = m_new
    seen = ell > 0  # (B, H, Q, 1): False for a query with no visible key
    out = torch.where(seen, a / ell.clamp_min(1e-30), 0.0)  # (B, H, Q, dv) = softmax(S) V
    lse = torch.where(seen, m + torch.log(ell.clamp_min(1e-30)), -math.inf)  # (B, H, Q, 1) = log Σ_j e^(s_j)
    return out.to(q.dtype), lse.squeeze(-1)


def flash_backward(q, k, v, out, lse, d_out, tiling: Tiling = Tiling()):
    """Gradients (dq, dk, dv) from the saved output and log-sum-exp, each tile's weights recomputed."""
    (*_, Q, d), K = q.shape, k.shape[-2]
    scale = tiling.scale or 1.0 / math.sqrt(d)
    acc = dict(dtype=_acc(q.dtype), device=q.device)
    lse_safe = lse.masked_fill(lse == -math.inf, 0.0)[..., None]  # (B, H, Q, 1); those rows' P are all 0
    D = (d_out.to(acc["dtype"]) * out.to(acc["dtype"])).sum(-1, keepdim=True)  # (B, H, Q, 1) = rowsum(dO ⊙ O)
    dq, dk, dv = (torch.zeros(x.shape, **acc) for x in (q, k, v))  # accumulators
    for q0, q1, k0, k1 in _tiles(Q, K, tiling):
        q_b, do_b = q[..., q0:q1, :], d_out[..., q0:q1, :]  # (B, H, bq, d), (B, H, bq, dv)
        k_b, v_b = k[..., k0:k1, :], v[..., k0:k1, :]  # (B, H, bk, d), (B, H, bk, dv)
        keep = _tile_keep(q0, q1, k0, k1, K - Q, tiling, q.device)
        p = torch.exp(_scores(q_b, k_b, keep, scale) - lse_safe[..., q0:q1, :])  # (B, H, bq, bk) = P
        dv[..., k0:k1, :] += (p.transpose(-2, -1).to(v.dtype) @ do_b).to(dv.dtype)  # Pᵀ dO
        dp = (do_b @ v_b.transpose(-2, -1)).to(p.dtype)  # (B, H, bq, bk) = dO Vᵀ
        ds = (p * (dp - D[..., q0:q1, :])).to(q.dtype)  # (B, H, bq, bk) = P ⊙ (dP − D)
        dq[..., q0:q1, :] += (ds @ k_b).to(dq.dtype) * scale  # dS K / √d
        dk[..., k0:k1, :] += (ds.transpose(-2, -1) @ q_b).to(dk.dtype) * scale  # dSᵀ Q / √d
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: forward saves q, k, v, the output and the log-sum-exp; backward recomputes the tiles."""

    @staticmethod
    def forward(ctx, q, k, v, tiling):
        out, lse = flash_forward(q, k, v, tiling)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.tiling = tiling
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        return (*flash_backward(q, k, v, out, lse, d_out.contiguous(), ctx.tiling), None)


def flash_attention(queries, keys, values, valid_lens=None, is_causal=False, block_q=None, block_k=128, scale=None):  # noqa: PLR0913 (the tiling's knobs, named)
    """softmax(Q Kᵀ / √d) V computed in tiles, with gradients; equal to ``scaled_dot_product_attention``'s output.

    Shapes: queries (B, [H,] Q, d), keys (B, [H,] K, d), values (B, [H,] K, dv) -> (B, [H,] Q, dv).
    ``valid_lens`` (B,) or (B, Q): visible keys per row. ``is_causal``: bottom-right causal diagonal.
    ``block_q`` (None = all queries at once) and ``block_k`` set the tile; ``scale`` defaults to 1/√d.
    """
    valid_lens = validate.flash(queries, keys, values, valid_lens, is_causal, block_q, block_k, scale)
    tiling = Tiling(valid_lens, is_causal, block_q, block_k, scale)
    three_d = queries.dim() == 3
    q, k, v = (x.unsqueeze(1) if three_d else x for x in (queries, keys, values))  # (B, H, T, d)
    out = FlashAttentionFunction.apply(q, k, v, tiling)  # (B, H, Q, dv)
    return out.squeeze(1) if three_d else out  # (B, [H,] Q, dv)
