"""The new exercise checks of notebook 04a (the cost of attention) pass right answers, name typical wrong ones and
report a stub as not attempted. (Its peak-memory exercise, check_peak_prediction, is tested in test_checks_nb04.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from mha_tutorial import MultiHeadAttention, checks

from testkit import fails_with

# ------------------------------------------------------------------------------ Exercise 1: cross-attention FLOPs


def flops_right(B, Q, K, D, H, E):
    # W_q and W_o: (B Q x D) @ (D x D); W_k and W_v: (B K x E) @ (E x D); scores and pooling: B H Q K (D / H) each
    multiply_adds = 2 * B * Q * D * D + 2 * B * K * E * D + 2 * B * Q * K * D
    return 2 * multiply_adds


@pytest.mark.parametrize("shape", [(2, 5, 9, 24, 3, 10), (1, 1, 17, 8, 8, 3), (2, 11, 4, 12, 1, 12)])
def test_the_formula_of_the_right_answer_is_what_flop_counter_mode_counts(shape):
    B, Q, K, D, H, E = shape  # independent of the check: FlopCounterMode on the layer itself
    layer = MultiHeadAttention(D, H, key_size=E, value_size=E)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        layer(torch.randn(B, Q, D), torch.randn(B, K, E), torch.randn(B, K, E))
    assert counter.get_total_flops() == flops_right(*shape)


def test_flops_right_answer_passes(capsys):
    checks.check_cross_attention_flops(flops_right)
    assert "✓ check_cross_attention_flops: passed on 3 cases" in capsys.readouterr().out


def test_flops_as_a_float_or_a_tensor_passes(capsys):
    checks.check_cross_attention_flops(lambda *a: float(flops_right(*a)))
    checks.check_cross_attention_flops(lambda *a: torch.tensor(flops_right(*a)))
    assert capsys.readouterr().out.count("passed on 3 cases") == 2


def _slip(kind):
    def fn(B, Q, K, D, H, E):
        pq, pkv, attn = 4 * B * Q * D * D, 4 * B * K * E * D, 4 * B * Q * K * D
        return {
            "half": (pq + pkv + attn) / 2,
            "Q for K": pq + 4 * B * Q * E * D + attn,
            "D for E": pq + 4 * B * K * D * D + attn,
            "Q^2": pq + pkv + 4 * B * Q * Q * D,
            "K^2": pq + pkv + 4 * B * K * K * D,
            "heads": pq + pkv + H * attn,
            "one head": pq + pkv + attn // H,
            "no pooling": pq + pkv + attn // 2,
            "no W_o": pq // 2 + pkv + attn,
            "no projections": attn,
            "self-attention formula": 8 * B * Q * D * D + 4 * B * Q * Q * D,
            "section 1 with T -> Q": 8 * B * Q * D * D + 4 * B * Q * K * D,
        }[kind]

    return fn


@pytest.mark.parametrize(
    "kind, fragment",
    [
        ("half", "multiply-adds"),
        ("Q for K", "not the Q queries"),
        ("D for E", "width key_size E"),
        ("Q^2", "not Q**2"),
        ("K^2", "not K**2"),
        ("heads", "H cancels"),
        ("one head", "one head only"),
        ("no pooling", "pooling"),
        ("no W_o", "output projection W_o is missing"),
        ("no projections", "projections are missing"),
        ("self-attention formula", "FlopCounterMode counts 48,960"),
        ("section 1 with T -> Q", "section 1's formula with T replaced by Q"),
    ],
)
def test_flops_slips_are_named(kind, fragment):
    fails_with(checks.check_cross_attention_flops, _slip(kind), "batch=2, queries=5, keys=9", fragment)


def test_flops_counting_by_running_the_layer_is_refused():
    def fn(B, Q, K, D, H, E):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            MultiHeadAttention(D, H, key_size=E, value_size=E)(torch.randn(B, Q, D), *[torch.randn(B, K, E)] * 2)
        return counter.get_total_flops()

    fails_with(checks.check_cross_attention_flops, fn, "FlopCounterMode")


def test_flops_not_a_number_and_a_stub(capsys):
    fails_with(checks.check_cross_attention_flops, lambda *a: "many", "return a number of FLOPs")

    def stub(*a):
        raise NotImplementedError("Exercise 1: not written yet")

    checks.check_cross_attention_flops(stub)
    assert "not attempted yet (Exercise 1: not written yet)" in capsys.readouterr().out


# ------------------------------------------------------------------------- Exercise 3: fix the online softmax


def online_right(scores, values, block, rescale_s=True, rescale_a=True, guard=True, tail=True, sign=1, divide=True):  # noqa: PLR0913
    """A per-query Python loop over blocks with math.exp, apart from the check's tensor code; flags inject slips."""
    N, K = scores.shape
    rows = []
    for i in range(N):
        m, s, a = -math.inf, 0.0, [0.0] * values.shape[1]
        for start in range(0, K - block + 1 if not tail else K, block):
            block_scores = scores[i, start : start + block].tolist()
            m_new = max(m, *block_scores)
            m_safe = 0.0 if (guard and m_new == -math.inf) else m_new
            r = math.exp(sign * (m - m_safe))  # -inf - (-inf) is NaN in Python too
            p = [math.exp(x - m_safe) for x in block_scores]
            s = (s * r if rescale_s else s) + sum(p)
            v_rows = values[start : start + block].tolist()
            a = [
                (aj * r if rescale_a else aj) + sum(pk * v[j] for pk, v in zip(p, v_rows, strict=True))
                for j, aj in enumerate(a)
            ]
            m = m_new
        rows.append([aj / s if divide else aj for aj in a])
    return torch.tensor(rows, dtype=torch.float64)


