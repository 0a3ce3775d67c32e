"""Checks for the exercises of notebook 07 (which heads matter, and pruning them).

Each check runs the learner's function on the committed trained models (or on
small freshly built ones) and compares with the package: ``pruning.gradient_importance``,
``pruning.order_from_scores`` and the parameter count of ``pruning.pruned_copy``.
When an answer differs, it is compared with the typical wrong answers (the
absolute value taken after averaging, a descending order, a forgotten ``W_o``,
biases counted wrongly, ...) so that the failure can name the mistake.
"""

from __future__ import annotations

import copy
import numbers

import torch
from torch.nn import functional as F

from ..analysis import pruning
from ..models.model import ModelConfig, build_model
from ..models.tasks import get_task
from ..models.train import load_pretrained
from ._common import CheckFailed, call, expect_close, expect_shape, expect_tensor, friendly, passed, refusing
from ._nb07_ablation import check_delta_loss as _check_delta_loss

__all__ = ["check_head_importance", "check_pruning_order", "check_params_after_pruning", "check_delta_loss"]

# The package's own versions of what exercises 1 and 2 ask for: a check refuses them.
_PACKAGE_IMPORTANCE = {
    pruning.gradient_importance: "pruning.gradient_importance",
    pruning.iterative_importance_order: "pruning.iterative_importance_order",
}
_PACKAGE_ORDER = {pruning.order_from_scores: "pruning.order_from_scores"}


_MODELS: dict = {}


def _model(name: str):
    """The committed model for ``name`` on the CPU, loaded once; callers get their own copy."""
    if name not in _MODELS:
        _MODELS[name] = load_pretrained(name, device="cpu")
    return copy.deepcopy(_MODELS[name])


# --------------------------------------------------------------------------- Exercise 1


def _per_example_gradients(model, task_name: str, examples, reduction: str = "mean") -> tuple[torch.Tensor, list]:
    """dL(x)/d head_mask for every example x: (N, L, H), and the number of counted positions of each."""
    task = get_task(task_name)
    L, H = model.num_attention_layers, model.num_heads
    grads, counts = [], []
    for row in examples:
        gates = torch.ones(L, H, requires_grad=True)
        batch = task.collate([row])
        logits = task.forward(model, batch, gates)  # (1, T, V)
        loss = F.cross_entropy(logits[batch.loss_mask], batch.tgt_out[batch.loss_mask], reduction=reduction)
        (grad,) = torch.autograd.grad(loss, gates)  # (L, H)
        grads.append(grad)
        counts.append(int(batch.loss_mask.sum()))
    return torch.stack(grads), counts  # (N, L, H)


def _importance_mistakes(model, task_name: str, examples, layer: int) -> list[tuple[str, torch.Tensor]]:
    """(message, the (H,) result that mistake gives) for the usual ways to get importance wrong."""
    g, counts = _per_example_gradients(model, task_name, examples)  # (N, L, H)
    g_sum, _ = _per_example_gradients(model, task_name, examples, reduction="sum")
    weights = torch.tensor(counts, dtype=g.dtype)[:, None, None]  # (N, 1, 1)
    batch_grad = (g * weights).sum(0) / weights.sum()  # (L, H): gradient of one loss over the whole batch
    right = g.abs().mean(0)  # (L, H)
    out = [
        (
            "took the absolute value after averaging over the examples (|E[g]| instead of E[|g|]): gradients "
            "of opposite sign from different examples cancel; take |dL(x)/dxi| for each example, then average",
            g.mean(0).abs()[layer],
        ),
        (
            "computed one loss over the whole batch and took |gradient| of it: that is |E[g]|, where gradients "
            "of opposite sign cancel; run the examples one at a time and average |dL(x)/dxi|",
            batch_grad.abs()[layer],
        ),
        (
            "no absolute value: the signed gradients are averaged (and can cancel, or come out negative); "
            "importance is the mean of |dL(x)/dxi|",
            g.mean(0)[layer],
        ),
        (
            "summed over the examples instead of averaging: divide by the number of examples",
            g.abs().sum(0)[layer],
        ),
        (
            "each example's loss was summed over its positions; use the mean cross-entropy over the positions "
            "in loss_mask (F.cross_entropy's default reduction)",
            g_sum.abs().mean(0)[layer],
        ),
        (
            "averaged squared gradients; Michel et al. (2019) average the absolute value |dL(x)/dxi|",
            (g**2).mean(0)[layer],
        ),
        (
            "the row is normalised by its L2 norm; this exercise asks for the raw mean "
            "(what gradient_importance(..., normalize=False) returns)",
            right[layer] / right[layer].norm(),
        ),
    ]
    names = [name for name, _ in model.attention_layers()]
    for other in range(model.num_attention_layers):
        if other != layer:
            out.append(
                (
                    f"returned the importances of layer {other} ({names[other]}), not layer {layer} "
                    f"({names[layer]}): row i of head_mask is the i-th entry of model.attention_layers()",
                    right[other],
                )
            )
    return out


