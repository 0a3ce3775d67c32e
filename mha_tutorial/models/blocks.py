r"""The layers a tiny transformer is made of (notebook 05): the MLP, the embedding and one post-norm block.

Three ways to tell the model where a token stands (``ModelConfig.position``):

* ``"learned"``: a trained vector per position, added to the token's embedding (the default).
* ``"sinusoidal"``: the fixed table of Vaswani et al. (2017), added the same way; nothing to train,

  .. math::
      PE_{m, 2i} = \sin(m / 10000^{2i/d}), \qquad PE_{m, 2i+1} = \cos(m / 10000^{2i/d}).

* ``"rope"``: nothing added; every self-attention layer rotates its q and k by their positions (``core/rope.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..core.mha import AddNorm, MultiHeadAttention
from . import _validate_model as validate_model
from ._validate_model import POSITIONS

if TYPE_CHECKING:
    from .model import ModelConfig

__all__ = ["POSITIONS", "Block", "Embedding", "PositionWiseFFN", "sinusoidal_table"]


class PositionWiseFFN(nn.Module):
    """The same two-layer MLP applied at every position: (B, T, d) -> (B, T, d)."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int):
        super().__init__()
        self.dense1 = nn.Linear(num_hiddens, ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_num_hiddens, num_hiddens)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


def sinusoidal_table(max_len: int, num_hiddens: int) -> torch.Tensor:
    """The fixed positional encodings (max_len, d): sin in the even columns, cos in the odd ones (float64)."""
    m = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1): the positions
    exponents = torch.arange(0, num_hiddens, 2, dtype=torch.float64) / num_hiddens  # (ceil(d/2),): 2i/d
    angles = m / 10000.0**exponents  # (max_len, ceil(d/2)): m / 10000^(2i/d)
    table = torch.zeros(max_len, num_hiddens, dtype=torch.float64)
    table[:, 0::2] = angles.sin()  # columns 2i
    table[:, 1::2] = angles[:, : num_hiddens // 2].cos()  # columns 2i + 1 (an odd d has no last cos column)
    return table


class Embedding(nn.Module):
    """Token embedding plus the position's (learned or sinusoidal; none for "rope"): (B, T) ids -> (B, T, d)."""

    def __init__(self, vocab_size: int, num_hiddens: int, max_len: int, position: str = "learned"):
        super().__init__()
        validate_model.position_kind(position)
        self.max_len, self.kind = max_len, position
        self.token = nn.Embedding(vocab_size, num_hiddens)
        self.position = nn.Embedding(max_len, num_hiddens) if position == "learned" else None
        if position == "sinusoidal":  # a buffer, not a parameter: it follows .to() but is not trained or saved
            table = sinusoidal_table(max_len, num_hiddens).to(torch.get_default_dtype())
            self.register_buffer("table", table, persistent=False)  # (max_len, d)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions`` (B, T) or (T,) default to 0..T-1; a decoder continuing a KV cache passes its own."""
        validate_model.token_ids(ids, self.token.num_embeddings, self.max_len)
        if self.kind == "rope":  # the positions act inside attention instead
            return self.token(ids)  # (B, T, d)
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device)  # (T,)
        if self.kind == "sinusoidal":
            return self.token(ids) + self.table[positions]  # (B, T, d)
        return self.token(ids) + self.position(positions)  # (B, T, d)


class Block(nn.Module):
    """One transformer layer (post-norm, as in Vaswani et al. 2017).

    X -> AddNorm(X, SelfAttn(X)) -> [AddNorm(., CrossAttn(., memory))] -> [AddNorm(., FFN(.))]
    """

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        d, H, kv = cfg.num_hiddens, cfg.num_heads, cfg.num_kv_heads
        rope_base = cfg.rope_base if cfg.position == "rope" else None  # None: this layer rotates nothing
        self.self_attn = MultiHeadAttention(d, H, cfg.dropout, bias=cfg.bias, num_kv_heads=kv, rope_base=rope_base)
        self.norm1 = AddNorm(d, cfg.dropout)
        # Cross-attention is not rotated: its keys (the encoder's positions) are not the queries' positions.
        self.cross_attn = MultiHeadAttention(d, H, cfg.dropout, bias=cfg.bias, num_kv_heads=kv) if cross else None
        self.norm2 = AddNorm(d, cfg.dropout) if cross else None
        self.ffn = PositionWiseFFN(d, cfg.ffn_num_hiddens) if cfg.ffn_num_hiddens else None
        self.norm3 = AddNorm(d, cfg.dropout) if cfg.ffn_num_hiddens else None

    def forward(  # noqa: PLR0913 (one input per sublayer: masks, memory, head gates, caches)
        self,
        X,
        valid_lens=None,
        mask=None,
        memory=None,
        memory_valid_lens=None,
        self_head_mask=None,
        cross_head_mask=None,
        self_cache=None,
        cross_cache=None,
        positions=None,
    ):
        """``self_cache``/``cross_cache``: the ``LayerCache`` of each attention layer when decoding with a cache;
        ``positions`` (T,) or (B, T): where the tokens stand, for rotary self-attention (ignored otherwise)."""
        positions = positions if self.self_attn.rope_base is not None else None  # only a rotary layer takes them
        Y = self.self_attn(X, X, X, valid_lens, mask, self_head_mask, kv_cache=self_cache, positions=positions)
        X = self.norm1(X, Y)  # (B, T, d)
        if self.cross_attn is not None:
            Y = self.cross_attn(X, memory, memory, memory_valid_lens, None, cross_head_mask, kv_cache=cross_cache)
            X = self.norm2(X, Y)
        if self.ffn is not None:
            X = self.norm3(X, self.ffn(X))
        return X
