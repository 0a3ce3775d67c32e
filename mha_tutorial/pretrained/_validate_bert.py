"""The checks of the BERT encoder's own inputs (``bert``): its configuration, token batches and pooling.

Below ``bert`` (which imports it) and re-exported by ``_validate_pretrained`` (the checks of everything built on the
encoder). Each function raises a ``TypeError`` or ``ValueError`` that names the value it got, and is called before
anything is computed.
"""

from __future__ import annotations

import math

import torch

_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


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
