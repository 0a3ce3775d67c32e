"""Checks for the exercises of notebook 09 (a pretrained encoder's heads, drawn and pruned).

Each check runs the learner's function on small seeded cases whose answers are known, then on the pretrained
all-MiniLM-L6-v2 (loaded once, on the CPU, from its wheel), and compares with a reference written here as plain
loops. When an answer is wrong it is compared with the typical wrong answers -- a gate of the wrong shape, counting
padded queries, the argmax over the wrong axis, ... -- so that the failure can name the mistake.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers

import torch

from ..data import DATA_DIR
from ._common import CheckFailed, call, diagnose, expect_tensor, friendly, passed, refusing

__all__ = ["check_ablation_change", "check_sep_share", "check_accuracy_at_1"]

PARAPHRASES = DATA_DIR / "paraphrases.tsv"


def _with_rng(make):
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        return make()


@functools.lru_cache(maxsize=1)
def _model():
    """all-MiniLM-L6-v2 on the CPU, loaded once per process (the checks only read it)."""
    from ..pretrained.minilm import load_minilm

    return load_minilm(device="cpu")


def _pairs(n: int) -> tuple[list[str], list[str]]:
    """The first ``n`` (sentence, paraphrase) pairs of the paraphrase data."""
    lines = PARAPHRASES.read_text(encoding="utf-8").splitlines()[1 : n + 1]  # after the header
    rows = [line.split("\t") for line in lines]
    return [r[1] for r in rows], [r[2] for r in rows]


@functools.lru_cache(maxsize=1)
def _real_batch():
    """A padded batch of five sentences of the paraphrase data: (batch, hidden (B, T, d), weights per layer)."""
    from ..pretrained.minilm import tokenize

    sentences, paraphrases = _pairs(40)
    chosen = [sentences[0], paraphrases[3], sentences[11], paraphrases[17], sentences[29]]
    batch = tokenize(chosen)
    with torch.no_grad():
        out = _model()(batch.input_ids, batch.attention_mask, batch.token_type_ids, output_attentions=True)
    return batch, out.last_hidden_state, [w.double() for w in out.attentions]


def _as_vectors(actual, shape: tuple, case: str, axes: dict) -> torch.Tensor:
    """The learner's result as a float64 tensor of ``shape``, or a failure naming the axis that is off."""
    actual = expect_tensor(actual, case).detach().cpu()
    if tuple(actual.shape) == shape:
        return actual.double()
    hint = axes.get(tuple(actual.shape), f"expected shape {shape}")
    raise CheckFailed(f"{case}: wrong shape {tuple(actual.shape)}: {hint}")


def _unchanged(before: list[torch.Tensor], after: list[torch.Tensor], case: str) -> None:
    for b, a in zip(before, after, strict=True):
        if not torch.equal(b, a):
            raise CheckFailed(f"{case}: your function changed its input in place; it must only read it")


# =====================================================================================================
# Exercise 1: switch one head off with head_mask and measure what it costs
# =====================================================================================================
ABLATION_PAIRS = 32  # the check scores the first 32 eval pairs: cheap, and enough to separate the mistakes
ABLATION_CASES = [(0, 2), (1, 8)]  # (layer, head): the previous-token head, then the next-token head


class _Watched(list):
    read = False  # set when the learner's function reads the pairs at all

    def __iter__(self):
        self.read = True
        return super().__iter__()

    def __getitem__(self, index):
        self.read = True
        return super().__getitem__(index)


def _scores(pairs, gates=None, loss_only=False) -> tuple[float, float]:  # (accuracy@1 or NaN, loss) of MiniLM
    from ..pretrained.retrieval import retrieval_accuracy, retrieval_loss

    with torch.no_grad():
        acc = math.nan if loss_only else retrieval_accuracy(_model(), pairs, head_mask=gates)
        return acc, retrieval_loss(_model(), pairs, gates).item()


@functools.cache
def _split_pairs(split: str, n: int | None = None) -> tuple:
    from ..pretrained.retrieval import load_paraphrases

    return tuple(load_paraphrases(split)[:n])


