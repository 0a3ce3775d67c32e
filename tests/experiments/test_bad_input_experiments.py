"""Bad input at the experiments' entry points (tiny models, tasks, training, pruning, plots, head statistics): a clear
ValueError or TypeError naming the value, shape or type, raised before anything is computed, or a correct result."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from mha_tutorial import ModelConfig, build_model, get_task, load_pretrained, load_split, random_orders, train
from mha_tutorial.analysis import head_stats, pruning, viz
from mha_tutorial.models.train import TrainSettings
from mha_tutorial.pretrained import bert_heads, retrieval

from testkit import no_arithmetic


class _NoTorch(TorchFunctionMode):
    """Inside this block any torch function (a tensor built, any arithmetic) fails the test."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        raise AssertionError(f"torch ran {func} before the input was validated")


def tiny(kind: str):
    sizes = {"encoder": (5, 7, 1, 0), "decoder": (0, 7, 0, 1), "encoder_decoder": (5, 7, 1, 1)}[kind]
    src, tgt, enc, dec = sizes
    config = ModelConfig(kind, src, tgt, num_hiddens=8, num_heads=2, num_enc_layers=enc, num_dec_layers=dec, max_len=6)
    return build_model(config).eval()


# --------------------------------------------------------------------------- model.py


@pytest.mark.parametrize("config", ["encoder", None, 5, [("kind", "encoder")]])
def test_build_model_names_what_is_not_a_config(config):
    with pytest.raises(TypeError, match=f"build_model takes a ModelConfig .*got {type(config).__name__}"):
        build_model(config)  # was AttributeError: no .kind


@pytest.mark.parametrize(
    "field, value, error, pattern",
    [
        ("src_vocab_size", 5.5, TypeError, r"ModelConfig.src_vocab_size must be an int, got 5.5 \(float\)"),
        ("num_hiddens", "64", TypeError, r"ModelConfig.num_hiddens must be an int, got '64' \(str\)"),
        ("num_heads", True, TypeError, r"ModelConfig.num_heads must be an int, got True \(bool\)"),
        ("max_len", 3.0, TypeError, "ModelConfig.max_len must be an int, got 3.0"),
        ("dropout", "0.1", TypeError, "ModelConfig.dropout must be a number in .*got '0.1'"),
        ("dropout", 2.0, ValueError, r"ModelConfig.dropout must lie in \[0, 1\), got 2.0"),
        ("bias", "yes", TypeError, "ModelConfig.bias must be True or False, got 'yes'"),
    ],
)
def test_model_config_names_fields_of_the_wrong_type(field, value, error, pattern):
    with pytest.raises(error, match=pattern):
        ModelConfig(**{"kind": "encoder", "src_vocab_size": 5, "tgt_vocab_size": 5, field: value})


