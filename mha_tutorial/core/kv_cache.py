r"""The KV cache (notebook 11): the keys and values a decoder has already computed, kept for its next step.

A causal decoder that generates token t+1 needs every position's key and value up to t. Without a cache it
re-runs the whole prefix at every step; with one it projects only the new position and appends:

.. math::
    K_{1:t+1} = [K_{1:t};\, x_{t+1} W^K], \qquad V_{1:t+1} = [V_{1:t};\, x_{t+1} W^V]

The new queries are the *last* Q of the K positions, so the causal mask of a step is bottom-right aligned:
query i sees keys up to i + (K - Q) (``causal_mask(Q, K)``). Cross-attention's keys and values come from the
encoder's memory, which does not change while decoding: they are projected once and reused.

One ``LayerCache`` per attention layer holds (B, H, T, d) tensors; ``KVCache`` holds a model's layers, how
many positions they have seen, and which of those are left padding. Its size is the formula

    bytes = 2 (K and V) * layers * B * H * T * d * bytes per element.
"""

from __future__ import annotations

import torch

__all__ = ["KVCache", "LayerCache", "cache_bytes"]


class LayerCache:
    """The keys and values of one attention layer, each (B, H, T, d).

    ``grow=True`` (self-attention): every call appends the new positions. ``grow=False`` (cross-attention):
    the first call stores the memory's keys and values; later calls reuse them and project nothing.
    """

    def __init__(self, grow: bool = True):
        self.grow = grow
        self.keys: torch.Tensor | None = None  # (B, H, T, d)
        self.values: torch.Tensor | None = None  # (B, H, T, d)

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    @property
    def filled(self) -> bool:
        return self.keys is not None

    def num_keys_after(self, num_new: int) -> int:
        """The keys attention sees once this call's ``num_new`` positions went through the cache."""
        if not self.filled:
            return num_new
        return len(self) + num_new if self.grow else len(self)

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (or append) the new positions' k, v (B, H, T_new, d); return all of them (B, H, T, d)."""
        if self.keys is None or not self.grow:
            self.keys, self.values = k, v
        else:
            self.keys = torch.cat([self.keys, k], dim=2)  # (B, H, T + T_new, d)
            self.values = torch.cat([self.values, v], dim=2)  # (B, H, T + T_new, d)
        return self.keys, self.values


class KVCache:
    """The cache of a whole model: one ``LayerCache`` per decoder attention layer, named as in ``attention_layers()``.

    ``length`` counts the decoder positions seen so far (the next position's index); ``keep`` (B, length) is
    False where a position is left padding, so later steps hide those keys too. Make a new one per sequence
    batch: ``cache = KVCache(model)``, then call ``model(tokens, cache=cache)`` on the prompt and on each new token.
    """

    def __init__(self, model):
        self.layers = {  # the decoder's layers: an encoder runs once, its output is what cross-attention caches
            name: LayerCache(grow=not name.endswith(".cross"))
            for name, _ in model.attention_layers()
            if name.startswith("dec.")
        }
        self.length = 0
        self.keep: torch.Tensor | None = None  # (B, length) bool, None while nothing is padded

    def __getitem__(self, name: str) -> LayerCache:
        return self.layers[name]

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's keys and values (the tensors, not Python's bookkeeping)."""
        return sum(layer.nbytes for layer in self.layers.values())

    def extend(self, num_new: int, keep_new: torch.Tensor | None, batch: int, device) -> torch.Tensor | None:
        """Record ``num_new`` positions (``keep_new`` (B, num_new): False = padding); return keep (B, K) or None."""
        if keep_new is not None or self.keep is not None:
            old = (
                self.keep if self.keep is not None else torch.ones(batch, self.length, dtype=torch.bool, device=device)
            )
            new = keep_new if keep_new is not None else torch.ones(batch, num_new, dtype=torch.bool, device=device)
            self.keep = torch.cat([old, new.to(device)], dim=1)  # (B, length + num_new)
        self.length += num_new
        return self.keep


def cache_bytes(num_layers: int, batch: int, num_heads: int, length: int, head_size: int, dtype=torch.float32) -> int:
    """What a cache of ``length`` positions should hold: 2 (K and V) * layers * B * H * T * d * element size."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * batch * num_heads * length * head_size * element
