"""Bad input at the core entry points (masks, attention, multi-head attention, variants, heads): a clear ValueError or
TypeError naming the value, shape or type, raised before any arithmetic, or a correct finite result (empty axes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from mha_tutorial import (
    AddNorm,
    DotProductAttention,
    EinsumMultiHeadAttention,
    HeadLoopMultiHeadAttention,
    MultiHeadAttention,
    SeqFirstMultiHeadAttention,
    additive_to_bool,
    bool_to_additive,
    causal_mask,
    drop_to_keep,
    keep_to_drop,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
    transpose_qkv,
)

from testkit import TOL32, explode_projections, no_arithmetic

# --------------------------------------------------------------------------- empty axes: empty or zero results

EMPTY_KEY_MASKS = {
    "valid_lens": lambda B, Q: dict(valid_lens=torch.zeros(B, dtype=torch.long)),
    "valid_lens_per_query": lambda B, Q: dict(valid_lens=torch.zeros(B, Q, dtype=torch.long)),
    "mask": lambda B, Q: dict(mask=torch.ones(Q, 0, dtype=torch.bool)),
    "both": lambda B, Q: dict(valid_lens=torch.zeros(B, dtype=torch.long), mask=torch.ones(B, Q, 0, dtype=torch.bool)),
}


@pytest.mark.parametrize("masks", list(EMPTY_KEY_MASKS))
def test_masked_softmax_with_no_keys_gives_empty_weights(masks):
    weights = masked_softmax(torch.randn(2, 3, 0), **EMPTY_KEY_MASKS[masks](2, 3))  # was IndexError from amax
    assert weights.shape == (2, 3, 0)


@pytest.mark.parametrize(
    "shape, kwargs",
    [
        ((2, 0, 4), dict(valid_lens=torch.tensor([1, 4]))),
        ((2, 0, 4), dict(valid_lens=torch.zeros(2, 0, dtype=torch.long))),
        ((0, 3, 4), dict(valid_lens=torch.zeros(0, dtype=torch.long))),
        ((0, 3, 4), dict(mask=torch.ones(3, 4, dtype=torch.bool))),
    ],
)
def test_masked_softmax_with_no_queries_or_no_examples_gives_empty_weights(shape, kwargs):
    weights = masked_softmax(torch.randn(shape), **kwargs)
    assert weights.shape == shape


@pytest.mark.parametrize("masks", list(EMPTY_KEY_MASKS))
def test_attention_with_no_keys_is_a_fully_masked_row(masks):
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 5)
    output, weights = scaled_dot_product_attention(q, k, v, **EMPTY_KEY_MASKS[masks](2, 3))
    assert weights.shape == (2, 3, 0) and output.shape == (2, 3, 5)
    assert torch.isfinite(output).all()
    torch.testing.assert_close(output, F.scaled_dot_product_attention(q, k, v))  # PyTorch's answer: zeros
    # The same as one key that nobody may see: a fully masked row gives zeros.
    masked, _ = scaled_dot_product_attention(q, torch.randn(2, 1, 4), torch.randn(2, 1, 5), torch.tensor([0, 0]))
    torch.testing.assert_close(output, masked)
    module = DotProductAttention()
    torch.testing.assert_close(module(q, k, v, **EMPTY_KEY_MASKS[masks](2, 3)), output)
    assert module.attention_weights.shape == (2, 3, 0)


@pytest.mark.parametrize(
    "shapes, valid_lens",
    [(((2, 0, 4), (2, 3, 4), (2, 3, 5)), torch.tensor([1, 2])), (((0, 2, 4), (0, 3, 4), (0, 3, 5)), torch.zeros(0))],
)
def test_attention_with_no_queries_or_no_examples_is_empty(shapes, valid_lens):
    q, k, v = (torch.randn(s) for s in shapes)
    output, weights = scaled_dot_product_attention(q, k, v, valid_lens.long())
    assert output.shape == F.scaled_dot_product_attention(q, k, v).shape
    assert weights.shape == (*shapes[0][:2], shapes[1][1])


def _mha_no_keys_cases():
    return {
        "valid_lens": dict(valid_lens=torch.tensor([0, 0])),
        "mask": dict(mask=torch.ones(3, 0, dtype=torch.bool)),
        "is_causal": dict(is_causal=True),
        "none": {},
    }


@pytest.mark.parametrize("case", list(_mha_no_keys_cases()))
@pytest.mark.parametrize("cls", [MultiHeadAttention, HeadLoopMultiHeadAttention, EinsumMultiHeadAttention])
def test_multi_head_attention_with_no_keys_returns_the_output_bias(cls, case):
    mha = cls(8, 2, bias=True).eval()
    x, empty = torch.randn(2, 3, 8), torch.randn(2, 0, 8)
    kwargs = _mha_no_keys_cases()[case]
    out = mha(x, empty, empty, **kwargs)  # need_weights=True: was IndexError from amax
    assert out.shape == (2, 3, 8) and torch.isfinite(out).all()
    assert mha.attention_weights.shape == (2, 2, 3, 0)
    torch.testing.assert_close(out, mha.W_o.bias.expand(2, 3, 8))  # every query fully masked: zeros before W_o
    torch.testing.assert_close(mha(x, empty, empty, **kwargs, need_weights=False), out, **TOL32)


@pytest.mark.parametrize("cls", [MultiHeadAttention, HeadLoopMultiHeadAttention, EinsumMultiHeadAttention])
@pytest.mark.parametrize("shape", [(2, 0), (0, 3)], ids=["no_queries", "no_examples"])
def test_multi_head_attention_with_no_queries_or_examples_is_empty(cls, shape):
    mha = cls(8, 2).eval()
    B, Q = shape
    x, kv = torch.randn(B, Q, 8), torch.randn(B, 4, 8)
    out = mha(x, kv, kv, torch.full((B,), 2), is_causal=True)
    assert out.shape == (B, Q, 8) and mha.attention_weights.shape == (B, 2, Q, 4)
    torch.testing.assert_close(mha(x, kv, kv, torch.full((B,), 2), need_weights=False, is_causal=True), out)


def test_seq_first_with_no_keys_matches_the_batch_first_module():
    base = MultiHeadAttention(8, 2, bias=True).eval()
    seq_first = SeqFirstMultiHeadAttention(8, 2, bias=True).eval()
    seq_first.load_state_dict(base.state_dict())
    x, empty = torch.randn(3, 2, 8), torch.randn(0, 2, 8)  # [seq, batch, features]
    out = seq_first(x, empty, empty, torch.ones(3, 0, 2, dtype=torch.bool))
    assert seq_first.attention_weights.shape == (2, 2, 3, 0)
    expected = base(
        x.transpose(0, 1), empty.transpose(0, 1), empty.transpose(0, 1), mask=torch.ones(3, 0, dtype=torch.bool)
    )
    torch.testing.assert_close(out.transpose(0, 1), expected)


# --------------------------------------------------------------------------- a feature size of 0


@pytest.mark.parametrize("call", ["function", "module"])
def test_attention_refuses_a_feature_size_of_zero(call):
    q, k, v = torch.randn(2, 3, 0), torch.randn(2, 4, 0), torch.randn(2, 4, 5)  # was ZeroDivisionError
    fn = scaled_dot_product_attention if call == "function" else DotProductAttention()
    with no_arithmetic(), pytest.raises(ValueError, match=r"feature size d = 0 \(shapes \(2, 3, 0\) and \(2, 4, 0\)\)"):
        fn(q, k, v)


# --------------------------------------------------------------------------- NumPy arrays and lists for tensors

NOT_TENSORS = {"ndarray": lambda x: x.numpy(), "list": lambda x: x.tolist()}


@pytest.mark.parametrize("kind", list(NOT_TENSORS))
def test_masked_softmax_names_scores_that_are_not_a_tensor(kind):
    scores = NOT_TENSORS[kind](torch.randn(2, 3, 4))
    with no_arithmetic(), pytest.raises(TypeError, match=rf"scores must be a floating tensor .*got (numpy\.)?{kind}"):
        masked_softmax(scores)


@pytest.mark.parametrize("kind", list(NOT_TENSORS))
@pytest.mark.parametrize("convert", [keep_to_drop, drop_to_keep, bool_to_additive], ids=lambda f: f.__name__)
def test_bool_mask_converters_name_what_is_not_a_tensor(convert, kind):
    mask = NOT_TENSORS[kind](torch.ones(2, 3, dtype=torch.bool))  # a list was AttributeError: no .shape
    with pytest.raises(TypeError, match=f"mask must be a bool tensor .*got {kind}"):
        convert(mask)
    with pytest.raises(TypeError, match="got NoneType"):
        convert(None)


@pytest.mark.parametrize("kind", list(NOT_TENSORS))
def test_additive_to_bool_names_what_is_not_a_tensor(kind):
    mask = NOT_TENSORS[kind](torch.zeros(2, 3))  # an array was reported as "got float64"
    with pytest.raises(TypeError, match=rf"additive_to_bool expects a floating tensor, got (numpy\.)?{kind}"):
        additive_to_bool(mask)


@pytest.mark.parametrize(
    "valid_lens, pattern",
    [(None, "got NoneType"), ([[1], [1, 2]], r"got list \[\[1\], \[1, 2\]\]"), ("12", "got str '12'")],
)
def test_lengths_that_are_no_tensor_of_counts_are_named(valid_lens, pattern):
    with pytest.raises(TypeError, match=f"valid_lens must be an integer tensor or a list of lengths, {pattern}"):
        padding_mask(valid_lens, 3)
    if valid_lens is not None:  # (None means "no lengths" to masked_softmax)
        with no_arithmetic(), pytest.raises(TypeError, match=pattern):
            masked_softmax(torch.randn(2, 3, 3), valid_lens)


def test_numpy_lengths_and_integer_sizes_still_work():
    torch.testing.assert_close(padding_mask(np.array([1, 2]), np.int64(3)), padding_mask(torch.tensor([1, 2]), 3))
    torch.testing.assert_close(causal_mask(np.int64(3), torch.tensor(4)), causal_mask(3, 4))


# --------------------------------------------------------------------------- sizes, rates and flags


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((2.5,), r"num_queries must be an int, got 2.5 \(float\)"),
        (("3",), r"num_queries must be an int, got '3' \(str\)"),
        ((True,), r"num_queries must be an int, got True \(bool\)"),
        ((3, 2.0), r"num_keys must be an int, got 2.0 \(float\)"),
        ((3, None, None), None),
    ],
)
def test_causal_mask_refuses_sizes_that_are_not_ints(args, pattern):
    if pattern is None:  # num_keys=None means K = Q
        assert causal_mask(*args).shape == (3, 3)
        return
    with pytest.raises(TypeError, match=f"causal_mask: {pattern}"):
        causal_mask(*args)


@pytest.mark.parametrize(
    "num_keys, error, pattern",
    [
        (2.5, TypeError, r"num_keys must be an int, got 2.5 \(float\)"),
        ("3", TypeError, r"num_keys must be an int, got '3' \(str\)"),
        (True, TypeError, "got True"),
        (-1, ValueError, "num_keys >= 0, got -1"),
    ],
)
def test_padding_mask_refuses_a_number_of_keys_that_is_not_a_count(num_keys, error, pattern):
    with pytest.raises(error, match=pattern):
        padding_mask(torch.tensor([1, 2]), num_keys)


@pytest.mark.parametrize("p, pattern", [("0.1", r"got '0.1' \(str\)"), (None, r"got None \(NoneType\)")])
def test_dropout_rates_that_are_not_numbers_are_named(p, pattern):
    x = torch.randn(2, 3, 4)
    with no_arithmetic(), pytest.raises(TypeError, match=f"dropout_p must be a number in \\[0, 1\\), {pattern}"):
        scaled_dot_product_attention(x, x, x, dropout_p=p)
    with pytest.raises(TypeError, match=f"dropout must be a number in \\[0, 1\\), {pattern}"):
        MultiHeadAttention(8, 2, p)


def test_transpose_qkv_refuses_a_bool_number_of_heads():
    with no_arithmetic(), pytest.raises(ValueError, match="num_heads must be a positive int, got True"):
        transpose_qkv(torch.randn(2, 3, 4), True)


@pytest.mark.parametrize(
    "X, Y, error, pattern",
    [
        (np.zeros((2, 3, 8), np.float32), torch.zeros(2, 3, 8), TypeError, "got X as numpy.ndarray"),
        (torch.zeros(2, 3, 8), [0.0], TypeError, "got Y as list"),
        (torch.zeros(2, 3, 8, dtype=torch.long), torch.zeros(2, 3, 8), TypeError, "got X as dtype torch.int64"),
        (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), ValueError, r"last axes of shape \(8,\), got .* \(2, 3, 4\)"),
        (torch.zeros(2, 3, 8), torch.zeros(2, 1, 8), ValueError, "same shape"),
    ],
)
def test_add_norm_names_bad_inputs(X, Y, error, pattern):
    with pytest.raises(error, match=pattern):
        AddNorm(8)(X, Y)


def test_add_norm_refuses_bad_settings():
    with pytest.raises(TypeError, match=r"norm_shape must be .* got '8' \(str\)"):
        AddNorm("8")
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), got 2.0"):
        AddNorm(8, dropout=2.0)


# --------------------------------------------------------------------------- SeqFirstMultiHeadAttention


def _seq_first_pair(bias=True):
    base = MultiHeadAttention(12, 3, bias=bias).eval()
    seq_first = SeqFirstMultiHeadAttention(12, 3, bias=bias).eval()
    seq_first.load_state_dict(base.state_dict())
    return base, seq_first


@pytest.mark.parametrize("steps", [[[1]], [[2], [0]], [[0, 1, 2]]], ids=["one", "two_steps", "all"])
def test_seq_first_prune_heads_matches_the_batch_first_module(steps):
    base, seq_first = _seq_first_pair()
    for heads in steps:
        base.prune_heads(heads)
        seq_first.prune_heads(heads)
    assert (seq_first.head_ids, seq_first.pruned_heads, seq_first.num_heads) == (
        base.head_ids,
        base.pruned_heads,
        base.num_heads,
    )
    q, kv = torch.randn(2, 4, 12), torch.randn(2, 5, 12)
    mask = torch.rand(4, 5, 2) < 0.7  # [Q, K, B], True = may attend
    out = seq_first(q.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1), mask)
    expected = base(q, kv, kv, mask=mask.permute(2, 0, 1)[:, None])  # (B, 1, Q, K)
    torch.testing.assert_close(out.transpose(0, 1), expected, **TOL32)
    torch.testing.assert_close(seq_first.attention_weights, base.attention_weights, **TOL32)
    assert {k: v.shape for k, v in seq_first.state_dict().items()} == {k: v.shape for k, v in base.state_dict().items()}


def test_seq_first_prune_heads_refuses_bad_head_numbers():
    _, seq_first = _seq_first_pair()
    with pytest.raises(ValueError, match=r"head 3 is out of range: this layer was built with 3 heads"):
        seq_first.prune_heads([3])
    seq_first.prune_heads([1])
    with pytest.raises(ValueError, match=r"heads \[1\] are already pruned \(heads left: \[0, 2\]\)"):
        seq_first.prune_heads([1])
    with pytest.raises(TypeError, match="heads must be a list of head numbers, got str"):
        seq_first.prune_heads("1")


@pytest.mark.parametrize(
    "shapes, pattern",
    [
        (
            ((4, 2, 12), (5, 2, 12), (5, 2, 7)),
            r"values have 7 features \(shape \[seq, batch, features\] = \[5, 2, 7\]\) but the projection expects 12",
        ),
        (
            ((4, 2, 9), (5, 2, 12), (5, 2, 12)),
            r"queries have 9 features \(shape \[seq, batch, features\] = \[4, 2, 9\]\)",
        ),
        (
            ((4, 2, 12), (5, 3, 12), (5, 3, 12)),
            r"same batch size \(axis 1 of \[seq, batch, features\]\), got shapes \[4, 2, 12\], \[5, 3, 12\], \[5, 3, 12\]",
        ),
        (
            ((4, 2, 12), (5, 2, 12), (6, 2, 12)),
            r"keys and values must have the same length \(axis 0 .*\), got shapes \[5, 2, 12\] and \[6, 2, 12\]",
        ),
    ],
)
def test_seq_first_errors_name_the_shapes_the_caller_passed(shapes, pattern):
    q, k, v = (torch.randn(s) for s in shapes)
    with no_arithmetic(), pytest.raises(ValueError, match=pattern):
        explode_projections(SeqFirstMultiHeadAttention(12, 3))(q, k, v)
