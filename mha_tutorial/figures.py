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
