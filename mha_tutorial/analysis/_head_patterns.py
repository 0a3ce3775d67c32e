"""What each task needs a head to do: the task's own attention patterns, per head (re-exported by ``head_stats``).

``pattern_scores`` measures, for the task of a model, the mean weight its heads put on the keys that the task's
solution needs (the mirrored position for reversal, the previous token and the token after the earlier copy for
induction, the source field being written for dates). Heads keep their original numbering: a pruned head gets NaN.
"""

from __future__ import annotations

import datetime

import torch

from ..models import _validate_experiments as validate
from ..models.tasks import get_task, render_date


@torch.no_grad()
def _reversal_patterns(task, model, examples):
    batch = task.collate(examples, next(model.parameters()).device)
    task.forward(model, batch)
    L = batch.src.shape[1]
    anti = torch.arange(L - 1, -1, -1)  # query i -> key L-1-i
    return {
        "anti_diagonal": {
            name: w[:, :, torch.arange(L), anti].mean(dim=(0, 2)).cpu().tolist()  # (H,)
            for name, w in model.attention_weights()
        }
    }


@torch.no_grad()
def _induction_patterns(task, model, examples):
    """previous_token: weight of query p on key p-1, for p in 1..n-1 (the first run);
    induction: weight of query p on key p-n+1 (the token after the earlier copy), p in n..2n-2.

    The previous-token pattern is measured on the first run because that is
    where it is used: an induction head in the second run looks for the key
    whose *previous* token equals its current one, and those keys all lie in
    the first run. Nothing needs layer 0 to look back one step in the second
    run, and the trained heads' patterns are more diffuse there.
    """
    batch = task.collate(examples, next(model.parameters()).device)
    task.forward(model, batch)
    prev_b, prev_q, prev_k = [], [], []  # (example, query, key) index triples
    ind_b, ind_q, ind_k = [], [], []
    for b, (seq,) in enumerate(examples):
        n = len(seq) // 2
        for p in range(1, n):
            prev_b.append(b), prev_q.append(p), prev_k.append(p - 1)
        for p in range(n, 2 * n - 1):
            ind_b.append(b), ind_q.append(p), ind_k.append(p - n + 1)
    scores = {"previous_token": {}, "induction": {}}
    for name, w in model.attention_weights():  # (B, H, T, T)
        w = w.permute(0, 2, 3, 1)  # (B, T, T, H)
        scores["previous_token"][name] = w[prev_b, prev_q, prev_k].mean(0).cpu().tolist()
        scores["induction"][name] = w[ind_b, ind_q, ind_k].mean(0).cpu().tolist()
    return scores


@torch.no_grad()
def _dates_patterns(task, model, examples):
    """field_alignment: share of a cross-attention query's weight that falls on the source
    characters of the field it is writing (year for y0..y3, month for m0..m1, day for d0..d1),
    averaged over the 8 digit queries; year / month / day: the same for that field's queries only."""
    batch = task.collate(examples, next(model.parameters()).device)
    task.forward(model, batch)
    fields_of_output = ["year"] * 4 + [None] + ["month"] * 2 + [None] + ["day"] * 2  # query t predicts char t
    S = batch.src.shape[1]
    target = torch.zeros(len(examples), task.target_len, S)  # (B, T, S): 1 on the right source span
    for b, (_, iso, fmt) in enumerate(examples):
        _, spans = render_date(datetime.date.fromisoformat(iso), fmt)
        for t, field in enumerate(fields_of_output):
            if field is not None:
                start, end = spans[field]
                target[b, t, start:end] = 1.0
    out = {"field_alignment": {}, "year": {}, "month": {}, "day": {}}
    for name, w in model.attention_weights():
        if not name.endswith(".cross"):
            continue
        on_field = (w.cpu() * target[:, None]).sum(-1)  # (B, H, T): weight on the right source span
        for key in out:
            rows = [t for t, f in enumerate(fields_of_output) if f is not None and key in (f, "field_alignment")]
            out[key][name] = on_field[:, :, rows].mean(dim=(0, 2)).tolist()  # (H,)
    return out


PATTERN_SCORES = {"reversal": _reversal_patterns, "induction": _induction_patterns, "dates": _dates_patterns}


def pattern_scores(model, task_name: str, examples) -> dict[str, dict[str, list[float]]]:
    """{pattern: {layer name: [mean attention weight on that pattern, one per head]}} for the task's own patterns.

    Heads are in their original numbering: a head pruned from the model gets NaN.
    """
    task = get_task(task_name)
    validate.model_for_task(model, task)
    examples = validate.examples_for(examples, task, "pattern_scores")
    scores = PATTERN_SCORES[task_name](task, model, examples)
    layers = dict(model.attention_layers())
    return {
        pattern: {
            name: _by_original_head(values, layers[name].head_ids, model.num_heads) for name, values in by_layer.items()
        }
        for pattern, by_layer in scores.items()
    }


def _by_original_head(values: list[float], head_ids: list[int], num_heads: int) -> list[float]:
    """One value per head still present -> one per original head, NaN for the pruned ones."""
    if len(head_ids) == num_heads:
        return values
    out = [float("nan")] * num_heads
    for value, h in zip(values, head_ids, strict=True):
        out[h] = value
    return out
