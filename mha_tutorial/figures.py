"""The series' figures: one style for every notebook, and the data-flow schematics of the core notebooks."""

from __future__ import annotations

MIN_TICK_PT = 8.0  # the smallest type on any figure of the series


def use_style() -> None:
    """The series' figure settings: 100 dpi and type large enough to read where notebooks are shown
    (GitHub, JupyterLab, the site). Call it after any seaborn theme, which resets these settings."""
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 100,
            "font.size": 10,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "xtick.labelsize": 9,
            "ytick.labelsize": 9,
            "legend.fontsize": 9,
            "figure.titlesize": 12,
        }
    )


def draw_flow(boxes: dict, arrows: list, title: str = "", size=(10, 4), box=(0.1, 0.2), notes=()):
    """A data-flow schematic: the series draws one per core notebook, with a tensor shape on every arrow.

    Args:
        boxes: ``{name: (x, y, text)}``, each box's centre in axes units (0..1).
        arrows: ``[(from_name, to_name, label)]``, the label (a shape such as ``"(B, Q, d)"``) beside the arrow.
        title: the figure's title; size: the figure size in inches; box: (width, height) of every box.
        notes: ``[(x, y, text)]``, free labels (for example the name of a group of steps).
    Returns the figure (end the cell with ``plt.show()``).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=size)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.03, top=0.9 if title else 0.97)
    ax.set(xlim=(0, 1), ylim=(0, 1))
    ax.set_axis_off()
    w, h = box

    def edge(a, b):  # where the line from the centre of box a towards box b leaves box a
        (xa, ya, _), (xb, yb, _) = boxes[a], boxes[b]
        t = min(w / 2 / abs(xb - xa) if xb != xa else 1.0, h / 2 / abs(yb - ya) if yb != ya else 1.0)
        return xa + t * (xb - xa), ya + t * (yb - ya)

    for x, y, text in boxes.values():
        patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.005", fc="#e8eef8", ec="#35609a")
        ax.add_patch(patch)
        ax.text(x, y, text, ha="center", va="center")
    for a, b, label in arrows:
        (x0, y0), (x1, y1) = edge(a, b), edge(b, a)
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops={"arrowstyle": "-|>", "color": "0.3", "lw": 1.2})
        vertical = abs(x1 - x0) < abs(y1 - y0)  # the label beside a vertical arrow, above any other
        x_text, y_text = (x0 + x1) / 2 + (0.01 if vertical else 0), (y0 + y1) / 2 + (0 if vertical else 0.04)
        ha, va = ("left", "center") if vertical else ("center", "bottom")
        ax.text(x_text, y_text, label, ha=ha, va=va, fontsize=9, color="#9b2d20")
    for x, y, text in notes:
        ax.text(x, y, text, ha="center", va="center", fontweight="bold", color="#35609a")
    ax.set_title(title)
    return fig


def _box(ax, x, y, w, title, lines, color):
    """A rounded box centred at (x, y): a bold title, then one line per entry (the shapes that flow through it)."""
    from matplotlib.patches import FancyBboxPatch

    h = 0.42 + 0.3 * len(lines)
    patch = FancyBboxPatch(
        (x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.12", fc=color, ec="0.25", lw=1.2
    )
    ax.add_patch(patch)
    top = y + h / 2 - 0.24
    ax.text(x, top, title, ha="center", va="center", fontsize=10, fontweight="bold")
    for i, line in enumerate(lines):
        ax.text(x, top - 0.3 * (i + 1), line, ha="center", va="center", fontsize=9)


def _arrow(ax, start, end, label="", offset=(0.0, 0.1), ha="center"):
    """An arrow from ``start`` to ``end`` with an optional label beside its middle."""
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.3, color="0.2"))
    if label:
        x, y = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(x, y, label, ha=ha, va="bottom", fontsize=9, color="0.15")


def pruning_diagram():
    """Notebook 07's map of its experiments: gates in, loss out; scores give an order; the order gives a pruning
    curve and a cut. Returns the figure (end the cell with ``plt.show()``)."""
    import matplotlib.pyplot as plt

    flow, gate, score, cut = "#d6e6f5", "#fde2c8", "#dcefd8", "#ecdff5"
    fig, ax = plt.subplots(figsize=(12.5, 6.0))
    ax.set(xlim=(0, 12.5), ylim=(0.1, 6.1))
    ax.axis("off")
    # Row 1: one forward pass, every head scaled by its gate.
    _box(ax, 1.3, 5.3, 2.2, "examples", ["tokens (B, T)"], flow)
    _box(ax, 4.7, 5.3, 3.4, "model(..., head_mask=ξ)", ["head h of layer l times ξ[l, h]"], flow)
    _box(ax, 8.2, 5.3, 2.0, "logits", ["(B, T, V)"], flow)
    _box(ax, 11.1, 5.3, 2.4, r"loss $\mathcal{L}(\xi)$", ["scalar, and accuracy"], flow)
    for start, end in [((2.4, 5.3), (3.0, 5.3)), ((6.4, 5.3), (7.2, 5.3)), ((9.2, 5.3), (9.9, 5.3))]:
        _arrow(ax, start, end)
    # Row 2: the gates, the scores of every head, and the order they give.
    _box(ax, 1.3, 3.2, 2.4, "head_mask ξ", ["(L, H)", "1 = on, 0 = off"], gate)
    _box(ax, 4.7, 3.2, 2.6, "removal order", ["L·H pairs (l, h),", "least important first"], gate)
    scores = [
        r"gradient: $I$ = mean over x of |∂$\mathcal{L}_x$/∂ξ|",
        "ablation: Δ loss with one gate at 0",
        "or entropy (06), or random",
    ]
    _box(ax, 9.6, 3.2, 5.0, "scores of every head: (L, H)", scores, score)
    _arrow(ax, (1.6, 3.8), (3.4, 4.95), "gates", offset=(-0.5, 0.0))
    _arrow(ax, (11.1, 4.95), (11.1, 3.95), "one backward pass per example,", offset=(0.15, 0.12), ha="left")
    ax.text(11.25, 4.33, "or one run per head", ha="left", va="bottom", fontsize=9, color="0.15")
    _arrow(ax, (7.1, 3.2), (6.0, 3.2), "sort", offset=(0.0, 0.06))
    _arrow(ax, (3.4, 3.2), (2.5, 3.2), "first k", offset=(0.0, 0.06))
    # Row 3: the pruning curve, and physical pruning of the heads the curve says can go.
    _box(ax, 1.3, 1.1, 2.4, "pruning curve", ["accuracy for k = 0 .. L·H:", "(L·H + 1,)"], score)
    _box(ax, 5.3, 1.1, 3.0, "pruning.pruned_copy", ["the first k heads, n in a layer,", "each d = D / H wide"], cut)
    shapes = ["W_q, W_k, W_v weights: (D, D) → (D − n·d, D)", "W_o weight: (D, D) → (D, D − n·d)"]
    _box(ax, 9.9, 1.1, 4.4, "a smaller model", shapes, cut)
    _arrow(ax, (1.3, 2.65), (1.3, 1.6), "k heads off", offset=(0.1, -0.05), ha="left")
    _arrow(ax, (4.9, 2.65), (5.2, 1.6), "which heads", offset=(0.12, -0.05), ha="left")
    _arrow(ax, (2.5, 1.1), (3.8, 1.1), "k from\nthe curve", offset=(0.0, 0.06))
    _arrow(ax, (6.8, 1.1), (7.7, 1.1))
    ax.set_title("The pruning experiment: gates in, loss out; scores give an order; the order gives a curve and a cut")
    return fig


_ATTN, _NORM, _FFN, _EMB, _OUT = "#cfe2f3", "#eeeeee", "#d9ead3", "#fff2cc", "#f4cccc"


def _flow_box(ax, x, y, text, colour, w=2.6):
    """A rounded box of one line or two, centred at (x, y), 0.6 high."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - 0.3), w, 0.6, boxstyle="round,pad=0.05", fc=colour, ec="0.3"))
    ax.text(x, y, text, ha="center", va="center", fontsize=9)


