"""The exercise check of notebook 08 accepts right answers and names each bug of the exercise."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial import masked_softmax
from mha_tutorial.checks import check_fixed_attention
from mha_tutorial.checks.nb08 import _CASES, _inputs, reference_attention

from testkit import fails_with as check_fails_with


def make_attention(
    scale="sqrt", mask="b11k", fill="package", dim=-1, merge="transpose-reshape", split="view-transpose"
):
    """A multi-head attention core with one knob per bug of the exercise; the defaults are right."""

    def fn(queries, keys, values, valid_lens, num_heads):
        B, Q, D = queries.shape
        K = keys.shape[1]
        d = D // num_heads

        def heads(X, T):
            if split == "no-transpose":
                return X.reshape(B, num_heads, T, d)  # mixes positions and heads
            return X.view(B, T, num_heads, d).transpose(1, 2)  # (B, H, T, d)

        q, k, v = heads(queries, Q), heads(keys, K), heads(values, K)
        scores = q @ k.transpose(-2, -1)  # (B, H, Q, K)
        scores = {"sqrt": scores / math.sqrt(d), "none": scores, "d": scores / d}[scale]
        real = torch.arange(K) < valid_lens[:, None]  # (B, K)
        keep = {"b11k": real[:, None, None], "bk": real, "b1k": real[:, None], "inverted": ~real[:, None, None]}[mask]
        if fill == "package":
            weights = masked_softmax(scores, mask=keep.expand(scores.shape))
        elif fill == "-inf":
            weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=dim)
        elif fill == "-inf-patched":  # NaN rows patched after the product: right forward, NaN in the backward pass
            weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=dim)
            return _merge(weights @ v, merge, B, Q, D).nan_to_num(), weights.nan_to_num()
        elif fill == "-1e9":
            weights = torch.softmax(scores.masked_fill(~keep, -1e9), dim=dim)
        elif fill == "finfo-zeroed":  # the right recipe written out by hand
            weights = torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=dim)
            weights = weights.masked_fill(~keep.expand(scores.shape).any(-1, keepdim=True), 0.0)
        if dim != -1 and fill == "package":
            weights = torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=dim)
            weights = weights.masked_fill(~keep.expand(scores.shape).any(-1, keepdim=True), 0.0)
        return _merge(weights @ v, merge, B, Q, D), weights

    return fn


def _merge(output, merge, B, Q, D):  # (B, H, Q, d) -> (B, Q, D), rightly or by one of the exercise's bugs
    if merge == "view":
        return output.transpose(1, 2).view(B, Q, D)
    if merge == "no-transpose":
        return output.reshape(B, Q, D)
    return output.transpose(1, 2).reshape(B, Q, D)


def sdpa_attention(queries, keys, values, valid_lens, num_heads):
    """An independent right answer: PyTorch's fused attention (zeros on fully masked rows in this version)."""
    B, Q, D = queries.shape
    K = keys.shape[1]
    q, k, v = (x.unflatten(-1, (num_heads, -1)).transpose(1, 2) for x in (queries, keys, values))
    keep = (torch.arange(K) < valid_lens[:, None])[:, None, None]  # (B, 1, 1, K)
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B, H, Q, d)
    weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask=keep)
    return output.transpose(1, 2).reshape(B, Q, D), weights


def fails_with(fn, *fragments):
    return check_fails_with(check_fixed_attention, fn, *fragments)


def test_right_answers_pass(capsys):
    check_fixed_attention(make_attention())
    check_fixed_attention(make_attention(fill="finfo-zeroed"))
    assert capsys.readouterr().out.count("✓ check_fixed_attention: passed on 3 cases") == 2


@pytest.mark.parametrize(
    "finished, name",
    [
        (reference_attention, "mha_tutorial.scaled_dot_product_attention"),
        (sdpa_attention, "F.scaled_dot_product_attention"),
    ],
)
def test_a_finished_attention_is_refused(finished, name):
    """Right answers, but they skip the exercise: the package's or PyTorch's attention does the work."""
    fails_with(finished, f"your function calls {name}")


