"""The typical mistakes of notebook 06's exercises, as switches of one computation each (``checks.nb06``).

For each statistic -- normalised entropy, previous-token, induction and duplicate-token scores -- a ``*_variant``
function computes it with keyword switches whose defaults give the right answer, and an
``*_OPTIONS`` list gives, for every switch, its wrong settings and what to tell the learner who
made that mistake. ``checks.nb06`` tries the combinations, fewest mistakes first, and names the
one that reproduces the learner's answer.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "DUPLICATE_OPTIONS",
    "ENTROPY_OPTIONS",
    "INDUCTION_OPTIONS",
    "PREVIOUS_OPTIONS",
    "entropy_variant",
    "induction_variant",
    "previous_variant",
    "row_mean",
]


def row_mean(values: torch.Tensor, rows: torch.Tensor, per_example: bool = False) -> torch.Tensor:
    """values (B, H, Q) averaged over the rows (B, Q) that count -> (H,): all rows pooled, or example by example."""
    r = rows[:, None].to(values.dtype)  # (B, 1, Q)
    if per_example:
        return ((values * r).sum(-1) / r.sum(-1).clamp_min(1)).mean(0)
    return (values * r).sum(dim=(0, 2)) / r.sum(dim=(0, 2)).clamp_min(1)


# =====================================================================================================
# Exercise 1: normalised entropy
# =====================================================================================================
def entropy_variant(w, keep, norm="visible", single="skip", base="same", per_example=False, mean_keys=False):
    """Mean normalised entropy with switchable mistakes; the defaults give the right answer. -> (H,)."""
    n = keep.sum(-1).double()  # (B, Q) visible keys per row
    plogp = torch.xlogy(w, w)
    ent = -(plogp.mean(-1) if mean_keys else plogp.sum(-1))  # (B, H, Q)
    if norm is not None and base != "same":  # entropy and normaliser in different bases: off by a factor ln 2
        ent = ent / math.log(2) if base == "bits/nats" else ent * math.log(2)
    if norm == "visible":
        ent = ent / n.clamp_min(2).log()[:, None]
    elif norm == "all":
        ent = ent / math.log(keep.shape[-1])
    if single == "one":
        ent = torch.where((n == 1)[:, None], torch.ones_like(ent), ent)
    elif single == "zero":
        ent = torch.where((n == 1)[:, None], torch.zeros_like(ent), ent)
    return row_mean(ent, n >= (2 if single == "skip" else 1), per_example)


ENTROPY_OPTIONS = [
    (
        "norm",
        [
            ("visible", None),
            (
                None,
                "not normalised: that is the entropy in nats; divide each row's entropy by log(number of visible keys)",
            ),
            (
                "all",
                "normalised by log K (all keys, masked ones included); a row that may only see n keys can at most "
                "reach log n, so divide by the log of that row's number of visible keys",
            ),
        ],
    ),
    (
        "single",
        [
            ("skip", None),
            (
                "zero",
                "rows with a single visible key were counted (as entropy 0); such a row has no choice to make "
                "(its weight is 1 whatever the head does) and log 1 = 0 makes its normalised entropy 0/0: leave it out",
            ),
            (
                "one",
                "rows with a single visible key were counted (as entropy 1); leave them out: with one key there is "
                "no distribution to measure, and log 1 = 0 makes the ratio 0/0",
            ),
        ],
    ),
    (
        "base",
        [
            ("same", None),
            (
                "bits/nats",
                "entropy in bits (log2) but the normaliser in nats (log): use the same logarithm in both "
                "(the normalised entropy does not depend on the base)",
            ),
            (
                "nats/bits",
                "entropy in nats (log) but the normaliser in bits (log2): use the same logarithm in both "
                "(the normalised entropy does not depend on the base)",
            ),
        ],
    ),
    (
        "per_example",
        [
            (False, None),
            (
                True,
                "averaged each example first and then the examples: when examples have different numbers of "
                "counted rows this weights rows unequally; average over all counted rows at once",
            ),
        ],
    ),
    ("mean_keys", [(False, None), (True, "averaged -w log w over the keys instead of summing it: entropy is a sum")]),
]


# =====================================================================================================
# Exercise 3, first half: previous-token score
# =====================================================================================================
def previous_variant(w, lengths, offset=-1, first=1, use_lengths=True, drop_last=False, per_example=False):
    """Mean of w[b, h, t, t + offset] over queries t = first .. len_b - 1 -> (H,); defaults: the right answer.

    A key left of 0 wraps around as negative indexing does; a key past the end counts as 0.
    """
    B, H, T, _ = w.shape
    t = torch.arange(T)
    k = t + offset
    values = w[:, :, t, k % T] * (k < T)  # (B, H, T)
    end = lengths if use_lengths else torch.full((B,), T)
    end = end - 1 if drop_last else end
    rows = (t[None] >= first) & (t[None] < end[:, None])  # (B, T)
    return row_mean(values, rows, per_example)


PREVIOUS_OPTIONS = [
    (
        "offset",
        [
            (-1, None),
            (
                +1,
                "read the weight on key t + 1 (or weights[b, h, t - 1, t], queries and keys swapped): under a "
                "causal mask a query never sees later keys, so that is 0. The weights are indexed "
                "[b, h, query, key]: the previous-token weight of query t is weights[b, h, t, t - 1]",
            ),
            (0, "read the diagonal (key t, the query's own position): that is a self score, not previous-token"),
            (-2, "read the weight on key t - 2: the previous token is one step back"),
        ],
    ),
    (
        "first",
        [
            (1, None),
            (
                0,
                "query 0 was included: it has no previous token (weights[b, h, 0, -1] wraps around to the last "
                "key); start at t = 1",
            ),
        ],
    ),
    (
        "use_lengths",
        [
            (True, None),
            (False, "ignored lengths: queries past the end were averaged too; only t = 1 .. lengths[b] - 1 count"),
        ],
    ),
    (
        "drop_last",
        [
            (False, None),
            (True, "the last query of each sequence (t = lengths[b] - 1) is missing: range(1, lengths[b]) includes it"),
        ],
    ),
    (
        "per_example",
        [
            (False, None),
            (
                True,
                "averaged each example first and then the examples: examples of different lengths then weigh "
                "differently; average over all counted queries at once",
            ),
        ],
    ),
]


# =====================================================================================================
# The induction score (worked in the lesson's section 3; docs/gpu's older copy of the lesson calls its check)
# =====================================================================================================
def induction_variant(w, runs, key="p-n+1", first=0, last=-1, per_example=False):
    """Mean of w[b, h, p, key(p)] over queries p = n + first .. 2n + last - 1 -> (H,); defaults: the right answer."""
    B, H, T, _ = w.shape
    p = torch.arange(T)[None]  # (1, T)
    n = runs[:, None]  # (B, 1)
    k = {"p-n+1": p - n + 1, "p-n": p - n, "p-n+2": p - n + 2, "p-1": (p - 1).expand(B, T)}[key]  # (B, T)
    rows = (p >= n + first) & (p < 2 * n + last) & (k >= 0) & (k < T)  # (B, T)
    values = w.gather(-1, k.clamp(0, T - 1)[:, None, :, None].expand(B, H, T, 1)).squeeze(-1)  # (B, H, T)
    return row_mean(values, rows, per_example)


INDUCTION_OPTIONS = [
    (
        "key",
        [
            ("p-n+1", None),
            (
                "p-n",
                "read key p - n, the earlier copy of the current token itself: that is a duplicate-token score. "
                "An induction head looks one step further, at the token that *followed* the earlier copy "
                "(key p - n + 1), because that is the token to predict",
            ),
            ("p-n+2", "read key p - n + 2: one step too far; the token after the earlier copy is at p - n + 1"),
            ("p-1", "read key p - 1: that is the previous-token pattern; an induction head looks at key p - n + 1"),
        ],
    ),
    (
        "first",
        [
            (0, None),
            (
                -1,
                "started at query n - 1, the last token of the first run: its next token starts the repeat, "
                "which has no earlier copy to follow; the queries are p = n .. 2n - 2",
            ),
            (
                1,
                "started at query n + 1: query n (the first repeated token) already has an earlier copy to "
                "follow; the queries are p = n .. 2n - 2",
            ),
        ],
    ),
    (
        "last",
        [
            (-1, None),
            (
                0,
                "included query 2n - 1, the last token: its next token is not in the sequence, so there is "
                "nothing to copy; the queries are p = n .. 2n - 2",
            ),
        ],
    ),
    (
        "per_example",
        [
            (False, None),
            (
                True,
                "averaged each example first and then the examples: runs of different lengths then weigh "
                "differently; average over all counted queries at once",
            ),
        ],
    ),
]


# Exercise 3, second half: duplicate-token score, computed by ``induction_variant`` with other right settings
DUPLICATE_OPTIONS = [
    (
        "key",
        [
            ("p-n", None),
            (
                "p-n+1",
                "read key p - n + 1, the token that *followed* the earlier copy: that is the induction score. "
                "A duplicate-token head looks at the earlier copy of the current token itself, key p - n",
            ),
            ("p-1", "read key p - 1: that is the previous-token pattern; the earlier copy of token p is at p - n"),
        ],
    ),
    (
        "first",
        [
            (0, None),
            (1, "started at query n + 1: query n, the first repeated token, already has its earlier copy at 0"),
        ],
    ),
    (
        "last",
        [
            (0, None),
            (
                -1,
                "stopped at query 2n - 2, as the induction score does; but this score needs no next token, "
                "and the last token 2n - 1 has an earlier copy too (at n - 1)",
            ),
        ],
    ),
    (
        "per_example",
        [
            (False, None),
            (
                True,
                "averaged each example first and then the examples: runs of different lengths then weigh "
                "differently; average over all counted queries at once",
            ),
        ],
    ),
]
