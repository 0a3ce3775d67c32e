"""The exercise checks of notebook 10 (FlashAttention from scratch) pass right answers and name typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from mha_tutorial import checks

from testkit import fails_with


def merge_right(outs, lses):  # outs (n_s, N, dv), lses (n_s, N): a fold over the splits, written apart from the check
    out, lse = torch.zeros_like(outs[0]), torch.full_like(lses[0], -math.inf)
    for o_s, l_s in zip(outs, lses, strict=True):
        new = torch.logaddexp(lse, l_s)  # (N,): -inf only while nothing has been seen
        new_safe = new.masked_fill(new == -math.inf, 0.0)
        out = out * torch.exp(lse - new_safe)[:, None] + o_s * torch.exp(l_s - new_safe)[:, None]
        lse = new
    return out, lse


def _weights(lses):  # e^(L_s - L) through torch.logsumexp, with no guard for a query that no split shows
    return torch.exp(lses - torch.logsumexp(lses, 0))[..., None]


def _top(lses):
    top = lses.amax(0)
    return top.masked_fill(top == -math.inf, 0.0)


def test_merge_right_answer_passes(capsys):
    checks.check_merge_states(merge_right)
    assert "✓ check_merge_states: passed on 6 cases" in capsys.readouterr().out


def test_merge_softmax_weights_with_a_guard_pass(capsys):  # another right way: the weights are a softmax over splits
    def fn(outs, lses):
        seen = torch.isfinite(lses).any(0)  # (N,)
        w = torch.softmax(lses.masked_fill(~seen, 0.0), 0) * seen  # (n_s, N)
        return (w[..., None] * outs).sum(0), torch.logsumexp(lses, 0)

    checks.check_merge_states(fn)
    assert "passed on 6 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda outs, lses: (outs.mean(0), merge_right(outs, lses)[1]), "equal weights"),
        (lambda outs, lses: (outs.sum(0), merge_right(outs, lses)[1]), "without weights"),
        (
            lambda outs, lses: ((torch.exp(lses - _top(lses))[..., None] * outs).sum(0), merge_right(outs, lses)[1]),
            "did not divide",
        ),
        (
            lambda outs, lses: (
                (torch.exp(-lses) / torch.exp(-lses).sum(0))[..., None].mul(outs).sum(0).nan_to_num(0.0),
                merge_right(outs, lses)[1],
            ),
            "sign flipped",
        ),
        (lambda outs, lses: ((lses / lses.sum(0))[..., None].mul(outs).sum(0), merge_right(outs, lses)[1]), "by L_s"),
        (lambda outs, lses: (merge_right(outs, lses)[0], lses.amax(0)), "largest L_s"),
        (lambda outs, lses: (merge_right(outs, lses)[0], lses.sum(0)), "sum of the L_s"),
        (lambda outs, lses: ((_weights(lses) * outs).sum(0), torch.logsumexp(lses, 0)), "-inf - (-inf)"),
        (
            lambda outs, lses: (
                (torch.exp(lses)[..., None] * outs).sum(0) / torch.exp(lses).sum(0)[:, None],
                merge_right(outs, lses)[1],
            ),
            "NaN from inf / inf. e^(L_s) overflows",
        ),
        (lambda outs, lses: (merge_right(outs, lses)[0], torch.logsumexp(lses, 0).nan_to_num(0.0, 0.0, 0.0)), "-inf"),
        (lambda outs, lses: merge_right(outs, lses)[0], "return a tuple (out, lse)"),
        (lambda outs, lses: (merge_right(outs, lses)[0][:, :2], merge_right(outs, lses)[1]), "wrong shape"),
        (lambda outs, lses: (merge_right(outs, lses)[0] * 1.01, merge_right(outs, lses)[1]), "merged output"),
    ],
)
def test_merge_mistakes_are_named(fn, fragment):
    fails_with(checks.check_merge_states, fn, fragment)


def test_merge_refuses_the_package():
    def fn(outs, lses):
        from mha_tutorial.modern.flash import Tiling, flash_forward

        flash_forward(outs[None, None], outs[None, None], outs[None, None], Tiling())
        return merge_right(outs, lses)

    fails_with(checks.check_merge_states, fn, "flash_forward")


def tiled_backward(q, k, v, out, lse, d_out, block, is_causal, slip=None):  # noqa: PLR0913
    """The learner's loop (right when ``slip`` is None), written independently of the check's own variants."""
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    lse_safe = lse[..., None] if slip == "no guard" else torch.where(torch.isinf(lse), 0.0, lse)[..., None]
    big_d = (d_out * out).sum(-1, keepdim=True)  # (B, H, Q, 1)
    dq, dks, dvs = torch.zeros_like(q), [], []
    for start in range(0, n_k, block):
        k_b, v_b = k[..., start : start + block, :], v[..., start : start + block, :]
        s = q @ k_b.transpose(-2, -1) / math.sqrt(d)  # (B, H, Q, bk)
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
    assert (
        "✓ check_tile_gradients: passed on 3 cases" in out
        and "The answer: with keys outside, each query's dQ collects a share" in out
    )


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


def _package_function(q, k, v, out, lse, d_out, block, is_causal):  # the autograd Function, no autograd call
    from mha_tutorial.modern.flash import FlashAttentionFunction, Tiling

    FlashAttentionFunction.apply(q, k, v, Tiling(is_causal=is_causal, block_k=block))
    return tiled_backward(q, k, v, out, lse, d_out, block, is_causal)


def _package_function_backward(q, k, v, out, lse, d_out, block, is_causal):  # its backward, called directly
    from types import SimpleNamespace

    from mha_tutorial.modern.flash import FlashAttentionFunction, Tiling

    ctx = SimpleNamespace(saved_tensors=(q, k, v, out, lse), tiling=Tiling(is_causal=is_causal, block_k=block))
    return FlashAttentionFunction.backward(ctx, d_out)[:3]


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
        (_package_function, "FlashAttentionFunction (its backward"),
        (_package_function_backward, "FlashAttentionFunction.backward"),
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
