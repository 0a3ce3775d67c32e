"""Converting the series' trained models to grouped-query attention, then uptraining them (Ainslie et al. 2023).

The two checkpoints that decode with a KV cache -- ``induction`` (a 2-layer decoder) and ``dates`` (an
encoder-decoder: encoder self-attention, decoder self- and cross-attention) -- have 4 heads in every attention
layer. ``model_to_gqa`` turns a whole model into one with ``num_kv_heads`` K/V heads per layer, every layer at once
(self- and cross-attention), with ``gqa.mha_to_gqa``: queries and outputs kept, each group's K/V heads pooled as
``init`` says ("mean", "first" or "random"). The study scores every conversion on the committed eval split right
after conversion ("converted") and after uptraining on 5 % of the original steps ("uptrained",
``DEFAULT_SETTINGS[task].steps // 20``: 25 steps for induction, 50 for dates), for ``len(SEEDS)`` seeds. The seed
drives the stream of uptraining batches and the "random" draw; "mean" and "first" convert deterministically.

A control separates "uptraining helps the converted model" from "more training helps any model": the unconverted
model (``num_kv_heads`` = 4, ``init`` = "none") is uptrained in exactly the same way.

One uptraining schedule for every row (``UPTRAIN_LR``, ``uptrain_settings``): the training loop's own shape --
a linear warmup over the first tenth of the steps, then cosine decay to 5 % -- with a peak of 1e-3, a third of the
original training's 3e-3. The converted models start near a good solution, not from random weights, so a smaller
step keeps what was kept while the warmup spares the fresh moments of AdamW a large first step; the decay lets the
last steps settle. The peak was fixed before the study was run and is not tuned on the eval split.

``kv_bytes_per_token`` is the decoder's KV cache per generated token per sequence in float32, from the formula
(``kv_cache.cache_bytes``): 2 (K and V) x decoder self-attention layers x H_kv x head size x 4 bytes. Only the
decoder's self-attention layers grow with each token; the dates model's cross-attention cache holds the encoder's
keys and values once per sequence (it shrinks by the same factor, but does not grow).

``python -m mha_tutorial.modern.gqa_study`` writes one row per (task, num_kv_heads, init, seed, stage) to ``STUDY_PATH``
(about 3 minutes on a 2-core CPU with one thread).
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import replace
from numbers import Real
from pathlib import Path

import torch

from ..core.kv_cache import cache_bytes
from ..device import describe_machine
from ..models.model import TinyTransformer, build_model
from ..models.task_base import DATA_DIR
from ..models.tasks import get_task
from ..models.train import DEFAULT_SETTINGS, TrainSettings, _optimise, evaluate, load_pretrained
from .gqa import INITS, mha_to_gqa

TASKS = ("induction", "dates")  # the checkpoints that decode with a KV cache
KV_HEADS = (2, 1)  # grouped-query attention with 2 groups, multi-query attention
CONTROL = "none"  # the ``init`` of the control rows: the unconverted model (H_kv = H), uptrained the same way
SEEDS = tuple(range(5))
STAGES = ("converted", "uptrained")
UPTRAIN_FRACTION = 20  # uptrain for 1/20 = 5 % of the original steps (the paper's alpha = 0.05)
UPTRAIN_LR = 1e-3  # the peak learning rate of every uptraining run
STUDY_PATH = DATA_DIR / "gqa_study.csv"
COLUMNS = ("task", "num_kv_heads", "init", "seed", "stage", "accuracy", "loss", "kv_bytes_per_token")
MARKERS = {"mean": "o", "first": "s", "random": "^"}
BAND_MIN = 0.01  # the control's seeds' range is drawn as a band only when at least this wide (else invisible)


def uptrain_settings(task: str) -> TrainSettings:
    """The uptraining run for ``task``: 5 % of its original steps, warmup over a tenth, peak ``UPTRAIN_LR``."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r:.40}")
    steps = DEFAULT_SETTINGS[task].steps // UPTRAIN_FRACTION
    return replace(DEFAULT_SETTINGS[task], steps=steps, lr=UPTRAIN_LR, warmup=max(1, steps // 10), eval_every=0)


def uptrain(model, task: str, seed: int = 0, settings: TrainSettings | None = None):
    """Continue training ``model`` on ``task`` in place (default: ``uptrain_settings(task)``); ``seed`` sets the
    stream of batches. Returns the model in eval mode."""
    settings = settings or uptrain_settings(task)
    _optimise(model, get_task(task), settings, torch.Generator().manual_seed(seed), progress=False)
    return model.eval()


def kv_bytes_per_token(config) -> int:
    """Bytes the decoder's KV cache grows by per generated token of one sequence (float32): its self-attention
    layers only (cross-attention's cache is the encoder's memory, stored once)."""
    num_kv_heads = config.num_heads if config.num_kv_heads is None else config.num_kv_heads
    head_size = config.num_hiddens // config.num_heads
    return cache_bytes(config.num_dec_layers, 1, num_kv_heads, 1, head_size, torch.float32)


def _check_conversion(model, num_kv_heads, init, generator) -> None:
    """``model_to_gqa``'s arguments, before anything is built."""
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer (build_model, load_pretrained), got {type(model).__name__}")
    H = model.config.num_heads
    if model.config.num_kv_heads not in (None, H):
        raise ValueError(
            f"model already shares its K/V heads (num_heads={H}, num_kv_heads={model.config.num_kv_heads}): "
            "convert the plain multi-head model it came from"
        )
    pruned = {name: layer.pruned_heads for name, layer in model.attention_layers() if layer.pruned_heads}
    if pruned:
        raise ValueError(f"model has pruned heads {pruned}; convert the unpruned model")
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int):
        raise TypeError(f"num_kv_heads must be an int dividing num_heads={H}, got {num_kv_heads!r:.40}")
    if num_kv_heads < 1 or H % num_kv_heads:
        divisors = [n for n in range(1, H + 1) if H % n == 0]
        raise ValueError(f"num_kv_heads must divide num_heads={H} (one of {divisors}), got {num_kv_heads}")
    if not isinstance(init, str) or init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r:.40}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


