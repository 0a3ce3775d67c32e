"""The three rewrites in variants.py load MultiHeadAttention's state_dict and give the same answers."""

from __future__ import annotations

import pytest
import torch

from mha_tutorial import (
    EinsumMultiHeadAttention,
    HeadLoopMultiHeadAttention,
    MultiHeadAttention,
    SeqFirstMultiHeadAttention,
    causal_mask,
)

from testkit import TOL32, explode_projections, no_arithmetic

BATCH_FIRST = [HeadLoopMultiHeadAttention, EinsumMultiHeadAttention]


def pair(cls, num_hiddens=12, num_heads=3, bias=True, **sizes):
    """A MultiHeadAttention and a ``cls`` holding the same weights (float32, eval mode)."""
    base = MultiHeadAttention(num_hiddens, num_heads, bias=bias, **sizes).eval()
    other = cls(num_hiddens, num_heads, bias=bias, **sizes).eval()
    torch.manual_seed(123)  # fresh weights for `other`, so loading really has to overwrite them
    for p in other.parameters():
        torch.nn.init.normal_(p.data)
    other.load_state_dict(base.state_dict())
    return base, other


def assert_same(base, other, *args, **kwargs):
    expected = base(*args, **kwargs)
    got = other(*args, **kwargs)
    torch.testing.assert_close(got, expected, **TOL32)
    torch.testing.assert_close(other.attention_weights, base.attention_weights, **TOL32)
    return got


def test_state_dicts_have_the_same_keys_and_shapes():
    base = MultiHeadAttention(12, 3, bias=True, key_size=5)
    for cls in (*BATCH_FIRST, SeqFirstMultiHeadAttention):
        other = cls(12, 3, bias=True, key_size=5)
        assert {k: v.shape for k, v in other.state_dict().items()} == {k: v.shape for k, v in base.state_dict().items()}


