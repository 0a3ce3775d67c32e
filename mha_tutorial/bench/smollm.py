"""Greedy decoding of SmolLM2-135M: our ``LlamaDecoder`` with its KV cache against transformers' ``generate``
(notebook 14; issue 23's goal: ours >= 1.0x its tokens/s).

    python -m mha_tutorial.bench smollm            # writes data/smollm_race.csv
    python -m mha_tutorial.bench smollm --quick    # fewer tokens and rounds, into build/bench/smollm

Both models hold the same float32 weights (``llama_hf.to_transformers`` copies ours), run on the same CPU with the
same threads, greedy, with their KV caches. Before anything is timed the two generations are checked
token-identical. Then for each prompt length the two alternate ``rounds`` times (ours, theirs, ours, ...), so that a
change in the machine's load hits both; the row keeps each side's best and median time and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

import torch

from ..device import describe_machine
from ..models.task_base import DATA_DIR

__all__ = ["RACE_PATH", "race", "run"]

RACE_PATH = DATA_DIR / "smollm_race.csv"
PROMPT = "The history of the printing press begins"
FIELDS = ["prompt_tokens", "new_tokens", "rounds", "ours_s", "theirs_s", "ours_tok_s", "theirs_tok_s", "ratio"]


def race(ours, theirs, ids: torch.Tensor, new_tokens: int, rounds: int) -> dict:
    """Time ``new_tokens`` greedy tokens from ids (1, T) with both models, alternating; medians and their ratio."""
    mine = ours.generate(ids, new_tokens)  # (1, T + n); also the warm-up
    with torch.no_grad():
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        other = theirs.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    if not torch.equal(mine, other):
        raise RuntimeError("the two models generated different tokens: nothing is timed")
    times = {"ours": [], "theirs": []}
    for _ in range(rounds):
        start = time.perf_counter()
        ours.generate(ids, new_tokens)
        times["ours"].append(time.perf_counter() - start)
        start = time.perf_counter()
        with torch.no_grad():
            theirs.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        times["theirs"].append(time.perf_counter() - start)
    ours_s, theirs_s = statistics.median(times["ours"]), statistics.median(times["theirs"])
    return {
        "prompt_tokens": ids.shape[1],
        "new_tokens": new_tokens,
        "rounds": rounds,
        "ours_s": round(ours_s, 3),
        "theirs_s": round(theirs_s, 3),
        "ours_tok_s": round(new_tokens / ours_s, 1),
        "theirs_tok_s": round(new_tokens / theirs_s, 1),
        "ratio": round(theirs_s / ours_s, 2),  # > 1: ours is faster
    }


def run(new_tokens=(32, 128), prompt_repeats=(1, 16), rounds: int = 3) -> list[dict]:
    """Both models loaded once; one row per (prompt length, new tokens)."""
    from ..pretrained.llama_hf import to_transformers
    from ..pretrained.smollm import load_smollm, load_smollm_tokenizer

    ours = load_smollm(device="cpu")
    theirs = to_transformers(ours)
    tokenizer = load_smollm_tokenizer()
    rows = []
    for repeats in prompt_repeats:
        ids = torch.tensor([tokenizer.encode(" ".join([PROMPT] * repeats)).ids])  # (1, T)
        for n in new_tokens:
            row = race(ours, theirs, ids, n, rounds)
            print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha_tutorial.bench smollm", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 new tokens, 2 rounds, into build/bench/smollm")
    parser.add_argument("--out", type=Path, default=None, help="a folder for smollm_race.csv")
    args = parser.parse_args(argv)
    if args.quick:
        rows, path = run(new_tokens=(16,), prompt_repeats=(1,), rounds=2), Path("build/bench/smollm")
    else:
        rows, path = run(), RACE_PATH.parent
    path = (args.out or path) / RACE_PATH.name
    path.parent.mkdir(parents=True, exist_ok=True)
    machine = f"{describe_machine()}; load average {os.getloadavg()[0]:.1f}"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*FIELDS, "machine"])
        writer.writeheader()
        writer.writerows({**row, "machine": machine} for row in rows)
    print(f"wrote {path}")
    return 0
