"""The tiled attention of ``modern/flash.py`` against PyTorch's fused kernels: time, TFLOP/s and peak memory against T.

    python -m mha_tutorial.bench flash --quick                  # seconds on a CPU (what the tests run)
    python -m mha_tutorial.bench flash --device cpu             # the CPU sweep, float32
    python -m mha_tutorial.bench flash --device cuda            # T = 1k ... 16k in bfloat16 on a GPU

Attention alone (no projections): q, k, v of shape (B, H, T, d) with B·T tokens fixed (FlashAttention-2's
benchmark setting: 16k tokens, d = 128, 16 heads), causal. Every implementation is checked against PyTorch's
reference (its math kernel in float64 where the weights fit, else its default kernel) before anything is timed:
the output and all three gradients, as max |difference| / max |reference| per tensor. One that disagrees is
reported and not timed. Times: ``torch.utils.benchmark`` (warm-up, median of repeated blocks; it
synchronises CUDA). TFLOP/s counts the useful work, FlashAttention-2's way: 4·B·H·T²·d for the forward, halved
when causal; backward = 2.5 × forward. Peak memory is that of one call beyond its inputs:
``torch.cuda.max_memory_allocated`` on a GPU, ``bench.PeakMemory`` (every storage created) on the CPU.

An implementation that runs out of memory at some T is reported as such and not tried at larger T.
Results go to the terminal and, as Markdown, CSV and a PNG, to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import benchmark

from ..core.attention import scaled_dot_product_attention
from ..core.masks import causal_mask
from ..data import DATA_DIR
from ..modern.flash import flash_attention
from .attention import peak_bytes

# max |diff| / max |reference| over the output and gradients, beyond which an implementation is not timed
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}
PASSES = ("forward", "forward+backward")


@dataclass
class Row:
    impl: str
    pass_: str
    dtype: str
    device: str
    batch: int
    heads: int
    head_dim: int
    seq: int
    median_ms: float = math.nan
    iqr_ms: float = math.nan
    tflops: float = math.nan
    peak_mib: float = math.nan
    max_diff: float = math.nan
    status: str = "ok"


def flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool, pass_: str) -> float:
    """Useful FLOPs: Q Kᵀ and P V are 2·T²·d each per head; causal halves them; backward is 2.5 × forward."""
    forward = 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
    return forward * (3.5 if pass_ == "forward+backward" else 1.0)


def _sdpa(backend):
    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


def implementations(device: torch.device, block_k: int, triton: bool, block_q: int | None = None) -> dict:
    """name -> f(q, k, v) for causal attention with Q = K (so top-left and bottom-right causal agree); the PyTorch
    tiles take ``block_q`` queries (None: all at once) by ``block_k`` keys."""
    impls = {
        "materialising (package)": lambda q, k, v: scaled_dot_product_attention(
            q, k, v, mask=causal_mask(q.shape[-2], device=q.device)
        )[0],
        "tiled, PyTorch (ours)": lambda q, k, v: flash_attention(
            q, k, v, is_causal=True, block_q=block_q, block_k=block_k
        ),
        "SDPA math": _sdpa(SDPBackend.MATH),
        "SDPA flash": _sdpa(SDPBackend.FLASH_ATTENTION),
    }
    if device.type == "cuda":
        impls["SDPA cuDNN"] = _sdpa(SDPBackend.CUDNN_ATTENTION)
        impls["SDPA mem-efficient"] = _sdpa(SDPBackend.EFFICIENT_ATTENTION)
        if triton:
            try:
                from ..modern.flash_triton import triton_flash_attention
            except ImportError as error:  # a PyTorch build without Triton
                print(f"tiled, Triton (ours): skipped ({error})")
            else:
                impls["tiled, Triton (ours)"] = lambda q, k, v: triton_flash_attention(q, k, v, is_causal=True)
    return impls


def _inputs(batch, heads, seq, head_dim, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(batch, heads, seq, head_dim, generator=g, device=device, dtype=dtype) for _ in range(3)]


def _out_and_grads(f, q, k, v, d_out):
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = f(*inputs)
    return [out.detach(), *torch.autograd.grad(out, inputs, d_out)]


def reference(q, k, v, d_out):
    """Output and gradients from PyTorch's math kernel in float64 where it fits, else its default kernel."""
    budget = 10 * 2**30 if q.is_cuda else 2**30
    if q.numel() // q.shape[-1] * q.shape[-2] * 8 <= budget:  # float64 (B, H, T, T) weights: 10 GiB GPU, 1 GiB CPU
        got = _out_and_grads(_sdpa(SDPBackend.MATH), *(x.double() for x in (q, k, v)), d_out.double())
    else:
        got = _out_and_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, d_out)
    return [x.float() for x in got]


