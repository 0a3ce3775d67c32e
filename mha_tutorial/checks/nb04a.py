"""Checks for the exercises of notebook 04a (the cost of attention) that are new there.

Exercise 1 (check_cross_attention_flops): the matrix-product FLOPs of one forward pass of cross-attention, with
Q queries of width D and K keys and values of width E, from the shapes alone. The reference is PyTorch's
``FlopCounterMode`` on the package's ``MultiHeadAttention`` for shapes the notebook never shows; typical slips
(multiply-adds, not FLOPs; section 1's formula with T -> Q; Q where K belongs; D where E belongs; T^2 for Q K;
the heads counted; the pooling or the output projection left out) are named. Counting with FlopCounterMode or running the layer is refused.

Exercise 2 is ``check_peak_prediction`` (in ``nb04``, where notebook 04's tests reach it).

Exercise 3 (check_online_attention): the fixed blockwise online softmax, ``fn(scores, values, block)`` for N
queries at once. The reference is ``torch.softmax(scores) @ values`` in float64, on cases with K not a multiple of
the block, scores near 1000 (e^score overflows) and -inf (masked) scores, a whole block of them included; typical
slips (a or s not rescaled, the rescale's sign flipped, no maximum subtracted, the last partial block dropped, no
division by s, NaN from -inf - (-inf)) are named. Softmax and SDPA are refused, and so are exponentials, maxima, sums and
matrix products on a whole row of K scores at once (blocks are the point); slicing the scores, creating tensors from
them (new_zeros, full_like, ...) and elementwise tests (isnan) are allowed.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..core.mha import MultiHeadAttention
from ._common import CheckFailed, call, diagnose, expect_shape, expect_tensor, friendly, passed, refusing

__all__ = ["check_cross_attention_flops", "check_online_attention"]

# ------------------------------------------------------------------------------ Exercise 1: cross-attention FLOPs

# (batch, queries, keys, hiddens, heads, key_size): Q != K, E != D, shapes the notebook does not show
_FLOP_CASES = [(2, 5, 9, 24, 3, 10), (1, 12, 3, 32, 4, 48), (3, 6, 6, 16, 2, 16)]


def _counted_flops(batch, queries, keys, hiddens, heads, key_size) -> int:  # noqa: PLR0913
    """FLOPs that FlopCounterMode counts in one forward pass of MultiHeadAttention(hiddens, heads, key_size=E,
    value_size=E) on (batch, queries, hiddens) queries and (batch, keys, key_size) keys and values."""
    layer = MultiHeadAttention(hiddens, heads, key_size=key_size, value_size=key_size)
    g = torch.Generator().manual_seed(0)
    x, kv = torch.randn(batch, queries, hiddens, generator=g), torch.randn(batch, keys, key_size, generator=g)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        layer(x, kv, kv)
    return counter.get_total_flops()


def _flop_slips(B, Q, K, D, H, E):  # noqa: PLR0913 (the exercise's arguments)
    """(what went wrong, the count that slip gives); the right count is 4BQD^2 + 4BKED + 4BQKD."""
    proj_q, proj_kv, attn = 4 * B * Q * D * D, 4 * B * K * E * D, 4 * B * Q * K * D
    return [
        ("that is section 1's formula with T replaced by Q: W_k and W_v project the K keys and values of width E "
         "(2*B*K*E*D each, not 2*B*Q*D*D)", 8 * B * Q * D * D + attn),
        ("that counts multiply-adds: each one is 2 FLOPs (a multiply and an add)", (proj_q + proj_kv + attn) // 2),
        ("W_k and W_v project the K keys and values, not the Q queries: use K there", proj_q + 4 * B * Q * E * D + attn),
        ("W_k and W_v read inputs of width key_size E, not D: each costs 2*B*K*E*D", proj_q + 4 * B * K * D * D + attn),
        ("the scores are (Q, K) per head, not (Q, Q): use Q*K, not Q**2", proj_q + proj_kv + 4 * B * Q * Q * D),
        ("the scores are (Q, K) per head, not (K, K): use Q*K, not K**2", proj_q + proj_kv + 4 * B * K * K * D),
        ("the heads were counted on top of D: H heads of size D/H cost what one head of size D costs, so H cancels",
         proj_q + proj_kv + H * attn),
        ("one head only: the scores and pooling of all H heads of size D/H together cost 4*B*Q*K*D",
         proj_q + proj_kv + attn // H),
        ("the weighted sum of the values (pooling) is missing: it costs as much as the scores", proj_q + proj_kv + attn // 2),
        ("the output projection W_o is missing: it is a second (D x D) product on the Q outputs",
         proj_q // 2 + proj_kv + attn),
        ("the projections are missing: W_q and W_o cost 2*B*Q*D*D each, W_k and W_v 2*B*K*E*D each", attn),
    ]  # fmt: skip


@friendly
def check_cross_attention_flops(fn) -> None:
    """``fn(batch, queries, keys, hiddens, heads, key_size)`` -> the FLOPs of one forward pass, as counted by
    ``FlopCounterMode`` (matrix products only)."""
    refused = {
        FlopCounterMode.__init__: "FlopCounterMode (count from the shapes instead)",
        MultiHeadAttention.forward: "the layer itself (count from the shapes instead of running it)",
    }
    for B, Q, K, D, H, E in _FLOP_CASES:
        case = f"batch={B}, queries={Q}, keys={K}, hiddens={D}, heads={H}, key_size={E}"
        with refusing(refused):
            got = call(fn, B, Q, K, D, H, E, case=case)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise CheckFailed(f"{case}: return a number of FLOPs, got {got!r} ({type(got).__name__})")
        counted = _counted_flops(B, Q, K, D, H, E)
        if abs(got - counted) <= 1e-9 * counted:
            continue
        for why, wrong in _flop_slips(B, Q, K, D, H, E):
            if abs(got - wrong) <= 1e-9 * wrong:
                raise CheckFailed(f"{case}: you gave {got:,.0f}, FlopCounterMode counts {counted:,d}: {why}")
        raise CheckFailed(f"{case}: you gave {got:,.0f}, FlopCounterMode counts {counted:,d}")
    passed("check_cross_attention_flops", len(_FLOP_CASES))


# ------------------------------------------------------------------------- Exercise 3: fix the online softmax

_DT = torch.float64


def _online_variant(scores, values, block, slip=""):
    """The blockwise online softmax in float64, right when ``slip`` is empty, else with that one typical mistake."""
    N, K = scores.shape
    m = torch.full((N, 1), -math.inf, dtype=_DT)  # (N, 1): largest score so far
    s, a = torch.zeros(N, 1, dtype=_DT), torch.zeros(N, values.shape[1], dtype=_DT)  # (N, 1), (N, dv)
    stop = K - block + 1 if slip == "tail" else K
    for start in range(0, stop, block):
        S_b, V_b = scores[:, start : start + block], values[start : start + block]  # (N, b), (b, dv)
        if slip == "no max":
            p = torch.exp(S_b)
            s, a = s + p.sum(-1, keepdim=True), a + p @ V_b
            continue
        m_new = torch.maximum(m, S_b.amax(-1, keepdim=True))  # (N, 1)
        m_safe = m_new.masked_fill(m_new == -math.inf, 0.0)  # (N, 1): 0 while a query has seen only -inf
        if slip == "flip":  # e^(m' - m), the state started from the first block so that it stays finite
            rescale = torch.exp(m_new - m).nan_to_num(0.0, 0.0, 0.0) if start else torch.zeros(N, 1, dtype=_DT)
        else:
            rescale = torch.exp(m - m_safe)  # (N, 1)
        p = torch.exp(S_b - m_safe)  # (N, b)
        s = (s if slip == "s" else s * rescale) + p.sum(-1, keepdim=True)
        a = (a if slip == "a" else a * rescale) + p @ V_b
        m = m_new
    return a if slip == "no division" else a / s


_ONLINE_SLIPS = {
    "a": "the accumulator a is not rescaled: when a block raises the maximum from m to m', the old a (like the old "
    "s) must be multiplied by e^(m - m')",
    "s": "the sum s is not rescaled: when a block raises the maximum from m to m', the old s (like the old a) must "
    "be multiplied by e^(m - m')",
    "flip": "the rescale has its sign flipped: the old terms were e^(score - m), the new ones need e^(score - m'), "
    "so multiply by e^(m - m'), at most 1",
    "tail": "the last block is dropped when K is not a multiple of the block: range(0, K, block) reaches it, and "
    "the slice start:start + block simply ends at K",
    "no division": "the result is a, not a / s: a is the weighted sum of values before the softmax's division",
}


def _online_cases():
    """(case, scores (N, K) float64 with -inf for a masked key, values (K, dv), block); every query sees a key."""
    g = torch.Generator().manual_seed(41)
    masked = torch.randn(3, 8, generator=g, dtype=_DT) * 2
    masked[0, :3] = -math.inf  # query 0: the whole first block is masked
    masked[1, 3:6] = -math.inf  # query 1: a middle block is masked
    masked[2, [1, 4, 7]] = -math.inf  # query 2: scattered masked keys, the last one included
    cases = [
        ("N=3 queries, K=6 keys, blocks of 2", torch.randn(3, 6, generator=g, dtype=_DT) * 2, 2),
        ("K=7 keys, blocks of 3 (the last block has 1 key)", torch.randn(2, 7, generator=g, dtype=_DT) * 2, 3),
        ("K=5 keys, blocks of 1", torch.randn(2, 5, generator=g, dtype=_DT) * 2, 1),
        ("K=5 keys, one block larger than K", torch.randn(2, 5, generator=g, dtype=_DT), 8),
        ("scores near 1000 (e^score overflows), K=9, blocks of 4", 1000 + 3 * torch.randn(2, 9, generator=g, dtype=_DT), 4),
        ("masked (-inf) scores, query 0's whole first block among them, K=8, blocks of 3", masked, 3),
    ]  # fmt: skip
    return [(case, sc, torch.randn(sc.shape[1], 4, generator=g, dtype=_DT), b) for case, sc, b in cases]


# what builds a softmax over a row: exponentials, maxima, sums and products with the values; on a whole row of K
# scores these are refused, while views, new tensors (new_zeros, full_like, ...) and elementwise tests (isnan) are not
_ROW_OPS = frozenset(
    "exp exp2 expm1 amax max aminmax argmax sort topk sum nansum mean cumsum logsumexp logcumsumexp _softmax "
    "_log_softmax mm bmm addmm mv dot matmul".split()
)


class _WatchRows(TorchDispatchMode):
    """Notes the first exponential, maximum, sum or matrix product that reads a float tensor whose last axis has K
    entries (a whole row of scores)."""

    def __init__(self, K: int):
        super().__init__()
        self.K, self.seen = K, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.seen is None and name in _ROW_OPS:
            for x in (*args, *(kwargs or {}).values()):
                if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() and x.shape[-1] == self.K:
                    self.seen = name
        return func(*args, **(kwargs or {}))


_REFUSED_NAMES = {
    "softmax": "softmax (the exercise is to build it one block at a time)",
    "log_softmax": "log_softmax (the exercise is to build the softmax one block at a time)",
    "scaled_dot_product_attention": "F.scaled_dot_product_attention (it computes the whole attention)",
}


def _explain_non_finite(got, case, has_masked) -> None:
    if torch.isnan(got).any() and has_masked:
        raise CheckFailed(
            f"{case}: NaN. After a block whose scores are all -inf, the running maximum is still -inf, and score - m "
            "is -inf - (-inf) = NaN; subtract a safe maximum instead, 0 where m' = -inf (its terms are e^(-inf) = 0)"
        )
    if not torch.isfinite(got).all():
        raise CheckFailed(
            f"{case}: NaN or inf. Either e^score overflows (subtract the running maximum m' before exponentiating) "
            "or the rescale is e^(m' - m), which is inf at the first block, where m = -inf (it must be e^(m - m'))"
        )


@friendly
def check_online_attention(fn) -> None:
    """``fn(scores, values, block)``: scores (N, K) float64 (-inf = masked), values (K, dv) -> (N, dv), the softmax
    over each row of scores times the values, computed one block of ``block`` keys at a time."""
    cases = _online_cases()
    for case, scores, values, block in cases:
        K = scores.shape[1]
        watch = _WatchRows(K) if block < K else None
        args = (scores.clone(), values.clone(), block)  # copies made before the watch starts
        with refusing({}, _REFUSED_NAMES), watch or contextlib.nullcontext():
            got = call(fn, *args, case=case)
        if watch is not None and watch.seen is not None:
            raise CheckFailed(
                f"{case}: your function ran {watch.seen} on a whole row of K={K} scores; exponentials, maxima, sums "
                "and products with the values must take one block at a time (e.g. scores[:, start:start + block]), "
                "keeping m, s and a running"
            )
        expected = torch.softmax(scores, -1) @ values  # (N, dv)
        got = expect_tensor(got, case)
        expect_shape(got, expected.shape, case)
        _explain_non_finite(got.detach(), case, has_masked=bool(torch.isinf(scores).any()))
        slips = ((why, _online_variant(scores, values, block, slip)) for slip, why in _ONLINE_SLIPS.items())
        diagnose(got.detach().double(), expected, slips, case, atol=1e-9, rtol=1e-7)
    passed("check_online_attention", len(cases))
