"""MultiHeadAttention and AddNorm (mha.py), checked against nn.MultiheadAttention with copied weights."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial import AddNorm, MultiHeadAttention, causal_mask, keep_to_drop, padding_mask

from testkit import TOL32, TOL64, explode_projections, functional_mha, no_arithmetic, torch_mha_from


def make_mha(num_hiddens=12, num_heads=3, bias=False, dtype=torch.float64, **sizes) -> MultiHeadAttention:
    mha = MultiHeadAttention(num_hiddens, num_heads, bias=bias, **sizes).to(dtype).eval()
    if bias:  # nn.Linear's default biases are fine, but make sure none is accidentally zero
        with torch.no_grad():
            for layer in (mha.W_q, mha.W_k, mha.W_v, mha.W_o):
                layer.bias.uniform_(-0.5, 0.5)
    return mha


def randn(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


def reference(mha, q, k, v, **masks):
    """nn.MultiheadAttention's output and per-head weights (B, H, Q, K)."""
    ref = torch_mha_from(mha)
    return ref(q, k, v, need_weights=True, average_attn_weights=False, **masks)


# --------------------------------------------------------------------------- equivalence with nn.MultiheadAttention


@pytest.mark.parametrize("bias", [False, True])
def test_self_attention_matches_nn_multihead_attention(bias):
    mha = make_mha(bias=bias)
    x = randn(2, 5, 12)
    out = mha(x, x, x)
    ref_out, ref_w = reference(mha, x, x, x)
    assert out.shape == (2, 5, 12) and mha.attention_weights.shape == (2, 3, 5, 5)
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)
    # The default (averaged) weights of nn.MultiheadAttention are the mean over heads.
    _, avg = torch_mha_from(mha)(x, x, x)
    torch.testing.assert_close(mha.attention_weights.mean(1), avg, **TOL64)


@pytest.mark.parametrize("bias", [False, True])
def test_cross_attention_matches_nn_multihead_attention(bias):
    mha = make_mha(bias=bias)
    q, kv = randn(2, 4, 12), randn(2, 7, 12)
    values = randn(2, 7, 12)
    out = mha(q, kv, values)
    ref_out, ref_w = reference(mha, q, kv, values)
    assert out.shape == (2, 4, 12) and mha.attention_weights.shape == (2, 3, 4, 7)
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)


@pytest.mark.parametrize("bias", [False, True])
def test_valid_lens_match_key_padding_mask(bias):
    mha = make_mha(bias=bias)
    q, k, v = randn(3, 4, 12), randn(3, 6, 12), randn(3, 6, 12)
    valid_lens = torch.tensor([6, 2, 4])
    out = mha(q, k, v, valid_lens)
    key_padding_mask = keep_to_drop(padding_mask(valid_lens, 6)[:, 0])  # (B, K), True = ignore
    ref_out, ref_w = reference(mha, q, k, v, key_padding_mask=key_padding_mask)
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)
    assert torch.all(mha.attention_weights[1, ..., 2:] == 0)


@pytest.mark.parametrize("bias", [False, True])
def test_causal_mask_matches_attn_mask(bias):
    mha = make_mha(bias=bias)
    x = randn(2, 6, 12)
    out = mha(x, x, x, mask=causal_mask(6))
    ref_out, ref_w = reference(mha, x, x, x, attn_mask=keep_to_drop(causal_mask(6)))
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)


def test_causal_mask_and_valid_lens_together_match_nn_multihead_attention():
    mha = make_mha(bias=True)
    x = randn(2, 6, 12)
    valid_lens = torch.tensor([3, 6])
    out = mha(x, x, x, valid_lens, causal_mask(6))
    ref_out, ref_w = reference(
        mha,
        x,
        x,
        x,
        attn_mask=keep_to_drop(causal_mask(6)),
        key_padding_mask=keep_to_drop(padding_mask(valid_lens, 6)[:, 0]),
    )
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)


def test_per_query_valid_lens_match_3d_attn_mask():
    mha = make_mha(bias=True)
    q, k, v = randn(2, 3, 12), randn(2, 5, 12), randn(2, 5, 12)
    valid_lens = torch.tensor([[1, 3, 5], [5, 2, 1]])  # (B, Q)
    out = mha(q, k, v, valid_lens)
    keep = padding_mask(valid_lens, 5).repeat_interleave(mha.num_heads, dim=0)  # (B*H, Q, K), batch-major
    ref_out, ref_w = reference(mha, q, k, v, attn_mask=keep_to_drop(keep))
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)