def test_the_cases_exercise_every_bug():
    """B != Q and B == Q, B == H, an empty example and unequal lengths are all present."""
    assert any(b != q for b, q, *_ in _CASES) and any(b == q for b, q, *_ in _CASES)
    assert any(b == h for b, _, _, h, *_ in _CASES)
    assert any(0 in lens for *_, lens, _ in _CASES)
    assert all(d > 1 and len(set(lens)) > 1 for *_, d, lens, _ in _CASES)


def test_reference_matches_sdpa():
    for batch, num_queries, num_keys, heads, head_size, lens, seed in _CASES:
        args = (*_inputs(batch, num_queries, num_keys, heads, head_size, seed), torch.tensor(lens), heads)
        out, _ = reference_attention(*args)
        torch.testing.assert_close(out, sdpa_attention(*args)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "knobs, fragment",
    [
        ({"merge": "view"}, "non-contiguous"),
        ({"merge": "no-transpose"}, "heads were merged in the wrong order"),
        ({"mask": "bk"}, "does not broadcast"),  # case 0 has B != Q: it crashes
        ({"mask": "bk", "fill": "-inf"}, "does not broadcast"),
        ({"mask": "b1k"}, "broadcast against the head axis"),  # case 0 has B == H: it runs
        ({"mask": "b1k", "fill": "-inf"}, "section 3"),
        ({"mask": "inverted"}, "convention is inverted"),
        ({"fill": "-inf"}, "0 / 0 = NaN"),
        ({"fill": "-1e9"}, "uniform weights"),
        ({"dim": -2}, "wrong axis"),
        ({"dim": 1}, "head axis, dim=1"),
        ({"dim": -2, "fill": "-inf"}, "softmax runs over the queries"),
        ({"scale": "none"}, "forgot the 1/sqrt(d) scale"),
        ({"scale": "d"}, "not by sqrt(d)"),
        ({"split": "no-transpose"}, None),
    ],
)
def test_each_bug_fails_and_is_named(knobs, fragment):
    fails_with(make_attention(**knobs), *([fragment] if fragment else []))


def test_silent_mask_broadcasts_are_named_on_the_cases_where_they_fit():
    """Where B == Q (or B == H) the misaligned mask runs; the check recognises it instead of crashing on it."""
    from mha_tutorial.checks import nb08

    saved = nb08._CASES
    try:
        nb08._CASES = [c for c in saved if c[0] == c[1]]  # B == Q only: a (B, K) mask fits (Q, K)
        fails_with(make_attention(mask="bk"), "broadcast against the query axis")
        nb08._CASES = [c for c in saved if c[0] == c[3]]  # B == H only: a (B, 1, K) mask fits (H, 1, K)
        fails_with(make_attention(mask="b1k"), "broadcast against the head axis")
    finally:
        nb08._CASES = saved


def test_the_notebooks_buggy_function_fails_and_every_fix_is_needed():
    """All five bugs together fail; fixing any four of them still fails."""
    bugs = {"merge": "view", "mask": "bk", "fill": "-inf", "dim": -2, "scale": "none"}
    fails_with(make_attention(**bugs))
    for left in bugs:
        fails_with(make_attention(**{left: bugs[left]}))


def test_wrong_return_values_are_reported():
    right = make_attention()
    fails_with(lambda q, k, v, lens, h: right(q, k, v, lens, h)[0], "return a pair")
    fails_with(lambda q, k, v, lens, h: right(q, k, v, lens, h)[::-1], "wrong shape")


# Exercise 2: predict which smoke-test checks three new variants fail.
RIGHT_PREDICTIONS = {
    "A: renormalised": {"masked = 0", "no NaN", "= F.sdpa"},
    "B: mask multiplied": {"masked = 0", "= F.sdpa"},
    "C: (B, 1, K) mask": {"runs"},
}


def test_smoke_predictions_right_answer_passes(capsys):
    from mha_tutorial.checks import check_smoke_predictions

    check_smoke_predictions(lambda: RIGHT_PREDICTIONS)
    check_smoke_predictions(lambda: {name: list(cols) for name, cols in RIGHT_PREDICTIONS.items()})
    assert capsys.readouterr().out.count("✓ check_smoke_predictions: passed on 3 cases") == 2


