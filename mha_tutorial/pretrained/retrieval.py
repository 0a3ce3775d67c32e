r"""Scoring all-MiniLM-L6-v2 by paraphrase retrieval, and pruning its heads (notebook 09).

The score is *accuracy@1*: embed every sentence and every paraphrase of ``paraphrases.tsv``; a sentence is a
hit when its own paraphrase is the most similar (cosine) of all the paraphrases in the set. The pairs come in
clusters of near-misses, so the full model is good but not perfect (87% on the eval split). Curves and
ablations also record the retrieval *loss* (see ``retrieval_loss``; lower is better), which moves where
accuracy@1 does not: with every head masked the model keeps its eval accuracy -- mean-pooled token vectors
already find most paraphrases -- while its loss rises from 0.28 to 0.70.

The head-pruning study follows Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?",
with the tools of ``analysis/pruning.py`` (notebook 07) applied to a pretrained model:

* ``gradient_importance``: :math:`I_h = \mathbb{E}_x |\partial L(x) / \partial \xi_h|` at every gate
  :math:`\xi = 1`, where :math:`L` is a differentiable stand-in for retrieval -- the cross-entropy of each
  sentence against the paraphrases of its chunk, over cosine similarities times ``SCALE`` (the in-batch
  negatives loss such encoders are trained with) -- and an "example" :math:`x` is a chunk of pairs;
  measured on the ``importance`` split (ids 0-159);
* ``ablation_drops``: the accuracy lost (or loss gained) when only head (l, h) is switched off, on the ``eval``
  split (ids 160-319);
* ``pruning_curve``: the accuracy as the first n heads of an order are switched off, for the importance
  order (least important first) and random orders; ``curve_auc`` and ``prunable_heads`` summarise a curve;
* ``physical_pruning_savings``: what removing heads for good saves in parameters and time.

The study takes about 15 minutes on a CPU, so ``python -m mha_tutorial.pretrained.retrieval --write`` runs it once and ships the result as
``data/minilm_pruning.json``; ``load_study()`` reads it back.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import torch
from torch.nn import functional as F

from ..analysis import pruning
from ..models.task_base import DATA_DIR
from . import _validate_pretrained as validate
from ._retrieval_score import PAIRS_PATH as PAIRS_PATH
from ._retrieval_score import (
    SCALE,
    _batches,
    _checked,
    _embed,
    _gather,
    embedding_scores,
    gradient_importance,
    load_paraphrases,
    retrieval_accuracy,
    retrieval_loss,
)
from ._retrieval_score import SPLITS as SPLITS
from .bert import mean_pool
from .minilm import file_sha256, load_minilm, model_dir, tokenize

__all__ = [
    "ablation_drops",
    "curve_auc",
    "embedding_scores",
    "gradient_importance",
    "load_paraphrases",
    "load_study",
    "physical_pruning_savings",
    "prunable_heads",
    "pruning_curve",
    "random_orders",
    "retrieval_accuracy",
    "retrieval_loss",
    "run_study",
]

STUDY_PATH = DATA_DIR / "minilm_pruning.json"
SIZES = (6, 12)  # all-MiniLM-L6-v2: layers x heads
METRICS = ("accuracy", "loss")  # what curves and ablations measure: accuracy@1, and the retrieval loss
TABLES = ("importance", "importance_raw", "ablation_drops", "ablation_loss_increase")  # (L, H) in the study


# ---- ablation (one head at a time) and pruning curves ------------------------------------------------------------


def _embed_from(model, hidden, mask, layer: int, row) -> torch.Tensor:
    """Unit sentence embeddings from the hidden states entering ``layer``, with (H,) ``row`` gating that layer."""
    keep = mask.bool()[:, None, None, :]  # (B, 1, 1, T), as BertEncoder.forward builds it
    X = hidden
    for i in range(layer, len(model.layers)):
        X = model.layers[i](X, keep, row if i == layer else None, need_weights=False)
    return F.normalize(mean_pool(X, mask), p=2, dim=-1)


def _scores_from(model, cache, batches, layer: int, row=None) -> dict[str, float]:
    """``embedding_scores`` from the cached hidden states entering ``layer`` (``layer`` = L: the full model)."""
    pieces = [_embed_from(model, h[layer], b[2], layer, row) for h, b in zip(cache, batches, strict=True)]
    return embedding_scores(_gather(pieces, batches))


def _ablations(model, pairs, batch_size: int) -> tuple[dict, dict]:
    """The full model's scores, and {metric: (L, H) score with only head (l, h) masked}.

    Masking a head of layer l leaves layers 0 .. l-1 unchanged, so their outputs are computed once and
    cached; each ablation runs only layers l .. L-1 (about 40% less work for six layers).
    """
    L, H = model.num_attention_layers, model.num_heads
    batches = _batches(model, pairs, batch_size)
    masked = {metric: torch.zeros(L, H) for metric in METRICS}
    with torch.no_grad():
        cache = [model(ids, mask, output_hidden_states=True).hidden_states for _, ids, mask in batches]
        for layer in range(L):
            for head in range(H):
                mask = pruning.order_mask(model, [(layer, head)], device=cache[0][0].device)
                row = model._head_mask_rows(mask)[layer]  # (heads left,): a pruned layer takes its own columns
                for metric, value in _scores_from(model, cache, batches, layer, row).items():
                    masked[metric][layer, head] = value
        return _scores_from(model, cache, batches, L), masked


def ablation_drops(
    model, pairs, base: float | None = None, batch_size: int = 64, metric: str = "accuracy"
) -> torch.Tensor:
    """(L, H): what switching off only head (l, h) costs; > 0 means the head helps. For ``metric`` "accuracy",
    the full model's accuracy (``base``, computed if None) minus the accuracy without the head; for "loss",
    the retrieval loss without the head minus the full model's (``base``)."""
    pairs = _checked(model, pairs, None, batch_size)
    validate.choice(metric, "metric", METRICS)
    full, masked = _ablations(model, pairs, batch_size)
    base = full[metric] if base is None else base
    return base - masked[metric] if metric == "accuracy" else masked[metric] - base


