"""Checks for the exercises of notebook 10 (FlashAttention from scratch).

Exercise 1: merge the running states (m, ℓ, a) of two disjoint blocks of keys into the state of their union, the
step that lets blocks be processed in any order or in parallel. The reference is the softmax over both blocks at
once; the cases include an empty block (m = -inf) on either side and scores large enough to overflow exp without
the maximum. Typical slips (no rescaling, the rescale's sign, rescaling ℓ but not a, NaN from an empty block) are
named.

Exercise 2: the gradients of one tile of attention from its saved output and log-sum-exp, without autograd. The
reference is autograd through a float64 softmax; autograd itself is refused. Typical slips (no 1/√d, D from dP
instead of dO ⊙ O, no D at all, transposed products) are named.
"""

from __future__ import annotations

import math

import torch

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
    flash.flash_backward: "mha_tutorial.modern.flash.flash_backward (the package's version of this exercise)",
}


def _tile_reference(q, k, v, d_out):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), -1) @ v
    return torch.autograd.grad(out, (q, k, v), d_out)


@friendly
def check_tile_gradients(fn) -> None:
    """``fn(q, k, v, out, lse, d_out)`` for one head: q (Q, d), k (K, d), v (K, dv) -> (dq, dk, dv)."""
    cases = [(5, 7, 4, 3), (6, 3, 8, 5)]  # (Q, K, d, dv): Q != K, so swapped products fail on shape or value
    for seed, (Q, K, d, dv) in enumerate(cases):
        g = torch.Generator().manual_seed(100 + seed)
        q, k = torch.randn(Q, d, generator=g, dtype=_DT), torch.randn(K, d, generator=g, dtype=_DT)
        v, d_out = torch.randn(K, dv, generator=g, dtype=_DT), torch.randn(Q, dv, generator=g, dtype=_DT)
        scores = q @ k.T / math.sqrt(d)  # (Q, K)
        lse = torch.logsumexp(scores, -1)  # (Q,)
        p = torch.exp(scores - lse[:, None])  # (Q, K)
        out = p @ v  # (Q, dv)
        case = f"Q={Q}, K={K}, d={d}, dv={dv}"
        with refusing(_AUTOGRAD):
            got = call(fn, q.clone(), k.clone(), v.clone(), out.clone(), lse.clone(), d_out.clone(), case=case)
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise CheckFailed(f"{case}: return a tuple (dq, dk, dv), got {type(got).__name__}")
        expected = _tile_reference(q, k, v, d_out)
        dp = d_out @ v.T  # (Q, K)
        wrong_d = {
            "D taken as rowsum(dP); it is rowsum(P ⊙ dP) = rowsum(dO ⊙ O)": p * (dp - dp.sum(-1, keepdim=True)),
            "no D: dS = P ⊙ dP forgets that raising one weight lowers the others (the softmax Jacobian)": p * dp,
        }
        ds = p * (dp - (d_out * out).sum(-1, keepdim=True))  # (Q, K)
        for name, exp_, got_ in zip(("dq", "dk", "dv"), expected, got, strict=True):
            label = f"{case}, {name}"
            actual = expect_tensor(got_, label)
            expect_shape(actual, exp_.shape, label)
            mistakes = []
            if name == "dq":
                mistakes += [(f"{w}", x @ k / math.sqrt(d)) for w, x in wrong_d.items()]
                mistakes.append(("dQ is missing the 1/√d of the scores", ds @ k))
            else:
                mistakes += [(f"{w}", x.T @ q / math.sqrt(d)) for w, x in wrong_d.items()]
                mistakes.append(("dK is missing the 1/√d of the scores", ds.T @ q))
            diagnose(actual.detach().double(), exp_, mistakes, label, atol=1e-9, rtol=1e-9)
    passed("check_tile_gradients", len(cases))
    print("  Your prediction: dV = Pᵀ dO needs no D; D enters through dS, which dQ and dK both use.")