CASES = {
    "plain": lambda q, k: {},
    "valid_lens": lambda q, k: dict(valid_lens=torch.tensor([k, 2, 1])),
    "valid_lens_per_query": lambda q, k: dict(valid_lens=torch.randint(0, k + 1, (3, q))),
    "causal": lambda q, k: dict(mask=causal_mask(q, k)),
    "causal+valid_lens": lambda q, k: dict(valid_lens=torch.tensor([k, 1, 0]), mask=causal_mask(q, k)),
    "mask_k": lambda q, k: dict(mask=torch.rand(k) < 0.5),
    "mask_hqk": lambda q, k: dict(mask=torch.rand(3, q, k) < 0.5),
    "mask_b1qk": lambda q, k: dict(mask=torch.rand(3, 1, q, k) < 0.5),
    "mask_bhqk": lambda q, k: dict(mask=torch.rand(3, 3, q, k) < 0.5),
    "mask_1h1k": lambda q, k: dict(mask=torch.rand(1, 3, 1, k) < 0.5),
    "head_mask": lambda q, k: dict(head_mask=torch.tensor([1.0, 0.0, 0.5])),
    "everything": lambda q, k: dict(
        valid_lens=torch.tensor([k, 3, 2]), mask=torch.rand(3, 1, q, k) < 0.7, head_mask=torch.tensor([0.0, 1.0, 2.0])
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("cls", BATCH_FIRST, ids=lambda c: c.__name__)
def test_batch_first_variants_match_multi_head_attention(cls, case):
    base, other = pair(cls)
    q, k = torch.randn(3, 4, 12), torch.randn(3, 5, 12)
    v = torch.randn(3, 5, 12)
    out = assert_same(base, other, q, k, v, **CASES[case](4, 5))
    assert out.shape == (3, 4, 12) and other.attention_weights.shape == (3, 3, 4, 5)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("cls", BATCH_FIRST, ids=lambda c: c.__name__)
@pytest.mark.parametrize("bias", [False, True])
def test_batch_first_variants_with_other_input_sizes(cls, bias):
    base, other = pair(cls, 8, 2, bias=bias, query_size=3, key_size=5, value_size=7)
    q, k, v = torch.randn(2, 4, 3), torch.randn(2, 6, 5), torch.randn(2, 6, 7)
    assert_same(base, other, q, k, v, valid_lens=torch.tensor([6, 2]))


@pytest.mark.parametrize("cls", BATCH_FIRST, ids=lambda c: c.__name__)
def test_batch_first_variants_in_float64(cls):
    base, other = pair(cls)
    base.double(), other.double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    out = other(x, x, x, torch.tensor([5, 3]), causal_mask(5))
    torch.testing.assert_close(out, base(x, x, x, torch.tensor([5, 3]), causal_mask(5)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", BATCH_FIRST, ids=lambda c: c.__name__)
def test_batch_first_variants_gradients_match(cls):
    base, other = pair(cls)
    x = torch.randn(2, 5, 12)
    base(x, x, x, torch.tensor([5, 2])).square().sum().backward()
    other(x, x, x, torch.tensor([5, 2])).square().sum().backward()
    for (name, p), (_, p2) in zip(base.named_parameters(), other.named_parameters(), strict=True):
        torch.testing.assert_close(p2.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("cls", BATCH_FIRST, ids=lambda c: c.__name__)
def test_batch_first_variants_dropout_only_in_training(cls):
    _, other = pair(cls)
    other.attention.dropout = 0.5
    x = torch.randn(2, 5, 12)
    evaluated = other(x, x, x)
    torch.testing.assert_close(other(x, x, x), evaluated, rtol=0, atol=0)
    other.train()
    assert not torch.allclose(other(x, x, x), evaluated)
    torch.testing.assert_close(other.attention_weights.sum(-1), torch.ones(2, 3, 5))


@pytest.mark.parametrize("cls", BATCH_FIRST, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(head_mask=torch.ones(2)), ValueError, r"head_mask must have shape \(3,\)"),
        (dict(valid_lens=torch.tensor([1, 9])), ValueError, r"\[0, 5\]"),
        (dict(valid_lens=torch.tensor([1.0, 2.0])), TypeError, "integer"),
        (dict(mask=torch.ones(4, 4, dtype=torch.bool)), ValueError, r"\(4, 4\) does not broadcast.*\(2, 3, 4, 5\)"),
        (dict(mask=torch.ones(4, 5, dtype=torch.int64)), TypeError, "bool"),
    ],
)
def test_batch_first_variants_validate_before_arithmetic(cls, kwargs, error, pattern):
    q, kv = torch.randn(2, 4, 12), torch.randn(2, 5, 12)
    with no_arithmetic(), pytest.raises(error, match=pattern):
        explode_projections(cls(12, 3))(q, kv, kv, **kwargs)


# --------------------------------------------------------------------------- sequence-first


@pytest.mark.parametrize("mask_shape", [None, "QKB", "1KB", "QK1", "1K1"])
@pytest.mark.parametrize("bias", [False, True])
def test_seq_first_matches_multi_head_attention(mask_shape, bias):
    base, other = pair(SeqFirstMultiHeadAttention, bias=bias, key_size=6)
    Q, K, B = 4, 5, 3
    q, k, v = torch.randn(B, Q, 12), torch.randn(B, K, 6), torch.randn(B, K, 12)
    mask = None
    if mask_shape is not None:
        sizes = {"Q": Q, "K": K, "B": B, "1": 1}
        mask = torch.rand([sizes[c] for c in mask_shape]) < 0.6  # [Q or 1, K, B or 1], True = may attend
    out = other(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask)
    assert out.shape == (Q, B, 12)
    mask_bf = None if mask is None else mask.permute(2, 0, 1)[:, None]  # [Q, K, B] -> (B, 1, Q, K)
    torch.testing.assert_close(out.transpose(0, 1), base(q, k, v, mask=mask_bf), **TOL32)
    torch.testing.assert_close(other.attention_weights, base.attention_weights, **TOL32)


def test_seq_first_is_a_sibling_with_its_own_forward_and_the_same_weights():
    """Not a subclass (its forward takes other arguments), yet one state_dict loads both ways, strictly."""
    assert not issubclass(SeqFirstMultiHeadAttention, MultiHeadAttention)
    base, other = pair(SeqFirstMultiHeadAttention, bias=False, out_bias=True)
    back = MultiHeadAttention(12, 3, bias=False, out_bias=True)
    back.load_state_dict(other.state_dict(), strict=True)
    x = torch.randn(5, 2, 12)  # [T, B, d]
    with_weights = other(x, x, x)
    without = other(x, x, x, need_weights=False)
    assert other.attention_weights is None
    torch.testing.assert_close(without, with_weights)
    torch.testing.assert_close(back.eval()(*(x.transpose(0, 1),) * 3), with_weights.transpose(0, 1), **TOL32)
    with pytest.raises(TypeError, match="need_weights must be True or False, got 'yes'"):
        other(x, x, x, need_weights="yes")
    with pytest.raises(ValueError, match="num_hiddens=12 is not divisible by num_heads=5"):
        SeqFirstMultiHeadAttention(12, 5)


def test_seq_first_causal_mask():
    base, other = pair(SeqFirstMultiHeadAttention)
    x = torch.randn(6, 2, 12)  # [T, B, d]
    out = other(x, x, x, causal_mask(6)[:, :, None])
    torch.testing.assert_close(out.transpose(0, 1), base(*(x.transpose(0, 1),) * 3, mask=causal_mask(6)), **TOL32)


def test_seq_first_fully_masked_query_is_finite():
    _, other = pair(SeqFirstMultiHeadAttention)
    x = torch.randn(3, 2, 12)
    mask = torch.ones(3, 3, 2, dtype=torch.bool)
    mask[1, :, 0] = False
    out = other(x, x, x, mask)
    assert torch.isfinite(out).all()
    assert torch.all(other.attention_weights[0, :, 1] == 0)
    torch.testing.assert_close(out[1, 0], other.W_o.bias)


@pytest.mark.parametrize(
    "mask, error, pattern",
    [
        (
            torch.ones(4, 5, dtype=torch.bool),
            ValueError,
            r"mask must have shape \[Q, K, B\] = \[4, 5, 3\] \(Q or B may be 1\), got \[4, 5\]",
        ),
        (torch.ones(4, 4, 3, dtype=torch.bool), ValueError, r"\[4, 5, 3\].*got \[4, 4, 3\]"),
        (torch.ones(2, 5, 3, dtype=torch.bool), ValueError, r"got \[2, 5, 3\]"),
        (torch.ones(4, 5, 2, dtype=torch.bool), ValueError, r"got \[4, 5, 2\]"),
        (torch.ones(4, 5, 3), TypeError, r"mask must be a bool tensor \[Q, K, B\].*float32"),
        ([[[True]]], TypeError, "bool tensor.*got list"),
    ],
)
def test_seq_first_rejects_bad_masks_before_arithmetic(mask, error, pattern):
    q, kv = torch.randn(4, 3, 12), torch.randn(5, 3, 12)
    with no_arithmetic(), pytest.raises(error, match=pattern):
        explode_projections(SeqFirstMultiHeadAttention(12, 3))(q, kv, kv, mask)


def test_seq_first_rejects_bad_tensors():
    layer = SeqFirstMultiHeadAttention(12, 3)
    x = torch.randn(4, 3, 12)
    with pytest.raises(ValueError, match=r"query must have shape \[seq, batch, features\], got \[3, 12\]"):
        layer(torch.randn(3, 12), x, x)
    with pytest.raises(TypeError, match="key must be a tensor, got list"):
        layer(x, [[[0.0]]], x)
    with pytest.raises(ValueError, match="keys and values must have the same length"):
        layer(x, x, torch.randn(5, 3, 12))
    with pytest.raises(ValueError, match="same batch size"):
        layer(x, torch.randn(4, 2, 12), torch.randn(4, 2, 12))
    with pytest.raises(ValueError, match="values have 7 features"):
        layer(x, x, torch.randn(4, 3, 7))


# --------------------------------------------------------------------------- devices


def test_einsum_head_mask_follows_the_module_to_another_device():
    # 'meta' stands in for a GPU: a head_mask made on the CPU is moved to the output's device.
    layer = EinsumMultiHeadAttention(8, 2).to("meta")
    x = torch.randn(2, 3, 8, device="meta")
    assert layer(x, x, x, head_mask=torch.ones(2)).device.type == "meta"
    loop = HeadLoopMultiHeadAttention(8, 2).to("meta")
    assert loop(x, x, x, head_mask=torch.ones(2)).device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cls", BATCH_FIRST, ids=lambda c: c.__name__)
def test_cuda_variants_match_cpu_with_masks_made_on_the_cpu(cls):
    base, other = pair(cls)
    q, k = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
    valid_lens, mask = torch.tensor([6, 0]), torch.rand(2, 1, 4, 6) < 0.5
    expected = base(q, k, k, valid_lens, mask, torch.tensor([1.0, 0.0, 0.5]))
    out = other.cuda()(q.cuda(), k.cuda(), k.cuda(), valid_lens, mask, torch.tensor([1.0, 0.0, 0.5]).cuda())
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-5)
    seq_first = SeqFirstMultiHeadAttention(12, 3, bias=True).eval()
    seq_first.load_state_dict(base.state_dict())  # the same weights as `base` (a second pair() would make new ones)
    seq_first = seq_first.cuda()
    q_sf, k_sf = q.transpose(0, 1).cuda(), k.transpose(0, 1).cuda()  # [T, B, d]
    out = seq_first(q_sf, k_sf, k_sf, causal_mask(4, 6)[..., None])
    torch.testing.assert_close(out.cpu().transpose(0, 1), base(q, k, k, mask=causal_mask(4, 6)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", [HeadLoopMultiHeadAttention, EinsumMultiHeadAttention], ids=lambda c: c.__name__)
def test_variants_with_every_head_pruned_return_the_output_bias(cls):
    base, other = pair(cls)
    base.prune_heads([0, 1, 2])
    other.prune_heads([0, 1, 2])
    x = torch.randn(2, 3, 12)
    torch.testing.assert_close(other(x, x, x), base(x, x, x))
    torch.testing.assert_close(other(x, x, x), base.W_o.bias.expand(2, 3, 12))


@pytest.mark.parametrize("cls", BATCH_FIRST, ids=lambda c: c.__name__)
@pytest.mark.parametrize("kwargs", [{}, {"valid_lens": torch.tensor([3, 1])}, {"mask": torch.rand(2, 3, 4, 4) < 0.7}])
def test_batch_first_variants_take_need_weights_and_is_causal(cls, kwargs):
    # Drop-in for MultiHeadAttention: the same forward arguments give the same outputs.
    base, other = pair(cls)
    x = torch.randn(2, 4, 12)
    for extra in ({"is_causal": True}, {"need_weights": False}, {"need_weights": False, "is_causal": True}):
        expected = base(x, x, x, **kwargs, **extra)
        torch.testing.assert_close(other(x, x, x, **kwargs, **extra), expected, **TOL32)
        if extra.get("need_weights", True):
            torch.testing.assert_close(other.attention_weights, base.attention_weights, **TOL32)
        else:
            assert other.attention_weights is None
    with pytest.raises(TypeError, match="is_causal must be True or False"):
        other(x, x, x, is_causal="yes")