def _curve_scores(model, pairs, order, counts, batch_size: int) -> dict[str, list[float]]:
    sizes = (model.num_attention_layers, model.num_heads)
    batches = _batches(model, pairs, batch_size)
    device = next(model.parameters()).device
    with torch.no_grad():
        points = [embedding_scores(_embed(model, batches, pruning.order_mask(sizes, order, n, device))) for n in counts]
    return {metric: [p[metric] for p in points] for metric in METRICS}


def pruning_curve(model, pairs, order, counts, batch_size: int = 64, metric: str = "accuracy") -> list[float]:
    """Accuracy (or the retrieval loss, ``metric="loss"``) with the first n heads of ``order`` masked, for
    each n of ``counts`` (n = 0: the full model)."""
    pairs = _checked(model, pairs, None, batch_size)
    validate.choice(metric, "metric", METRICS)
    pruning.order_mask((model.num_attention_layers, model.num_heads), order)  # inside the model, none twice
    counts = validate.head_counts(counts, len(order))
    return _curve_scores(model, pairs, order, counts, batch_size)[metric]


def random_orders(n: int, seed: int = 0, sizes: tuple[int, int] = SIZES) -> list[list[tuple[int, int]]]:
    """``n`` random orders of all (layer, head) pairs of a ``sizes`` = (layers, heads) model, from seeds
    seed, seed + 1, ... (``pruning.random_order``)."""
    validate.positive_int(n, "n")
    validate.integer(seed, "seed")
    validate.model_sizes(sizes)
    return [pruning.random_order(tuple(sizes), seed + i) for i in range(n)]


def curve_auc(counts, accuracies) -> float:
    """The trapezoid area under accuracy(heads removed), divided by the range of ``counts``: the mean accuracy
    over the curve (1.0 for a curve that never drops), comparable between orders measured at the same counts."""
    counts, accuracies = validate.pruning_curve_points(counts, accuracies)
    return pruning.area_under_curve(accuracies, counts)


def prunable_heads(counts, accuracies, tolerance: float = 0.01) -> int:
    """The largest n of ``counts`` whose accuracy is at least full - ``tolerance`` (full: the accuracy at n = 0;
    0.01 = one point). Only that count is required to pass, not every count before it: the heads it masks
    form a set that can go. (``pruning.heads_prunable`` instead stops at the first count that fails.)"""
    counts, accuracies = validate.pruning_curve_points(counts, accuracies, start_at_zero=True)
    validate.fraction(tolerance, "tolerance")
    floor = accuracies[0] - tolerance - 1e-9  # 1e-9: a difference of exactly ``tolerance`` passes
    return max(n for n, accuracy in zip(counts, accuracies, strict=True) if accuracy >= floor)


# ---- physical pruning ----------------------------------------------------------------------------------------------


def _head_dict(model, heads) -> dict[int, list[int]]:
    """{layer: [heads]} from a dict or from a list of (layer, head) pairs (checked by ``order_mask``)."""
    if isinstance(heads, dict):
        return heads
    validate.head_pairs(heads)
    pruning.order_mask(model, heads)
    chosen: dict[int, list[int]] = {}
    for layer, head in heads:
        chosen.setdefault(int(layer), []).append(int(head))
    return chosen


