"""Property tests (hypothesis) over small random shapes.

Each example draws sizes and a seed; tensors come from a seeded torch.Generator
so that a failing example is reproducible from what hypothesis prints.
Everything runs in float64 so comparisons can be tight.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from mha_tutorial import (
    EinsumMultiHeadAttention,
    HeadLoopMultiHeadAttention,
    MultiHeadAttention,
    SeqFirstMultiHeadAttention,
    additive_to_bool,
    bool_to_additive,
    causal_mask,
    keep_to_drop,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
    transpose_output,
    transpose_qkv,
)

from testkit import TOL64, loop_keep_from_valid_lens, loop_masked_softmax, torch_mha_from

DT = torch.float64
seeds = st.integers(0, 2**31 - 1)
small = st.integers(1, 5)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=DT)


def random_keep(g, *shape, at_least_one=True):
    keep = torch.rand(shape, generator=g) < 0.5
    if at_least_one:  # every query sees some key (PyTorch's references give NaN otherwise)
        first = torch.randint(shape[-1], shape[:-1], generator=g)
        keep.scatter_(-1, first[..., None], True)
    return keep


def make_mha(g, num_hiddens, num_heads, bias, cls=MultiHeadAttention):
    mha = cls(num_hiddens, num_heads, bias=bias).to(DT).eval()
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=DT) * 0.5)
    return mha


@st.composite
def mha_config(draw):
    heads = draw(st.integers(1, 3))
    return dict(
        batch=draw(st.integers(1, 3)),
        heads=heads,
        hiddens=heads * draw(st.integers(1, 4)),
        queries=draw(small),
        keys=draw(small),
        bias=draw(st.booleans()),
        seed=draw(seeds),
    )


# --------------------------------------------------------------------------- references


@given(shape=st.tuples(st.integers(1, 3), small, small), seed=seeds, use_lens=st.booleans(), use_mask=st.booleans())
def test_masked_softmax_matches_loop(shape, seed, use_lens, use_mask):
    g = gen(seed)
    B, Q, K = shape
    scores = randn(g, B, Q, K) * 3
    valid_lens = torch.randint(0, K + 1, (B,), generator=g) if use_lens else None
    mask = random_keep(g, Q, K, at_least_one=False) if use_mask else None
    keep = torch.ones(B, Q, K, dtype=torch.bool)
    if use_lens:
        keep &= loop_keep_from_valid_lens(valid_lens, B, Q, K)
    if use_mask:
        keep &= mask
    weights = masked_softmax(scores, valid_lens, mask)
    torch.testing.assert_close(weights, loop_masked_softmax(scores, keep), **TOL64)
    assert torch.all(weights[~keep] == 0)


@given(b=st.integers(1, 3), h=st.integers(1, 3), q=small, k=small, d=small, seed=seeds, heads_axis=st.booleans())
def test_sdpa_matches_pytorch(b, h, q, k, d, seed, heads_axis):
    g = gen(seed)
    lead = (b, h) if heads_axis else (b,)
    Qt, Kt, Vt = randn(g, *lead, q, d), randn(g, *lead, k, d), randn(g, *lead, k, d + 1)
    keep = random_keep(g, *lead, q, k)
    out, weights = scaled_dot_product_attention(Qt, Kt, Vt, mask=keep)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Qt, Kt, Vt, attn_mask=keep), **TOL64)
    if q == k:
        out, _ = scaled_dot_product_attention(Qt, Kt, Vt, mask=causal_mask(q))
        torch.testing.assert_close(out, F.scaled_dot_product_attention(Qt, Kt, Vt, is_causal=True), **TOL64)


@given(cfg=mha_config(), use_lens=st.booleans(), use_causal=st.booleans())
def test_mha_matches_nn_multihead_attention(cfg, use_lens, use_causal):
    g = gen(cfg["seed"])
    B, Q, K, E = cfg["batch"], cfg["queries"], cfg["keys"], cfg["hiddens"]
    mha = make_mha(g, E, cfg["heads"], cfg["bias"])
    q, k, v = randn(g, B, Q, E), randn(g, B, K, E), randn(g, B, K, E)
    kwargs, ref_kwargs = {}, {}
    if use_lens:
        kwargs["valid_lens"] = torch.randint(1, K + 1, (B,), generator=g)
        ref_kwargs["key_padding_mask"] = keep_to_drop(padding_mask(kwargs["valid_lens"], K)[:, 0])
    if use_causal:
        kwargs["mask"] = causal_mask(Q, K)
        # With Q > K the first queries would see no key (nn.MultiheadAttention gives NaN there), and
        # valid_lens may hide the others: key 0 stays visible to every query.
        kwargs["mask"][:, 0] = True
        ref_kwargs["attn_mask"] = keep_to_drop(kwargs["mask"])
    out = mha(q, k, v, **kwargs)
    ref_out, ref_w = torch_mha_from(mha)(q, k, v, average_attn_weights=False, **ref_kwargs)
    torch.testing.assert_close(out, ref_out, **TOL64)
    torch.testing.assert_close(mha.attention_weights, ref_w, **TOL64)
    torch.testing.assert_close(mha(q, k, v, need_weights=False, **kwargs), ref_out, **TOL64)  # the fused path


@given(cfg=mha_config(), cls=st.sampled_from([HeadLoopMultiHeadAttention, EinsumMultiHeadAttention]))
def test_variants_match_mha(cfg, cls):
    g = gen(cfg["seed"])
    B, Q, K, E, H = cfg["batch"], cfg["queries"], cfg["keys"], cfg["hiddens"], cfg["heads"]
    mha = make_mha(g, E, H, cfg["bias"])
    other = cls(E, H, bias=cfg["bias"]).to(DT).eval()
    other.load_state_dict(mha.state_dict())
    q, k, v = randn(g, B, Q, E), randn(g, B, K, E), randn(g, B, K, E)
    kwargs = dict(
        valid_lens=torch.randint(0, K + 1, (B,), generator=g),
        mask=random_keep(g, B, H, Q, K, at_least_one=False),
        head_mask=randn(g, H),
    )
    torch.testing.assert_close(other(q, k, v, **kwargs), mha(q, k, v, **kwargs), **TOL64)
    torch.testing.assert_close(other.attention_weights, mha.attention_weights, **TOL64)


@given(cfg=mha_config(), q_axis=st.booleans(), b_axis=st.booleans())
def test_seq_first_matches_mha(cfg, q_axis, b_axis):
    g = gen(cfg["seed"])
    B, Q, K, E, H = cfg["batch"], cfg["queries"], cfg["keys"], cfg["hiddens"], cfg["heads"]
    mha = make_mha(g, E, H, cfg["bias"])
    other = SeqFirstMultiHeadAttention(E, H, bias=cfg["bias"]).to(DT).eval()
    other.load_state_dict(mha.state_dict())
    q, k, v = randn(g, Q, B, E), randn(g, K, B, E), randn(g, K, B, E)
    mask = random_keep(g, Q if q_axis else 1, K, B if b_axis else 1, at_least_one=False)
    out = other(q, k, v, mask)
    expected = mha(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask=mask.permute(2, 0, 1)[:, None])
    torch.testing.assert_close(out.transpose(0, 1), expected, **TOL64)
    torch.testing.assert_close(other.attention_weights, mha.attention_weights, **TOL64)


# --------------------------------------------------------------------------- invariances


@given(b=st.integers(1, 3), t=small, heads=st.integers(1, 4), d=st.integers(1, 4), seed=seeds)
def test_transpose_round_trips(b, t, heads, d, seed):
    g = gen(seed)
    X = randn(g, b, t, heads * d)
    folded = transpose_qkv(X, heads)
    assert folded.shape == (b * heads, t, d)
    assert torch.equal(transpose_output(folded, heads), X)
    assert torch.equal(transpose_qkv(transpose_output(folded, heads), heads), folded)
    # Batch-major: the rows of example b are b*H .. (b+1)*H.
    assert torch.equal(folded.view(b, heads, t, d)[-1].transpose(0, 1).reshape(t, heads * d), X[-1])


@given(cfg=mha_config(), split=st.integers(0, 4))
def test_causality_future_tokens_do_not_change_the_past(cfg, split):
    g = gen(cfg["seed"])
    B, T, E = cfg["batch"], cfg["queries"], cfg["hiddens"]
    split = min(split, T - 1)
    mha = make_mha(g, E, cfg["heads"], cfg["bias"])
    x = randn(g, B, T, E)
    changed = x.clone()
    changed[:, split + 1 :] = randn(g, B, T - split - 1, E) * 5
    before = mha(x, x, x, mask=causal_mask(T))
    after = mha(changed, changed, changed, mask=causal_mask(T))
    torch.testing.assert_close(after[:, : split + 1], before[:, : split + 1], **TOL64)
    if split + 1 < T:  # and the future really did change (the test is not vacuous)
        assert not torch.allclose(after[:, split + 1 :], before[:, split + 1 :])


@given(cfg=mha_config(), per_query=st.booleans())
def test_padding_invariance(cfg, per_query):
    g = gen(cfg["seed"])
    B, Q, K, E = cfg["batch"], cfg["queries"], cfg["keys"], cfg["hiddens"]
    mha = make_mha(g, E, cfg["heads"], cfg["bias"])
    q, k, v = randn(g, B, Q, E), randn(g, B, K, E), randn(g, B, K, E)
    shape = (B, Q) if per_query else (B,)
    valid_lens = torch.randint(0, K + 1, shape, generator=g)
    before = mha(q, k, v, valid_lens)
    w_before = mha.attention_weights
    pad = ~padding_mask(valid_lens, K).any(1)  # (B, K): keys no query may see
    k2, v2 = k.clone(), v.clone()
    k2[pad] = randn(g, int(pad.sum()), E) * 100
    v2[pad] = randn(g, int(pad.sum()), E) * 100
    after = mha(q, k2, v2, valid_lens)
    torch.testing.assert_close(after, before, **TOL64)
    torch.testing.assert_close(mha.attention_weights, w_before, **TOL64)
    assert torch.isfinite(after).all()


@given(cfg=mha_config(), which=st.integers(0, 2))
def test_batch_independence(cfg, which):
    g = gen(cfg["seed"])
    B, Q, K, E = cfg["batch"], cfg["queries"], cfg["keys"], cfg["hiddens"]
    which = which % B
    mha = make_mha(g, E, cfg["heads"], cfg["bias"])
    q, k, v = randn(g, B, Q, E), randn(g, B, K, E), randn(g, B, K, E)
    valid_lens = torch.randint(0, K + 1, (B,), generator=g)
    full = mha(q, k, v, valid_lens)
    alone = mha(q[which : which + 1], k[which : which + 1], v[which : which + 1], valid_lens[which : which + 1])
    torch.testing.assert_close(full[which : which + 1], alone, **TOL64)
    others = torch.arange(B) != which
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for t in (q2, k2, v2):
        t[others] = randn(g, int(others.sum()), *t.shape[1:])
    torch.testing.assert_close(mha(q2, k2, v2, valid_lens)[which], full[which], **TOL64)


@given(cfg=mha_config(), use_mask=st.booleans())
def test_self_attention_is_permutation_equivariant(cfg, use_mask):
    g = gen(cfg["seed"])
    B, T, E = cfg["batch"], cfg["queries"], cfg["hiddens"]
    mha = make_mha(g, E, cfg["heads"], cfg["bias"])
    x = randn(g, B, T, E)
    perm = torch.randperm(T, generator=g)
    mask = random_keep(g, T, T) if use_mask else None
    out = mha(x, x, x, mask=mask)
    weights = mha.attention_weights  # (B, H, T, T)
    # Permuting the tokens (and, if any, both axes of the mask) permutes the outputs.
    perm_mask = None if mask is None else mask[perm][:, perm]
    xp = x[:, perm]
    torch.testing.assert_close(mha(xp, xp, xp, mask=perm_mask), out[:, perm], **TOL64)
    torch.testing.assert_close(mha.attention_weights, weights[:, :, perm][..., perm], **TOL64)


@given(shape=st.tuples(small, small), seed=seeds)
@settings(max_examples=20)
def test_mask_conversions_round_trip(shape, seed):
    keep = torch.rand(shape, generator=gen(seed)) < 0.5
    assert torch.equal(additive_to_bool(bool_to_additive(keep)), keep)
    assert torch.equal(keep_to_drop(keep), ~keep)


@pytest.mark.parametrize("n", [1, 2])
def test_property_generators_are_not_degenerate(n):
    # random_keep must keep at least one key per row and still mask something overall.
    keep = random_keep(gen(n), 50, 6)
    assert keep.any(-1).all() and not keep.all()
