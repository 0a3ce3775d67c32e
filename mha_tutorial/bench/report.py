"""What the benchmark reports: one ``Row`` per measurement, and the tables and plot made from them.

``python -m mha_tutorial.bench attention`` (see ``bench``) measures; this module turns its rows into the
ratios of ours to PyTorch's (``ratios``), achieved TFLOP/s (``flops``, ``tflops``), a Markdown
table, a CSV file that can be read back (``write_csv``, ``read_csv``) and a log-log plot of time
and peak memory against the sequence length (``plot``).
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "PartialCsv",
    "Row",
    "flops",
    "format_row",
    "plot",
    "ratios",
    "read_csv",
    "tflops",
    "to_markdown",
    "write_csv",
    "write_reports",
]

# The pairs the targets compare: (ours, PyTorch's equivalent on the same weights and mask).
PAIRS = (
    ("readable", "nn.MHA (weights)"),  # both materialise the (B, H, T, T) weights
    ("fused", "nn.MHA"),  # both hand a bool mask to a fused kernel
    ("fused (is_causal)", "SDPA (is_causal)"),  # both let PyTorch pick flash attention (no mask tensor)
)


@dataclass
class Row:
    """One measurement: an implementation, a pass and a size; its median time, spread and peak memory.

    ``status`` is "ok", or says why nothing was measured (skipped over the memory budget, out of memory).
    """

    impl: str
    pass_: str
    dtype: str
    device: str
    threads: int
    batch: int
    seq: int
    hiddens: int
    heads: int
    median_ms: float = math.nan
    iqr_ms: float = math.nan
    peak_mib: float = math.nan
    status: str = "ok"


def format_row(row: Row) -> str:
    if row.status != "ok":
        return f"  {row.pass_:16} {row.impl:20} T={row.seq:<5} {row.status}"
    return (
        f"  {row.pass_:16} {row.impl:20} T={row.seq:<5} {row.median_ms:10.2f} ms "
        f"(IQR {row.iqr_ms:.2f})  peak {row.peak_mib:9.1f} MiB"
    )


def ratios(rows: list[Row]) -> list[tuple]:
    """(dtype, pass, seq, ours, theirs, ours_ms / theirs_ms) for the pairs in ``PAIRS``."""
    index = {(r.dtype, r.pass_, r.seq, r.impl): r for r in rows if r.status == "ok"}
    out = []
    for (dtype, p, seq, impl), r in index.items():
        for ours, theirs_name in PAIRS:
            theirs = index.get((dtype, p, seq, theirs_name))
            if impl == ours and theirs is not None:
                out.append((dtype, p, seq, impl, theirs.impl, r.median_ms / theirs.median_ms))
    return out


def flops(row: Row) -> float:
    """Useful floating-point operations of one call of causal self-attention with its four projections.

    Projections: 4 matmuls of (B*T, D) by (D, D) = 8*B*T*D^2. Attention: Q K^T and weights @ V, each
    2*B*H*T^2*d, halved because a causal mask makes half of the (T, T) products unnecessary.
    Backward counts twice the forward (the usual convention: two matmuls per forward matmul).
    """
    B, T, D = row.batch, row.seq, row.hiddens
    forward = 8 * B * T * D**2 + 0.5 * 4 * B * T**2 * D
    return forward * (3 if row.pass_ == "forward+backward" else 1)


def tflops(row: Row) -> float:
    """Achieved TFLOP/s, counting only the useful operations of ``flops``."""
    return flops(row) / (row.median_ms * 1e-3) / 1e12 if row.status == "ok" else math.nan


def to_markdown(rows: list[Row]) -> str:
    head = (
        "| pass | dtype | T | implementation | median ms | IQR ms | TFLOP/s | peak MiB | status |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r.pass_} | {r.dtype} | {r.seq} | {r.impl} | {r.median_ms:.2f} | {r.iqr_ms:.2f} | {tflops(r):.3g} "
        f"| {r.peak_mib:.1f} | {r.status} |"
        for r in rows
    ]
    first = rows[0] if rows else None
    setting = (
        f"{first.device}, {first.threads} threads, batch {first.batch}, {first.hiddens} hiddens, "
        f"{first.heads} heads, causal self-attention\n\n"
        if first
        else ""
    )
    pairs = "\n".join(f"- {d}, {p}, T={s}: {a} / {b} = {x:.2f}" for d, p, s, a, b, x in ratios(rows))
    return setting + head + "\n".join(lines) + ("\n\nRatios (ours / PyTorch's):\n\n" + pairs if pairs else "") + "\n"


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


class PartialCsv:
    """A CSV file written row by row while a sweep runs, so that a sweep cut short keeps what it measured."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = open(self.path, "w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=list(asdict(_blank_row())))
        self.writer.writeheader()

    def write(self, row: Row) -> None:
        self.writer.writerow(asdict(row))
        self.file.flush()

    def remove(self) -> None:
        """Close and delete the file: the sweep finished, and ``write_reports`` writes the whole table."""
        self.file.close()
        self.path.unlink()


