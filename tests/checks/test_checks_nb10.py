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


def tiled_backward(q, k, v, out, lse, d_out, block, is_causal, slip=None):  # noqa: PLR0913
    """The learner's loop (right when ``slip`` is None), written independently of the check's own variants."""
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    lse_safe = lse[..., None] if slip == "no guard" else torch.where(torch.isinf(lse), 0.0, lse)[..., None]
    big_d = (d_out * out).sum(-1, keepdim=True)  # (B, H, Q, 1)
    dq, dks, dvs = torch.zeros_like(q), [], []
    for start in range(0, n_k, block):
        k_b, v_b = k[..., start : start + block, :], v[..., start : start + block, :]
        s = q @ k_b.transpose(-2, -1) / math.sqrt(d)  # (B, H, Q, b)
        if is_causal and slip != "no mask":
            shift = 0 if slip == "top-left" else n_k - n_q
            hidden = torch.arange(start, start + k_b.shape[-2])[None, :] > torch.arange(n_q)[:, None] + shift
            s = s.masked_fill(hidden, -math.inf)
        p = torch.exp(s - (s.logsumexp(-1, keepdim=True) if slip == "local" else lse_safe))
        p = p.nan_to_num(0.0) if slip == "local" else p
        dp = d_out @ v_b.transpose(-2, -1)
        sub = {"no D": 0.0, "D from dP": dp.sum(-1, keepdim=True)}.get(slip, big_d)
        ds = p * (dp - sub)
        scale = 1.0 if slip == "no scale" else 1 / math.sqrt(d)
        dvs.append(p.transpose(-2, -1) @ d_out)
        dks.append(ds.transpose(-2, -1) @ q * scale)
        dq = ds @ k_b * scale if slip == "dq overwritten" else dq + ds @ k_b * scale
    return dq, torch.cat(dks, -2), torch.cat(dvs, -2)


def test_tile_gradients_right_answer_passes(capsys):
    checks.check_tile_gradients(tiled_backward)
    out = capsys.readouterr().out
    assert "✓ check_tile_gradients: passed on 3 cases" in out and "The answer: dV = Pᵀ dO needs no D" in out


def _autograd(q, k, v, out, lse, d_out, block, is_causal):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    o = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v
    return torch.autograd.grad(o, (q, k, v), d_out)


def _package_backward(q, k, v, out, lse, d_out, block, is_causal):
    from mha_tutorial.modern.flash import Tiling, flash_backward

    return flash_backward(q, k, v, out, lse, d_out, Tiling(is_causal=is_causal, block_k=block))


def _package_attention(q, k, v, out, lse, d_out, block, is_causal):
    from mha_tutorial.modern.flash import flash_attention

    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    return torch.autograd.grad(flash_attention(q, k, v, is_causal=is_causal, block_k=block), (q, k, v), d_out)


def _dense(q, k, v, out, lse, d_out, block, is_causal):  # right numbers, but the whole (Q, K) weights at once
    return tiled_backward(q, k, v, out, lse, d_out, k.shape[-2], is_causal)


def _slip(name):
    return lambda *a: tiled_backward(*a, slip=name)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (_autograd, "autograd computes the gradient"),
        (_package_backward, "flash_backward"),
        (_package_attention, "flash_attention"),
        (_dense, "for the whole (Q, K)"),
        (_slip("local"), "normalised within the tile"),
        (_slip("no D"), "no D"),
        (_slip("D from dP"), "rowsum(dP)"),
        (_slip("dq overwritten"), "dQ holds only the last block"),
        (_slip("no mask"), "causal mask is missing"),
        (_slip("top-left"), "aligned top-left"),
        (_slip("no scale"), "missing the 1/√d"),
        (_slip("no guard"), "NaN. A query that sees no key has L = -inf"),
        (lambda *a: tiled_backward(*a)[:2], "return a tuple (dq, dk, dv)"),
        (lambda *a: (tiled_backward(*a)[0], tiled_backward(*a)[1], a[2]), "wrong values"),
        (lambda *a: (*tiled_backward(*a)[:2], tiled_backward(*a)[2][..., :2]), "wrong shape"),
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
