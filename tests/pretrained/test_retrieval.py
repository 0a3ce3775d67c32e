"""Paraphrase retrieval and the head-pruning study on all-MiniLM-L6-v2 (retrieval.py), against plain references.

The references avoid retrieval.py's own paths: every text is embedded on its own (no padding, no sorting into
batches), cosines and the nearest paraphrase come from Python loops, and the gradient from finite differences.
The shipped study (data/minilm_pruning.json) is checked against the code by recomputing parts of it.
"""

from __future__ import annotations

import json
import math
from copy import deepcopy

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial.analysis import pruning
from mha_tutorial.pretrained import minilm, retrieval

from testkit import no_arithmetic

L, H = 6, 12
EVAL = retrieval.load_paraphrases("eval")
SMALL = EVAL[60:68]  # ids 220-227: a cluster of near-misses the full model partly confuses, so masks change it


@pytest.fixture(scope="module")
def model():
    return minilm.load_minilm(device="cpu")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These tests run many small forward passes; two threads on a shared 2-core machine make each one several
    times slower (the threads wait for each other), so this module uses one, and restores the setting after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def study():
    return retrieval.load_study()


def one_by_one(model, texts, head_mask=None) -> list[list[float]]:
    """Each text embedded alone (a batch of one, no padding)."""
    out = []
    with torch.no_grad():
        for text in texts:
            batch = minilm.tokenize([text])
            out.append(model.encode(batch.input_ids, batch.attention_mask, head_mask=head_mask)[0].tolist())
    return out


def loop_accuracy(model, pairs, head_mask=None) -> float:
    """Accuracy@1 with explicit cosines and an explicit search for the nearest paraphrase (first one on ties)."""
    sentences = one_by_one(model, [s for s, _ in pairs], head_mask)
    paraphrases = one_by_one(model, [p for _, p in pairs], head_mask)

    def cosine(a, b):
        dot = sum(x * y for x, y in zip(a, b, strict=True))
        return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))

    hits = 0
    for i, s in enumerate(sentences):
        scores = [cosine(s, p) for p in paraphrases]
        hits += max(range(len(scores)), key=scores.__getitem__) == i
    return hits / len(pairs)


def batch_scores(model, pairs, head_mask=None) -> tuple[float, float]:
    """Accuracy@1 and the retrieval loss (cross-entropy over 20 x cosine), from embeddings computed 64 texts at a
    time in file order (unsorted), with tensor ops written out here."""
    texts = [s for s, _ in pairs] + [p for _, p in pairs]
    pieces = []
    with torch.no_grad():
        for start in range(0, len(texts), 64):
            batch = minilm.tokenize(texts[start : start + 64])
            pieces.append(model.encode(batch.input_ids, batch.attention_mask, head_mask=head_mask))
    E, n = torch.cat(pieces), len(pairs)
    cosines = E[:n] @ E[n:].T
    accuracy = sum(int(cosines[i].argmax()) == i for i in range(n)) / n
    loss = -(torch.log_softmax(20.0 * cosines, dim=1).diagonal()).mean().item()
    return accuracy, loss


def mask_of(*heads) -> torch.Tensor:
    mask = torch.ones(L, H)
    for layer, head in heads:
        mask[layer, head] = 0.0
    return mask


# ---- the pairs ---------------------------------------------------------------------------------------------------


def test_splits_are_disjoint_halves_that_cover_the_file():
    importance, every = retrieval.load_paraphrases("importance"), retrieval.load_paraphrases()
    assert len(importance) == len(EVAL) == 160 and len(every) == 320
    assert importance + EVAL == every  # ids 0-159, then 160-319, in file order
    assert not set(importance) & set(EVAL)
    assert all(isinstance(s, str) and isinstance(p, str) and s != p for s, p in every)


# ---- accuracy, gradient importance, ablation ---------------------------------------------------------------------


def test_accuracy_equals_a_plain_loop(model):
    assert retrieval.retrieval_accuracy(model, SMALL) == pytest.approx(loop_accuracy(model, SMALL))
    broken = torch.ones(L, H)
    broken[:, ::2] = 0.0  # half of the heads of every layer
    expected = loop_accuracy(model, SMALL, broken)
    assert retrieval.retrieval_accuracy(model, SMALL, broken, batch_size=5) == pytest.approx(expected)


