"""Positions in the tiny transformers: ``ModelConfig.position`` ("learned", "sinusoidal", "rope") and
``num_kv_heads``, and ``MultiHeadAttention(rope_base=)``.

References: rotary attention written head by head with explicit 2x2 rotation matrices and a loop softmax (float64);
the sinusoidal table by ``math.sin``/``math.cos`` loops; the uncached forward pass and each prompt run alone for the
KV cache. Properties: a rope decoder's logits do not move when every position is shifted by the same amount, a
learned one's do; checkpoint dicts without the new fields load as before; bad input is refused before arithmetic.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mha_tutorial.core.kv_cache import KVCache, LayerCache, cache_bytes
from mha_tutorial.core.mha import MultiHeadAttention
from mha_tutorial.core.variants import EinsumMultiHeadAttention, HeadLoopMultiHeadAttention
from mha_tutorial.models.blocks import sinusoidal_table
from mha_tutorial.models.model import ModelConfig, build_model

from decoding.cachekit import TIGHT, cached_in_chunks, greedy, left_pad, random_tokens, split_batches
from testkit import explode_projections, loop_masked_softmax, no_arithmetic

VOCAB, MAX_LEN = 13, 12
seeds = st.integers(0, 2**16)

# --------------------------------------------------------------------------- an independent rotary reference


def rotation(m: int, d: int, base: float) -> torch.Tensor:
    """R(m) (d, d) for the "half" layout: features i and i + d/2 turned by the angle m * base^(-2i/d)."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        angle = m * base ** (-2 * i / d)
        a, b = i, i + d // 2
        R[a, a], R[a, b] = math.cos(angle), -math.sin(angle)
        R[b, a], R[b, b] = math.sin(angle), math.cos(angle)
    return R


def reference_rope_mha(mha, X, positions, keep):
    """Self-attention of ``mha`` on X (B, T, D), one head and one query at a time, in float64.

    ``positions`` (B, T) ints; ``keep`` (B, T, T) bool. Query head h reads K/V head h // (H / H_kv); q and k of
    position m are multiplied by the explicit matrix R(m); v is not. Returns the output and weights (B, H, T, T)."""
    with torch.no_grad():
        return _reference(mha, X, positions, keep)


def _reference(mha, X, positions, keep):
    B, T, _ = X.shape
    H, H_kv, d, base = mha.num_heads, mha.num_kv_heads, mha.head_size, mha.rope_base
    Wq, Wk, Wv = (layer.weight.double().view(-1, d, X.shape[-1]) for layer in (mha.W_q, mha.W_k, mha.W_v))
    bq, bk, bv = (layer.bias.double().view(-1, d) for layer in (mha.W_q, mha.W_k, mha.W_v))
    heads, weights = torch.zeros(B, T, H * d, dtype=torch.float64), torch.zeros(B, H, T, T, dtype=torch.float64)
    for b in range(B):
        R = [rotation(int(m), d, base) for m in positions[b]]
        for h in range(H):
            j = h // (H // H_kv)
            q = [R[t] @ (Wq[h] @ X[b, t] + bq[h]) for t in range(T)]
            k = [R[s] @ (Wk[j] @ X[b, s] + bk[j]) for s in range(T)]
            v = [Wv[j] @ X[b, s] + bv[j] for s in range(T)]
            scores = [[float(q[t] @ k[s]) / math.sqrt(d) for s in range(T)] for t in range(T)]
            scores = torch.tensor(scores, dtype=torch.float64)  # (T, T)
            weights[b, h] = loop_masked_softmax(scores, keep[b])
            for t in range(T):
                heads[b, t, h * d : (h + 1) * d] = sum(weights[b, h, t, s] * v[s] for s in range(T))
    return heads @ mha.W_o.weight.double().T + mha.W_o.bias.double(), weights


