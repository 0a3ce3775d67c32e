r"""What SmolLM2-135M's heads are worth, measured by perplexity (notebook 14; issue 23).

Perplexity is the exponential of the mean next-token cross-entropy: a model that spreads its guesses evenly over P
tokens has perplexity P, so lower is better and the vocabulary size (49,152) is the uniform guesser's:

.. math::
    \mathrm{PPL} = \exp\Big(-\frac{1}{N} \sum_{t} \log p(x_{t+1} \mid x_{\le t})\Big)

The text is CPython's own documentation (``data/smollm_eval_text.json``: four ``help()`` topics, copied with their
licence): two topics *select* (importance is measured on them), two others are *held out* (the pruning curves are
measured there, so an order is never judged on the text that chose it). Each topic gives one window of
``WINDOW`` tokens, its first.

- ``head_importance``: switch one query head off (its ``head_mask`` entry 0), perplexity minus the intact model's;
- ``group_importance``: the same for a K/V group (its G = 3 query heads at once, all its K/V head serves);
- ``pruning_curve``: switch off units in a given order, perplexity after each count in ``counts``;
- ``run_study``: both importances on the selection text, then curves on the held-out text in the importance order
  (least important first) and in ``NUM_RANDOM`` random orders, for heads and for groups. It takes minutes on a
  2-core CPU, so its result ships as ``data/smollm_pruning.json`` and the notebook re-computes a few entries live:

    python -m mha_tutorial.pretrained.smollm_study      # writes data/smollm_pruning.json
"""

from __future__ import annotations

import json
import random
import sys
import time

import torch
from torch.nn import functional as F

from ..device import describe_machine
from ..models.task_base import DATA_DIR
from .llama import LlamaDecoder

__all__ = [
    "COUNTS",
    "NUM_RANDOM",
    "STUDY_PATH",
    "TEXT_PATH",
    "WINDOW",
    "eval_text",
    "eval_windows",
    "group_importance",
    "group_mask",
    "head_importance",
    "layer_inputs",
    "load_study",
    "masked_perplexity",
    "perplexity",
    "pruning_curve",
    "random_orders",
    "run_study",
]

TEXT_PATH = DATA_DIR / "smollm_eval_text.json"
STUDY_PATH = DATA_DIR / "smollm_pruning.json"
COMMAND = "python -m mha_tutorial.pretrained.smollm_study"
WINDOW = 256  # tokens per topic
NUM_RANDOM = 5  # random orders per curve
COUNTS = [i / 10 for i in range(11)]  # fractions of the units switched off: 0, 10 %, ..., 100 %


def eval_text() -> dict:
    """The shipped text: {"source", "licence", "selection": {topic: text}, "heldout": {topic: text}}."""
    return json.loads(TEXT_PATH.read_text(encoding="utf-8"))


def eval_windows(tokenizer, split: str, window: int = WINDOW) -> torch.Tensor:
    """The first ``window`` tokens of each topic of ``split`` ("selection" or "heldout"): ids (topics, window)."""
    if split not in ("selection", "heldout"):
        raise ValueError(f"split must be 'selection' or 'heldout', got {split!r}")
    rows = []
    for topic, text in eval_text()[split].items():
        ids = tokenizer.encode(text).ids
        if len(ids) < window:
            raise ValueError(f"topic {topic!r} has {len(ids)} tokens, fewer than the window {window}")
        rows.append(ids[:window])
    return torch.tensor(rows)  # (topics, window)


@torch.no_grad()
def perplexity(model: LlamaDecoder, ids: torch.Tensor, head_mask=None, mask=None) -> float:
    """exp(mean cross-entropy of each next token) over every window of ids (B, T): T - 1 predictions per window.
    ``head_mask`` (L, H) and ``mask`` (a keep-mask AND-ed with the causal one) go to the model."""
    return _from_logits(model(ids, head_mask=head_mask, mask=mask), ids)  # logits (B, T, V)


def _from_logits(logits, ids) -> float:
    """exp of the mean cross-entropy of position t's logits (B, T, V) against token t + 1 of ids (B, T)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 at least
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())  # mean over B * (T - 1)
    return float(nll.exp())


def _shape(model: LlamaDecoder) -> tuple[int, int, int]:
    """(layers L, query heads H, K/V heads H_kv) of an unpruned model."""
    config = model.config
    return config.num_layers, config.num_heads, config.num_kv_heads


def group_mask(model: LlamaDecoder, groups) -> torch.Tensor:
    """A head_mask (L, H) with the query heads of the K/V groups ``groups`` [(layer, group), ...] switched off."""
    L, H, H_kv = _shape(model)
    G = H // H_kv  # query heads per K/V head
    mask = torch.ones(L, H)
    for layer, group in groups:
        mask[layer, group * G : (group + 1) * G] = 0.0
    return mask


@torch.no_grad()
def layer_inputs(model: LlamaDecoder, ids: torch.Tensor) -> list[torch.Tensor]:
    """The intact model's residual stream entering each layer: [X_0, ..., X_L], each (B, T, D); X_L feeds the head."""
    X = model.embedding(ids)  # (B, T, D)
    inputs = [X]
    for block in model.layers:
        X = block(X)  # (B, T, D)
        inputs.append(X)
    return inputs


@torch.no_grad()
def masked_perplexity(model: LlamaDecoder, ids: torch.Tensor, inputs: list, head_mask: torch.Tensor) -> float:
    """``perplexity(model, ids, head_mask)``, with the layers before the first masked one read from ``inputs``.

    A head_mask row of ones changes nothing in its layer, so those layers' outputs are the intact ones; starting
    at the first layer with a head off gives the same numbers in less time (the importances cost half as much).
    """
    changed = (head_mask != 1).any(dim=1).nonzero()  # layers with a head off
    start = int(changed[0]) if len(changed) else len(model.layers)
    X = inputs[start]  # (B, T, D)
    for i in range(start, len(model.layers)):
        X = model.layers[i](X, None, head_mask[i])  # (B, T, D)
    return _from_logits(model.head(model.norm(X)), ids)  # logits (B, T, V)


