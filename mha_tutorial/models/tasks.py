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
``data/`` (``<task>_eval.tsv``, ``<task>_importance.tsv``). Every
task splits its examples by a hash of a key (the letters / the repeated run /
the calendar day): one in ten keys is *held out*. Training draws only the other
nine, the committed splits only held-out ones, so no evaluation example (and,
for dates, no evaluation day) is ever seen in training.
The ``Batch`` of tensors and the ``Task`` base class that all three share are in
``task_base``.

    task = get_task("dates")
    batch = task.make_batch(64, torch.Generator().manual_seed(0))   # a Batch of tensors
    loss, acc = task.loss_and_accuracy(model, batch)                 # the shared metric
    rows = load_split("dates", "eval")                                # committed examples
"""

from __future__ import annotations

import datetime
import string

import torch
from torch.nn import functional as F

from . import _validate_experiments as validate
from . import _validate_training as validate_training
from .model import ModelConfig

# What every task shares lives in task_base; it stays importable from here (tasks.Task, tasks.DATA_DIR, ...).
from .task_base import BOS, PAD, SPLIT_SEEDS, Batch, Task
from .task_base import DATA_DIR as DATA_DIR
from .task_base import HOLDOUT_MODULUS as HOLDOUT_MODULUS
from .task_base import SPLIT_SIZE as SPLIT_SIZE
from .task_base import is_heldout as is_heldout

__all__ = ["DATE_FORMATS", "TASKS", "get_task", "load_split", "render_date"]


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
        examples = validate.examples_for(examples, self, "collate")  # a list of (source, target)
        src_ids = [self.encode(s) for s, _ in examples]  # a character outside the vocabulary raises here
        tgt_ids = [self.encode(t, "tgt") for _, t in examples]
        length = len(examples[0][0])
        for source, target in examples:
            if len(source) != length or len(target) != length:
                raise ValueError(
                    f"reversal: a batch's sources and targets must all have one length ({length}: "
                    f"{examples[0][0]!r}), got {(source, target)!r}"
                )
        src = torch.tensor(src_ids, device=device)  # (B, L)
        tgt = torch.tensor(tgt_ids, device=device)  # (B, L)
        return Batch(src=src, tgt_out=tgt, loss_mask=torch.ones_like(tgt, dtype=torch.bool), examples=examples)

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
        examples = validate.examples_for(examples, self, "collate")  # a list of (sequence,)
        ids = [self.encode(seq, "tgt") for (seq,) in examples]  # a character outside the vocabulary raises here
        for (seq,) in examples:
            if len(seq) % 2 or len(seq) > 2 * self.max_run:
                raise ValueError(
                    f"induction: a sequence is a run written twice, an even number of letters up to "
                    f"{2 * self.max_run}; got {seq!r} ({len(seq)} letters)"
                )
        validate_training.induction_runs(examples)
        T = 2 * self.max_run
        tokens = torch.zeros(len(examples), T, dtype=torch.long)  # (B, T), 0 = <pad>
        loss_mask = torch.zeros(len(examples), T, dtype=torch.bool)  # (B, T)
        for b, (seq,) in enumerate(examples):
            n = len(seq) // 2
            tokens[b, : 2 * n] = torch.tensor(ids[b])
            loss_mask[b, n : 2 * n - 1] = True
        targets = torch.cat([tokens[:, 1:], torch.zeros(len(examples), 1, dtype=torch.long)], dim=1)  # (B, T)
        return Batch(
            tgt_in=tokens.to(device),
            tgt_out=targets.to(device),
            loss_mask=loss_mask.to(device),
            tgt_valid_lens=torch.tensor([len(seq) for (seq,) in examples], device=device),  # right-padded runs
            examples=examples,
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
        examples = validate.examples_for(examples, self, "collate")  # a list of (source, target, format)
        src_ids = [self.encode(s) for s, _, _ in examples]  # a character outside the vocabulary raises here
        tgt_ids = [self.encode(t, "tgt") for _, t, _ in examples]
        for _, target, _ in examples:
            if len(target) != self.target_len:
                raise ValueError(
                    f"dates: a target is a {self.target_len}-character date like 2026-11-21, got {target!r}"
                )
        lens = [len(ids) for ids in src_ids]
        src = torch.zeros(len(examples), max(lens), dtype=torch.long)  # (B, S), 0 = <pad>
        for b, ids in enumerate(src_ids):
            src[b, : len(ids)] = torch.tensor(ids)
        tgt = torch.tensor(tgt_ids)  # (B, 10)
        bos = torch.full((len(examples), 1), self.tgt_stoi[BOS], dtype=torch.long)
        tgt_in = torch.cat([bos, tgt[:, :-1]], dim=1)  # (B, 10): <bos> y0 .. y8
        return Batch(
            src=src.to(device),
            valid_lens=_lengths_to_tensor(lens, device),
            tgt_in=tgt_in.to(device),
            tgt_out=tgt.to(device),
            loss_mask=torch.ones_like(tgt, dtype=torch.bool, device=device),
            examples=examples,
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
        validate_training.loss_inputs(model, self, batch)
        logits = self.forward(model, batch, head_mask)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten())
        pred = self.predict(model, batch, None if head_mask is None else head_mask.detach())
        return loss, float((pred == batch.tgt_out).all(dim=1).float().mean())


# =====================================================================================================
TASKS: dict[str, type[Task]] = {"reversal": ReversalTask, "induction": InductionTask, "dates": DatesTask}
_INSTANCES: dict[str, Task] = {}


def get_task(name: str) -> Task:
    """The task called ``name`` (``reversal``, ``induction`` or ``dates``)."""
    validate_training.name(name, "task name")
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    if name not in _INSTANCES:
        _INSTANCES[name] = TASKS[name]()
    return _INSTANCES[name]


def load_split(name: str, split: str = "eval") -> list[tuple[str, ...]]:
    """The committed examples of ``data/<name>_<split>.tsv`` (split: ``eval`` or ``importance``)."""
    return get_task(name).load_split(split)


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="(Re)write the committed evaluation splits in data/.")
    parser.add_argument("--write-splits", action="store_true", help="write data/<task>_<split>.tsv for every task")
    args = parser.parse_args(argv)
    if not args.write_splits:
        parser.error("nothing to do: pass --write-splits")
    for name in TASKS:
        for split in SPLIT_SEEDS:
            print(get_task(name).write_split(split))


if __name__ == "__main__":
    main()
