r"""A Llama-style decoder built around this package's ``MultiHeadAttention`` (issue 23; SmolLM2 is loaded into it
by ``smollm``).

Each of the ``num_layers`` blocks is *pre-norm*: the input of each sublayer is normalised, the sublayer's output
is added back to the unnormalised stream, so the residual stream X itself is never normalised until the end:

.. math::
    H = X + \mathrm{Attention}(\mathrm{RMSNorm}_1(X)), \qquad
    X' = H + \mathrm{MLP}(\mathrm{RMSNorm}_2(H)),

- RMSNorm (Zhang & Sennrich 2019) rescales each position by its root mean square, with no centring and no bias:
  ``x / sqrt(mean(x^2) + eps) * weight``;
- the MLP is SwiGLU (Shazeer 2020): ``down(silu(gate(x)) * up(x))``, three bias-free linear maps;
- attention is causal, grouped-query (H query heads share H_kv key/value heads) and rotary (q and k turned by
  their positions, layout "half"); no projection has a bias.

After the last block a final RMSNorm, then the output head maps each position to ``vocab_size`` logits. Small
models *tie* that head to the token embedding (the same matrix read in both directions).

``forward(tokens, cache=None)`` takes a ``KVCache(model)`` (notebook 11): each call continues the positions the
cache has seen and projects only its new tokens. ``generate`` is greedy decoding, with or without that cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ..core.kv_cache import KVCache
from ..core.mha import MultiHeadAttention

__all__ = ["LlamaConfig", "LlamaDecoder", "RMSNorm", "SwiGLU"]


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes of a Llama-style decoder (the defaults are SmolLM2-135M's)."""

    vocab_size: int = 49152
    num_hiddens: int = 576  # the residual stream's width D
    num_heads: int = 9  # query heads H; head size d = D / H = 64
    num_kv_heads: int = 3  # key/value heads H_kv: each serves H / H_kv = 3 query heads
    num_layers: int = 30
    ffn_num_hiddens: int = 1536  # the MLP's inner width
    rope_base: float = 100000.0
    eps: float = 1e-5  # RMSNorm's guard against dividing by zero
    tie_embeddings: bool = True  # the output head reuses the token embedding's matrix
    max_len: int = 8192  # the context the model was trained for

    def __post_init__(self):
        sizes = ("vocab_size", "num_hiddens", "num_heads", "num_kv_heads", "num_layers", "ffn_num_hiddens", "max_len")
        for name in sizes:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        for name in ("rope_base", "eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive number, got {value!r}")
        if self.num_hiddens % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide num_hiddens ({self.num_hiddens}), "
                f"and num_kv_heads ({self.num_kv_heads}) must divide num_heads"
            )

    @property
    def head_size(self) -> int:
        return self.num_hiddens // self.num_heads


class RMSNorm(nn.Module):
    """x (..., D) -> x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast back to x's dtype."""

    def __init__(self, num_hiddens: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_hiddens))  # (D,): a gain per feature, no bias

    def forward(self, x):
        xf = x.float()  # (..., D)
        rms_inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return self.weight * (xf * rms_inv).to(x.dtype)  # (..., D)


class SwiGLU(nn.Module):
    """The gated MLP: x (..., D) -> down(silu(gate(x)) * up(x)) (..., D), through an inner width F."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int):
        super().__init__()
        self.gate = nn.Linear(num_hiddens, ffn_num_hiddens, bias=False)  # D -> F
        self.up = nn.Linear(num_hiddens, ffn_num_hiddens, bias=False)  # D -> F
        self.down = nn.Linear(ffn_num_hiddens, num_hiddens, bias=False)  # F -> D

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))  # (..., F) gated elementwise, then back to (..., D)


class LlamaBlock(nn.Module):
    """One pre-norm decoder block: X + Attention(RMSNorm(X)), then + SwiGLU(RMSNorm(.))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.norm1 = RMSNorm(config.num_hiddens, config.eps)
        self.self_attn = MultiHeadAttention(
            config.num_hiddens,
            config.num_heads,
            bias=False,
            num_kv_heads=config.num_kv_heads,
            rope_base=config.rope_base,
        )
        self.norm2 = RMSNorm(config.num_hiddens, config.eps)
        self.mlp = SwiGLU(config.num_hiddens, config.ffn_num_hiddens)

    def forward(self, X, layer_cache=None, head_mask=None, need_weights=False, mask=None):  # noqa: PLR0913
        """X (B, T, D) -> (B, T, D). With ``layer_cache`` the T new positions follow the cached ones;
        ``head_mask`` (H,) scales each query head's output (0 switches it off)."""
        Y = self.norm1(X)  # (B, T, D)
        # need_weights=False: PyTorch's fused attention (the weights are not kept); is_causal hides the future,
        # aligned with the last keys when a cache holds earlier positions; the rotary positions continue it.
        attended = self.self_attn(
            Y, Y, Y, mask=mask, head_mask=head_mask, need_weights=need_weights, is_causal=True, kv_cache=layer_cache
        )  # (B, T, D)
        X = X + attended
        return X + self.mlp(self.norm2(X))  # (B, T, D)


