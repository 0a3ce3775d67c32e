"""Checks for the exercises of notebooks 04 and 04a (multi-head attention).

The forward check lives in ``_nb04_forward``, the parameter-counting checks in ``_nb04_params`` and the head-off
check in ``_nb04_head_off``; they are re-exported here, so ``nb04.check_num_params`` is the same function as
``checks.check_num_params``. The peak-memory prediction of notebook 04a is checked here.
"""

from __future__ import annotations

import numbers

import torch

from ._common import CheckFailed, call, friendly, passed
from ._nb04_forward import check_mha_forward
from ._nb04_guards import _refusing
from ._nb04_head_off import check_head_off
from ._nb04_params import _TORCH_PARAM_CASES as _TORCH_PARAM_CASES
from ._nb04_params import _torch_mha_count as _torch_mha_count
from ._nb04_params import check_num_params, check_torch_mha_params

__all__ = [
    "check_mha_forward",
    "check_num_params",
    "check_torch_mha_params",
    "check_head_off",
    "check_peak_prediction",
]


# ------------------------------------------------------------------ notebook 04a: predict a peak before measuring

# (batch, heads, seq), num_hiddens = 64: heads and seq varied against each other, the T^2 terms dominate
_PEAK_CASES = [(1, 16, 256), (2, 4, 768), (3, 8, 256)]
_PEAK_TABLES = 3  # (B, H, T, T) float32 tensors alive at the readable path's peak: P, dP and dS in softmax backward
_PEAK_MEASURED: dict[tuple[int, int, int], float] = {}  # the check's own cache (measured_peak_mib always measures)


def measured_peak_mib(batch: int, heads: int, seq: int, hiddens: int = 64) -> float:
    """The measured peak (MiB) of one forward+backward call of the readable path, float32, on the CPU."""
    from ..bench.attention import run_benchmark

    (row,) = run_benchmark(  # run_benchmark restores PyTorch's thread count itself
        seqs=[seq],
        batch=batch,
        hiddens=hiddens,
        heads=heads,
        passes=("forward+backward",),
        impl_names=["readable"],
        device="cpu",
        threads=1,
        min_run_time=0.01,
        log=None,
    )
    return row.peak_mib


def _peak_slip(tables: float, B: int, H: int, T: int) -> str | None:
    """The named mistake whose count ``tables`` (the prediction in units of one (B, H, T, T) float32 tensor) gives."""
    right = _PEAK_TABLES
    candidates = [
        ("you counted one (batch, heads, seq, seq) tensor; the softmax backward holds more at once", 1 / right),
        ("you counted two (batch, heads, seq, seq) tensors; the softmax backward reads two and writes one", 2 / right),
        ("you counted four (batch, heads, seq, seq) tensors; the raw scores are not among those alive at the peak: "
         "the softmax backward needs its output, not its input", 4 / right),
        ("that is bytes: divide by 2**20 for MiB", 2**20),
        ("8 bytes per number: float32 takes 4", 2.0),
        ("that is MB (10**6 bytes): a MiB is 2**20 bytes", 2**20 / 10**6),
        ("the heads are missing: every head has its own (seq, seq) table", 1 / H),
        ("the batch is missing: every example has its own tables", 1 / B),
        ("seq, not seq squared: each table is (seq, seq)", 1 / T),
    ]  # fmt: skip
    for message, factor in candidates:
        if factor != 1 and abs(tables / right / factor - 1) < 0.01:
            return message
    if abs(tables / right - 1) < 0.12:
        return (
            f"that is {tables:.2f} (batch, heads, seq, seq) tensors' worth; the tensors come whole: count which ones "
            "the softmax backward holds at once and leave out the terms linear in seq (a ratio read off a measured "
            "peak carries them)"
        )
    return None


@friendly
def check_peak_prediction(fn) -> None:
    """``fn(batch, heads, seq)`` -> the predicted peak memory (MiB) of one forward+backward call of the readable
    ``MultiHeadAttention`` in float32: a whole number of (batch, heads, seq, seq) float32 tensors, the right one,
    and within 12% of the peak that the check measures."""
    from ..bench.attention import PeakMemory

    for B, H, T in _PEAK_CASES:
        case = f"batch={B}, heads={H}, seq={T} (num_hiddens=64)"
        with _refusing(
            (PeakMemory,),
            "__init__",
            "your function measured the peak instead of predicting it; compute it from batch, heads and seq",
        ):
            predicted = call(fn, B, H, T, case=case)
        if isinstance(predicted, torch.Tensor) and predicted.numel() == 1:
            predicted = predicted.item()
        if isinstance(predicted, bool) or not isinstance(predicted, numbers.Real):
            raise CheckFailed(f"{case}: return a number of MiB, got {predicted!r} ({type(predicted).__name__})")
        tables = predicted / (4 * B * H * T * T / 2**20)  # in units of one (B, H, T, T) float32 tensor
        if abs(tables / _PEAK_TABLES - 1) >= 1e-6:
            slip = _peak_slip(tables, B, H, T)
            if slip is not None:
                raise CheckFailed(f"{case}: predicted {predicted:.4g} MiB: {slip}")
        if (B, H, T) not in _PEAK_MEASURED:
            _PEAK_MEASURED[B, H, T] = measured_peak_mib(B, H, T)
        measured = _PEAK_MEASURED[B, H, T]
        if not 0.88 <= predicted / measured <= 1.12:
            raise CheckFailed(
                f"{case}: predicted {predicted:.4g} MiB, measured {measured:.1f} MiB (more than 12% apart)"
            )
        if abs(tables / _PEAK_TABLES - 1) >= 1e-6:  # within 12%, yet not the whole count of tensors alive at the peak
            raise CheckFailed(f"{case}: predicted {predicted:.4g} MiB, {tables:.3g} tensors' worth: count whole ones")
    passed("check_peak_prediction", len(_PEAK_CASES))