def independent_loss(model, pairs, head_mask) -> torch.Tensor:
    """Cross-entropy of each sentence over 20 x cosine with every paraphrase, each text embedded alone."""
    rows = []
    for text in [s for s, _ in pairs] + [p for _, p in pairs]:
        batch = minilm.tokenize([text])
        rows.append(model.encode(batch.input_ids, batch.attention_mask, head_mask=head_mask)[0])
    E = torch.stack(rows)
    n = len(pairs)
    return F.cross_entropy(20.0 * E[:n] @ E[n:].T, torch.arange(n))


def test_gradient_importance_matches_finite_differences(model):
    pairs = retrieval.load_paraphrases("importance")[:4]
    double = deepcopy(model).double()  # float64: central differences accurate to ~1e-9
    importance = retrieval.gradient_importance(double, pairs, chunk=4, normalize=False)
    eps = 1e-4
    for layer, head in [(0, 3), (5, 7)]:
        up, down = torch.ones(L, H, dtype=torch.float64), torch.ones(L, H, dtype=torch.float64)
        up[layer, head], down[layer, head] = 1 + eps, 1 - eps
        with torch.no_grad():
            slope = (independent_loss(double, pairs, up) - independent_loss(double, pairs, down)) / (2 * eps)
        assert importance[layer, head].item() == pytest.approx(abs(slope.item()), rel=1e-4)


