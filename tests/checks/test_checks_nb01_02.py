"""The exercise checks of notebooks 01 and 02 pass right answers and name typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial import checks
from mha_tutorial.checks import CheckFailed


def fails_with(check, fn, *fragments):
    with pytest.raises(CheckFailed) as info:
        check(fn)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


# --------------------------------------------------------------------------- notebook 01, exercise 1: softmax


def softmax_right(scores):
    shifted = scores - scores.max(dim=-1, keepdim=True).values
    e = shifted.exp()
    return e / e.sum(dim=-1, keepdim=True)


def test_softmax_right_answers_pass(capsys):
    checks.check_softmax(softmax_right)
    checks.check_softmax(lambda s: torch.softmax(s, dim=-1))
    assert "✓ check_softmax" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda s: torch.softmax(s, dim=-2), "wrong axis"),
        (lambda s: torch.softmax(s, dim=1), "wrong axis"),
        (lambda s: torch.softmax(s, dim=2), "wrong axis"),  # right for 3-D, wrong once a head axis appears
        (lambda s: s.exp() / s.exp().sum(dim=-1, keepdim=True), "subtract each row's maximum"),
        (lambda s: (s - s.max(-1, keepdim=True).values).exp(), None),
        (lambda s: s.exp() / s.exp().sum(), None),
        (
            lambda s: (s - s.max(-1, keepdim=True).values).exp() / (s - s.max(-1, keepdim=True).values).exp().sum(-1),
            None,
        ),
    ],
)
def test_softmax_mistakes_fail(fn, fragment):
    fails_with(checks.check_softmax, fn, *([fragment] if fragment else []))


def test_softmax_wrong_axis_is_named():
    fails_with(checks.check_softmax, lambda s: torch.softmax(s, dim=-2), "over the queries (dim=-2)")


def test_softmax_inplace_is_named():
    def inplace(s):
        s -= s.max(-1, keepdim=True).values
        return s.softmax(-1)

    fails_with(checks.check_softmax, inplace, "in place")


# --------------------------------------------------------------------------- notebook 01, exercise 2: attention


def attention_right(queries, keys, values, temperature=1.0):
    d = queries.shape[-1]
    scores = queries @ keys.transpose(-2, -1) / (math.sqrt(d) * temperature)
    weights = torch.softmax(scores, dim=-1)
    return weights @ values, weights


def make_attention(scale=None, dim=-1, temperature_mode="divide", transpose="last2", out="weights@values"):
    def fn(queries, keys, values, temperature=1.0):
        d = queries.shape[-1]
        s = 1 / math.sqrt(d) if scale is None else scale(d)
        kt = keys.transpose(-2, -1) if transpose == "last2" else keys.transpose(1, 2)
        scores = queries @ kt * s
        if transpose == "KQ":
            scores = keys @ queries.transpose(-2, -1) * s
        scores = {"divide": scores / temperature, "multiply": scores * temperature, "ignore": scores}[temperature_mode]
        weights = torch.softmax(scores, dim=dim)
        output = weights @ values if out == "weights@values" else weights.transpose(-2, -1) @ values
        return output, weights

    return fn


def test_attention_right_answer_passes(capsys):
    checks.check_temperature_attention(attention_right)
    assert "✓ check_temperature_attention" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (make_attention(scale=lambda d: 1.0), "forgot the 1/sqrt(d) scale"),
        (make_attention(scale=lambda d: 1.0 / d), "divided by d instead of sqrt(d)"),
        (make_attention(scale=lambda d: math.sqrt(d)), "multiplied by sqrt(d)"),
        (make_attention(dim=-2), "softmax over the wrong axis"),
        (make_attention(temperature_mode="multiply"), "multiplied by the temperature"),
        (make_attention(temperature_mode="ignore"), "temperature is ignored"),
        (make_attention(transpose="KQ"), "K Q^T"),
        (make_attention(transpose="1,2"), "transpose(1, 2)"),
        (make_attention(out="weights^T@values"), "transposed weights"),
        (lambda q, k, v, t=1.0: attention_right(q, k, v, t)[0], "return a pair"),
    ],
)
def test_attention_mistakes_are_named(fn, fragment):
    fails_with(checks.check_temperature_attention, fn, fragment)


def test_attention_keys_dot_T_is_reported():
    def with_T(queries, keys, values, temperature=1.0):
        weights = torch.softmax(queries @ keys.T / (math.sqrt(queries.shape[-1]) * temperature), dim=-1)
        return weights @ values, weights

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fails_with(checks.check_temperature_attention, with_T, "keys.T")


# --------------------------------------------------------------------------- notebook 01, exercise 3: entropy


def test_entropy_right_answers_pass():
    checks.check_attention_entropy(lambda w: -torch.xlogy(w, w).sum(dim=-1))
    checks.check_attention_entropy(lambda w: -(w * torch.log(w.clamp_min(1e-30))).sum(dim=-1))


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda w: -(w * torch.log(w)).sum(dim=-1), "0 * log 0"),
        (lambda w: (w * torch.log(w.clamp_min(1e-30))).sum(dim=-1), "minus sign"),
        (lambda w: -torch.xlogy(w, w).sum(dim=-1) / math.log(2), "log base 2"),
        (lambda w: -torch.xlogy(w, w).mean(dim=-1), "mean instead of sum"),
        (lambda w: -torch.xlogy(w, w).sum(dim=-1, keepdim=True), "keepdim=False"),
        (lambda w: -torch.xlogy(w, w).sum(dim=-2), "sum over the keys"),
    ],
)
def test_entropy_mistakes_are_named(fn, fragment):
    fails_with(checks.check_attention_entropy, fn, fragment)


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


def small_negative_fill(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    return torch.softmax(scores.masked_fill(~keep, -5.0), dim=-1) * keep.any(-1, keepdim=True)


def upcasts(scores, valid_lens):
    return masked_softmax_right(scores.float(), valid_lens)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (neg_inf_fill, "NaN on a fully-masked row"),
        (big_negative_fill, "uniform instead of zero rows"),
        (minus_1e9_then_zero, "float16"),
        (inverted, "convention inverted"),
        (off_by_one, "off-by-one"),
        (additive_inf_where, "gradient contains NaN"),
        (small_negative_fill, "non-zero weight"),
        (upcasts, "keep the dtype"),
    ],
)
def test_masked_softmax_mistakes_are_named(fn, fragment):
    fails_with(checks.check_masked_softmax, fn, fragment)


def test_checks_are_exported():
    from mha_tutorial.checks import nb01, nb02

    assert set(nb01.__all__) == {"check_softmax", "check_temperature_attention", "check_attention_entropy"}
    assert set(nb02.__all__) == {"check_causal_mask", "check_padding_mask", "check_masked_softmax"}
    for name in nb01.__all__ + nb02.__all__:
        assert callable(getattr(checks, name))


def test_every_check_is_one_function_under_both_names():
    # checks.check_x and checks.nbNN.check_x used to differ (only the first reported a stub as not attempted).
    from mha_tutorial.checks import nb01, nb02, nb03, nb04, nb05, nb06, nb07, nb08

    modules = (nb01, nb02, nb03, nb04, nb05, nb06, nb07, nb08)
    names = [name for module in modules for name in module.__all__]
    assert sorted(names) == sorted(n for n in checks.__all__ if n.startswith("check_"))
    for module in modules:
        for name in module.__all__:
            assert getattr(checks, name) is getattr(module, name), name


def test_reference_softmax_is_F_softmax():
    # sanity for the test helpers themselves
    s = torch.randn(2, 3, 4)
    assert torch.allclose(softmax_right(s), F.softmax(s, dim=-1))
