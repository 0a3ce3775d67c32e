r"""What the heads of a pretrained BERT-style model look at, in the categories of Clark et al. (notebook 09).

Clark, Khandelwal, Levy & Manning (2019), "What Does BERT Look At?", averaged each head's attention over many
sentences and found a few recurring habits: heads that put most of their weight on the previous or the next
token (mostly in early layers), heads that look at [SEP] or [CLS] (in the middle layers; they suggest that
[SEP] serves as a "no-op", where a head parks its attention when its pattern does not apply), heads focused on
punctuation, and broad heads that spread their weight almost evenly (mostly in the lower layers).

``head_token_stats(model, sentences)`` measures these habits on any list of sentences, one row per
(layer, head); ``clark_categories`` names each head after them (rules in ``CATEGORY_RULES``);
``category_profile`` counts the names per layer and ``plot_category_profile`` draws the counts.

Which queries count. Every real token of every sentence is a query, [CLS] and [SEP] included, as in
Clark et al. (who averaged over all tokens); padding never counts, neither as query nor as key. The means
are pooled over all counted queries of all sentences (a 30-token sentence weighs twice a 15-token one).
Three columns have a smaller set of queries, those for which the measured key exists:
``previous`` (every query but [CLS]), ``next`` (every query but [SEP]) and ``same_word`` (the sub-words of a
word cut into at least two pieces, e.g. "token" "##ization"; NaN when no sentence has such a word). Words are
the tokenizer's (``TokenBatch.word_ids``): every punctuation mark is a word of its own, so "isn't" is three words.

For a query :math:`i` with weights :math:`w_{ij}` over the :math:`n` real keys of its sentence:

.. math::
    \text{entropy}_i = -\sum_j w_{ij} \log w_{ij} \;\text{(nats)},\qquad
    \text{norm\_entropy}_i = \text{entropy}_i / \log n \in [0, 1],\qquad
    \text{share}_i(S) = \sum_{j \in S} w_{ij},

where :math:`S` is the [CLS] key, the [SEP] key, the previous or next key, the punctuation keys, or the other
sub-words of the query's own word. Norm-entropy 1 is a uniform spread over the sentence, 0 one single key.
"""

from __future__ import annotations

import math
import unicodedata

import torch
from torch.nn import functional as F

from . import _validate_pretrained as validate
from .minilm import TokenBatch, tokenize

__all__ = [
    "CATEGORIES",
    "CATEGORY_COLOURS",
    "CATEGORY_RULES",
    "SHARE_CATEGORIES",
    "STAT_COLUMNS",
    "category_profile",
    "clark_categories",
    "head_token_stats",
    "is_punctuation",
    "plot_category_profile",
]

STAT_COLUMNS = ("entropy", "norm_entropy", "cls", "sep", "previous", "next", "same_word", "punctuation")
SHARE_CATEGORIES = {  # share column -> the category of a head that puts most of its weight there
    "cls": "[CLS]",
    "sep": "[SEP]",
    "punctuation": "punctuation",
    "previous": "previous token",
    "next": "next token",
    "same_word": "same word",
}
CATEGORIES = (*SHARE_CATEGORIES.values(), "broad", "mixed")

# The two thresholds of ``clark_categories``, in one place.
#   min_share 0.5: the head's largest share must be at least half of its weight -- more on those keys than on
#       all others together, and about ten times chance for a 20-token sentence (a uniform head gives
#       [CLS] 1/20). Clark et al. use the same bar: heads with over 50 % of their attention on the previous
#       or the next token, and over half of the attention of whole layers on [SEP].
#   min_norm_entropy 0.8: the weights look like a spread over n ** 0.8 keys (perplexity exp(H) with
#       H = 0.8 log n): 6 of 10 keys, 11 of 20, 15 of 30 -- more than half of the sentence, the "broad"
#       attention of Clark et al.'s first layer. The same bar names "diffuse" heads in ``head_stats.role_labels``.
CATEGORY_RULES = {"min_share": 0.5, "min_norm_entropy": 0.8}