@functools.cache
def _change(split: str, n: int | None, off: tuple, loss_only: bool = False) -> tuple[float, float]:  # gated - full
    pairs, gates = list(_split_pairs(split, n)), torch.ones(6, 12)  # (layers, heads) of all-MiniLM-L6-v2
    for l, h in off:
        gates[l, h] = 0.0
    (acc, loss), (acc0, loss0) = _scores(pairs, gates, loss_only), _scores(pairs, None, loss_only)
    return acc - acc0, loss - loss0


def _ablation_mistakes(layer: int, head: int, n: int):
    acc, loss = _change("eval", n, ((layer, head),))
    yield "the changes have the wrong sign: return ablated minus full (a lost retrieval is negative)", (-acc, -loss)
    yield "the accuracy change is a count of pairs; return it as a fraction of the pairs", (acc * n, loss)
    every_layer = f"switched head {head} off in every layer (gates[:, head] = 0); zero gates[layer, head] only"
    yield every_layer, _change("eval", n, tuple((l, head) for l in range(6)))
    yield (
        f"switched off all of layer {layer} (gates[layer] = 0 zeroes a whole row); zero gates[layer, head] only",
        _change("eval", n, tuple((layer, h) for h in range(12))),
    )
    if head < 6:
        yield "swapped layer and head: head_mask is indexed [layer, head]", _change("eval", n, ((head, layer),))
    loss_imp = _change("importance", None, ((layer, head),), loss_only=True)[1]
    yield "measured the loss on the importance pairs; score both metrics on the pairs you are given", (acc, loss_imp)


def _as_pair(actual, case: str) -> tuple[float, float]:
    if isinstance(actual, (tuple, list)) and len(actual) == 2:
        values = [v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for v in actual]
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
            return float(values[0]), float(values[1])
    raise CheckFailed(f"{case}: return two numbers, (accuracy change, loss change); got {type(actual).__name__}")


@friendly
def check_ablation_change(fn) -> None:
    """``fn(model, pairs, layer, head)`` -> (accuracy@1 change, loss change) with that head's gate at 0."""
    from ..pretrained import retrieval, retrieval_study  # the package's ablations: the exercise is to write one

    refused = {
        retrieval.ablation_drops: "mha_tutorial.pretrained.retrieval.ablation_drops",
        retrieval.pruning_curve: "mha_tutorial.pretrained.retrieval.pruning_curve",
        retrieval_study._one_head_off: "mha_tutorial.pretrained.retrieval_study's ablation helper",
    }
    model, n = _model(), ABLATION_PAIRS
    for layer, head in ABLATION_CASES:
        case = f"all-MiniLM-L6-v2, layer {layer} head {head} off, the first {n} eval pairs"
        pairs = _Watched(_split_pairs("eval", n))
        model.eval()
        with refusing(refused):
            hint = "head_mask holds one gate per head of every layer: shape (layers, heads) = (6, 12)"
            actual = _as_pair(call(fn, model, pairs, layer, head, case=case, hint=hint), case)
        if model.training:
            model.eval()
            raise CheckFailed(f"{case}: your function left the model in train mode; call model.eval() (or leave it)")
        if not pairs.read:
            raise CheckFailed(f"{case}: your function never read `pairs`; score the pairs it is given, not a global")
        right = [("", _change("eval", n, ((layer, head),)))]  # first the right answer; the mistakes only if needed
        for message, wrong in itertools.chain(right, _ablation_mistakes(layer, head, n)):
            if abs(actual[0] - wrong[0]) < 1e-6 and abs(actual[1] - wrong[1]) < 1e-5:
                if not message:
                    break
                raise CheckFailed(f"{case}: got {actual[0]:+.4f}, {actual[1]:+.5f}: {message}")
        else:
            raise CheckFailed(f"{case}: got {actual[0]:+.4f}, {actual[1]:+.5f}, expected a different change")
    passed("check_ablation_change", len(ABLATION_CASES))
    study = retrieval.load_study()  # the shipped study: every head off alone on all 160 eval pairs
    for layer, head in ABLATION_CASES:
        lost, added = round(study["ablation_drops"][layer, head].item() * 160), study["ablation_loss_increase"]
        print(
            f"  the shipped study, layer {layer} head {head} off, 160 eval pairs: {lost} retrieval(s) lost net, "
            f"loss {added[layer, head].item():+.3f}; was that your prediction?"
        )


