"""Checks for the exercise of notebook 08 (common errors in attention code).

The exercise hands the learner a multi-head attention core with several of the
notebook's bugs in it and asks for a fixed ``fixed_attention``. The check runs
it on small seeded cases chosen so that each bug shows: one batch whose size
differs from the number of queries (a (B, K) mask then fails to broadcast), one
whose size equals it (the same mask then broadcasts silently against the query
axis), an empty example (valid length 0: -inf gives NaN), unequal lengths, head
size d > 1 (so a missing 1/sqrt(d) changes the weights) and scores large enough
that the scale matters. When a wrong answer matches one of the notebook's
mistakes, the message names it.
"""

from __future__ import annotations

import math

import torch

from ..core.attention import masked_softmax, scaled_dot_product_attention
from ..core.masks import padding_mask
from ._common import (
    CheckFailed,
    call,
    diagnose,
    expect_close,
    expect_shape,
    expect_tensor,
    friendly,
    passed,
    refusing,
)
from .nb08_smoke import SMOKE_COLUMNS, real_keys, smoke_failures

__all__ = ["check_fixed_attention", "check_smoke_predictions"]

# The exercise is to find and fix the bugs, so a finished attention refuses: the package's and PyTorch's. The
# masked softmax is allowed: section 8 names mha_tutorial.masked_softmax as the fix for the empty row.
_PACKAGE_ATTENTION = {scaled_dot_product_attention: "mha_tutorial.scaled_dot_product_attention"}
_TORCH_ATTENTION = {"scaled_dot_product_attention": "F.scaled_dot_product_attention"}

# (batch, queries, keys, heads, head_size, valid_lens, seed). Case 0 has B != Q, case 1 has B == Q and an
# empty example, case 2 has a single visible key in one example.
_CASES = [
    (2, 3, 4, 2, 3, [4, 2], 80),
    (3, 3, 5, 2, 4, [5, 0, 2], 81),
    (2, 4, 4, 3, 2, [1, 3], 82),
]


def _inputs(batch, num_queries, num_keys, heads, head_size, seed):
    g = torch.Generator().manual_seed(seed)
    D = heads * head_size
    queries = torch.randn(batch, num_queries, D, generator=g) * 2  # (B, Q, H*d); large enough for the scale to matter
    keys = torch.randn(batch, num_keys, D, generator=g) * 2  # (B, K, H*d)
    values = torch.randn(batch, num_keys, D, generator=g)  # (B, K, H*d)
    return queries, keys, values


def _split(X, heads):
    return X.unflatten(-1, (heads, -1)).transpose(1, 2)  # (B, T, H*d) -> (B, H, T, d)


def reference_attention(queries, keys, values, valid_lens, num_heads):
    """What ``fixed_attention`` must compute: per-head scaled dot-product attention with padding."""
    q, k, v = (_split(x, num_heads) for x in (queries, keys, values))  # (B, H, T, d)
    output, weights = scaled_dot_product_attention(q, k, v, valid_lens)  # (B, H, Q, d), (B, H, Q, K)
    return output.transpose(1, 2).flatten(2), weights  # (B, Q, H*d), (B, H, Q, K)


def _known_mistakes(q, k, valid_lens, shape):
    """(description, weights) for the notebook's mistakes that can be reproduced exactly with the package."""
    B, H, Q, K = shape
    d = q.shape[-1]
    raw = q @ k.transpose(-2, -1)  # (B, H, Q, K), unscaled
    scaled = raw / math.sqrt(d)
    keep_bk = padding_mask(valid_lens, K)[:, 0]  # (B, K)
    mistakes = [
        (
            f"forgot the 1/sqrt(d) scale (section 6): the scores must be q . k / sqrt(d), with d = {d} the head size",
            masked_softmax(raw, valid_lens),
        ),
        (f"divided the scores by d = {d}, not by sqrt(d) (section 6)", masked_softmax(raw / d, valid_lens)),
        (
            "the weights sit on the padding: the mask convention is inverted (section 4). True must mean 'may attend'",
            masked_softmax(scaled, mask=~padding_mask(valid_lens, K)[:, None]),
        ),
    ]
    if B == Q:  # a (B, K) mask then fits the (Q, K) axes and nothing fails
        mistakes.append(
            (
                "the (B, K) padding mask was broadcast against the query axis: with B == Q it fits (Q, K), so "
                "query i used the lengths of example i (section 3). Give the mask all its axes, "
                "keep[:, None, None, :] of shape (B, 1, 1, K)",
                masked_softmax(scaled, mask=keep_bk),
            )
        )
    if B == H:  # a (B, 1, K) mask then fits the (H, 1, K) axes
        mistakes.append(
            (
                "the (B, 1, K) padding mask was broadcast against the head axis: with B == H it fits (H, 1, K), "
                "so head h used the lengths of example h (section 3). Give the mask all its axes, "
                "keep[:, None, None, :] of shape (B, 1, 1, K)",
                masked_softmax(scaled, mask=keep_bk[:, None]),
            )
        )
    return mistakes


