"""The decoding benchmark: it checks both decoders before timing, reports a wrong one untimed, and measures the
cache's bytes against the formula. No timings are asserted (they are the benchmark's output, not a property)."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from mha_tutorial.bench import decode as bench_decode
from mha_tutorial.core.kv_cache import KVCache
from mha_tutorial.models.model import ModelConfig, build_model

# one thread: on a shared CPU, two OpenMP threads stall at every small op when the other core is busy (timings are
# not what these tests check)
QUICK = ["--quick", "--threads", "1", "--name", "quick"]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out, threads = tmp_path_factory.mktemp("bench_decode"), torch.get_num_threads()
    assert bench_decode.main([*QUICK, "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads  # restored for the tests that follow
    return out


def test_quick_run_checks_times_and_reports_both_decoders(quick_run):
    rows = _rows(quick_run / "quick.csv")
    assert {r["impl"] for r in rows} == {"uncached", "KV cache"}
    assert len(rows) == 2 * (2 + 3)  # two implementations x (two lengths of the small model + three induction)
    for r in rows:
        assert r["status"] == "ok" and r["same_ids"] == "yes" and float(r["max_diff"]) <= bench_decode.TOLERANCE
        assert int(r["repeats"]) == 3 and 0 < float(r["median_ms"]) and 0 < float(r["tokens_per_s"])
        assert 0 < float(r["ratio"]) < math.inf
    for r in rows:  # the cache's bytes per position are the formula's, and it holds prompt + new - 1 positions
        if r["impl"] == "KV cache":
            assert int(r["cache_positions"]) == int(r["prompt"]) + int(r["new_tokens"]) - 1
            assert float(r["bytes_per_token"]) == float(r["formula_bytes_per_token"]) > 0
        else:
            assert float(r["ratio"]) == 1.0 and r["bytes_per_token"] == "nan"
    text = (quick_run / "quick.md").read_text()
    assert "torch.set_num_threads(1)" in text and "UNTRAINED" in text and "## Findings" in text
    assert "goal of >= 5x is" in text and "equal to cache_bytes" in text
    assert (quick_run / "quick.png").stat().st_size > 0


def test_a_wrong_implementation_is_reported_and_not_timed(monkeypatch, tmp_path):
    real = bench_decode.implementations

    def forgets_the_prefix(model, prompt, num_new):  # feeds each new token alone, without a cache
        ids, new = [], prompt
        for _ in range(num_new):
            logits = model(new)[:, -1]
            new = logits.argmax(-1, keepdim=True)
            ids.append(new)
        return bench_decode.Decoded(torch.cat(ids, dim=1), logits, None)

    monkeypatch.setattr(bench_decode, "implementations", lambda: {**real(), "buggy": forgets_the_prefix})
    bench_decode.main([*QUICK, "--out", str(tmp_path)])
    rows = [r for r in _rows(tmp_path / "quick.csv") if r["impl"] == "buggy" and int(r["new_tokens"]) >= 4]
    assert len(rows) == 3 and all(r["status"].startswith("disagrees") for r in rows)
    assert all(r["median_ms"] == r["tokens_per_s"] == "nan" and r["repeats"] == "0" for r in rows)
    assert all(r["status"] == "ok" for r in _rows(tmp_path / "quick.csv") if r["impl"] != "buggy")


def _tiny_decoder():
    config = ModelConfig("decoder", 0, 11, num_hiddens=8, num_heads=2, ffn_num_hiddens=16, num_enc_layers=0,
                         num_dec_layers=2, max_len=12)  # fmt: skip
    return build_model(config).eval()


def test_the_check_accepts_greedy_ids_and_rejects_others():
    model, prompt = _tiny_decoder(), torch.tensor([[3, 1, 4]])
    with torch.inference_mode():
        good = bench_decode.uncached_decode(model, prompt, 5)
        assert bench_decode.check(model, prompt, 5, good) == (True, 0.0)
        cached = bench_decode.cached_decode(model, prompt, 5)
        assert torch.equal(cached.ids, good.ids) and isinstance(cached.cache, KVCache)
        ids = good.ids.clone()
        ids[0, 2] = (ids[0, 2] + 1) % 11  # one id that is not the argmax
        assert not bench_decode.check(model, prompt, 5, good._replace(ids=ids))[0]
        greedy, diff = bench_decode.check(model, prompt, 5, good._replace(last_logits=good.last_logits + 1))
        assert greedy and diff > bench_decode.TOLERANCE
        assert bench_decode.check(model, prompt, 4, good) == (False, math.inf)  # not the length asked for


def test_crossing_is_where_the_ratio_stays_above_one():
    assert bench_decode.crossing([(1, 0.5), (2, 1.2), (3, 0.9), (4, 1.1), (5, 1.3)]) == 4
    assert bench_decode.crossing([(3, 1.5), (1, 0.5), (2, 1.2)]) == 2  # in order of length, not of the list
    assert bench_decode.crossing([(1, 1.5), (2, 2.0)]) == 1
    assert bench_decode.crossing([(1, 0.5), (2, 1.2), (3, 1.0)]) is None  # 1 = break-even, not a gain
    assert bench_decode.crossing([]) is None


def test_bad_options_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="threads"):
        bench_decode.main(["--threads", "0", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="lengths"):
        bench_decode.main(["--lengths", "4", "0", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="max_len=24"):
        bench_decode.main([*QUICK, "--induction-prompt", "24", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
