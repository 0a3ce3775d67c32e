"""Head importance and pruning: ablation, gradient importance (Michel et al. 2019), pruning curves,
and physical pruning that computes exactly what masking does."""

import itertools

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial import MultiHeadAttention
from mha_tutorial.analysis import pruning
from mha_tutorial.models.tasks import get_task
from mha_tutorial.models.train import evaluate, load_pretrained

TASKS = ["reversal", "induction", "dates"]


def rows(name, split="eval", n=40):
    return get_task(name).load_split(split)[:n]


# ---- ablation ---------------------------------------------------------------------------------


def test_ablation_table_matches_masking_each_head_by_hand(models):
    model, examples = models["induction"], rows("induction")
    table = pruning.ablation(model, "induction", examples=examples)
    L, H = model.num_attention_layers, model.num_heads
    assert table["loss"].shape == table["delta_accuracy"].shape == (L, H)
    assert table["base_loss"] == pytest.approx(evaluate(model, "induction", examples=examples)["loss"])
    mask = torch.ones(L, H)
    mask[1, 2] = 0
    by_hand = evaluate(model, "induction", examples=examples, head_mask=mask)
    assert table["loss"][1, 2].item() == pytest.approx(by_hand["loss"], rel=1e-5)
    assert table["delta_loss"][1, 2].item() == pytest.approx(by_hand["loss"] - table["base_loss"], rel=1e-4, abs=1e-7)


# ---- gradient importance --------------------------------------------------------------------


def per_example_loss(model, task, row, gates):
    batch = task.collate([row])
    logits = task.forward(model, batch, gates)
    return F.cross_entropy(logits[batch.loss_mask], batch.tgt_out[batch.loss_mask])


def test_gradient_importance_equals_mean_absolute_finite_difference(models):
    """An independent reference: central differences of each example's loss in each gate, in float64."""
    model, task, examples = models["induction"], get_task("induction"), rows("induction", "importance", 6)
    model64 = load_pretrained("induction", device="cpu").double()
    L, H = model.num_attention_layers, model.num_heads
    reference = torch.zeros(L, H, dtype=torch.double)
    eps = 1e-5
    for row, (layer, head) in itertools.product(examples, itertools.product(range(L), range(H))):
        up, down = torch.ones(L, H, dtype=torch.double), torch.ones(L, H, dtype=torch.double)
        up[layer, head] += eps
        down[layer, head] -= eps
        with torch.no_grad():
            diff = per_example_loss(model64, task, row, up) - per_example_loss(model64, task, row, down)
        reference[layer, head] += abs(diff.item()) / (2 * eps)
    reference /= len(examples)
    ours = pruning.gradient_importance(model64, "induction", examples=examples, normalize=False)
    torch.testing.assert_close(ours.double(), reference, rtol=1e-4, atol=1e-7)


def test_absolute_value_is_taken_per_example_not_per_batch(models):
    model, task, examples = models["dates"], get_task("dates"), rows("dates", "importance", 8)
    per_example = pruning.gradient_importance(model, "dates", examples=examples, normalize=False)
    gates = torch.ones(model.num_attention_layers, model.num_heads, requires_grad=True)
    total = sum(per_example_loss(model, task, row, gates) for row in examples) / len(examples)
    (batch_grad,) = torch.autograd.grad(total, gates)
    assert torch.all(per_example >= batch_grad.abs() - 1e-6)  # the triangle inequality
    # and here it matters: signs differ across examples, so averaging first would hide importance
    assert (per_example - batch_grad.abs()).max() > 0.1 * per_example.max()


def test_normalized_importance_has_unit_rows_and_masked_heads_get_zero(models):
    model = models["dates"]
    L, H = model.num_attention_layers, model.num_heads
    mask = torch.ones(L, H)
    mask[2, 1] = 0
    importance = pruning.gradient_importance(model, "dates", examples=rows("dates", "importance", 5), head_mask=mask)
    assert importance[2, 1] == 0
    torch.testing.assert_close(importance.norm(dim=1), torch.ones(L))
    assert not model.training


