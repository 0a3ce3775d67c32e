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

from . import _validate_masks as validate
from ._validate_masks import _check_range, _shape, as_valid_lens, check_mask, check_valid_lens  # noqa: F401 (re-exported)


def padding_mask(valid_lens, num_keys: int) -> torch.Tensor:
    """Turn ``valid_lens`` into a bool keep-mask over the keys.

    valid_lens (B,)   -> (B, 1, K): the same row for every query
    valid_lens (B, Q) -> (B, Q, K): one row per query
    """
    validate.key_count(num_keys)
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
    Q - K queries with no visible key (rows of False). The sizes are ints (NumPy integers and
    integer 0-d tensors count); a float, a string or a bool raises ``TypeError``.
    """
    num_keys = num_queries if num_keys is None else num_keys
    validate.causal_sizes(num_queries, num_keys)
    if num_queries < 0 or num_keys < 0:
        raise ValueError(f"causal_mask needs non-negative sizes, got Q={num_queries}, K={num_keys}")
    return torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril(num_keys - num_queries)


def keep_to_drop(mask: torch.Tensor) -> torch.Tensor:
    """SDPA convention (True = attend) -> ``nn.MultiheadAttention`` convention (True = ignore)."""
    validate.bool_mask(mask)
    return ~mask


def drop_to_keep(mask: torch.Tensor) -> torch.Tensor:
    """``nn.MultiheadAttention`` convention (True = ignore) -> SDPA convention (True = attend)."""
    validate.bool_mask(mask)
    return ~mask


def bool_to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Keep-mask -> additive float mask: 0 where True, -inf where False."""
    validate.bool_mask(mask)
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
    validate.additive_mask(mask)
    return mask > -1e4


def combine_masks(valid_lens, mask, num_keys: int, ndim: int = 4, device=None) -> torch.Tensor | None:
    """One keep-mask for scores with ``ndim`` axes (B, ..., Q, K) from ``valid_lens`` and/or a bool ``mask``.

    ``valid_lens`` (B,) or (B, Q) becomes (B, 1.., 1 or Q, K); ``mask`` must already broadcast to the
    scores. Both end up on ``device`` (default: ``valid_lens``'s). Returns None when neither is given.
    This is the one place where the two ways of masking meet.
    """
    keep = None
    if valid_lens is not None:
        keep = padding_mask(valid_lens, num_keys)  # (B, 1 or Q, K)
        keep = keep.view(keep.shape[0], *([1] * (ndim - 3)), *keep.shape[1:])  # (B, 1.., 1 or Q, K)
        keep = keep if device is None else keep.to(device)
    if mask is not None:
        mask = mask if device is None else mask.to(device)
        keep = mask if keep is None else keep & mask.to(keep.device)
    return keep


def and_causal(mask, num_queries: int, num_keys: int, device=None) -> torch.Tensor:
    """``mask`` AND ``causal_mask(Q, K)``: what ``is_causal=True`` means, in every attention module."""
    causal = causal_mask(num_queries, num_keys, device=device)  # (Q, K)
    return causal if mask is None else mask.to(causal.device) & causal


def as_4d(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A mask broadcastable to (B, H, Q, K) with all four axes: (K,) -> (1, 1, 1, K), (Q, K) -> (1, 1, Q, K), ..."""
    return None if mask is None else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def fold_heads(mask: torch.Tensor | None, batch: int, num_heads: int) -> torch.Tensor | None:
    """A mask broadcastable to (B, H, Q, K) -> one broadcastable to (B*H, Q, K), row b*H + h for head h of b."""
    if mask is None or mask.dim() <= 2:  # (Q, K) or (K,): the same for every example and head
        return mask
    mask = as_4d(mask)  # (b, h, Q, K), b in {1, B}, h in {1, H}
    if mask.shape[0] == 1 and mask.shape[1] == 1:
        return mask[0]  # (1, Q, K)
    return mask.expand(batch, num_heads, *mask.shape[2:]).reshape(-1, *mask.shape[2:])  # (B*H, Q, K)