def _diagnose_weights(weights, expected, q, k, valid_lens, case: str) -> None:
    """Name the notebook's mistake that ``weights`` (B, H, Q, K) shows, if any; then compare values."""
    B, H, Q, K = expected.shape
    keep = padding_mask(valid_lens, K)[:, None]  # (B, 1, 1, K), True = real key
    empty = (valid_lens == 0)[:, None, None].expand(B, H, Q)  # (B, H, Q): queries with no visible key
    if torch.isnan(weights).any():
        _diagnose_nan(weights, keep, empty, case)
    if torch.isinf(weights).any():
        raise CheckFailed(f"{case}: the weights contain inf")
    if torch.allclose(weights, expected, atol=1e-5, rtol=1e-5):
        return  # right: the diagnosis of wrong weights below does not apply
    mistakes = _known_mistakes(q, k, valid_lens, expected.shape)
    diagnose(weights, expected, mistakes, case, atol=1e-5, rtol=1e-5, otherwise=None, mistake_atol=1e-4)
    if empty.any():
        _diagnose_empty_rows(weights[empty], K, case)  # (n, K)
    _diagnose_row_sums(weights, keep, empty, valid_lens, case)
    on_padding = (weights * ~keep).sum().item()
    if on_padding > 1e-6:
        raise CheckFailed(f"{case}: padded keys got weight {on_padding:.3g} in total; they must get exactly 0")
    expect_close(weights, expected, case + " (weights)", atol=1e-5)


def _diagnose_nan(weights, keep, empty, case: str) -> None:
    """Weights with NaN: which mistake puts it where it is. ``keep`` (B, 1, 1, K), ``empty`` (B, H, Q)."""
    nan = torch.isnan(weights)  # (B, H, Q, K)
    padded = ~keep.expand(nan.shape)  # (B, H, Q, K): True where the key is padding
    if torch.equal(nan, padded) and not padded[~empty].all():
        raise CheckFailed(
            f"{case}: NaN in every column of a padded key, for all queries: the softmax runs over the queries "
            "(section 5), and a column that is all -inf gives 0 / 0 = NaN. The softmax must be over the keys, "
            "dim=-1"
        )
    if torch.isnan(weights[empty]).all() and not torch.isnan(weights[~empty]).any():
        raise CheckFailed(
            f"{case}: NaN on the rows of the empty example (valid length 0). Filling masked scores with -inf "
            "makes a row with no visible key 0 / 0 = NaN (section 8); fill with torch.finfo(dtype).min and "
            "zero the empty rows, or call mha_tutorial.masked_softmax(scores, valid_lens)"
        )
    raise CheckFailed(
        f"{case}: the weights contain NaN on rows of examples that do have visible keys. A padding mask "
        "broadcast along the wrong axis (a (B, K) mask meeting the query axis, or a (B, 1, K) mask the head "
        "axis; section 3) can hide every key of such a row, and -inf then gives 0 / 0 = NaN (section 8)"
    )


def _diagnose_empty_rows(rows, num_keys: int, case: str) -> None:
    """The rows (n, K) of the queries of an empty example (valid length 0) must be zeros."""
    if torch.allclose(rows, torch.full_like(rows, 1.0 / num_keys), atol=1e-3):
        raise CheckFailed(
            f"{case}: the queries of the empty example (valid length 0) got uniform weights 1/{num_keys}: with a "
            "large negative fill every score of such a row is equal, so softmax spreads the row evenly over the "
            "padding (section 8). A query with no visible key must get a row of zeros"
        )
    if (rows != 0).any():
        raise CheckFailed(
            f"{case}: the queries of the empty example (valid length 0) must get weights of exactly 0, "
            f"got a row summing to {rows.sum(-1).max().item():.3g}"
        )


