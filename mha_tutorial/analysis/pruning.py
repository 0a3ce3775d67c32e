r"""Which heads matter? Measure it, then remove the ones that do not (notebook 07).

Every measurement here goes through ``head_mask`` (num_attention_layers, num_heads):
``head_mask[l, h]`` scales head h of attention layer l before that layer's ``W_o``.

* ``ablation``: switch one head off at a time and measure the change in loss and
  accuracy -- the whole layers x heads table in one call.
* ``gradient_importance``: the first-order estimate of Michel, Levy & Neubig (2019),
  "Are Sixteen Heads Really Better than One?":

  .. math:: I_h = \mathbb{E}_x \left| \frac{\partial L(x)}{\partial \xi_h} \right|

  with every gate :math:`\xi` at 1 (or at the current mask), the absolute value taken
  per example before averaging, the model in eval mode, optionally normalised per
  layer by that layer's L2 norm.
* ``pruning_curve`` / ``pruning_orders``: the metric as heads are masked one after
  another, in several orders (importance once or recomputed after each removal,
  single-head ablation, random, most-important-first, attention entropy).
* ``time_pruning``: forward-pass times of the full, masked and pruned models and of the attention
  layers alone, for reading a pruning speed-up against Amdahl's law.
* ``prune_attention_heads``: physical pruning of one layer (what ``MultiHeadAttention.prune_heads``
  calls; the models' ``prune_heads({layer: [heads]})`` calls it for each layer); a pruned model
  computes what the masked one does, with smaller matrices. It lives in ``mha`` (the core needs it
  and must not import this module) and is re-exported here.
"""

from __future__ import annotations

import math
import random
import time
import timeit
from copy import deepcopy

import torch
from torch.nn import functional as F
from torch.utils import benchmark

from ..core import _validate as validate
from ..core.mha import prune_attention_heads  # noqa: F401 (re-exported: lives in the core, with the layer it prunes)
from ..models import _validate_experiments as validate_experiments
from ..models import _validate_training as validate_training
from ..models.tasks import get_task
from ..models.train import evaluate


def _sizes(model) -> tuple[int, int]:
    """(num_attention_layers, num_heads) of a model, or the pair itself when given one."""
    validate_training.model_sizes(model)
    if isinstance(model, tuple):
        return model
    return model.num_attention_layers, model.num_heads


def check_head_mask(model, head_mask: torch.Tensor) -> None:
    """Raise a clear error unless ``head_mask`` is a (num_attention_layers, num_heads) tensor."""
    validate.model_head_mask(head_mask, model.attention_layers(), model.num_heads)


def _examples(task_name: str, split: str, examples, limit: int | None):
    rows = get_task(task_name).load_split(split) if examples is None else list(examples)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None (all examples), got {limit!r}")
    rows = rows[:limit] if limit is not None else rows
    if not rows:  # an average over no examples would be NaN, or a division by zero
        raise ValueError(f"no examples of task {task_name!r} to measure on")
    return rows


def ablation(model, task_name: str, split: str = "eval", examples=None, limit: int | None = None) -> dict:
    """Switch off one head at a time; return the (L, H) tables of loss and accuracy and their changes.

    Returns {"base_loss", "base_accuracy", "loss", "accuracy", "delta_loss", "delta_accuracy"},
    the last four as (L, H) tensors; ``delta_loss[l, h] > 0`` means the model is worse without head h
    of layer l.
    """
    validate_training.model_for_task(model, get_task(task_name))
    rows = _examples(task_name, split, examples, limit)
    L, H = _sizes(model)
    device = next(model.parameters()).device
    base = evaluate(model, task_name, examples=rows)
    loss, accuracy = torch.zeros(L, H), torch.zeros(L, H)
    for layer in range(L):
        for head in range(H):
            mask = torch.ones(L, H, device=device)
            mask[layer, head] = 0.0
            result = evaluate(model, task_name, examples=rows, head_mask=mask)
            loss[layer, head], accuracy[layer, head] = result["loss"], result["accuracy"]
    return {
        "base_loss": base["loss"],
        "base_accuracy": base["accuracy"],
        "loss": loss,
        "accuracy": accuracy,
        "delta_loss": loss - base["loss"],
        "delta_accuracy": accuracy - base["accuracy"],
    }


