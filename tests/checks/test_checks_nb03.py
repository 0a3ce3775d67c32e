"""The exercise checks of notebook 03 accept right answers and reject typical wrong ones by name."""

from __future__ import annotations

import pytest
import torch

from mha_tutorial import transpose_output, transpose_qkv
from mha_tutorial.checks import (
    CheckFailed,
    check_average_heads,
    check_expand_kv_heads,
    check_expand_valid_lens,
    check_transpose_output,
    check_transpose_qkv,
    check_transpose_qkv_seq_first,
)


def qkv_right(X, num_heads):
    B, T, D = X.shape
    return X.view(B, T, num_heads, D // num_heads).transpose(1, 2).reshape(B * num_heads, T, D // num_heads)


def qkv_no_permute(X, num_heads):
    B, T, D = X.shape
    return X.reshape(B * num_heads, T, D // num_heads)


def qkv_head_major(X, num_heads):
    B, T, D = X.shape
    return X.reshape(B, T, num_heads, D // num_heads).permute(2, 0, 1, 3).reshape(B * num_heads, T, D // num_heads)


def qkv_split_d_h(X, num_heads):
    B, T, D = X.shape
    d = D // num_heads
    return X.reshape(B, T, d, num_heads).permute(0, 3, 1, 2).reshape(B * num_heads, T, d)


def qkv_four_d(X, num_heads):
    B, T, D = X.shape
    return X.reshape(B, T, num_heads, D // num_heads).permute(0, 2, 1, 3)


def qkv_view_after_permute(X, num_heads):
    B, T, D = X.shape
    return X.view(B, T, num_heads, D // num_heads).permute(0, 2, 1, 3).view(B * num_heads, T, D // num_heads)


def qkv_off_by_one(X, num_heads):
    out = qkv_right(X, num_heads).clone()
    out[0, 0, 0] += 1
    return out


def test_transpose_qkv_accepts_right_answers(capsys):
    check_transpose_qkv(qkv_right)
    assert "✓ check_transpose_qkv: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (qkv_no_permute, "without moving the head axis"),
        (qkv_head_major, "head-major"),
        (qkv_split_d_h, "split as (d, H)"),
        (qkv_four_d, "4-D layout"),
        (qkv_view_after_permute, "use .reshape()"),
        (qkv_off_by_one, "wrong values, first at index (0, 0, 0)"),
    ],
)
def test_transpose_qkv_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed, match=None) as info:
        check_transpose_qkv(wrong)
    assert words in str(info.value)


def out_right(X, num_heads):
    BH, T, d = X.shape
    return X.view(BH // num_heads, num_heads, T, d).transpose(1, 2).reshape(BH // num_heads, T, num_heads * d)


def out_no_permute(X, num_heads):
    BH, T, d = X.shape
    return X.reshape(BH // num_heads, T, num_heads * d)


def out_head_major(X, num_heads):
    BH, T, d = X.shape
    return X.reshape(num_heads, BH // num_heads, T, d).permute(1, 2, 0, 3).reshape(BH // num_heads, T, num_heads * d)


def out_interleaved(X, num_heads):
    BH, T, d = X.shape
    return X.reshape(BH // num_heads, num_heads, T, d).permute(0, 2, 3, 1).reshape(BH // num_heads, T, num_heads * d)


def test_transpose_output_accepts_right_answers(capsys):
    check_transpose_output(out_right)
    assert "passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (out_no_permute, "without moving the head axis"),
        (out_head_major, "head-major"),
        (out_interleaved, "interleaved"),
        (lambda X, H: X, "wrong shape"),
    ],
)
def test_transpose_output_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_transpose_output(wrong)
    assert words in str(info.value)


def test_expand_valid_lens_accepts_right_answers(capsys):
    check_expand_valid_lens(lambda v, h: torch.repeat_interleave(v, h, dim=0))
    check_expand_valid_lens(lambda v, h: v[:, None].expand(v.shape[0], h, *v.shape[1:]).flatten(0, 1))
    assert "passed on 4 cases" in capsys.readouterr().out


def lens_repeat(v, h):
    return v.repeat(h) if v.dim() == 1 else v.repeat(h, 1)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lens_repeat, "`repeat` instead of `repeat_interleave`"),
        (lambda v, h: torch.repeat_interleave(v, h), "pass dim=0"),  # flattens a (B, Q) tensor
        (lambda v, h: torch.repeat_interleave(v, h, dim=0).float(), "integer dtype"),
        (lambda v, h: v, "wrong shape"),
    ],
)
def test_expand_valid_lens_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_expand_valid_lens(wrong)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "check, fn, words",
    [
        (check_transpose_qkv, transpose_qkv, "mha_tutorial.transpose_qkv"),
        (check_transpose_qkv, lambda X, H: transpose_qkv(X, H) + 0, "mha_tutorial.transpose_qkv"),
        (check_transpose_output, transpose_output, "mha_tutorial.transpose_output"),
        (check_transpose_output, lambda X, H: transpose_output(X.clone(), H), "mha_tutorial.transpose_output"),
    ],
)
def test_the_package_functions_are_refused(check, fn, words):
    with pytest.raises(CheckFailed, match="write that step yourself") as info:
        check(fn)
    assert words in str(info.value)


