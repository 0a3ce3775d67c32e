"""The forward pass of ``flash.py`` as one Triton kernel: a tile of queries per program, keys streamed through.

Same algorithm as ``flash.flash_forward`` (the online softmax: running maximum m, denominator ℓ, numerator a,
rescaled by e^(m - m') when the maximum grows), but each program keeps its BLOCK_Q queries' m, ℓ and a in
registers and reads each tile of K and V from GPU memory once per query tile: the (Q, K) weights never leave the
chip. Scores are taken in base 2 (multiplied by log2(e)/√d, then exp2 instead of exp), which the GPU computes
directly. The backward pass is ``flash.flash_backward`` (PyTorch, recomputing each tile from the log-sum-exp
this kernel saves).

Needs Triton (shipped with PyTorch's CUDA builds) and a GPU, or ``TRITON_INTERPRET=1`` on the CPU (NumPy; slow,
for tests; Triton 3.6's interpreter needs NumPy < 2.4). Causal masking with Q != K is bottom-right, as in
``masks.causal_mask``; ``valid_lens`` is not supported here.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _validate as validate
from .flash import Tiling, flash_backward

LOG2E = 1.4426950408889634  # log2(e): e^x = 2^(x log2 e)
LN2 = tl.constexpr(0.6931471805599453)  # ln 2: log-sum-exp in base 2 times ln 2 is the natural one


@triton.jit
def _forward_kernel(  # noqa: PLR0913 (a kernel takes its pointers, strides and sizes one by one)
    Q, K, V, Out, Lse,  # pointers
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h, so_t,  # strides (the last axis is contiguous)
    H, T_q, T_k, qk_scale,  # sizes; qk_scale = log2(e) / sqrt(d)
    IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    pid_q, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // H, pid_bh % H
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)  # (BLOCK_Q,): this program's queries
    dims = tl.arange(0, D)  # (D,)
    q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :], mask=rows[:, None] < T_q, other=0.0)
    m = tl.full([BLOCK_Q], float("-inf"), tl.float32)  # largest score so far (base 2)
    ell = tl.zeros([BLOCK_Q], tl.float32)  # sum of 2^(score - m)
    acc = tl.zeros([BLOCK_Q, D], tl.float32)  # sum of 2^(score - m) v
    offset = T_k - T_q  # causal: query i sees keys j <= i + offset
    stop = T_k
    if IS_CAUSAL:  # keys after the tile's last query are hidden from every query in it
        stop = tl.minimum(T_k, tl.maximum((pid_q + 1) * BLOCK_Q + offset, 0))
    for k0 in range(0, stop, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
        k_t = tl.load(
            K + b * sk_b + h * sk_h + cols[None, :] * sk_t + dims[:, None], mask=cols[None, :] < T_k, other=0.0
        )
        if IEEE:
            s = tl.dot(q, k_t, input_precision="ieee") * qk_scale  # (BLOCK_Q, BLOCK_K), float32
        else:
            s = tl.dot(q, k_t) * qk_scale
        visible = (cols[None, :] < T_k) & (rows[:, None] < T_q)
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: avoid -inf - -inf
        p = tl.exp2(s - m_safe[:, None])  # (BLOCK_Q, BLOCK_K)
        rescale = tl.exp2(m - m_safe)  # 2^(m - m'), 0 while m = -inf
        v = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_t + dims[None, :], mask=cols[:, None] < T_k, other=0.0)
        ell = ell * rescale + tl.sum(p, 1)
        if IEEE:
            acc = acc * rescale[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    seen = ell > 0.0
    out = tl.where(seen[:, None], acc / tl.where(seen, ell, 1.0)[:, None], 0.0)
    lse = tl.where(seen, (m + tl.log2(tl.where(seen, ell, 1.0))) * LN2, float("-inf"))  # natural log
    tl.store(Out + b * so_b + h * so_h + rows[:, None] * so_t + dims[None, :], out.to(Out.dtype.element_ty),
             mask=rows[:, None] < T_q)  # fmt: skip
    tl.store(Lse + pid_bh * T_q + rows, lse, mask=rows < T_q)


def triton_forward(q, k, v, is_causal=False, block_q=64, block_k=64, num_warps=4, num_stages=2):  # noqa: PLR0913
    """(output (B, H, Q, d), lse (B, H, Q) float32) from the kernel; q, k, v (B, H, T, d) on one device."""
    B, H, T_q, D = q.shape
    T_k = k.shape[-2]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty((B, H, T_q), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(T_q, block_q), B * H)
    _forward_kernel[grid](
        q, k, v, out, lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        H, T_q, T_k, LOG2E / math.sqrt(D),
        IS_CAUSAL=is_causal, IEEE=q.dtype == torch.float32, BLOCK_Q=block_q, BLOCK_K=block_k, D=D,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out, lse


class TritonFlashFunction(torch.autograd.Function):
    """Forward: the Triton kernel. Backward: ``flash.flash_backward`` from the kernel's log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, config):
        out, lse = triton_forward(q, k, v, is_causal, **config)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.tiling = Tiling(is_causal=is_causal, block_q=None, block_k=256)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        return (*flash_backward(q, k, v, out, lse, d_out.contiguous(), ctx.tiling), None, None)


def triton_flash_attention(queries, keys, values, is_causal=False, **config):
    """Causal or full attention of (B, H, T, d) tensors through the Triton kernel, with gradients.

    ``config``: ``block_q``, ``block_k``, ``num_warps``, ``num_stages`` of the launch (defaults: 64, 64, 4, 2;
    on a GPU with d >= 64, 128 queries per tile and 8 warps). d must be a power of two from 16 to 256.
    """
    validate.flash(queries, keys, values, None, is_causal, None, 1, None)
    d = queries.shape[-1]
    if queries.dim() != 4 or d not in (16, 32, 64, 128, 256) or values.shape[-1] != d:
        raise ValueError(
            f"the Triton kernel takes (B, H, T, d) tensors with d (of q, k and v alike) a power of two from 16 to "
            f"256, got shapes {tuple(queries.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    if queries.is_cuda and not config:
        config = dict(block_q=128, block_k=64, num_warps=8, num_stages=3) if d >= 64 else {}
    return TritonFlashFunction.apply(queries, keys, values, is_causal, config)