_IMPORTANCE_CASES = [("induction", 1, 6), ("dates", 3, 5), ("dates", 0, 4)]  # (task, layer, examples)


@friendly
def check_head_importance(fn) -> None:
    """``fn(model, task_name, examples, layer)`` -> (H,): mean over ``examples`` of ``|dL(x)/d head_mask[layer, h]|``.

    All gates at 1, the model in eval mode, the loss of one example the mean cross-entropy over the
    positions of its ``loss_mask``, no normalisation: ``pruning.gradient_importance(..., normalize=False)[layer]``.
    """
    for task_name, layer, n in _IMPORTANCE_CASES:
        model = _model(task_name)
        examples = get_task(task_name).load_split("importance")[:n]
        names = [name for name, _ in model.attention_layers()]
        case = f"{task_name} model, layer {layer} ({names[layer]}), {n} importance examples"
        before = {k: v.clone() for k, v in model.state_dict().items()}
        expected = pruning.gradient_importance(model, task_name, examples=examples, limit=None, normalize=False)
        expected = expected[layer]  # (H,)
        with refusing(_PACKAGE_IMPORTANCE):
            actual = call(fn, model, task_name, list(examples), layer, case=case)
        if model.training:
            raise CheckFailed(
                f"{case}: your function left the model in training mode; importance is measured in eval "
                f"mode (dropout off), and the model must be put back as it was"
            )
        for k, v in model.state_dict().items():
            if not torch.equal(v, before[k]):
                raise CheckFailed(f"{case}: your function changed the model's {k}; it must only read the model")
        actual = expect_tensor(actual, case).detach().cpu().float()
        if actual.dim() == 2 and tuple(actual.shape) == (model.num_attention_layers, model.num_heads):
            raise CheckFailed(
                f"{case}: returned the whole (layers, heads) = {tuple(actual.shape)} table; return only row "
                f"{layer}, shape ({model.num_heads},)"
            )
        expect_shape(actual, expected.shape, case)
        if torch.allclose(actual, expected, rtol=1e-4, atol=1e-6):
            continue
        for message, wrong in _importance_mistakes(model, task_name, examples, layer):
            if torch.allclose(actual, wrong.float(), rtol=1e-4, atol=1e-6):
                raise CheckFailed(f"{case}: {message}")
        expect_close(actual, expected, case, atol=1e-6, rtol=1e-4)
    passed("check_head_importance", len(_IMPORTANCE_CASES))


# --------------------------------------------------------------------------- Exercise 2


def _order_cases() -> list[tuple[torch.Tensor, str]]:
    g = torch.Generator().manual_seed(7)
    distinct = torch.rand(2, 4, generator=g)
    tied = torch.tensor([[0.3, 0.1], [0.1, 0.5], [0.3, 0.0]])  # ties across layers and a zero (a masked head)
    wide = torch.rand(3, 5, generator=g).round(decimals=1)  # rounding makes ties
    return [
        (distinct, "2 layers x 4 heads, all scores different"),
        (tied, "3 layers x 2 heads with ties: [[0.3, 0.1], [0.1, 0.5], [0.3, 0.0]]"),
        (wide, "3 layers x 5 heads, scores rounded to one decimal (many ties)"),
        (torch.tensor([[0.2, 0.9, 0.4, 0.1]]), "1 layer x 4 heads"),
    ]


