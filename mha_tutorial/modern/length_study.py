"""Length generalisation of three ways to give attention positions (notebook 12): learned, sinusoidal, rotary.

The task is notebook 05's induction task with a longer alphabet: a run of n distinct letters written twice; each
letter of the second copy is predicted from its earlier copy (``tasks.InductionTask``). Every model trains on runs
of ``TRAIN_RUNS`` letters -- sequences of at most 16 tokens -- and is scored on runs of every length from 3 to 24
letters, so on sequences up to three times longer than any it was trained on. The models differ only in
``ModelConfig.position``; all are built with ``max_len = MAX_LEN`` so that each can read the long sequences (the
learned table's rows past 15 are never trained: every training batch is padded to 16 tokens, so they get a zero
gradient, and only AdamW's weight decay moves them, shrinking their random initial values slightly).

Two ways to leave the training distribution are scored apart: longer runs starting at position 0 (the copy sits
further back: unseen *offsets*, and unseen positions), and trained run lengths moved to later positions (``start``:
the same offsets, at unseen *positions*).

``python -m mha_tutorial.modern.length_study`` trains ``len(SEEDS)`` models per position (a few minutes on a 2-core CPU),
writes one row per (position, seed, run length, start) to ``STUDY_PATH`` -- the per-token accuracy over the repeated
letters of ``EVAL_EXAMPLES`` held-out runs -- and saves the seed-0 models beside the series' checkpoints. Notebook 12
loads those models, scores them live against the shipped seed-0 rows, and reads the shipped rows of all seeds
(``read_study``, ``same_at_every_start``, ``plot_study``); tests/experiments/test_length_study.py recomputes rows live.
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

import torch

from ..device import describe_machine
from ..models.model import ModelConfig, build_model
from ..models.task_base import DATA_DIR, PAD
from ..models.tasks import InductionTask
from ..models.train import TrainSettings, _optimise

POSITIONS = ("learned", "sinusoidal", "rope")
TRAIN_RUNS = (3, 8)  # run lengths seen in training: sequences of 6 .. 16 tokens
TEST_RUNS = tuple(range(3, 25))  # run lengths scored: up to 24 letters, 48 tokens
MAX_LEN = 2 * TEST_RUNS[-1]  # 48 positions: every model can read the longest test sequence
SEEDS = tuple(range(5))
SETTINGS = TrainSettings(steps=500, batch_size=64, lr=3e-3, warmup=50)
EVAL_EXAMPLES = 200  # held-out runs per length
EVAL_SEED = 12  # the seed of the evaluation runs (the training stream uses the model's seed)
STARTS = (0, 8, 16, 24, 32)  # first positions of the shifted runs (a run of 8 then ends at position 47)
STUDY_PATH = DATA_DIR / "length_study.csv"
CHECKPOINTS = {position: DATA_DIR / "checkpoints" / f"length-{position}.pt" for position in POSITIONS}  # seed 0
BANDS = {"trained (3-8)": (3, 8), "9-12": (9, 12), "13-16": (13, 16), "17-24": (17, 24)}


class LongInductionTask(InductionTask):
    """The induction task over 24 letters with runs of ``min_run`` .. ``max_run`` letters (sequences padded to
    2 * ``max_run`` tokens)."""

    name = "induction-long"
    letters = list(string.ascii_uppercase[:24])
    src_vocab = [PAD] + letters
    tgt_vocab = [PAD] + letters

    def __init__(self, min_run: int = TRAIN_RUNS[0], max_run: int = TRAIN_RUNS[1]):
        if not 2 <= min_run <= max_run <= len(self.letters):
            raise ValueError(f"runs must satisfy 2 <= min_run <= max_run <= 24, got {min_run} and {max_run}")
        super().__init__()
        self.min_run, self.max_run = min_run, max_run


def study_config(position: str) -> ModelConfig:
    """Notebook 05's induction model (2 attention-only layers, 4 heads, 64 wide) with ``position`` and 48 positions."""
    vocab = len(LongInductionTask.tgt_vocab)
    return ModelConfig(
        "decoder",
        0,
        vocab,
        num_hiddens=64,
        num_heads=4,
        ffn_num_hiddens=0,
        num_enc_layers=0,
        num_dec_layers=2,
        max_len=MAX_LEN,
        position=position,
    )


def train_model(position: str, seed: int = 0, settings: TrainSettings = SETTINGS, num_threads: int = 1):
    """A fresh model with ``position`` trained on runs of 3 .. 8 letters; ``seed`` seeds the weights and the batches.
    Returns the model in eval mode, on the CPU."""
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        torch.manual_seed(seed)
        model = build_model(study_config(position))
        _optimise(model, LongInductionTask(), settings, torch.Generator().manual_seed(seed), progress=False)
    finally:
        torch.set_num_threads(previous)
    return model.eval()


