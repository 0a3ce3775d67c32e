r"""The layers x heads grid of attention heatmaps (notebook 06).

``plot_head_grid`` draws one set of weights: axes labelled with the real tokens, one shared colour scale
(or one per head), cells a query may not look at drawn grey and hatched. Collecting the weights from a model
lives in ``maps.py``; per-head numbers and roles in ``head_stats.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..figures import MIN_TICK_PT
from ..models import _validate_experiments as validate
from ..models.tasks import BOS, PAD

__all__ = ["display_token", "plot_head_grid"]

DISPLAY = {" ": "␣", PAD: "∅", BOS: "<s>"}  # plain ASCII: thin angle brackets read as "(s)" at 8 pt
MASKED_COLOUR, MASKED_HATCH, HATCH_COLOUR = "0.86", "////", "0.55"


def display_token(token: str) -> str:
    """How one token appears on a heatmap axis (``" "`` -> ``"␣"``, ``<pad>`` -> ``"∅"``, ``<bos>`` -> ``"<s>"``)."""
    validate.token(token)
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
        out.append(w)
    validate.grid_weights(out)
    return [w.detach().float().cpu() for w in out]


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


def _tick_layout(n: int, panel_in: float) -> tuple[float, int]:
    """Font size (points) and step for ``n`` one-character labels along a panel ``panel_in`` inches long.

    Labels stay readable (8 pt at least): when all ``n`` do not fit, only every ``step``-th is shown.
    """
    room = 0.8 * panel_in * 72 / max(n, 1)  # points of axis per label
    step = max(1, math.ceil(MIN_TICK_PT / room))
    return float(min(9.0, max(MIN_TICK_PT, room * step))), step


def plot_head_grid(  # noqa: PLR0913 -- the public signature, kept as is: notebooks pass these options by name
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
        weights: a list of (H, Q, K) tensors, one per layer (Q and K may differ between layers,
            and so may H: a pruned layer has fewer heads, one with none is drawn as a note),
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

    Raises TypeError or ValueError, naming the argument, when the weights are not floating tensors (or are
    negative or infinite where the mask allows attention), the labels do not match the weights' shape, the
    mask does not fit, or an option is out of range; all before anything is drawn.
    """
    return _head_grid(locals())


@dataclass(frozen=True)
class _Grid:
    """``plot_head_grid``'s data, checked, one entry per layer."""

    layers: list[torch.Tensor]  # (H_l, Q_l, K_l) float CPU tensors; H_l may differ (pruned layers)
    query_labels: list[list[str]]
    key_labels: list[list[str]]
    names: list[str]
    axis: list[tuple[str, str]]  # (y label, x label)
    keeps: list[torch.Tensor]  # (H_l, Q_l, K_l) bool, True = may attend
    head_titles: list | None  # [layer][head] extra title lines
    head_ids: list[list[int]]  # [layer][head] the number in the title: the head's original number


@dataclass(frozen=True)
class _Style:
    """How ``plot_head_grid`` draws: the colour scale(s), sizes and title."""

    shared_scale: bool
    vmax: float  # top of the shared colour scale
    colormap: object  # masked (bad) cells transparent: the hatched background shows through
    panel_size: float
    heads_per_row: int | None
    figsize: tuple | None
    title: str | None


def _head_grid(args: dict, head_ids=None):
    """``plot_head_grid`` with its arguments by name; ``head_ids`` numbers the heads of pruned layers (maps.py)."""
    grid = _grid_data(args, head_ids)
    return _draw_grid(grid, _style(args))


