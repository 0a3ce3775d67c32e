"""Train the tiny transformers of notebook 05, save and load their checkpoints.

    python -m mha_tutorial.models.train --task reversal --out data/checkpoints/reversal.pt

``train`` is a plain seeded loop (AdamW, linear warmup then cosine decay,
gradient clipping) on fresh batches drawn from the task's generator; it
evaluates on the committed split ``data/<task>_eval.tsv``. ``load_pretrained``
reads the committed checkpoints in ``data/checkpoints/`` with
``torch.load(..., weights_only=True)``: a checkpoint holds only tensors, dicts,
lists, strings and numbers.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm  # the plain text bar: tqdm.auto would need ipywidgets (not installed) in notebooks

from ..device import get_device
from . import _validate_experiments as validate
from . import _validate_training as validate_training
from .model import ModelConfig, TinyTransformer, build_model
from .tasks import DATA_DIR, TASKS, get_task

__all__ = [
    "DEFAULT_SETTINGS",
    "CheckpointNotFoundError",
    "TrainSettings",
    "evaluate",
    "load_pretrained",
    "read_checkpoint",
    "save_checkpoint",
    "train",
]

CHECKPOINT_DIR = DATA_DIR / "checkpoints"
CHECKPOINT_FORMAT = 1


class CheckpointNotFoundError(FileNotFoundError, ValueError):
    """No file at a checkpoint's path: a ``FileNotFoundError``, and a ``ValueError`` like every other bad argument."""


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings of one training run (the CLI's defaults are ``DEFAULT_SETTINGS``)."""

    steps: int
    batch_size: int
    lr: float
    warmup: int
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 0  # 0: evaluate only at the end

    def __post_init__(self):
        validate_training.train_settings(self)


DEFAULT_SETTINGS = {
    "reversal": TrainSettings(steps=300, batch_size=64, lr=3e-3, warmup=30, eval_every=100),
    "induction": TrainSettings(steps=500, batch_size=64, lr=3e-3, warmup=50, eval_every=100),
    "dates": TrainSettings(steps=1000, batch_size=64, lr=3e-3, warmup=100, eval_every=250),
}


def default_threads() -> int:
    """CPU threads for training: 1.

    The matrices of these models are tiny (64 wide, a few thousand rows), so a
    second thread buys little (about 1.2x on the dates task on a 2-core CPU),
    while extra threads on cores that are busy with other work can make a step
    many times slower. Pass ``num_threads`` to ``train`` to use more (it is
    capped at the number of cores this process may use).
    """
    return 1


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def lr_lambda(step: int, settings: TrainSettings) -> float:
    """Linear warmup to 1, then cosine decay to 0.05 (a multiplier of the base learning rate)."""
    if step < settings.warmup:
        return (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return 0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(
    model: TinyTransformer, task_name: str, split: str = "eval", examples=None, batch_size: int = 500, head_mask=None
) -> dict:
    """Loss and accuracy of ``model`` on a committed split (or on ``examples``).

    Accuracy: per-token for reversal and induction (over the positions that
    count), whole-date exact match under greedy decoding for dates. Returns
    {"loss": float, "accuracy": float, "n": number of examples}.
    """
    task = get_task(task_name)
    validate.model_for_task(model, task)
    examples = validate.examples_for(task.load_split(split) if examples is None else examples, task, "evaluate")
    validate.positive_count(batch_size, "batch_size")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_loss, total_acc, total_w = 0.0, 0.0, 0
    try:
        for i in range(0, len(examples), batch_size):
            batch = task.collate(examples[i : i + batch_size], device)
            loss, acc = task.loss_and_accuracy(model, batch, head_mask)
            # Weight by the positions (or examples) that count, so the result equals one big batch.
            w = int(batch.loss_mask.sum()) if task.name != "dates" else len(batch)
            total_loss += float(loss) * w
            total_acc += acc * w
            total_w += w
    finally:
        model.train(was_training)
    return {"loss": total_loss / total_w, "accuracy": total_acc / total_w, "n": len(examples)}


def _optimise(model, task, settings: TrainSettings, generator: torch.Generator, progress: bool) -> dict:
    """``settings.steps`` steps of AdamW (warmup, cosine decay, gradient clipping) on fresh batches drawn with
    ``generator`` (the batch stream, independent of the initial weights); evaluates every ``settings.eval_every``.

    Returns {"loss": [per step], "lr": [per step], "eval_step": [...], "eval_accuracy": [...]}.
    """
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, settings))
    history = {"loss": [], "lr": [], "eval_step": [], "eval_accuracy": []}
    model.train()
    bar = tqdm(range(settings.steps), desc=f"train {task.name}", disable=not progress, leave=False)
    for step in bar:
        batch = task.make_batch(settings.batch_size, generator, device)
        logits = task.forward(model, batch)  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits[batch.loss_mask], batch.tgt_out[batch.loss_mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        history["lr"].append(sched.get_last_lr()[0])
        sched.step()
        history["loss"].append(loss.item())
        if settings.eval_every and (step + 1) % settings.eval_every == 0 and step + 1 < settings.steps:
            history["eval_step"].append(step + 1)
            history["eval_accuracy"].append(evaluate(model, task.name)["accuracy"])
        if step % 20 == 0:
            bar.set_postfix(loss=f"{history['loss'][-1]:.3f}", refresh=False)
    bar.close()
    return history


def train(
    task_name: str,
    config: ModelConfig | None = None,
    steps: int | None = None,
    seed: int = 0,
    device=None,
    progress: bool = True,
    settings: TrainSettings | None = None,
    num_threads: int | None = None,
    **overrides,
):
    """Train a fresh model on ``task_name``; return ``(model, history)``.

    Args:
        config: model sizes (default: ``get_task(task_name).default_config()``).
        steps: optimisation steps (default: the task's ``DEFAULT_SETTINGS``).
        seed: seeds the initial weights and the stream of training batches.
        device: where to train (default: ``get_device()``, the GPU when there is one).
        progress: show a tqdm progress bar.
        settings: all optimisation settings at once; ``overrides`` (e.g.
            ``lr=1e-3, batch_size=32``) replace single fields.
        num_threads: CPU threads during training (default ``default_threads()``);
            the previous setting is restored afterwards.

    history: {"loss": [training loss, one per step], "lr": [learning rate per step],
    "eval_step": [...], "eval_accuracy": [accuracy on the committed eval split
    at those steps; the last entry is the final model], "accuracy": final eval
    accuracy, "eval_loss": its loss, "train_time_s": wall seconds (including
    the evaluations), "settings": the TrainSettings as a dict, "seed", "device"}.
    """
    task = get_task(task_name)
    validate_training.train_args(task, config, settings, overrides, seed, device, num_threads, TrainSettings)
    config = config or task.default_config()
    settings = settings or DEFAULT_SETTINGS[task_name]
    if steps is not None:
        overrides["steps"] = steps
    settings = replace(settings, **overrides)
    device = torch.device(device) if device is not None else get_device()

    previous_threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(num_threads or default_threads(), available_cores())))
    try:
        start = time.perf_counter()
        torch.manual_seed(seed)
        model = build_model(config).to(device)
        history = _optimise(model, task, settings, torch.Generator().manual_seed(seed), progress)
        history.update(settings=asdict(settings), seed=seed, device=device.type)
        final = evaluate(model, task_name)
        history["eval_step"].append(settings.steps)
        history["eval_accuracy"].append(final["accuracy"])
        history["accuracy"], history["eval_loss"] = final["accuracy"], final["loss"]
        history["train_time_s"] = time.perf_counter() - start
    finally:
        torch.set_num_threads(previous_threads)
    model.eval()
    return model, history


