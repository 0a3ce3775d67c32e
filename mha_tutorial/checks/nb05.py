"""Checks for the exercises of notebook 05 (training a tiny transformer).

* ``check_decoder_mask``: the self-attention mask of a causal decoder on a
  *left*-padded batch (the layout of batched generation).
* ``check_masked_loss_and_accuracy``: the loss over the positions where ``loss_mask``
  is True, and the whole-sequence accuracy (a sequence is right only if every
  counted position is), the metric that dates uses.
* ``check_greedy_decode``: the greedy decoding loop of the encoder-decoder,
  run on the committed ``dates`` checkpoint and on an untrained model.

Each compares with the package's own code on small seeded cases and, when the
answer is wrong, tries a list of typical mistakes to name the one that was made.

Exercise 3 lives in ``_nb05_greedy`` and notebook 05a's ``check_to_torch_attention`` in ``_nb05_torch``; both are
re-exported here.
"""

from __future__ import annotations

import numbers

import torch
from torch.nn import functional as F

from ..core.masks import causal_mask
from ._common import CheckFailed, call, expect_shape, expect_tensor, friendly, passed
from ._nb05_greedy import check_greedy_decode
from ._nb05_torch import _to_torch as _to_torch
from ._nb05_torch import check_to_torch_attention

__all__ = ["check_decoder_mask", "check_masked_loss_and_accuracy", "check_greedy_decode", "check_to_torch_attention"]


# --------------------------------------------------------------------------- Exercise 1


def reference_decoder_mask(valid_lens: torch.Tensor, num_steps: int) -> torch.Tensor:
    """(B, T, T) bool: query i of example b may see key j iff j <= i and j is one of its real (last) tokens."""
    first_real = num_steps - valid_lens  # (B,): index of example b's first real token
    real_key = torch.arange(num_steps)[None, :] >= first_real[:, None]  # (B, K)
    return causal_mask(num_steps)[None] & real_key[:, None, :]  # (1, Q, K) & (B, 1, K) -> (B, Q, K)


def _decoder_mask_mistakes(valid_lens: torch.Tensor, T: int) -> list:
    expected = reference_decoder_mask(valid_lens, T)
    B = len(valid_lens)
    pos = torch.arange(T)
    causal = causal_mask(T)[None].expand(B, T, T)  # (B, Q, K)
    left_real = (pos[None, :] >= (T - valid_lens)[:, None])[:, None, :]  # (B, 1, K): keys that are real tokens
    right_real = (pos[None, :] < valid_lens[:, None])[:, None, :]  # (B, 1, K): as if the padding were on the right
    lower_strict = torch.ones(T, T, dtype=torch.bool).tril(-1)[None]
    return [
        (
            "mask convention inverted: True must mean 'may attend' (the convention of "
            "F.scaled_dot_product_attention and of this package)",
            ~expected,
        ),
        (
            "forgot the padding: this is the causal mask alone, so real tokens may still attend to the <pad> "
            "tokens to their left. (With right padding that would be harmless, with left padding it is not)",
            causal,
        ),
        (
            "treated the batch as right-padded (real keys 0 .. valid_lens[b] - 1); here the padding is on the "
            "left: example b's real tokens are its *last* valid_lens[b] positions, num_steps - valid_lens[b] .. "
            "num_steps - 1",
            causal & right_real,
        ),
        (
            "valid_lens counts the real tokens, not the padding: example b has num_steps - valid_lens[b] <pad> "
            "tokens on the left",
            causal & (pos[None, :] >= valid_lens[:, None])[:, None, :],
        ),
        (
            "forgot the causal part: every token may look at the tokens after it (the future)",
            left_real.expand(B, T, T),
        ),
        (
            "upper triangle: query i would see the future keys j > i; keep the lower triangle (j <= i)",
            causal.transpose(1, 2) & left_real,
        ),
        (
            "query and key axes swapped: mask[b, i, j] must say whether query i may attend to key j, so the "
            "padding belongs on the last axis (the keys)",
            expected.transpose(1, 2),
        ),
        (
            "off-by-one on the diagonal: each token must also see itself (key j = i); use tril with diagonal 0",
            lower_strict & left_real,
        ),
    ]


_DECODER_MASK_CASES = [([4, 2, 5], 5), ([3, 1], 4), ([6, 1, 3], 6), ([3], 3)]