@torch.no_grad()
def accuracy_by_length(
    model, runs=TEST_RUNS, n: int = EVAL_EXAMPLES, seed: int = EVAL_SEED, start: int = 0
) -> dict[int, float]:
    """{run length: per-token accuracy on the repeated letters of ``n`` held-out runs of exactly that length},
    with the tokens at positions ``start``, ``start + 1``, ... (the same runs whatever ``start`` is), on the
    model's device."""
    out, device = {}, next(model.parameters()).device
    for run in runs:
        task = LongInductionTask(run, run)
        batch = task.collate(task.sample(n, seed + run, heldout=True), device)  # (n, 2 * run) tokens
        positions = torch.arange(start, start + 2 * run, device=device)  # (T,)
        logits = model(batch.tgt_in, positions=positions)  # (n, T, V)
        hits = logits.argmax(-1)[batch.loss_mask] == batch.tgt_out[batch.loss_mask]  # the positions that count
        out[run] = hits.sum().item() / hits.numel()  # a fraction of counted letters, exactly
    return out


def save_model(model, path, seed: int) -> Path:
    """A study model as {"config", "state_dict", "seed", "settings"} (read back by ``load_model``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    settings = {k: getattr(SETTINGS, k) for k in ("steps", "batch_size", "lr", "warmup")}
    torch.save({"config": model.config.to_dict(), "state_dict": state, "seed": seed, "settings": settings}, path)
    return path


def load_model(position: str, path=None):
    """The shipped seed-0 model of the study with ``position`` (in eval mode, on the CPU)."""
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    path = Path(CHECKPOINTS[position] if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"no model at {path}; make it with: python -m mha_tutorial.modern.length_study")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved["config"] != study_config(position).to_dict():
        raise ValueError(f"{path} holds a model of another configuration than study_config({position!r})")
    with torch.random.fork_rng(devices=[]):  # the initial weights are overwritten: keep the caller's random stream
        model = build_model(saved["config"])
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def evaluate_model(model, position: str, seed: int) -> list[dict]:
    """The study's rows for one model: every run length from position 0, and the trained lengths shifted."""
    rows = [
        {"position": position, "seed": seed, "run": run, "start": 0, "accuracy": acc}
        for run, acc in accuracy_by_length(model).items()
    ]
    trained = range(TRAIN_RUNS[0], TRAIN_RUNS[1] + 1)
    for start in STARTS[1:]:
        rows += [
            {"position": position, "seed": seed, "run": run, "start": start, "accuracy": acc}
            for run, acc in accuracy_by_length(model, trained, start=start).items()
        ]
    return rows


def run_study(seeds=SEEDS, positions=POSITIONS, save: bool = False, progress: bool = True):
    """Train and score every (position, seed): a DataFrame with columns position, seed, run, start, accuracy.
    ``save``: write the seed-0 models to ``CHECKPOINTS``."""
    import pandas as pd

    rows = []
    for position in positions:
        for seed in seeds:
            model = train_model(position, seed)
            if save and seed == 0:
                save_model(model, CHECKPOINTS[position], seed)
            rows += evaluate_model(model, position, seed)
            if progress:
                print(f"{position:>10} seed {seed}: done", flush=True)
    return pd.DataFrame(rows)


def read_study(path=None):
    """The shipped study (``STUDY_PATH``): the DataFrame ``run_study`` returns, plus a ``machine`` column."""
    import pandas as pd

    path = Path(STUDY_PATH if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no study at {path}; make it with: python -m mha_tutorial.modern.length_study --out {path}"
        )
    return pd.read_csv(path)


def _per_seed(study):
    """{(position, column): per-seed mean accuracies}: columns are the bands of run lengths from position 0, then
    "start s" for the trained lengths moved to position s."""
    cells = {}
    from_zero = study[study.start == 0]
    for position in study.position.unique():
        rows = from_zero[from_zero.position == position]
        for band, (lo, hi) in BANDS.items():
            cells[position, band] = rows[rows.run.between(lo, hi)].groupby("seed").accuracy.mean()
        trained = study[(study.position == position) & study.run.between(*TRAIN_RUNS)]
        for start in STARTS:
            cells[position, f"start {start}"] = trained[trained.start == start].groupby("seed").accuracy.mean()
    return cells


