"""Checks for the exercises of notebook 05a (training details).

Exercise 1 (``check_to_torch_attention``) lives in ``nb05`` with the other attention mappings; this module holds
Exercise 2: predict which configuration changes let the committed reversal weights load without an error.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..models.model import build_model
from ..models.train import load_pretrained
from ._common import CheckFailed, call, friendly, passed

__all__ = ["check_load_predictions"]

# One changed field of the reversal model's configuration each, and why plain load_state_dict accepts or refuses
# the trained weights. Whether each load succeeds is measured by the check, never taken from this table.
LOAD_CHANGES = {
    "num_heads=8": (
        {"num_heads": 8},
        "the number of heads changes no parameter's shape: W_q, W_k, W_v and W_o stay (D, D) for any H "
        "(notebook 04 counted 4D² + 4D), so the weights load silently and the model computes something else",
    ),
    "ffn_num_hiddens=256": (
        {"ffn_num_hiddens": 256},
        "the FFN's W_1 becomes (256, 64) instead of (128, 64): a size mismatch, which raises",
    ),
    "max_len=12": (
        {"max_len": 12},
        "the position table becomes (12, 64) instead of (10, 64): a size mismatch raises, although the 10 "
        "trained rows would fit inside it",
    ),
    "num_enc_layers=2": (
        {"num_enc_layers": 2},
        "the second block's tensors (enc_blocks.1.*) are not in the checkpoint: missing keys raise",
    ),
    "bias=False": (
        {"bias": False},
        "attention without biases has no W_q.bias, W_k.bias, ...: the checkpoint's biases are unexpected keys, "
        "which raise",
    ),
    "dropout=0.1": (
        {"dropout": 0.1},
        "dropout has no parameters, so nothing changes name or shape: the weights load silently (and in eval "
        "mode, where dropout is off, the model computes what it computed before)",
    ),
}


def _loads(trained, change: dict) -> bool:
    """Does a fresh model with ``change`` applied accept ``trained``'s weights under plain load_state_dict?"""
    model = build_model(replace(trained.config, **change))
    try:
        model.load_state_dict(trained.state_dict())
    except RuntimeError:
        return False
    return True


@friendly
def check_load_predictions(fn) -> None:
    """``fn()`` -> {change: bool}, True where the committed reversal weights load without an error."""
    predictions = call(fn, case="your predictions")
    if not isinstance(predictions, dict):
        raise CheckFailed(
            f"predict_loads() must return a dict {{change: True or False}}, got {type(predictions).__name__}"
        )
    missing, extra = set(LOAD_CHANGES) - set(predictions), set(predictions) - set(LOAD_CHANGES)
    if missing or extra:
        raise CheckFailed(
            f"the dict needs exactly the keys {list(LOAD_CHANGES)}"
            + (f"; missing {sorted(missing)}" if missing else "")
            + (f"; not one of them: {sorted(extra)}" if extra else "")
        )
    not_bool = {k: v for k, v in predictions.items() if not isinstance(v, bool)}
    if not_bool:
        raise CheckFailed(f"each prediction must be True (loads) or False (raises), got {not_bool}")
    with torch.random.fork_rng():
        trained = load_pretrained("reversal")
        misses = []
        for name, (change, why) in LOAD_CHANGES.items():
            loads = _loads(trained, change)
            if predictions[name] != loads:
                verdict = "loads without an error" if loads else "raises"
                misses.append(f"{name}: you predicted {predictions[name]}, but it {verdict}: {why}")
    if misses:
        raise CheckFailed(f"{len(misses)} of {len(LOAD_CHANGES)} predictions missed:\n  " + "\n  ".join(misses))
    passed("check_load_predictions", len(LOAD_CHANGES))
