"""Execute notebooks headless, top to bottom, in a fresh kernel each (``make run``, ``make outputs``).

    python -m mha_tutorial.run_notebooks --out build/notebooks notebooks/*.ipynb
    python -m mha_tutorial.run_notebooks --inplace notebooks/*.ipynb

The kernel runs in the notebook's own folder, so relative paths such as
``../data`` work as they do in JupyterLab. The device is whatever
``mha_tutorial.get_device()`` finds (the GPU when there is one).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def execute(path: Path, timeout: int = 600):
    """Run one notebook and return (executed notebook, seconds)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="folder for the executed copies")
    where.add_argument("--inplace", action="store_true", help="overwrite the notebooks' stored outputs")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = parser.parse_args(argv)

    import nbformat

    for path in args.notebooks:
        nb, seconds = execute(path, args.timeout)
        target = path if args.inplace else args.out / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        print(f"{path.name}: {seconds:.1f} s -> {target}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