def summary(study):
    """The study in numbers: a DataFrame indexed by (position, column) with the seeds' min, mean and max accuracy.
    Two positions differ beyond the noise of the seeds in a column where their [min, max] ranges do not overlap."""
    import pandas as pd

    rows = {key: {"min": acc.min(), "mean": acc.mean(), "max": acc.max()} for key, acc in _per_seed(study).items()}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(["position", "column"])


def table(study, columns):
    """``mean [min, max]`` over the seeds, one row per position, for the given columns of ``summary``."""
    import pandas as pd

    numbers = summary(study)
    cells = {
        position: {c: "{mean:.2f} [{min:.2f}, {max:.2f}]".format(**numbers.loc[(position, c)]) for c in columns}
        for position in study.position.unique()
    }
    return pd.DataFrame.from_dict(cells, orient="index").rename_axis("position")


def same_at_every_start(study, position: str) -> bool:
    """Whether every seed of ``position`` scores each trained run length exactly as at start 0 at every start."""
    rows = study[(study.position == position) & study.run.between(*TRAIN_RUNS)]
    by_start = rows.pivot_table("accuracy", ["seed", "run"], "start")  # one row per (seed, run), a column per start
    return all(by_start[start].equals(by_start[0]) for start in STARTS[1:])


def plot_study(study, live=None):
    """Two panels on one accuracy scale. Left: accuracy against run length from position 0. Right: the trained
    lengths moved to later positions. One colour per position: each seed a thin line, the mean a thick one; chance
    (1 in 24 letters) dashed; ``live`` ({position: DataFrame of ``evaluate_model`` rows}) drawn as crosses."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 4.0), sharey=True, layout="constrained")
    left.axvspan(TRAIN_RUNS[0] - 0.5, TRAIN_RUNS[1] + 0.5, color="0.9", label="trained lengths")
    trained = study[study.run.between(*TRAIN_RUNS)]
    for i, position in enumerate(study.position.unique()):
        rows = study[(study.position == position) & (study.start == 0)]
        shifted = trained[trained.position == position].groupby(["seed", "start"]).accuracy.mean().reset_index()
        for _, seed_rows in rows.groupby("seed"):
            left.plot(seed_rows.run, seed_rows.accuracy, color=f"C{i}", lw=0.6, alpha=0.5)
        for _, seed_rows in shifted.groupby("seed"):
            right.plot(seed_rows.start, seed_rows.accuracy, color=f"C{i}", lw=0.6, alpha=0.5)
        mean = rows.groupby("run").accuracy.mean()
        left.plot(mean.index, mean.values, color=f"C{i}", lw=2.2, label=f"{position} (mean of {rows.seed.nunique()})")
        mean = shifted.groupby("start").accuracy.mean()
        right.plot(mean.index, mean.values, color=f"C{i}", lw=2.2, marker="o", ms=4)
        if live is not None and position in live:
            mine = live[position]
            at_zero = mine[mine.start == 0]
            left.plot(at_zero.run, at_zero.accuracy, "x", color=f"C{i}", ms=6, label=f"{position}, seed 0 scored here")
            moved = mine[mine.run.between(*TRAIN_RUNS)].groupby("start").accuracy.mean()
            right.plot(moved.index, moved.values, "x", color=f"C{i}", ms=8)
    for ax in (left, right):
        ax.axhline(1 / len(LongInductionTask.letters), color="0.3", ls="--", lw=1)
        ax.grid(alpha=0.3)
    left.set(xlabel="letters per run (from position 0)", ylabel="accuracy on the repeated letters")
    left.set(ylim=(0, 1.02), xticks=[3, 6, 8, 12, 16, 20, 24], title="longer runs: the copy further back")
    right.set(xlabel="first position (runs of 3-8 letters)", xticks=list(STARTS))
    right.set(title="trained runs, at later positions")
    left.plot([], [], color="0.3", ls="--", lw=1, label="chance (1/24)")
    left.plot([], [], color="0.3", lw=0.6, alpha=0.5, label="one seed (thin lines)")
    fig.legend(*left.get_legend_handles_labels(), loc="outside right upper", fontsize=9)
    return fig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=STUDY_PATH, help="where to write the CSV (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="models per position (default: %(default)s)")
    parser.add_argument("--no-save", action="store_true", help="do not overwrite the shipped seed-0 models")
    args = parser.parse_args(argv)
    study = run_study(seeds=range(args.seeds), save=not args.no_save)
    study["machine"] = describe_machine()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    study.to_csv(args.out, index=False)
    print(table(study, list(BANDS)).to_string())
    print(table(study, [f"start {s}" for s in STARTS]).to_string())
    print(f"wrote {len(study)} rows to {args.out}")


if __name__ == "__main__":
    main()
