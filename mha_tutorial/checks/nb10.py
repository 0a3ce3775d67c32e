"""Checks for the exercises of notebook 10 (FlashAttention from scratch).

Exercise 1: merge the running states (m, ℓ, a) of two disjoint blocks of keys into the state of their union, the
step that lets blocks be processed in any order or in parallel. The reference is the softmax over both blocks at
once; the cases include an empty block (m = -inf) on either side and scores large enough to overflow exp without
the maximum. Typical slips (no rescaling, the rescale's sign, rescaling ℓ but not a, NaN from an empty block) are
named.

Exercise 2: the tiled backward pass, a loop over blocks of keys from the saved output and log-sum-exp, causal
masks with Q != K included. The reference is autograd through dense float64 attention; autograd and the package's
passes are refused, and so is any tensor the size of the whole (Q, K) weights (the point is one tile at a time).
Typical slips (weights normalised within a tile instead of e^(S - L), no D, D from dP, dQ overwritten instead of
accumulated across key blocks, the mask missing or top-left, no 1/√d, NaN for a query with no visible key) are
named.
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..modern import flash
from ._common import CheckFailed, call, diagnose, expect_shape, expect_tensor, friendly, passed, refusing

__all__ = ["check_merge_states", "check_tile_gradients"]

_DT = torch.float64


def _state(scores: torch.Tensor, values: torch.Tensor):
    """(m, ℓ, a) of one block: scores (N, b), values (b, dv) -> (N,), (N,), (N, dv); an empty block gives -inf, 0, 0."""
    if scores.shape[-1] == 0:
        n = scores.shape[0]
        return (
            torch.full((n,), -math.inf, dtype=_DT),
            torch.zeros(n, dtype=_DT),
            torch.zeros(n, values.shape[-1], dtype=_DT),
        )
    m = scores.amax(-1)  # (N,)
    p = torch.exp(scores - m[:, None])  # (N, b)
    return m, p.sum(-1), p @ values


def _merge_cases():
    """(case, scores (N, K), split): a block of keys [0, split) and one [split, K)."""
    g = torch.Generator().manual_seed(10)
    return [
        ("3 queries, 8 keys split 3 + 5", torch.randn(3, 8, generator=g, dtype=_DT) * 2, 3),
        ("scores near 1000 (exp overflows without the maximum)", 1000 + torch.randn(2, 6, generator=g, dtype=_DT), 4),
        ("an empty first block (m1 = -inf)", torch.randn(2, 5, generator=g, dtype=_DT), 0),
        ("an empty second block (m2 = -inf)", torch.randn(2, 5, generator=g, dtype=_DT), 5),
        ("the second block holds the largest score", torch.tensor([[0.0, 1.0, 9.0, 2.0]], dtype=_DT), 2),
        ("both blocks empty (no key at all)", torch.zeros(2, 0, dtype=_DT), 0),
    ]


@friendly
def check_merge_states(fn) -> None:
    """``fn(m1, l1, a1, m2, l2, a2)`` -> (m, l, a) of the union of the two blocks; shapes (N,), (N,), (N, dv)."""
    g = torch.Generator().manual_seed(11)
    cases = list(_merge_cases())
    for case, scores, split in cases:
        values = torch.randn(scores.shape[-1], 5, generator=g, dtype=_DT)  # (K, dv): dv = 5, unlike any N
        s1, s2 = _state(scores[:, :split], values[:split]), _state(scores[:, split:], values[split:])
        with refusing({}, {"softmax": "a softmax (the scores are not given: merge the two states)"}):
            got = call(fn, *(x.clone() for x in (*s1, *s2)), case=case)
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise CheckFailed(f"{case}: return a tuple (m, l, a), got {type(got).__name__}")
        m, ell, a = (expect_tensor(x, case) for x in got)
        expect_shape(a, (scores.shape[0], 5), case)
        if scores.shape[-1] == 0:  # nothing to attend to: the union is empty too
            if torch.isnan(m).any() or torch.isnan(ell).any() or torch.isnan(a).any():
                raise CheckFailed(
                    f"{case}: NaN. With both maxima -inf, m_block - m is -inf - (-inf); replace an m of -inf by 0 "
                    "before subtracting (section 3's m_safe), so that each factor is e^(-inf) = 0"
                )
            if not (bool((m == -math.inf).all()) and not ell.abs().max() and not a.abs().max()):
                raise CheckFailed(f"{case}: expected m = -inf, l = 0 and a = 0, got m {m}, l {ell}")
            continue
        if not (torch.isfinite(a).all() and torch.isfinite(ell).all()):
            raise CheckFailed(
                f"{case}: NaN or inf. Take m = max(m1, m2) first and rescale each block by e^(m_block - m), which is "
                "at most 1 (e^1000 overflows), and 0 for an empty block, whose m_block is -inf"
            )
        top = scores.amax(-1)  # (N,): the largest score of both blocks
        diagnose(m.double(), top, [], f"{case} (m, the largest score of both blocks)", atol=1e-12, rtol=0)
        r1, r2 = torch.exp(s1[0] - top), torch.exp(s2[0] - top)  # (N,): each block's rescale, 0 for an empty one
        unscaled = (s1[2] + s2[2]) / (s1[1] + s2[1])[:, None]
        f1, f2 = torch.exp(top - s1[0]), torch.exp(top - s2[0])  # the rescale with its sign flipped
        flipped = (s1[2] * f1[:, None] + s2[2] * f2[:, None]) / (s1[1] * f1 + s2[1] * f2)[:, None]
        mistakes = [
            ("added the two states without rescaling: each block's ℓ and a are relative to its own maximum, so "
             "multiply each by e^(m_block - m) first", unscaled),
            ("rescaled ℓ but not a: both sums are relative to the block's maximum",
             (s1[2] + s2[2]) / (s1[1] * r1 + s2[1] * r2)[:, None]),
            ("rescaled a but not ℓ: both sums are relative to the block's maximum",
             (s1[2] * r1[:, None] + s2[2] * r2[:, None]) / (s1[1] + s2[1])[:, None]),
            ("the rescale has its sign flipped: multiply by e^(m_block - m), which is at most 1", flipped),
        ]  # fmt: skip
        expected = torch.softmax(scores, -1) @ values  # (N, dv): attention over both blocks at once
        ratio = a.double() / ell.double()[:, None]
        diagnose(ratio, expected, mistakes, f"{case} (a / ℓ, the attention output)", atol=1e-9, rtol=1e-9)
        expected_ell = torch.exp(scores - top[:, None]).sum(-1)
        ell_mistakes = [
            ("the rescale has its sign flipped: multiply by e^(m_block - m), which is at most 1",
             s1[1] * f1 + s2[1] * f2),
            ("ℓ is relative to 0, not to the maximum: a / ℓ comes out right here, but e^score overflows for large "
             "scores; keep ℓ and a relative to m", torch.exp(scores).sum(-1)),
        ]  # fmt: skip
        what = f"{case} (ℓ, relative to the merged maximum m)"
        diagnose(ell.double(), expected_ell, ell_mistakes, what, atol=1e-9, rtol=1e-9)
    passed("check_merge_states", len(cases))


_AUTOGRAD = {
    torch.autograd.grad: "torch.autograd.grad (autograd computes the gradient for you)",
    torch.autograd.backward: "backward() (autograd computes the gradient for you)",
    torch.Tensor.backward: "backward() (autograd computes the gradient for you)",
    torch.func.vjp: "torch.func.vjp (autograd computes the gradient for you)",
}
_PACKAGE_PASSES = {
    flash.flash_backward: "mha_tutorial.modern.flash.flash_backward (the package's version of this exercise)",
    flash.flash_attention: "mha_tutorial.modern.flash.flash_attention (the package's tiles, with autograd)",
    flash.FlashAttentionFunction.backward: "the package's FlashAttentionFunction.backward",
}


class _WatchShapes(TorchDispatchMode):
    """Notes the first float tensor an operation returns whose last two axes are (Q, K) or (K, Q): the weights."""

    def __init__(self, Q: int, K: int):
        super().__init__()
        self.banned, self.seen = {(Q, K), (K, Q)}, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for x in result if isinstance(result, tuple | list) else (result,):
            whole = isinstance(x, torch.Tensor) and x.is_floating_point() and tuple(x.shape[-2:]) in self.banned
            if self.seen is None and whole:
                self.seen = tuple(x.shape)
        return result


def _backward_variant(q, k, v, out, lse, d_out, block, is_causal, slip=""):  # noqa: PLR0913 (the exercise's arguments)
    """The tiled backward in float64, right when ``slip`` is empty, else with that one typical mistake."""
    (*_, Q, d), K = q.shape, k.shape[-2]
    scale = 1.0 if slip == "no scale" else 1 / math.sqrt(d)
    L = lse.masked_fill(lse == -math.inf, 0.0)[..., None]  # (B, H, Q, 1): a query that sees no key has P = 0
    D = (d_out * out).sum(-1, keepdim=True)  # (B, H, Q, 1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    rows = torch.arange(Q)[:, None]  # (Q, 1)
    offset = 0 if slip == "top-left" else K - Q
    for k0 in range(0, K, block):
        k_b, v_b = k[..., k0 : k0 + block, :], v[..., k0 : k0 + block, :]  # (B, H, b, d), (B, H, b, dv)
        s = q @ k_b.transpose(-2, -1) / math.sqrt(d)  # (B, H, Q, b)
        if is_causal and slip != "no mask":
            s = s.masked_fill(torch.arange(k0, k0 + k_b.shape[-2]) > rows + offset, -math.inf)
        p = torch.softmax(s, -1).nan_to_num(0.0) if slip == "local" else torch.exp(s - L)  # (B, H, Q, b)
        dp = d_out @ v_b.transpose(-2, -1)  # (B, H, Q, b)
        dd = {"no D": 0.0, "D from dP": dp.sum(-1, keepdim=True)}.get(slip, D)
        ds = p * (dp - dd)  # (B, H, Q, b)
        dv[..., k0 : k0 + block, :] = p.transpose(-2, -1) @ d_out
        dk[..., k0 : k0 + block, :] = ds.transpose(-2, -1) @ q * scale
        dq = ds @ k_b * scale if slip == "dq overwritten" else dq + ds @ k_b * scale
    return dq, dk, dv


_BACKWARD_SLIPS = {
    "local": "each tile's weights were normalised within the tile (a softmax over its b keys); the weights are "
    "e^(S − L) with the saved L, the log-sum-exp over all keys, so that tiles need no rescaling",
    "no D": "no D: dS = P ⊙ dP forgets the softmax Jacobian's second term; subtract D = rowsum(dO ⊙ O), one number "
    "per query",
    "D from dP": "D taken as rowsum(dP) of the tile; it is rowsum(dO ⊙ O) over the whole output",
    "dq overwritten": "dQ holds only the last block of keys: every block of keys adds its dS K_b / √d to dQ (+=), "
    "while dK and dV of a block come from that block alone",
    "no mask": "the causal mask is missing: hide the same keys as the forward pass (score -inf, so P = 0)",
    "top-left": "the causal mask is aligned top-left (j <= i); the forward's is bottom-right, j <= i + K - Q",
    "no scale": "dQ and dK are missing the 1/√d of the scores",
}


def _masked_reference(q, k, v, d_out, is_causal):
    """Autograd through dense float64 attention; a query that sees no key gets output 0 and no gradient."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    (*_, Q, d), K = q.shape, k.shape[-2]
    keep = torch.arange(K) <= torch.arange(Q)[:, None] + (K - Q) if is_causal else torch.ones(Q, K, dtype=bool)
    any_key = keep.any(-1, keepdim=True)  # (Q, 1)
    s = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~keep, -math.inf)  # (B, H, Q, K)
    p = torch.softmax(torch.where(any_key, s, 0.0), -1) * any_key  # (B, H, Q, K)
    return torch.autograd.grad(p @ v, (q, k, v), d_out)