@given(
    heads=st.sampled_from([(1, 1), (2, 2), (4, 4), (4, 2), (4, 1)]),
    batch=st.integers(1, 2),
    length=st.integers(1, 5),
    per_row=st.booleans(),
    causal=st.booleans(),
    need_weights=st.booleans(),
    seed=seeds,
)
def test_rope_attention_equals_explicit_rotation_matrices(heads, batch, length, per_row, causal, need_weights, seed):
    """Both paths (step and fused SDPA), grouped K/V heads, (T,) or (B, T) positions, causal or not."""
    H, H_kv = heads
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mha = MultiHeadAttention(4 * H, H, bias=True, num_kv_heads=H_kv, rope_base=100.0).double().eval()
    X = torch.randn(batch, length, 4 * H, dtype=torch.float64, generator=gen)
    shape = (batch, length) if per_row else (length,)
    positions = torch.randint(0, 50, shape, generator=gen)
    keep = torch.ones(length, length, dtype=torch.bool)
    keep = keep.tril() if causal else keep
    with torch.no_grad():
        out = mha(X, X, X, is_causal=causal, need_weights=need_weights, positions=positions)
    expected, weights = reference_rope_mha(mha, X, positions.expand(batch, length), keep.expand(batch, -1, -1))
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-10)
    if need_weights:
        torch.testing.assert_close(mha.attention_weights, weights, rtol=1e-9, atol=1e-10)


def test_rope_default_positions_count_from_zero_and_rope_base_none_is_plain_attention():
    torch.manual_seed(1)
    mha = MultiHeadAttention(8, 2, bias=True, rope_base=10000.0).double().eval()
    X = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(mha(X, X, X), mha(X, X, X, positions=torch.arange(5)), **TIGHT)
        moved = mha(X, X, X, positions=torch.arange(5) + 3)  # every position shifted: the scores only see offsets
        torch.testing.assert_close(moved, mha(X, X, X), **TIGHT)
        plain = MultiHeadAttention(8, 2, bias=True).double().eval()
        plain.load_state_dict(mha.state_dict())  # same parameter names: a rope layer adds no parameters
        assert not torch.allclose(plain(X, X, X), mha(X, X, X))  # ... but the rotation does change the output