def kv_right(kv, num_kv_heads, num_heads):
    return torch.repeat_interleave(kv, num_heads // num_kv_heads, dim=0)


def kv_right_by_expand(kv, num_kv_heads, num_heads):
    group = num_heads // num_kv_heads
    return kv[:, None].expand(kv.shape[0], group, *kv.shape[1:]).flatten(0, 1)  # (B*G, r, T, d) -> (B*H, T, d)


def test_expand_kv_heads_accepts_right_answers(capsys):
    check_expand_kv_heads(kv_right)
    check_expand_kv_heads(kv_right_by_expand)
    assert capsys.readouterr().out.count("✓ check_expand_kv_heads: passed on 4 cases") == 2


def kv_within_example(kv, num_kv_heads, num_heads):
    group = num_heads // num_kv_heads
    return kv.unflatten(0, (-1, num_kv_heads)).repeat(1, group, 1, 1).flatten(0, 1)  # head h -> K/V head h mod G


def kv_off_by_one(kv, num_kv_heads, num_heads):
    out = kv_right(kv, num_kv_heads, num_heads).clone()
    out[-1, -1, -1] += 1
    return out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda kv, G, H: kv.repeat(H // G, 1, 1), "`repeat` instead of `repeat_interleave`"),
        (kv_within_example, "K/V head h mod G"),
        (lambda kv, G, H: torch.repeat_interleave(kv, G, dim=0), "repeated G = num_kv_heads"),
        (lambda kv, G, H: torch.repeat_interleave(kv, H // G, dim=1), "positions axis"),
        (lambda kv, G, H: torch.repeat_interleave(kv, H // G), "pass dim=0"),
        (lambda kv, G, H: kv, "wrong shape"),
        (kv_off_by_one, "wrong values, first at index"),
    ],
)
def test_expand_kv_heads_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_expand_kv_heads(wrong)
    assert words in str(info.value)


def average_right(weights, num_heads):
    return weights.unflatten(0, (num_heads, -1)).mean(dim=0)  # head-major (H*B, Q, K) -> (H, B, Q, K) -> (B, Q, K)


def test_average_heads_accepts_the_right_answer(capsys):
    check_average_heads(average_right)
    assert "✓ check_average_heads: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda w, H: w.unflatten(0, (-1, H)).mean(dim=1), "unfolded batch-major"),
        (lambda w, H: w.unflatten(0, (H, -1)).sum(dim=0), "summed the heads"),
        (lambda w, H: w.unflatten(0, (H, -1)).mean(dim=1), "averaged over the examples"),
        (lambda w, H: w.unflatten(0, (H, -1)).mean(dim=2), "averaged over the queries"),
        (lambda w, H: w.unflatten(0, (H, -1))[0], "wrong values"),
    ],
)
def test_average_heads_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_average_heads(wrong)
    assert words in str(info.value)


def seq_right(X, num_heads):
    T, B, D = X.shape
    return X.reshape(T, B, num_heads, D // num_heads).permute(1, 2, 0, 3).reshape(B * num_heads, T, D // num_heads)


def seq_no_permute(X, num_heads):
    T, B, D = X.shape
    return X.reshape(B * num_heads, T, D // num_heads)


def seq_transpose_only(X, num_heads):
    T, B, D = X.shape
    return X.transpose(0, 1).reshape(B * num_heads, T, D // num_heads)


def seq_head_major(X, num_heads):
    T, B, D = X.shape
    return X.reshape(T, B, num_heads, D // num_heads).permute(2, 1, 0, 3).reshape(B * num_heads, T, D // num_heads)


def seq_batch_first(X, num_heads):  # the batch-first recipe applied to a sequence-first input
    T, B, D = X.shape
    return X.reshape(T, B, num_heads, D // num_heads).permute(0, 2, 1, 3).reshape(T * num_heads, B, D // num_heads)


def test_transpose_qkv_seq_first_accepts_right_answers(capsys):
    check_transpose_qkv_seq_first(seq_right)
    check_transpose_qkv_seq_first(lambda X, H: X.unflatten(-1, (H, -1)).permute(1, 2, 0, 3).flatten(0, 1))
    assert "✓ check_transpose_qkv_seq_first: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (seq_no_permute, "without a permute"),
        (seq_transpose_only, "swapped T and B with a transpose"),
        (seq_head_major, "head-major"),
        (seq_batch_first, "treated the input as batch-first"),
        (lambda X, H: seq_right(X, H) + 1, "wrong values, first at index (0, 0, 0)"),
        (lambda X, H: seq_right(X, H)[None], "shape"),
    ],
)
def test_transpose_qkv_seq_first_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_transpose_qkv_seq_first(wrong)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "fn",
    [lambda X, H: transpose_qkv(X.transpose(0, 1), H), lambda X, H: transpose_qkv(X.transpose(0, 1).clone(), H) * 1],
)
def test_transpose_qkv_seq_first_refuses_the_package(fn):
    with pytest.raises(CheckFailed, match="write that step yourself") as info:
        check_transpose_qkv_seq_first(fn)
    assert "mha_tutorial.transpose_qkv" in str(info.value)