def _flow_arrow(ax, start, end, label=""):
    """A vertical arrow with the shape of the data that flows along it written beside it."""
    ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "-|>", "color": "0.2", "lw": 1.2})
    ax.text(start[0] + 0.12, (start[1] + end[1]) / 2, label, fontsize=8.5, va="center")


def _stack_column(ax, x, rows, length, sublayers):
    """One stack, from the top down: ids, embedding, then (sublayer, add & norm) pairs with their residual paths.

    ``rows`` gives the heights of the ids, the embedding and the first sublayer; ``length`` is "S" (source) or
    "T" (target). Returns the height of the last add & norm.
    """
    from matplotlib.patches import Rectangle

    ax.text(x, rows[0], "src: source ids" if length == "S" else "tgt_in: target ids", ha="center", fontsize=9)
    _flow_box(ax, x, rows[1], "token embedding + position embedding", _EMB, w=3.6)
    _flow_arrow(ax, (x, rows[0] - 0.1), (x, rows[1] + 0.35), f"(B, {length})")
    _flow_arrow(ax, (x, rows[1] - 0.35), (x, rows[2] + 0.35), f"(B, {length}, D)")
    for i, (name, colour) in enumerate(sublayers):
        y_sub, y_norm = rows[2] - 2 * i, rows[2] - 2 * i - 1
        _flow_box(ax, x, y_sub, name, colour)
        _flow_box(ax, x, y_norm, "add & norm", _NORM)
        _flow_arrow(ax, (x, y_sub - 0.35), (x, y_norm + 0.35), f"(B, {length}, D)")
        if i + 1 < len(sublayers):
            _flow_arrow(ax, (x, y_norm - 0.35), (x, y_norm - 0.65), f"(B, {length}, D)")
        # the residual path: a sublayer's input also goes to its add & norm
        ax.plot([x, x - 1.6, x - 1.6], [y_sub + 0.45, y_sub + 0.45, y_norm], color="0.5", lw=1)
        ax.annotate(
            "", xy=(x - 1.3, y_norm), xytext=(x - 1.6, y_norm), arrowprops={"arrowstyle": "-|>", "color": "0.5"}
        )
    bottom = rows[2] - 2 * len(sublayers) + 1
    ax.add_patch(Rectangle((x - 1.9, bottom - 0.55), 3.8, rows[2] - bottom + 1.17, fill=False, ls="--", ec="0.4"))
    ax.text(x - 1.85, rows[2] + 0.85, "× num_enc_layers" if length == "S" else "× num_dec_layers", fontsize=9)
    return bottom


