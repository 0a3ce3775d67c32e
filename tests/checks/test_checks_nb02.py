"""The exercise checks of notebook 02 pass right answers and name typical wrong ones."""

from __future__ import annotations

import pytest
import torch

import mha_tutorial
from mha_tutorial import checks

from testkit import fails_with

# --------------------------------------------------------------------------- notebook 02, exercise 1: causal mask


def causal_right(num_queries, num_keys=None):
    num_keys = num_queries if num_keys is None else num_keys
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(num_keys - num_queries)


def test_causal_right_answer_passes(capsys):
    checks.check_causal_mask(causal_right)
    assert "✓ check_causal_mask" in capsys.readouterr().out


def _k(q, k):
    return q if k is None else k


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda q, k=None: ~causal_right(q, k), "convention inverted"),
        (lambda q, k=None: torch.ones(q, _k(q, k), dtype=torch.bool).tril(_k(q, k) - q - 1), "own position"),
        (lambda q, k=None: torch.ones(q, _k(q, k), dtype=torch.bool).tril(_k(q, k) - q + 1), "into the future"),
        (lambda q, k=None: torch.ones(q, _k(q, k), dtype=torch.bool).triu(q - _k(q, k)), "upper triangle"),
        (lambda q, k=None: torch.ones(q, _k(q, k), dtype=torch.bool).tril(), "the queries are the *last* Q positions"),
        (lambda q, k=None: torch.ones(q, _k(q, k)).tril(_k(q, k) - q), "dtype"),
        (lambda q, k=None: torch.ones(q, q, dtype=torch.bool).tril(), "wrong shape"),
    ],
)
def test_causal_mistakes_are_named(fn, fragment):
    fails_with(checks.check_causal_mask, fn, fragment)


# --------------------------------------------------------------------------- notebook 02, exercise 2: padding mask


def padding_right(valid_lens, num_keys):
    lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens
    return torch.arange(num_keys) < lens[..., None]


def test_padding_right_answer_passes():
    checks.check_padding_mask(padding_right)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda v, k: ~padding_right(v, k), "convention inverted"),
        (lambda v, k: torch.arange(k) <= (v[:, None] if v.dim() == 1 else v)[..., None], "not <="),
        (lambda v, k: torch.arange(k) < (v[:, None] if v.dim() == 1 else v)[..., None] - 1, "valid_len - 1"),
        (lambda v, k: torch.arange(k) < v[:, None], "Add the axis"),
        (lambda v, k: torch.arange(k) < v.reshape(v.shape[0], -1)[:, :1, None], "2-D valid_lens"),
        (lambda v, k: padding_right(v, k).float(), "dtype"),
    ],
)
def test_padding_mistakes_are_named(fn, fragment):
    fails_with(checks.check_padding_mask, fn, fragment)


# --------------------------------------------------------------------------- notebook 02, exercise 3: masked softmax


def _keep(scores, valid_lens):
    lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens
    return torch.arange(scores.shape[-1]) < lens[..., None]


def masked_softmax_right(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    weights = torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=-1)
    return weights * keep.any(dim=-1, keepdim=True)


def test_masked_softmax_right_answer_passes(capsys):
    checks.check_masked_softmax(masked_softmax_right)
    assert "✓ check_masked_softmax" in capsys.readouterr().out


def neg_inf_fill(scores, valid_lens):
    return torch.softmax(scores.masked_fill(~_keep(scores, valid_lens), float("-inf")), dim=-1)


def big_negative_fill(scores, valid_lens):
    return torch.softmax(scores.masked_fill(~_keep(scores, valid_lens), torch.finfo(scores.dtype).min), dim=-1)


def minus_1e9_then_zero(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    return torch.softmax(scores.masked_fill(~keep, -1e9), dim=-1) * keep.any(-1, keepdim=True)


def _zeroed_softmax(scores, keep):
    weights = torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=-1)
    return weights * keep.any(dim=-1, keepdim=True)


def inverted(scores, valid_lens):
    return _zeroed_softmax(scores, ~_keep(scores, valid_lens))


def off_by_one(scores, valid_lens):
    lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens
    return _zeroed_softmax(scores, torch.arange(scores.shape[-1]) <= lens[..., None])


def additive_inf_where(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    additive = torch.zeros(keep.shape, dtype=scores.dtype).masked_fill(~keep, float("-inf"))
    return torch.where(keep.any(-1, keepdim=True), torch.softmax(scores + additive, dim=-1), 0.0).to(scores.dtype)


def fill_inf_where(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return torch.where(keep.any(-1, keepdim=True), weights, 0.0).to(scores.dtype)


def test_fill_inf_then_where_passes_with_a_finite_gradient(capsys):
    # masked_fill's backward gives the filled entries gradient 0, so the NaN of the empty row's softmax
    # backward never reaches the scores (notebook 02, section 7); only an *added* -inf mask leaks it
    checks.check_masked_softmax(fill_inf_where)
    assert "✓ check_masked_softmax" in capsys.readouterr().out


def small_negative_fill(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    return torch.softmax(scores.masked_fill(~keep, -5.0), dim=-1) * keep.any(-1, keepdim=True)


def upcasts(scores, valid_lens):
    return masked_softmax_right(scores.float(), valid_lens)


def two_none_axes_always(scores, valid_lens):
    # valid_lens[:, None, None] is right for 1-D lengths but gives 2-D lengths one axis too many
    return _zeroed_softmax(scores, torch.arange(scores.shape[-1]) < valid_lens[:, None, None])


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (neg_inf_fill, "NaN on a fully-masked row"),
        (big_negative_fill, "uniform instead of zero rows"),
        (minus_1e9_then_zero, "float16"),
        (inverted, "convention inverted"),
        (off_by_one, "off-by-one"),
        (additive_inf_where, "*added* to the scores"),
        (small_negative_fill, "non-zero weight"),
        (upcasts, "keep the dtype"),
        (two_none_axes_always, "valid_lens[..., None]"),
    ],
)
def test_masked_softmax_mistakes_are_named(fn, fragment):
    fails_with(checks.check_masked_softmax, fn, fragment)


def test_checks_are_exported():
    from mha_tutorial.checks import nb02

    assert set(nb02.__all__) == {"check_causal_mask", "check_padding_mask", "check_masked_softmax"}
    for name in nb02.__all__:
        assert callable(getattr(checks, name))


@pytest.mark.parametrize(
    "check, fn, fragment",
    [
        (checks.check_causal_mask, mha_tutorial.causal_mask, "mha_tutorial.causal_mask"),
        (
            checks.check_causal_mask,
            lambda q, k=None: mha_tutorial.causal_mask(q, k).clone(),
            "mha_tutorial.causal_mask",
        ),
        (checks.check_padding_mask, mha_tutorial.padding_mask, "mha_tutorial.padding_mask"),
        (checks.check_masked_softmax, mha_tutorial.masked_softmax, "mha_tutorial.masked_softmax"),
        (
            checks.check_masked_softmax,
            lambda s, lens: mha_tutorial.masked_softmax(s, valid_lens=lens) + 0,
            "mha_tutorial.masked_softmax",
        ),
    ],
)
def test_the_package_functions_are_refused(check, fn, fragment):
    fails_with(check, fn, fragment, "write that step yourself")


def test_causal_message_does_not_give_the_answer():
    message = fails_with(
        checks.check_causal_mask, lambda q, k=None: torch.ones(q, _k(q, k), dtype=torch.bool).tril(), "last* Q"
    )
    assert "tril(" not in message
