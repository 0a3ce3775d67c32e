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


# =====================================================================================================
# the experiments' entry points: models, examples, plots, statistics, checkpoints
# (maps.py, head_stats.py, viz.py, train.py)
# =====================================================================================================
def _kind_of(x) -> str:
    """A tensor's dtype, or any other value's type name, for messages."""
    return str(x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__


def _is_real(value) -> bool:
    import numbers

    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_number(value, name: str, unit: str = "") -> None:
    """A finite real number above 0 (``panel_size``, ``vmax``)."""
    import math

    if not _is_real(value):
        raise TypeError(f"{name} must be a positive number{unit}, got {value!r} ({type(value).__name__})")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number{unit}, got {value!r}")


def model_for_task(model, task) -> None:
    """A model of this package (``build_model`` / ``load_pretrained``), of the kind that ``task`` runs."""
    if not (isinstance(model, torch.nn.Module) and hasattr(model, "attention_layers") and hasattr(model, "config")):
        raise TypeError(
            f"model must be a model of this package (from build_model or load_pretrained), got {type(model).__name__}"
        )
    if model.config.kind != task.model_kind:
        raise ValueError(
            f"task {task.name!r} runs a model of kind {task.model_kind!r}, got one of kind {model.config.kind!r} "
            f"(a model for another task?)"
        )


def example_for(example, task, where: str = "example") -> tuple:
    """One row of ``task`` (as ``load_split`` gives them): a tuple of strings, one per column; returned as a tuple."""
    if isinstance(example, str) or not isinstance(example, tuple | list):
        raise TypeError(
            f"{where} must be a tuple of strings {task.columns} (a row of load_split({task.name!r})), "
            f"got {type(example).__name__} {example!r:.80}"
        )
    if not all(isinstance(x, str) for x in example):
        raise TypeError(f"{where} must hold strings {task.columns}, got {example!r:.80}")
    if len(example) != len(task.columns):
        raise ValueError(
            f"{where} must have {len(task.columns)} strings {task.columns} for task {task.name!r}, "
            f"got {len(example)}: {example!r:.80}"
        )
    return tuple(example)


def examples_for(examples, task, what: str) -> list:
    """A non-empty list of ``task`` rows (see ``example_for``), as tuples; ``what`` names the caller."""
    if isinstance(examples, str | bytes | dict | torch.Tensor) or not hasattr(examples, "__iter__"):
        raise TypeError(
            f"{what} takes a list of {task.name} examples (tuples {task.columns}), got {type(examples).__name__}"
        )
    rows = [example_for(e, task, f"example {i}") for i, e in enumerate(examples)]
    if not rows:
        raise ValueError(f"{what} needs at least one example of task {task.name!r}, got none")
    return rows


def task_batch(batch) -> None:
    """A ``Batch`` from ``Task.collate``."""
    from .tasks import Batch  # here, not at the top: tasks imports the model, which imports this module

    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a Batch (from Task.collate), got {type(batch).__name__}")


def pad_to(value, max_len: int) -> None:
    """``collect_attention(pad_to=...)``: None, or a positive int the model's positions cover."""
    if value is None:
        return
    positive_count(value, "pad_to")
    if value > max_len:
        raise ValueError(f"pad_to={value} is longer than the model's max_len={max_len} positions")


def layer_selection(names) -> None:
    """``AttentionMaps.select(*names)``: at least one layer name, all strings."""
    if not names:
        raise ValueError("select needs at least one layer name, e.g. maps.select('enc.0.self')")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"layer names are strings such as 'enc.0.self', got {bad}")


def date_format(fmt) -> None:
    """A date template of ``DATE_FORMATS``' kind: a string whose fields are among ``FIELD_OF``."""
    import string

    from .tasks import FIELD_OF

    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a date template such as '{{dd}}.{{mm}}.{{Y}}', got {type(fmt).__name__}")
    unknown = [f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None and f not in FIELD_OF]
    if unknown:
        raise ValueError(f"fmt {fmt!r} has unknown fields {unknown}; known: {sorted(FIELD_OF)}")


