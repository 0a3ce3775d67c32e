"""Checks for the exercises of notebook 03 (splitting into heads).

Each check runs the learner's function on small tensors whose values are all
different, so that a rearrangement that puts even one number in the wrong
place is caught, and compares it with the package's reference. When the answer
is wrong in a way that learners often get it wrong (no permute before the
reshape, heads folded head-major instead of batch-major, ``repeat`` instead of
``repeat_interleave``, for lengths or for shared key/value heads; a fused projection cut per head), the message
names that mistake.
"""

from __future__ import annotations

import torch

from ..core import heads as _heads
from ..core.heads import transpose_qkv
from ._common import CheckFailed, call, diagnose, expect_shape, expect_tensor, friendly, passed, refusing
from ._nb03_fused import check_split_fused_qkv

__all__ = [
    "check_transpose_qkv",
    "check_transpose_qkv_seq_first",
    "check_transpose_output",
    "check_expand_valid_lens",
    "check_expand_kv_heads",
    "check_average_heads",
    "check_split_fused_qkv",
]

# What the exercises ask the learner to write, already in the package: calling it is refused.
_PACKAGE_HEADS = {
    _heads.transpose_qkv: "mha_tutorial.transpose_qkv",
    _heads.transpose_output: "mha_tutorial.transpose_output",
}


def _labelled(batch: int, steps: int, heads: int, head_size: int) -> torch.Tensor:
    """(B, T, H*d) integer tensor whose entry for (b, t, h, j) is 1000 b + 100 t + 10 h + j."""
    b = torch.arange(batch).view(-1, 1, 1, 1)
    t = torch.arange(steps).view(1, -1, 1, 1)
    h = torch.arange(heads).view(1, 1, -1, 1)
    j = torch.arange(head_size).view(1, 1, 1, -1)
    return (1000 * b + 100 * t + 10 * h + j).reshape(batch, steps, heads * head_size)


# (batch, steps, heads, head_size): each has B > 1, T > 1 and H > 1, so that every
# wrong ordering below gives a different tensor from the right one.
_CASES = [(2, 3, 2, 2), (3, 4, 4, 3), (2, 5, 3, 1)]


def _first_match(actual: torch.Tensor, candidates) -> str | None:
    for message, wrong in candidates:
        if actual.shape == wrong.shape and torch.equal(actual, wrong):
            return message
    return None


def _as_cpu(actual, case: str) -> torch.Tensor:
    return expect_tensor(actual, case).detach().cpu()


_LEGEND = "1000*b + 100*t + 10*h + j for example b, position t, head h, feature j"


def _first_difference(case: str, actual, expected, legend: str = "") -> CheckFailed:
    """The failure for labelled integer tensors that differ: the first index, both entries, what an entry means."""
    where = tuple(int(i) for i in (actual != expected).nonzero()[0])
    note = f" ({legend})" if legend else ""
    return CheckFailed(
        f"{case}: wrong values, first at index {where}: got {int(actual[where])}, expected {int(expected[where])}{note}"
    )


@friendly
def check_transpose_qkv(fn) -> None:
    """``fn(X, num_heads)``: (B, T, H*d) -> (B*H, T, d), row b*H + h = head h of example b."""
    for batch, steps, heads, size in _CASES:
        X = _labelled(batch, steps, heads, size)
        case = f"X of shape {tuple(X.shape)}, num_heads={heads}"
        with refusing(_PACKAGE_HEADS):
            actual = _as_cpu(call(fn, X.clone(), heads, case=case), case)
        if tuple(actual.shape) == (batch, heads, steps, size):
            raise CheckFailed(
                f"{case}: got the 4-D layout (B, H, T, d) = {tuple(actual.shape)}; fold the batch and head "
                f"axes into one with .reshape({batch * heads}, {steps}, {size})"
            )
        expect_shape(actual, (batch * heads, steps, size), case)
        expected = transpose_qkv(X, heads)
        if torch.equal(actual, expected):
            continue
        split = X.reshape(batch, steps, heads, size)
        mistake = _first_match(
            actual,
            [
                (
                    "reshaped straight to (B*H, T, d) without moving the head axis first: the features of "
                    "different positions and heads get scrambled together; split the last axis into (H, d), "
                    "then permute(0, 2, 1, 3) to (B, H, T, d), then reshape",
                    X.reshape(batch * heads, steps, size),
                ),
                (
                    "the heads are folded head-major (row h*B + b) instead of batch-major (row b*H + h): "
                    "permute to (B, H, T, d), not (H, B, T, d), before folding",
                    split.permute(2, 0, 1, 3).reshape(batch * heads, steps, size),
                ),
                (
                    "the last axis was split as (d, H) instead of (H, d): head h must own the contiguous "
                    "block of features h*d .. (h+1)*d - 1, not every H-th feature",
                    X.reshape(batch, steps, size, heads).permute(0, 3, 1, 2).reshape(batch * heads, steps, size),
                ),
            ],
        )
        if mistake:
            raise CheckFailed(f"{case}: {mistake}")
        raise _first_difference(case, actual, expected, "the input holds " + _LEGEND)
    passed("check_transpose_qkv", len(_CASES))


