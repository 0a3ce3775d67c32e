"""mha_tutorial.analysis.mha_figures: notebook 04's figures draw the data they are given, in readable type, and refuse
malformed input with a clear error."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from mha_tutorial import figures
from mha_tutorial.analysis import mha_figures

WORDS = ["the", "cat", "sat", "on", "mat"]


def _swap_inputs():
    attn = {"one head": torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0, 0.0]), "head 0": torch.eye(6)[1]}
    plain = {"one head": torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0]), "two heads": torch.eye(10)[1] + torch.eye(10)[8]}
    swapped = {"one head": plain["one head"].clone(), "two heads": torch.eye(10)[3] + torch.eye(10)[6]}
    return attn, plain, swapped


def test_plot_swap_draws_one_bar_per_weight_and_one_row_per_output_with_blank_padding():
    attn, plain, swapped = _swap_inputs()
    fig = mha_figures.plot_swap(attn, plain, swapped, WORDS)
    left, right = fig.axes[0], fig.axes[1]
    heights = [p.get_height() for p in left.patches]
    assert heights == pytest.approx(torch.cat(list(attn.values())).tolist())  # the bars are the weights, in order
    shown = np.ma.getdata(right.images[0].get_array())  # (rows, features)
    assert shown.shape == (4, 10)
    assert np.allclose(shown[0, :5], plain["one head"].numpy()) and np.isnan(shown[0, 5:]).all()  # one head: blank
    assert np.allclose(shown[3], swapped["two heads"].numpy())
    assert [t.get_text() for t in right.get_yticklabels()][3] == "two heads: on sat cat"
    sizes = [t.get_fontsize() for ax in (left, right) for t in ax.get_xticklabels() + ax.get_yticklabels()]
    assert min(sizes) >= figures.MIN_TICK_PT
    plt.close(fig)


def test_plot_swap_refuses_mismatched_outputs_and_non_tensors():
    attn, plain, swapped = _swap_inputs()
    with pytest.raises(ValueError, match="same names"):
        mha_figures.plot_swap(attn, plain, {"one head": swapped["one head"]}, WORDS)
    with pytest.raises(TypeError, match="torch.Tensor"):
        mha_figures.plot_swap({"one head": [0.5, 0.5]}, plain, swapped, WORDS)


def test_mha_schematic_puts_every_shape_on_the_figure_in_readable_type():
    fig = mha_figures.mha_schematic()
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    for shape in ("(B, T, D)", "Q (B, T, H·d)", "k (B, H, T, d)", "(B, H, T, d)", "(B, T, H·d)"):
        assert shape in texts
    assert texts.count("split into\nH heads") == 3 and "concat\nheads" in texts
    assert min(t.get_fontsize() for t in ax.texts) >= figures.MIN_TICK_PT
    plt.close(fig)


def test_plot_heads_draws_each_map_on_one_shared_scale():
    g = torch.Generator().manual_seed(0)
    rows = [torch.softmax(torch.randn(3, 4, 4, generator=g), -1) for _ in range(2)]  # (H, Q, K) each
    fig = mha_figures.plot_heads(rows, ["a", "b"], [["x", "y", "z"]] * 2, list("wxyz"))
    panels = [ax for ax in fig.axes if ax.collections and ax.get_label() != "<colorbar>"]
    assert len(panels) == 6
    first = panels[3].collections[0]  # row 1, head 0
    assert np.allclose(np.asarray(first.get_array()).reshape(4, 4), rows[1][0].numpy())
    assert all(p.collections[0].get_clim() == (0, 1) for p in panels)
    assert panels[4].get_title() == "b\nhead 1: y"
    assert math.isclose(min(t.get_fontsize() for t in panels[0].get_xticklabels()), figures.MIN_TICK_PT)
    plt.close(fig)


def test_plot_heads_refuses_rows_of_different_shapes_or_counts():
    rows = [torch.rand(2, 3, 3), torch.rand(2, 3, 4)]
    with pytest.raises(ValueError, match="one shape"):
        mha_figures.plot_heads(rows, ["a", "b"], [["x", "y"]] * 2, list("abc"))
    with pytest.raises(ValueError, match="one length"):
        mha_figures.plot_heads(rows[:1], ["a", "b"], [["x", "y"]], list("abc"))