def test_per_head_mask_matches_3d_attn_mask():
    mha = make_mha()
    x = randn(2, 5, 12)
    keep = torch.rand(2, 3, 5, 5) < 0.5  # (B, H, Q, K): every head of every example its own pattern
    keep[..., 0] = True
    out = mha(x, x, x, mask=keep)
    ref_out, ref_w = reference(mha, x, x, x, attn_mask=keep_to_drop(keep.reshape(6, 5, 5)))
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)


@pytest.mark.parametrize("mask_shape", [(5,), (4, 5), (1, 4, 5), (3, 4, 5), (2, 1, 4, 5), (2, 3, 4, 5), (1, 3, 1, 5)])
def test_masks_broadcast_like_b_h_q_k(mask_shape):
    # A 3-D mask lines up with (H, Q, K), as broadcasting against (B, H, Q, K) says.
    mha = make_mha(bias=True)
    q, k, v = randn(2, 4, 12), randn(2, 5, 12), randn(2, 5, 12)
    keep = torch.rand(mask_shape) < 0.5
    keep[..., 1] = True
    out = mha(q, k, v, mask=keep)
    torch.testing.assert_close(out, functional_mha(mha, q, k, v, keep), **TOL64)
    expected_w = torch.softmax(
        (mha.W_q(q).view(2, 4, 3, 4).transpose(1, 2) @ mha.W_k(k).view(2, 5, 3, 4).permute(0, 2, 3, 1)) / 2.0
        + torch.zeros(2, 3, 4, 5, dtype=torch.float64).masked_fill(~keep, float("-inf")),
        dim=-1,
    )
    torch.testing.assert_close(mha.attention_weights, expected_w, **TOL64)


def test_key_and_value_sizes_match_kdim_vdim():
    mha = make_mha(bias=True, key_size=6, value_size=10)
    q, k, v = randn(2, 4, 12), randn(2, 5, 6), randn(2, 5, 10)
    ref = torch_mha_from(mha)
    assert not ref._qkv_same_embed_dim  # uses q_proj_weight, k_proj_weight, v_proj_weight
    valid_lens = torch.tensor([5, 3])
    out = mha(q, k, v, valid_lens)
    ref_out, ref_w = ref(
        q, k, v, key_padding_mask=keep_to_drop(padding_mask(valid_lens, 5)[:, 0]), average_attn_weights=False
    )
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)


def test_query_size_differs_from_num_hiddens():
    # nn.MultiheadAttention cannot do this (queries must be embed_dim wide): compare with the functional reference.
    mha = make_mha(bias=True, query_size=7, key_size=5, value_size=9)
    q, k, v = randn(2, 3, 7), randn(2, 4, 5), randn(2, 4, 9)
    out = mha(q, k, v, mask=causal_mask(3, 4))
    assert out.shape == (2, 3, 12)
    torch.testing.assert_close(out, functional_mha(mha, q, k, v, causal_mask(3, 4)), **TOL64)


@pytest.mark.parametrize("bias", [False, True])
def test_float32_matches_nn_multihead_attention(bias):
    mha = make_mha(16, 4, bias=bias, dtype=torch.float32)
    q, k = torch.randn(3, 5, 16), torch.randn(3, 8, 16)
    valid_lens = torch.tensor([8, 1, 5])
    out = mha(q, k, k, valid_lens)
    ref_out, ref_w = reference(mha, q, k, k, key_padding_mask=keep_to_drop(padding_mask(valid_lens, 8)[:, 0]))
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL32)


# --------------------------------------------------------------------------- head_mask


def test_head_mask_zeroing_a_head_equals_zeroing_its_w_o_columns():
    mha = make_mha(bias=True)
    q, k = randn(2, 4, 12), randn(2, 6, 12)
    valid_lens = torch.tensor([6, 3])
    out = mha(q, k, k, valid_lens, head_mask=torch.tensor([1.0, 0.0, 1.0]))
    weights = mha.attention_weights
    pruned = make_mha(bias=True)
    pruned.load_state_dict(mha.state_dict())
    with torch.no_grad():
        pruned.W_o.weight[:, 4:8] = 0  # head 1 owns input columns 4..8 of W_o (d = 4)
    torch.testing.assert_close(out, pruned(q, k, k, valid_lens), **TOL64)
    torch.testing.assert_close(weights, pruned.attention_weights, **TOL64)  # gates act after the weights
    assert not torch.allclose(out, mha(q, k, k, valid_lens))


