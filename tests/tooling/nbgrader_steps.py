"""nbgrader commands run one after another in one Python process, each as if typed in its own folder.

    python tests/tooling/nbgrader_steps.py STEPS.json

STEPS.json holds ``[[folder, [argument, ...]], ...]``; each step runs ``nbgrader ARGUMENTS`` in ``folder``: nbgrader's
own application (``NbGraderApp``, as nbgrader's test suite drives it), which reads the nbgrader_config.py of that
folder. The run stops at the first step that fails, with its exit status. Every step is announced on stderr
(``$ cd FOLDER && nbgrader ...``) and followed by its wall time, so the output reads as the teacher's and the
students' terminals would.

Starting nbgrader costs seconds (its imports, and a subprocess ``alembic heads`` when a gradebook is created): one
process for a class's whole round trip saves most of a minute in tests/tooling/test_nbgrader.py. Python shows a
warning once per place in the code: one that several commands would each print appears once here, but it appears.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path


def run_step(folder: str, args: list[str]) -> int:
    """``nbgrader ARGS`` in ``folder``; its exit status."""
    from jupyter_core.application import NoStart
    from nbgrader.apps.nbgraderapp import NbGraderApp

    os.chdir(folder)
    print(f"$ cd {shlex.quote(folder)} && nbgrader {shlex.join(args)}", file=sys.stderr, flush=True)
    app = NbGraderApp.instance()
    try:
        app.initialize(args)
        app.start()
    except NoStart:  # how a Jupyter application says that its subcommand ran: success
        pass
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        app.reset()  # nbgrader's own clean-up between commands: logging, the application and its subcommand
    return 0


def main(argv: list[str] | None = None) -> int:
    steps = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    for folder, args in steps:
        start = time.perf_counter()
        status = run_step(folder, args)
        print(f"({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
        if status:
            print(f"step failed with exit status {status}", file=sys.stderr)
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
