"""The smoke test of notebook 08, section 12: the attention versions it runs and the table it prints.

Every version has the smoke test's signature: ``fn(q, k, v, valid_lens)`` with q (B, H, Q, d), k and v
(B, H, K, d) and valid_lens (B,), returning the output (B, H, Q, d) and the weights (B, H, Q, K). Each one carries
a single bug (or its fix) from the section of the notebook named in its docstring. The notebook shows its own
``attention_smoke_test`` and hands it to ``print_table``; ``smoke_test`` here is the same test, which the
exercise check runs (``smoke_failures``) so that the truth it compares against is measured, not stored.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..core.attention import masked_softmax, scaled_dot_product_attention

SMOKE_COLUMNS = ["runs", "rows sum to 1", "masked = 0", "no NaN", "= F.sdpa"]


def real_keys(valid_lens, num_keys):
    """(B,) -> (B, 1, 1, K): True = real key."""
    return (torch.arange(num_keys) < valid_lens[:, None])[:, None, None]


def _attention_with(masked_softmax_fn, q, k, v, valid_lens, scale=True):
    """Attention on split heads with a given masked softmax; scale=False drops the 1/sqrt(d)."""
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)  # (B, H, Q, K)
    weights = masked_softmax_fn(scores, valid_lens)  # (B, H, Q, K)
    return weights @ v, weights  # (B, H, Q, d), (B, H, Q, K)


def _keep(scores, valid_lens):
    return real_keys(valid_lens, scores.shape[-1])  # (B, 1, 1, K)


# ---- the masked softmaxes of sections 3, 4, 5 and 8: scores (B, H, Q, K), valid_lens (B,) -> weights (B, H, Q, K)
def _bk_softmax(scores, valid_lens):
    keep = torch.arange(scores.shape[-1]) < valid_lens[:, None]  # (B, K): meets the (Q, K) axes
    return scores.masked_fill(~keep, -1e9).softmax(dim=-1)


def bk_mask(q, k, v, valid_lens):
    """Section 3, bug: a (B, K) padding mask on (B, H, Q, K) scores."""
    return _attention_with(_bk_softmax, q, k, v, valid_lens)


def b11k_mask(q, k, v, valid_lens):
    """Section 3, fix: a (B, 1, 1, K) padding mask."""
    return _attention_with(lambda s, lens: masked_softmax(s, mask=_keep(s, lens)), q, k, v, valid_lens)


def inverted_mask(q, k, v, valid_lens):
    """Section 4, bug: a drop-mask where a keep-mask is due."""
    return _attention_with(lambda s, lens: masked_softmax(s, mask=~_keep(s, lens)), q, k, v, valid_lens)


def softmax_over_queries(q, k, v, valid_lens):
    """Section 5, bug: the softmax over dim=-2."""
    return _attention_with(lambda s, lens: s.masked_fill(~_keep(s, lens), -1e9).softmax(dim=-2), q, k, v, valid_lens)


def fill_minus_inf(q, k, v, valid_lens):
    """Section 8, bug: masked scores filled with -inf, so an empty row is NaN."""
    return _attention_with(
        lambda s, lens: s.masked_fill(~_keep(s, lens), float("-inf")).softmax(dim=-1), q, k, v, valid_lens
    )


def fill_minus_1e9(q, k, v, valid_lens):
    """Section 8, bug: masked scores filled with -1e9, so an empty row is spread evenly over the padding."""
    return _attention_with(lambda s, lens: s.masked_fill(~_keep(s, lens), -1e9).softmax(dim=-1), q, k, v, valid_lens)


def package_masked_softmax(q, k, v, valid_lens):
    """Section 8, fix: mha_tutorial.masked_softmax (a finite fill, then empty rows set to zeros)."""
    return _attention_with(masked_softmax, q, k, v, valid_lens)


# ---- bugs outside the softmax: sections 5, 6 and 7
def kt_wrong_axes(q, k, v, valid_lens):
    """Section 5, bug: K^T written as k.transpose(1, 2), which swaps heads and positions."""
    weights = masked_softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), valid_lens)
    return weights @ v, weights


def no_scale(q, k, v, valid_lens):
    """Section 6, bug: the scores are not divided by sqrt(d)."""
    return _attention_with(masked_softmax, q, k, v, valid_lens, scale=False)


def scaled_twice(q, k, v, valid_lens):
    """Section 6, bug: q scaled by hand, then passed to an attention that scales again."""
    return scaled_dot_product_attention(q / math.sqrt(q.shape[-1]), k, v, valid_lens)


def _folded(expand_lens, q, k, v, valid_lens):
    B, H = q.shape[:2]
    q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)  # (B*H, T, d) each: row b*H + h
    out, w = scaled_dot_product_attention(q, k, v, expand_lens(valid_lens, H))  # valid_lens (B*H,)
    return out.unflatten(0, (B, H)), w.unflatten(0, (B, H))  # (B, H, Q, d), (B, H, Q, K)


def folded_repeat(q, k, v, valid_lens):
    """Section 7, bug: heads folded into the batch, lengths expanded with repeat ([5, 2, 0] -> [5, 2, 0, 5, 2, 0])."""
    return _folded(lambda lens, H: lens.repeat(H), q, k, v, valid_lens)


def folded_repeat_interleave(q, k, v, valid_lens):
    """Section 7, fix: lengths expanded with repeat_interleave ([5, 2, 0] -> [5, 5, 2, 2, 0, 0])."""
    return _folded(lambda lens, H: lens.repeat_interleave(H, dim=0), q, k, v, valid_lens)


# ---- the test and its table
def smoke_test(fn) -> dict:
    """{check: passed?} for ``fn`` on the smoke batch; only {"runs": False} when ``fn`` raises."""
    g = torch.Generator().manual_seed(0)
    B, H, Q, K, d = 3, 2, 4, 5, 8  # B != Q, H > 1
    q, k, v = (torch.randn(B, H, n, d, generator=g).requires_grad_() for n in (Q, K, K))  # (B, H, n, d)
    valid_lens = torch.tensor([5, 2, 0])  # (B,): unequal lengths, one empty sequence
    keep = real_keys(valid_lens, K).expand(B, H, Q, K)  # (B, H, Q, K): True = real key
    try:
        out, w = fn(q, k, v, valid_lens)
    except (RuntimeError, ValueError):
        return {"runs": False}
    out.pow(2).sum().backward()
    return {
        "runs": True,
        "rows sum to 1": torch.allclose(w.sum(-1)[valid_lens > 0], torch.ones(1)),
        "masked = 0": bool(w[~keep].eq(0).all()),
        "no NaN": not any(t.isnan().any() for t in (out, w, q.grad, k.grad, v.grad)),
        "= F.sdpa": torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep), atol=1e-5),
    }


def smoke_failures(fn) -> set:
    """The checks of the smoke test that ``fn(q, k, v, valid_lens)`` fails ('runs' alone if it raises)."""
    return {column for column, ok in smoke_test(fn).items() if not ok}


def print_table(versions, test=smoke_test) -> None:
    """One row per version of {name: fn}: "ok", "FAIL", or "-" for a check not run because fn raised."""
    print(f"{'version':33s}" + "".join(f"{c:>14s}" for c in SMOKE_COLUMNS))
    for name, fn in versions.items():
        result = test(fn)
        cells = [("ok" if result[c] else "FAIL") if c in result else "-" for c in SMOKE_COLUMNS]
        print(f"{name:33s}" + "".join(f"{cell:>14s}" for cell in cells))
