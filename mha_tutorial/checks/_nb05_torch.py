"""The check of notebook 05a's exercise: our attention as ``nn.MultiheadAttention`` (re-exported by ``nb05``).

The learner copies the weights of our ``MultiHeadAttention`` into PyTorch's layer; the check compares the outputs
and, when they differ, names the typical mistake (keys and values swapped, biases forgotten).
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.masks import padding_mask
from ..core.mha import MultiHeadAttention
from ._common import CheckFailed, call, expect_shape, friendly, passed
from ._nb04_guards import _refusing


def _to_torch(ours, swap_kv=False, in_bias=True, out_bias=True, batch_first=True):
    """``ours`` copied into ``nn.MultiheadAttention``; the switches make the mistakes the check names."""
    bias = ours.W_q.bias is not None
    layer = nn.MultiheadAttention(
        ours.num_hiddens,
        ours.num_heads,
        bias=bias,
        kdim=ours.W_k.in_features,
        vdim=ours.W_v.in_features,
        batch_first=batch_first,
    )
    W_k, W_v = (ours.W_v, ours.W_k) if swap_kv else (ours.W_k, ours.W_v)
    with torch.no_grad():
        if layer.in_proj_weight is not None:
            layer.in_proj_weight.copy_(torch.cat([ours.W_q.weight, W_k.weight, W_v.weight]))
        else:
            layer.q_proj_weight.copy_(ours.W_q.weight)
            layer.k_proj_weight.copy_(W_k.weight)
            layer.v_proj_weight.copy_(W_v.weight)
        layer.out_proj.weight.copy_(ours.W_o.weight)
        if bias:
            layer.in_proj_bias.copy_(torch.cat([ours.W_q.bias, W_k.bias, W_v.bias]) if in_bias else 0)
            layer.out_proj.bias.copy_(ours.W_o.bias if out_bias else 0)
    return layer.eval()


def _torch_attention_cases():
    """(ours, queries, keys, values, valid_lens, description), seeded."""
    cases = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(50)
        for D, H, bias, k_size, v_size in [(16, 4, True, 10, 6), (16, 2, False, 12, 12), (12, 3, True, None, None)]:
            ours = MultiHeadAttention(D, H, bias=bias, key_size=k_size, value_size=v_size).eval()
            K, kw, vw = 5, k_size or D, v_size or D
            inputs = torch.randn(2, 4, D), torch.randn(2, K, kw), torch.randn(2, K, vw)
            describe = f"MultiHeadAttention({D}, {H}, bias={bias}, key_size={k_size}, value_size={v_size})"
            cases.append((ours, *inputs, torch.tensor([5, 3]), describe))
    return cases


def _torch_attention_output(layer, q, k, v, valid_lens):
    """``layer``'s output on batch-first inputs, with our padding lengths as PyTorch's key_padding_mask."""
    ignore = ~padding_mask(valid_lens, k.shape[1])[:, 0]  # (B, K), True = ignore
    if not layer.batch_first:
        out, _ = layer(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), key_padding_mask=ignore)
        return out.transpose(0, 1)
    out, _ = layer(q, k, v, key_padding_mask=ignore, need_weights=False)
    return out


def _expect_plain_torch_layer(layer, ours, before: dict, case: str) -> None:
    """``layer`` is a plain batch-first ``nn.MultiheadAttention``, and ``ours`` kept its weights."""
    for name, p in ours.state_dict().items():
        if not torch.equal(p, before[name]):
            raise CheckFailed(f"{case}: your function changed our layer's {name}; it must only read it")
    if type(layer) is not nn.MultiheadAttention:
        raise CheckFailed(f"{case}: return an nn.MultiheadAttention, got {type(layer).__name__}")
    if "forward" in vars(layer):
        raise CheckFailed(f"{case}: the layer's forward was replaced; copy the weights instead")
    if not layer.batch_first:
        raise CheckFailed(f"{case}: build it with batch_first=True: our tensors are (B, T, D)")


@friendly
def check_to_torch_attention(fn) -> None:
    """``fn(ours)`` -> an ``nn.MultiheadAttention`` (``batch_first=True``) that computes what ``ours`` computes."""

    def refusal():
        return _refusing(
            (MultiHeadAttention,),
            "forward",
            "the layer you returned runs our MultiHeadAttention; copy our weights into PyTorch's layer instead",
        )

    cases = _torch_attention_cases()
    for ours, q, k, v, valid_lens, case in cases:
        before = {name: p.detach().clone() for name, p in ours.state_dict().items()}
        with torch.no_grad():
            expected = ours(q, k, v, valid_lens)  # (B, Q, D)
        hint = (
            " (when kdim or vdim differs from embed_dim, nn.MultiheadAttention has no in_proj_weight: it keeps "
            "q_proj_weight, k_proj_weight and v_proj_weight)"
        )
        layer = call(fn, ours, case=case, hint=hint)
        _expect_plain_torch_layer(layer, ours, before, case)
        layer.eval()
        with torch.no_grad(), refusal():
            actual = call(_torch_attention_output, layer, q, k, v, valid_lens, case=case)
        expect_shape(actual, expected.shape, case)
        if torch.allclose(actual, expected, atol=1e-5, rtol=1e-5):
            continue
        bias = ours.W_q.bias is not None
        mistakes = [
            (
                "keys and values swapped: k_proj / the middle block of in_proj_weight is W_k, then W_v",
                dict(swap_kv=True),
            ),
            ("forgot the input biases: in_proj_bias is the three biases of W_q, W_k and W_v", dict(in_bias=False)),
            ("forgot out_proj.bias: it is W_o's bias", dict(out_bias=False)),
            ("forgot every bias: in_proj_bias and out_proj.bias", dict(in_bias=False, out_bias=False)),
        ]
        with torch.no_grad():
            for message, switches in mistakes:
                if not bias and "swap_kv" not in switches:
                    continue
                if "swap_kv" in switches and ours.W_k.in_features != ours.W_v.in_features:
                    continue  # keys and values of different widths cannot be swapped
                wrong = _torch_attention_output(_to_torch(ours, **switches), q, k, v, valid_lens)
                if torch.allclose(actual, wrong, atol=1e-5, rtol=1e-5):
                    raise CheckFailed(f"{case}: {message}")
        diff = (actual - expected).abs().max().item()
        raise CheckFailed(f"{case}: the outputs differ from our layer's by up to {diff:.3g}")
    passed("check_to_torch_attention", len(cases))