def gradient_importance(
    model,
    task_name: str,
    split: str = "importance",
    examples=None,
    limit: int | None = 200,
    head_mask: torch.Tensor | None = None,
    normalize: bool = True,
) -> torch.Tensor:
    r"""I[l, h] = mean over examples of ``|dL(x)/d head_mask[l, h]|``, at ``head_mask`` (default all ones).

    Computed example by example (the absolute value must be taken per example:
    gradients of opposite sign from different examples would otherwise cancel)
    on the ``importance`` split, drawn with another seed than the ``eval`` split the
    pruning curves are measured on (for dates, 19 of the 1000 examples coincide:
    notebook 07 drops them from the curves' examples). Heads already masked (gate 0) or pruned get
    importance 0.
    With ``normalize``, each layer's row is divided by its L2 norm, as in Michel et al.
    """
    task = get_task(task_name)
    validate_training.model_for_task(model, task)
    if head_mask is not None:
        check_head_mask(model, head_mask)  # a list or an array is named here, before it is converted
    rows = _examples(task_name, split, examples, limit)
    L, H = _sizes(model)
    device = next(model.parameters()).device
    gates = torch.ones(L, H, device=device) if head_mask is None else head_mask.detach().to(device).float()
    check_head_mask(model, gates)
    gates.requires_grad_(True)
    was_training = model.training
    model.eval()
    total = torch.zeros(L, H, device=device)
    try:
        for row in rows:
            batch = task.collate([row], device)
            logits = task.forward(model, batch, gates)  # (1, T, V)
            loss = F.cross_entropy(logits[batch.loss_mask], batch.tgt_out[batch.loss_mask])
            # A gate no head reads (its head pruned, or the whole layer) has derivative 0, not "unused".
            (grad,) = torch.autograd.grad(loss, gates, allow_unused=True, materialize_grads=True)
            total += grad.abs()  # (L, H): |dL(x)/d xi| for this one example
    finally:
        model.train(was_training)
    importance = (total / len(rows)) * (gates.detach() != 0)
    return normalize_per_layer(importance).cpu() if normalize else importance.cpu()


