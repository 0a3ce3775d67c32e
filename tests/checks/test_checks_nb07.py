"""The exercise checks of notebook 07 accept right answers and reject typical wrong ones by name."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial.analysis import pruning
from mha_tutorial.checks import (
    CheckFailed,
    check_delta_loss,
    check_head_importance,
    check_params_after_pruning,
    check_pruning_order,
)
from mha_tutorial.checks._nb07_ablation import DELTA_CASES, delta_mistakes
from mha_tutorial.checks.nb07 import _IMPORTANCE_CASES, _importance_mistakes, _model, _order_cases, _param_cases
from mha_tutorial.models.tasks import get_task
from mha_tutorial.models.train import evaluate

# ---------------------------------------------------------------- Exercise 1: gradient importance of one layer


def grads(model, task_name, examples, reduction="mean"):
    """Per-example dL/dxi, (N, L, H), written independently of the check's helper."""
    task = get_task(task_name)
    out = []
    for row in examples:
        gates = torch.ones(model.num_attention_layers, model.num_heads, requires_grad=True)
        batch = task.collate([row])
        logits = task.forward(model, batch, gates)
        loss = F.cross_entropy(logits[batch.loss_mask], batch.tgt_out[batch.loss_mask], reduction=reduction)
        out.append(torch.autograd.grad(loss, gates)[0])
    return torch.stack(out)


def importance_right(model, task_name, examples, layer):
    return grads(model, task_name, examples)[:, layer].abs().mean(0)


def importance_via_package(model, task_name, examples, layer):
    return pruning.gradient_importance(model, task_name, examples=examples, limit=None, normalize=False)[layer]


def importance_abs_after_mean(model, task_name, examples, layer):
    return grads(model, task_name, examples)[:, layer].mean(0).abs()


def importance_one_batch(model, task_name, examples, layer):
    task = get_task(task_name)
    gates = torch.ones(model.num_attention_layers, model.num_heads, requires_grad=True)
    batch = task.collate(examples)
    logits = task.forward(model, batch, gates)
    loss = F.cross_entropy(logits[batch.loss_mask], batch.tgt_out[batch.loss_mask])
    return torch.autograd.grad(loss, gates)[0][layer].abs()


def importance_signed(model, task_name, examples, layer):
    return grads(model, task_name, examples)[:, layer].mean(0)


def importance_summed(model, task_name, examples, layer):
    return grads(model, task_name, examples)[:, layer].abs().sum(0)


def importance_loss_summed(model, task_name, examples, layer):
    return grads(model, task_name, examples, reduction="sum")[:, layer].abs().mean(0)


def importance_squared(model, task_name, examples, layer):
    return (grads(model, task_name, examples)[:, layer] ** 2).mean(0)


def importance_normalised(model, task_name, examples, layer):
    row = importance_right(model, task_name, examples, layer)
    return row / row.norm()


def importance_next_layer(model, task_name, examples, layer):
    return importance_right(model, task_name, examples, (layer + 1) % model.num_attention_layers)


def importance_whole_table(model, task_name, examples, layer):
    return grads(model, task_name, examples).abs().mean(0)


def importance_train_mode(model, task_name, examples, layer):
    model.train()
    return importance_right(model, task_name, examples, layer)


def importance_edits_model(model, task_name, examples, layer):
    with torch.no_grad():
        next(model.parameters()).mul_(1.001)
    return importance_right(model, task_name, examples, layer)


def test_head_importance_accepts_right_answers(capsys):
    check_head_importance(importance_right)
    assert "✓ check_head_importance: passed on 3 cases" in capsys.readouterr().out


def test_head_importance_refuses_the_package_implementation():
    with pytest.raises(CheckFailed, match="pruning.gradient_importance"):
        check_head_importance(importance_via_package)


def test_every_named_importance_mistake_differs_from_the_right_answer():
    """Otherwise a right answer could be reported as a mistake; and at least one case must separate each."""
    separated = {}
    for task_name, layer, n in _IMPORTANCE_CASES:
        model = _model(task_name)
        examples = get_task(task_name).load_split("importance")[:n]
        right = importance_right(model, task_name, examples, layer)
        for message, wrong in _importance_mistakes(model, task_name, examples, layer):
            key = message.split(":")[0]
            separated[key] = separated.get(key, False) or not torch.allclose(wrong, right, rtol=1e-4, atol=1e-6)
    assert all(separated.values()), [k for k, ok in separated.items() if not ok]


