r"""Turning a trained multi-head attention layer into grouped-query attention (Ainslie et al. 2023, section 2.1).

A layer with H heads becomes one with H_kv key/value heads: the queries and the output projection stay as they
are, and the K/V heads are grouped in runs of G = H / H_kv consecutive heads (the grouping
``MultiHeadAttention(num_kv_heads=...)`` uses: query head h reads K/V head h // G). Each group's new K/V head is

* ``"mean"``: the mean of its G heads' rows of ``W_k`` and ``W_v`` (and biases), what the paper found best;
* ``"first"``: the rows of the group's first head;
* ``"random"``: freshly drawn, as ``nn.Linear`` would initialise them (a baseline that keeps nothing).

.. math::
    W^K_{j} = \frac{1}{G} \sum_{h = jG}^{(j+1)G - 1} W^K_{h}, \qquad j = 0, \dots, H_{kv} - 1

The converted layer is an approximation of the original (uptraining recovers the rest); with ``num_kv_heads`` =
H it is an exact copy.
"""

from __future__ import annotations

import math

import torch

from ..core import _validate as validate
from ..core._validate import _type_name
from ..core.mha import MultiHeadAttention, _select

__all__ = ["INITS", "mha_to_gqa", "prune_kv_groups"]

INITS = ("mean", "first", "random")


def _check(mha, num_kv_heads, init, generator) -> None:
    """``mha_to_gqa``'s arguments, before anything is built."""
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"mha must be a MultiHeadAttention, got {_type_name(mha)}")
    if mha.num_kv_heads != mha.num_heads:
        raise ValueError(
            f"mha already shares its K/V heads (num_heads={mha.num_heads}, num_kv_heads={mha.num_kv_heads}): "
            "convert the plain multi-head layer it came from"
        )
    if mha.pruned_heads:
        raise ValueError(
            f"mha has pruned heads {mha.pruned_heads} (heads left: {mha.head_ids}); convert the unpruned layer"
        )
    if num_kv_heads is None:
        raise TypeError(f"num_kv_heads must be an int dividing num_heads={mha.num_heads}, got None")
    validate.kv_heads(num_kv_heads, mha.num_heads)
    if not isinstance(init, str) or init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r:.40}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {_type_name(generator)}")


def _grouped_rows(x: torch.Tensor, num_kv_heads: int, head_size: int, init: str) -> torch.Tensor:
    """A weight (H*d, in) or bias (H*d,) -> (H_kv*d, in) or (H_kv*d,): each group of G heads' rows pooled."""
    groups = x.unflatten(0, (num_kv_heads, -1, head_size))  # (H_kv, G, d, ...): head h = group h // G, member h % G
    pooled = groups.mean(dim=1) if init == "mean" else groups[:, 0]  # (H_kv, d, ...)
    return pooled.flatten(0, 1)  # (H_kv*d, ...)


def mha_to_gqa(mha: MultiHeadAttention, num_kv_heads: int, init: str = "mean", generator=None) -> MultiHeadAttention:
    """A NEW ``MultiHeadAttention`` with ``num_kv_heads`` K/V heads, made from the plain layer ``mha``.

    ``W_q`` and ``W_o`` (weights and biases) are copied; ``W_k`` and ``W_v`` are pooled per group of
    H / num_kv_heads consecutive heads as ``init`` says ("mean", "first" or "random"; ``generator`` seeds
    "random"). The new layer has ``mha``'s sizes, dropout, dtype, device and train/eval mode; ``mha`` is untouched.
    """
    _check(mha, num_kv_heads, init, generator)
    W_q, W_k, W_v, W_o = mha.W_q, mha.W_k, mha.W_v, mha.W_o
    new = MultiHeadAttention(
        mha.num_hiddens,
        mha.num_heads,
        mha.attention.dropout,
        bias=W_q.bias is not None,
        out_bias=W_o.bias is not None,
        query_size=W_q.in_features,
        key_size=W_k.in_features,
        value_size=W_v.in_features,
        num_kv_heads=num_kv_heads,
        rope_base=mha.rope_base,  # a rotary layer stays rotary
    ).to(device=W_q.weight.device, dtype=W_q.weight.dtype)
    new.train(mha.training)
    with torch.no_grad():
        for name in ("W_q", "W_o"):
            getattr(new, name).load_state_dict(getattr(mha, name).state_dict())
        for name in ("W_k", "W_v"):
            source, target = getattr(mha, name), getattr(new, name)
            for param in ("weight", "bias"):
                old, fresh = getattr(source, param), getattr(target, param)
                if old is None:
                    continue
                if init == "random":  # nn.Linear's own rule: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias
                    bound = 1.0 / math.sqrt(source.in_features) if source.in_features else 0.0
                    fresh.uniform_(-bound, bound, generator=generator)
                else:
                    fresh.copy_(_grouped_rows(old, num_kv_heads, mha.head_size, init))
    return new


@torch.no_grad()
def prune_kv_groups(layer: MultiHeadAttention, groups) -> None:
    """Remove whole K/V groups from a grouped-query layer, for good (notebook 14).

    K/V head j serves the G = H / H_kv consecutive query heads j*G .. (j+1)*G - 1, so removing it removes its rows of
    ``W_k`` and ``W_v``, those query heads' rows of ``W_q`` and their columns of ``W_o``. ``groups`` are the groups'
    numbers in the layer as it is now (0 .. H_kv - 1). The pruned layer computes exactly what the unpruned one does
    with those G query heads' ``head_mask`` entries set to 0 (``W_o``'s bias stays), and its KV cache is smaller by
    the removed heads.
    """
    if not isinstance(layer, MultiHeadAttention):
        raise TypeError(f"layer must be a MultiHeadAttention, got {_type_name(layer)}")
    H_kv, G, d = layer.num_kv_heads, layer.num_heads // layer.num_kv_heads, layer.head_size
    groups = list(groups) if not isinstance(groups, int) else [groups]
    if any(isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < H_kv for g in groups):
        raise ValueError(f"groups must be K/V head numbers in 0 .. {H_kv - 1}, got {groups!r}")
    if len(set(groups)) != len(groups):
        raise ValueError(f"groups must not repeat, got {groups!r}")
    keep_kv = [j for j in range(H_kv) if j not in groups]
    keep_q = [j * G + i for j in keep_kv for i in range(G)]  # query heads whose K/V head stays

    def rows(heads):  # head h owns features h*d .. (h+1)*d
        index = [torch.arange(h * d, (h + 1) * d) for h in heads]
        return (torch.cat(index) if index else torch.zeros(0, dtype=torch.long)).to(layer.W_q.weight.device)

    q_rows, kv_rows = rows(keep_q), rows(keep_kv)
    layer.W_q, layer.W_o = _select(layer.W_q, q_rows, dim=0), _select(layer.W_o, q_rows, dim=1)
    layer.W_k, layer.W_v = _select(layer.W_k, kv_rows, dim=0), _select(layer.W_v, kv_rows, dim=0)
    removed = [layer.head_ids[j * G + i] for j in groups for i in range(G)]
    layer.pruned_heads = sorted([*layer.pruned_heads, *removed])
    layer.head_ids = [layer.head_ids[h] for h in keep_q]
    layer.num_heads = len(keep_q)
