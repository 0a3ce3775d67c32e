"""Greedy decoding with and without the KV cache (``core/kv_cache.py``): tokens/s, their ratio, and the cache's size.

    python -m mha_tutorial.bench decode --quick                                   # seconds (the tests)
    OMP_NUM_THREADS=2 python -m mha_tutorial.bench decode --out docs/benchmarks   # the CPU report, cpu-decode.*

Batch 1, float32, ``torch.inference_mode``. Two decoders: one of realistic width, UNTRAINED (seeded random
weights; 6 layers x 384, 6 heads, FFN 1536, vocabulary 512), prompt 16, 16 ... 256 new tokens; and the series'
trained induction decoder (``load_pretrained("induction")``, 2 x 64, max_len 24), prompt 4, every length up to
max_len. Without a cache each step re-runs the whole prefix; with one, each step runs only the newest token.

Before timing, every implementation is checked against one teacher-forced forward pass over the prompt and the
ids it produced: each id must be that pass's argmax at its position (so they are the greedy ids) and its last
logits that pass's last row (max |diff| / max |reference| <= ``TOLERANCE``); its ids are also compared with the
uncached ones. One that disagrees is reported and not timed. A measurement is a whole decode (prompt and new
tokens); the implementations alternate within each round; medians over the rounds (fewer at long lengths); the
check run is the warm-up. Ratio = uncached / cached time. Run it on a quiet machine (the report records the load
average): with a busy core, OpenMP threads stall at every op big enough to be split, the uncached ones most.
``KVCache.nbytes`` per position, after each cached decode, is compared with ``cache_bytes(layers, 1, H, 1, d)``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import NamedTuple

import torch

from ..core.kv_cache import KVCache, cache_bytes
from ..data import DATA_DIR
from ..device import describe_machine as machine
from ..models.model import ModelConfig, build_model
from ..models.train import load_pretrained

TOLERANCE = 1e-4  # max |diff| / max |reference| of the last logits, float32
GOAL = 5.0  # the target: cached / uncached tokens/s at 256 new tokens
BASELINE = "uncached"
LONG = 128  # from this many new tokens on, --long-repeats rounds


@dataclass
class Row:
    model: str
    impl: str
    prompt: int
    new_tokens: int
    repeats: int = 0
    median_ms: float = math.nan
    iqr_ms: float = math.nan
    tokens_per_s: float = math.nan
    ratio: float = math.nan  # uncached median / this median (the baseline's own row: 1)
    max_diff: float = math.nan
    same_ids: str = ""  # "yes" / "no": the ids equal the uncached implementation's
    cache_positions: int = 0
    bytes_per_token: float = math.nan  # KVCache.nbytes / cache_positions
    formula_bytes_per_token: float = math.nan  # cache_bytes(layers, 1, H, 1, d)
    status: str = "ok"
    machine: str = ""  # where it ran, and the load average before and after


SHIPPED = DATA_DIR / "cpu_decode.csv"  # the run of docs/benchmarks/cpu-decode.md, shipped in the package's data


def read_rows(path: Path = SHIPPED) -> list[Row]:
    """Rows of a ``cpu-decode.csv`` (default: the run shipped with the package, which notebook 11 prints)."""
    types, convert = {f.name: f.type for f in fields(Row)}, {"int": int, "float": float, "str": str}
    with open(path, newline="") as f:
        return [Row(**{k: convert[types[k]](v) for k, v in row.items()}) for row in csv.DictReader(f)]


class Decoded(NamedTuple):
    ids: torch.Tensor  # (B, new) generated ids
    last_logits: torch.Tensor  # (B, V) the logits that chose the last id
    cache: KVCache | None  # the cache after decoding, None without one


def uncached_decode(model, prompt: torch.Tensor, num_new: int) -> Decoded:
    """Greedy decoding that re-runs the whole prefix (B, t) at every step."""
    out = prompt
    for _ in range(num_new):
        logits = model(out)[:, -1]  # (B, V)
        out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)  # (B, t + 1)
    return Decoded(out[:, prompt.shape[1] :], logits, None)


def cached_decode(model, prompt: torch.Tensor, num_new: int) -> Decoded:
    """Greedy decoding that runs the prompt once, then one token per step through a ``KVCache``."""
    cache, new, ids = KVCache(model), prompt, []
    for _ in range(num_new):
        logits = model(new, cache=cache)[:, -1]  # (B, V)
        new = logits.argmax(-1, keepdim=True)  # (B, 1)
        ids.append(new)
    return Decoded(torch.cat(ids, dim=1), logits, cache)


def implementations() -> dict:
    """name -> f(model, prompt (B, P), num_new) -> Decoded; the first is the baseline of the ratio."""
    return {BASELINE: uncached_decode, "KV cache": cached_decode}


def check(model, prompt: torch.Tensor, num_new: int, got: Decoded) -> tuple[bool, float]:
    """(ids are greedy, max rel. diff of the last logits) against one teacher-forced pass over prompt + ids."""
    if tuple(got.ids.shape) != (prompt.shape[0], num_new) or tuple(got.last_logits.shape[:1]) != prompt.shape[:1]:
        return False, math.inf
    full = model(torch.cat([prompt, got.ids[:, :-1]], dim=1))  # (B, P + new - 1, V)
    greedy = torch.equal(full[:, prompt.shape[1] - 1 :].argmax(-1), got.ids)
    expected = full[:, -1]
    diff = ((got.last_logits - expected).abs().max() / expected.abs().max()).item()
    return greedy, diff


def realistic_model(options):
    """The untrained decoder of realistic width (seeded random weights), in eval mode."""
    config = ModelConfig(
        "decoder", 0, options.vocab, num_hiddens=options.width, num_heads=options.heads,
        ffn_num_hiddens=options.ffn, num_enc_layers=0, num_dec_layers=options.layers,
        max_len=options.prompt + max(options.lengths),
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(options.seed)
        return build_model(config).eval()


def _prompt(model, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, model.config.tgt_vocab_size, (1, length), generator=g)  # (1, P), no <pad> (id 0)


def _bytes_per_token(model, cache: KVCache | None) -> tuple[int, float, float]:
    c = model.config
    formula = cache_bytes(c.num_dec_layers, 1, c.num_heads, 1, c.num_hiddens // c.num_heads)
    return (0, math.nan, math.nan) if cache is None else (cache.length, cache.nbytes / cache.length, float(formula))


def _time_rounds(calls: dict, repeats: int) -> dict:
    """name -> seconds of each round; the calls interleaved, their order reversed every other round."""
    times = {name: [] for name in calls}
    for i in range(repeats):
        for name in list(calls)[:: -1 if i % 2 else 1]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return times


def _median_iqr_ms(seconds: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(seconds, n=4, method="inclusive") if len(seconds) > 1 else [math.nan] * 3
    return statistics.median(seconds) * 1e3, (q[2] - q[0]) * 1e3


def bench_length(label: str, model, prompt: torch.Tensor, num_new: int, repeats: int) -> list[Row]:
    """Check every implementation at one length, then time the ones that agree, interleaved."""
    rows, calls, baseline_ids = [], {}, None
    for name, f in implementations().items():
        row = Row(label, name, prompt.shape[1], num_new)
        got = f(model, prompt, num_new)  # the check run is also the warm-up
        greedy, row.max_diff = check(model, prompt, num_new, got)
        baseline_ids = got.ids if name == BASELINE else baseline_ids
        row.same_ids = "" if baseline_ids is None else ("yes" if torch.equal(got.ids, baseline_ids) else "no")
        row.cache_positions, row.bytes_per_token, row.formula_bytes_per_token = _bytes_per_token(model, got.cache)
        if not (greedy and row.max_diff <= TOLERANCE):  # wrong results are not timed
            row.status = f"disagrees ({'ids not greedy' if not greedy else f'logits > {TOLERANCE:g}'})"
        else:
            calls[name] = lambda f=f: f(model, prompt, num_new)
        rows.append(row)
    times = _time_rounds(calls, repeats)
    for row in rows:
        if row.impl in times:
            row.repeats = repeats
            row.median_ms, row.iqr_ms = _median_iqr_ms(times[row.impl])
            row.tokens_per_s = num_new / (row.median_ms * 1e-3)
    base = next((r.median_ms for r in rows if r.impl == BASELINE), math.nan)
    for row in rows:
        row.ratio = base / row.median_ms
    return rows


def run(label: str, model, prompt: torch.Tensor, lengths: list[int], repeats_for) -> list[Row]:
    rows = []
    for num_new in lengths:
        rows += (new := bench_length(label, model, prompt, num_new, repeats_for(num_new)))
        print("\n".join(format_row(row) for row in new), flush=True)
    return rows


def crossing(points: list[tuple[int, float]]) -> int | None:
    """From (length, uncached / cached time): the smallest length from which on the ratio stays > 1, or None."""
    first = None
    for n, ratio in sorted(points):
        first = (first or n) if ratio > 1 else None
    return first


def format_row(row: Row) -> str:
    return (
        f"{row.model[:28]:28s} new={row.new_tokens:4d} {row.impl:10s} {row.median_ms:10.2f} ms "
        f"{row.tokens_per_s:8.1f} tok/s  ratio {row.ratio:5.2f}  rel. diff {row.max_diff:.1e}  same ids "
        f"{row.same_ids or '-':3s} {row.bytes_per_token:7.0f} B/token  {row.status}"
    )


def to_markdown(rows: list[Row], label: str) -> str:
    """One line per length: both implementations' times, tokens/s and the ratio, for the model ``label``."""
    lines = [
        "| new tokens | uncached ms | KV cache ms | uncached tok/s | KV cache tok/s | ratio | repeats | "
        "max rel. diff (cached) | same ids | cache bytes/token (measured) | formula | status |",
        "|" + "---|" * 12,
    ]
    for n in sorted({r.new_tokens for r in rows if r.model == label}):
        by = {r.impl: r for r in rows if r.model == label and r.new_tokens == n}
        u, c = by.get(BASELINE, Row(label, BASELINE, 0, n)), by.get("KV cache", Row(label, "KV cache", 0, n))
        status = "ok" if u.status == c.status == "ok" else f"uncached: {u.status}; KV cache: {c.status}"
        cells = [n, f"{u.median_ms:.3g}", f"{c.median_ms:.3g}", f"{u.tokens_per_s:.4g}", f"{c.tokens_per_s:.4g}"]
        cells += [f"{c.ratio:.2f}", c.repeats, f"{c.max_diff:.1e}", c.same_ids, f"{c.bytes_per_token:.0f}"]
        cells += [f"{c.formula_bytes_per_token:.0f}", status]
        lines.append("| " + " | ".join(str(x).replace("nan", "") for x in cells) + " |")
    return "\n".join(lines) + "\n"


