"""The check of notebook 07's Exercise 4: the change in loss when several heads are switched off together."""

from __future__ import annotations

import numbers

import torch
from torch.nn import functional as F

from ..analysis import pruning
from ..models.tasks import get_task
from ..models.train import evaluate
from ._common import CheckFailed, call, friendly, passed, refusing

# The package functions that would do the exercise for the learner: the check refuses them.
_PACKAGE_ABLATION = {pruning.ablation: "pruning.ablation", pruning.pruning_curve: "pruning.pruning_curve"}

# (task, heads switched off together, number of importance examples); induction's examples differ in length.
DELTA_CASES = [
    ("dates", [(3, 3), (0, 1)], 12),
    ("induction", [(0, 2), (0, 3), (1, 1)], 40),
    ("reversal", [(0, 0), (0, 1), (0, 2)], 30),
    ("induction", [(1, 0), (1, 1), (1, 2), (1, 3)], 30),
]
# The prediction of Exercise 4: every head of the dates encoder's layer 1 (enc.1.self), whose joint effect the
# lesson prints nowhere (its pruning curves remove other heads first and print only accuracy).
PREDICTION_TASK, PREDICTION_HEADS = "dates", [(1, 0), (1, 1), (1, 2), (1, 3)]


def _mask(model, heads) -> torch.Tensor:
    mask = torch.ones(model.num_attention_layers, model.num_heads)  # (L, H), on the CPU like the check's models
    for layer, head in heads:
        mask[layer, head] = 0.0
    return mask


def _per_example_mean_loss(model, task_name: str, examples, mask) -> float:
    """The mean over examples of each example's own mean loss: a different weighting from evaluate's."""
    task = get_task(task_name)
    batch = task.collate(list(examples))
    with torch.no_grad():
        logits = task.forward(model, batch, mask)  # (B, T, V)
    per_token = F.cross_entropy(logits.transpose(1, 2), batch.tgt_out, reduction="none")  # (B, T)
    counted = batch.loss_mask.float()
    return float(((per_token * counted).sum(1) / counted.sum(1)).mean())


def delta_mistakes(model, task_name: str, examples, heads) -> list[tuple[str, float]]:
    """(message, the value that mistake gives) for the usual ways to get the change in loss wrong."""
    L, H = model.num_attention_layers, model.num_heads
    full = evaluate(model, task_name, examples=examples)
    off = evaluate(model, task_name, examples=examples, head_mask=_mask(model, heads))
    out = [
        ("returned the loss with the heads off; return the change, minus the loss with every head on", off["loss"]),
        (
            "the sign is reversed: Δloss is the loss with the heads off minus the loss with all on",
            full["loss"] - off["loss"],
        ),
        ("measured the change in accuracy, not in loss", off["accuracy"] - full["accuracy"]),
        (
            "measured the change in accuracy, not in loss (and with the sign reversed)",
            full["accuracy"] - off["accuracy"],
        ),
    ]
    if len(heads) > 1:
        singles = [evaluate(model, task_name, examples=examples, head_mask=_mask(model, [h]))["loss"] for h in heads]
        out.append(
            (
                "added up the single-head Δlosses: switch all the listed heads off together, in one mask "
                "(heads interact, so the sum is not the joint effect)",
                sum(s - full["loss"] for s in singles),
            )
        )
        out.append(
            ("switched off only the first listed head; set every listed (layer, head) to 0", singles[0] - full["loss"])
        )
    if all(h < L and layer < H for layer, h in heads):
        swapped = evaluate(
            model, task_name, examples=examples, head_mask=_mask(model, [(h, layer) for layer, h in heads])
        )
        out.append(
            (
                "indexed the mask as [head, layer]; head_mask is (layers, heads): mask[layer, head]",
                swapped["loss"] - full["loss"],
            )
        )
    per_example = _per_example_mean_loss(model, task_name, examples, _mask(model, heads))
    per_example -= _per_example_mean_loss(model, task_name, examples, _mask(model, []))
    out.append(
        (
            "averaged each example's own mean loss; section 2's loss weighs every counted position the same "
            "(what evaluate reports), so longer examples count more",
            per_example,
        )
    )
    return out


def _as_float(actual, case: str) -> float:
    if isinstance(actual, torch.Tensor) and actual.numel() == 1:
        actual = actual.item()
    if isinstance(actual, bool) or not isinstance(actual, numbers.Real):
        raise CheckFailed(f"{case}: return the change in loss as a float, got {actual!r} ({type(actual).__name__})")
    return float(actual)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 + 1e-4 * abs(b)


@friendly
def check_delta_loss(fn, models) -> None:
    """``fn(model, task_name, examples, heads)`` -> float: loss with ``heads`` off together minus loss with all on.

    The loss is ``evaluate``'s (every counted position weighs the same). ``models`` maps a task to a model on the
    CPU; the check refuses ``pruning.ablation`` and ``pruning.pruning_curve``, then prints the joint and summed
    Δloss of ``PREDICTION_HEADS`` on the 200 importance examples of ``PREDICTION_TASK``, for the prediction.
    """
    for task_name, heads, n in DELTA_CASES:
        model = models[task_name]
        examples = get_task(task_name).load_split("importance")[:n]
        names = [name for name, _ in model.attention_layers()]
        case = f"{task_name} model, heads off {[(names[l], h) for l, h in heads]}, {n} importance examples"
        before = {k: v.clone() for k, v in model.state_dict().items()}
        expected = (
            evaluate(model, task_name, examples=examples, head_mask=_mask(model, heads))["loss"]
            - evaluate(model, task_name, examples=examples)["loss"]
        )
        with refusing(_PACKAGE_ABLATION):
            actual = call(fn, model, task_name, list(examples), list(heads), case=case)
        if model.training:
            raise CheckFailed(f"{case}: your function left the model in training mode; measure in eval mode")
        if any(not torch.equal(v, before[k]) for k, v in model.state_dict().items()):
            raise CheckFailed(f"{case}: your function changed the model's weights; it must only read the model")
        actual = _as_float(actual, case)
        if _close(actual, expected):
            continue
        for message, wrong in delta_mistakes(model, task_name, examples, heads):
            if _close(actual, wrong):
                raise CheckFailed(f"{case}: got {actual:.4g}, expected {expected:.4g}: {message}")
        raise CheckFailed(f"{case}: got {actual:.4g}, expected {expected:.4g}")
    passed("check_delta_loss", len(DELTA_CASES))
    model, rows = models[PREDICTION_TASK], get_task(PREDICTION_TASK).load_split("importance")[:200]
    together = fn(model, PREDICTION_TASK, list(rows), list(PREDICTION_HEADS))
    singles = sum(fn(model, PREDICTION_TASK, list(rows), [head]) for head in PREDICTION_HEADS)
    names = [name for name, _ in model.attention_layers()]
    heads = ", ".join(f"{names[layer]} head {h}" for layer, h in PREDICTION_HEADS)
    print(
        f"your prediction? {PREDICTION_TASK}, {heads} off together: Δloss {together:.3f}; "
        f"the sum of their single Δlosses: {singles:.3f}"
    )
