"""Per-head statistics of all-MiniLM-L6-v2 and the Clark et al. categories (``mha_tutorial.pretrained.bert_heads``).

The statistics are checked against plain Python loops over the tokens of each sentence run alone (no padding,
no masks, no tensors in the arithmetic); the category rules on hand-made frames, boundaries included.
"""

from __future__ import annotations

import math
import string

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

from mha_tutorial.analysis.pruning import pruned_copy
from mha_tutorial.pretrained import bert_heads, minilm
from mha_tutorial.pretrained.bert_heads import (
    CATEGORIES,
    CATEGORY_RULES,
    SHARE_CATEGORIES,
    STAT_COLUMNS,
    category_profile,
    clark_categories,
    head_token_stats,
    plot_category_profile,
)

from testkit import no_arithmetic

SENTENCES = [  # split words (token ##ization, un ##bel ##ie ##va ##bly), punctuation, different lengths
    "Tokenization isn't hard, honestly!",
    "The cat sat.",
    "Unbelievably, she re-tokenized it.",
]
HEADS = [(0, 2), (3, 11)]  # a previous-token head and a head with some weight on punctuation
SHARES = [c for c in STAT_COLUMNS if c not in ("entropy", "norm_entropy")]


@pytest.fixture(scope="module")
def model():
    return minilm.load_minilm(device="cpu")


@pytest.fixture(scope="module")
def stats(model):
    return head_token_stats(model, SENTENCES)


def loop_stats(model, sentences, heads) -> dict:
    """{(layer, head): {column: value}}: every sentence alone, every real token a query, plain loops."""
    tokenizer = minilm.load_tokenizer()
    sums = {head: dict.fromkeys(STAT_COLUMNS, 0.0) for head in heads}
    counts = dict.fromkeys(STAT_COLUMNS, 0)
    for sentence in sentences:
        enc = tokenizer.encode(sentence)
        tokens, words, n = enc.tokens, enc.word_ids, len(enc.tokens)
        with torch.no_grad():
            attentions = model(torch.tensor([enc.ids]), output_attentions=True).attentions
        for i in range(n):
            others = [j for j in range(n) if j != i and words[i] is not None and words[j] == words[i]]
            counts.update(
                {c: counts[c] + 1 for c in ("entropy", "norm_entropy", "cls", "sep", "punctuation")},
                previous=counts["previous"] + (i > 0),
                next=counts["next"] + (i < n - 1),
                same_word=counts["same_word"] + bool(others),
            )
            for layer, head in heads:
                row = attentions[layer][0, head, i].tolist()
                s = sums[layer, head]
                entropy = -sum(p * math.log(p) for p in row if p > 0)
                s["entropy"] += entropy
                s["norm_entropy"] += entropy / math.log(n)
                s["cls"] += sum(p for p, t in zip(row, tokens, strict=True) if t == "[CLS]")
                s["sep"] += sum(p for p, t in zip(row, tokens, strict=True) if t == "[SEP]")
                s["punctuation"] += sum(p for p, t in zip(row, tokens, strict=True) if t in string.punctuation)
                s["previous"] += row[i - 1] if i > 0 else 0.0
                s["next"] += row[i + 1] if i < n - 1 else 0.0
                s["same_word"] += sum(row[j] for j in others)
    return {h: {c: v / counts[c] if counts[c] else math.nan for c, v in s.items()} for h, s in sums.items()}


# =====================================================================================================
# statistics
# =====================================================================================================
def test_word_ids_group_the_pieces_of_a_word():
    batch = minilm.tokenize(["Tokenization works.", "Hi"])
    assert batch.tokens[0] == ["[CLS]", "token", "##ization", "works", ".", "[SEP]"]
    assert batch.word_ids == [[None, 0, 0, 1, 2, None], [None, 0, None, None, None, None]]


def test_frame_shape_and_columns(stats):
    assert list(stats.columns) == list(STAT_COLUMNS)
    assert stats.index.names == ["layer", "head"]
    assert list(stats.index) == [(layer, head) for layer in range(6) for head in range(12)]
    assert stats.attrs["sentences"] == 3
    assert stats.attrs["queries"]["entropy"] == 11 + 6 + 15  # every real token, [CLS] and [SEP] included
    assert stats.attrs["queries"]["same_word"] == 2 + 5 + 2