# (batch, steps, heads, head_size) for the sequence-first exercise: one case has T == B, so that
# a result with T and B swapped has the right shape and is told apart by its values.
_SEQ_CASES = [(2, 3, 2, 2), (3, 3, 2, 2), (3, 4, 4, 3)]


@friendly
def check_transpose_qkv_seq_first(fn) -> None:
    """``fn(X, num_heads)``: sequence-first (T, B, H*d) -> (B*H, T, d), row b*H + h = head h of example b."""
    for batch, steps, heads, size in _SEQ_CASES:
        X = _labelled(batch, steps, heads, size).transpose(0, 1).contiguous()  # (T, B, H*d)
        case = f"sequence-first X of shape {tuple(X.shape)} = (T, B, H*d), num_heads={heads}"
        with refusing(_PACKAGE_HEADS):
            actual = _as_cpu(call(fn, X.clone(), heads, case=case), case)
        split = X.reshape(steps, batch, heads, size)  # (T, B, H, d)
        expected = split.permute(1, 2, 0, 3).reshape(batch * heads, steps, size)
        if actual.shape == expected.shape and torch.equal(actual, expected):
            continue
        mistake = _first_match(
            actual,
            [
                (
                    "reshaped straight to (B*H, T, d) without a permute: each row is just the next T*d numbers "
                    "of X, mixing positions, examples and heads; split the last axis into (H, d) first",
                    X.reshape(batch * heads, steps, size),
                ),
                (
                    "swapped T and B with a transpose, then reshaped without moving the head axis: the rows mix "
                    "positions and heads; split the last axis into (H, d) and permute so the order is (B, H, T, d)",
                    X.transpose(0, 1).reshape(batch * heads, steps, size),
                ),
                (
                    "the rows are folded head-major (row h*B + b) instead of batch-major (row b*H + h): "
                    "the axis order before folding must be (B, H, T, d), not (H, B, T, d)",
                    split.permute(2, 1, 0, 3).reshape(batch * heads, steps, size),
                ),
                (
                    "treated the input as batch-first (B, T, H*d): the first axis of X is the position T, the "
                    "second the example B, so the permute must bring axis 1 first and axis 0 third",
                    split.permute(0, 2, 1, 3).reshape(steps * heads, batch, size),
                ),
            ],
        )
        if mistake:
            raise CheckFailed(f"{case}: {mistake}")
        expect_shape(actual, (batch * heads, steps, size), case)
        raise _first_difference(case, actual, expected, "entry " + _LEGEND)
    passed("check_transpose_qkv_seq_first", len(_SEQ_CASES))