# =====================================================================================================
# Exercise 2: a head's share of attention on [SEP]
# =====================================================================================================
def _sep_reference(weights: torch.Tensor, valid_lens: torch.Tensor) -> torch.Tensor:
    """Mean of weights[b, h, q, n_b - 1] over every real query q < n_b of every sentence b, as a loop -> (H,)."""
    picked = []
    for b, n in enumerate(valid_lens.tolist()):
        picked += [weights[b, :, q, n - 1].double() for q in range(n)]
    return torch.stack(picked).mean(0)


def _sep_mistakes(weights: torch.Tensor, valid_lens: torch.Tensor):
    w = weights.double()
    B, H, T, _ = w.shape
    lens = valid_lens.tolist()
    on_sep = torch.stack([w[b, :, :, n - 1] for b, n in enumerate(lens)])  # (B, H, T): every query's weight on [SEP]
    real = (torch.arange(T)[None] < valid_lens[:, None]).double()[:, None]  # (B, 1, T): 1 = real query
    yield (
        "counted the padded queries too: BERT masks padded keys, not padded queries, so their rows hold weights "
        "but are not tokens; average over the real queries q < valid_lens[b] only",
        on_sep.mean(dim=(0, 2)),
    )
    last = w[:, :, :, T - 1]  # (B, H, T): the last column
    yield (
        f"read the last key (column T-1 = {T - 1}): in a padded sentence that is [PAD], which gets weight 0; "
        "[SEP] is the sentence's last real token, key valid_lens[b] - 1",
        (last * real).sum(dim=(0, 2)) / real.sum(),
    )
    yield (
        "read key 0, [CLS]; [SEP] is the last real token of each sentence, key valid_lens[b] - 1",
        (w[:, :, :, 0] * real).sum(dim=(0, 2)) / real.sum(),
    )
    row = torch.stack([w[b, :, n - 1, :] for b, n in enumerate(lens)])  # (B, H, T): what [SEP] attends to
    yield (
        "swapped queries and keys: you averaged the [SEP] query's row (what [SEP] looks at); the share on [SEP] "
        "is its key column, weights[b, h, q, valid_lens[b] - 1] for every real query q",
        (row * real).sum(dim=(0, 2)) / real.sum(),
    )
    yield (
        "averaged each sentence first, then the sentences: a short sentence then weighs as much as a long one; "
        "pool the real queries of the whole batch, each counted once",
        ((on_sep * real).sum(2) / real.sum(2)).mean(0),
    )
    inner = real.clone()
    for b, n in enumerate(lens):
        inner[b, 0, 0], inner[b, 0, n - 1] = 0.0, 0.0
    yield (
        "left out the [CLS] and [SEP] queries; every real token counts as a query here",
        (on_sep * inner).sum(dim=(0, 2)) / inner.sum(),
    )
    yield (
        "summed over the queries instead of averaging",
        (on_sep * real).sum(dim=(0, 2)),
    )


def _sep_cases():
    def make():
        g = torch.Generator().manual_seed(10)
        B, H, T = 3, 4, 6
        lens = torch.tensor([6, 4, 3])
        keys = torch.arange(T)[None] < lens[:, None]  # (B, T): real keys
        scores = 2.0 * torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
        for b, n in enumerate(lens.tolist()):
            scores[b, :, n:, n - 1] += 4.0  # padded queries lean on [SEP]: counting them shows
        scores = scores.masked_fill(~keys[:, None, None, :], float("-inf"))
        weights = scores.softmax(-1)  # (B, H, T, T): padded keys 0, padded query rows real distributions
        return [(weights, lens, "random weights, valid_lens [6, 4, 3] of T=6 (padded keys get 0, as in BERT)")]

    return _with_rng(make)


