"""Checks for the exercises of notebook 01 (scaled dot-product attention).

Each check runs the learner's function on a few small seeded cases, compares
with the package (or ``torch.softmax``), and when the answer is wrong tries a
list of typical mistakes: if the wrong answer matches one of them, the
failure message names it.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..core import attention
from ..core.attention import scaled_dot_product_attention
from ._common import (
    CheckFailed,
    call,
    diagnose,
    expect_finite,
    expect_shape,
    expect_tensor,
    friendly,
    passed,
    refusing,
)

__all__ = ["check_softmax", "check_colleague_bugs", "check_temperature_attention", "check_attention_entropy"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)) * scale


# --------------------------------------------------------------------------- Exercise 1

# What the exercises ask the learner to write, already written elsewhere: calling it is refused.
_PACKAGE_SOFTMAX = {
    attention.masked_softmax: "mha_tutorial.masked_softmax",
    attention._softmax_over_keys: "the package's softmax",
    F.softmax: "F.softmax",
}
_TORCH_SOFTMAX = {"softmax": "torch.softmax (or Tensor.softmax)", "_softmax": "torch._softmax"}
_PACKAGE_ATTENTION = {scaled_dot_product_attention: "mha_tutorial.scaled_dot_product_attention"}
_TORCH_ATTENTION = {"scaled_dot_product_attention": "F.scaled_dot_product_attention"}


@friendly
def check_softmax(my_softmax) -> None:
    """``my_softmax(scores)``: softmax over the keys (last axis), safe for large scores."""
    cases = [
        ("scores of shape (2, 3, 5)", _randn(2, 3, 5, seed=1)),
        ("scores of shape (2, 4, 4) (as many queries as keys)", _randn(2, 4, 4, seed=2)),
        ("scores with a head axis, shape (2, 2, 3, 4)", _randn(2, 2, 3, 4, seed=3)),
        ("large scores (around 1000), shape (1, 3, 4)", _randn(1, 3, 4, seed=4, scale=30.0) + 1000.0),
        (
            "rows of very different size (one near 1000, one near 0), shape (1, 2, 3)",
            torch.tensor([[[1000.0, 999.0, 998.0], [0.0, -1.0, 1.0]]]),
        ),
        (
            "scores with -inf entries (masked keys), shape (1, 2, 3)",
            torch.tensor([[[0.5, float("-inf"), 1.5], [float("-inf"), 2.0, 0.0]]]),
        ),
    ]
    for case, scores in cases:
        original = scores.clone()
        with refusing(_PACKAGE_SOFTMAX, _TORCH_SOFTMAX):
            out = expect_tensor(call(my_softmax, scores, case=case), case)
        if not torch.equal(scores, original):
            raise CheckFailed(f"{case}: your function changed its input in place; work on a copy")
        scores = original
        expected = F.softmax(scores, dim=-1)
        if tuple(out.shape) != tuple(scores.shape):
            raise CheckFailed(
                f"{case}: wrong shape {tuple(out.shape)}, expected {tuple(scores.shape)}: softmax keeps the shape "
                "of the scores (did you sum without keepdim=True, so the division broadcast wrongly?)"
            )
        if not torch.isfinite(out).all():
            raise CheckFailed(
                f"{case}: the result contains NaN or inf. exp(1000) overflows float32, and a row far below the "
                "largest score of the whole tensor underflows to 0/0: subtract each row's maximum (not the whole "
                "tensor's) before exp (softmax(x) = softmax(x - max x), so the answer does not change)"
            )
        mistakes = [
            (
                "rows sum to 1 over the wrong axis: you normalised over the queries (dim=-2); "
                "softmax must be over the keys (dim=-1)",
                F.softmax(scores, dim=-2),
            ),
            (
                "rows sum to 1 over the wrong axis: you normalised over the first axis (dim=0); "
                "softmax must be over the keys (dim=-1)",
                F.softmax(scores, dim=0),
            ),
            (
                "rows sum to 1 over the wrong axis: you normalised over dim=1, which is the keys only for 2-D "
                "scores; use dim=-1 so the code works for any number of leading axes",
                F.softmax(scores, dim=1),
            ),
            ("the result is exp(scores) without dividing by the row sum", torch.exp(scores)),
            (
                "you normalised by the sum over the whole tensor instead of each row (over the keys, dim=-1)",
                torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum(),
            ),
        ]
        diagnose(out, expected, mistakes, case)
    passed("check_softmax", len(cases))


# --------------------------------------------------------------------------- Exercise 2a

# The colleague's five lines, A to E, and which of them hold a bug.
_COLLEAGUE_LINES = ("A", "B", "C", "D", "E")
_COLLEAGUE_BUGS = {"A", "C", "E"}
_NOT_A_BUG = (
    "B and D are right: transpose(-2, -1) swaps only the keys' last two axes (section 2), and softmax over dim=-1 "
    "normalises each query's row over the keys (section 3)"
)
_EXPERIMENTS = (
    "run the colleague's function (1) on 3 queries against 5 keys, (2) at tau = 0.5 and tau = 2, where a higher "
    "temperature must flatten the weights, and (3) on our sentence against section 3's weights, then find the line "
    "each failure comes from"
)


@friendly
def check_colleague_bugs(colleague_bugs) -> None:
    """``colleague_bugs()`` -> the set of the letters of the colleague's lines that hold a bug (Exercise 2a).

    A wrong answer is told whether every line it names is a bug and, only then, how many remain: never which named
    line is right, since with five lines and three bugs that would give the others away by elimination.
    """
    case = "colleague_bugs()"
    named = call(colleague_bugs, case=case)
    if isinstance(named, str) or not isinstance(named, (set, frozenset, list, tuple)):
        raise CheckFailed(f"{case} returned {named!r}: return a set of letters, such as {{'A', 'B'}}")
    letters = {str(x).strip().upper() for x in named}
    unknown = sorted(letters - set(_COLLEAGUE_LINES))
    if unknown:
        raise CheckFailed(f"{case}: {', '.join(map(repr, unknown))} is not a line: the colleague's lines are A to E")
    if not letters:
        raise CheckFailed(f"{case} is empty: name the lines that hold a bug")
    if len(letters) > len(_COLLEAGUE_BUGS):
        raise CheckFailed(
            f"{case}: you named {len(letters)} lines, but the colleague has {len(_COLLEAGUE_BUGS)} bugs: keep only "
            "the lines you can show to be wrong (the hint says how)"
        )
    if letters - _COLLEAGUE_BUGS:
        raise CheckFailed(
            f"{case} = {sorted(letters)}: at least one of these lines is right. Name only a line you have seen "
            f"fail: {_EXPERIMENTS}"
        )
    missed = len(_COLLEAGUE_BUGS - letters)
    if missed:
        raise CheckFailed(
            f"{case} = {sorted(letters)}: each of these lines holds a bug, and {missed} more "
            f"{'bug is' if missed == 1 else 'bugs are'} still to find: {_EXPERIMENTS}"
        )
    print(f"✓ check_colleague_bugs: passed: lines A, C and E hold the three bugs; {_NOT_A_BUG}")


# --------------------------------------------------------------------------- Exercise 2b


def _weights(queries, keys, temperature, scale, dim=-1, transpose_scores=False):
    scores = queries @ keys.transpose(-2, -1) * scale / temperature
    if transpose_scores:
        scores = keys @ queries.transpose(-2, -1) * scale / temperature
    return F.softmax(scores, dim=dim)


# (description, (B, Q, K, d, value size), temperature, seed); "4-D" in the description adds a head axis of 2
_ATTENTION_CASES = [
    ("3-D inputs, 4 queries and 4 keys, temperature 1", (2, 4, 4, 8, 5), 1.0, 11),
    ("3-D inputs, 4 queries and 4 keys, temperature 0.5", (2, 4, 4, 9, 3), 0.5, 12),
    ("3-D inputs, 3 queries and 4 keys, temperature 1", (2, 3, 4, 8, 5), 1.0, 10),
    ("3-D inputs, 3 queries and 5 keys, temperature 3", (1, 3, 5, 4, 2), 3.0, 13),
    ("4-D inputs with a head axis (2, 2, 3, 4, d=8), temperature 2", (2, 3, 4, 8, 5), 2.0, 14),
]

_TRANSPOSE_HINT = (
    "\nHint: scores = queries @ keys.transpose(-2, -1) has shape (..., Q, K); transposing the last two axes "
    "(not keys.T, which reverses every axis, nor transpose(1, 2), which breaks once a head axis is added) "
    "works for 3-D and 4-D inputs."
)


def _expect_pair(result, case: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's (output, weights), each a tensor."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CheckFailed(f"{case}: return a pair (output, weights), got {type(result).__name__}")
    output, weights = (expect_tensor(x, case) for x in result)
    return output, weights


def _expect_weights_shape(weights: torch.Tensor, shape: tuple, case: str) -> None:
    """``shape`` is (..., Q, K); a (..., K, Q) answer is named as the transposed scores."""
    if tuple(weights.shape) != shape:
        if tuple(weights.shape) == (*shape[:-2], shape[-1], shape[-2]):
            raise CheckFailed(
                f"{case}: weights have shape {tuple(weights.shape)} = (..., K, Q), expected (..., Q, K): "
                "the scores are Q @ K^T (one row per query), not K @ Q^T"
            )
        expect_shape(weights, shape, case + " (weights, one row per query)")


def _weights_mistakes(queries, keys, temperature, d):
    """(message, the weights that mistake gives) for the usual ways to get the weights wrong."""
    r = 1.0 / math.sqrt(d)
    return [
        (
            "forgot the 1/sqrt(d) scale: the weights equal softmax(Q K^T / tau), tau the temperature",
            _weights(queries, keys, temperature, 1.0),
        ),
        ("divided by d instead of sqrt(d)", _weights(queries, keys, temperature, 1.0 / d)),
        ("multiplied by sqrt(d) instead of dividing by it", _weights(queries, keys, temperature, math.sqrt(d))),
        *(
            (
                f"the scale used the wrong size, queries.shape[{axis}] = {queries.shape[axis]} (a count of queries "
                f"or heads): d is the length of one query vector, queries.shape[-1] = {d}",
                _weights(queries, keys, temperature, 1.0 / math.sqrt(queries.shape[axis])),
            )
            for axis in (1, -2)
        ),
        (
            "multiplied by the temperature instead of dividing by it: a high temperature must flatten the weights",
            _weights(queries, keys, 1.0 / temperature, r) if temperature != 1 else None,
        ),
        (
            "the temperature is ignored: the weights are those of temperature 1",
            _weights(queries, keys, 1.0, r) if temperature != 1 else None,
        ),
        (
            "softmax over the wrong axis: you normalised over the queries (dim=-2); it must be over the keys "
            "(dim=-1), so that each query's weights sum to 1",
            _weights(queries, keys, temperature, r, dim=-2),
        ),
        (
            "wrong transposition: the weights are softmax(K Q^T) (one row per key); the scores are "
            "Q @ K^T, one row per query",
            _weights(queries, keys, temperature, r, transpose_scores=True),
        ),
    ]


@friendly
def check_temperature_attention(my_attention) -> None:
    """``my_attention(queries, keys, values, temperature)`` -> (output, weights), softmax(Q K^T / (tau sqrt d)) V."""
    for case, (B, Q, K, d, v), temperature, seed in _ATTENTION_CASES:
        lead = (B, 2) if "4-D" in case else (B,)
        queries = _randn(*lead, Q, d, seed=seed)
        keys = _randn(*lead, K, d, seed=seed + 100)
        values = _randn(*lead, K, v, seed=seed + 200)
        with refusing(_PACKAGE_ATTENTION, _TORCH_ATTENTION):
            result = call(my_attention, queries, keys, values, temperature, case=case, hint=_TRANSPOSE_HINT)
        output, weights = _expect_pair(result, case)
        ref_out, ref_w = scaled_dot_product_attention(queries / temperature, keys, values)
        _expect_weights_shape(weights, (*lead, Q, K), case)
        expect_finite(weights, case)
        diagnose(weights, ref_w, _weights_mistakes(queries, keys, temperature, d), case + " (weights)")
        expect_shape(output, (*lead, Q, v), case + " (output)")
        out_mistakes = [
            (
                "the output uses the transposed weights (weights^T @ values); it must be weights @ values",
                ref_w.transpose(-2, -1) @ values if Q == K else None,
            ),
        ]
        diagnose(output, ref_out, out_mistakes, case + " (output)")
    passed("check_temperature_attention", len(_ATTENTION_CASES))


# --------------------------------------------------------------------------- Exercise 3


def _entropy(weights: torch.Tensor) -> torch.Tensor:
    return -torch.xlogy(weights, weights).sum(dim=-1)


@friendly
def check_attention_entropy(attention_entropy) -> None:
    """``attention_entropy(weights)`` -> entropy in nats of each query's weights, shape (..., Q)."""
    uniform = torch.full((1, 3, 4), 0.25)
    one_hot = F.one_hot(torch.tensor([[0, 2, 1]]), 4).float()  # (1, 3, 4)
    zero_rows = F.softmax(
        _randn(2, 3, 5, seed=21).masked_fill(torch.tensor([False, False, True, True, False]), float("-inf")), dim=-1
    )
    cases = [
        ("uniform weights over 4 keys (entropy log 4)", uniform),
        ("one-hot weights (entropy 0)", one_hot),
        ("random weights, shape (2, 3, 5)", F.softmax(_randn(2, 3, 5, seed=20), dim=-1)),
        ("weights with exact zeros (masked keys), shape (2, 3, 5)", zero_rows),
        ("weights with a head axis, shape (2, 2, 3, 6)", F.softmax(_randn(2, 2, 3, 6, seed=22) * 2, dim=-1)),
    ]
    for case, weights in cases:
        out = expect_tensor(call(attention_entropy, weights.clone(), case=case), case)
        expected = _entropy(weights)
        if tuple(out.shape) == (*weights.shape[:-1], 1):
            raise CheckFailed(
                f"{case}: shape {tuple(out.shape)}: drop the summed key axis (keepdim=False), "
                f"expected {tuple(expected.shape)}"
            )
        per_key = tuple(weights.shape[:-2]) + (weights.shape[-1],)
        if tuple(out.shape) == per_key and weights.shape[-1] != weights.shape[-2]:
            raise CheckFailed(
                f"{case}: shape {tuple(out.shape)} has one entry per key: sum over the keys "
                f"(dim=-1) to get one entropy per query, shape {tuple(expected.shape)}"
            )
        expect_shape(out, expected.shape, case + " (one entropy per query)")
        if torch.isnan(out).any():
            raise CheckFailed(
                f"{case}: NaN: a weight of exactly 0 gives 0 * log 0 = 0 * (-inf) = NaN. By convention 0 log 0 = 0 "
                "(the limit of p log p): those terms must count as 0, so keep log 0 out of the product"
            )
        mistakes = [
            ("the entropy is negative: H = -sum p log p has a minus sign", -expected),
            ("used log base 2 (bits); measure in nats with the natural log, torch.log", expected / math.log(2)),
            ("averaged over the keys instead of summing (mean instead of sum)", expected / weights.shape[-1]),
        ]
        diagnose(out, expected, mistakes, case, atol=1e-4)
    passed("check_attention_entropy", len(cases))