def token(value) -> None:
    """``display_token``: one token, a string."""
    if not isinstance(value, str):
        raise TypeError(f"a token is a string, got {type(value).__name__} {value!r:.40}")


# ---- plot_head_grid --------------------------------------------------------------------------------
def grid_weights(layers: list) -> None:
    """One (heads, queries, keys) tensor per layer: floating, with queries and keys, and some head to draw."""
    for l, w in enumerate(layers):
        if not w.is_floating_point():
            raise TypeError(f"layer {l}: weights must be a floating tensor (attention weights), got dtype {w.dtype}")
        if w.shape[1] == 0 or w.shape[2] == 0:
            raise ValueError(
                f"layer {l}: weights have no queries or no keys: shape (heads, queries, keys) = {tuple(w.shape)}"
            )
    if all(w.shape[0] == 0 for w in layers):
        raise ValueError(
            f"nothing to draw: every layer has 0 heads (all pruned), shapes {[tuple(w.shape) for w in layers]}"
        )


def grid_layer_names(layer_names) -> None:
    """None, or a list of strings (their number is checked against the layers by the caller)."""
    ok = isinstance(layer_names, list | tuple) and all(isinstance(n, str) for n in layer_names)
    if layer_names is not None and not ok:
        raise TypeError(f"layer_names must be a list of strings, one per layer, got {layer_names!r:.80}")


def grid_head_titles(head_titles, heads: list) -> None:
    """None, or one list per layer with one title per head drawn (``heads``: heads per layer)."""
    if head_titles is None:
        return
    ok = isinstance(head_titles, list | tuple) and len(head_titles) == len(heads)
    ok = ok and all(isinstance(row, list | tuple) and len(row) == h for row, h in zip(head_titles, heads, strict=True))
    if not ok:
        per = heads[0] if len(set(heads)) == 1 else heads
        raise ValueError(f"head_titles must be a list of {len(heads)} lists of {per} strings, got {head_titles!r:.80}")


def grid_head_ids(head_ids, heads: list) -> None:
    """None, or per layer the original numbers of the heads drawn (a pruned model's ``head_ids``)."""
    if head_ids is None:
        return

    def fits(ids, h) -> bool:
        numbers = isinstance(ids, list | tuple) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        return numbers and len(ids) == h and len(set(ids)) == h and all(i >= 0 for i in ids)

    if not (isinstance(head_ids, list | tuple) and len(head_ids) == len(heads)) or not all(
        fits(ids, h) for ids, h in zip(head_ids, heads, strict=True)
    ):
        raise ValueError(
            f"head_ids must give, per layer, the distinct original numbers of its {heads} heads, got {head_ids!r:.80}"
        )


def grid_style(shared_scale, vmax, cmap, panel_size, heads_per_row, figsize, title) -> None:
    """``plot_head_grid``'s drawing options."""
    from matplotlib import colormaps
    from matplotlib.colors import Colormap

    if not isinstance(shared_scale, bool):
        raise TypeError(f"shared_scale must be True or False, got {shared_scale!r}")
    if vmax is not None:
        positive_number(vmax, "vmax", " (the top of the shared colour scale) or None (= 1)")
    if not isinstance(cmap, Colormap | str):
        raise TypeError(f"cmap must be a matplotlib colormap or the name of one, got {type(cmap).__name__}")
    if isinstance(cmap, str) and cmap not in colormaps:
        raise ValueError(f"cmap must be a matplotlib colormap or the name of one (e.g. 'viridis'), got {cmap!r:.40}")
    positive_number(panel_size, "panel_size", " of inches")
    if heads_per_row is not None:
        positive_count(heads_per_row, "heads_per_row")
    if figsize is not None and not (isinstance(figsize, tuple | list) and len(figsize) == 2):
        raise ValueError(f"figsize must be (width, height) in inches, got {figsize!r:.40}")
    for size in figsize or ():
        positive_number(size, "figsize", " of inches (width, height)")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string or None, got {type(title).__name__}")


