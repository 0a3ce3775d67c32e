"""Three toy tasks whose trained attention heads can be read off a heatmap (notebook 05).

* ``reversal`` (encoder): read 10 letters, output them reversed, one class per
  position. The head that solves it puts its weight on the anti-diagonal.
* ``induction`` (causal decoder): a run of distinct random letters followed by
  the same run again; predict each repeated letter from the ones before it.
  Two layers suffice: a previous-token head in layer 0 and an induction head
  in layer 1 (Olsson et al. 2022, "In-context learning and induction heads").
* ``dates`` (encoder-decoder): a date written by a human in one of ten forms
  (``21 Nov 2026``, ``Saturday, November 21, 2026``, ``11/21/26``, ...) ->
  ``2026-11-21``, character by character. Cross-attention aligns each output
  character with the part of the source that holds it.

Everything is generated from a seed; nothing is downloaded. An example is a
tuple of strings -- exactly one line of the task's committed TSV files in
``mha_tutorial/data/`` (``<task>_eval.tsv``, ``<task>_importance.tsv``). Every
task splits its examples by a hash of a key (the letters / the repeated run /
the calendar day): one in ten keys is *held out*. Training draws only the other
nine, the committed splits only held-out ones, so no evaluation example (and,
for dates, no evaluation day) is ever seen in training.

    task = get_task("dates")
    batch = task.make_batch(64, torch.Generator().manual_seed(0))   # a Batch of tensors
    loss, acc = task.loss_and_accuracy(model, batch)                 # the shared metric
    rows = load_split("dates", "eval")                                # committed examples
"""

from __future__ import annotations

import datetime
import random
import string
import zlib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import torch
from torch.nn import functional as F

from .model import ModelConfig

__all__ = ["Batch", "DATE_FORMATS", "Task", "TASKS", "get_task", "load_split", "render_date"]

