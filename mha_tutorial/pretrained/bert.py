r"""A BERT-style encoder built from the package's own parts (notebook 09).

BERT (Devlin et al., 2019) is the encoder half of the transformer, trained on text and reused everywhere.
Its layers are the post-norm blocks of notebook 05 with three changes: the MLP uses GELU instead of ReLU,
the input adds a *segment* (token type) embedding for sentence pairs, and a LayerNorm follows the embeddings:

.. math::
    X_0 &= \mathrm{LayerNorm}(E^{tok}_{x_t} + E^{pos}_t + E^{seg}_{s_t}) \\
    Y_l &= \mathrm{LayerNorm}(X_{l-1} + \mathrm{MultiHead}(X_{l-1}, X_{l-1}, X_{l-1})) \\
    X_l &= \mathrm{LayerNorm}(Y_l + W_2\, \mathrm{GELU}(W_1 Y_l + b_1) + b_2)

Every LayerNorm uses the checkpoint's eps (1e-12 for BERT models), and the attention is this package's
``MultiHeadAttention`` with a bias on all four projections. Padding enters as a key mask: a padded token is
never attended to, by any query of any head.

A *sentence embedding* (Sentence-BERT, Reimers & Gurevych, 2019) is the mean of the last hidden states over
the real tokens, scaled to length 1; the cosine of two such vectors is then their dot product.

The attention layers are named ``layer.0`` .. ``layer.{L-1}``; they are the rows of ``head_mask``
(num_layers, num_heads), exactly as for the toy models (``TinyTransformer``), and ``prune_heads`` and
``attention_weights()`` work the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ..core.mha import AddNorm, MultiHeadAttention
from ..models.model import TinyTransformer
from . import _validate_bert as validate

__all__ = ["BertConfig", "BertEncoder", "BertOutput", "mean_pool"]


@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT-style encoder; the defaults are those of all-MiniLM-L6-v2.

    Args:
        vocab_size: WordPiece vocabulary size.
        num_hiddens: model width d (BERT's "hidden size").
        num_heads: attention heads per layer (d must be divisible by it).
        num_layers: encoder layers L.
        ffn_num_hiddens: hidden width of the GELU MLP (BERT's "intermediate size", usually 4 d).
        max_len: learned positions (the longest input).
        type_vocab_size: segment types (2: sentence A and sentence B).
        eps: LayerNorm's epsilon (1e-12 in BERT checkpoints; PyTorch's default is 1e-5).
    """

    vocab_size: int = 30522
    num_hiddens: int = 384
    num_heads: int = 12
    num_layers: int = 6
    ffn_num_hiddens: int = 1536
    max_len: int = 512
    type_vocab_size: int = 2
    eps: float = 1e-12

    def __post_init__(self):
        validate.bert_config(self)

    @property
    def num_attention_layers(self) -> int:
        return self.num_layers

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class BertOutput:
    """What ``BertEncoder.forward`` returns.

    last_hidden_state (B, T, d); pooler_output (B, d): BERT's tanh(W [CLS] + b), unused by sentence
    embeddings; hidden_states: L + 1 tensors (B, T, d), the embeddings' output then every layer's (or None);
    attentions: L tensors (B, H, T, T) of per-head attention weights (or None).
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class BertEmbeddings(nn.Module):
    """Token + position + segment embeddings, then LayerNorm: (B, T) ids -> (B, T, d)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.token = nn.Embedding(cfg.vocab_size, cfg.num_hiddens)
        self.position = nn.Embedding(cfg.max_len, cfg.num_hiddens)
        self.segment = nn.Embedding(cfg.type_vocab_size, cfg.num_hiddens)
        self.norm = nn.LayerNorm(cfg.num_hiddens, eps=cfg.eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,): 0, 1, ..., T-1
        X = self.token(input_ids) + self.position(positions) + self.segment(token_type_ids)  # (B, T, d)
        return self.norm(X)


