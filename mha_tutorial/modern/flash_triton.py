"""The forward pass of ``flash.py`` as one Triton kernel: a tile of queries per program, keys streamed through.

Same algorithm as ``flash.flash_forward`` (the online softmax: running maximum m, denominator ℓ, numerator a,
rescaled by e^(m - m') when the maximum grows), but each program keeps its BLOCK_Q queries' m, ℓ and a in
registers and reads each tile of K and V from GPU memory once per query tile: the (Q, K) weights never leave the
chip. Scores are taken in base 2 (multiplied by log2(e)/√d, then exp2 instead of exp), which the GPU computes
directly. The backward pass is ``flash.flash_backward``'s formulas as two kernels, each recomputing its tiles'
weights P = 2^(S·log2 e − L·log2 e) from the saved log-sum-exp L: one program per tile of keys accumulates dK and
dV over the queries, one per tile of queries accumulates dQ over the keys. That separate dQ pass needs no atomic
additions; FlashAttention-2's backward instead adds each key tile's share to dQ atomically. D = rowsum(dO ⊙ O)
comes from PyTorch.

Needs Triton (shipped with PyTorch's CUDA builds) and a GPU, or ``TRITON_INTERPRET=1`` on the CPU (NumPy; slow,
for tests; Triton 3.6's interpreter needs NumPy < 2.4). Causal masking with Q != K is bottom-right, as in
``masks.causal_mask``; ``valid_lens`` is not supported here.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..core import _validate as validate

LOG2E = 1.4426950408889634  # log2(e): e^x = 2^(x log2 e)
LN2 = tl.constexpr(0.6931471805599453)  # ln 2: log-sum-exp in base 2 times ln 2 is the natural one
NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b on the tensor cores, accumulated in float32; in full float32 precision when IEEE."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a.to(b.dtype), b)


@triton.jit
def _visible(rows, cols, T_q, T_k, IS_CAUSAL: tl.constexpr):
    """(len(rows), len(cols)) bool: query row may see key col (inside the tensors; causal bottom-right)."""
    keep = (rows[:, None] < T_q) & (cols[None, :] < T_k)
    if IS_CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None] + (T_k - T_q))
    return keep


@triton.jit
def _causal_stop(pid_q, T_q, T_k, BLOCK_Q: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """One past the last key that a tile of queries can see: the key loop ends there."""
    if IS_CAUSAL:
        return tl.minimum(T_k, tl.maximum((pid_q + 1) * BLOCK_Q + (T_k - T_q), 0))
    return T_k


@triton.jit
def _forward_kernel(  # noqa: PLR0913 (a kernel takes its pointers and sizes one by one)
    Q, K, V, Out, Lse, T_q, T_k, qk_scale,
    IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    pid_q, bh = tl.program_id(0), tl.program_id(1)  # a tile of queries, one (batch, head)
    Q, K, V, Out, Lse = Q + bh * T_q * D, K + bh * T_k * D, V + bh * T_k * D, Out + bh * T_q * D, Lse + bh * T_q
    rows, dims = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q), tl.arange(0, D)  # (BLOCK_Q,), (D,)
    q = tl.load(Q + rows[:, None] * D + dims[None, :], mask=rows[:, None] < T_q, other=0.0)  # (BLOCK_Q, D)
    m = tl.full([BLOCK_Q], NEG_INF, tl.float32)  # largest score so far (base 2)
    ell = tl.zeros([BLOCK_Q], tl.float32)  # sum of 2^(score - m)
    acc = tl.zeros([BLOCK_Q, D], tl.float32)  # sum of 2^(score - m) v
    for k0 in range(0, _causal_stop(pid_q, T_q, T_k, BLOCK_Q, IS_CAUSAL), BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
        k_t = tl.load(K + cols[None, :] * D + dims[:, None], mask=cols[None, :] < T_k, other=0.0)  # (D, BLOCK_K)
        v = tl.load(V + cols[:, None] * D + dims[None, :], mask=cols[:, None] < T_k, other=0.0)  # (BLOCK_K, D)
        s = _dot(q, k_t, IEEE) * qk_scale  # (BLOCK_Q, BLOCK_K): scores in base 2
        s = tl.where(_visible(rows, cols, T_q, T_k, IS_CAUSAL), s, NEG_INF)
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)  # no visible key yet: avoid -inf - -inf
        p = tl.exp2(s - m_safe[:, None])  # (BLOCK_Q, BLOCK_K)
        rescale = tl.exp2(m - m_safe)  # 2^(m - m'), 0 while m = -inf
        ell = ell * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + _dot(p, v, IEEE)
        m = m_new
    seen = ell > 0.0
    ell_safe = tl.where(seen, ell, 1.0)
    tl.store(
        Out + rows[:, None] * D + dims[None, :],
        (acc / ell_safe[:, None]).to(Out.dtype.element_ty),
        mask=rows[:, None] < T_q,
    )  # fmt: skip  (a row with no visible key: acc = 0, so 0)
    tl.store(Lse + rows, tl.where(seen, (m + tl.log2(ell_safe)) * LN2, NEG_INF), mask=rows < T_q)  # natural log


@triton.jit
def _backward_dkdv_kernel(  # noqa: PLR0913
    Q, K, V, dO, Lse2, Delta, dK, dV, T_q, T_k, qk_scale, sm_scale,
    IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    pid_k, bh = tl.program_id(0), tl.program_id(1)  # a tile of keys, one (batch, head)
    Q, dO, Lse2, Delta = Q + bh * T_q * D, dO + bh * T_q * D, Lse2 + bh * T_q, Delta + bh * T_q
    K, V, dK, dV = K + bh * T_k * D, V + bh * T_k * D, dK + bh * T_k * D, dV + bh * T_k * D
    cols, dims = pid_k * BLOCK_K + tl.arange(0, BLOCK_K), tl.arange(0, D)
    k = tl.load(K + cols[:, None] * D + dims[None, :], mask=cols[:, None] < T_k, other=0.0)  # (BLOCK_K, D)
    v = tl.load(V + cols[:, None] * D + dims[None, :], mask=cols[:, None] < T_k, other=0.0)  # (BLOCK_K, D)
    dk, dv = tl.zeros([BLOCK_K, D], tl.float32), tl.zeros([BLOCK_K, D], tl.float32)
    start = 0
    if IS_CAUSAL:  # queries before this tile's first key (shifted by T_k - T_q) see none of it
        start = tl.maximum(pid_k * BLOCK_K - (T_k - T_q), 0) // BLOCK_Q * BLOCK_Q
    for q0 in range(start, T_q, BLOCK_Q):
        rows = q0 + tl.arange(0, BLOCK_Q)
        q_t = tl.load(Q + rows[None, :] * D + dims[:, None], mask=rows[None, :] < T_q, other=0.0)  # (D, BLOCK_Q)
        do = tl.load(dO + rows[:, None] * D + dims[None, :], mask=rows[:, None] < T_q, other=0.0)  # (BLOCK_Q, D)
        lse2 = tl.load(Lse2 + rows, mask=rows < T_q, other=0.0)  # (BLOCK_Q,)
        delta = tl.load(Delta + rows, mask=rows < T_q, other=0.0)  # (BLOCK_Q,)
        s_t = _dot(k, q_t, IEEE) * qk_scale  # (BLOCK_K, BLOCK_Q) = (S·log2 e)ᵀ
        s_t = tl.where(tl.trans(_visible(rows, cols, T_q, T_k, IS_CAUSAL)), s_t, NEG_INF)
        p_t = tl.exp2(s_t - lse2[None, :])  # Pᵀ
        dv += _dot(p_t, do, IEEE)  # Pᵀ dO
        dp_t = _dot(v, tl.trans(do), IEEE)  # (BLOCK_K, BLOCK_Q) = (dO Vᵀ)ᵀ
        ds_t = p_t * (dp_t - delta[None, :])  # dSᵀ = Pᵀ ⊙ (dPᵀ − D)
        dk += _dot(ds_t, tl.trans(q_t), IEEE)  # dSᵀ Q
    tl.store(dK + cols[:, None] * D + dims[None, :], (dk * sm_scale).to(dK.dtype.element_ty), mask=cols[:, None] < T_k)
    tl.store(dV + cols[:, None] * D + dims[None, :], dv.to(dV.dtype.element_ty), mask=cols[:, None] < T_k)


@triton.jit
def _backward_dq_kernel(  # noqa: PLR0913
    Q, K, V, dO, Lse2, Delta, dQ, T_q, T_k, qk_scale, sm_scale,
    IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    pid_q, bh = tl.program_id(0), tl.program_id(1)  # a tile of queries, one (batch, head)
    Q, dO, dQ, Lse2, Delta = Q + bh * T_q * D, dO + bh * T_q * D, dQ + bh * T_q * D, Lse2 + bh * T_q, Delta + bh * T_q
    K, V = K + bh * T_k * D, V + bh * T_k * D
    rows, dims = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q), tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + dims[None, :], mask=rows[:, None] < T_q, other=0.0)  # (BLOCK_Q, D)
    do = tl.load(dO + rows[:, None] * D + dims[None, :], mask=rows[:, None] < T_q, other=0.0)  # (BLOCK_Q, D)
    lse2 = tl.load(Lse2 + rows, mask=rows < T_q, other=0.0)
    delta = tl.load(Delta + rows, mask=rows < T_q, other=0.0)
    dq = tl.zeros([BLOCK_Q, D], tl.float32)
    for k0 in range(0, _causal_stop(pid_q, T_q, T_k, BLOCK_Q, IS_CAUSAL), BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        k_t = tl.load(K + cols[None, :] * D + dims[:, None], mask=cols[None, :] < T_k, other=0.0)  # (D, BLOCK_K)
        v_t = tl.load(V + cols[None, :] * D + dims[:, None], mask=cols[None, :] < T_k, other=0.0)  # (D, BLOCK_K)
        s = tl.where(_visible(rows, cols, T_q, T_k, IS_CAUSAL), _dot(q, k_t, IEEE) * qk_scale, NEG_INF)
        p = tl.exp2(s - lse2[:, None])  # (BLOCK_Q, BLOCK_K) = P
        ds = p * (_dot(do, v_t, IEEE) - delta[:, None])  # dS = P ⊙ (dO Vᵀ − D)
        dq += _dot(ds, tl.trans(k_t), IEEE)  # dS K
    tl.store(dQ + rows[:, None] * D + dims[None, :], (dq * sm_scale).to(dQ.dtype.element_ty), mask=rows[:, None] < T_q)


def _configs(pairs):
    return [triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=st) for bq, bk, w, st in pairs]


_KEY = ["T_q", "T_k", "D", "IS_CAUSAL"]  # autotune again when these change
_TUNED = {  # the GPU launch: each kernel tries a few tile shapes once per key and keeps the fastest
    "forward": triton.autotune(_configs([(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4)]), _KEY)(
        _forward_kernel
    ),
    "dkdv": triton.autotune(_configs([(32, 128, 8, 3), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 4)]), _KEY)(
        _backward_dkdv_kernel
    ),
    "dq": triton.autotune(_configs([(128, 32, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 4)]), _KEY)(
        _backward_dq_kernel
    ),
}


def _launch(name, args, tiled_length, batch_heads, constexpr, config):
    """Run kernel ``name`` over (tiles of ``tiled_length``, batch × heads): with ``config`` as given, else autotuned.

    ``config``: block_q, block_k and optionally num_warps, num_stages (what the interpreter and the tests use).
    """
    axis = "BLOCK_K" if name == "dkdv" else "BLOCK_Q"  # the dK, dV kernel tiles the keys, the others the queries
    if config:
        blocks = {"BLOCK_Q": config["block_q"], "BLOCK_K": config["block_k"]}
        kernel = {"forward": _forward_kernel, "dkdv": _backward_dkdv_kernel, "dq": _backward_dq_kernel}[name]
        launch = dict(num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 2))
        kernel[(triton.cdiv(tiled_length, blocks[axis]), batch_heads)](*args, **blocks, **constexpr, **launch)
    else:
        _TUNED[name][lambda meta: (triton.cdiv(tiled_length, meta[axis]), batch_heads)](*args, **constexpr)


def triton_forward(q, k, v, is_causal=False, config=None):
    """(output (B, H, Q, d), lse (B, H, Q) float32, natural log) of contiguous (B, H, T, d) q, k, v."""
    (B, H, T_q, D), T_k = q.shape, k.shape[-2]
    out = torch.empty_like(q)
    lse = torch.empty((B, H, T_q), device=q.device, dtype=torch.float32)
    constexpr = dict(IS_CAUSAL=is_causal, IEEE=q.dtype == torch.float32, D=D)
    _launch("forward", (q, k, v, out, lse, T_q, T_k, LOG2E / math.sqrt(D)), T_q, B * H, constexpr, config)
    return out, lse


def triton_backward(q, k, v, out, lse, d_out, is_causal=False, config=None):  # noqa: PLR0913
    """(dq, dk, dv) from the forward's output and log-sum-exp; two kernels, each recomputing its tiles."""
    (B, H, T_q, D), T_k = q.shape, k.shape[-2]
    delta = (d_out.float() * out.float()).sum(-1)  # (B, H, Q) = rowsum(dO ⊙ O)
    lse2 = torch.where(torch.isinf(lse), 0.0, lse * LOG2E)  # base 2; a row with no visible key has P = 0 anyway
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sizes = (T_q, T_k, LOG2E / math.sqrt(D), 1.0 / math.sqrt(D))
    constexpr = dict(IS_CAUSAL=is_causal, IEEE=q.dtype == torch.float32, D=D)
    _launch("dkdv", (q, k, v, d_out, lse2, delta, dk, dv, *sizes), T_k, B * H, constexpr, config)
    _launch("dq", (q, k, v, d_out, lse2, delta, dq, *sizes), T_q, B * H, constexpr, config)
    return dq, dk, dv