def transformer_diagram():
    """Notebook 05's map of the encoder–decoder transformer (the dates model), with the shape of the data on every
    arrow and a note on the encoder-only and decoder-only variants. Returns the figure (end the cell with
    ``plt.show()``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6.9))
    ax.set(xlim=(0.3, 10.0), ylim=(-0.45, 10.75))
    ax.axis("off")
    xe, xd, rows = 2.4, 7.3, [10.3, 9.2, 7.7]
    enc_out = _stack_column(
        ax, xe, rows, "S", [("self-attention\n(padding keys masked)", _ATTN), ("FFN: D → F → D", _FFN)]
    )
    decoder = [("causal self-attention", _ATTN), ("cross-attention", _ATTN), ("FFN: D → F → D", _FFN)]
    dec_out = _stack_column(ax, xd, rows, "T", decoder)
    _flow_box(ax, xd, 1.1, "output layer: Linear D → V", _OUT, w=3.2)
    _flow_arrow(ax, (xd, dec_out - 0.35), (xd, 1.45), "(B, T, D)")
    _flow_arrow(ax, (xd, 0.75), (xd, 0.05), "(B, T, V)")
    ax.text(xd, -0.25, "logits", ha="center", va="center", fontsize=9)
    # the encoder's output, the memory, is the keys and values of every cross-attention
    y_cross, x_turn = 5.7, 4.45
    ax.plot([xe, xe, x_turn, x_turn], [enc_out - 0.35, 3.5, 3.5, y_cross], color="0.2", lw=1.2)
    arrowprops = {"arrowstyle": "-|>", "color": "0.2", "lw": 1.2}
    ax.annotate("", xy=(xd - 1.3, y_cross), xytext=(x_turn, y_cross), arrowprops=arrowprops)
    ax.text(xe + 0.12, 3.22, "memory M: (B, S, D)", fontsize=8.5)
    ax.text(x_turn + 0.08, y_cross + 0.1, "keys, values", fontsize=8.5)
    legend = (
        "B batch, S source length, T target length,\nD model width, F FFN width, V vocabulary\n\n"
        "encoder-only (reversal): the left column\n    followed by the output layer\n"
        "decoder-only (induction): the right column\n    without cross-attention (and, here, F = 0:\n    no FFN and no add & norm after it)"
    )
    ax.text(0.4, 1.9, legend, fontsize=9, va="top")
    ax.set_title("Data flow of the encoder–decoder transformer (the dates model), shapes on the arrows")
    return fig


def memory_rows(rows, colors, xlabel="slot", title="", size=(9, 3.6)):
    """Rows of numbered boxes on one shared slot axis: a block of memory and the orders in which views read it.

    Args:
        rows: ``[(label, texts, groups)]`` from top to bottom; the label is written above the row, ``texts[i]``
            in slot ``i``'s box, and ``groups[i]`` (an int) picks that box's fill from ``colors``.
        colors: fill colours, one per group; xlabel, title, size: the slot axis' label, the title, the size in inches.
    Returns the figure (end the cell with ``plt.show()``).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    slots = max(len(texts) for _, texts, _ in rows)
    fig, ax = plt.subplots(figsize=size)
    for r, (label, texts, groups) in enumerate(rows):
        y = -1.8 * r  # the centre of row r's boxes; its label sits just above them
        ax.text(-0.5, y + 0.6, label, ha="left", va="bottom", fontsize=9)
        for i, (text, group) in enumerate(zip(texts, groups, strict=True)):
            ax.add_patch(Rectangle((i - 0.47, y - 0.5), 0.94, 1.0, fc=colors[group], ec="0.3", lw=0.6))
            ax.text(i, y, text, ha="center", va="center", fontsize=8)
    ax.set(xlim=(-0.55, slots - 0.45), ylim=(-1.8 * (len(rows) - 1) - 0.6, 1.25), xlabel=xlabel, title=title)
    ax.set_xticks(range(slots))
    ax.set_yticks([])
    ax.tick_params(length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
