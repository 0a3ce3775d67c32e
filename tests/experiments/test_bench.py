"""The benchmark module: it refuses to time implementations that disagree, measures memory
honestly, skips sizes that would not fit, and its --quick CLI (what CI runs) writes its reports."""

import csv
import subprocess
import sys

import pytest
import torch

from mha_tutorial.bench import attention as bench


def test_quick_cli_writes_table_csv_and_plot(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mha_tutorial.bench", "attention", "--quick", "--threads", "1", "--out", str(tmp_path)]
        + ["--seq", "32", "64", "--min-run-time", "0.01"],  # the CLI end to end; --quick's sizes take longer
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "implementations agree" in result.stdout
    rows = list(csv.DictReader(open(tmp_path / "bench.csv")))
    impls = {r["impl"] for r in rows}
    assert {
        "head loop",
        "readable",
        "fused",
        "einsum",
        "seq-first",
        "nn.MHA (weights)",
        "nn.MHA",
        "SDPA (is_causal)",
    } <= impls
    assert {r["pass_"] for r in rows} == {"forward", "forward+backward"}
    assert all(r["status"] == "ok" and float(r["median_ms"]) > 0 for r in rows)
    md = (tmp_path / "bench.md").read_text()
    assert "readable / nn.MHA (weights)" in md and "fused / nn.MHA" in md
    assert (tmp_path / "bench.png").stat().st_size > 10_000


def test_disagreeing_implementation_is_caught_before_timing():
    impls, _ = bench.implementations(16, 2, "cpu", torch.float32)
    x, keep = torch.randn(2, 5, 16), torch.ones(5, 5, dtype=torch.bool).tril()
    assert max(bench.check_agreement(impls, x, keep, atol=1e-5).values()) < 1e-5
    impls["fused"] = lambda x, keep: impls["readable"](x, keep) * 1.01  # a subtly wrong kernel
    with pytest.raises(RuntimeError, match="fused"):
        bench.check_agreement(impls, x, keep, atol=1e-5)


def test_peak_memory_counts_created_tensors_until_freed():
    x = torch.randn(256, 256)  # 256 KiB, existed before: not counted
    with bench.PeakMemory(existing=[x]) as tracker:
        a = x @ x  # +256 KiB
        b = a.softmax(-1)  # +256 KiB, peak 512 KiB
        del a  # -256 KiB
        c = b @ x  # +256 KiB, still 512 KiB
    assert tracker.peak == 2 * 256 * 256 * 4
    del b, c


def test_sizes_over_the_memory_budget_are_skipped_and_reported():
    messages = []
    rows = bench.run_benchmark(
        seqs=(16, 4096),
        batch=1,
        hiddens=16,
        heads=2,
        passes=("forward",),
        impl_names=["nn.MHA"],
        device="cpu",
        threads=1,
        min_run_time=0.01,
        memory_budget=50 * 2**20,
        log=messages.append,
    )
    done = [r for r in rows if r.seq == 16]
    skipped = [r for r in rows if r.seq == 4096]
    assert done and all(r.status == "ok" for r in done)
    assert skipped and all(r.status.startswith("skipped") for r in skipped)
    assert any("stopping at T=4096" in m for m in messages)


def test_ratios_pair_ours_with_pytorchs():
    row = lambda impl, ms: bench.Row(impl, "forward", "float32", "cpu", 1, 1, 8, 16, 2, median_ms=ms)
    rows = [row("readable", 3.0), row("nn.MHA (weights)", 2.0), row("fused", 1.0), row("nn.MHA", 1.0)]
    assert sorted(r[3:] for r in bench.ratios(rows)) == [
        ("fused", "nn.MHA", 1.0),
        ("readable", "nn.MHA (weights)", 1.5),
    ]


def test_csv_round_trip(tmp_path):
    rows = [bench.Row("fused", "forward", "float32", "cpu", 2, 8, 128, 768, 12, 1.5, 0.1, 30.0)]
    rows.append(bench.Row("fused", "forward", "float32", "cpu", 2, 8, 4096, 768, 12, status="skipped: needs ~31 GiB"))
    bench.write_csv(rows, tmp_path / "b.csv")
    back = bench.read_csv(tmp_path / "b.csv")
    assert back[0] == rows[0] and back[1].status == rows[1].status and back[1].seq == 4096


def _round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """Keep 10 of float32's 23 mantissa bits (truncation), as a TF32 tensor core reads its inputs."""
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)