def _ratio_sentences(rows: list[Row], big: str, small: str) -> list[str]:
    out, cached = [], [r for r in rows if r.impl != BASELINE and r.status == "ok"]
    long = [r for r in cached if r.model == big]
    if long:
        top, low = max(long, key=lambda r: r.new_tokens), min(long, key=lambda r: r.new_tokens)
        base = next(r for r in rows if r.model == big and r.impl == BASELINE and r.new_tokens == top.new_tokens)
        out.append(
            f"At {top.new_tokens} new tokens the KV cache decodes {top.tokens_per_s:.1f} tokens/s against "
            f"{base.tokens_per_s:.1f} tokens/s without it: {top.ratio:.2f}x the uncached speed, so the goal of "
            f">= {GOAL:g}x is {'met' if top.ratio >= GOAL else 'NOT met'}. At {low.new_tokens} new tokens the "
            f"ratio is {low.ratio:.2f}x."
        )
    points = sorted((r.new_tokens, r.ratio) for r in cached if r.model == small)
    if points:
        where = crossing(points)
        where = (
            "the cache never pays within max_len (its ratio is not above 1 at the longest length)"
            if where is None
            else f"the cache starts to pay at {where} generated tokens (ratio > 1 there and at every longer length)"
        )
        listed = ", ".join(f"{n}: {x:.2f}" for n, x in points)
        out.append(f"For {small}, {where}. Ratios uncached/cached by generated length (1 = break-even): {listed}.")
    return out