@given(split=split_batches(max_len=6, max_batch=2), heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]), data=st.data())
def test_rope_layer_cache_over_splits_step_and_fused(split, heads, data):
    """Chunk by chunk through one LayerCache, each chunk on either path, with the default positions (continuing
    the cache) equals one causal call and the reference: the cache holds keys rotated once, at their positions."""
    batch, length, sizes, seed = split
    fused = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8, heads[0], bias=True, num_kv_heads=heads[1], rope_base=50.0).double().eval()
    X = torch.randn(batch, length, 8, dtype=torch.float64)
    with torch.no_grad():
        full = mha(X, X, X, is_causal=True)
        cache, outs, start = LayerCache(), [], 0
        for size, use_sdpa in zip(sizes, fused, strict=True):
            x = X[:, start : start + size]
            outs.append(mha(x, x, x, is_causal=True, need_weights=not use_sdpa, kv_cache=cache))
            start += size
    reference, _ = reference_rope_mha(
        mha, X, torch.arange(length).expand(batch, -1), torch.ones(batch, length, length, dtype=torch.bool).tril()
    )
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TIGHT)
    torch.testing.assert_close(full, reference, rtol=1e-9, atol=1e-10)
    assert cache.keys.shape == (batch, heads[1], length, 8 // heads[0])  # the cache holds the H_kv heads


# --------------------------------------------------------------------------- models


def config(kind: str = "decoder", position: str = "rope", num_kv_heads=None, **sizes) -> ModelConfig:
    enc, dec = {"encoder": (1, 0), "decoder": (0, 2), "encoder_decoder": (1, 2)}[kind]
    base = dict(num_hiddens=16, num_heads=4, ffn_num_hiddens=24, num_enc_layers=enc, num_dec_layers=dec)
    src = 11 if kind != "decoder" else 0
    return ModelConfig(
        kind, src, VOCAB, **{**base, "max_len": MAX_LEN, **sizes}, position=position, num_kv_heads=num_kv_heads
    )


def model_of(cfg: ModelConfig, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(cfg).double().eval()


@given(
    batch=st.integers(1, 3),
    length=st.integers(1, 6),
    shift=st.integers(1, 24),
    per_row=st.booleans(),
    kv=st.sampled_from([None, 2]),
    seed=seeds,
)
def test_rope_decoder_logits_ignore_a_common_shift_of_the_positions(batch, length, shift, per_row, kv, seed):
    """Relative positions: positions + c (one c per row with (B, T) positions) leave a rope decoder's logits as
    they are; a learned-position decoder (and a sinusoidal one) moves."""
    tokens = random_tokens(batch, length, VOCAB, seed)
    shifts = (
        torch.randint(0, shift + 1, (batch, 1), generator=torch.Generator().manual_seed(seed)) if per_row else shift
    )
    moved = torch.arange(length) + shifts  # (T,) or (B, T), at most length + 24 < max_len
    with torch.no_grad():
        rope = model_of(config(position="rope", num_kv_heads=kv, max_len=32), seed)
        torch.testing.assert_close(rope(tokens, positions=moved), rope(tokens), **TIGHT)
        for absolute in ("learned", "sinusoidal"):
            model = model_of(config(position=absolute, num_kv_heads=kv, max_len=32), seed)
            assert not torch.allclose(model(tokens, positions=torch.arange(length) + shift), model(tokens))


@pytest.mark.parametrize("position", ["rope", "learned", "sinusoidal"])
def test_explicit_decoder_positions_reach_the_model(position):
    """A gap in the positions (0, 1, 2, 9, 10) moves the logits after it and none before it (causal): so the
    positions given are the ones used, by the embedding or by every rotary layer, not counted afresh."""
    model = model_of(config(position=position, max_len=16), seed=4)
    tokens = random_tokens(2, 5, VOCAB, seed=6)
    with torch.no_grad():
        default = model(tokens)
        gap = model(tokens, positions=torch.tensor([0, 1, 2, 9, 10]))
        rows = model(tokens, positions=torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 9, 10]]))  # (B, T): one per row
    torch.testing.assert_close(gap[:, :3], default[:, :3], **TIGHT)
    assert not torch.allclose(gap[:, 3:], default[:, 3:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rows[0], default[0], **TIGHT)
    torch.testing.assert_close(rows[1], gap[1], **TIGHT)


def test_rope_layers_are_the_self_attention_ones_and_the_embedding_adds_nothing():
    model = model_of(config("encoder_decoder", "rope"))
    rotary = {name: layer.rope_base for name, layer in model.attention_layers()}
    assert rotary == {
        "enc.0.self": 10000.0,
        "dec.0.self": 10000.0,
        "dec.1.self": 10000.0,
        "dec.0.cross": None,
        "dec.1.cross": None,
    }
    ids = random_tokens(2, 5, 11, seed=1)
    torch.testing.assert_close(model.src_embedding(ids), model.src_embedding.token(ids), rtol=0, atol=0)
    src, tgt = random_tokens(2, 7, 11, seed=2), random_tokens(2, 4, VOCAB, seed=3)  # S != T: cross-attention runs
    assert model(src, tgt).shape == (2, 4, VOCAB)
    learned = build_model(config("decoder", "learned"))
    rope = build_model(config("decoder", "rope"))
    assert sum(p.numel() for p in learned.parameters()) - sum(p.numel() for p in rope.parameters()) == MAX_LEN * 16


ROPE_DECODERS = {
    "rope, 4 heads, 2 K/V heads": dict(num_kv_heads=2),
    "rope, 2 heads, no FFN": dict(num_heads=2, ffn_num_hiddens=0),
}


@given(name=st.sampled_from(list(ROPE_DECODERS)), split=split_batches(MAX_LEN))
def test_rope_decoder_chunks_equal_the_full_forward(name, split):
    batch, length, sizes, seed = split
    model = model_of(config(**ROPE_DECODERS[name]))
    tokens = random_tokens(batch, length, VOCAB, seed)
    with torch.no_grad():
        cached, cache = cached_in_chunks(model, tokens, sizes)
        full = model(tokens)
    torch.testing.assert_close(cached, full, **TIGHT)
    assert cache.length == length


@given(
    name=st.sampled_from(list(ROPE_DECODERS)),
    lengths=st.lists(st.integers(1, 6), min_size=2, max_size=3),
    data=st.data(),
)
def test_rope_left_padded_chunks_equal_each_prompt_alone(name, lengths, data):
    """Left padding: positions count real tokens, so each row rotates as it would alone (cached, in chunks)."""
    model = model_of(config(**ROPE_DECODERS[name]))
    prompts = [random_tokens(1, n, VOCAB, seed=n + 7 * i)[0] for i, n in enumerate(lengths)]
    tokens, token_mask = left_pad(prompts, pad_id=data.draw(st.integers(0, VOCAB - 1)))
    width = tokens.shape[1]
    cuts = sorted(data.draw(st.sets(st.integers(1, width - 1), max_size=3))) if width > 1 else []
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, width], strict=True)]
    with torch.no_grad():
        cached, _ = cached_in_chunks(model, tokens, sizes, token_mask)
        uncached = model(tokens, token_mask=token_mask)
        for row, prompt in enumerate(prompts):
            alone = model(prompt[None])[0]  # (n, V)
            torch.testing.assert_close(cached[row, width - len(prompt) :], alone, **TIGHT)
            torch.testing.assert_close(uncached[row, width - len(prompt) :], alone, **TIGHT)


