"""The tiny transformers: shapes, head_mask, collected attention weights, causality, padding."""

import dataclasses

import pytest
import torch

from mha_tutorial import MultiHeadAttention
from mha_tutorial.models.model import ModelConfig, TransformerEncoder, build_model

B, S, T = 3, 7, 5
CONFIGS = {
    "encoder": ModelConfig(
        "encoder",
        11,
        13,
        num_hiddens=16,
        num_heads=4,
        ffn_num_hiddens=24,
        num_enc_layers=2,
        num_dec_layers=0,
        max_len=12,
    ),
    "decoder": ModelConfig(
        "decoder", 0, 13, num_hiddens=16, num_heads=2, ffn_num_hiddens=0, num_enc_layers=0, num_dec_layers=3, max_len=12
    ),
    "encoder_decoder": ModelConfig(
        "encoder_decoder",
        11,
        13,
        num_hiddens=16,
        num_heads=4,
        ffn_num_hiddens=24,
        num_enc_layers=2,
        num_dec_layers=2,
        max_len=12,
    ),
}
NAMES = {
    "encoder": ["enc.0.self", "enc.1.self"],
    "decoder": ["dec.0.self", "dec.1.self", "dec.2.self"],
    "encoder_decoder": ["enc.0.self", "enc.1.self", "dec.0.self", "dec.1.self", "dec.0.cross", "dec.1.cross"],
}


def make(kind, seed=0):
    torch.manual_seed(seed)
    return build_model(CONFIGS[kind]).eval()


def inputs(kind, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 11, (B, S), generator=g)
    tgt = torch.randint(0, 13, (B, T), generator=g)
    lens = torch.tensor([S, 4, 2])
    if kind == "encoder":
        return (src,), {"valid_lens": lens}
    if kind == "decoder":
        return (tgt,), {}
    return (src, tgt), {"src_valid_lens": lens}


def out_len(kind):
    return S if kind == "encoder" else T


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_output_shape_and_attention_layer_order(kind):
    model = make(kind)
    args, kw = inputs(kind)
    assert model(*args, **kw).shape == (B, out_len(kind), 13)
    assert [name for name, _ in model.attention_layers()] == NAMES[kind]
    assert all(isinstance(layer, MultiHeadAttention) for _, layer in model.attention_layers())
    assert model.num_attention_layers == len(NAMES[kind]) == model.config.num_attention_layers


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_attention_weights_are_collected_from_every_layer(kind):
    model = make(kind)
    with pytest.raises(RuntimeError, match="run a forward pass first"):
        model.attention_weights()
    args, kw = inputs(kind)
    model(*args, **kw)
    weights = model.attention_weights()
    assert [name for name, _ in weights] == NAMES[kind]
    H = model.config.num_heads
    for name, w in weights:
        q = S if name.startswith("enc") else T
        k = S if (name.startswith("enc") or name.endswith("cross")) else T
        assert w.shape == (B, H, q, k), name
        torch.testing.assert_close(w.sum(-1), torch.ones(B, H, q))
        if "valid_lens" in kw or "src_valid_lens" in kw:
            if name.startswith("enc") or name.endswith("cross"):
                assert (w[1, :, :, 4:] == 0).all() and (w[2, :, :, 2:] == 0).all(), f"{name} attends to padding"
        if name.startswith("dec") and name.endswith("self"):
            assert (w.triu(diagonal=1) == 0).all(), f"{name} looks ahead"


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_head_mask_shape_errors(kind):
    model = make(kind)
    args, kw = inputs(kind)
    L, H = model.num_attention_layers, model.num_heads
    for bad in (torch.ones(H), torch.ones(L + 1, H), torch.ones(L, H + 1), torch.ones(1, L, H)):
        with pytest.raises(ValueError, match=rf"\({L}, {H}\).*got shape {re_shape(bad.shape)}"):
            model(*args, **kw, head_mask=bad)
    with pytest.raises(TypeError, match="head_mask must be a tensor"):
        model(*args, **kw, head_mask=[[1.0] * H] * L)


