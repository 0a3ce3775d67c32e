"""Every check of the experiments' inputs, in one place: models, examples, batches, plots and statistics.

The companion of ``_validate`` (which checks the attention code's inputs): each function raises a ``TypeError``
or ``ValueError`` that names the value it got, and is called by ``maps``, ``head_stats``, ``viz``, ``tasks`` and
``train`` before they compute anything. Checkpoints are checked in ``_validate_training``. It imports none of the
modules it serves: what it checks against is passed in (``date_format``) or checked by name (``task_batch``).
"""

from __future__ import annotations

import torch


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
    """One row of ``task`` (as ``load_split`` gives them): a tuple of non-empty strings, one per column; returned
    as a tuple."""
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
    empty = [column for column, text in zip(task.columns, example, strict=True) if not text]
    if empty:
        raise ValueError(
            f"{where} has an empty {' and '.join(empty)}: every column of a {task.name!r} example needs text, "
            f"got {example!r:.80}"
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


# The fields of ``task_base.Batch``: checked by name, as this module sits below the tasks it serves.
_BATCH_FIELDS = ("src", "valid_lens", "tgt_in", "tgt_out", "loss_mask", "tgt_valid_lens", "examples")


def task_batch(batch) -> None:
    """A ``Batch`` from ``Task.collate``: an object with every field of ``task_base.Batch``."""
    if isinstance(batch, type) or not all(hasattr(batch, f) for f in _BATCH_FIELDS):
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


def date_format(fmt, field_of) -> None:
    """A date template of ``DATE_FORMATS``' kind: a string whose fields are among ``field_of`` (``tasks.FIELD_OF``,
    passed in: this module sits below the tasks)."""
    import string

    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a date template such as '{{dd}}.{{mm}}.{{Y}}', got {type(fmt).__name__}")
    unknown = [f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None and f not in field_of]
    if unknown:
        raise ValueError(f"fmt {fmt!r} has unknown fields {unknown}; known: {sorted(field_of)}")


def token(value) -> None:
    """``display_token``: one token, a string."""
    if not isinstance(value, str):
        raise TypeError(f"a token is a string, got {type(value).__name__} {value!r:.40}")


# ---- plot_head_grid --------------------------------------------------------------------------------
def grid_weights(layers: list) -> None:
    """One (heads, queries, keys) tensor per layer: floating, with queries and keys, and some head to draw."""
    if not layers:
        raise ValueError("weights have no layers: an (L, H, Q, K) tensor needs L >= 1, got L = 0")
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


def grid_axis_labels(axis: list) -> None:
    """``axis_labels`` once spread over the layers: one (y label, x label) pair of strings per layer."""
    bad = [a for a in axis if not (isinstance(a, tuple | list) and len(a) == 2 and all(isinstance(s, str) for s in a))]
    if bad:
        raise ValueError(
            f"axis_labels must be a (y label, x label) tuple of strings, or a list with one such pair per layer; "
            f"got {bad[0]!r:.60} for a layer"
        )


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
    if len(layer_names) != L:
        raise ValueError(f"{len(layer_names)} layer names for {L} layers")
    if roles is not None and not (
        isinstance(roles, list | tuple)
        and len(roles) == L
        and all(isinstance(row, list | tuple) and len(row) == H for row in roles)
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


def role_inputs(stats, thresholds: dict) -> None:
    """``role_labels``: the dict from ``head_stats`` (checked in full by ``head_stats_dict``) and numeric thresholds."""
    if not isinstance(stats, dict):
        raise TypeError(f"stats must be the dict returned by head_stats, got {type(stats).__name__}")
    if "entropy" not in stats or "tv_to_nearest" not in stats:
        raise ValueError("role_labels needs the dict returned by head_stats")
    for name, value in thresholds.items():
        if not _is_real(value):
            raise TypeError(f"{name} must be a number, got {value!r:.40} ({type(value).__name__})")


def table_decimals(decimals) -> None:
    """``stats_table(decimals=...)``: an int (the number of decimals shown)."""
    if isinstance(decimals, bool) or not isinstance(decimals, int):
        raise TypeError(f"decimals must be an int, got {decimals!r:.40} ({type(decimals).__name__})")


def stats_plot(roles, columns, title, thresholds) -> None:
    """``plot_head_stats``: roles and columns are needed to draw, a string title, thresholds {column: number}."""
    if roles is None or columns is None:
        raise ValueError(
            "plot_head_stats needs roles (from role_labels) and columns (statistic names), got "
            f"roles={roles!r:.40} and columns={columns!r:.40}"
        )
    if not isinstance(title, str):
        raise TypeError(f"title must be a string, got {type(title).__name__}")
    if thresholds is None:
        return
    if not isinstance(thresholds, dict):
        raise TypeError(f"thresholds must be a dict {{column: value}} or None, got {type(thresholds).__name__}")
    bad = {k: v for k, v in thresholds.items() if not _is_real(v)}
    if bad:
        raise TypeError(f"thresholds must map columns to numbers, got {bad!r:.80}")


def positive_count(value, name: str) -> None:
    """A count such as ``Task.make_batch``'s ``batch_size``: an int of at least 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
