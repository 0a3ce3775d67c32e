"""Every check of the tasks', training's, checkpoints' and pruning's arguments, in one place.

The companion of ``_validate`` (attention), ``_validate_masks``, ``_validate_model`` (the tiny models) and
``_validate_experiments`` (examples, plots, statistics) for ``task_base``, ``tasks``, ``train`` and ``pruning``: each
function raises a ``TypeError`` or ``ValueError`` that names the value, shape or type it got, and is called before
anything is computed. It sits below the modules it checks, so the classes it checks against that they define
(``TrainSettings``, the task names) are passed in.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from ..core._validate_masks import _type_name
from ._validate_experiments import model_for_task, positive_count, task_batch  # noqa: F401 (re-exported)
from ._validate_model import _is_int, _is_real, _number, non_negative_count
from .model import ModelConfig


# ---- tasks -------------------------------------------------------------------------------------------------------
def name(value, what: str) -> None:
    """A task's or a split's name: a string (unknown names are refused, with the known ones, by the caller)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {value!r:.40} ({_type_name(value)})")


def id_sequence(ids, task_name: str) -> None:
    """``Task.decode``: a tensor or a sequence of ids (their values are checked against the vocabulary)."""
    if not isinstance(ids, torch.Tensor) and not hasattr(ids, "__iter__"):
        raise TypeError(f"{task_name}: decode takes a list or tensor of ids, got {_type_name(ids)} {ids!r:.40}")


def generator(value) -> None:
    """``make_batch``'s random stream: None or a ``torch.Generator``."""
    if value is not None and not isinstance(value, torch.Generator):
        raise TypeError(f"generator must be None or a torch.Generator, got {_type_name(value)}")


def induction_runs(examples) -> None:
    """Induction sequences whose run has at least two letters: with one, no position counts in the loss."""
    short = [seq for (seq,) in examples if len(seq) < 4]
    if short:
        raise ValueError(
            f"induction: a run needs at least 2 letters (a run of one has no letter to predict from an earlier "
            f"copy), got {short[0]!r}"
        )


def loss_inputs(model, task, batch) -> None:
    """``Task.loss_and_accuracy``: a model of the task's kind and a ``Batch``."""
    model_for_task(model, task)
    task_batch(batch)


# ---- train.py ----------------------------------------------------------------------------------------------------
def train_settings(settings) -> None:
    """``TrainSettings``: positive counts, non-negative warmup and evaluation interval, sensible rates."""
    positive_count(settings.steps, "TrainSettings.steps")
    positive_count(settings.batch_size, "TrainSettings.batch_size")
    non_negative_count(settings.warmup, "TrainSettings.warmup")
    non_negative_count(settings.eval_every, "TrainSettings.eval_every")
    _number(settings.lr, "TrainSettings.lr", 0.0, strict=True)
    _number(settings.weight_decay, "TrainSettings.weight_decay", 0.0, strict=False)
    _number(settings.grad_clip, "TrainSettings.grad_clip", 0.0, strict=True)


def device(value) -> None:
    """None (the default device), a ``torch.device`` or a device name such as 'cpu' or 'cuda'."""
    if value is not None and not isinstance(value, str | torch.device):
        raise TypeError(f"device must be None, a torch.device or a name such as 'cpu', got {_type_name(value)}")


