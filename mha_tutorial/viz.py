r"""The layers x heads grid of attention heatmaps (notebook 06).

``plot_head_grid`` draws one set of weights: axes labelled with the real tokens, one shared colour scale
(or one per head), cells a query may not look at drawn grey and hatched. Collecting the weights from a model
lives in ``maps.py``; per-head numbers and roles in ``head_stats.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .tasks import BOS, PAD

__all__ = ["display_token", "plot_head_grid"]

DISPLAY = {" ": "␣", PAD: "∅", BOS: "⟨s⟩"}
MASKED_COLOUR, MASKED_HATCH, HATCH_COLOUR = "0.86", "////", "0.55"


def display_token(token: str) -> str:
    """How one token appears on a heatmap axis (``" "`` -> ``"␣"``, ``<pad>`` -> ``"∅"``, ``<bos>`` -> ``"⟨s⟩"``)."""
    return DISPLAY.get(token, token)


# =====================================================================================================
# the grid of heatmaps
# =====================================================================================================
def _layers_of(weights) -> list[torch.Tensor]:
    """(L, H, Q, K) tensor, (H, Q, K) tensor or list of (H, Q, K) tensors -> list of CPU float tensors."""
    if isinstance(weights, torch.Tensor):
        if weights.dim() == 4:
            layers = list(weights.unbind(0))
        elif weights.dim() == 3:
            layers = [weights]
        else:
            raise ValueError(
                f"weights must be (layers, heads, queries, keys), (heads, queries, keys) or a list of "
                f"(heads, queries, keys) tensors, got a tensor of shape {tuple(weights.shape)}"
            )
    elif isinstance(weights, Sequence) and len(weights) > 0:
        layers = list(weights)
    else:
        raise TypeError(f"weights must be a tensor or a non-empty list of tensors, got {type(weights).__name__}")
    out = []
    for l, w in enumerate(layers):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"layer {l}: weights must be a tensor, got {type(w).__name__}")
        if w.dim() != 3:
            raise ValueError(f"layer {l}: weights must be (heads, queries, keys), got shape {tuple(w.shape)}")
        out.append(w.detach().float().cpu())
    heads = {w.shape[0] for w in out}
    if len(heads) != 1:
        raise ValueError(f"every layer must have the same number of heads, got {[w.shape[0] for w in out]}")
    return out


def _per_layer(value, L: int, what: str, is_single) -> list:
    """One entry per layer: ``value`` itself when ``is_single(value)``, else a list of length L."""
    if is_single(value):
        return [value] * L
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != L:
        got = len(value) if isinstance(value, Sequence) and not isinstance(value, str) else type(value).__name__
        raise ValueError(f"{what}: expected one shared value or a list with one entry per layer ({L}), got {got}")
    return list(value)


def _is_label_list(x) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, str) and all(isinstance(t, str) for t in x)


def _keep_per_layer(keep, layers: list[torch.Tensor]) -> list[torch.Tensor]:
    """Bool (H, Q, K) keep-masks, one per layer (all True where ``keep`` is None)."""
    L = len(layers)
    if keep is None:
        masks = [None] * L
    elif isinstance(keep, torch.Tensor):
        masks = list(keep.unbind(0)) if keep.dim() == 4 else [keep] * L
        if keep.dim() == 4 and keep.shape[0] != L:
            raise ValueError(f"a 4-D keep mask needs one entry per layer ({L}), got shape {tuple(keep.shape)}")
    else:
        masks = _per_layer(keep, L, "keep", lambda v: False)
    out = []
    for l, (w, m) in enumerate(zip(layers, masks, strict=True)):
        if m is None:
            out.append(torch.ones(w.shape, dtype=torch.bool))
            continue
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            what = m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
            raise TypeError(f"layer {l}: keep must be a bool tensor (True = may attend), got {what}")
        try:
            shape = torch.broadcast_shapes(m.shape, w.shape)
        except RuntimeError:
            shape = None
        if shape != w.shape:
            raise ValueError(
                f"layer {l}: keep mask of shape {tuple(m.shape)} does not fit weights of shape "
                f"(heads, queries, keys) = {tuple(w.shape)}; give (queries, keys) or (heads, queries, keys)"
            )
        out.append(m.detach().cpu().expand(w.shape))
    return out


def _tick_fontsize(n: int, panel_in: float) -> float:
    """Font size (points) that lets ``n`` one-character labels fit along a panel ``panel_in`` inches long."""
    return float(min(9.0, max(6.0, 0.8 * panel_in * 72 / max(n, 1))))


def plot_head_grid(  # noqa: C901, PLR0912, PLR0913, PLR0915 -- known debt: layout + per-panel split (issue 10)
    weights,
    query_labels,
    key_labels,
    layer_names=None,
    shared_scale: bool = True,
    keep=None,
    title: str | None = None,
    head_titles=None,
    axis_labels=("query", "key"),
    vmax: float | None = None,
    cmap: str = "viridis",
    panel_size: float = 2.4,
    heads_per_row: int | None = None,
    figsize=None,
):
    """Draw a layers x heads grid of attention heatmaps for one set of weights; return the Figure.

    Args:
        weights: a list of (H, Q, K) tensors, one per layer (Q and K may differ between layers),
            or an (L, H, Q, K) tensor. Row q of a panel is one query's distribution over the keys.
        query_labels, key_labels: the tokens along the rows / columns: one list of strings shared by
            every layer, or a list of such lists, one per layer.
        layer_names: one title per layer (default ``layer 0``, ``layer 1``, ...).
        shared_scale: one colour scale 0..``vmax`` (default 1) and a single colour bar for the whole grid;
            ``False`` gives every head its own scale 0..(its largest weight) and its own colour bar,
            which shows the shape of weak heads but makes colours incomparable between panels.
        keep: bool mask, True = the query may attend to the key: (Q, K) or (H, Q, K) shared by all
            layers, an (L, H, Q, K) tensor, or a list with one mask (or None) per layer. Cells where it
            is False are drawn light grey and hatched, so that "not allowed" never looks like "weight 0".
        title: the figure's title; head_titles: an extra line per panel, [layer][head].
        axis_labels: (y label, x label), or a list of such pairs, one per layer.
        panel_size: width of one panel in inches (its height follows: cells are square).
        heads_per_row: wrap a layer's heads onto several rows (useful for wide cross-attention maps).

    Raises ValueError when the labels do not match the weights' shape or the mask does not fit.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch, Rectangle

    layers = _layers_of(weights)
    L, H = len(layers), layers[0].shape[0]
    q_labels = _per_layer(query_labels, L, "query_labels", _is_label_list)
    k_labels = _per_layer(key_labels, L, "key_labels", _is_label_list)
    names = [f"layer {l}" for l in range(L)] if layer_names is None else list(layer_names)
    if len(names) != L:
        raise ValueError(f"layer_names has {len(names)} entries for {L} layers")
    axis = _per_layer(axis_labels, L, "axis_labels", lambda v: isinstance(v, tuple) and len(v) == 2)
    for l, (w, ql, kl) in enumerate(zip(layers, q_labels, k_labels, strict=True)):
        if not _is_label_list(ql) or not _is_label_list(kl):
            raise ValueError(f"{names[l]}: labels must be lists of strings")
        if len(ql) != w.shape[1] or len(kl) != w.shape[2]:
            raise ValueError(
                f"{names[l]}: {len(ql)} query labels and {len(kl)} key labels for weights of shape "
                f"(heads, queries, keys) = {tuple(w.shape)}"
            )
    if head_titles is not None and (len(head_titles) != L or any(len(row) != H for row in head_titles)):
        raise ValueError(f"head_titles must be a list of {L} lists of {H} strings")
    if heads_per_row is not None and heads_per_row < 1:
        raise ValueError(f"heads_per_row must be at least 1, got {heads_per_row}")
    keeps = _keep_per_layer(keep, layers)
    for l, (w, k) in enumerate(zip(layers, keeps, strict=True)):
        if torch.isnan(w[k]).any():
            raise ValueError(f"{names[l]}: weights contain NaN at cells the keep mask allows")
    any_masked = any(not bool(k.all()) for k in keeps)

    ncols = min(H, heads_per_row or H)
    per_layer = -(-H // ncols)  # grid rows per layer
    grid_rows = [(l, r) for l in range(L) for r in range(per_layer)]
    ratios = [max(layers[l].shape[1] / layers[l].shape[2], 0.2) for l, _ in grid_rows]  # square cells
    show_x = [
        i == len(grid_rows) - 1 or k_labels[l] != k_labels[grid_rows[i + 1][0]] or r < per_layer - 1
        for i, (l, r) in enumerate(grid_rows)
    ]
    if figsize is None:
        width = ncols * panel_size * (1.0 if shared_scale else 1.22) + (1.2 if shared_scale else 0.7)
        height = sum(panel_size * q + 0.4 + (0.45 if x else 0.05) for q, x in zip(ratios, show_x, strict=True))
        figsize = (width, height + 0.5 + (0.25 if any_masked else 0.0))
    fig = plt.figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(len(grid_rows), ncols, squeeze=False, gridspec_kw={"height_ratios": ratios})
    top = vmax if vmax is not None else 1.0
    colormap = plt.get_cmap(cmap).with_extremes(bad=(0, 0, 0, 0))  # masked cells transparent: the hatching shows
    image = None
    for i, (l, r) in enumerate(grid_rows):
        w, keep_l = layers[l], keeps[l]
        Q, K = w.shape[1:]
        size = _tick_fontsize(max(Q, K), panel_size)
        xl = [display_token(t) for t in k_labels[l]]
        yl = [display_token(t) for t in q_labels[l]]
        for c in range(ncols):
            ax, h = axes[i, c], r * ncols + c
            if h >= H:
                ax.set_axis_off()
                continue
            ax.add_patch(
                Rectangle(
                    (-0.5, -0.5),
                    K,
                    Q,
                    facecolor=MASKED_COLOUR,
                    edgecolor=HATCH_COLOUR,
                    hatch=MASKED_HATCH,
                    lw=0,
                    zorder=0,
                )
            )
            data = np.ma.masked_array(w[h].numpy(), mask=(~keep_l[h]).numpy())
            head_max = float(w[h][keep_l[h]].max()) if keep_l[h].any() else 1.0
            im = ax.imshow(
                data,
                cmap=colormap,
                vmin=0.0,
                vmax=top if shared_scale else max(head_max, 1e-6),
                interpolation="nearest",
                aspect="equal",
                zorder=1,
            )
            image = image or im
            if not shared_scale:
                bar = fig.colorbar(im, ax=ax, shrink=0.85, pad=0.02)
                bar.ax.tick_params(labelsize=7)
            ax.set_yticks(range(Q), yl if c == 0 else [""] * Q)
            ax.set_xticks(range(K), xl if show_x[i] else [""] * K)
            ax.tick_params(axis="both", labelsize=size, length=0, pad=1.5)
            # Turn the key labels vertical only when two neighbours would overlap (a character is ~0.6 em wide).
            crowded = any(
                (len(a) + len(b)) / 2 * 0.62 * size > 0.9 * panel_size * 72 / K
                for a, b in zip(xl, xl[1:], strict=False)
            )
            if show_x[i] and crowded:
                ax.tick_params(axis="x", labelrotation=90)
            if show_x[i]:
                ax.set_xlabel(axis[l][1], fontsize=8)
            ax.set_ylabel(axis[l][0] if c == 0 else "", fontsize=8)
            extra = f"\n{head_titles[l][h]}" if head_titles is not None else ""
            ax.set_title(f"{names[l]} · head {h}{extra}", fontsize=8.5)
            for spine in ax.spines.values():
                spine.set_linewidth(0.5)
    if shared_scale:
        fig.colorbar(image, ax=axes, shrink=min(0.9, 0.3 + 0.2 * len(grid_rows)), pad=0.01, label="attention weight")
    if any_masked:
        handle = Patch(
            facecolor=MASKED_COLOUR, edgecolor=HATCH_COLOUR, hatch=MASKED_HATCH, label="masked: may not attend"
        )
        fig.legend(handles=[handle], loc="outside lower right", fontsize=8, frameon=False)
    scale = "one shared colour scale" if shared_scale else "each head on its own colour scale"
    fig.suptitle(title or f"Attention weights per head (rows: queries, columns: keys; {scale})", fontsize=10.5)
    return fig
