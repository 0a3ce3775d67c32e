"""Helpers for the KV-cache tests: small models, hypothesis strategies for prefill/decode splits, a greedy loop.

The references are the package's *uncached* forward passes (the whole sequence at once, positions 0..T-1, the
plain causal mask) and each prompt run alone without padding; the cached side goes through ``KVCache`` in chunks.
"""

from __future__ import annotations

import copy
import functools

import torch
from hypothesis import strategies as st

from mha_tutorial.core.kv_cache import KVCache
from mha_tutorial.models.model import ModelConfig, build_model
from mha_tutorial.models.train import load_pretrained

MAX_LEN = 12
VOCAB = 13
# float64 models: cached and uncached logits differ only by summation order (about 1e-15).
TIGHT = dict(rtol=1e-9, atol=1e-10)
# float32 (the trained checkpoint as committed).
LOOSE = dict(rtol=1e-4, atol=1e-5)


def _decoder_config(layers: int, heads: int, ffn: int, bias: bool) -> ModelConfig:
    return ModelConfig(
        "decoder",
        0,
        VOCAB,
        num_hiddens=16,
        num_heads=heads,
        ffn_num_hiddens=ffn,
        num_enc_layers=0,
        num_dec_layers=layers,
        max_len=MAX_LEN,
        bias=bias,
    )


DECODER_CONFIGS = {
    "1 layer, 1 head, attention only": _decoder_config(1, 1, 0, True),
    "2 layers, 2 heads, FFN": _decoder_config(2, 2, 24, True),
    "3 layers, 4 heads, no bias, attention only": _decoder_config(3, 4, 0, False),
}
ENC_DEC_CONFIGS = {
    "2+2 layers, 4 heads, FFN": ModelConfig(
        "encoder_decoder", 11, VOCAB, 16, 4, 24, num_enc_layers=2, num_dec_layers=2, max_len=MAX_LEN
    ),
    "1+1 layers, 2 heads, attention only": ModelConfig(
        "encoder_decoder", 11, VOCAB, 16, 2, 0, num_enc_layers=1, num_dec_layers=1, max_len=MAX_LEN
    ),
}


@functools.cache
def shared_model(name: str, dtype: torch.dtype = torch.float64):
    """A random-weight model of ``DECODER_CONFIGS``/``ENC_DEC_CONFIGS`` (or a checkpoint's name), made once.

    Shared between tests: never prune or train it (use ``fresh_model``)."""
    return fresh_model(name, dtype)


def fresh_model(name: str, dtype: torch.dtype = torch.float64):
    if name in ("induction", "dates"):
        return copy.deepcopy(_checkpoint(name)).to(dtype)
    torch.manual_seed(sum(map(ord, name)))
    config = DECODER_CONFIGS.get(name) or ENC_DEC_CONFIGS[name]
    return build_model(config).eval().to(dtype)


@functools.cache
def _checkpoint(name: str):
    return load_pretrained(name, device="cpu")


@st.composite
def chunk_sizes(draw, total: int) -> list[int]:
    """A split of ``total`` positions into a prefill chunk and decode chunks of any sizes >= 1."""
    cuts = draw(st.sets(st.integers(1, total - 1), max_size=total - 1)) if total > 1 else set()
    bounds = [0, *sorted(cuts), total]
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


@st.composite
def split_batches(draw, max_len: int = MAX_LEN, max_batch: int = 3):
    """(batch, length, chunk sizes, seed) for a prefill/decode run."""
    batch = draw(st.integers(1, max_batch))
    length = draw(st.integers(1, max_len))
    return batch, length, draw(chunk_sizes(length)), draw(st.integers(0, 2**16))


def random_tokens(batch: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def cached_in_chunks(model, tokens, sizes, token_mask=None, cache=None):
    """Run ``tokens`` (B, T) through ``model`` chunk by chunk with one KVCache; -> (B, T, V) logits, the cache."""
    cache = KVCache(model) if cache is None else cache
    outs, start = [], 0
    for size in sizes:
        part = slice(start, start + size)
        chunk_mask = None if token_mask is None else token_mask[:, part]
        outs.append(model(tokens[:, part], cache=cache, token_mask=chunk_mask))
        start += size
    return torch.cat(outs, dim=1), cache


def random_source(model, batch: int, length: int, seed: int):
    """Source ids (B, S) and valid lengths (B,) in 1..S for an encoder-decoder."""
    src = random_tokens(batch, length, model.config.src_vocab_size, seed)
    valid_lens = torch.randint(1, length + 1, (batch,), generator=torch.Generator().manual_seed(seed))
    return src, valid_lens


def cache_state(cache: KVCache):
    """What a rejected call must leave as it was: the length, the padding record, each layer's key tensor."""
    layers = {name: (len(layer), layer.keys) for name, layer in cache.layers.items()}
    return cache.length, None if cache.keep is None else cache.keep.clone(), layers


def assert_cache_unchanged(before, cache: KVCache) -> None:
    length, keep, layers = cache_state(cache)
    assert length == before[0] and (keep is None) == (before[1] is None)
    assert keep is None or torch.equal(keep, before[1])
    assert all(layers[name][0] == n and layers[name][1] is keys for name, (n, keys) in before[2].items())


def left_pad(prompts: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D prompts of different lengths -> tokens (B, T_max) left-padded with ``pad_id``, token_mask (B, T_max)."""
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = True
    return tokens, mask


@torch.no_grad()
def greedy(model, prompt, steps: int, token_mask=None, use_cache: bool = False):
    """A decoder's greedy continuation of ``prompt`` (B, T): -> (B, steps) ids.

    Without a cache every step reruns the whole sequence (the token mask grows by True columns); with one the
    prompt is prefilled and each step feeds only the newest token."""
    out, mask = prompt, token_mask
    cache = KVCache(model) if use_cache else None
    new = prompt
    for _ in range(steps):
        if cache is None:
            logits = model(out, token_mask=mask)
        else:
            logits = model(new, cache=cache, token_mask=mask if new is prompt else None)
        new = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out = torch.cat([out, new], dim=1)
        if mask is not None and cache is None:
            mask = torch.cat([mask, torch.ones_like(new, dtype=torch.bool)], dim=1)
    return out[:, prompt.shape[1] :]


class CallCounter:
    """Counts the forward calls of a module through a hook: ``with CallCounter(layer.W_k) as calls: ...``."""

    def __init__(self, module):
        self.module, self.count = module, 0

    def __enter__(self):
        self.handle = self.module.register_forward_hook(self._hook)
        return self

    def _hook(self, module, args, output):
        self.count += 1

    def __exit__(self, *exc):
        self.handle.remove()
