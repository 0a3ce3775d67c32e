"""Independent references and guards shared by the tests, as an importable module (``from testkit import ...``).

The references deliberately avoid the package's own code paths: a plain Python-loop softmax,
``nn.MultiheadAttention`` with weights copied from our module, and a functional multi-head attention built on
``F.scaled_dot_product_attention``. The guards prove that bad input is rejected before any arithmetic.
pytest puts ``tests/`` on the path (``pythonpath`` in pyproject.toml), so any subset of the tests can import this.
Fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

# float32 comparisons against PyTorch's own kernels; float64 ones can be tighter.
TOL32 = dict(rtol=1e-5, atol=1e-6)
TOL64 = dict(rtol=1e-10, atol=1e-12)


def loop_masked_softmax(scores: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis with plain Python loops and ``math.exp``.

    ``keep`` (bool, broadcastable to ``scores``) marks the keys a query may see;
    a row with no visible key is all zeros.
    """
    shape = scores.shape
    flat = scores.detach().double().reshape(-1, shape[-1]).tolist()
    if keep is None:
        keep_rows = [[True] * shape[-1] for _ in flat]
    else:
        keep_rows = keep.expand(shape).reshape(-1, shape[-1]).tolist()
    out = []
    for row, row_keep in zip(flat, keep_rows, strict=True):
        visible = [s for s, k in zip(row, row_keep, strict=True) if k]
        if not visible:
            out.append([0.0] * len(row))
            continue
        top = max(visible)
        exps = [math.exp(s - top) if k else 0.0 for s, k in zip(row, row_keep, strict=True)]
        total = sum(exps)
        out.append([e / total for e in exps])
    return torch.tensor(out, dtype=torch.float64).reshape(shape)


def loop_keep_from_valid_lens(valid_lens, batch: int, num_queries: int, num_keys: int) -> torch.Tensor:
    """(B, Q, K) keep-mask from d2l-style ``valid_lens`` (B,) or (B, Q), by loops."""
    lens = torch.as_tensor(valid_lens).tolist()
    keep = torch.zeros(batch, num_queries, num_keys, dtype=torch.bool)
    for b in range(batch):
        for q in range(num_queries):
            n = lens[b] if not isinstance(lens[b], list) else lens[b][q]
            for k in range(num_keys):
                keep[b, q, k] = k < n
    return keep


def torch_mha_from(mha: nn.Module) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` holding a copy of ``mha``'s weights."""
    embed, heads = mha.num_hiddens, mha.num_heads
    kdim, vdim = mha.W_k.in_features, mha.W_v.in_features
    if mha.W_q.in_features != embed:
        raise ValueError("nn.MultiheadAttention needs queries of size embed_dim")
    bias = mha.W_q.bias is not None
    ref = nn.MultiheadAttention(embed, heads, bias=bias, batch_first=True, kdim=kdim, vdim=vdim)
    ref = ref.to(mha.W_q.weight.dtype)
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            ref.in_proj_weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
        else:
            ref.q_proj_weight.copy_(mha.W_q.weight)
            ref.k_proj_weight.copy_(mha.W_k.weight)
            ref.v_proj_weight.copy_(mha.W_v.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
            ref.out_proj.bias.copy_(mha.W_o.bias)
        ref.out_proj.weight.copy_(mha.W_o.weight)
    return ref.eval()


def functional_mha(mha: nn.Module, queries, keys, values, keep=None):
    """Multi-head attention written with ``F.linear`` and ``F.scaled_dot_product_attention``.

    ``keep`` is a bool mask broadcastable to (B, H, Q, K), True = may attend;
    every query must see at least one key. Heads are split with
    view + transpose (head-major inside each example), independently of
    ``transpose_qkv``.
    """
    B, H, d = queries.shape[0], mha.num_heads, mha.head_size

    def project(layer, x):  # (B, T, in) -> (B, H, T, d)
        return F.linear(x, layer.weight, layer.bias).view(B, x.shape[1], H, d).transpose(1, 2)

    q, k, v = project(mha.W_q, queries), project(mha.W_k, keys), project(mha.W_v, values)
    if keep is not None:
        keep = keep.expand(B, H, queries.shape[1], keys.shape[1])  # SDPA wants at least 2-D masks
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B, H, Q, d)
    out = out.transpose(1, 2).reshape(B, queries.shape[1], H * d)
    return F.linear(out, mha.W_o.weight, mha.W_o.bias)


# Ops that count as "arithmetic": an input error must be raised before any of them runs.
_ARITHMETIC = {
    torch.matmul,
    torch.bmm,
    torch.einsum,
    torch.softmax,
    F.softmax,
    F.linear,
    torch.Tensor.softmax,
    torch.Tensor.__matmul__,
    torch.Tensor.matmul,
    torch.Tensor.bmm,
    torch.Tensor.__rmatmul__,
}


class _NoArithmetic(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _ARITHMETIC:
            raise AssertionError(f"{getattr(func, '__name__', func)} ran before the input was validated")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_arithmetic():
    """Inside this block, a matmul/softmax/linear call fails the test with AssertionError."""
    with _NoArithmetic():
        yield


class ExplodingLinear(nn.Linear):
    """An ``nn.Linear`` whose forward fails: proves validation happens before projecting."""

    def forward(self, x):
        raise AssertionError("a projection ran before the input was validated")


def explode_projections(mha: nn.Module) -> nn.Module:
    """Replace W_q, W_k, W_v, W_o by ``ExplodingLinear`` layers of the same sizes."""
    for name in ("W_q", "W_k", "W_v", "W_o"):
        old = getattr(mha, name)
        w = old.weight
        setattr(mha, name, ExplodingLinear(*w.shape[::-1], bias=old.bias is not None, dtype=w.dtype, device=w.device))
    return mha


def fails_with(check, fn, *fragments):
    """``check(fn)`` must raise CheckFailed with every fragment in its message; returns the message."""
    from mha_tutorial.checks import CheckFailed

    with pytest.raises(CheckFailed) as info:
        check(fn)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def flip_byte(path, offset: int) -> None:
    """Corrupt a file in place: invert the bits of its byte at ``offset``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
