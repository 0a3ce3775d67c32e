"""The exercise checks of notebook 11 (the KV cache) pass right answers and name typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from mha_tutorial import checks
from mha_tutorial.core import kv_cache
from mha_tutorial.core.masks import causal_mask

from testkit import fails_with


def _attend(q, k, v, keep):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Q, K)
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, -1) @ v


def bottom_right(Q, K):  # (Q, K): query i sees keys 0..K - Q + i
    return torch.ones(Q, K, dtype=torch.bool).tril(K - Q)


def chunk_right(q, k_cache, v_cache, k_new, v_new):
    k, v = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)  # (B, H, P + Q, d)
    return _attend(q, k, v, bottom_right(q.shape[2], k.shape[2])), k, v


def chunk_with_mask(make_mask, scale=True, append=True):
    def fn(q, k_cache, v_cache, k_new, v_new):
        k, v = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
        seen_k, seen_v = (k, v) if append else (k_cache, v_cache)
        Q, K = q.shape[2], seen_k.shape[2]
        out = _attend(q if scale else q * math.sqrt(q.shape[-1]), seen_k, seen_v, make_mask(Q, K))
        return out, k, v

    return fn


def test_chunk_right_answer_passes(capsys):
    checks.check_chunk_step(chunk_right)
    assert "✓ check_chunk_step: passed on 4 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (chunk_with_mask(lambda Q, K: torch.ones(Q, K, dtype=torch.bool).tril()), "aligned top-left"),
        (chunk_with_mask(lambda Q, K: None), "no causal mask"),
        (chunk_with_mask(bottom_right, scale=False), "not scaled"),
        (chunk_with_mask(lambda Q, K: None, append=False), "its own key too"),
        (chunk_with_mask(lambda Q, K: torch.ones(Q, K, dtype=torch.bool).tril(K - Q - 1)), "its own key too"),
    ],
)
def test_chunk_mistakes_are_named(fn, fragment):
    fails_with(checks.check_chunk_step, fn, fragment)


def test_chunk_refuses_the_package_mask():
    fails_with(checks.check_chunk_step, chunk_with_mask(causal_mask), "causal_mask")


def test_chunk_swapped_cache_is_named():
    def swapped(q, k_cache, v_cache, k_new, v_new):
        out, k, v = chunk_right(q, k_cache, v_cache, k_new, v_new)
        return out, v, k

    fails_with(checks.check_chunk_step, swapped, "swapped")


def test_chunk_appended_on_the_wrong_axis_is_named():
    def wrong_axis(q, k_cache, v_cache, k_new, v_new):
        out, _, _ = chunk_right(q, k_cache, v_cache, k_new, v_new)
        return out, torch.cat([k_cache, k_new], dim=1), torch.cat([v_cache, v_new], dim=1)

    fails_with(checks.check_chunk_step, wrong_axis, "position axis")


def test_chunk_refuses_the_package_cache():
    def via_package(q, k_cache, v_cache, k_new, v_new):
        cache = kv_cache.LayerCache()
        cache.update(k_cache, v_cache)
        k, v = cache.update(k_new, v_new)
        return _attend(q, k, v, causal_mask(q.shape[2], k.shape[2])), k, v

    fails_with(checks.check_chunk_step, via_package, "LayerCache")


def size_right(config, batch, src_len, tgt_len, dtype):
    d = config.num_hiddens // config.num_heads
    positions = tgt_len + (src_len if config.kind == "encoder_decoder" else 0)
    return (
        2
        * config.num_dec_layers
        * batch
        * config.num_heads
        * positions
        * d
        * torch.empty((), dtype=dtype).element_size()
    )


def test_size_right_answer_passes(capsys):
    checks.check_cache_size(size_right)
    assert "✓ check_cache_size: passed on 4 cases" in capsys.readouterr().out


def _size(config, batch, src_len, tgt_len, dtype, *, factor=2, cross="src", element=None, enc=False):  # noqa: PLR0913
    d = config.num_hiddens // config.num_heads
    layers = config.num_dec_layers + (config.num_enc_layers if enc else 0)
    extra = {"src": src_len, "tgt": tgt_len, "none": 0, "src_always": src_len}[cross]
    extra = extra if config.kind == "encoder_decoder" or cross == "src_always" else 0
    size = element or torch.empty((), dtype=dtype).element_size()
    return factor * layers * batch * config.num_heads * (tgt_len + extra) * d * size


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(factor=1), "no factor 2"),
        (dict(cross="none"), "cross-attention caches are missing"),
        (dict(cross="tgt"), "not the target's"),
        (dict(element=4), "whatever the dtype"),
        (dict(enc=True), "encoder's layers keep no cache"),
        (dict(cross="src_always"), "a decoder has no source"),
    ],
)
def test_size_mistakes_are_named(kwargs, fragment):
    fails_with(checks.check_cache_size, lambda *a: _size(*a, **kwargs), fragment)


def test_size_refuses_the_package():
    def via_formula(config, batch, src_len, tgt_len, dtype):
        d = config.num_hiddens // config.num_heads
        positions = tgt_len + (src_len if config.kind == "encoder_decoder" else 0)
        return kv_cache.cache_bytes(config.num_dec_layers, batch, config.num_heads, positions, d, dtype)

    fails_with(checks.check_cache_size, via_formula, "cache_bytes")


def test_unattempted_exercises_are_reported_or_fail_in_strict_mode(monkeypatch, capsys):
    def stub(*args):
        raise NotImplementedError("Exercise 1: not written yet")

    checks.check_chunk_step(stub)
    checks.check_cache_size(stub)
    assert capsys.readouterr().out.count("not attempted yet") == 2
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    fails_with(checks.check_chunk_step, stub, "not attempted")


def cached_forward_right(model, new_tokens, cache, *, restart=False, top_left=False, first_rows=False):
    T, start = new_tokens.shape[1], cache.length
    X = model.embedding(new_tokens, torch.arange(T) if restart else torch.arange(start, start + T))
    mask = torch.ones(T, start + T, dtype=torch.bool).tril() if top_left else causal_mask(T, start + T)
    if first_rows:  # the lesson's buggy line: the full causal mask's first T rows
        mask = causal_mask(start + T)[:T]
    for i, block in enumerate(model.dec_blocks):
        X = block(X, mask=mask, self_cache=cache[f"dec.{i}.self"])
    cache.length += T
    return model.head(X)


def test_cached_forward_right_answer_passes(capsys):
    checks.check_cached_forward(cached_forward_right)
    assert "✓ check_cached_forward: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(restart=True), "positions start at 0"),
        (dict(top_left=True), "aligned top-left"),
        (dict(first_rows=True), "first T rows of the full causal mask"),
        (dict(restart=True, top_left=True), "both bugs"),
    ],
)
def test_cached_forward_bugs_are_named(kwargs, fragment):
    fails_with(checks.check_cached_forward, lambda m, t, c: cached_forward_right(m, t, c, **kwargs), fragment)


def test_cached_forward_refuses_the_model_own_cache():
    fails_with(checks.check_cached_forward, lambda m, t, c: m(t, cache=c), "model(tokens, cache=...)")


def test_size_with_num_hiddens_as_the_head_size_is_named():
    def wrong_d(config, batch, src_len, tgt_len, dtype):
        return size_right(config, batch, src_len, tgt_len, dtype) * config.num_heads

    fails_with(checks.check_cache_size, wrong_d, "head size")