def grid_values(layers: list, keeps: list, names: list) -> None:
    """Where a keep mask allows attention, weights are finite and >= 0: the colour scale starts at 0."""
    for w, keep, name in zip(layers, keeps, names, strict=True):
        allowed = w[keep]
        if bool(torch.isinf(allowed).any()) or bool((allowed < 0).any()):
            raise ValueError(
                f"{name}: weights must be finite and >= 0 where the keep mask allows attention (the colour scale "
                f"starts at 0), got values from {float(allowed.min()):.3g} to {float(allowed.max()):.3g}"
            )


# ---- head_stats -------------------------------------------------------------------------------------
def entropy_inputs(weights, keep, query_real) -> None:
    """``normalized_entropy``: floating weights, a bool keep mask and an optional bool (B, Q) query mask."""
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
        raise TypeError(f"weights must be a floating tensor (B, H, Q, K), got {_kind_of(weights)}")
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool:
        raise TypeError(f"keep must be a bool tensor (B, Q, K) with True = may attend, got {_kind_of(keep)}")
    if query_real is None:
        return
    if not isinstance(query_real, torch.Tensor) or query_real.dtype != torch.bool:
        raise TypeError(f"query_real must be a bool tensor (B, Q) or None, got {_kind_of(query_real)}")
    if keep.dim() == 3 and tuple(query_real.shape) != tuple(keep.shape[:2]):
        raise ValueError(
            f"query_real must have shape (B, Q) = {tuple(keep.shape[:2])} to match keep {tuple(keep.shape)}, "
            f"got {tuple(query_real.shape)}"
        )


def head_stats_dict(stats) -> tuple:
    """``head_stats``' result: a dict of (layers, heads) tensors, all of one shape; returns (layers, heads)."""
    if not isinstance(stats, dict) or not isinstance(stats.get("entropy"), torch.Tensor):
        got = f"'entropy' as {_kind_of(stats.get('entropy'))}" if isinstance(stats, dict) else type(stats).__name__
        raise TypeError(f"stats must be the dict returned by head_stats ({{name: (layers, heads) tensor}}), got {got}")
    shape = tuple(stats["entropy"].shape)
    if len(shape) != 2:
        raise ValueError(f"statistics must be (layers, heads) tensors, got 'entropy' of shape {shape}")
    bad = {
        k: tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
        for k, v in stats.items()
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != shape
    }
    if bad:
        raise ValueError(f"every statistic must be a (layers, heads) tensor of shape {shape} like 'entropy', got {bad}")
    return shape


def stats_labels(stats: dict, layer_names, roles, columns) -> None:
    """``stats_table`` / ``plot_head_stats``: layer names, roles [layer][head] and column names that fit ``stats``."""
    L, H = stats["entropy"].shape
    if isinstance(layer_names, str) or not isinstance(layer_names, list | tuple):
        raise TypeError(f"layer_names must be a list of {L} strings, one per layer, got {layer_names!r:.80}")
    if roles is not None and not (
        isinstance(roles, list | tuple) and len(roles) == L and all(len(row) == H for row in roles)
    ):
        raise ValueError(f"roles must be a list of {L} lists of {H} names (from role_labels), got {roles!r:.80}")
    if columns is None:
        return
    if isinstance(columns, str) or not isinstance(columns, list | tuple):
        raise TypeError(f"columns must be a list of statistic names, got {columns!r:.80}")
    if not columns:
        raise ValueError(f"columns is empty: name at least one statistic of {sorted(stats)}")
    unknown = [c for c in columns if c not in stats]
    if unknown:
        raise ValueError(f"unknown statistics {unknown}; available: {sorted(stats)}")