@friendly
def check_transpose_output(fn) -> None:
    """``fn(X, num_heads)``: (B*H, T, d) -> (B, T, H*d), the inverse of ``transpose_qkv``."""
    for batch, steps, heads, size in _CASES:
        X = _labelled(batch, steps, heads, size)
        folded = transpose_qkv(X, heads)  # (B*H, T, d), rows batch-major
        case = f"input of shape {tuple(folded.shape)}, num_heads={heads}"
        with refusing(_PACKAGE_HEADS):
            actual = _as_cpu(call(fn, folded.clone(), heads, case=case), case)
        expect_shape(actual, (batch, steps, heads * size), case)
        if torch.equal(actual, X):
            continue
        mistake = _first_match(
            actual,
            [
                (
                    "reshaped straight back to (B, T, H*d) without moving the head axis: unfold to "
                    "(B, H, T, d), permute(0, 2, 1, 3) to (B, T, H, d), then merge the last two axes",
                    folded.reshape(batch, steps, heads * size),
                ),
                (
                    "unfolded the rows as head-major (row h*B + b), but transpose_qkv folds them batch-major "
                    "(row b*H + h): reshape to (B, H, T, d), not (H, B, T, d)",
                    folded.reshape(heads, batch, steps, size).permute(1, 2, 0, 3).reshape(batch, steps, heads * size),
                ),
                (
                    "the heads are concatenated in the wrong order: their features come out interleaved "
                    "(feature j of every head, then feature j+1, ...) because the last axes were merged as (d, H); "
                    "permute to (B, T, H, d) so that head h fills features h*d .. (h+1)*d - 1",
                    folded.reshape(batch, heads, steps, size).permute(0, 2, 3, 1).reshape(batch, steps, heads * size),
                ),
            ],
        )
        if mistake:
            raise CheckFailed(f"{case}: {mistake}")
        raise _first_difference(case, actual, X)
    passed("check_transpose_output", len(_CASES))


# (valid_lens, num_heads): lengths differ between examples, so `repeat` and
# `repeat_interleave` give different answers; the last case is per query (B, Q).
_LENS_CASES = [
    ([3, 1], 2),
    ([2, 4, 1], 3),
    ([5, 2], 4),
    ([[1, 2, 3], [3, 3, 1]], 2),
]


@friendly
def check_expand_valid_lens(fn) -> None:
    """``fn(valid_lens, num_heads)``: (B,) -> (B*H,) or (B, Q) -> (B*H, Q), row b*H + h = valid_lens[b]."""
    for lens, heads in _LENS_CASES:
        valid_lens = torch.tensor(lens)
        case = f"valid_lens={lens}, num_heads={heads}"
        actual = _as_cpu(call(fn, valid_lens.clone(), heads, case=case), case)
        if actual.is_floating_point() or actual.dtype == torch.bool:
            raise CheckFailed(f"{case}: got dtype {actual.dtype}; lengths are counts, keep an integer dtype")
        expected = torch.repeat_interleave(valid_lens, heads, dim=0)
        if valid_lens.dim() == 2 and tuple(actual.shape) == (valid_lens.numel() * heads,):
            raise CheckFailed(
                f"{case}: got a flat tensor of shape {tuple(actual.shape)}: per-query lengths (B, Q) must "
                f"stay one row per (example, head); pass dim=0 to repeat_interleave"
            )
        expect_shape(actual, expected.shape, case)
        if torch.equal(actual, expected):
            continue
        tiled = valid_lens.repeat(heads) if valid_lens.dim() == 1 else valid_lens.repeat(heads, 1)
        if torch.equal(actual, tiled):
            raise CheckFailed(
                f"{case}: looks like `repeat` instead of `repeat_interleave`: got {actual.tolist()}, "
                f"expected {expected.tolist()}. `repeat` tiles the whole vector, so row b*H + h would get "
                f"the length of example (b*H + h) mod B; each example's length must be repeated H times in place"
            )
        raise CheckFailed(
            f"{case}: got {actual.tolist()}, expected {expected.tolist()} (row b*H + h holds valid_lens[b])"
        )
    passed("check_expand_valid_lens", len(_LENS_CASES))


# (batch, steps, kv_heads, heads, head_size): B > 1 everywhere; G = 1 is multi-query attention; in the
# other cases G > 1 and H/G > 1, so tiling the K/V heads gives other numbers than repeating each in place.
_KV_CASES = [(2, 3, 2, 4, 2), (3, 2, 1, 3, 2), (2, 2, 3, 6, 1), (2, 3, 2, 6, 2)]


