"""The check of notebook 03's fused-projection exercise accepts right answers and names typical wrong ones."""

from __future__ import annotations

import pytest

from mha_tutorial import transpose_qkv
from mha_tutorial.checks import CheckFailed, check_split_fused_qkv


def fused_right(qkv, num_heads):
    B, T, W = qkv.shape
    D = W // 3
    return tuple(
        b.reshape(B, T, num_heads, D // num_heads).transpose(1, 2).reshape(-1, T, D // num_heads)
        for b in qkv.split(D, -1)
    )


def per_head_cut(qkv, num_heads):  # heads first, then each head's 3d cut into q, k, v
    B, T, W = qkv.shape
    per_head = qkv.reshape(B, T, num_heads, W // num_heads).permute(0, 2, 1, 3)
    return tuple(p.reshape(B * num_heads, T, -1) for p in per_head.chunk(3, -1))


def test_accepts_right_answers(capsys):
    check_split_fused_qkv(fused_right)
    check_split_fused_qkv(
        lambda x, H: tuple(b.unflatten(-1, (H, -1)).permute(0, 2, 1, 3).flatten(0, 1) for b in x.chunk(3, -1))
    )
    assert capsys.readouterr().out.count("✓ check_split_fused_qkv: passed on 3 cases") == 2


@pytest.mark.parametrize(
    "wrong, words",
    [
        (per_head_cut, "cut each head's 3d into q, k, v"),
        (lambda x, H: tuple(b.reshape(x.shape[0] * H, x.shape[1], -1) for b in x.chunk(3, -1)), "reshaped straight"),
        (
            lambda x, H: tuple(b.unflatten(-1, (H, -1)).permute(2, 0, 1, 3).flatten(0, 1) for b in x.chunk(3, -1)),
            "head-major",
        ),
        (lambda x, H: fused_right(x, H)[::-1], "the tensor returned as q holds v"),
        (lambda x, H: fused_right(x, H)[0], "return the three tensors"),
        (lambda x, H: tuple(t + 1 for t in fused_right(x, H)), "first wrong at index (0, 0, 0)"),
        (lambda x, H: tuple(t[:, :, :1] for t in fused_right(x, H)), "shape"),
    ],
)
def test_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_split_fused_qkv(wrong)
    assert words in str(info.value)


def test_refuses_the_package():
    with pytest.raises(CheckFailed, match="mha_tutorial.transpose_qkv"):
        check_split_fused_qkv(lambda x, H: tuple(transpose_qkv(b, H) for b in x.chunk(3, -1)))
