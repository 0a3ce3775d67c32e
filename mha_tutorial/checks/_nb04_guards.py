"""A guard shared by the checks of notebooks 04 and 05: while the learner's code runs, a method of the package's
own classes refuses to run, so that a check cannot be passed by calling the package's implementation."""

from __future__ import annotations

import contextlib

from ._common import CheckFailed


@contextlib.contextmanager
def _refusing(classes, method: str, message: str):
    """While the learner's code runs, ``cls.method`` of each class raises ``CheckFailed(message)``.

    This catches the package's own implementation however it is reached: ``net(...)``,
    ``MultiHeadAttention.forward(net, ...)``, or a fresh module with ``net``'s weights loaded.
    """
    saved = [(cls, cls.__dict__[method]) for cls in classes if method in cls.__dict__]

    def refuse(*args, **kwargs):
        raise CheckFailed(message)

    for cls, _ in saved:
        setattr(cls, method, refuse)
    try:
        yield
    finally:
        for cls, original in saved:
            setattr(cls, method, original)