@pytest.mark.parametrize(
    "wrong, words",
    [
        (importance_abs_after_mean, "absolute value after averaging"),
        (importance_one_batch, "|E[g]|"),
        (importance_signed, "no absolute value"),
        (importance_summed, "summed over the examples"),
        (importance_loss_summed, "summed over its positions"),
        (importance_squared, "squared gradients"),
        (importance_normalised, "normalised by its L2 norm"),
        (importance_next_layer, "returned the importances of layer 0 (dec.0.self), not layer 1"),
        (importance_whole_table, "whole (layers, heads) = (2, 4) table"),
        (importance_train_mode, "training mode"),
        (importance_edits_model, "changed the model's"),
        (lambda m, t, e, layer: importance_right(m, t, e, layer) * 1.01, "wrong values"),
        (lambda m, t, e, layer: importance_right(m, t, e, layer).tolist(), "expected a tensor"),
    ],
)
def test_head_importance_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_head_importance(wrong)
    assert words in str(info.value)


def test_one_batch_gradient_is_named_as_averaging_first():
    """On the induction case (examples with different numbers of counted positions) the single-batch
    gradient differs from |mean of per-example gradients|; it must still be recognised."""
    with pytest.raises(CheckFailed) as info:
        check_head_importance(importance_one_batch)
    assert "induction model" in str(info.value) and "cancel" in str(info.value)


# ---------------------------------------------------------------- Exercise 2: pruning order


