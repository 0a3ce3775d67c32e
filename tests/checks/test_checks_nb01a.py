"""The exercise check of the deep dive 01a passes right answers and names typical wrong ones."""

from __future__ import annotations

import pytest
import torch

from mha_tutorial import checks

from testkit import fails_with


def jacobian_right(p, temperature):
    return (torch.diag_embed(p) - p[..., :, None] * p[..., None, :]) / temperature  # (..., K, K)


def test_right_answer_passes(capsys):
    checks.check_tempered_jacobian(jacobian_right)
    assert "✓ check_tempered_jacobian: passed on 3 cases" in capsys.readouterr().out


def test_autograd_on_the_weights_alone_is_not_the_answer():
    # The Jacobian of softmax(log p / τ) at p would be a different function: the check is driven by the scores.
    fails_with(
        checks.check_tempered_jacobian,
        lambda p, t: torch.func.vmap(torch.func.jacrev(lambda x: torch.softmax(x / t, -1)))(
            p.reshape(-1, p.shape[-1])
        ).reshape(*p.shape, p.shape[-1]),
        "wrong values",
    )


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda p, t: jacobian_right(p, 1.0), "without the temperature"),
        (lambda p, t: jacobian_right(p, 1.0) * t, "multiplied by the temperature"),
        (lambda p, t: torch.diag_embed(p) / t, "only the diagonal"),
        (lambda p, t: -jacobian_right(p, t), "sign is flipped"),
        (lambda p, t: (torch.diag(p.flatten()[:3]) - torch.outer(p.flatten()[:3], p.flatten()[:3])) / t, "shape"),
        (lambda p, t: (torch.diag(p) - torch.outer(p, p)) / t, "torch.diag"),
    ],
)
def test_mistakes_are_named(fn, fragment):
    fails_with(checks.check_tempered_jacobian, fn, fragment)


def test_check_is_exported():
    from mha_tutorial.checks import nb01a

    assert nb01a.__all__ == ["check_tempered_jacobian", "check_jacobian_norm"]
    assert checks.check_tempered_jacobian is nb01a.check_tempered_jacobian
    assert checks.check_jacobian_norm is nb01a.check_jacobian_norm


def norm_right(p):
    squares = (p**2).sum(dim=-1)  # (...)
    return (squares - 2 * (p**3).sum(dim=-1) + squares**2).sqrt()


def test_jacobian_norm_right_answer_passes(capsys):
    checks.check_jacobian_norm(norm_right)
    assert "✓ check_jacobian_norm: passed on 3 cases" in capsys.readouterr().out


def _near_saturation(p):
    top = p.max(dim=-1).values
    return ((1 - top) ** 2 + 3 * ((p**2).sum(dim=-1) - top**2)).sqrt()


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda p: norm_right(p) ** 2, "square root"),
        (lambda p: ((p**2).sum(-1) + (p**2).sum(-1) ** 2).sqrt(), "cross term is missing"),
        (lambda p: ((p**2).sum(-1) - (p**3).sum(-1) + (p**2).sum(-1) ** 2).sqrt(), "cross term counts twice"),
        (lambda p: ((p**2).sum(-1) - 2 * (p**3).sum(-1)).clamp_min(0).sqrt(), "last term is missing"),
        (_near_saturation, "near-saturation approximation"),
        (lambda p: 1 - p.max(dim=-1).values, "leftover weight"),
        (lambda p: (torch.diag_embed(p) - p[..., :, None] * p[..., None, :]).flatten(-2).norm(dim=-1), "diag_embed"),
        (lambda p: torch.func.vmap(torch.func.jacrev(lambda x: x))(p.reshape(-1, p.shape[-1])).sum(), "jacrev"),
        (lambda p: norm_right(p)[..., None], "wrong shape"),
    ],
)
def test_jacobian_norm_mistakes_are_named(fn, fragment):
    fails_with(checks.check_jacobian_norm, fn, fragment)
