"""Every check of the attention code's inputs, in one place, so the modules can show their formulas.

Each public function here raises a ``TypeError`` or ``ValueError`` that names the shapes or values it got,
and is called *before* any arithmetic (tests/core check that nothing is computed on bad input).
The checks of masks and lengths live in ``_validate_masks`` (re-exported here).
"""

from __future__ import annotations

import numbers

import torch

from ._validate_cache import layer_cache
from ._validate_masks import (  # noqa: F401 (the mask checks, re-exported: validate.check_mask, ...)
    _check_range,
    _shape,
    _type_name,
    as_valid_lens,
    check_mask,
    check_valid_lens,
    masks_for,
)


def _heads_input(X, num_heads: int, name: str) -> None:
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} expects a tensor, got {type(X).__name__}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if X.dim() != 3:
        raise ValueError(f"{name} expects a 3-D tensor, got shape {tuple(X.shape)}")


def split_heads(X, num_heads: int) -> None:
    """``transpose_qkv``: X (B, T, H*d) with H dividing the last size."""
    _heads_input(X, num_heads, "transpose_qkv")
    if X.shape[-1] % num_heads:
        raise ValueError(
            f"the last size of X (shape {tuple(X.shape)}) is {X.shape[-1]}, not divisible by num_heads={num_heads}"
        )


def merge_heads(X, num_heads: int) -> None:
    """``transpose_output``: X (B*H, T, d) with H dividing the first size."""
    _heads_input(X, num_heads, "transpose_output")
    if X.shape[0] % num_heads:
        raise ValueError(
            f"the first size of X (shape {tuple(X.shape)}) is {X.shape[0]}, not divisible by num_heads={num_heads}"
        )


def softmax_args(scores, valid_lens, mask):
    """``masked_softmax``: a floating tensor (..., Q, K) and its masks; returns ``valid_lens`` as a tensor."""
    if not isinstance(scores, torch.Tensor):
        raise TypeError(
            f"scores must be a floating tensor (..., Q, K), got {_type_name(scores)}; "
            "convert it with torch.as_tensor(...)"
        )
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating tensor, got {getattr(scores, 'dtype', type(scores))}")
    if scores.dim() < 2:
        raise ValueError(f"scores must have shape (..., Q, K), got {tuple(scores.shape)}")
    return masks_for(scores.shape, scores.device, valid_lens, mask)


def dropout(p, name: str = "dropout") -> None:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{name} must be a number in [0, 1), got {p!r:.40} ({_type_name(p)})")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {p}")


