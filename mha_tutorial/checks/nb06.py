"""Checks for the exercises of notebook 06 (visualizing attention heads).

Each check runs the learner's function on small seeded weight tensors whose
answers are known, then on the weights of a trained model from
``mha_tutorial/data/checkpoints/``, and compares with a reference. When the answer is wrong
it recomputes the statistic with each of a list of typical mistakes and names
the one that matches.
"""

from __future__ import annotations

import itertools
import math

import torch

from ..attention import masked_softmax
from ..head_stats import normalized_entropy
from ..maps import layer_masks
from ..masks import causal_mask, padding_mask
from ._common import CheckFailed, call, diagnose, expect_tensor, friendly, passed

__all__ = ["check_normalized_entropy", "check_previous_token_score", "check_induction_score"]


def _per_head(actual, H: int, B: int, Q: int, case: str) -> torch.Tensor:
    """The learner's result as a float (H,) tensor, or a failure that says which average is missing."""
    actual = expect_tensor(actual, case).detach().cpu()
    if tuple(actual.shape) == (H,):
        return actual.double()
    hints = {
        (): "a single number: return one value per head, shape (H,) -- average over examples and queries only",
        (B, H): "shape (B, H): also average over the examples (dim 0)",
        (H, Q): "shape (H, Q): also average over the queries",
        (B, H, Q): "one value per query: average over the examples and the queries",
    }
    hint = hints.get(tuple(actual.shape), f"expected one value per head, shape ({H},)")
    raise CheckFailed(f"{case}: wrong shape {tuple(actual.shape)}: {hint}")


def _diagnose(actual, expected, compute, options, case: str, what: str, atol: float = 1e-4) -> None:
    """Pass when ``actual`` is close to ``expected``; otherwise name the mistakes that reproduce it.

    ``options``: [(flag, [(value, message), ...]), ...]; the first value of every flag is the right one
    (message None). Every combination of flags is tried, fewest mistakes first, with ``compute(**flags)``.
    """
    if torch.isnan(actual).any():
        raise CheckFailed(f"{case}: the {what} contains NaN")

    def mistakes():  # every combination of wrong flags, fewest first, computed only as far as needed
        combos = sorted(itertools.product(*[range(len(vals)) for _, vals in options]), key=lambda c: sum(map(bool, c)))
        for combo in combos[1:]:  # combos[0] is the right answer
            flags = {name: vals[i][0] for (name, vals), i in zip(options, combo, strict=True)}
            messages = [vals[i][1] for (_, vals), i in zip(options, combo, strict=True) if i]
            listed = " ".join(f"({k}) {m}" for k, m in enumerate(messages, 1))
            yield messages[0] if len(messages) == 1 else f"{len(messages)} things to fix: {listed}", compute(**flags)

    def wrong_head(actual, expected, case):
        h = int((actual - expected).abs().argmax())
        raise CheckFailed(
            f"{case}: wrong {what} for head {h}: got {actual[h].item():.4f}, expected {expected[h].item():.4f}"
        )

    diagnose(actual, expected, mistakes(), case, atol=atol, otherwise=wrong_head)


def _row_mean(values: torch.Tensor, rows: torch.Tensor, per_example: bool = False) -> torch.Tensor:
    """values (B, H, Q) averaged over the rows (B, Q) that count -> (H,): all rows pooled, or example by example."""
    r = rows[:, None].to(values.dtype)  # (B, 1, Q)
    if per_example:
        return ((values * r).sum(-1) / r.sum(-1).clamp_min(1)).mean(0)
    return (values * r).sum(dim=(0, 2)) / r.sum(dim=(0, 2)).clamp_min(1)


def _random_weights(g, B: int, H: int, Q: int, K: int, keep: torch.Tensor) -> torch.Tensor:
    """Softmax of random scores under ``keep`` (B, Q, K): (B, H, Q, K) float64, zeros where masked."""
    scores = 2.0 * torch.randn(B, H, Q, K, generator=g, dtype=torch.float64)
    return masked_softmax(scores, mask=keep[:, None])


def _with_rng(make):
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        return make()


def _trained_weights(task_name: str, n: int):
    """(model, batch, {layer: weights (B, H, Q, K)}) of the committed model on the first n eval examples."""
    from ..tasks import get_task
    from ..train import load_pretrained

    task = get_task(task_name)
    model = _with_rng(lambda: load_pretrained(task_name, device="cpu"))  # building a model draws random numbers
    batch = task.collate(task.load_split("eval")[:n])
    with torch.no_grad():
        task.forward(model, batch)
    return model, batch, {name: w.double() for name, w in model.attention_weights()}


# =====================================================================================================
# Exercise 1: normalised entropy
# =====================================================================================================
def _entropy_variant(w, keep, norm="visible", single="skip", base="same", per_example=False, mean_keys=False):
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
    return _row_mean(ent, n >= (2 if single == "skip" else 1), per_example)


