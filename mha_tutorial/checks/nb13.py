"""Checks for the exercises of notebook 13 (grouped-query attention); each reference is written here with loops.

Exercise 1: pool W_k (or W_v) by averaging each group of G = H / H_kv consecutive heads (Ainslie et al. 2023);
``gqa.mha_to_gqa`` and ``gqa._grouped_rows`` are refused; nine slips named. Exercise 2: per group, the mean over its
heads of ||W_h - M_j||_F / ||W_h||_F (``gqa._grouped_rows`` refused; seven slips named); the learner's function then
measures the induction model (and its heads aligned in pairs, if given). Exercise 3: grouped-query attention with no
G-fold copy of K/V: the package's attention, SDPA, repeat_interleave, repeat and any tensor holding G times K's (or
V's) numbers in memory of its own (expand-and-reshape, cat, stack, `@` broadcasting a size-1 axis of k) are refused.
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..core import attention
from ..core.mha import MultiHeadAttention
from ..modern import gqa
from ._common import CheckFailed, call, diagnose, expect_close, expect_tensor, friendly, passed, refusing

__all__ = ["check_group_spread", "check_grouped_attention", "check_pool_kv_heads"]

_DT = torch.float64
_TOL = dict(atol=1e-12, rtol=1e-10)
_GROUPS = (
    "query head h reads K/V head h // G, so group j is the G consecutive heads jG .. (j+1)G - 1 "
    "(the grouping of repeat_interleave)"
)


def _blocks(x, H):  # head h's block of d rows of x (H*d, ...), for h = 0 .. H-1: a list of H tensors (d, ...)
    d = x.shape[0] // H
    return [x[h * d : (h + 1) * d] for h in range(H)]


def _groups(H, H_kv, interleaved=False):  # each group's heads: [[0 .. G-1], ...]; interleaved: [[0, H_kv, ...], ...]
    G = H // H_kv
    if interleaved:
        return [[j + H_kv * g for g in range(G)] for j in range(H_kv)]
    return [[j * G + g for g in range(G)] for j in range(H_kv)]


# Exercise 1: pool the K/V heads
def _pool(x, H, H_kv, *, interleaved=False, how="mean"):  # x (H*d, ...) -> (H_kv*d, ...): each group's mean
    blocks = _blocks(x, H)
    pooled = []
    for heads in _groups(H, H_kv, interleaved):
        total = sum((blocks[h] for h in heads), torch.zeros_like(blocks[0]))  # (d, ...): added one by one
        pooled.append({"mean": total / len(heads), "sum": total, "first": blocks[heads[0]]}[how])
    return torch.cat(pooled)  # (H_kv*d, ...)


def _pool_mistakes(x, H, H_kv, what):  # (what is wrong, what it computes), computed only as far as needed
    d, G = x.shape[0] // H, H // H_kv
    right = _pool(x, H, H_kv)  # (H_kv*d, ...)
    yield (f"the {what} came back unpooled, with all H*d rows: return H_kv*d rows, one block of d per group",
           x)  # fmt: skip
    yield (
        f"the {what}'s groups are interleaved (heads j, j + H_kv, j + 2 H_kv, ...: h % H_kv, the grouping of "
        f"repeat): {_GROUPS}",
        _pool(x, H, H_kv, interleaved=True),
    )
    yield (f"the {what}'s heads are summed: take the mean of each group's G heads (divide by G)",
           _pool(x, H, H_kv, how="sum"))  # fmt: skip
    yield (f"the {what} holds each group's first head: mean pooling averages all G heads of the group",
           _pool(x, H, H_kv, how="first"))  # fmt: skip
    yield (f"every group of the {what} is the mean of all H heads: average each group's own G heads only",
           torch.cat([sum(_blocks(x, H)) / H] * H_kv))  # fmt: skip
    yield (
        f"the {what}: you averaged G neighbouring rows, unflatten(0, (H_kv, d, G)): head h owns the d consecutive "
        "rows h*d .. (h+1)*d - 1, so a group is G whole blocks of d rows: unflatten(0, (H_kv, G, d)), then average "
        "over the G axis (dim=1)",
        x.unflatten(0, (H_kv * d, G)).mean(1),
    )
    yield (
        f"the {what}: you averaged the d rows inside each head (one row per head is left): keep a head's d rows "
        "and average over the G heads of a group, row by row (dim=1 of unflatten(0, (H_kv, G, d)))",
        torch.stack([block.mean(0) for block in _blocks(x, H)]),
    )
    yield (
        f"the {what}: you averaged over the d rows of each head as well as over the heads (one row per group is "
        "left): keep the d rows, average only over the G heads",
        torch.stack([block.mean(0) for block in _blocks(right, H_kv)]),
    )
    yield (
        f"the {what}: you expanded the pooled heads back to H heads (what the layer does at run time): return the "
        "H_kv pooled heads only, H_kv*d rows",
        torch.cat([block for block in _blocks(right, H_kv) for _ in range(G)]),
    )


def _pool_shape(what, d):  # when no named mistake fits: explain a wrong shape, else name the first wrong value
    def otherwise(actual, expected, case):
        if tuple(actual.shape) != tuple(expected.shape):
            raise CheckFailed(
                f"{case}: the {what} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}: H_kv blocks "
                f"of d = {d} rows, one per group"
                + (" (the columns, D_in, stay as they are)" if what == "weight" else "")
            )
        expect_close(actual, expected, case, **_TOL)

    return otherwise


_POOL_CASES = [
    ("W (16, 8), b (16,): H = 4 heads of d = 4 -> H_kv = 2", 4, 2, 4, 8),
    ("W (12, 6), b (12,): H = 4 heads of d = 3 -> H_kv = 1 (multi-query)", 4, 1, 3, 6),
    ("W (18, 5), b (18,): H = 6 heads of d = 3 -> H_kv = 2 (G = 3)", 6, 2, 3, 5),
    ("W (8, 4), b (8,): H = 4 heads of d = 2 -> H_kv = 4 (G = 1: nothing to pool)", 4, 4, 2, 4),
]

_POOL_REFUSED = {gqa.mha_to_gqa: "the package's gqa.mha_to_gqa", gqa._grouped_rows: "the package's gqa._grouped_rows"}


def _pooled_pair(got, case):  # the learner's (weight, bias), or a plain message saying what came back instead
    if not (isinstance(got, tuple | list) and len(got) == 2):
        raise CheckFailed(f"{case}: return two tensors, (weight, bias); got {type(got).__name__}")
    for what, t in zip(("weight", "bias"), got, strict=True):
        expect_tensor(t, f"{case} ({what})")
        if t.dtype != _DT:
            raise CheckFailed(f"{case}: the {what} is {t.dtype}, expected {_DT}: keep the input's dtype")
    return got


@friendly
@torch.no_grad()
def check_pool_kv_heads(fn) -> None:
    """``fn(weight, bias, num_heads, num_kv_heads)``: weight (H*d, D_in), bias (H*d,) -> (H_kv*d, D_in), (H_kv*d,)."""
    g = torch.Generator().manual_seed(131)
    for case, H, H_kv, d, D_in in _POOL_CASES:
        weight = torch.randn(H * d, D_in, generator=g, dtype=_DT)  # (H*d, D_in)
        bias = torch.randn(H * d, generator=g, dtype=_DT)  # (H*d,)
        given = weight.clone(), bias.clone()
        with refusing(_POOL_REFUSED):
            got = call(fn, *given, H, H_kv, case=case)
        if not (torch.equal(given[0], weight) and torch.equal(given[1], bias)):
            raise CheckFailed(f"{case}: your function changed its inputs in place; return new tensors")
        for what, actual, x in zip(("weight", "bias"), _pooled_pair(got, case), (weight, bias), strict=True):
            where = f"{case} ({what})"
            mistakes = _pool_mistakes(x, H, H_kv, what)
            diagnose(actual, _pool(x, H, H_kv), mistakes, where, otherwise=_pool_shape(what, d), **_TOL)
    passed("check_pool_kv_heads", len(_POOL_CASES))


# Exercise 2: how far is each head from its group's mean?
def _spread(weight, H, H_kv, *, interleaved=False, scale="own", reduce="mean", centre="group", power=1):
    """Per group (H_kv,) by loops: the mean over its heads h of (||W_h - M_j||_F / ||W_h||_F) ** power. The keywords
    switch on the named slips (``scale`` by ||M_j|| or none, ``reduce`` max or per head, ``centre`` all heads)."""
    blocks = _blocks(weight, H)  # H blocks (d, D_in)
    frobenius = lambda x: math.sqrt(sum(v * v for v in x.flatten().tolist()))  # noqa: E731 -- by a plain loop
    everyone = sum(blocks) / H  # (d, D_in)
    per_group, per_head = [], [0.0] * H
    for heads in _groups(H, H_kv, interleaved):
        mean = sum(blocks[h] for h in heads) / len(heads)  # (d, D_in): M_j
        ratios = []
        for h in heads:
            distance = frobenius(blocks[h] - (mean if centre == "group" else everyone))
            size = {"own": frobenius(blocks[h]), "mean": frobenius(mean), "none": 1.0}[scale]
            ratios.append((distance / size) ** power)
            per_head[h] = ratios[-1]
        per_group.append(max(ratios) if reduce == "max" else sum(ratios) / len(ratios))
    return torch.tensor(per_head if reduce == "head" else per_group, dtype=_DT)


def _spread_mistakes(weight, H, H_kv):
    yield (f"the groups are interleaved (heads j, j + H_kv, ...: h % H_kv): {_GROUPS}",
           _spread(weight, H, H_kv, interleaved=True))  # fmt: skip
    yield (
        "the distances are not normalised: divide ||W_h - M_j||_F by ||W_h||_F, the head's own size, so that the "
        "spread is a fraction (0: the head is its group's mean)",
        _spread(weight, H, H_kv, scale="none"),
    )
    yield (
        "you divided by ||M_j||_F, the size of the group's mean: divide by ||W_h||_F, each head's own size "
        "(two heads W and -W have the mean 0)",
        _spread(weight, H, H_kv, scale="mean"),
    )
    yield ("you took the largest ratio of each group: average the G ratios of its heads",
           _spread(weight, H, H_kv, reduce="max"))  # fmt: skip
    yield (
        "you measured each head's distance to the mean of all H heads: the centre is its own group's mean M_j, "
        "the block that mean pooling puts in its place",
        _spread(weight, H, H_kv, centre="all"),
    )
    yield (
        "the ratios are squared: the Frobenius norm is the square root of the sum of squares "
        "(torch.linalg.matrix_norm, or .norm(dim=(-2, -1)))",
        _spread(weight, H, H_kv, power=2),
    )
    yield ("one number per head, (H,): average the ratios of each group's G heads, one number per group (H_kv,)",
           _spread(weight, H, H_kv, reduce="head"))  # fmt: skip


def _spread_cases(g):  # (case, weight (H*d, D_in), H, H_kv): heads of unequal sizes, then cases of known answer
    cases = []
    for case, H, H_kv, d, D_in in [
        ("W_k (16, 8): H = 4 heads of d = 4, H_kv = 2, heads of unequal sizes", 4, 2, 4, 8),
        ("W_k (18, 5): H = 6 heads of d = 3, H_kv = 2 (G = 3), heads of unequal sizes", 6, 2, 3, 5),
        ("W_k (12, 6): H = 4 heads of d = 3, H_kv = 1 (multi-query), heads of unequal sizes", 4, 1, 3, 6),
        ("W_k (8, 4): H = 4 heads of d = 2, H_kv = 4 (G = 1: every head is its group's mean, spread 0)", 4, 4, 2, 4),
    ]:
        sizes = (0.5 + 1.5 * torch.rand(H, generator=g, dtype=_DT)).repeat_interleave(d)[:, None]  # (H*d, 1)
        cases.append((case, torch.randn(H * d, D_in, generator=g, dtype=_DT) * sizes, H, H_kv))
    head, other = (torch.randn(3, 5, generator=g, dtype=_DT) for _ in range(2))  # (d, D_in) each
    cases.append(("W_k (12, 5): H = 4 -> H_kv = 2, heads 0 and 1 identical, heads 2 and 3 identical (spread 0)",
                  torch.cat([head, head, other, other]), 4, 2))  # fmt: skip
    cases.append(("W_k (6, 5): H = 2 -> H_kv = 1, head 1 = -head 0 (their mean is 0, spread 1)",
                  torch.cat([head, -head]), 2, 1))  # fmt: skip
    rows = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=_DT)).Q.T  # (6, 6): orthonormal rows
    cases.append(("W_k (4, 6): H = 2 -> H_kv = 1, two orthogonal heads of equal norm", rows[:4], 2, 1))
    return cases


def _spread_shape(H, H_kv, d, tol):  # when no named mistake fits: explain a wrong shape, else the first wrong value
    per_row = {(H_kv, d), (H_kv, H // H_kv, d), (H, d)}  # what norms over the last axis alone leave

    def otherwise(actual, expected, case):
        if tuple(actual.shape) != tuple(expected.shape):
            row = tuple(actual.shape) in per_row
            raise CheckFailed(
                f"{case}: the result has shape {tuple(actual.shape)}, expected ({H_kv},): one number per group"
                + (" (a norm per row? a head's Frobenius norm takes both axes of its (d, D_in) block)" if row else "")
            )
        expect_close(actual, expected, case, **tol)

    return otherwise


def _spread_call(fn, weight, H, H_kv, case):
    with refusing({gqa._grouped_rows: "the package's gqa._grouped_rows (form the group means yourself)"}):
        return expect_tensor(call(fn, weight, H, H_kv, case=case), case)


def _qk(layer, h):  # head h's query rows and key rows, each bias as one more column, side by side: (d, 2 (D + 1))
    r = slice(h * layer.head_size, (h + 1) * layer.head_size)
    return torch.cat([torch.cat([lin.weight[r], lin.bias[r, None]], 1) for lin in (layer.W_q, layer.W_k)], 1).to(_DT)


def _measure(fn, trained, aligned):
    """fn on W_k of each attention layer at H_kv = 2, as trained (and aligned in pairs if given), against the loops."""
    rows = []
    second = trained if aligned is None else aligned  # without aligned heads, measure the trained ones only
    for (name, before), (_, after) in zip(trained.attention_layers(), second.attention_layers(), strict=True):
        for h in range(1, before.num_heads, 2) if aligned is not None else ():
            U, _, Vh = torch.linalg.svd(_qk(after, h - 1) @ _qk(after, h).T)  # Procrustes of head h onto h - 1
            if not torch.allclose(U @ Vh, torch.eye(len(U), dtype=_DT), atol=1e-4):
                raise CheckFailed(f"{name}: in the second model, head {h} is not turned onto head {h - 1}: pass "
                                  "a copy whose heads are aligned in pairs")  # fmt: skip
        spreads = []
        for label, layer in (("as trained", before), ("aligned", after))[: 1 if aligned is None else 2]:
            case, weight = f"{name}'s W_k {label}, H = {before.num_heads} -> H_kv = 2", layer.W_k.weight.to(_DT).cpu()
            got = _spread_call(fn, weight.clone(), before.num_heads, 2, case)
            expect_close(got, _spread(weight, before.num_heads, 2), case, atol=1e-6, rtol=1e-5)
            spreads.append((label, got.to(_DT)))
        rows.append((name, spreads))
    return rows


@friendly
@torch.no_grad()
def check_group_spread(fn, trained=None, aligned=None) -> None:
    """``fn(weight, num_heads, num_kv_heads)``: weight (H*d, D_in) -> (H_kv,) float, each group's mean relative spread.
    Given the induction model ``trained`` (and a copy ``aligned`` with its heads turned onto their neighbours in
    pairs), also measure it with ``fn``."""
    g = torch.Generator().manual_seed(132)
    cases = _spread_cases(g)
    for case, weight, H, H_kv in cases:
        given = weight.clone()
        got = _spread_call(fn, given, H, H_kv, case)
        if not torch.equal(given, weight):
            raise CheckFailed(f"{case}: your function changed the weight in place; work on a copy")
        if not got.is_floating_point():
            raise CheckFailed(f"{case}: the result is {got.dtype}: return a float tensor (H_kv,)")
        tol = _TOL if got.dtype == _DT else dict(atol=1e-6, rtol=1e-5)  # a float32 result is fine, to its precision
        expected = _spread(weight, H, H_kv)  # (H_kv,)
        diagnose(got, expected, _spread_mistakes(weight, H, H_kv), case,
                 otherwise=_spread_shape(H, H_kv, weight.shape[0] // H, tol), **tol)  # fmt: skip
    rows = _measure(fn, trained, aligned) if trained is not None else []
    passed("check_group_spread", len(cases))
    if rows:
        two = lambda t: "[" + ", ".join(f"{x:.2f}" for x in t.tolist()) + "]"  # noqa: E731
        print("Your group_spread on the induction model's W_k, H_kv = 2 (one number per group; checked against loops):")
        for name, spreads in rows:
            print(f"  {name}: " + ", ".join(f"{label} {two(s)}" for label, s in spreads))
        turns = "; one computation in other coordinates would give 0 once aligned" if aligned is not None else ""
        print(f"  predictions: identical heads give 0; two unrelated heads of equal norm give 1/sqrt(2) = "
              f"{1 / math.sqrt(2):.3f}{turns}")  # fmt: skip
        before, *after = (torch.cat([s[i][1] for _, s in rows]) for i in range(len(rows[0][1])))
        print(f"  measured: as trained {before.min():.2f} to {before.max():.2f}" + "".join(f"; aligned {a.min():.2f} "
              f"to {a.max():.2f}, lower in every group: {bool((a < before).all())}" for a in after))  # fmt: skip


# Exercise 3: grouped-query attention without copying the K/V heads
def _grouped(q, k, v, *, tiled=False, scale="sqrt", softmax_dim=-1):  # head by head: h reads K/V head h // G
    H, H_kv, d = q.shape[1], k.shape[1], q.shape[-1]
    out = []
    for h in range(H):
        j = h % H_kv if tiled else h // (H // H_kv)
        scores = q[:, h] @ k[:, j].transpose(-1, -2) / {"sqrt": math.sqrt(d), "none": 1.0, "d": d}[scale]  # (B, T, S)
        out.append(scores.softmax(softmax_dim) @ v[:, j])  # (B, T, d)
    return torch.stack(out, dim=1)  # (B, H, T, d)


def _grouped_mistakes(q, k, v):
    G = q.shape[1] // k.shape[1]
    right = _grouped(q, k, v)
    yield (
        "query head h read K/V head h % H_kv: the heads were tiled, what `repeat` (or q.unflatten(1, (G, H_kv))) "
        f"gives, while {_GROUPS}: group the query axis as (H_kv, G), K/V head first",
        _grouped(q, k, v, tiled=True),
    )
    yield (
        "every head is right but they come back in the wrong order: merge the (H_kv, G) axes back into H in that "
        "order (head h = j*G + g), not as (G, H_kv)",
        right.unflatten(1, (-1, G)).transpose(1, 2).flatten(1, 2),
    )
    yield ("the scores are not scaled: divide q k^T by sqrt(d)", _grouped(q, k, v, scale="none"))
    yield ("the scores are divided by d: divide by sqrt(d)", _grouped(q, k, v, scale="d"))
    yield ("the softmax runs over the queries (dim=-2): each query's weights over the keys must sum to 1 (dim=-1)",
           _grouped(q, k, v, softmax_dim=-2))  # fmt: skip


def _grouped_shape(B, H, H_kv, T, d):
    def otherwise(actual, expected, case):
        shape, G = tuple(actual.shape), H // H_kv
        if shape != tuple(expected.shape):
            why = {
                (B, H_kv, G, T, d): ": merge (H_kv, G) back into H, e.g. .flatten(1, 2)",
                (B, H_kv, G * T, d): ": unflatten G*T into (G, T), then merge (H_kv, G) into H",
                (B, T, H, d): ": keep the heads on axis 1, (B, H, T, d), as the queries came",
            }.get(shape, "")
            raise CheckFailed(f"{case}: the result has shape {shape}, expected {tuple(expected.shape)}{why}")
        expect_close(actual, expected, case, **_TOL)

    return otherwise


# (B, H, H_kv, T, S, d): T queries, S keys; T != S and T != d, so no query or score tensor has G times K's size
_GROUPED_CASES = [(2, 4, 2, 3, 5, 4), (1, 6, 2, 2, 4, 3), (2, 4, 1, 3, 6, 2), (1, 6, 3, 1, 7, 4), (2, 3, 3, 2, 3, 2)]
_COPIES = "copies the K/V heads G times; the exercise is to pair each K/V head with its G query heads without a copy"
_GROUPED_REFUSED = {
    attention.scaled_dot_product_attention: "the package's scaled_dot_product_attention",
    attention.masked_softmax: "the package's masked_softmax",
    MultiHeadAttention.forward: "the package's MultiHeadAttention",
    MultiHeadAttention._repeat_kv_heads: f"the package's _repeat_kv_heads, which {_COPIES}",
}
_GROUPED_REFUSED_C = {
    "scaled_dot_product_attention": "PyTorch's scaled_dot_product_attention (write the scores and softmax)",
    "repeat_interleave": f"repeat_interleave, which {_COPIES}",
    "repeat": f"repeat, which {_COPIES}",
}


class _WatchCopies(TorchDispatchMode):
    """Notes the first float tensor an operation returns with G times K's numbers in memory of its own, any rank."""

    def __init__(self, copy_numel: int):
        super().__init__()
        self.copy_numel, self.seen = copy_numel, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for x in result if isinstance(result, tuple | list) else (result,):
            if self.seen is None and isinstance(x, torch.Tensor) and x.is_floating_point():
                own = x.untyped_storage().nbytes() // x.element_size()  # a view of k (expand) holds k's numbers only
                if x.numel() == self.copy_numel and own >= self.copy_numel:
                    self.seen = tuple(x.shape)
        return result


