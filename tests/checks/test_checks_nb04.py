"""The exercise checks of notebook 04 accept right answers and reject typical wrong ones by name."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn import functional as F

import mha_tutorial as mt
from mha_tutorial import MultiHeadAttention
from mha_tutorial.checks import (
    CheckFailed,
    check_head_off,
    check_mha_forward,
    check_num_params,
    check_peak_prediction,
    check_torch_mha_params,
)
from mha_tutorial.checks._nb04_forward import _OUTPUT_MISTAKES, _WEIGHT_MISTAKES, _applies, _forward_cases, _variant

# ------------------------------------------------ Exercise 1: a forward pass with (B, Q) lengths and a mask


def mha_loop(net, queries, keys, values, valid_lens=None, mask=None):
    """Plain loops over examples, heads, queries and keys, each head's weights sliced out of the Linear layers."""
    H = net.num_heads
    d = net.W_q.out_features // H
    B, Q, K = queries.shape[0], queries.shape[1], keys.shape[1]
    out, weights = torch.zeros(B, Q, H * d), torch.zeros(B, H, Q, K)
    for b in range(B):
        for h in range(H):
            rows = slice(h * d, (h + 1) * d)

            def project(W, x, rows=rows):  # head h's rows of W applied to x, bias slice included
                return x @ W.weight[rows].T + (0 if W.bias is None else W.bias[rows])

            q, k, v = project(net.W_q, queries[b]), project(net.W_k, keys[b]), project(net.W_v, values[b])
            for i in range(Q):
                seen = [
                    j for j in range(K) if (valid_lens is None or j < valid_lens[b, i]) and (mask is None or mask[i, j])
                ]
                scores = [math.exp(float(q[i] @ k[j]) / math.sqrt(d)) for j in seen]
                for j, s in zip(seen, scores, strict=True):
                    weights[b, h, i, j] = s / sum(scores)
                    out[b, i, rows] += weights[b, h, i, j] * v[j]
    return net.W_o(out), weights


def mha_vectorised(net, queries, keys, values, valid_lens=None, mask=None):
    H = net.num_heads
    d = net.W_q.out_features // H
    q, k, v = (
        W(x).unflatten(-1, (H, d)).transpose(1, 2) for W, x in ((net.W_q, queries), (net.W_k, keys), (net.W_v, values))
    )
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, Q, K)
    keep = torch.ones(scores.shape[-2:], dtype=torch.bool)
    if valid_lens is not None:
        keep = keep & (torch.arange(k.shape[2]) < valid_lens[:, None, :, None])
    if mask is not None:
        keep = keep & mask
    w = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return net.W_o((w @ v).transpose(1, 2).flatten(2)), w


def test_check_reference_and_variant_defaults_match_the_loops():
    for net, q, k, v, lens, mask, _ in _forward_cases():
        with torch.no_grad():
            out, w = mha_loop(net, q, k, v, lens, mask)
            assert torch.allclose(MultiHeadAttention.forward(net, q, k, v, lens, mask), out, atol=1e-5)
            assert torch.allclose(net.attention_weights, w, atol=1e-6)
            v_out, v_w = _variant(net, q, k, v, lens, mask)
            assert torch.allclose(v_out, out, atol=1e-5) and torch.allclose(v_w, w, atol=1e-6)


@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.data())
def test_loop_reference_matches_the_package_on_random_masks(B, Q, K, H, d, data):
    """Every query sees key 0 (length >= 1, mask column 0 True), so no row is empty."""
    net = MultiHeadAttention(H * d, H, bias=data.draw(st.booleans())).eval()
    x, y = torch.randn(B, Q, H * d), torch.randn(B, K, H * d)
    lens = torch.tensor(data.draw(st.lists(st.integers(1, K), min_size=B * Q, max_size=B * Q))).view(B, Q)
    mask = torch.rand(Q, K) < 0.6
    mask[:, 0] = True
    with torch.no_grad():
        out, w = mha_loop(net, x, y, y, lens, mask)
        assert torch.allclose(net(x, y, y, lens, mask), out, atol=1e-5)
        assert torch.allclose(net.attention_weights, w, atol=1e-6)


