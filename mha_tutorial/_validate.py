"""Every check of the attention code's inputs, in one place, so the modules can show their formulas.

Each public function here raises a ``TypeError`` or ``ValueError`` that names the shapes or values it got,
and is called *before* any arithmetic (tests/core check that nothing is computed on bad input).
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


def _heads_input(X, num_heads: int, name: str) -> None:
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} expects a tensor, got {type(X).__name__}")
    if not isinstance(num_heads, int) or num_heads < 1:
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
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        raise TypeError(f"scores must be a floating tensor, got {getattr(scores, 'dtype', type(scores))}")
    if scores.dim() < 2:
        raise ValueError(f"scores must have shape (..., Q, K), got {tuple(scores.shape)}")
    return masks_for(scores.shape, scores.device, valid_lens, mask)


def masks_for(shape: tuple, device, valid_lens=None, mask=None):
    """``valid_lens`` and ``mask`` against scores of ``shape``; returns ``valid_lens`` as a tensor on ``device``."""
    shape = tuple(shape)
    if valid_lens is not None:
        if len(shape) < 3:
            raise ValueError(
                f"valid_lens needs scores with a batch axis, (B, Q, K) or (B, ..., Q, K), got shape {shape}"
            )
        valid_lens = as_valid_lens(valid_lens).to(device)
        check_valid_lens(valid_lens, shape[0], shape[-2], shape[-1])
    if mask is not None:
        check_mask(mask, shape)
    return valid_lens


def dropout(p, name: str = "dropout") -> None:
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


def attention(queries, keys, values, valid_lens, mask, dropout_p):
    """``scaled_dot_product_attention``'s inputs; returns ``valid_lens`` as a tensor (or None)."""
    qkv(queries, keys, values)
    dropout(dropout_p, "dropout_p")
    return masks_for((*queries.shape[:-1], keys.shape[-2]), queries.device, valid_lens, mask)


def mha_config(num_hiddens, num_heads, bias, out_bias, query_size, key_size, value_size) -> None:
    """``MultiHeadAttention(...)``: sizes and bias flags."""
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


def seq_first_inputs(module, query, key, value, mask, need_weights) -> None:
    """``SeqFirstMultiHeadAttention.forward``: [seq, batch, features] tensors and a bool [Q, K, B] mask."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape [seq, batch, features], got {list(x.shape)}")
    # The batch-first checks on batch-first views (no copies).
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


def mha_inputs(module, queries, keys, values, valid_lens, mask, head_mask, is_causal):
    """``MultiHeadAttention.forward``: inputs against the module's sizes; returns ``valid_lens`` as a tensor."""
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
    shape = (queries.shape[0], module.num_heads, queries.shape[1], keys.shape[1])  # the scores' (B, H, Q, K)
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
