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


def base(value) -> None:
    """A finite real number > 0 (the frequencies are base^(-2i/d))."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"base must be a real number, got {_type_name(value)} {value!r:.40}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"base must be finite and > 0 (the frequencies are base^(-2i/d)), got {value!r}")


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