@friendly
def check_sep_share(fn) -> None:
    """``fn(weights (B, H, T, T), valid_lens (B,))`` -> (H,): mean over every real query of its weight on [SEP]."""
    cases = _sep_cases()
    batch, _, layers = _real_batch()
    for l in (2, 5):
        cases.append((layers[l], batch.valid_lens, f"all-MiniLM-L6-v2 layer {l}, 5 padded sentences"))
    shares = {}
    for w, lens, case in cases:
        B, H, T, _ = w.shape
        inputs = [w.clone(), lens.clone()]
        actual = call(fn, *inputs, case=case)
        _unchanged([w, lens], inputs, case)
        axes = {
            (): "a single number: return one value per head, shape (H,)",
            (B, H): "shape (B, H): also average over the sentences, pooling their real queries",
            (H, T): "shape (H, T): also average over the queries",
            (B, H, T): "one value per query: average over the sentences and their real queries",
        }
        actual = _as_vectors(actual, (H,), case, axes)
        expected = _sep_reference(w, lens)
        diagnose(actual, expected, _sep_mistakes(w, lens), case, atol=1e-5, rtol=1e-4)
        if case.startswith("all-MiniLM"):
            shares[case.split(",")[0]] = expected
    passed("check_sep_share", len(cases))
    for name, share in shares.items():
        h = int(share.argmax())
        print(f"  {name}: head {h} puts the most on [SEP], {share[h]:.2f} of its attention on these sentences")


# =====================================================================================================
# Exercise 3: accuracy@1 of paraphrase retrieval
# =====================================================================================================
def _accuracy_reference(queries: torch.Tensor, candidates: torch.Tensor) -> float:
    """Fraction of rows i whose most cosine-similar candidate is candidate i, as a loop."""
    hits = 0
    for i, q in enumerate(queries.double()):
        sims = [float(q @ c / (q.norm() * c.norm())) for c in candidates.double()]
        hits += max(range(len(sims)), key=lambda j: sims[j]) == i
    return hits / len(queries)


def _accuracy_mistakes(queries: torch.Tensor, candidates: torch.Tensor):
    q, c = queries.double(), candidates.double()
    n = len(q)
    target = torch.arange(n)
    cos = torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(c, dim=1).T  # (N, N)
    dot = q @ c.T  # (N, N)
    right = (cos.argmax(1) == target).double().mean().item()
    yield (
        "took the argmax over dim 0: that finds, for each candidate, its nearest query; row i of the similarity "
        "matrix belongs to query i, so take the argmax over dim 1 (the candidates)",
        (cos.argmax(0) == target).double().mean().item(),
    )
    yield (
        "compared raw dot products: these rows are not unit length, so a long candidate wins whatever its "
        "direction; normalise the rows first (F.normalize) to compare by cosine similarity",
        (dot.argmax(1) == target).double().mean().item(),
    )
    yield (
        "took the least similar candidate (argmin); the retrieved paraphrase is the most similar one",
        (cos.argmin(1) == target).double().mean().item(),
    )
    yield (
        "two mistakes at once: raw dot products of rows that are not unit length, and the argmax over dim 0 (for "
        "each candidate its nearest query). Normalise the rows (F.normalize), then take the argmax over dim 1",
        (dot.argmax(0) == target).double().mean().item(),
    )
    yield (
        "nearest by Euclidean distance between vectors that are not unit length; compare by cosine similarity",
        (torch.cdist(q, c).argmin(1) == target).double().mean().item(),
    )
    yield "returned the number of hits; accuracy is their fraction (divide by the number of queries)", right * n
    yield "returned a percentage; accuracy here is a fraction between 0 and 1", right * 100


