"""Notebook 14's tools on a small random Llama-style decoder: head masks and weights through ``LlamaDecoder``,
``prune_kv_groups`` against masking, perplexity and pruning curves against plain loops, the copy into transformers.

The real SmolLM2 is checked in test_smollm.py; the shipped pruning study in test_smollm_study.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn import functional as F

from mha_tutorial.core.kv_cache import LayerCache
from mha_tutorial.core.mha import MultiHeadAttention
from mha_tutorial.modern.gqa import prune_kv_groups
from mha_tutorial.pretrained import smollm_study as study
from mha_tutorial.pretrained.llama import LlamaConfig, LlamaDecoder

from testkit import no_arithmetic

SMALL = LlamaConfig(
    vocab_size=50, num_hiddens=24, num_heads=6, num_kv_heads=2, num_layers=3, ffn_num_hiddens=40, max_len=64
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = LlamaDecoder(SMALL).double().eval()
    with torch.no_grad():
        for block in net.layers:  # RMSNorm gains away from 1, so that they matter
            block.norm1.weight.uniform_(0.5, 1.5)
            block.norm2.weight.uniform_(0.5, 1.5)
    return net


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, SMALL.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))


def _layer(H=6, H_kv=2, D=24, seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(D, H, num_kv_heads=H_kv, rope_base=10000.0, bias=True).double().eval()


# ---- LlamaDecoder: head_mask and need_weights -------------------------------------------------------------------
def test_need_weights_keeps_every_layers_weights_and_changes_nothing(model, ids):
    with torch.no_grad():
        fused = model(ids)
        stepped = model(ids, need_weights=True)
    torch.testing.assert_close(stepped, fused)
    for block in model.layers:
        w = block.self_attn.attention_weights  # (B, H, T, T)
        assert w.shape == (2, 6, 12, 12)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 6, 12, dtype=w.dtype))
        assert bool((w.triu(1) == 0).all())  # causal: no weight on a later key


def test_head_mask_of_ones_changes_nothing_and_zeros_remove_attention(model, ids):
    with torch.no_grad():
        plain = model(ids)
        ones = model(ids, head_mask=torch.ones(3, 6, dtype=torch.float64))
        zeros = model(ids, head_mask=torch.zeros(3, 6, dtype=torch.float64))
        # by hand: with every head off, each block is X + MLP(RMSNorm2(X))
        X = model.embedding(ids)
        for block in model.layers:
            X = X + block.mlp(block.norm2(X))
        by_hand = model.head(model.norm(X))
    torch.testing.assert_close(ones, plain)
    torch.testing.assert_close(zeros, by_hand)


def test_bad_head_mask_and_need_weights_are_refused_before_arithmetic(model, ids):
    with no_arithmetic():
        with pytest.raises(ValueError, match=r"\(num_layers, H\) = \(3, 6\).*\(6, 3\)"):
            model(ids, head_mask=torch.ones(6, 3))
        with pytest.raises(TypeError, match="float tensor"):
            model(ids, head_mask=torch.ones(3, 6, dtype=torch.long))
        with pytest.raises(TypeError, match="need_weights"):
            model(ids, need_weights=1)


# ---- prune_kv_groups ----------------------------------------------------------------------------------------------
@given(groups=st.sets(st.integers(0, 2), max_size=3), T=st.integers(1, 6))
def test_pruned_groups_compute_what_masking_their_query_heads_does(groups, T):
    """H = 9, H_kv = 3 (SmolLM2's ratio): removing group j is the same as masking query heads 3j .. 3j + 2."""
    layer = _layer(H=9, H_kv=3, D=36)
    x = torch.randn(2, T, 36, dtype=torch.float64)
    mask = torch.ones(9, dtype=torch.float64)
    for j in groups:
        mask[3 * j : 3 * j + 3] = 0.0
    with torch.no_grad():
        expected = layer(x, x, x, head_mask=mask, is_causal=True)
        pruned = copy.deepcopy(layer)
        prune_kv_groups(pruned, sorted(groups))
        got = pruned(x, x, x, is_causal=True)
    torch.testing.assert_close(got, expected)
    assert pruned.num_kv_heads == 3 - len(groups) and pruned.num_heads == 9 - 3 * len(groups)
    assert pruned.head_ids == [h for h in range(9) if h // 3 not in groups]


def test_pruned_groups_shrink_the_cache_and_decode_the_same():
    layer = _layer()
    x = torch.randn(1, 7, 24, dtype=torch.float64)
    pruned = copy.deepcopy(layer)
    prune_kv_groups(pruned, [0])
    with torch.no_grad():
        full = pruned(x, x, x, is_causal=True)
        cache = LayerCache(grow=True)
        steps = [
            pruned(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], is_causal=True, kv_cache=cache) for t in range(7)
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert cache.keys.shape == (1, 1, 7, 4)  # one K/V head of size 4 left


def test_pruning_groups_in_two_steps_equals_one_step():
    layer = _layer(H=9, H_kv=3, D=36)
    x = torch.randn(1, 5, 36, dtype=torch.float64)
    once, twice = copy.deepcopy(layer), copy.deepcopy(layer)
    prune_kv_groups(once, [0, 2])
    prune_kv_groups(twice, [2])
    prune_kv_groups(twice, [0])  # numbers as the layer is now: group 0 is still the original group 0
    with torch.no_grad():
        torch.testing.assert_close(once(x, x, x, is_causal=True), twice(x, x, x, is_causal=True))
    assert once.head_ids == twice.head_ids == [3, 4, 5] and once.pruned_heads == [0, 1, 2, 6, 7, 8]


@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [([2], ValueError, r"0 \.\. 1, got \[2\]"), ([0, 0], ValueError, "repeat"), ([True], ValueError, "0 .. 1")],
)
def test_bad_groups_are_refused_and_leave_the_layer_untouched(groups, error, match):
    layer = _layer()
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with pytest.raises(error, match=match):
        prune_kv_groups(layer, groups)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        prune_kv_groups(torch.nn.Linear(2, 2), [0])


# ---- perplexity, masks and curves ----------------------------------------------------------------------------------
def test_perplexity_is_the_exponential_of_a_plain_mean_of_log_losses(model, ids):
    with torch.no_grad():
        logits = model(ids)
    logp = F.log_softmax(logits, dim=-1)
    total = sum(-float(logp[b, t, ids[b, t + 1]]) for b in range(2) for t in range(11))
    assert study.perplexity(model, ids) == pytest.approx(math.exp(total / 22), rel=1e-9)


def test_group_mask_switches_off_the_groups_query_heads(model):
    mask = study.group_mask(model, [(0, 1), (2, 0)])
    expected = torch.ones(3, 6)
    expected[0, 3:6] = 0
    expected[2, 0:3] = 0
    assert torch.equal(mask, expected)


def test_pruning_curve_matches_masks_built_by_hand(model, ids):
    order = [5, 0, 12, 3, 17, 1, 2, 4, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16]  # flat layer * 6 + head, 3 layers
    curve = study.pruning_curve(model, ids, order, [0, 1, 3], "head")
    mask = torch.ones(3, 6)
    expected = [study.perplexity(model, ids)]
    for count, unit in enumerate(order[:3], start=1):
        mask[unit // 6, unit % 6] = 0
        if count in (1, 3):
            expected.append(study.perplexity(model, ids, mask.clone()))
    assert curve == pytest.approx(expected, rel=1e-12)
    groups = study.pruning_curve(model, ids, [3, 0, 1, 2, 4, 5], [2], "group")  # flat layer * 2 + group
    assert groups == pytest.approx([study.perplexity(model, ids, study.group_mask(model, [(1, 1), (0, 0)]))])
    with pytest.raises(ValueError, match="permutation"):
        study.pruning_curve(model, ids, order[:-1], [0], "head")
    with pytest.raises(ValueError, match="'head' or 'group'"):
        study.pruning_curve(model, ids, order, [0], "layer")


def test_importances_are_perplexity_rises_of_single_units(model, ids):
    m = model
    heads, groups = study.head_importance(m, ids), study.group_importance(m, ids)
    base = study.perplexity(m, ids)
    mask = torch.ones(3, 6)
    mask[1, 4] = 0
    assert heads[1, 4].item() == pytest.approx(study.perplexity(m, ids, mask) - base, rel=1e-9)
    assert groups[2, 1].item() == pytest.approx(
        study.perplexity(m, ids, study.group_mask(m, [(2, 1)])) - base, rel=1e-9
    )
    assert heads.shape == (3, 6) and groups.shape == (3, 2)


def test_random_orders_are_seeded_permutations():
    a, b = study.random_orders(20, 5, seed=3), study.random_orders(20, 5, seed=3)
    assert a == b and len(a) == 5 and all(sorted(o) == list(range(20)) for o in a)
    assert len({tuple(o) for o in a}) == 5 and study.random_orders(20, 5, seed=4) != a


def test_masked_perplexity_starting_at_the_first_masked_layer_equals_the_full_run(model, ids):
    inputs = study.layer_inputs(model, ids)
    ones = torch.ones(3, 6)
    assert study.masked_perplexity(model, ids, inputs, ones) == study.perplexity(model, ids)
    for layer in range(3):
        mask = ones.clone()
        mask[layer, 2] = 0.5  # any value other than 1 counts as masked
        mask[2, 5] = 0.0
        assert study.masked_perplexity(model, ids, inputs, mask) == study.perplexity(model, ids, mask)


def test_a_mask_is_and_ed_with_the_causal_mask_in_every_layer(model, ids):
    """A sliding window through ``mask`` equals the step path with the window AND causal mask given by hand."""
    T = ids.shape[1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    window = (j > i - 3) | (j == 0)  # (T, T): the last 3 keys and the first
    with torch.no_grad():
        got = model(ids, mask=window)
        X = model.embedding(ids)
        for block in model.layers:
            Y = block.norm1(X)
            X = X + block.self_attn(Y, Y, Y, mask=window & (j <= i))  # causal AND window, by hand
            X = X + block.mlp(block.norm2(X))
        expected = model.head(model.norm(X))
        full = model(ids)
    torch.testing.assert_close(got, expected)
    assert (got - full).abs().max() > 1e-3  # the window changes something
    torch.testing.assert_close(model(ids, mask=torch.ones(T, T, dtype=torch.bool)), full)
