"""Automatic checks for the exercises of the notebooks.

Each ``check_*`` function takes the learner's function or module, runs it on
small seeded cases against the package's reference implementation, and either
prints one line saying it passed or raises ``CheckFailed`` (an
``AssertionError``) whose message says, in plain words, the first thing that
differs and what was expected instead.

One module per notebook: ``checks.nb01`` for notebook 01, and so on; every
check is re-exported here.
"""

from . import nb01, nb02, nb03, nb04, nb05, nb06, nb07, nb08
from ._common import CheckFailed, NotAttempted, friendly

__all__ = ["CheckFailed", "NotAttempted"]
for _module in (nb01, nb02, nb03, nb04, nb05, nb06, nb07, nb08):
    for _name in _module.__all__:
        globals()[_name] = friendly(getattr(_module, _name))
        __all__.append(_name)
