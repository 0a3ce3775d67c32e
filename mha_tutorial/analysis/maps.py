"""Attention maps from a trained model, ready to draw (notebook 06).

* ``collect_attention``: run a model on one example and return every layer's weights (H, Q, K) on the CPU
  with the right labels and keep-masks.
* ``average_attention``: the same maps averaged over many examples, cell by cell over the examples in which
  that cell exists.
* ``layer_masks``: for every attention layer of a batch, what may be attended and which queries are real.
* ``value_weighted_maps``: one layer's maps weighted by what each key sends, ``||alpha_ij v_j W^O_h||``.

Masks are bool with True = "may attend" (as in ``core/masks.py``).
"""

from __future__ import annotations

import datetime
import inspect
from dataclasses import dataclass, field, replace

import torch

from ..core.masks import causal_mask
from ..models import _validate_experiments as validate
from ..models.tasks import FIELD_OF, PAD, get_task, render_date
from .viz import _head_grid, _is_label_list, _per_layer, plot_head_grid

__all__ = [
    "AttentionMaps",
    "average_attention",
    "collect_attention",
    "date_field_labels",
    "layer_masks",
    "value_weighted_maps",
]


@dataclass
class AttentionMaps:
    """Every attention layer's maps for one example (or an average over many), ready to plot.

    weights[l]: (H, Q_l, K_l) CPU tensor; keep[l]: (Q_l, K_l) bool, True = the query may attend;
    query_labels[l] / key_labels[l]: the tokens along the axes; axis_labels[l]: (y label, x label);
    count: how many examples were averaged (1 for one example); head_ids[l]: the original numbers of
    layer l's heads (``MultiHeadAttention.head_ids``: a pruned layer has fewer heads, H_l of them;
    empty = 0, 1, 2, ...).
    """

    layer_names: list[str]
    weights: list[torch.Tensor]
    query_labels: list[list[str]]
    key_labels: list[list[str]]
    keep: list[torch.Tensor]
    axis_labels: list[tuple[str, str]] = field(default_factory=list)
    count: int = 1
    head_ids: list[list[int]] = field(default_factory=list)

    def select(self, *names: str) -> AttentionMaps:
        """Only the layers called ``names`` (e.g. ``maps.select("dec.0.cross")``)."""
        validate.layer_selection(names)
        unknown = [n for n in names if n not in self.layer_names]
        if unknown:
            raise ValueError(f"unknown layers {unknown}; this model has {self.layer_names}")
        idx = [self.layer_names.index(n) for n in names]
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return replace(
            self,
            layer_names=list(names),
            weights=pick(self.weights),
            query_labels=pick(self.query_labels),
            key_labels=pick(self.key_labels),
            keep=pick(self.keep),
            axis_labels=pick(self.axis_labels),
            head_ids=pick(self.head_ids) if self.head_ids else [],
        )

    def relabel(self, query_labels=None, key_labels=None) -> AttentionMaps:
        """The same maps with other axis labels (one list shared by all layers, or one per layer)."""
        L = len(self.layer_names)
        q = self.query_labels if query_labels is None else _per_layer(query_labels, L, "query_labels", _is_label_list)
        k = self.key_labels if key_labels is None else _per_layer(key_labels, L, "key_labels", _is_label_list)
        return replace(self, query_labels=[list(x) for x in q], key_labels=[list(x) for x in k])

    def plot(self, **kwargs):
        """``plot_head_grid`` with this object's weights, labels, masks and layer names; its panels are
        titled with the heads' original numbers (``head_ids``), which differ from 0, 1, 2 in a pruned layer."""
        kwargs.setdefault("axis_labels", self.axis_labels or ("query", "key"))
        call = inspect.signature(plot_head_grid).bind(
            self.weights, self.query_labels, self.key_labels, layer_names=self.layer_names, keep=self.keep, **kwargs
        )
        call.apply_defaults()
        return _head_grid(call.arguments, head_ids=self.head_ids or None)


@dataclass
class _LayerMasks:
    """For one attention layer of a batch: what may be attended, and which queries are real tokens."""

    keep: torch.Tensor  # (B, Q, K) bool, True = may attend
    query_real: torch.Tensor  # (B, Q) bool, True = the query is a real token (not padding)
    same_sequence: bool  # self-attention (queries and keys are positions of one sequence)