# ---- checkpoints ------------------------------------------------------------------------------


def train_command(task_name: str) -> str:
    return f"python -m mha_tutorial.models.train --task {task_name} --out data/checkpoints/{task_name}.pt"


def save_checkpoint(path, model: TinyTransformer, task_name: str, history: dict) -> Path:
    """Write ``model`` and what made it (``history`` from ``train``) so that
    ``torch.load(path, weights_only=True)`` can read it back."""
    validate_training.checkpoint_path(path)
    validate.model_for_task(model, get_task(task_name))
    validate_training.train_history(history)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "task": task_name,
        "config": model.config.to_dict(),
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "train": {
            **history["settings"],
            "seed": history["seed"],
            "device": history["device"],
            "torch": str(torch.__version__),
        },
        "metrics": {
            "eval_accuracy": float(history["accuracy"]),
            "eval_loss": float(history["eval_loss"]),
            "train_time_s": float(history["train_time_s"]),
            "final_train_loss": float(history["loss"][-1]),
        },
    }
    torch.save(checkpoint, path)
    return path


def read_checkpoint(path) -> dict:
    """The checkpoint dict at ``path``.

    Raises ``CheckpointNotFoundError`` (a FileNotFoundError and a ValueError) if there is no file, TypeError if
    ``path`` is not a path, ValueError, naming the field, if the file is unreadable or a field is missing or
    malformed: ``task`` (a known task), ``config`` (ModelConfig's fields), ``state_dict`` ({name: tensor},
    finite), ``metrics`` ({name: number}).
    """
    validate_training.checkpoint_path(path)
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"no checkpoint at {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways (zip, pickle, EOF, IndexError...)
        raise ValueError(f"{path} is not a readable checkpoint (corrupt or not made by torch.save): {e}") from None
    required = ("format", "task", "config", "state_dict", "metrics")
    if not isinstance(checkpoint, dict) or any(k not in checkpoint for k in required):
        got = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"{path} is not a checkpoint of this package: expected keys {required}, got {got}")
    if checkpoint["format"] != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} has checkpoint format {checkpoint['format']!r}; this version of the package reads format "
            f"{CHECKPOINT_FORMAT}: retrain it with python -m mha_tutorial.models.train (data/README.md has the commands)"
        )
    validate_training.checkpoint_fields(checkpoint, path, TASKS)
    return checkpoint


