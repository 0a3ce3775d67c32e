"""What every task of ``tasks`` shares: the ``Batch`` of tensors and the ``Task`` base class.

A task draws examples from a seed (``draw``, ``sample``), turns characters into ids and
back (``encode``, ``decode``), collates examples into a ``Batch`` (``collate``,
``make_batch``), computes the shared loss and metric (``loss_and_accuracy``) and reads
and writes its committed splits (``<task>_eval.tsv``, ``<task>_importance.tsv`` in
``data/``). ``is_heldout`` decides which keys training never sees.
The three tasks themselves, and ``get_task``, are in ``tasks``.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch.nn import functional as F

from ..data import DATA_DIR  # the shipped data (data/ in the repository), from any install
from . import _validate_experiments as validate
from . import _validate_training as validate_training
from .model import ModelConfig

__all__ = ["Batch", "Task", "is_heldout"]

SPLIT_SEEDS = {"eval": 1000, "importance": 2000}  # seeds of the committed splits
SPLIT_SIZE = 1000  # examples per committed split
HOLDOUT_MODULUS = 10  # one key in HOLDOUT_MODULUS is held out of training

PAD, BOS = "<pad>", "<bos>"


def is_heldout(key: str) -> bool:
    """True for the one key in ten that training never sees (CRC-32 of the key, mod 10 == 0)."""
    return zlib.crc32(key.encode("utf-8")) % HOLDOUT_MODULUS == 0


@dataclass
class Batch:
    """Tensors for one batch; fields a task does not use are None.

    src (B, S) encoder ids, valid_lens (B,) encoder lengths, tgt_in (B, T)
    decoder input ids, tgt_out (B, T) target ids, loss_mask (B, T) bool
    (True = this position counts in loss and accuracy), tgt_valid_lens (B,)
    real decoder tokens when the decoder side is right-padded (None when every
    position is real), examples: the raw rows.
    """

    src: torch.Tensor | None = None
    valid_lens: torch.Tensor | None = None
    tgt_in: torch.Tensor | None = None
    tgt_out: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    tgt_valid_lens: torch.Tensor | None = None
    examples: list | None = None

    def to(self, device) -> Batch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device)
        return Batch(**moved)

    def __len__(self) -> int:
        return len(self.examples)


class Task:
    """Base class: sampling, tensors, the shared loss/metric and the committed splits."""

    name: str
    model_kind: str
    columns: tuple[str, ...]
    src_vocab: list[str]
    tgt_vocab: list[str]

    def __init__(self):
        self.src_stoi = {t: i for i, t in enumerate(self.src_vocab)}
        self.tgt_stoi = {t: i for i, t in enumerate(self.tgt_vocab)}

    # ---- examples --------------------------------------------------------------------------
    def draw(self, rng: random.Random) -> tuple[str, ...]:
        raise NotImplementedError

    def key(self, example: tuple[str, ...]) -> str:
        """The string whose hash decides whether an example is held out."""
        return example[0]

    def sample(self, n: int, seed: int, heldout: bool = False) -> list[tuple[str, ...]]:
        """``n`` examples from ``random.Random(seed)``: training ones, or held-out ones when ``heldout``."""
        validate_training.non_negative_count(n, "n")
        rng, out = random.Random(seed), []
        while len(out) < n:
            example = self.draw(rng)
            if is_heldout(self.key(example)) == heldout:
                out.append(example)
        return out

    def make_batch(self, batch_size: int, generator: torch.Generator | None = None, device=None) -> Batch:
        """A fresh training batch; the torch ``generator`` makes the stream reproducible."""
        validate.positive_count(batch_size, "batch_size")
        validate_training.generator(generator)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        return self.collate(self.sample(batch_size, seed), device)

    def collate(self, examples, device=None) -> Batch:
        """A non-empty list of examples (tuples of strings, one per column) -> a ``Batch`` on ``device``."""
        raise NotImplementedError

    # ---- tokens ----------------------------------------------------------------------------
    @staticmethod
    def _check_side(side) -> None:
        if side not in ("src", "tgt"):
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")

    def encode(self, text: str, side: str = "src") -> list[int]:
        """Characters -> ids in the ``src`` or ``tgt`` vocabulary (every token here is one character)."""
        self._check_side(side)
        if not isinstance(text, str):
            raise TypeError(f"{self.name}: encode takes a string, got {type(text).__name__} {text!r}")
        stoi = self.src_stoi if side == "src" else self.tgt_stoi
        try:
            return [stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(f"{self.name}: character {e.args[0]!r} is not in the {side} vocabulary") from None

    def decode(self, ids, side: str = "tgt", strip_special: bool = True) -> str:
        """Ids -> string; special tokens (<pad>, <bos>) are dropped unless ``strip_special=False``."""
        self._check_side(side)
        vocab = self.src_vocab if side == "src" else self.tgt_vocab
        validate_training.id_sequence(ids, self.name)
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(vocab)]
        if bad:  # a negative id would silently index from the end of the vocabulary
            raise ValueError(
                f"{self.name}: ids must be ints in [0, {len(vocab) - 1}] ({side} vocabulary), got {bad[:5]}"
            )
        return "".join(vocab[i] for i in ids if not (strip_special and vocab[i] in (PAD, BOS)))

    # ---- model -----------------------------------------------------------------------------
    def default_config(self) -> ModelConfig:
        raise NotImplementedError

    def forward(self, model, batch: Batch, head_mask=None) -> torch.Tensor:
        """Teacher-forced logits (B, T, tgt_vocab) for ``batch``."""
        raise NotImplementedError

    def loss_and_accuracy(self, model, batch: Batch, head_mask=None) -> tuple[torch.Tensor, float]:
        """(mean cross-entropy over the positions in ``loss_mask``, accuracy in [0, 1]).

        The loss keeps its graph (so it can be differentiated, e.g. with respect
        to ``head_mask``). Accuracy is per token for reversal and induction and
        whole-date exact match under greedy decoding for dates.
        """
        validate_training.loss_inputs(model, self, batch)
        logits = self.forward(model, batch, head_mask)  # (B, T, V)
        mask = batch.loss_mask  # (B, T)
        loss = F.cross_entropy(logits[mask], batch.tgt_out[mask])
        correct = (logits.argmax(-1) == batch.tgt_out)[mask]
        return loss, float(correct.float().mean())

    # ---- committed splits --------------------------------------------------------------------
    def split_path(self, split: str) -> Path:
        validate_training.name(split, "split")
        if split not in SPLIT_SEEDS:
            raise ValueError(f"unknown split {split!r}; known: {sorted(SPLIT_SEEDS)}")
        return DATA_DIR / f"{self.name}_{split}.tsv"

    def generate_split(self, split: str) -> list[tuple[str, ...]]:
        """The examples of a committed split, regenerated from its seed."""
        self.split_path(split)  # validates the name
        return self.sample(SPLIT_SIZE, SPLIT_SEEDS[split], heldout=True)

    def write_split(self, split: str, path: Path | None = None) -> Path:
        path = Path(path) if path is not None else self.split_path(split)
        lines = ["\t".join(self.columns)] + ["\t".join(row) for row in self.generate_split(split)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    def load_split(self, split: str = "eval") -> list[tuple[str, ...]]:
        path = self.split_path(split)
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing; recreate it with: python -m mha_tutorial.models.tasks --write-splits"
            )
        lines = path.read_text(encoding="utf-8").splitlines()
        if not lines or tuple(lines[0].split("\t")) != self.columns:
            raise ValueError(f"{path}: expected header {self.columns}, got {lines[:1]}")
        return [tuple(line.split("\t")) for line in lines[1:]]
