r"""Multi-head attention (notebook 04).

.. math::
    \mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)\, W^O,
    \qquad \mathrm{head}_h = \mathrm{Attention}(Q W_h^Q, K W_h^K, V W_h^V)

The four projections are ``nn.Linear`` layers named as in the text: ``W_q``,
``W_k``, ``W_v`` and ``W_o``. Head h owns output columns h*d .. (h+1)*d of
``W_q``, ``W_k``, ``W_v`` (d = num_hiddens / num_heads) and the matching input
columns of ``W_o`` -- the layout of ``nn.MultiheadAttention``, so weights can be
copied across directly.

Grouped-query attention (``num_kv_heads`` < H, Ainslie et al. 2023) keeps H query heads but only
H_kv key/value heads: ``W_k`` and ``W_v`` output H_kv * d features, and query head h reads K/V head
h // (H / H_kv), so each run of H / H_kv consecutive query heads shares one. ``num_kv_heads=1`` is
multi-query attention (Shazeer 2019). A KV cache then stores H_kv heads instead of H.

Rotary positions (``rope_base``, Su et al. 2021; ``rope.py``): in self-attention, each head's q and k are rotated
by their positions right after the projections, so a score depends only on how far apart query and key are. v is
never rotated, and the cache stores keys already rotated: a later step rotates only its own new ones.

Removing heads for good (notebook 07): ``prune_attention_heads`` drops a layer's heads from its four projections; it
lives here, with the layer it prunes (``pruning``, which measures which heads to remove, re-exports it).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F

from . import _validate as validate
from . import _validate_rope as validate_rope
from .attention import DotProductAttention
from .heads import transpose_output
from .masks import and_causal, as_4d, combine_masks, fold_heads
from .rope import apply_rope, rotate_range

# F.scaled_dot_product_attention(..., enable_gqa=True) appeared in PyTorch 2.5.
_SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with per-head weights kept in ``.attention_weights`` (B, H, Q, K).

    Args:
        num_hiddens: width of the projections and of the output (H * d).
        num_heads: number of heads H; must divide ``num_hiddens``.
        dropout: dropout on the attention weights (training only).
        bias: whether the input projections ``W_q``, ``W_k``, ``W_v`` have a bias.
        out_bias: whether ``W_o`` has a bias; None (the default) follows ``bias``. Some formulations
            (and checkpoints) have a bias on ``W_o`` only: ``bias=False, out_bias=True``.
        query_size, key_size, value_size: input sizes when they differ from
            ``num_hiddens`` (cross-attention between different spaces).
        num_kv_heads: key/value heads H_kv, a divisor of ``num_heads``; None (the default) means H_kv = H,
            plain multi-head attention; 1 is multi-query attention; anything between, grouped-query attention.
        rope_base: None (the default) for no positions inside attention; a number > 0 makes the layer rotate q and k
            by their positions (rotary positions, layout "half", frequencies base^(-2i/d)); self-attention only.
    """

    def __init__(  # noqa: PLR0913 (the module's options, as keywords)
        self,
        num_hiddens: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = False,
        *,
        out_bias: bool | None = None,
        query_size: int | None = None,
        key_size: int | None = None,
        value_size: int | None = None,
        num_kv_heads: int | None = None,
        rope_base: float | None = None,
    ):
        super().__init__()
        validate.mha_config(num_hiddens, num_heads, bias, out_bias, query_size, key_size, value_size, num_kv_heads)
        validate_rope.attention_config(rope_base, num_hiddens, num_heads)
        if type(self).forward is not MultiHeadAttention.forward:  # a variant of notebook 03: its own forward
            why = "it replaces forward with plain multi-head attention; use MultiHeadAttention itself"
            validate.plain_heads_only(type(self).__name__, num_heads, num_kv_heads, why)
            validate_rope.no_rope(type(self).__name__, rope_base, why)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_hiddens, self.num_heads = num_hiddens, num_heads
        self.head_size = num_hiddens // num_heads
        self.rope_base = None if rope_base is None else float(rope_base)  # None: q and k are not rotated
        kv_features = num_kv_heads * self.head_size  # H_kv * d: num_hiddens unless grouped-query
        self.W_q = nn.Linear(query_size or num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size or num_hiddens, kv_features, bias=bias)
        self.W_v = nn.Linear(value_size or num_hiddens, kv_features, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias if out_bias is None else out_bias)
        self.attention = DotProductAttention(dropout)
        self.attention_weights: torch.Tensor | None = None
        self.head_ids = list(range(num_heads))  # original numbers of the heads still present (see prune_heads)
        self.pruned_heads: list[int] = []

    @property
    def num_kv_heads(self) -> int:
        """H_kv, the key/value heads: read off ``W_k``, so it follows ``num_heads`` when heads are pruned."""
        return self.W_k.out_features // self.head_size

    def forward(  # noqa: PLR0913 (the module's options, named as in PyTorch)
        self,
        queries,
        keys,
        values,
        valid_lens=None,
        mask=None,
        head_mask=None,
        need_weights=True,
        is_causal=False,
        kv_cache=None,
        positions=None,
    ):
        """queries (B, Q, q_size), keys (B, K, k_size), values (B, K, v_size) -> (B, Q, num_hiddens).

        ``valid_lens`` (B,) or (B, Q) and ``mask`` (bool, broadcastable to (B, H, Q, K),
        True = may attend) select the visible keys. For padding use ``valid_lens`` (or a
        (B, 1, 1, K) mask): a (B, K) mask broadcasts as (Q, K), so when B == Q it is
        silently read as one row per *query*; ``head_mask`` (H,) scales each
        head's output before ``W_o`` (0 switches a head off).

        With ``need_weights=False`` the same projections go through PyTorch's fused
        ``F.scaled_dot_product_attention`` instead, which never materialises the
        (B, H, Q, K) weights; ``.attention_weights`` is then None.

        ``is_causal=True`` hides the future: it is the same as AND-ing ``causal_mask(Q, K)``
        into ``mask``. With no other mask and Q == K the fused path hands it to PyTorch as
        ``is_causal``, which lets the flash-attention kernel run (it takes no mask tensor).

        ``kv_cache`` (a ``LayerCache``, notebook 11) keeps the projected keys and values of earlier calls: a
        growing cache appends this call's, so the scores' K counts the cached positions too (masks and
        ``valid_lens`` cover all K; ``is_causal`` aligns the queries with the *last* keys); a fixed one
        (cross-attention) projects ``keys``/``values`` on its first call only.

        ``positions`` (T,) or (B, T) integers, only for a layer made with ``rope_base``: where the T new queries
        stand, which are the T new keys (self-attention: Q == K_new). By default 0..T-1, continuing the cache.
        """
        valid_lens = validate.mha_inputs(self, queries, keys, values, valid_lens, mask, head_mask, is_causal, kv_cache)
        positions = self._positions(queries, keys, positions, kv_cache)  # (T,), (B, T), an int start, or None
        num_keys = keys.shape[1] if kv_cache is None else kv_cache.num_keys_after(keys.shape[1])  # cached + new
        if self.num_heads == 0:  # every head pruned: the sublayer contributes only W_o's bias
            return self._no_heads(queries, num_keys, need_weights)
        num_queries = queries.shape[1]
        q, k, v = self._project(queries, keys, values, kv_cache, positions)  # (B, H, Q, d), (B, H_kv, K, d) x 2
        if is_causal and num_queries == 1:  # one query, aligned with the last key: the causal mask hides nothing
            is_causal = False  # (a decoding step with a cache; PyTorch's kernel then runs without a mask)
        if not need_weights and is_causal and valid_lens is None and mask is None and num_queries == num_keys:
            return self._fused_forward(q, k, v, None, None, head_mask, is_causal=True)
        mask = and_causal(mask, num_queries, num_keys, queries.device) if is_causal else mask
        if not need_weights:
            return self._fused_forward(q, k, v, valid_lens, mask, head_mask)
        return self._step_forward(q, k, v, valid_lens, mask, head_mask)

    def _positions(self, queries, keys, positions, kv_cache):
        """Where the new queries and keys stand, checked: positions (T,) or (B, T) as given; by default the int
        start of 0..T-1 continuing the cache (``rotate_range`` then reuses its cos and sin); None without rope_base."""
        positions = validate_rope.attention_positions(self, queries, keys, positions, kv_cache)
        if positions is None and self.rope_base is not None:
            return 0 if kv_cache is None else len(kv_cache)  # the cache's positions come first
        return positions

    def _rope(self, x, positions):
        """x (B, heads, T, d) turned by its positions: a tensor of them, or the int start of a range."""
        if isinstance(positions, int):
            return rotate_range(x, positions, self.rope_base)
        return apply_rope(x, positions, self.rope_base)

    def _project(self, queries, keys, values, kv_cache, positions):
        """queries (B, Q, q_size) -> q (B, H, Q, d); keys, values -> every key and value (B, H_kv, K, d).

        With ``positions`` (rotary positions), q and the new k are rotated here, before the cache stores k."""
        H, d = self.num_heads, self.head_size
        q = self.W_q(queries).unflatten(-1, (H, d)).transpose(1, 2)  # (B, H, Q, d)
        if positions is not None:
            q = self._rope(q, positions)  # (B, H, Q, d): query i turned by its position's angles
        k, v = self._keys_values(keys, values, kv_cache, positions)  # (B, H_kv, K, d) each
        return q, k, v

    def _keys_values(self, keys, values, kv_cache, positions=None):
        """keys, values (B, K_new, size) -> all keys and values (B, H_kv, K, d), through the cache if any
        (notebook 11): the cache holds the H_kv heads, never the repeated ones, and keys already rotated."""
        if kv_cache is not None and not kv_cache.grow and kv_cache.filled:  # cross-attention: projected once
            return kv_cache.keys, kv_cache.values
        H_kv, d = self.num_kv_heads, self.head_size
        k = self.W_k(keys).unflatten(-1, (H_kv, d)).transpose(1, 2)  # (B, H_kv, K_new, d)
        v = self.W_v(values).unflatten(-1, (H_kv, d)).transpose(1, 2)  # (B, H_kv, K_new, d)
        if positions is not None:
            k = self._rope(k, positions)  # (B, H_kv, K_new, d); v is never rotated
        if kv_cache is None:
            return k, v
        return kv_cache.update(k, v)  # (B, H_kv, K, d): the cached positions, then the new ones

    def _repeat_kv_heads(self, x):
        """(B, H_kv, K, d) -> (B, H, K, d): K/V head j becomes query heads j*G .. (j+1)*G - 1, G = H / H_kv."""
        group = self.num_heads // self.num_kv_heads
        return x if group == 1 else torch.repeat_interleave(x, group, dim=1)  # (B, H, K, d)

    def _step_forward(self, q, k, v, valid_lens, mask, head_mask):
        """The step-by-step path on q (B, H, Q, d), k and v (B, H_kv, K, d): scores, softmax, weighted sum."""
        batch, H = q.shape[0], self.num_heads
        q = q.flatten(0, 1)  # (B*H, Q, d): row b*H + h is head h of example b (transpose_qkv's layout)
        # Each K/V head serves H / H_kv consecutive query heads: copy it that many times in place, so that
        # row b*H + h of k and v is K/V head h // (H / H_kv) of example b, next to row b*H + h of q.
        k, v = (self._repeat_kv_heads(t).flatten(0, 1) for t in (k, v))  # (B, H, K, d) -> (B*H, K, d)
        if valid_lens is not None:
            # Row b*H + h of q is head h of example b, so each length is repeated H times in place.
            valid_lens = torch.repeat_interleave(valid_lens, repeats=H, dim=0)  # (B*H,) or (B*H, Q)
        output = self.attention(q, k, v, valid_lens, fold_heads(mask, batch, H))  # (B*H, Q, d)
        self.attention_weights = self.attention.attention_weights.unflatten(0, (batch, H))  # (B, H, Q, K)
        if head_mask is not None:
            gates = head_mask.to(output).repeat(batch)  # (B*H,): entry b*H + h is head_mask[h]
            output = output * gates[:, None, None]  # (B*H, Q, d)
        return self.W_o(transpose_output(output, H))  # (B, Q, num_hiddens)

    def _fused_forward(self, q, k, v, valid_lens, mask, head_mask, is_causal=False):
        """The same computation through ``F.scaled_dot_product_attention`` on q (B, H, Q, d), k, v (B, H_kv, K, d)."""
        H = self.num_heads
        keep = as_4d(combine_masks(valid_lens, mask, k.shape[2], device=q.device))  # ~(B, H, Q, K), or None
        dropout_p = self.attention.dropout if self.training else 0.0
        grouped = self.num_kv_heads != H
        if grouped and not _SDPA_HAS_GQA:  # an older PyTorch: share the K/V heads by hand, as the step path does
            k, v, grouped = self._repeat_kv_heads(k), self._repeat_kv_heads(v), False  # (B, H, K, d)
        # enable_gqa: SDPA itself lets query head h read K/V head h // (H / H_kv), without copying k and v.
        extra = {"enable_gqa": True} if grouped else {}
        output = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=dropout_p, is_causal=is_causal, **extra
        )  # (B, H, Q, d)
        # Some fused kernels (PyTorch's CPU flash kernel) turn a NaN query into a finite row; the step path gives
        # NaN, and so must this one: bad input should show, not vanish.
        output = output.masked_fill(q.isnan().any(dim=-1, keepdim=True), float("nan"))
        if keep is not None:
            has_key = keep.any(dim=-1, keepdim=True)  # (B or 1, H or 1, Q or 1, 1)
            if not bool(has_key.all()):  # same rule as masked_softmax: no visible key -> zeros
                output = output.masked_fill(~has_key, 0.0)
        if head_mask is not None:
            output = output * head_mask.to(output)[:, None, None]  # (B, H, Q, d)
        self.attention_weights = None
        return self.W_o(output.transpose(1, 2).flatten(2))  # (B, Q, H*d) -> (B, Q, num_hiddens)

    def _no_heads(self, queries, num_keys, need_weights):
        batch, num_queries = queries.shape[:2]
        output = queries.new_zeros(batch, num_queries, self.W_o.out_features)  # (B, Q, num_hiddens)
        if self.W_o.bias is not None:
            output = output + self.W_o.bias
        self.attention_weights = queries.new_zeros(batch, 0, num_queries, num_keys) if need_weights else None
        return output

    def prune_heads(self, heads) -> None:
        """Remove heads for good (notebook 07): see ``prune_attention_heads``."""
        why = "removing a query head cannot remove rows of W_k and W_v that other query heads still read"
        validate.plain_heads_only("prune_heads", self.num_heads, self.num_kv_heads, why)
        prune_attention_heads(self, heads)


