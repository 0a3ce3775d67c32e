"""The KV cache (notebook 11) is correct by construction: cached logits equal the uncached forward pass for every
prefill/decode split, batch and left padding; greedy decoding is token-identical with and without it; bad input is
refused before any arithmetic and leaves the cache as it was."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import mha_tutorial
from mha_tutorial import MultiHeadAttention, causal_mask
from mha_tutorial.core.kv_cache import KVCache, LayerCache, cache_bytes

from decoding.cachekit import (
    DECODER_CONFIGS,
    ENC_DEC_CONFIGS,
    LOOSE,
    MAX_LEN,
    TIGHT,
    CallCounter,
    assert_cache_unchanged,
    cache_state,
    cached_in_chunks,
    chunk_sizes,
    fresh_model,
    greedy,
    left_pad,
    random_source,
    random_tokens,
    shared_model,
    split_batches,
)
from testkit import functional_mha, no_arithmetic

DECODERS = [*DECODER_CONFIGS, "induction"]

# --------------------------------------------------------------------------- decoder: every split, uncached reference


@given(name=st.sampled_from(DECODERS), data=st.data())
def test_decoder_chunks_equal_the_full_forward(name, data):
    model = shared_model(name)
    cfg = model.config
    batch, length, sizes, seed = data.draw(split_batches(cfg.max_len))
    tokens = random_tokens(batch, length, cfg.tgt_vocab_size, seed)
    with torch.no_grad():
        cached, cache = cached_in_chunks(model, tokens, sizes)
        weights = dict(model.attention_weights())
        full = model(tokens)
    torch.testing.assert_close(cached, full, **TIGHT)
    assert cache.length == length and all(len(layer) == length for layer in cache.layers.values())
    for layer_name, _ in model.attention_layers():  # the last chunk's queries against every key so far
        assert weights[layer_name].shape == (batch, cfg.num_heads, sizes[-1], length)


def test_float32_checkpoint_chunks_equal_the_full_forward():
    model = shared_model("induction", torch.float32)
    tokens = random_tokens(3, 20, model.config.tgt_vocab_size, seed=5)
    with torch.no_grad():
        cached, _ = cached_in_chunks(model, tokens, [7, 1, 1, 4, 1, 6])
        full = model(tokens)
    torch.testing.assert_close(cached, full, **LOOSE)


@given(split=split_batches(), heads=st.sampled_from([1, 2, 4]), data=st.data())
def test_mha_layer_cache_over_splits_step_and_fused(split, heads, data):
    """``MultiHeadAttention(kv_cache=)`` chunk by chunk, each chunk on the step or the fused (SDPA) path, equals
    one causal call and an independent functional reference; weights are (B, H, Q_new, K_total) or None."""
    batch, length, sizes, seed = split
    fused = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, heads, bias=True).double().eval()
    X = torch.randn(batch, length, 16, dtype=torch.float64)
    with torch.no_grad():
        full = mha(X, X, X, is_causal=True)
        reference = functional_mha(mha, X, X, X, keep=causal_mask(length))
        cache, outs, start = LayerCache(), [], 0
        for size, use_sdpa in zip(sizes, fused, strict=True):
            x = X[:, start : start + size]
            outs.append(mha(x, x, x, is_causal=True, need_weights=not use_sdpa, kv_cache=cache))
            start += size
            expected = None if use_sdpa else (batch, heads, size, start)
            assert (None if use_sdpa else tuple(mha.attention_weights.shape)) == expected
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TIGHT)
    torch.testing.assert_close(full, reference, **TIGHT)
    assert len(cache) == length


# --------------------------------------------------------------------------- the mask must be bottom-right aligned


@pytest.mark.parametrize("new", [1, 3])
def test_a_top_left_mask_with_a_cache_is_caught(new):
    """With K > Q cached keys, ``tril`` of a (Q, K) block is the wrong causal mask: it hides the newest keys."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, bias=True).double().eval()
    X = torch.randn(2, 6, 16, dtype=torch.float64)
    prefix = 6 - new
    with torch.no_grad():
        expected = mha(X, X, X, is_causal=True)[:, prefix:]
        prefilled = LayerCache()
        mha(X[:, :prefix], X[:, :prefix], X[:, :prefix], is_causal=True, kv_cache=prefilled)
        x = X[:, prefix:]
        right = mha(x, x, x, mask=causal_mask(new, 6), kv_cache=copy.deepcopy(prefilled))
        top_left = torch.ones(new, 6, dtype=torch.bool).tril()
        wrong = mha(x, x, x, mask=top_left, kv_cache=copy.deepcopy(prefilled))
    torch.testing.assert_close(right, expected, **TIGHT)
    assert not torch.allclose(wrong, expected, rtol=1e-3, atol=1e-3)
    assert torch.equal(causal_mask(new, 6), torch.ones(new, 6, dtype=torch.bool).tril(prefix))