def test_head_mask_scales_each_head():
    mha = make_mha()
    x = randn(2, 5, 12)
    gates = torch.tensor([0.5, 2.0, -1.0], dtype=torch.float64)
    scaled = make_mha()
    scaled.load_state_dict(mha.state_dict())
    with torch.no_grad():
        scaled.W_o.weight.mul_(gates.repeat_interleave(4))  # column block h scaled by gates[h]
    torch.testing.assert_close(mha(x, x, x, head_mask=gates), scaled(x, x, x), **TOL64)
    torch.testing.assert_close(mha(x, x, x, head_mask=torch.ones(3)), mha(x, x, x), **TOL64)
    # A float32 gate on a float64 module is fine too.
    torch.testing.assert_close(mha(x, x, x, head_mask=gates.float()), scaled(x, x, x), **TOL64)


# --------------------------------------------------------------------------- d2l demos, shapes, corner cases


def test_d2l_cross_attention_demo():
    num_hiddens, num_heads = 100, 5
    attention = MultiHeadAttention(num_hiddens, num_heads, 0.5).eval()
    batch_size, num_queries, num_kvpairs = 2, 4, 6
    valid_lens = torch.tensor([3, 2])
    X = torch.ones((batch_size, num_queries, num_hiddens))
    Y = torch.ones((batch_size, num_kvpairs, num_hiddens))
    out = attention(X, Y, Y, valid_lens)
    assert out.shape == (batch_size, num_queries, num_hiddens)
    weights = attention.attention_weights
    assert weights.shape == (2, 5, 4, 6)
    assert torch.all(weights[0, ..., 3:] == 0) and torch.all(weights[1, ..., 2:] == 0)
    # All keys are equal, so each query spreads its attention evenly over the valid ones.
    torch.testing.assert_close(weights[0, ..., :3], torch.full((5, 4, 3), 1 / 3))
    torch.testing.assert_close(weights[1, ..., :2], torch.full((5, 4, 2), 1 / 2))


def test_d2l_self_attention_demo():
    attention = MultiHeadAttention(64, 8).eval()
    X = torch.randn(2, 10, 64)
    assert attention(X, X, X).shape == (2, 10, 64)
    assert attention.attention_weights.shape == (2, 8, 10, 10)


@pytest.mark.parametrize("bias", [False, True])
def test_fully_masked_rows_give_finite_output_and_gradient(bias):
    mha = make_mha(bias=bias)
    q = randn(2, 3, 12).requires_grad_()
    kv = randn(2, 4, 12)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2] = False  # query 2 sees nothing
    out = mha(q, kv, kv, torch.tensor([0, 4]), mask)  # example 0 sees nothing
    assert torch.isfinite(out).all()
    # No visible key: the heads give 0, so the output is W_o's bias (or 0).
    expected = mha.W_o.bias.expand(3, 12) if bias else torch.zeros(3, 12, dtype=torch.float64)
    torch.testing.assert_close(out[0], expected, rtol=0, atol=0)
    torch.testing.assert_close(out[1, 2], expected[0], rtol=0, atol=0)
    assert torch.all(mha.attention_weights[0] == 0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and all(torch.isfinite(p.grad).all() for p in mha.parameters())


@pytest.mark.parametrize(
    "bias, sizes, expected",
    [
        (False, {}, 4 * 16 * 16),
        (True, {}, 4 * 16 * 16 + 4 * 16),
        (False, dict(query_size=3, key_size=5, value_size=7), 16 * (3 + 5 + 7) + 16 * 16),
        (True, dict(key_size=5, value_size=7), 16 * (16 + 5 + 7) + 16 * 16 + 4 * 16),
    ],
)
def test_parameter_count(bias, sizes, expected):
    mha = MultiHeadAttention(16, 4, bias=bias, **sizes)
    assert sum(p.numel() for p in mha.parameters()) == expected
    assert [n for n, _ in mha.named_parameters()][:1] == ["W_q.weight"]
    if "query_size" not in sizes:
        ref = torch_mha_from(mha)
        assert sum(p.numel() for p in ref.parameters()) == expected


def test_gradients_reach_every_projection():
    mha = make_mha(bias=True).train()
    x = randn(2, 4, 12)
    mha(x, x, x, torch.tensor([2, 4])).pow(2).sum().backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_dropout_only_in_training():
    mha = MultiHeadAttention(12, 3, dropout=0.5).eval()
    plain = MultiHeadAttention(12, 3)
    plain.load_state_dict(mha.state_dict())
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(mha(x, x, x), plain(x, x, x), rtol=0, atol=0)
    mha.train()
    trained = mha(x, x, x)
    assert not torch.allclose(trained, plain(x, x, x))
    torch.testing.assert_close(mha.attention_weights.sum(-1), torch.ones(2, 3, 5))  # kept before dropout


# --------------------------------------------------------------------------- AddNorm


def test_addnorm_is_layernorm_of_the_sum():
    add_norm = AddNorm(8, 0.5).eval()
    X, Y = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    out = add_norm(X, Y)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out, F.layer_norm(X + Y, (8,)))
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 3), rtol=0, atol=1e-6)
    add_norm.train()
    assert not torch.allclose(add_norm(X, Y), out)  # dropout acts on Y in training
    assert torch.allclose(AddNorm(8, 0.0).train()(X, Y), out)


