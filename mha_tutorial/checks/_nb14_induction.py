"""Exercise 3 of notebook 14: induction scores, their reference loop, the usual slips, and SmolLM2's real case."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ._common import CheckFailed, call, diagnose, expect_tensor

_DT = torch.float64
_TOL32 = dict(atol=1e-6, rtol=1e-5)  # a float32 answer is fine, to its precision
_REAL_PERIOD = 64  # the real model's case: 64 random tokens, then the same 64 again


def induction_loop(weights, period) -> torch.Tensor:
    """(L, H) by loops: per head, the mean over queries i = period .. T-1 of the weight on key i - period + 1."""
    T = weights.shape[-1]
    rows = weights.double().tolist()  # L lists of H lists of T rows of T weights
    return torch.tensor(
        [
            [math.fsum(head[i][i - period + 1] for i in range(period, T)) / (T - period) for head in layer]
            for layer in rows
        ],
        dtype=_DT,
    )


def _offset_mean(w, offset, first):
    """(L, H): the mean over queries i = first .. T-1 of w[..., i, i - offset]; a negative key wraps, as a slip would."""
    i = torch.arange(first, w.shape[-1])
    return w[..., i, i - offset].mean(-1)


def _causal_weights(H, T, g, dtype, spread=3.0):
    """(H, T, T) softmax of random scores under a causal mask; head h's scores scaled differently."""
    scale = spread * torch.rand(H, 1, 1, generator=g, dtype=_DT)  # (H, 1, 1): flat to peaked heads
    scores = torch.randn(H, T, T, generator=g, dtype=_DT) * scale  # (H, T, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, T): True above the diagonal
    return scores.masked_fill(future, -math.inf).softmax(-1).to(dtype)


def _known_heads(period):
    """(1, 3, 2P, 2P): a perfect induction head, a duplicate-token head (key i - P) and a previous-token head."""
    T = 2 * period
    heads = torch.zeros(3, T, T, dtype=_DT)
    for i in range(T):
        heads[0, i, i - period + 1 if i >= period else 0] = 1.0
        heads[1, i, i - period if i >= period else 0] = 1.0
        heads[2, i, max(i - 1, 0)] = 1.0
    return heads[None]


def induction_cases(g):
    """(case, weights (L, H, T, T), period): random heads, a sequence repeated three times, then known heads."""
    cases = []
    for L, H, P, copies, dtype in [(2, 3, 4, 2, _DT), (1, 2, 5, 2, torch.float32), (3, 4, 16, 2, torch.float32),
                                   (2, 2, 3, 3, _DT), (1, 3, 7, 2, _DT)]:  # fmt: skip
        T = P * copies
        w = torch.stack([_causal_weights(H, T, g, dtype) for _ in range(L)])
        cases.append((f"weights ({L}, {H}, {T}, {T}) {str(dtype)[6:]}, period {P} ({copies} copies)", w, P))
    cases.append(("weights (1, 3, 8, 8), period 4: an induction, a duplicate-token and a previous-token head",
                  _known_heads(4), 4))  # fmt: skip
    return cases


def induction_mistakes(w, period):
    """(what is wrong, what it computes) for the slips of induction_score on float64 weights w (L, H, T, T)."""
    P, T = period, w.shape[-1]
    second = f"average over the queries after the first copy, i = period .. T-1 = {P} .. {T - 1}"
    yield ("key i - period holds the same token as query i: that scores a duplicate-token head; an induction head "
           "looks one further, at the token that followed it, key i - period + 1", _offset_mean(w, P, P))  # fmt: skip
    yield (f"query period - 1 = {P - 1} is the first copy's last token and has no earlier occurrence: {second}",
           _offset_mean(w, P - 1, P - 1))  # fmt: skip
    yield (f"you skipped query period = {P}, the second copy's first token: {second}", _offset_mean(w, P - 1, P + 1))
    yield (f"queries before position period have no earlier occurrence (their key index i - period + 1 is negative "
           f"and wraps to a future key): {second}", _offset_mean(w, P - 1, 0))  # fmt: skip
    yield ("key i - 1 is the previous token: that scores a previous-token head; the induction key is i - period + 1",
           _offset_mean(w, 1, P))  # fmt: skip
    i = torch.arange(P, T)
    yield ("you read weights[..., key, query]: rows are queries, so query i's weight on key j is weights[..., i, j]",
           w[..., i - P + 1, i].mean(-1))  # fmt: skip
    yield (f"you summed over the queries: take the mean over the T - period = {T - P} of them",
           w[..., i, i - P + 1].sum(-1))  # fmt: skip
    if T // 2 != P:
        yield (f"you took the period as T // 2 = {T // 2}: the sequence repeats every period = {P} tokens, here "
               f"{T // P} times", _offset_mean(w, T // 2 - 1, T // 2))  # fmt: skip


def expect_scores(got, weights, case):
    """A float tensor of shape (L, H), the weights' dtype, the weights untouched."""
    got = expect_tensor(got, case)
    L, H = weights.shape[:2]
    if tuple(got.shape) != (L, H):
        raise CheckFailed(f"{case}: wrong shape {tuple(got.shape)}, expected one score per head ({L}, {H}): average "
                          "over the queries only (the last two axes are queries and keys)")  # fmt: skip
    if got.dtype != weights.dtype:
        raise CheckFailed(f"{case}: the result is {got.dtype}, expected {weights.dtype}: keep the weights' dtype")
    return got


@torch.no_grad()
def on_smollm(induction_score, model):
    """Run ``model`` on 64 random tokens repeated, compare the learner's scores, and say what they find."""
    P, device = _REAL_PERIOD, next(model.parameters()).device
    V = model.config.vocab_size
    half = torch.randint(V // 10, V // 2, (1, P), generator=torch.Generator().manual_seed(14))  # (1, P) ordinary ids
    ids = torch.cat([half, half], dim=1).to(device)  # (1, 2P): the same P tokens twice
    logits = model(ids, need_weights=True)  # (1, 2P, V)
    weights = torch.stack([b.self_attn.attention_weights[0] for b in model.layers]).float().cpu()  # (L, H, 2P, 2P)
    case = f"SmolLM2's weights {tuple(weights.shape)}, period {P}"
    got = expect_scores(call(induction_score, weights.clone(), P, case=case), weights, case)
    w = weights.double()
    diagnose(got.double(), _offset_mean(w, P - 1, P), induction_mistakes(w, P), case, **_TOL32)
    H = weights.shape[1]
    top = [divmod(int(f), H) for f in got.flatten().argsort(descending=True)[:3]]
    even = sum(1 / (i + 1) for i in range(P, 2 * P)) / P  # a head spreading evenly over keys 0 .. i
    loss = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none").cpu()  # (2P - 1,): position t -> t+1
    return (f"SmolLM2 on {P} random tokens repeated: the top induction scores are "
          + ", ".join(f"layer {l} head {h} {got[l, h]:.2f}" for l, h in top)
          + f" (an even spread: {even:.3f}); next-token loss {loss[: P - 1].mean():.1f} on the first copy, "
          f"{loss[P:].mean():.1f} on the second (a uniform guess: ln {V:,} = {math.log(V):.1f})")  # fmt: skip
