"""Notebook 14's figure helpers on tiny made-up inputs: labels, colour bars, hatching, log scales (no model)."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.colors import LogNorm

from mha_tutorial.pretrained import smollm_figures as figs


def causal(n: int) -> torch.Tensor:
    """(n, n) causal weights spread evenly over the visible keys."""
    return torch.ones(n, n).tril() / torch.arange(1, n + 1)[:, None]


def colourbar_labels(fig) -> list[str]:
    return [ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_causal_map_hatches_the_later_keys_and_labels_everything():
    fig = figs.plot_causal_map(causal(4), "a head", labels=["a", "␣", "b", "↵"])
    ax = fig.axes[0]
    assert ax.patch.get_hatch() == "///"
    image = ax.get_images()[0]
    assert image.get_array().mask[0, 1] and not image.get_array().mask[1, 0]  # later key masked, earlier drawn
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "␣", "b", "↵"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("key", "query", "a head")
    assert colourbar_labels(fig) == ["attention weight (0-1)"]
    assert fig.legends and "masked" in fig.legends[0].get_texts()[0].get_text()
    plt.close(fig)


def test_causal_map_refuses_a_non_square_map_and_wrong_labels():
    with pytest.raises(ValueError, match="square"):
        figs.plot_causal_map(torch.ones(2, 3), "x")
    with pytest.raises(ValueError, match="one label per position"):
        figs.plot_causal_map(causal(3), "x", labels=["a"])


def test_sink_removed_renormalises_without_key_0_on_a_shared_scale():
    w = causal(5)
    fig = figs.plot_sink_removed(w, "title")
    left, right = fig.axes[0], fig.axes[1]
    assert (left.get_title(), right.get_title()) == ("as computed", "key 0 removed, rows renormalised")
    shown = right.get_images()[0].get_array()
    assert shown.shape == (4, 4)
    assert np.allclose(shown.filled(0).sum(-1), 1.0)  # each row of the right panel sums to 1
    assert right.get_images()[0].get_extent() == [0.5, 4.5, 4.5, 0.5]  # positions 1 .. 4
    assert left.get_images()[0].get_clim() == right.get_images()[0].get_clim() == (0, 1)
    assert colourbar_labels(fig) == ["attention weight (0-1, shared)"]
    assert all(ax.patch.get_hatch() == "///" for ax in (left, right))
    plt.close(fig)


def test_layer_head_map_puts_layers_on_x_with_a_colour_bar():
    fig = figs.plot_layer_head_map(torch.rand(6, 3), "sinks", "weight on key 0")
    ax = fig.axes[0]
    assert ax.get_images()[0].get_array().shape == (3, 6)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("layer", "query head")
    assert colourbar_labels(fig) == ["weight on key 0"]
    with pytest.raises(ValueError, match="layers, heads"):
        figs.plot_layer_head_map(torch.rand(6), "x", "y")
    plt.close(fig)


def test_importance_is_on_a_shared_log_scale_with_negatives_masked():
    heads = torch.tensor([[0.5, -0.2, 100.0], [1e-5, 2.0, 0.1]])
    groups = torch.tensor([[200.0], [3.0]])
    fig = figs.plot_importance(heads, groups)
    images = [ax.get_images()[0] for ax in fig.axes[:2]]
    assert all(isinstance(im.norm, LogNorm) for im in images)
    assert images[0].norm.vmax == images[1].norm.vmax == 200.0
    data = images[0].get_array()
    assert data.mask[0, 1] and not data.mask[1, 0]  # the negative rise is masked (grey), the tiny one is not
    assert data[1, 0] == pytest.approx(1e-3)  # clipped to the scale's bottom
    assert [ax.get_xlabel() for ax in fig.axes[:2]] == ["query head", "K/V group"]
    assert "log" in colourbar_labels(fig)[0]
    plt.close(fig)


CURVE = {"counts": [0, 2, 4], "importance": [10.0, 12.0, 50.0], "random": [[10.0, 20.0, 80.0], [10.0, 15.0, 90.0]]}


def test_pruning_curves_draw_a_band_lines_and_a_log_axis():
    fig = figs.plot_pruning_curves({"head": CURVE, "group": CURVE}, {"head": 4, "group": 4}, 10.0, 100.0)
    left = fig.axes[0]
    assert left.get_yscale() == "log" and left.get_ylabel() == "held-out perplexity (log)"
    assert left.collections, "the random orders' band is missing"
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert set(labels) == {"2 random orders", "least important first", "no unit off", "uniform guess"}
    assert [ax.get_xlabel() for ax in fig.axes] == ["fraction of heads off", "fraction of groups off"]
    plt.close(fig)


def test_curve_table_prints_each_count_with_the_random_range():
    lines = figs.curve_table(CURVE, "head", 4).splitlines()
    assert lines[0] == "heads off | least important first | 2 random orders (min - max)"
    assert lines[2] == "  2 of 4 |     12.00 |     15.00 - 20.00"


def test_cost_scatter_draws_threshold_band_median_and_clips_high_rises():
    rise = torch.tensor([[0.0, 5.0], [0.2, -0.1]])  # (L, H): 5.0 lies above top = 1.5
    score = torch.tensor([[0.1, 0.9], [0.6, 0.2]])
    tests = {"sink score": (score, 0.5, 0.2, 0.1, 0.3), "previous": (score.flip(0), 0.3, 0.0, -0.1, 0.4)}
    fig = figs.plot_cost_scatter(tests, rise, [(0, 1)])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["L0 H1"]
    assert ax.texts[0].xy == pytest.approx((0.9, 1.5))  # the clipped head is named at the top edge
    assert ax.get_yscale() == "linear" and ax.get_ylim()[1] == pytest.approx(1.6)
    dots, triangles = ax.collections[0].get_offsets(), ax.collections[1].get_offsets()
    assert len(dots) == 3 and np.allclose(triangles, [[0.9, 1.5]])
    assert ax.lines[0].get_xdata()[0] == 0.5  # the threshold
    median = [line for line in ax.lines if line.get_label() == "the set's median"][0]
    assert list(median.get_ydata()) == [0.2, 0.2]
    band = ax.collections[2].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(0.1) and band.max() == pytest.approx(0.3)
    assert colourbar_labels(fig) == ["layer"]
    plt.close(fig)


def test_visible_marks_spaces_and_newlines():
    assert figs.visible(["import", "  ", "\n", "a\nb"]) == ["import", "␣␣", "↵", "a↵b"]