def model_to_gqa(model, num_kv_heads: int, init: str = "mean", generator=None):
    """A NEW model of ``model``'s kind whose every attention layer (self and cross) has ``num_kv_heads`` K/V heads.

    Every weight is copied; each layer's ``W_k`` and ``W_v`` are converted by ``gqa.mha_to_gqa`` (``init``:
    "mean", "first" or "random", the last drawn with ``generator``, in ``attention_layers()`` order). The new
    model's config is ``model.config`` with ``num_kv_heads`` (None when it equals num_heads: then the new model is
    an exact copy). It has ``model``'s device, dtype and train/eval mode; ``model`` is untouched.
    """
    _check_conversion(model, num_kv_heads, init, generator)
    config = replace(model.config, num_kv_heads=None if num_kv_heads == model.config.num_heads else num_kv_heads)
    paths = {id(module): path for path, module in model.named_modules()}
    state = {name: value.detach().clone() for name, value in model.state_dict().items()}
    for _, layer in model.attention_layers():
        prefix = paths[id(layer)]
        for key in [k for k in state if k.startswith(f"{prefix}.W_k.") or k.startswith(f"{prefix}.W_v.")]:
            del state[key]
        converted = mha_to_gqa(layer, num_kv_heads, init, generator)
        state.update({f"{prefix}.{k}": v for k, v in converted.state_dict().items() if k[:4] in ("W_k.", "W_v.")})
    with torch.random.fork_rng(devices=[]):  # the initial weights are overwritten: keep the caller's random stream
        new = build_model(config)
    weight = next(model.parameters())
    new = new.to(device=weight.device, dtype=weight.dtype)
    new.load_state_dict(state)  # strict: every parameter of the new model is set, with its shape checked
    return new.train(model.training)


def _check_study_args(tasks, kv_heads, inits, seeds) -> None:
    """``run_study``'s arguments: sequences of known tasks, divisors of the checkpoints' 4 heads, inits, seeds."""
    allowed = {"tasks": TASKS, "kv_heads": (1, 2, 4), "inits": INITS, "seeds": None}
    for name, values in zip(allowed, (tasks, kv_heads, inits, seeds), strict=True):
        if isinstance(values, str) or not hasattr(values, "__iter__"):
            raise TypeError(f"{name} must be a sequence (a tuple or list), got {values!r:.40}")
        if name == "seeds":
            bad = [s for s in values if isinstance(s, bool) or not isinstance(s, int) or s < 0]
            what = "non-negative ints"
        else:
            bad = [v for v in values if isinstance(v, bool) or v not in allowed[name]]
            what = f"taken from {allowed[name]}"
        if bad:
            raise ValueError(f"{name} must be {what}, got {bad}")


def _score(model, task: str, stage: str, **key) -> dict:
    """One row: ``key`` (task, num_kv_heads, init, seed), the stage, eval accuracy and loss, the cache's bytes."""
    result = evaluate(model, task)
    return {
        "task": task,
        **key,
        "stage": stage,
        "accuracy": result["accuracy"],
        "loss": result["loss"],
        "kv_bytes_per_token": kv_bytes_per_token(model.config),
    }


