"""How fast is the from-scratch attention, and why is fused attention faster? Measure it.

    python -m mha_tutorial.bench attention --quick            # < 1 minute on a 2-core CPU (what the tests run)
    python -m mha_tutorial.bench attention --seq 1024         # the setting of the issue's targets
    python -m mha_tutorial.bench attention                    # full sweep, T = 128 ... 8192

Every implementation runs causal self-attention with the *same* weights. Before anything is timed, all outputs are
checked to agree; then each is timed with ``torch.utils.benchmark`` (warm-up calls, median of repeated blocks, a fixed
thread count; the timer synchronises CUDA on a GPU) for the forward pass alone (under ``torch.no_grad``) and for
forward + backward. Peak memory is measured per call: ``torch.cuda.max_memory_allocated`` on a GPU, and on the CPU by
tracking every tensor storage the call's operations create until it is freed. That CPU measure cannot see scratch
memory *inside* one fused kernel: forward-only ``nn.MultiheadAttention`` in eval mode runs as a single kernel that
builds the (B, H, T, T) weights internally, so its forward-pass CPU figure is too low; the forward+backward figures
(which keep what backward needs) are the ones to compare.

Results go to the terminal, and as Markdown, CSV and a log-log PNG to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import benchmark
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..core.masks import causal_mask
from ..core.mha import MultiHeadAttention
from ..core.variants import EinsumMultiHeadAttention, HeadLoopMultiHeadAttention, SeqFirstMultiHeadAttention
from ..device import get_device

# The report side lives in .report; its names stay importable from here (attention.ratios, attention.PAIRS, ...).
from .report import PAIRS as PAIRS
from .report import PartialCsv, Row, format_row, write_reports
from .report import flops as flops
from .report import plot as plot
from .report import ratios as ratios
from .report import read_csv as read_csv
from .report import tflops as tflops
from .report import to_markdown as to_markdown
from .report import write_csv as write_csv

__all__ = [
    "PeakMemory",
    "SweepOptions",
    "check_agreement",
    "estimated_bytes",
    "implementations",
    "main",
    "run_benchmark",
]

DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16}
# How far implementations may disagree: TF32 matmuls keep 10 mantissa bits (a relative error near
# 5e-4 per product), bfloat16 keeps 7.
ATOL = {"float32": 1e-4, "tf32": 5e-3, "bfloat16": 5e-2}


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
    peak = peak_bytes(step, x.is_cuda, existing=[x, grad, keep, *params])
    return m.median * 1e3, m.iqr * 1e3, peak / 2**20


def peak_bytes(step, cuda: bool, existing=()) -> int:
    """Peak bytes of one ``step()`` beyond what exists before it: the allocator's peak on a GPU, else ``PeakMemory``."""
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with PeakMemory(existing=existing) as tracker:
        step()
    return tracker.peak


@dataclass
class SweepOptions:
    """How ``run_benchmark`` measures and where it reports (its keyword arguments after ``device``)."""

    threads: int | None = None  # default: PyTorch's current thread count
    min_run_time: float = 0.5  # seconds of timing per measurement
    compile_: bool = False  # also time torch.compile'd paths
    memory_budget: float | None = None  # bytes; default: half of the machine's RAM
    log: Callable[[str], object] | None = print  # None: silent
    on_row: Callable[[Row], object] | None = None  # called with each finished row


class _Sweep:
    """One call of ``run_benchmark``: its sizes and options resolved, and the rows measured so far."""

    def __init__(self, batch: int, hiddens: int, heads: int, passes, device, options: SweepOptions):
        self.batch, self.hiddens, self.heads, self.passes = batch, hiddens, heads, passes
        self.log = options.log or (lambda *_: None)
        self.device = torch.device(device) if device is not None else get_device()
        self.threads = options.threads or torch.get_num_threads()  # the Timer restores the process's count
        self.memory_budget = options.memory_budget
        if self.memory_budget is None:
            self.memory_budget = 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.options = options
        self.rows: list[Row] = []

    def row(self, impl: str, pass_: str, dtype_name: str, seq: int, **measured) -> Row:
        d = self.device.type
        return Row(impl, pass_, dtype_name, d, self.threads, self.batch, seq, self.hiddens, self.heads, **measured)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        if self.options.on_row is not None:
            self.options.on_row(row)


def run_benchmark(
    seqs=(128, 256, 512, 1024, 2048, 4096, 8192),
    batch: int = 8,
    hiddens: int = 768,
    heads: int = 12,
    dtypes=("float32",),
    passes=("forward", "forward+backward"),
    impl_names=None,
    device=None,
    **options,
) -> list[Row]:
    """Time every implementation for each dtype, pass and sequence length; return the rows.

    ``options`` are the keywords of ``SweepOptions``: ``threads``, ``min_run_time``, ``compile_``,
    ``memory_budget``, ``log`` and ``on_row``. On the CPU a size whose estimated peak exceeds
    ``memory_budget`` bytes (default: half of the machine's RAM) is skipped and reported; on a GPU
    an out-of-memory error ends the sweep for that implementation, also reported. ``on_row(row)``
    is called as each row is finished, so a long sweep that is cut short still leaves what it measured.
    """
    sweep = _Sweep(batch, hiddens, heads, passes, device, SweepOptions(**options))
    for dtype_name in dtypes:
        if dtype_name == "tf32" and sweep.device.type != "cuda":
            sweep.log("tf32 is a GPU setting: skipped on the CPU")
            continue
        _sweep_dtype(sweep, dtype_name, seqs, impl_names)
    return sweep.rows


