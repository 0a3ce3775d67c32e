"""Tiny transformers built from the package's own parts (notebook 05).

Three shapes of model, all made of the same pieces -- ``MultiHeadAttention``,
the post-norm ``AddNorm`` sublayer, a position-wise MLP and positional
embeddings (learned by default; ``ModelConfig.position`` also offers the fixed
sinusoidal table and rotary positions):

* ``TransformerEncoder``  (kind ``"encoder"``): bidirectional self-attention,
  one prediction per input position.
* ``TransformerDecoder``  (kind ``"decoder"``): causal self-attention, a
  next-token predictor.
* ``TransformerEncoderDecoder`` (kind ``"encoder_decoder"``): an encoder, and
  a decoder with causal self-attention followed by cross-attention to the
  encoder's output.

Every model exposes its attention layers in one fixed order, the order of the
rows of ``head_mask`` (num_attention_layers, num_heads)::

    enc.0.self, enc.1.self, ...,  dec.0.self, dec.1.self, ...,  dec.0.cross, dec.1.cross, ...

that is, all encoder self-attention layers, then all decoder self-attention
layers, then all decoder cross-attention layers. ``model.attention_layers()``
lists them as (name, module) pairs, and after a forward pass
``model.attention_weights()`` returns (name, weights (B, H, Q, K)) in the same
order. ``head_mask[i, h]`` scales head h of the i-th layer before its ``W_o``
(0 switches the head off); it is differentiable, so dL/d head_mask measures how
much the loss depends on each head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from ..core import _validate as validate
from ..core.kv_cache import KVCache
from ..core.masks import causal_mask
from ..core.mha import MultiHeadAttention
from . import _validate_model as validate_model
from .blocks import Block, Embedding, PositionWiseFFN  # noqa: F401 (re-exported: notebook 05 imports them from here)

__all__ = [
    "ModelConfig",
    "TinyTransformer",
    "TransformerDecoder",
    "TransformerEncoder",
    "TransformerEncoderDecoder",
    "build_model",
    "count_parameters",
]

KINDS = ("encoder", "decoder", "encoder_decoder")
LATER_FIELDS = ("position", "rope_base", "num_kv_heads")  # ModelConfig fields newer than the first checkpoints


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of a tiny transformer; stored inside checkpoints as a plain dict.

    Args:
        kind: ``"encoder"``, ``"decoder"`` or ``"encoder_decoder"``.
        src_vocab_size: tokens the encoder reads (0 for a decoder-only model).
        tgt_vocab_size: tokens the decoder reads, and the classes every model predicts.
        num_hiddens: model width (H * head size).
        num_heads: heads per attention layer (the same in every layer).
        ffn_num_hiddens: hidden width of the position-wise MLP; 0 = attention-only layers.
        num_enc_layers: encoder layers (0 for a decoder-only model).
        num_dec_layers: decoder layers (0 for an encoder-only model).
        max_len: longest sequence (and largest position + 1) the model takes, whatever ``position`` is.
        dropout: dropout in attention weights and sublayers (0 for these tiny tasks).
        bias: whether the attention projections have biases.
        position: ``"learned"`` (a trained embedding per position, the default), ``"sinusoidal"`` (the fixed
            sin/cos table, added the same way) or ``"rope"`` (rotary positions in every self-attention layer).
        rope_base: the base of the rotary frequencies, base^(-2i/d) (used with ``position="rope"``).
        num_kv_heads: key/value heads of every attention layer (grouped-query attention); None = num_heads.

    Checkpoints saved before ``position``, ``rope_base`` and ``num_kv_heads`` existed lack them: the defaults
    are what those models were (learned positions, one K/V head per head).
    """

    kind: str
    src_vocab_size: int
    tgt_vocab_size: int
    num_hiddens: int = 64
    num_heads: int = 4
    ffn_num_hiddens: int = 128
    num_enc_layers: int = 1
    num_dec_layers: int = 0
    max_len: int = 32
    dropout: float = 0.0
    bias: bool = True
    position: str = "learned"
    rope_base: float = 10000.0
    num_kv_heads: int | None = None

    def __post_init__(self):
        validate_model.model_config_fields(self)
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        counts = ("src_vocab_size", "num_enc_layers", "num_dec_layers", "ffn_num_hiddens")
        negative = {name: getattr(self, name) for name in counts if getattr(self, name) < 0}
        if negative:
            raise ValueError(f"sizes and layer counts must be >= 0, got {negative}")
        want_enc = self.kind in ("encoder", "encoder_decoder")
        want_dec = self.kind in ("decoder", "encoder_decoder")
        if want_enc != (self.num_enc_layers > 0) or want_dec != (self.num_dec_layers > 0):
            raise ValueError(
                f"a {self.kind!r} model needs num_enc_layers {'>= 1' if want_enc else '= 0'} and "
                f"num_dec_layers {'>= 1' if want_dec else '= 0'}, got {self.num_enc_layers} and {self.num_dec_layers}"
            )
        if want_enc != (self.src_vocab_size > 0):
            raise ValueError(
                f"src_vocab_size must be {'positive' if want_enc else '0'} for a {self.kind!r} model, "
                f"got {self.src_vocab_size}"
            )
        if self.tgt_vocab_size < 1 or self.max_len < 1 or self.num_hiddens < 1 or self.num_heads < 1:
            raise ValueError(f"sizes must be positive, got {self}")
        if self.num_hiddens % self.num_heads:
            raise ValueError(f"num_hiddens={self.num_hiddens} is not divisible by num_heads={self.num_heads}")
        if self.ffn_num_hiddens < 0:
            raise ValueError(f"ffn_num_hiddens must be >= 0 (0 = no MLP), got {self.ffn_num_hiddens}")
        validate.kv_heads(self.num_kv_heads, self.num_heads)
        validate_model.model_position_sizes(self)

    def to_dict(self) -> dict:
        """The fields as a plain dict; the later fields (``LATER_FIELDS``) only where they differ from their
        defaults, so a model configured as before has the dict (and checkpoints) it always had."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        fields = dataclasses.asdict(self)
        return {k: v for k, v in fields.items() if k not in LATER_FIELDS or v != defaults[k]}

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)

    @property
    def num_attention_layers(self) -> int:
        return self.num_enc_layers + self.num_dec_layers * (2 if self.kind == "encoder_decoder" else 1)


class TinyTransformer(nn.Module):
    """What the three models share: attention-layer bookkeeping and ``head_mask`` handling.

    Token ids outside the vocabulary raise ``ValueError``. Empty input gives empty output: B = 0 or T = 0
    positions give (B, T, tgt_vocab) logits with a zero axis; a source with no visible token (S = 0, or
    ``valid_lens`` 0) is fully masked, so cross-attention contributes only its output bias.
    """

    config: ModelConfig

    def attention_layers(self) -> list[tuple[str, MultiHeadAttention]]:
        """(name, module) for every attention layer, in ``head_mask`` row order."""
        layers = [(f"enc.{i}.self", b.self_attn) for i, b in enumerate(getattr(self, "enc_blocks", []))]
        dec = list(getattr(self, "dec_blocks", []))
        layers += [(f"dec.{i}.self", b.self_attn) for i, b in enumerate(dec)]
        layers += [(f"dec.{i}.cross", b.cross_attn) for i, b in enumerate(dec) if b.cross_attn is not None]
        return layers

    @property
    def num_attention_layers(self) -> int:
        return self.config.num_attention_layers

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def attention_weights(self) -> list[tuple[str, torch.Tensor]]:
        """(name, weights (B, H, Q, K)) of every attention layer from the last forward pass."""
        out = []
        for name, layer in self.attention_layers():
            if layer.attention_weights is None:
                raise RuntimeError(f"layer {name} has no attention weights yet: run a forward pass first")
            out.append((name, layer.attention_weights))
        return out

    def _head_mask_rows(self, head_mask) -> list:
        """Validate ``head_mask`` (L, H) and split it into one (H,) row per attention layer (or Nones)."""
        L, H = self.num_attention_layers, self.num_heads
        if head_mask is None:
            return [None] * L
        validate.model_head_mask(head_mask, self.attention_layers(), H)
        head_mask = head_mask.to(next(self.parameters()).device)
        # Columns keep the original head numbering; a pruned layer takes only its remaining heads.
        return [
            row if layer.num_heads == H else row[layer.head_ids]  # views/indexing: gradients flow back
            for row, (_, layer) in zip(head_mask.unbind(0), self.attention_layers(), strict=True)
        ]

    def prune_heads(self, heads: dict) -> None:
        """Remove heads for good: ``{layer: [head, ...]}`` with layers as row numbers of ``head_mask``
        or as names from ``attention_layers()`` ("enc.0.self"), heads in their original numbering.

        Each layer's ``MultiHeadAttention.prune_heads`` drops the heads' rows of W_q, W_k, W_v and
        columns of W_o. The pruned model computes what the unpruned one does with those entries of
        ``head_mask`` set to 0; ``head_mask`` keeps its (layers, heads) shape and original numbering.
        """
        layers = self.attention_layers()
        for index, chosen in validate.prune_request(heads, layers, self.num_heads).items():
            layers[index][1].prune_heads(chosen)


class TransformerEncoder(TinyTransformer):
    """Bidirectional encoder with a per-position classifier: (B, T) ids -> (B, T, tgt_vocab) logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.kind != "encoder":
            raise ValueError(f"TransformerEncoder needs kind='encoder', got {cfg.kind!r}")
        self.config = cfg
        self.embedding = Embedding(cfg.src_vocab_size, cfg.num_hiddens, cfg.max_len, cfg.position)
        self.enc_blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_enc_layers))
        self.head = nn.Linear(cfg.num_hiddens, cfg.tgt_vocab_size)

    def forward(self, src, valid_lens=None, head_mask=None):
        """src (B, T); valid_lens (B,) hides padded keys; head_mask (num_enc_layers, H)."""
        rows = self._head_mask_rows(head_mask)
        X = self.embedding(src)  # (B, T, d)
        for block, row in zip(self.enc_blocks, rows, strict=True):
            X = block(X, valid_lens=valid_lens, self_head_mask=row)
        return self.head(X)  # (B, T, tgt_vocab)