def test_every_named_forward_mistake_differs_from_the_right_answer():
    """Otherwise a mistake could be 'recognised' in an answer that is in fact right."""
    for net, q, k, v, lens, mask, case in _forward_cases():
        Q, K = q.shape[1], k.shape[1]
        with torch.no_grad():
            right, right_w = _variant(net, q, k, v, lens, mask)
            for message, flags in _WEIGHT_MISTAKES:
                if _applies(flags, lens, mask, Q, K):
                    assert not torch.allclose(right_w, _variant(net, q, k, v, lens, mask, **flags)[1], atol=1e-5), (
                        case,
                        message,
                    )
            for message, flags in _OUTPUT_MISTAKES:
                assert not torch.allclose(right, _variant(net, q, k, v, lens, mask, **flags)[0], atol=1e-5), message


@pytest.mark.parametrize("right", [mha_loop, mha_vectorised])
def test_mha_forward_accepts_right_answers(right, capsys):
    check_mha_forward(right)
    assert "✓ check_mha_forward: passed on 4 cases" in capsys.readouterr().out


def mha_needs_a_mask(net, q, k, v, lens=None, mask=None):  # right whenever a mask is given; crashes on None
    keep = mask[None, None] & True  # None[None, None]: TypeError
    return mha_vectorised(net, q, k, v, lens, keep)


def mha_needs_lengths(net, q, k, v, lens=None, mask=None):  # right whenever lengths are given; crashes on None
    return mha_vectorised(net, q, k, v, lens.clone(), mask)  # None.clone(): AttributeError


@pytest.mark.parametrize(
    "wrong, words",
    [
        (mha_needs_a_mask, "mask=None: your function raised TypeError"),
        (mha_needs_lengths, "valid_lens=None: your function raised AttributeError"),
    ],
)
def test_mha_forward_tries_each_argument_as_none_and_says_so(wrong, words):
    """The exercise says either argument may be None; a solution that crashes on None fails, naming the None."""
    with torch.no_grad():  # each is right on a case that passes both arguments
        net, q, k, v, lens, mask, _ = _forward_cases()[0]
        assert torch.allclose(wrong(net, q, k, v, lens, mask)[0], mha_loop(net, q, k, v, lens, mask)[0], atol=1e-5)
    with pytest.raises(CheckFailed) as info:
        check_mha_forward(wrong)
    assert words in str(info.value)
    assert "is None, which the exercise allows: None hides no key" in str(info.value)


def _wrong(**flags):
    return lambda net, q, k, v, lens=None, mask=None: _variant(net, q, k, v, lens, mask, **flags)


def mha_lens_on_keys(net, q, k, v, lens=None, mask=None):  # the lengths broadcast along the keys
    keep = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool) if mask is None else mask
    if lens is not None:
        keep = keep & (torch.arange(k.shape[1]) < lens[:, None, None, :])
    return mha_vectorised(net, q, k, v, None, keep)


def mha_torch_mask(net, q, k, v, lens=None, mask=None):  # nn.MultiheadAttention's True = ignore
    return mha_vectorised(net, q, k, v, lens, None if mask is None else ~mask)


def mha_via_sdpa(net, q, k, v, lens=None, mask=None):
    H, d = net.num_heads, net.head_size
    keep = torch.arange(k.shape[1]) < lens[:, None, :, None] if lens is not None else torch.tensor(True)
    keep = keep & (mask if mask is not None else True)
    q, k, v = (W(x).unflatten(-1, (H, d)).transpose(1, 2) for W, x in ((net.W_q, q), (net.W_k, k), (net.W_v, v)))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    return net.W_o(out.transpose(1, 2).flatten(2)), None


