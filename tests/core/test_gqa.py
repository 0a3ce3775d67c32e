"""Grouped-query and multi-query attention: ``MultiHeadAttention(num_kv_heads=...)`` and ``gqa.mha_to_gqa``.

Two independent references: a plain multi-head layer whose ``W_k``/``W_v`` rows are the grouped layer's, copied
per group by hand (``torch.repeat_interleave`` on the weight rows), and a functional layer built on
``F.scaled_dot_product_attention(..., enable_gqa=True)`` with the weights copied.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn import functional as F

from mha_tutorial.core import mha as mha_module
from mha_tutorial.core.kv_cache import LayerCache, cache_bytes
from mha_tutorial.core.masks import causal_mask
from mha_tutorial.core.mha import MultiHeadAttention
from mha_tutorial.core.variants import EinsumMultiHeadAttention, HeadLoopMultiHeadAttention
from mha_tutorial.modern.gqa import mha_to_gqa

from testkit import TOL64, explode_projections, no_arithmetic

GROUPINGS = [(4, 2), (4, 1), (6, 3), (6, 2), (3, 3)]  # (num_heads, num_kv_heads)


def make_gqa(num_heads, num_kv_heads, head_size=2, bias=True, dtype=torch.float64, **sizes):
    """A grouped-query layer with random, nonzero biases (nn.Linear's defaults could hide a bias mix-up)."""
    gqa = MultiHeadAttention(num_heads * head_size, num_heads, bias=bias, num_kv_heads=num_kv_heads, **sizes)
    gqa = gqa.to(dtype).eval()
    if bias:
        with torch.no_grad():
            for layer in (gqa.W_q, gqa.W_k, gqa.W_v, gqa.W_o):
                layer.bias.uniform_(-0.5, 0.5)
    return gqa


def expanded_mha(gqa: MultiHeadAttention) -> MultiHeadAttention:
    """A plain layer (num_kv_heads=None) computing what ``gqa`` should: K/V head j's rows copied to query heads
    j*G .. (j+1)*G - 1, built from the weight rows, not from the module's forward."""
    H, H_kv, d = gqa.num_heads, gqa.W_k.out_features // gqa.head_size, gqa.head_size
    plain = MultiHeadAttention(
        gqa.num_hiddens,
        H,
        bias=gqa.W_q.bias is not None,
        out_bias=gqa.W_o.bias is not None,
        key_size=gqa.W_k.in_features,
        value_size=gqa.W_v.in_features,
    ).to(gqa.W_q.weight.dtype)
    state = {name: t.clone() for name, t in gqa.state_dict().items()}
    for name in ("W_k.weight", "W_k.bias", "W_v.weight", "W_v.bias"):
        if name in state:
            heads = state[name].unflatten(0, (H_kv, d))  # (H_kv, d, ...)
            state[name] = torch.repeat_interleave(heads, H // H_kv, dim=0).flatten(0, 1)  # (H*d, ...)
    plain.load_state_dict(state)
    return plain.eval()


def functional_gqa(gqa, queries, keys, values, keep=None):
    """Grouped-query attention through F.linear and SDPA's enable_gqa; every query must see a key."""
    B, H, d = queries.shape[0], gqa.num_heads, gqa.head_size

    def project(layer, x):  # (B, T, in) -> (B, heads, T, d)
        return F.linear(x, layer.weight, layer.bias).view(B, x.shape[1], -1, d).transpose(1, 2)

    q, k, v = project(gqa.W_q, queries), project(gqa.W_k, keys), project(gqa.W_v, values)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)  # (B, H, Q, d)
    return F.linear(out.transpose(1, 2).reshape(B, queries.shape[1], H * d), gqa.W_o.weight, gqa.W_o.bias)


def assert_same_state(a, b):
    """Two modules (or Linear layers) hold the same parameter names, shapes and values, exactly."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def assert_same_as_expanded(gqa, q, k, v, need_weights, **kwargs):
    plain = expanded_mha(gqa)
    out, ref = gqa(q, k, v, need_weights=need_weights, **kwargs), plain(q, k, v, need_weights=need_weights, **kwargs)
    torch.testing.assert_close(out, ref, **TOL64)
    if need_weights:
        assert gqa.attention_weights.shape == (q.shape[0], gqa.num_heads, q.shape[1], k.shape[1])
        torch.testing.assert_close(gqa.attention_weights, plain.attention_weights, **TOL64)
    else:
        assert gqa.attention_weights is None


# --------------------------------------------------------------------------- against the expanded plain layer

MASK_CASES = {
    "none": lambda B, Q, K, H: {},
    "valid_lens (B,)": lambda B, Q, K, H: {"valid_lens": torch.tensor([K, 1, K - 2][:B])},
    "valid_lens (B, Q)": lambda B, Q, K, H: {"valid_lens": torch.randint(0, K + 1, (B, Q))},
    "bool mask (B, H, Q, K)": lambda B, Q, K, H: {"mask": torch.rand(B, H, Q, K) < 0.6},
    "is_causal": lambda B, Q, K, H: {"is_causal": True},
    "is_causal + valid_lens": lambda B, Q, K, H: {"is_causal": True, "valid_lens": torch.tensor([K, 2, 4][:B])},
    "head_mask": lambda B, Q, K, H: {"head_mask": torch.linspace(0.0, 1.5, H, dtype=torch.float64)},
}


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("case", list(MASK_CASES))
@pytest.mark.parametrize("heads", GROUPINGS[:3], ids=str)
def test_gqa_equals_the_plain_layer_with_repeated_kv_rows(heads, case, need_weights):
    gqa = make_gqa(*heads)
    B, T = 3, 5
    x = randn(B, T, gqa.num_hiddens)
    assert_same_as_expanded(gqa, x, x, x, need_weights, **MASK_CASES[case](B, T, T, heads[0]))


@pytest.mark.parametrize("need_weights", [True, False])
def test_gqa_cross_attention_with_other_key_sizes(need_weights):
    gqa = make_gqa(6, 2, key_size=5, value_size=7)
    q, k, v = randn(2, 3, 12), randn(2, 4, 5), randn(2, 4, 7)
    assert gqa.W_k.weight.shape == (4, 5) and gqa.W_v.weight.shape == (4, 7)
    assert_same_as_expanded(gqa, q, k, v, need_weights, valid_lens=torch.tensor([4, 2]))


def test_the_fused_fallback_without_enable_gqa_gives_the_same(monkeypatch):
    """An older PyTorch has no enable_gqa: the fused path then repeats the K/V heads itself."""
    gqa = make_gqa(6, 2)
    x = randn(2, 5, 12)
    with_sdpa = gqa(x, x, x, need_weights=False, valid_lens=torch.tensor([5, 3]))
    monkeypatch.setattr(mha_module, "_SDPA_HAS_GQA", False)
    torch.testing.assert_close(gqa(x, x, x, need_weights=False, valid_lens=torch.tensor([5, 3])), with_sdpa, **TOL64)
    assert_same_as_expanded(gqa, x, x, x, False, is_causal=True)


@given(data=st.data())
def test_gqa_equals_the_expanded_layer_for_any_grouping(data):
    H = data.draw(st.integers(1, 6), label="num_heads")
    H_kv = data.draw(st.sampled_from([n for n in range(1, H + 1) if H % n == 0]), label="num_kv_heads")
    B, Q, K = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))
    d, need_weights = data.draw(st.integers(1, 3)), data.draw(st.booleans())
    torch.manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    gqa = make_gqa(H, H_kv, head_size=d, bias=data.draw(st.booleans()))
    lens = torch.randint(1, K + 1, (B,))
    assert_same_as_expanded(
        gqa, randn(B, Q, H * d), randn(B, K, H * d), randn(B, K, H * d), need_weights, valid_lens=lens
    )


# --------------------------------------------------------------------------- against SDPA's own enable_gqa


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("heads", GROUPINGS, ids=str)
def test_gqa_matches_sdpa_enable_gqa(heads, need_weights):
    gqa = make_gqa(*heads)
    q, kv = randn(2, 4, gqa.num_hiddens), randn(2, 6, gqa.num_hiddens)
    keep = torch.rand(2, 1, 4, 6) < 0.5
    keep[..., 0] = True  # every query sees a key (SDPA gives NaN rows otherwise)
    out = gqa(q, kv, kv, mask=keep, need_weights=need_weights)
    torch.testing.assert_close(out, functional_gqa(gqa, q, kv, kv, keep), **TOL64)
    causal = gqa(q, q, q, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(causal, functional_gqa(gqa, q, q, q, causal_mask(4)), **TOL64)


def test_query_heads_of_one_group_see_the_same_keys():
    """Multi-query: every head's scores use one key head, so heads with equal W_q rows get equal weights."""
    gqa = make_gqa(4, 1)
    with torch.no_grad():
        gqa.W_q.weight[2:4] = gqa.W_q.weight[0:2]  # head 1 := head 0
        gqa.W_q.bias[2:4] = gqa.W_q.bias[0:2]
    x = randn(2, 5, 8)
    gqa(x, x, x)
    torch.testing.assert_close(gqa.attention_weights[:, 1], gqa.attention_weights[:, 0], rtol=0, atol=0)
    assert not torch.allclose(gqa.attention_weights[:, 2], gqa.attention_weights[:, 0])


# --------------------------------------------------------------------------- parameters and state_dict


def test_num_kv_heads_equal_to_num_heads_is_the_plain_layer():
    torch.manual_seed(1)
    plain = MultiHeadAttention(12, 3, bias=True)
    for kv in (None, 3):
        torch.manual_seed(1)
        same = MultiHeadAttention(12, 3, bias=True, num_kv_heads=kv)
        assert same.num_kv_heads == 3
        assert_same_state(same, plain)
        x = torch.randn(2, 4, 12)
        assert torch.equal(same(x, x, x), plain(x, x, x))


@pytest.mark.parametrize("heads", GROUPINGS, ids=str)
def test_gqa_shapes_and_parameter_count(heads):
    H, H_kv = heads
    gqa = make_gqa(H, H_kv, head_size=3)
    D = 3 * H
    assert gqa.num_kv_heads == H_kv and gqa.W_k.weight.shape == gqa.W_v.weight.shape == (3 * H_kv, D)
    assert gqa.W_q.weight.shape == gqa.W_o.weight.shape == (D, D)
    assert sum(p.numel() for p in gqa.parameters()) == 2 * (D * D + D) + 2 * (3 * H_kv * D + 3 * H_kv)


def test_pruning_a_plain_layer_keeps_num_kv_heads_in_step():
    mha = make_gqa(3, None)
    mha.prune_heads([1])
    assert mha.num_heads == mha.num_kv_heads == 2
    x = randn(2, 4, 6)
    cache = LayerCache()
    mha(x, x, x, is_causal=True, kv_cache=cache)
    assert cache.keys.shape == (2, 2, 4, 2)


# --------------------------------------------------------------------------- the KV cache


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("heads", [(4, 2), (4, 1)], ids=str)
def test_cached_decode_equals_the_uncached_forward_and_the_cache_shrinks(heads, need_weights):
    H, H_kv = heads
    gqa = make_gqa(H, H_kv, head_size=3)
    B, T, d = 2, 7, 3
    x = randn(B, T, gqa.num_hiddens)
    full = gqa(x, x, x, is_causal=True, need_weights=need_weights)
    cache, plain_cache, plain = LayerCache(), LayerCache(), expanded_mha(gqa)
    steps = []
    for part in (slice(0, 3), slice(3, 4), slice(4, 5), slice(5, 7)):  # a prompt, then 1, 1 and 2 new tokens
        xs = x[:, part]
        steps.append(gqa(xs, xs, xs, is_causal=True, need_weights=need_weights, kv_cache=cache))
        plain(xs, xs, xs, is_causal=True, need_weights=need_weights, kv_cache=plain_cache)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL64)
    assert cache.keys.shape == cache.values.shape == (B, H_kv, T, d)
    assert cache.nbytes == cache_bytes(1, B, H_kv, T, d, torch.float64)
    assert cache.nbytes * (H // H_kv) == plain_cache.nbytes  # the plain layer caches H heads


def test_a_fixed_cross_attention_cache_holds_kv_heads():
    gqa = make_gqa(6, 3)
    memory, q = randn(2, 5, 12), randn(2, 1, 12)
    cache = LayerCache(grow=False)
    first = gqa(q, memory, memory, kv_cache=cache)
    again = gqa(q, memory[:, :2] * 0, memory[:, :2] * 0, kv_cache=cache)  # the memory is not projected again
    assert cache.keys.shape == (2, 3, 5, 2)
    torch.testing.assert_close(again, first, **TOL64)
    torch.testing.assert_close(first, gqa(q, memory, memory), **TOL64)


@pytest.mark.parametrize(
    "filled_by, used_by, message",
    [
        ((4, None), (4, 2), "H_kv = 2 key/value heads"),
        ((4, 2), (4, None), "H = 4 heads"),
        ((4, 2), (4, 1), "H_kv = 1 key/value heads"),
    ],
)
def test_a_cache_of_other_kv_heads_is_refused_before_arithmetic(filled_by, used_by, message):
    x = randn(2, 3, 8)
    cache = LayerCache()
    make_gqa(*filled_by)(x, x, x, is_causal=True, kv_cache=cache)
    keys = cache.keys
    user = explode_projections(make_gqa(*used_by))
    with no_arithmetic(), pytest.raises(ValueError, match=message):
        user(x[:, :1], x[:, :1], x[:, :1], is_causal=True, kv_cache=cache)
    assert cache.keys is keys and len(cache) == 3


# --------------------------------------------------------------------------- mha_to_gqa


@pytest.mark.parametrize("init", ["mean", "first"])
def test_mha_to_gqa_with_every_head_kept_is_an_exact_copy(init):
    mha = make_gqa(4, None)
    new = mha_to_gqa(mha, 4, init)
    assert new is not mha and new.num_kv_heads == 4
    assert_same_state(new, mha)
    x = randn(2, 5, 8)
    for need_weights in (True, False):
        assert torch.equal(new(x, x, x, need_weights=need_weights), mha(x, x, x, need_weights=need_weights))


@pytest.mark.parametrize("heads", [(6, 2), (6, 3), (4, 1)], ids=str)
def test_mha_to_gqa_mean_and_first_by_hand(heads):
    H, H_kv = heads
    mha, d, G = make_gqa(H, None, head_size=2), 2, H // H_kv
    means, firsts = mha_to_gqa(mha, H_kv, "mean"), mha_to_gqa(mha, H_kv, "first")
    for name in ("W_k", "W_v"):
        for param in ("weight", "bias"):
            old = getattr(getattr(mha, name), param)
            for j in range(H_kv):
                rows = slice(j * d, (j + 1) * d)
                group = [old[h * d : (h + 1) * d] for h in range(j * G, (j + 1) * G)]
                expected_mean = sum(group[1:], group[0]) / G
                torch.testing.assert_close(getattr(getattr(means, name), param)[rows], expected_mean, **TOL64)
                assert torch.equal(getattr(getattr(firsts, name), param)[rows], group[0])
    for new in (means, firsts):
        for name in ("W_q", "W_o"):
            assert_same_state(getattr(new, name), getattr(mha, name))


def test_mha_to_gqa_keeps_the_layer_settings_and_leaves_the_original():
    mha = MultiHeadAttention(8, 4, 0.25, bias=False, out_bias=True, key_size=5, value_size=3).double().train()
    before = {n: t.clone() for n, t in mha.state_dict().items()}
    new = mha_to_gqa(mha, 2)
    assert new.training and new.attention.dropout == 0.25 and new.W_q.weight.dtype == torch.float64
    assert new.W_q.bias is None and new.W_k.bias is None and new.W_o.bias is not None
    assert new.W_k.weight.shape == (4, 5) and new.W_v.weight.shape == (4, 3)
    assert all(torch.equal(before[n], t) for n, t in mha.state_dict().items())
    assert not mha_to_gqa(mha.eval(), 2).training


def test_mha_to_gqa_random_is_seeded_and_in_nn_linear_bounds():
    mha = make_gqa(4, None, head_size=4)
    a = mha_to_gqa(mha, 2, "random", generator=torch.Generator().manual_seed(3))
    b = mha_to_gqa(mha, 2, "random", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.W_k.weight, b.W_k.weight) and torch.equal(a.W_v.bias, b.W_v.bias)
    assert not torch.allclose(a.W_k.weight, mha_to_gqa(mha, 2).W_k.weight)
    bound = 1 / 16**0.5
    assert a.W_k.weight.abs().max() <= bound and a.W_k.weight.std() > bound / 4
    assert torch.equal(a.W_q.weight, mha.W_q.weight)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "num_kv_heads, error, message",
    [
        (0, ValueError, "num_kv_heads=0 does not divide num_heads=4.*one of \\[1, 2, 4\\]"),
        (-2, ValueError, "num_kv_heads=-2 does not divide num_heads=4"),
        (3, ValueError, "num_kv_heads=3 does not divide num_heads=4"),
        (8, ValueError, "num_kv_heads=8 does not divide num_heads=4"),
        (2.0, TypeError, "num_kv_heads must be an int dividing num_heads=4"),
        (True, TypeError, "num_kv_heads must be an int"),
        ("2", TypeError, "num_kv_heads must be an int"),
    ],
)
def test_bad_num_kv_heads_is_refused(num_kv_heads, error, message):
    with no_arithmetic(), pytest.raises(error, match=message):
        MultiHeadAttention(8, 4, num_kv_heads=num_kv_heads)
    mha = make_gqa(4, None)
    with no_arithmetic(), pytest.raises(error, match=message):
        mha_to_gqa(mha, num_kv_heads)


