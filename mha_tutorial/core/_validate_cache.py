"""The checks of KV caches (notebook 11): a cache must fit the layer, the batch and the model it is used with.

A cache that does not fit would not crash: ``torch.cat`` of another batch's keys or of a pruned layer's heads
fails obscurely, and a cache reused for a second prompt silently continues the first. So each is caught here,
before anything is projected or appended.
"""

from __future__ import annotations

from ._validate_masks import _type_name
from .kv_cache import LayerCache


def _fits(module, kv_cache, batch: int, device, dtype) -> None:
    """A filled ``LayerCache`` against the layer it serves: batch, (key/value) heads, head size, device, dtype."""
    B, H, _, d = kv_cache.keys.shape
    expected = (batch, module.num_kv_heads, module.head_size)  # the cache holds the K/V heads only
    if (B, H, d) != expected:
        heads = (
            f"H = {expected[1]} heads"
            if module.num_kv_heads == module.num_heads
            else f"H_kv = {expected[1]} key/value heads (num_kv_heads; num_heads = {module.num_heads})"
        )
        raise ValueError(
            f"the cache holds keys of shape {tuple(kv_cache.keys.shape)} (B, H, T, d) but this call has B = "
            f"{expected[0]} and the layer {heads} of d = {expected[2]}: a cache belongs to one batch "
            "of sequences and one layer (make a new one for a new batch, or after pruning heads)"
        )
    if kv_cache.keys.device != device or kv_cache.keys.dtype != dtype:
        raise ValueError(
            f"the cache holds {kv_cache.keys.dtype} keys on {kv_cache.keys.device}, the inputs are {dtype} on {device}"
        )


def layer_cache(module, queries, keys, kv_cache) -> int:
    """``MultiHeadAttention.forward(kv_cache=...)``: a ``LayerCache`` of this batch, heads, head size, device and
    dtype; returns the number of keys attention will see (cached + new)."""
    if not isinstance(kv_cache, LayerCache):
        raise TypeError(f"kv_cache must be a LayerCache (mha_tutorial.core.kv_cache), got {_type_name(kv_cache)}")
    if not kv_cache.filled:
        return keys.shape[1]
    _fits(module, kv_cache, queries.shape[0], queries.device, queries.dtype)
    return kv_cache.num_keys_after(keys.shape[1])
