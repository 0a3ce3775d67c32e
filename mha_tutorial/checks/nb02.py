"""Checks for the exercises of notebook 02 (masking).

Every mask here uses the package's convention: a bool tensor where True means
"this query may attend to this key" (the convention of
``F.scaled_dot_product_attention``). When a wrong answer matches a typical
mistake -- the inverted convention, a packed mask missing its document or its
causal part, an off-by-one length, NaN or a uniform row where a query sees no
key -- the failure message names it.
"""

from __future__ import annotations

import torch

from ..core import attention, masks
from ..core.attention import masked_softmax
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

# What the exercises ask the learner to write, already in the package: calling it is refused.
_PACKAGE_PADDING = {
    masks.padding_mask: "mha_tutorial.padding_mask",
    masks.combine_masks: "mha_tutorial's combine_masks",
}
_PACKAGE_MASKED_SOFTMAX = {
    attention.masked_softmax: "mha_tutorial.masked_softmax",
    attention._softmax_over_keys: "the package's masked softmax",
    attention.scaled_dot_product_attention: "mha_tutorial.scaled_dot_product_attention",
    masks.padding_mask: "mha_tutorial.padding_mask (build the mask yourself, as in Exercise 1)",
}

__all__ = ["check_packed_mask", "check_padding_mask", "check_masked_softmax"]

_INVERTED = (
    "mask convention inverted: True must mean 'may attend' (the convention of F.scaled_dot_product_attention); "
    "you returned nn.MultiheadAttention's convention, where True means 'ignore'"
)


def _expect_bool_mask(actual, shape: tuple, case: str) -> torch.Tensor:
    actual = expect_tensor(actual, case)
    if actual.dtype != torch.bool:
        raise CheckFailed(
            f"{case}: the mask has dtype {actual.dtype}; return a bool tensor (True = may attend). "
            "A float 0/1 or 0/-inf mask means something different to attention code (it is *added* to the scores)"
        )
    expect_shape(actual, shape, case)
    return actual.cpu()


def _mask_difference(actual: torch.Tensor, expected: torch.Tensor, case: str) -> None:
    where = tuple(int(i) for i in (actual != expected).nonzero()[0])
    raise CheckFailed(
        f"{case}: wrong mask, first at index {where}: got {bool(actual[where])}, expected {bool(expected[where])}"
        f"\nexpected:\n{expected.int()}\ngot:\n{actual.int()}"
    )


# --------------------------------------------------------------------------- Exercise 3 (packed documents)


def _packed_reference(segment_ids: torch.Tensor) -> torch.Tensor:
    """(B, T, T) keep-mask by plain loops: query i sees key j when both share a document and j <= i."""
    ids = segment_ids.tolist()
    B, T = len(ids), len(ids[0])
    keep = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(i + 1):
                keep[b, i, j] = ids[b][i] == ids[b][j]
    return keep


def _packed_cases() -> list[torch.Tensor]:
    """Packed rows of document ids: B = 1 and > 1, one document, one token per document, documents of length 1,
    ids that neither start at 0 nor count up by 1."""
    return [
        torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 2, 2]]),
        torch.tensor([[3, 3, 3, 3]]),
        torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]),
        torch.tensor([[7, 7, 2, 2, 2, 9, 9], [4, 4, 4, 4, 4, 4, 1], [8, 5, 5, 6, 6, 6, 6]]),
        torch.tensor([[0], [5]]),
    ]


def _expect_packed_shape(actual, B: int, T: int, case: str) -> None:
    """Name the shapes a packed mask typically comes out in, before any value is compared."""
    shape = tuple(actual.shape)
    if shape == (B, T, T):
        return
    wrong = f"{case}: shape {shape}, expected (B, T, T) = {(B, T, T)}"
    if shape == (B, T):
        raise CheckFailed(f"{wrong}. That is one value per token; the mask needs one per (query, key) pair")
    if shape == (T, T):
        raise CheckFailed(
            f"{wrong}: the batch axis is missing. Every row of the batch packs different documents, so each "
            "example needs its own (T, T) mask"
        )
    if B != T and shape == (B, B, T):
        raise CheckFailed(
            f"{wrong}: you compared (B, 1, T) with (1, B, T), so examples met examples. Add the new axes next to "
            "the token axis: segment_ids[:, :, None] is (B, T, 1) and segment_ids[:, None, :] is (B, 1, T)"
        )
    if actual.dim() == 4 and actual.numel() == B * T * T:
        raise CheckFailed(
            f"{wrong}: an extra axis. Return (B, T, T); the head axis is added only where the mask meets "
            "(B, H, Q, K) scores (mask[:, None])"
        )
    raise CheckFailed(wrong)


