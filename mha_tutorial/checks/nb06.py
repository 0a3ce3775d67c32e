"""Checks for the exercises of notebook 06 (visualizing attention heads).

Each check runs the learner's function on small seeded weight tensors whose
answers are known, then on the weights of a trained model from
``data/checkpoints/``, and compares with a reference. When the answer is wrong
it recomputes the statistic with each of a list of typical mistakes (``_nb06_mistakes``)
and names the one that matches.
"""

from __future__ import annotations

import itertools

import torch

from ..analysis import head_stats, maps
from ..analysis.head_stats import normalized_entropy
from ..analysis.maps import layer_masks
from ..core.attention import masked_softmax
from ..core.masks import causal_mask, padding_mask
from ._common import CheckFailed, call, diagnose, expect_shape, expect_tensor, friendly, passed, refusing
from ._nb06_mistakes import (
    DUPLICATE_OPTIONS,
    ENTROPY_OPTIONS,
    INDUCTION_OPTIONS,
    PREVIOUS_OPTIONS,
    entropy_variant,
    induction_variant,
    previous_variant,
)
from ._nb06_torch import check_torch_head_maps

__all__ = [
    "check_cell_average",
    "check_duplicate_token_score",
    "check_induction_score",
    "check_normalized_entropy",
    "check_previous_token_score",
    "check_torch_head_maps",
]

# The package's own versions of what the exercises ask for: a check refuses them.
_PACKAGE_ENTROPY = {normalized_entropy: "mha_tutorial.analysis.head_stats.normalized_entropy"}
_PACKAGE_SCORES = {
    head_stats.head_stats: "mha_tutorial.analysis.head_stats.head_stats",
    head_stats.pattern_scores: "mha_tutorial.analysis.head_stats.pattern_scores",
    head_stats._offset_score: "mha_tutorial.analysis.head_stats._offset_score",
}


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


def _random_weights(g, B: int, H: int, Q: int, K: int, keep: torch.Tensor) -> torch.Tensor:
    """Softmax of random scores under ``keep`` (B, Q, K): (B, H, Q, K) float64, zeros where masked."""
    scores = 2.0 * torch.randn(B, H, Q, K, generator=g, dtype=torch.float64)
    return masked_softmax(scores, mask=keep[:, None])


def _with_rng(make):
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        return make()


def _trained_weights(task_name: str, n: int):
    """(model, batch, {layer: weights (B, H, Q, K)}) of the committed model on the first n eval examples."""
    from ..models.tasks import get_task
    from ..models.train import load_pretrained

    task = get_task(task_name)
    model = _with_rng(lambda: load_pretrained(task_name, device="cpu"))  # building a model draws random numbers
    batch = task.collate(task.load_split("eval")[:n])
    with torch.no_grad():
        task.forward(model, batch)
    return model, batch, {name: w.double() for name, w in model.attention_weights()}


# =====================================================================================================
# Exercise 1: normalised entropy
# =====================================================================================================


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
        with refusing(_PACKAGE_ENTROPY):
            result = call(fn, w.clone(), keep.clone(), case=case)
        actual = _per_head(result, H, B, Q, case)
        if torch.isnan(actual).any():  # the cases come in order: padding (zeros) before causal (single keys)
            cause = (
                "0/0 on a row with a single visible key (its entropy is 0 and so is log 1): leave such rows out"
                if bool((keep.sum(-1) == 1).any())
                else "0 * log 0 on a masked key: masked keys have weight 0 and must add 0 to the entropy, "
                "e.g. torch.xlogy(w, w) or w * w.clamp_min(1e-12).log()"
            )
            raise CheckFailed(f"{case}: the result contains NaN, probably from {cause}")
        expected = normalized_entropy(w, keep).double()
        compute = lambda **flags: entropy_variant(w, keep, **flags)  # noqa: B023 - used inside this iteration
        _diagnose(actual, expected, compute, ENTROPY_OPTIONS, case, "normalised entropy")
    passed("check_normalized_entropy", len(cases))


