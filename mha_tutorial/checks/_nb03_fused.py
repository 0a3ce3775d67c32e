"""Check for notebook 03's exercise on heads from a fused projection (one linear layer of width 3D).

The input's values say where they came from: 10000 w + 1000 b + 100 t + 10 h + j for block w (0 = queries, 1 = keys,
2 = values), example b, position t, head h and feature j. Cutting each head's 3d features into q, k and v (the layout
of checkpoints that interleave them per head), folding head-major and skipping the permute are named.
"""

from __future__ import annotations

import torch

from ..core import heads as _heads
from ..core.heads import transpose_qkv
from ._common import CheckFailed, call, expect_shape, expect_tensor, friendly, passed, refusing

# (batch, steps, heads, head_size): B, T, H > 1, and H >= 3 in two cases so that a per-head cut lands in other heads
_FUSED_CASES = [(2, 3, 3, 2), (3, 2, 4, 3), (2, 4, 2, 2)]
_LEGEND = (
    "10000*w + 1000*b + 100*t + 10*h + j for block w (0 = Q, 1 = K, 2 = V), example b, position t, head h, feature j"
)


def _fused(batch: int, steps: int, heads: int, size: int) -> torch.Tensor:
    """(B, T, 3*H*d): Q's H*d features, then K's, then V's, each labelled by its digits."""
    idx = [torch.arange(n) for n in (3, batch, steps, heads, size)]
    w, b, t, h, j = (i.view([-1 if k == m else 1 for k in range(5)]) for m, i in enumerate(idx))
    labels = 10000 * w + 1000 * b + 100 * t + 10 * h + j  # (3, B, T, H, d)
    return labels.permute(1, 2, 0, 3, 4).reshape(batch, steps, 3 * heads * size)


def _per_head_cut(qkv: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """The mistake: split the 3D features into H heads of 3d first, then cut each head's 3d into q, k, v."""
    batch, steps, width = qkv.shape
    per_head = qkv.reshape(batch, steps, heads, width // heads).permute(0, 2, 1, 3)  # (B, H, T, 3d)
    return [part.reshape(batch * heads, steps, -1) for part in per_head.chunk(3, dim=-1)]


@friendly
def check_split_fused_qkv(fn) -> None:
    """``fn(qkv, num_heads)``: (B, T, 3D) -> (q, k, v), each (B*H, T, d) folded batch-major as transpose_qkv."""
    for batch, steps, heads, size in _FUSED_CASES:
        qkv = _fused(batch, steps, heads, size)
        case = f"qkv of shape {tuple(qkv.shape)}, num_heads={heads}"
        refused = {_heads.transpose_qkv: "mha_tutorial.transpose_qkv"}
        with refusing(refused):
            result = call(fn, qkv.clone(), heads, case=case)
        if not isinstance(result, tuple | list) or len(result) != 3:
            raise CheckFailed(f"{case}: return the three tensors (q, k, v), got {type(result).__name__}")
        actual = [expect_tensor(r, case).detach().cpu() for r in result]
        expected = [transpose_qkv(block, heads) for block in qkv.chunk(3, dim=-1)]  # the package's, as reference
        for name, a, e, wrong in zip("qkv", actual, expected, _per_head_cut(qkv, heads), strict=True):
            expect_shape(a, e.shape, f"{case}, {name}")
            if torch.equal(a, e):
                continue
            if torch.equal(a, wrong):
                raise CheckFailed(
                    f"{case}, {name}: you split the 3D features into heads first and cut each head's 3d into q, k, "
                    "v; here Q fills features 0..D-1, K D..2D-1, V 2D..3D-1, so cut the three blocks of D first"
                )
            for other, e_other in zip("qkv", expected, strict=True):
                if other != name and torch.equal(a, e_other):
                    raise CheckFailed(f"{case}: the tensor returned as {name} holds {other}; return them as (q, k, v)")
            block = qkv.chunk(3, dim=-1)["qkv".index(name)]
            if torch.equal(a, block.reshape(a.shape)):
                raise CheckFailed(f"{case}, {name}: reshaped straight to (B*H, T, d); permute the head axis first")
            if torch.equal(a, block.unflatten(-1, (heads, size)).permute(2, 0, 1, 3).reshape(a.shape)):
                raise CheckFailed(f"{case}, {name}: folded head-major (row h*B + b); fold batch-major, row b*H + h")
            where = tuple(int(i) for i in (a != e).nonzero()[0])
            raise CheckFailed(
                f"{case}, {name}: first wrong at index {where}: got {int(a[where])}, expected {int(e[where])} ({_LEGEND})"
            )
    passed("check_split_fused_qkv", len(_FUSED_CASES))