def _diagnose_row_sums(weights, keep, empty, valid_lens, case: str) -> None:
    """Every query with a visible key has weights summing to 1; if not, the axis the softmax ran over."""
    B, H, Q, K = weights.shape
    row_sums = weights[~empty].sum(-1)  # rows that have a visible key
    if torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-4):
        return
    col_sums = weights.sum(-2)  # (B, H, K)
    visible = keep[:, :, 0].expand(B, H, K) & ~(valid_lens == 0)[:, None, None]  # (B, H, K)
    if torch.allclose(col_sums[visible], torch.ones(int(visible.sum())), atol=1e-4):
        raise CheckFailed(
            f"{case}: each key's weights sum to 1 over the queries, and the rows do not: the softmax runs over "
            "the wrong axis (section 5). It must be over the keys, dim=-1"
        )
    head_sums = weights.sum(1, keepdim=True).expand(B, H, Q, K)[~empty]  # (n, K), summed over the heads
    if torch.allclose(head_sums, torch.ones_like(head_sums), atol=1e-4):
        raise CheckFailed(
            f"{case}: the weights sum to 1 over the heads: the softmax runs over the head axis, dim=1, of the "
            "(B, H, Q, K) scores (section 5). It must be over the keys, dim=-1"
        )
    raise CheckFailed(
        f"{case}: the weights of a query must sum to 1 over its visible keys; row sums range from "
        f"{row_sums.min().item():.3g} to {row_sums.max().item():.3g}"
    )


@friendly
def check_fixed_attention(fixed_attention) -> None:
    """``fixed_attention(queries, keys, values, valid_lens, num_heads)`` -> (output, weights).

    queries (B, Q, H*d), keys and values (B, K, H*d), valid_lens (B,) -> output (B, Q, H*d) and
    weights (B, H, Q, K): per-head scaled dot-product attention that ignores padded keys and gives a
    query with no visible key a row of zero weights.
    """
    for batch, num_queries, num_keys, heads, head_size, lens, seed in _CASES:
        queries, keys, values = _inputs(batch, num_queries, num_keys, heads, head_size, seed)
        valid_lens = torch.tensor(lens)
        case = (
            f"fixed_attention(queries {tuple(queries.shape)}, keys {tuple(keys.shape)}, valid_lens={lens}, "
            f"num_heads={heads})"
        )
        leaves = [t.clone().requires_grad_() for t in (queries, keys, values)]  # to backpropagate through the answer
        with refusing(_PACKAGE_ATTENTION, _TORCH_ATTENTION):
            result = call(fixed_attention, *(t * 1 for t in leaves), valid_lens.clone(), heads, case=case)
        if not isinstance(result, tuple) or len(result) != 2:
            raise CheckFailed(f"{case}: return a pair (output, weights), got {type(result).__name__}")
        output, weights = (expect_tensor(x, case).detach().float().cpu() for x in result)
        expected_output, expected_weights = reference_attention(queries, keys, values, valid_lens, heads)
        expect_shape(weights, expected_weights.shape, case + " (weights, (B, H, Q, K))")
        expect_shape(output, expected_output.shape, case + " (output, (B, Q, H*d))")
        q, k = _split(queries, heads), _split(keys, heads)  # (B, H, T, d)
        _diagnose_weights(weights, expected_weights, q, k, valid_lens, case)
        if not torch.allclose(output, expected_output, atol=1e-5, rtol=1e-5):
            per_head = expected_weights @ _split(values, heads)  # (B, H, Q, d)
            if torch.allclose(output, per_head.reshape(output.shape), atol=1e-5):
                raise CheckFailed(
                    f"{case}: the weights are right but the heads were merged in the wrong order: reshaping "
                    "(B, H, Q, d) straight to (B, Q, H*d) mixes heads and positions; transpose(1, 2) first"
                )
        expect_close(output, expected_output, case + " (output)", atol=1e-5)
        _expect_finite_gradients(result[0], leaves, case)
    passed("check_fixed_attention", len(_CASES))


def _expect_finite_gradients(output, leaves, case: str) -> None:
    """A right forward pass whose backward pass puts NaN in the inputs' gradients (a -inf fill patched afterwards)."""
    if not output.requires_grad:
        return
    output.float().pow(2).sum().backward()
    if any(t.grad is not None and t.grad.isnan().any() for t in leaves):
        raise CheckFailed(
            f"{case}: the outputs are right but the gradients hold NaN: a -inf fill patched after the softmax "
            "(nan_to_num, masked_fill, where) still sends 0 * NaN back through it (section 8); fill the masked "
            "scores with torch.finfo(dtype).min instead, then zero the rows with no visible key"
        )