class LlamaDecoder(nn.Module):
    """tokens (B, T) -> logits (B, T, vocab_size): embedding, ``num_layers`` blocks, RMSNorm, output head."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.num_hiddens)  # (V, D)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.num_hiddens, config.eps)
        self.head = nn.Linear(config.num_hiddens, config.vocab_size, bias=False)  # weight (V, D)
        if config.tie_embeddings:
            self.head.weight = self.embedding.weight  # one (V, D) matrix: embedding rows = output rows

    def attention_layers(self) -> list[tuple[str, MultiHeadAttention]]:
        """("dec.i.self", layer i's attention): the names ``KVCache(model)`` keys its layer caches by."""
        return [(f"dec.{i}.self", block.self_attn) for i, block in enumerate(self.layers)]

    def forward(self, tokens, cache: KVCache | None = None, *, head_mask=None, need_weights: bool = False, mask=None):
        """tokens (B, T) integer ids -> logits (B, T, V).

        ``cache`` (a ``KVCache(model)``): the tokens are positions cache.length .. cache.length + T - 1; their keys
        and values are appended to it, so the next call needs only the next tokens.
        ``head_mask`` (num_layers, H): row i scales layer i's query heads (0 switches a head off).
        ``need_weights=True`` keeps every layer's weights (B, H, T, K) in ``layers[i].self_attn.attention_weights``
        (the step-by-step path: slower, the same numbers to float rounding).
        ``mask`` (bool, broadcastable to (B, H, T, K), True = may attend), AND-ed with the causal mask in every layer:
        a sliding window, for example (notebook 14).
        """
        features = self.features(tokens, cache, head_mask=head_mask, need_weights=need_weights, mask=mask)
        return self.head(features)  # (B, T, V)

    def features(self, tokens, cache: KVCache | None = None, *, head_mask=None, need_weights: bool = False, mask=None):
        """tokens (B, T) -> the final normalised states (B, T, D), which the output head turns into logits;
        ``forward``'s arguments. (``generate`` needs the logits of the last position only: it applies the head there.)
        """
        self._check_tokens(tokens, cache)
        self._check_head_mask(head_mask, need_weights)
        X = self.embedding(tokens)  # (B, T, D)
        for i, block in enumerate(self.layers):
            layer_cache = None if cache is None else cache[f"dec.{i}.self"]
            layer_mask = None if head_mask is None else head_mask[i]  # (H,)
            X = block(X, layer_cache, layer_mask, need_weights, mask)  # (B, T, D)
        if cache is not None:
            cache.extend(tokens.shape[1], None, tokens.shape[0], tokens.device)  # the cache has seen T more
        return self.norm(X)  # (B, T, D)

    def _check_tokens(self, tokens, cache) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int32, torch.int64):
            got = type(tokens).__name__ if not isinstance(tokens, torch.Tensor) else f"a {tokens.dtype} tensor"
            raise TypeError(f"tokens must be an int64 or int32 tensor of shape (B, T), got {got}")
        if tokens.dim() != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must have shape (B, T) with T >= 1, got {tuple(tokens.shape)}")
        if tokens.numel() and not (0 <= int(tokens.min()) and int(tokens.max()) < self.config.vocab_size):
            found = (int(tokens.min()), int(tokens.max()))
            raise ValueError(f"token ids must lie in 0 .. {self.config.vocab_size - 1}, got min, max {found}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache(model) or None, got {type(cache).__name__}")
        seen = 0 if cache is None else cache.length
        if seen + tokens.shape[1] > self.config.max_len:
            raise ValueError(f"{seen} cached + {tokens.shape[1]} new positions exceed max_len {self.config.max_len}")

    def _check_head_mask(self, head_mask, need_weights) -> None:
        if not isinstance(need_weights, bool):
            raise TypeError(f"need_weights must be True or False, got {need_weights!r}")
        if head_mask is None:
            return
        heads = [block.self_attn.num_heads for block in self.layers]
        if not isinstance(head_mask, torch.Tensor) or not head_mask.is_floating_point():
            raise TypeError(f"head_mask must be a float tensor (num_layers, H), got {type(head_mask).__name__}")
        if len(set(heads)) != 1 or tuple(head_mask.shape) != (len(heads), heads[0]):
            raise ValueError(
                f"head_mask must have shape (num_layers, H) = ({len(heads)}, {heads[0]}), "
                f"got {tuple(head_mask.shape)}"
                + (
                    ""
                    if len(set(heads)) == 1
                    else f"; the layers have different head counts {heads}: prune or mask, not both"
                )
            )

    @torch.no_grad()
    def generate(self, tokens, max_new_tokens: int, use_cache: bool = True, eos_id: int | None = None):
        """Greedy decoding: tokens (B, T) -> (B, T + n), n <= ``max_new_tokens``, each step the arg-max token.

        Without the cache every step re-runs the whole sequence; with it (the default) the prompt runs once and
        every later step runs only the newest token. ``eos_id``: a row that produced it keeps producing it, and
        decoding stops early once every row has.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if not isinstance(use_cache, bool):
            raise TypeError(f"use_cache must be True or False, got {use_cache!r}")
        if eos_id is not None and (isinstance(eos_id, bool) or not 0 <= eos_id < self.config.vocab_size):
            raise ValueError(f"eos_id must be None or a token id in 0 .. {self.config.vocab_size - 1}, got {eos_id!r}")
        self._check_tokens(tokens, None)
        cache = KVCache(self) if use_cache else None
        out, done = tokens, torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)  # (B, T), (B,)
        for _ in range(max_new_tokens):
            new = out if cache is None else out[:, cache.length :]  # (B, t) without a cache, (B, 1) after step 1
            next_ids = self.head(self.features(new, cache)[:, -1]).argmax(dim=-1)  # (B,): the last position's best
            if eos_id is not None:
                next_ids = next_ids.masked_fill(done, eos_id)  # finished rows stay finished
                done = done | (next_ids == eos_id)
            out = torch.cat([out, next_ids[:, None].to(out.dtype)], dim=1)  # (B, t + 1)
            if eos_id is not None and bool(done.all()):
                break
        return out