def test_addnorm_d2l_shape():
    add_norm = AddNorm([3, 4], 0.5).eval()
    assert add_norm(torch.ones((2, 3, 4)), torch.ones((2, 3, 4))).shape == (2, 3, 4)


def test_addnorm_rejects_shape_mismatch():
    with pytest.raises(ValueError, match=r"same shape, got \(2, 3, 8\) and \(2, 4, 8\)"):
        AddNorm(8)(torch.randn(2, 3, 8), torch.randn(2, 4, 8))


# --------------------------------------------------------------------------- bad input


def test_num_hiddens_must_divide_into_heads():
    with pytest.raises(ValueError, match="num_hiddens=10 is not divisible by num_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="must be positive, got 8 and 0"):
        MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), got 1.0"):
        MultiHeadAttention(8, 2, dropout=1.0)


B, Q, K, D, H = 2, 3, 4, 8, 2

BAD_INPUTS = [
    # (id, args, kwargs, error, pattern)
    (
        "kv-length",
        (randn(B, Q, D), randn(B, K, D), randn(B, K + 1, D)),
        {},
        ValueError,
        r"keys and values must have the same length, got shapes \(2, 4, 8\) and \(2, 5, 8\)",
    ),
    (
        "query-size",
        (randn(B, Q, D + 1), randn(B, K, D), randn(B, K, D)),
        {},
        ValueError,
        r"queries have 9 features \(shape \(2, 3, 9\)\) but the projection expects 8",
    ),
    (
        "key-size",
        (randn(B, Q, D), randn(B, K, 5), randn(B, K, D)),
        {},
        ValueError,
        r"keys have 5 features \(shape \(2, 4, 5\)\) but the projection expects 8",
    ),
    (
        "value-size",
        (randn(B, Q, D), randn(B, K, D), randn(B, K, 3)),
        {},
        ValueError,
        r"values have 3 features .* expects 8",
    ),
    (
        "batch",
        (randn(B, Q, D), randn(B + 1, K, D), randn(B + 1, K, D)),
        {},
        ValueError,
        r"same batch size, got shapes \(2, 3, 8\), \(3, 4, 8\), \(3, 4, 8\)",
    ),
    (
        "rank",
        (randn(Q, D), randn(B, K, D), randn(B, K, D)),
        {},
        ValueError,
        r"queries must have shape \(batch, steps, features\), got \(3, 8\)",
    ),
    (
        "not-tensor",
        ([[[0.0] * D]], randn(B, K, D), randn(B, K, D)),
        {},
        TypeError,
        "queries must be a tensor, got list",
    ),
    (
        "valid_lens-batch",
        (),
        dict(valid_lens=torch.tensor([1, 2, 3])),
        ValueError,
        r"valid_lens has shape \(3,\), expected \(2,\) or \(2, 3\)",
    ),
    (
        "valid_lens-negative",
        (),
        dict(valid_lens=torch.tensor([-1, 2])),
        ValueError,
        r"valid_lens values must lie in \[0, 4\].*got min -1",
    ),
    (
        "valid_lens-too-long",
        (),
        dict(valid_lens=torch.tensor([5, 2])),
        ValueError,
        r"valid_lens values must lie in \[0, 4\].*max 5",
    ),
    (
        "valid_lens-float",
        (),
        dict(valid_lens=torch.tensor([1.0, 2.0])),
        TypeError,
        "valid_lens must be an integer tensor.*float32",
    ),
    (
        "head_mask-length",
        (),
        dict(head_mask=torch.ones(3)),
        ValueError,
        r"head_mask must have shape \(2,\) \(one gate per head\), got \(3,\)",
    ),
    (
        "head_mask-list",
        (),
        dict(head_mask=[1.0, 1.0]),
        TypeError,
        r"head_mask must be a tensor of shape \(2,\), got list",
    ),
    (
        "mask-broadcast",
        (),
        dict(mask=torch.ones(3, 3, dtype=torch.bool)),
        ValueError,
        r"mask of shape \(3, 3\) does not broadcast to the scores' shape \(2, 2, 3, 4\)",
    ),
    (
        "mask-too-many-heads",
        (),
        dict(mask=torch.ones(4, Q, K, dtype=torch.bool)),
        ValueError,
        r"mask of shape \(4, 3, 4\) does not broadcast",
    ),
    (
        "queries-float32-into-float64-module",
        (randn(B, Q, D).float(), randn(B, K, D), randn(B, K, D)),
        dict(),
        TypeError,
        r"queries have dtype torch.float32 but the module's weights are torch.float64",
    ),
    (
        "keys-int",
        (randn(B, Q, D), torch.ones(B, K, D, dtype=torch.long), randn(B, K, D)),
        dict(),
        TypeError,
        r"keys have dtype torch.int64 but the module's weights are torch.float64",
    ),
    (
        "values-bool",
        (randn(B, Q, D), randn(B, K, D), torch.ones(B, K, D, dtype=torch.bool)),
        dict(),
        TypeError,
        r"values have dtype torch.bool",
    ),
    (
        "mask-float",
        (),
        dict(mask=torch.ones(Q, K)),
        TypeError,
        "mask must be a bool tensor with True = may attend, got torch.float32",
    ),
]


