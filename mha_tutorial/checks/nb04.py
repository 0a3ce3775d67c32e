"""Checks for the exercises of notebook 04 (multi-head attention).

The forward check compares the learner's function with ``MultiHeadAttention``
itself and, when they differ, with a small set of deliberately broken
variants (no W_o, no scale, heads concatenated in the wrong order, ``repeat``
instead of ``repeat_interleave``, ...) so that it can name the mistake.
"""

from __future__ import annotations

import copy
import math
import numbers
from dataclasses import dataclass

import torch

from ..attention import masked_softmax
from ..masks import padding_mask
from ..mha import MultiHeadAttention
from ._common import CheckFailed, call, expect_close, expect_shape, expect_tensor, friendly, passed

__all__ = ["check_mha_forward", "check_num_params", "check_head_off"]


class _NoForward(MultiHeadAttention):
    """A MultiHeadAttention that refuses to be called: the exercise is to use its four Linear layers."""

    def forward(self, *args, **kwargs):
        raise CheckFailed(
            "your function called net(...) itself; the exercise is to compute the output from "
            "net.W_q, net.W_k, net.W_v and net.W_o"
        )


@dataclass(frozen=True)
class _Switches:
    """The mistakes ``_variant`` can make; the defaults make none."""

    scale: str | None = "head"  # "head": 1/sqrt(d); "model": 1/sqrt(num_hiddens); None: no scale
    use_wo: bool = True  # the concatenated heads go through W_o
    concat: str = "blocks"  # "blocks" (right), "interleaved" (merged as (d, H)) or "reversed" (last head first)
    lens: str = "interleave"  # valid_lens per example ("interleave"), tiled with repeat ("repeat") or "ignore"d
    split: bool = True  # False: one head over all num_hiddens features
    softmax_dim: int = -1  # the axis the softmax normalises (-1: the keys)


def _variant(net, queries, keys, values, valid_lens=None, **switches):
    """Multi-head attention with switchable mistakes (the fields of ``_Switches``); the defaults give the right
    answer.

    Written on (B, H, T, d) tensors, independently of ``transpose_qkv``.
    """
    m = _Switches(**switches)
    H = net.num_heads if m.split else 1
    d = net.num_hiddens // H

    def heads(x):  # (B, T, D) -> (B, H, T, d)
        return x.unflatten(-1, (H, d)).transpose(1, 2)

    q, k, v = heads(net.W_q(queries)), heads(net.W_k(keys)), heads(net.W_v(values))
    out = _variant_weights(q, k, valid_lens, m) @ v  # (B, H, Q, d)
    if m.concat == "blocks":
        cat = out.transpose(1, 2).flatten(2)  # (B, Q, H*d), head h in features h*d .. (h+1)*d - 1
    elif m.concat == "interleaved":
        cat = out.permute(0, 2, 3, 1).flatten(2)  # (B, Q, d*H): feature j of every head, then j+1, ...
    else:  # "reversed"
        cat = out.flip(1).transpose(1, 2).flatten(2)
    return net.W_o(cat) if m.use_wo else cat


def _variant_weights(q, k, valid_lens, m: _Switches):
    """The attention weights (B, H, Q, K) of ``q`` (B, H, Q, d) over ``k`` (B, H, K, d), with ``m``'s mistakes."""
    B, H, _, d = q.shape
    num_keys = k.shape[2]
    scores = q @ k.transpose(-2, -1)  # (B, H, Q, K)
    if m.scale == "head":
        scores = scores / math.sqrt(d)
    elif m.scale == "model":
        scores = scores / math.sqrt(H * d)  # H * d = num_hiddens
    keep = None
    if valid_lens is not None and m.lens != "ignore":
        if m.lens == "interleave":
            keep = padding_mask(valid_lens, num_keys)[:, None]  # (B, 1, 1, K)
        else:  # "repeat": row b*H + h of the folded batch wrongly gets valid_lens[(b*H + h) mod B]
            tiled = valid_lens.repeat(H)  # (B*H,)
            keep = padding_mask(tiled, num_keys).view(B, H, 1, num_keys)
    if m.softmax_dim == -1:
        return masked_softmax(scores, mask=keep)
    if keep is not None:
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=m.softmax_dim)


