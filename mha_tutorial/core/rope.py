r"""Rotary position embeddings (RoPE; Su et al. 2021, arXiv:2104.09864): positions as rotations of q and k.

A query or key x of head size d at integer position m is cut into d/2 pairs of features (a_i, b_i); pair i is
turned by the angle m θ_i, with one frequency per pair:

.. math::
    \theta_i = \text{base}^{-2i/d}, \quad i = 0, \dots, d/2 - 1, \qquad
    \begin{pmatrix} a_i' \\ b_i' \end{pmatrix} =
    \begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & \cos m\theta_i \end{pmatrix}
    \begin{pmatrix} a_i \\ b_i \end{pmatrix},

that is z_i = a_i + i b_i becomes z_i e^{i m θ_i} (the paper's complex form). Written for whole vectors,

.. math::
    R(m)\, x = x \odot \cos(m\theta) + \operatorname{rotate}(x) \odot \sin(m\theta),

where rotate(x) puts (−b_i, a_i) where (a_i, b_i) were. Rotations compose and are orthogonal, so the score of a
query at m and a key at n depends on the positions only through their offset, and no norm changes:

.. math::
    \langle R(m) q, R(n) k \rangle = \langle q, R(n - m) k \rangle, \qquad \lVert R(m) x \rVert = \lVert x \rVert .

Only q and k are rotated (after the projections and the head split), never v; position 0 is the identity.

Two layouts say which features form pair i. ``"interleaved"``: (2i, 2i+1), as in the paper. ``"half"``:
(i, i + d/2), as in GPT-NeoX and Hugging Face's Llama code, which needs no strided slicing. They are the same
rotation up to a fixed permutation of the features (``interleaved_to_half``), which is why a checkpoint moved from
one to the other has the rows of each head of W_q and W_k permuted.

Precision: the angles are computed in float32 (float64 for float64 x) even for 16-bit x, and the result is cast
back at the end: at position 1000, a bfloat16 angle would be off by whole radians.
Checks live in ``_validate_rope``.
"""

from __future__ import annotations

import functools

import torch

from . import _validate_rope as validate

__all__ = ["apply_rope", "interleaved_to_half", "rope_angles", "rope_frequencies"]


def rope_frequencies(head_size: int, base: float = 10000.0, dtype=torch.float32, device=None) -> torch.Tensor:
    """θ_i = base^(-2i/d) for i = 0 .. d/2 - 1: shape (d/2,), from 1 down to about 1/base; computed in float64."""
    validate.head_size(head_size)
    validate.base(base)
    exponents = torch.arange(0, head_size, 2, dtype=torch.float64, device=device) / head_size  # (d/2,): 2i/d
    return (float(base) ** -exponents).to(dtype)  # (d/2,)