def _sweep_dtype(sweep: _Sweep, dtype_name: str, seqs, impl_names) -> None:
    """Every length in turn for one dtype: check that all implementations agree, then time each pass."""
    if sweep.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
        torch.backends.cudnn.allow_tf32 = dtype_name == "tf32"
    dtype = DTYPES[dtype_name]
    impls, modules = implementations(sweep.hiddens, sweep.heads, sweep.device, dtype, sweep.options.compile_)
    if impl_names:
        impls = {n: f for n, f in impls.items() if n in impl_names or n == "readable"}
    params = [p for m in modules for p in m.parameters()]
    stopped: dict[tuple, str] = {}  # (implementation, pass) -> why larger lengths are not timed
    for seq in seqs:
        x = torch.randn(sweep.batch, seq, sweep.hiddens, device=sweep.device, dtype=dtype)
        keep = causal_mask(seq, device=sweep.device)
        if _skip_over_budget(sweep, impls, dtype_name, dtype, seq):
            break
        if not _agree(sweep, impls, x, keep, dtype_name, seq):
            break
        for p in sweep.passes:
            for name, f in impls.items():
                row = sweep.row(name, p, dtype_name, seq)
                _time_row(sweep, row, f, x, keep, params, stopped)
                sweep.add(row)
                sweep.log(format_row(row))


def _skip_over_budget(sweep: _Sweep, impls, dtype_name: str, dtype, seq: int) -> bool:
    """On the CPU, when ``seq`` would not fit in the memory budget: report it, add skipped rows, return True."""
    backward = "forward+backward" in sweep.passes
    need = estimated_bytes(sweep.batch, seq, sweep.hiddens, sweep.heads, dtype, backward=backward)
    if sweep.device.type != "cpu" or need <= sweep.memory_budget:
        return False
    sweep.log(
        f"stopping at T={seq}: the readable path would need ~{need / 2**30:.1f} GiB "
        f"(budget {sweep.memory_budget / 2**30:.1f} GiB)"
    )
    for name in impls:
        for p in sweep.passes:
            sweep.add(sweep.row(name, p, dtype_name, seq, status=f"skipped: needs ~{need / 2**30:.0f} GiB"))
    return True


def _agree(sweep: _Sweep, impls, x, keep, dtype_name: str, seq: int) -> bool:
    """``check_agreement`` at this length; False (and the sweep stops) when it runs out of GPU memory."""
    try:
        diffs = check_agreement(impls, x, keep, atol=ATOL[dtype_name])
    except torch.OutOfMemoryError:
        sweep.log(f"T={seq}: out of memory while checking agreement; stopping the sweep here")
        torch.cuda.empty_cache()
        return False
    sweep.log(
        f"[{dtype_name}, T={seq}] all {len(impls)} implementations agree "
        f"(max |diff| vs readable {max(diffs.values()):.1e})"
    )
    return True


def _time_row(sweep: _Sweep, row: Row, f, x, keep, params, stopped: dict) -> None:
    """Fill in ``row``'s time and memory, or its status when this implementation already ran out of memory."""
    key = (row.impl, row.pass_)
    if key in stopped:
        row.status = stopped[key]
        return
    try:
        backward = row.pass_ == "forward+backward"
        measured = _measure(f, x, keep, backward, sweep.options.min_run_time, sweep.threads, params)
        row.median_ms, row.iqr_ms, row.peak_mib = measured
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        row.status = stopped[key] = f"out of memory at T={row.seq}"
        sweep.log(f"{row.impl} ({row.pass_}): out of memory at T={row.seq}; larger T skipped")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mha_tutorial.bench attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
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
    partial = PartialCsv(args.out / "bench.partial.csv")  # as we go: a sweep stopped by a time limit keeps its rows
    rows = run_benchmark(
        seqs,
        batch,
        hiddens,
        heads,
        dtypes,
        args.passes,
        args.impls,
        device,
        threads=args.threads,
        min_run_time=min_run_time,
        compile_=args.compile or (on_gpu and not args.quick),
        on_row=partial.write,
    )
    partial.remove()
    where = torch.cuda.get_device_name(device) if on_gpu else f"CPU, {rows[0].threads if rows else '?'} threads"
    title = (
        f"{where} (torch {torch.__version__}): causal self-attention, batch {batch}, {hiddens} hiddens, {heads} heads"
    )
    write_reports(rows, args.out, title)
    return 0