def plot(rows: list[Row], path: Path | None = None, title: str | None = None):
    """Time and peak memory against sequence length, log-log, one line per implementation (same colour in every panel)."""
    import matplotlib
    import matplotlib.ticker

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.status == "ok"]
    passes = [p for p in ("forward", "forward+backward") if any(r.pass_ == p for r in ok)]
    # Peak memory from forward+backward when measured: on the CPU a forward-only figure misses the
    # buffers inside fused kernels, while backward keeps what it needs in tensors that are counted.
    memory_pass = passes[-1]
    dtypes = sorted({r.dtype for r in ok})
    seqs = sorted({r.seq for r in ok})
    names = list(dict.fromkeys(r.impl for r in ok))
    colours = dict(zip(names, plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2], strict=False))
    fig, axes = plt.subplots(
        len(dtypes), len(passes) + 1, figsize=(5 * (len(passes) + 1), 4 * len(dtypes)), squeeze=False
    )
    for i, dtype in enumerate(dtypes):
        for j, p in enumerate([*passes, "memory"]):
            ax = axes[i, j]
            source = [r for r in ok if r.dtype == dtype and r.pass_ == (memory_pass if p == "memory" else p)]
            for impl in dict.fromkeys(r.impl for r in source):
                pts = sorted((r.seq, r.peak_mib if p == "memory" else r.median_ms) for r in source if r.impl == impl)
                style = "--" if "compiled" in impl else "-"
                ax.plot(*zip(*pts, strict=True), style, marker="o", color=colours[impl], label=impl)
            ax.set(
                xscale="log",
                yscale="log",
                xlabel="sequence length T",
                ylabel="peak memory (MiB)" if p == "memory" else "median time (ms)",
                title=f"{'peak memory, ' + memory_pass if p == 'memory' else p} ({dtype})",
            )
            ax.set_xticks(seqs, [str(t) for t in seqs])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.grid(True, which="both", alpha=0.3)
    axes[0, -1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def read_csv(path: Path) -> list[Row]:
    """Rows written by ``write_csv``, e.g. to redraw a plot without rerunning the benchmark."""
    types = {name: type(value) for name, value in asdict(_blank_row()).items()}
    with open(path, newline="") as f:
        return [Row(**{k: types[k](v) for k, v in row.items()}) for row in csv.DictReader(f)]


def write_reports(rows: list[Row], out: Path, title: str) -> None:
    """bench.md, bench.csv and bench.png (titled ``title``) in the folder ``out``; the table also goes to the terminal."""
    (out / "bench.md").write_text(to_markdown(rows))
    write_csv(rows, out / "bench.csv")
    plot(rows, out / "bench.png", title=title)
    print()
    print(to_markdown(rows))
    print(f"wrote {out / 'bench.md'}, {out / 'bench.csv'}, {out / 'bench.png'}")


def _blank_row() -> Row:
    return Row("", "", "", "", 0, 0, 0, 0, 0)