@pytest.mark.parametrize("name", list(ROPE_DECODERS))
def test_rope_greedy_with_padding_and_cache_equals_each_prompt_alone(name):
    model = model_of(config(**ROPE_DECODERS[name]), seed=3)
    prompts = [random_tokens(1, n, VOCAB, seed=n)[0] for n in (5, 1, 3)]
    tokens, token_mask = left_pad(prompts)
    alone = torch.cat([greedy(model, p[None], MAX_LEN - 5) for p in prompts])
    assert torch.equal(greedy(model, tokens, MAX_LEN - 5, token_mask, use_cache=True), alone)
    assert torch.equal(greedy(model, tokens, MAX_LEN - 5, token_mask), alone)


@pytest.mark.parametrize("kv", [None, 2])
def test_rope_encoder_decoder_greedy_decode_with_and_without_cache(kv):
    model = model_of(config("encoder_decoder", "rope", num_kv_heads=kv), seed=5)
    src = random_tokens(3, 7, 11, seed=4)
    valid_lens = torch.tensor([7, 3, 5])
    uncached = model.greedy_decode(src, MAX_LEN - 1, 0, valid_lens)
    assert torch.equal(model.greedy_decode(src, MAX_LEN - 1, 0, valid_lens, use_cache=True), uncached)


# --------------------------------------------------------------------------- sinusoidal positions