@torch.no_grad()
def prune_attention_heads(layer, heads) -> None:
    """Remove heads from a ``MultiHeadAttention`` for good: their rows of ``W_q``, ``W_k``, ``W_v``
    and their columns of ``W_o``.

    ``heads`` are the heads' original numbers (0 .. num_heads-1 at construction), so pruning in
    several steps needs no renumbering; ``layer.head_ids`` lists the heads still present. The output
    bias stays: pruning every head leaves a layer that returns only that bias. A pruned layer computes
    exactly what the unpruned one does with those heads' ``head_mask`` entries set to 0.
    """
    validate.attention_layer(layer)
    validate.plain_heads_only(
        "prune_attention_heads", layer.num_heads, getattr(layer, "num_kv_heads", None), "a K/V head is shared"
    )
    original = len(layer.head_ids) + len(layer.pruned_heads)
    heads = validate.head_numbers(heads, layer.head_ids, original)
    d = layer.head_size
    keep = [i for i, h in enumerate(layer.head_ids) if h not in heads]  # current positions to keep
    rows = [torch.arange(i * d, (i + 1) * d) for i in keep]  # head i owns features i*d .. (i+1)*d
    rows = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    rows = rows.to(layer.W_q.weight.device)
    layer.W_q, layer.W_k, layer.W_v = (_select(w, rows, dim=0) for w in (layer.W_q, layer.W_k, layer.W_v))
    layer.W_o = _select(layer.W_o, rows, dim=1)
    layer.pruned_heads = sorted([*layer.pruned_heads, *heads])
    layer.head_ids = [layer.head_ids[i] for i in keep]
    layer.num_heads = len(keep)