# Package data (pyproject.toml ships it in the wheel), so splits and checkpoints load from any install.
DATA_DIR = Path(str(resources.files("mha_tutorial") / "data"))
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
        rng, out = random.Random(seed), []
        while len(out) < n:
            example = self.draw(rng)
            if is_heldout(self.key(example)) == heldout:
                out.append(example)
        return out

    def make_batch(self, batch_size: int, generator: torch.Generator | None = None, device=None) -> Batch:
        """A fresh training batch; the torch ``generator`` makes the stream reproducible."""
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        return self.collate(self.sample(batch_size, seed), device)

    def collate(self, examples, device=None) -> Batch:
        raise NotImplementedError

    # ---- tokens ----------------------------------------------------------------------------
    @staticmethod
    def _check_side(side) -> None:
        if side not in ("src", "tgt"):
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")

    def encode(self, text: str, side: str = "src") -> list[int]:
        """Characters -> ids in the ``src`` or ``tgt`` vocabulary (every token here is one character)."""
        self._check_side(side)
        stoi = self.src_stoi if side == "src" else self.tgt_stoi
        try:
            return [stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(f"{self.name}: character {e.args[0]!r} is not in the {side} vocabulary") from None

    def decode(self, ids, side: str = "tgt", strip_special: bool = True) -> str:
        """Ids -> string; special tokens (<pad>, <bos>) are dropped unless ``strip_special=False``."""
        self._check_side(side)
        vocab = self.src_vocab if side == "src" else self.tgt_vocab
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
        logits = self.forward(model, batch, head_mask)  # (B, T, V)
        mask = batch.loss_mask  # (B, T)
        loss = F.cross_entropy(logits[mask], batch.tgt_out[mask])
        correct = (logits.argmax(-1) == batch.tgt_out)[mask]
        return loss, float(correct.float().mean())

    # ---- committed splits --------------------------------------------------------------------
    def split_path(self, split: str) -> Path:
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
            raise FileNotFoundError(f"{path} is missing; recreate it with: python -m mha_tutorial.tasks --write-splits")
        lines = path.read_text(encoding="utf-8").splitlines()
        if not lines or tuple(lines[0].split("\t")) != self.columns:
            raise ValueError(f"{path}: expected header {self.columns}, got {lines[:1]}")
        return [tuple(line.split("\t")) for line in lines[1:]]

    # ---- interpretability ----------------------------------------------------------------------


def _lengths_to_tensor(lengths, device=None):
    return torch.tensor(lengths, dtype=torch.long, device=device)


# =====================================================================================================
class ReversalTask(Task):
    """``qwhdkeoazu`` -> ``uzaoekdhwq``: per-position classification with an encoder."""

    name, model_kind = "reversal", "encoder"
    columns = ("source", "target")
    seq_len = 10
    src_vocab = list(string.ascii_lowercase)
    tgt_vocab = list(string.ascii_lowercase)

    def draw(self, rng):
        src = "".join(rng.choice(self.src_vocab) for _ in range(self.seq_len))
        return (src, src[::-1])

    def collate(self, examples, device=None):
        src = torch.tensor([self.encode(s) for s, _ in examples], device=device)  # (B, L)
        tgt = torch.tensor([self.encode(t, "tgt") for _, t in examples], device=device)  # (B, L)
        return Batch(src=src, tgt_out=tgt, loss_mask=torch.ones_like(tgt, dtype=torch.bool), examples=list(examples))

    def default_config(self):
        return ModelConfig(
            "encoder",
            len(self.src_vocab),
            len(self.tgt_vocab),
            num_hiddens=64,
            num_heads=4,
            ffn_num_hiddens=128,
            num_enc_layers=1,
            num_dec_layers=0,
            max_len=self.seq_len,
        )

    def forward(self, model, batch, head_mask=None):
        return model(batch.src, valid_lens=batch.valid_lens, head_mask=head_mask)


# =====================================================================================================
class InductionTask(Task):
    """``KDPA`` + ``KDPA``: predict each repeated letter; only the predictable ones count.

    A sequence is n distinct random letters (n from ``min_run`` to ``max_run``)
    followed by the same n letters, right-padded with <pad>. Position p holds
    token t_p and predicts t_{p+1}; the positions n .. 2n-2 (whose next token is
    a repeat that has a unique earlier copy) make up ``loss_mask``. The run
    length varies, so no fixed positional offset solves the task: the model has
    to find the earlier copy by content.
    """

    name, model_kind = "induction", "decoder"
    columns = ("sequence",)
    min_run, max_run = 6, 12
    letters = list(string.ascii_uppercase[:16])
    src_vocab = [PAD] + letters
    tgt_vocab = [PAD] + letters

    def draw(self, rng):
        run = "".join(rng.sample(self.letters, rng.randint(self.min_run, self.max_run)))
        return (run + run,)

    def key(self, example):
        return example[0][: len(example[0]) // 2]

    def collate(self, examples, device=None):
        T = 2 * self.max_run
        tokens = torch.zeros(len(examples), T, dtype=torch.long)  # (B, T), 0 = <pad>
        loss_mask = torch.zeros(len(examples), T, dtype=torch.bool)  # (B, T)
        for b, (seq,) in enumerate(examples):
            n = len(seq) // 2
            tokens[b, : 2 * n] = torch.tensor(self.encode(seq, "tgt"))
            loss_mask[b, n : 2 * n - 1] = True
        targets = torch.cat([tokens[:, 1:], torch.zeros(len(examples), 1, dtype=torch.long)], dim=1)  # (B, T)
        return Batch(
            tgt_in=tokens.to(device),
            tgt_out=targets.to(device),
            loss_mask=loss_mask.to(device),
            tgt_valid_lens=torch.tensor([len(seq) for (seq,) in examples], device=device),  # right-padded runs
            examples=list(examples),
        )

    def default_config(self):
        return ModelConfig(
            "decoder",
            0,
            len(self.tgt_vocab),
            num_hiddens=64,
            num_heads=4,
            ffn_num_hiddens=0,
            num_enc_layers=0,
            num_dec_layers=2,
            max_len=2 * self.max_run,
        )

    def forward(self, model, batch, head_mask=None):
        return model(batch.tgt_in, head_mask=head_mask)


# =====================================================================================================
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]  # date.weekday() order

# Ten ways people write 2026-11-21. Field names: Weekday/Wkd (Saturday/Sat), Month/Mon (November/Nov),
# m/mm (11, zero-padded), d/dd/dth (21, zero-padded, 21st), Y/yy (2026, 26).
DATE_FORMATS = (
    "{d} {Mon} {Y}",  # 21 Nov 2026
    "{Weekday}, {Month} {d}, {Y}",  # Saturday, November 21, 2026
    "{m}/{d}/{yy}",  # 11/21/26  (US order, two-digit year)
    "{Y}.{mm}.{dd}",  # 2026.11.21
    "{Month} {dth}, {Y}",  # November 21st, 2026
    "{dd}.{mm}.{Y}",  # 21.11.2026
    "{Wkd}, {d} {Mon} {Y}",  # Sat, 21 Nov 2026
    "{d} {Month} {Y}",  # 21 November 2026
    "{Mon} {d}, {Y}",  # Nov 21, 2026
    "{Weekday} {dth} {Month} {Y}",  # Saturday 21st November 2026
)
FIELD_OF = {
    "Weekday": "weekday",
    "Wkd": "weekday",
    "Month": "month",
    "Mon": "month",
    "m": "month",
    "mm": "month",
    "d": "day",
    "dd": "day",
    "dth": "day",
    "Y": "year",
    "yy": "year",
}
FIRST_DAY, LAST_DAY = datetime.date(1950, 1, 1), datetime.date(2049, 12, 31)  # two-digit years: 50-99 -> 19xx


def ordinal(n: int) -> str:
    """1 -> 1st, 2 -> 2nd, 3 -> 3rd, 11 -> 11th, 22 -> 22nd."""
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def render_date(date: datetime.date, fmt: str) -> tuple[str, dict[str, tuple[int, int]]]:
    """Write ``date`` in format ``fmt``; also return each field's character span {field: (start, end)}."""
    values = {
        "Weekday": WEEKDAYS[date.weekday()],
        "Wkd": WEEKDAYS[date.weekday()][:3],
        "Month": MONTHS[date.month - 1],
        "Mon": MONTHS[date.month - 1][:3],
        "m": str(date.month),
        "mm": f"{date.month:02d}",
        "d": str(date.day),
        "dd": f"{date.day:02d}",
        "dth": ordinal(date.day),
        "Y": f"{date.year:04d}",
        "yy": f"{date.year % 100:02d}",
    }
    text, spans = "", {}
    for literal, field, _, _ in string.Formatter().parse(fmt):
        text += literal
        if field is not None:
            spans[FIELD_OF[field]] = (len(text), len(text) + len(values[field]))
            text += values[field]
    return text, spans


def _date_chars() -> list[str]:
    chars = set(string.digits + " ,./")
    for name in MONTHS + WEEKDAYS:
        chars |= set(name)
    chars |= set("stndrh")  # ordinal suffixes
    return sorted(chars)


class DatesTask(Task):
    """``Saturday, November 21, 2026`` -> ``2026-11-21`` with an encoder-decoder, character by character.

    Columns: source, target, format (the template in ``DATE_FORMATS``). Source
    batches are right-padded with <pad> and carry ``valid_lens``; the decoder
    reads <bos> + target[:-1] and predicts the target (always 10 characters).
    The held-out key is the calendar day itself, so evaluation days are days
    the model never saw in any form.
    """

    name, model_kind = "dates", "encoder_decoder"
    columns = ("source", "target", "format")
    src_vocab = [PAD] + _date_chars()
    tgt_vocab = [BOS] + list(string.digits) + ["-"]
    target_len = 10
    max_src_len = 32

    def draw(self, rng):
        date = FIRST_DAY + datetime.timedelta(days=rng.randrange((LAST_DAY - FIRST_DAY).days + 1))
        fmt = rng.choice(DATE_FORMATS)
        return (render_date(date, fmt)[0], date.isoformat(), fmt)

    def key(self, example):
        return example[1]

    def collate(self, examples, device=None):
        lens = [len(src) for src, _, _ in examples]
        src = torch.zeros(len(examples), max(lens), dtype=torch.long)  # (B, S), 0 = <pad>
        for b, (s, _, _) in enumerate(examples):
            src[b, : len(s)] = torch.tensor(self.encode(s))
        tgt = torch.tensor([self.encode(t, "tgt") for _, t, _ in examples])  # (B, 10)
        bos = torch.full((len(examples), 1), self.tgt_stoi[BOS], dtype=torch.long)
        tgt_in = torch.cat([bos, tgt[:, :-1]], dim=1)  # (B, 10): <bos> y0 .. y8
        return Batch(
            src=src.to(device),
            valid_lens=_lengths_to_tensor(lens, device),
            tgt_in=tgt_in.to(device),
            tgt_out=tgt.to(device),
            loss_mask=torch.ones_like(tgt, dtype=torch.bool, device=device),
            examples=list(examples),
        )

    def default_config(self):
        return ModelConfig(
            "encoder_decoder",
            len(self.src_vocab),
            len(self.tgt_vocab),
            num_hiddens=64,
            num_heads=4,
            ffn_num_hiddens=128,
            num_enc_layers=2,
            num_dec_layers=1,
            max_len=self.max_src_len,
        )

    def forward(self, model, batch, head_mask=None):
        return model(batch.src, batch.tgt_in, src_valid_lens=batch.valid_lens, head_mask=head_mask)

    def predict(self, model, batch: Batch, head_mask=None) -> torch.Tensor:
        """Greedy decoding: (B, 10) predicted target ids."""
        return model.greedy_decode(batch.src, self.target_len, self.tgt_stoi[BOS], batch.valid_lens, head_mask)

    def loss_and_accuracy(self, model, batch, head_mask=None):
        """(teacher-forced cross-entropy, exact match of whole dates under greedy decoding)."""
        logits = self.forward(model, batch, head_mask)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten())
        pred = self.predict(model, batch, None if head_mask is None else head_mask.detach())
        return loss, float((pred == batch.tgt_out).all(dim=1).float().mean())


# =====================================================================================================
TASKS: dict[str, type[Task]] = {"reversal": ReversalTask, "induction": InductionTask, "dates": DatesTask}
_INSTANCES: dict[str, Task] = {}


def get_task(name: str) -> Task:
    """The task called ``name`` (``reversal``, ``induction`` or ``dates``)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    if name not in _INSTANCES:
        _INSTANCES[name] = TASKS[name]()
    return _INSTANCES[name]


def load_split(name: str, split: str = "eval") -> list[tuple[str, ...]]:
    """The committed examples of ``mha_tutorial/data/<name>_<split>.tsv`` (split: ``eval`` or ``importance``)."""
    return get_task(name).load_split(split)


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="(Re)write the committed evaluation splits in mha_tutorial/data/.")
    parser.add_argument(
        "--write-splits", action="store_true", help="write mha_tutorial/data/<task>_<split>.tsv for every task"
    )
    args = parser.parse_args(argv)
    if not args.write_splits:
        parser.error("nothing to do: pass --write-splits")
    for name in TASKS:
        for split in SPLIT_SEEDS:
            print(get_task(name).write_split(split))


if __name__ == "__main__":
    main()