def test_sinusoidal_table_equals_the_formula_by_loops():
    for max_len, d in ((7, 6), (5, 5), (3, 1)):  # an odd d has no cos column for its last sin
        table = sinusoidal_table(max_len, d)
        for m in range(max_len):
            for col in range(d):
                angle = m / 10000 ** (2 * (col // 2) / d)
                expected = math.sin(angle) if col % 2 == 0 else math.cos(angle)
                assert table[m, col].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_sinusoidal_embedding_has_no_parameters_and_round_trips_through_state_dict():
    cfg = config(position="sinusoidal")
    model = model_of(cfg, seed=1)
    learned = build_model(config(position="learned"))
    assert learned.state_dict().keys() - model.state_dict().keys() == {"embedding.position.weight"}
    assert model.state_dict().keys() <= learned.state_dict().keys()  # the table is a buffer, not saved
    assert not any("position" in name or "table" in name for name, _ in model.named_parameters())
    table = model.embedding.table  # built in the default dtype (float32), then moved with the model by .double()
    expected = sinusoidal_table(MAX_LEN, 16).float().double()
    assert table.dtype == torch.float64 and not table.requires_grad
    torch.testing.assert_close(table, expected, rtol=0, atol=0)
    torch.testing.assert_close(table, sinusoidal_table(MAX_LEN, 16), rtol=1e-7, atol=1e-7)
    tokens = random_tokens(2, MAX_LEN, VOCAB, seed=2)  # every position up to max_len - 1
    with torch.no_grad():
        X = model.embedding(tokens)
        torch.testing.assert_close(X, model.embedding.token(tokens) + expected, rtol=0, atol=0)
        again = model_of(cfg, seed=99)
        again.load_state_dict(model.state_dict())  # strict: the same keys
        torch.testing.assert_close(again(tokens), model(tokens), rtol=0, atol=0)


# --------------------------------------------------------------------------- configs and checkpoints


def test_an_old_checkpoint_dict_without_the_new_fields_loads_as_learned_with_one_kv_head_per_head():
    from mha_tutorial.models._validate_training import checkpoint_config

    old = {
        "kind": "decoder", "src_vocab_size": 0, "tgt_vocab_size": VOCAB, "num_hiddens": 16, "num_heads": 4,
        "ffn_num_hiddens": 24, "num_enc_layers": 0, "num_dec_layers": 2, "max_len": MAX_LEN, "dropout": 0.0, "bias": True,
    }  # fmt: skip
    checkpoint_config(old, "old.pt")  # the checkpoint reader accepts it
    cfg = ModelConfig.from_dict(old)
    assert (cfg.position, cfg.rope_base, cfg.num_kv_heads) == ("learned", 10000.0, None)
    assert cfg.to_dict() == old  # saved again, it is the same dict
    model = build_model(cfg)
    assert all(layer.num_kv_heads == 4 and layer.rope_base is None for _, layer in model.attention_layers())
    assert "embedding.position.weight" in model.state_dict()
    new = dataclasses.replace(cfg, position="rope", rope_base=500.0, num_kv_heads=2)
    assert ModelConfig.from_dict(new.to_dict()) == new
    checkpoint_config(new.to_dict(), "new.pt")


def test_a_grouped_kv_decoder_trains_a_step_and_its_cache_holds_the_kv_heads():
    model = build_model(config(position="learned", num_kv_heads=2)).train()
    layer = model.dec_blocks[0].self_attn
    assert layer.num_kv_heads == 2 and layer.W_k.weight.shape == (2 * 4, 16)
    tokens = random_tokens(4, 8, VOCAB, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())
    opt.step()
    assert not torch.equal(before["dec_blocks.0.self_attn.W_k.weight"], layer.W_k.weight)
    with torch.no_grad():
        new_loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    assert new_loss < loss
    sizes = {}
    for kv in (None, 2):
        m = model_of(config(position="learned", num_kv_heads=kv))
        cache = KVCache(m)
        with torch.no_grad():
            m(tokens, cache=cache)
        assert all(c.keys.shape == (4, kv or 4, 8, 4) for c in cache.layers.values())
        sizes[kv] = cache.nbytes
    assert sizes[2] * 2 == sizes[None] == cache_bytes(2, 4, 4, 8, 4, torch.float64)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        (dict(position="rotary"), ValueError, "'rotary'"),
        (dict(position=None), ValueError, "position must be one of"),
        (dict(position="rope", rope_base=0), ValueError, "rope_base must be finite and > 0"),
        (dict(rope_base=float("inf")), ValueError, "rope_base"),
        (dict(rope_base="10000"), TypeError, "rope_base"),
        (dict(num_kv_heads=3), ValueError, "num_kv_heads=3 does not divide num_heads=4"),
        (dict(num_kv_heads=0), ValueError, "num_kv_heads=0"),
        (dict(num_kv_heads=2.0), TypeError, "num_kv_heads"),
        (dict(position="rope", num_hiddens=12), ValueError, "12 / 4 = 3 must be even"),
    ],
)
def test_bad_model_configs_are_refused(fields, error, message):
    base = dict(position="learned", num_kv_heads=None)
    with no_arithmetic(), pytest.raises(error, match=message):
        config(**{**base, **fields})


