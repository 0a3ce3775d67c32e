"""Checks for the exercises of notebook 12 (rotary position embeddings).

Exercise 1: RoPE by hand in the *half* layout (pair i = features i and i + d/2, as GPT-NeoX and Llama code),
after the notebook built the interleaved one. The reference is a loop of explicit 2x2 rotations written here; the
package's ``apply_rope`` and its helpers are refused. Typical slips (interleaved pairs, turning the wrong way,
frequencies base^(-i/d), the positions ignored, the two features of a pair given different angles, angles in
float32 for float64 input, a wrong dtype) are named.

Exercise 2: find the two bugs in a hand-written cached rotary attention step (what they are is left to the
learner: this docstring is readable from the notebook). The reference is the package's ``MultiHeadAttention(rope_base=...)``
over the whole sequence with ``is_causal=True``, fed to the learner's step in chunks; the package's forward pass and
its cache are refused. The untouched buggy step is told only that both bugs remain (naming them would give the
exercise away); once one is fixed, the other is named. The new keys appended unrotated, the values rotated, a
top-left mask, and a cache returned with the wrong shape or unrotated keys are named.

Exercise 3: move W_q and W_k of a layer trained with interleaved RoPE to the package's half layout, by permuting
the rows of each head. The reference is attention with interleaved rotations over the original weights; a
permutation across heads, the inverse permutation, an unpermuted bias, permuted columns and unchanged weights are
named.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.nn import functional as F

from ..core import kv_cache, rope
from ..core.mha import MultiHeadAttention
from ._common import CheckFailed, call, diagnose, expect_close, expect_shape, expect_tensor, friendly, passed, refusing

__all__ = ["check_half_layout_weights", "check_rope_half", "check_rotary_step"]

_DT = torch.float64
_SHUFFLED = [3, 0, 11, 5, 2, 9, 4]  # positions need not be 0..T-1 (a cache's offset, a packed batch)


def _angles(positions, d, base, *, exponent=2.0, sign=1.0, dtype=_DT):
    """The angle table (T, d/2): entry (t, i) is sign * positions[t] * base^(-exponent * i / d), in ``dtype``."""
    theta = torch.tensor([base ** (-exponent * i / d) for i in range(d // 2)], dtype=dtype)  # (d/2,)
    return sign * positions.to(dtype)[:, None] * theta  # (T, d/2)


def _turn_pairs(x, angles, pairs="half"):
    """x (..., T, d) with pair i of row t turned by angles[t, i] (T, d/2), one explicit 2x2 rotation at a time."""
    d, out = x.shape[-1], x.clone().double()
    for t in range(x.shape[-2]):
        for i in range(d // 2):
            a, b = (i, i + d // 2) if pairs == "half" else (2 * i, 2 * i + 1)
            c, s = math.cos(float(angles[t, i])), math.sin(float(angles[t, i]))
            turn = torch.tensor([[c, -s], [s, c]], dtype=_DT)  # (2, 2)
            ab = x[..., t, [a, b]].double()  # (..., 2)
            out[..., t, [a, b]] = ab @ turn.T  # (..., 2): (a, b) -> (c a - s b, s a + c b)
    return out


def _one_angle_per_feature_wrong(x, angles):
    """Half pairs, but feature j turned by angle j // 2 (repeat_interleave, the interleaved spreading)."""
    per_feature = angles.double().repeat_interleave(2, dim=-1)  # (T, d): wrong for the half layout
    a, b = x.double().chunk(2, dim=-1)  # (..., T, d/2) each
    return x.double() * per_feature.cos() + torch.cat([-b, a], dim=-1) * per_feature.sin()


def _rope_cases():
    """(case, shape, positions, base, dtype): leading axes of any number, d = 8, 6, 4, shuffled positions."""
    return [
        ("x (2, 3, 5, 8) float64, positions 0..4, base 10000", (2, 3, 5, 8), torch.arange(5), 10000.0, _DT),
        ("x (7, 6) float64, positions [3, 0, 11, 5, 2, 9, 4], base 100", (7, 6), torch.tensor(_SHUFFLED), 100.0, _DT),
        ("x (2, 7, 8) float64, positions [3, 0, 11, 5, 2, 9, 4], base 10000", (2, 7, 8), torch.tensor(_SHUFFLED),
         10000.0, _DT),
        ("x (2, 4, 3, 4) float32, positions [5, 1, 8], base 10000", (2, 4, 3, 4), torch.tensor([5, 1, 8]), 10000.0,
         torch.float32),
    ]  # fmt: skip