def max_difference(f, q, k, v, d_out, expected) -> float:
    """The largest max |difference| / max |expected| over the output and the three gradients."""
    got = _out_and_grads(f, q, k, v, d_out)
    return max(((a.float() - b).abs().max() / b.abs().max()).item() for a, b in zip(got, expected, strict=True))


def measure(f, q, k, v, pass_: str, min_run_time: float):
    """(median ms, IQR ms, peak MiB) of one pass."""
    inputs = [x.detach().requires_grad_(pass_ != "forward") for x in (q, k, v)]
    d_out = torch.ones_like(q)

    def step():
        if pass_ == "forward":
            with torch.no_grad():
                f(*inputs)
        else:
            f(*inputs).backward(d_out)

    step()  # warm-up: kernels, allocator, autotuning
    m = benchmark.Timer(stmt="step()", globals={"step": step}).blocked_autorange(min_run_time=min_run_time)
    existing = [*inputs, d_out, *(x.grad for x in inputs if x.grad is not None)]
    return m.median * 1e3, m.iqr * 1e3, peak_bytes(step, q.is_cuda, existing) / 2**20


def _is_oom(error: Exception) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def run(options) -> list[Row]:
    """Every implementation at every length, in one process: the ratios between rows are side by side."""
    device, dtype = torch.device(options.device), getattr(torch, options.dtype)
    impls, rows, stopped = implementations(device, options.block_k, options.triton, options.block_q or None), [], set()
    for seq in options.lengths:
        batch = max(1, options.tokens // seq)
        q, k, v = _inputs(batch, options.heads, seq, options.head_dim, dtype, device)
        d_out = _inputs(batch, options.heads, seq, options.head_dim, dtype, device, seed=1)[0]
        expected = reference(q, k, v, d_out)
        for name, f in impls.items():
            base = dict(impl=name, dtype=options.dtype, device=device.type, batch=batch, heads=options.heads)
            base.update(head_dim=options.head_dim, seq=seq)
            if name in stopped:
                rows += [Row(pass_=p, status="skipped (ran out of memory at a smaller T)", **base) for p in PASSES]
                continue
            rows += _measure_impl(f, (q, k, v, d_out, expected), base, options, stopped)
            for row in rows[-len(PASSES) :]:
                print(format_row(row), flush=True)
        del q, k, v, d_out, expected
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _measure_impl(f, data, base, options, stopped) -> list[Row]:
    """Check one implementation at one T against the reference, then time both passes."""
    q, k, v, d_out, expected = data
    try:
        diff = max_difference(f, q, k, v, d_out, expected)
    except RuntimeError as error:  # no kernel for this input, or out of memory
        status = "out of memory" if _is_oom(error) else f"not run: {str(error).splitlines()[0][:80]}"
        if _is_oom(error):
            stopped.add(base["impl"])
            torch.cuda.empty_cache() if q.is_cuda else None
        return [Row(pass_=p, status=status, **base) for p in PASSES]
    if not diff <= TOLERANCE[q.dtype]:  # wrong results are not timed
        return [Row(pass_=p, max_diff=diff, status=f"disagrees (> {TOLERANCE[q.dtype]:g})", **base) for p in PASSES]
    rows = []
    for pass_ in PASSES:
        row = Row(pass_=pass_, max_diff=diff, **base)
        try:
            row.median_ms, row.iqr_ms, row.peak_mib = measure(f, q, k, v, pass_, options.min_run_time)
            work = flops(row.batch, row.heads, row.seq, row.head_dim, True, pass_)
            row.tflops = work / (row.median_ms * 1e-3) / 1e12
        except RuntimeError as error:
            if not _is_oom(error):
                raise
            row.status = "out of memory"
            stopped.add(base["impl"])
            torch.cuda.empty_cache() if q.is_cuda else None
        rows.append(row)
    return rows


def format_row(row: Row) -> str:
    return (
        f"{row.pass_:16s} T={row.seq:6d} {row.impl:24s} {row.median_ms:10.3f} ms {row.tflops:8.2f} TFLOP/s "
        f"{row.peak_mib:10.1f} MiB  rel. diff {row.max_diff:.1e}  {row.status}"
    )


# The H100 run of docs/benchmarks/h100-flash.md, shipped in the package's data.
GPU_RUN = DATA_DIR / "h100_flash.csv"


def read_rows(path: Path = GPU_RUN) -> list[Row]:
    """Rows of a ``bench_flash.csv`` (default: the shipped H100 run)."""
    types = {f.name: f.type for f in fields(Row)}
    convert = {"int": int, "float": float, "str": str}
    with open(path, newline="") as f:
        return [Row(**{k: convert[types[k]](v) for k, v in row.items()}) for row in csv.DictReader(f)]


def to_markdown(rows: list[Row], peak_tflops: float | None) -> str:
    head = "| pass | T | batch | implementation | median ms | IQR ms | TFLOP/s | % of peak | peak MiB | max rel. diff | status |"
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        share = f"{100 * r.tflops / peak_tflops:.1f}" if peak_tflops and r.status == "ok" else ""
        cells = [r.pass_, r.seq, r.batch, r.impl, f"{r.median_ms:.3g}", f"{r.iqr_ms:.2g}", f"{r.tflops:.3g}"]
        cells += [share, f"{r.peak_mib:.4g}", f"{r.max_diff:.1e}", r.status]
        lines.append("| " + " | ".join(str(c).replace("nan", "") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def ratios(rows: list[Row], against: str = "SDPA flash") -> list[tuple]:
    """(pass, T, implementation, time / the time of ``against`` at the same pass and T)."""
    base = {(r.pass_, r.seq): r.median_ms for r in rows if r.impl == against and r.status == "ok"}
    return [
        (r.pass_, r.seq, r.impl, r.median_ms / base[(r.pass_, r.seq)])
        for r in rows
        if r.status == "ok" and (r.pass_, r.seq) in base and r.impl != against
    ]


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    names = list(dict.fromkeys(r.impl for r in rows))
    for name in names:
        for ax, pass_, key in ((axes[0], "forward", "median_ms"), (axes[1], "forward+backward", "median_ms")):
            pts = [(r.seq, getattr(r, key)) for r in rows if r.impl == name and r.pass_ == pass_ and r.status == "ok"]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        pts = [
            (r.seq, r.peak_mib) for r in rows if r.impl == name and r.pass_ == "forward+backward" and r.status == "ok"
        ]
        if pts:
            axes[2].plot(*zip(*pts, strict=True), marker="o", label=name)
    for ax, label in zip(
        axes, ("forward: median ms", "forward+backward: median ms", "forward+backward: peak MiB"), strict=True
    ):
        ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel=label)
        ax.tick_params(labelsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=9)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(rows: list[Row], out: Path, title: str, peak_tflops: float | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_flash.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[x.name for x in fields(Row)])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    table = "\n".join(f"| {p} | {t} | {n} | {x:.2f} |" for p, t, n, x in ratios(rows))
    ratio_md = "| pass | T | implementation | time / SDPA flash |\n|---|---|---|---|\n" + table + "\n"
    (out / "bench_flash.md").write_text(f"# {title}\n\n{to_markdown(rows, peak_tflops)}\n{ratio_md}")
    plot(rows, out / "bench_flash.png", title)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mha_tutorial.bench flash",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: bfloat16 on a GPU")
    parser.add_argument("--lengths", type=int, nargs="+", help="default: 1k ... 16k on a GPU, 256 ... 4096 on a CPU")
    parser.add_argument("--tokens", type=int, help="batch = tokens // T, at least 1 (default 16384 GPU, 4096 CPU)")
    parser.add_argument("--heads", type=int, help="default 16 on a GPU, 8 on a CPU")
    parser.add_argument("--head-dim", type=int, help="default 128 on a GPU, 64 on a CPU")
    parser.add_argument("--block-k", type=int, default=256, help="keys per tile of the PyTorch version")
    parser.add_argument("--block-q", type=int, default=256, help="queries per tile of the PyTorch version (0: all)")
    parser.add_argument("--no-triton", dest="triton", action="store_false", help="skip the Triton version")
    parser.add_argument("--min-run-time", type=float, default=0.5)
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense peak for --dtype, for the %% column")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, short timings")
    parser.add_argument("--out", type=Path, default=Path("build/bench_flash"))
    return parser