@friendly
def check_decoder_mask(fn) -> None:
    """``fn(valid_lens, num_steps)`` -> bool (B, T, T): causal self-attention on a left-padded batch."""
    for lens, T in _DECODER_MASK_CASES:
        valid_lens = torch.tensor(lens)
        case = f"decoder_mask(valid_lens=torch.tensor({lens}), num_steps={T})"
        actual = expect_tensor(call(fn, valid_lens.clone(), T, case=case), case)
        B = len(lens)
        if tuple(actual.shape) == (B, 1, T, T):
            raise CheckFailed(
                f"{case}: shape {tuple(actual.shape)} has a head axis; return (B, T, T) = {(B, T, T)} "
                "(MultiHeadAttention broadcasts a (B, T, T) mask over the heads itself)"
            )
        expect_shape(actual, (B, T, T), case)
        if actual.dtype != torch.bool:
            raise CheckFailed(
                f"{case}: the mask has dtype {actual.dtype}; return a bool tensor (True = may attend). A float "
                "0/1 or 0/-inf mask is *added* to the scores by attention code, which means something else"
            )
        actual = actual.cpu()
        expected = reference_decoder_mask(valid_lens, T)
        if torch.equal(actual, expected):
            continue
        for message, wrong in _decoder_mask_mistakes(valid_lens, T):
            if torch.equal(actual, wrong):
                raise CheckFailed(f"{case}: {message}")
        where = tuple(int(i) for i in (actual != expected).nonzero()[0])
        raise CheckFailed(
            f"{case}: wrong mask, first at index {where} (example, query, key): got {bool(actual[where])}, "
            f"expected {bool(expected[where])}\nexpected:\n{expected.int()}\ngot:\n{actual.int()}"
        )
    passed("check_decoder_mask", len(_DECODER_MASK_CASES))


# --------------------------------------------------------------------------- Exercise 2


def reference_masked_loss_and_accuracy(logits, targets, loss_mask):
    """Mean cross-entropy over the positions where ``loss_mask`` is True, and the fraction of sequences whose
    counted positions are all right (positions outside ``loss_mask`` do not matter)."""
    loss = F.cross_entropy(logits[loss_mask], targets[loss_mask])
    right = (logits.argmax(-1) == targets) | ~loss_mask  # (B, T): an uncounted position never spoils a sequence
    accuracy = float(right.all(dim=1).float().mean())
    return loss, accuracy


def _loss_cases():
    """(logits, targets, loss_mask, description), seeded; the masks count different numbers per row, every row
    counts at least one position; row 0 is right exactly where it counts, row 1
    nowhere, row 2 everywhere."""
    g = torch.Generator().manual_seed(5)
    cases = []
    for B, T, V, counts in [(4, 6, 6, [1, 4, 2, 6]), (5, 5, 7, [3, 1, 2, 5, 4]), (4, 4, 9, [2, 3, 1, 4])]:
        logits = 2 * torch.randn(B, T, V, generator=g)  # (B, T, V)
        targets = torch.randint(0, V, (B, T), generator=g)  # (B, T)
        hit = torch.rand(B, T, generator=g) < 0.5  # make about half of the positions right
        targets = torch.where(hit, logits.argmax(-1), targets)
        loss_mask = torch.zeros(B, T, dtype=torch.bool)
        for b, n in enumerate(counts):
            start = int(torch.randint(0, T - n + 1, (1,), generator=g))
            loss_mask[b, start : start + n] = True
        best = logits[0].argmax(-1)  # (T,)
        targets[0] = torch.where(loss_mask[0], best, (best + 1) % V)  # right where it counts, wrong elsewhere
        targets[1] = (logits[1].argmax(-1) + 1) % V  # wrong everywhere
        targets[2] = logits[2].argmax(-1)  # right everywhere
        case = f"B={B}, T={T}, V={V}, positions counted per sequence {counts}"
        cases.append((logits, targets, loss_mask, case))
    return cases


def _per_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over sequences of each sequence's mean over its counted positions (0/0 gives NaN)."""
    per_seq = (values * mask).sum(1) / mask.sum(1)  # (B,)
    return float(per_seq.mean())


def _loss_mistakes(logits, targets, mask):
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
    return [
        ("averaged over every position: positions where loss_mask is False must not count", ce.mean()),
        (
            "(ce * loss_mask).mean() divides by all B*T positions; divide by the number of counted positions "
            "(loss_mask.sum()) instead",
            (ce * mask).sum() / mask.numel(),
        ),
        ("returned the sum over the counted positions; the loss is their mean", ce[mask].sum()),
        ("loss_mask inverted: True marks the positions that count", ce[~mask].mean()),
        (
            "applied softmax before F.cross_entropy: it takes raw logits (it computes log_softmax itself), so "
            "the probabilities were squashed twice",
            F.cross_entropy(logits.softmax(-1)[mask], targets[mask]),
        ),
        (
            "averaged per sequence first, then over the batch: every counted position must weigh the same, "
            "whatever the length of its sequence",
            torch.tensor(_per_sequence_mean(ce, mask)),
        ),
    ]