def _rope_mistakes(x, positions, base):
    """(what is wrong, what it computes) for the slips of exercise 1, computed only as far as needed."""
    d, T = x.shape[-1], x.shape[-2]
    right = _angles(positions, d, base)  # (T, d/2)
    yield (
        "you turned the pairs (2i, 2i + 1), the interleaved layout of the notebook: in the half layout pair i "
        "is feature i with feature i + d/2 (x[..., :d/2] and x[..., d/2:])",
        _turn_pairs(x, right, "interleaved"),
    )
    yield (
        "each pair is turned the wrong way (by -m θ_i): (a, b) becomes (a cos - b sin, a sin + b cos), "
        "rotate_half(x) is cat([-x2, x1]), not cat([x2, -x1])",
        _turn_pairs(x, -right),
    )
    yield (
        "the frequencies are base^(-i/d): θ_i = base^(-2i/d) for pair i = 0 .. d/2 - 1 "
        "(torch.arange(0, d, 2) / d gives the exponents 2i/d)",
        _turn_pairs(x, _angles(positions, d, base, exponent=1)),
    )
    if not torch.equal(positions, torch.arange(T)):
        yield (
            "the positions are ignored (0..T-1 used): row t is turned by positions[t] θ_i, and the positions "
            "here are not 0..T-1",
            _turn_pairs(x, _angles(torch.arange(T), d, base)),
        )
    yield (
        "features i and i + d/2 of a pair must share one angle θ_i: spread the d/2 angles over d features with "
        "cat([angles, angles], dim=-1), not repeat_interleave (that is the interleaved layout's spreading)",
        _one_angle_per_feature_wrong(x, right),
    )
    if x.dtype == _DT:
        float32 = _angles(positions, d, base, dtype=torch.float32)  # (T, d/2), rounded to float32
        yield (
            "right only to about 1e-7: the angles (or the frequencies) are computed in float32 for float64 x "
            "(torch.arange(0, d, 2) / d is float32): compute θ and the angles in float64, e.g. with dtype=x.dtype",
            _turn_pairs(x, float32),
        )


@friendly
def check_rope_half(fn) -> None:
    """``fn(x, positions, base=10000.0)``: x (..., T, d), positions (T,) integers -> (..., T, d) in x's dtype."""
    g = torch.Generator().manual_seed(121)
    cases = _rope_cases()
    for case, shape, positions, base, dtype in cases:
        x = torch.randn(*shape, generator=g, dtype=_DT).to(dtype)
        given = x.clone()
        with refusing({rope.apply_rope: "the package's apply_rope", rope._rotate: "the package's rotate (_rotate)",
                       rope._per_feature: "the package's _per_feature"}):  # fmt: skip
            got = call(fn, given, positions.clone(), base, case=case)
        got = expect_tensor(got, case)
        if not torch.equal(given, x):
            raise CheckFailed(f"{case}: your function changed x in place: build a new tensor for the result")
        expect_shape(got, shape, case)
        if got.dtype != dtype:
            raise CheckFailed(f"{case}: the result is {got.dtype}, expected {dtype}: return x's dtype")
        tol = dict(atol=1e-10, rtol=1e-10) if dtype == _DT else dict(atol=1e-5, rtol=1e-4)
        expected = _turn_pairs(x, _angles(positions, shape[-1], base))  # (..., T, d) float64
        diagnose(got.double(), expected, _rope_mistakes(x, positions, base), case, mistake_atol=1e-5, **tol)
    passed("check_rope_half", len(cases))


def _heads(t, H, d):
    """(B, T, H * d) -> (B, H, T, d)."""
    return t.unflatten(-1, (H, d)).transpose(1, 2)