def _as_pairs(actual, case: str) -> list:
    if isinstance(actual, torch.Tensor):
        actual = actual.tolist()
    if not isinstance(actual, (list, tuple)):
        raise CheckFailed(f"{case}: return a list of (layer, head) pairs, got {type(actual).__name__}")
    return list(actual)


@friendly
def check_pruning_order(fn) -> None:
    """``fn(scores)`` -> list of (layer, head) pairs, least important first, ties in row-major order.

    ``scores`` is an (L, H) tensor; the answer must equal ``pruning.order_from_scores(scores)``.
    """
    cases = _order_cases()
    for scores, case in cases:
        L, H = scores.shape
        expected = pruning.order_from_scores(scores)
        with refusing(_PACKAGE_ORDER):
            result = call(fn, scores.clone(), case=case)
        actual = _as_pairs(result, case)
        if actual and all(isinstance(x, numbers.Integral) for x in actual):
            raise CheckFailed(
                f"{case}: returned flat indices {actual[:4]}...; return (layer, head) pairs: flat index i of an "
                f"(L, H) table is (i // H, i % H)"
            )
        try:
            pairs = [(int(a), int(b)) for a, b in actual]
        except (TypeError, ValueError):
            raise CheckFailed(
                f"{case}: every entry must be a (layer, head) pair of ints, got {actual[:4]}..."
            ) from None
        if pairs == expected:
            continue
        if pairs == [(h, l) for l, h in expected]:
            raise CheckFailed(f"{case}: the pairs are (head, layer); they must be (layer, head)")
        flat = sorted(range(L * H), key=lambda i: (scores.flatten()[i].item(), i))
        if L != H and pairs == [(i // L, i % L) for i in flat]:
            raise CheckFailed(
                f"{case}: converted flat indices with the number of layers; with H heads per layer flat "
                f"index i is (i // H, i % H) = (i // {H}, i % {H})"
            )
        if len(pairs) != L * H or set(pairs) != {(l, h) for l in range(L) for h in range(H)}:
            missing = sorted({(l, h) for l in range(L) for h in range(H)} - set(pairs))
            raise CheckFailed(
                f"{case}: every one of the {L * H} heads must appear exactly once; got {len(pairs)} entries"
                + (f", missing {missing}" if missing else ", some twice")
            )
        values = [scores[l, h].item() for l, h in pairs]
        if values == sorted(values, reverse=True) and values != sorted(values):
            raise CheckFailed(
                f"{case}: sorted from most to least important (descending); pruning removes the least "
                f"important head first, so sort in ascending order of score"
            )
        if values == [scores[l, h].item() for l, h in expected]:
            raise CheckFailed(
                f"{case}: the scores are in the right order but equal scores are not in row-major order "
                f"(layer, then head); sort stably on the flattened scores (torch.argsort(..., stable=True) "
                f"or Python's sorted), because argsort without stable=True may put ties in any order"
            )
        raise CheckFailed(f"{case}: got {pairs}, expected {expected}")
    passed("check_pruning_order", len(cases))


# --------------------------------------------------------------------------- Exercise 3


def _no_pruning(*args, **kwargs):
    raise CheckFailed(
        "your function pruned the model (prune_heads / pruned_copy); count from the sizes instead: "
        "model.config.num_hiddens, model.num_heads, model.config.bias"
    )


def _guarded(model):
    """A copy of ``model`` whose prune_heads (its own and every attention layer's) refuses to run."""
    model = copy.deepcopy(model)
    model.prune_heads = _no_pruning
    for _, layer in model.attention_layers():
        layer.prune_heads = _no_pruning
    return model


def _param_cases():
    small = ModelConfig(
        "encoder", 10, 7, num_hiddens=48, num_heads=6, ffn_num_hiddens=32, num_enc_layers=2, max_len=8, bias=False
    )
    wide = ModelConfig(
        "decoder", 0, 9, num_hiddens=40, num_heads=2, ffn_num_hiddens=0, num_enc_layers=0, num_dec_layers=3, max_len=6
    )
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        torch.manual_seed(70)
        small_model, wide_model = build_model(small).eval(), build_model(wide).eval()
    return [
        (_model("dates"), {0: [1], 3: [0, 2]}, "the dates model (D=64, H=4, bias=True), heads {0: [1], 3: [0, 2]}"),
        (_model("induction"), {1: [0, 1, 2, 3]}, "the induction model (D=64, H=4, bias=True), all of layer 1"),
        (_model("dates"), {}, "the dates model, no heads pruned"),
        (small_model, {0: [5], 1: [0, 3, 4]}, "an encoder with D=48, H=6, bias=False, heads {0: [5], 1: [0, 3, 4]}"),
        (wide_model, {0: [1], 2: [0]}, "a decoder with D=40, H=2, bias=True, heads {0: [1], 2: [0]}"),
    ]


def _as_count(actual, case: str) -> int:
    """The learner's answer as an int (a one-element integer tensor is fine); anything else fails."""
    if isinstance(actual, torch.Tensor) and actual.numel() == 1 and not actual.is_floating_point():
        actual = actual.item()
    if isinstance(actual, bool) or not isinstance(actual, numbers.Integral):
        raise CheckFailed(f"{case}: return the count as an int, got {actual!r} ({type(actual).__name__})")
    return actual


def _param_mistakes(model, heads, total: int) -> list[tuple[str, int, bool]]:
    """(message, the count that mistake gives, whether it applies to this model) for the usual wrong counts."""
    D, H = model.config.num_hiddens, model.num_heads
    d, bias = D // H, model.config.bias
    n = sum(len(chosen) for chosen in heads.values())
    right = n * (4 * d * D + (3 * d if bias else 0))  # parameters that go
    attention_after = sum(pruning.count_parameters(layer) for _, layer in model.attention_layers()) - right
    return [
        (
            "forgot W_o: each pruned head also takes its d columns of W_o (d * num_hiddens weights)",
            total - n * (3 * d * D + (3 * d if bias else 0)),
            True,
        ),
        (
            "removed a share of W_o's bias too: W_o loses input columns, not outputs, so its bias "
            "(num_hiddens numbers) stays whole",
            total - n * (4 * d * D + 4 * d),
            bias,
        ),
        (
            "forgot the biases: with bias=True each pruned head also takes d entries of the biases of W_q, W_k and W_v",
            total - n * 4 * d * D,
            bias,
        ),
        (
            "removed bias entries, but this model has bias=False (model.config.bias)",
            total - n * (4 * d * D + 3 * d),
            not bias,
        ),
        (
            "counted a d x d block per head and matrix; a head's slice of W_q is d rows of full width "
            "num_hiddens (and of W_o, d columns of full height)",
            total - n * (4 * d * d + (3 * d if bias else 0)),
            True,
        ),
        (
            "returned the number of parameters removed; the question is how many remain",
            right,
            n > 0,
        ),
        (
            "counted only the attention layers; the question is the whole model's count "
            "(embeddings, MLPs, LayerNorms and the output layer are untouched)",
            attention_after,
            True,
        ),
    ]


@friendly
def check_params_after_pruning(fn) -> None:
    """``fn(model, heads)`` -> int: parameters of ``model`` once ``heads`` ({layer: [head, ...]}) are pruned.

    Counted from the sizes, without pruning (the check's model refuses ``prune_heads``); the answer
    must equal ``count_parameters(pruned_copy(model, heads))``.
    """
    cases = _param_cases()
    for model, heads, case in cases:
        expected = pruning.count_parameters(pruning.pruned_copy(model, heads))
        actual = _as_count(call(fn, _guarded(model), copy.deepcopy(heads), case=case), case)
        if actual == expected:
            continue
        total = pruning.count_parameters(model)
        for message, wrong, applies in _param_mistakes(model, heads, total):
            if applies and actual == wrong:
                raise CheckFailed(f"{case}: got {actual}, expected {expected}: {message}")
        raise CheckFailed(
            f"{case}: got {actual}, expected {expected} (the model has {total} parameters before pruning)"
        )
    passed("check_params_after_pruning", len(cases))


# --------------------------------------------------------------------------- Exercise 4


@friendly
def check_delta_loss(fn) -> None:
    """``fn(model, task_name, examples, heads)`` -> float: Δloss with the (layer, head) pairs ``heads`` off together.

    Runs on the committed models on the CPU; see ``_nb07_ablation.check_delta_loss``.
    """
    return _check_delta_loss(fn, {name: _model(name) for name in ("reversal", "induction", "dates")})