def re_shape(shape):
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_head_mask_of_ones_changes_nothing(kind):
    model = make(kind)
    args, kw = inputs(kind)
    ones = torch.ones(model.num_attention_layers, model.num_heads)
    torch.testing.assert_close(model(*args, **kw, head_mask=ones), model(*args, **kw), rtol=0, atol=0)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_zero_in_head_mask_equals_zeroing_that_heads_W_o_columns(kind):
    """Row i of head_mask must reach the i-th layer of attention_layers(): checked for every row."""
    model = make(kind)
    args, kw = inputs(kind)
    L, H = model.num_attention_layers, model.num_heads
    d = model.config.num_hiddens // H
    for i, (name, _) in enumerate(model.attention_layers()):
        h = i % H
        head_mask = torch.ones(L, H)
        head_mask[i, h] = 0.0
        masked = model(*args, **kw, head_mask=head_mask)
        surgery = make(kind)
        layer = dict(surgery.attention_layers())[name]
        with torch.no_grad():
            layer.W_o.weight[:, h * d : (h + 1) * d] = 0.0
        torch.testing.assert_close(masked, surgery(*args, **kw), msg=f"layer {i} ({name}), head {h}")
        assert not torch.allclose(masked, model(*args, **kw)), f"switching off {name} head {h} did nothing"


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_gradients_reach_head_mask(kind):
    model = make(kind)
    args, kw = inputs(kind)
    head_mask = torch.ones(model.num_attention_layers, model.num_heads, requires_grad=True)
    model(*args, **kw, head_mask=head_mask).logsumexp(-1).mean().backward()
    assert head_mask.grad is not None and head_mask.grad.shape == head_mask.shape
    assert torch.isfinite(head_mask.grad).all()
    assert (head_mask.grad.abs() > 0).all(), "every head should influence the output"


def test_decoder_is_causal():
    model = make("decoder")
    (tgt,), _ = inputs("decoder")
    changed = tgt.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 13
    a, b = model(tgt), model(changed)
    torch.testing.assert_close(a[:, :3], b[:, :3], rtol=0, atol=0)
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_encoder_decoder_decoder_is_causal():
    model = make("encoder_decoder")
    (src, tgt), kw = inputs("encoder_decoder")
    changed = tgt.clone()
    changed[:, 2] = (changed[:, 2] + 1) % 13
    a, b = model(src, tgt, **kw), model(src, changed, **kw)
    torch.testing.assert_close(a[:, :2], b[:, :2], rtol=0, atol=0)
    assert not torch.allclose(a[:, 2:], b[:, 2:])


def test_encoder_ignores_padding_given_valid_lens():
    model = make("encoder")
    g = torch.Generator().manual_seed(5)
    src = torch.randint(0, 11, (1, 4), generator=g)
    alone = model(src)  # (1, 4, V): no padding at all
    for fill in range(3):  # whatever the padding holds, and however much of it there is
        padded = torch.cat([src, torch.randint(0, 11, (1, 3 + fill), generator=g)], dim=1)
        out = model(padded, valid_lens=torch.tensor([4]))
        torch.testing.assert_close(out[:, :4], alone, atol=1e-6, rtol=1e-5)
    without_lens = model(padded)
    assert not torch.allclose(without_lens[:, :4], alone, atol=1e-4)


def test_encoder_decoder_ignores_source_padding():
    model = make("encoder_decoder")
    (src, tgt), _ = inputs("encoder_decoder")
    short = src[:1, :4]
    alone = model(short, tgt[:1])
    padded = torch.cat([short, torch.full((1, 3), 7)], dim=1)
    torch.testing.assert_close(model(padded, tgt[:1], src_valid_lens=torch.tensor([4])), alone, atol=1e-6, rtol=1e-5)


def test_greedy_decode_agrees_with_teacher_forcing_on_its_own_output():
    model = make("encoder_decoder")
    (src, _), kw = inputs("encoder_decoder")
    pred = model.greedy_decode(src, num_steps=T, bos_id=0, src_valid_lens=kw["src_valid_lens"])
    assert pred.shape == (B, T)
    tgt_in = torch.cat([torch.zeros(B, 1, dtype=torch.long), pred[:, :-1]], dim=1)
    assert torch.equal(model(src, tgt_in, **kw).argmax(-1), pred)
    assert dict(model.attention_weights())["dec.0.cross"].shape == (B, model.num_heads, T, S)


def test_config_validation_and_round_trip():
    cfg = CONFIGS["encoder_decoder"]
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**cfg.to_dict(), "num_experts": 8})
    with pytest.raises(ValueError, match="kind must be one of"):
        dataclasses.replace(cfg, kind="seq2seq")
    with pytest.raises(ValueError, match="num_dec_layers"):
        dataclasses.replace(CONFIGS["encoder"], num_dec_layers=1)
    with pytest.raises(ValueError, match="not divisible"):
        dataclasses.replace(cfg, num_heads=3)
    with pytest.raises(ValueError, match="needs kind='encoder'"):
        TransformerEncoder(cfg)


def test_too_long_input_is_an_error():
    model = make("decoder")
    with pytest.raises(ValueError, match="longer than max_len=12"):
        model(torch.zeros(1, 13, dtype=torch.long))


@pytest.mark.parametrize("field", ["num_enc_layers", "src_vocab_size", "ffn_num_hiddens"])
def test_config_refuses_negative_counts(field):
    base = dict(kind="decoder", src_vocab_size=0, tgt_vocab_size=10, num_enc_layers=0, num_dec_layers=2)
    with pytest.raises(ValueError, match=f"must be >= 0, got {{'{field}': -1}}"):
        ModelConfig(**{**base, field: -1})