def test_online_right_answer_passes(capsys):
    checks.check_online_attention(online_right)
    assert "✓ check_online_attention: passed on 6 cases" in capsys.readouterr().out


def test_online_tensor_version_with_torch_where_passes(capsys):  # another right way, vectorised over queries
    def fn(scores, values, block):
        m = torch.full_like(scores[:, :1], -math.inf)
        s, a = torch.zeros_like(m), torch.zeros(scores.shape[0], values.shape[1], dtype=scores.dtype)
        for S_b, V_b in zip(scores.split(block, -1), values.split(block, 0), strict=True):
            m_new = torch.maximum(m, S_b.amax(-1, keepdim=True))
            safe = torch.where(torch.isinf(m_new), 0.0, m_new)
            r, p = torch.exp(m - safe), torch.exp(S_b - safe)
            s, a, m = s * r + p.sum(-1, keepdim=True), a * r + p @ V_b, m_new
        return a / s

    checks.check_online_attention(fn)
    assert "passed on 6 cases" in capsys.readouterr().out


def online_tensor(scores, values, block, start_state=None):
    """A right tensor version over blocks; ``start_state(scores, values)`` builds the initial m, s and a."""
    N, K = scores.shape
    if start_state is None:
        m = torch.full((N, 1), -math.inf, dtype=scores.dtype)
        s, a = torch.zeros(N, 1, dtype=scores.dtype), torch.zeros(N, values.shape[1], dtype=scores.dtype)
    else:
        m, s, a = start_state(scores, values)
    for start in range(0, K, block):
        S_b, V_b = scores[:, start : start + block], values[start : start + block]
        m_new = torch.maximum(m, S_b.amax(-1, keepdim=True))
        safe = m_new.masked_fill(m_new == -math.inf, 0.0)
        r, p = torch.exp(m - safe), torch.exp(S_b - safe)
        s, a, m = s * r + p.sum(-1, keepdim=True), a * r + p @ V_b, m_new
    return a / s


def _new_full_state(scores, values):  # the idiomatic way to match dtype and device
    N = scores.shape[0]
    return scores.new_full((N, 1), -math.inf), scores.new_zeros(N, 1), scores.new_zeros(N, values.shape[1])


def _like_state(scores, values):
    m = torch.full_like(scores, -math.inf)[:, :1]  # a whole-row creation op, then a slice
    return m, torch.zeros_like(scores)[:, :1], torch.zeros_like(values[:1]).expand(scores.shape[0], -1)


def _guarded(scores, values, block):  # an input guard that reads the whole row: an elementwise test, no softmax
    if torch.isnan(scores).any() or (scores == math.inf).any():
        raise ValueError("scores must not hold NaN or +inf")
    return online_tensor(scores.clone(), values, block)


