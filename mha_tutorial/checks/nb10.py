"""Checks for the exercises of notebook 10 (FlashAttention from scratch).

Exercise 1: merge the results of n_s splits of the keys, each given as its output O_s and log-sum-exp L_s (what
flash-decoding's parallel splits return), into the output and log-sum-exp of all the keys. The reference is the
softmax over every key at once; the cases include splits in which a query sees no key (L_s = -inf), a query that
no split shows anything, an empty split arriving first, and scores near 1000 (e^L overflows). Typical slips (equal
weights, no weights, weights not normalised, the sign flipped, L_s as a weight, L as max or sum of the L_s, NaN
from -inf - (-inf)) are named; the package's forward passes are refused.

Exercise 2: the tiled backward pass, a loop over blocks of keys from the saved output and log-sum-exp, causal
masks with Q != K included. The reference is autograd through dense float64 attention; autograd and the package's
passes (flash_backward, flash_attention, FlashAttentionFunction) are refused, and so is any tensor the size of the whole (Q, K) weights (the point is one tile at a time).
Typical slips (weights normalised within a tile instead of e^(S - L), no D, D from dP, dQ overwritten instead of
accumulated across key blocks, the mask missing or top-left, no 1/√d, NaN for a query with no visible key) are
named.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..modern import flash
from ._common import CheckFailed, call, diagnose, expect_shape, expect_tensor, friendly, passed, refusing

__all__ = ["check_merge_states", "check_tile_gradients"]

_DT = torch.float64


def _split_state(scores: torch.Tensor, values: torch.Tensor):
    """(O, L) of one split: scores (N, b), -inf for a hidden key; values (b, dv) -> (N, dv), (N,); no key: 0, -inf."""
    lse = torch.logsumexp(scores, -1) if scores.shape[-1] else torch.full(scores.shape[:1], -math.inf, dtype=_DT)
    lse_safe = lse.masked_fill(lse == -math.inf, 0.0)[:, None]  # (N, 1): the split's scores are all -inf there
    return torch.exp(scores - lse_safe) @ values, lse


def _merge_cases():
    """(case, scores (N, K) with -inf for a hidden key, the splits' sizes in the order they arrive)."""
    g = torch.Generator().manual_seed(10)
    hidden = torch.randn(3, 9, generator=g, dtype=_DT)
    hidden[0, 4:] = -math.inf  # query 0 sees no key of the last two splits
    nobody = torch.randn(3, 6, generator=g, dtype=_DT)
    nobody[1] = -math.inf  # query 1 sees no key at all
    return [
        ("3 splits of 2, 3 and 4 keys", torch.randn(3, 9, generator=g, dtype=_DT) * 2, (2, 3, 4)),
        ("one split only", torch.randn(2, 5, generator=g, dtype=_DT), (5,)),
        ("4 splits, scores near 1000 (e^L overflows)", 1000 + 3 * torch.randn(2, 10, generator=g, dtype=_DT), (1, 4, 2, 3)),
        ("query 0 sees no key of the last two splits (L = -inf there)", hidden, (4, 3, 2)),
        ("an empty split arrives first", torch.randn(2, 5, generator=g, dtype=_DT), (0, 2, 3)),
        ("query 1 sees no key in any split", nobody, (3, 3)),
    ]  # fmt: skip


def _merge_mistakes(outs: torch.Tensor, lses: torch.Tensor):
    """(what went wrong, the output that slip gives) for the splits' outs (n_s, N, dv) and lses (n_s, N)."""
    top = lses.amax(0)  # (N,)
    w = torch.exp(lses - top.masked_fill(top == -math.inf, 0.0))  # (n_s, N): e^(L_s - max L_s), 0 for an empty split
    flipped = torch.exp(top[None] - lses).nan_to_num(0.0, 0.0, 0.0)  # e^(max L_s - L_s): the sign flipped
    linear = lses.nan_to_num(0.0, 0.0, 0.0)  # the L_s themselves as weights
    return [
        ("averaged the splits' outputs with equal weights: a split whose keys score higher holds more of the "
         "softmax; weight each O_s by its share e^(L_s - L)", outs.mean(0)),
        ("added the splits' outputs without weights: each O_s is normalised over its own keys only, so weight "
         "each by its share e^(L_s - L) of the union's softmax", outs.sum(0)),
        ("weighted each O_s by e^(L_s - max L_s) but did not divide by the weights' sum: the shares must add "
         "up to 1", (w[..., None] * outs).sum(0)),
        ("the weights have their sign flipped: split s holds e^(L_s - L) of the union, at most 1, larger for "
         "a larger L_s", (flipped[..., None] * outs).sum(0) / flipped.sum(0).clamp_min(1e-300)[:, None]),
        ("weighted each O_s by L_s; L_s is a logarithm: the weight is e^(L_s - L)",
         (linear[..., None] * outs).sum(0) / linear.sum(0)[:, None]),
    ]  # fmt: skip


def _lse_mistakes(lses: torch.Tensor):
    return [
        ("L is the largest L_s; the union's L is the log of the summed e^(L_s), log Σ_s e^(L_s)", lses.amax(0)),
        ("L is the sum of the L_s; the union's L is the log of the summed e^(L_s), log Σ_s e^(L_s)", lses.sum(0)),
    ]


def _check_merged(out, lse, outs, lses, scores, values, case):  # noqa: PLR0913 (what one comparison needs)
    expect_shape(out, (scores.shape[0], values.shape[-1]), case)
    expect_shape(lse, (scores.shape[0],), case)
    if torch.isnan(out).any() or torch.isnan(lse).any():
        if (lses.isfinite() & torch.exp(lses).isinf()).any():  # e^(L_s) overflowed: inf / inf is NaN
            raise CheckFailed(
                f"{case}: NaN from inf / inf. e^(L_s) overflows for large scores; subtract the largest L_s first"
            )
        raise CheckFailed(
            f"{case}: NaN. Where every split has L_s = -inf, L_s - L is -inf - (-inf); replace an L (or maximum) of "
            "-inf by 0 before subtracting, as section 3's m_safe does, so that each weight is e^(-inf) = 0"
        )
    if not torch.isfinite(out).all():
        raise CheckFailed(
            f"{case}: inf in the output. e^(L_s) overflows for large scores; subtract the largest L_s first"
        )
    expected_lse = torch.logsumexp(scores, -1)  # (N,): -inf where no split shows a key
    empty = expected_lse == -math.inf
    if not bool(((lse == -math.inf) == empty).all()):
        raise CheckFailed(f"{case}: L must be -inf for a query that sees no key in any split, and finite elsewhere")
    lse_safe = expected_lse.masked_fill(empty, 0.0)[:, None]
    expected = torch.exp(scores - lse_safe) @ values  # (N, dv): attention over every key at once, 0 with none
    diagnose(out.double(), expected, _merge_mistakes(outs, lses), f"{case} (the merged output)", atol=1e-9, rtol=1e-9)
    mistakes = [(why, wrong.masked_fill(empty, 0.0)) for why, wrong in _lse_mistakes(lses)]
    what = f"{case} (L, the union's log-sum-exp)"
    diagnose(
        lse.double().masked_fill(empty, 0.0),
        expected_lse.masked_fill(empty, 0.0),
        mistakes,
        what,
        atol=1e-9,
        rtol=1e-12,
    )


_FORWARD_PASSES = {
    flash.flash_forward: "mha_tutorial.modern.flash.flash_forward (the scores are not given: merge the splits)",
    flash.flash_attention: "mha_tutorial.modern.flash.flash_attention (the scores are not given: merge the splits)",
}


@friendly
def check_merge_states(fn) -> None:
    """``fn(outs, lses)``: the splits' outputs (n_s, N, dv) and log-sum-exps (n_s, N) -> (out (N, dv), lse (N,))."""
    g = torch.Generator().manual_seed(11)
    cases = _merge_cases()
    for case, scores, sizes in cases:
        values = torch.randn(scores.shape[-1], 5, generator=g, dtype=_DT)  # (K, dv): dv = 5, unlike any n_s or N
        edges = [0, *itertools.accumulate(sizes)]
        states = [_split_state(scores[:, a:b], values[a:b]) for a, b in itertools.pairwise(edges)]
        # outs (n_s, N, dv), lses (n_s, N)
        outs, lses = torch.stack([o for o, _ in states]), torch.stack([lse for _, lse in states])
        with refusing(_FORWARD_PASSES):
            got = call(fn, outs.clone(), lses.clone(), case=case)
        if not isinstance(got, tuple | list) or len(got) != 2:
            raise CheckFailed(f"{case}: return a tuple (out, lse), got {type(got).__name__}")
        out, lse = (expect_tensor(x, case) for x in got)
        _check_merged(out, lse, outs, lses, scores, values, case)
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
    flash.FlashAttentionFunction.forward: "the package's FlashAttentionFunction (its backward is this exercise)",
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
        k_b, v_b = k[..., k0 : k0 + block, :], v[..., k0 : k0 + block, :]  # (B, H, bk, d), (B, H, bk, dv)
        s = q @ k_b.transpose(-2, -1) / math.sqrt(d)  # (B, H, Q, bk)
        if is_causal and slip != "no mask":
            s = s.masked_fill(torch.arange(k0, k0 + k_b.shape[-2]) > rows + offset, -math.inf)
        p = torch.softmax(s, -1).nan_to_num(0.0) if slip == "local" else torch.exp(s - L)  # (B, H, Q, bk)
        dp = d_out @ v_b.transpose(-2, -1)  # (B, H, Q, bk)
        dd = {"no D": 0.0, "D from dP": dp.sum(-1, keepdim=True)}.get(slip, D)
        ds = p * (dp - dd)  # (B, H, Q, bk)
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
    print("  The answer: with keys outside, each query's dQ collects a share from every block of keys, while a")
    print("  block's dK and dV come from that block alone (every query meets it in one step). With queries outside")
    print("  it is the reverse: dK and dV collect a share from every block of queries.")
