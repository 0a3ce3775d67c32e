"""Checks of notebook 04's parameter-counting exercises (re-exported by ``nb04``).

The learner counts the parameters from the shapes alone: of our ``MultiHeadAttention`` (``check_num_params``) and
of ``nn.MultiheadAttention`` (``check_torch_mha_params``); when the count is wrong, each check tries a list of
typical miscounts to name the one that was made.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from ..core.mha import MultiHeadAttention
from ._common import CheckFailed, call, friendly, passed
from ._nb04_guards import _refusing


def _no_modules():
    return _refusing(
        (nn.Module,),
        "__init__",
        "your function built a module to count its parameters; count them from the shapes instead "
        "(some of the check's sizes are far too large to build)",
    )


_PARAM_CASES = [
    dict(num_hiddens=64, num_heads=8, bias=False),
    dict(num_hiddens=64, num_heads=8, bias=True),
    dict(num_hiddens=100, num_heads=5, bias=True),
    dict(num_hiddens=32, num_heads=4, bias=False, query_size=16, key_size=24, value_size=8),
    dict(num_hiddens=32, num_heads=4, bias=True, query_size=16, key_size=24, value_size=8),
]


def _describe(kwargs) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


def _as_int(actual, case: str) -> int:
    if isinstance(actual, torch.Tensor) and actual.numel() == 1 and not actual.is_floating_point():
        actual = actual.item()
    if isinstance(actual, bool) or not isinstance(actual, numbers.Integral):
        raise CheckFailed(f"{case}: return the count as an int, got {actual!r} ({type(actual).__name__})")
    return int(actual)


@friendly
def check_num_params(fn) -> None:
    """``fn(num_hiddens, num_heads, bias, query_size=None, key_size=None, value_size=None)`` -> int."""
    for kwargs in _PARAM_CASES:
        case = _describe(kwargs)
        with _no_modules():
            actual = call(fn, case=case, **kwargs)
        actual = _as_int(actual, case)
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


# nn.MultiheadAttention's options, including sizes far too large to build (2**20 features: 4 TiB of weights).
_TORCH_PARAM_CASES = [
    dict(embed_dim=16, num_heads=4),
    dict(embed_dim=16, num_heads=4, bias=False),
    dict(embed_dim=16, num_heads=4, kdim=20, vdim=24),
    dict(embed_dim=16, num_heads=4, bias=False, add_bias_kv=True),
    dict(embed_dim=2**20, num_heads=64, kdim=768, vdim=512, add_bias_kv=True),
    dict(embed_dim=2**20, num_heads=16, bias=False, kdim=2**20 + 1),
]


def _torch_mha_count(embed_dim, num_heads, bias=True, add_bias_kv=False, kdim=None, vdim=None) -> int:
    """The parameter count of ``nn.MultiheadAttention`` from its shapes (tested against the built layer)."""
    E, k, v = embed_dim, kdim or embed_dim, vdim or embed_dim
    return E * (E + k + v) + E * E + (4 * E if bias else 0) + (2 * E if add_bias_kv else 0)


@friendly
def check_torch_mha_params(fn) -> None:
    """``fn(embed_dim, num_heads, bias=True, add_bias_kv=False, kdim=None, vdim=None)`` -> int: the number of
    parameters of ``nn.MultiheadAttention`` with those arguments, without building it."""
    for kwargs in _TORCH_PARAM_CASES:
        case = "nn.MultiheadAttention(" + _describe(kwargs) + ")"
        with _no_modules():
            actual = call(fn, case=case, **kwargs)
        actual = _as_int(actual, case)
        expected = _torch_mha_count(**kwargs)
        if actual == expected:
            continue
        E, H = kwargs["embed_dim"], kwargs["num_heads"]
        bias, extra = kwargs.get("bias", True), kwargs.get("add_bias_kv", False)
        k, v = kwargs.get("kdim") or E, kwargs.get("vdim") or E
        biases, pair = (4 * E if bias else 0), (2 * E if extra else 0)
        weights = E * (E + k + v) + E * E
        candidates = [
            (
                "forgot bias_k and bias_v: add_bias_kv=True learns one extra key and one extra value",
                expected - pair,
                extra,
            ),
            (
                "bias_k and bias_v are added after the projections, so each has embed_dim numbers, not kdim or vdim",
                weights + biases + k + v,
                extra and (k, v) != (E, E),
            ),
            ("counted biases, but with bias=False no projection has one", weights + 4 * E + pair, not bias),
            (
                "forgot the biases: with bias=True, in_proj_bias has 3 * embed_dim numbers and out_proj.bias embed_dim",
                weights + pair,
                bias,
            ),
            ("forgot out_proj.bias: the output projection has a bias of embed_dim numbers too", expected - E, bias),
            ("forgot out_proj: the output projection adds embed_dim * embed_dim weights", expected - E * E, True),
            (
                "ignored kdim / vdim: they are the widths of the key and value inputs, so k_proj_weight is "
                "(embed_dim, kdim) and v_proj_weight (embed_dim, vdim)",
                4 * E * E + biases + pair,
                (k, v) != (E, E),
            ),
            (
                "the queries were given width kdim too; in nn.MultiheadAttention the query input always has "
                "embed_dim features",
                E * (k + k + v) + E * E + biases + pair,
                k != E,
            ),
            (
                "counted only a d x d block per head (d = embed_dim / num_heads); each projection reads all of "
                "its input features",
                4 * H * (E // H) ** 2 + biases + pair,
                True,
            ),
        ]
        for message, wrong, applies in candidates:
            if applies and actual == wrong:
                raise CheckFailed(f"{case}: got {actual}, expected {expected}: {message}")
        raise CheckFailed(f"{case}: got {actual}, expected {expected}")
    passed("check_torch_mha_params", len(_TORCH_PARAM_CASES))