# ---- checkpoints ------------------------------------------------------------------------------------
def checkpoint_path(path) -> None:
    """A path to a checkpoint file: a str or a ``pathlib.Path``."""
    import os

    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or pathlib.Path to a .pt file, got {type(path).__name__} {path!r:.40}")


def checkpoint_config(config, path) -> None:
    """Field ``config``: a dict of ``ModelConfig`` fields (no unknown ones, the required ones present), typed."""
    import dataclasses

    from .model import ModelConfig  # here, not at the top: the model imports this module

    if not isinstance(config, dict):
        raise ValueError(f"{path}: field 'config' must be a dict of ModelConfig fields, got {type(config).__name__}")
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    missing = [n for n, f in fields.items() if n not in config and f.default is dataclasses.MISSING]
    unknown = sorted(str(k) for k in config if k not in fields)
    if missing:
        raise ValueError(f"{path}: field 'config' lacks the ModelConfig fields {missing}")
    if unknown:
        raise ValueError(f"{path}: field 'config' has fields {unknown} that ModelConfig does not know")
    types = {"int": int, "str": str, "bool": bool, "float": int | float}
    for name, value in config.items():
        want = types.get(str(fields[name].type), object)
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            raise ValueError(f"{path}: config[{name!r}] must be of type {fields[name].type}, got {value!r:.40}")


def checkpoint_state(state, path) -> None:
    """Field ``state_dict``: a non-empty dict {parameter name: tensor}, floating ones finite."""
    if not isinstance(state, dict) or not state:
        raise ValueError(
            f"{path}: field 'state_dict' must be a non-empty dict {{parameter name: tensor}}, got "
            f"{type(state).__name__}{' (empty)' if isinstance(state, dict) else ''}"
        )
    for name, value in state.items():
        if not isinstance(name, str):
            raise ValueError(f"{path}: field 'state_dict' has a key {name!r} ({type(name).__name__}); keys are names")
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: state_dict[{name!r}] must be a tensor, got {type(value).__name__}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{path}: state_dict[{name!r}] contains NaN or inf")


def checkpoint_fields(checkpoint: dict, path) -> None:
    """A checkpoint's fields once its keys and format are known: task, config, state_dict, metrics (and train)."""
    from .tasks import TASKS  # here, not at the top: tasks imports the model, which imports this module

    task = checkpoint["task"]
    if not isinstance(task, str) or task not in TASKS:
        raise ValueError(f"{path}: field 'task' must name a task of this package ({', '.join(TASKS)}), got {task!r}")
    checkpoint_config(checkpoint["config"], path)
    checkpoint_state(checkpoint["state_dict"], path)
    metrics = checkpoint["metrics"]
    if not isinstance(metrics, dict):
        raise ValueError(f"{path}: field 'metrics' must be a dict {{name: number}}, got {type(metrics).__name__}")
    bad = {k: v for k, v in metrics.items() if not (isinstance(k, str) and _is_real(v))}
    if bad:
        raise ValueError(f"{path}: field 'metrics' must map names to numbers, got {bad!r:.80}")
    if "train" in checkpoint and not isinstance(checkpoint["train"], dict):
        raise ValueError(f"{path}: field 'train' must be a dict of training settings, got {checkpoint['train']!r:.80}")


def train_history(history) -> None:
    """``save_checkpoint``'s ``history``: the dict that ``train`` returns."""
    required = ("settings", "seed", "device", "accuracy", "eval_loss", "train_time_s", "loss")
    if not isinstance(history, dict) or any(k not in history for k in required):
        got = sorted(history) if isinstance(history, dict) else type(history).__name__
        raise ValueError(f"history must be the dict returned by train(), with keys {required}; got {got}")
    if not history["loss"]:
        raise ValueError("history['loss'] is empty: a checkpoint records the final training loss")


def positive_count(value, name: str) -> None:
    """A count such as ``Task.make_batch``'s ``batch_size``: an int of at least 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
