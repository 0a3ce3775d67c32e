"""The benchmark of the tiled attention: it checks every implementation before timing, and reports honestly."""

from __future__ import annotations

import csv

import pytest
import torch

from mha_tutorial.bench import flash as bench_flash


def test_quick_run_checks_times_and_reports_every_implementation(tmp_path):
    assert bench_flash.main(["--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "bench_flash.csv")))
    impls = {r["impl"] for r in rows}
    assert {"materialising (package)", "tiled, PyTorch (ours)", "SDPA math", "SDPA flash"} <= impls
    assert len(rows) == len(impls) * 2 * 2  # two lengths, two passes
    assert all(r["status"] == "ok" and 0 < float(r["median_ms"]) and float(r["max_diff"]) <= 1e-3 for r in rows)
    assert (tmp_path / "bench_flash.png").stat().st_size > 0
    assert "time / SDPA flash" in (tmp_path / "bench_flash.md").read_text()


def test_a_wrong_implementation_is_reported_and_not_timed(monkeypatch, tmp_path):
    real = bench_flash.implementations

    def with_a_bug(*args):
        impls = real(*args)
        impls["buggy"] = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # not causal
        return impls

    monkeypatch.setattr(bench_flash, "implementations", with_a_bug)
    bench_flash.main(["--quick", "--device", "cpu", "--out", str(tmp_path)])
    rows = [r for r in csv.DictReader(open(tmp_path / "bench_flash.csv")) if r["impl"] == "buggy"]
    assert len(rows) == 4 and all(r["status"].startswith("disagrees") and r["median_ms"] == "nan" for r in rows)
    assert all(float(r["max_diff"]) > 0.1 for r in rows)


def test_flops_follow_flashattention2s_count():
    assert bench_flash.flops(1, 1, 4, 2, False, "forward") == 4 * 16 * 2
    assert bench_flash.flops(1, 1, 4, 2, True, "forward+backward") == 4 * 16 * 2 / 2 * 3.5


def test_ratios_divide_by_the_reference_at_the_same_pass_and_length():
    row = dict(dtype="float32", device="cpu", batch=1, heads=1, head_dim=8)
    rows = [
        bench_flash.Row("SDPA flash", "forward", seq=8, median_ms=2.0, **row),
        bench_flash.Row("tiled", "forward", seq=8, median_ms=5.0, **row),
        bench_flash.Row("tiled", "forward", seq=16, median_ms=9.0, **row),  # no reference at T = 16: no ratio
    ]
    assert bench_flash.ratios(rows) == [("forward", 8, "tiled", 2.5)]


@pytest.mark.parametrize("module", ["bench.flash", "bench.decode"])
def test_help_prints_and_exits_cleanly(module, capsys):
    import importlib

    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"mha_tutorial.{module}").main(["--help"])
    assert info.value.code == 0
    assert "--out" in capsys.readouterr().out
