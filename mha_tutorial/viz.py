r"""Pictures and numbers for reading trained attention heads (notebook 06).

* ``plot_head_grid``: a layers x heads grid of heatmaps for one set of weights,
  axes labelled with the real tokens, one shared colour scale (or one per
  head), cells a query may not look at drawn grey and hatched.
* ``collect_attention``: run a model on one example and return every layer's
  weights (H, Q, K) on the CPU with the right labels and keep-masks.
* ``average_attention``: the same maps averaged over many examples, cell by
  cell over the examples in which that cell exists.
* ``head_stats`` / ``role_labels`` / ``stats_table``: per-head numbers
  ((layers, heads) tensors) and a name for what each head does.

Conventions. Masks are bool with True = "may attend" (as in ``masks.py``). A
query row *counts* in a statistic when its position is a real token (not
padding) and it has at least two visible keys: with one visible key the softmax
has no choice to make (its weight is 1 whatever the head does) and the
normalised entropy below would be 0/0.

Statistics, for a counted row i with weights :math:`w_{ij}` over its
:math:`n_i` visible keys, averaged over all counted rows of all examples:

.. math::

    \text{entropy} = \frac{-\sum_j w_{ij}\log w_{ij}}{\log n_i} \in [0, 1],\qquad
    \text{distance} = \sum_j w_{ij}\,|i - j|,\qquad
    \text{confidence} = \max_j w_{ij}.

Entropy 1 is a uniform spread over the visible keys, 0 all weight on one key.
Distance needs queries and keys on the same sequence, so it is NaN for
cross-attention layers.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from .masks import causal_mask
from .tasks import BOS, PAD, get_task, render_date

__all__ = [
    "AttentionMaps",
    "average_attention",
    "collect_attention",
    "date_field_labels",
    "display_token",
    "head_stats",
    "layer_masks",
    "normalized_entropy",
    "plot_head_grid",
    "plot_head_stats",
    "role_labels",
    "stats_table",
]

# How special tokens are shown on the axes: a space would be invisible, <pad> and <bos> too wide.
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


# =====================================================================================================
# weights, labels and masks from a model
# =====================================================================================================
@dataclass
class AttentionMaps:
    """Every attention layer's maps for one example (or an average over many), ready to plot.

    weights[l]: (H, Q_l, K_l) CPU tensor; keep[l]: (Q_l, K_l) bool, True = the query may attend;
    query_labels[l] / key_labels[l]: the tokens along the axes; axis_labels[l]: (y label, x label);
    count: how many examples were averaged (1 for one example).
    """

    layer_names: list[str]
    weights: list[torch.Tensor]
    query_labels: list[list[str]]
    key_labels: list[list[str]]
    keep: list[torch.Tensor]
    axis_labels: list[tuple[str, str]] = field(default_factory=list)
    count: int = 1

    def select(self, *names: str) -> AttentionMaps:
        """Only the layers called ``names`` (e.g. ``maps.select("dec.0.cross")``)."""
        unknown = [n for n in names if n not in self.layer_names]
        if unknown:
            raise ValueError(f"unknown layers {unknown}; this model has {self.layer_names}")
        idx = [self.layer_names.index(n) for n in names]
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return replace(
            self,
            layer_names=list(names),
            weights=pick(self.weights),
            query_labels=pick(self.query_labels),
            key_labels=pick(self.key_labels),
            keep=pick(self.keep),
            axis_labels=pick(self.axis_labels),
        )

    def relabel(self, query_labels=None, key_labels=None) -> AttentionMaps:
        """The same maps with other axis labels (one list shared by all layers, or one per layer)."""
        L = len(self.layer_names)
        q = self.query_labels if query_labels is None else _per_layer(query_labels, L, "query_labels", _is_label_list)
        k = self.key_labels if key_labels is None else _per_layer(key_labels, L, "key_labels", _is_label_list)
        return replace(self, query_labels=[list(x) for x in q], key_labels=[list(x) for x in k])

    def plot(self, **kwargs):
        """``plot_head_grid`` with this object's weights, labels, masks and layer names."""
        kwargs.setdefault("axis_labels", self.axis_labels or ("query", "key"))
        return plot_head_grid(
            self.weights,
            self.query_labels,
            self.key_labels,
            layer_names=self.layer_names,
            keep=self.keep,
            **kwargs,
        )