def _timed(model, ids, mask, head_mask=None) -> float:
    start = time.perf_counter()
    model.encode(ids, mask, head_mask=head_mask)
    if ids.is_cuda:
        torch.cuda.synchronize(ids.device)
    return time.perf_counter() - start


def physical_pruning_savings(model, heads, sentences=None, repeats: int = 9) -> dict:
    """Parameters and forward time (median of ``repeats``) of ``model`` before and after removing ``heads``
    ({layer: [heads]} or a list of (layer, head)) for good, on a fixed batch (default: the first 64 sentences
    of the eval split); the two models are timed in alternation. Also the largest difference between the
    pruned model's embeddings and the masked model's (they must agree: "equal" means within 1e-5)."""
    validate.bert_model(model)
    validate.positive_int(repeats, "repeats")
    chosen = _head_dict(model, heads)
    pruned = pruning.pruned_copy(model, chosen)  # validates the request; ``model`` is unchanged
    sentences = [s for s, _ in load_paraphrases("eval")[:64]] if sentences is None else sentences
    batch = tokenize(sentences, device=next(model.parameters()).device)
    ids, attention = batch.input_ids, batch.attention_mask
    head_mask = torch.ones(model.num_attention_layers, model.num_heads)
    for layer, heads_of_layer in chosen.items():
        head_mask[int(str(layer).removeprefix("layer.")), heads_of_layer] = 0.0
    times = {"full": [], "pruned": []}
    with torch.no_grad():
        difference = (model.encode(ids, attention, head_mask=head_mask) - pruned.encode(ids, attention)).abs().max()
        for r in range(repeats):
            pair = [("full", model), ("pruned", pruned)]
            for name, m in pair if r % 2 == 0 else pair[::-1]:  # alternate who goes first
                times[name].append(_timed(m, ids, attention))
    attention_params = [sum(pruning.count_parameters(a) for _, a in m.attention_layers()) for m in (model, pruned)]
    seconds = [statistics.median(times[name]) for name in ("full", "pruned")]
    return {
        "heads_removed": int((head_mask == 0).sum()),
        "parameters_before": pruning.count_parameters(model),
        "parameters_after": pruning.count_parameters(pruned),
        "attention_parameters_before": attention_params[0],
        "attention_parameters_after": attention_params[1],
        "seconds_before": seconds[0],
        "seconds_after": seconds[1],
        "speedup": seconds[0] / seconds[1],
        "batch": list(ids.shape),
        "max_abs_difference": float(difference),
        "equal": bool(difference <= 1e-5),
    }


# ---- the study, shipped as data/minilm_pruning.json --------------------------------------------------------------


def _curve(model, pairs, order, counts, tolerance: float, **extra) -> dict:
    scores = _curve_scores(model, pairs, order, counts, batch_size=64)
    return {
        **extra,
        "order": [list(h) for h in order],
        **scores,
        "auc": curve_auc(counts, scores["accuracy"]),
        "loss_auc": pruning.area_under_curve(scores["loss"], counts),  # the mean loss over the curve
        "prunable": prunable_heads(counts, scores["accuracy"], tolerance),
    }


def _band(curves: list[dict], key: str) -> dict:
    values = [c[key] for c in curves]
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)}