# Okabe & Ito's colour-blind-safe palette (grey for "mixed"), one fixed colour per category in every figure.
OKABE_ITO = ("#0072B2", "#D55E00", "#CC79A7", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#999999")
CATEGORY_COLOURS = dict(zip(CATEGORIES, OKABE_ITO, strict=True))
SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")


def is_punctuation(token: str) -> bool:
    """True for a token made only of punctuation, with BERT's own rule: Unicode category P*, or any ASCII
    character that is neither a letter, a digit nor a space ("$", "+", "^" ...)."""
    validate.token(token)
    if not token or token in SPECIAL_TOKENS:
        return False
    return all(
        unicodedata.category(c).startswith("P") or (c.isascii() and not c.isalnum() and not c.isspace()) for c in token
    )


# =====================================================================================================
# statistics
# =====================================================================================================
def _token_masks(batch: TokenBatch) -> dict[str, torch.Tensor]:
    """CPU masks of one batch: real (B, T) tokens, key kinds (B, T, 3) [CLS]/[SEP]/punctuation, same_word (B, T, T)."""
    real = batch.attention_mask.bool().cpu()  # (B, T)

    def where(test) -> torch.Tensor:  # (B, T): the real tokens passing ``test``
        return torch.tensor([[test(t) for t in row] for row in batch.tokens], dtype=torch.bool) & real

    kinds = [where(lambda t: t == "[CLS]"), where(lambda t: t == "[SEP]"), where(is_punctuation)]
    words = torch.tensor([[-1 if w is None else w for w in row] for row in batch.word_ids])  # (B, T); -1: none
    segments = batch.token_type_ids.cpu()
    same = (words[:, :, None] == words[:, None, :]) & (words[:, :, None] >= 0)  # (B, T, T): query i, key j
    same &= segments[:, :, None] == segments[:, None, :]  # word numbers restart in a pair's second sentence
    same &= ~torch.eye(words.shape[1], dtype=torch.bool)  # the OTHER sub-words: never the query itself
    return {"real": real, "kinds": torch.stack(kinds, dim=-1), "same_word": same}


def _query_values(w: torch.Tensor, masks: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights w (B, H, T, T) -> (value of each column for each query (B, H, T, C), queries that count (B, T, C)),
    columns in ``STAT_COLUMNS`` order."""
    real, same = masks["real"], masks["same_word"]
    n_keys = real.sum(dim=1).clamp_min(2).to(w.dtype)  # (B,); a sentence always has [CLS] and [SEP]
    entropy = -torch.xlogy(w, w).sum(dim=-1)  # (B, H, T); padded keys have weight exactly 0, and 0 log 0 = 0
    has_previous = real.clone()
    has_previous[:, 0] = False  # [CLS] has no previous token
    has_next = torch.zeros_like(real)
    has_next[:, :-1] = real[:, 1:]  # the next key is real: every real query but the last, [SEP]
    on_kinds = w @ masks["kinds"].to(w.dtype)[:, None]  # (B, H, T, 3): weight on [CLS], [SEP], punctuation keys
    columns = {
        "entropy": (entropy, real),
        "norm_entropy": (entropy / n_keys.log()[:, None, None], real),
        "cls": (on_kinds[..., 0], real),
        "sep": (on_kinds[..., 1], real),
        "previous": (F.pad(w.diagonal(-1, -2, -1), (1, 0)), has_previous),  # entry i: w[i, i - 1] (0 for i = 0)
        "next": (F.pad(w.diagonal(1, -2, -1), (0, 1)), has_next),  # entry i: w[i, i + 1] (0 for the last)
        "same_word": ((w * same[:, None]).sum(dim=-1), same.any(dim=-1)),  # queries with another piece of their word
        "punctuation": (on_kinds[..., 2], real),
    }
    values = torch.stack([columns[c][0] for c in STAT_COLUMNS], dim=-1)  # (B, H, T, C)
    return values, torch.stack([columns[c][1] for c in STAT_COLUMNS], dim=-1)  # (B, T, C)


def _add_batch(totals: dict, model, batch: TokenBatch) -> None:
    """Run one batch; add every head's sums ("sums": (all heads, C)) and the query counts ("counts": (C,))."""
    out = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, output_attentions=True)
    # All layers side by side, (B, heads of all layers, T, T): one pass of a few large operations is much faster
    # than one per layer (each operation costs a fixed time, and on a busy CPU the threads wait for each other).
    w = torch.cat([a.float().cpu() for a in out.attentions], dim=1)
    values, counted = _query_values(w, _token_masks(batch))
    sums = torch.einsum("bhqc,bqc->hc", values, counted.to(values.dtype)).double()  # sums over the counted queries
    counts = counted.sum(dim=(0, 1))  # (C,)
    totals["sums"] = totals["sums"] + sums if totals else sums
    totals["counts"] = totals["counts"] + counts if "counts" in totals else counts


def head_token_stats(model, sentences, batch_size: int = 64):
    """Per-head statistics of a ``BertEncoder`` on ``sentences``: a pandas DataFrame indexed by (layer, head).

    Columns (``STAT_COLUMNS``; see the module docstring for the definitions and which queries count):
    ``entropy`` (nats), ``norm_entropy`` (entropy / log of the number of keys, in [0, 1]), and the mean shares
    of weight on ``cls``, ``sep``, ``previous``, ``next``, ``same_word`` (the other sub-words of the query's
    word; NaN when no sentence has a word of two or more pieces) and ``punctuation`` keys.

    The sentences go ``batch_size`` at a time, shortest first (less padding; the pooled means do not depend on
    the order), through the model on its own device, without gradients; the weights are reduced on the CPU.
    A pruned model has rows only for the heads it still has (their original numbers).
    ``attrs["queries"]`` holds the number of queries behind each column. The weights of all layers of a batch are
    held at once (6 x 64 x 12 x T x T floats for MiniLM): lower ``batch_size`` for texts of hundreds of tokens.
    """
    import pandas as pd

    validate.bert_model(model)
    sentences = validate.sentences(sentences)
    validate.positive_int(batch_size, "batch_size")
    device = next(model.parameters()).device
    ordered = sorted(sentences, key=len)
    totals: dict = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(ordered), batch_size):
                _add_batch(totals, model, tokenize(ordered[start : start + batch_size], device=device))
    finally:
        model.train(was_training)
    counts = totals["counts"].tolist()
    means = (totals["sums"] / totals["counts"].clamp_min(1)).tolist()  # (all heads, C)
    heads = [(layer, head) for layer, block in enumerate(model.layers) for head in block.self_attn.head_ids]
    rows = [[m if n else math.nan for m, n in zip(row, counts, strict=True)] for row in means]  # NaN: no query
    index = pd.MultiIndex.from_tuples(heads, names=["layer", "head"])
    frame = pd.DataFrame(rows, index=index, columns=list(STAT_COLUMNS))
    frame.attrs["sentences"] = len(sentences)
    frame.attrs["queries"] = dict(zip(STAT_COLUMNS, counts, strict=True))
    return frame