def test_tf32_tolerance_admits_tf32_rounding_and_float32_does_not():
    # The first GPU run stopped at the tf32 sweep: TF32's rounding was judged by float32's tolerance.
    # Emulate TF32 on the CPU by rounding the inputs and weights, at the benchmark's width (768).
    impls, modules = bench.implementations(768, 12, "cpu", torch.float32)
    x, keep = torch.randn(2, 64, 768), torch.ones(64, 64, dtype=torch.bool).tril()
    with torch.no_grad():
        exact = impls["readable"](x, keep)
        for p in modules[0].parameters():
            p.copy_(_round_to_tf32(p))
        rounded = impls["readable"](_round_to_tf32(x), keep)
    error = (rounded - exact).abs().max().item()
    assert bench.ATOL["float32"] < error < bench.ATOL["tf32"], error


def test_flop_count_agrees_with_pytorchs_counter():
    # Our count keeps only the causal half of Q K^T and weights @ V; PyTorch's counter sees all of it.
    from torch.utils.flop_counter import FlopCounterMode

    B, T, D, H = 2, 32, 64, 4
    impls, _ = bench.implementations(D, H, "cpu", torch.float32)
    x, keep = torch.randn(B, T, D, requires_grad=True), torch.ones(T, T, dtype=torch.bool).tril()
    full_attention = 4 * B * T * T * D  # two (T, T) products per head, 2 * T * T * d each
    for pass_, factor in (("forward", 1), ("forward+backward", 3)):
        with FlopCounterMode(display=False) as counter:
            out = impls["readable"](x, keep)
            if pass_ == "forward+backward":
                out.sum().backward()
        row = bench.Row("readable", pass_, "float32", "cpu", 1, B, T, D, H)
        assert bench.flops(row) == counter.get_total_flops() - factor * full_attention / 2


def test_every_pair_has_both_sides_and_fused_is_causal_matches_sdpa():
    impls, _ = bench.implementations(16, 2, "cpu", torch.float32)
    assert all(ours in impls and theirs in impls for ours, theirs in bench.PAIRS)
    x, keep = torch.randn(2, 5, 16), torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        torch.testing.assert_close(impls["fused (is_causal)"](x, keep), impls["SDPA (is_causal)"](x, keep))


def test_report_names_stay_importable_from_bench():
    # bench_report holds the report side since bench.py was split; bench re-exports it unchanged.
    from mha_tutorial.bench import report as bench_report

    for name in [*bench_report.__all__, "PAIRS"]:
        assert getattr(bench, name) is getattr(bench_report, name), name


def test_run_benchmark_options_are_keywords_and_a_misspelt_one_is_refused():
    seen = []
    rows = bench.run_benchmark(
        (8,),
        1,
        16,
        2,
        ("float32",),
        ("forward",),
        ["fused"],
        "cpu",
        threads=1,
        min_run_time=0.01,
        log=None,
        on_row=seen.append,
    )
    assert [r.impl for r in rows] == ["readable", "fused"] and seen == rows
    assert all(r.status == "ok" and r.threads == 1 for r in rows)
    with pytest.raises(TypeError, match="'thread'"):
        bench.run_benchmark((8,), device="cpu", thread=1)


def test_partial_csv_keeps_rows_as_they_come_and_is_removed_at_the_end(tmp_path):
    partial = bench.PartialCsv(tmp_path / "bench.partial.csv")
    row = bench.Row("fused", "forward", "float32", "cpu", 2, 8, 128, 768, 12, 1.5, 0.1, 30.0)
    partial.write(row)
    assert bench.read_csv(tmp_path / "bench.partial.csv") == [row]  # on disk before the sweep ends
    partial.remove()
    assert not (tmp_path / "bench.partial.csv").exists()