def _packed_mistakes(segment_ids: torch.Tensor, expected: torch.Tensor):
    """(what the message says, what that mistake computes) for the typical wrong packed masks."""
    B, T = segment_ids.shape
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # (B, T, T)
    lower = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
    yield _INVERTED, ~expected
    yield (
        "the causal part is missing: a token sees the *later* tokens of its own document (its future). "
        "Combine the same-document mask with the causal triangle (key j <= query i) using &",
        same,
    )
    yield (
        "the document part is missing: this is a plain causal mask, so a token also sees every earlier document "
        "in its row. Also require segment_ids[b, i] == segment_ids[b, j], and combine the two masks with &",
        lower.expand(B, T, T),
    )
    yield (
        "the comparison is transposed: query i sees the keys j >= i of its document (the upper triangle, the "
        "future); a causal mask keeps the keys j <= i (the lower triangle)",
        same & lower.T,
    )
    yield (
        "off-by-one on the diagonal: each token must also see itself (key j = i); the first token of a document "
        "then sees exactly one key, itself",
        same & lower.tril(-1),
    )
    yield (
        "every query sees only itself: that is what comparing positions (i == j) gives. Compare the *document "
        "ids* of query i and key j, segment_ids[b, i] == segment_ids[b, j], not their positions",
        torch.eye(T, dtype=torch.bool).expand(B, T, T),
    )
    yield (
        "every example got the mask of example 0: compare the ids of each row b with that same row",
        expected[:1].expand(B, T, T) if B > 1 else None,
    )


@friendly
def check_packed_mask(my_packed_mask) -> None:
    """``my_packed_mask(segment_ids)``: ids (B, T) -> bool (B, T, T), True where query i may see key j."""
    cases = _packed_cases()
    for segment_ids in cases:
        B, T = segment_ids.shape
        case = f"my_packed_mask(segment_ids={segment_ids.tolist()})"
        given = segment_ids.clone()
        actual = expect_tensor(call(my_packed_mask, given, case=case), case)
        if not torch.equal(given, segment_ids):
            raise CheckFailed(
                f"{case}: your function changed segment_ids in place (an operation ending in _, or an "
                "assignment into the input): build new tensors and leave the input as it was"
            )
        _expect_packed_shape(actual, B, T, case)
        if actual.dtype != torch.bool:
            raise CheckFailed(
                f"{case}: the mask has dtype {actual.dtype}; return a bool tensor (True = may attend). Comparisons "
                "already give bool tensors, and & combines them; a float 0/1 mask would be *added* to the scores"
            )
        expected = _packed_reference(segment_ids)
        diagnose(actual.cpu(), expected, _packed_mistakes(segment_ids, expected), case, otherwise=_mask_difference)
    passed("check_packed_mask", len(cases))


# --------------------------------------------------------------------------- Exercise 1 (padding mask)


@friendly
def check_padding_mask(my_padding_mask) -> None:
    """``my_padding_mask(valid_lens, num_keys)`` -> bool (B, 1, K) for (B,) lengths, (B, Q, K) for (B, Q)."""
    cases = [
        (torch.tensor([3, 1, 4]), 4),
        (torch.tensor([0, 2]), 3),
        (torch.tensor([5]), 5),
        (torch.tensor([[1, 2, 3], [2, 2, 0]]), 3),
        (torch.tensor([[4, 1], [0, 3], [2, 2]]), 4),
    ]
    for valid_lens, num_keys in cases:
        case = f"my_padding_mask(valid_lens={valid_lens.tolist()}, num_keys={num_keys})"
        with refusing(_PACKAGE_PADDING):
            actual = expect_tensor(call(my_padding_mask, valid_lens.clone(), num_keys, case=case), case)
        expected = padding_mask(valid_lens, num_keys)
        B = valid_lens.shape[0]
        if valid_lens.dim() == 1 and tuple(actual.shape) == (B, num_keys):
            raise CheckFailed(
                f"{case}: shape {(B, num_keys)}, expected {tuple(expected.shape)}. Without the middle query axis, "
                "a (B, K) mask broadcasts against (B, Q, K) scores as if B were the query axis: every example "
                "would be masked with another example's lengths. Add the axis: (B, 1, K)"
            )
        if valid_lens.dim() == 2 and tuple(actual.shape) != tuple(expected.shape):
            raise CheckFailed(
                f"{case}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}. With 2-D valid_lens (B, Q) "
                "each query has its own length, so the mask has one row per query: compare positions (K,) with "
                "valid_lens[..., None] (B, Q, 1)"
            )
        actual = _expect_bool_mask(actual, tuple(expected.shape), case)
        positions = torch.arange(num_keys)
        lens = valid_lens[:, None, None] if valid_lens.dim() == 1 else valid_lens[..., None]
        mistakes = [
            (_INVERTED + " (True on the padding)", ~expected),
            (
                "off-by-one: valid_lens counts the visible keys, so key j is visible when j < valid_len (not <=)",
                positions <= lens,
            ),
            ("off-by-one: key j is visible when j < valid_len (you used j < valid_len - 1)", positions < lens - 1),
        ]
        diagnose(actual, expected, mistakes, case, otherwise=_mask_difference)
    passed("check_padding_mask", len(cases))


