"""The score of ``retrieval.py``: the paraphrase pairs of ``paraphrases.tsv``, their embedding in length-sorted
batches, accuracy@1 and the retrieval loss over them, and Michel et al.'s gradient importance of each head for
that loss.

Everything here is re-exported by ``retrieval`` (``retrieval.load_paraphrases``, ``retrieval.retrieval_accuracy``,
``retrieval.gradient_importance``, ``retrieval.SCALE``, ...), which documents them; import it from there.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..analysis import pruning
from ..models.task_base import DATA_DIR
from . import _validate_pretrained as validate
from .minilm import tokenize

PAIRS_PATH = DATA_DIR / "paraphrases.tsv"
SPLITS = {"importance": slice(0, 160), "eval": slice(160, 320), "all": slice(0, 320)}  # rows of the file, by id
SCALE = 20.0  # similarity scale of the retrieval loss (the "temperature" 1/20 of in-batch-negatives training)


def load_paraphrases(split: str = "all") -> list[tuple[str, str]]:
    """(sentence, paraphrase) pairs of ``paraphrases.tsv`` in id order: "importance" (ids 0-159), "eval"
    (ids 160-319) or "all" (320 pairs). Importance is measured on one split and accuracy on the other.

    The splits are the two halves of the file, not even and odd ids: a sentence's nearest rival is nearly
    always its neighbour (id +- 1, written as its near-miss), so a split by parity would leave no rival in
    either half (the full model scores 100% on both) where the halves keep 90% and 87%.
    """
    validate.choice(split, "split", SPLITS)
    lines = PAIRS_PATH.read_text(encoding="utf-8").splitlines()[1:]  # after the header id, sentence, paraphrase
    rows = [line.split("\t") for line in lines if line]
    chosen = SPLITS[split]
    return [(s, p) for i, s, p in rows if chosen.start <= int(i) < chosen.stop]


# ---- embedding in length-sorted batches --------------------------------------------------------------------------


def _batches(model, pairs, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The 2N texts (sentences, then paraphrases) as (indices, input_ids, attention_mask) batches on the model's
    device, sorted by length so that each batch is padded only to its own longest text."""
    device = next(model.parameters()).device
    tokens = tokenize([s for s, _ in pairs] + [p for _, p in pairs], device=device)
    lengths = tokens.valid_lens  # (2N,)
    order = torch.argsort(lengths, stable=True)
    batches = []
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        width = int(lengths[index].max())
        batches.append((index, tokens.input_ids[index, :width], tokens.attention_mask[index, :width]))
    return batches


def _gather(pieces: list[torch.Tensor], batches) -> torch.Tensor:
    """Batch outputs back in text order: (2N, d)."""
    index = torch.cat([b[0] for b in batches])
    return torch.cat(pieces)[torch.argsort(index)]


def _embed(model, batches, head_mask=None) -> torch.Tensor:
    return _gather([model.encode(ids, mask, head_mask=head_mask) for _, ids, mask in batches], batches)


def embedding_scores(embeddings: torch.Tensor, scale: float = SCALE) -> dict[str, float]:
    """From the (2N, d) unit embeddings of N sentences, then their N paraphrases: "accuracy" (@1: sentence i's
    nearest paraphrase is paraphrase i) and "loss", ``retrieval_loss`` over all N pairs at once (lower is better)."""
    n = len(embeddings) // 2
    similarity = embeddings[:n] @ embeddings[n:].T  # (N, N) cosines: sentences x paraphrases
    target = torch.arange(n, device=similarity.device)
    return {
        "accuracy": (similarity.argmax(dim=1) == target).double().mean().item(),
        "loss": F.cross_entropy(scale * similarity, target).item(),
    }


def _checked(model, pairs, head_mask=None, batch_size: int = 64) -> list[tuple[str, str]]:
    validate.bert_model(model)
    pairs = validate.paraphrase_pairs(pairs)
    if head_mask is not None:
        pruning.check_head_mask(model, head_mask)
    validate.positive_int(batch_size, "batch_size")
    return pairs


def retrieval_accuracy(model, pairs, head_mask=None, batch_size: int = 64) -> float:
    """Accuracy@1, sentence -> paraphrase, among all the paraphrases of ``pairs`` (ties go to the first)."""
    pairs = _checked(model, pairs, head_mask, batch_size)
    with torch.no_grad():
        return embedding_scores(_embed(model, _batches(model, pairs, batch_size), head_mask))["accuracy"]


def retrieval_loss(model, pairs, head_mask=None, scale: float = SCALE) -> torch.Tensor:
    """Cross-entropy of each sentence against all paraphrases of ``pairs`` (its own is the class), over the
    cosine similarities times ``scale``; differentiable in ``head_mask`` and the weights."""
    pairs = _checked(model, pairs, head_mask)
    batches = _batches(model, pairs, batch_size=2 * len(pairs))  # one batch: the chunk is small
    embeddings = _embed(model, batches, head_mask)
    n = len(pairs)
    logits = scale * embeddings[:n] @ embeddings[n:].T  # (N, N)
    return F.cross_entropy(logits, torch.arange(n, device=logits.device))


# ---- gradient importance -----------------------------------------------------------------------------------------


def gradient_importance(model, pairs, chunk: int = 32, scale: float = SCALE, normalize: bool = True) -> torch.Tensor:
    """Michel et al.'s I[l, h] = mean over chunks of ``|dL(chunk) / d head_mask[l, h]|`` at head_mask = 1, (L, H).

    The pairs are cut in id order into len(pairs) // chunk nearly equal chunks (at least ``chunk`` pairs each,
    or one chunk of all), so that near-miss clusters stay together; the absolute value is taken per chunk.
    With ``normalize`` each layer's row is divided by its L2 norm, as Michel et al. do.
    """
    pairs = _checked(model, pairs)
    validate.positive_int(chunk, "chunk")
    L, H = model.num_attention_layers, model.num_heads
    gates = torch.ones(L, H, device=next(model.parameters()).device, requires_grad=True)
    parts = max(1, len(pairs) // chunk)
    bounds = [round(i * len(pairs) / parts) for i in range(parts + 1)]
    total = torch.zeros(L, H, device=gates.device)
    for start, stop in zip(bounds, bounds[1:], strict=False):
        loss = retrieval_loss(model, pairs[start:stop], gates, scale)
        (grad,) = torch.autograd.grad(loss, gates, allow_unused=True, materialize_grads=True)  # pruned: 0
        total += grad.abs()
    importance = total / parts
    return (pruning.normalize_per_layer(importance) if normalize else importance).cpu()
