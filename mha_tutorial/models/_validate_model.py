"""Every check of the tiny models' arguments (``blocks``, ``model``), in one place: configurations, token ids,
positions, decoding and the model-wide KV cache.

The layer above ``_validate`` (attention), ``_validate_masks`` and ``_validate_cache`` (one layer's cache), below
``_validate_training`` (tasks, training, checkpoints): it imports nothing of the models themselves, so the classes it
checks against are passed in (``model_config``). Each function raises a ``TypeError`` or ``ValueError`` that names
the value, shape or type it got, and is called before anything is computed.
"""

from __future__ import annotations

import math
import numbers

import torch

from ..core._validate_cache import _fits
from ..core._validate_masks import _shape, _type_name
from ..core.kv_cache import KVCache

POSITIONS = ("learned", "sinusoidal", "rope")  # how a model encodes positions (blocks.POSITIONS re-exports it)
_INTEGER_DTYPES = (torch.int64, torch.int32)  # what ``Embedding`` takes (nn.Embedding's index types)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def non_negative_count(value, name: str) -> None:
    """An int >= 0 (not a bool)."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int >= 0, got {value!r:.40} ({_type_name(value)})")
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value}")


def _number(value, name: str, low: float, strict: bool) -> None:
    """A finite real number above ``low`` (or at least ``low`` unless ``strict``)."""
    bound = f"{'>' if strict else '>='} {low:g}"
    if not _is_real(value):
        raise TypeError(f"{name} must be a number {bound}, got {value!r:.40} ({_type_name(value)})")
    if not (math.isfinite(value) and (value > low if strict else value >= low)):
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


# ---- blocks.py, model.py -----------------------------------------------------------------------------------------
MODEL_SIZES = (
    "src_vocab_size",
    "tgt_vocab_size",
    "num_hiddens",
    "num_heads",
    "ffn_num_hiddens",
    "num_enc_layers",
    "num_dec_layers",
    "max_len",
)


def model_config_fields(config) -> None:
    """``ModelConfig``'s field types, before its sizes are compared: ints, a dropout rate in [0, 1), a bool bias."""
    for name in MODEL_SIZES:
        value = getattr(config, name)
        if not _is_int(value):
            raise TypeError(f"ModelConfig.{name} must be an int, got {value!r:.40} ({_type_name(value)})")
    if not _is_real(config.dropout):
        raise TypeError(f"ModelConfig.dropout must be a number in [0, 1), got {config.dropout!r:.40}")
    if not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"ModelConfig.dropout must lie in [0, 1), got {config.dropout}")
    if not isinstance(config.bias, bool):
        raise TypeError(f"ModelConfig.bias must be True or False, got {config.bias!r:.40}")


def model_position_sizes(config) -> None:
    """``ModelConfig.position``, ``rope_base`` and (once the sizes are known good) a head size RoPE can pair up."""
    position_kind(config.position)
    if not _is_real(config.rope_base):
        raise TypeError(f"ModelConfig.rope_base must be a number > 0, got {config.rope_base!r:.40}")
    if not (math.isfinite(config.rope_base) and config.rope_base > 0):
        raise ValueError(
            f"ModelConfig.rope_base must be finite and > 0 (frequencies base^(-2i/d)), got {config.rope_base!r}"
        )
    head_size = config.num_hiddens // config.num_heads
    if config.position == "rope" and head_size % 2:
        raise ValueError(
            f"position='rope' rotates q and k in pairs of features, so the head size num_hiddens / num_heads = "
            f"{config.num_hiddens} / {config.num_heads} = {head_size} must be even"
        )


def position_kind(position) -> None:
    """How a model encodes positions: one of ``POSITIONS``."""
    if not isinstance(position, str) or position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r:.40}")


def token_positions(positions, tokens, max_len: int) -> None:
    """``TransformerDecoder.forward(positions=...)``: None or integers (T,) or (B, T) in [0, max_len)."""
    if positions is None:
        return
    if not isinstance(positions, torch.Tensor) or positions.dtype not in _INTEGER_DTYPES:
        what = f"dtype {positions.dtype}" if isinstance(positions, torch.Tensor) else _type_name(positions)
        raise TypeError(f"positions must be an integer tensor (T,) or (B, T), got {what}")
    B, T = tokens.shape
    if tuple(positions.shape) not in ((T,), (B, T)):
        raise ValueError(
            f"positions must have shape ({T},) or ({B}, {T}) for tokens {tuple(tokens.shape)}, got {tuple(positions.shape)}"
        )
    if positions.device != tokens.device:
        raise ValueError(f"positions are on {positions.device}, the tokens on {tokens.device}")
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= max_len):
        raise ValueError(
            f"positions must lie in [0, {max_len - 1}] (max_len={max_len}), got values from "
            f"{int(positions.min())} to {int(positions.max())}"
        )


def model_config(config, config_type: type) -> None:
    """``build_model(config)``: a ``ModelConfig`` (``config_type``, passed in: this module sits below ``model``)
    or a dict of its fields."""
    if not isinstance(config, config_type | dict):
        raise TypeError(
            f"build_model takes a ModelConfig (or a dict of its fields, as checkpoints store it), "
            f"got {_type_name(config)} {config!r:.40}"
        )


def token_ids(ids, vocab_size: int, max_len: int) -> None:
    """``Embedding``: an integer tensor (batch, steps), at most ``max_len`` steps, ids in [0, vocab_size)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(
            f"token ids must be an integer tensor of shape (batch, steps), got {_type_name(ids)}; "
            "convert them with torch.as_tensor(ids, dtype=torch.long)"
        )
    if ids.dim() != 2 or ids.dtype not in _INTEGER_DTYPES:
        raise ValueError(
            f"token ids must be an integer tensor of shape (batch, steps), got "
            f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}"
        )
    if ids.shape[1] > max_len:
        raise ValueError(f"sequence of length {ids.shape[1]} is longer than max_len={max_len}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {vocab_size - 1}] (a vocabulary of {vocab_size} tokens), "
            f"got values from {int(ids.min())} to {int(ids.max())}"
        )


def source_and_target(config, src, tgt_in) -> None:
    """``TransformerEncoderDecoder.forward``: source and target ids (as ``token_ids``) of one batch size."""
    token_ids(src, config.src_vocab_size, config.max_len)
    token_ids(tgt_in, config.tgt_vocab_size, config.max_len)
    if src.shape[0] != tgt_in.shape[0]:
        raise ValueError(
            f"src and tgt_in must have the same batch size, got shapes {tuple(src.shape)} and {tuple(tgt_in.shape)}"
        )


def greedy_args(num_steps, bos_id, vocab_size: int) -> None:
    """``greedy_decode``: a step count >= 0 and a <bos> id in the target vocabulary (the source: ``token_ids``)."""
    non_negative_count(num_steps, "num_steps")
    if not _is_int(bos_id):
        raise TypeError(f"bos_id must be an int (a token id), got {bos_id!r:.40} ({_type_name(bos_id)})")
    if not 0 <= bos_id < vocab_size:
        raise ValueError(f"bos_id must lie in [0, {vocab_size - 1}] (the target vocabulary), got {bos_id}")


# ---- the model's KV cache (notebook 11) --------------------------------------------------------------------------


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