def findings(rows: list[Row], big: str, small: str) -> list[str]:
    """Plain sentences, each with its number and what it is compared with."""
    out = _ratio_sentences(rows, big, small)
    cached = [r for r in rows if r.impl != BASELINE and r.cache_positions]
    for label in dict.fromkeys(r.model for r in cached):
        r = max((x for x in cached if x.model == label), key=lambda x: x.cache_positions)
        same = "equal to" if r.bytes_per_token == r.formula_bytes_per_token else "DIFFERENT from"
        out.append(
            f"{label}: after {r.cache_positions} positions KVCache.nbytes is "
            f"{r.bytes_per_token * r.cache_positions:.0f} bytes, {r.bytes_per_token:.0f} bytes per token, {same} "
            f"cache_bytes(layers, 1, H, 1, d) = {r.formula_bytes_per_token:.0f} (2 x layers x H x d x 4 bytes)."
        )
    return out


def plot(rows: list[Row], path: Path, big: str, small: str) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    for impl in implementations():
        pts = [(r.new_tokens, r.tokens_per_s) for r in rows if r.model == big and r.impl == impl and r.status == "ok"]
        left.plot(*zip(*pts, strict=True), marker="o", label=impl)  # nothing for an implementation not timed
    left.set(xscale="log", yscale="log", xlabel="new tokens generated", ylabel="tokens / s (new tokens)")
    left.set_title(big.split(",")[0] + ", untrained", fontsize=10)
    left.legend(fontsize=9)
    pts = [(r.new_tokens, r.ratio) for r in rows if r.model == small and r.impl != BASELINE and r.status == "ok"]
    right.plot(*zip(*pts, strict=True), marker="o", color="C1")
    right.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    right.set(xlabel="tokens generated", ylabel="uncached time / cached time")
    right.set_title(small.split(",")[0] + ", trained", fontsize=10)
    for ax in (left, right):
        ax.tick_params(labelsize=9)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)  # 900 px wide
    plt.close(fig)


