"""The exercise checks of notebook 04 accept right answers and reject typical wrong ones by name."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mha_tutorial import MultiHeadAttention, scaled_dot_product_attention, transpose_output, transpose_qkv
from mha_tutorial.checks import (
    CheckFailed,
    check_head_off,
    check_mha_forward,
    check_num_params,
    check_peak_prediction,
    check_torch_mha_params,
)
from mha_tutorial.checks.nb04 import _forward_cases, _variant
from mha_tutorial.core.attention import masked_softmax


def mha_right(net, queries, keys, values, valid_lens=None):
    H = net.num_heads
    q, k, v = (transpose_qkv(W(x), H) for W, x in ((net.W_q, queries), (net.W_k, keys), (net.W_v, values)))
    if valid_lens is not None:
        valid_lens = torch.repeat_interleave(valid_lens, H, dim=0)
    out, _ = scaled_dot_product_attention(q, k, v, valid_lens)
    return net.W_o(transpose_output(out, H))


def test_variant_defaults_match_the_package():
    for net, q, k, v, valid_lens, _ in _forward_cases():
        with torch.no_grad():
            assert torch.allclose(
                _variant(net, q, k, v, valid_lens), MultiHeadAttention.forward(net, q, k, v, valid_lens), atol=1e-6
            )


def test_every_named_forward_mistake_differs_from_the_right_answer():
    """Otherwise a mistake could be 'recognised' in an answer that is in fact right."""
    from mha_tutorial.checks.nb04 import _MISTAKES

    for net, q, k, v, valid_lens, _ in _forward_cases():
        with torch.no_grad():
            right = _variant(net, q, k, v, valid_lens)
            for message, flags in _MISTAKES:
                if flags.get("lens") and valid_lens is None:
                    continue
                assert not torch.allclose(right, _variant(net, q, k, v, valid_lens, **flags), atol=1e-5), message


def test_mha_forward_accepts_right_answer(capsys):
    check_mha_forward(mha_right)
    assert "✓ check_mha_forward: passed on 3 cases" in capsys.readouterr().out


def mha_no_scale(net, queries, keys, values, valid_lens=None):
    H, d = net.num_heads, net.head_size
    q, k, v = (transpose_qkv(W(x), H) for W, x in ((net.W_q, queries), (net.W_k, keys), (net.W_v, values)))
    if valid_lens is not None:
        valid_lens = torch.repeat_interleave(valid_lens, H, dim=0)
    out, _ = scaled_dot_product_attention(q * math.sqrt(d), k, v, valid_lens)  # undoes the 1/sqrt(d)
    return net.W_o(transpose_output(out, H))


def mha_repeat(net, queries, keys, values, valid_lens=None):
    H = net.num_heads
    q, k, v = (transpose_qkv(W(x), H) for W, x in ((net.W_q, queries), (net.W_k, keys), (net.W_v, values)))
    if valid_lens is not None:
        valid_lens = valid_lens.repeat(H)
    out, _ = scaled_dot_product_attention(q, k, v, valid_lens)
    return net.W_o(transpose_output(out, H))


def mha_merged_by_reshape(net, q, k, v, valid_lens=None):  # notebook 03's classic slip
    H, d = net.num_heads, net.head_size
    q, k, v = (W(x).unflatten(-1, (H, d)).transpose(1, 2) for W, x in ((net.W_q, q), (net.W_k, k), (net.W_v, v)))
    out = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(d), valid_lens) @ v  # (B, H, Q, d)
    return net.W_o(out.reshape(out.shape[0], out.shape[2], -1))  # no transpose back to (B, Q, H, d)


def mha_edits_weights(net, queries, keys, values, valid_lens=None):
    with torch.no_grad():
        net.W_o.weight.mul_(1.0001)
    return mha_right(net, queries, keys, values, valid_lens)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda net, q, k, v, vl=None: _variant(net, q, k, v, vl, use_wo=False), "forgot the output projection"),
        (mha_no_scale, "forgot the 1/sqrt(d) scale"),
        (mha_repeat, "`repeat` instead of `repeat_interleave`"),
        (lambda net, q, k, v, vl=None: _variant(net, q, k, v, vl, concat="interleaved"), "wrong order"),
        (mha_merged_by_reshape, "merged without the transpose"),
        (lambda net, q, k, v, vl=None: _variant(net, q, k, v, vl, concat="reversed"), "last head first"),
        (lambda net, q, k, v, vl=None: _variant(net, q, k, v, vl, scale="model"), "1/sqrt(num_hiddens)"),
        (lambda net, q, k, v, vl=None: _variant(net, q, k, v, None), "valid_lens is ignored"),
        (lambda net, q, k, v, vl=None: _variant(net, q, k, v, vl, split=False, scale="model"), "never split"),
        (lambda net, q, k, v, vl=None: _variant(net, q, k, v, vl, softmax_dim=-2), "wrong axis"),
        (lambda net, q, k, v, vl=None: net(q, k, v, vl), "called net(...) itself"),
        (mha_edits_weights, "changed net.W_o.weight"),
        (lambda net, q, k, v, vl=None: mha_right(net, q, k, v, vl) + 1e-3, "wrong values"),
    ],
)
def test_mha_forward_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_mha_forward(wrong)
    assert words in str(info.value)


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


def off_right(net, X, h):
    other = copy.deepcopy(net)
    d = net.head_size
    with torch.no_grad():
        other.W_o.weight[:, h * d : (h + 1) * d] = 0
    return other(X, X, X)


def off_via_values(net, X, h):
    other = copy.deepcopy(net)
    d = net.head_size
    with torch.no_grad():
        other.W_v.weight[h * d : (h + 1) * d] = 0
        if other.W_v.bias is not None:
            other.W_v.bias[h * d : (h + 1) * d] = 0
    return other(X, X, X)


def test_head_off_accepts_right_answers(capsys):
    check_head_off(off_right)
    check_head_off(off_via_values)
    assert "passed on 3 cases" in capsys.readouterr().out


def off_rows(net, X, h):
    other = copy.deepcopy(net)
    d = net.head_size
    with torch.no_grad():
        other.W_o.weight[h * d : (h + 1) * d] = 0
    return other(X, X, X)


def off_in_place(net, X, h):
    d = net.head_size
    with torch.no_grad():
        net.W_o.weight[:, h * d : (h + 1) * d] = 0
    return net(X, X, X)


def off_with_head_mask(net, X, h):
    gates = torch.ones(net.num_heads)
    gates[h] = 0
    return net(X, X, X, head_mask=gates)


def off_queries(net, X, h, with_bias=True):
    other = copy.deepcopy(net)
    d = net.head_size
    with torch.no_grad():
        other.W_q.weight[h * d : (h + 1) * d] = 0
        if with_bias and other.W_q.bias is not None:
            other.W_q.bias[h * d : (h + 1) * d] = 0
    return other(X, X, X)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (off_rows, "zeroed rows of W_o.weight"),
        (off_in_place, "in place"),
        (lambda net, X, h: off_right(net, X, (h + 1) % net.num_heads), "instead of head"),
        (off_with_head_mask, "without head_mask"),
        (off_queries, "attend uniformly"),
        (lambda net, X, h: off_queries(net, X, h, with_bias=False), "W_q's weight rows of head h but not its bias"),
        (lambda net, X, h: net(X, X, X), "nothing was switched off"),
    ],
)
def test_head_off_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_head_off(wrong)
    assert words in str(info.value)


def test_checks_that_seed_leave_the_global_rng_alone(capsys):
    # check_mha_forward builds its modules under torch.manual_seed(40) inside torch.random.fork_rng.
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_mha_forward(mha_right)
    assert torch.equal(torch.random.get_rng_state(), before)


# ------------------------------------------------ gaming attempts: the package's own implementation is refused


def mha_via_class_forward(net, queries, keys, values, valid_lens=None):
    return MultiHeadAttention.forward(net, queries, keys, values, valid_lens)  # skips _NoForward.forward


def mha_via_fresh_module(net, queries, keys, values, valid_lens=None):
    sizes = dict(query_size=net.W_q.in_features, key_size=net.W_k.in_features, value_size=net.W_v.in_features)
    fresh = MultiHeadAttention(net.num_hiddens, net.num_heads, bias=net.W_o.bias is not None, **sizes)
    fresh.load_state_dict(net.state_dict())
    return fresh(queries, keys, values, valid_lens)


def mha_via_inner_attention(net, queries, keys, values, valid_lens=None):
    H = net.num_heads
    q, k, v = (transpose_qkv(W(x), H) for W, x in ((net.W_q, queries), (net.W_k, keys), (net.W_v, values)))
    if valid_lens is not None:
        valid_lens = torch.repeat_interleave(valid_lens, H, dim=0)
    return net.W_o(transpose_output(net.attention(q, k, v, valid_lens), H))


@pytest.mark.parametrize("gamed", [mha_via_class_forward, mha_via_fresh_module, mha_via_inner_attention])
def test_mha_forward_refuses_the_package_implementation(gamed):
    with pytest.raises(CheckFailed) as info:
        check_mha_forward(gamed)
    assert "ran the package's attention" in str(info.value)
    # the refusal is undone afterwards: the package's layer works again
    net = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    assert net(x, x, x).shape == (1, 3, 8)


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


def off_via_class_forward(net, X, h):
    gates = torch.ones(net.num_heads)
    gates[h] = 0
    return MultiHeadAttention.forward(net, X, X, X, head_mask=gates)  # skips _NoHeadMask.forward


def off_via_positional_head_mask(net, X, h):
    gates = torch.ones(net.num_heads)
    gates[h] = 0
    return MultiHeadAttention.forward(net, X, X, X, None, None, gates)


@pytest.mark.parametrize("gamed", [off_via_class_forward, off_via_positional_head_mask])
def test_head_off_refuses_head_mask_however_called(gamed):
    with pytest.raises(CheckFailed) as info:
        check_head_off(gamed)
    assert "without head_mask" in str(info.value)