def rope_angles(positions, head_size: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    """The angles m θ_i: integer positions (..., T) -> (..., T, d/2), in ``dtype`` (float32 by default).

    ``positions`` may have any shape: (T,) for one sequence, or (B, T) for a batch whose rows start at different
    positions (a KV cache's offset, left padding).
    """
    positions = validate.angles_inputs(positions, head_size, base)  # (..., T) integer
    theta = rope_frequencies(head_size, base, dtype, positions.device)  # (d/2,)
    return positions.to(dtype)[..., None] * theta  # (..., T, d/2)


def interleaved_to_half(head_size: int) -> torch.Tensor:
    """The permutation P (d,) of the features that turns interleaved pairs into half pairs.

    ``P = [0, 2, 4, ..., d-2, 1, 3, ..., d-1]``: feature 2i goes to slot i, feature 2i+1 to slot i + d/2, so

        apply_rope(x[..., P], layout="half") == apply_rope(x, layout="interleaved")[..., P].

    ``P.argsort()`` is the way back.
    """
    validate.head_size(head_size)
    return torch.cat([torch.arange(0, head_size, 2), torch.arange(1, head_size, 2)])  # (d,) int64


def _rotate(x: torch.Tensor, layout: str) -> torch.Tensor:
    """rotate(x): every pair (a_i, b_i) of x (..., d) replaced by (−b_i, a_i); shape (..., d)."""
    if layout == "half":
        a, b = x.chunk(2, dim=-1)  # (..., d/2) each: features i and i + d/2
        return torch.cat([-b, a], dim=-1)  # (..., d)
    a, b = x[..., 0::2], x[..., 1::2]  # (..., d/2) each: features 2i and 2i + 1
    return torch.stack([-b, a], dim=-1).flatten(-2)  # (..., d/2, 2) -> (..., d), pairs back in place


def _per_feature(angles: torch.Tensor, layout: str) -> torch.Tensor:
    """(..., d/2) angles of the pairs -> (..., d): each pair's angle at both of its features."""
    if layout == "half":
        return torch.cat([angles, angles], dim=-1)  # (..., d): slot i and i + d/2 share θ_i
    return angles.repeat_interleave(2, dim=-1)  # (..., d): slots 2i and 2i + 1 share θ_i


def apply_rope(x: torch.Tensor, positions, base: float = 10000.0, layout: str = "half") -> torch.Tensor:
    """R(m) x for each position m: x (..., T, d) -> (..., T, d), same dtype as x.

    ``positions``: integers, (T,) shared by every row, or (B, T) with B = x.shape[0] (one row of positions per
    sequence, broadcast over the heads of x (B, H, T, d)). Apply it to the queries and keys with their own
    positions; with a KV cache the cached keys are already rotated, and the new ones continue at the cache length.
    """
    positions = validate.rope_inputs(x, positions, base, layout)  # (T,) or (B, T)
    B, T, d = x.shape[0], x.shape[-2], x.shape[-1]
    acc = torch.promote_types(x.dtype, torch.float32)  # float32 for 16-bit x, float64 for float64
    angles = rope_angles(positions, d, base, dtype=acc)  # (T, d/2) or (B, T, d/2)
    if positions.dim() == 2:
        angles = angles.view(B, *[1] * (x.dim() - 3), T, d // 2)  # (B, 1, ..., 1, T, d/2): same for every head
    angles = _per_feature(angles, layout)  # (..., T, d)
    xf = x.to(acc)  # (..., T, d)
    out = xf * angles.cos() + _rotate(xf, layout) * angles.sin()  # (..., T, d)
    return out.to(x.dtype)


def rotate_range(x: torch.Tensor, start: int, base: float = 10000.0, layout: str = "half") -> torch.Tensor:
    """``apply_rope(x, arange(start, start + T), base, layout)`` for x (..., T, d), already validated.

    The same numbers, but the cos and sin of the angles are computed once per (start, T) and kept: a decoder's
    layers turn their q and k by the same positions at every step (30 layers x 2 in SmolLM2), and recomputing them
    each time cost a sixth of a decoding step (notebook 14).
    """
    T, d = x.shape[-2], x.shape[-1]
    acc = torch.promote_types(x.dtype, torch.float32)
    cos, sin = _cos_sin(start, T, d, float(base), layout, acc, x.device, torch.is_inference_mode_enabled())  # (T, d)
    xf = x.to(acc)  # (..., T, d)
    return (xf * cos + _rotate(xf, layout) * sin).to(x.dtype)


@functools.lru_cache(maxsize=8)
def _cos_sin(start, length, head_size, base, layout, dtype, device, inference_mode):
    """cos and sin of the angles of positions start .. start + length - 1, per feature: two (length, d) tensors.
    (``inference_mode`` is part of the key: a tensor made under it cannot be used where autograd records.)"""
    positions = torch.arange(start, start + length, device=device)  # (T,)
    angles = _per_feature(rope_angles(positions, head_size, base, dtype), layout)  # (T, d)
    return angles.cos(), angles.sin()