def write_reports(rows: list[Row], out: Path, name: str, header: str, big: str, small: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[x.name for x in fields(Row)])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    text = [header, "## Findings", "\n".join(f"- {s}" for s in findings(rows, big, small))]
    for label in (big, small):
        text += [f"## {label}", to_markdown(rows, label)]
    text += [f"![tokens/s and ratio]({name}.png)", ""]
    (out / f"{name}.md").write_text("\n\n".join(text))
    plot(rows, out / f"{name}.png", big, small)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mha_tutorial.bench decode",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (recorded in the report)")
    for name, default in (("layers", 6), ("width", 384), ("heads", 6), ("ffn", 1536), ("vocab", 512)):
        parser.add_argument(f"--{name}", type=int, default=default)  # the realistic model's sizes
    parser.add_argument("--seed", type=int, default=0, help="the untrained model's weights and the prompts")
    parser.add_argument("--prompt", type=int, default=16, help="prompt length of the realistic model")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256], help="new tokens")
    parser.add_argument("--repeats", type=int, default=7, help=f"timed rounds below {LONG} new tokens")
    parser.add_argument("--long-repeats", type=int, default=3, help=f"timed rounds from {LONG} new tokens on")
    parser.add_argument("--induction-prompt", type=int, default=4)
    parser.add_argument("--induction-lengths", type=int, nargs="+", help="default: 1 ... max_len - prompt")
    parser.add_argument("--induction-repeats", type=int, default=51)
    parser.add_argument("--quick", action="store_true", help="a small model, few lengths, few rounds")
    parser.add_argument("--out", type=Path, default=Path("build/bench_decode"))
    parser.add_argument("--name", default="cpu-decode", help="the outputs are NAME.csv, NAME.md, NAME.png")
    return parser