class TritonFlashFunction(torch.autograd.Function):
    """Forward and backward through the Triton kernels; saves q, k, v, the output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, config):
        out, lse = triton_forward(q, k, v, is_causal, config)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.config = is_causal, config
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        return (*triton_backward(q, k, v, out, lse, d_out.contiguous(), ctx.is_causal, ctx.config), None, None)


def triton_flash_attention(queries, keys, values, is_causal=False, config=None):
    """Causal or full attention of (B, H, T, d) tensors through the Triton kernels, with gradients.

    ``config`` (block_q, block_k, num_warps, num_stages) fixes the launch; None autotunes each kernel over a few
    tile shapes (on a GPU). d must be a power of two from 16 to 256, the same for q, k and v.
    """
    validate.flash(queries, keys, values, None, is_causal, None, 1, None)
    d = queries.shape[-1]
    if queries.dim() != 4 or d not in (16, 32, 64, 128, 256) or values.shape[-1] != d:
        raise ValueError(
            f"the Triton kernel takes (B, H, T, d) tensors with d (of q, k and v alike) a power of two from 16 to "
            f"256, got shapes {tuple(queries.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    q, k, v = (x.contiguous() for x in (queries, keys, values))
    return TritonFlashFunction.apply(q, k, v, is_causal, config)