def mha_via_masked_softmax(net, q, k, v, lens=None, mask=None):
    H, d = net.num_heads, net.head_size
    q, k, v = (W(x).unflatten(-1, (H, d)).transpose(1, 2) for W, x in ((net.W_q, q), (net.W_k, k), (net.W_v, v)))
    w = mt.masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(d), lens, None if mask is None else mask)
    return net.W_o((w @ v).transpose(1, 2).flatten(2)), w


def mha_via_padding_mask(net, q, k, v, lens=None, mask=None):
    keep = mask if lens is None else mt.padding_mask(lens, k.shape[1])[:, None] & mask
    return mha_vectorised(net, q, k, v, None, keep)


def mha_via_fresh_module(net, q, k, v, lens=None, mask=None):
    sizes = dict(query_size=net.W_q.in_features, key_size=net.W_k.in_features, value_size=net.W_v.in_features)
    fresh = MultiHeadAttention(net.num_hiddens, net.num_heads, bias=net.W_o.bias is not None, **sizes)
    fresh.load_state_dict(net.state_dict())
    return fresh(q, k, v, lens, mask), fresh.attention_weights


def mha_edits_weights(net, q, k, v, lens=None, mask=None):
    with torch.no_grad():
        net.W_o.weight.mul_(1.0001)
    return mha_vectorised(net, q, k, v, lens, mask)


def _then(change):
    return lambda *args: change(*mha_vectorised(*args))


@pytest.mark.parametrize(
    "wrong, words",
    [
        *[(_wrong(**flags), message) for message, flags in _WEIGHT_MISTAKES + _OUTPUT_MISTAKES],
        (mha_lens_on_keys, "read along the keys"),
        (mha_torch_mask, "the mask is inverted"),
        (_then(lambda out, w: (out, w.flatten(0, 1))), "folded layout (B*H, Q, K)"),
        (_then(lambda out, w: (out, w.mean(1))), "one map per head"),
        (_then(lambda out, w: out), "return a pair (output, weights)"),
        (_then(lambda out, w: (out, w + 1e-3)), "(weights): wrong values"),
        (_then(lambda out, w: (out + 1e-3, w)), "(output): wrong values"),
        (lambda net, q, k, v, lens=None, mask=None: net(q, k, v, lens, mask), "called net(...) itself"),
        (lambda net, *a: (MultiHeadAttention.forward(net, *a), net.attention_weights), "ran the package's attention"),
        (mha_via_fresh_module, "ran the package's attention"),
        (mha_via_sdpa, "calls F.scaled_dot_product_attention"),
        (mha_via_masked_softmax, "calls mha_tutorial.masked_softmax"),
        (mha_via_padding_mask, "calls mha_tutorial.padding_mask"),
        (mha_edits_weights, "changed net.W_o.weight"),
    ],
)
def test_mha_forward_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_mha_forward(wrong)
    assert words in str(info.value)
    net = MultiHeadAttention(8, 2)  # every refusal is undone afterwards: the package's layer works again
    x = torch.randn(1, 3, 8)
    assert net(x, x, x, torch.tensor([[1, 2, 3]]), mt.causal_mask(3)).shape == (1, 3, 8)
    assert mt.masked_softmax(torch.zeros(1, 2, 2), torch.tensor([1])).shape == (1, 2, 2)


def _stub(*args, **kwargs):
    raise NotImplementedError("write me")


@pytest.mark.parametrize("check", [check_mha_forward, check_head_off])
def test_a_stub_is_not_attempted_and_fails_in_strict_mode(check, capsys, monkeypatch):
    check(_stub)
    assert f"{check.__name__}: not attempted yet (write me)" in capsys.readouterr().out
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    with pytest.raises(CheckFailed, match="not attempted"):
        check(_stub)


def test_checks_that_seed_leave_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_mha_forward(mha_vectorised)
    check_head_off(off_right)
    assert torch.equal(torch.random.get_rng_state(), before)


# ------------------------------------------------ Exercise 3: switch a head off through W_v


