"""Checks for the exercises of notebook 04 (multi-head attention).

The forward check compares the learner's function with ``MultiHeadAttention``
itself and, when they differ, with a small set of deliberately broken
variants (no W_o, no scale, heads concatenated in the wrong order, ``repeat``
instead of ``repeat_interleave``, ...) so that it can name the mistake.

The parameter-counting checks live in ``_nb04_params`` and the head-off check in ``_nb04_head_off``; they are
re-exported here, so ``nb04.check_num_params`` is the same function as ``checks.check_num_params``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ..core.attention import DotProductAttention, masked_softmax
from ..core.masks import padding_mask
from ..core.mha import MultiHeadAttention
from ..core.variants import EinsumMultiHeadAttention, HeadLoopMultiHeadAttention, SeqFirstMultiHeadAttention
from ._common import CheckFailed, call, expect_close, expect_shape, expect_tensor, friendly, passed
from ._nb04_guards import _refusing
from ._nb04_head_off import check_head_off
from ._nb04_params import _TORCH_PARAM_CASES as _TORCH_PARAM_CASES
from ._nb04_params import _torch_mha_count as _torch_mha_count
from ._nb04_params import check_num_params, check_torch_mha_params

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


def _no_package_attention():
    return _refusing(
        _PACKAGE_LAYERS,
        "forward",
        "your function ran the package's attention (a MultiHeadAttention or its inner attention); the "
        "exercise is to compute the output yourself from net.W_q, net.W_k, net.W_v and net.W_o",
    )


@dataclass(frozen=True)
class _Switches:
    """The mistakes ``_variant`` can make; the defaults make none."""

    scale: str | None = "head"  # "head": 1/sqrt(d); "model": 1/sqrt(num_hiddens); None: no scale
    use_wo: bool = True  # the concatenated heads go through W_o
    concat: str = "blocks"  # "blocks" (right), "interleaved" (merged as (d, H)), "reversed" (last head first)
    # or "no_transpose" ((B, H, Q, d) reshaped straight to (B, Q, H*d))
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
    elif m.concat == "no_transpose":  # reads (B, H, Q, d) in memory order: mixes positions and heads
        cat = out.reshape(out.shape[0], out.shape[2], -1)
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
        "heads merged without the transpose: reshaping (B, H, Q, d) straight to (B, Q, H*d) mixes positions and "
        "heads; transpose to (B, Q, H, d) first, then flatten the last two axes",
        dict(concat="no_transpose"),
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


# ------------------------------------------------------------------ notebook 04a: predict a peak before measuring

# (batch, heads, seq), num_hiddens = 64: heads and seq varied against each other, the T^2 terms dominate
_PEAK_CASES = [(1, 16, 256), (2, 4, 768), (3, 8, 256)]
_PEAK_TABLES = 3  # (B, H, T, T) float32 tensors alive at the readable path's peak: P, dP and dS in softmax backward
_PEAK_MEASURED: dict[tuple[int, int, int], float] = {}  # the check's own cache (measured_peak_mib always measures)


def measured_peak_mib(batch: int, heads: int, seq: int, hiddens: int = 64) -> float:
    """The measured peak (MiB) of one forward+backward call of the readable path, float32, on the CPU."""
    from ..bench.attention import run_benchmark

    (row,) = run_benchmark(  # run_benchmark restores PyTorch's thread count itself
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
    return row.peak_mib


def _peak_slip(tables: float, B: int, H: int, T: int) -> str | None:
    """The named mistake whose count ``tables`` (the prediction in units of one (B, H, T, T) float32 tensor) gives."""
    right = _PEAK_TABLES
    candidates = [
        ("you counted one (batch, heads, seq, seq) tensor; the softmax backward holds more at once", 1 / right),
        ("you counted two (batch, heads, seq, seq) tensors; the softmax backward reads two and writes one", 2 / right),
        ("you counted four (batch, heads, seq, seq) tensors; the raw scores are not among those alive at the peak: "
         "the softmax backward needs its output, not its input", 4 / right),
        ("that is bytes: divide by 2**20 for MiB", 2**20),
        ("8 bytes per number: float32 takes 4", 2.0),
        ("that is MB (10**6 bytes): a MiB is 2**20 bytes", 2**20 / 10**6),
        ("the heads are missing: every head has its own (seq, seq) table", 1 / H),
        ("the batch is missing: every example has its own tables", 1 / B),
        ("seq, not seq squared: each table is (seq, seq)", 1 / T),
    ]  # fmt: skip
    for message, factor in candidates:
        if factor != 1 and abs(tables / right / factor - 1) < 0.01:
            return message
    if abs(tables / right - 1) < 0.12:
        return (
            f"that is {tables:.2f} (batch, heads, seq, seq) tensors' worth; the tensors come whole: count which ones "
            "the softmax backward holds at once and leave out the terms linear in seq (a ratio read off a measured "
            "peak carries them)"
        )
    return None


@friendly
def check_peak_prediction(fn) -> None:
    """``fn(batch, heads, seq)`` -> the predicted peak memory (MiB) of one forward+backward call of the readable
    ``MultiHeadAttention`` in float32: a whole number of (batch, heads, seq, seq) float32 tensors, the right one,
    and within 12% of the peak that the check measures."""
    from ..bench.attention import PeakMemory

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
        tables = predicted / (4 * B * H * T * T / 2**20)  # in units of one (B, H, T, T) float32 tensor
        if abs(tables / _PEAK_TABLES - 1) >= 1e-6:
            slip = _peak_slip(tables, B, H, T)
            if slip is not None:
                raise CheckFailed(f"{case}: predicted {predicted:.4g} MiB: {slip}")
        if (B, H, T) not in _PEAK_MEASURED:
            _PEAK_MEASURED[B, H, T] = measured_peak_mib(B, H, T)
        measured = _PEAK_MEASURED[B, H, T]
        if not 0.88 <= predicted / measured <= 1.12:
            raise CheckFailed(
                f"{case}: predicted {predicted:.4g} MiB, measured {measured:.1f} MiB (more than 12% apart)"
            )
        if abs(tables / _PEAK_TABLES - 1) >= 1e-6:  # within 12%, yet not the whole count of tensors alive at the peak
            raise CheckFailed(f"{case}: predicted {predicted:.4g} MiB, {tables:.3g} tensors' worth: count whole ones")
    passed("check_peak_prediction", len(_PEAK_CASES))