def test_matches_plain_loops(model, stats):
    expected = loop_stats(model, SENTENCES, HEADS)
    for head in HEADS:
        for column in STAT_COLUMNS:
            assert stats.loc[head, column] == pytest.approx(expected[head][column], rel=1e-5, abs=1e-6), (head, column)


def test_values_in_range(stats):
    assert stats.notna().all().all()
    assert ((stats[SHARES] >= 0) & (stats[SHARES] <= 1 + 1e-6)).all().all()
    assert ((stats.norm_entropy >= 0) & (stats.norm_entropy <= 1 + 1e-6)).all()
    assert (stats.entropy <= math.log(15) + 1e-5).all()  # at most uniform over the longest sentence
    assert (stats[["cls", "sep", "punctuation"]].sum(axis=1) <= 1 + 1e-5).all()  # disjoint kinds of keys


def test_padding_never_counted(model):
    short, long = "The cat sat.", "Unbelievably, the cat sat on the warm windowsill all afternoon."
    alone = head_token_stats(model, [short, long], batch_size=1)  # each sentence in its own batch: no padding
    padded = head_token_stats(model, [short, long], batch_size=2)  # the short one padded to the long one
    pd.testing.assert_frame_equal(alone, padded, rtol=1e-5, atol=1e-6)
    assert alone.attrs == padded.attrs


def test_pruned_model_keeps_original_head_numbers(model, stats):
    pruned = head_token_stats(pruned_copy(model, {0: [0, 5], 3: list(range(12))}), SENTENCES)
    assert len(pruned) == 72 - 2 - 12 and (3, 0) not in pruned.index and (0, 5) not in pruned.index
    kept = [(0, 2), (0, 11), (1, 0)]  # layer 0's other heads are unchanged; later layers see other inputs
    pd.testing.assert_frame_equal(pruned.loc[kept[:2]], stats.loc[kept[:2]], rtol=1e-5, atol=1e-6)
    assert pruned.loc[kept[2]].notna().all()


def test_same_word_nan_without_split_words(model):
    model.train()  # head_token_stats evaluates in eval mode and gives the mode back
    stats = head_token_stats(model, ["The cat sat on the mat."])
    assert model.training
    model.eval()
    assert stats.same_word.isna().all() and stats.attrs["queries"]["same_word"] == 0
    assert stats.drop(columns="same_word").notna().all().all()
    assert set(clark_categories(stats)) <= set(CATEGORIES)  # NaN shares take no part


# =====================================================================================================
# categories
# =====================================================================================================
BASE = {"entropy": 1.0, "norm_entropy": 0.5, "cls": 0.1, "sep": 0.1, "previous": 0.1, "next": 0.1}
BASE |= {"same_word": math.nan, "punctuation": 0.1}


def frame(*changes: dict) -> pd.DataFrame:
    """One head per dict of changes to ``BASE``, all in layer 0."""
    index = pd.MultiIndex.from_tuples([(0, h) for h in range(len(changes))], names=["layer", "head"])
    return pd.DataFrame([BASE | c for c in changes], index=index)


@pytest.mark.parametrize("column", list(SHARE_CATEGORIES))
def test_share_rule_and_its_boundary(column):
    share = CATEGORY_RULES["min_share"]
    labels = clark_categories(frame({column: share}, {column: math.nextafter(share, 0)}, {column: 0.9}))
    assert labels.tolist() == [SHARE_CATEGORIES[column], "mixed", SHARE_CATEGORIES[column]]
    assert labels.name == "category" and labels.index.equals(frame({}, {}, {}).index)


def test_broad_mixed_and_precedence():
    bar = CATEGORY_RULES["min_norm_entropy"]
    labels = clark_categories(
        frame(
            {"norm_entropy": bar},  # on the bar: broad
            {"norm_entropy": math.nextafter(bar, 0)},  # just below: mixed
            {},  # nothing stands out: mixed
            {"cls": 0.6, "norm_entropy": 0.95},  # a share above the bar wins over high entropy
            {"previous": 0.6, "same_word": 0.8},  # the largest share names the head
            {"norm_entropy": math.nan},  # no entropy: not broad
        )
    )
    assert labels.tolist() == ["broad", "mixed", "mixed", "[CLS]", "same word", "mixed"]