_MISTAKES = [
    ("forgot the output projection: the concatenated heads must go through W_o", dict(use_wo=False)),
    ("forgot the 1/sqrt(d) scale on the scores", dict(scale=None)),
    (
        "scaled by 1/sqrt(num_hiddens); the scale uses the size of one head, d = num_hiddens / num_heads",
        dict(scale="model"),
    ),
    (
        "heads concatenated in the wrong order: their features come out interleaved (merged as (d, H)); "
        "head h must fill features h*d .. (h+1)*d - 1 before W_o",
        dict(concat="interleaved"),
    ),
    (
        "heads concatenated in the wrong order (last head first); head h must fill features h*d .. (h+1)*d - 1",
        dict(concat="reversed"),
    ),
    (
        "looks like `repeat` instead of `repeat_interleave` for valid_lens: row b*H + h of the folded "
        "batch belongs to example b, so each length must be repeated H times in place",
        dict(lens="repeat"),
    ),
    ("valid_lens is ignored: padded keys still receive attention weight", dict(lens="ignore")),
    (
        "the features were never split into heads: this is single-head attention over all num_hiddens features",
        dict(split=False, scale="model"),
    ),
    (
        "softmax over the wrong axis: the weights must sum to 1 over the keys (dim=-1), not the queries",
        dict(softmax_dim=-2),
    ),
]


def _forward_cases():
    """(net, queries, keys, values, valid_lens, description), seeded."""
    g = torch.Generator().manual_seed(4)
    cases = []
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        torch.manual_seed(40)
        net = _NoForward(16, 4, bias=False).eval()
        X = torch.randn(2, 5, 16, generator=g)
        cases.append((net, X, X, X, None, "self-attention, num_hiddens=16, 4 heads, no valid_lens"))
        cases.append((net, X, X, X, torch.tensor([2, 5]), "self-attention, num_hiddens=16, 4 heads, valid_lens=[2, 5]"))
        net = _NoForward(12, 3, bias=True, query_size=6, key_size=10, value_size=7).eval()
        q, k, v = (
            torch.randn(2, 3, 6, generator=g),
            torch.randn(2, 5, 10, generator=g),
            torch.randn(2, 5, 7, generator=g),
        )
        cases.append(
            (
                net,
                q,
                k,
                v,
                torch.tensor([4, 1]),
                "cross-attention with bias, 3 heads, query/key/value sizes 6/10/7, valid_lens=[4, 1]",
            )
        )
    return cases


@friendly
def check_mha_forward(fn) -> None:
    """``fn(net, queries, keys, values, valid_lens=None)`` -> (B, Q, num_hiddens), as ``net`` would give."""
    cases = _forward_cases()
    for net, q, k, v, valid_lens, case in cases:
        before = {name: p.detach().clone() for name, p in net.state_dict().items()}
        with torch.no_grad():
            expected = MultiHeadAttention.forward(net, q, k, v, valid_lens)  # the package's reference
            args = (net, q.clone(), k.clone(), v.clone())
            actual = (
                call(fn, *args, case=case) if valid_lens is None else call(fn, *args, valid_lens.clone(), case=case)
            )
        for name, p in net.state_dict().items():
            if not torch.equal(p, before[name]):
                raise CheckFailed(f"{case}: your function changed net.{name}; it must only read the weights")
        actual = expect_tensor(actual, case).detach().cpu()
        expect_shape(actual, expected.shape, case)
        if torch.allclose(actual, expected, atol=1e-5, rtol=1e-5):
            continue
        with torch.no_grad():
            for message, flags in _MISTAKES:
                if flags.get("lens") and valid_lens is None:
                    continue
                wrong = _variant(net, q, k, v, valid_lens, **flags)
                if wrong.shape == actual.shape and torch.allclose(actual, wrong, atol=1e-5, rtol=1e-5):
                    raise CheckFailed(f"{case}: {message}")
        expect_close(actual, expected, case)
    passed("check_mha_forward", len(cases))


