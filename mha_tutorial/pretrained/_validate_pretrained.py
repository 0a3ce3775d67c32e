"""Every check of the pretrained encoder's inputs, in one place: configurations, token batches, sentences, devices.

The companion of ``_validate`` and ``_validate_experiments`` for ``minilm``, ``bert_heads`` and ``retrieval``
(``bert``'s own checks are in ``_validate_bert``, below ``bert``, and re-exported here): each function raises a
``TypeError`` or ``ValueError`` that names the value it got, and is called before anything is computed.
"""

from __future__ import annotations

import math

import torch

from ._validate_bert import (  # noqa: F401 (the encoder's own checks, re-exported: validate.bert_config, ...)
    attention_mask_tensor,
    bert_config,
    encoder_inputs,
    pooling_inputs,
    positive_int,
)
from .bert import BertEncoder

# config.json (Hugging Face's BERT format): the keys the builder reads, and the values it can reproduce.
CONFIG_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
CONFIG_SUPPORTED = {  # key: (value assumed when the key is absent, the values supported)
    "model_type": (None, ("bert",)),
    "hidden_act": ("gelu", ("gelu",)),  # "gelu" is the exact erf GELU; "gelu_new" (tanh) would differ
    "position_embedding_type": ("absolute", ("absolute",)),
    "is_decoder": (False, (False,)),
    "add_cross_attention": (False, (False,)),
}


def sentences(value) -> list[str]:
    """A non-empty list (or tuple) of strings; returned as a list."""
    if isinstance(value, str):
        raise TypeError(f"sentences must be a list of strings; for one sentence pass [{value!r:.40}]")
    if not isinstance(value, list | tuple):
        raise TypeError(f"sentences must be a list of strings, got {type(value).__name__}")
    if not value:
        raise ValueError("sentences is empty: pass at least one sentence")
    bad = [(i, type(s).__name__) for i, s in enumerate(value) if not isinstance(s, str)]
    if bad:
        raise TypeError(f"sentences must all be strings, got (index, type) {bad[:5]}")
    return list(value)


def device(value) -> None:
    """None (the default device), a ``torch.device`` or a device name such as 'cpu' or 'cuda'."""
    if value is not None and not isinstance(value, str | torch.device):
        raise TypeError(f"device must be None, a torch.device or a name such as 'cpu', got {type(value).__name__}")


def max_length(value, max_len: int) -> None:
    """``tokenize(max_length=...)``: room for [CLS] and [SEP], within the model's positions."""
    positive_int(value, "max_length")
    if not 2 <= value <= max_len:
        raise ValueError(f"max_length must lie in [2, {max_len}] ([CLS] + [SEP] .. the model's positions), got {value}")


def hf_config(config, path) -> None:
    """A Hugging Face BERT config.json that ``BertEncoder`` computes exactly: names the first unsupported key."""
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    for key, (default, supported) in CONFIG_SUPPORTED.items():
        value = config.get(key, default)
        if value not in supported:
            raise ValueError(f"{path}: unsupported {key}={value!r}; this builder supports {key} in {supported}")
    missing = [key for key in (*CONFIG_SIZES, "layer_norm_eps") if key not in config]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    for key in CONFIG_SIZES:
        if isinstance(config[key], bool) or not isinstance(config[key], int) or config[key] < 1:
            raise ValueError(f"{path}: {key} must be a positive int, got {config[key]!r}")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ValueError(
            f"{path}: hidden_size={config['hidden_size']} is not divisible by "
            f"num_attention_heads={config['num_attention_heads']}"
        )


# ---- retrieval.py: paraphrase pairs, pruning curves and the shipped study ----------------------------------------


def bert_model(model) -> None:
    """A ``BertEncoder`` (e.g. from ``load_minilm``)."""
    if not isinstance(model, BertEncoder):
        raise TypeError(f"model must be a BertEncoder (from load_minilm), got {type(model).__name__}")