def _off(net, h, *, weight="W_v", rows=True, bias="head", head=None):
    """A copy of net with head (head or h)'s block of ``weight`` zeroed: rows or columns; bias: "head", "none", "all"."""
    other, d = copy.deepcopy(net), net.head_size
    block = slice((h if head is None else head) * d, ((h if head is None else head) + 1) * d)
    layer = getattr(other, weight)
    with torch.no_grad():
        layer.weight[block if rows else (slice(None), block)] = 0
        if layer.bias is not None and bias != "none":
            layer.bias[block if bias == "head" else slice(None)] = 0
    return other


def off_right(net, h):
    return _off(net, h)


def off_loop(net, h):  # one number at a time
    other, d = copy.deepcopy(net), net.head_size
    with torch.no_grad():
        for i in range(h * d, (h + 1) * d):
            for j in range(other.W_v.in_features):
                other.W_v.weight[i, j] = 0.0
            if other.W_v.bias is not None:
                other.W_v.bias[i] = 0.0
    return other


@pytest.mark.parametrize("right", [off_right, off_loop])
def test_head_off_accepts_right_answers_equal_to_the_sum_of_the_other_heads(right, capsys):
    check_head_off(right)
    assert "✓ check_head_off: passed on 3 cases" in capsys.readouterr().out
    net, h, d = MultiHeadAttention(16, 4, bias=True).eval(), 2, 4  # the premise, without head_mask:
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        heads = mt.transpose_output(net.attention(*(mt.transpose_qkv(W(x), 4) for W in (net.W_q, net.W_k, net.W_v))), 4)
        kept = sum(
            heads[..., j * d : (j + 1) * d] @ net.W_o.weight[:, j * d : (j + 1) * d].T for j in range(4) if j != h
        )
        assert torch.allclose(right(net, h)(x, x, x), kept + net.W_o.bias, atol=1e-5)


def _biased_only(wrong):  # right on the bias-free net, wrong on the biased one
    return lambda net, h: wrong(net, h) if net.W_v.bias is not None else off_right(net, h)


def off_in_place(net, h):
    with torch.no_grad():
        net.W_v.weight[h * net.head_size : (h + 1) * net.head_size] = 0
    return net


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_biased_only(lambda net, h: _off(net, h, bias="none")), "bias=True, head h=1: zeroed W_v's weight rows of head h only, not its bias"),
        (lambda net, h: _off(net, h, rows=False), "zeroed columns of W_v.weight"),
        (_biased_only(lambda net, h: _off(net, h, bias="all")), "zeroed all of W_v's bias"),
        (lambda net, h: _off(net, h, weight="W_q"), "bias=False, head h=0: zeroed W_q's rows of head h"),
        (_biased_only(lambda net, h: _off(net, h, weight="W_q", bias="none")), "bias=True, head h=1: zeroed W_q's weight rows only"),
        (lambda net, h: _off(net, h, weight="W_k", bias="none"), "(or W_k's: the same effect)"),
        (lambda net, h: _off(net, h, head=(h + 1) % net.num_heads), "switched off head 1 instead of head 0"),
        (_biased_only(lambda net, h: _off(net, h, head=(h + 1) % net.num_heads)), "switched off head 2 instead of head 1"),
        (lambda net, h: copy.deepcopy(net), "nothing was switched off"),
        (lambda net, h: net, "nothing was switched off"),
        (off_in_place, "in place"),
        (lambda net, h: _off(net, h, weight="W_o", rows=False), "W_o.weight was changed"),
        (lambda net, h: _off(net, h)(torch.ones(1, 2, net.num_hiddens), torch.ones(1, 2, net.num_hiddens), torch.ones(1, 2, net.num_hiddens)), "you returned a tensor"),
        (lambda net, h: net.W_v, "a MultiHeadAttention"),
    ],
)  # fmt: skip
def test_head_off_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_head_off(wrong)
    assert words in str(info.value)


# ------------------------------------------------ parameter counts (check_num_params; Exercise 2's check_torch_mha_params)