def main(argv=None) -> int:
    options = _parser().parse_args(argv)
    on_gpu = options.device.startswith("cuda")
    options.dtype = options.dtype or ("bfloat16" if on_gpu else "float32")
    options.lengths = options.lengths or ([1024, 2048, 4096, 8192, 16384] if on_gpu else [256, 512, 1024, 2048, 4096])
    options.tokens = options.tokens or (16384 if on_gpu else 4096)
    options.heads = options.heads or (16 if on_gpu else 8)
    options.head_dim = options.head_dim or (128 if on_gpu else 64)
    if options.quick:
        options.lengths, options.tokens, options.heads, options.head_dim = [32, 64], 128, 2, 16
        options.min_run_time, options.block_k, options.block_q = 0.01, 16, 16
    where = torch.cuda.get_device_name(options.device) if on_gpu else f"CPU, {torch.get_num_threads()} threads"
    title = (
        f"{where}, torch {torch.__version__}: causal attention, {options.dtype}, {options.tokens} tokens "
        f"(batch = tokens // T), {options.heads} heads of {options.head_dim}; "
        f"the PyTorch tiles: {options.block_q or 'all'} queries x {options.block_k} keys"
    )
    print(title, flush=True)
    rows = run(options)
    write_reports(rows, options.out, title, options.peak_tflops)
    return 0