@pytest.mark.parametrize("args, kwargs, error, pattern", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_clear_error_before_any_arithmetic(args, kwargs, error, pattern):
    if not args:
        args = (randn(B, Q, D), randn(B, K, D), randn(B, K, D))
    mha = MultiHeadAttention(D, H).double()
    with pytest.raises(error, match=pattern):
        mha(*args, **kwargs)
    # The same call on a module whose projections blow up, under a guard against matmuls:
    # only the validation error may come out.
    with no_arithmetic(), pytest.raises(error, match=pattern):
        explode_projections(MultiHeadAttention(D, H).double())(*args, **kwargs)


def test_exploding_projection_guard_does_fire():
    x = randn(B, Q, D)
    with pytest.raises(AssertionError, match="projection ran before"):
        explode_projections(MultiHeadAttention(D, H).double())(x, x, x)


# --------------------------------------------------------------------------- devices


def test_head_mask_follows_the_module_to_another_device():
    # 'meta' stands in for a GPU here: a (B*H, Q, d) output on another device, a head_mask made on the CPU,
    # as valid_lens and masks may be (the package moves those for the caller).
    mha = MultiHeadAttention(8, 2).to("meta")
    x = torch.randn(2, 3, 8, device="meta")
    assert mha(x, x, x, head_mask=torch.ones(2)).device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu_with_masks_made_on_the_cpu():
    mha = make_mha(bias=True, dtype=torch.float32)
    q, k = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
    valid_lens, mask, head_mask = torch.tensor([6, 0]), causal_mask(4, 6), torch.tensor([1.0, 0.0, 0.5])
    expected = mha(q, k, k, valid_lens, mask, head_mask)
    weights = mha.attention_weights
    gpu = mha.cuda()
    out = gpu(q.cuda(), k.cuda(), k.cuda(), valid_lens, mask, head_mask.cuda())
    assert out.is_cuda and torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gpu.attention_weights.cpu(), weights, rtol=1e-4, atol=1e-5)
    # The fused path, with and without valid_lens next to the CPU mask.
    fused = gpu(q.cuda(), k.cuda(), k.cuda(), valid_lens, mask, head_mask.cuda(), need_weights=False)
    torch.testing.assert_close(fused.cpu(), expected, rtol=1e-4, atol=1e-5)
    fused = gpu(q.cuda(), k.cuda(), k.cuda(), mask=mask, need_weights=False)
    torch.testing.assert_close(fused.cpu(), mha.cpu()(q, k, k, mask=mask), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- need_weights=False (fused path)

FUSED_CASES = {
    "plain": lambda: {},
    "valid_lens": lambda: dict(valid_lens=torch.tensor([6, 2])),
    "valid_lens_per_query": lambda: dict(valid_lens=torch.tensor([[1, 2, 3, 4], [6, 0, 5, 1]])),
    "causal": lambda: dict(mask=causal_mask(4, 6)),
    "per_head_mask": lambda: dict(mask=torch.rand(2, 3, 4, 6) < 0.5),
    "everything": lambda: dict(
        valid_lens=torch.tensor([0, 4]), mask=torch.rand(1, 3, 4, 6) < 0.6, head_mask=torch.tensor([1.0, 0.0, -0.5])
    ),
}


@pytest.mark.parametrize("case", list(FUSED_CASES))
@pytest.mark.parametrize("bias", [False, True])
def test_fused_path_gives_the_same_output(case, bias):
    mha = make_mha(bias=bias)
    q, k, v = randn(2, 4, 12), randn(2, 6, 12), randn(2, 6, 12)
    kwargs = FUSED_CASES[case]()
    expected = mha(q, k, v, **kwargs)
    out = mha(q, k, v, need_weights=False, **kwargs)
    assert mha.attention_weights is None
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, **TOL64)


