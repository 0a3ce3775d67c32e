"""The checks of masks and lengths (``masks.py``, and every attention function through ``masks_for``), in one place.

Split from ``_validate`` (which re-exports them): each function raises a ``TypeError`` or ``ValueError`` that names
the shapes, values or types it got, and is called before any arithmetic.
"""

from __future__ import annotations

import operator

import torch


def _shape(x) -> tuple:
    return tuple(x.shape)


def _type_name(x) -> str:
    """A value's type for messages: ``list``, ``float``, ``numpy.ndarray``, ..."""
    kind = type(x)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__name__}"


def as_valid_lens(valid_lens) -> torch.Tensor:
    """Accept a list or tensor of lengths and return an integer tensor.

    Raises ``TypeError`` for floating or bool tensors: a length is a count.
    """
    if not isinstance(valid_lens, torch.Tensor):
        try:
            valid_lens = torch.as_tensor(valid_lens)
        except (TypeError, ValueError, RuntimeError):  # None, a string, ragged lists ...
            raise TypeError(
                f"valid_lens must be an integer tensor or a list of lengths, got {_type_name(valid_lens)} "
                f"{valid_lens!r:.60}"
            ) from None
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
    # Broadcasting to ``shape`` itself: every axis of the mask, from the right, is 1 or the target's size (a plain
    # loop: torch.broadcast_shapes costs half a millisecond, on every attention call).
    fits = mask.dim() <= len(shape) and all(
        m in (1, t) for m, t in zip(reversed(mask.shape), reversed(shape), strict=False)
    )
    if not fits:
        raise ValueError(f"mask of shape {_shape(mask)} does not broadcast to the scores' shape {tuple(shape)}")


def count(value, name: str, where: str) -> int:
    """A count such as ``causal_mask``'s number of queries: an int (any integer type but bool), returned as one."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: {name} must be an int, got {value!r:.40} ({_type_name(value)})") from None


def key_count(value) -> None:
    """``padding_mask``'s number of keys: an int >= 0."""
    if count(value, "num_keys", "padding_mask") < 0:
        raise ValueError(f"padding_mask needs num_keys >= 0, got {value}")


def bool_mask(mask) -> None:
    """``keep_to_drop``, ``drop_to_keep``, ``bool_to_additive``: a bool tensor of any shape."""
    check_mask(mask, _shape(mask) if isinstance(mask, torch.Tensor) else ())


def additive_mask(mask) -> None:
    """``additive_to_bool``: a floating tensor of any shape."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"additive_to_bool expects a floating tensor, got {_type_name(mask)}; convert it with torch.as_tensor(...)"
        )
    if not mask.is_floating_point():
        raise TypeError(f"additive_to_bool expects a floating tensor, got {getattr(mask, 'dtype', type(mask))}")


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


def causal_sizes(num_queries, num_keys) -> None:
    """``causal_mask``'s sizes: ints (their signs are checked where the mask is built)."""
    count(num_queries, "num_queries", "causal_mask")
    count(num_keys, "num_keys", "causal_mask")