def test_smoke_truth_is_measured_and_a_right_attention_passes_every_check():
    from mha_tutorial.checks import nb08

    assert {name: nb08.smoke_failures(fn) for name, fn in nb08.SMOKE_VARIANTS.items()} == RIGHT_PREDICTIONS
    assert nb08.smoke_failures(lambda q, k, v, lens: nb08.scaled_dot_product_attention(q, k, v, lens)) == set()


@pytest.mark.parametrize(
    "variant, wrong, fragment",
    [
        ("A: renormalised", {"rows sum to 1", "masked = 0", "no NaN", "= F.sdpa"}, "fails 'rows sum to 1'"),
        ("A: renormalised", {"no NaN", "= F.sdpa"}, "0 / 0 = NaN: its masked weights are NaN"),
        ("A: renormalised", {"masked = 0", "= F.sdpa"}, "in the output, the weights and the gradients"),
        ("B: mask multiplied", {"= F.sdpa"}, "exp(0) = 1"),
        ("B: mask multiplied", {"rows sum to 1", "masked = 0", "= F.sdpa"}, "rows sum to 1"),
        ("C: (B, 1, K) mask", {"masked = 0", "= F.sdpa"}, "its B = 3 meets H = 2"),
        ("C: (B, 1, K) mask", {"runs", "= F.sdpa"}, "not run ('-')"),
    ],
)
def test_each_wrong_prediction_is_named(variant, wrong, fragment):
    from mha_tutorial.checks import check_smoke_predictions

    predictions = {**RIGHT_PREDICTIONS, variant: wrong}
    check_fails_with(check_smoke_predictions, lambda: predictions, variant, fragment)


def test_malformed_predictions_are_reported():
    from mha_tutorial.checks import check_smoke_predictions

    check_fails_with(check_smoke_predictions, lambda: {"A": set()}, "one entry per variant")
    bad = {**RIGHT_PREDICTIONS, "C: (B, 1, K) mask": {"crashes"}}
    check_fails_with(check_smoke_predictions, lambda: bad, "set of column names")


def test_a_forward_patched_after_a_minus_inf_fill_is_caught_by_its_gradients():
    """nan_to_num after a -inf softmax gives the right outputs and weights, but NaN in the gradients (section 8)."""
    fails_with(make_attention(fill="-inf-patched"), "the outputs are right but the gradients hold NaN", "finfo")


# Section 12: the versions the lesson's smoke table runs, and the rows it prints (the committed table).
SECTION_12_FAILURES = {
    "b11k_mask": set(),
    "package_masked_softmax": set(),
    "folded_repeat_interleave": set(),
    "bk_mask": {"runs"},
    "kt_wrong_axes": {"runs"},
    "inverted_mask": {"rows sum to 1", "masked = 0", "= F.sdpa"},
    "softmax_over_queries": {"rows sum to 1", "masked = 0", "= F.sdpa"},
    "folded_repeat": {"rows sum to 1", "masked = 0", "= F.sdpa"},
    "no_scale": {"= F.sdpa"},
    "scaled_twice": {"= F.sdpa"},
    "fill_minus_inf": {"masked = 0", "no NaN", "= F.sdpa"},
    "fill_minus_1e9": {"masked = 0", "= F.sdpa"},
}


def test_each_section_12_version_fails_the_smoke_checks_of_its_bug():
    from mha_tutorial.checks import nb08_smoke

    assert {name: nb08_smoke.smoke_failures(getattr(nb08_smoke, name)) for name in SECTION_12_FAILURES} == (
        SECTION_12_FAILURES
    )


def test_print_table_runs_the_given_test_and_marks_checks_not_run(capsys):
    from mha_tutorial.checks import nb08_smoke

    def test(fn):  # a stand-in smoke test: every check passes for fn = True; fn = False "raised"
        return dict.fromkeys(nb08_smoke.SMOKE_COLUMNS, True) if fn else {"runs": False}

    nb08_smoke.print_table({"fine": True, "raises": False}, test)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["version", "runs"]
    assert lines[1].split() == ["fine", "ok", "ok", "ok", "ok", "ok"]
    assert lines[2].split() == ["raises", "FAIL", "-", "-", "-", "-"]
