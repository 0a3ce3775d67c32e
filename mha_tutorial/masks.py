r"""Masks: which keys each query may look at.

One convention is used inside the package: a **bool tensor where True means
"may attend"** (the convention of ``F.scaled_dot_product_attention``).
``nn.MultiheadAttention`` uses the opposite one (True means "ignore"), and some
code uses additive float masks (0 to keep, a very negative number or -inf to
drop). The converters below move between the three.

``valid_lens`` is d2l's compact way to describe padding: an integer tensor of
shape (B,) -- every query of example b sees the first ``valid_lens[b]`` keys --
or (B, Q) -- query q of example b sees the first ``valid_lens[b, q]`` keys.
"""

from __future__ import annotations

import torch


def _shape(x) -> tuple:
    return tuple(x.shape)


def as_valid_lens(valid_lens) -> torch.Tensor:
    """Accept a list or tensor of lengths and return an integer tensor.

    Raises ``TypeError`` for floating or bool tensors: a length is a count.
    """
    if not isinstance(valid_lens, torch.Tensor):
        valid_lens = torch.as_tensor(valid_lens)
    if valid_lens.dtype == torch.bool or valid_lens.is_floating_point() or valid_lens.is_complex():
        raise TypeError(f"valid_lens must be an integer tensor (lengths are counts), got dtype {valid_lens.dtype}")
    return valid_lens


def _check_range(valid_lens: torch.Tensor, num_keys: int) -> None:
    if valid_lens.numel() and (valid_lens.min() < 0 or valid_lens.max() > num_keys):
        raise ValueError(
            f"valid_lens values must lie in [0, {num_keys}] (there are {num_keys} keys), "
            f"got min {int(valid_lens.min())} and max {int(valid_lens.max())}"
        )


def check_valid_lens(valid_lens: torch.Tensor, batch_size: int, num_queries: int, num_keys: int) -> None:
    """Raise ``ValueError`` unless ``valid_lens`` is (B,) or (B, Q) with values in [0, K]."""
    shape = _shape(valid_lens)
    if shape not in ((batch_size,), (batch_size, num_queries)):
        raise ValueError(
            f"valid_lens has shape {shape}, expected ({batch_size},) or ({batch_size}, {num_queries}) "
            f"for a batch of {batch_size} with {num_queries} queries"
        )
    _check_range(valid_lens, num_keys)


def check_mask(mask: torch.Tensor, shape: tuple) -> None:
    """Raise unless ``mask`` is a bool tensor that broadcasts to ``shape``."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        what = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(
            f"mask must be a bool tensor with True = may attend, got {what}; "
            "convert additive float masks with additive_to_bool()"
        )
    try:
        broadcast = torch.broadcast_shapes(mask.shape, shape)
    except RuntimeError:
        broadcast = None
    if broadcast != torch.Size(shape):
        raise ValueError(f"mask of shape {_shape(mask)} does not broadcast to the scores' shape {tuple(shape)}")


def padding_mask(valid_lens, num_keys: int) -> torch.Tensor:
    """Turn ``valid_lens`` into a bool keep-mask over the keys.

    valid_lens (B,)   -> (B, 1, K): the same row for every query
    valid_lens (B, Q) -> (B, Q, K): one row per query
    """
    valid_lens = as_valid_lens(valid_lens)
    if valid_lens.dim() not in (1, 2):
        raise ValueError(f"valid_lens must have shape (B,) or (B, Q), got {_shape(valid_lens)}")
    _check_range(valid_lens, num_keys)
    positions = torch.arange(num_keys, device=valid_lens.device)  # (K,)
    lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens
    return positions < lens[..., None]  # (B, 1 or Q, K)


def causal_mask(num_queries: int, num_keys: int | None = None, device=None) -> torch.Tensor:
    """Bool (Q, K) mask where query i may attend to keys 0..i (+ offset when K > Q).

    When there are more keys than queries (a decoder continuing a cached
    prefix), the queries are the *last* Q positions, so query i sees keys up to
    i + (K - Q). With fewer keys than queries the same rule leaves the first
    Q - K queries with no visible key (rows of False).
    """
    num_keys = num_queries if num_keys is None else num_keys
    if num_queries < 0 or num_keys < 0:
        raise ValueError(f"causal_mask needs non-negative sizes, got Q={num_queries}, K={num_keys}")
    return torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril(num_keys - num_queries)


def keep_to_drop(mask: torch.Tensor) -> torch.Tensor:
    """SDPA convention (True = attend) -> ``nn.MultiheadAttention`` convention (True = ignore)."""
    check_mask(mask, mask.shape)
    return ~mask


def drop_to_keep(mask: torch.Tensor) -> torch.Tensor:
    """``nn.MultiheadAttention`` convention (True = ignore) -> SDPA convention (True = attend)."""
    check_mask(mask, mask.shape)
    return ~mask


def bool_to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Keep-mask -> additive float mask: 0 where True, -inf where False."""
    check_mask(mask, mask.shape)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"bool_to_additive needs a floating dtype (the mask is added to scores), got {dtype}; "
            "a bool result would be read as a keep-mask"
        )
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))


def additive_to_bool(mask: torch.Tensor) -> torch.Tensor:
    """Additive float mask -> keep-mask: True where the mask adds a finite amount > -1e4.

    Large negative numbers (-1e4, -1e6, -1e9, -inf) all count as "drop".
    """
    if not isinstance(mask, torch.Tensor) or not mask.is_floating_point():
        raise TypeError(f"additive_to_bool expects a floating tensor, got {getattr(mask, 'dtype', type(mask))}")
    return mask > -1e4


def combine_masks(valid_lens, mask, num_keys: int) -> torch.Tensor | None:
    """One keep-mask broadcastable to (B, H, Q, K) from ``valid_lens`` and/or a bool ``mask``.

    ``valid_lens`` (B,) or (B, Q) becomes (B, 1, 1 or Q, K); ``mask`` must already
    broadcast to (B, H, Q, K). Returns None when neither is given.
    """
    keep = None
    if valid_lens is not None:
        keep = padding_mask(valid_lens, num_keys)[:, None]  # (B, 1, 1 or Q, K)
    if mask is not None:
        keep = mask if keep is None else keep & mask.to(keep.device)
    return keep
