"""Checks for the exercises of notebook 11 (the KV cache).

Exercise 1: one attention step of a chunk of Q new queries against a cache of P earlier positions, after the
projections. The reference is causal attention over all P + Q positions at once, keeping the last Q rows; the
package's cached attention and its ``causal_mask`` are refused (the learner builds the bottom-right mask). Typical slips (the top-left ``tril()`` mask, no mask, no 1/√d, the new keys
not appended, appending along the wrong axis) are named.

Exercise 3: find the two bugs in a hand-written cached forward pass of a decoder (positions that restart at 0, a
top-left mask: the first T rows of the full causal mask, equal to ``tril()`` of (T, start + T)). The reference is the model without a cache over the whole sequence; the package's cached
``TransformerDecoder.forward`` is refused. Each bug, and forgetting to advance ``cache.length``, is named.

Exercise 2: the bytes of an encoder-decoder's (or a decoder's) cache from its config, transferring notebook 11's
decoder formula to a model with cross-attention. The reference is a real ``KVCache`` filled by the model; the
package's ``KVCache`` and ``cache_bytes`` are refused. Typical slips (no factor 2 for K and V, the cross cache
missing or counted with the target length, the encoder layers counted, 4 bytes for every dtype) are named.
"""

from __future__ import annotations

import functools
import math

import torch

from ..core import kv_cache
from ..core.masks import causal_mask
from ..core.mha import MultiHeadAttention
from ..models.model import ModelConfig, TransformerDecoder, build_model
from ._common import CheckFailed, call, diagnose, expect_shape, expect_tensor, friendly, passed, refusing

__all__ = ["check_cache_size", "check_cached_forward", "check_chunk_step"]

_DT = torch.float64


