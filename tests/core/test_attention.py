"""masked_softmax, scaled_dot_product_attention and DotProductAttention (attention.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial import DotProductAttention, causal_mask, masked_softmax, padding_mask, scaled_dot_product_attention

from testkit import TOL32, TOL64, loop_keep_from_valid_lens, loop_masked_softmax, no_arithmetic

# --------------------------------------------------------------------------- masked_softmax


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 3, 5), (1, 2, 3, 4, 6)])
def test_masked_softmax_without_mask_is_softmax_over_keys(shape):
    scores = torch.randn(shape, dtype=torch.float64)
    weights = masked_softmax(scores)
    torch.testing.assert_close(weights, loop_masked_softmax(scores), **TOL64)
    torch.testing.assert_close(weights.sum(-1), torch.ones(shape[:-1], dtype=torch.float64), **TOL64)


def test_masked_softmax_d2l_example():
    # d2l's demo: two examples with 2 and 3 valid keys out of 4.
    scores = torch.rand(2, 2, 4)
    weights = masked_softmax(scores, torch.tensor([2, 3]))
    assert weights.shape == (2, 2, 4)
    assert torch.all(weights[0, :, 2:] == 0) and torch.all(weights[1, :, 3:] == 0)
    assert torch.all(weights[0, :, :2] > 0) and torch.all(weights[1, :, :3] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2))


def test_masked_softmax_valid_lens_1d_matches_loop():
    scores = torch.randn(3, 4, 6, dtype=torch.float64)
    valid_lens = torch.tensor([2, 6, 1])
    expected = loop_masked_softmax(scores, loop_keep_from_valid_lens(valid_lens, 3, 4, 6))
    torch.testing.assert_close(masked_softmax(scores, valid_lens), expected, **TOL64)


def test_masked_softmax_valid_lens_2d_matches_loop():
    scores = torch.randn(2, 3, 5, dtype=torch.float64)
    valid_lens = torch.tensor([[1, 3, 5], [2, 0, 4]])  # one length per query
    expected = loop_masked_softmax(scores, loop_keep_from_valid_lens(valid_lens, 2, 3, 5))
    torch.testing.assert_close(masked_softmax(scores, valid_lens), expected, **TOL64)


def test_masked_softmax_valid_lens_as_list_and_any_int_dtype():
    scores = torch.randn(2, 3, 4)
    expected = masked_softmax(scores, torch.tensor([1, 3]))
    torch.testing.assert_close(masked_softmax(scores, [1, 3]), expected, rtol=0, atol=0)
    int32_lens = torch.tensor([1, 3], dtype=torch.int32)
    torch.testing.assert_close(masked_softmax(scores, int32_lens), expected, rtol=0, atol=0)


def test_masked_softmax_valid_lens_on_4d_scores_apply_to_every_head():
    scores = torch.randn(2, 3, 4, 5, dtype=torch.float64)  # (B, H, Q, K)
    valid_lens = torch.tensor([2, 4])
    keep = loop_keep_from_valid_lens(valid_lens, 2, 4, 5)[:, None]  # (B, 1, Q, K)
    torch.testing.assert_close(masked_softmax(scores, valid_lens), loop_masked_softmax(scores, keep), **TOL64)
    valid_lens_2d = torch.tensor([[1, 2, 3, 4], [5, 0, 5, 1]])
    keep = loop_keep_from_valid_lens(valid_lens_2d, 2, 4, 5)[:, None]
    torch.testing.assert_close(masked_softmax(scores, valid_lens_2d), loop_masked_softmax(scores, keep), **TOL64)


@pytest.mark.parametrize("mask_shape", [(4, 5), (5,), (2, 1, 5), (2, 4, 5), (1, 1, 5)])
def test_masked_softmax_bool_mask_broadcasts_and_matches_loop(mask_shape):
    scores = torch.randn(2, 4, 5, dtype=torch.float64)
    mask = torch.rand(mask_shape) < 0.6
    torch.testing.assert_close(masked_softmax(scores, mask=mask), loop_masked_softmax(scores, mask), **TOL64)


def test_masked_softmax_valid_lens_and_mask_are_combined():
    scores = torch.randn(2, 4, 4, dtype=torch.float64)
    valid_lens = torch.tensor([3, 2])
    mask = causal_mask(4)
    keep = loop_keep_from_valid_lens(valid_lens, 2, 4, 4) & mask
    weights = masked_softmax(scores, valid_lens, mask)
    torch.testing.assert_close(weights, loop_masked_softmax(scores, keep), **TOL64)
    # Neither alone gives that answer.
    assert not torch.allclose(weights, masked_softmax(scores, valid_lens))
    assert not torch.allclose(weights, masked_softmax(scores, mask=mask))


def test_masked_keys_get_exactly_zero_even_with_huge_scores():
    scores = torch.randn(2, 3, 5)
    scores[..., 3:] = 1e4  # the masked keys would dominate if they leaked in
    weights = masked_softmax(scores, torch.tensor([3, 3]))
    assert torch.all(weights[..., 3:] == 0)
    torch.testing.assert_close(weights[..., :3], torch.softmax(scores[..., :3], dim=-1))


def test_masked_softmax_full_length_equals_plain_softmax():
    scores = torch.randn(2, 3, 4)
    torch.testing.assert_close(masked_softmax(scores, torch.tensor([4, 4])), torch.softmax(scores, -1), rtol=0, atol=0)
    torch.testing.assert_close(
        masked_softmax(scores, mask=torch.ones(4, dtype=torch.bool)), torch.softmax(scores, -1), rtol=0, atol=0
    )


def test_masked_softmax_does_not_modify_its_input():
    scores = torch.randn(2, 3, 4)
    before = scores.clone()
    masked_softmax(scores, torch.tensor([1, 0]), mask=causal_mask(3, 4))
    assert torch.equal(scores, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_row_is_zero_not_nan_and_has_finite_gradient(dtype):
    scores = (torch.randn(2, 3, 4) * 3).to(dtype).requires_grad_()
    valid_lens = torch.tensor([0, 2])  # example 0 sees no key at all
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False  # and query 1 of every example sees none either
    weights = masked_softmax(scores, valid_lens, mask)
    assert weights.dtype == dtype
    assert torch.isfinite(weights).all()
    assert torch.all(weights[0] == 0) and torch.all(weights[1, 1] == 0)
    rows = weights.float().sum(-1)
    torch.testing.assert_close(rows[1, [0, 2]], torch.ones(2), rtol=0, atol=1e-2)
    (weights * torch.randn(weights.shape).to(dtype)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[0] == 0) and torch.all(scores.grad[1, 1] == 0)
    assert torch.all(scores.grad[1, :, 2:] == 0)  # masked keys get no gradient


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masked_softmax_low_precision_matches_float64_loop(dtype):
    scores = torch.randn(2, 3, 6)
    valid_lens = torch.tensor([4, 1])
    weights = masked_softmax(scores.to(dtype), valid_lens)
    keep = loop_keep_from_valid_lens(valid_lens, 2, 3, 6)
    expected = loop_masked_softmax(scores.to(dtype), keep)
    torch.testing.assert_close(weights.double(), expected, rtol=0, atol=1e-2)
    assert torch.all(weights[~keep] == 0)


def test_masked_softmax_gradcheck():
    scores = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    valid_lens = torch.tensor([[1, 4, 0], [2, 3, 4]])
    assert torch.autograd.gradcheck(lambda s: masked_softmax(s, valid_lens, causal_mask(3, 4)), (scores,))


# --------------------------------------------------------------------------- masked_softmax errors


def test_masked_softmax_rejects_integer_scores():
    with pytest.raises(TypeError, match="scores must be a floating tensor.*int64"):
        masked_softmax(torch.ones(2, 3, dtype=torch.long))


def test_masked_softmax_rejects_1d_scores():
    with pytest.raises(ValueError, match=r"\(\.\.\., Q, K\), got \(4,\)"):
        masked_softmax(torch.randn(4))


def test_masked_softmax_valid_lens_need_a_batch_axis():
    with pytest.raises(ValueError, match=r"valid_lens needs scores with a batch axis.*\(3, 4\)"):
        masked_softmax(torch.randn(3, 4), torch.tensor([1, 2, 3]))


def test_masked_softmax_rejects_float_valid_lens():
    with pytest.raises(TypeError, match="valid_lens must be an integer tensor.*float32"):
        masked_softmax(torch.randn(2, 3, 4), torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="valid_lens must be an integer tensor.*bool"):
        masked_softmax(torch.randn(2, 3, 4), torch.tensor([True, False]))


@pytest.mark.parametrize("valid_lens", [[1, 2, 3], [[1, 2], [3, 4]], [[[1]]]])
def test_masked_softmax_rejects_valid_lens_of_wrong_shape(valid_lens):
    with pytest.raises(ValueError, match=r"valid_lens has shape .* expected \(2,\) or \(2, 3\)"):
        masked_softmax(torch.randn(2, 3, 4), torch.tensor(valid_lens))


@pytest.mark.parametrize("valid_lens", [[-1, 2], [2, 5]])
def test_masked_softmax_rejects_valid_lens_out_of_range(valid_lens):
    with pytest.raises(ValueError, match=r"valid_lens values must lie in \[0, 4\].*got min -?\d+ and max \d+"):
        masked_softmax(torch.randn(2, 3, 4), torch.tensor(valid_lens))


def test_masked_softmax_rejects_non_bool_mask():
    with pytest.raises(TypeError, match="mask must be a bool tensor.*float32"):
        masked_softmax(torch.randn(2, 3, 4), mask=torch.zeros(3, 4))
    with pytest.raises(TypeError, match="mask must be a bool tensor.*list"):
        masked_softmax(torch.randn(2, 3, 4), mask=[[True] * 4] * 3)


def re_shape(shape) -> str:
    """A shape tuple as a regex matching how the error message prints it."""
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize("mask_shape", [(3, 5), (4, 3), (3, 2, 3, 4), (2, 2, 3, 4)])
def test_masked_softmax_rejects_mask_that_does_not_broadcast(mask_shape):
    # (2, 2, 3, 4) broadcasts *with* (2, 3, 4) but would enlarge it: also an error.
    shape_text = re_shape(mask_shape)
    pattern = rf"mask of shape {shape_text} does not broadcast to the scores' shape \(2, 3, 4\)"
    with pytest.raises(ValueError, match=pattern):
        masked_softmax(torch.randn(2, 3, 4), mask=torch.ones(mask_shape, dtype=torch.bool))


def test_masked_softmax_errors_come_before_the_softmax():
    scores = torch.randn(2, 3, 4)
    with no_arithmetic():
        with pytest.raises(ValueError):
            masked_softmax(scores, torch.tensor([1, 9]))
        with pytest.raises(ValueError):
            masked_softmax(scores, mask=torch.ones(5, dtype=torch.bool))


# --------------------------------------------------------------------------- scaled_dot_product_attention


def _random_keep(*shape) -> torch.Tensor:
    """A random bool mask where every query keeps at least one key."""
    keep = torch.rand(shape) < 0.5
    keep[..., torch.randint(shape[-1], ())] = True
    return keep


@pytest.mark.parametrize("lead", [(2,), (2, 3)], ids=["3d", "4d"])
def test_sdpa_matches_pytorch_without_mask(lead):
    q, k, v = torch.randn(*lead, 4, 8), torch.randn(*lead, 6, 8), torch.randn(*lead, 6, 5)
    out, weights = scaled_dot_product_attention(q, k, v)
    assert out.shape == (*lead, 4, 5) and weights.shape == (*lead, 4, 6)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL32)


@pytest.mark.parametrize("lead", [(2,), (2, 3)], ids=["3d", "4d"])
def test_sdpa_matches_pytorch_with_bool_mask(lead):
    q, k, v = torch.randn(*lead, 4, 8), torch.randn(*lead, 6, 8), torch.randn(*lead, 6, 8)
    mask = _random_keep(*lead, 4, 6)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL32)
    assert torch.all(weights[~mask] == 0)


@pytest.mark.parametrize("lead", [(2,), (2, 3)], ids=["3d", "4d"])
def test_sdpa_causal_mask_matches_is_causal(lead):
    q, k, v = (torch.randn(*lead, 5, 4, dtype=torch.float64) for _ in range(3))
    out, weights = scaled_dot_product_attention(q, k, v, mask=causal_mask(5))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL64)
    assert torch.all(weights.triu(1) == 0)


def test_sdpa_causal_mask_with_more_keys_matches_lower_right_bias():
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 7, 4), torch.randn(2, 7, 4)
    out, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(3, 7))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 7)._materialize())
    torch.testing.assert_close(out, expected, **TOL32)


@pytest.mark.parametrize("lead", [(2,), (2, 3)], ids=["3d", "4d"])
def test_sdpa_padding_matches_pytorch(lead):
    q, k, v = torch.randn(*lead, 4, 8), torch.randn(*lead, 6, 8), torch.randn(*lead, 6, 8)
    valid_lens = torch.tensor([2, 5])
    keep = padding_mask(valid_lens, 6)  # (B, 1, K)
    if len(lead) == 2:
        keep = keep[:, None]  # (B, 1, 1, K)
    out, _ = scaled_dot_product_attention(q, k, v, valid_lens)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep), **TOL32)


def test_sdpa_per_query_valid_lens_and_mask_match_pytorch():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(2, 4, 8)
    valid_lens = torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1]])
    keep = loop_keep_from_valid_lens(valid_lens, 2, 4, 4) & causal_mask(4)
    out, _ = scaled_dot_product_attention(q, k, v, valid_lens, causal_mask(4))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep), **TOL32)


def test_sdpa_weights_are_the_scaled_softmax_and_output_is_their_average():
    q, k, v = (
        torch.randn(2, 3, 4, dtype=torch.float64),
        torch.randn(2, 5, 4, dtype=torch.float64),
        torch.randn(2, 5, 7, dtype=torch.float64),
    )
    out, weights = scaled_dot_product_attention(q, k, v, torch.tensor([5, 2]))
    keep = loop_keep_from_valid_lens([5, 2], 2, 3, 5)
    expected = loop_masked_softmax(q @ k.transpose(1, 2) / math.sqrt(4), keep)
    torch.testing.assert_close(weights, expected, **TOL64)
    torch.testing.assert_close(out, weights @ v, **TOL64)


def test_sdpa_fully_masked_query_gives_zero_output():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    out, weights = scaled_dot_product_attention(q, k, v, torch.tensor([0, 3]))
    assert torch.isfinite(out).all()
    assert torch.all(out[0] == 0) and torch.all(weights[0] == 0)


def test_sdpa_gradcheck():
    q, k, v = (torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    valid_lens = torch.tensor([2, 0])
    assert torch.autograd.gradcheck(lambda *t: scaled_dot_product_attention(*t, valid_lens)[0], (q, k, v))


def test_sdpa_dropout_only_when_training():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    plain, plain_w = scaled_dot_product_attention(q, k, v)
    evaluated, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=False)
    torch.testing.assert_close(evaluated, plain, rtol=0, atol=0)
    torch.manual_seed(1)
    trained, trained_w = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=True)
    assert not torch.allclose(trained, plain)
    torch.testing.assert_close(trained_w, plain_w, rtol=0, atol=0)  # weights are returned before dropout
    torch.manual_seed(1)
    expected = F.dropout(plain_w, 0.5, training=True) @ v  # same RNG draw, so the same dropped entries
    torch.testing.assert_close(trained, expected, **TOL32)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_sdpa_rejects_bad_dropout(p):
    x = torch.randn(1, 2, 3)
    with pytest.raises(ValueError, match=rf"dropout_p must lie in \[0, 1\), got {p}"):
        scaled_dot_product_attention(x, x, x, dropout_p=p)


def test_sdpa_rejects_keys_and_values_of_different_length():
    pattern = r"keys and values must have the same length, got 5 keys .*\(2, 5, 4\).* 6 values"
    with pytest.raises(ValueError, match=pattern):
        scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 6, 4))


def test_sdpa_rejects_query_key_size_mismatch():
    with pytest.raises(ValueError, match=r"same feature size.*got 4 \(shape \(2, 3, 4\)\) and 5"):
        scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 6, 5), torch.randn(2, 6, 5))


def test_sdpa_rejects_mismatched_leading_sizes_and_ranks():
    with pytest.raises(ValueError, match=r"leading \(batch/head\) sizes.*\(2, 3, 4\), \(3, 6, 4\)"):
        scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(3, 6, 4), torch.randn(3, 6, 4))
    with pytest.raises(ValueError, match="same number of dimensions"):
        scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 1, 6, 4), torch.randn(2, 1, 6, 4))
    with pytest.raises(ValueError, match=r"queries must be 3-D .* or 4-D .*got shape \(3, 4\)"):
        scaled_dot_product_attention(torch.randn(3, 4), torch.randn(6, 4), torch.randn(6, 4))
    with pytest.raises(TypeError, match="keys must be a tensor, got list"):
        scaled_dot_product_attention(torch.randn(1, 1, 1), [[[1.0]]], torch.randn(1, 1, 1))


def test_sdpa_rejects_integer_bool_and_mixed_dtypes_before_any_arithmetic():
    f32 = torch.randn(2, 3, 4)
    with no_arithmetic(), pytest.raises(TypeError, match="queries must be a floating tensor.*got dtype torch.int64"):
        scaled_dot_product_attention(torch.ones(2, 3, 4, dtype=torch.long), f32, f32)
    with no_arithmetic(), pytest.raises(TypeError, match="values must be a floating tensor.*got dtype torch.bool"):
        scaled_dot_product_attention(f32, f32, torch.ones(2, 3, 4, dtype=torch.bool))
    with no_arithmetic(), pytest.raises(TypeError, match="one dtype, got torch.float32, torch.float64, torch.float32"):
        scaled_dot_product_attention(f32, f32.double(), f32)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(valid_lens=torch.tensor([1, 2, 3])), ValueError, r"valid_lens has shape \(3,\), expected \(2,\)"),
        (dict(valid_lens=torch.tensor([1, 7])), ValueError, r"\[0, 6\].*max 7"),
        (dict(valid_lens=torch.tensor([1.0, 2.0])), TypeError, "integer"),
        (dict(mask=torch.ones(4, 5, dtype=torch.bool)), ValueError, r"\(4, 5\) does not broadcast.*\(2, 4, 6\)"),
        (dict(mask=torch.ones(4, 6)), TypeError, "bool"),
    ],
)
def test_sdpa_rejects_bad_masks_before_any_arithmetic(kwargs, error, pattern):
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    with no_arithmetic(), pytest.raises(error, match=pattern):
        scaled_dot_product_attention(q, k, v, **kwargs)


def test_no_arithmetic_guard_does_fire():
    # Guards the guard: the check above would be vacuous if matmul slipped past it.
    q = torch.randn(1, 2, 3)
    with no_arithmetic(), pytest.raises(AssertionError, match="ran before"):
        scaled_dot_product_attention(q, q, q)


# --------------------------------------------------------------------------- DotProductAttention


def test_dot_product_attention_module_keeps_weights():
    attention = DotProductAttention(dropout=0.5).eval()
    q, k, v = torch.randn(2, 1, 2), torch.ones(2, 10, 2), torch.arange(40.0).reshape(1, 10, 4).repeat(2, 1, 1)
    valid_lens = torch.tensor([2, 6])
    out = attention(q, k, v, valid_lens)
    assert out.shape == (2, 1, 4)
    assert attention.attention_weights.shape == (2, 1, 10)
    # All keys are equal, so attention is uniform over the valid ones (d2l's demo).
    torch.testing.assert_close(attention.attention_weights[0, 0, :2], torch.full((2,), 0.5))
    torch.testing.assert_close(attention.attention_weights[1, 0, :6], torch.full((6,), 1 / 6))
    torch.testing.assert_close(out[1, 0], v[1, :6].mean(0))


def test_dot_product_attention_dropout_follows_train_and_eval():
    attention = DotProductAttention(dropout=0.5)
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    reference, _ = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(attention.eval()(q, k, v), reference, rtol=0, atol=0)
    assert not torch.allclose(attention.train()(q, k, v), reference)


@pytest.mark.parametrize("p", [-0.5, 1.0])
def test_dot_product_attention_rejects_bad_dropout(p):
    with pytest.raises(ValueError, match=rf"dropout must lie in \[0, 1\), got {p}"):
        DotProductAttention(p)


def test_hidden_keys_get_zero_even_when_the_visible_scores_are_minus_infinity():
    # An additive mask applied earlier leaves -inf on visible keys; valid_lens hides the others. Filling the
    # hidden ones with the smallest finite number used to hand them all the weight ([0, 0, 0.5, 0.5]).
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        scores = torch.tensor([[[-math.inf, -math.inf, 0.5, 0.7]]], dtype=dtype)
        weights = masked_softmax(scores, valid_lens=torch.tensor([2]))
        assert weights.tolist() == [[[0.0, 0.0, 0.0, 0.0]]], dtype
        partly = masked_softmax(torch.tensor([[[-math.inf, 0.3, 0.5, 0.7]]], dtype=dtype), valid_lens=torch.tensor([2]))
        assert partly.tolist() == [[[0.0, 1.0, 0.0, 0.0]]], dtype


def test_hidden_keys_get_zero_gradient_and_rows_stay_finite():
    scores = torch.tensor([[[-math.inf, -math.inf, 0.5, 0.7], [0.1, 0.2, 0.3, 0.4]]], requires_grad=True)
    weights = masked_softmax(scores, valid_lens=torch.tensor([2]))
    (weights * torch.arange(4.0)).sum().backward()
    assert torch.isfinite(scores.grad).all() and scores.grad[..., 2:].abs().sum() == 0