class GeluFFN(nn.Module):
    """BERT's position-wise MLP, with the exact GELU x * Phi(x) (Phi: the normal CDF, through erf)."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int):
        super().__init__()
        self.dense1 = nn.Linear(num_hiddens, ffn_num_hiddens)
        self.gelu = nn.GELU()  # approximate="none": erf, not the tanh approximation
        self.dense2 = nn.Linear(ffn_num_hiddens, num_hiddens)

    def forward(self, X):
        return self.dense2(self.gelu(self.dense1(X)))  # (B, T, d) -> (B, T, ffn) -> (B, T, d)


class BertLayer(nn.Module):
    """X -> AddNorm(X, SelfAttn(X)) -> AddNorm(., FFN(.)): one post-norm encoder layer."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        d = cfg.num_hiddens
        self.self_attn = MultiHeadAttention(d, cfg.num_heads, bias=True)  # bias on W_q, W_k, W_v and W_o
        self.norm1 = AddNorm(d, eps=cfg.eps)
        self.ffn = GeluFFN(d, cfg.ffn_num_hiddens)
        self.norm2 = AddNorm(d, eps=cfg.eps)

    def forward(self, X, keep=None, head_mask=None, need_weights: bool = True):
        """X (B, T, d); keep (B, 1, 1, T) bool, True = a real token; head_mask (H,) -> (B, T, d)."""
        Y = self.norm1(X, self.self_attn(X, X, X, mask=keep, head_mask=head_mask, need_weights=need_weights))
        return self.norm2(Y, self.ffn(Y))


class BertPooler(nn.Module):
    """BERT's pooler: tanh(W h_[CLS] + b), trained for next-sentence prediction: (B, T, d) -> (B, d)."""

    def __init__(self, num_hiddens: int):
        super().__init__()
        self.dense = nn.Linear(num_hiddens, num_hiddens)

    def forward(self, X):
        return torch.tanh(self.dense(X[:, 0]))


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The mean of the token vectors over the real tokens: hidden (B, T, d), attention_mask (B, T) -> (B, d).

    Padded positions (mask 0) count neither in the sum nor in the number of tokens.
    """
    validate.pooling_inputs(hidden, attention_mask)
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1): 1 for a real token, 0 for padding
    counts = weights.sum(dim=1).clamp_min(1e-9)  # (B, 1); the clamp only matters for an all-padding row
    return (hidden * weights).sum(dim=1) / counts  # (B, d)


class BertEncoder(TinyTransformer):
    """A BERT-style encoder: (B, T) token ids -> ``BertOutput`` (hidden states, attention weights).

    ``head_mask`` (num_layers, num_heads) scales head h of layer l before its ``W_o`` (0 switches it off);
    ``prune_heads({layer: [heads]})`` removes heads for good (layers as numbers or names "layer.3").
    """

    def __init__(self, cfg: BertConfig):
        super().__init__()
        if not isinstance(cfg, BertConfig):
            raise TypeError(f"BertEncoder needs a BertConfig, got {type(cfg).__name__}")
        self.config = cfg
        self.embedding = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))
        self.pooler = BertPooler(cfg.num_hiddens)

    def attention_layers(self) -> list[tuple[str, MultiHeadAttention]]:
        """(name, module) for every attention layer, in ``head_mask`` row order."""
        return [(f"layer.{i}", layer.self_attn) for i, layer in enumerate(self.layers)]

    def forward(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        head_mask=None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> BertOutput:
        """input_ids (B, T); attention_mask (B, T) 1 = real token, 0 = padding (None: no padding);
        token_type_ids (B, T) segment of each token (None: all 0); head_mask (num_layers, num_heads).

        Without ``output_attentions`` the layers take the fused attention path (no weights kept).
        """
        validate.encoder_inputs(self.config, input_ids, attention_mask, token_type_ids)  # before any arithmetic
        rows = self._head_mask_rows(head_mask)  # validates head_mask; one (H,) row (or None) per layer
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)  # a single sentence: segment A everywhere
        keep = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        X = self.embedding(input_ids, token_type_ids)  # (B, T, d)
        hidden = [X]
        for layer, row in zip(self.layers, rows, strict=True):
            X = layer(X, keep, row, need_weights=output_attentions)  # (B, T, d)
            hidden.append(X)
        return BertOutput(
            last_hidden_state=X,
            pooler_output=self.pooler(X),
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(w for _, w in self.attention_weights()) if output_attentions else None,
        )

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, head_mask=None, normalize: bool = True):
        """Sentence embeddings (B, d): mean of the last hidden states over real tokens, unit length if
        ``normalize`` (as the all-MiniLM-L6-v2 model card does)."""
        out = self(input_ids, attention_mask, token_type_ids, head_mask)
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask  # (B, T)
        sentence = mean_pool(out.last_hidden_state, mask)  # (B, d)
        return F.normalize(sentence, p=2, dim=-1) if normalize else sentence