# =====================================================================================================
# Exercise 3, first half: previous-token score
# =====================================================================================================
def _previous_reference(w, lengths) -> torch.Tensor:
    """Mean of w[b, h, t, t - 1] over b and t = 1 .. lengths[b] - 1, as a plain loop -> (H,)."""
    picked = [w[b, :, t, t - 1].double() for b in range(w.shape[0]) for t in range(1, int(lengths[b]))]
    return torch.stack(picked).mean(0)


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
        with refusing(_PACKAGE_SCORES):
            result = call(fn, w.clone(), lens.clone(), case=case)
        actual = _per_head(result, H, B, T, case)
        expected = _previous_reference(w, lens)
        compute = lambda **flags: previous_variant(w, lens, **flags)  # noqa: B023 - used inside this iteration
        _diagnose(actual, expected, compute, PREVIOUS_OPTIONS, case, "previous-token score")
        if layer:
            found.append((layer[0], expected))
    passed("check_previous_token_score", len(cases))
    layer, scores = max(found, key=lambda f: float(f[1].max()))
    print(
        f"  on the trained induction model (first runs of 200 eval examples, not notebook 06's importance "
        f"examples), the strongest previous-token head is {layer} head {int(scores.argmax())}; "
        f"{layer} scores {[round(float(x), 3) for x in scores]}"
    )


# =====================================================================================================
# The induction score (worked in the lesson's section 3; docs/gpu's older copy of the lesson calls its check)
# =====================================================================================================
def _run_reference(w, runs, shift: int = 1, stop: int = -1) -> torch.Tensor:
    """Mean of w[b, h, p, p - n + shift] over b and p = n .. 2n + stop - 1 (n = runs[b]), a plain loop -> (H,).

    The defaults give the induction score; ``shift=0, stop=0`` the duplicate-token score.
    """
    picked = []
    for b in range(w.shape[0]):
        n = int(runs[b])
        picked += [w[b, :, p, p - n + shift].double() for p in range(n, 2 * n + stop)]
    return torch.stack(picked).mean(0)


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


