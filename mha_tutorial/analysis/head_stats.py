r"""Per-head numbers and a name for what each head does (notebooks 06 and 07).

``head_stats`` / ``role_labels`` / ``stats_table`` / ``plot_head_stats``: per-head numbers as (layers, heads)
tensors, a role for each head, a table and a bar chart of them.
``pattern_scores`` (the task's own patterns) lives in ``_head_patterns`` and is re-exported here.

Conventions. Masks are bool with True = "may attend" (as in ``core/masks.py``). A
query row *counts* in a statistic when its position is a real token (not
padding) and it has at least two visible keys: with one visible key the softmax
has no choice to make (its weight is 1 whatever the head does) and the
normalised entropy below would be 0/0.

Statistics, for a counted row i with weights :math:`w_{ij}` over its
:math:`n_i` visible keys, averaged over all counted rows of all examples:

.. math::

    \text{entropy} = \frac{-\sum_j w_{ij}\log w_{ij}}{\log n_i} \in [0, 1],\qquad
    \text{distance} = \sum_j w_{ij}\,|i - j|,\qquad
    \text{confidence} = \max_j w_{ij}.

Entropy 1 is a uniform spread over the visible keys, 0 all weight on one key.
Distance needs queries and keys on the same sequence, so it is NaN for
cross-attention layers.

Pruned models. Tables keep the shape (layers, heads) and the original head
numbering of ``head_mask``: a head that ``prune_heads`` removed gets NaN in
every statistic, and the role ``n/a``.
"""

from __future__ import annotations

import math

import torch

from ..models import _validate_experiments as validate
from ..models.tasks import get_task
from ._head_patterns import PATTERN_SCORES as PATTERN_SCORES
from ._head_patterns import pattern_scores
from .maps import _forward, _LayerMasks, layer_masks

__all__ = ["head_stats", "normalized_entropy", "pattern_scores", "plot_head_stats", "role_labels", "stats_table"]


