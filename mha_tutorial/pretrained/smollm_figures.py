"""The figures of notebook 14 (SmolLM2-135M's heads), so that its cells hold the attention code, not matplotlib.

- ``plot_causal_map``: one causal attention map, later keys hatched, optional token labels;
- ``plot_sink_removed``: one head as computed beside the same head with key 0 removed and rows renormalised;
- ``plot_layer_head_map``: one number per (layer, head), such as the sink score, on a 0-1 colour scale;
- ``plot_importance``: the perplexity rise per head and per K/V group, on a log colour scale (grey: negative);
- ``plot_pruning_curves`` and ``curve_table``: perplexity as units are switched off, beside random orders;
- ``plot_cost_scatter``: each head's perplexity rise against a pattern score, with the pattern set's threshold,
  median and random band;
- ``visible``: token pieces made visible on an axis (spaces and newlines drawn as ␣ and ↵).

Every function takes CPU tensors or nested lists and returns the matplotlib figure; nothing here runs the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..analysis.mask_viz import HATCH_COLOUR, MASKED_COLOUR, masked_legend

__all__ = [
    "curve_table",
    "plot_causal_map",
    "plot_cost_scatter",
    "plot_importance",
    "plot_layer_head_map",
    "plot_pruning_curves",
    "plot_sink_removed",
    "visible",
]


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _square(weights, name: str = "weights") -> np.ndarray:
    """A (n, n) tensor or array -> a float numpy array on the CPU; anything else raises ValueError."""
    data = weights.detach().float().cpu().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights, float)
    if data.ndim != 2 or data.shape[0] != data.shape[1] or data.shape[0] == 0:
        raise ValueError(f"{name} must be a square (n, n) map, got shape {data.shape}")
    return data


def visible(pieces: Sequence[str]) -> list[str]:
    """Token pieces as drawn on an axis: a newline as ↵; a piece of spaces only as ␣ per space."""
    return [p.replace("\n", "↵") if p.strip() else p.replace(" ", "␣").replace("\n", "↵") for p in pieces]


def draw_causal(ax, weights, first: int = 0, title: str = ""):
    """Draw one causal (n, n) map on ``ax``: rows and columns are positions first .. first + n - 1, weights on a
    0-1 viridis scale, keys after the query (masked) left undrawn over a hatched grey background."""
    data = _square(weights)
    n = data.shape[0]
    later = np.triu(np.ones((n, n), dtype=bool), k=1)  # (n, n) True = a key after its query
    ax.set_facecolor(MASKED_COLOUR)  # masked cells are not drawn, so the hatched background shows
    ax.patch.set(hatch="///", edgecolor=HATCH_COLOUR)
    edges = (first - 0.5, first + n - 0.5, first + n - 0.5, first - 0.5)  # cell k centred on position first + k
    image = ax.imshow(np.ma.masked_array(data, later), cmap="viridis", vmin=0, vmax=1, extent=edges)
    ax.set(title=title, xlabel="key position", ylabel="query position")
    return image


def plot_causal_map(weights, title: str, labels: Sequence[str] | None = None, size=(6.4, 5.8)):
    """One causal (n, n) attention map with a colour bar and the hatch legend; ``labels`` name the n positions."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    image = draw_causal(ax, weights, 0, title)
    if labels is not None:
        if len(labels) != _square(weights).shape[0]:
            raise ValueError(f"need one label per position: {_square(weights).shape[0]}, got {len(labels)}")
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set(xlabel="key", ylabel="query")
    fig.colorbar(image, ax=ax, label="attention weight (0-1)")
    fig.legend(handles=[masked_legend()], loc="outside lower right", fontsize=8)
    return fig


def plot_sink_removed(weights, title: str):
    """Two panels of one head's (n, n) map: as computed, and with key 0 removed and each row rescaled to sum to 1
    (query 0, which sees only key 0, is dropped with it). One shared 0-1 colour bar and the hatch legend."""
    data = torch.as_tensor(_square(weights))
    rest = data[1:, 1:] / data[1:, 1:].sum(-1, keepdim=True)  # (n-1, n-1): positions 1 .. n-1
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.4), layout="constrained")
    draw_causal(axes[0], data, 0, "as computed")
    image = draw_causal(axes[1], rest, 1, "key 0 removed, rows renormalised")
    fig.colorbar(image, ax=axes, label="attention weight (0-1, shared)")
    fig.legend(handles=[masked_legend()], loc="outside lower center", fontsize=8)
    fig.suptitle(title)
    return fig


def plot_layer_head_map(values, title: str, label: str, vmax: float = 1.0):
    """A (L, H) score as an image: layers along x, query heads along y, one colour bar from 0 to ``vmax``."""
    data = torch.as_tensor(values).float().cpu()
    if data.dim() != 2:
        raise ValueError(f"values must be (layers, heads), got shape {tuple(data.shape)}")
    L, H = data.shape
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.2), layout="constrained")
    image = ax.imshow(data.T.numpy(), cmap="viridis", vmin=0, vmax=vmax, aspect="auto")
    ax.set(xlabel="layer", ylabel="query head", title=title, xticks=range(0, L, 2), yticks=range(H))
    fig.colorbar(image, ax=ax, label=label)
    return fig


