"""Mask helpers (masks.py) and their agreement with PyTorch's two mask conventions."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from mha_tutorial import (
    additive_to_bool,
    bool_to_additive,
    causal_mask,
    drop_to_keep,
    keep_to_drop,
    masked_softmax,
    padding_mask,
)
from mha_tutorial.core.masks import as_valid_lens, check_mask, check_valid_lens

from testkit import TOL32, loop_keep_from_valid_lens

# --------------------------------------------------------------------------- causal_mask


def test_causal_mask_square_is_lower_triangle():
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(4), expected)
    assert causal_mask(4).dtype == torch.bool


@pytest.mark.parametrize("num_queries, num_keys", [(1, 1), (3, 3), (2, 5), (1, 4), (5, 2), (0, 3), (3, 0)])
def test_causal_mask_matches_loop_with_offset(num_queries, num_keys):
    # Queries are the last Q of K positions: query i sits at position i + (K - Q).
    mask = causal_mask(num_queries, num_keys)
    assert mask.shape == (num_queries, num_keys)
    for i in range(num_queries):
        for j in range(num_keys):
            assert bool(mask[i, j]) == (j <= i + num_keys - num_queries), (i, j)


def test_causal_mask_with_more_keys_is_pytorchs_lower_right_causal_bias():
    from torch.nn.attention.bias import causal_lower_right

    for q, k in [(3, 3), (2, 6), (1, 5)]:
        assert torch.equal(causal_mask(q, k), causal_lower_right(q, k)._materialize())


def test_causal_mask_square_is_sdpas_is_causal():
    q, k, v = (torch.randn(2, 6, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(6)),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )


def test_causal_mask_last_query_of_cached_prefix_sees_everything():
    assert causal_mask(1, 7).all()


def test_causal_mask_rejects_negative_sizes():
    with pytest.raises(ValueError, match=r"non-negative sizes, got Q=-1, K=-1"):
        causal_mask(-1)
    with pytest.raises(ValueError, match=r"Q=2, K=-3"):
        causal_mask(2, -3)


# --------------------------------------------------------------------------- padding_mask


def test_padding_mask_from_lengths_per_example():
    mask = padding_mask(torch.tensor([2, 0, 4]), 4)
    assert mask.shape == (3, 1, 4) and mask.dtype == torch.bool
    expected = torch.tensor([[[1, 1, 0, 0]], [[0, 0, 0, 0]], [[1, 1, 1, 1]]], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_padding_mask_from_lengths_per_query_matches_loop():
    valid_lens = torch.tensor([[1, 3], [0, 2]])
    mask = padding_mask(valid_lens, 3)
    assert mask.shape == (2, 2, 3)
    assert torch.equal(mask, loop_keep_from_valid_lens(valid_lens, 2, 2, 3))


def test_padding_mask_accepts_lists():
    assert torch.equal(padding_mask([1, 2], 3), padding_mask(torch.tensor([1, 2]), 3))


def test_padding_mask_rejects_float_lengths_and_bad_rank():
    with pytest.raises(TypeError, match="integer tensor.*float"):
        padding_mask(torch.tensor([1.5, 2.0]), 3)
    with pytest.raises(ValueError, match=r"\(B,\) or \(B, Q\), got \(1, 1, 2\)"):
        padding_mask(torch.ones(1, 1, 2, dtype=torch.long), 3)


def test_padding_mask_is_nn_multihead_key_padding_mask_inverted():
    # nn.MultiheadAttention's key_padding_mask is (B, K) with True = padding.
    valid_lens = torch.tensor([3, 1])
    key_padding_mask = torch.tensor([[False, False, False, True], [False, True, True, True]])
    assert torch.equal(keep_to_drop(padding_mask(valid_lens, 4)[:, 0]), key_padding_mask)


# --------------------------------------------------------------------------- conversions


def test_keep_and_drop_are_inverse_negations():
    keep = torch.rand(3, 4, 5) < 0.5
    drop = keep_to_drop(keep)
    assert drop.dtype == torch.bool and torch.equal(drop, ~keep)
    assert torch.equal(drop_to_keep(drop), keep)
    assert torch.equal(keep_to_drop(drop_to_keep(keep)), keep)


@pytest.mark.parametrize("fn", [keep_to_drop, drop_to_keep, bool_to_additive])
def test_bool_converters_reject_non_bool(fn):
    with pytest.raises(TypeError, match="mask must be a bool tensor.*float32"):
        fn(torch.zeros(2, 2))
    with pytest.raises(TypeError, match="mask must be a bool tensor.*int64"):
        fn(torch.zeros(2, 2, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_bool_to_additive_values(dtype):
    keep = torch.tensor([[True, False], [False, True]])
    additive = bool_to_additive(keep, dtype)
    assert additive.dtype == dtype
    assert torch.all(additive[keep] == 0)
    assert torch.all(additive[~keep] == float("-inf"))


def test_additive_round_trip_and_common_large_negatives():
    keep = torch.rand(4, 6) < 0.5
    assert torch.equal(additive_to_bool(bool_to_additive(keep)), keep)
    for big in (-1e4, -1e6, -1e9, float("-inf")):
        assert torch.equal(additive_to_bool(torch.tensor([0.0, big])), torch.tensor([True, False]))
    # Small (e.g. ALiBi-like) biases are not masks: they keep the key.
    assert additive_to_bool(torch.tensor([-3.0, -100.0])).all()


def test_additive_to_bool_rejects_bool_and_int():
    with pytest.raises(TypeError, match="floating tensor, got torch.bool"):
        additive_to_bool(torch.ones(2, dtype=torch.bool))
    with pytest.raises(TypeError, match="floating tensor, got torch.int64"):
        additive_to_bool(torch.ones(2, dtype=torch.long))


def test_additive_mask_gives_same_softmax_as_bool_mask():
    scores = torch.randn(2, 4, 5, dtype=torch.float64)
    keep = torch.rand(4, 5) < 0.5
    keep[:, 0] = True  # with -inf, a fully masked row would be NaN
    additive = bool_to_additive(keep, torch.float64)
    torch.testing.assert_close(torch.softmax(scores + additive, -1), masked_softmax(scores, mask=keep))


# --------------------------------------------------------------------------- the two PyTorch conventions


def test_keep_mask_is_sdpas_convention():
    # SDPA: bool attn_mask True = take part in attention; a float attn_mask is added.
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    keep = torch.rand(2, 4, 5) < 0.5
    keep[..., 2] = True
    from_bool = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    from_additive = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_to_additive(keep))
    torch.testing.assert_close(from_bool, from_additive, **TOL32)
    # The weights SDPA used are ours: recompute its output from masked_softmax.
    weights = masked_softmax(q @ k.transpose(1, 2) / 8**0.5, mask=keep)
    torch.testing.assert_close(from_bool, weights @ v, **TOL32)


def test_drop_mask_is_nn_multihead_attention_convention():
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    keep = causal_mask(5)
    _, w_drop = mha(x, x, x, attn_mask=keep_to_drop(keep), average_attn_weights=False)
    _, w_add = mha(x, x, x, attn_mask=bool_to_additive(keep), average_attn_weights=False)
    torch.testing.assert_close(w_drop, w_add, **TOL32)
    assert torch.all(w_drop[..., ~keep] == 0)  # True in the drop mask = ignored key
    assert torch.all(w_drop[..., keep] > 0)
    # Passing our keep-mask unconverted does the opposite (a classic bug): the
    # future is seen and the past hidden. Row 4 keeps every key, so it would drop all.
    _, w_wrong = mha(x[:, :4], x, x, attn_mask=keep[:4], average_attn_weights=False)
    assert torch.all(w_wrong[..., keep[:4]] == 0)


def test_key_padding_mask_from_valid_lens_matches_valid_lens():
    torch.manual_seed(4)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    valid_lens = torch.tensor([2, 4])
    _, weights = mha(x, x, x, key_padding_mask=keep_to_drop(padding_mask(valid_lens, 5)[:, 0]))  # (B, Q, K)
    assert torch.all(weights[~loop_keep_from_valid_lens(valid_lens, 2, 5, 5)] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))


# --------------------------------------------------------------------------- validators


def test_check_mask_accepts_broadcastable_and_rejects_the_rest():
    check_mask(torch.ones(3, 4, dtype=torch.bool), (2, 3, 4))
    check_mask(torch.ones(1, 4, dtype=torch.bool), (2, 3, 4))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5\) does not broadcast to the scores' shape \(2, 3, 4\)"):
        check_mask(torch.ones(3, 5, dtype=torch.bool), (2, 3, 4))
    with pytest.raises(ValueError, match=r"\(5, 3, 4\)"):
        check_mask(torch.ones(5, 3, 4, dtype=torch.bool), (1, 3, 4))  # broadcasting would grow the scores
    with pytest.raises(TypeError, match="True = may attend"):
        check_mask(torch.ones(3, 4, dtype=torch.uint8), (3, 4))


def test_check_valid_lens_messages():
    check_valid_lens(torch.tensor([0, 4]), 2, 3, 4)
    check_valid_lens(torch.tensor([[0, 1, 4], [4, 4, 4]]), 2, 3, 4)
    with pytest.raises(ValueError, match=r"valid_lens has shape \(2, 2\), expected \(2,\) or \(2, 3\)"):
        check_valid_lens(torch.ones(2, 2, dtype=torch.long), 2, 3, 4)
    with pytest.raises(ValueError, match=r"must lie in \[0, 4\].*got min -2 and max 1"):
        check_valid_lens(torch.tensor([-2, 1]), 2, 3, 4)
    with pytest.raises(ValueError, match=r"must lie in \[0, 4\].*got min 1 and max 5"):
        check_valid_lens(torch.tensor([1, 5]), 2, 3, 4)


def test_as_valid_lens():
    assert as_valid_lens([1, 2]).dtype == torch.int64
    with pytest.raises(TypeError, match="lengths are counts.*float64"):
        as_valid_lens(torch.tensor([1.0], dtype=torch.float64))


def test_combine_masks():
    from mha_tutorial.core.masks import combine_masks

    assert combine_masks(None, None, 4) is None
    mask = causal_mask(3, 4)
    assert combine_masks(None, mask, 4) is mask
    valid_lens = torch.tensor([[1, 2, 4], [0, 3, 3]])
    keep = combine_masks(valid_lens, mask, 4)
    assert keep.shape == (2, 1, 3, 4)  # broadcasts to (B, H, Q, K)
    assert torch.equal(keep[:, 0], loop_keep_from_valid_lens(valid_lens, 2, 3, 4) & mask)
    assert combine_masks(torch.tensor([2, 3]), None, 4).shape == (2, 1, 1, 4)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, "float32"])
def test_bool_to_additive_refuses_a_non_floating_dtype(dtype):
    with pytest.raises(TypeError, match="bool_to_additive needs a floating dtype"):
        bool_to_additive(torch.ones(2, 3, dtype=torch.bool), dtype=dtype)


def test_combine_masks_fits_scores_of_any_rank_and_as_4d_adds_leading_axes():
    from mha_tutorial.core.masks import as_4d, combine_masks

    valid_lens = torch.tensor([1, 3])
    assert combine_masks(valid_lens, None, 4, ndim=3).shape == (2, 1, 4)  # (B, Q, K) scores
    assert combine_masks(valid_lens, None, 4, ndim=5).shape == (2, 1, 1, 1, 4)  # (B, H, G, Q, K)
    keep = combine_masks(valid_lens, torch.tensor([True, False, True, True]), 4, ndim=3)
    assert keep.tolist() == [[[True, False, False, False]], [[True, False, True, False]]]
    assert as_4d(None) is None
    assert [as_4d(torch.ones(s, dtype=torch.bool)).shape for s in [(), (4,), (3, 4), (2, 3, 4)]] == [
        (1, 1, 1, 1),
        (1, 1, 1, 4),
        (1, 1, 3, 4),
        (1, 2, 3, 4),
    ]


@pytest.mark.parametrize("shape", [(5,), (3, 5), (1, 1, 3, 5), (2, 1, 3, 5), (1, 4, 3, 5), (4, 3, 5), (2, 4, 3, 5)])
def test_fold_heads_puts_head_h_of_example_b_in_row_b_times_H_plus_h(shape):
    from mha_tutorial.core.masks import fold_heads

    B, H = 2, 4
    mask = torch.rand(shape) < 0.5
    folded = fold_heads(mask, B, H).expand(B * H, 3, 5)  # (B*H, Q, K)
    full = mask.expand(B, H, 3, 5)  # (B, H, Q, K)
    for b in range(B):
        for h in range(H):
            assert torch.equal(folded[b * H + h], full[b, h])
    assert fold_heads(None, B, H) is None
