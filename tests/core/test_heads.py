"""transpose_qkv / transpose_output (heads.py): shapes, batch-major order, round trips, errors."""

from __future__ import annotations

import pytest
import torch

from mha_tutorial import transpose_output, transpose_qkv


def test_d2l_shapes():
    X = torch.randn(2, 4, 100)
    folded = transpose_qkv(X, 5)
    assert folded.shape == (10, 4, 20)
    assert transpose_output(folded, 5).shape == (2, 4, 100)


@pytest.mark.parametrize("batch, steps, heads, head_size", [(2, 3, 4, 5), (3, 1, 1, 2), (1, 4, 3, 1)])
def test_transpose_qkv_is_batch_major_elementwise(batch, steps, heads, head_size):
    X = torch.randn(batch, steps, heads * head_size)
    folded = transpose_qkv(X, heads)
    assert folded.shape == (batch * heads, steps, head_size)
    for b in range(batch):
        for h in range(heads):
            for t in range(steps):
                for j in range(head_size):
                    # Row b*H + h is head h of example b; head h owns columns h*d .. (h+1)*d.
                    assert folded[b * heads + h, t, j] == X[b, t, h * head_size + j]


def test_transpose_output_elementwise():
    batch, steps, heads, head_size = 2, 3, 3, 2
    folded = torch.randn(batch * heads, steps, head_size)
    X = transpose_output(folded, heads)
    assert X.shape == (batch, steps, heads * head_size)
    for b in range(batch):
        for h in range(heads):
            assert torch.equal(X[b, :, h * head_size : (h + 1) * head_size], folded[b * heads + h])


def test_round_trips():
    X = torch.randn(3, 5, 12)
    for heads in (1, 2, 3, 4, 6, 12):
        assert torch.equal(transpose_output(transpose_qkv(X, heads), heads), X)
    folded = torch.randn(12, 5, 2)
    for heads in (1, 2, 3, 4, 6, 12):
        assert torch.equal(transpose_qkv(transpose_output(folded, heads), heads), folded)


def test_one_head_is_the_identity():
    X = torch.randn(2, 3, 4)
    assert torch.equal(transpose_qkv(X, 1), X)


def test_batch_major_order_is_why_valid_lens_use_repeat_interleave():
    batch, heads = 3, 2
    valid_lens = torch.tensor([1, 2, 3])
    X = torch.arange(batch, dtype=torch.float32)[:, None, None].expand(batch, 1, heads * 2)  # X[b] == b
    example_of_row = transpose_qkv(X, heads)[:, 0, 0].long()  # which example each folded row came from
    assert torch.equal(valid_lens[example_of_row], valid_lens.repeat_interleave(heads))
    assert not torch.equal(valid_lens[example_of_row], valid_lens.repeat(heads))


def test_gradients_flow_back_unchanged():
    X = torch.randn(2, 3, 6, requires_grad=True)
    upstream = torch.randn(4, 3, 3)
    transpose_qkv(X, 2).backward(upstream)
    assert torch.equal(X.grad, transpose_output(upstream, 2))


def test_transpose_qkv_rejects_indivisible_hidden_size():
    with pytest.raises(ValueError, match=r"shape \(2, 3, 10\)\) is 10, not divisible by num_heads=3"):
        transpose_qkv(torch.randn(2, 3, 10), 3)


def test_transpose_output_rejects_indivisible_first_size():
    with pytest.raises(ValueError, match=r"shape \(5, 3, 4\)\) is 5, not divisible by num_heads=2"):
        transpose_output(torch.randn(5, 3, 4), 2)


@pytest.mark.parametrize("fn", [transpose_qkv, transpose_output])
def test_reject_bad_rank_heads_and_type(fn):
    with pytest.raises(ValueError, match=r"expects a 3-D tensor, got shape \(2, 3, 4, 4\)"):
        fn(torch.randn(2, 3, 4, 4), 2)
    for bad in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match=rf"num_heads must be a positive int, got {bad!r}"):
            fn(torch.randn(2, 3, 4), bad)
    with pytest.raises(TypeError, match="expects a tensor, got list"):
        fn([[[1.0]]], 1)