def normalize_per_layer(importance: torch.Tensor) -> torch.Tensor:
    """Each row (layer) of an (L, H) importance table divided by its L2 norm (Michel et al.); a zero row stays 0."""
    validate_training.table(importance, "importance")
    return importance / importance.norm(dim=1, keepdim=True).clamp_min(1e-20)


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two equally shaped tensors (ties get their average rank)."""
    validate_training.table(a, "a", layers_by_heads=False)
    validate_training.table(b, "b", layers_by_heads=False)
    if a.shape != b.shape:
        raise ValueError(f"rank_correlation needs tensors of the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.numel() < 2:
        raise ValueError(f"rank_correlation needs at least 2 values, got {a.numel()}")

    def ranks(x: torch.Tensor) -> torch.Tensor:
        x = x.flatten().double()
        order = x.argsort()
        r = torch.empty_like(x)
        r[order] = torch.arange(len(x), dtype=torch.double)
        for value in x.unique():  # ties share the mean of their ranks
            tied = x == value
            r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = (ra.norm() * rb.norm()).item()
    return float((ra @ rb).item() / denom) if denom > 0 else float("nan")


def order_from_scores(scores: torch.Tensor, ascending: bool = True) -> list[tuple[int, int]]:
    """(layer, head) pairs sorted by score; ties broken by position, so the order is deterministic."""
    validate_training.table(scores, "scores")
    L, H = scores.shape
    flat = scores.flatten().tolist()
    index = sorted(range(L * H), key=lambda i: (flat[i] if ascending else -flat[i], i))
    return [(i // H, i % H) for i in index]


def random_order(model, seed: int) -> list[tuple[int, int]]:
    """Every (layer, head) of ``model`` -- or of a (num_layers, num_heads) pair -- shuffled by ``random.Random(seed)``."""
    L, H = _sizes(model)
    heads = [(layer, head) for layer in range(L) for head in range(H)]
    random.Random(seed).shuffle(heads)
    return heads


def iterative_importance_order(
    model, task_name: str, limit: int | None = 64, examples=None, normalize: bool = True
) -> list[tuple[int, int]]:
    """Mask the least important head, recompute importance with it masked, repeat.

    With ``normalize`` each recomputation is normalised per layer, which makes the weakest
    remaining head of every layer look small; notebook 07 shows one cost of normalising (on dates it hides that
    some layers matter little).
    """
    L, H = _sizes(model)
    device = next(model.parameters()).device
    mask = torch.ones(L, H, device=device)
    order = []
    for _ in range(L * H):
        importance = gradient_importance(
            model, task_name, examples=examples, limit=limit, head_mask=mask, normalize=normalize
        )
        alive = [(layer, head) for layer, head in order_from_scores(importance) if mask[layer, head] != 0]
        layer, head = alive[0]
        order.append((layer, head))
        mask[layer, head] = 0.0
    return order


def pruning_curve(
    model, task_name: str, order, split: str = "eval", examples=None, limit: int | None = None, loss: bool = True
) -> dict:
    """Mask the heads of ``order`` one after another; return loss and accuracy after each step.

    Returns {"accuracy": tensor (N+1,), "loss": tensor (N+1,)}: entry k is the model with the
    first k heads of ``order`` switched off (entry 0 is the full model). ``loss=False`` skips the loss
    ("loss" is then None): for dates it is a teacher-forced pass beside the greedy decoding that accuracy needs.
    """
    validate_training.model_for_task(model, get_task(task_name))
    if not isinstance(loss, bool):
        raise TypeError(f"loss must be True or False, got {loss!r:.40}")
    rows = _examples(task_name, split, examples, limit)
    device = next(model.parameters()).device
    order_mask(model, order)  # the whole order is checked before the first evaluation
    accuracy, losses = [], []
    for k in range(len(order) + 1):
        mask = order_mask(model, order, k, device)
        if loss or task_name != "dates":
            result = evaluate(model, task_name, examples=rows, head_mask=mask)
            accuracy.append(result["accuracy"])
            losses.append(result["loss"])
        else:
            accuracy.append(_dates_accuracy(model, rows, mask))
    return {"accuracy": torch.tensor(accuracy), "loss": torch.tensor(losses) if loss else None}


@torch.no_grad()
def _dates_accuracy(model, rows, head_mask, batch_size: int = 500) -> float:
    """``evaluate``'s accuracy on dates (whole dates right under greedy decoding), without its loss."""
    task, device, hits = get_task("dates"), next(model.parameters()).device, 0
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(rows), batch_size):
            batch = task.collate(rows[i : i + batch_size], device)
            hits += int((task.predict(model, batch, head_mask) == batch.tgt_out).all(dim=1).sum())
    finally:
        model.train(was_training)
    return hits / len(rows)


def order_mask(model, order, n: int | None = None, device=None) -> torch.Tensor:
    """The ``head_mask`` (L, H) of ``model`` with the first ``n`` heads of ``order`` (default: all) set to 0.

    Raises ValueError for a head outside the model or one that appears twice in ``order``.
    """
    L, H = _sizes(model)
    validate_training.head_order(order)
    mask, seen = torch.ones(L, H, device=device), set()
    for k, (layer, head) in enumerate(order):
        if not (0 <= layer < L and 0 <= head < H):
            raise ValueError(f"head {(layer, head)} is outside the model's {L} layers x {H} heads")
        if (layer, head) in seen:
            raise ValueError(f"head {(layer, head)} appears twice in the pruning order")
        seen.add((layer, head))
        if n is None or k < n:
            mask[layer, head] = 0.0
    return mask