def _step(mha, x_new, k_cache, v_cache, bugs=()):
    """One cached rotary attention step with the mistakes named in ``bugs``; no bugs gives the right answer."""
    H, d, base = mha.num_heads, mha.head_size, mha.rope_base
    P, T = k_cache.shape[2], x_new.shape[1]
    new, restart = torch.arange(P, P + T), torch.arange(T)  # (T,) each
    q, k, v = (_heads(W(x_new), H, d) for W in (mha.W_q, mha.W_k, mha.W_v))  # (B, H, T, d) each
    q = rope.apply_rope(q, restart if "query_restart" in bugs else new, base)
    if "rerotate" in bugs:  # the notebook's buggy step: every key rotated at every call, and returned so
        k_all = rope.apply_rope(torch.cat([k_cache, k], dim=2), torch.arange(P + T), base)
    elif "unrotated_keys" in bugs:
        k_all = torch.cat([k_cache, k], dim=2)
    else:
        k_all = torch.cat([k_cache, rope.apply_rope(k, restart if "key_restart" in bugs else new, base)], dim=2)
    v_all = torch.cat([v_cache, rope.apply_rope(v, new, base) if "rotate_values" in bugs else v], dim=2)
    keep = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=0 if "top_left" in bugs else P)  # (T, P + T)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=None if "no_mask" in bugs else keep)
    return mha.W_o(out.transpose(1, 2).flatten(2)), k_all, v_all  # (B, T, D), (B, H, P + T, d) x 2


_STEP_MISTAKES = [
    (("query_restart", "rerotate"), "both bugs of buggy_rotary_step are still there: the hint's two questions find "
     "them; fix one, run this check again, and it names the other"),
    (("query_restart",), "the new queries are rotated at 0..T-1: after P cached positions they stand at P..P+T-1 "
     "(0..T-1 is right only for the first chunk, where P = 0)"),
    (("rerotate",), "the cached keys are rotated again at every step: they were stored already rotated at their own "
     "positions, so rotate only the T new keys, at P..P+T-1, append them, and return that cache"),
    (("unrotated_keys",), "the new keys are appended unrotated: rotate them at P..P+T-1 (like the queries) before "
     "appending; the cache keeps rotated keys"),
    (("key_restart",), "the new keys are rotated at 0..T-1: after P cached positions they stand at P..P+T-1"),
    (("rotate_values",), "the values are rotated too: rotary positions turn only q and k (they move the scores); v "
     "stays as W_v made it"),
    (("top_left",), "the mask is aligned top-left (tril() of (T, P + T)): new query i is at position P + i and sees "
     "the keys up to P + i, tril(diagonal=P); F.scaled_dot_product_attention's is_causal=True is aligned top-left "
     "too"),
    (("no_mask",), "no causal mask: with T > 1 new tokens, an earlier one must not see the later new keys"),
]  # fmt: skip

_REFUSED = {
    MultiHeadAttention.forward: "the package's MultiHeadAttention forward pass (mha(...))",
    MultiHeadAttention._project: "the package's MultiHeadAttention._project",
    MultiHeadAttention._keys_values: "the package's MultiHeadAttention._keys_values",
    kv_cache.LayerCache.update: "the package's LayerCache (its cached attention)",
}


def _run(fn, mha, x, sizes, case):
    """Feed x (B, T, D) to ``fn`` in chunks of ``sizes`` from empty caches -> out (B, T, D), k_cache, v_cache."""
    B, H, d = x.shape[0], mha.num_heads, mha.head_size
    k_cache, v_cache = x.new_zeros(B, H, 0, d), x.new_zeros(B, H, 0, d)  # (B, H, 0, d): nothing cached yet
    pieces, start = [], 0
    for size in sizes:
        step = f"{case}, the chunk at P = {start}, T = {size}"
        got = call(fn, mha, x[:, start : start + size], k_cache, v_cache, case=step)
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise CheckFailed(f"{step}: return a tuple (out, k_cache, v_cache), got {type(got).__name__}")
        out, k_cache, v_cache = (expect_tensor(t, step) for t in got)
        expect_shape(out, (B, size, x.shape[-1]), f"{step} (out)")
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if tuple(t.shape) != (B, H, start + size, d):
                raise CheckFailed(
                    f"{step}: the returned {name} has shape {tuple(t.shape)}, expected {(B, H, start + size, d)}: "
                    "return the whole cache (B, H, P + T, d), the P cached positions then the T new ones (dim=2)"
                )
        pieces.append(out)
        start += size
    return torch.cat(pieces, dim=1), k_cache, v_cache  # (B, T, D), (B, H, T, d) x 2