@friendly
def check_tile_gradients(fn) -> None:
    """``fn(q, k, v, out, lse, d_out, block, is_causal)``: q (B, H, Q, d), k (B, H, K, d), v (B, H, K, dv) -> dq, dk, dv."""
    cases = [(1, 2, 6, 9, 4, 3, 4, False), (1, 2, 6, 9, 4, 3, 4, True), (2, 1, 7, 5, 4, 3, 2, True)]
    for seed, (B, H, Q, K, d, dv, block, is_causal) in enumerate(cases):
        g = torch.Generator().manual_seed(200 + seed)
        q, k = torch.randn(B, H, Q, d, generator=g, dtype=_DT), torch.randn(B, H, K, d, generator=g, dtype=_DT)
        v, d_out = torch.randn(B, H, K, dv, generator=g, dtype=_DT), torch.randn(B, H, Q, dv, generator=g, dtype=_DT)
        out, lse = flash.flash_forward(q, k, v, flash.Tiling(is_causal=is_causal, block_k=block))
        case = f"Q={Q}, K={K}, blocks of {block} keys, " + ("causal" if is_causal else "no mask")
        watch = _WatchShapes(Q, K)
        with refusing(_AUTOGRAD | _PACKAGE_PASSES), watch:
            args = (x.clone() for x in (q, k, v, out, lse, d_out))
            got = call(fn, *args, block, is_causal, case=case)
        if watch.seen is not None:
            raise CheckFailed(
                f"{case}: your function built a tensor of shape {watch.seen}, scores or weights for the whole (Q, K); work one "
                "(Q, block) tile of keys at a time, as tiled_forward does"
            )
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise CheckFailed(f"{case}: return a tuple (dq, dk, dv), got {type(got).__name__}")
        expected = _masked_reference(q, k, v, d_out, is_causal)
        data = (q, k, v, out, lse, d_out, block, is_causal)
        for i, (name, exp_, got_) in enumerate(zip(("dq", "dk", "dv"), expected, got, strict=True)):
            label = f"{case}, {name}"
            actual = expect_tensor(got_, label)
            expect_shape(actual, exp_.shape, label)
            if torch.isnan(actual).any():
                raise CheckFailed(
                    f"{label}: NaN. A query that sees no key has L = -inf, and S - L is -inf - (-inf); replace an L "
                    "of -inf by 0 before subtracting (its scores are all -inf, so its P is 0)"
                )
            slips = ((why, _backward_variant(*data, slip=slip)[i]) for slip, why in _BACKWARD_SLIPS.items())
            diagnose(actual.detach().double(), exp_, slips, label, atol=1e-9, rtol=1e-9)
    passed("check_tile_gradients", len(cases))
    print("  The answer: dV = Pᵀ dO needs no D; D enters through dS, which dQ and dK both use.")