@pytest.mark.parametrize(
    "kind, call, pattern",
    [
        (
            "encoder",
            lambda m: m(torch.tensor([[1, 5]])),
            r"\[0, 4\] \(a vocabulary of 5 tokens\), got values from 1 to 5",
        ),
        ("encoder", lambda m: m(torch.tensor([[1, -1]])), r"\[0, 4\] .*got values from -1 to 1"),
        (
            "decoder",
            lambda m: m(torch.tensor([[1, 7]])),
            r"\[0, 6\] \(a vocabulary of 7 tokens\), got values from 1 to 7",
        ),
        ("encoder_decoder", lambda m: m(torch.tensor([[1, 9]]), torch.tensor([[1]])), r"\[0, 4\] .*from 1 to 9"),
        ("encoder_decoder", lambda m: m(torch.tensor([[1, 2]]), torch.tensor([[8]])), r"\[0, 6\] .*from 8 to 8"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_named(kind, call, pattern):
    model = tiny(kind)
    with no_arithmetic(), pytest.raises(ValueError, match=f"token ids must lie in {pattern}"):
        call(model)  # was IndexError: index out of range in self


@pytest.mark.parametrize("kind", ["ndarray", "list"])
def test_token_ids_that_are_not_a_tensor_are_named(kind):
    ids = np.zeros((2, 3), dtype=np.int64) if kind == "ndarray" else [[1, 2]]
    with (
        no_arithmetic(),
        pytest.raises(TypeError, match=rf"token ids must be an integer tensor .*got (numpy\.)?{kind}"),
    ):
        tiny("encoder")(ids)


def test_encoder_decoder_names_source_and_target_of_other_batch_sizes():
    with no_arithmetic(), pytest.raises(ValueError, match=r"same batch size, got shapes \(2, 3\) and \(3, 2\)"):
        tiny("encoder_decoder")(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long))


@pytest.mark.parametrize("B, T", [(2, 0), (0, 3)], ids=["no_steps", "no_examples"])
def test_empty_inputs_give_empty_logits(B, T):
    ids = torch.zeros(B, T, dtype=torch.long)
    lens = torch.full((B,), T)
    for logits in (tiny("encoder")(ids, lens), tiny("decoder")(ids), tiny("encoder_decoder")(ids, ids, lens)):
        assert logits.shape == (B, T, 7) and torch.isfinite(logits).all()  # T = 0 with lengths was IndexError


def test_an_empty_source_is_a_fully_masked_source():
    model = tiny("encoder_decoder")
    tgt, none = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([0, 0])
    empty = model(torch.zeros(2, 0, dtype=torch.long), tgt, none)  # was IndexError from amax
    assert torch.isfinite(empty).all()
    torch.testing.assert_close(empty, model(torch.tensor([[1], [2]]), tgt, none))  # one key, hidden: the same


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(num_steps=2.5, bos_id=0), TypeError, r"num_steps must be an int >= 0, got 2.5 \(float\)"),
        (dict(num_steps=-1, bos_id=0), ValueError, "num_steps must be an int >= 0, got -1"),
        (dict(num_steps=2, bos_id=9), ValueError, r"bos_id must lie in \[0, 6\] .*got 9"),
        (dict(num_steps=2, bos_id="a"), TypeError, r"bos_id must be an int .*got 'a' \(str\)"),
    ],
)
def test_greedy_decode_names_bad_arguments(kwargs, error, pattern):
    with no_arithmetic(), pytest.raises(error, match=pattern):
        tiny("encoder_decoder").greedy_decode(torch.zeros(2, 3, dtype=torch.long), **kwargs)


# --------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("name", [5, ["reversal"], None])
def test_task_and_split_names_that_are_not_strings_are_named(name):
    with pytest.raises(TypeError, match=f"task name must be a string, got .*{type(name).__name__}"):
        get_task(name)  # a list was TypeError: unhashable type
    with pytest.raises(TypeError, match=f"split must be a string, got .*{type(name).__name__}"):
        load_split("reversal", name)


@pytest.mark.parametrize(
    "name, example, pattern",
    [
        ("reversal", ("", ""), "example 0 has an empty source and target"),  # was a float tensor, then ValueError
        ("induction", ("",), "example 0 has an empty sequence"),  # counted every <pad> position in the loss
        ("dates", ("", "2020-01-01", "{d}"), "example 0 has an empty source"),
        ("induction", ("AA",), r"a run needs at least 2 letters .*got 'AA'"),  # was ZeroDivisionError in evaluate
    ],
)
def test_collate_refuses_examples_with_nothing_to_learn(name, example, pattern):
    with _NoTorch(), pytest.raises(ValueError, match=pattern):
        get_task(name).collate([example])


def test_task_helpers_name_bad_arguments():
    task = get_task("reversal")
    with pytest.raises(TypeError, match="reversal: decode takes a list or tensor of ids, got NoneType"):
        task.decode(None)
    with pytest.raises(TypeError, match=r"n must be an int >= 0, got 2.5 \(float\)"):
        task.sample(2.5, seed=0)
    with pytest.raises(ValueError, match="n must be an int >= 0, got -1"):
        task.sample(-1, seed=0)
    with pytest.raises(TypeError, match="generator must be None or a torch.Generator, got str"):
        task.make_batch(2, "seed 0")
    batch = task.collate(load_split("reversal")[:2])
    with pytest.raises(TypeError, match="model must be a model of this package .*got str"):
        task.loss_and_accuracy("model", batch)
    with pytest.raises(TypeError, match="batch must be a Batch .*got dict"):
        task.loss_and_accuracy(tiny("encoder"), {"src": batch.src})