def plot_importance(heads, groups, title: str = "Perplexity rise, one unit off"):
    """The rise per head (L, H) and per K/V group (L, H_kv) side by side, log colour scale shared by both: rises
    below 0.001 clipped to it (black), negative rises (removal helps) grey."""
    from matplotlib.colors import LogNorm

    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [3, 1]}, layout="constrained")
    panels = [(axes[0], torch.as_tensor(heads), "query head"), (axes[1], torch.as_tensor(groups), "K/V group")]
    vmax = max(float(data.max()) for _, data, _ in panels)
    cmap = plt.get_cmap("magma").with_extremes(bad="silver")  # masked (negative) cells drawn grey
    for ax, data, what in panels:
        shown = np.ma.masked_less(data.double().cpu().numpy(), 0)  # negative rises masked
        norm = LogNorm(vmin=1e-3, vmax=vmax)
        image = ax.imshow(np.ma.maximum(shown, 1e-3), cmap=cmap, aspect="auto", norm=norm)
        ax.set(xlabel=what, ylabel="layer", title=f"one {what} off", xticks=range(data.shape[1]))
    fig.colorbar(image, ax=axes, label="rise (log scale)\ngrey: negative, removal helps")
    fig.suptitle(title)
    return fig


def plot_pruning_curves(curves: dict, totals: dict, intact: float, uniform: float):
    """Perplexity against the fraction of units off, one panel per unit (``curves``: {unit: {"counts",
    "importance", "random"}}, ``totals``: {unit: how many there are}): the importance order as a line, the random
    orders as a grey band from their minimum to their maximum, the intact model and the uniform guess as lines."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(curves), figsize=(9, 3.6), sharey=True, layout="constrained", squeeze=False)
    for ax, (unit, c) in zip(axes[0], curves.items(), strict=True):
        x = [n / totals[unit] for n in c["counts"]]
        rnd = torch.tensor(c["random"])  # (orders, counts)
        ax.fill_between(
            x, rnd.min(0).values, rnd.max(0).values, color="grey", alpha=0.3, label=f"{len(rnd)} random orders"
        )
        ax.plot(x, c["importance"], "o-", color="C3", label="least important first")
        ax.axhline(intact, color="k", ls=":", label="no unit off")
        ax.axhline(uniform, color="k", ls="--", lw=1, label="uniform guess")
        ax.set(xlabel=f"fraction of {unit}s off", title=f"{totals[unit]} {unit}s", yscale="log")
    axes[0, 0].set_ylabel("held-out perplexity (log)")
    axes[0, 0].legend(fontsize=8)
    return fig


def curve_table(curve: dict, unit: str, total: int) -> str:
    """The curve's numbers as text: units off | importance order | random orders' minimum - maximum."""
    rnd = torch.tensor(curve["random"])  # (orders, counts)
    lines = [f"{unit}s off | least important first | {len(rnd)} random orders (min - max)"]
    for i, n in enumerate(curve["counts"]):
        low, high = float(rnd[:, i].min()), float(rnd[:, i].max())
        lines.append(f"{n:>3} of {total} | {curve['importance'][i]:>9.2f} | {low:9.2f} - {high:.2f}")
    return "\n".join(lines)


def plot_cost_scatter(tests: dict, rise, marked: Sequence[tuple[int, int]] = (), top: float = 1.5):
    """Each head's rise (L, H) against each pattern score, one panel per entry of ``tests``: {name: (score (L, H),
    threshold, the set's median, band low, band high)}. A dotted line at the threshold (the set: every head right
    of it), the random band in orange and the set's median in red across the set; dots coloured by layer, rises
    above ``top`` drawn at ``top`` as triangles, the heads ``marked`` [(layer, head)] named. Linear y axis."""
    rise = torch.as_tensor(rise).float().cpu()
    L, H = rise.shape
    plt = _plt()
    fig, axes = plt.subplots(1, len(tests), figsize=(9.5, 4.2), sharey=True, layout="constrained", squeeze=False)
    layer_of, y = torch.arange(L).repeat_interleave(H), rise.flatten()  # (L*H,) each
    over, colour = y > top, {"cmap": "viridis", "vmin": 0, "vmax": L - 1}
    for ax, (name, (score, threshold, median, lo, hi)) in zip(axes[0], tests.items(), strict=True):
        score = torch.as_tensor(score).float().cpu()
        x = score.flatten()  # (L*H,)
        dots = ax.scatter(x[~over], y[~over], c=layer_of[~over], s=14, **colour)
        ax.scatter(x[over], torch.full((int(over.sum()),), top), c=layer_of[over], s=30, marker="^", **colour)
        ax.axvline(threshold, color="black", linestyle=":", linewidth=1)
        ax.fill_between([threshold, 1], lo, hi, color="tab:orange", alpha=0.35, linewidth=0, label="random band")
        ax.plot([threshold, 1], [median, median], color="tab:red", linewidth=2, label="the set's median")
        ax.axhline(0, color="grey", linewidth=0.5)
        for layer, head in marked:
            y_mark = min(float(rise[layer, head]), top)
            offset = (4, -11 if y_mark == top else 3)
            ax.annotate(f"L{layer} H{head}", (float(score[layer, head]), y_mark), fontsize=8, xytext=offset,
                        textcoords="offset points")  # fmt: skip
        ax.set(xlabel=f"{name}, first held-out topic (set: > {threshold})", xlim=(0, 1), ylim=(-0.4, top + 0.1))
    axes[0, 0].set_ylabel(f"perplexity rise, one head off\n(▲: above {top}, drawn at {top})")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncols=2)
    fig.colorbar(dots, ax=axes, label="layer")
    return fig