# =====================================================================================================
# categories
# =====================================================================================================
def _category(row) -> str:
    """The category of one head (a row of ``head_token_stats``), by ``CATEGORY_RULES``."""
    shares = {column: row[column] for column in SHARE_CATEGORIES if not math.isnan(row[column])}
    if shares:
        top = max(shares, key=shares.get)  # a tie goes to the column listed first in SHARE_CATEGORIES
        if shares[top] >= CATEGORY_RULES["min_share"]:
            return SHARE_CATEGORIES[top]
    if row["norm_entropy"] >= CATEGORY_RULES["min_norm_entropy"]:  # False for NaN
        return "broad"
    return "mixed"


def clark_categories(stats):
    """One category (from ``CATEGORIES``) per head of a ``head_token_stats`` frame: a pandas Series, same index.

    Rules (thresholds in ``CATEGORY_RULES``), in order:

    1. the share column (``SHARE_CATEGORIES``) with the largest value, when that value is at least
       ``min_share``: "[CLS]", "[SEP]", "punctuation", "previous token", "next token" or "same word"
       (NaN shares, e.g. ``same_word`` without split words, take no part);
    2. "broad" when ``norm_entropy`` is at least ``min_norm_entropy``;
    3. "mixed": none of these (a head may still do something precise, e.g. attend to a word's verb).
    """
    import pandas as pd

    validate.stats_frame(stats, ("norm_entropy", *SHARE_CATEGORIES))
    labels = [_category(row) for _, row in stats.iterrows()]
    return pd.Series(labels, index=stats.index, name="category", dtype=object)


def category_profile(labels):
    """Heads per category in each layer: a DataFrame (layers x ``CATEGORIES``), every category a column."""
    import pandas as pd

    validate.category_labels(labels, CATEGORIES)
    layers = labels.index.get_level_values(0)
    table = pd.crosstab(layers, labels.to_numpy(), rownames=["layer"], colnames=["category"])
    return table.reindex(columns=list(CATEGORIES), fill_value=0).astype(int)


def plot_category_profile(labels, ax=None):
    """A stacked bar per layer: how many of its heads fall in each category (colours: ``CATEGORY_COLOURS``).

    Only the categories that occur are drawn and listed (top to bottom as in the bars); each segment shows its
    count, in white on the dark colours. Returns the axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    validate.category_labels(labels, CATEGORIES)
    validate.axes(ax)
    profile = category_profile(labels)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    x = list(range(len(profile)))
    bottom = [0] * len(profile)
    for category in CATEGORIES:
        counts = profile[category].tolist()
        if not any(counts):
            continue
        bars = ax.bar(x, counts, bottom=bottom, color=CATEGORY_COLOURS[category], edgecolor="white", label=category)
        red, green, blue = to_rgb(CATEGORY_COLOURS[category])
        ink = "white" if 0.2126 * red + 0.7152 * green + 0.0722 * blue < 0.4 else "black"  # relative luminance
        ax.bar_label(bars, labels=[str(c) if c else "" for c in counts], label_type="center", fontsize=9, color=ink)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_xticks(x, [str(layer) for layer in profile.index])
    ax.set_xlabel("layer")
    ax.set_ylabel("heads")
    ax.set_ylim(0, max(bottom) * 1.02)
    ax.tick_params(labelsize=9)
    ax.set_title("What each layer's heads attend to (categories of Clark et al., 2019)")
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], title="category", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9)
    return ax
