"""Every check of the pretrained encoder's inputs, in one place: configurations, token batches, sentences, devices.

The companion of ``_validate`` and ``_validate_experiments`` for ``bert`` and ``minilm``: each function raises a
``TypeError`` or ``ValueError`` that names the value it got, and is called before anything is computed.
"""

from __future__ import annotations

import math

import torch

_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

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


def _kind_of(x) -> str:
    return str(x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__


def positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")


def bert_config(config) -> None:
    """``BertConfig``: positive sizes, heads dividing the width, a positive finite LayerNorm eps."""
    for name in ("vocab_size", "num_hiddens", "num_heads", "num_layers", "ffn_num_hiddens", "max_len"):
        positive_int(getattr(config, name), f"BertConfig.{name}")
    positive_int(config.type_vocab_size, "BertConfig.type_vocab_size")
    if config.num_hiddens % config.num_heads:
        raise ValueError(f"num_hiddens={config.num_hiddens} is not divisible by num_heads={config.num_heads}")
    eps = config.eps
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"BertConfig.eps must be a positive number, got {eps!r}")


def _ids(x, name: str, shape, high: int, what: str) -> None:
    """An integer tensor of ``shape`` with values in [0, high)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"{name} must be an integer tensor (batch, steps), got {_kind_of(x)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of input_ids {tuple(shape)}, got {tuple(x.shape)}")
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= high):
        raise ValueError(
            f"{name} must lie in [0, {high - 1}] ({what}), got values from {int(x.min())} to {int(x.max())}"
        )


def encoder_inputs(config, input_ids, attention_mask, token_type_ids) -> None:
    """``BertEncoder.forward``: ids (B, T) within the vocabulary and positions; masks and types of the same shape."""
    _ids(input_ids, "input_ids", None, config.vocab_size, f"a vocabulary of {config.vocab_size} tokens")
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must have shape (batch, steps) with both > 0, got {tuple(input_ids.shape)}")
    if input_ids.shape[1] > config.max_len:
        raise ValueError(
            f"a sequence of {input_ids.shape[1]} tokens is longer than the {config.max_len} learned positions"
        )
    if token_type_ids is not None:
        types = config.type_vocab_size
        _ids(token_type_ids, "token_type_ids", input_ids.shape, types, f"{types} segment types")
    if attention_mask is not None:
        attention_mask_tensor(attention_mask, input_ids.shape)


def attention_mask_tensor(attention_mask, shape) -> None:
    """A (B, T) mask of 1 (real token) and 0 (padding), as int or bool."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype not in (*_INTEGER_DTYPES, torch.bool):
        raise TypeError(
            f"attention_mask must be an integer or bool tensor of 1/0 (batch, steps), got {_kind_of(attention_mask)}"
        )
    if tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(f"attention_mask must have shape {tuple(shape)}, got {tuple(attention_mask.shape)}")
    if attention_mask.dtype != torch.bool and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ValueError(
            f"attention_mask must hold only 1 (real token) and 0 (padding), got values {attention_mask.unique().tolist()}"
        )


def pooling_inputs(hidden, attention_mask) -> None:
    """``mean_pool``: floating hidden states (B, T, d) and their (B, T) attention mask."""
    if not isinstance(hidden, torch.Tensor) or not hidden.is_floating_point() or hidden.dim() != 3:
        got = f"{_kind_of(hidden)} {tuple(hidden.shape)}" if isinstance(hidden, torch.Tensor) else _kind_of(hidden)
        raise TypeError(f"hidden must be a floating tensor (batch, steps, features), got {got}")
    attention_mask_tensor(attention_mask, hidden.shape[:2])


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