def _first_wrong_chunk(sizes, atol, rtol):
    """When no named mistake fits: say which chunk is the first wrong one, pointing at positions if not the first."""

    def otherwise(actual, expected, case):
        start = 0
        for size in sizes if torch.isfinite(actual).all() else ():
            if not torch.allclose(actual[:, start : start + size], expected[:, start : start + size], atol, rtol):
                if start > 0:
                    raise CheckFailed(
                        f"{case}: the first chunk (empty cache, P = 0) is right, but the chunk at P = {start}, "
                        f"T = {size} is not: check the positions: the new queries and keys stand at P..P+T-1, and "
                        "the cached keys are already rotated, each once at its own position"
                    )
                break
            start += size
        expect_close(actual, expected, case, atol=atol, rtol=rtol)

    return otherwise


def _rotary_layer():
    """A seeded float64 MultiHeadAttention(32, 4, rope_base=10000), new at every check (the learner may change it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12)
        return MultiHeadAttention(32, 4, rope_base=10000.0).to(_DT).eval()


@friendly
@torch.no_grad()
def check_rotary_step(fn) -> None:
    """``fn(mha, x_new, k_cache, v_cache)`` -> (out (B, T, D), k_cache (B, H, P+T, d) rotated keys, v_cache)."""
    mha, g = _rotary_layer(), torch.Generator().manual_seed(122)
    H, d, base = mha.num_heads, mha.head_size, mha.rope_base
    x = torch.randn(2, 10, 32, generator=g, dtype=_DT)  # (B, T, D)
    expected = mha(x, x, x, is_causal=True)  # (B, T, D): the whole sequence at once, no cache
    keys, values = _heads(mha.W_k(x), H, d), _heads(mha.W_v(x), H, d)  # (B, H, T, d) each
    cases = [("a prompt of 4, then chunks of 1, 1, 3, 1", [4, 1, 1, 3, 1]), ("chunks of 2, 5, 3", [2, 5, 3])]
    for case, sizes in cases:
        with refusing(_REFUSED):
            out, k_cache, v_cache = _run(fn, mha, x, sizes, case)
        mistakes = ((why, _run(functools.partial(_step, bugs=bugs), mha, x, sizes, case)[0])
                    for bugs, why in _STEP_MISTAKES)  # fmt: skip
        where = f"{case} (out, against the layer over the whole sequence)"
        diagnose(out.double(), expected, mistakes, where, 1e-8, 1e-7, _first_wrong_chunk(sizes, 1e-8, 1e-7))
        unrotated = ("k_cache holds the keys unrotated: store each key rotated once, at its own position, so that a "
                     "later step never rotates the cache again", keys)  # fmt: skip
        where = f"{case} (the returned k_cache, against W_k(x) rotated at 0..9)"
        diagnose(k_cache.double(), rope.apply_rope(keys, torch.arange(10), base), [unrotated], where, 1e-8, 1e-7)
        rotated = ("v_cache holds rotated values: v is never rotated", rope.apply_rope(values, torch.arange(10), base))
        diagnose(v_cache.double(), values, [rotated], f"{case} (the returned v_cache, against W_v(x))", 1e-8, 1e-7)
    passed("check_rotary_step", len(cases))


# =====================================================================================================
# Exercise 3: a checkpoint trained with interleaved RoPE, in the package's half-layout layer
# =====================================================================================================
def _interleaved_attention(weights, x, H):
    """Causal attention with interleaved rotations: ``weights`` {name: (weight, bias)} of W_q, W_k, W_v, W_o."""
    (Wq, bq), (Wk, bk), (Wv, bv), (Wo, bo) = (weights[n] for n in ("W_q", "W_k", "W_v", "W_o"))
    d, T = Wq.shape[0] // H, x.shape[1]
    q, k, v = (_heads(F.linear(x, W, b), H, d) for W, b in ((Wq, bq), (Wk, bk), (Wv, bv)))  # (B, H, T, d)
    pos = torch.arange(T)
    q, k = (_turn_pairs(t, _angles(pos, d, 10000.0), "interleaved") for t in (q, k))  # the checkpoint's layout
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    return F.linear((scores.softmax(-1) @ v).transpose(1, 2).flatten(2), Wo, bo)  # (B, T, D)


def _half_layer_output(weights, converted, x, H):
    """The package's half-layout layer with W_q, W_k from ``converted`` and W_v, W_o as they are -> (B, T, D)."""
    layer = MultiHeadAttention(x.shape[-1], H, bias=True, rope_base=10000.0).to(_DT).eval()
    for name in ("W_q", "W_k", "W_v", "W_o"):
        weight, bias = converted.get(name, weights[name])
        getattr(layer, name).weight.copy_(weight)
        getattr(layer, name).bias.copy_(bias)
    return layer(x, x, x, is_causal=True)  # (B, T, D)