def _grid_data(args: dict, head_ids) -> _Grid:
    """Check the weights, labels and masks against each other; one entry per layer."""
    layers = _layers_of(args["weights"])
    L = len(layers)
    q_labels = _per_layer(args["query_labels"], L, "query_labels", _is_label_list)
    k_labels = _per_layer(args["key_labels"], L, "key_labels", _is_label_list)
    validate.grid_layer_names(args["layer_names"])
    names = [f"layer {l}" for l in range(L)] if args["layer_names"] is None else list(args["layer_names"])
    if len(names) != L:
        raise ValueError(f"layer_names has {len(names)} entries for {L} layers")
    axis = _per_layer(args["axis_labels"], L, "axis_labels", lambda v: isinstance(v, tuple) and len(v) == 2)
    validate.grid_axis_labels(axis)
    for l, (w, ql, kl) in enumerate(zip(layers, q_labels, k_labels, strict=True)):
        if not _is_label_list(ql) or not _is_label_list(kl):
            raise ValueError(f"{names[l]}: labels must be lists of strings")
        if len(ql) != w.shape[1] or len(kl) != w.shape[2]:
            raise ValueError(
                f"{names[l]}: {len(ql)} query labels and {len(kl)} key labels for weights of shape "
                f"(heads, queries, keys) = {tuple(w.shape)}"
            )
    heads = [w.shape[0] for w in layers]
    validate.grid_head_titles(args["head_titles"], heads)
    validate.grid_head_ids(head_ids, heads)
    keeps = _keep_per_layer(args["keep"], layers)
    for l, (w, k) in enumerate(zip(layers, keeps, strict=True)):
        if torch.isnan(w[k]).any():
            raise ValueError(f"{names[l]}: weights contain NaN at cells the keep mask allows")
    validate.grid_values(layers, keeps, names)
    ids = [list(range(h)) for h in heads] if head_ids is None else [list(i) for i in head_ids]
    return _Grid(layers, q_labels, k_labels, names, axis, keeps, args["head_titles"], ids)


def _style(args: dict) -> _Style:
    """Check the drawing options; resolve the colour map."""
    import matplotlib.pyplot as plt

    options = ("shared_scale", "vmax", "cmap", "panel_size", "heads_per_row", "figsize", "title")
    validate.grid_style(*(args[k] for k in options))
    colormap = plt.get_cmap(args["cmap"]).with_extremes(bad=(0, 0, 0, 0))
    top = args["vmax"] if args["vmax"] is not None else 1.0
    return _Style(
        args["shared_scale"], top, colormap, args["panel_size"], args["heads_per_row"], args["figsize"], args["title"]
    )