_PARAM_CASES = [
    dict(num_hiddens=64, num_heads=8, bias=False),
    dict(num_hiddens=64, num_heads=8, bias=True),
    dict(num_hiddens=100, num_heads=5, bias=True),
    dict(num_hiddens=32, num_heads=4, bias=False, query_size=16, key_size=24, value_size=8),
    dict(num_hiddens=32, num_heads=4, bias=True, query_size=16, key_size=24, value_size=8),
]


def _describe(kwargs) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


@friendly
def check_num_params(fn) -> None:
    """``fn(num_hiddens, num_heads, bias, query_size=None, key_size=None, value_size=None)`` -> int."""
    for kwargs in _PARAM_CASES:
        case = _describe(kwargs)
        actual = call(fn, case=case, **kwargs)
        if isinstance(actual, torch.Tensor) and actual.numel() == 1 and not actual.is_floating_point():
            actual = actual.item()
        if isinstance(actual, bool) or not isinstance(actual, numbers.Integral):
            raise CheckFailed(f"{case}: return the count as an int, got {actual!r} ({type(actual).__name__})")
        net = MultiHeadAttention(**kwargs)
        expected = sum(p.numel() for p in net.parameters())
        if actual == expected:
            continue
        D, H, bias = kwargs["num_hiddens"], kwargs["num_heads"], kwargs["bias"]
        q = kwargs.get("query_size") or D
        k = kwargs.get("key_size") or D
        v = kwargs.get("value_size") or D
        weights = D * (q + k + v) + D * D
        biases = 4 * D if bias else 0
        candidates = [
            ("counted the four bias vectors, but with bias=False the projections have none", weights + 4 * D, not bias),
            (
                "forgot the bias vectors: with bias=True each of the four projections adds num_hiddens numbers",
                weights,
                bias,
            ),
            ("one bias vector short: all four projections (W_q, W_k, W_v and W_o) have a bias", weights + 3 * D, bias),
            (
                "forgot W_o: the output projection adds num_hiddens * num_hiddens weights"
                + (" (+ num_hiddens biases)" if bias else ""),
                D * (q + k + v) + (3 * D if bias else 0),
                True,
            ),
            (
                "counted only a d x d block per head (4 * H * d * d); each head's projection reads all of "
                "its input features, so W_q alone is (query_size x num_hiddens)",
                4 * H * (D // H) ** 2 + biases,
                True,
            ),
            (
                "ignored query_size / key_size / value_size: W_q, W_k and W_v read inputs of those sizes, "
                "not num_hiddens",
                4 * D * D + biases,
                (q, k, v) != (D, D, D),
            ),
        ]
        for message, wrong, applies in candidates:
            if applies and actual == wrong:
                raise CheckFailed(f"{case}: got {actual}, expected {expected}: {message}")
        raise CheckFailed(f"{case}: got {actual}, expected {expected} (the sum of p.numel() over net.parameters())")
    passed("check_num_params", len(_PARAM_CASES))


class _NoHeadMask(MultiHeadAttention):
    """A MultiHeadAttention that refuses ``head_mask``: the exercise is to get the same effect from the weights."""

    def forward(self, queries, keys, values, valid_lens=None, mask=None, head_mask=None, **kwargs):
        if head_mask is not None:
            raise CheckFailed("solve it without head_mask: change the weights of a copy of the net instead")
        return super().forward(queries, keys, values, valid_lens, mask, **kwargs)


def _off_by_weights(net, X, h, zero):
    """Run a copy of ``net`` on X after ``zero(copy, cols)`` edits its weights (cols = head h's block)."""
    other = copy.deepcopy(net)
    cols = slice(h * net.head_size, (h + 1) * net.head_size)
    with torch.no_grad():
        zero(other, cols)
    return MultiHeadAttention.forward(other, X, X, X)


def _zero_rows_of_wo(m, cols):
    m.W_o.weight[cols] = 0


def _zero_cols_and_bias_of_wo(m, cols):
    m.W_o.weight[:, cols] = 0
    m.W_o.bias.zero_()


def _zero_wq_rows(m, cols):
    m.W_q.weight[cols] = 0
    if m.W_q.bias is not None:
        m.W_q.bias[cols] = 0


def _zero_wv_rows_not_bias(m, cols):
    m.W_v.weight[cols] = 0


def _head_off_mistakes(net, X, h):
    """(message, what that mistake computes) for the ways of switching head ``h`` of ``net`` off wrongly."""
    candidates = [
        ("nothing was switched off: this is the output with all heads on", MultiHeadAttention.forward(net, X, X, X)),
        (
            "zeroed rows of W_o.weight: nn.Linear stores its weight as (out_features, in_features), so "
            "head h's part of the concatenation is the columns W_o.weight[:, h*d:(h+1)*d]",
            _off_by_weights(net, X, h, _zero_rows_of_wo),
        ),
        (
            "zeroing W_q's rows of head h only makes that head attend uniformly: it still adds the "
            "average of its values; zero its contribution (W_o's columns, or W_v's rows and bias) instead",
            _off_by_weights(net, X, h, _zero_wq_rows),
        ),
    ]
    if net.W_o.bias is not None:
        candidates.append(
            (
                "zeroed W_o's bias as well: the bias belongs to no head, switching one head off leaves it",
                _off_by_weights(net, X, h, _zero_cols_and_bias_of_wo),
            )
        )
        candidates.append(
            (
                "zeroed W_v's weight rows for head h but not its bias: the head still passes on the bias",
                _off_by_weights(net, X, h, _zero_wv_rows_not_bias),
            )
        )
    for j in range(net.num_heads):
        if j != h:
            gates = torch.ones(net.num_heads)
            gates[j] = 0
            candidates.append(
                (
                    f"switched off head {j} instead of head {h}: head h owns features h*d .. (h+1)*d - 1 "
                    f"with d = num_hiddens / num_heads = {net.head_size}",
                    MultiHeadAttention.forward(net, X, X, X, head_mask=gates),
                )
            )
    return candidates


@friendly
def check_head_off(fn) -> None:
    """``fn(net, X, h)`` -> self-attention output of ``net`` on X with head h switched off, without head_mask."""
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        torch.manual_seed(41)
        nets = [_NoHeadMask(16, 4, bias=True).eval(), _NoHeadMask(12, 3, bias=False).eval()]
        g = torch.Generator().manual_seed(5)
        inputs = [torch.randn(2, 5, 16, generator=g), torch.randn(2, 4, 12, generator=g)]
    cases = [(nets[0], inputs[0], 1), (nets[0], inputs[0], 3), (nets[1], inputs[1], 0)]
    for net, X, h in cases:
        H = net.num_heads
        case = f"num_hiddens={net.num_hiddens}, {H} heads, bias={net.W_o.bias is not None}, head h={h}"
        before = {name: p.detach().clone() for name, p in net.state_dict().items()}
        with torch.no_grad():
            gates = torch.ones(H)
            gates[h] = 0
            expected = MultiHeadAttention.forward(net, X, X, X, head_mask=gates)
            actual = call(fn, net, X.clone(), h, case=case)
        for name, p in net.state_dict().items():
            if not torch.equal(p, before[name]):
                raise CheckFailed(
                    f"{case}: your function changed net.{name} in place; edit a copy (copy.deepcopy(net)) "
                    f"so that the original net keeps all its heads"
                )
        actual = expect_tensor(actual, case).detach().cpu()
        expect_shape(actual, expected.shape, case)
        if torch.allclose(actual, expected, atol=1e-5, rtol=1e-5):
            continue
        with torch.no_grad():
            for message, wrong in _head_off_mistakes(net, X, h):
                if torch.allclose(actual, wrong, atol=1e-5, rtol=1e-5):
                    raise CheckFailed(f"{case}: {message}")
        expect_close(actual, expected, case)
    passed("check_head_off", len(cases))