@dataclass
class _LayerMasks:
    """For one attention layer of a batch: what may be attended, and which queries are real tokens."""

    keep: torch.Tensor  # (B, Q, K) bool, True = may attend
    query_real: torch.Tensor  # (B, Q) bool, True = the query is a real token (not padding)
    same_sequence: bool  # self-attention (queries and keys are positions of one sequence)


def _real_lengths(task, batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(encoder lengths (B,) or None, decoder lengths (B,) or None) of the real tokens in ``batch``."""
    enc = dec = None
    if batch.src is not None:
        S = batch.src.shape[1]
        enc = (
            batch.valid_lens if batch.valid_lens is not None else torch.full((len(batch),), S, device=batch.src.device)
        )
    if batch.tgt_in is not None:
        if task.name == "induction":  # right-padded: the sequence is the run twice
            dec = torch.tensor([len(seq) for (seq,) in batch.examples], device=batch.tgt_in.device)
        else:
            dec = torch.full((len(batch),), batch.tgt_in.shape[1], device=batch.tgt_in.device)
    return enc, dec


def layer_masks(model, task_name: str, batch) -> dict[str, _LayerMasks]:
    """{layer name: masks} for every attention layer of ``model`` on ``batch`` (a ``Task.collate`` result).

    Encoder self-attention: keys beyond ``valid_lens`` are padding. Decoder self-attention: causal.
    Cross-attention: decoder queries, encoder keys (padding beyond ``valid_lens``). Induction
    sequences are right-padded to a fixed width: their padded queries are not real tokens (a causal
    mask already keeps real queries off the padded keys).
    """
    task = get_task(task_name)
    enc_len, dec_len = _real_lengths(task, batch)
    out = {}
    for name, _ in model.attention_layers():
        part, _, kind = name.split(".")
        if part == "enc":
            S = batch.src.shape[1]
            pos = torch.arange(S, device=batch.src.device)
            real = pos[None] < enc_len[:, None]  # (B, S)
            out[name] = _LayerMasks(real[:, None, :].expand(-1, S, -1), real, True)
        elif kind == "self":
            T = batch.tgt_in.shape[1]
            pos = torch.arange(T, device=batch.tgt_in.device)
            real = pos[None] < dec_len[:, None]  # (B, T)
            keep = causal_mask(T, device=batch.tgt_in.device)[None].expand(len(batch), -1, -1)
            out[name] = _LayerMasks(keep, real, True)
        else:  # cross: decoder queries x encoder keys
            S, T = batch.src.shape[1], batch.tgt_in.shape[1]
            pos = torch.arange(S, device=batch.src.device)
            keep = (pos[None] < enc_len[:, None])[:, None, :].expand(-1, T, -1)  # (B, T, S)
            real = torch.ones(len(batch), T, dtype=torch.bool, device=batch.src.device)
            out[name] = _LayerMasks(keep, real, False)
    return out


def _tokens(task, batch, b: int) -> tuple[list[str] | None, list[str] | None, list[str] | None]:
    """(encoder tokens, decoder input tokens, decoder output tokens) of example ``b`` of ``batch``."""
    src = [task.src_vocab[i] for i in batch.src[b].tolist()] if batch.src is not None else None
    tgt_in = [task.tgt_vocab[i] for i in batch.tgt_in[b].tolist()] if batch.tgt_in is not None else None
    tgt_out = [task.tgt_vocab[i] for i in batch.tgt_out[b].tolist()] if batch.tgt_out is not None else None
    return src, tgt_in, tgt_out


def _forward(model, task, batch):
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            task.forward(model, batch)
        return dict(model.attention_weights())  # {name: (B, H, Q, K)}
    finally:
        model.train(was_training)


def collect_attention(model, task_name: str, example, pad_to: int | None = None) -> AttentionMaps:
    """Run ``model`` on one example; return every layer's weights (on the CPU) with labels and masks.

    Labels. Encoder layers: the source characters; reversal's query rows are labelled with the letter
    that position writes (its target), so a head looks at the right key when row and column labels
    agree. Induction (decoder only): the sequence; the right-padding the batch adds is cut off, since
    no real query can see it. Dates decoder: a query
    row is labelled with the character that position *writes* (its target), a self-attention key
    with the token the position *reads* (``<bos>`` or the previous output), and cross-attention keys
    with the source characters.

    ``pad_to`` (tasks with padding, i.e. dates): right-pad the source to this many positions, as a
    short example is padded in a batch with longer ones; its padded keys appear masked.
    """
    task = get_task(task_name)
    device = next(model.parameters()).device
    batch = task.collate([tuple(example)], device)
    if pad_to is not None:
        if batch.valid_lens is None:
            raise ValueError(
                f"task {task_name!r} has no padding (its sequences all have one length): pad_to is not for it"
            )
        S = batch.src.shape[1]
        if pad_to < S:
            raise ValueError(f"pad_to={pad_to} is shorter than the example's {S} source characters")
        batch.src = torch.nn.functional.pad(batch.src, (0, pad_to - S), value=task.src_stoi[PAD])
    weights = _forward(model, task, batch)
    masks = layer_masks(model, task_name, batch)
    src, tgt_in, tgt_out = _tokens(task, batch, 0)
    n_dec = int(masks[next(iter(masks))].query_real[0].sum()) if task.name == "induction" else None
    maps = AttentionMaps([], [], [], [], [], [])
    for name, w in weights.items():
        m = masks[name]
        part, _, kind = name.split(".")
        w, keep = w[0].detach().float().cpu(), m.keep[0].cpu()  # (H, Q, K), (Q, K)
        if part == "enc" and task.model_kind == "encoder":  # one output per position: label it by what it writes
            q, k, axis = tgt_out, src, ("query: writes", "key (source)")
        elif part == "enc":
            q, k, axis = src, src, ("query (source)", "key (source)")
        elif task.model_kind == "decoder":
            w, keep = w[:, :n_dec, :n_dec], keep[:n_dec, :n_dec]
            q, k, axis = tgt_in[:n_dec], tgt_in[:n_dec], ("query", "key")
        elif kind == "self":
            q, k, axis = tgt_out, tgt_in, ("query: writes", "key: reads")
        else:
            q, k, axis = tgt_out, src, ("query: writes", "key (source)")
        maps.layer_names.append(name)
        maps.weights.append(w)
        maps.query_labels.append(list(q))
        maps.key_labels.append(list(k))
        maps.keep.append(keep)
        maps.axis_labels.append(axis)
    return maps


def average_attention(model, task_name: str, examples, batch_size: int = 500) -> AttentionMaps:
    """Every layer's weights averaged over ``examples``, position by position.

    Cell (q, k) is averaged over the examples in which query q is a real token and may attend to
    key k; a cell that exists in no example is masked. Averaging by position only makes sense when
    positions mean the same thing in every example (equal lengths, one format), so pass a
    position-aligned set. Labels are the positions 0, 1, 2, ... (``relabel`` them for the plot).
    """
    task = get_task(task_name)
    examples = [tuple(e) for e in examples]
    if not examples:
        raise ValueError("average_attention needs at least one example")
    device = next(model.parameters()).device
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, torch.Tensor] = {}
    for i in range(0, len(examples), batch_size):
        batch = task.collate(examples[i : i + batch_size], device)
        weights = _forward(model, task, batch)
        masks = layer_masks(model, task_name, batch)
        for name, w in weights.items():
            m = masks[name]
            cell = (m.keep & m.query_real[:, :, None]).float()  # (B, Q, K): this cell exists in this example
            s = (w * cell[:, None]).sum(0).cpu()  # (H, Q, K)
            c = cell.sum(0).cpu()  # (Q, K)
            if name in sums:  # batches may differ in width (dates): grow to the widest
                Q, K = max(sums[name].shape[1], s.shape[1]), max(sums[name].shape[2], s.shape[2])
                sums[name] = _grow(sums[name], Q, K) + _grow(s, Q, K)
                counts[name] = _grow(counts[name], Q, K) + _grow(c, Q, K)
            else:
                sums[name], counts[name] = s, c
    maps = AttentionMaps([], [], [], [], [], [], count=len(examples))
    for name in sums:
        c = counts[name]
        mean = sums[name] / c.clamp_min(1)  # (H, Q, K)
        keep = c > 0
        if task.model_kind == "decoder":  # cut the columns and rows no example reaches
            n = int(keep.any(dim=0).nonzero().max()) + 1
            mean, keep = mean[:, :n, :n], keep[:n, :n]
        mean = mean.masked_fill(~keep, float("nan"))
        part, _, kind = name.split(".")
        Q, K = keep.shape
        axis = ("query position", "key position") if kind == "self" else ("output position", "source position")
        maps.layer_names.append(name)
        maps.weights.append(mean)
        maps.query_labels.append([str(i) for i in range(Q)])
        maps.key_labels.append([str(j) for j in range(K)])
        maps.keep.append(keep)
        maps.axis_labels.append(axis)
    return maps


def _grow(x: torch.Tensor, Q: int, K: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, K - x.shape[-1], 0, Q - x.shape[-2]))


# =====================================================================================================
# per-head statistics and roles
# =====================================================================================================
def normalized_entropy(
    weights: torch.Tensor, keep: torch.Tensor, query_real: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Mean normalised entropy per head: weights (B, H, Q, K), keep (B, Q, K) bool -> (H,).

    Row i counts when it has at least two visible keys (and is a real query); its entropy
    :math:`-\sum_j w_{ij} \log w_{ij}` (0 log 0 = 0) is divided by :math:`\log n_i`, the entropy of
    a uniform spread over its :math:`n_i` visible keys. The mean is over all counted rows.
    """
    if weights.dim() != 4 or keep.shape != (weights.shape[0], *weights.shape[2:]):
        raise ValueError(
            f"weights must be (B, H, Q, K) and keep (B, Q, K); got {tuple(weights.shape)} and {tuple(keep.shape)}"
        )
    rows = _counted_rows(keep, query_real)  # (B, Q)
    n_vis = keep.sum(-1).clamp_min(2).to(weights.dtype)  # (B, Q); rows with < 2 keys are not counted
    ent = -torch.xlogy(weights, weights).sum(-1) / n_vis.log()[:, None]  # (B, H, Q)
    return _mean_over_rows(ent, rows)


def _counted_rows(keep: torch.Tensor, query_real: torch.Tensor | None) -> torch.Tensor:
    rows = keep.sum(-1) >= 2  # (B, Q)
    return rows if query_real is None else rows & query_real


def _mean_over_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x (B, H, Q) averaged over the counted rows (B, Q) -> (H,); NaN when no row counts."""
    r = rows[:, None, :].to(x.dtype)  # (B, 1, Q)
    if not bool(rows.any()):
        return torch.full((x.shape[1],), float("nan"), dtype=x.dtype, device=x.device)
    return (x * r).sum(dim=(0, 2)) / r.sum(dim=(0, 2))


def _offset_score(w: torch.Tensor, keep: torch.Tensor, rows: torch.Tensor, offset: int) -> torch.Tensor:
    """Mean weight of query i on key i + offset, over counted rows where that key is visible -> (H,)."""
    B, H, Q, K = w.shape
    i = torch.arange(Q, device=w.device)
    j = i + offset
    ok = (j >= 0) & (j < K)  # (Q,)
    jj = j.clamp(0, K - 1)
    on = w[:, :, i, jj]  # (B, H, Q)
    visible = keep[:, i, jj] & ok[None] & rows  # (B, Q)
    return _mean_over_rows(on, visible)


def _layer_stats(w: torch.Tensor, m: _LayerMasks) -> dict[str, torch.Tensor]:
    """All statistics of one layer: w (B, H, Q, K) -> {name: (H,)}."""
    H = w.shape[1]
    nan = torch.full((H,), float("nan"), device=w.device)
    rows = _counted_rows(m.keep, m.query_real)  # (B, Q)
    w = w * m.keep[:, None]  # exact zeros where masked (they already are)
    stats = {
        "entropy": normalized_entropy(w, m.keep, m.query_real),
        "confidence": _mean_over_rows(w.amax(-1), rows),
        "first": _mean_over_rows(w[..., 0], rows),
    }
    if m.same_sequence:
        Q, K = w.shape[2:]
        dist = (torch.arange(Q, device=w.device)[:, None] - torch.arange(K, device=w.device)[None]).abs()  # (Q, K)
        stats["distance"] = _mean_over_rows((w * dist).sum(-1), rows)
        stats["self"] = _offset_score(w, m.keep, rows, 0)
        stats["prev"] = _offset_score(w, m.keep, rows, -1)
        stats["next"] = _offset_score(w, m.keep, rows, +1)
    else:
        stats.update(distance=nan, self=nan, prev=nan, next=nan)
    # Redundancy: total-variation distance 1/2 sum_j |w_hj - w_gj| to the most similar other head of the layer.
    tv = 0.5 * (w[:, :, None] - w[:, None, :]).abs().sum(-1)  # (B, H, H, Q)
    tv = torch.stack([_mean_over_rows(tv[:, h], rows) for h in range(H)])  # (H, H)
    tv = tv + torch.diag(torch.full((H,), float("inf"), device=w.device))
    stats["tv_to_nearest"] = tv.amin(dim=1) if H > 1 else nan
    return stats


STAT_KEYS = ("entropy", "distance", "confidence", "first", "self", "prev", "next", "tv_to_nearest")
PATTERN_KEYS = {  # task pattern (from Task.pattern_scores) -> role name
    "reversal": {"anti_diagonal": "anti-diagonal"},
    "induction": {"previous_token": "previous-token", "induction": "induction"},
    "dates": {"field_alignment": "aligned"},
}


def head_stats(model, task_name: str, examples) -> dict[str, torch.Tensor]:
    """Per-head statistics of ``model`` on ``examples``: {name: (num_attention_layers, num_heads) CPU tensor}.

    Always present (rows in ``model.attention_layers()`` order):
      ``entropy``     mean normalised entropy (1 = uniform over the visible keys, 0 = one key);
      ``distance``    mean |i - j| under the weights (NaN for cross-attention);
      ``confidence``  mean largest weight of a row;
      ``first``       mean weight on key 0 (the first token, or ``<bos>``);
      ``self``, ``prev``, ``next``  mean weight on key i, i - 1, i + 1 (NaN for cross-attention);
      ``tv_to_nearest``  mean total-variation distance to the most similar other head of the same
                      layer (0 = an identical twin);
    plus the task's own patterns from ``Task.pattern_scores`` (NaN for layers they do not cover):
    ``anti_diagonal`` (reversal), ``previous_token`` and ``induction`` (induction),
    ``field_alignment`` (dates, cross-attention).
    Rows count as described in the module docstring (real queries with at least two visible keys).
    """
    task = get_task(task_name)
    examples = [tuple(e) for e in examples]
    if not examples:
        raise ValueError("head_stats needs at least one example")
    device = next(model.parameters()).device
    batch = task.collate(examples, device)
    weights = _forward(model, task, batch)
    masks = layer_masks(model, task_name, batch)
    names = [name for name, _ in model.attention_layers()]
    per_layer = [_layer_stats(weights[name], masks[name]) for name in names]
    out = {key: torch.stack([s[key] for s in per_layer]).float().cpu() for key in STAT_KEYS}
    was_training = model.training
    model.eval()
    try:
        patterns = task.pattern_scores(model, examples)
    finally:
        model.train(was_training)
    for key in PATTERN_KEYS[task.name]:
        table = torch.full((len(names), model.num_heads), float("nan"))
        for l, name in enumerate(names):
            if name in patterns[key]:
                table[l] = torch.tensor(patterns[key][name])
        out[key] = table
    return out


GENERIC_ROLES = {"first": "first-token/BOS", "self": "self/diagonal", "prev": "previous-token", "next": "next-token"}


def role_labels(
    stats: dict[str, torch.Tensor],
    pattern_threshold: float = 0.5,
    focus_threshold: float = 0.5,
    diffuse_entropy: float = 0.8,
    redundant_tv: float = 0.15,
) -> list[list[str]]:
    """A name for what each head does, [layer][head], from ``head_stats``'s numbers.

    Rules, first match wins:

    1. a task pattern (anti-diagonal, previous-token, induction, aligned) that gets at least
       ``pattern_threshold`` of the head's weight: the head puts more weight on the pattern's key(s)
       than on all other keys together, several times chance (about 1 / number of visible keys);
    2. a generic position (first-token/BOS, self/diagonal, previous-token, next-token) with at least
       ``focus_threshold`` of the weight;
    3. ``diffuse``: normalised entropy at least ``diffuse_entropy`` (an even spread over half of 20
       keys already gives log 10 / log 20 = 0.77);
    4. ``mixed``: none of these.

    `` (redundant)`` is appended when another head of the same layer attends almost the same way:
    mean total-variation distance below ``redundant_tv`` (their distributions overlap by more than
    85% on average). Every member of such a group is marked: any one of them could stand in for
    the others, which does not mean that all of them can go.
    """
    if "entropy" not in stats or "tv_to_nearest" not in stats:
        raise ValueError("role_labels needs the dict returned by head_stats")
    L, H = stats["entropy"].shape
    patterns = [k for k in stats if k not in STAT_KEYS]
    names = {k: r for task in PATTERN_KEYS.values() for k, r in task.items()}
    labels = []
    for l in range(L):
        row = []
        for h in range(H):

            def best(keys, threshold, l=l, h=h):
                scored = [(float(stats[k][l, h]), k) for k in keys if not math.isnan(float(stats[k][l, h]))]
                scored = [s for s in scored if s[0] >= threshold]
                return max(scored)[1] if scored else None

            if (k := best(patterns, pattern_threshold)) is not None:
                role = names.get(k, k)
            elif (k := best(GENERIC_ROLES, focus_threshold)) is not None:
                role = GENERIC_ROLES[k]
            elif float(stats["entropy"][l, h]) >= diffuse_entropy:
                role = "diffuse"
            else:
                role = "mixed"
            if float(stats["tv_to_nearest"][l, h]) < redundant_tv:
                role += " (redundant)"
            row.append(role)
        labels.append(row)
    return labels


def stats_table(stats: dict[str, torch.Tensor], layer_names, roles=None, columns=None, decimals: int = 3):
    """A pandas DataFrame with one row per head (index: layer, head) and one column per statistic."""
    import pandas as pd

    L, H = stats["entropy"].shape
    if len(layer_names) != L:
        raise ValueError(f"{len(layer_names)} layer names for {L} layers")
    columns = list(columns) if columns is not None else list(stats)
    data = {c: stats[c].flatten().tolist() for c in columns}
    if roles is not None:
        data["role"] = [roles[l][h] for l in range(L) for h in range(H)]
    index = pd.MultiIndex.from_tuples([(n, h) for n in layer_names for h in range(H)], names=["layer", "head"])
    return pd.DataFrame(data, index=index).round(decimals)


def plot_head_stats(stats: dict[str, torch.Tensor], layer_names, roles, columns, title: str, thresholds=None):
    """Horizontal bars, one row per head (labelled with its role), one panel per statistic; returns the Figure.

    ``thresholds`` {column: value} draws a dashed line per panel; by default the ``role_labels`` rules:
    0.5 on task patterns and on the generic position scores, 0.8 on entropy. NaN values show as "n/a".
    """
    import matplotlib.pyplot as plt

    L, H = stats["entropy"].shape
    unknown = [c for c in columns if c not in stats]
    if unknown:
        raise ValueError(f"unknown statistics {unknown}; available: {sorted(stats)}")
    patterns = {k for task in PATTERN_KEYS.values() for k in task}
    if thresholds is None:
        thresholds = {"entropy": 0.8, **{k: 0.5 for k in [*patterns, *GENERIC_ROLES]}}
    labels = [f"{layer_names[l]} h{h}: {roles[l][h]}" for l in range(L) for h in range(H)]
    y = list(range(L * H))
    fig, axes = plt.subplots(
        1,
        len(columns),
        figsize=(2.1 * len(columns) + 2.6, 0.26 * L * H + 1.1),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    for i, (ax, col) in enumerate(zip(axes[0], columns, strict=True)):
        values = stats[col].flatten().tolist()
        ax.barh(y, [0.0 if math.isnan(v) else v for v in values], color=f"C{i}", height=0.7)
        for yy, v in zip(y, values, strict=True):
            if math.isnan(v):
                ax.text(0.02, yy, "n/a", va="center", fontsize=7, color="0.4", transform=ax.get_yaxis_transform())
        ax.set_title(col.replace("_", " "), fontsize=9)
        ax.tick_params(labelsize=7.5)
        if col in ("entropy", "confidence", "first", "self", "prev", "next") or col in patterns:
            ax.set_xlim(0, 1)
        if col in thresholds:
            ax.axvline(thresholds[col], color="0.3", ls="--", lw=0.8)
        for l in range(1, L):
            ax.axhline(l * H - 0.5, color="0.7", lw=0.6)
    axes[0, 0].set_yticks(y, labels)
    axes[0, 0].invert_yaxis()
    fig.suptitle(title, fontsize=10)
    return fig


def date_field_labels(fmt: str) -> list[str]:
    """One label per source character of a fixed-width date format, naming its field (``dd.mm.YYYY``)."""
    text, spans = render_date(datetime.date(2000, 10, 20), fmt)  # a date whose fields have their longest widths
    letters = {"year": "Y", "month": "m", "day": "d", "weekday": "w"}
    labels = list(text)
    for name, (start, end) in spans.items():
        for i in range(start, end):
            labels[i] = letters[name]
    return labels
