"""The layers a tiny transformer is made of (notebook 05): the MLP, the embedding and one post-norm block."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from . import _validate_training as validate_training
from .mha import AddNorm, MultiHeadAttention

if TYPE_CHECKING:
    from .model import ModelConfig

__all__ = ["Block", "Embedding", "PositionWiseFFN"]


class PositionWiseFFN(nn.Module):
    """The same two-layer MLP applied at every position: (B, T, d) -> (B, T, d)."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int):
        super().__init__()
        self.dense1 = nn.Linear(num_hiddens, ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_num_hiddens, num_hiddens)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class Embedding(nn.Module):
    """Token embedding plus a learned embedding of the position: (B, T) ids -> (B, T, d)."""

    def __init__(self, vocab_size: int, num_hiddens: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.token = nn.Embedding(vocab_size, num_hiddens)
        self.position = nn.Embedding(max_len, num_hiddens)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions`` (B, T) or (T,) default to 0..T-1; a decoder continuing a KV cache passes its own."""
        validate_training.token_ids(ids, self.token.num_embeddings, self.max_len)
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device)  # (T,)
        return self.token(ids) + self.position(positions)  # (B, T, d)


class Block(nn.Module):
    """One transformer layer (post-norm, as in Vaswani et al. 2017).

    X -> AddNorm(X, SelfAttn(X)) -> [AddNorm(., CrossAttn(., memory))] -> [AddNorm(., FFN(.))]
    """

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        d = cfg.num_hiddens
        self.self_attn = MultiHeadAttention(d, cfg.num_heads, cfg.dropout, bias=cfg.bias)
        self.norm1 = AddNorm(d, cfg.dropout)
        self.cross_attn = MultiHeadAttention(d, cfg.num_heads, cfg.dropout, bias=cfg.bias) if cross else None
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
    ):
        """``self_cache``/``cross_cache``: the ``LayerCache`` of each attention layer when decoding with a cache."""
        X = self.norm1(X, self.self_attn(X, X, X, valid_lens, mask, self_head_mask, kv_cache=self_cache))  # (B, T, d)
        if self.cross_attn is not None:
            Y = self.cross_attn(X, memory, memory, memory_valid_lens, None, cross_head_mask, kv_cache=cross_cache)
            X = self.norm2(X, Y)
        if self.ffn is not None:
            X = self.norm3(X, self.ffn(X))
        return X