def _converted(original, num_kv_heads: int, init: str, seed: int):
    """The model a study row starts from: the unconverted copy for the control, else ``model_to_gqa``'s."""
    if init == CONTROL:
        return copy.deepcopy(original)
    return model_to_gqa(original, num_kv_heads, init, torch.Generator().manual_seed(seed))


def run_study(tasks=TASKS, kv_heads=KV_HEADS, inits=INITS, seeds=SEEDS, settings=None, progress: bool = True):
    """Convert, score, uptrain and score again, for every (task, num_kv_heads, init, seed) and the control;
    a DataFrame with ``COLUMNS``. ``settings`` ({task: TrainSettings}) replaces ``uptrain_settings`` (for quick
    trials). Runs on the CPU with one thread. "mean" and "first" conversions are scored once per task and
    num_kv_heads (they do not depend on the seed), the control's unconverted model once per task."""
    import pandas as pd

    _check_study_args(tasks, kv_heads, inits, seeds)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    rows, start = [], time.perf_counter()
    try:
        for task in tasks:
            original = load_pretrained(task, device="cpu")
            plan = [(h, init) for h in kv_heads for init in inits] + [(original.config.num_heads, CONTROL)]
            scored = {}  # (num_kv_heads, init) -> the converted row of a seed-independent conversion
            for (num_kv_heads, init), seed in ((p, s) for p in plan for s in seeds):
                key = {"num_kv_heads": num_kv_heads, "init": init, "seed": seed}
                model = _converted(original, num_kv_heads, init, seed)
                if init == "random" or (num_kv_heads, init) not in scored:
                    scored[num_kv_heads, init] = _score(model, task, "converted", **key)
                rows.append({**scored[num_kv_heads, init], "seed": seed})
                uptrain(model, task, seed, (settings or {}).get(task))
                rows.append(_score(model.eval(), task, "uptrained", **key))
                if progress:
                    print(f"{task:>9} H_kv={num_kv_heads} {init:>6} seed {seed}: "
                          f"{rows[-2]['accuracy']:.3f} -> {rows[-1]['accuracy']:.3f} "
                          f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
    finally:
        torch.set_num_threads(previous)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def read_study(path=None):
    """The shipped study (``STUDY_PATH``): the DataFrame ``run_study`` returns, plus a ``machine`` column."""
    import pandas as pd

    path = Path(STUDY_PATH if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no study at {path}; make it with: python -m mha_tutorial.modern.gqa_study --out {path}"
        )
    return pd.read_csv(path)


def summary(study):
    """The seeds' min, mean and max accuracy, indexed by (task, num_kv_heads, init, stage). Two rows differ beyond
    the noise of the seeds where their [min, max] ranges do not overlap."""
    keys = ["task", "num_kv_heads", "init", "stage"]
    return study.groupby(keys, sort=False).accuracy.agg(["min", "mean", "max"])


def table(study, digits: int = 3):
    """``mean [min, max]`` over the seeds: one row per (task, num_kv_heads, init), one column per stage."""
    import pandas as pd

    fmt = f"{{mean:.{digits}f}} [{{min:.{digits}f}}, {{max:.{digits}f}}]"
    cells = {}
    for (task, num_kv_heads, init, stage), numbers in summary(study).iterrows():
        cells.setdefault((task, num_kv_heads, init), {})[stage] = fmt.format(**numbers)
    out = pd.DataFrame.from_dict(cells, orient="index")
    out.index = out.index.set_names(["task", "num_kv_heads", "init"])
    return out[[s for s in STAGES if s in out.columns]]


def _check_extra_points(study, extra_points) -> None:
    """``plot_study``'s ``extra_points``: {task: [(kv_bytes, accuracy), ...]}, at cache sizes the task's panel has."""
    if not isinstance(extra_points, dict):
        raise TypeError(f"extra_points must be a dict {{task: [(kv_bytes, accuracy), ...]}}, got {extra_points!r:.60}")
    for task, points in extra_points.items():
        sizes = sorted(set(study[study.task == task].kv_bytes_per_token))
        if not sizes:
            raise ValueError(
                f"extra_points names task {task!r:.40}, which has no panel (study: {sorted(set(study.task))})"
            )
        for point in points:
            if not (isinstance(point, tuple | list) and len(point) == 2 and point[0] in sizes):
                raise ValueError(
                    f"{task}'s extra points must be (kv_bytes in {sizes}, accuracy) pairs, got {point!r:.60}"
                )
            if isinstance(point[1], bool) or not isinstance(point[1], Real) or not 0 <= point[1] <= 1:
                raise ValueError(f"{task}'s extra point {tuple(point)}: accuracy must lie in [0, 1]")


def _draw_task(ax, rows, numbers, extra=(), extra_label="") -> None:
    """One task's panel: each conversion's seeds (mean; min-max bar where they differ) against its cache bytes,
    side by side around each cache size; the control; ``extra`` points (black diamonds) right of the rest."""
    control = rows[rows.init == CONTROL]
    if len(control):
        up = numbers.loc[(control.task.iloc[0], control.num_kv_heads.iloc[0], CONTROL, "uptrained")]
        if up["max"] - up["min"] >= BAND_MIN:  # a thinner band would be a legend entry with nothing visible
            ax.axhspan(up["min"], up["max"], color="0.85", label="MHA uptrained the same way (control): seeds' range")
        ax.axhline(up["mean"], color="0.35", lw=1.2, label="MHA uptrained (control): mean of its seeds")
        original = control[control.stage == "converted"]
        ax.plot(original.kv_bytes_per_token.iloc[:1], original.accuracy.iloc[:1], "*", color="k", ms=11,
                label="MHA checkpoint, as trained")  # fmt: skip
    slots = 2 * len(MARKERS) + bool(extra)  # marker positions around one cache size, 0.06 octave apart
    for i, init in enumerate(MARKERS):
        for j, (stage, fill) in enumerate((("converted", "none"), ("uptrained", f"C{i}"))):
            mine = rows[(rows.init == init) & (rows.stage == stage)]
            if not len(mine):
                continue
            stats = mine.groupby("num_kv_heads").agg(
                x=("kv_bytes_per_token", "first"), mean=("accuracy", "mean"), lo=("accuracy", "min"),
                hi=("accuracy", "max"))  # fmt: skip
            x = stats.x * 2 ** ((2 * i + j - (slots - 1) / 2) * 0.06)
            ax.plot(x, stats["mean"], MARKERS[init], color=f"C{i}", mfc=fill, ms=7, label=f"{init} init, {stage}")
            spread = stats.hi > stats.lo  # seeds that agree get no bar (a zero-length bar would show only its caps)
            if spread.any():
                s = stats[spread]
                ax.errorbar(x[spread], s["mean"], yerr=[s["mean"] - s.lo, s.hi - s["mean"]], fmt="none",
                            ecolor=f"C{i}", capsize=3, lw=1)  # fmt: skip
    if extra:
        x, y = zip(*extra, strict=True)
        x = [b * 2 ** ((slots - 1) / 2 * 0.06) for b in x]
        ax.plot(x, y, "D", color="k", mfc="none", ms=9, zorder=5, label=extra_label)


def plot_study(study, extra_points=None, extra_label="extra points"):
    """Per task a panel (one accuracy scale): accuracy against the decoder's KV-cache bytes per token (log axis).
    Markers per init, hollow right after conversion and filled after uptraining, the seeds' mean with a min-max
    bar (none where the seeds agree); the uptrained MHA control as a grey line (the seeds' mean) and band (their
    range, drawn only when at least ``BAND_MIN`` wide), the checkpoint a star. ``extra_points`` ({task:
    [(kv_bytes, accuracy), ...]}, named ``extra_label`` in the legend) adds black diamonds right of the markers of
    their cache size. One legend, below the panels."""
    import matplotlib.pyplot as plt

    if extra_points is not None:
        _check_extra_points(study, extra_points)
    tasks = list(dict.fromkeys(study.task))
    fig, axes = plt.subplots(1, len(tasks), figsize=(9, 5.6), sharey=True, layout="constrained", squeeze=False)
    numbers = summary(study)
    for ax, task in zip(axes[0], tasks, strict=True):
        rows = study[study.task == task]
        _draw_task(ax, rows, numbers, (extra_points or {}).get(task, ()), extra_label)
        sizes = sorted(set(rows.kv_bytes_per_token))
        heads = dict(zip(rows.kv_bytes_per_token, rows.num_kv_heads, strict=True))
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [f"{b} B\n(H_kv={heads[b]})" for b in sizes])
        ax.minorticks_off()
        ax.set_xlim(sizes[0] / 1.6, sizes[-1] * 1.6)
        ax.set(title=f"{task}", xlabel="decoder KV cache per token (float32)")
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set(ylabel="accuracy on the eval split", ylim=(-0.02, 1.05))  # room for markers at 1
    legend = {}  # label -> handle, every panel's entries once
    for ax in axes[0]:
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels, strict=True):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncol=3, fontsize=8)
    return fig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=STUDY_PATH, help="where to write the CSV (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds per conversion (default: %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the study's setting, so that the machine column names it
    start = time.perf_counter()
    study = run_study(seeds=tuple(range(args.seeds)))
    study["machine"] = describe_machine()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    study.to_csv(args.out, index=False)
    print(table(study).to_string())
    print(f"wrote {len(study)} rows to {args.out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