# --------------------------------------------------------------------------- left padding: each row as if alone


@given(name=st.sampled_from(DECODERS), data=st.data())
def test_left_padded_batch_in_chunks_equals_each_prompt_alone(name, data):
    model = shared_model(name)
    cfg = model.config
    lengths = data.draw(st.lists(st.integers(1, cfg.max_len), min_size=1, max_size=3))
    seed = data.draw(st.integers(0, 2**16))
    prompts = [random_tokens(1, n, cfg.tgt_vocab_size, seed + i)[0] for i, n in enumerate(lengths)]
    tokens, token_mask = left_pad(prompts, pad_id=data.draw(st.integers(0, cfg.tgt_vocab_size - 1)))
    sizes = data.draw(chunk_sizes(tokens.shape[1]))
    with torch.no_grad():
        uncached = model(tokens, token_mask=token_mask)
        cached, _ = cached_in_chunks(model, tokens, sizes, token_mask)
        for row, prompt in enumerate(prompts):
            alone = model(prompt[None])[0]  # (n, V)
            torch.testing.assert_close(uncached[row, -len(prompt) :], alone, **TIGHT)
            torch.testing.assert_close(cached[row, -len(prompt) :], alone, **TIGHT)
    assert uncached.isfinite().all() and cached.isfinite().all()  # the padded positions too


def _greedy_padded_vs_alone(model, prompts, steps):
    tokens, token_mask = left_pad(prompts)
    alone = torch.cat([greedy(model, p[None], steps) for p in prompts])
    uncached = greedy(model, tokens, steps, token_mask)
    cached = greedy(model, tokens, steps, token_mask, use_cache=True)
    assert torch.equal(uncached, alone) and torch.equal(cached, alone)
    assert torch.equal(greedy(model, tokens[:1], steps, use_cache=True), alone[:1])  # no padding, cached
    return alone


def test_greedy_with_padding_and_cache_on_the_induction_checkpoint():
    """Real prompts (a sequence and the start of its repeat) of different lengths: the cached, padded batch
    continues each one exactly as it does alone, in float32 as committed, and the trained model copies."""
    model = shared_model("induction", torch.float32)
    task = mha_tutorial.get_task("induction")
    batch = task.collate(mha_tutorial.load_split("induction", "eval")[:4])
    halves = (batch.tgt_valid_lens + 1) // 2
    prompts = [batch.tgt_in[i, : halves[i] + 1 + i % 2] for i in range(4)]
    continuation = _greedy_padded_vs_alone(model, prompts, steps=3)
    copies = [batch.tgt_in[i, len(p) : len(p) + 3] for i, p in enumerate(prompts)]
    assert (continuation == torch.stack(copies)).float().mean() > 0.9


@pytest.mark.parametrize("name", list(DECODER_CONFIGS))
def test_greedy_with_padding_and_cache_on_random_models(name):
    model = shared_model(name)
    prompts = [random_tokens(1, n, model.config.tgt_vocab_size, seed=n)[0] for n in (5, 1, 3)]
    _greedy_padded_vs_alone(model, prompts, steps=MAX_LEN - 5)


