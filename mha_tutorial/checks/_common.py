"""Shared helpers for the exercise checks: compare, and explain the first difference."""

from __future__ import annotations

import functools

import torch


class CheckFailed(AssertionError):
    """Raised by a check with a plain-words explanation of what is wrong."""


class NotAttempted(Exception):
    """The learner's code still raises NotImplementedError (the student edition's stubs)."""


def friendly(check):
    """Wrap a check so that an exercise not attempted yet is reported, not raised.

    The student edition replaces each solution with a stub that raises
    NotImplementedError; its check then prints what to do instead of failing.
    Wrong answers still raise ``CheckFailed``.
    """

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except NotAttempted as e:
            print(f"… {check.__name__}: not attempted yet ({e}). Write your solution above, then run this cell again.")
            return None

    return wrapper


def passed(name: str, cases: int) -> None:
    print(f"✓ {name}: passed on {cases} case{'s' if cases != 1 else ''}")


def call(fn, *args, case: str, **kwargs):
    """Call the learner's code; turn NotImplementedError into a friendly failure."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        raise NotAttempted(str(e) or case) from None


def expect_tensor(actual, case: str) -> torch.Tensor:
    if not isinstance(actual, torch.Tensor):
        raise CheckFailed(f"{case}: expected a tensor, got {type(actual).__name__}")
    return actual


def expect_shape(actual: torch.Tensor, expected: tuple, case: str) -> None:
    expect_tensor(actual, case)
    if tuple(actual.shape) != tuple(expected):
        raise CheckFailed(f"{case}: wrong shape {tuple(actual.shape)}, expected {tuple(expected)}")


def expect_finite(actual: torch.Tensor, case: str) -> None:
    if torch.isnan(actual).any():
        raise CheckFailed(
            f"{case}: the result contains NaN (from 0/0 or inf - inf; on a fully-masked row the weights must be zeros)"
        )
    if torch.isinf(actual).any():
        raise CheckFailed(f"{case}: the result contains inf")


def expect_close(actual, expected: torch.Tensor, case: str, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Shape, finiteness, then values; the message names the first differing position."""
    expect_shape(actual, expected.shape, case)
    if torch.isfinite(expected).all():
        expect_finite(actual, case)
    actual = actual.detach().to(expected.dtype).cpu()
    expected = expected.detach().cpu()
    close = torch.isclose(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    if not close.all():
        where = tuple(int(i) for i in (~close).nonzero()[0])
        raise CheckFailed(
            f"{case}: wrong values, first at index {where}: got {actual[where].item():.4g}, "
            f"expected {expected[where].item():.4g} (max difference {(actual - expected).abs().max().item():.3g})"
        )