def qkv(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    for name, x in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        if x.dim() not in (3, 4):
            raise ValueError(f"{name} must be 3-D (B, T, d) or 4-D (B, H, T, d), got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor (weights are fractions), got dtype {x.dtype}")
    if not (queries.dtype == keys.dtype == values.dtype):
        raise TypeError(
            f"queries, keys and values must have one dtype, got {queries.dtype}, {keys.dtype}, {values.dtype}"
        )
    if not (queries.dim() == keys.dim() == values.dim()):
        raise ValueError(
            f"queries, keys and values must have the same number of dimensions, got shapes "
            f"{tuple(queries.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    if queries.shape[:-2] != keys.shape[:-2] or keys.shape[:-2] != values.shape[:-2]:
        raise ValueError(
            f"queries, keys and values must share their leading (batch/head) sizes, got shapes "
            f"{tuple(queries.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    if keys.shape[-2] != values.shape[-2]:
        raise ValueError(
            f"keys and values must have the same length, got {keys.shape[-2]} keys "
            f"(shape {tuple(keys.shape)}) and {values.shape[-2]} values (shape {tuple(values.shape)})"
        )
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same feature size to take dot products, got "
            f"{queries.shape[-1]} (shape {tuple(queries.shape)}) and {keys.shape[-1]} (shape {tuple(keys.shape)})"
        )
    if queries.shape[-1] == 0:
        raise ValueError(
            f"queries and keys have feature size d = 0 (shapes {tuple(queries.shape)} and {tuple(keys.shape)}): "
            "the scores are scaled by 1/sqrt(d), which needs d >= 1"
        )


def attention(queries, keys, values, valid_lens, mask, dropout_p):
    """``scaled_dot_product_attention``'s inputs; returns ``valid_lens`` as a tensor (or None)."""
    qkv(queries, keys, values)
    dropout(dropout_p, "dropout_p")
    return masks_for((*queries.shape[:-1], keys.shape[-2]), queries.device, valid_lens, mask)


def mha_config(num_hiddens, num_heads, bias, out_bias, query_size, key_size, value_size, num_kv_heads=None) -> None:
    """``MultiHeadAttention(...)``: sizes, bias flags, and ``num_kv_heads`` (None or a divisor of num_heads)."""
    for name, value in (("num_hiddens", num_hiddens), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if num_heads < 1 or num_hiddens < 1:
        raise ValueError(f"num_hiddens and num_heads must be positive, got {num_hiddens} and {num_heads}")
    if num_hiddens % num_heads:
        raise ValueError(
            f"num_hiddens={num_hiddens} is not divisible by num_heads={num_heads}: "
            f"each head needs num_hiddens / num_heads features"
        )
    for name, value in (("bias", bias), ("out_bias", out_bias)):
        if not isinstance(value, bool) and not (name == "out_bias" and value is None):
            raise TypeError(f"{name} must be True or False{' or None' if name == 'out_bias' else ''}, got {value!r}")
    sizes = {"query_size": query_size, "key_size": key_size, "value_size": value_size}
    for name, size in sizes.items():
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"{name} must be a positive int or None (= num_hiddens), got {size!r}")
    kv_heads(num_kv_heads, num_heads)


def kv_heads(num_kv_heads, num_heads: int) -> None:
    """Grouped-query attention's ``num_kv_heads``: None (= num_heads) or a positive divisor of ``num_heads``."""
    if num_kv_heads is None:
        return
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int):
        raise TypeError(f"num_kv_heads must be an int dividing num_heads={num_heads} or None, got {num_kv_heads!r:.40}")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        divisors = [n for n in range(1, num_heads + 1) if num_heads % n == 0]
        raise ValueError(
            f"num_kv_heads={num_kv_heads} does not divide num_heads={num_heads}: each key/value head serves "
            f"num_heads / num_kv_heads query heads, so num_kv_heads must be one of {divisors} (or None)"
        )


def plain_heads_only(what: str, num_heads: int, num_kv_heads, why: str) -> None:
    """Refuse grouped-query attention (``num_kv_heads`` < ``num_heads``) where ``what`` needs one K/V head per head."""
    if num_kv_heads is not None and num_kv_heads != num_heads:
        raise NotImplementedError(
            f"{what} needs one key/value head per query head, but num_heads={num_heads} and num_kv_heads="
            f"{num_kv_heads} (each K/V head shared by {num_heads // num_kv_heads} query heads): {why}"
        )


def _seq_first_shapes(module, query, key, value) -> None:
    """The [seq, batch, features] tensors against each other and the projections, named as the caller passed them."""
    for name, x, layer in (("queries", query, module.W_q), ("keys", key, module.W_k), ("values", value, module.W_v)):
        if x.shape[-1] != layer.in_features:
            raise ValueError(
                f"{name} have {x.shape[-1]} features (shape [seq, batch, features] = {list(x.shape)}) but the "
                f"projection expects {layer.in_features}"
            )
    shapes = f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}"
    if not (query.shape[1] == key.shape[1] == value.shape[1]):
        raise ValueError(
            f"query, key and value must have the same batch size (axis 1 of [seq, batch, features]), "
            f"got shapes {shapes}"
        )
    if key.shape[0] != value.shape[0]:
        raise ValueError(
            f"keys and values must have the same length (axis 0 of [seq, batch, features]), got shapes "
            f"{list(key.shape)} and {list(value.shape)}"
        )