def train_args(task, config, settings, overrides: dict, seed, device_name, num_threads, settings_type) -> None:  # noqa: PLR0913
    """``train``'s arguments, before a model is built: a config for the task, settings (of ``settings_type``,
    ``train.TrainSettings``), seed, device, threads."""
    if config is not None and not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig (or None: the task's default), got {_type_name(config)}")
    if config is not None and config.kind != task.model_kind:
        raise ValueError(
            f"task {task.name!r} runs a model of kind {task.model_kind!r}, got a config of kind {config.kind!r}"
        )
    if settings is not None and not isinstance(settings, settings_type):
        raise TypeError(f"settings must be a TrainSettings (or None), got {_type_name(settings)}")
    known = [f.name for f in dataclasses.fields(settings_type)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise TypeError(f"unknown training settings {unknown}; known: {known}")
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {seed!r:.40} ({_type_name(seed)})")
    device(device_name)
    if num_threads is not None:
        positive_count(num_threads, "num_threads")


# ---- checkpoints ------------------------------------------------------------------------------------
def checkpoint_path(path) -> None:
    """A path to a checkpoint file: a str or a ``pathlib.Path``."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or pathlib.Path to a .pt file, got {type(path).__name__} {path!r:.40}")


def checkpoint_config(config, path) -> None:
    """Field ``config``: a dict of ``ModelConfig`` fields (no unknown ones, the required ones present), typed."""
    if not isinstance(config, dict):
        raise ValueError(f"{path}: field 'config' must be a dict of ModelConfig fields, got {type(config).__name__}")
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    missing = [n for n, f in fields.items() if n not in config and f.default is dataclasses.MISSING]
    unknown = sorted(str(k) for k in config if k not in fields)
    if missing:
        raise ValueError(f"{path}: field 'config' lacks the ModelConfig fields {missing}")
    if unknown:
        raise ValueError(f"{path}: field 'config' has fields {unknown} that ModelConfig does not know")
    types = {"int": int, "str": str, "bool": bool, "float": int | float, "int | None": int | type(None)}
    for name, value in config.items():
        want = types.get(str(fields[name].type), object)
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            raise ValueError(f"{path}: config[{name!r}] must be of type {fields[name].type}, got {value!r:.40}")


def checkpoint_state(state, path) -> None:
    """Field ``state_dict``: a non-empty dict {parameter name: tensor}, floating ones finite."""
    if not isinstance(state, dict) or not state:
        raise ValueError(
            f"{path}: field 'state_dict' must be a non-empty dict {{parameter name: tensor}}, got "
            f"{type(state).__name__}{' (empty)' if isinstance(state, dict) else ''}"
        )
    for name, value in state.items():
        if not isinstance(name, str):
            raise ValueError(f"{path}: field 'state_dict' has a key {name!r} ({type(name).__name__}); keys are names")
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: state_dict[{name!r}] must be a tensor, got {type(value).__name__}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{path}: state_dict[{name!r}] contains NaN or inf")


def checkpoint_fields(checkpoint: dict, path, task_names) -> None:
    """A checkpoint's fields once its keys and format are known: task (one of ``task_names``, ``tasks.TASKS``),
    config, state_dict, metrics (and train)."""
    task = checkpoint["task"]
    if not isinstance(task, str) or task not in task_names:
        raise ValueError(
            f"{path}: field 'task' must name a task of this package ({', '.join(task_names)}), got {task!r}"
        )
    checkpoint_config(checkpoint["config"], path)
    checkpoint_state(checkpoint["state_dict"], path)
    metrics = checkpoint["metrics"]
    if not isinstance(metrics, dict):
        raise ValueError(f"{path}: field 'metrics' must be a dict {{name: number}}, got {type(metrics).__name__}")
    bad = {k: v for k, v in metrics.items() if not (isinstance(k, str) and _is_real(v))}
    if bad:
        raise ValueError(f"{path}: field 'metrics' must map names to numbers, got {bad!r:.80}")
    if "train" in checkpoint and not isinstance(checkpoint["train"], dict):
        raise ValueError(f"{path}: field 'train' must be a dict of training settings, got {checkpoint['train']!r:.80}")


def train_history(history) -> None:
    """``save_checkpoint``'s ``history``: the dict that ``train`` returns."""
    required = ("settings", "seed", "device", "accuracy", "eval_loss", "train_time_s", "loss")
    if not isinstance(history, dict) or any(k not in history for k in required):
        got = sorted(history) if isinstance(history, dict) else type(history).__name__
        raise ValueError(f"history must be the dict returned by train(), with keys {required}; got {got}")
    if not history["loss"]:
        raise ValueError("history['loss'] is empty: a checkpoint records the final training loss")


# ---- pruning.py --------------------------------------------------------------------------------------------------
def model_sizes(model) -> None:
    """A model with ``num_attention_layers`` and ``num_heads``, or a (layers, heads) pair of ints >= 0."""
    if isinstance(model, tuple):
        if len(model) != 2 or not all(_is_int(n) and n >= 0 for n in model):
            raise ValueError(f"sizes must be a (num_layers, num_heads) pair of ints >= 0, got {model!r:.40}")
    elif not (hasattr(model, "num_attention_layers") and hasattr(model, "num_heads")):
        raise TypeError(
            f"model must be a model of this package or a (num_layers, num_heads) pair, got {_type_name(model)}"
        )


def head_order(order) -> None:
    """A pruning order: a list of (layer, head) pairs of ints (their ranges are checked against the model)."""
    if isinstance(order, str | torch.Tensor) or not hasattr(order, "__iter__"):
        raise TypeError(f"order must be a list of (layer, head) pairs, got {_type_name(order)} {order!r:.40}")
    bad = [h for h in order if not (isinstance(h, list | tuple) and len(h) == 2 and all(_is_int(i) for i in h))]
    if bad:
        raise TypeError(f"order must hold (layer, head) pairs of ints, got {bad[:3]!r:.80}")


def table(x, name: str, layers_by_heads: bool = True) -> None:
    """An importance or score table: a real tensor, of shape (layers, heads) when ``layers_by_heads``."""
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.dtype == torch.bool:
        what = f"dtype {x.dtype}" if isinstance(x, torch.Tensor) else _type_name(x)
        raise TypeError(f"{name} must be a real tensor, got {what}")
    if layers_by_heads and x.dim() != 2:
        raise ValueError(f"{name} must be a (layers, heads) table, got shape {tuple(x.shape)}")


def curve(values, counts, minimum: int = 0) -> None:
    """A pruning curve: at least ``minimum`` numbers, and as many strictly increasing counts (or None)."""
    for label, x in (("values", values), ("counts", counts)):
        if x is None and label == "counts":
            continue
        try:
            t = torch.as_tensor(x, dtype=torch.double)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{label} must be a list or tensor of numbers, got {_type_name(x)} {x!r:.40}") from None
        if t.dim() != 1:
            raise ValueError(f"{label} must be a 1-D list of numbers, got shape {tuple(t.shape)}")
        if t.numel() < minimum:
            raise ValueError(f"a pruning curve needs at least {minimum} point(s), got {label} of length {t.numel()}")
    if counts is not None and len(counts) != len(values):
        raise ValueError(f"counts must give one x per value: {len(counts)} counts for {len(values)} values")
    if counts is not None and len(counts) >= 2 and not bool((torch.as_tensor(counts).diff() > 0).all()):
        raise ValueError(f"counts must be strictly increasing, got {list(counts)[:8]}")