def test_fused_path_dropout_only_in_training():
    mha = MultiHeadAttention(12, 3, dropout=0.5).eval()
    x = torch.randn(2, 5, 12)
    evaluated = mha(x, x, x, need_weights=False)
    torch.testing.assert_close(evaluated, mha(x, x, x), **TOL32)
    assert not torch.allclose(mha.train()(x, x, x, need_weights=False), evaluated)


def test_fused_path_validates_before_arithmetic():
    x = randn(B, Q, D)
    with no_arithmetic(), pytest.raises(ValueError, match=r"valid_lens values must lie in \[0, 3\]"):
        explode_projections(MultiHeadAttention(D, H).double())(x, x, x, torch.tensor([1, 4]), need_weights=False)


@pytest.mark.parametrize("case", ["plain", "valid_lens", "per_head_mask", "everything"])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("num_keys", [4, 6])  # Q == K (self-attention) and K > Q (a continued prefix)
def test_is_causal_is_the_causal_mask_anded_in(case, need_weights, num_keys):
    mha = make_mha(bias=True)
    q, k = randn(2, 4, 12), randn(2, num_keys, 12)
    kwargs = FUSED_CASES[case]()
    if "mask" in kwargs:
        kwargs["mask"] = kwargs["mask"][..., :num_keys]
    if "valid_lens" in kwargs:
        kwargs["valid_lens"] = kwargs["valid_lens"].clamp(max=num_keys)
    causal = causal_mask(4, num_keys)
    expected = mha(q, k, k, **{**kwargs, "mask": causal & kwargs.get("mask", causal)})
    torch.testing.assert_close(mha(q, k, k, need_weights=need_weights, is_causal=True, **kwargs), expected, **TOL64)


def test_is_causal_alone_reaches_sdpa_as_is_causal(monkeypatch):
    # With no other mask the fused path must pass is_causal (which lets flash attention run) and no mask tensor.
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    mha, x = make_mha(), randn(2, 5, 12)
    out = mha(x, x, x, need_weights=False, is_causal=True)
    assert seen == [(None, True)]
    torch.testing.assert_close(out, mha(x, x, x, mask=causal_mask(5)), **TOL64)
    # On another device ('meta' stands in for a GPU) that path builds no mask, so nothing lands on the CPU.
    layer = MultiHeadAttention(8, 2).to("meta")
    y = torch.randn(2, 3, 8, device="meta")
    assert layer(y, y, y, need_weights=False, is_causal=True).device.type == "meta"