# =====================================================================================================
# statistics of any head
# =====================================================================================================
def normalized_entropy(
    weights: torch.Tensor, keep: torch.Tensor, query_real: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Mean normalised entropy per head: weights (B, H, Q, K), keep (B, Q, K) bool -> (H,).

    Row i counts when it has at least two visible keys (and is a real query); its entropy
    :math:`-\sum_j w_{ij} \log w_{ij}` (0 log 0 = 0) is divided by :math:`\log n_i`, the entropy of
    a uniform spread over its :math:`n_i` visible keys. The mean is over all counted rows.
    """
    validate.entropy_inputs(weights, keep, query_real)
    if weights.dim() != 4 or keep.shape != (weights.shape[0], *weights.shape[2:]):
        raise ValueError(
            f"weights must be (B, H, Q, K) and keep (B, Q, K); got {tuple(weights.shape)} and {tuple(keep.shape)}"
        )
    rows = _counted_rows(keep, query_real)  # (B, Q)
    n_vis = keep.sum(-1).clamp_min(2).to(weights.dtype)  # (B, Q); rows with < 2 keys are not counted
    ent = -torch.xlogy(weights, weights).sum(-1) / n_vis.log()[:, None]  # (B, H, Q)
    return _mean_over_rows(ent, rows)


def _counted_rows(keep: torch.Tensor, query_real: torch.Tensor | None) -> torch.Tensor:
    rows = keep.sum(-1) >= 2  # (B, Q)
    return rows if query_real is None else rows & query_real


def _mean_over_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x (B, H, Q) averaged over the counted rows (B, Q) -> (H,); NaN when no row counts."""
    r = rows[:, None, :].to(x.dtype)  # (B, 1, Q)
    if not bool(rows.any()):
        return torch.full((x.shape[1],), float("nan"), dtype=x.dtype, device=x.device)
    return (x * r).sum(dim=(0, 2)) / r.sum(dim=(0, 2))


def _offset_score(w: torch.Tensor, keep: torch.Tensor, rows: torch.Tensor, offset: int) -> torch.Tensor:
    """Mean weight of query i on key i + offset, over counted rows where that key is visible -> (H,)."""
    B, H, Q, K = w.shape
    i = torch.arange(Q, device=w.device)
    j = i + offset
    ok = (j >= 0) & (j < K)  # (Q,)
    jj = j.clamp(0, K - 1)
    on = w[:, :, i, jj]  # (B, H, Q)
    visible = keep[:, i, jj] & ok[None] & rows  # (B, Q)
    return _mean_over_rows(on, visible)


def _layer_stats(w: torch.Tensor, m: _LayerMasks) -> dict[str, torch.Tensor]:
    """All statistics of one layer: w (B, H, Q, K) -> {name: (H,)}."""
    H = w.shape[1]
    nan = torch.full((H,), float("nan"), device=w.device)
    rows = _counted_rows(m.keep, m.query_real)  # (B, Q)
    w = w * m.keep[:, None]  # exact zeros where masked (they already are)
    stats = {
        "entropy": normalized_entropy(w, m.keep, m.query_real),
        "confidence": _mean_over_rows(w.amax(-1), rows),
        "first": _mean_over_rows(w[..., 0], rows),
    }
    if m.same_sequence:
        Q, K = w.shape[2:]
        dist = (torch.arange(Q, device=w.device)[:, None] - torch.arange(K, device=w.device)[None]).abs()  # (Q, K)
        stats["distance"] = _mean_over_rows((w * dist).sum(-1), rows)
        stats["self"] = _offset_score(w, m.keep, rows, 0)
        stats["prev"] = _offset_score(w, m.keep, rows, -1)
        stats["next"] = _offset_score(w, m.keep, rows, +1)
    else:
        stats.update(distance=nan, self=nan, prev=nan, next=nan)
    # Redundancy: total-variation distance 1/2 sum_j |w_hj - w_gj| to the most similar other head of the layer.
    tv = 0.5 * (w[:, :, None] - w[:, None, :]).abs().sum(-1)  # (B, H, H, Q)
    tv = torch.stack([_mean_over_rows(tv[:, h], rows) for h in range(H)])  # (H, H)
    tv = tv + torch.diag(torch.full((H,), float("inf"), device=w.device))
    stats["tv_to_nearest"] = tv.amin(dim=1) if H > 1 else nan
    return stats


def _original_heads(w: torch.Tensor, m: _LayerMasks, head_ids: list[int], num_heads: int) -> dict[str, torch.Tensor]:
    """``_layer_stats`` of a layer whose heads ``head_ids`` are left -> {name: (num_heads,)}, NaN for pruned heads."""
    if len(head_ids) == num_heads:
        return _layer_stats(w, m)
    stats = _layer_stats(w, m) if head_ids else {}
    out = {}
    for key in STAT_KEYS:
        out[key] = torch.full((num_heads,), float("nan"), device=w.device)
        if head_ids:
            out[key][head_ids] = stats[key].to(out[key].dtype)
    return out


STAT_KEYS = ("entropy", "distance", "confidence", "first", "self", "prev", "next", "tv_to_nearest")
PATTERN_KEYS = {  # task pattern (from pattern_scores) -> role name
    "reversal": {"anti_diagonal": "anti-diagonal"},
    "induction": {"previous_token": "previous-token", "induction": "induction"},
    "dates": {"field_alignment": "aligned"},
}


def head_stats(model, task_name: str, examples) -> dict[str, torch.Tensor]:
    """Per-head statistics of ``model`` on ``examples``: {name: (num_attention_layers, num_heads) CPU tensor}.

    Always present (rows in ``model.attention_layers()`` order):

    - ``entropy``: mean normalised entropy (1 = uniform over the visible keys, 0 = one key);
    - ``distance``: mean ``|i - j|`` under the weights (NaN for cross-attention);
    - ``confidence``: mean largest weight of a row;
    - ``first``: mean weight on key 0 (the first token, or ``<bos>``);
    - ``self``, ``prev``, ``next``: mean weight on key i, i - 1, i + 1 (NaN for cross-attention);
    - ``tv_to_nearest``: total-variation distance to the most similar other head of its layer (0 = a twin).

    Plus the task's own patterns from ``pattern_scores`` (NaN for layers they do not cover):
    ``anti_diagonal`` (reversal), ``previous_token`` and ``induction`` (induction),
    ``field_alignment`` (dates, cross-attention).

    Rows count as described in the module docstring (real queries with at least two visible keys).
    A pruned model keeps the (layers, heads) shape: NaN for the heads it no longer has.
    """
    task = get_task(task_name)
    validate.model_for_task(model, task)
    examples = validate.examples_for(examples, task, "head_stats")
    device = next(model.parameters()).device
    batch = task.collate(examples, device)
    weights = _forward(model, task, batch)
    masks = layer_masks(model, task_name, batch)
    layers = model.attention_layers()
    names = [name for name, _ in layers]
    per_layer = [_original_heads(weights[name], masks[name], layer.head_ids, model.num_heads) for name, layer in layers]
    out = {key: torch.stack([s[key] for s in per_layer]).float().cpu() for key in STAT_KEYS}
    was_training = model.training
    model.eval()
    try:
        patterns = pattern_scores(model, task.name, examples)
    finally:
        model.train(was_training)
    for key in PATTERN_KEYS[task.name]:
        table = torch.full((len(names), model.num_heads), float("nan"))
        for l, name in enumerate(names):
            if name in patterns[key]:
                table[l] = torch.tensor(patterns[key][name])
        out[key] = table
    return out


GENERIC_ROLES = {"first": "first-token/BOS", "self": "self/diagonal", "prev": "previous-token", "next": "next-token"}


def role_labels(
    stats: dict[str, torch.Tensor],
    pattern_threshold: float = 0.5,
    focus_threshold: float = 0.5,
    diffuse_entropy: float = 0.8,
    redundant_tv: float = 0.15,
) -> list[list[str]]:
    """A name for what each head does, [layer][head], from ``head_stats``'s numbers.

    Rules, first match wins:

    0. ``n/a``: no entropy for this head (NaN): a head pruned from the model, or no query that counts;
    1. a task pattern (anti-diagonal, previous-token, induction, aligned) that gets at least
       ``pattern_threshold`` of the head's weight: the head puts more weight on the pattern's key(s)
       than on all other keys together, several times chance (about 1 / number of visible keys);
    2. a generic position (first-token/BOS, self/diagonal, previous-token, next-token) with at least
       ``focus_threshold`` of the weight;
    3. ``diffuse``: normalised entropy at least ``diffuse_entropy`` (an even spread over half of 20
       keys already gives log 10 / log 20 = 0.77);
    4. ``mixed``: none of these.

    `` (redundant)`` is appended when another head of the same layer attends almost the same way:
    mean total-variation distance below ``redundant_tv`` (their distributions overlap by more than
    85% on average). Every member of such a group is marked: any one of them could stand in for
    the others, which does not mean that all of them can go.
    """
    thresholds = dict(pattern_threshold=pattern_threshold, focus_threshold=focus_threshold)
    validate.role_inputs(stats, {**thresholds, "diffuse_entropy": diffuse_entropy, "redundant_tv": redundant_tv})
    L, H = validate.head_stats_dict(stats)
    patterns = [k for k in stats if k not in STAT_KEYS]
    names = {k: r for task in PATTERN_KEYS.values() for k, r in task.items()}
    labels = []
    for l in range(L):
        row = []
        for h in range(H):

            def best(keys, threshold, l=l, h=h):
                scored = [(float(stats[k][l, h]), k) for k in keys if not math.isnan(float(stats[k][l, h]))]
                scored = [s for s in scored if s[0] >= threshold]
                return max(scored)[1] if scored else None

            if math.isnan(float(stats["entropy"][l, h])):
                role = "n/a"
            elif (k := best(patterns, pattern_threshold)) is not None:
                role = names.get(k, k)
            elif (k := best(GENERIC_ROLES, focus_threshold)) is not None:
                role = GENERIC_ROLES[k]
            elif float(stats["entropy"][l, h]) >= diffuse_entropy:
                role = "diffuse"
            else:
                role = "mixed"
            if float(stats["tv_to_nearest"][l, h]) < redundant_tv:
                role += " (redundant)"
            row.append(role)
        labels.append(row)
    return labels


def stats_table(stats: dict[str, torch.Tensor], layer_names, roles=None, columns=None, decimals: int = 3):
    """A pandas DataFrame with one row per head (index: layer, head) and one column per statistic."""
    import pandas as pd

    L, H = validate.head_stats_dict(stats)
    validate.stats_labels(stats, layer_names, roles, columns)
    validate.table_decimals(decimals)
    columns = list(columns) if columns is not None else list(stats)
    data = {c: stats[c].flatten().tolist() for c in columns}
    if roles is not None:
        data["role"] = [roles[l][h] for l in range(L) for h in range(H)]
    index = pd.MultiIndex.from_tuples([(n, h) for n in layer_names for h in range(H)], names=["layer", "head"])
    return pd.DataFrame(data, index=index).round(decimals)


def plot_head_stats(stats: dict[str, torch.Tensor], layer_names, roles, columns, title: str, thresholds=None):
    """Horizontal bars, one row per head (labelled with its role), one panel per statistic; returns the Figure.

    ``thresholds`` {column: value} draws a dashed line per panel; by default the ``role_labels`` rules:
    0.5 on task patterns and on the generic position scores, 0.8 on entropy. NaN values show as "n/a".
    """
    import matplotlib.pyplot as plt

    L, H = validate.head_stats_dict(stats)
    validate.stats_labels(stats, layer_names, roles, columns)
    validate.stats_plot(roles, columns, title, thresholds)
    patterns = {k for task in PATTERN_KEYS.values() for k in task}
    if thresholds is None:
        thresholds = {"entropy": 0.8, **{k: 0.5 for k in [*patterns, *GENERIC_ROLES]}}
    labels = [f"{layer_names[l]} h{h}: {roles[l][h]}" for l in range(L) for h in range(H)]
    y = list(range(L * H))
    fig, axes = plt.subplots(
        1,
        len(columns),
        figsize=(2.1 * len(columns) + 2.6, 0.26 * L * H + 1.1),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    for i, (ax, col) in enumerate(zip(axes[0], columns, strict=True)):
        values = stats[col].flatten().tolist()
        ax.barh(y, [0.0 if math.isnan(v) else v for v in values], color=f"C{i}", height=0.7)
        for yy, v in zip(y, values, strict=True):
            if math.isnan(v):
                ax.text(0.02, yy, "n/a", va="center", fontsize=8, color="0.4", transform=ax.get_yaxis_transform())
        ax.set_title(col.replace("_", " "), fontsize=9)
        ax.tick_params(labelsize=8)
        if col in ("entropy", "confidence", "first", "self", "prev", "next") or col in patterns:
            ax.set_xlim(0, 1)
        if col in thresholds:
            ax.axvline(thresholds[col], color="0.3", ls="--", lw=0.8)
        for l in range(1, L):
            ax.axhline(l * H - 0.5, color="0.7", lw=0.6)
    axes[0, 0].set_yticks(y, labels)
    axes[0, 0].invert_yaxis()
    fig.suptitle(title, fontsize=10)
    return fig