def params_right(num_hiddens, num_heads, bias, query_size=None, key_size=None, value_size=None):
    q, k, v = (s or num_hiddens for s in (query_size, key_size, value_size))
    return num_hiddens * (q + k + v + num_hiddens) + (4 * num_hiddens if bias else 0)


def test_num_params_accepts_right_answer(capsys):
    check_num_params(params_right)
    check_num_params(lambda *a, **kw: torch.tensor(params_right(*a, **kw)))  # a 0-d integer tensor is fine
    assert "passed on 5 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda D, H, bias, **kw: params_right(D, H, False, **kw), "forgot the bias vectors"),
        (lambda D, H, bias, **kw: params_right(D, H, False, **kw) + 4 * D, "with bias=False the projections have none"),
        (lambda D, H, bias, **kw: params_right(D, H, bias, **kw) - D * D - (D if bias else 0), "forgot W_o"),
        (lambda D, H, bias, **kw: 4 * H * (D // H) ** 2 + (4 * D if bias else 0), "d x d block per head"),
        (lambda D, H, bias, **kw: 4 * D * D + (4 * D if bias else 0), "ignored query_size"),
        (lambda D, H, bias, **kw: float(params_right(D, H, bias, **kw)), "as an int"),
        (lambda D, H, bias, **kw: params_right(D, H, bias, **kw) + 1, "got"),
    ],
)
def test_num_params_names_mistakes(wrong, words):
    def fn(num_hiddens, num_heads, bias, **kw):
        return wrong(num_hiddens, num_heads, bias, **kw)

    with pytest.raises(CheckFailed) as info:
        check_num_params(fn)
    assert words in str(info.value)


def params_by_building(num_hiddens, num_heads, bias, query_size=None, key_size=None, value_size=None):
    net = MultiHeadAttention(num_hiddens, num_heads, bias=bias, query_size=query_size, key_size=key_size,
                             value_size=value_size)  # fmt: skip
    return sum(p.numel() for p in net.parameters())


def test_num_params_refuses_building_the_module():
    with pytest.raises(CheckFailed) as info:
        check_num_params(params_by_building)
    assert "built a module" in str(info.value)
    assert isinstance(torch.nn.Linear(2, 2), torch.nn.Module)  # the refusal is undone afterwards


def torch_params_right(embed_dim, num_heads, bias=True, add_bias_kv=False, kdim=None, vdim=None):
    E, k, v = embed_dim, kdim or embed_dim, vdim or embed_dim
    return E * (E + k + v) + E * E + (4 * E if bias else 0) + (2 * E if add_bias_kv else 0)


def test_torch_mha_params_reference_matches_pytorch_on_buildable_sizes():
    from mha_tutorial.checks.nb04 import _TORCH_PARAM_CASES, _torch_mha_count

    for kwargs in _TORCH_PARAM_CASES:
        if kwargs["embed_dim"] > 64:
            continue
        built = torch.nn.MultiheadAttention(**kwargs)
        assert _torch_mha_count(**kwargs) == sum(p.numel() for p in built.parameters()), kwargs


def test_torch_mha_params_accepts_right_answer(capsys):
    check_torch_mha_params(torch_params_right)
    assert "✓ check_torch_mha_params: passed on 6 cases" in capsys.readouterr().out


def torch_params_by_building(embed_dim, num_heads, bias=True, add_bias_kv=False, kdim=None, vdim=None):
    layer = torch.nn.MultiheadAttention(embed_dim, num_heads, bias=bias, add_bias_kv=add_bias_kv, kdim=kdim, vdim=vdim,
                                        device="meta")  # fmt: skip
    return sum(p.numel() for p in layer.parameters())


def _torch_wrong(change):
    def fn(embed_dim, num_heads, bias=True, add_bias_kv=False, kdim=None, vdim=None):
        return change(embed_dim, num_heads, bias, add_bias_kv, kdim or embed_dim, vdim or embed_dim)

    return fn