def _layout(grid: _Grid, style: _Style):
    """The figure and its axes: one grid row per layer (more when ``heads_per_row`` wraps), square cells.

    Returns (fig, axes, rows, show_x): rows[i] = (layer, row within the layer) of grid row i; show_x[i][c]
    says whether panel (i, c) carries the key labels: at the bottom of a block of rows with the same keys,
    on every row of a wrapped layer, and above an empty place.
    """
    import matplotlib.pyplot as plt

    heads = [w.shape[0] for w in grid.layers]
    ncols = min(max(heads), style.heads_per_row or max(heads))
    per_layer = [max(1, -(-h // ncols)) for h in heads]  # grid rows per layer (a layer with no heads keeps one)
    rows = [(l, r) for l in range(len(heads)) for r in range(per_layer[l])]
    ratios = [max(grid.layers[l].shape[1] / grid.layers[l].shape[2], 0.2) for l, _ in rows]  # square cells

    def has_panel(i: int, c: int) -> bool:
        l, r = rows[i]
        return r * ncols + c < heads[l]

    last = len(rows) - 1
    block_end = [
        i == last or grid.key_labels[l] != grid.key_labels[rows[i + 1][0]] or r < per_layer[l] - 1
        for i, (l, r) in enumerate(rows)
    ]
    show_x = [
        [has_panel(i, c) and (block_end[i] or not has_panel(i + 1, c)) for c in range(ncols)] for i in range(last + 1)
    ]
    figsize = style.figsize
    if figsize is None:
        any_masked = any(not bool(k.all()) for k in grid.keeps)
        width = ncols * style.panel_size * (1.0 if style.shared_scale else 1.22) + (1.2 if style.shared_scale else 0.7)
        height = sum(
            style.panel_size * q + 0.4 + (0.45 if any(x) else 0.05) for q, x in zip(ratios, show_x, strict=True)
        )
        figsize = (width, height + 0.5 + (0.25 if any_masked else 0.0))
    fig = plt.figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(len(rows), ncols, squeeze=False, gridspec_kw={"height_ratios": ratios})
    return fig, axes, rows, show_x


def _draw_panel(ax, grid: _Grid, l: int, h: int, show: tuple[bool, bool], style: _Style):
    """Draw head ``h`` (its position in layer ``l``'s weights) on ``ax``; return the image.

    ``show``: (query labels, key labels) on this panel's axes. Masked cells are transparent over a grey
    hatched rectangle.
    """
    import numpy as np
    from matplotlib.patches import Rectangle

    w, keep = grid.layers[l][h], grid.keeps[l][h]  # (Q, K)
    Q, K = w.shape
    size, step = _tick_layout(max(Q, K), style.panel_size)
    xl = [display_token(t) for t in grid.key_labels[l]]
    yl = [display_token(t) for t in grid.query_labels[l]]
    hatched = Rectangle(
        (-0.5, -0.5), K, Q, facecolor=MASKED_COLOUR, edgecolor=HATCH_COLOUR, hatch=MASKED_HATCH, lw=0, zorder=0
    )
    ax.add_patch(hatched)
    data = np.ma.masked_array(w.numpy(), mask=(~keep).numpy())
    head_max = float(w[keep].max()) if keep.any() else 1.0
    top = style.vmax if style.shared_scale else max(head_max, 1e-6)
    im = ax.imshow(data, cmap=style.colormap, vmin=0.0, vmax=top, interpolation="nearest", aspect="equal", zorder=1)
    if not style.shared_scale:
        bar = ax.figure.colorbar(im, ax=ax, shrink=0.85, pad=0.02)
        bar.ax.tick_params(labelsize=MIN_TICK_PT)
        bar.set_label("attention weight", fontsize=MIN_TICK_PT)
    show_y, show_x = show
    ax.set_yticks(range(0, Q, step), yl[::step] if show_y else [""] * len(range(0, Q, step)))
    ax.set_xticks(range(0, K, step), xl[::step] if show_x else [""] * len(range(0, K, step)))
    ax.tick_params(axis="both", labelsize=size, length=0, pad=1.5)
    # Turn the key labels vertical only when two neighbours would overlap (a character is ~0.6 em wide).
    shown = xl[::step]
    crowded = any(
        (len(a) + len(b)) / 2 * 0.62 * size > 0.9 * style.panel_size * 72 / len(shown)
        for a, b in zip(shown, shown[1:], strict=False)
    )
    if show_x and crowded:
        ax.tick_params(axis="x", labelrotation=90)
    if show_x:
        ax.set_xlabel(grid.axis[l][1], fontsize=8)
    ax.set_ylabel(grid.axis[l][0] if show_y else "", fontsize=8)
    extra = f"\n{grid.head_titles[l][h]}" if grid.head_titles is not None else ""
    ax.set_title(f"{grid.names[l]} · head {grid.head_ids[l][h]}{extra}", fontsize=8.5)
    for spine in ax.spines.values():
        spine.set_linewidth(0.5)
    return im


def _draw_grid(grid: _Grid, style: _Style):
    """Lay the grid out, draw every head, then the shared colour bar, the legend of masked cells and the title."""
    from matplotlib.patches import Patch

    fig, axes, rows, show_x = _layout(grid, style)
    images = []
    for i, (l, r) in enumerate(rows):
        for c in range(axes.shape[1]):
            ax, h = axes[i, c], r * axes.shape[1] + c
            if h < len(grid.layers[l]):
                images.append(_draw_panel(ax, grid, l, h, (c == 0, show_x[i][c]), style))
                continue
            ax.set_axis_off()
            if h == 0:  # a layer whose heads were all pruned
                ax.text(0.02, 0.5, f"{grid.names[l]}: no heads left", transform=ax.transAxes, fontsize=8.5)
    if style.shared_scale:
        shrink = min(0.9, 0.3 + 0.2 * len(rows))
        fig.colorbar(images[0], ax=axes, shrink=shrink, pad=0.01, label="attention weight")
    if any(not bool(k.all()) for k in grid.keeps):
        handle = Patch(
            facecolor=MASKED_COLOUR, edgecolor=HATCH_COLOUR, hatch=MASKED_HATCH, label="masked: may not attend"
        )
        fig.legend(handles=[handle], loc="outside lower right", fontsize=8, frameon=False)
    scale = "one shared colour scale" if style.shared_scale else "each head on its own colour scale"
    fig.suptitle(style.title or f"Attention weights per head (rows: queries, columns: keys; {scale})", fontsize=10.5)
    return fig
