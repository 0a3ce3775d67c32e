"""mha_tutorial.analysis.head_stats on pruned models and on bad input: tables keep their (layers, heads) shape with NaN
and the role "n/a" for pruned heads; bad arguments get a TypeError / ValueError naming them."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest
import torch

from mha_tutorial.analysis import head_stats, pruning
from mha_tutorial.models.tasks import load_split


# ============================================================================ pruned models
def test_stats_of_a_pruned_layer_are_nan_for_its_pruned_heads_and_unchanged_for_the_others(models):
    model = models["reversal"]  # one layer: the weights of the heads left do not depend on the pruned ones
    rows = load_split("reversal")[:40]
    full = head_stats.head_stats(model, "reversal", rows)
    stats = head_stats.head_stats(pruning.pruned_copy(model, {0: [1, 3]}), "reversal", rows)
    for key in ("entropy", "confidence", "first", "distance", "self", "anti_diagonal"):
        assert stats[key].shape == (1, 4), key
        assert bool(stats[key][0, [1, 3]].isnan().all()), key
        torch.testing.assert_close(stats[key][0, [0, 2]], full[key][0, [0, 2]], atol=1e-5, rtol=1e-5)
    assert bool(stats["tv_to_nearest"][0, [0, 2]].isfinite().all())  # nearest among the heads left
    roles = head_stats.role_labels(stats)
    assert roles[0][1] == roles[0][3] == "n/a" and "n/a" not in (roles[0][0], roles[0][2])
    table = head_stats.stats_table(stats, ["enc.0.self"], roles, columns=["entropy"])
    assert table.loc[("enc.0.self", 1), "role"] == "n/a" and math.isnan(table.loc[("enc.0.self", 1), "entropy"])
    head_stats.plot_head_stats(stats, ["enc.0.self"], roles, ["entropy", "anti_diagonal"], "pruned")


def test_stats_of_a_model_with_a_layer_pruned_away(models):
    model = pruning.pruned_copy(models["dates"], {"enc.0.self": [0, 1, 2, 3], "dec.0.cross": [2]})
    stats = head_stats.head_stats(model, "dates", load_split("dates")[:20])
    L = model.num_attention_layers
    for key, table in stats.items():
        assert table.shape == (L, 4), key
        assert bool(table[0].isnan().all()), key  # enc.0.self: no heads left
    assert bool(stats["entropy"][1:].isfinite().sum() == 11)  # 16 heads - 4 - 1
    assert bool(stats["field_alignment"][3, [0, 1, 3]].isfinite().all()) and stats["field_alignment"][3, 2].isnan()
    scores = head_stats.pattern_scores(model, "dates", load_split("dates")[:20])
    assert len(scores["field_alignment"]["dec.0.cross"]) == 4 and math.isnan(
        scores["field_alignment"]["dec.0.cross"][2]
    )
    assert head_stats.role_labels(stats)[0] == ["n/a"] * 4


# ============================================================================ bad input
ROW = ("abcdefghij", "jihgfedcba")
W = torch.softmax(torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)), -1)  # (B, H, Q, K)
KEEP = torch.ones(2, 4, 4, dtype=torch.bool)


def _stats():
    return {k: torch.rand(1, 2) for k in head_stats.STAT_KEYS}


BAD_CALLS = [  # (what is wrong, call on the models, error, words of its message)
    # head_stats / pattern_scores: a model of the task's kind, a non-empty list of rows
    ("model None", lambda m: head_stats.head_stats(None, "reversal", [ROW]), TypeError, "model must be"),
    ("other task's model", lambda m: head_stats.head_stats(m["reversal"], "induction", []), ValueError, "of kind"),
    ("unknown task", lambda m: head_stats.pattern_scores(m["reversal"], "sorting", [ROW]), ValueError, "unknown task"),
    ("examples empty", lambda m: head_stats.head_stats(m["reversal"], "reversal", []), ValueError, "at least one"),
    ("examples None", lambda m: head_stats.head_stats(m["reversal"], "reversal", None), TypeError, "list of"),
    ("examples a str", lambda m: head_stats.head_stats(m["reversal"], "reversal", "abc"), TypeError, "list of"),
    ("example too short", lambda m: head_stats.pattern_scores(m["reversal"], "reversal", [("a",)]), ValueError, "2"),
    ("pattern examples empty", lambda m: head_stats.pattern_scores(m["reversal"], "reversal", []), ValueError, "one"),
    # normalized_entropy: tensors of the right kinds
    ("weights a list", lambda m: head_stats.normalized_entropy(W.tolist(), KEEP), TypeError, "weights"),
    ("weights ints", lambda m: head_stats.normalized_entropy(W.long(), KEEP), TypeError, "floating"),
    ("keep a list", lambda m: head_stats.normalized_entropy(W, KEEP.tolist()), TypeError, "keep must be a bool"),
    ("keep floats", lambda m: head_stats.normalized_entropy(W, KEEP.float()), TypeError, "keep must be a bool"),
    ("query_real a list", lambda m: head_stats.normalized_entropy(W, KEEP, [[True] * 4] * 2), TypeError, "query_real"),
    (
        "query_real shape",
        lambda m: head_stats.normalized_entropy(W, KEEP, torch.ones(3, dtype=torch.bool)),
        ValueError,
        "query_real must have shape (B, Q) = (2, 4)",
    ),
    # role_labels / stats_table / plot_head_stats: head_stats' dict and labels that fit it
    ("stats of lists", lambda m: head_stats.role_labels({k: [[0.5]] for k in head_stats.STAT_KEYS}), TypeError, "list"),
    (
        "stats 1-D",
        lambda m: head_stats.role_labels({k: torch.rand(3) for k in head_stats.STAT_KEYS}),
        ValueError,
        "(3,)",
    ),
    (
        "stats of two shapes",
        lambda m: head_stats.role_labels({**_stats(), "self": torch.rand(1, 3)}),
        ValueError,
        "'self': (1, 3)",
    ),
    ("stats not a dict", lambda m: head_stats.stats_table([1], ["a"]), TypeError, "stats must be"),
    ("layer_names a str", lambda m: head_stats.stats_table(_stats(), "enc.0.self"), TypeError, "layer_names"),
    ("roles of the wrong shape", lambda m: head_stats.stats_table(_stats(), ["a"], [["x"]]), ValueError, "roles"),
    ("unknown column", lambda m: head_stats.stats_table(_stats(), ["a"], columns=["zzz"]), ValueError, "'zzz'"),
    (
        "columns a str",
        lambda m: head_stats.plot_head_stats(_stats(), ["a"], [["x"] * 2], "entropy", "t"),
        TypeError,
        "columns",
    ),
    ("no columns", lambda m: head_stats.plot_head_stats(_stats(), ["a"], [["x"] * 2], [], "t"), ValueError, "columns"),
    (
        "too few layer names",
        lambda m: head_stats.plot_head_stats(_stats(), [], [["x"] * 2], ["entropy"], "t"),
        ValueError,
        "0 layer names",
    ),
]


@pytest.mark.parametrize("call, error, words", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_named_before_anything_is_computed(models, call, error, words):
    figures = plt.get_fignums()
    with pytest.raises(error) as info:
        call(models)
    assert words in str(info.value)
    assert plt.get_fignums() == figures
