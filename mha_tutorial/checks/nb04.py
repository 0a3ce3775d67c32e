"""Checks for the exercises of notebook 04 (multi-head attention).

The forward check compares the learner's function with ``MultiHeadAttention``
itself and, when they differ, with a small set of deliberately broken
variants (no W_o, no scale, heads concatenated in the wrong order, ``repeat``
instead of ``repeat_interleave``, ...) so that it can name the mistake.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn

from ..attention import DotProductAttention, masked_softmax
from ..masks import padding_mask
from ..mha import MultiHeadAttention
from ..variants import EinsumMultiHeadAttention, HeadLoopMultiHeadAttention, SeqFirstMultiHeadAttention
from ._common import CheckFailed, call, expect_close, expect_shape, expect_tensor, friendly, passed

__all__ = [
    "check_mha_forward",
    "check_num_params",
    "check_torch_mha_params",
    "check_head_off",
    "check_peak_prediction",
]


class _NoForward(MultiHeadAttention):
    """A MultiHeadAttention that refuses to be called: the exercise is to use its four Linear layers."""

    def forward(self, *args, **kwargs):
        raise CheckFailed(
            "your function called net(...) itself; the exercise is to compute the output from "
            "net.W_q, net.W_k, net.W_v and net.W_o"
        )


_PACKAGE_LAYERS = (
    MultiHeadAttention,
    HeadLoopMultiHeadAttention,
    EinsumMultiHeadAttention,
    SeqFirstMultiHeadAttention,
    DotProductAttention,
)


@contextlib.contextmanager
def _refusing(classes, method: str, message: str):
    """While the learner's code runs, ``cls.method`` of each class raises ``CheckFailed(message)``.

    This catches the package's own implementation however it is reached: ``net(...)``,
    ``MultiHeadAttention.forward(net, ...)``, or a fresh module with ``net``'s weights loaded.
    """
    saved = [(cls, cls.__dict__[method]) for cls in classes if method in cls.__dict__]

    def refuse(*args, **kwargs):
        raise CheckFailed(message)

    for cls, _ in saved:
        setattr(cls, method, refuse)
    try:
        yield
    finally:
        for cls, original in saved:
            setattr(cls, method, original)


def _no_package_attention():
    return _refusing(
        _PACKAGE_LAYERS,
        "forward",
        "your function ran the package's attention (a MultiHeadAttention or its inner attention); the "
        "exercise is to compute the output yourself from net.W_q, net.W_k, net.W_v and net.W_o",
    )


def _no_modules():
    return _refusing(
        (nn.Module,),
        "__init__",
        "your function built a module to count its parameters; count them from the shapes instead "
        "(some of the check's sizes are far too large to build)",
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
            with _no_package_attention():
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


class _NoHeadMask(MultiHeadAttention):
    """A MultiHeadAttention that refuses ``head_mask``: the exercise is to get the same effect from the weights."""

    def forward(self, queries, keys, values, valid_lens=None, mask=None, head_mask=None, **kwargs):
        if head_mask is not None:
            raise CheckFailed("solve it without head_mask: change the weights of a copy of the net instead")
        return super().forward(queries, keys, values, valid_lens, mask, **kwargs)


@contextlib.contextmanager
def _no_head_mask_anywhere():
    """While the learner's code runs, ``MultiHeadAttention.forward`` refuses a ``head_mask`` however it is called
    (``MultiHeadAttention.forward(net, ..., head_mask=...)`` skips ``_NoHeadMask.forward``)."""
    original = MultiHeadAttention.__dict__["forward"]

    def forward(self, queries, keys, values, valid_lens=None, mask=None, head_mask=None, *rest, **kwargs):
        if head_mask is not None:
            raise CheckFailed("solve it without head_mask: change the weights of a copy of the net instead")
        return original(self, queries, keys, values, valid_lens, mask, None, *rest, **kwargs)

    MultiHeadAttention.forward = forward
    try:
        yield
    finally:
        MultiHeadAttention.forward = original


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
            with _no_head_mask_anywhere():
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


# ------------------------------------------------------------------ notebook 04a: predict a peak before measuring

_PEAK_CASES = [(1, 8, 384), (2, 4, 512), (1, 4, 768)]  # (batch, heads, seq), num_hiddens = 64: the T^2 terms dominate


def measured_peak_mib(batch: int, heads: int, seq: int, hiddens: int = 64) -> float:
    """The measured peak (MiB) of one forward+backward call of the readable path, float32, on the CPU."""
    from ..bench import run_benchmark

    threads = torch.get_num_threads()
    try:
        (row,) = run_benchmark(
            seqs=[seq],
            batch=batch,
            hiddens=hiddens,
            heads=heads,
            passes=("forward+backward",),
            impl_names=["readable"],
            device="cpu",
            threads=1,
            min_run_time=0.01,
            log=None,
        )
    finally:
        torch.set_num_threads(threads)
    return row.peak_mib


@friendly
def check_peak_prediction(fn) -> None:
    """``fn(batch, heads, seq)`` -> the predicted peak memory (MiB) of one forward+backward call of the readable
    ``MultiHeadAttention`` in float32; the check measures it and accepts a prediction within 12%."""
    from ..bench import PeakMemory

    for B, H, T in _PEAK_CASES:
        case = f"batch={B}, heads={H}, seq={T} (num_hiddens=64)"
        with _refusing(
            (PeakMemory,),
            "__init__",
            "your function measured the peak instead of predicting it; compute it from batch, heads and seq",
        ):
            predicted = call(fn, B, H, T, case=case)
        if isinstance(predicted, torch.Tensor) and predicted.numel() == 1:
            predicted = predicted.item()
        if isinstance(predicted, bool) or not isinstance(predicted, numbers.Real):
            raise CheckFailed(f"{case}: return a number of MiB, got {predicted!r} ({type(predicted).__name__})")
        measured = measured_peak_mib(B, H, T)
        ratio = predicted / measured
        if 0.88 <= ratio <= 1.12:
            continue
        candidates = [
            ("you counted one (batch, heads, seq, seq) tensor; the backward pass holds about three at once", 1 / 3),
            ("you counted two (batch, heads, seq, seq) tensors; the backward pass holds about three at once", 2 / 3),
            ("that is bytes: divide by 2**20 for MiB", 2**20),
            ("8 bytes per number: float32 takes 4", 2.0),
            ("the heads are missing: every head has its own (seq, seq) table", 1 / H),
            ("the batch is missing: every example has its own tables", 1 / B),
            ("seq, not seq squared: each table is (seq, seq)", 1 / T),
        ]
        for message, factor in candidates:
            if factor != 1 and abs(ratio / factor - 1) < 0.1:
                raise CheckFailed(f"{case}: predicted {predicted:.4g} MiB, measured {measured:.1f} MiB: {message}")
        raise CheckFailed(f"{case}: predicted {predicted:.4g} MiB, measured {measured:.1f} MiB (more than 12% apart)")
    passed("check_peak_prediction", len(_PEAK_CASES))