@pytest.mark.parametrize(
    "fn",
    [
        lambda sc, v, b: online_tensor(sc, v, b, _new_full_state),
        lambda sc, v, b: online_tensor(sc, v, b, _like_state),
        _guarded,
        lambda sc, v, b: online_tensor(torch.where(torch.isinf(sc), -math.inf, sc), v, b),  # elementwise where
    ],
    ids=["new_full and new_zeros", "full_like and zeros_like", "isnan guard and clone", "elementwise where"],
)
def test_online_whole_row_creation_ops_and_elementwise_tests_pass(fn, capsys):
    checks.check_online_attention(fn)
    assert "passed on 6 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (dict(rescale_a=False), ("K=6", "accumulator a is not rescaled")),
        (dict(rescale_s=False), ("K=6", "sum s is not rescaled")),
        (dict(tail=False), ("K=7", "last block is dropped")),
        (dict(divide=False), ("K=6", "not a / s")),
        (dict(sign=-1), ("K=6", "NaN or inf", "e^(m - m')")),
        (dict(guard=False), ("masked", "-inf - (-inf) = NaN")),
    ],
)
def test_online_slips_are_named(flags, fragments):
    fails_with(checks.check_online_attention, lambda sc, v, b: online_right(sc, v, b, **flags), *fragments)


def test_online_flipped_sign_started_from_the_first_block_is_named():
    def fn(scores, values, block):  # e^(m' - m) with the state taken from the first block: finite, but wrong
        m = scores[:, :block].amax(-1, keepdim=True)
        p = torch.exp(scores[:, :block] - m)
        s, a = p.sum(-1, keepdim=True), p @ values[:block]
        for start in range(block, scores.shape[1], block):
            S_b = scores[:, start : start + block]
            m_new = torch.maximum(m, S_b.amax(-1, keepdim=True))
            r, p = torch.exp(m_new - m), torch.exp(S_b - m_new)
            s, a, m = s * r + p.sum(-1, keepdim=True), a * r + p @ values[start : start + block], m_new
        return a / s

    fails_with(checks.check_online_attention, fn, "sign flipped")


def test_online_no_max_subtracted_overflows_near_1000():
    def fn(scores, values, block):
        s, a = torch.zeros(scores.shape[0], 1, dtype=scores.dtype), 0.0
        for start in range(0, scores.shape[1], block):
            p = torch.exp(scores[:, start : start + block])
            s, a = s + p.sum(-1, keepdim=True), a + p @ values[start : start + block]
        return a / s

    fails_with(checks.check_online_attention, fn, "scores near 1000", "e^score overflows")


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda sc, v, b: torch.softmax(sc, -1) @ v, "calls softmax"),
        (lambda sc, v, b: F.softmax(sc, -1) @ v, "calls softmax"),
        (lambda sc, v, b: sc.softmax(-1) @ v, "calls softmax"),
        (
            lambda sc, v, b: F.scaled_dot_product_attention(sc[None], torch.eye(sc.shape[1], dtype=sc.dtype), v),
            "calls F.scaled_dot_product_attention",
        ),
        (lambda sc, v, b: torch.exp(sc - torch.logsumexp(sc, -1, keepdim=True)) @ v, "on a whole row of K=6 scores"),
        (lambda sc, v, b: online_tensor(sc - sc.amax(-1, keepdim=True), v, b), "ran amax on a whole row of K=6"),
        (lambda sc, v, b: (e := torch.exp(sc - 3.0)) @ v / e.sum(-1, keepdim=True), "ran exp on a whole row of K=6"),
        (lambda sc, v, b: online_tensor(sc, v, b) + 0 * sc.sum(), "ran sum on a whole row of K=6"),
    ],
)
def test_online_whole_row_shortcuts_are_refused(fn, fragment):
    fails_with(checks.check_online_attention, fn, fragment)


def test_online_wrong_shape_and_stub(capsys):
    fails_with(checks.check_online_attention, lambda sc, v, b: online_right(sc, v, b).T, "wrong shape")

    def stub(scores, values, block):
        raise NotImplementedError("Exercise 3: not written yet")

    checks.check_online_attention(stub)
    assert "not attempted yet (Exercise 3: not written yet)" in capsys.readouterr().out