def _select(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping only the output rows (dim=0) or input columns (dim=1) in ``index``."""
    weight = linear.weight.index_select(dim, index)  # (out', in) or (out, in')
    with warnings.catch_warnings():  # a zero-width layer (every head pruned) has nothing to initialise
        warnings.simplefilter("ignore", UserWarning)
        new = nn.Linear(*weight.shape[::-1], bias=linear.bias is not None, device=weight.device, dtype=weight.dtype)
    new.weight.copy_(weight)
    if linear.bias is not None:
        new.bias.copy_(linear.bias.index_select(0, index) if dim == 0 else linear.bias)
    return new


class AddNorm(nn.Module):
    """The post-norm transformer sublayer: LayerNorm(X + Dropout(Y)).

    ``eps`` is LayerNorm's guard against dividing by zero: PyTorch's default 1e-5, BERT-style
    models 1e-12 (their weights only reproduce with theirs).
    """

    def __init__(self, norm_shape, dropout: float = 0.0, eps: float = 1e-5):
        super().__init__()
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
            raise ValueError(f"eps must be a positive number, got {eps!r}")
        validate.add_norm_config(norm_shape, dropout)
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(norm_shape, eps=eps)

    def forward(self, X, Y):
        validate.add_norm_inputs(X, Y, self.ln.normalized_shape)
        return self.ln(X + self.dropout(Y))