def test_a_fully_padded_prefix_gives_finite_logits():
    """A row that is all padding has no visible key at all; its logits stay finite, and the first real token
    after it computes exactly as that token alone at position 0."""
    model = shared_model("2 layers, 2 heads, FFN")
    tokens = random_tokens(2, 4, model.config.tgt_vocab_size, seed=3)
    token_mask = torch.tensor([[False] * 4, [False, False, True, True]])
    step = random_tokens(2, 1, model.config.tgt_vocab_size, seed=4)
    with torch.no_grad():
        assert model(tokens, token_mask=token_mask).isfinite().all()
        cache = KVCache(model)
        assert model(tokens, cache=cache, token_mask=token_mask).isfinite().all()
        logits = model(step, cache=cache)
        torch.testing.assert_close(logits[0], model(step[:1])[0], **TIGHT)
        torch.testing.assert_close(logits[1], model(torch.cat([tokens[1:, 2:], step[1:]], 1))[0, -1:], **TIGHT)


# --------------------------------------------------------------------------- encoder-decoder


def test_greedy_decode_with_cache_on_the_dates_eval_split():
    model = shared_model("dates", torch.float32)
    task = mha_tutorial.get_task("dates")
    batch = task.collate(mha_tutorial.load_split("dates", "eval")[:64])
    args = (batch.src, batch.tgt_in.shape[1], task.tgt_stoi["<bos>"], batch.valid_lens)
    uncached = model.greedy_decode(*args, use_cache=False)
    cached = model.greedy_decode(*args, use_cache=True)
    assert torch.equal(cached, uncached)
    assert (cached == batch.tgt_out).float().mean() > 0.9  # the checkpoint works, so the ids are meaningful
    assert dict(model.attention_weights())["dec.0.self"].shape == (64, 4, 1, args[1])  # Q = 1 with a cache


@pytest.mark.parametrize("name", list(ENC_DEC_CONFIGS))
def test_greedy_decode_with_cache_on_random_models(name):
    model = shared_model(name)
    src, valid_lens = random_source(model, 4, 7, seed=1)
    cached = model.greedy_decode(src, MAX_LEN, 1, valid_lens, use_cache=True)
    assert torch.equal(cached, model.greedy_decode(src, MAX_LEN, 1, valid_lens, use_cache=False))


@given(name=st.sampled_from(list(ENC_DEC_CONFIGS)), split=split_batches(), source_length=st.integers(1, 8))
def test_decode_chunks_equal_the_full_decode(name, split, source_length):
    model = shared_model(name)
    batch, length, sizes, seed = split
    src, valid_lens = random_source(model, batch, source_length, seed)
    tgt = random_tokens(batch, length, model.config.tgt_vocab_size, seed + 1)
    with torch.no_grad():
        memory = model.encode(src, valid_lens)
        cache, outs, start = KVCache(model), [], 0
        for size in sizes:
            outs.append(model.decode(tgt[:, start : start + size], memory, valid_lens, cache=cache))
            start += size
        torch.testing.assert_close(torch.cat(outs, dim=1), model(src, tgt, valid_lens), **TIGHT)
    assert cache.length == length and len(cache["dec.0.self"]) == length and len(cache["dec.0.cross"]) == source_length


def test_cross_attention_keys_are_projected_once():
    model = shared_model("2+2 layers, 4 heads, FFN")
    src, valid_lens = random_source(model, 3, 6, seed=2)
    steps = 5
    memory = model.encode(src, valid_lens)
    cache, tok, cross_keys = KVCache(model), torch.ones(3, 1, dtype=torch.long), []
    cross, own = model.dec_blocks[1].cross_attn, model.dec_blocks[1].self_attn
    with CallCounter(cross.W_k) as cross_calls, CallCounter(own.W_k) as self_calls, torch.no_grad():
        for step in range(steps):
            tok = model.decode(tok, memory, valid_lens, cache=cache)[:, -1:].argmax(-1)
            cross_keys.append(cache["dec.1.cross"].keys)
            assert len(cache["dec.1.cross"]) == 6 and len(cache["dec.1.self"]) == step + 1
    assert cross_calls.count == 1 and self_calls.count == steps
    assert all(keys is cross_keys[0] for keys in cross_keys)
    with CallCounter(cross.W_k) as cached_run:
        model.greedy_decode(src, steps, 1, valid_lens, use_cache=True)
    with CallCounter(cross.W_k) as uncached_run:
        model.greedy_decode(src, steps, 1, valid_lens, use_cache=False)
    assert (cached_run.count, uncached_run.count) == (1, steps)