def test_gradient_importance_averages_absolute_gradients_over_chunks(model):
    pairs = retrieval.load_paraphrases("importance")[:6]
    expected = torch.zeros(L, H)
    for part in (pairs[:3], pairs[3:]):
        gates = torch.ones(L, H, requires_grad=True)
        (grad,) = torch.autograd.grad(retrieval.retrieval_loss(model, part, gates), gates)
        expected += grad.abs() / 2
    raw = retrieval.gradient_importance(model, pairs, chunk=3, normalize=False)
    torch.testing.assert_close(raw, expected, rtol=1e-5, atol=1e-8)
    normalized = retrieval.gradient_importance(model, pairs, chunk=3)
    torch.testing.assert_close(normalized, raw / raw.norm(dim=1, keepdim=True), rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(normalized.norm(dim=1), torch.ones(L))


def test_ablation_drop_is_the_accuracy_lost_with_that_head_masked(model):
    pairs = SMALL[:6]
    drops = retrieval.ablation_drops(model, pairs)
    full = loop_accuracy(model, pairs)
    for layer, head in [(3, 5), tuple(divmod(int(drops.argmax()), H))]:
        expected = full - loop_accuracy(model, pairs, mask_of((layer, head)))
        assert drops[layer, head].item() == pytest.approx(expected, abs=1e-9), (layer, head)


def test_ablation_loss_increase_is_the_loss_gained_with_that_head_masked(model):
    pairs = SMALL[:4]
    increase = retrieval.ablation_drops(model, pairs, metric="loss")
    full = batch_scores(model, pairs)[1]
    for layer, head in [(0, 7), tuple(divmod(int(increase.argmax()), H))]:
        expected = batch_scores(model, pairs, mask_of((layer, head)))[1] - full
        assert increase[layer, head].item() == pytest.approx(expected, abs=1e-5), (layer, head)


# ---- pruning curves and their summaries --------------------------------------------------------------------------


def test_curve_starts_at_the_full_model_and_ends_with_no_heads(model):
    order = retrieval.random_orders(1, seed=3)[0]
    curve = retrieval.pruning_curve(model, SMALL, order, [0, 5, L * H])
    assert curve[0] == pytest.approx(retrieval.retrieval_accuracy(model, SMALL))
    assert curve[1] == pytest.approx(loop_accuracy(model, SMALL, mask_of(*order[:5])))
    assert curve[2] == pytest.approx(loop_accuracy(model, SMALL, torch.zeros(L, H)))
    losses = retrieval.pruning_curve(model, SMALL, order, [0, L * H], metric="loss")
    assert losses[0] == pytest.approx(batch_scores(model, SMALL)[1], abs=1e-5)
    assert losses[1] == pytest.approx(batch_scores(model, SMALL, torch.zeros(L, H))[1], abs=1e-5)


def test_random_orders_are_seeded_permutations():
    orders = retrieval.random_orders(3, seed=7)
    every = {(layer, head) for layer in range(L) for head in range(H)}
    assert all(len(o) == L * H and set(o) == every for o in orders)
    assert orders == retrieval.random_orders(3, seed=7) and orders[0] != orders[1]
    assert orders[1] == pruning.random_order((L, H), 8)


def test_curve_auc_is_the_normalised_trapezoid_area():
    assert retrieval.curve_auc([0, 36, 72], [1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert retrieval.curve_auc([0, 36, 72], [1.0, 1.0, 0.0]) == pytest.approx(0.75)
    # Uneven steps: 10 heads at a mean of 0.75, then 62 at 0.5, over 72.
    assert retrieval.curve_auc([0, 10, 72], [1.0, 0.5, 0.5]) == pytest.approx((10 * 0.75 + 62 * 0.5) / 72)
    assert retrieval.curve_auc(torch.tensor([4, 8]).tolist(), torch.tensor([0.5, 0.5])) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "accuracies, tolerance, expected",
    [
        ([0.9, 0.9, 0.9, 0.9], 0.01, 6),  # never drops
        ([0.9, 0.89, 0.85, 0.2], 0.01, 2),  # exactly one point lower still counts
        ([0.9, 0.885, 0.95, 0.5], 0.01, 4),  # a dip, then a count that passes again: the largest passing count
        ([0.9, 0.88, 0.87, 0.5], 0.01, 0),  # the first step already loses two points
        ([0.9, 0.88, 0.876, 0.5], 0.025, 4),
        ([0.9, 0.9, 0.899, 0.9], 0.0, 6),
    ],
)
def test_prunable_heads_on_synthetic_curves(accuracies, tolerance, expected):
    assert retrieval.prunable_heads([0, 2, 4, 6], accuracies, tolerance) == expected


# ---- physical pruning --------------------------------------------------------------------------------------------


def test_physical_pruning_saves_the_heads_parameters_and_computes_the_masked_model(model):
    heads = [(0, 1), (0, 2), (4, 11)]
    before = [p.clone() for p in model.parameters()]
    savings = retrieval.physical_pruning_savings(model, heads, sentences=[s for s, _ in SMALL], repeats=1)
    d, head_size = 384, 32
    per_head = 4 * d * head_size + 3 * head_size  # rows of W_q, W_k, W_v with their biases; columns of W_o
    assert savings["parameters_before"] - savings["parameters_after"] == len(heads) * per_head
    assert savings["heads_removed"] == 3 and savings["equal"] and savings["max_abs_difference"] <= 1e-5
    assert savings["seconds_before"] > 0 and savings["seconds_after"] > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # model untouched
    assert retrieval.physical_pruning_savings(model, {4: [11]}, sentences=["Hi."], repeats=1)["heads_removed"] == 1


# ---- the shipped study -------------------------------------------------------------------------------------------


def test_shipped_study_matches_the_code(model, study):
    assert study["provenance"]["model_sha256"] == minilm.SAFETENSORS_SHA256
    assert study["pairs"] == {"importance": 160, "eval": 160}
    full, loss = batch_scores(model, EVAL)
    assert study["full_accuracy"] == pytest.approx(full, abs=1e-12)
    assert study["full_loss"] == pytest.approx(loss, abs=1e-5)
    importance = retrieval.gradient_importance(model, retrieval.load_paraphrases("importance"), normalize=False)
    torch.testing.assert_close(study["importance_raw"], importance, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(study["importance"], pruning.normalize_per_layer(importance), rtol=1e-4, atol=1e-6)
    head = divmod(int(study["ablation_loss_increase"].argmax()), H)  # the most harmful single ablation
    accuracy, masked_loss = batch_scores(model, EVAL, mask_of(head))
    assert study["ablation_drops"][head].item() == pytest.approx(full - accuracy, abs=1e-9)
    assert study["ablation_loss_increase"][head].item() == pytest.approx(masked_loss - loss, abs=1e-5)


def test_shipped_study_is_consistent_with_itself(study):
    named = study["curves"]
    counts, curves = study["counts"], [named["importance"], named["importance_raw"], *named["random"]]
    assert counts[0] == 0 and counts[-1] == L * H
    assert named["importance"]["order"] == pruning.order_from_scores(study["importance"])
    assert named["importance_raw"]["order"] == pruning.order_from_scores(study["importance_raw"])
    for curve in curves:
        assert curve["accuracy"][0] == pytest.approx(study["full_accuracy"])
        assert curve["loss"][0] == pytest.approx(study["full_loss"])
        assert curve["accuracy"][-1] == pytest.approx(named["importance"]["accuracy"][-1])  # no head left
        assert curve["auc"] == pytest.approx(retrieval.curve_auc(counts, curve["accuracy"]))
        assert curve["loss_auc"] == pytest.approx(pruning.area_under_curve(curve["loss"], counts))
        assert curve["prunable"] == retrieval.prunable_heads(counts, curve["accuracy"], study["settings"]["tolerance"])
    for curve in study["curves"]["random"]:
        assert curve["order"] == retrieval.random_orders(1, curve["seed"])[0]
    aucs = [c["auc"] for c in study["curves"]["random"]]
    assert study["summary"]["random_auc"]["min"] == min(aucs) and study["summary"]["random_auc"]["max"] == max(aucs)
    assert study["savings"]["equal"]


def test_a_damaged_study_file_is_refused(tmp_path):
    data = json.loads(retrieval.STUDY_PATH.read_text())
    bad = dict(data, importance=data["importance"][:5])
    (tmp_path / "short.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="importance must be a"):
        retrieval.load_study(tmp_path / "short.json")
    (tmp_path / "missing.json").write_text(json.dumps({k: v for k, v in data.items() if k != "counts"}))
    with pytest.raises(ValueError, match="counts"):
        retrieval.load_study(tmp_path / "missing.json")


# ---- validation --------------------------------------------------------------------------------------------------


def test_bad_arguments_raise_before_arithmetic(model):
    cases = [
        (lambda: retrieval.load_paraphrases("train"), ValueError, "'train'"),
        (lambda: retrieval.retrieval_accuracy(model, SMALL[:1]), ValueError, "at least 2 pairs"),
        (lambda: retrieval.retrieval_accuracy(model, "a sentence"), TypeError, "pairs must be a list"),
        (lambda: retrieval.retrieval_accuracy(model, [("a", "b"), ("c", 3)]), TypeError, "indices [1]"),
        (lambda: retrieval.retrieval_accuracy(model, SMALL, torch.ones(6, 8)), ValueError, "(6, 8)"),
        (lambda: retrieval.retrieval_accuracy("model", SMALL), TypeError, "BertEncoder"),
        (lambda: retrieval.retrieval_accuracy(model, SMALL, batch_size=0), ValueError, "batch_size"),
        (lambda: retrieval.gradient_importance(model, SMALL, chunk=0), ValueError, "chunk"),
        (lambda: retrieval.ablation_drops(model, SMALL, metric="bleu"), ValueError, "'bleu'"),
        (lambda: retrieval.pruning_curve(model, SMALL, [(0, 1)], [0], metric="f1"), ValueError, "'f1'"),
        (lambda: retrieval.pruning_curve(model, SMALL, [(0, 1), (0, 1)], [0]), ValueError, "twice"),
        (lambda: retrieval.pruning_curve(model, SMALL, [(6, 0)], [0]), ValueError, "outside"),
        (lambda: retrieval.pruning_curve(model, SMALL, [(0, 1)], [0, 2]), ValueError, "[0, 1]"),
        (lambda: retrieval.pruning_curve(model, SMALL, [(0, 1), (0, 2)], [2, 1]), ValueError, "increasing"),
        (lambda: retrieval.physical_pruning_savings(model, "0.1"), TypeError, "heads must be"),
        (lambda: retrieval.physical_pruning_savings(model, [(0, 12)]), ValueError, "outside"),
    ]
    for call, error, fragment in cases:
        with no_arithmetic(), pytest.raises(error) as info:
            call()
        assert fragment in str(info.value), str(info.value)


def test_bad_curves_raise_clear_errors():
    cases = [
        (lambda: retrieval.curve_auc([0], [1.0]), ValueError, "two points"),
        (lambda: retrieval.curve_auc([0, 2], [1.0]), ValueError, "2 numbers"),
        (lambda: retrieval.curve_auc([0, 2], [1.0, 1.5]), ValueError, "[0, 1]"),
        (lambda: retrieval.curve_auc([0, 2.5], [1.0, 1.0]), TypeError, "ints"),
        (lambda: retrieval.prunable_heads([2, 4], [1.0, 1.0]), ValueError, "start at 0"),
        (lambda: retrieval.prunable_heads([0, 4], [1.0, 1.0], tolerance=-0.1), ValueError, "tolerance"),
        (lambda: retrieval.prunable_heads([0, 4], [1.0, 1.0], tolerance="1"), TypeError, "tolerance"),
        (lambda: retrieval.random_orders(0), ValueError, "n must be"),
        (lambda: retrieval.random_orders(2, seed=1.5), TypeError, "seed"),
    ]
    for call, error, fragment in cases:
        with pytest.raises(error) as info:
            call()
        assert fragment in str(info.value), str(info.value)