def test_gradient_importance_rejects_a_wrong_head_mask(models):
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        pruning.gradient_importance(models["induction"], "induction", limit=2, head_mask=torch.ones(4, 2))
    with pytest.raises(TypeError, match="head_mask"):
        pruning.check_head_mask(models["induction"], [[1.0] * 4] * 2)


# ---- rank correlation, curves, orders ----------------------------------------------------------


def test_rank_correlation_against_known_values():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert pruning.rank_correlation(a, a * 10) == pytest.approx(1.0)
    assert pruning.rank_correlation(a, -a) == pytest.approx(-1.0)
    # With ties (average ranks), against the textbook formula on ranks [1.5, 1.5, 3, 4] vs [1, 2, 3, 4].
    tied = torch.tensor([1.0, 1.0, 3.0, 4.0])
    ra, rb = torch.tensor([1.5, 1.5, 3.0, 4.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected = torch.corrcoef(torch.stack([ra, rb]))[0, 1].item()
    assert pruning.rank_correlation(tied, a) == pytest.approx(expected)
    with pytest.raises(ValueError, match="same shape"):
        pruning.rank_correlation(a, a[:3])


def test_pruning_curve_starts_at_the_full_model_and_ends_with_every_head_masked(models):
    model, examples = models["reversal"], rows("reversal")
    order = pruning.random_order(model, seed=0)
    curve = pruning.pruning_curve(model, "reversal", order, examples=examples)
    assert curve["accuracy"].shape == (len(order) + 1,)
    assert curve["accuracy"][0] == pytest.approx(evaluate(model, "reversal", examples=examples)["accuracy"])
    none_left = torch.zeros(model.num_attention_layers, model.num_heads)
    assert curve["loss"][-1].item() == pytest.approx(
        evaluate(model, "reversal", examples=examples, head_mask=none_left)["loss"], rel=1e-5
    )


def test_pruning_curve_without_the_loss_gives_the_same_accuracy(models):
    model, examples = models["dates"], rows("dates", n=60)
    order = pruning.random_order(model, seed=1)[:6]
    full = pruning.pruning_curve(model, "dates", order, examples=examples)
    quick = pruning.pruning_curve(model, "dates", order, examples=examples, loss=False)
    assert quick["loss"] is None
    assert torch.equal(quick["accuracy"], full["accuracy"])
    assert full["accuracy"].min() < full["accuracy"].max()  # the masks change the accuracy: the comparison can fail
    with pytest.raises(TypeError, match="loss must be True or False"):
        pruning.pruning_curve(model, "dates", order, examples=examples, loss="no")


def test_pruning_curve_rejects_bad_orders(models):
    model = models["reversal"]
    with pytest.raises(ValueError, match="twice"):
        pruning.pruning_curve(model, "reversal", [(0, 1), (0, 1)], examples=rows("reversal", n=4))
    with pytest.raises(ValueError, match="outside"):
        pruning.pruning_curve(model, "reversal", [(0, 9)], examples=rows("reversal", n=4))


def test_orders_are_permutations_of_all_heads(models):
    model = models["induction"]
    every = {(layer, head) for layer in range(2) for head in range(4)}
    scores = torch.tensor([[0.5, 0.1, 0.5, 0.9], [0.0, 0.2, 0.3, 0.4]])
    assert pruning.order_from_scores(scores)[:3] == [(1, 0), (0, 1), (1, 1)]
    assert pruning.order_from_scores(scores, ascending=False)[0] == (0, 3)
    assert set(pruning.random_order(model, 1)) == every
    assert pruning.random_order(model, 1) != pruning.random_order(model, 2)
    order = pruning.iterative_importance_order(model, "induction", limit=4)
    assert len(order) == 8 and set(order) == every


def test_curve_summaries():
    assert pruning.area_under_curve(torch.tensor([1.0, 1.0, 1.0])) == pytest.approx(1.0)
    assert pruning.area_under_curve(torch.tensor([1.0, 0.0])) == pytest.approx(0.5)
    assert pruning.heads_prunable(torch.tensor([1.0, 0.995, 0.99, 0.95, 0.2])) == 2
    assert pruning.heads_prunable(torch.tensor([1.0, 1.0, 1.0])) == 2
    assert pruning.heads_prunable(torch.tensor([0.9, 0.5])) == 0


# ---- physical pruning ------------------------------------------------------------------------


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pruned_model_equals_masked_model(models, name, seed):
    model, task = models[name], get_task(name)
    L, H = model.num_attention_layers, model.num_heads
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(L, H, generator=g) < 0.5).float()
    mask[int(torch.randint(L, (1,), generator=g))] = 0  # and one whole layer gone
    heads = {layer: [h for h in range(H) if mask[layer, h] == 0] for layer in range(L)}
    pruned = pruning.pruned_copy(model, heads)
    batch = task.collate(rows(name, n=32))
    with torch.no_grad():
        torch.testing.assert_close(task.forward(pruned, batch), task.forward(model, batch, mask), rtol=0, atol=1e-5)
        # head_mask keeps its original (layers, heads) numbering on the pruned model
        other = torch.rand(L, H, generator=g)
        torch.testing.assert_close(
            task.forward(pruned, batch, other), task.forward(model, batch, other * mask), rtol=0, atol=1e-5
        )
    assert pruning.count_parameters(pruned) < pruning.count_parameters(model)


def test_pruning_in_two_steps_equals_pruning_at_once():
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, 6, bias=True)
    x = torch.randn(2, 5, 24)
    once, twice = pruning.deepcopy(mha), pruning.deepcopy(mha)
    once.prune_heads([1, 4, 5])
    twice.prune_heads([4])
    twice.prune_heads([5, 1])
    assert once.head_ids == twice.head_ids == [0, 2, 3]
    torch.testing.assert_close(once(x, x, x), twice(x, x, x), rtol=0, atol=1e-6)
    gates = torch.tensor([1.0, 0, 1, 1, 0, 0])
    torch.testing.assert_close(once(x, x, x), mha(x, x, x, head_mask=gates), rtol=0, atol=1e-5)
    torch.testing.assert_close(once(x, x, x, need_weights=False), mha(x, x, x, head_mask=gates), rtol=0, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_pruning_every_head_leaves_only_the_output_bias(bias):
    mha = MultiHeadAttention(8, 2, bias=bias)
    mha.prune_heads([0, 1])
    x = torch.randn(3, 4, 8)
    expected = (mha.W_o.bias if bias else torch.zeros(8)).expand(3, 4, 8)
    torch.testing.assert_close(mha(x, x, x), expected)
    torch.testing.assert_close(mha(x, x, x, need_weights=False), expected)
    assert mha.attention_weights is None or mha.attention_weights.shape == (3, 0, 4, 4)
    assert mha.W_q.weight.shape == (0, 8) and mha.W_o.weight.shape == (8, 0)


def test_prune_heads_errors():
    mha = MultiHeadAttention(8, 4)
    with pytest.raises(ValueError, match="out of range"):
        mha.prune_heads([4])
    with pytest.raises(ValueError, match="repeat"):
        mha.prune_heads([1, 1])
    with pytest.raises(TypeError, match="ints"):
        mha.prune_heads([1.0])
    mha.prune_heads([1])
    with pytest.raises(ValueError, match="already pruned"):
        mha.prune_heads([1])
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        x = torch.randn(1, 2, 8)
        mha(x, x, x, head_mask=torch.ones(4))


def test_model_prune_heads_errors_change_nothing(models):
    model = pruning.pruned_copy(models["dates"], {})
    before = [layer.head_ids for _, layer in model.attention_layers()]
    with pytest.raises(ValueError, match="unknown attention layer"):
        model.prune_heads({"enc.9.self": [0]})
    with pytest.raises(ValueError, match="out of range"):
        model.prune_heads({0: [0], 1: [7]})  # layer 0 valid, layer 1 not: neither may change
    with pytest.raises(ValueError, match="layer 9"):
        model.prune_heads({9: [0]})
    with pytest.raises(TypeError, match="dict"):
        model.prune_heads([(0, 1)])
    assert [layer.head_ids for _, layer in model.attention_layers()] == before
    model.prune_heads({"dec.0.cross": [3]})
    with pytest.raises(ValueError, match="already pruned"):
        model.prune_heads({3: [3]})
    with pytest.raises(ValueError, match=r"\(4, 4\)"):
        get_task("dates").forward(model, get_task("dates").collate(rows("dates", n=2)), torch.ones(4, 3))


@pytest.mark.parametrize("name", ["reversal", "dates"])
def test_gradient_importance_of_a_pruned_model_equals_the_masked_model(models, name):
    """Pruned heads (a whole layer included: its gates reach nothing) get 0; the rest match masking."""
    model = models[name]
    L, H = model.num_attention_layers, model.num_heads
    heads = {0: [0, 1], L - 1: list(range(H))} if L > 1 else {0: list(range(H))}
    mask = torch.ones(L, H)
    for layer, chosen in heads.items():
        mask[layer, chosen] = 0
    examples = rows(name, n=6)
    masked = pruning.gradient_importance(model, name, examples=examples, head_mask=mask)
    pruned = pruning.gradient_importance(pruning.pruned_copy(model, heads), name, examples=examples)
    torch.testing.assert_close(pruned, masked, rtol=1e-4, atol=1e-6)
    assert (pruned[mask == 0] == 0).all()


def test_prune_attention_heads_is_what_the_method_calls():
    torch.manual_seed(0)
    by_method, by_function = MultiHeadAttention(12, 4, bias=True), MultiHeadAttention(12, 4, bias=True)
    by_function.load_state_dict(by_method.state_dict())
    by_method.prune_heads([2, 0])
    pruning.prune_attention_heads(by_function, [0, 2])
    assert by_function.head_ids == by_method.head_ids == [1, 3]
    for (name, a), (_, b) in zip(by_method.state_dict().items(), by_function.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(TypeError, match="heads must be a list of head numbers, got int"):
        pruning.prune_attention_heads(by_function, 1)


# ---- timing -----------------------------------------------------------------------------------


def test_time_pruning_times_all_four_and_the_attention_layers_are_part_of_the_model(models):
    model = models["induction"]
    mask = torch.ones(model.num_attention_layers, model.num_heads)
    mask[0, 2:] = 0
    pruned = pruning.pruned_copy(model, {0: [2, 3]})
    times = pruning.time_pruning(model, "induction", pruned, mask, rows("induction", n=16), rounds=3, block_s=0.002)
    assert set(times) == {"attention", "full", "masked", "pruned"}
    assert all(0 < t < 1e6 for t in times.values())  # microseconds per call: positive, finite, below a second
    # no comparison between the times: a timed assertion fails on a busy machine (ratios belong in benchmarks)


def test_time_pruning_rejects_bad_input(models):
    model, examples = models["reversal"], rows("reversal", n=4)
    mask = torch.ones(model.num_attention_layers, model.num_heads)
    with pytest.raises(ValueError, match="rounds"):
        pruning.time_pruning(model, "reversal", model, mask, examples, rounds=0)
    with pytest.raises(ValueError, match="block_s"):
        pruning.time_pruning(model, "reversal", model, mask, examples, block_s=-1.0)
    with pytest.raises(TypeError, match="block_s"):
        pruning.time_pruning(model, "reversal", model, mask, examples, block_s="fast")
    with pytest.raises(ValueError):  # a head_mask of the wrong shape
        pruning.time_pruning(model, "reversal", model, torch.ones(2, 4), examples)
    with pytest.raises(ValueError, match="kind"):  # a pruned copy of another task's model
        pruning.time_pruning(model, "reversal", models["induction"], mask, examples)
    with pytest.raises(ValueError, match="no examples"):
        pruning.time_pruning(model, "reversal", model, mask, [])
