"""The checks of KV caches (notebook 11): a cache must fit the layer, the batch and the model it is used with.

A cache that does not fit would not crash: ``torch.cat`` of another batch's keys or of a pruned layer's heads
fails obscurely, and a cache reused for a second prompt silently continues the first. So each is caught here,
before anything is projected or appended.
"""

from __future__ import annotations

import torch

from ._validate_masks import _shape, _type_name
from ._validate_training import token_ids
from .kv_cache import KVCache, LayerCache


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
        raise TypeError(f"kv_cache must be a LayerCache (mha_tutorial.kv_cache), got {_type_name(kv_cache)}")
    if not kv_cache.filled:
        return keys.shape[1]
    _fits(module, kv_cache, queries.shape[0], queries.device, queries.dtype)
    return kv_cache.num_keys_after(keys.shape[1])


def decoder_step(model, tokens, cache, token_mask, max_len: int) -> None:
    """``TransformerDecoder.forward(tokens, cache=..., token_mask=...)``: a cache made for this model and batch,
    a bool (B, T) token mask, and positions that stay below ``max_len``."""
    token_ids(tokens, model.config.tgt_vocab_size, max_len)  # first: the checks below read the tokens' shape
    if cache is not None:
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache(model), got {_type_name(cache)}")
        names = [name for name, _ in model.attention_layers() if name.startswith("dec.")]
        if list(cache.layers) != names:
            raise ValueError(f"this cache was made for layers {list(cache.layers)}, the model has {names}")
        first = next((c for c in cache.layers.values() if c.filled), None)
        if first is not None and first.keys.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"the cache holds a batch of {first.keys.shape[0]} sequences, the tokens have shape "
                f"{tuple(tokens.shape)}: make a new KVCache(model) for a new batch"
            )
        weight = next(model.parameters())
        for name, layer in model.attention_layers():  # every layer, before the first one appends anything
            if name in cache.layers and cache.layers[name].filled:
                _fits(layer, cache.layers[name], tokens.shape[0], weight.device, weight.dtype)
    start = 0 if cache is None else cache.length
    if start + tokens.shape[1] > max_len:
        raise ValueError(
            f"{start} cached + {tokens.shape[1]} new positions make a sequence of length {start + tokens.shape[1]}, "
            f"longer than max_len={max_len} (the positions the model has embeddings for)"
        )
    if token_mask is not None:
        if not isinstance(token_mask, torch.Tensor) or token_mask.dtype != torch.bool:
            raise TypeError(
                f"token_mask must be a bool tensor (B, T), True = a real token, got {_type_name(token_mask)}"
            )
        if tuple(token_mask.shape) != tuple(tokens.shape):
            raise ValueError(f"token_mask must have the tokens' shape {tuple(tokens.shape)}, got {_shape(token_mask)}")


def use_cache_flag(use_cache) -> None:
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache must be True or False, got {use_cache!r}")
