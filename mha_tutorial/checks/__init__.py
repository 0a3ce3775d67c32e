"""Automatic checks for the exercises of the notebooks.

Each ``check_*`` function takes the learner's function or module, runs it on
small seeded cases against the package's reference implementation, and either
prints one line saying it passed or raises ``CheckFailed`` (an
``AssertionError``) whose message says, in plain words, the first thing that
differs and what was expected instead.

One module per notebook: ``checks.nb01`` for notebook 01, and so on; every
check is re-exported here.
"""

from ._common import CheckFailed
from .nb01 import *  # noqa: F401,F403
from .nb02 import *  # noqa: F401,F403
from .nb03 import *  # noqa: F401,F403
from .nb04 import *  # noqa: F401,F403