@pytest.mark.parametrize("variant", [HeadLoopMultiHeadAttention, EinsumMultiHeadAttention])
def test_variants_that_replace_forward_refuse_grouped_kv_heads(variant):
    with pytest.raises(
        NotImplementedError,
        match=f"{variant.__name__} needs one key/value head.*num_kv_heads=2 .*MultiHeadAttention itself",
    ):
        variant(8, 4, num_kv_heads=2)
    assert variant(8, 4, num_kv_heads=4).num_kv_heads == 4


def test_pruning_a_gqa_layer_is_refused_and_changes_nothing():
    gqa = make_gqa(4, 2)
    before = {n: t.clone() for n, t in gqa.state_dict().items()}
    with (
        no_arithmetic(),
        pytest.raises(NotImplementedError, match="prune_heads needs one key/value head.*shared by 2 query heads"),
    ):
        gqa.prune_heads([1])
    assert gqa.num_heads == 4 and gqa.head_ids == [0, 1, 2, 3]
    assert all(torch.equal(before[n], t) for n, t in gqa.state_dict().items())


def test_a_head_mask_per_kv_head_is_refused_before_arithmetic():
    gqa = explode_projections(make_gqa(4, 2))
    x = randn(2, 3, 8)
    with no_arithmetic(), pytest.raises(ValueError, match=r"head_mask must have shape \(4,\)"):
        gqa(x, x, x, head_mask=torch.ones(2, dtype=torch.float64))


BAD_CONVERSIONS = {
    "not a layer": (lambda m: ("W_k", 2), TypeError, "mha must be a MultiHeadAttention"),
    "already grouped": (lambda m: (mha_to_gqa(m, 2), 1), ValueError, "already shares its K/V heads"),
    "pruned": (lambda m: (_pruned(m), 1), ValueError, r"pruned heads \[0\]"),
    "no num_kv_heads": (lambda m: (m, None), TypeError, "num_kv_heads must be an int"),
    "unknown init": (lambda m: (m, 2, "median"), ValueError, "init must be one of"),
    "init not a string": (lambda m: (m, 2, 0), ValueError, "init must be one of"),
    "bad generator": (lambda m: (m, 2, "random", 3), TypeError, "generator must be a torch.Generator"),
}


def _pruned(mha):
    mha.prune_heads([0])
    return mha


@pytest.mark.parametrize("case", list(BAD_CONVERSIONS))
def test_bad_conversions_are_refused_before_arithmetic(case):
    make_args, error, message = BAD_CONVERSIONS[case]
    args = make_args(make_gqa(4, None))
    with no_arithmetic(), pytest.raises(error, match=message):
        mha_to_gqa(*args)