_ENTROPY_OPTIONS = [
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


def _entropy_cases():
    def make():
        g = torch.Generator().manual_seed(6)
        cases = []
        B, H, Q, K = 2, 3, 4, 6
        keep = torch.ones(B, Q, K, dtype=torch.bool)
        cases.append((_random_weights(g, B, H, Q, K, keep), keep, "no mask, B=2, H=3, Q=4, K=6"))
        keep = padding_mask(torch.tensor([6, 3]), K).expand(B, Q, K)
        cases.append((_random_weights(g, B, H, Q, K, keep), keep, "padding, valid_lens=[6, 3] of K=6"))
        T = 5
        keep = causal_mask(T)[None].expand(2, T, T)
        cases.append((_random_weights(g, 2, 2, T, T, keep), keep, "causal mask, T=5 (query 0 sees one key)"))
        real = torch.arange(T)[None] < torch.tensor([5, 3, 2])[:, None]  # (3, T): real tokens
        keep = causal_mask(T)[None] & real[:, None, :] & real[:, :, None]  # (3, T, T): padded queries see nothing
        case = "causal mask and padding on both axes, lengths [5, 3, 2], T=5 (padded queries see no key)"
        cases.append((_random_weights(g, 3, 2, T, T, keep), keep, case))
        return cases

    return _with_rng(make)


@friendly
def check_normalized_entropy(fn) -> None:
    """``fn(weights (B, H, Q, K), keep (B, Q, K) bool)`` -> (H,) mean normalised entropy per head."""
    cases = _entropy_cases()
    model, batch, weights = _trained_weights("dates", 100)
    cross = layer_masks(model, "dates", batch)["dec.0.cross"].keep  # (B, T, S): padded source keys
    cases.append((weights["dec.0.cross"], cross, "the trained dates model's cross-attention, 100 eval examples"))
    for w, keep, case in cases:
        B, H, Q, _ = w.shape
        actual = _per_head(call(fn, w.clone(), keep.clone(), case=case), H, B, Q, case)
        if torch.isnan(actual).any():  # the cases come in order: padding (zeros) before causal (single keys)
            cause = (
                "0/0 on a row with a single visible key (its entropy is 0 and so is log 1): leave such rows out"
                if bool((keep.sum(-1) == 1).any())
                else "0 * log 0 on a masked key: masked keys have weight 0 and must add 0 to the entropy, "
                "e.g. torch.xlogy(w, w) or w * w.clamp_min(1e-12).log()"
            )
            raise CheckFailed(f"{case}: the result contains NaN, probably from {cause}")
        expected = normalized_entropy(w, keep).double()
        compute = lambda **flags: _entropy_variant(w, keep, **flags)  # noqa: B023 - used inside this iteration
        _diagnose(actual, expected, compute, _ENTROPY_OPTIONS, case, "normalised entropy")
    passed("check_normalized_entropy", len(cases))


# =====================================================================================================
# Exercise 2: previous-token score
# =====================================================================================================
def _previous_reference(w, lengths) -> torch.Tensor:
    """Mean of w[b, h, t, t - 1] over b and t = 1 .. lengths[b] - 1, as a plain loop -> (H,)."""
    picked = [w[b, :, t, t - 1].double() for b in range(w.shape[0]) for t in range(1, int(lengths[b]))]
    return torch.stack(picked).mean(0)


def _previous_variant(w, lengths, offset=-1, first=1, use_lengths=True, drop_last=False, per_example=False):
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
    return _row_mean(values, rows, per_example)


_PREVIOUS_OPTIONS = [
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


def _previous_cases():
    def make():
        g = torch.Generator().manual_seed(7)
        cases = []
        T = 6
        keep = causal_mask(T)[None].expand(3, T, T)
        cases.append((_random_weights(g, 3, 2, T, T, keep), torch.tensor([6, 6, 6]), "random causal weights, T=6"))
        cases.append(
            (_random_weights(g, 3, 3, T, T, keep), torch.tensor([6, 4, 2]), "random causal weights, lengths [6, 4, 2]")
        )
        hand = torch.zeros(2, 3, T, T, dtype=torch.float64)
        for t in range(T):
            hand[:, 0, t, max(t - 1, 0)] = 1.0  # head 0: previous token (query 0 looks at itself)
            hand[:, 1, t, t] = 1.0  # head 1: its own position
            hand[:, 2, t, : t + 1] = 1.0 / (t + 1)  # head 2: uniform over the visible keys
        cases.append((hand, torch.tensor([6, 5]), "hand-made heads: previous-token, self, uniform"))
        return cases

    return _with_rng(make)


@friendly
def check_previous_token_score(fn) -> None:
    """``fn(weights (B, H, T, T), lengths (B,))`` -> (H,): mean of weights[b, h, t, t - 1] over t = 1 .. lengths[b] - 1."""
    cases = _previous_cases()
    _, batch, weights = _trained_weights("induction", 200)
    lengths = torch.tensor([len(seq) // 2 for (seq,) in batch.examples])  # the first run: n tokens
    for name, w in weights.items():
        cases.append((w, lengths, f"the trained induction model's {name}, first runs of 200 eval examples", name))
    found = []
    for w, lens, case, *layer in cases:
        B, H, T, _ = w.shape
        actual = _per_head(call(fn, w.clone(), lens.clone(), case=case), H, B, T, case)
        expected = _previous_reference(w, lens)
        compute = lambda **flags: _previous_variant(w, lens, **flags)  # noqa: B023 - used inside this iteration
        _diagnose(actual, expected, compute, _PREVIOUS_OPTIONS, case, "previous-token score")
        if layer:
            found.append((layer[0], expected))
    passed("check_previous_token_score", len(cases))
    layer, scores = max(found, key=lambda f: float(f[1].max()))
    print(
        f"  on the trained induction model, the strongest previous-token head is {layer} head "
        f"{int(scores.argmax())} (score {float(scores.max()):.3f})"
    )


# =====================================================================================================
# Exercise 3: induction score
# =====================================================================================================
def _induction_reference(w, runs) -> torch.Tensor:
    """Mean of w[b, h, p, p - n + 1] over b and p = n .. 2n - 2 (n = runs[b]), as a plain loop -> (H,)."""
    picked = []
    for b in range(w.shape[0]):
        n = int(runs[b])
        picked += [w[b, :, p, p - n + 1].double() for p in range(n, 2 * n - 1)]
    return torch.stack(picked).mean(0)


def _induction_variant(w, runs, key="p-n+1", first=0, last=-1, per_example=False):
    """Mean of w[b, h, p, key(p)] over queries p = n + first .. 2n + last - 1 -> (H,); defaults: the right answer."""
    B, H, T, _ = w.shape
    p = torch.arange(T)[None]  # (1, T)
    n = runs[:, None]  # (B, 1)
    k = {"p-n+1": p - n + 1, "p-n": p - n, "p-n+2": p - n + 2, "p-1": (p - 1).expand(B, T)}[key]  # (B, T)
    rows = (p >= n + first) & (p < 2 * n + last) & (k >= 0) & (k < T)  # (B, T)
    values = w.gather(-1, k.clamp(0, T - 1)[:, None, :, None].expand(B, H, T, 1)).squeeze(-1)  # (B, H, T)
    return _row_mean(values, rows, per_example)


_INDUCTION_OPTIONS = [
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


def _induction_cases():
    def make():
        g = torch.Generator().manual_seed(8)
        cases = []
        T = 14
        keep = causal_mask(T)[None].expand(3, T, T)
        cases.append(
            (_random_weights(g, 3, 2, T, T, keep), torch.tensor([7, 5, 6]), "random causal weights, runs [7, 5, 6]")
        )
        runs = torch.tensor([4, 6])
        hand = torch.zeros(2, 3, T, T, dtype=torch.float64)
        for b, n in enumerate(runs.tolist()):
            for p in range(T):
                hand[b, :, p, : p + 1] = 1.0 / (p + 1)  # default: uniform over what the query sees
                if n <= p < 2 * n:
                    hand[b, :, p] = 0.0
                    hand[b, 0, p, p - n + 1] = 1.0  # head 0: induction (the token after the earlier copy)
                    hand[b, 1, p, p - n] = 1.0  # head 1: duplicate token (the earlier copy itself)
                    hand[b, 2, p, p - 1] = 1.0  # head 2: previous token
        cases.append((hand, runs, "hand-made heads: induction, duplicate-token, previous-token"))
        return cases

    return _with_rng(make)


@friendly
def check_induction_score(fn) -> None:
    """``fn(weights (B, H, T, T), run_lengths (B,))`` -> (H,): mean of weights[b, h, p, p - n + 1] over p = n .. 2n - 2."""
    cases = _induction_cases()
    _, batch, weights = _trained_weights("induction", 200)
    runs = torch.tensor([len(seq) // 2 for (seq,) in batch.examples])
    for name, w in weights.items():
        cases.append((w, runs, f"the trained induction model's {name}, 200 eval examples", name))
    found = []
    for w, run_lengths, case, *layer in cases:
        B, H, T, _ = w.shape
        actual = _per_head(call(fn, w.clone(), run_lengths.clone(), case=case), H, B, T, case)
        expected = _induction_reference(w, run_lengths)
        compute = lambda **flags: _induction_variant(w, run_lengths, **flags)  # noqa: B023 - used inside this iteration
        _diagnose(actual, expected, compute, _INDUCTION_OPTIONS, case, "induction score")
        if layer:
            found.append((layer[0], expected))
    passed("check_induction_score", len(cases))
    for layer, scores in found:
        print(f"  {layer}: induction scores {[round(float(s), 3) for s in scores]}")