def _attend(q, k, v, keep):
    """Plain attention in float64: q (B, H, Q, d), k (B, H, K, d), v (B, H, K, dv), keep (Q, K) or None."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Q, K)
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1) @ v  # (B, H, Q, dv)


def _chunk_cases():
    """(case, B, H, P, Q, d, dv): cached positions P, new positions Q; dv differs from d to catch swapped axes."""
    return [
        ("one new token after 5 cached (Q = 1)", 2, 3, 5, 1, 4, 6),
        ("a chunk of 3 after 5 cached", 2, 3, 5, 3, 4, 6),
        ("a prefill: 4 new, nothing cached (P = 0)", 1, 2, 0, 4, 8, 5),
        ("a chunk of 6 after 2 cached (Q > P)", 1, 2, 2, 6, 4, 3),
    ]


_AXES = " (the tensors are (B, H, positions, d): the cache grows along the position axis, dim=2)"

_REFUSED = {
    kv_cache.LayerCache.update: "the package's LayerCache (its cached attention)",
    MultiHeadAttention.forward: "the package's MultiHeadAttention (its cached attention)",
    causal_mask: "the package's causal_mask (build the bottom-right mask yourself, e.g. with tril)",
}


@friendly
def check_chunk_step(fn) -> None:
    """``fn(q, k_cache, v_cache, k_new, v_new)`` -> (out (B, H, Q, dv), k_all (B, H, P+Q, d), v_all (B, H, P+Q, dv))."""
    g = torch.Generator().manual_seed(111)
    cases = _chunk_cases()
    for case, B, H, P, Q, d, dv in cases:
        q, k_new = (torch.randn(B, H, Q, d, generator=g, dtype=_DT) for _ in range(2))
        k_cache = torch.randn(B, H, P, d, generator=g, dtype=_DT)
        v_cache, v_new = (
            torch.randn(B, H, P, dv, generator=g, dtype=_DT),
            torch.randn(B, H, Q, dv, generator=g, dtype=_DT),
        )
        inputs = (q, k_cache, v_cache, k_new, v_new)
        with refusing(_REFUSED):
            got = call(fn, *(x.clone() for x in inputs), case=case, hint=_AXES)
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise CheckFailed(f"{case}: return a tuple (out, k_all, v_all), got {type(got).__name__}")
        out, k_all, v_all = (expect_tensor(x, case) for x in got)
        k, v = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)  # (B, H, P + Q, d or dv)
        if tuple(k_all.shape) == tuple(v.shape) and tuple(v_all.shape) == tuple(k.shape) and d != dv:
            raise CheckFailed(f"{case}: k_all and v_all are swapped: return (out, k_all, v_all) in that order")
        for name, actual, expected in (("k_all", k_all, k), ("v_all", v_all, v)):
            if tuple(actual.shape) != tuple(expected.shape):
                raise CheckFailed(
                    f"{case}: {name} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}: append the "
                    "new positions along the position axis, dim=2 of (B, H, positions, d)"
                )
            diagnose(actual.double(), expected, [], f"{case} ({name}: the cache, then the new positions)")
        expect_shape(out, (B, H, Q, dv), case)
        K = P + Q
        mistakes = [
            ("the mask is aligned top-left (tril of (Q, K)): the new queries are the *last* Q positions, so query i "
             "sees keys up to P + i: tril(diagonal=P) of (Q, K), aligned bottom-right",
             _attend(q, k, v, torch.ones(Q, K, dtype=torch.bool).tril()) if P else None),
            ("each new query must see its own key too: the diagonal is visible (query i sees keys up to P + i, "
             "included)", _attend(q, k, v, torch.ones(Q, K, dtype=torch.bool).tril(K - Q - 1)) if K > Q or Q > 1 else None),
            ("no causal mask: with Q > 1 new queries, an earlier one must not see the later new keys",
             _attend(q, k, v, None) if Q > 1 else None),
            ("the new queries see only the cached keys: append k_new and v_new first, and let each new query see "
             "its own key and the earlier new ones",
             _attend(q, k_cache, v_cache, None) if P else None),
            ("the scores are not scaled by 1/√d",
             _attend(q * math.sqrt(d), k, v, causal_mask(Q, K))),
        ]  # fmt: skip
        diagnose(out.double(), _attend(q, k, v, causal_mask(Q, K)), mistakes, f"{case} (out)", atol=1e-6, rtol=1e-5)
    passed("check_chunk_step", len(cases))


def _size_cases():
    """(case, config, batch, src_len, tgt_len, dtype): decoders and encoder-decoders of unlike sizes."""
    dec = ModelConfig("decoder", 0, 11, num_hiddens=24, num_heads=3, ffn_num_hiddens=0, num_enc_layers=0,
                      num_dec_layers=2, max_len=16)  # fmt: skip
    encdec = ModelConfig("encoder_decoder", 13, 11, num_hiddens=32, num_heads=4, ffn_num_hiddens=16,
                         num_enc_layers=1, num_dec_layers=3, max_len=20)  # fmt: skip
    return [
        ("a decoder, float32 (src_len 5 given, to be ignored)", dec, 2, 5, 7, torch.float32),
        ("an encoder-decoder, source 12, target 5, float32", encdec, 3, 12, 5, torch.float32),
        ("the same encoder-decoder in float64, source 4, target 9", encdec, 1, 4, 9, torch.float64),
        ("the same encoder-decoder in bfloat16, source 17, target 3", encdec, 2, 17, 3, torch.bfloat16),
    ]


@functools.cache
@torch.no_grad()
def _measured(config, batch, src_len, tgt_len, dtype) -> int:
    """The bytes of a real KVCache after the model decoded ``tgt_len`` positions (for a ``src_len`` source)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        model = build_model(config).to(dtype).eval()
    cache = kv_cache.KVCache(model)
    tgt = torch.ones(batch, tgt_len, dtype=torch.long)
    if config.kind == "decoder":
        model(tgt, cache=cache)
    else:
        memory = model.encode(torch.ones(batch, src_len, dtype=torch.long))  # (B, S, d)
        model.decode(tgt, memory, cache=cache)
    return cache.nbytes


