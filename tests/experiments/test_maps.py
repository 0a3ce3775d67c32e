"""mha_tutorial.analysis.maps on pruned models and on bad input: maps of the heads that are left, numbered as before
pruning; a clear TypeError / ValueError naming the argument otherwise, raised before the model runs."""

from __future__ import annotations

import pytest
import torch

from mha_tutorial.analysis import maps as attention_maps
from mha_tutorial.analysis import pruning
from mha_tutorial.models.tasks import load_split


def _titles(fig):
    return [ax.get_title() for ax in fig.axes if ax.images]


# ============================================================================ pruned models
def test_collect_from_a_pruned_model_keeps_the_remaining_heads_and_their_numbers(models):
    model = models["dates"]
    pruned = pruning.pruned_copy(model, {"enc.0.self": [0, 1, 2, 3], "dec.0.cross": [0, 2]})
    example = load_split("dates")[0]
    full = attention_maps.collect_attention(model, "dates", example)
    maps = attention_maps.collect_attention(pruned, "dates", example)
    assert [tuple(w.shape[:1]) for w in maps.weights] == [(0,), (4,), (4,), (2,)]
    assert maps.head_ids == [[], [0, 1, 2, 3], [0, 1, 2, 3], [1, 3]]
    assert full.head_ids == [[0, 1, 2, 3]] * 4
    # The first encoder layer is gone, so the later layers differ; cross-attention's heads 1 and 3 still exist.
    cross = maps.select("dec.0.cross")
    assert cross.head_ids == [[1, 3]] and cross.weights[0].shape == (2, 10, full.weights[3].shape[2])
    fig = maps.plot(title="pruned")
    titles = _titles(fig)
    assert "dec.0.cross · head 1" in titles and "dec.0.cross · head 3" in titles
    assert "dec.0.cross · head 0" not in titles and not any(t.startswith("enc.0.self") for t in titles)
    assert any("enc.0.self: no heads left" in t.get_text() for ax in fig.axes for t in ax.texts)


def test_average_of_a_pruned_model_equals_the_full_models_average_on_its_heads(models):
    model = models["reversal"]  # one layer: the remaining heads' weights do not depend on the pruned ones
    rows = load_split("reversal")[:30]
    full = attention_maps.average_attention(model, "reversal", rows, batch_size=7)
    maps = attention_maps.average_attention(pruning.pruned_copy(model, {0: [0, 2]}), "reversal", rows, batch_size=7)
    assert maps.head_ids == [[1, 3]]
    torch.testing.assert_close(maps.weights[0], full.weights[0][[1, 3]], atol=1e-6, rtol=1e-5)
    assert _titles(maps.plot()) == ["enc.0.self · head 1", "enc.0.self · head 3"]


def test_a_model_with_every_head_pruned_has_nothing_to_draw(models):
    pruned = pruning.pruned_copy(models["reversal"], {0: [0, 1, 2, 3]})
    maps = attention_maps.collect_attention(pruned, "reversal", load_split("reversal")[0])
    assert maps.weights[0].shape == (0, 10, 10)
    with pytest.raises(ValueError, match="nothing to draw: every layer has 0 heads"):
        maps.plot()


def test_plot_checks_head_ids_and_its_keywords(models):
    maps = attention_maps.collect_attention(models["reversal"], "reversal", load_split("reversal")[0])
    with pytest.raises(ValueError, match="head_ids"):
        attention_maps.AttentionMaps(**{**maps.__dict__, "head_ids": [[0, 0, 1, 2]]}).plot()
    with pytest.raises(TypeError, match="layer_names"):
        maps.plot(layer_names=["x"])  # given by the maps themselves, as before
    with pytest.raises(TypeError, match="colour"):
        maps.plot(colour="red")


# ============================================================================ bad input
ROW = ("abcdefghij", "jihgfedcba")
DATE = ("21 Nov 2026", "2026-11-21", "{d} {Mon} {Y}")
collect, average = attention_maps.collect_attention, attention_maps.average_attention

BAD_CALLS = [  # (what is wrong, call on the models, error, words of its message)
    # a model of this package, of the task's kind
    ("model None", lambda m: collect(None, "reversal", ROW), TypeError, "model must be"),
    ("other task's model", lambda m: collect(m["reversal"], "dates", DATE), ValueError, "runs a model of kind"),
    # one example: a tuple of the task's strings
    ("example None", lambda m: collect(m["reversal"], "reversal", None), TypeError, "example must be a tuple"),
    ("example str", lambda m: collect(m["reversal"], "reversal", "abc"), TypeError, "example must be a tuple"),
    ("example empty", lambda m: collect(m["reversal"], "reversal", ()), ValueError, "2 strings"),
    ("example of ints", lambda m: collect(m["reversal"], "reversal", (1, 2)), TypeError, "strings"),
    # pad_to
    ("pad_to str", lambda m: collect(m["dates"], "dates", DATE, pad_to="30"), TypeError, "pad_to"),
    ("pad_to past max_len", lambda m: collect(m["dates"], "dates", DATE, pad_to=99), ValueError, "max_len=32"),
    # examples: a non-empty list of rows
    ("examples None", lambda m: average(m["reversal"], "reversal", None), TypeError, "list of reversal examples"),
    ("examples empty", lambda m: average(m["reversal"], "reversal", []), ValueError, "at least one example"),
    ("examples of strings", lambda m: average(m["reversal"], "reversal", ["abc"]), TypeError, "example 0"),
    ("examples a tensor", lambda m: average(m["reversal"], "reversal", torch.zeros(2, 10)), TypeError, "Tensor"),
    # batch sizes
    ("batch_size 0", lambda m: average(m["reversal"], "reversal", [ROW], batch_size=0), ValueError, "batch_size"),
    ("batch_size < 0", lambda m: average(m["reversal"], "reversal", [ROW], batch_size=-3), ValueError, "batch_size"),
    ("batch_size 2.5", lambda m: average(m["reversal"], "reversal", [ROW], batch_size=2.5), TypeError, "batch_size"),
    ("batch_size True", lambda m: average(m["reversal"], "reversal", [ROW], batch_size=True), TypeError, "batch_size"),
    # layer_masks takes a Batch; date labels take a template
    ("batch a list", lambda m: attention_maps.layer_masks(m["reversal"], "reversal", [ROW]), TypeError, "Batch"),
    ("date format int", lambda m: attention_maps.date_field_labels(5), TypeError, "fmt"),
    ("date format unknown field", lambda m: attention_maps.date_field_labels("{zz}.{Y}"), ValueError, "'zz'"),
]


@pytest.mark.parametrize("call, error, words", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_named_before_the_model_runs(models, call, error, words):
    for model in models.values():
        for _, layer in model.attention_layers():
            layer.attention_weights = None
    with pytest.raises(error) as info:
        call(models)
    assert words in str(info.value)
    assert all(layer.attention_weights is None for m in models.values() for _, layer in m.attention_layers())


def test_select_needs_a_layer_name(models):
    maps = collect(models["reversal"], "reversal", ROW)
    with pytest.raises(ValueError, match="at least one layer name"):
        maps.select()
    with pytest.raises(TypeError, match="strings"):
        maps.select(0)
