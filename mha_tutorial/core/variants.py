"""Three other ways to write the same multi-head attention (notebook 03).

Each class has the constructor and parameter names of ``MultiHeadAttention``, so one
``state_dict`` loads into all of them and they must give the same outputs. The two
batch-first ones subclass it and only replace ``forward``, with the same arguments
(``need_weights=False`` only drops the weights: they have no fused path), so either can
stand in for it. The sequence-first one is a sibling with its own ``forward`` contract.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import _validate as validate
from . import _validate_rope as validate_rope
from .attention import masked_softmax, scaled_dot_product_attention
from .masks import and_causal, as_4d, combine_masks
from .mha import MultiHeadAttention, prune_attention_heads


class HeadLoopMultiHeadAttention(MultiHeadAttention):
    """The literal reading of Concat(head_1, ..., head_H) W^O: one head at a time, on column slices."""

    def forward(
        self, queries, keys, values, valid_lens=None, mask=None, head_mask=None, need_weights=True, is_causal=False
    ):
        valid_lens = validate.mha_inputs(self, queries, keys, values, valid_lens, mask, head_mask, is_causal)
        if self.num_heads == 0:  # every head pruned: nothing to loop over, only W_o's bias
            return self._no_heads(queries, keys.shape[1], need_weights)
        mask = and_causal(mask, queries.shape[1], keys.shape[1], queries.device) if is_causal else mask
        Q, K, V = self.W_q(queries), self.W_k(keys), self.W_v(values)  # (B, T, H*d)
        d = self.head_size
        mask = as_4d(mask)  # (b, h, Q, K), b in {1, B}, h in {1, H}
        heads, weights = [], []
        for h in range(self.num_heads):
            cols = slice(h * d, (h + 1) * d)
            mask_h = None if mask is None else mask[:, h if mask.shape[1] > 1 else 0]  # (b, Q, K)
            out_h, w_h = scaled_dot_product_attention(
                Q[..., cols],
                K[..., cols],
                V[..., cols],
                valid_lens,
                mask_h,
                self.attention.dropout,
                self.training,
            )  # (B, Q, d), (B, Q, K)
            heads.append(out_h if head_mask is None else out_h * head_mask[h])
            weights.append(w_h)
        self.attention_weights = torch.stack(weights, dim=1) if need_weights else None  # (B, H, Q, K)
        return self.W_o(torch.cat(heads, dim=-1))  # (B, Q, H*d) -> (B, Q, num_hiddens)


class EinsumMultiHeadAttention(MultiHeadAttention):
    """Head-first layout (H, B, T, d) with ``torch.einsum`` for the scores and the weighted sum."""

    def forward(
        self, queries, keys, values, valid_lens=None, mask=None, head_mask=None, need_weights=True, is_causal=False
    ):
        valid_lens = validate.mha_inputs(self, queries, keys, values, valid_lens, mask, head_mask, is_causal)
        mask = and_causal(mask, queries.shape[1], keys.shape[1], queries.device) if is_causal else mask
        H, d = self.num_heads, self.head_size

        def split(X):  # (B, T, H*d) -> (H, B, T, d)
            return X.unflatten(-1, (H, d)).permute(2, 0, 1, 3)

        q, k, v = split(self.W_q(queries)), split(self.W_k(keys)), split(self.W_v(values))
        scores = torch.einsum("hbqd,hbkd->hbqk", q / math.sqrt(d), k)  # (H, B, Q, K)
        keep = as_4d(combine_masks(valid_lens, mask, keys.shape[1]))  # ~(B, H, Q, K)
        keep = None if keep is None else keep.transpose(0, 1)  # ~(H, B, Q, K)
        weights = masked_softmax(scores, mask=keep)  # (H, B, Q, K)
        self.attention_weights = weights.transpose(0, 1) if need_weights else None  # (B, H, Q, K)
        if self.training and self.attention.dropout > 0:
            weights = nn.functional.dropout(weights, self.attention.dropout)
        out = torch.einsum("hbqk,hbkd->hbqd", weights, v)  # (H, B, Q, d)
        if head_mask is not None:
            out = out * head_mask.to(device=out.device, dtype=out.dtype)[:, None, None, None]
        return self.W_o(out.permute(1, 2, 0, 3).flatten(2))  # (B, Q, H*d) -> (B, Q, num_hiddens)


class SeqFirstMultiHeadAttention(nn.Module):
    """Sequence-first tensors [seq, batch, d_model], as in the original Transformer code bases.

    A sibling of ``MultiHeadAttention``, not a subclass: its ``forward`` has another contract,
    ``forward(query, key, value, mask=None, need_weights=True)`` with a bool ``mask`` of shape
    [Q, K, B] (True = may attend) whose Q or B axis may be 1 to broadcast. It takes the same
    constructor arguments and has the same parameters (``W_q``, ``W_k``, ``W_v``, ``W_o``), so one
    ``state_dict`` loads into both. The scores use the index pattern ``'ibhd,jbhd->ijbh'``
    (i = query position, j = key position, b = batch, h = head). Errors name the [seq, batch, features]
    shapes passed in; ``prune_heads`` removes heads as ``MultiHeadAttention.prune_heads`` does.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        parts = MultiHeadAttention(*args, **kwargs)  # the same checks, sizes and initialisation
        validate.plain_heads_only(
            "SeqFirstMultiHeadAttention", parts.num_heads, parts.num_kv_heads, "it mirrors nn.MultiheadAttention"
        )
        validate_rope.no_rope("SeqFirstMultiHeadAttention", parts.rope_base, "it mirrors nn.MultiheadAttention")
        self.num_hiddens, self.num_heads, self.head_size = parts.num_hiddens, parts.num_heads, parts.head_size
        self.W_q, self.W_k, self.W_v, self.W_o = parts.W_q, parts.W_k, parts.W_v, parts.W_o
        self.attention = parts.attention  # holds the dropout rate
        self.attention_weights: torch.Tensor | None = None
        self.head_ids, self.pruned_heads = parts.head_ids, parts.pruned_heads  # see prune_heads

    def forward(self, query, key, value, mask=None, need_weights=True):
        validate.seq_first_inputs(self, query, key, value, mask, need_weights)
        H, d = self.num_heads, self.head_size
        q = self.W_q(query).unflatten(-1, (H, d))  # (Q, B, H, d)
        k = self.W_k(key).unflatten(-1, (H, d))  # (K, B, H, d)
        v = self.W_v(value).unflatten(-1, (H, d))  # (K, B, H, d)
        scores = torch.einsum("ibhd,jbhd->ijbh", q / math.sqrt(d), k)  # (Q, K, B, H)
        # masked_softmax works on the last axis: move the key axis j there and back.
        keep = None if mask is None else mask.permute(0, 2, 1).unsqueeze(2)  # (Q, B, 1, K)
        weights = masked_softmax(scores.permute(0, 2, 3, 1), mask=keep).permute(0, 3, 1, 2)  # (Q, K, B, H)
        self.attention_weights = weights.permute(2, 3, 0, 1) if need_weights else None  # (B, H, Q, K)
        if self.training and self.attention.dropout > 0:
            weights = nn.functional.dropout(weights, self.attention.dropout)
        out = torch.einsum("ijbh,jbhd->ibhd", weights, v)  # (Q, B, H, d)
        return self.W_o(out.flatten(2))  # (Q, B, num_hiddens)

    def prune_heads(self, heads) -> None:
        """Remove heads for good, as ``MultiHeadAttention.prune_heads`` does: the same original numbering
        (``head_ids``, ``pruned_heads``), the same smaller weights, the same outputs."""
        prune_attention_heads(self, heads)