def test_is_causal_must_be_a_bool():
    x = randn(B, Q, D)
    with no_arithmetic(), pytest.raises(TypeError, match="is_causal must be True or False, got 1"):
        explode_projections(MultiHeadAttention(D, H).double())(x, x, x, is_causal=1)


# --------------------------------------------------------------------------- prune_heads


@pytest.mark.parametrize("heads", [[1], [0, 2], [2, 0]])
def test_pruning_equals_gating_those_heads_off(heads):
    mha = make_mha(bias=True)
    q, k = randn(2, 4, 12), randn(2, 6, 12)
    valid_lens, mask = torch.tensor([6, 3]), torch.rand(2, 3, 4, 6) < 0.7
    gates = torch.ones(3, dtype=torch.float64)
    gates[heads] = 0
    expected = mha(q, k, k, valid_lens, mask, head_mask=gates)
    expected_w = mha.attention_weights
    kept = [h for h in range(3) if h not in heads]
    mha.prune_heads(heads)
    assert mha.num_heads == len(kept) and mha.head_ids == kept and mha.pruned_heads == sorted(heads)
    assert sum(p.numel() for p in mha.parameters()) == 4 * 12 * 4 * len(kept) + 3 * 4 * len(kept) + 12
    out = mha(q, k, k, valid_lens, mask[:, kept])  # a per-head mask loses the pruned heads too
    torch.testing.assert_close(out, expected, **TOL64)
    torch.testing.assert_close(mha.attention_weights, expected_w[:, kept], **TOL64)
    torch.testing.assert_close(mha(q, k, k, valid_lens, need_weights=False), mha(q, k, k, valid_lens), **TOL64)
    assert mha.attention_weights.shape == (2, len(kept), 4, 6)


def test_pruning_in_steps_uses_the_original_head_numbers():
    mha = make_mha(16, 4, bias=True)
    x = randn(2, 5, 16)
    expected = mha(x, x, x, head_mask=torch.tensor([1.0, 0.0, 1.0, 0.0]))
    mha.prune_heads([3])
    mha.prune_heads([1])  # still head 1 of the original four, not the second of the remaining three
    assert mha.head_ids == [0, 2] and mha.pruned_heads == [1, 3]
    torch.testing.assert_close(mha(x, x, x), expected, **TOL64)
    with pytest.raises(ValueError, match=r"head_mask must have shape \(2,\)"):
        mha(x, x, x, head_mask=torch.ones(4))


@pytest.mark.parametrize("bias", [False, True])
def test_pruning_every_head_leaves_the_output_bias(bias):
    mha = make_mha(bias=bias)
    x = randn(2, 5, 12)
    mha.prune_heads(range(3))
    assert mha.num_heads == 0
    out = mha(x, x, x, torch.tensor([5, 0]))
    expected = mha.W_o.bias.expand(2, 5, 12) if bias else torch.zeros(2, 5, 12, dtype=torch.float64)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert mha.attention_weights.shape == (2, 0, 5, 5)
    torch.testing.assert_close(mha(x, x, x, need_weights=False), expected, rtol=0, atol=0)
    assert mha.attention_weights is None


def test_prune_heads_rejects_bad_head_numbers():
    mha = make_mha()
    with pytest.raises(TypeError, match=r"head numbers must be ints, got 1.0"):
        mha.prune_heads([1.0])
    with pytest.raises(TypeError, match="got True"):
        mha.prune_heads([True])
    with pytest.raises(ValueError, match=r"head 3 is out of range: this layer was built with 3 heads \(0..2\)"):
        mha.prune_heads([3])
    with pytest.raises(ValueError, match=r"must not repeat, got \[1, 1\]"):
        mha.prune_heads([1, 1])
    mha.prune_heads([1])
    with pytest.raises(ValueError, match=r"heads \[1\] are already pruned \(heads left: \[0, 2\]\)"):
        mha.prune_heads([1])
    assert mha.head_ids == [0, 2]  # failed calls changed nothing


# --------------------------------------------------------------------------- weights from elsewhere


