"""The figures of notebook 04 (multi-head attention), kept here so the lesson shows one call per figure.

* :func:`plot_swap`: section 1's query "sat", its weights and what it receives for both word orders;
* :func:`mha_schematic`: the data flow of multi-head self-attention, each tensor's shape on an arrow;
* :func:`plot_heads`: per-head attention maps, one row of heads per set of weights, one shared colour scale.

Each function returns the figure; end the notebook cell with ``plt.show()``.
"""

from __future__ import annotations

import numpy as np
import torch


def _as_cpu(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t.detach().cpu()


def plot_swap(attn: dict, plain: dict, swapped: dict, words: list):
    """Left: bars of each query's weights over the keys. Right: the outputs for both word orders.

    Args:
        attn: ``{name: (T,) weights}``, one distribution over the T keys per query.
        plain, swapped: ``{name: (F,) output}`` for the two word orders, the same names in both; an output with
            fewer features than the widest is padded with blank (grey) cells.
        words: the vocabulary, ``len(words)`` features per head; the key axis is labelled with the sentence
            "the cat sat on the mat".
    """
    import matplotlib.pyplot as plt

    if not attn or set(plain) != set(swapped):
        raise ValueError("attn must be non-empty and plain and swapped must have the same names")
    weights = {name: _as_cpu(w, f"attn[{name!r}]") for name, w in attn.items()}
    keys = len(next(iter(weights.values())))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 3.6), gridspec_kw={"width_ratios": [1, 1.2], "wspace": 0.7})
    positions = np.arange(keys)
    width = 0.8 / len(weights)
    for i, (name, w) in enumerate(weights.items()):
        left.bar(positions + width * (i - (len(weights) - 1) / 2), w.numpy(), width=width, label=name)
    left.axhline(1 / keys, color="k", ls="--", lw=1, label=f"uniform, 1/{keys}")
    left.set(xticks=positions, xlabel="key", ylabel="weight", ylim=(0, 1.6), yticks=[0, 0.25, 0.5, 0.75, 1])
    left.set_title("the query 'sat' attends")
    left.set_xticklabels("the cat sat on the mat".split()[:keys])
    left.legend(fontsize=8, loc="upper center", ncol=2)
    widest = max(len(out) for out in plain.values())
    rows, labels = [], []
    for name in plain:  # both orders per query; a narrower output is padded with NaN, drawn blank
        for out, order in ((plain[name], "cat sat on"), (swapped[name], "on sat cat")):
            out = _as_cpu(out, f"output {name!r}").float()
            rows.append(torch.cat([out, torch.full((widest - len(out),), float("nan"))]))  # (widest,)
            labels.append(f"{name}: {order}")
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.9")  # NaN: a feature this output does not have
    image = right.imshow(torch.stack(rows).numpy(), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    right.set(xticks=range(widest), yticks=range(len(rows)))
    right.set_xlabel("output feature (two heads: head 0 in 0-4, head 1 in 5-9)")
    right.set_xticklabels((list(words) * widest)[:widest], rotation=90)
    right.set_yticklabels(labels)
    right.set_title("what 'sat' receives, for both word orders")
    for y in range(1, len(rows) // 2):
        right.axhline(2 * y - 0.5, color="w", lw=2)
    fig.colorbar(image, ax=right, label="share of the word in the output")
    return fig


def _box(ax, x, y, w, h, text, colour):  # (x, y) is the box's centre
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04", fc=colour, ec="0.25"))
    ax.text(x, y, text, ha="center", va="center", fontsize=10)


def _arrow(ax, x0, y0, x1, y1, shape=""):  # the tensor's shape is written above the arrow
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops={"arrowstyle": "-|>", "color": "0.25", "lw": 1.2})
    ax.text((x0 + x1) / 2, max(y0, y1) + 0.1, shape, ha="center", va="bottom", fontsize=9)


def mha_schematic():
    """The data flow of multi-head self-attention: X, the three projections, the split into H heads, attention
    in each head, the concatenation and W_o, with each tensor's shape on its arrow."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(12.5, 4.2))
    ax.set(xlim=(0, 16.5), ylim=(-0.35, 4.6))
    ax.axis("off")
    for i in range(3, -1, -1):  # a deck of head boxes, the front one drawn last
        corner = (7.5 + 0.12 * i, 0.25 + 0.12 * i)
        ax.add_patch(FancyBboxPatch(corner, 2.4, 3.9, boxstyle="round,pad=0.04", fc="#d9f0d3", ec="0.25"))
    formula = r"$\mathrm{softmax}(q_h k_h^T / \sqrt{d})\, v_h$"
    ax.text(8.7, 2.2, "attention in\neach head\nh = 0 .. H-1:\n\n" + formula, ha="center", va="center", fontsize=10)
    _box(ax, 0.5, 2.2, 0.7, 0.8, "$X$", "0.9")
    ax.text(0.5, 2.75, "(B, T, D)", ha="center", va="bottom", fontsize=9)
    for name, y in {"q": 3.7, "k": 2.2, "v": 0.7}.items():  # the query, key and value paths
        _arrow(ax, 0.85, 2.2, 1.9, y)
        _box(ax, 2.4, y, 0.9, 0.7, f"$W_{name}$", "#cfe3f5")
        _arrow(ax, 2.85, y, 4.35, y, f"{name.upper()} (B, T, H·d)")
        _box(ax, 5.0, y, 1.2, 0.7, "split into\nH heads", "#fde3c8")
        _arrow(ax, 5.6, y, 7.45, y, f"{name} (B, H, T, d)")
    note = "(the code folds H into\nthe batch: (B·H, T, d))"
    ax.text(5.0, -0.15, note, ha="center", va="center", fontsize=8, color="0.35")
    _arrow(ax, 10.35, 2.2, 11.55, 2.2, "(B, H, T, d)")
    _box(ax, 12.15, 2.2, 1.1, 0.8, "concat\nheads", "#fde3c8")
    _arrow(ax, 12.75, 2.2, 13.85, 2.2, "(B, T, H·d)")
    _box(ax, 14.3, 2.2, 0.8, 0.8, "$W_o$", "#cfe3f5")
    _arrow(ax, 14.75, 2.2, 15.75, 2.2, "(B, T, D)")
    ax.text(16.1, 2.2, "out", ha="center", va="center", fontsize=10)
    ax.set_title("Multi-head self-attention: the data flow, with the tensors' shapes on the arrows (d = D / H)")
    return fig


def plot_heads(rows: list, row_titles: list, head_titles: list, labels: list):
    """Per-head attention maps: one row of panels per ``(H, Q, K)`` tensor in ``rows``, one panel per head,
    all on one colour scale from 0 to 1. ``head_titles[r][h]`` names head h of row r; ``labels`` names the
    tokens on both axes."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    if not rows or len(row_titles) != len(rows) or len(head_titles) != len(rows):
        raise ValueError("rows, row_titles and head_titles must be non-empty and of one length")
    maps = [_as_cpu(r, "each row") for r in rows]
    if any(m.dim() != 3 or m.shape != maps[0].shape for m in maps):
        raise ValueError(f"every row must be one (H, Q, K) tensor of one shape, got {[tuple(m.shape) for m in maps]}")
    fig, axes = plt.subplots(len(maps), maps[0].shape[0], figsize=(12.5, 3.1 * len(maps)), squeeze=False)
    for r, (heads, row_title) in enumerate(zip(maps, row_titles, strict=True)):
        for i, ax in enumerate(axes[r]):
            sns.heatmap(heads[i].numpy(), ax=ax, vmin=0, vmax=1, cmap="viridis", square=True, cbar=False,
                        xticklabels=labels, yticklabels=labels)  # fmt: skip
            ax.set_title(f"{row_title}\nhead {i}: {head_titles[r][i]}", fontsize=9)
            ax.tick_params(labelsize=8)
            ax.tick_params(axis="y", labelrotation=0)
            ax.set_xlabel("key" if r == len(maps) - 1 else "")
            ax.set_ylabel("query" if i == 0 else "")
    fig.colorbar(axes[0, 0].collections[0], ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle("Per-head attention weights on one sentence (rows: queries, columns: keys)")
    return fig