# --------------------------------------------------------------------------- train.py


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(config="small"), TypeError, "config must be a ModelConfig .*got str"),
        (dict(config=get_task("dates").default_config()), ValueError, "runs a model of kind 'encoder', got a config"),
        (dict(steps=2.5), TypeError, r"TrainSettings.steps must be a positive int, got 2.5 \(float\)"),
        (dict(steps=-1), ValueError, "TrainSettings.steps must be a positive int, got -1"),
        (dict(lr="fast"), TypeError, "TrainSettings.lr must be a number > 0, got 'fast'"),
        (dict(eval_every=0.5), TypeError, "TrainSettings.eval_every must be an int >= 0, got 0.5"),
        (dict(foo=1), TypeError, r"unknown training settings \['foo'\]"),
        (dict(seed="a"), TypeError, r"seed must be an int, got 'a' \(str\)"),
        (dict(device=5), TypeError, "device must be None, a torch.device or a name .*got int"),
        (dict(num_threads="2"), TypeError, "num_threads must be a positive int, got '2'"),
        (dict(settings={"steps": 1}), TypeError, "settings must be a TrainSettings .*got dict"),
    ],
)
def test_train_names_bad_arguments_before_building_a_model(kwargs, error, pattern):
    with no_arithmetic(), pytest.raises(error, match=pattern):
        train("reversal", progress=False, **kwargs)


def test_train_settings_and_load_pretrained_name_bad_values():
    with pytest.raises(ValueError, match="TrainSettings.grad_clip must be a finite number > 0, got inf"):
        TrainSettings(steps=1, batch_size=1, lr=1e-3, warmup=0, grad_clip=float("inf"))
    with pytest.raises(ValueError, match="TrainSettings.warmup must be an int >= 0, got -1"):
        dataclasses.replace(TrainSettings(steps=1, batch_size=1, lr=1e-3, warmup=0), warmup=-1)
    with pytest.raises(TypeError, match="device must be None, a torch.device or a name .*got int"):
        load_pretrained("reversal", device=5)


# --------------------------------------------------------------------------- pruning.py


@pytest.mark.parametrize("head_mask", [[[1.0] * 4], np.ones((1, 4))], ids=["list", "ndarray"])
def test_gradient_importance_names_a_head_mask_that_is_not_a_tensor(models, head_mask):
    kind = type(head_mask).__name__
    with no_arithmetic(), pytest.raises(TypeError, match=rf"head_mask must be a tensor of shape \(1, 4\), got {kind}"):
        pruning.gradient_importance(
            models["reversal"], "reversal", examples=load_split("reversal")[:2], head_mask=head_mask
        )


@pytest.mark.parametrize("measure", ["gradient_importance", "ablation", "pruning_curve"])
def test_pruning_measures_name_a_model_for_another_task(models, measure):
    rows = load_split("reversal")[:2]
    extra = {"order": [(0, 1)]} if measure == "pruning_curve" else {}
    with (
        no_arithmetic(),
        pytest.raises(ValueError, match="task 'reversal' runs a model of kind 'encoder', got one of kind 'decoder'"),
    ):
        getattr(pruning, measure)(models["induction"], "reversal", examples=rows, **extra)
    with no_arithmetic(), pytest.raises(TypeError, match="model must be a model of this package .*got str"):
        getattr(pruning, measure)("model", "reversal", examples=rows, **extra)


@pytest.mark.parametrize(
    "call, error, pattern",
    [
        (
            lambda: pruning.order_mask((1, 4), [1, 2]),
            TypeError,
            r"order must hold \(layer, head\) pairs of ints, got \[1, 2\]",
        ),
        (lambda: pruning.order_mask((1, 4), [(0, 1.5)]), TypeError, r"pairs of ints, got \[\(0, 1.5\)\]"),
        (lambda: pruning.order_mask((1, 4), "ab"), TypeError, "order must be a list of .* got str 'ab'"),
        (lambda: pruning.random_order("model", 0), TypeError, "a model of this package or a .* pair, got str"),
        (lambda: pruning.normalize_per_layer([[1.0, 2.0]]), TypeError, "importance must be a real tensor, got list"),
        (lambda: pruning.normalize_per_layer(torch.ones(3)), ValueError, r"\(layers, heads\) table, got shape \(3,\)"),
        (
            lambda: pruning.order_from_scores(np.ones((1, 2))),
            TypeError,
            "scores must be a real tensor, got numpy.ndarray",
        ),
        (lambda: pruning.rank_correlation([1, 2], torch.ones(2)), TypeError, "a must be a real tensor, got list"),
        (lambda: pruning.area_under_curve([1.0, 0.5], [0, 1, 2]), ValueError, "3 counts for 2 values"),
        (lambda: pruning.area_under_curve([1.0, 0.5], [1, 1]), ValueError, r"strictly increasing, got \[1, 1\]"),
        (lambda: pruning.area_under_curve("ab"), TypeError, "values must be a list or tensor of numbers, got str"),
        (lambda: pruning.heads_prunable(torch.tensor([])), ValueError, "at least 1 point.*length 0"),
        (
            lambda: pruning.prune_attention_heads("layer", [0]),
            TypeError,
            "layer must be a MultiHeadAttention .*got str",
        ),
    ],
)
def test_pruning_helpers_name_bad_arguments(call, error, pattern):
    with no_arithmetic(), pytest.raises(error, match=pattern):
        call()