def run_study(model, random: int = 10, step: int = 2, seed: int = 0, tolerance: float = 0.01, chunk: int = 32) -> dict:
    """The whole study: importance (importance split), single-head ablations and pruning curves (eval split) for
    the importance order, the order of the raw (not layer-normalised) importance and ``random`` random orders at
    counts 0, step, 2 step, ..., 72, each measured as accuracy@1 and as retrieval loss; and the savings of
    removing the heads the importance order can lose at ``tolerance``. Returns plain data (what --write saves)."""
    validate.bert_model(model)
    validate.positive_int(step, "step")
    started = time.perf_counter()
    importance_pairs, eval_pairs = load_paraphrases("importance"), load_paraphrases("eval")
    L, H = model.num_attention_layers, model.num_heads
    counts = sorted({*range(0, L * H + 1, step), L * H})
    raw = gradient_importance(model, importance_pairs, chunk=chunk, normalize=False)
    importance = pruning.normalize_per_layer(raw)
    full, masked = _ablations(model, eval_pairs, batch_size=64)
    drops, loss_increase = full["accuracy"] - masked["accuracy"], masked["loss"] - full["loss"]
    order = pruning.order_from_scores(importance)  # least important first
    randoms = random_orders(random, seed, (L, H))
    curves = {
        "importance": _curve(model, eval_pairs, order, counts, tolerance),
        "importance_raw": _curve(model, eval_pairs, pruning.order_from_scores(raw), counts, tolerance),
        "random": [_curve(model, eval_pairs, o, counts, tolerance, seed=seed + i) for i, o in enumerate(randoms)],
    }
    savings = physical_pruning_savings(model, order[: curves["importance"]["prunable"]])
    return {
        "model": "all-MiniLM-L6-v2",
        "pairs": {"importance": len(importance_pairs), "eval": len(eval_pairs)},
        "settings": {"chunk": chunk, "scale": SCALE, "normalize": True, "tolerance": tolerance, "seed": seed},
        "full_accuracy": full["accuracy"],
        "full_loss": full["loss"],
        "importance": importance.tolist(),
        "importance_raw": raw.tolist(),
        "ablation_drops": drops.tolist(),
        "ablation_loss_increase": loss_increase.tolist(),
        "rank_correlation": {
            "importance_raw_vs_ablation_drop": _finite(pruning.rank_correlation(raw, drops)),
            "importance_raw_vs_ablation_loss_increase": _finite(pruning.rank_correlation(raw, loss_increase)),
        },
        "counts": counts,
        "curves": curves,
        "summary": {
            "importance_auc": curves["importance"]["auc"],
            "importance_raw_auc": curves["importance_raw"]["auc"],
            "random_auc": _band(curves["random"], "auc"),
            "importance_loss_auc": curves["importance"]["loss_auc"],
            "importance_raw_loss_auc": curves["importance_raw"]["loss_auc"],
            "random_loss_auc": _band(curves["random"], "loss_auc"),
            "prunable": curves["importance"]["prunable"],
            "random_prunable": [c["prunable"] for c in curves["random"]],
            "accuracy_without_any_head": curves["importance"]["accuracy"][-1],
            "loss_without_any_head": curves["importance"]["loss"][-1],
        },
        "savings": savings,
        "provenance": _provenance(model, started),
    }


def _provenance(model, started: float) -> dict:
    """Where and how the study was run; ``started``: its ``time.perf_counter()`` at the start."""
    device = next(model.parameters()).device
    return {
        "model_sha256": file_sha256(model_dir() / "model.safetensors"),
        "torch": torch.__version__,
        "device": str(device) if device.type != "cpu" else f"cpu ({torch.get_num_threads()} threads)",
        "date": datetime.date.today().isoformat(),
        "seconds": round(time.perf_counter() - started, 1),
        "command": "python -m mha_tutorial.pretrained.retrieval --write --threads 1",
    }


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None  # JSON has no NaN: None (null) instead


def to_json(value, depth: int = 0) -> str:
    """JSON text with one key per line and short lists -- a curve, a row of a table, an order -- on one line."""
    pad = " " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(key)}: {to_json(item, depth + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    if isinstance(value, list) and value and all(isinstance(v, dict | list) for v in value):
        if not all(isinstance(v, list) and len(v) == 2 for v in value):  # (layer, head) pairs stay on one line
            return "[\n" + ",\n".join(pad + to_json(v, depth + 1) for v in value) + "\n" + " " * depth + "]"
    return json.dumps(value)


def load_study(path=None) -> dict:
    """The shipped study (``data/minilm_pruning.json``), checked, with the (L, H) tables as tensors and the
    orders as lists of (layer, head) tuples."""
    validate.json_path(path)
    path = STUDY_PATH if path is None else path
    data = json.loads(open(path, encoding="utf-8").read())
    validate.study(data, path, *SIZES)
    for key in TABLES:
        data[key] = torch.tensor(data[key])
    for curve in [data["curves"]["importance"], data["curves"]["importance_raw"], *data["curves"]["random"]]:
        curve["order"] = [tuple(h) for h in curve["order"]]
    return data


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="Head-pruning study of all-MiniLM-L6-v2 by paraphrase retrieval.")
    parser.add_argument("--write", action="store_true", help=f"save the result to {STUDY_PATH}")
    parser.add_argument("--out", default=str(STUDY_PATH), help="where --write saves it")
    parser.add_argument("--random", type=int, default=10, help="number of random orders")
    parser.add_argument("--step", type=int, default=2, help="heads between two points of a curve")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    study = run_study(load_minilm(), random=args.random, step=args.step)
    print(json.dumps({k: study[k] for k in ("full_accuracy", "rank_correlation", "summary", "savings")}, indent=1))
    print(f"took {study['provenance']['seconds']} s")
    if args.write:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(to_json(study) + "\n")
    return study


if __name__ == "__main__":
    main()