@friendly
def check_expand_kv_heads(fn) -> None:
    """``fn(kv, num_kv_heads, num_heads)``: folded (B*G, T, d) -> (B*H, T, d), row b*H + h = row b*G + h // (H/G)."""
    for batch, steps, kv_heads, heads, size in _KV_CASES:
        kv = transpose_qkv(_labelled(batch, steps, kv_heads, size), kv_heads)  # (B*G, T, d), row b*G + g
        group = heads // kv_heads  # query heads per K/V head
        case = f"kv of shape {tuple(kv.shape)}, num_kv_heads={kv_heads}, num_heads={heads}"
        actual = _as_cpu(call(fn, kv.clone(), kv_heads, heads, case=case), case)
        expected = torch.repeat_interleave(kv, group, dim=0)  # (B*H, T, d)
        if actual.dim() == 1:
            raise CheckFailed(
                f"{case}: got a flat tensor of shape {tuple(actual.shape)}: repeat_interleave without dim "
                f"flattens its input first; pass dim=0 to repeat the rows"
            )
        if tuple(actual.shape) == (batch * kv_heads, steps * group, size):
            raise CheckFailed(f"{case}: repeated along the positions axis; repeat the rows (dim=0), one per query head")
        if kv_heads != group and tuple(actual.shape) == (batch * kv_heads * kv_heads, steps, size):
            raise CheckFailed(
                f"{case}: each row was repeated G = num_kv_heads = {kv_heads} times; each K/V head serves "
                f"H/G = {group} query heads, so repeat each row H/G times"
            )
        expect_shape(actual, expected.shape, case)
        if torch.equal(actual, expected):
            continue
        mistake = _first_match(
            actual,
            [
                (
                    "looks like `repeat` instead of `repeat_interleave`: `repeat` tiles all B*G rows, so row "
                    "b*H + h gets row (b*H + h) mod (B*G), often another example's keys; each row must be "
                    "repeated H/G times in place",
                    kv.repeat(group, 1, 1),
                ),
                (
                    "query head h got K/V head h mod G: the K/V heads were tiled within each example; "
                    "consecutive query heads share a K/V head, so query head h needs K/V head h // (H/G)",
                    kv.unflatten(0, (batch, kv_heads)).repeat(1, group, 1, 1).flatten(0, 1),
                ),
            ],
        )
        if mistake:
            raise CheckFailed(f"{case}: {mistake}")
        raise _first_difference(
            case,
            actual,
            expected,
            "kv holds 1000*b + 100*t + 10*g + j for example b, position t, K/V head g, feature j",
        )
    passed("check_expand_kv_heads", len(_KV_CASES))


# (batch, heads, queries, keys): B != H everywhere, so that unfolding the rows batch-major gives other numbers.
_AVERAGE_CASES = [(3, 2, 2, 4), (2, 3, 4, 5), (4, 2, 4, 6)]


def _folded_weights(batch: int, heads: int, queries: int, keys: int, seed: int) -> torch.Tensor:
    """(H*B, Q, K) attention weights, folded head-major, every row a different distribution over the keys."""
    scores = torch.randn(heads * batch, queries, keys, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(2.0 * scores, dim=-1)


@friendly
def check_average_heads(fn) -> None:
    """``fn(weights, num_heads)``: head-major weights (H*B, Q, K), row h*B + b -> each example's head mean (B, Q, K)."""
    for seed, (batch, heads, queries, keys) in enumerate(_AVERAGE_CASES):
        weights = _folded_weights(batch, heads, queries, keys, seed)
        case = f"weights of shape {tuple(weights.shape)}, num_heads={heads} (so B={batch})"
        actual = expect_tensor(call(fn, weights.clone(), heads, case=case), case)
        if tuple(actual.shape) == (heads, queries, keys) and heads != batch:
            raise CheckFailed(
                f"{case}: got shape {tuple(actual.shape)}, one matrix per head: you averaged over the examples; "
                f"average over the head axis, expected shape {(batch, queries, keys)}"
            )
        if tuple(actual.shape) in {(heads, batch, keys), (batch, heads, keys)} - {(batch, queries, keys)}:
            raise CheckFailed(f"{case}: got shape {tuple(actual.shape)}: you averaged over the queries, not the heads")
        expected = weights.reshape(heads, batch, queries, keys).mean(dim=0)  # (B, Q, K)
        expect_shape(actual, expected.shape, case)
        mistakes = [
            (
                "the rows were unfolded batch-major (row b*H + h, the order transpose_qkv uses), but these rows "
                "are head-major (row h*B + b): your average mixes the heads of different examples",
                weights.reshape(batch, heads, queries, keys).mean(dim=1),
            ),
            (
                "summed the heads instead of averaging them: each row of the result must still sum to 1",
                weights.reshape(heads, batch, queries, keys).sum(dim=0),
            ),
        ]
        diagnose(actual.detach().cpu(), expected, mistakes, case, atol=1e-6)
    passed("check_average_heads", len(_AVERAGE_CASES))
