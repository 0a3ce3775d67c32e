"""Execute notebooks in place, headless, one after another, and record how long each took (``make run``).

    python tools/run_notebooks.py build/notebooks/*.ipynb

Each notebook runs top to bottom in a fresh kernel (the one its metadata names, as ``jupyter execute``
would start it) from its own folder, and is saved with its new outputs. The wall time of each run, kernel
start included, goes to ``timings.json`` beside the notebooks ({"01_....ipynb": seconds, ...}), written
after every notebook, so a failed run keeps the times of those before it; tools/build_site.py shows them
on the site's index. A notebook that raises stops the run with a non-zero exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TIMINGS = "timings.json"  # the name tools/build_site.py reads


def execute(path: Path) -> float:
    """Run one notebook in place; return its wall time in seconds."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    nbformat.write(nb, path)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.notebooks:
        seconds = execute(path)
        timings_file = path.parent / TIMINGS
        timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
        timings[path.name] = round(seconds, 1)
        timings_file.write_text(json.dumps(timings, indent=1) + "\n")
        print(f"{path}: {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