def integer(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")


def model_sizes(sizes) -> None:
    """``random_orders(sizes=...)``: a (layers, heads) pair of positive ints."""
    if not (isinstance(sizes, tuple | list) and len(sizes) == 2):
        raise TypeError(f"sizes must be a (layers, heads) pair of ints, got {sizes!r:.40} ({type(sizes).__name__})")
    for n in sizes:
        positive_int(n, "sizes: layers and heads")


def json_path(path) -> None:
    """``load_study(path)``: None (the shipped study) or a path, a str or a ``pathlib.Path``."""
    import os

    if path is not None and not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be None, a str or a pathlib.Path to a .json file, got {type(path).__name__}")


def token(value) -> None:
    """``is_punctuation``: one token, a string."""
    if not isinstance(value, str):
        raise TypeError(f"a token is a string, got {type(value).__name__} {value!r:.40}")


def head_pairs(heads) -> None:
    """A list of (layer, head) pairs (their ranges are checked against the model by ``pruning.order_mask``)."""
    if isinstance(heads, str) or not isinstance(heads, list | tuple):
        raise TypeError(
            f"heads must be a dict {{layer: [heads]}} or a list of (layer, head), got {type(heads).__name__}"
        )
    bad = [h for h in heads if not (isinstance(h, list | tuple) and len(h) == 2)]
    if bad:
        raise TypeError(f"heads must be (layer, head) pairs, got {bad[:5]}")


def choice(value, name: str, allowed) -> None:
    """One of the strings in ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def paraphrase_pairs(pairs, minimum: int = 2) -> list[tuple[str, str]]:
    """A list of at least ``minimum`` (sentence, paraphrase) string pairs; returned as a list of tuples."""
    if isinstance(pairs, str) or not isinstance(pairs, list | tuple):
        raise TypeError(f"pairs must be a list of (sentence, paraphrase) pairs, got {type(pairs).__name__}")
    bad = [i for i, p in enumerate(pairs) if not (isinstance(p, list | tuple) and len(p) == 2)]
    bad += [i for i, p in enumerate(pairs) if i not in bad and not all(isinstance(s, str) for s in p)]
    if bad:
        raise TypeError(f"pairs must hold (sentence, paraphrase) pairs of two strings; not so at indices {bad[:5]}")
    if len(pairs) < minimum:
        raise ValueError(f"retrieval needs at least {minimum} pairs (a paraphrase must have rivals), got {len(pairs)}")
    return [tuple(p) for p in pairs]


def head_counts(counts, maximum: int | None = None, start_at_zero: bool = False) -> list[int]:
    """Strictly increasing ints in [0, maximum] (numbers of heads removed; no maximum if None); returned as a list."""
    if isinstance(counts, str) or not isinstance(counts, list | tuple | range):
        raise TypeError(f"counts must be a list of ints (heads removed), got {type(counts).__name__}")
    if any(isinstance(n, bool) or not isinstance(n, int) for n in counts):
        raise TypeError(f"counts must all be ints, got {[type(n).__name__ for n in counts][:8]}")
    counts = list(counts)
    top = math.inf if maximum is None else maximum
    if not counts or any(not 0 <= n <= top for n in counts):
        raise ValueError(f"counts must be non-empty, each in [0, {top}], got {counts}")
    if any(b <= a for a, b in zip(counts, counts[1:], strict=False)):
        raise ValueError(f"counts must be strictly increasing, got {counts}")
    if start_at_zero and counts[0] != 0:
        raise ValueError(f"counts must start at 0 (the full model), got {counts[:3]} ...")
    return counts


def pruning_curve_points(counts, accuracies, start_at_zero: bool = False) -> tuple[list[int], list[float]]:
    """A curve: at least two counts (see ``head_counts``) and as many finite accuracies in [0, 1]."""
    counts = head_counts(counts, None, start_at_zero)
    if isinstance(accuracies, torch.Tensor):
        accuracies = accuracies.tolist()
    if not isinstance(accuracies, list | tuple) or len(accuracies) != len(counts):
        n = len(accuracies) if isinstance(accuracies, list | tuple) else type(accuracies).__name__
        raise ValueError(f"accuracies must be a list of {len(counts)} numbers (one per count), got {n}")
    if any(isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a <= 1 for a in accuracies):
        raise ValueError(f"accuracies must be numbers in [0, 1], got {list(accuracies)[:8]}")
    if len(counts) < 2:
        raise ValueError(f"a pruning curve needs at least two points, got counts {counts}")
    return counts, [float(a) for a in accuracies]


def fraction(value, name: str) -> None:
    """A number in [0, 1] (e.g. an accuracy tolerance: 0.01 = one point)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number in [0, 1], got {value!r} ({type(value).__name__})")
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


STUDY_KEYS = ("full_accuracy", "full_loss", "counts", "curves", "summary", "provenance")
STUDY_TABLES = ("importance", "importance_raw", "ablation_drops", "ablation_loss_increase")


def study(data, path, num_layers: int, num_heads: int) -> None:
    """The head-pruning study read from ``path``: its keys, (L, H) tables and curves as long as ``counts``."""
    missing = [key for key in (*STUDY_KEYS, *STUDY_TABLES) if not isinstance(data, dict) or key not in data]
    if missing:
        raise ValueError(f"{path}: not a pruning study, missing keys {missing}")
    for key in STUDY_TABLES:
        shape = tuple(torch.tensor(data[key]).shape)
        if shape != (num_layers, num_heads):
            raise ValueError(f"{path}: {key} must be a ({num_layers}, {num_heads}) table, got shape {shape}")
    counts = head_counts(data["counts"], num_layers * num_heads, start_at_zero=True)
    curves = data["curves"]
    if not isinstance(curves, dict) or not {"importance", "importance_raw", "random"} <= set(curves):
        raise ValueError(f"{path}: curves must hold 'importance', 'importance_raw' and 'random'")
    for curve in [curves["importance"], curves["importance_raw"], *curves["random"]]:
        pruning_curve_points(counts, curve["accuracy"])
        if len(curve["loss"]) != len(counts):
            raise ValueError(
                f"{path}: a loss curve must have one value per count ({len(counts)}), got {len(curve['loss'])}"
            )
        if len(curve["order"]) != num_layers * num_heads:
            raise ValueError(
                f"{path}: an order must list all {num_layers * num_heads} heads, got {len(curve['order'])}"
            )


# ---- bert_heads.py: per-head statistics frames, category labels, axes ---------------------------------------------


def _layer_head_index(frame, what: str) -> None:
    import pandas as pd

    if len(frame) == 0:
        raise ValueError(f"{what} is empty: it needs one row per (layer, head)")
    if not isinstance(frame.index, pd.MultiIndex) or frame.index.nlevels != 2:
        raise ValueError(f"{what} must be indexed by (layer, head), got an index of names {list(frame.index.names)}")


def stats_frame(stats, columns) -> None:
    """A pandas DataFrame from ``head_token_stats``: indexed by (layer, head), with numeric ``columns``."""
    import pandas as pd

    if not isinstance(stats, pd.DataFrame):
        raise TypeError(f"stats must be the DataFrame returned by head_token_stats, got {type(stats).__name__}")
    missing = [c for c in columns if c not in stats.columns]
    if missing:
        raise ValueError(f"stats lacks the columns {missing} (it has {list(stats.columns)}); use head_token_stats")
    _layer_head_index(stats, "stats")
    bad = {c: str(stats[c].dtype) for c in columns if not pd.api.types.is_numeric_dtype(stats[c])}
    if bad:
        raise TypeError(f"stats columns must be numbers, got dtypes {bad}")


def category_labels(labels, categories) -> None:
    """A pandas Series of category names (from ``clark_categories``) indexed by (layer, head)."""
    import pandas as pd

    if not isinstance(labels, pd.Series):
        raise TypeError(f"labels must be the Series returned by clark_categories, got {type(labels).__name__}")
    _layer_head_index(labels, "labels")
    unknown = sorted({repr(v) for v in labels if v not in categories})
    if unknown:
        raise ValueError(f"labels must be categories from {list(categories)}, got {unknown[:5]}")


def axes(ax) -> None:
    """None (a new figure) or a matplotlib Axes."""
    from matplotlib.axes import Axes

    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(f"ax must be None or a matplotlib Axes, got {type(ax).__name__}")