# --------------------------------------------------------------------------- bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cache_bytes_formula(dtype):
    decoder = shared_model("3 layers, 4 heads, no bias, attention only", dtype)
    cache, tokens, n = KVCache(decoder), random_tokens(2, 9, decoder.config.tgt_vocab_size, seed=0), 0
    assert cache.nbytes == 0
    for size in (4, 1, 3, 1):
        with torch.no_grad():
            decoder(tokens[:, n : n + size], cache=cache)
        n += size
        tensors = sum(t.nbytes for layer in cache.layers.values() for t in (layer.keys, layer.values))
        assert cache.nbytes == cache_bytes(3, 2, 4, n, 4, dtype) == tensors
    enc_dec = shared_model("2+2 layers, 4 heads, FFN", dtype)
    src, valid_lens = random_source(enc_dec, 2, 5, seed=0)
    cache = KVCache(enc_dec)
    with torch.no_grad():
        memory = enc_dec.encode(src, valid_lens)
        for _ in range(3):
            enc_dec.decode(tokens[:, :1], memory, valid_lens, cache=cache)
    assert cache.nbytes == cache_bytes(2, 2, 4, 3, 4, dtype) + cache_bytes(2, 2, 4, 5, 4, dtype)  # self + cross


# --------------------------------------------------------------------------- bad input: refused first, cache intact


OTHER = {
    "3 layers": "3 layers, 4 heads, no bias, attention only",
    "encoder-decoder": "1+1 layers, 2 heads, attention only",
}
BAD_DECODER_CALLS = {  # (tokens (B, 1) continuing a cache of batch 2 and length 3, cache, model) -> kwargs
    "batch of 3": (lambda t, c: dict(tokens=t.repeat(3, 1)[:3], cache=c), ValueError, "a batch of 2 sequences"),
    "cache not a KVCache": (lambda t, c: dict(tokens=t, cache=LayerCache()), TypeError, "cache must be a KVCache"),
    "cache a string": (lambda t, c: dict(tokens=t, cache="cache"), TypeError, "got str"),
    "mask of ints": (lambda t, c: dict(tokens=t, cache=c, token_mask=torch.ones_like(t)), TypeError, "bool tensor"),
    "mask a list": (lambda t, c: dict(tokens=t, cache=c, token_mask=[[True], [True]]), TypeError, "bool tensor"),
    "mask shape": (
        lambda t, c: dict(tokens=t, cache=c, token_mask=torch.ones(2, 2, dtype=torch.bool)),
        ValueError,
        r"tokens' shape \(2, 1\), got \(2, 2\)",
    ),
    "past max_len": (lambda t, c: dict(tokens=t.repeat(1, 10), cache=c), ValueError, "length 13, longer than max_len"),
    **{
        f"a KVCache of a {other} model": (
            lambda t, c, o=o: dict(tokens=t, cache=KVCache(shared_model(o))),
            ValueError,
            "this cache was made for layers",
        )
        for other, o in OTHER.items()
    },
}


@pytest.mark.parametrize("case", list(BAD_DECODER_CALLS))
def test_bad_decoder_calls_are_refused_before_arithmetic(case):
    make, error, message = BAD_DECODER_CALLS[case]
    model = shared_model("2 layers, 2 heads, FFN")
    cache = KVCache(model)
    tokens = random_tokens(2, 3, model.config.tgt_vocab_size, seed=0)
    with torch.no_grad():
        model(tokens, cache=cache, token_mask=torch.tensor([[False, True, True]] * 2))
    before = cache_state(cache)
    with no_arithmetic(), pytest.raises(error, match=message):
        model(**make(tokens[:, :1], cache))
    assert_cache_unchanged(before, cache)