def test_every_category_reachable():
    changes = [{c: 0.7} for c in SHARE_CATEGORIES] + [{"norm_entropy": 0.9}, {}]
    assert clark_categories(frame(*changes)).tolist() == list(CATEGORIES)


def test_profile_counts(stats):
    profile = category_profile(clark_categories(stats))
    assert list(profile.columns) == list(CATEGORIES) and list(profile.index) == list(range(6))
    assert (profile.sum(axis=1) == 12).all()
    labels = pd.Series(["broad", "broad", "mixed"], index=pd.MultiIndex.from_tuples([(0, 0), (0, 1), (2, 0)]))
    profile = category_profile(labels)
    assert list(profile.index) == [0, 2]  # the layers that have labels
    assert profile.loc[0, "broad"] == 2 and profile.loc[2, "mixed"] == 1 and profile.to_numpy().sum() == 3


def test_plot_category_profile(stats, monkeypatch):
    monkeypatch.setattr(plt, "show", lambda *a, **k: pytest.fail("plot_category_profile must not call plt.show"))
    labels = clark_categories(stats)
    profile = category_profile(labels)
    ax = plot_category_profile(labels)
    assert len(ax.patches) == int((profile > 0).any().sum()) * len(profile)  # one bar per layer and drawn category
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [c for c in CATEGORIES if profile[c].any()][::-1]  # top to bottom, as stacked
    assert ax.get_title() and ax.get_xlabel() == "layer" and ax.get_ylabel() == "heads"
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(layer) for layer in range(6)]
    ticks = ax.get_xticklabels() + ax.get_yticklabels()
    assert min(t.get_fontsize() for t in ticks) >= 8
    _, given = plt.subplots()
    assert plot_category_profile(labels, ax=given) is given


# =====================================================================================================
# validation: errors name the value, before any arithmetic
# =====================================================================================================
@pytest.mark.parametrize(
    ("args", "error", "fragment"),
    [
        (("model", ["a"]), TypeError, "BertEncoder"),
        ((None, "one sentence"), TypeError, "list of strings"),
        ((None, []), ValueError, "empty"),
        ((None, ["ok", 3]), TypeError, "(1, 'int')"),
        ((None, ["ok"], 0), ValueError, "batch_size must be a positive int, got 0"),
        ((None, ["ok"], 2.5), TypeError, "batch_size"),
        ((None, ["ok"], True), TypeError, "batch_size"),
    ],
)
def test_head_token_stats_errors(model, args, error, fragment):
    args = (model if args[0] is None else args[0], *args[1:])
    with no_arithmetic(), pytest.raises(error, match=None) as info:
        head_token_stats(*args)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("make", "error", "fragment"),
    [
        (lambda: BASE, TypeError, "got dict"),
        (lambda: frame({}).drop(columns=["sep", "next"]), ValueError, "['sep', 'next']"),
        (lambda: frame({}).iloc[:0], ValueError, "empty"),
        (lambda: frame({}).reset_index(drop=True), ValueError, "indexed by (layer, head)"),
        (lambda: frame({}).astype({"cls": str}), TypeError, "'cls'"),
    ],
)
def test_clark_categories_errors(make, error, fragment):
    with pytest.raises(error) as info:
        clark_categories(make())
    assert fragment in str(info.value)


def test_profile_and_plot_errors():
    index = pd.MultiIndex.from_tuples([(0, 0)])
    with pytest.raises(TypeError, match="got list"):
        category_profile(["broad"])
    with pytest.raises(ValueError, match="'sink'"):
        category_profile(pd.Series(["sink"], index=index))
    with pytest.raises(TypeError, match="got str"):
        plot_category_profile(pd.Series(["broad"], index=index), ax="left")


def test_is_punctuation():
    assert all(bert_heads.is_punctuation(t) for t in [",", ".", "!", "-", "'", "$", "...", "«"])
    assert not any(bert_heads.is_punctuation(t) for t in ["a", "##s", "3", "[SEP]", "[CLS]", "", "a."])
