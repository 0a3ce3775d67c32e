"""The exercise checks of notebook 10 (FlashAttention from scratch) pass right answers and name typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from mha_tutorial import checks

from testkit import fails_with


def merge_right(m1, l1, a1, m2, l2, a2):
    m = torch.maximum(m1, m2)  # (N,)
    m_safe = m.masked_fill(m == -math.inf, 0.0)  # both blocks empty: avoid -inf - (-inf)
    r1, r2 = torch.exp(m1 - m_safe), torch.exp(m2 - m_safe)  # (N,): 0 for an empty block
    return m, l1 * r1 + l2 * r2, a1 * r1[:, None] + a2 * r2[:, None]


def merge_without_m_safe(m1, l1, a1, m2, l2, a2):
    m = torch.maximum(m1, m2)
    r1, r2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, l1 * r1 + l2 * r2, a1 * r1[:, None] + a2 * r2[:, None]


def test_merge_right_answer_passes(capsys):
    checks.check_merge_states(merge_right)
    assert "✓ check_merge_states: passed on 6 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda m1, l1, a1, m2, l2, a2: (torch.maximum(m1, m2), l1 + l2, a1 + a2), "without rescaling"),
        (
            lambda m1, l1, a1, m2, l2, a2: (
                torch.maximum(m1, m2),
                l1 * torch.exp(m1 - torch.maximum(m1, m2)) + l2 * torch.exp(m2 - torch.maximum(m1, m2)),
                a1 + a2,
            ),
            "rescaled ℓ but not a",
        ),
        (
            lambda m1, l1, a1, m2, l2, a2: (
                torch.maximum(m1, m2),
                l1 * torch.exp(torch.maximum(m1, m2) - m1) + l2 * torch.exp(torch.maximum(m1, m2) - m2),
                a1 * torch.exp(torch.maximum(m1, m2) - m1)[:, None]
                + a2 * torch.exp(torch.maximum(m1, m2) - m2)[:, None],
            ),
            "sign flipped",
        ),
        (
            lambda m1, l1, a1, m2, l2, a2: (
                torch.maximum(m1, m2),
                l1 * torch.exp(m1) + l2 * torch.exp(m2),
                a1 * torch.exp(m1)[:, None] + a2 * torch.exp(m2)[:, None],
            ),
            "relative to 0",
        ),
        (lambda m1, l1, a1, m2, l2, a2: (m1 + m2, *merge_right(m1, l1, a1, m2, l2, a2)[1:]), "(m, the largest"),
        (lambda m1, l1, a1, m2, l2, a2: merge_right(m1, l1, a1, m2, l2, a2)[:2], "return a tuple (m, l, a)"),
        (merge_without_m_safe, "both maxima -inf"),
    ],
)
def test_merge_mistakes_are_named(fn, fragment):
    fails_with(checks.check_merge_states, fn, fragment)


def grads_right(q, k, v, out, lse, d_out):
    p = torch.exp(q @ k.T / math.sqrt(q.shape[-1]) - lse[:, None])  # (Q, K): the weights, recomputed
    dp = d_out @ v.T  # (Q, K)
    ds = p * (dp - (d_out * out).sum(-1, keepdim=True))  # (Q, K)
    scale = 1 / math.sqrt(q.shape[-1])
    return ds @ k * scale, ds.T @ q * scale, p.T @ d_out


def test_tile_gradients_right_answer_passes(capsys):
    checks.check_tile_gradients(grads_right)
    out = capsys.readouterr().out
    assert "✓ check_tile_gradients: passed on 2 cases" in out and "dV = Pᵀ dO needs no D" in out


def _autograd(q, k, v, out, lse, d_out):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    o = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), -1) @ v
    return torch.autograd.grad(o, (q, k, v), d_out)


def _package(q, k, v, out, lse, d_out):
    from mha_tutorial.modern.flash import flash_backward

    grads = flash_backward(*(x[None, None] for x in (q, k, v, out, lse, d_out)))
    return tuple(g[0, 0] for g in grads)


def _variant(change):
    def fn(q, k, v, out, lse, d_out):
        p = torch.exp(q @ k.T / math.sqrt(q.shape[-1]) - lse[:, None])
        dp = d_out @ v.T
        scale = 1 / math.sqrt(q.shape[-1])
        ds = change(p, dp, (d_out * out).sum(-1, keepdim=True))
        return ds @ k * (scale if change is not None else 1), ds.T @ q * scale, p.T @ d_out

    return fn


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (_autograd, "torch.autograd.grad"),
        (_package, "flash_backward"),
        (_variant(lambda p, dp, D: p * dp), "no D"),
        (_variant(lambda p, dp, D: p * (dp - dp.sum(-1, keepdim=True))), "rowsum(dP)"),
        (lambda *a: (grads_right(*a)[0] * math.sqrt(a[0].shape[-1]), *grads_right(*a)[1:]), "dQ is missing the 1/√d"),
        (lambda *a: (grads_right(*a)[0], grads_right(*a)[1] * math.sqrt(a[0].shape[-1]), grads_right(*a)[2]), "dK is"),
        (lambda *a: (grads_right(*a)[0], grads_right(*a)[1], a[5] @ a[2][: a[5].shape[1]]), "wrong shape"),
    ],
)
def test_tile_gradient_mistakes_are_named(fn, fragment):
    fails_with(checks.check_tile_gradients, fn, fragment)


def test_not_attempted_is_reported_and_fails_in_strict_mode(capsys, monkeypatch):
    def stub(*args):
        raise NotImplementedError("Exercise 1: not written yet")

    checks.check_merge_states(stub)
    assert "not attempted yet" in capsys.readouterr().out
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    with pytest.raises(checks.CheckFailed, match="not attempted"):
        checks.check_tile_gradients(stub)


def test_checks_are_exported():
    from mha_tutorial.checks import nb10

    assert nb10.__all__ == ["check_merge_states", "check_tile_gradients"]
    assert checks.check_merge_states is nb10.check_merge_states