def _second_run_check(fn, name: str, what: str, reference, options):
    """Grade ``fn(weights, runs)`` on seeded and trained weights -> ([(layer, right scores)], trained runs)."""
    cases = _induction_cases()
    _, batch, weights = _trained_weights("induction", 200)
    runs = torch.tensor([len(seq) // 2 for (seq,) in batch.examples])
    for layer, w in weights.items():
        cases.append((w, runs, f"the trained induction model's {layer}, 200 eval examples", layer))
    found = []
    for w, run_lengths, case, *layer in cases:
        B, H, T, _ = w.shape
        with refusing(_PACKAGE_SCORES):
            result = call(fn, w.clone(), run_lengths.clone(), case=case)
        actual = _per_head(result, H, B, T, case)
        expected = reference(w, run_lengths)
        compute = lambda **flags: induction_variant(w, run_lengths, **flags)  # noqa: B023 - used inside this iteration
        _diagnose(actual, expected, compute, options, case, what)
        if layer:
            found.append((layer[0], expected))
    passed(name, len(cases))
    return found, runs.tolist()


@friendly
def check_induction_score(fn) -> None:
    """``fn(weights (B, H, T, T), run_lengths (B,))`` -> (H,): mean of weights[b, h, p, p - n + 1] over p = n .. 2n - 2."""
    found, _ = _second_run_check(fn, "check_induction_score", "induction score", _run_reference, INDUCTION_OPTIONS)
    print("  on the trained induction model (200 eval examples, not notebook 06's importance examples):")
    for layer, scores in found:
        print(f"  {layer}: induction scores {[round(float(s), 3) for s in scores]}")


# Exercise 3, second half: duplicate-token score (query p of the second run on its own earlier copy, key p - n)
@friendly
def check_duplicate_token_score(fn) -> None:
    """``fn(weights (B, H, T, T), run_lengths (B,))`` -> (H,): mean of weights[b, h, p, p - n] over p = n .. 2n - 1."""
    dup = lambda w, r: _run_reference(w, r, shift=0, stop=0)
    found, runs = _second_run_check(fn, "check_duplicate_token_score", "duplicate-token score", dup, DUPLICATE_OPTIONS)
    even = sum(1 / (p + 1) for n in runs for p in range(n, 2 * n)) / sum(runs)  # a head spread evenly over p + 1 keys
    top = max(float(scores.max()) for _, scores in found)
    print(f"  on the trained induction model (200 eval examples), an even spread scores {even:.3f}:")
    for layer, scores in found:
        print(f"  {layer}: duplicate-token scores {[round(float(s), 3) for s in scores]}")
    verdict = "no head" if top < 0.5 else "a head"
    print(f"  the largest is {top:.3f}: {verdict} puts at least half its weight on the earlier copy")


# =====================================================================================================
# Exercise 2: find the bug in an average (cell by cell over the examples where the cell exists)
# =====================================================================================================
def _cell_mistakes(w, keep):
    """(what to tell the learner, what that mistake returns) for the typical wrong averages -> (H, Q, K)."""
    k = keep[:, None].to(w.dtype)  # (B, 1, Q, K)
    total = (w * k).sum(0)  # (H, Q, K)
    per_cell = keep.sum(0).to(w.dtype)  # (Q, K): examples in which the cell exists
    per_row = keep.any(-1).sum(0).to(w.dtype)[:, None].expand_as(per_cell)  # (Q, K): examples that reach the row
    return [
        (
            "divided every cell by B, the number of examples (plain_average's bug): a cell that exists in only "
            "some examples (a row that short sequences do not reach, a padded key) is pulled toward 0; divide "
            "each cell by the number of examples in which it exists, keep.sum(0)",
            total / w.shape[0],
        ),
        (
            "a cell that exists in no example came out 0: it has no data, so it must be NaN (0 would read as "
            "'the head gives it no weight'); 0 / 0 gives NaN by itself, so do not clamp the count",
            total / per_cell.clamp_min(1),
        ),
        (
            "counted the examples that reach each query row, not each cell: with padded keys the cells of one "
            "row exist in different numbers of examples; count per cell, keep.sum(0)",
            total / per_row,
        ),
    ]


def _cell_cases():
    def make():
        g = torch.Generator().manual_seed(9)
        B, T = 4, 6
        lengths = torch.tensor([6, 4, 3, 6])
        real = torch.arange(T)[None] < lengths[:, None]  # (B, T)
        causal = causal_mask(T)[None] & real[:, :, None] & real[:, None, :]  # (B, T, T)
        S = 7
        real_s = torch.arange(S)[None] < torch.tensor([7, 5, 3])[:, None]  # (3, S): real tokens
        padded = real_s[:, :, None] & real_s[:, None, :]  # (3, S, S): padding on both axes, as in an encoder
        cases = [(_random_weights(g, 3, 3, S, S, padded), padded, "padded queries and keys, valid_lens [7, 5, 3]")]
        cases.append((_random_weights(g, B, 2, T, T, causal), causal, "causal, lengths [6, 4, 3, 6]: short rows"))
        return cases

    return _with_rng(make)


def _same_with_nan(actual, expected) -> bool:
    nan = torch.isnan(expected)
    if not torch.equal(torch.isnan(actual), nan):
        return False
    return bool(torch.allclose(actual[~nan], expected[~nan], atol=1e-6, rtol=1e-5))


@friendly
def check_cell_average(fn) -> None:
    """``fn(weights (B, H, Q, K), keep (B, Q, K) bool)`` -> (H, Q, K): each cell's mean over the examples where it
    exists, NaN where it exists in none."""
    cases = _cell_cases()
    model, batch, weights = _trained_weights("induction", 200)
    m = layer_masks(model, "induction", batch)["dec.1.self"]
    induction_keep = m.keep & m.query_real[:, :, None]  # (B, T, T): the query is a real token and may see the key
    cases.append((weights["dec.1.self"], induction_keep, "the induction model's dec.1.self, 200 mixed run lengths"))
    for w, keep, case in cases:
        w = w.masked_fill(~keep[:, None], 0.0)  # (B, H, Q, K): 0 where the cell does not exist
        with refusing({maps.average_attention: "mha_tutorial.analysis.maps.average_attention"}):
            result = call(fn, w.clone(), keep.clone(), case=case)
        actual = expect_tensor(result, case).detach().cpu().double()
        expect_shape(actual, w.shape[1:], case)
        count = keep.sum(0)  # (Q, K)
        expected = w.sum(0) / count  # (H, Q, K); 0 / 0 = NaN where the cell exists in no example
        if _same_with_nan(actual, expected):
            continue
        for message, wrong in _cell_mistakes(w, keep):
            if _same_with_nan(actual, wrong):
                raise CheckFailed(f"{case}: {message}")
        where = (~torch.isclose(actual, expected, equal_nan=True)).nonzero()[0].tolist()
        raise CheckFailed(
            f"{case}: wrong value at (head, query, key) = {tuple(where)}: got {actual[tuple(where)].item():.4g}, "
            f"expected {expected[tuple(where)].item():.4g} (examples with that cell: {int(count[tuple(where[1:])])})"
        )
    passed("check_cell_average", len(cases))
    rows = induction_keep.any(-1).sum(0)  # (T,): sequences that reach each query row
    masked = weights["dec.1.self"].masked_fill(~induction_keep[:, None], 0.0)  # (B, H, T, T)
    plain = masked.sum(0).sum(-1).mean(0) / masked.shape[0]  # (T,): plain_average's row sums, mean over heads
    print(
        "  plain_average on those 200 sequences: each row should sum to 1; rows 12-23 sum to",
        [round(float(x), 3) for x in plain[12:]],
        f"(sequences reaching them: {rows[12:].tolist()})",
    )