def _rope_layer(**kwargs):
    return explode_projections(MultiHeadAttention(8, 2, bias=True, rope_base=10000.0, **kwargs).double())


X5, X3 = torch.zeros(2, 5, 8, dtype=torch.float64), torch.zeros(2, 3, 8, dtype=torch.float64)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: MultiHeadAttention(8, 2, rope_base=0), ValueError, "rope_base must be finite and > 0 .*, got 0"),
        (lambda: MultiHeadAttention(8, 2, rope_base=True), TypeError, "rope_base must be a real number"),
        (lambda: MultiHeadAttention(6, 2, rope_base=100.0), ValueError, "6 / 2 = 3 must be even"),
        (lambda: HeadLoopMultiHeadAttention(8, 2, rope_base=100.0), NotImplementedError, "cannot rotate"),
        (lambda: EinsumMultiHeadAttention(8, 2, rope_base=100.0), NotImplementedError, "cannot rotate"),
        (lambda: _rope_layer()(X5, X3, X3), ValueError, "5 queries but 3 new keys"),
        (lambda: _rope_layer()(X3, X3, X3, kv_cache=LayerCache(grow=False)), ValueError, "cross-attention"),
        (lambda: _rope_layer()(X5, X5, X5, positions=torch.arange(4)), ValueError, r"expected \(5,\) or \(2, 5\)"),
        (lambda: _rope_layer()(X5, X5, X5, positions=torch.arange(5.0)), TypeError, "integer tensor"),
        (lambda: _rope_layer()(X5, X5, X5, positions=torch.zeros(5, dtype=torch.bool)), TypeError, "integer"),
        (
            lambda: explode_projections(MultiHeadAttention(8, 2).double())(X5, X5, X5, positions=torch.arange(5)),
            ValueError,
            "no rotary positions",
        ),
    ],
)
def test_bad_rope_attention_is_refused_before_arithmetic(call, error, message):
    with no_arithmetic(), pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(
    ("positions", "error", "message"),
    [
        (torch.arange(5) + 8, ValueError, r"\[0, 11\] \(max_len=12\), got values from 8 to 12"),
        (torch.arange(5) - 1, ValueError, "from -1 to 3"),
        (torch.arange(4), ValueError, r"shape \(5,\) or \(2, 5\)"),
        (torch.arange(5.0), TypeError, "integer tensor"),
        ([0, 1, 2, 3, 4], TypeError, "integer tensor"),
    ],
)
def test_bad_decoder_positions_are_refused_before_arithmetic(positions, error, message):
    model = model_of(config())
    for block in model.dec_blocks:
        explode_projections(block.self_attn)
    with no_arithmetic(), pytest.raises(error, match=message):
        model(random_tokens(2, 5, VOCAB, seed=0), positions=positions)


def test_gqa_conversion_keeps_the_rotation_and_the_seq_first_variant_refuses_it():
    from mha_tutorial.core.variants import SeqFirstMultiHeadAttention
    from mha_tutorial.modern.gqa import mha_to_gqa

    torch.manual_seed(0)
    rotary = MultiHeadAttention(32, 4, rope_base=100.0)
    grouped = mha_to_gqa(rotary, 2)
    assert grouped.rope_base == 100.0
    x = torch.randn(2, 5, 32)
    shifted = [grouped(x, x, x, positions=torch.arange(5) + c, is_causal=True) for c in (0, 7)]
    torch.testing.assert_close(shifted[0], shifted[1], rtol=1e-5, atol=1e-5)  # still rotary: blind to the shift
    with pytest.raises(NotImplementedError, match="rope_base"):
        SeqFirstMultiHeadAttention(32, 4, rope_base=100.0)