@pytest.mark.parametrize(
    "wrong, words",
    [
        (torch_params_by_building, "built a module"),
        (_torch_wrong(lambda E, H, b, x, k, v: torch_params_right(E, H, b, False, k, v)), "forgot bias_k and bias_v"),
        (
            _torch_wrong(lambda E, H, b, x, k, v: torch_params_right(E, H, b, False, k, v) + (k + v if x else 0)),
            "embed_dim numbers, not kdim",
        ),  # fmt: skip
        (_torch_wrong(lambda E, H, b, x, k, v: torch_params_right(E, H, True, x, k, v)), "with bias=False"),
        (_torch_wrong(lambda E, H, b, x, k, v: torch_params_right(E, H, False, x, k, v)), "forgot the biases"),
        (
            _torch_wrong(lambda E, H, b, x, k, v: torch_params_right(E, H, b, x, k, v) - (E if b else 0)),
            "forgot out_proj.bias",
        ),  # fmt: skip
        (_torch_wrong(lambda E, H, b, x, k, v: torch_params_right(E, H, b, x, E, E)), "ignored kdim / vdim"),
        (_torch_wrong(lambda E, H, b, x, k, v: torch_params_right(E, H, b, x, k, v) - E * E), "forgot out_proj"),
        (
            _torch_wrong(lambda E, H, b, x, k, v: 4 * H * (E // H) ** 2 + (4 * E if b else 0) + (2 * E if x else 0)),
            "d x d block per head",
        ),
        (_torch_wrong(lambda E, H, b, x, k, v: float(torch_params_right(E, H, b, x, k, v))), "as an int"),
        (_torch_wrong(lambda E, H, b, x, k, v: torch_params_right(E, H, b, x, k, v) + 1), "got"),
    ],
)
def test_torch_mha_params_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_torch_mha_params(wrong)
    assert words in str(info.value)


# ------------------------------------------------ notebook 04a: predict the peak memory before measuring


def peak_right(batch, heads, seq):
    return 3 * 4 * batch * heads * seq**2 / 2**20  # three (B, H, T, T) float32 tensors


def peak_by_measuring(batch, heads, seq):
    from mha_tutorial.checks.nb04 import measured_peak_mib

    return measured_peak_mib(batch, heads, seq)


def peak_read_off_the_table(batch, heads, seq):  # section 2's 98.02 MiB over its 32 MiB tensor, scaled
    return 98.02 / 32 * 4 * batch * heads * seq**2 / 2**20


def test_peak_prediction_accepts_the_three_tensor_estimate(capsys):
    check_peak_prediction(peak_right)
    assert "✓ check_peak_prediction: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda B, H, T: peak_right(B, H, T) / 3, "counted one"),
        (lambda B, H, T: peak_right(B, H, T) * 2 / 3, "counted two"),
        (lambda B, H, T: peak_right(B, H, T) * 4 / 3, "counted four"),
        (lambda B, H, T: peak_right(B, H, T) * 2**20 / 10**6, "that is MB"),
        (lambda B, H, T: peak_right(B, H, T) / B, "batch is missing"),
        (lambda B, H, T: peak_right(B, H, T) / T, "seq, not seq squared"),
        (peak_read_off_the_table, "3.06 (batch, heads, seq, seq) tensors' worth"),
        (lambda B, H, T: peak_right(B, H, T) * 2**20, "that is bytes"),
        (lambda B, H, T: peak_right(B, H, T) * 2, "8 bytes per number"),
        (lambda B, H, T: peak_right(B, H, T) / H, "heads are missing"),
        (lambda B, H, T: peak_right(B, H, T) * 1.5, "more than 12% apart"),
        (lambda B, H, T: str(peak_right(B, H, T)), "return a number"),
        (peak_by_measuring, "measured the peak instead of predicting"),
    ],
)
def test_peak_prediction_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_peak_prediction(wrong)
    assert words in str(info.value)
