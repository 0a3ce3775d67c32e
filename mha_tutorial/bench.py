"""How fast is the from-scratch attention, and why is fused attention faster? Measure it.

    python -m mha_tutorial.bench --quick            # < 1 minute on a 2-core CPU (what the tests run)
    python -m mha_tutorial.bench --seq 1024         # the setting of the issue's targets
    python -m mha_tutorial.bench                    # full sweep, T = 128 ... 8192

Every implementation runs causal self-attention with the *same* weights. Before
anything is timed, all outputs are checked to agree; then each is timed with
``torch.utils.benchmark`` (warm-up calls, median of repeated blocks, a fixed
thread count; the timer synchronises CUDA on a GPU) for the forward pass alone
(under ``torch.no_grad``) and for forward + backward. Peak memory is measured
per call: ``torch.cuda.max_memory_allocated`` on a GPU, and on the CPU by
tracking every tensor storage the call's operations create until it is freed.
That CPU measure cannot see scratch memory *inside* one fused kernel: forward-only
``nn.MultiheadAttention`` in eval mode runs as a single kernel that builds the
(B, H, T, T) weights internally, so its forward-pass CPU figure is too low; the
forward+backward figures (which keep what backward needs) are the ones to compare.

Results go to the terminal, and as Markdown, CSV and a log-log PNG to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import benchmark
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .device import get_device
from .masks import causal_mask
from .mha import MultiHeadAttention
from .variants import EinsumMultiHeadAttention, HeadLoopMultiHeadAttention, SeqFirstMultiHeadAttention

# The pairs the targets compare: (ours, PyTorch's equivalent on the same weights and mask).
PAIRS = (
    ("readable", "nn.MHA (weights)"),  # both materialise the (B, H, T, T) weights
    ("fused", "nn.MHA"),  # both hand a bool mask to a fused kernel
    ("fused (is_causal)", "SDPA (is_causal)"),  # both let PyTorch pick flash attention (no mask tensor)
)
DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16}
# How far implementations may disagree: TF32 matmuls keep 10 mantissa bits (a relative error near
# 5e-4 per product), bfloat16 keeps 7.
ATOL = {"float32": 1e-4, "tf32": 5e-3, "bfloat16": 5e-2}


@dataclass
class Row:
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


def implementations(num_hiddens: int, num_heads: int, device, dtype, compile_: bool = False):
    """name -> f(x, keep) returning (B, T, D); all share one set of weights."""
    torch.manual_seed(0)
    readable = MultiHeadAttention(num_hiddens, num_heads, bias=True).to(device, dtype).eval()
    state = readable.state_dict()
    loop, einsum, seq_first = (
        cls(num_hiddens, num_heads, bias=True).to(device, dtype).eval()
        for cls in (HeadLoopMultiHeadAttention, EinsumMultiHeadAttention, SeqFirstMultiHeadAttention)
    )
    for m in (loop, einsum, seq_first):
        m.load_state_dict(state)
    torch_mha = nn.MultiheadAttention(num_hiddens, num_heads, bias=True, batch_first=True).to(device, dtype).eval()
    with torch.no_grad():  # nn.MultiheadAttention packs W_q, W_k, W_v into one matrix
        torch_mha.in_proj_weight.copy_(torch.cat([readable.W_q.weight, readable.W_k.weight, readable.W_v.weight]))
        torch_mha.in_proj_bias.copy_(torch.cat([readable.W_q.bias, readable.W_k.bias, readable.W_v.bias]))
        torch_mha.out_proj.weight.copy_(readable.W_o.weight)
        torch_mha.out_proj.bias.copy_(readable.W_o.bias)

    # On a GPU in 16-bit floats, insist on the flash kernel for the reference (an error if it cannot run);
    # elsewhere (CPU, float32) PyTorch picks its best available kernel.
    flash = torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    kernel = (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)) if flash else contextlib.nullcontext

    def bare_sdpa(x, keep):  # PyTorch's kernel around the same projections
        H, d = num_heads, num_hiddens // num_heads
        q, k, v = (W(x).unflatten(-1, (H, d)).transpose(1, 2) for W in (readable.W_q, readable.W_k, readable.W_v))
        with kernel():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d)
        return readable.W_o(out.transpose(1, 2).flatten(2))

    impls = {
        "head loop": lambda x, keep: loop(x, x, x, mask=keep),
        "readable": lambda x, keep: readable(x, x, x, mask=keep),
        "fused": lambda x, keep: readable(x, x, x, mask=keep, need_weights=False),
        "fused (is_causal)": lambda x, keep: readable(x, x, x, need_weights=False, is_causal=True),
        "einsum": lambda x, keep: einsum(x, x, x, mask=keep),
        "seq-first": lambda x, keep: seq_first(*(x.transpose(0, 1),) * 3, mask=keep[:, :, None]).transpose(0, 1),
        "nn.MHA (weights)": lambda x, keep: torch_mha(
            x, x, x, attn_mask=~keep, need_weights=True, average_attn_weights=False
        )[0],
        "nn.MHA": lambda x, keep: torch_mha(x, x, x, attn_mask=~keep, need_weights=False)[0],
        "SDPA (is_causal)": bare_sdpa,
    }
    if compile_:
        impls["readable (compiled)"] = torch.compile(impls["readable"])
        impls["fused (compiled)"] = torch.compile(impls["fused"])
    return impls, [readable, loop, einsum, seq_first, torch_mha]


class PeakMemory(TorchDispatchMode):
    """Peak bytes of the tensor storages created inside the ``with`` block (CPU or GPU).

    Storages that exist before the block (inputs, weights) are not counted.
    """

    def __init__(self, existing=()):
        super().__init__()
        self.live = self.peak = 0
        self.seen = {t.untyped_storage().data_ptr() for t in existing}

    def _free(self, key, nbytes):
        self.live -= nbytes
        self.seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and key not in self.seen:
                    self.seen.add(key)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, key, nbytes)
        return out


def estimated_bytes(batch: int, seq: int, hiddens: int, heads: int, dtype: torch.dtype, backward: bool) -> int:
    """A generous estimate of the peak of the readable path: a few (B, H, T, T) tensors plus activations."""
    size = torch.empty((), dtype=dtype).element_size()
    weights = batch * heads * seq * seq * size
    return (5 if backward else 3) * weights + 12 * batch * seq * hiddens * size


def check_agreement(impls, x, keep, atol: float) -> dict:
    """Run every implementation once and insist that all agree with ``readable``; return max differences."""
    with torch.no_grad():
        outputs = {name: f(x, keep) for name, f in impls.items()}
    reference = outputs["readable"].float()
    diffs = {name: (out.float() - reference).abs().max().item() for name, out in outputs.items()}
    bad = {name: d for name, d in diffs.items() if not d <= atol}
    if bad:
        raise RuntimeError(f"implementations disagree with the readable path beyond {atol}: {bad}")
    return diffs


def _measure(f, x, keep, backward: bool, min_run_time: float, threads: int, params):
    grad = torch.ones_like(x)
    if backward:
        x = x.detach().requires_grad_()

        def step():
            f(x, keep).backward(grad)
    else:

        def step():
            with torch.no_grad():
                f(x, keep)

    for _ in range(2):  # warm-up: allocator, kernels, torch.compile
        step()
    timer = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=threads)
    m = timer.blocked_autorange(min_run_time=min_run_time)
    if x.is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        with PeakMemory(existing=[x, grad, keep, *params]) as tracker:
            step()
        peak = tracker.peak
    return m.median * 1e3, m.iqr * 1e3, peak / 2**20


def run_benchmark(  # noqa: C901, PLR0913 -- known debt (issue 10): one sweep, many settings
    seqs=(128, 256, 512, 1024, 2048, 4096, 8192),
    batch: int = 8,
    hiddens: int = 768,
    heads: int = 12,
    dtypes=("float32",),
    passes=("forward", "forward+backward"),
    impl_names=None,
    device=None,
    threads: int | None = None,
    min_run_time: float = 0.5,
    compile_: bool = False,
    memory_budget: float | None = None,
    log=print,
    on_row=None,
) -> list[Row]:
    """Time every implementation for each dtype, pass and sequence length; return the rows.

    On the CPU a size whose estimated peak exceeds ``memory_budget`` bytes (default: half of
    the machine's RAM) is skipped and reported; on a GPU an out-of-memory error ends the
    sweep for that implementation, also reported. ``on_row(row)`` is called as each row is
    finished, so a long sweep that is cut short still leaves what it measured.
    """
    log = log or (lambda *_: None)
    device = torch.device(device) if device is not None else get_device()
    threads = threads or torch.get_num_threads()  # the Timer runs with this many and restores the process's count
    if memory_budget is None:
        memory_budget = 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows: list[Row] = []

    def add(row: Row) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(row)

    for dtype_name in dtypes:
        if dtype_name == "tf32" and device.type != "cuda":
            log("tf32 is a GPU setting: skipped on the CPU")
            continue
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
            torch.backends.cudnn.allow_tf32 = dtype_name == "tf32"
        dtype = DTYPES[dtype_name]
        impls, modules = implementations(hiddens, heads, device, dtype, compile_)
        if impl_names:
            impls = {n: f for n, f in impls.items() if n in impl_names or n == "readable"}
        params = [p for m in modules for p in m.parameters()]
        stopped: dict[tuple, str] = {}
        for seq in seqs:
            x = torch.randn(batch, seq, hiddens, device=device, dtype=dtype)
            keep = causal_mask(seq, device=device)
            need = estimated_bytes(batch, seq, hiddens, heads, dtype, backward="forward+backward" in passes)
            if device.type == "cpu" and need > memory_budget:
                log(
                    f"stopping at T={seq}: the readable path would need ~{need / 2**30:.1f} GiB "
                    f"(budget {memory_budget / 2**30:.1f} GiB)"
                )
                for name in impls:
                    for p in passes:
                        add(
                            Row(
                                name,
                                p,
                                dtype_name,
                                device.type,
                                threads,
                                batch,
                                seq,
                                hiddens,
                                heads,
                                status=f"skipped: needs ~{need / 2**30:.0f} GiB",
                            )
                        )
                break
            try:
                diffs = check_agreement(impls, x, keep, atol=ATOL[dtype_name])
            except torch.OutOfMemoryError:
                log(f"T={seq}: out of memory while checking agreement; stopping the sweep here")
                torch.cuda.empty_cache()
                break
            log(
                f"[{dtype_name}, T={seq}] all {len(impls)} implementations agree "
                f"(max |diff| vs readable {max(diffs.values()):.1e})"
            )
            for p in passes:
                for name, f in impls.items():
                    row = Row(name, p, dtype_name, device.type, threads, batch, seq, hiddens, heads)
                    if (name, p) in stopped:
                        row.status = stopped[(name, p)]
                    else:
                        try:
                            row.median_ms, row.iqr_ms, row.peak_mib = _measure(
                                f, x, keep, p == "forward+backward", min_run_time, threads, params
                            )
                        except torch.OutOfMemoryError:
                            torch.cuda.empty_cache()
                            row.status = stopped[(name, p)] = f"out of memory at T={seq}"
                            log(f"{name} ({p}): out of memory at T={seq}; larger T skipped")
                    add(row)
                    log(format_row(row))
    return rows


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
    types = {name: type(value) for name, value in asdict(Row("", "", "", "", 0, 0, 0, 0, 0)).items()}
    with open(path, newline="") as f:
        return [Row(**{k: types[k](v) for k, v in row.items()}) for row in csv.DictReader(f)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, short timings: under a minute on a CPU")
    parser.add_argument("--seq", type=int, nargs="+", help="sequence lengths (default 128 ... 8192)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hiddens", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(DTYPES), help="default: float32 (+ tf32, bfloat16 on a GPU)"
    )
    parser.add_argument(
        "--passes", nargs="+", choices=["forward", "forward+backward"], default=["forward", "forward+backward"]
    )
    parser.add_argument("--impls", nargs="+", help="only these implementations (readable always runs)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd paths (default on a GPU)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: all)")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per measurement")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--out", type=Path, default=Path("build/bench"), help="folder for bench.md/.csv/.png")
    args = parser.parse_args(argv)

    device = torch.device(args.device) if args.device else get_device()
    on_gpu = device.type == "cuda"
    seqs = args.seq or [128, 256, 512, 1024, 2048, 4096, 8192]
    dtypes = args.dtypes or (["float32", "tf32", "bfloat16"] if on_gpu else ["float32"])
    batch, hiddens, heads, min_run_time = args.batch, args.hiddens, args.heads, args.min_run_time
    if args.quick:
        seqs = args.seq or [64, 128, 256]
        batch, hiddens, heads, min_run_time = 2, 128, 4, min(min_run_time, 0.1)
    if on_gpu:
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    args.out.mkdir(parents=True, exist_ok=True)
    partial = open(args.out / "bench.partial.csv", "w", newline="")
    writer = csv.DictWriter(partial, fieldnames=list(asdict(Row("", "", "", "", 0, 0, 0, 0, 0))))
    writer.writeheader()

    def save(row: Row) -> None:  # as we go: a sweep stopped by a time limit keeps its rows
        writer.writerow(asdict(row))
        partial.flush()

    rows = run_benchmark(
        seqs,
        batch,
        hiddens,
        heads,
        dtypes,
        args.passes,
        args.impls,
        device,
        args.threads,
        min_run_time,
        compile_=args.compile or (on_gpu and not args.quick),
        on_row=save,
    )
    partial.close()
    (args.out / "bench.partial.csv").unlink()
    (args.out / "bench.md").write_text(to_markdown(rows))
    write_csv(rows, args.out / "bench.csv")
    where = torch.cuda.get_device_name(device) if on_gpu else f"CPU, {rows[0].threads if rows else '?'} threads"
    plot(
        rows,
        args.out / "bench.png",
        title=f"{where} (torch {torch.__version__}): causal self-attention, "
        f"batch {batch}, {hiddens} hiddens, {heads} heads",
    )
    print()
    print(to_markdown(rows))
    print(f"wrote {args.out / 'bench.md'}, {args.out / 'bench.csv'}, {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