def _accuracy_cases():
    def make():
        g = torch.Generator().manual_seed(11)
        hand_q = torch.tensor([[1.0, 0.1], [0.2, 1.0], [1.0, 1.0]])
        hand_c = torch.tensor([[4.0, 0.0], [0.0, 0.5], [0.6, 0.5]])  # candidate 0 is long: raw dot products favour it
        cases = [(hand_q, hand_c, "3 hand-made 2-d vectors of different lengths")]
        n, d = 60, 12
        base = torch.randn(n, d, generator=g)
        queries = base * (0.5 + 2.0 * torch.rand(n, 1, generator=g))  # (N, d), lengths from 0.5 to 2.5 times
        noisy = base + 1.1 * torch.randn(n, d, generator=g)  # some candidates nearer to another query
        candidates = noisy * (0.5 + 2.0 * torch.rand(n, 1, generator=g))
        cases.append((queries, candidates, f"{n} random {d}-d queries, candidates = noisy copies, lengths varied"))
        return cases

    return _with_rng(make)


def _as_fraction(actual, case: str) -> float:
    if isinstance(actual, torch.Tensor) and actual.numel() == 1:
        actual = actual.item()
    if isinstance(actual, bool) or not isinstance(actual, numbers.Real):
        shape = f" of shape {tuple(actual.shape)}" if isinstance(actual, torch.Tensor) else ""
        raise CheckFailed(
            f"{case}: return one number, the fraction of queries whose nearest candidate is their own; got "
            f"{type(actual).__name__}{shape}"
        )
    return float(actual)


@functools.lru_cache(maxsize=1)
def _real_embeddings(n: int = 24):
    from ..pretrained.minilm import embed

    sentences, paraphrases = _pairs(n)
    return embed(sentences, _model()).cpu(), embed(paraphrases, _model()).cpu()


@friendly
def check_accuracy_at_1(fn) -> None:
    """``fn(queries (N, d), candidates (N, d))`` -> float: the fraction of i whose most cosine-similar candidate is i."""
    cases = _accuracy_cases()
    sentences, paraphrases = _real_embeddings()
    real = f"all-MiniLM-L6-v2 embeddings of the first {len(sentences)} pairs of the paraphrase data"
    cases.append((sentences, paraphrases, real))
    from ..pretrained.retrieval import embedding_scores  # the package's accuracy@1: the exercise is to write it

    for q, c, case in cases:
        inputs = [q.clone(), c.clone()]
        with refusing({embedding_scores: "the package's own accuracy@1 (pretrained.retrieval.embedding_scores)"}):
            actual = _as_fraction(call(fn, *inputs, case=case), case)
        _unchanged([q, c], inputs, case)
        expected = _accuracy_reference(q, c)
        if abs(actual - expected) < 1e-6:  # float32 means of hits are exact to about 1e-7
            continue
        for message, wrong in _accuracy_mistakes(q, c):
            if abs(actual - wrong) < 1e-6:
                raise CheckFailed(f"{case}: got {actual:.4g}, expected {expected:.4g}: {message}")
        raise CheckFailed(f"{case}: got {actual:.4g}, expected {expected:.4g}")
    passed("check_accuracy_at_1", len(cases))
    right = _accuracy_reference(sentences, paraphrases)
    print(f"  MiniLM finds the right paraphrase for {right:.3f} of the first {len(sentences)} pairs")
    target = torch.arange(len(sentences))
    cos = sentences @ paraphrases.T  # (N, N): the rows have length 1, so dot products are cosines
    axis_only = (cos.argmax(0) == target).double().mean().item()  # the lesson's bug 2 alone
    dot_only = ((sentences @ paraphrases.T).argmax(1) == target).double().mean().item()  # bug 1 alone
    shows = [name for name, v in [("dim 0", axis_only), ("raw dot products", dot_only)] if abs(v - right) > 1e-9]
    print(
        f"  your prediction, on these unit-length rows: the argmax over dim 0 alone gives {axis_only:.3f}, raw dot "
        f"products alone {dot_only:.3f}; the bug that shows: {' and '.join(shows) or 'neither'}"
    )