@pytest.mark.parametrize(
    "case, error, message",
    [
        ("kv_cache a dict", TypeError, "kv_cache must be a LayerCache"),
        ("batch of 3", ValueError, r"holds keys of shape \(2, 4, 3, 4\).*B = 3"),
        ("pruned heads", ValueError, "H = 3 heads"),
        ("float32 layer", ValueError, "holds torch.float64 keys"),
    ],
)
def test_bad_layer_cache_is_refused_before_arithmetic(case, error, message):
    torch.manual_seed(0)
    mha, cache, X = MultiHeadAttention(16, 4).double().eval(), LayerCache(), torch.randn(2, 3, 16).double()
    with torch.no_grad():
        mha(X, X, X, is_causal=True, kv_cache=cache)
    x = X[:, :1]
    kv_cache = {} if case == "kv_cache a dict" else cache
    if case == "batch of 3":
        x = x.repeat(2, 1, 1)[:3]
    if case == "pruned heads":
        mha.prune_heads([1])
    if case == "float32 layer":
        mha, x = mha.float(), x.float()
    keys = cache.keys
    with no_arithmetic(), pytest.raises(error, match=message):
        mha(x, x, x, is_causal=True, kv_cache=kv_cache)
    assert len(cache) == 3 and cache.keys is keys


@pytest.mark.parametrize("use_cache", [1, "yes", None, torch.tensor(True)])
def test_use_cache_must_be_a_bool(use_cache):
    model = shared_model("1+1 layers, 2 heads, attention only")
    src = random_tokens(2, 4, model.config.src_vocab_size, seed=0)
    with no_arithmetic(), pytest.raises(TypeError, match="use_cache must be True or False"):
        model.greedy_decode(src, 3, 1, use_cache=use_cache)


@pytest.mark.parametrize("layer", [0, 1])
def test_a_model_cache_after_pruning_is_refused_before_arithmetic(layer):
    model = fresh_model("2 layers, 2 heads, FFN")
    cache, tokens = KVCache(model), random_tokens(2, 3, model.config.tgt_vocab_size, seed=0)
    with torch.no_grad():
        model(tokens, cache=cache)
    model.prune_heads({f"dec.{layer}.self": [0]})
    before = cache_state(cache)
    with no_arithmetic(), pytest.raises(ValueError, match="H = 1 heads"):
        model(tokens[:, :1], cache=cache)
    assert_cache_unchanged(before, cache)


BAD_DECODE_CALLS = {  # (tokens (2, 1), memory (2, 5, d), cache of batch 2 and length 3) -> decode's arguments
    "cache a string": (lambda t, m, c: (t, m, "cache"), TypeError, "cache must be a KVCache"),
    "batch of 3": (lambda t, m, c: (t.repeat(2, 1)[:3], m.repeat(2, 1, 1)[:3], c), ValueError, "a batch of 2"),
    "past max_len": (lambda t, m, c: (t.repeat(1, 10), m, c), ValueError, "length 13, longer than max_len"),
    "a decoder's KVCache": (
        lambda t, m, c: (t, m, KVCache(shared_model("2 layers, 2 heads, FFN"))),
        ValueError,
        "this cache was made for layers",
    ),
}


@pytest.mark.parametrize("case", list(BAD_DECODE_CALLS))
def test_bad_decode_calls_are_refused_before_arithmetic(case):
    make, error, message = BAD_DECODE_CALLS[case]
    model = shared_model("2+2 layers, 4 heads, FFN")
    src, valid_lens = random_source(model, 2, 5, seed=0)
    tokens, cache = random_tokens(2, 3, model.config.tgt_vocab_size, seed=0), KVCache(model)
    with torch.no_grad():
        memory = model.encode(src, valid_lens)
        model.decode(tokens, memory, cache=cache)
    before = cache_state(cache)
    tgt, memory, bad_cache = make(tokens[:, :1], memory, cache)
    with no_arithmetic(), pytest.raises(error, match=message):
        model.decode(tgt, memory, cache=bad_cache)
    assert_cache_unchanged(before, cache)


@pytest.mark.parametrize("use_cache", [False, True])
def test_greedy_decode_past_max_len_says_max_len(use_cache):
    model = shared_model("1+1 layers, 2 heads, attention only")
    src = random_tokens(2, 4, model.config.src_vocab_size, seed=0)
    with pytest.raises(ValueError, match="longer than max_len=12"):
        model.greedy_decode(src, MAX_LEN + 1, 1, use_cache=use_cache)