def order_right(scores):
    L, H = scores.shape
    return [(int(i) // H, int(i) % H) for i in torch.argsort(scores.flatten(), stable=True)]


def order_descending(scores):
    L, H = scores.shape
    return [(int(i) // H, int(i) % H) for i in torch.argsort(scores.flatten(), descending=True, stable=True)]


def order_reverse_sorted(scores):  # descending with ties in reverse position order
    return order_right(scores)[::-1]


def order_flat(scores):
    return torch.argsort(scores.flatten(), stable=True).tolist()


def order_swapped(scores):
    return [(h, l) for l, h in order_right(scores)]


def order_divmod_layers(scores):
    L, H = scores.shape
    return [(int(i) // L, int(i) % L) for i in torch.argsort(scores.flatten(), stable=True)]


def order_column_major_ties(scores):
    L, H = scores.shape
    flat = scores.T.flatten()  # position j*L + l holds scores[l, j]
    return [(int(i) % L, int(i) // L) for i in torch.argsort(flat, stable=True)]


def order_missing_one(scores):
    return order_right(scores)[:-1]


def test_pruning_order_accepts_right_answers(capsys):
    check_pruning_order(order_right)
    check_pruning_order(lambda s: torch.tensor(order_right(s)))  # an (N, 2) tensor is fine
    assert capsys.readouterr().out.count("✓ check_pruning_order: passed on 4 cases") == 2


def test_pruning_order_refuses_the_package_implementation():
    with pytest.raises(CheckFailed, match="pruning.order_from_scores"):
        check_pruning_order(pruning.order_from_scores)
    with pytest.raises(CheckFailed, match="pruning.order_from_scores"):
        check_pruning_order(lambda s: pruning.order_from_scores(s.clone()))


def test_order_cases_have_ties_and_non_square_shapes():
    cases = [scores for scores, _ in _order_cases()]
    assert any(scores.flatten().unique().numel() < scores.numel() for scores in cases)
    assert any(scores.shape[0] != scores.shape[1] and scores.shape[0] > 1 for scores in cases)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (order_descending, "descending"),
        (order_reverse_sorted, "descending"),
        (order_flat, "flat indices"),
        (order_swapped, "(head, layer)"),
        (order_divmod_layers, "number of layers"),
        (order_column_major_ties, "equal scores are not in row-major order"),
        (order_missing_one, "exactly once"),
        (lambda s: "no", "list of (layer, head) pairs"),
        (lambda s: [(0, 1, 2)] * s.numel(), "pair of ints"),
        (lambda s: order_right(s)[1:] + order_right(s)[:1], "got"),
    ],
)
def test_pruning_order_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_pruning_order(wrong)
    assert words in str(info.value)


# ---------------------------------------------------------------- Exercise 3: parameters after pruning


def params_right(model, heads):
    D, H = model.config.num_hiddens, model.num_heads
    d = D // H
    per_head = 4 * d * D + (3 * d if model.config.bias else 0)
    return sum(p.numel() for p in model.parameters()) - per_head * sum(len(h) for h in heads.values())


def params_by_pruning(model, heads):
    return pruning.count_parameters(pruning.pruned_copy(model, heads))


def removed_with(model, heads, weights_per_head, biases_per_head):
    n = sum(len(h) for h in heads.values())
    return sum(p.numel() for p in model.parameters()) - n * (weights_per_head + biases_per_head)


def params_no_wo(model, heads):
    D, d = model.config.num_hiddens, model.config.num_hiddens // model.num_heads
    return removed_with(model, heads, 3 * d * D, 3 * d if model.config.bias else 0)


def params_wo_bias_too(model, heads):
    D, d = model.config.num_hiddens, model.config.num_hiddens // model.num_heads
    return removed_with(model, heads, 4 * d * D, 4 * d if model.config.bias else 0)


def params_no_bias(model, heads):
    D, d = model.config.num_hiddens, model.config.num_hiddens // model.num_heads
    return removed_with(model, heads, 4 * d * D, 0)


def params_always_bias(model, heads):
    D, d = model.config.num_hiddens, model.config.num_hiddens // model.num_heads
    return removed_with(model, heads, 4 * d * D, 3 * d)


def params_d_by_d(model, heads):
    d = model.config.num_hiddens // model.num_heads
    return removed_with(model, heads, 4 * d * d, 3 * d if model.config.bias else 0)


def params_removed(model, heads):
    return sum(p.numel() for p in model.parameters()) - params_right(model, heads)


def params_attention_only(model, heads):
    attention = sum(sum(p.numel() for p in layer.parameters()) for _, layer in model.attention_layers())
    return attention - (sum(p.numel() for p in model.parameters()) - params_right(model, heads))


def test_params_after_pruning_accepts_right_answers(capsys):
    check_params_after_pruning(params_right)
    check_params_after_pruning(lambda m, h: torch.tensor(params_right(m, h)))
    assert capsys.readouterr().out.count("✓ check_params_after_pruning: passed on 5 cases") == 2


def test_param_cases_cover_bias_and_no_bias():
    assert {model.config.bias for model, _, _ in _param_cases()} == {True, False}


@pytest.mark.parametrize(
    "wrong, words",
    [
        (params_by_pruning, "pruned the model"),
        (params_no_wo, "forgot W_o"),
        (params_wo_bias_too, "W_o's bias"),
        (params_no_bias, "forgot the biases"),
        (params_always_bias, "this model has bias=False"),
        (params_d_by_d, "d x d block"),
        (params_removed, "number of parameters removed"),
        (params_attention_only, "only the attention layers"),
        (lambda m, h: float(params_right(m, h)), "as an int"),
        (lambda m, h: params_right(m, h) + 1, "got"),
    ],
)
def test_params_after_pruning_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_params_after_pruning(wrong)
    assert words in str(info.value)


# ---------------------------------------------------------------- Exercise 4: several heads off together


def _gates(model, heads):
    gates = torch.ones(model.num_attention_layers, model.num_heads)
    for layer, head in heads:
        gates[layer, head] = 0.0
    return gates


def delta_right(model, task_name, examples, heads):
    """Written independently of the check: one batch, the mean over every counted position."""
    task = get_task(task_name)
    batch = task.collate(list(examples))

    def loss(gates):
        with torch.no_grad():
            logits = task.forward(model.eval(), batch, gates)
        return F.cross_entropy(logits[batch.loss_mask], batch.tgt_out[batch.loss_mask]).item()

    return loss(_gates(model, heads)) - loss(_gates(model, []))


def delta_via_package(model, task_name, examples, heads):
    return pruning.ablation(model, task_name, examples=examples)["delta_loss"][heads[0]].item()


def delta_via_curve(model, task_name, examples, heads):
    curve = pruning.pruning_curve(model, task_name, heads, examples=examples)["loss"]
    return (curve[-1] - curve[0]).item()


def delta_summed(model, task_name, examples, heads):
    return sum(delta_right(model, task_name, examples, [h]) for h in heads)


def delta_first_only(model, task_name, examples, heads):
    return delta_right(model, task_name, examples, heads[:1])


def delta_reversed(model, task_name, examples, heads):
    return -delta_right(model, task_name, examples, heads)


def delta_loss_only(model, task_name, examples, heads):
    return evaluate(model, task_name, examples=examples, head_mask=_gates(model, heads))["loss"]


def delta_accuracy(model, task_name, examples, heads):
    off = evaluate(model, task_name, examples=examples, head_mask=_gates(model, heads))["accuracy"]
    return off - evaluate(model, task_name, examples=examples)["accuracy"]


def delta_swapped(model, task_name, examples, heads):
    return delta_right(model, task_name, examples, [(h, layer) for layer, h in heads])


def delta_per_example(model, task_name, examples, heads):
    task = get_task(task_name)
    batch = task.collate(list(examples))

    def loss(gates):
        with torch.no_grad():
            logits = task.forward(model.eval(), batch, gates)
        per_token = F.cross_entropy(logits.transpose(1, 2), batch.tgt_out, reduction="none")
        counted = batch.loss_mask.float()
        return ((per_token * counted).sum(1) / counted.sum(1)).mean().item()

    return loss(_gates(model, heads)) - loss(_gates(model, []))


def delta_train_mode(model, task_name, examples, heads):
    value = delta_right(model, task_name, examples, heads)
    model.train()
    return value


def test_delta_loss_accepts_right_answers(capsys):
    check_delta_loss(delta_right)
    check_delta_loss(lambda m, t, e, h: torch.tensor(delta_right(m, t, e, h)))
    out = capsys.readouterr().out
    assert out.count(f"✓ check_delta_loss: passed on {len(DELTA_CASES)} cases") == 2
    assert "off together: Δloss" in out and "sum of their single Δlosses" in out
    assert "dates, enc.1.self head 0, enc.1.self head 1, enc.1.self head 2, enc.1.self head 3 off together" in out


@pytest.mark.parametrize("via", [delta_via_package, delta_via_curve])
def test_delta_loss_refuses_the_package_implementations(via):
    with pytest.raises(CheckFailed, match="pruning.ablation|pruning.pruning_curve"):
        check_delta_loss(via)


def test_every_named_delta_mistake_differs_from_the_right_answer():
    """Each named mistake must be told apart from the right answer in at least one case."""
    separated = {}
    for task_name, heads, n in DELTA_CASES:
        model = _model(task_name)
        examples = get_task(task_name).load_split("importance")[:n]
        right = delta_right(model, task_name, examples, heads)
        for message, wrong in delta_mistakes(model, task_name, examples, heads):
            key = message.split(":")[0]
            separated[key] = separated.get(key, False) or abs(wrong - right) > 1e-6 + 1e-4 * abs(right)
    assert all(separated.values()), [k for k, ok in separated.items() if not ok]


@pytest.mark.parametrize(
    "wrong, words",
    [
        (delta_summed, "added up the single-head"),
        (delta_first_only, "only the first listed head"),
        (delta_reversed, "sign is reversed"),
        (delta_loss_only, "returned the loss with the heads off"),
        (delta_accuracy, "change in accuracy"),
        (delta_swapped, "[head, layer]"),
        (delta_per_example, "each example's own mean loss"),
        (delta_train_mode, "training mode"),
        (lambda m, t, e, h: delta_right(m, t, e, h) + 0.01, "expected"),
        (lambda m, t, e, h: [delta_right(m, t, e, h)], "as a float"),
    ],
)
def test_delta_loss_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_delta_loss(wrong)
    assert words in str(info.value)