class BiasOnOutputOnly(torch.nn.Module):
    """An independent formulation with W_q, W_k, W_v unbiased and W_o biased, written head by head."""

    def __init__(self, num_hiddens, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.W_q, self.W_k, self.W_v = (torch.nn.Linear(num_hiddens, num_hiddens, bias=False) for _ in range(3))
        self.W_o = torch.nn.Linear(num_hiddens, num_hiddens, bias=True)

    def forward(self, X):
        d = X.shape[-1] // self.num_heads
        heads = []
        for h in range(self.num_heads):
            cols = slice(h * d, (h + 1) * d)
            q, k, v = self.W_q(X)[..., cols], self.W_k(X)[..., cols], self.W_v(X)[..., cols]  # (B, T, d)
            heads.append(torch.softmax(q @ k.transpose(1, 2) / d**0.5, dim=-1) @ v)  # (B, T, d)
        return self.W_o(torch.cat(heads, dim=-1))


def test_bias_on_w_o_only_loads_strictly_and_computes_the_same():
    torch.manual_seed(0)
    source = BiasOnOutputOnly(12, 3).double()
    ours = MultiHeadAttention(12, 3, bias=False, out_bias=True).double()
    ours.load_state_dict(source.state_dict(), strict=True)
    assert ours.W_q.bias is None and ours.W_o.bias is not None
    x = randn(2, 5, 12)
    torch.testing.assert_close(ours(x, x, x), source(x), **TOL64)
    torch.testing.assert_close(ours(x, x, x, need_weights=False), source(x), **TOL64)
    with pytest.raises(RuntimeError, match="Missing key"):  # the old all-or-nothing bias cannot hold these weights
        MultiHeadAttention(12, 3, bias=True).double().load_state_dict(source.state_dict(), strict=True)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        MultiHeadAttention(12, 3, bias=False).double().load_state_dict(source.state_dict(), strict=True)


def test_out_bias_follows_bias_by_default_and_is_checked():
    assert MultiHeadAttention(8, 2, bias=True).W_o.bias is not None
    assert MultiHeadAttention(8, 2).W_o.bias is None
    assert MultiHeadAttention(8, 2, bias=True, out_bias=False).W_o.bias is None
    with pytest.raises(TypeError, match="out_bias must be True or False or None, got 1"):
        MultiHeadAttention(8, 2, out_bias=1)


def test_addnorm_takes_bert_style_eps():
    # Sums with a tiny spread, where eps decides the answer: BERT-style models use 1e-12, LayerNorm's default 1e-5.
    torch.manual_seed(0)
    X, Y = 1e-3 * torch.randn(2, 4, 16), 1e-3 * torch.randn(2, 4, 16)
    bert = F.layer_norm(X + Y, (16,), eps=1e-12)
    torch.testing.assert_close(AddNorm(16, eps=1e-12)(X, Y), bert, rtol=1e-5, atol=1e-5)
    assert (AddNorm(16)(X, Y) - bert).abs().max() > 0.1  # the default eps would not reproduce it
    with pytest.raises(ValueError, match="eps must be a positive number, got 0"):
        AddNorm(16, eps=0)


@pytest.mark.parametrize("mask", [torch.tensor([True, False, True, True, False, True]), torch.tensor(True)])
def test_fused_path_takes_the_small_masks_the_step_path_takes(mask):
    mha, q, k = make_mha(bias=True), randn(2, 4, 12), randn(2, 6, 12)
    torch.testing.assert_close(mha(q, k, k, mask=mask, need_weights=False), mha(q, k, k, mask=mask), **TOL64)


@pytest.mark.parametrize("mask", [None, "causal"])
def test_fused_path_keeps_a_nan_query_nan_like_the_step_path(mask):
    mha, q, k = make_mha(), randn(1, 3, 12), randn(1, 4, 12)
    q[0, 1] = float("nan")
    keep = causal_mask(3, 4) if mask else None
    step, fused = mha(q, k, k, mask=keep), mha(q, k, k, mask=keep, need_weights=False)
    assert torch.isnan(step[0, 1]).all() and torch.isnan(fused[0, 1]).all()
    torch.testing.assert_close(fused, step, equal_nan=True, **TOL64)


def test_autocast_may_feed_a_lower_precision_input_to_a_float32_module():
    mha = MultiHeadAttention(D, H).eval()
    x = torch.randn(B, Q, D, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x, x, x)
    assert out.shape == (B, Q, D) and out.dtype == torch.bfloat16