def load_pretrained(name: str, path=None, device=None) -> TinyTransformer:
    """The committed model for task ``name`` from ``data/checkpoints/<name>.pt`` (in eval mode).

    Raises ``CheckpointNotFoundError`` (a FileNotFoundError and a ValueError) when the file is missing
    (naming the command that creates it), ValueError when it is corrupt or malformed (see
    ``read_checkpoint``), was trained for another task, has a configuration different from the task's
    current ``default_config()``, or weights that do not fit that configuration.
    """
    task = get_task(name)
    validate_training.device(device)
    if path is not None:
        validate_training.checkpoint_path(path)
    path = Path(path) if path is not None else CHECKPOINT_DIR / f"{name}.pt"
    if not path.exists():
        raise CheckpointNotFoundError(
            f"no checkpoint for task {name!r} at {path}; create it with: {train_command(name)}"
        )
    checkpoint = read_checkpoint(path)
    if checkpoint["task"] != name:
        raise ValueError(f"{path} was trained for task {checkpoint['task']!r}, not {name!r}")
    expected = task.default_config().to_dict()
    saved = checkpoint["config"]
    diffs = [
        f"{k}: checkpoint {saved.get(k)!r} vs current {expected.get(k)!r}"
        for k in sorted(set(expected) | set(saved))
        if saved.get(k) != expected.get(k)
    ]
    if diffs:
        raise ValueError(
            f"{path} was made with a different configuration ({'; '.join(diffs)}); "
            f"retrain it with: {train_command(name)}"
        )
    with torch.random.fork_rng(devices=[]):  # initial weights are overwritten: leave the caller's random stream alone
        model = build_model(ModelConfig.from_dict(saved))
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as e:
        raise ValueError(
            f"{path}: weights do not fit the configured model (field 'state_dict' vs 'config'): {e}"
        ) from None
    model.metrics = dict(checkpoint["metrics"])
    return model.to(device if device is not None else get_device()).eval()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Train a tiny transformer on one task and save a checkpoint.")
    parser.add_argument("--task", required=True, help="reversal, induction or dates")
    parser.add_argument("--out", required=True, type=Path, help="where to write the checkpoint (.pt)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override the task's default number of steps")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: get_device())")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    get_task(args.task)  # a clear error for an unknown name before any work
    model, history = train(
        args.task, steps=args.steps, seed=args.seed, device=args.device, progress=not args.no_progress
    )
    save_checkpoint(args.out, model, args.task, history)
    print(
        f"{args.task}: eval accuracy {history['accuracy']:.4f}, loss {history['eval_loss']:.4f}, "
        f"{history['train_time_s']:.1f} s on {next(model.parameters()).device.type}, "
        f"{args.out.stat().st_size / 1024:.0f} KiB -> {args.out}"
    )


if __name__ == "__main__":
    main()