def _accuracy_mistakes(logits, targets, mask):
    right = logits.argmax(-1) == targets  # (B, T)
    whole = (right | ~mask).all(1)  # (B,): the right answer's sequences
    mistakes = [
        (
            "counted positions, not sequences: a sequence is right only if all its counted positions are",
            float(right[mask].float().mean()),
        ),
        (
            "averaged each sequence's fraction of right positions: a sequence is right (1) only if all its counted "
            "positions are, else wrong (0)",
            _per_sequence_mean(right.float(), mask),
        ),
        (
            "required every position to be right, also those where loss_mask is False; only counted ones matter",
            float(right.all(1).float().mean()),
        ),
        (
            "used any() where all() is needed: one right position does not make a sequence right",
            float((right & mask).any(1).float().mean()),
        ),
        ("loss_mask inverted: True marks the positions that count", float((right | mask).all(1).float().mean())),
        (
            "returned the number of sequences right; accuracy is the fraction of sequences that are right",
            float(whole.sum()),
        ),
        ("returned a percentage; return a fraction in [0, 1]", 100 * float(whole.float().mean())),
    ]
    if logits.shape[1] == logits.shape[2]:  # only then does argmax over the wrong axis run without an error
        wrong_axis = logits.argmax(1) == targets
        mistakes.append(
            (
                "argmax over the wrong axis: the prediction is the most likely class, argmax over the last "
                "axis (the vocabulary, dim=-1)",
                float((wrong_axis | ~mask).all(1).float().mean()),
            )
        )
    return mistakes


def _same(a: float, b: float) -> bool:
    return (a != a and b != b) or abs(a - b) <= 1e-5 * max(1.0, abs(b))  # NaN == NaN here


@friendly
def check_masked_loss_and_accuracy(fn) -> None:
    """``fn(logits (B, T, V), targets (B, T), loss_mask (B, T) bool)`` -> (loss tensor, whole-sequence accuracy
    float)."""
    cases = _loss_cases()
    for logits, targets, mask, case in cases:
        logits_in = logits.clone().requires_grad_(True)
        result = call(fn, logits_in, targets.clone(), mask.clone(), case=case)
        if not isinstance(result, tuple | list) or len(result) != 2:
            raise CheckFailed(f"{case}: return a pair (loss, accuracy), got {type(result).__name__}")
        loss, accuracy = result
        expected_loss, expected_acc = reference_masked_loss_and_accuracy(logits, targets, mask)
        _check_loss(loss, float(expected_loss), (logits, targets, mask), case)
        _check_accuracy(accuracy, expected_acc, (logits, targets, mask), case)
    passed("check_masked_loss_and_accuracy", len(cases))


def _check_loss(loss, expected: float, inputs: tuple, case: str) -> None:
    """The learner's loss: a one-number tensor attached to the logits' graph, equal to ``expected``;
    else the message of the mistake it reproduces. ``inputs``: (logits, targets, loss_mask)."""
    if not isinstance(loss, torch.Tensor):
        raise CheckFailed(
            f"{case}: the loss is a {type(loss).__name__}; return it as a tensor, without .item() or "
            "float(), so that training can call loss.backward()"
        )
    if loss.numel() != 1:
        raise CheckFailed(
            f"{case}: the loss has shape {tuple(loss.shape)}; it must be one number, the mean over the "
            "counted positions"
        )
    if not loss.requires_grad:
        raise CheckFailed(
            f"{case}: the loss is cut off from the logits (no grad_fn): compute it with tensor operations "
            "only (no .item(), .detach() or torch.no_grad), so that loss.backward() reaches the model"
        )
    loss_value = float(loss.detach().reshape(()))
    if not _same(loss_value, expected):
        for message, wrong in _loss_mistakes(*inputs):
            if _same(loss_value, float(wrong)):
                raise CheckFailed(f"{case}: loss {loss_value:.4f}: {message}")
        raise CheckFailed(f"{case}: loss {loss_value:.4f}, expected {expected:.4f}")


def _check_accuracy(accuracy, expected: float, inputs: tuple, case: str) -> None:
    """The learner's accuracy: a number (or one-number tensor) equal to ``expected``; else the message of the
    mistake it reproduces. ``inputs``: (logits, targets, loss_mask)."""
    if isinstance(accuracy, torch.Tensor) and accuracy.numel() == 1:
        accuracy = accuracy.detach().reshape(()).item()
    if isinstance(accuracy, bool) or not isinstance(accuracy, numbers.Real):
        raise CheckFailed(f"{case}: return the accuracy as a float, got {type(accuracy).__name__}")
    accuracy = float(accuracy)
    if not _same(accuracy, expected):
        for message, wrong in _accuracy_mistakes(*inputs):
            if _same(accuracy, wrong):
                raise CheckFailed(f"{case}: accuracy {accuracy:.4f}: {message}")
        raise CheckFailed(f"{case}: accuracy {accuracy:.4f}, expected {expected:.4f}")