# --------------------------------------------------------------------------- Exercise 2 (masked softmax)


def _seeded_scores(shape, seed, dtype=torch.float32):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


def _masked_softmax_cases():
    """(description, scores, valid_lens), seeded; some rows see no key, and two cases are half precision."""
    return [
        ("float32 scores (2, 3, 4), valid_lens [2, 4]", _seeded_scores((2, 3, 4), 30), torch.tensor([2, 4])),
        ("float32 scores (3, 2, 5), valid_lens [5, 1, 3]", _seeded_scores((3, 2, 5), 31), torch.tensor([5, 1, 3])),
        (
            "float32 scores (2, 3, 4), valid_lens [0, 3] (example 0 has no visible key)",
            _seeded_scores((2, 3, 4), 32),
            torch.tensor([0, 3]),
        ),
        (
            "float32 scores (2, 3, 4), 2-D valid_lens [[1, 0, 3], [4, 4, 2]]",
            _seeded_scores((2, 3, 4), 33),
            torch.tensor([[1, 0, 3], [4, 4, 2]]),
        ),
        (
            "float16 scores (2, 3, 4), valid_lens [0, 2]",
            _seeded_scores((2, 3, 4), 34, torch.float16),
            torch.tensor([0, 2]),
        ),
        (
            "bfloat16 scores (2, 3, 4), valid_lens [3, 0]",
            _seeded_scores((2, 3, 4), 35, torch.bfloat16),
            torch.tensor([3, 0]),
        ),
    ]


_FP16_HINT = (
    "\nHint: a constant such as -1e9 does not fit in float16 (its largest magnitude is 65504). "
    "Use torch.finfo(scores.dtype).min, which exists in every floating dtype"
)

_TWO_D_HINT = (
    "\nHint: here valid_lens is 2-D, (B, Q): it already has the query axis, so it needs *fewer* new axes, "
    "not more: only the key axis, valid_lens[..., None] of shape (B, Q, 1). valid_lens[:, None, None] suits "
    "1-D lengths only"
)


def _expect_empty_rows_zero(actual_f, scores, keep, case: str) -> None:
    """No NaN or inf anywhere, and a row that sees no key is zeros (not NaN, not uniform)."""
    empty = ~keep.any(dim=-1).expand(scores.shape[:-1])  # (B, Q): rows with no visible key
    if torch.isnan(actual_f[empty]).any():
        raise CheckFailed(
            f"{case}: NaN on a fully-masked row: filling every score of a row with -inf gives "
            "exp(-inf) / sum = 0 / 0 = NaN. A query that may see no key must get a row of zeros"
        )
    if torch.isnan(actual_f).any() or torch.isinf(actual_f).any():
        raise CheckFailed(f"{case}: the result contains NaN or inf on rows that do have visible keys")
    K = scores.shape[-1]
    if empty.any() and torch.allclose(actual_f[empty], torch.full_like(actual_f[empty], 1.0 / K), atol=2e-3):
        raise CheckFailed(
            f"{case}: uniform instead of zero rows: a fully-masked row came out as 1/K = {1 / K:.3g} for every "
            "key (a large negative fill makes all its scores equal, so softmax spreads the weight evenly, "
            "over padding). Set the rows with no visible key to zero"
        )


def _expect_padding_zero(actual_f, scores, valid_lens, keep, case: str) -> None:
    """Every padded key gets exactly 0; an inverted mask or an off-by-one length is named."""
    inverted = masked_softmax(scores.float(), mask=~keep.expand(scores.shape))
    if torch.allclose(actual_f, inverted, atol=2e-3):
        raise CheckFailed(f"{case}: {_INVERTED}: the weights sit on the padded keys")
    if (actual_f.masked_select(~keep.expand(scores.shape)).abs() > 0).any():
        lens = valid_lens[:, None, None] if valid_lens.dim() == 1 else valid_lens[..., None]
        off_by_one = masked_softmax(scores.float(), mask=torch.arange(scores.shape[-1]) <= lens)
        if torch.allclose(actual_f, off_by_one, atol=2e-3):
            raise CheckFailed(f"{case}: off-by-one: key j is visible when j < valid_len (you used <=)")
        raise CheckFailed(f"{case}: a masked (padded) key got a non-zero weight; masked keys must get exactly 0")