def _options(argv):
    options = _parser().parse_args(argv)
    options.argv = sys.argv[1:] if argv is None else list(argv)
    if options.quick:
        options.layers, options.width, options.heads, options.ffn, options.vocab = 2, 32, 2, 64, 64
        options.prompt, options.lengths, options.repeats, options.long_repeats = 4, [2, 8], 3, 3
        options.induction_lengths, options.induction_repeats = [1, 4, 20], 3
    counts = ["threads", "layers", "width", "heads", "vocab", "prompt", "repeats", "long_repeats"]
    bad = {
        k: getattr(options, k) for k in counts + ["induction_prompt", "induction_repeats"] if getattr(options, k) < 1
    }
    bad |= {k: v for k in ("lengths", "induction_lengths") if (v := getattr(options, k)) and min(v) < 1}
    if bad or options.ffn < 0:
        raise ValueError(f"counts and lengths must be >= 1 (--ffn >= 0), got {bad or {'ffn': options.ffn}}")
    return options


def main(argv=None) -> int:
    options, start, threads = _options(argv), time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(options.threads)
    try:  # the caller's thread count is restored: a test process goes on with its own
        with torch.inference_mode():
            rows, big, small, where = _run_both(options)
    finally:
        torch.set_num_threads(threads)
    for row in rows:
        row.machine = where
    header = _header(where, big, small, options, time.perf_counter() - start)
    write_reports(rows, options.out, options.name, header, big, small)
    print("\n".join(findings(rows, big, small)))
    return 0


def _run_both(options):
    start_load = _load()
    small_model = load_pretrained("induction", device="cpu")
    max_len = small_model.config.max_len
    if options.induction_prompt >= max_len:
        raise ValueError(f"--induction-prompt must be below the induction model's max_len={max_len}")
    small_lengths = options.induction_lengths or range(1, max_len - options.induction_prompt + 1)
    big_model = realistic_model(options)
    c, s = big_model.config, small_model.config
    big = f"{c.num_dec_layers} layers x {c.num_hiddens}, {c.num_heads} heads, FFN {c.ffn_num_hiddens}, vocab "
    big += f"{c.tgt_vocab_size} (random weights, seed {options.seed})"
    small = f"induction decoder {s.num_dec_layers} layers x {s.num_hiddens}, {s.num_heads} heads, FFN "
    small += f"{s.ffn_num_hiddens}, max_len {s.max_len} (load_pretrained)"
    where = machine()
    print(where, flush=True)
    rows = run(big, big_model, _prompt(big_model, options.prompt, options.seed), options.lengths,
               lambda n: options.long_repeats if n >= LONG else options.repeats)  # fmt: skip
    prompt = _prompt(small_model, options.induction_prompt, options.seed)
    rows += run(small, small_model, prompt, list(small_lengths), lambda n: options.induction_repeats)
    return rows, big, small, f"{where}; load average (1, 5, 15 min) at the start: {start_load}, at the end: {_load()}"


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"


def _header(where: str, big: str, small: str, options, seconds: float) -> str:
    return (
        f"# Greedy decoding with and without the KV cache, CPU\n\nMachine: {where}.\n\n"
        f"Command: `OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')} python -m "
        f"mha_tutorial.bench decode {' '.join(options.argv)}` "
        f"({seconds:.0f} s in all). Batch 1, float32, torch.inference_mode.\n\n"
        f"Models: (1) {big}: UNTRAINED, so its tokens mean nothing; only its speed and sizes do. Prompt "
        f"{options.prompt} tokens. (2) {small}, the series' trained model, prompt {options.induction_prompt}.\n\n"
        "Each implementation was checked before timing: its ids are the argmax of one teacher-forced forward "
        f"pass at every position, its last logits within {TOLERANCE:g} (max |diff| / max |reference|) of that "
        "pass's, and its ids equal the uncached ones (`same ids`). Times are medians over rounds in which both "
        "implementations run, interleaved, each a whole decode (prompt + every new token); tokens/s counts the "
        f"new tokens; ratio = uncached time / cached time. Rounds: {options.repeats} below {LONG} "
        f"new tokens, {options.long_repeats} from there on, {options.induction_repeats} for the induction model."
    )