def area_under_curve(values: torch.Tensor, counts=None) -> float:
    """Mean of the curve over the fraction of heads removed (trapezoids on [0, 1]): 1.0 = never drops.

    Without ``counts`` the points are evenly spaced (0, 1, 2, ... heads removed); with them, point i
    sits at ``counts[i]`` heads and the area is divided by the range ``counts[-1] - counts[0]``.
    """
    validate_training.curve(values, counts)
    values = torch.as_tensor(values, dtype=torch.double)
    if values.numel() < 2:
        raise ValueError("a pruning curve needs at least two points")
    if counts is None:
        return float(torch.trapezoid(values, dx=1.0 / (values.numel() - 1)))
    x = torch.as_tensor(counts, dtype=torch.double)
    return float(torch.trapezoid(values, x) / (x[-1] - x[0]))


def heads_prunable(accuracy: torch.Tensor, tolerance: float = 0.01) -> int:
    """How many heads (from the start of the curve) can go before accuracy drops more than ``tolerance``."""
    validate_training.curve(accuracy, None, minimum=1)
    accuracy = torch.as_tensor(accuracy)
    below = (accuracy < accuracy[0] - tolerance).nonzero()
    return int(below[0]) - 1 if len(below) else len(accuracy) - 1


def pruned_copy(model, heads: dict):
    """A copy of ``model`` with ``heads`` ({layer: [heads]}) physically removed; ``model`` is unchanged.

    The last forward pass's attention weights are dropped first: they belong to a graph that
    cannot be copied, and the copy has not run yet.
    """
    for _, layer in model.attention_layers():
        layer.attention_weights = layer.attention.attention_weights = None
    copy = deepcopy(model)
    copy.prune_heads(heads)
    return copy


def count_parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())


def time_pruning(model, task_name: str, pruned, head_mask, examples, rounds: int = 20, block_s: float = 0.005) -> dict:
    """Microseconds per forward pass on one batch of ``examples``, for four things that take turns in every round:
    ``model``'s attention layers alone ("attention"), ``model`` ("full"), ``model`` with ``head_mask`` ("masked")
    and the pruned copy ``pruned`` ("pruned").

    Each time is the fastest of ``rounds`` blocks of calls, a block lasting about ``block_s`` seconds. On the CPU
    the clock is this thread's CPU time, which other programs inflate far less than wall-clock time (run PyTorch
    with one thread so that all the work is on it); on a GPU, wall-clock time. Only ratios of these times mean
    something, and they change from run to run.
    """
    task = get_task(task_name)
    for m in (model, pruned):
        validate_training.model_for_task(m, task)
    check_head_mask(model, head_mask)
    rows = _examples(task_name, "eval", examples, None)
    validate_training.positive_count(rounds, "rounds")
    validate_experiments.positive_number(block_s, "block_s", " seconds")
    device = next(model.parameters()).device
    batch, mask = task.collate(rows, device), head_mask.to(device)
    calls = _attention_calls(model, task, batch)

    fns = {
        "attention": torch.no_grad()(lambda: [layer(*args) for layer, args in calls]),
        "full": torch.no_grad()(lambda: task.forward(model, batch)),
        "masked": torch.no_grad()(lambda: task.forward(model, batch, mask)),
        "pruned": torch.no_grad()(lambda: task.forward(pruned, batch)),
    }
    clock = time.thread_time if device.type == "cpu" else timeit.default_timer
    timers, numbers = {}, {}
    for key, fn in fns.items():
        for _ in range(3):  # warm-up
            fn()
        timers[key] = benchmark.Timer("fn()", globals={"fn": fn}, timer=clock, num_threads=torch.get_num_threads())
        numbers[key] = max(1, int(block_s / timers[key].timeit(1).mean))  # calls per block of about block_s seconds
    best = dict.fromkeys(fns, math.inf)
    for _ in range(rounds):
        for key, timer in timers.items():
            best[key] = min(best[key], timer.timeit(numbers[key]).mean * 1e6)
    return best


def _attention_calls(model, task, batch) -> list:
    """Run ``model`` once on ``batch``; return (layer, its positional arguments) for every attention layer call."""
    calls = []
    hooks = [
        layer.register_forward_hook(lambda module, args, output: calls.append((module, args)))
        for _, layer in model.attention_layers()
    ]
    try:
        with torch.no_grad():
            task.forward(model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    return calls