def _expect_no_key_missing(actual_f, scores, valid_lens, case: str) -> None:
    """Name the off-by-one that hides the last visible key (positions counted from 1, compared with <)."""
    lens = valid_lens[:, None, None] if valid_lens.dim() == 1 else valid_lens[..., None]
    fewer = (torch.arange(scores.shape[-1]) < lens - 1).expand(scores.shape)  # (B, Q, K)
    rows = fewer.any(dim=-1)  # (B, Q): rows that still see a key under the mistake
    if not rows.any():
        return
    one_short = masked_softmax(scores.float(), mask=fewer)
    if torch.allclose(actual_f[rows], one_short[rows], atol=2e-3):
        raise CheckFailed(
            f"{case}: off-by-one, one key too few: the last visible key got weight 0. Keys are counted from 0, "
            "so the first valid_len keys are j = 0, ..., valid_len - 1: key j is visible when j < valid_len "
            "(positions 1..K compared with < valid_len leave one out)"
        )


def _check_gradient(my_masked_softmax) -> None:
    """The gradient must be finite too: a NaN gradient poisons every parameter in one optimiser step."""
    case = "gradient through a fully-masked row (float32, valid_lens [0, 2])"
    scores = _seeded_scores((2, 3, 4), 36).requires_grad_()
    with refusing(_PACKAGE_MASKED_SOFTMAX):
        out = call(my_masked_softmax, scores, torch.tensor([0, 2]), case=case)
    upstream = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / out.numel()
    try:
        (out * upstream).sum().backward()
    except RuntimeError as e:
        raise CheckFailed(
            f"{case}: backward failed ({e}); build the result from differentiable tensor operations"
        ) from None
    if scores.grad is None or not torch.isfinite(scores.grad).all():
        raise CheckFailed(
            f"{case}: the forward pass is right but the gradient contains NaN. torch.where / nan_to_num hide the "
            "NaN of a softmax over all -inf in the forward pass, but its backward is NaN (NaN * 0 = NaN), and a "
            "-inf mask that was *added* to the scores passes that NaN back to them (masked_fill would drop it). "
            "Avoid the NaN altogether: fill masked scores with torch.finfo(dtype).min, then zero the empty rows"
        )
    ref = scores.detach().clone().requires_grad_()
    (masked_softmax(ref, torch.tensor([0, 2])) * upstream).sum().backward()
    expect_close(scores.grad, ref.grad, case + " (gradient)", atol=1e-5)


@friendly
def check_masked_softmax(my_masked_softmax) -> None:
    """``my_masked_softmax(scores, valid_lens)``: zeros on padded keys, zero rows when nothing is visible."""
    cases = _masked_softmax_cases()
    for case, scores, valid_lens in cases:
        hint = _FP16_HINT if scores.dtype != torch.float32 else _TWO_D_HINT if valid_lens.dim() == 2 else ""
        with refusing(_PACKAGE_MASKED_SOFTMAX):
            actual = call(my_masked_softmax, scores.clone(), valid_lens.clone(), case=case, hint=hint)
        actual = expect_tensor(actual, case)
        expected = masked_softmax(scores, valid_lens)
        expect_shape(actual, expected.shape, case)
        if actual.dtype != scores.dtype:
            raise CheckFailed(
                f"{case}: the result has dtype {actual.dtype}; keep the dtype of the scores "
                f"({scores.dtype}) (adding a float32 mask to half-precision scores silently upcasts)"
            )
        keep = padding_mask(valid_lens, scores.shape[-1])  # (B, 1 or Q, K)
        actual_f = actual.detach().float().cpu()
        _expect_empty_rows_zero(actual_f, scores, keep, case)
        _expect_padding_zero(actual_f, scores, valid_lens, keep, case)
        tol = 1e-5 if scores.dtype == torch.float32 else 1e-2
        if not torch.allclose(actual_f, expected.float(), atol=tol, rtol=tol):
            _expect_no_key_missing(actual_f, scores, valid_lens, case)
        expect_close(actual_f, expected.float(), case, atol=tol, rtol=tol)
    _check_gradient(my_masked_softmax)
    passed("check_masked_softmax", len(cases) + 1)