def seq_first_inputs(module, query, key, value, mask, need_weights) -> None:
    """``SeqFirstMultiHeadAttention.forward``: [seq, batch, features] tensors and a bool [Q, K, B] mask."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape [seq, batch, features], got {list(x.shape)}")
    _seq_first_shapes(module, query, key, value)
    # The remaining batch-first checks (dtypes) on batch-first views (no copies).
    mha_inputs(module, query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), None, None, None, False)
    if not isinstance(need_weights, bool):
        raise TypeError(f"need_weights must be True or False, got {need_weights!r}")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        what = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor [Q, K, B] with True = may attend, got {what}")
    shape = (query.shape[0], key.shape[0], query.shape[1])
    fits = mask.dim() == 3 and mask.shape[1] == shape[1] and mask.shape[0] in (1, shape[0])
    if not (fits and mask.shape[2] in (1, shape[2])):
        raise ValueError(f"mask must have shape [Q, K, B] = {list(shape)} (Q or B may be 1), got {list(mask.shape)}")


def head_numbers(heads, head_ids: list, num_original: int, where: str = "") -> list:
    """Heads to prune, in their original numbering, against the heads still present; returns them as a list."""
    if isinstance(heads, torch.Tensor | str) or not hasattr(heads, "__iter__"):
        raise TypeError(f"{where}heads must be a list of head numbers, got {type(heads).__name__}")
    heads = list(heads)
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"{where}head numbers must be ints, got {h!r} in {heads}")
        if not 0 <= h < num_original:
            raise ValueError(
                f"{where}head {h} is out of range: this layer was built with {num_original} heads "
                f"(0..{num_original - 1})"
            )
    if len(set(heads)) != len(heads):
        raise ValueError(f"{where}head numbers must not repeat, got {heads}")
    already = sorted(set(heads) - set(head_ids))
    if already:
        raise ValueError(f"{where}heads {already} are already pruned (heads left: {head_ids})")
    return heads


def attention_layer(layer) -> None:
    """``prune_attention_heads``: an attention module of this package (it keeps ``head_ids`` and ``pruned_heads``)."""
    if not all(hasattr(layer, a) for a in ("head_ids", "pruned_heads", "W_q", "W_k", "W_v", "W_o", "head_size")):
        raise TypeError(
            f"layer must be a MultiHeadAttention (or a variant of it) of this package, got {_type_name(layer)}"
        )


def prune_request(heads, layers: list, num_heads: int) -> dict:
    """``model.prune_heads({layer: [heads]})``: layer numbers or names and every layer's heads, all checked
    before anything changes; returns ``{layer index: [heads]}``."""
    names = [name for name, _ in layers]
    if not isinstance(heads, dict):
        raise TypeError(f"prune_heads takes a dict {{layer: [heads]}}, got {type(heads).__name__}")
    resolved = {}
    for key, chosen in heads.items():
        if isinstance(key, str) and key in names:
            index = names.index(key)
        elif isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(layers):
            index = key
        elif isinstance(key, str):
            raise ValueError(f"unknown attention layer {key!r}; layers: {names}")
        else:
            raise ValueError(f"layer {key!r} is not a layer number in [0, {len(layers) - 1}] or a name in {names}")
        if index in resolved:
            raise ValueError(f"layer {names[index]} is named twice in {heads}")
        resolved[index] = head_numbers(chosen, layers[index][1].head_ids, num_heads, f"{names[index]}: ")
    return resolved


def model_head_mask(head_mask, layers: list, num_heads: int) -> None:
    """A model's ``head_mask``: a tensor (num_attention_layers, num_heads), rows in ``layers``' order."""
    L, H = len(layers), num_heads
    if not isinstance(head_mask, torch.Tensor):
        raise TypeError(f"head_mask must be a tensor of shape ({L}, {H}), got {type(head_mask).__name__}")
    if tuple(head_mask.shape) != (L, H):
        names = ", ".join(name for name, _ in layers)
        raise ValueError(
            f"head_mask must have shape (num_attention_layers, num_heads) = ({L}, {H}), one row per "
            f"attention layer in the order [{names}]; got shape {tuple(head_mask.shape)}"
        )


def mha_inputs(module, queries, keys, values, valid_lens, mask, head_mask, is_causal, kv_cache=None):  # noqa: PLR0913
    """``MultiHeadAttention.forward``: inputs against the module's sizes; returns ``valid_lens`` as a tensor.

    With a ``kv_cache`` the scores' K counts the cached keys too, and the cache must fit the module and batch.
    """
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    for name, x, layer in (
        ("queries", queries, module.W_q),
        ("keys", keys, module.W_k),
        ("values", values, module.W_v),
    ):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape (batch, steps, features), got {tuple(x.shape)}")
        if x.shape[-1] != layer.in_features:
            raise ValueError(
                f"{name} have {x.shape[-1]} features (shape {tuple(x.shape)}) but the projection "
                f"expects {layer.in_features}"
            )
        if x.dtype != layer.weight.dtype and not (x.is_floating_point() and torch.is_autocast_enabled(x.device.type)):
            raise TypeError(
                f"{name} have dtype {x.dtype} but the module's weights are {layer.weight.dtype}: convert one of "
                f"them, e.g. {name}.to({layer.weight.dtype}) or module.to({x.dtype})"
            )
    if not (queries.shape[0] == keys.shape[0] == values.shape[0]):
        raise ValueError(
            f"queries, keys and values must have the same batch size, got shapes "
            f"{tuple(queries.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    if keys.shape[1] != values.shape[1]:
        raise ValueError(
            f"keys and values must have the same length, got shapes {tuple(keys.shape)} and {tuple(values.shape)}"
        )
    num_keys = keys.shape[1] if kv_cache is None else layer_cache(module, queries, keys, kv_cache)
    shape = (queries.shape[0], module.num_heads, queries.shape[1], num_keys)  # the scores' (B, H, Q, K)
    valid_lens = masks_for(shape, queries.device, valid_lens, mask)
    if head_mask is not None:
        if not isinstance(head_mask, torch.Tensor):
            raise TypeError(
                f"head_mask must be a tensor of shape ({module.num_heads},), got {type(head_mask).__name__}"
            )
        if tuple(head_mask.shape) != (module.num_heads,):
            raise ValueError(
                f"head_mask must have shape ({module.num_heads},) (one gate per head), got {tuple(head_mask.shape)}"
            )
    return valid_lens


def add_norm_config(norm_shape, dropout_p) -> None:
    """``AddNorm(norm_shape, dropout)``: a positive size or a list of them, and a dropout rate in [0, 1)."""
    shape = [norm_shape] if isinstance(norm_shape, int) else norm_shape
    ok = isinstance(shape, list | tuple | torch.Size) and len(shape) > 0
    if not ok or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in shape):
        raise TypeError(
            f"norm_shape must be the size of the last axis (an int) or of the last axes (a tuple of ints), "
            f"got {norm_shape!r:.40} ({_type_name(norm_shape)})"
        )
    dropout(dropout_p)


def add_norm_inputs(X, Y, normalized_shape: tuple) -> None:
    """``AddNorm.forward``: floating tensors X and Y of one shape, ending in the normalised shape."""
    for name, x in (("X", X), ("Y", Y)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            what = f"dtype {x.dtype}" if isinstance(x, torch.Tensor) else _type_name(x)
            raise TypeError(f"AddNorm needs floating tensors X and Y, got {name} as {what}")
    if X.shape != Y.shape:
        raise ValueError(f"AddNorm needs X and Y of the same shape, got {tuple(X.shape)} and {tuple(Y.shape)}")
    n = len(normalized_shape)
    if X.dim() < n or tuple(X.shape[X.dim() - n :]) != tuple(normalized_shape):
        raise ValueError(
            f"AddNorm normalises the last axes of shape {tuple(normalized_shape)}, got X and Y of shape {tuple(X.shape)}"
        )


def _block(value, name: str, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        none = " or None (all at once)" if allow_none else ""
        raise ValueError(f"{name} must be a positive int{none}, got {value!r:.40}")


def flash(queries, keys, values, valid_lens, is_causal, block_q, block_k, scale):
    """``flash_attention``: q, k, v as for attention, on one device; tile sizes; returns ``valid_lens`` or None."""
    qkv(queries, keys, values)
    if not (queries.device == keys.device == values.device):
        raise ValueError(
            f"queries, keys and values must be on one device, got {queries.device}, {keys.device}, {values.device}"
        )
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    _block(block_q, "block_q", allow_none=True)
    _block(block_k, "block_k", allow_none=False)
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < float("inf")
    ):
        raise ValueError(f"scale must be a positive finite number or None (1/sqrt(d)), got {scale!r:.40}")
    shape = (*queries.shape[:-1], keys.shape[-2])  # the (B, [H,] Q, K) weights that are never built
    return masks_for(shape, queries.device, valid_lens, None)