@friendly
def check_cache_size(fn) -> None:
    """``fn(config, batch, src_len, tgt_len, dtype)`` -> the cache's bytes (an int)."""
    cases = _size_cases()
    for case, config, batch, src_len, tgt_len, dtype in cases:
        with refusing({kv_cache.KVCache.__init__: "KVCache (build the number from the config)",
                       kv_cache.cache_bytes: "the package's cache_bytes (write the formula)"}):  # fmt: skip
            got = call(fn, config, batch, src_len, tgt_len, dtype, case=case)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, int | float):
            raise CheckFailed(f"{case}: return a number of bytes, got {type(got).__name__}")
        expected = _measured(config, batch, src_len, tgt_len, dtype)
        if got == expected:
            continue
        L, H, d = config.num_dec_layers, config.num_heads, config.num_hiddens // config.num_heads
        size = torch.empty((), dtype=dtype).element_size()
        cross = config.kind == "encoder_decoder"
        per_position = 2 * L * batch * H * d * size  # bytes of K and V for one position in every decoder layer
        mistakes = [
            (expected // tgt_len * (tgt_len + src_len), "a decoder has no source and no cross-attention: ignore "
             "src_len for kind 'decoder'") if not cross else None,
            (expected // size * 4, "4 bytes per number whatever the dtype: use the dtype's element_size()")
            if size != 4 else None,
            (expected // 2, "no factor 2: every layer keeps a key *and* a value per position"),
            (expected * H, "d is the head size, num_hiddens // num_heads: H heads of d features make num_hiddens"),
            (per_position * tgt_len, "the cross-attention caches are missing: each decoder layer also keeps the "
             "keys and values of the src_len source positions") if cross else None,
            (per_position * 2 * tgt_len, "the cross-attention caches hold the source's positions (src_len), not the "
             "target's") if cross and src_len != tgt_len else None,
            (expected // L * (L + config.num_enc_layers), "the encoder's layers keep no cache: the encoder runs once, "
             "and its output is what cross-attention caches") if config.num_enc_layers else None,
        ]  # fmt: skip
        for value, why in filter(None, mistakes):
            if got == value:
                raise CheckFailed(f"{case}: got {got} bytes, expected {expected}: {why}")
        raise CheckFailed(f"{case}: got {got} bytes, a real cache holds {expected}")
    passed("check_cache_size", len(cases))


def _buggy_forward(model, new_tokens, cache, *, restart=False, top_left=False, frozen=False):
    """A cached forward pass with switchable mistakes; the defaults give the right answer."""
    T, start = new_tokens.shape[1], cache.length
    positions = torch.arange(T) if restart else torch.arange(start, start + T)  # (T,)
    X = model.embedding(new_tokens, positions)  # (B, T, d)
    mask = causal_mask(start + T)[:T] if top_left else causal_mask(T, start + T)  # [:T] = tril() of (T, start + T)
    for i, block in enumerate(model.dec_blocks):
        X = block(X, mask=mask, self_cache=cache[f"dec.{i}.self"])
    if not frozen:
        cache.length += T
    return model.head(X)  # (B, T, V)


def _maybe(compute):
    """What a mistake computes, or None where that mistake crashes (it then cannot be the learner's answer)."""
    try:
        return compute()
    except (RuntimeError, ValueError):
        return None


def _chunks(fn, model, tokens, sizes):
    cache, start, pieces = kv_cache.KVCache(model), 0, []
    for size in sizes:
        pieces.append(fn(model, tokens[:, start : start + size], cache))
        start += size
    return torch.cat(pieces, dim=1)  # (B, T, V)


@friendly
@torch.no_grad()
def check_cached_forward(fn) -> None:
    """``fn(model, new_tokens, cache)`` -> logits (B, T_new, V) of a decoder continuing ``cache`` (a KVCache)."""
    from ..models.train import load_pretrained  # here: only this check needs the checkpoint

    model = load_pretrained("induction", device="cpu").eval()
    g = torch.Generator().manual_seed(113)
    tokens = torch.randint(1, model.config.tgt_vocab_size, (2, 14), generator=g)  # (B, T)
    expected = model(tokens)  # (B, T, V): no cache
    cases = [("one chunk of 14 (no cache yet)", [14]), ("a prompt of 5, then one token at a time", [5] + [1] * 9),
             ("a prompt of 4, then chunks of 3, 1, 6", [4, 3, 1, 6])]  # fmt: skip
    for case, sizes in cases:
        with refusing({TransformerDecoder.forward: "the model's own cached forward pass, model(tokens, cache=...)"}):
            got = call(lambda sizes=sizes: _chunks(fn, model, tokens, sizes), case=case)
        got = expect_tensor(got, case)
        mistakes = (
            (why, _maybe(lambda kw=kw, sizes=sizes: _chunks(lambda m, t, c: _buggy_forward(m, t, c, **kw), model, tokens, sizes)))
            for why, kw in [
                ("both bugs are still there: positions restart at 0, and the mask is aligned top-left",
                 dict(restart=True, top_left=True)),
                ("the new tokens' positions start at 0 in every call: they sit at positions cache.length, "
                 "cache.length + 1, ... (and cache.length must grow by T after each call)", dict(restart=True)),
                ("the mask is aligned top-left: the first T rows of the full causal mask (like tril() of "
                 "(T, start + T)) belong to positions 0 ... T-1, but the new queries are the last T of the start + T "
                 "positions, rows start ... start + T - 1 (causal_mask(T, start + T))", dict(top_left=True)),
                ("cache.length is never advanced, so the next call's positions and mask start from 0 again",
                 dict(frozen=True)),
            ]
        )  # fmt: skip
        diagnose(got.float(), expected, mistakes, f"{case} (logits against the model without a cache)", atol=1e-4)
    passed("check_cached_forward", len(cases))