class TransformerDecoder(TinyTransformer):
    """Decoder-only (GPT-style) next-token predictor: (B, T) ids -> (B, T, tgt_vocab) logits.

    Position t sees positions 0..t only (``causal_mask``), so logits[:, t]
    predicts token t + 1.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.kind != "decoder":
            raise ValueError(f"TransformerDecoder needs kind='decoder', got {cfg.kind!r}")
        self.config = cfg
        self.embedding = Embedding(cfg.tgt_vocab_size, cfg.num_hiddens, cfg.max_len, cfg.position)
        self.dec_blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_dec_layers))
        self.head = nn.Linear(cfg.num_hiddens, cfg.tgt_vocab_size)

    def forward(self, tokens, head_mask=None, cache=None, token_mask=None, positions=None):  # noqa: PLR0913
        """tokens (B, T) -> logits (B, T, V).

        ``cache`` (a ``KVCache(model)``, notebook 11): the tokens continue the positions the cache has seen, only
        they are computed, and their keys and values are appended. ``token_mask`` (B, T) bool, False = padding
        (left padding, for prompts of different lengths): those keys are hidden and positions count real tokens.
        ``positions`` (T,) or (B, T) in [0, max_len): the tokens' positions, instead of the ones counted so.
        """
        validate_model.decoder_step(self, tokens, cache, token_mask, self.config.max_len)
        validate_model.token_positions(positions, tokens, self.config.max_len)
        rows = self._head_mask_rows(head_mask)
        T, start = tokens.shape[1], 0 if cache is None else cache.length
        keep = token_mask if cache is None else cache.extend(T, token_mask, tokens.shape[0], tokens.device)
        if positions is None and keep is not None:
            positions = (keep.cumsum(dim=1)[:, -T:] - 1).clamp(min=0)  # (B, T): real tokens before, padding 0
        if positions is None and start:
            positions = torch.arange(start, start + T, device=tokens.device)  # (T,)
        X = self.embedding(tokens, positions)  # (B, T, d)
        mask = causal_mask(T, start + T, device=tokens.device)  # (T, K), bottom-right: query i sees keys <= start + i
        if keep is not None:
            mask = mask & keep[:, None, None, :]  # (B, 1, T, K): padded keys hidden too
        for i, (block, row) in enumerate(zip(self.dec_blocks, rows, strict=True)):
            layer_cache = None if cache is None else cache[f"dec.{i}.self"]
            X = block(X, mask=mask, self_head_mask=row, self_cache=layer_cache, positions=positions)
        return self.head(X)  # (B, T, tgt_vocab)


class TransformerEncoderDecoder(TinyTransformer):
    """Encoder + decoder with cross-attention: (src (B, S), tgt_in (B, T)) -> (B, T, tgt_vocab) logits.

    head_mask rows: encoder self-attention layers, then decoder self-attention
    layers, then decoder cross-attention layers.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.kind != "encoder_decoder":
            raise ValueError(f"TransformerEncoderDecoder needs kind='encoder_decoder', got {cfg.kind!r}")
        self.config = cfg
        self.src_embedding = Embedding(cfg.src_vocab_size, cfg.num_hiddens, cfg.max_len, cfg.position)
        self.tgt_embedding = Embedding(cfg.tgt_vocab_size, cfg.num_hiddens, cfg.max_len, cfg.position)
        self.enc_blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_enc_layers))
        self.dec_blocks = nn.ModuleList(Block(cfg, cross=True) for _ in range(cfg.num_dec_layers))
        self.head = nn.Linear(cfg.num_hiddens, cfg.tgt_vocab_size)

    def _split_rows(self, head_mask):
        rows = self._head_mask_rows(head_mask)
        n_enc, n_dec = self.config.num_enc_layers, self.config.num_dec_layers
        return rows[:n_enc], rows[n_enc : n_enc + n_dec], rows[n_enc + n_dec :]

    def encode(self, src, src_valid_lens=None, enc_rows=None):
        """src (B, S) -> memory (B, S, d)."""
        X = self.src_embedding(src)  # (B, S, d)
        for block, row in zip(self.enc_blocks, enc_rows or [None] * len(self.enc_blocks), strict=True):
            X = block(X, valid_lens=src_valid_lens, self_head_mask=row)
        return X

    def decode(self, tgt_in, memory, src_valid_lens=None, self_rows=None, cross_rows=None, cache=None):
        """tgt_in (B, T), memory (B, S, d) -> logits (B, T, tgt_vocab); with a ``KVCache``, T continues it."""
        validate_model.decoder_step(self, tgt_in, cache, None, self.config.max_len)
        n = len(self.dec_blocks)
        self_rows, cross_rows = self_rows or [None] * n, cross_rows or [None] * n
        T, start = tgt_in.shape[1], 0 if cache is None else cache.length
        positions = torch.arange(start, start + T, device=tgt_in.device) if start else None  # (T,)
        X = self.tgt_embedding(tgt_in, positions)  # (B, T, d)
        mask = causal_mask(T, start + T, device=tgt_in.device)  # (T, K), bottom-right
        for i, (block, s_row, c_row) in enumerate(zip(self.dec_blocks, self_rows, cross_rows, strict=True)):
            X = block(
                X,
                mask=mask,
                memory=memory,
                memory_valid_lens=src_valid_lens,
                self_head_mask=s_row,
                cross_head_mask=c_row,
                self_cache=None if cache is None else cache[f"dec.{i}.self"],
                cross_cache=None if cache is None else cache[f"dec.{i}.cross"],
                positions=positions,
            )
        if cache is not None:
            cache.extend(T, None, tgt_in.shape[0], tgt_in.device)
        return self.head(X)

    def forward(self, src, tgt_in, src_valid_lens=None, head_mask=None):
        validate_model.source_and_target(self.config, src, tgt_in)  # both, before the encoder computes
        enc_rows, self_rows, cross_rows = self._split_rows(head_mask)
        memory = self.encode(src, src_valid_lens, enc_rows)
        return self.decode(tgt_in, memory, src_valid_lens, self_rows, cross_rows)

    @torch.no_grad()
    def greedy_decode(
        self, src, num_steps: int, bos_id: int, src_valid_lens=None, head_mask=None, use_cache: bool = False
    ):
        """Predict ``num_steps`` tokens one at a time, feeding back the argmax: -> (B, num_steps) ids.

        Without a cache the decoder reruns the whole prefix at each step, and afterwards ``attention_weights()``
        holds the final step's weights with Q = num_steps queries. ``use_cache=True`` (notebook 11) runs only the
        newest token through a ``KVCache``: the same ids, and weights with Q = 1.
        """
        validate_model.greedy_args(num_steps, bos_id, self.config.tgt_vocab_size)
        validate_model.use_cache_flag(use_cache)
        enc_rows, self_rows, cross_rows = self._split_rows(head_mask)
        memory = self.encode(src, src_valid_lens, enc_rows)  # (B, S, d)
        cache = KVCache(self) if use_cache else None
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        for _ in range(num_steps):
            new = out if cache is None else out[:, cache.length :]  # (B, t) without a cache, (B, 1) with one
            logits = self.decode(new, memory, src_valid_lens, self_rows, cross_rows, cache)  # (B, t or 1, V)
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)  # (B, t + 1)
        return out[:, 1:]  # (B, num_steps), without <bos>


MODEL_CLASSES = {
    "encoder": TransformerEncoder,
    "decoder": TransformerDecoder,
    "encoder_decoder": TransformerEncoderDecoder,
}


def build_model(config: ModelConfig | dict) -> TinyTransformer:
    """A freshly initialised model of the configured kind."""
    validate_model.model_config(config, ModelConfig)
    if isinstance(config, dict):
        config = ModelConfig.from_dict(config)
    return MODEL_CLASSES[config.kind](config)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
