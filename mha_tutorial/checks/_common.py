"""Shared helpers for the exercise checks: compare, and explain the first difference."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys

import torch


class CheckFailed(AssertionError):
    """Raised by a check with a plain-words explanation of what is wrong."""


class NotAttempted(Exception):
    """The learner's code still raises NotImplementedError (the student edition's stubs)."""


STRICT = "MHA_TUTORIAL_STRICT_CHECKS"


def strict() -> bool:
    """Graders set ``MHA_TUTORIAL_STRICT_CHECKS=1``: then an exercise not attempted fails its check."""
    return os.environ.get(STRICT, "") == "1"


def friendly(check):
    """Wrap a check so that an exercise not attempted yet is reported, not raised.

    Each exercise's cell starts as a stub that raises NotImplementedError; its check then
    prints what to do instead of failing, so a learner can run the whole notebook. In strict
    mode (``MHA_TUTORIAL_STRICT_CHECKS=1``, for graders) it fails like a wrong answer.
    Wrong answers always raise ``CheckFailed``.
    """

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except NotAttempted as e:
            if strict():
                raise CheckFailed(f"{check.__name__}: not attempted ({e}); {STRICT}=1 counts that as failed") from None
            print(f"… {check.__name__}: not attempted yet ({e}). Write your solution above, then run this cell again.")
            return None

    return wrapper


def passed(name: str, cases: int) -> None:
    print(f"✓ {name}: passed on {cases} case{'s' if cases != 1 else ''}")


# Crashes whose message alone would puzzle a learner, and what they usually mean.
KNOWN_CRASHES = [
    (
        ("view size is not compatible",),
        ".view() failed on a permuted or transposed (non-contiguous) tensor: use .reshape() to merge axes "
        "(or call .contiguous() before .view())",
    ),
    (
        ("must match the size of tensor", "expanded size", "does not broadcast"),
        "a tensor does not broadcast against another: broadcasting lines up their *last* axes, so give the smaller one its "
        "missing axes (keepdim=True keeps a summed axis; a (B, K) padding mask needs keep[:, None, None, :] "
        "for (B, H, Q, K) scores)",
    ),
    (
        ("torch.return_types",),
        "max(dim=...) and min(dim=...) return a pair (values, indices): use .values, or torch.amax / amin",
    ),
]


def call(fn, *args, case: str, hint: str = "", **kwargs):
    """Call the learner's code on one case and turn every way it can go wrong into a plain message.

    A stub of the student edition (NotImplementedError) becomes ``NotAttempted``; a ``CheckFailed``
    raised inside passes through; any other crash becomes ``CheckFailed`` naming the case, the
    exception, what it usually means when we know, and ``hint``.
    """
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        raise NotAttempted(str(e) or case) from None
    except (CheckFailed, NotAttempted):
        raise
    except Exception as e:  # noqa: BLE001 -- any crash of the learner's code is reported, with its case
        meaning = next((m for needles, m in KNOWN_CRASHES if any(n in str(e) for n in needles)), "")
        raise CheckFailed(
            f"{case}: your function raised {type(e).__name__}: {e}" + (f" -- {meaning}" if meaning else "") + hint
        ) from None


def _same(actual: torch.Tensor, candidate: torch.Tensor, atol: float, rtol: float) -> bool:
    """Equal shapes and values (bool tensors exactly, floats within tolerance; NaN or inf never matches)."""
    if tuple(actual.shape) != tuple(candidate.shape):
        return False
    actual = actual.detach().to(candidate.dtype).cpu()
    if candidate.dtype == torch.bool:
        return torch.equal(actual, candidate.cpu())
    if not (torch.isfinite(actual).all() and torch.isfinite(candidate).all()):
        return False
    return bool(torch.allclose(actual, candidate.cpu(), atol=atol, rtol=rtol))


def diagnose(actual, expected, mistakes, case: str, atol=1e-5, rtol=1e-4, otherwise="compare", mistake_atol=None):
    """Return if ``actual`` matches ``expected``; else raise naming the first known mistake it reproduces.

    ``mistakes``: (description, what that mistake computes) pairs, any iterable: a generator computes them
    only as far as needed, and a None candidate is skipped. When no mistake matches, ``otherwise`` decides:
    ``"compare"`` raises with the first differing value (``expect_close``), ``None`` returns so the caller can
    look further, and a function ``(actual, expected, case)`` raises its own message.
    """
    if _same(actual, expected, atol, rtol):
        return
    for description, candidate in mistakes:
        if candidate is not None and _same(actual, candidate, mistake_atol or atol, rtol):
            raise CheckFailed(f"{case}: {description}")
    if otherwise == "compare":
        expect_close(actual, expected, case, atol=atol, rtol=rtol)
    elif otherwise is not None:
        otherwise(actual, expected, case)


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


def _code_of(function):
    """The code object that runs when ``function`` is called, under any ``functools.wraps`` decorators."""
    return getattr(inspect.unwrap(function), "__code__", None)


@contextlib.contextmanager
def refusing(functions: dict, builtin_names: dict | None = None):
    """Inside the block, note every call of the package's ``functions`` ({function: what to say}); on leaving it
    normally, raise ``CheckFailed`` naming the first one called.

    An exercise asks the learner to write something the package already has; calling the package's version would
    pass any comparison with it, so the check refuses it, however it was reached (passed in directly, imported
    under another name, or called inside the learner's function). ``builtin_names`` ({name: what to say}) refuses
    C functions by name too, e.g. ``{"softmax": ...}`` for ``torch.softmax`` and ``Tensor.softmax``.
    """
    codes = {_code_of(f): what for f, what in functions.items() if _code_of(f) is not None}
    builtin_names = builtin_names or {}
    seen: list[str] = []
    previous = sys.getprofile()

    def note(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            seen.append(codes[frame.f_code])
        elif event == "c_call" and getattr(arg, "__name__", None) in builtin_names:
            seen.append(builtin_names[arg.__name__])

    sys.setprofile(note)
    try:
        yield
    finally:
        sys.setprofile(previous)
    if seen:
        raise CheckFailed(f"your function calls {seen[0]}: the exercise is to write that step yourself")
