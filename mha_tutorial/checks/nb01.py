"""Checks for the exercises of notebook 01 (scaled dot-product attention).

Each check runs the learner's function on a few small seeded cases, compares
with the package (or ``torch.softmax``), and when the answer is wrong tries a
list of typical mistakes: if the wrong answer matches one of them, the
failure message names it. Exercise 2 judges a set of letters, and Exercise 4 a
prediction made from the scores alone.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..core import attention
from ._common import (
    CheckFailed,
    call,
    diagnose,
    expect_shape,
    expect_tensor,
    friendly,
    passed,
    refusing,
)

__all__ = ["check_softmax", "check_colleague_bugs", "check_attention_entropy", "check_entropy_limits"]


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


# --------------------------------------------------------------------------- Exercise 2

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
    """``colleague_bugs()`` -> the set of the letters of the colleague's lines that hold a bug (Exercise 2).

    Only a full answer of three lines gets a verdict, and a wrong one is told only that a named line is right: a
    verdict on fewer lines (or on which line is right) would let one-letter guesses find the bugs by elimination.
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
    if len(letters) < len(_COLLEAGUE_BUGS):
        raise CheckFailed(
            f"{case}: you named {len(letters)} {'line' if len(letters) == 1 else 'lines'}; the colleague has "
            f"{len(_COLLEAGUE_BUGS)} bugs, and only a full answer gets a verdict (a verdict on fewer lines would give "
            f"lines away). To find them, {_EXPERIMENTS}"
        )
    if letters != _COLLEAGUE_BUGS:
        raise CheckFailed(
            f"{case} = {sorted(letters)}: at least one of these lines is right. Name only a line you have seen "
            f"fail: {_EXPERIMENTS}"
        )
    print(f"✓ check_colleague_bugs: passed: lines A, C and E hold the three bugs; {_NOT_A_BUG}")


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


# --------------------------------------------------------------------------- Exercise 4: predict before computing

# (description, scores (..., Q, K)): exact ties, and as many keys as queries only where it cannot hide log Q
_LIMIT_CASES = [
    (
        "integer scores, 3 queries and 5 keys, shape (1, 3, 5)",
        torch.tensor([[[2.0, 2.0, 0.0, 1.0, 0.0], [3.0, 3.0, 3.0, 3.0, 0.0], [0.0, 4.0, 1.0, 2.0, 3.0]]]),
    ),
    ("random integer scores with a head axis, shape (2, 2, 4, 6)", torch.randint(0, 3, (2, 2, 4, 6), generator=_gen(30)).float()),
    (
        "negative and fractional scores, shape (1, 4, 5)",
        torch.tensor(
            [[[-1.5, -1.5, -2.0, -3.0, -1.75], [0.5, 0.25, 0.5, 0.5, -1.0], [-0.75, 1.25, 1.0, -2.0, 0.0],
              [2.5, 2.5, 2.5, 2.5, -2.5]]]
        ),
    ),
]  # fmt: skip
_COMPUTES_WEIGHTS = "predict the two limits from the scores alone, without running a softmax at an extreme tau"


def _tied_best(scores: torch.Tensor) -> torch.Tensor:
    """(..., Q, K) -> (..., Q): how many keys share each query's largest score."""
    return (scores == scores.amax(dim=-1, keepdim=True)).sum(dim=-1).double()


def _limit_slips(scores: torch.Tensor, right: tuple[float, float]):
    """(message, (low, high) that mistake gives) for the usual wrong predictions; None stands for "either"."""
    ties, (Q, K), ln2 = _tied_best(scores), scores.shape[-2:], math.log(2)
    return [
        ("the two limits are swapped: return (the limit as tau -> 0, the limit as tau -> infinity)", right[::-1]),
        ("used log base 2 (bits); the entropy here is in nats, the natural log", (right[0] / ln2, right[1] / ln2)),
        (
            "as tau -> 0 the weights are not always one-hot: keys that tie for a query's largest score keep equal "
            "weights, so count the tied best keys of each row",
            (0.0, None),
        ),
        ("as tau -> 0, n tied keys get 1/n each, and the entropy of that is log n, not n", (ties.mean().item(), None)),
        (
            "as tau -> 0 you took the log of the mean number of tied keys: take each query's entropy log n, then "
            "average those",
            (ties.mean().log().item(), None),
        ),
        (
            "as tau -> 0 you summed the queries' entropies: the mean entropy per query divides by the number of "
            "queries",
            (ties.log().sum().item(), None),
        ),
        (
            f"as tau -> infinity the weights become uniform over the {K} keys, not over the {Q} queries: log K",
            (None, math.log(Q)),
        ),
        (f"as tau -> infinity every weight is 1/K; the entropy of {K} equal weights is log K", (None, 1.0 / K)),
        (f"as tau -> infinity the entropy of {K} equal weights is log K, not K", (None, float(K))),
    ]


def _as_number(x, scores: torch.Tensor, which: str, case: str) -> float:
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    if isinstance(x, torch.Tensor) and tuple(x.shape) == tuple(scores.shape[:-1]):
        raise CheckFailed(
            f"{case}: {which} has one entropy per query, shape {tuple(x.shape)}: return their mean over every query "
            "(and every batch element and head), one number"
        )
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise CheckFailed(f"{case}: {which} is {x!r}: return a number")
    return float(x)


@friendly
def check_entropy_limits(entropy_limits) -> None:
    """``entropy_limits(scores)`` -> (low, high): the mean entropy per query (nats) of softmax(scores / tau) as
    tau -> 0 and as tau -> infinity, predicted from the scores alone (softmax and exp are refused)."""
    for case, scores in _LIMIT_CASES:
        try:
            with refusing(_PACKAGE_SOFTMAX, {**_TORCH_SOFTMAX, "exp": "exp", "exp_": "exp_"}):
                result = call(entropy_limits, scores.clone(), case=case)
        except CheckFailed as e:
            if "the exercise is to write" not in str(e):
                raise
            raise CheckFailed(f"{case}: {str(e).split(': the exercise')[0]}: {_COMPUTES_WEIGHTS}") from None
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise CheckFailed(f"{case}: return a pair (low, high), the limits as tau -> 0 and tau -> infinity")
        got = tuple(_as_number(x, scores, w, case) for x, w in zip(result, ("low", "high"), strict=True))
        right = (_tied_best(scores).log().mean().item(), math.log(scores.shape[-1]))
        if all(abs(g - r) < 1e-4 for g, r in zip(got, right, strict=True)):
            continue
        for message, slip in _limit_slips(scores, right):
            if all(s is None or abs(g - s) < 1e-4 for g, s in zip(got, slip, strict=True)):
                raise CheckFailed(f"{case}: {message}")
        raise CheckFailed(
            f"{case}: got (low, high) = ({got[0]:.4f}, {got[1]:.4f}), expected ({right[0]:.4f}, {right[1]:.4f})"
        )
    passed("check_entropy_limits", len(_LIMIT_CASES))