@friendly
@torch.no_grad()
def check_grouped_attention(fn) -> None:
    """``fn(q, k, v)``: q (B, H, T, d), k and v (B, H_kv, S, d) -> (B, H, T, d), query head h reading K/V head h // G."""
    g = torch.Generator().manual_seed(133)
    for B, H, H_kv, T, S, d in _GROUPED_CASES:
        case = f"q ({B}, {H}, {T}, {d}), k and v ({B}, {H_kv}, {S}, {d}): H = {H}, H_kv = {H_kv}, G = {H // H_kv}"
        q = torch.randn(B, H, T, d, generator=g, dtype=_DT)
        k, v = (2 * torch.randn(B, H_kv, S, d, generator=g, dtype=_DT) for _ in range(2))
        given = q.clone(), k.clone(), v.clone()
        watch = _WatchCopies(B * H * S * d)  # G times K's (or V's) numbers
        with refusing(_GROUPED_REFUSED, _GROUPED_REFUSED_C), watch:
            got = expect_tensor(call(fn, *given, case=case), case)
        if watch.seen is not None and H > H_kv:  # with G = 1, k itself has that shape
            raise CheckFailed(f"{case}: your function built a tensor of shape {watch.seen} holding G = {H // H_kv} "
                              "copies of K or V: a G-fold copy (`@` makes one when it broadcasts a size-1 axis of k). "
                              "Lay each group's G*T queries end to end against its K/V head instead")  # fmt: skip
        if not all(torch.equal(a, b) for a, b in zip(given, (q, k, v), strict=True)):
            raise CheckFailed(f"{case}: your function changed q, k or v in place; return a new tensor")
        if got.dtype != _DT:
            raise CheckFailed(f"{case}: the result is {got.dtype}, expected {_DT}: keep the inputs' dtype")
        mistakes = _grouped_mistakes(q, k, v)
        diagnose(got, _grouped(q, k, v), mistakes, case, otherwise=_grouped_shape(B, H, H_kv, T, d), **_TOL)
    passed("check_grouped_attention", len(_GROUPED_CASES))