def _real_lengths(batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(encoder lengths (B,) or None, decoder lengths (B,) or None) of the real tokens in ``batch``."""
    enc = dec = None
    if batch.src is not None:
        S = batch.src.shape[1]
        enc = (
            batch.valid_lens if batch.valid_lens is not None else torch.full((len(batch),), S, device=batch.src.device)
        )
    if batch.tgt_in is not None:
        dec = batch.tgt_valid_lens  # set by tasks whose decoder side is right-padded
        if dec is None:
            dec = torch.full((len(batch),), batch.tgt_in.shape[1], device=batch.tgt_in.device)
    return enc, dec


def layer_masks(model, task_name: str, batch) -> dict[str, _LayerMasks]:
    """{layer name: masks} for every attention layer of ``model`` on ``batch`` (a ``Task.collate`` result).

    Encoder self-attention: keys beyond ``valid_lens`` are padding. Decoder self-attention: causal.
    Cross-attention: decoder queries, encoder keys (padding beyond ``valid_lens``). A task whose
    decoder side is right-padded (induction) says so in ``batch.tgt_valid_lens``: padded queries are not real tokens (a causal
    mask already keeps real queries off the padded keys).
    """
    validate.model_for_task(model, get_task(task_name))
    validate.task_batch(batch)
    enc_len, dec_len = _real_lengths(batch)
    out = {}
    for name, _ in model.attention_layers():
        part, _, kind = name.split(".")
        if part == "enc":
            S = batch.src.shape[1]
            pos = torch.arange(S, device=batch.src.device)
            real = pos[None] < enc_len[:, None]  # (B, S)
            out[name] = _LayerMasks(real[:, None, :].expand(-1, S, -1), real, True)
        elif kind == "self":
            T = batch.tgt_in.shape[1]
            pos = torch.arange(T, device=batch.tgt_in.device)
            real = pos[None] < dec_len[:, None]  # (B, T)
            keep = causal_mask(T, device=batch.tgt_in.device)[None].expand(len(batch), -1, -1)
            out[name] = _LayerMasks(keep, real, True)
        else:  # cross: decoder queries x encoder keys
            S, T = batch.src.shape[1], batch.tgt_in.shape[1]
            pos = torch.arange(S, device=batch.src.device)
            keep = (pos[None] < enc_len[:, None])[:, None, :].expand(-1, T, -1)  # (B, T, S)
            real = torch.ones(len(batch), T, dtype=torch.bool, device=batch.src.device)
            out[name] = _LayerMasks(keep, real, False)
    return out


def _tokens(task, batch, b: int) -> tuple[list[str] | None, list[str] | None, list[str] | None]:
    """(encoder tokens, decoder input tokens, decoder output tokens) of example ``b`` of ``batch``."""
    src = [task.src_vocab[i] for i in batch.src[b].tolist()] if batch.src is not None else None
    tgt_in = [task.tgt_vocab[i] for i in batch.tgt_in[b].tolist()] if batch.tgt_in is not None else None
    tgt_out = [task.tgt_vocab[i] for i in batch.tgt_out[b].tolist()] if batch.tgt_out is not None else None
    return src, tgt_in, tgt_out


def _forward(model, task, batch):
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            task.forward(model, batch)
        return dict(model.attention_weights())  # {name: (B, H, Q, K)}
    finally:
        model.train(was_training)


def collect_attention(model, task_name: str, example, pad_to: int | None = None) -> AttentionMaps:
    """Run ``model`` on one example; return every layer's weights (on the CPU) with labels and masks.

    Labels. Encoder layers: the source characters; reversal's query rows are labelled with the letter
    that position writes (its target), so a head looks at the right key when row and column labels
    agree. Induction (decoder only): the sequence; the right-padding the batch adds is cut off, since
    no real query can see it. Dates decoder: a query row is labelled with the character that position
    *writes* (its target), a self-attention key with the token the position *reads* (``<bos>`` or the
    previous output), and cross-attention keys with the source characters.

    ``pad_to`` (tasks with padding, i.e. dates): right-pad the source to this many positions, as a
    short example is padded in a batch with longer ones; its padded keys appear masked.

    A pruned model works: a layer's weights have one entry per head left; ``head_ids`` numbers them.
    """
    task = get_task(task_name)
    validate.model_for_task(model, task)
    example = validate.example_for(example, task)
    device = next(model.parameters()).device
    batch = task.collate([example], device)
    if pad_to is not None:
        if batch.valid_lens is None:
            raise ValueError(
                f"task {task_name!r} has no padding (its sequences all have one length): pad_to is not for it"
            )
        validate.pad_to(pad_to, model.config.max_len)
        S = batch.src.shape[1]
        if pad_to < S:
            raise ValueError(f"pad_to={pad_to} is shorter than the example's {S} source characters")
        batch.src = torch.nn.functional.pad(batch.src, (0, pad_to - S), value=task.src_stoi[PAD])
    weights = _forward(model, task, batch)
    masks = layer_masks(model, task_name, batch)
    src, tgt_in, tgt_out = _tokens(task, batch, 0)
    n_dec = int(batch.tgt_valid_lens[0]) if batch.tgt_valid_lens is not None else None  # drop right-padding
    maps = AttentionMaps([], [], [], [], [], [])
    heads = dict(model.attention_layers())
    for name, w in weights.items():
        m = masks[name]
        part, _, kind = name.split(".")
        w, keep = w[0].detach().float().cpu(), m.keep[0].cpu()  # (H, Q, K), (Q, K)
        if part == "enc" and task.model_kind == "encoder":  # one output per position: label it by what it writes
            q, k, axis = tgt_out, src, ("query: writes", "key (source)")
        elif part == "enc":
            q, k, axis = src, src, ("query (source)", "key (source)")
        elif task.model_kind == "decoder":
            w, keep = w[:, :n_dec, :n_dec], keep[:n_dec, :n_dec]
            q, k, axis = tgt_in[:n_dec], tgt_in[:n_dec], ("query", "key")
        elif kind == "self":
            q, k, axis = tgt_out, tgt_in, ("query: writes", "key: reads")
        else:
            q, k, axis = tgt_out, src, ("query: writes", "key (source)")
        maps.layer_names.append(name)
        maps.weights.append(w)
        maps.query_labels.append(list(q))
        maps.key_labels.append(list(k))
        maps.keep.append(keep)
        maps.axis_labels.append(axis)
        maps.head_ids.append(list(heads[name].head_ids))
    return maps


def average_attention(model, task_name: str, examples, batch_size: int = 500) -> AttentionMaps:
    """Every layer's weights averaged over ``examples``, position by position.

    Cell (q, k) is averaged over the examples in which query q is a real token and may attend to
    key k; a cell that exists in no example is masked. Averaging by position only makes sense when
    positions mean the same thing in every example (equal lengths, one format), so pass a
    position-aligned set. Labels are the positions 0, 1, 2, ... (``relabel`` them for the plot).
    A pruned model works as in ``collect_attention``.
    """
    task = get_task(task_name)
    validate.model_for_task(model, task)
    examples = validate.examples_for(examples, task, "average_attention")
    validate.positive_count(batch_size, "batch_size")
    device = next(model.parameters()).device
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, torch.Tensor] = {}
    for i in range(0, len(examples), batch_size):
        batch = task.collate(examples[i : i + batch_size], device)
        weights = _forward(model, task, batch)
        masks = layer_masks(model, task_name, batch)
        for name, w in weights.items():
            m = masks[name]
            cell = (m.keep & m.query_real[:, :, None]).float()  # (B, Q, K): this cell exists in this example
            s = (w * cell[:, None]).sum(0).cpu()  # (H, Q, K)
            c = cell.sum(0).cpu()  # (Q, K)
            if name in sums:  # batches may differ in width (dates): grow to the widest
                Q, K = max(sums[name].shape[1], s.shape[1]), max(sums[name].shape[2], s.shape[2])
                sums[name] = _grow(sums[name], Q, K) + _grow(s, Q, K)
                counts[name] = _grow(counts[name], Q, K) + _grow(c, Q, K)
            else:
                sums[name], counts[name] = s, c
    maps = AttentionMaps([], [], [], [], [], [], count=len(examples))
    heads = dict(model.attention_layers())
    for name in sums:
        c = counts[name]
        mean = sums[name] / c.clamp_min(1)  # (H, Q, K)
        keep = c > 0
        if task.model_kind == "decoder":  # cut the columns and rows no example reaches
            n = int(keep.any(dim=0).nonzero().max()) + 1
            mean, keep = mean[:, :n, :n], keep[:n, :n]
        mean = mean.masked_fill(~keep, float("nan"))
        part, _, kind = name.split(".")
        Q, K = keep.shape
        axis = ("query position", "key position") if kind == "self" else ("output position", "source position")
        maps.layer_names.append(name)
        maps.weights.append(mean)
        maps.query_labels.append([str(i) for i in range(Q)])
        maps.key_labels.append([str(j) for j in range(K)])
        maps.keep.append(keep)
        maps.axis_labels.append(axis)
        maps.head_ids.append(list(heads[name].head_ids))
    return maps


def value_weighted_maps(model, task_name: str, example, layer: str) -> torch.Tensor:
    """How much each key sends each query through each head of one layer (Kobayashi et al., 2020).

    Head h of ``layer`` sends query i the sum over keys j of ``alpha_ij v_j W^O_h``: the weight alpha_ij,
    key j's value v_j = (x_j W^V)[h's d features] and head h's d rows of W^O (row-vector convention;
    ``W_o.weight`` is its transpose, (D, H*d)). Returns the lengths ``||alpha_ij v_j W^O_h||`` as a
    (H, Q, K) CPU float tensor, cropped and laid out as ``collect_attention(...).select(layer)`` (0 where
    alpha is 0, e.g. masked keys). The value bias is included in v_j; W^O's bias, shared by all keys, is not.
    """
    if not isinstance(layer, str):
        raise TypeError(f"layer must be a layer name such as 'enc.1.self', got {type(layer).__name__}")
    mha = dict(model.attention_layers()).get(layer) if hasattr(model, "attention_layers") else None
    if mha is None and hasattr(model, "attention_layers"):
        names = [name for name, _ in model.attention_layers()]
        raise ValueError(f"unknown layer {layer!r}; this model has {names}")
    seen = {}

    def keep_values(module, args, kwargs):  # MultiHeadAttention.forward(queries, keys, values, ...)
        seen["values"] = args[2] if len(args) > 2 else kwargs["values"]  # (B, K, D)

    hook = mha.register_forward_pre_hook(keep_values, with_kwargs=True) if mha is not None else None
    try:
        maps = collect_attention(model, task_name, example)  # validates model, task and example
    finally:
        if hook is not None:
            hook.remove()
    alpha = maps.select(layer).weights[0]  # (H, Q, K)
    H, K, d = alpha.shape[0], alpha.shape[2], mha.head_size
    with torch.no_grad():
        v = mha.W_v(seen["values"][0, :K]).unflatten(-1, (H, d)).transpose(0, 1)  # (H, K, d): v_j per head
        W_o = mha.W_o.weight.unflatten(1, (H, d))  # (D, H, d): W_o[:, h] is head h's slice, transposed
        sent = torch.einsum("hkd,ehd->hke", v, W_o).float().cpu()  # (H, K, D): v_j W^O_h
    return alpha * sent.norm(dim=-1)[:, None, :]  # (H, Q, K): ||alpha_ij v_j W^O_h|| = alpha_ij ||v_j W^O_h||


def _grow(x: torch.Tensor, Q: int, K: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, K - x.shape[-1], 0, Q - x.shape[-2]))


def date_field_labels(fmt: str) -> list[str]:
    """One label per source character of a fixed-width date format, naming its field (``dd.mm.YYYY``)."""
    validate.date_format(fmt, FIELD_OF)
    text, spans = render_date(datetime.date(2000, 10, 20), fmt)  # a date whose fields have their longest widths
    letters = {"year": "Y", "month": "m", "day": "d", "weekday": "w"}
    labels = list(text)
    for name, (start, end) in spans.items():
        for i in range(start, end):
            labels[i] = letters[name]
    return labels
