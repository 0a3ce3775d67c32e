"""Check for notebook 06's Exercise 4: per-head maps from PyTorch's own ``nn.MultiheadAttention``.

The learner's function must return what the module computes at inference, one map per head, with padded keys
hidden. The reference is the module itself, called on a copy in eval mode; each typical mistake (heads averaged,
dropout left on, no mask, the mask inverted) is recomputed and named when it matches.
"""

from __future__ import annotations

import copy

import torch

from ..analysis import maps
from ._common import CheckFailed, call, expect_tensor, friendly, passed, refusing

_PACKAGE_MAPS = {
    maps.collect_attention: "mha_tutorial.analysis.maps.collect_attention",
    maps.average_attention: "mha_tutorial.analysis.maps.average_attention",
}


def _torch_cases():
    """(module in training mode, x (B, T, D), valid_lens (B,), description) for each case, seeded."""
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        torch.manual_seed(6)
        cases = []
        for D, H, lens in [(16, 4, [5, 5]), (24, 3, [6, 4, 2]), (8, 2, [3, 1])]:
            mha = torch.nn.MultiheadAttention(D, H, dropout=0.2, batch_first=True)  # training mode, as built
            x = torch.randn(len(lens), max(lens), D)
            cases.append((mha, x, torch.tensor(lens), f"D={D}, H={H}, valid_lens={lens}"))
        return cases


def _weights(mha, x, key_padding_mask, average=False) -> torch.Tensor:
    with torch.no_grad():
        _, w = copy.deepcopy(mha).eval()(
            x, x, x, key_padding_mask=key_padding_mask, need_weights=True, average_attn_weights=average
        )
    return w  # (B, H, T, T), or (B, T, T) when averaged


def _name_mistake(actual, mha, x, padded, case: str) -> None:
    """Raise naming the first typical mistake that ``actual`` reproduces, or the first wrong value."""
    B, T = x.shape[:2]
    H = mha.num_heads
    if tuple(actual.shape) == (B, T, T):
        raise CheckFailed(
            f"{case}: shape (B, T, T), one map for all heads: nn.MultiheadAttention averages the heads unless "
            "you pass average_attn_weights=False"
        )
    if tuple(actual.shape) != (B, H, T, T):
        raise CheckFailed(f"{case}: wrong shape {tuple(actual.shape)}, expected (B, H, T, T) = {(B, H, T, T)}")
    if torch.isnan(actual).any():
        raise CheckFailed(
            f"{case}: NaN rows, every key hidden: PyTorch's key_padding_mask is True where a key is *padding*, "
            "the opposite of our keep-mask"
        )
    real = torch.arange(T)[None] < torch.tensor([int((~p).sum()) for p in padded])[:, None]  # (B, T)
    if not torch.allclose(actual.sum(-1)[real[:, None].expand(-1, H, -1)], torch.tensor(1.0), atol=1e-4):
        raise CheckFailed(
            f"{case}: rows do not sum to 1: the module is in training mode, so its weights passed through "
            "dropout; call mha.eval() first (a map shows what the model computes at inference)"
        )
    wrong = [
        (_weights(mha, x, None), "padded keys got weight: pass key_padding_mask, True beyond valid_lens"),
        (_weights(mha, x, ~padded), "the mask is inverted: key_padding_mask is True where a key is *padding*"),
    ]
    for candidate, message in wrong:
        if not torch.isnan(candidate).any() and torch.allclose(actual, candidate, atol=1e-5):
            raise CheckFailed(f"{case}: {message}")
    raise CheckFailed(f"{case}: wrong weights (max difference {(actual - _weights(mha, x, padded)).abs().max():.3g})")


@friendly
def check_torch_head_maps(fn) -> None:
    """``fn(mha, x (B, T, D), valid_lens (B,))`` -> (B, H, T, T): the per-head self-attention weights of a
    ``batch_first`` ``nn.MultiheadAttention`` at inference, keys at positions >= valid_lens hidden."""
    cases = _torch_cases()
    for mha, x, lens, case in cases:
        padded = torch.arange(x.shape[1])[None] >= lens[:, None]  # (B, T): True = padding, PyTorch's convention
        expected = _weights(mha, x, padded)  # (B, H, T, T)
        with refusing(_PACKAGE_MAPS):
            result = call(fn, copy.deepcopy(mha), x.clone(), lens.clone(), case=case)
        if result is None:
            raise CheckFailed(f"{case}: got None: the weights are the module's second output, with need_weights=True")
        actual = expect_tensor(result, case).detach().cpu().float()
        if tuple(actual.shape) == tuple(expected.shape) and torch.allclose(actual, expected, atol=1e-5):
            continue
        _name_mistake(actual, mha, x, padded, case)
    passed("check_torch_head_maps", len(cases))