def _unit_mask(model: LlamaDecoder, off, unit: str) -> torch.Tensor:
    """A head_mask (L, H) with the units ``off`` [(layer, head or group), ...] switched off."""
    if unit == "group":
        return group_mask(model, off)
    L, H, _ = _shape(model)
    mask = torch.ones(L, H)
    for layer, head in off:
        mask[layer, head] = 0.0
    return mask


def _importance(model: LlamaDecoder, ids: torch.Tensor, unit: str, progress=None) -> torch.Tensor:
    """(L, units per layer): perplexity with one unit off, minus the intact model's perplexity."""
    L, H, H_kv = _shape(model)
    per_layer = H if unit == "head" else H_kv
    inputs, base = layer_inputs(model, ids), perplexity(model, ids)
    scores = torch.zeros(L, per_layer, dtype=torch.float64)
    for layer in range(L):
        for u in range(per_layer):
            scores[layer, u] = masked_perplexity(model, ids, inputs, _unit_mask(model, [(layer, u)], unit)) - base
        if progress:
            progress(f"{unit}s: layer {layer + 1}/{L}")
    return scores


def head_importance(model: LlamaDecoder, ids: torch.Tensor, progress=None) -> torch.Tensor:
    """(L, H): perplexity with that one query head off, minus the intact model's perplexity."""
    return _importance(model, ids, "head", progress)


def group_importance(model: LlamaDecoder, ids: torch.Tensor, progress=None) -> torch.Tensor:
    """(L, H_kv): perplexity with one K/V group off (its K/V head and the query heads it serves), minus the intact."""
    return _importance(model, ids, "group", progress)


def random_orders(num_units: int, num_orders: int = NUM_RANDOM, seed: int = 0) -> list[list[int]]:
    """``num_orders`` shuffles of 0 .. num_units - 1, from ``random.Random(seed)`` (the same on every machine)."""
    rng = random.Random(seed)
    return [rng.sample(range(num_units), num_units) for _ in range(num_orders)]


def pruning_curve(model: LlamaDecoder, ids: torch.Tensor, order: list[int], counts: list[int], unit: str) -> list:
    """Perplexity with the first c units of ``order`` off, for each c in ``counts``.

    A unit is a flat index: ``layer * H + head`` for unit "head", ``layer * H_kv + group`` for unit "group".
    """
    L, H, H_kv = _shape(model)
    per_layer = {"head": H, "group": H_kv}.get(unit)
    if per_layer is None:
        raise ValueError(f"unit must be 'head' or 'group', got {unit!r}")
    if sorted(order) != list(range(L * per_layer)):
        raise ValueError(f"order must be a permutation of 0 .. {L * per_layer - 1}")
    inputs, curve = layer_inputs(model, ids), []
    for count in counts:
        off = [divmod(u, per_layer) for u in order[:count]]  # [(layer, head or group), ...]
        curve.append(masked_perplexity(model, ids, inputs, _unit_mask(model, off, unit)))
    return curve


def _curves(model, ids, scores: torch.Tensor, unit: str) -> dict:
    """Curves on ``ids`` in the importance order (least important first) and in NUM_RANDOM random orders."""
    num = scores.numel()
    counts = [round(f * num) for f in COUNTS]
    by_importance = torch.argsort(scores.flatten(), stable=True).tolist()  # least important first
    orders = random_orders(num, NUM_RANDOM, seed={"head": 0, "group": 1}[unit])
    return {
        "counts": counts,
        "importance_order": by_importance,
        "importance": pruning_curve(model, ids, by_importance, counts, unit),
        "random": [pruning_curve(model, ids, order, counts, unit) for order in orders],
    }


def run_study(model: LlamaDecoder, tokenizer, progress=None) -> dict:
    """Both importances on the selection windows, curves on the held-out windows (see the module's docstring)."""
    select, heldout = eval_windows(tokenizer, "selection"), eval_windows(tokenizer, "heldout")
    heads = head_importance(model, select, progress)
    groups = group_importance(model, select, progress)
    return {
        "window": WINDOW,
        "selection_ppl": perplexity(model, select),
        "heldout_ppl": perplexity(model, heldout),
        "head_importance": heads.tolist(),
        "group_importance": groups.tolist(),
        "head_curves": _curves(model, heldout, heads, "head"),
        "group_curves": _curves(model, heldout, groups, "group"),
    }


def load_study() -> dict:
    """The shipped study (``STUDY_PATH``): ``run_study``'s dict plus its provenance (command, machine, time)."""
    return json.loads(STUDY_PATH.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    from .smollm import load_smollm, load_smollm_tokenizer

    if argv if argv is not None else sys.argv[1:]:
        raise SystemExit(f"usage: {COMMAND}   (no options; writes {STUDY_PATH})")
    start = time.perf_counter()
    model, tokenizer = load_smollm(device="cpu"), load_smollm_tokenizer()
    study = run_study(model, tokenizer, progress=lambda s: print(s, flush=True))
    study["provenance"] = {
        "command": COMMAND,
        "machine": describe_machine(),
        "minutes": round((time.perf_counter() - start) / 60, 1),
        "text": eval_text()["source"],
    }
    STUDY_PATH.write_text(json.dumps(study, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {STUDY_PATH} in {study['provenance']['minutes']} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