# Exercise 2: predict which checks of section 12's smoke test three new buggy variants fail. The check runs
# the package's copy of the smoke test (nb08_smoke) on its own copy of the variants, so the truth is measured, not
# stored.
def _renormalised(q, k, v, valid_lens):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Q, K)
    weights = scores.softmax(dim=-1).masked_fill(~real_keys(valid_lens, k.shape[-2]), 0.0)  # padded keys set to 0
    weights = weights / weights.sum(-1, keepdim=True)  # each row divided by its sum: 0 / 0 on an empty row
    return weights @ v, weights


def _mask_multiplied(q, k, v, valid_lens):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Q, K)
    weights = (scores * real_keys(valid_lens, k.shape[-2])).softmax(dim=-1)  # padded scores set to 0, not hidden
    return weights @ v, weights


def _b1k_mask(q, k, v, valid_lens):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Q, K)
    keep = padding_mask(valid_lens, k.shape[-2])  # (B, 1, K): right for (B, Q, K) scores, not for (B, H, Q, K)
    weights = scores.masked_fill(~keep, torch.finfo(scores.dtype).min).softmax(dim=-1)
    return weights @ v, weights


SMOKE_VARIANTS = {
    "A: renormalised": _renormalised,
    "B: mask multiplied": _mask_multiplied,
    "C: (B, 1, K) mask": _b1k_mask,
}

# Why each variant passes or fails each check; the message quotes the one the prediction got wrong.
_NOT_RUN = "the function raised, so this check is not run ('-')"
_WHY = {
    "A: renormalised": {
        "runs": "every operation is valid, so it runs",
        "rows sum to 1": "where a key is visible, dividing by the row sum gives exactly the masked softmax, "
        "so those rows sum to 1",
        "masked = 0": "the empty example's rows are all zeros before the division, and 0 / 0 = NaN: "
        "its masked weights are NaN, not 0",
        "no NaN": "the empty example's rows are 0 / 0 = NaN, in the output, the weights and the gradients",
        "= F.sdpa": "the empty example's output is NaN, and NaN equals nothing",
    },
    "B: mask multiplied": {
        "runs": "multiplying by a bool tensor is valid, so it runs",
        "rows sum to 1": "the softmax still normalises each row over all keys, so rows sum to 1",
        "masked = 0": "a padded score times 0 is 0, and exp(0) = 1: the padded keys keep weight "
        "(like section 10's float mask, it hides nothing)",
        "no NaN": "no -inf is used, so there is no 0 / 0",
        "= F.sdpa": "the padded keys keep weight, so the output differs",
    },
    "C: (B, 1, K) mask": {
        "runs": "a (B, 1, K) mask lines up from the right with (B, H, Q, K) as (1, B, 1, K): its B = 3 meets "
        "H = 2, and masked_fill raises a size error (section 3)",
        "rows sum to 1": _NOT_RUN,
        "masked = 0": _NOT_RUN,
        "no NaN": _NOT_RUN,
        "= F.sdpa": _NOT_RUN,
    },
}


@friendly
def check_smoke_predictions(predicted_failures) -> None:
    """``predicted_failures()`` -> {variant: set of the smoke test's columns it fails}, for SMOKE_VARIANTS."""
    case = "predicted_failures()"
    predictions = call(predicted_failures, case=case)
    if not isinstance(predictions, dict) or set(predictions) != set(SMOKE_VARIANTS):
        raise CheckFailed(f"{case}: return a dict with one entry per variant, keys {sorted(SMOKE_VARIANTS)}")
    for name, fn in SMOKE_VARIANTS.items():
        predicted = predictions[name]
        if not isinstance(predicted, (set, frozenset, list, tuple)) or not set(predicted) <= set(SMOKE_COLUMNS):
            raise CheckFailed(f"{case}[{name!r}]: give a set of column names, each one of {SMOKE_COLUMNS}")
        actual = smoke_failures(fn)
        for column in SMOKE_COLUMNS:
            if (column in predicted) != (column in actual):
                said, truth = ("fails", "passes") if column in predicted else ("passes", "fails")
                if name.startswith("C") and column != "runs":
                    said, truth = ("fails", "is not run")
                raise CheckFailed(
                    f"{name}: you predicted that it {said} '{column}', but it {truth}: {_WHY[name][column]}"
                )
    passed("check_smoke_predictions", len(SMOKE_VARIANTS))