def test_retrieval_helpers_name_bad_arguments():
    with pytest.raises(TypeError, match=r"sizes must be a \(layers, heads\) pair of ints, got 'ab'"):
        random_orders(2, sizes="ab")
    with pytest.raises(TypeError, match=r"layers and heads must be a positive int, got 1.5 \(float\)"):
        random_orders(2, sizes=(1.5, 2))
    with pytest.raises(TypeError, match="path must be None, a str or a pathlib.Path .*got int"):
        retrieval.load_study(5)  # was OSError: 5 read as a file descriptor
    for token in (5, None):
        with pytest.raises(TypeError, match=f"a token is a string, got {type(token).__name__}"):
            bert_heads.is_punctuation(token)


# --------------------------------------------------------------------------- viz.py and head_stats.py


@pytest.mark.parametrize(
    "layers, axis_labels, pattern",
    [
        (2, ["query", "key"], r"got 'query' for a layer"),  # was IndexError: string index out of range
        (1, ("query",), r"got 'query' for a layer"),  # one layer: read as a list of one entry per layer
        (1, (1, 2), r"got \(1, 2\) for a layer"),
    ],
)
def test_plot_head_grid_names_axis_labels_that_are_not_pairs_of_strings(layers, axis_labels, pattern):
    weights = [torch.rand(2, 3, 4).softmax(-1)] * layers
    with pytest.raises(ValueError, match=rf"axis_labels must be a \(y label, x label\) tuple of strings.*{pattern}"):
        viz.plot_head_grid(weights, list("abc"), list("defg"), axis_labels=axis_labels)


def test_plot_head_grid_names_weights_without_layers():
    with pytest.raises(ValueError, match="weights have no layers: .* got L = 0"):  # was "every layer has 0 heads"
        viz.plot_head_grid(torch.ones(0, 2, 3, 4), list("abc"), list("defg"))


@pytest.fixture(scope="module")
def stats(models):
    return head_stats.head_stats(models["reversal"], "reversal", load_split("reversal")[:3])


@pytest.mark.parametrize(
    "call, error, pattern",
    [
        (
            lambda s: head_stats.role_labels(None),
            TypeError,
            "stats must be the dict returned by head_stats, got NoneType",
        ),
        (lambda s: head_stats.role_labels(5), TypeError, "got int"),
        (
            lambda s: head_stats.role_labels(s, pattern_threshold="a"),
            TypeError,
            r"pattern_threshold must be a number, got 'a'",
        ),
        (
            lambda s: head_stats.role_labels(s, diffuse_entropy=None),
            TypeError,
            "diffuse_entropy must be a number, got None",
        ),
        (
            lambda s: head_stats.stats_table(s, ["a"], roles=[1]),
            ValueError,
            r"roles must be a list of 1 lists of 4 names",
        ),
        (
            lambda s: head_stats.stats_table(s, ["a"], decimals="x"),
            TypeError,
            r"decimals must be an int, got 'x' \(str\)",
        ),
        (
            lambda s: head_stats.plot_head_stats(s, ["a"], None, ["entropy"], "t"),
            ValueError,
            "needs roles .* roles=None",
        ),
        (lambda s: head_stats.plot_head_stats(s, ["a"], [["r"] * 4], None, "t"), ValueError, "columns=None"),
        (
            lambda s: head_stats.plot_head_stats(s, ["a"], [["r"] * 4], ["entropy"], 5),
            TypeError,
            "title must be a string, got int",
        ),
        (
            lambda s: head_stats.plot_head_stats(s, ["a"], [["r"] * 4], ["entropy"], "t", thresholds=[0.5]),
            TypeError,
            r"thresholds must be a dict \{column: value\} or None, got list",
        ),
        (
            lambda s: head_stats.plot_head_stats(s, ["a"], [["r"] * 4], ["entropy"], "t", thresholds={"entropy": "x"}),
            TypeError,
            r"thresholds must map columns to numbers, got \{'entropy': 'x'\}",
        ),
    ],
)
def test_head_statistics_name_bad_arguments(stats, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(stats)
