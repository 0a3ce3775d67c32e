"""The checks of rotary position embeddings (``rope.py``), kept apart so that module can show its formulas.

Each function raises a ``TypeError`` or ``ValueError`` naming the value, shape or type it got, before any
arithmetic: an odd head size has no pairs to rotate, and float positions would rotate by fractional steps silently.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._validate_masks import _shape, _type_name

LAYOUTS = ("half", "interleaved")


def head_size(d) -> None:
    """A positive even int: the features are rotated in d/2 pairs."""
    if isinstance(d, bool) or not isinstance(d, numbers.Integral):
        raise TypeError(f"head_size must be an int, got {_type_name(d)} {d!r:.40}")
    if d < 2 or d % 2:
        raise ValueError(f"RoPE rotates features in pairs, so head_size must be positive and even, got {d}")


def base(value, name: str = "base") -> None:
    """A finite real number > 0 (the frequencies are base^(-2i/d))."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {_type_name(value)} {value!r:.40}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0 (the frequencies are base^(-2i/d)), got {value!r}")


def layout(name) -> None:
    if not isinstance(name, str) or name not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {name!r:.40}")


def positions(pos) -> torch.Tensor:
    """An integer tensor (a list or range is converted): a position counts tokens."""
    if not isinstance(pos, torch.Tensor):
        try:
            pos = torch.as_tensor(pos)
        except (TypeError, ValueError, RuntimeError):  # None, a string, ragged lists ...
            raise TypeError(f"positions must be an integer tensor, got {_type_name(pos)} {pos!r:.60}") from None
    if pos.dtype == torch.bool or pos.is_floating_point() or pos.is_complex():
        raise TypeError(f"positions must be an integer tensor (positions count tokens), got dtype {pos.dtype}")
    return pos


def angles_inputs(pos, d, value) -> torch.Tensor:
    """``rope_angles``: integer positions of any shape, an even head size, a positive base."""
    head_size(d)
    base(value)
    return positions(pos)


def rope_inputs(x, pos, value, name) -> torch.Tensor:
    """``apply_rope``: x (..., T, d) floating with d even; positions (T,) or (B, T) with B = x.shape[0]."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"apply_rope expects x to be a tensor (..., T, d), got {_type_name(x)}")
    if not x.is_floating_point():
        raise TypeError(f"apply_rope expects a floating x, got dtype {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"apply_rope expects x of shape (..., T, d), got shape {_shape(x)}")
    if x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(f"RoPE rotates features in pairs: x (..., T, d) needs d even and > 0, got shape {_shape(x)}")
    pos = angles_inputs(pos, x.shape[-1], value)
    layout(name)
    T = x.shape[-2]
    if pos.dim() == 1:
        expected = (T,)
    elif pos.dim() == 2 and x.dim() >= 3:
        expected = (x.shape[0], T)
    else:
        expected = f"({T},) or ({x.shape[0]}, {T})" if x.dim() >= 3 else f"({T},)"  # (T,) or (B, T)
    if _shape(pos) != expected:
        raise ValueError(f"positions has shape {_shape(pos)}, expected {expected} for x of shape {_shape(x)}")
    if pos.device != x.device:
        raise ValueError(f"positions are on {pos.device}, x on {x.device}")
    return pos


# ---- MultiHeadAttention(rope_base=...) ----------------------------------------------------------------------------
def attention_config(rope_base, num_hiddens: int, num_heads: int) -> None:
    """``MultiHeadAttention(rope_base=...)``: None (no rotation), or a base > 0 with an even head size."""
    if rope_base is None:
        return
    base(rope_base, "rope_base")
    if (num_hiddens // num_heads) % 2:
        raise ValueError(
            f"rope_base={rope_base!r} rotates q and k in pairs of features, so the head size num_hiddens / num_heads "
            f"= {num_hiddens} / {num_heads} = {num_hiddens // num_heads} must be even"
        )


def no_rope(what: str, rope_base, why: str) -> None:
    """Refuse rotary positions in an attention variant whose own ``forward`` would not rotate q and k."""
    if rope_base is not None:
        raise NotImplementedError(f"{what} cannot rotate q and k (rope_base={rope_base!r}): {why}")


def attention_positions(module, queries, keys, pos, kv_cache):
    """``MultiHeadAttention.forward(positions=...)``: None or integer positions (T,) or (B, T) of the new queries,
    which must be the new keys (self-attention); refused for a layer without ``rope_base``. Returns them or None."""
    if module.rope_base is None:
        if pos is not None:
            raise ValueError(
                "positions were given, but this layer has no rotary positions (rope_base=None): "
                "only a layer made with MultiHeadAttention(..., rope_base=...) rotates q and k by their positions"
            )
        return None
    Q, K = queries.shape[1], keys.shape[1]
    if Q != K or (kv_cache is not None and not kv_cache.grow):
        what = "a fixed (cross-attention) cache" if Q == K else f"{Q} queries but {K} new keys"
        raise ValueError(
            f"rotary positions (rope_base={module.rope_base}) are for self-attention, where the new queries are the "
            f"new keys, at the same positions; got {what}: make cross-attention layers without rope_base"
        )
    if pos is None:
        return None
    pos = positions(pos)
    expected = [(K,), (queries.shape[0], K)]
    if _shape(pos) not in expected:
        raise ValueError(
            f"positions has shape {_shape(pos)}, expected {expected[0]} or {expected[1]} (one per new query) for "
            f"queries of shape {_shape(queries)}"
        )
    if pos.device != queries.device:
        raise ValueError(f"positions are on {pos.device}, the queries on {queries.device}")
    return pos
