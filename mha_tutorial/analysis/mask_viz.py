"""Helpers of notebook 02 (masking): heatmaps with hatched masked cells, and naming a fully masked weight row.

They keep the lesson's cells short; the lesson shows what they draw or print, not how.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

MASKED_COLOUR, HATCH_COLOUR = "#e3e3e3", "#999999"


def masked_legend():
    """The legend patch of every masked heatmap: hatched grey = weight exactly 0."""
    from matplotlib.patches import Patch

    return Patch(facecolor=MASKED_COLOUR, edgecolor=HATCH_COLOUR, hatch="///", label="masked: weight exactly 0")


def plot_masked_weights(weights, keep, labels: Sequence[str], title: str, ax, grey_label: str = "<pad>") -> None:
    """Heatmap of one (Q, K) weight matrix on ``ax``; cells where ``keep`` is False are hatched grey, not coloured.

    ``labels`` name the positions (ticks of both axes); ticks equal to ``grey_label`` are drawn in grey.
    """
    import seaborn as sns

    if not isinstance(weights, torch.Tensor) or weights.dim() != 2:
        raise ValueError(f"weights must be a (Q, K) tensor, got {getattr(weights, 'shape', type(weights))}")
    if len(labels) != weights.shape[-1]:
        raise ValueError(f"need {weights.shape[-1]} labels, got {len(labels)}")
    hidden = ~torch.as_tensor(keep, dtype=torch.bool).expand(weights.shape).cpu().numpy()  # (Q, K), True = masked
    ax.set_facecolor(MASKED_COLOUR)  # masked cells are not drawn, so the hatched background shows
    ax.patch.set_hatch("///")
    ax.patch.set_edgecolor(HATCH_COLOUR)
    sns.heatmap(
        weights.detach().float().cpu().numpy(),
        mask=hidden,
        ax=ax,
        vmin=0,
        vmax=1,
        cmap="viridis",
        annot=True,
        fmt=".2f",
        annot_kws={"size": 8},
        square=True,
        cbar=False,
        linewidths=0.5,
        linecolor="white",
        xticklabels=labels[: weights.shape[-1]],
        yticklabels=labels[: weights.shape[0]],
    )
    ax.set(title=title, xlabel="key", ylabel="query")
    ax.tick_params(axis="x", rotation=45)
    ax.tick_params(axis="y", rotation=0)
    for label in ax.get_xticklabels() + ax.get_yticklabels():
        if label.get_text() == grey_label:
            label.set_color("grey")


def plot_masked_grid(
    weights: Sequence, keeps: Sequence, labels: Sequence, titles: Sequence[str], suptitle: str, ncols=2
):
    """Side-by-side masked heatmaps (one per (Q, K) matrix), one shared 0-1 colour bar and the hatch legend."""
    import matplotlib.pyplot as plt

    if not len(weights) == len(keeps) == len(labels) == len(titles) or not weights:
        raise ValueError("weights, keeps, labels and titles must be non-empty and of the same length")
    nrows = math.ceil(len(weights) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(5.25 * ncols, 4.8 * nrows + 0.4), layout="constrained", squeeze=False
    )
    for w, keep, lab, title, ax in zip(weights, keeps, labels, titles, axes.flat, strict=False):
        plot_masked_weights(w, keep, lab, title, ax)
    for ax in axes.flat[len(weights) :]:
        ax.set_visible(False)
    colours = plt.cm.ScalarMappable(norm=plt.Normalize(0, 1), cmap="viridis")
    fig.colorbar(colours, ax=axes, shrink=0.6, label="attention weight")
    fig.legend(handles=[masked_legend()], loc="outside lower center", fontsize=11)
    if suptitle:
        fig.suptitle(suptitle, fontsize=13)
    return fig


def describe_row(row: torch.Tensor, atol: float = 2e-3) -> str:
    """Name a weight row: "NaN", "zeros ✓", "uniform 1/K" (within ``atol``, which covers bfloat16's rounding of
    1/K) or "other"."""
    if not isinstance(row, torch.Tensor) or row.dim() != 1 or row.numel() == 0:
        raise ValueError(f"row must be a non-empty 1-D tensor, got {getattr(row, 'shape', type(row))}")
    row = row.detach().float()
    if torch.isnan(row).any():
        return "NaN"
    if (row == 0).all():
        return "zeros ✓"
    if torch.allclose(row, torch.full_like(row, 1 / row.numel()), atol=atol):
        return f"uniform 1/{row.numel()}"
    return "other"


def fully_masked_table(methods: dict[str, Callable], scores, keep, dtypes, row=(0, 1)):
    """Run every ``method(scores, keep)`` in every dtype and name the weight row at index ``row``.

    Returns ``(table, errors)``: a pandas DataFrame (methods x dtypes) whose entries are ``describe_row`` names,
    "RuntimeError", or a name with the result's dtype in brackets when the method changed the dtype; and
    ``{method: error message}``.
    """
    import pandas as pd

    table, errors = {}, {}
    for dtype in dtypes:
        column = {}
        for name, method in methods.items():
            try:
                w = method(scores.to(dtype), keep)
            except RuntimeError as err:
                column[name], errors[name] = "RuntimeError", str(err)
                continue
            column[name] = describe_row(w[row]) + ("" if w.dtype == dtype else f" ({str(w.dtype)[6:]})")
        table[str(dtype)[6:]] = column
    return pd.DataFrame(table), errors