def _layout_mistakes(weights, x, H):
    d = weights["W_q"][0].shape[0] // H
    P = rope.interleaved_to_half(d)
    per_head = torch.cat([h * d + P for h in range(H)])  # (H*d,): P inside every head
    across = rope.interleaved_to_half(H * d)
    slips = [
        ("the weights came back unchanged: the package pairs feature i with i + d/2 in every head, so each head's "
         "rows of W_q and W_k must be reordered by P = interleaved_to_half(d)", lambda W, b: (W, b)),
        ("you reordered all H*d rows with interleaved_to_half(H*d), mixing the heads: apply P = "
         "interleaved_to_half(d) inside each head's block of d rows", lambda W, b: (W[across], b[across])),
        ("you applied the inverse permutation (P.argsort()): the half layer must see x[..., P], the interleaved "
         "features reordered by P itself", lambda W, b: (W[per_head.argsort()], b[per_head.argsort()])),
        ("the bias kept its old order: W x + b is reordered as a whole, so permute the bias like the rows",
         lambda W, b: (W[per_head], b)),
        ("you permuted the columns (the input features): the rotation acts on the outputs of W_q and W_k, i.e. on "
         "their rows", lambda W, b: (W[:, per_head], b)),
    ]  # fmt: skip
    for why, slip in slips:
        converted = {n: slip(*weights[n]) for n in ("W_q", "W_k")}
        yield why, _half_layer_output(weights, converted, x, H)


@friendly
@torch.no_grad()
def check_half_layout_weights(fn) -> None:
    """``fn(weight, bias, num_heads)`` -> (weight, bias): W_q's or W_k's rows reordered for the half layout."""
    g = torch.Generator().manual_seed(123)
    cases = [("D = 32, H = 4 heads of d = 8", 32, 4), ("D = 24, H = 2 heads of d = 12", 24, 2)]
    for case, D, H in cases:
        weights = {n: (torch.randn(D, D, generator=g, dtype=_DT) / math.sqrt(D), torch.randn(D, generator=g,
                   dtype=_DT)) for n in ("W_q", "W_k", "W_v", "W_o")}  # fmt: skip
        x = torch.randn(2, 7, D, generator=g, dtype=_DT)  # (B, T, D)
        converted = {}
        for name in ("W_q", "W_k"):
            W, b = (t.clone() for t in weights[name])
            got = call(fn, W, b, H, case=f"{case}, {name}")
            if not (isinstance(got, tuple | list) and len(got) == 2):
                raise CheckFailed(f"{case}, {name}: return two tensors, (weight, bias); got {type(got).__name__}")
            if not (torch.equal(W, weights[name][0]) and torch.equal(b, weights[name][1])):
                raise CheckFailed(f"{case}, {name}: your function changed its inputs in place; return new tensors")
            expect_shape(expect_tensor(got[0], case), (D, D), f"{case}, {name} weight")
            expect_shape(expect_tensor(got[1], case), (D,), f"{case}, {name} bias")
            converted[name] = (got[0].to(_DT), got[1].to(_DT))
        out = _half_layer_output(weights, converted, x, H)
        expected = _interleaved_attention(weights, x, H)
        diagnose(out, expected, _layout_mistakes(weights, x, H), f"{case} (the half layer's output)", 1e-9, 1e-8)
    passed("check_half_layout_weights", len(cases))
